/*
 * test_tp.c: MOET_TP on the CPU backend (runtime/tp.c's test double: the ranks are more CPU
 * backends, the exchanges memcpy), against the unsplit reference bit for bit (tests/
 * tp_check.h), each case also with a placement over the CPU tier and two simulated devices in
 * two micro-batches:
 *   - the tiny-tp preset (heads of whole 128-row blocks), 2, 3 and 4 ranks, both MLA forms:
 *     each rank computes its heads' q and kvb itself; MOET_TP_ATTN=rank0;
 *   - the tiny preset (48-row q heads: q and kvb from rank 0), 2, 3 and 4 ranks expanded
 *     (with 3 and 4 some F8 matrices leave the last ranks without rows), 2 and 3 absorbed;
 *     MOET_TP_ATTN=rank0 in both forms (the absorbed form's kv_b then whole on rank 0);
 *     3 ranks with MOET_TP_ROWS=2 (every product of more rows in chunks);
 *   - rank 0's KV bytes per position (its heads only), and the ranks' split bytes against the
 *     placement's accounting (tests/tp_check.h);
 *   - bad values of MOET_TP, MOET_TP_ROWS and MOET_TP_ATTN fail the open naming them;
 *   - the CLI opens split where a placement's dense part is `split` over two or more GPUs
 *     (verify says so), not with `dense: gpu0`, nor under MOET_TP=1.
 */
#include "../tp_check.h"

int main(void)
{
	tp_ctx x;
	/* tiny-tp: heads of whole 128-row blocks, so each rank computes its heads' q and kvb */
	if (!tp_prepare("tp-heads", MOET_GEN_TINY_TP, 47, &x)) {
		for (int absorbed = 0; absorbed < 2; absorbed++)
			if (!tp_reference(x.dir, absorbed, x.ref, x.n_log))
				for (int ranks = 2; ranks <= 4; ranks++)
					tp_case_attn(x.dir, "cpu", ranks, absorbed, x.own, 2, x.ref,
						     x.got, x.n_log, "tiny-tp", 2);
		CHECK(!tp_reference(x.dir, 0, x.ref, x.n_log), "reference: %s", moet_errmsg());
		moet_test_env("MOET_TP_ATTN", "rank0");
		tp_case_attn(x.dir, "cpu", 2, 0, x.own, 2, x.ref, x.got, x.n_log,
			     "tiny-tp, MOET_TP_ATTN=rank0", 0);
		moet_test_env("MOET_TP_ATTN", NULL);
		tp_ctx_free(&x);
	}
	if (tp_prepare("tp", MOET_GEN_TINY, 41, &x))
		return moet_test_done("test_tp");
	for (int absorbed = 0; absorbed < 2; absorbed++) {
		int rc = tp_reference(x.dir, absorbed, x.ref, x.n_log);
		CHECK(rc == 0, "reference (%s MLA): %s", absorbed ? "absorbed" : "expanded",
		      moet_errmsg());
		/* tiny's q_b heads (48 rows) are not whole blocks: q and kvb from rank 0 */
		for (int ranks = 2; !rc && ranks <= (absorbed ? 3 : 4); ranks++)
			tp_case_attn(x.dir, "cpu", ranks, absorbed, x.own, 2, x.ref, x.got, x.n_log,
				     "test_tp", 1);
		/* the attention whole on rank 0 (the absorbed form: kv_b whole there) */
		moet_test_env("MOET_TP_ATTN", "rank0");
		if (!rc && absorbed)
			tp_case_attn(x.dir, "cpu", 2, 1, x.own, 2, x.ref, x.got, x.n_log,
				     "MOET_TP_ATTN=rank0", 0);
		moet_test_env("MOET_TP_ATTN", NULL);
	}
	/* the attention on rank 0 (MOET_TP_ATTN=rank0: its reference path under the split) */
	moet_test_env("MOET_TP_ATTN", "rank0");
	if (!tp_reference(x.dir, 0, x.ref, x.n_log))
		tp_case(x.dir, "cpu", 2, 0, x.own, 2, x.ref, x.got, x.n_log, "MOET_TP_ATTN=rank0");
	moet_test_env("MOET_TP_ATTN", NULL);
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
	/* the CLI: a placement's `dense: split` over its 2 GPUs splits (verify says so, and its
	 * runs are bit-identical), `dense: gpu0` does not, MOET_TP=1 overrides the file */
	static const char *const dense[] = { "", "dense: gpu0\n", "" };
	static const char *const env[] = { "", "", "MOET_TP=1 " };
	for (int i = 0; i < 3; i++) {
		char path[1024], yaml[512], *out = NULL;
		snprintf(path, sizeof(path), "%s/p%d.yaml", x.dir, i);
		snprintf(yaml, sizeof(yaml), "version: 1\ngpus:\n  - {name: gpu0, budget: 1GiB}\n"
			 "  - {name: gpu1, budget: 1GiB}\n%sdefault: {gpu0: \"0-7\", gpu1: "
			 "\"8-15\"}\n", dense[i]);
		CHECK(moet_test_write_file(path, yaml, strlen(yaml)) == 0, "write %s", path);
		char cmd[2048];
		snprintf(cmd, sizeof(cmd), "%s%s verify --model %s --placement %s --prompts 2 "
			 "--steps 2 2>&1", env[i], moet_test_bin(), x.dir, path);
		int rc = moet_test_run(cmd, &out);
		const int said = out && strstr(out, "dense part split over 2 simulated ranks");
		CHECK(rc == 0 && (i == 0) == !!said && out && strstr(out, "bit-identical"),
		      "verify, placement %d (%s%s): exit %d, split said %d: %s", i, env[i], dense[i],
		      rc, said, out ? out : "");
		free(out);
	}
	static const char *const knob[][2] = { { "MOET_TP_ROWS", "0" }, { "MOET_TP_ATTN", "all" } };
	for (int i = 0; i < 2; i++) {
		char want[48];
		snprintf(want, sizeof(want), "%s='%s'", knob[i][0], knob[i][1]);
		moet_test_env("MOET_TP", "2");
		moet_test_env(knob[i][0], knob[i][1]);
		moet_model *m = NULL;
		int rc = moet_model_open(x.dir, &m);
		moet_test_env(knob[i][0], NULL);
		moet_test_env("MOET_TP", NULL);
		CHECK(rc == MOET_EINVAL && strstr(moet_errmsg(), want), "%s: rc %d (%s)", want, rc,
		      moet_errmsg());
		moet_model_close(m);
	}
	tp_ctx_free(&x);
	return moet_test_done("test_tp");
}
