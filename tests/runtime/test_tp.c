/*
 * test_tp.c: MOET_TP on the CPU backend (runtime/tp.c's test double: the ranks are more CPU
 * backends, the exchanges memcpy), against the unsplit reference bit for bit (tests/
 * tp_check.h): 2, 3 and 4 ranks in the expanded MLA form (with 3 and 4 some F8 matrices of
 * the tiny checkpoint leave the last ranks without rows: slices start on 128-row blocks),
 * 2 and 3 in the absorbed form (kv_b stays whole), each also with a placement over the CPU
 * tier and two simulated devices in two micro-batches; 3 ranks with MOET_TP_ROWS=2 (every
 * product of more rows in chunks). Bad values of MOET_TP and MOET_TP_ROWS fail the open
 * naming the value.
 */
#include "../tp_check.h"

int main(void)
{
	tp_ctx x;
	if (tp_prepare("tp", 41, &x))
		return moet_test_done("test_tp");
	for (int absorbed = 0; absorbed < 2; absorbed++) {
		int rc = tp_reference(x.dir, absorbed, x.ref, x.n_log);
		CHECK(rc == 0, "reference (%s MLA): %s", absorbed ? "absorbed" : "expanded",
		      moet_errmsg());
		for (int ranks = 2; !rc && ranks <= (absorbed ? 3 : 4); ranks++)
			tp_case(x.dir, "cpu", ranks, absorbed, x.own, 2, x.ref, x.got, x.n_log,
				"test_tp");
	}
	/* exchanges in chunks of 2 rows (the prefills' 3 to 7 rows run in several) */
	moet_test_env("MOET_TP_ROWS", "2");
	if (!tp_reference(x.dir, 0, x.ref, x.n_log))
		tp_case(x.dir, "cpu", 3, 0, x.own, 2, x.ref, x.got, x.n_log, "MOET_TP_ROWS=2");
	moet_test_env("MOET_TP_ROWS", NULL);
	/* bad values: refused at open, naming the value */
	static const char *const bad[] = { "0", "9", "two", "2x", "-2" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		moet_model *m = NULL;
		moet_test_env("MOET_TP", bad[i]);
		int rc = moet_model_open(x.dir, &m);
		moet_test_env("MOET_TP", NULL);
		char want[32];
		snprintf(want, sizeof(want), "MOET_TP='%s'", bad[i]);
		CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), want), "MOET_TP=%s: rc %d (%s)",
		      bad[i], rc, moet_errmsg());
		moet_model_close(m);
	}
	moet_test_env("MOET_TP", "2");
	moet_test_env("MOET_TP_ROWS", "0");
	moet_model *m = NULL;
	int rc = moet_model_open(x.dir, &m);
	moet_test_env("MOET_TP_ROWS", NULL);
	moet_test_env("MOET_TP", NULL);
	CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), "MOET_TP_ROWS='0'"), "MOET_TP_ROWS=0: rc %d "
	      "(%s)", rc, moet_errmsg());
	moet_model_close(m);
	tp_ctx_free(&x);
	return moet_test_done("test_tp");
}
