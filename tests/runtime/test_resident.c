/*
 * test_resident.c: MOET_CPU_RESIDENT (runtime/resident.c). Binding a placement makes its CPU
 * tier resident: the report counts exactly the CPU-owned experts of the MoE layers and their
 * tensors' bytes as the checkpoint's index gives them (read here through moet_ckpt, not the
 * engine's views), every page of them read in; `off` does nothing; `lock` locks them or says
 * why not; a placement without CPU experts and the release of a placement report zeros; a bad
 * value is refused naming the variable; the logits are memcmp-equal to the run without a
 * placement in every mode.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_model.h"
#include "moet_test.h"

#define SEQS 3
#define STEPS 2

/* The bytes of expert (l, e)'s tensors in the checkpoint (codes and block scales). */
static uint64_t expert_bytes(const moet_ckpt *ck, int64_t l, int64_t e)
{
	const char *mats[] = { "gate_proj", "up_proj", "down_proj" };
	const char *parts[] = { "weight", "weight_scale_inv" };
	uint64_t b = 0;
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 2; j++) {
			char name[160];
			snprintf(name, sizeof(name), "model.layers.%lld.mlp.experts.%lld.%s.%s",
				 (long long)l, (long long)e, mats[i], parts[j]);
			const moet_tensor *t = moet_ckpt_get(ck, name);
			CHECK(t || j == 1, "tensor %s missing", name);
			b += t ? t->n_bytes : 0;
		}
	return b;
}

int main(void)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 11;
	char *dir = NULL;
	moet_model *m = moet_test_gen_open("resident", &gp, &dir);
	if (!m)
		return moet_test_done("test_resident");
	moet_ckpt *ck = NULL;
	CHECK(moet_ckpt_open(dir, &ck) == 0, "checkpoint: %s", moet_errmsg());
	const moet_config *c = moet_model_config(m);
	const int64_t L = c->num_hidden_layers, E = c->n_routed_experts, V = c->vocab_size;
	const size_t n_logits = (size_t)((STEPS + 1) * SEQS * V);
	float *ref = malloc(n_logits * sizeof(float)), *got = malloc(n_logits * sizeof(float));
	int16_t *own = malloc((size_t)(L * E) * sizeof(*own));
	CHECK(moet_test_ragged_run(m, SEQS, STEPS, 1, ref) == 0, "reference run: %s",
	      moet_errmsg());

	/* every third expert on the CPU, the rest on one simulated device */
	int64_t want_n = 0;
	uint64_t want_b = 0;
	for (int64_t l = 0; l < L; l++)
		for (int64_t e = 0; e < E; e++) {
			own[l * E + e] = (int16_t)((e + l) % 3 == 0 ? -1 : 0);
			if (own[l * E + e] < 0 && moet_config_is_moe_layer(c, l)) {
				want_n++;
				want_b += expert_bytes(ck, l, e);
			}
		}
	const long page = sysconf(_SC_PAGESIZE);
	const char *modes[] = { "", "populate", "off", "lock" };
	for (int md = 0; md < 4; md++) {
		setenv("MOET_CPU_RESIDENT", modes[md], 1);
		CHECK(moet_model_set_placement(m, own, 1) == 0, "%s: %s", modes[md], moet_errmsg());
		unsetenv("MOET_CPU_RESIDENT");
		moet_resident_report r;
		moet_model_resident_report(m, &r);
		if (md == 2) {
			CHECK(r.experts == 0 && r.bytes == 0 && r.populated_bytes == 0, "off: %lld "
			      "experts, %llu bytes", (long long)r.experts, (unsigned long long)r.bytes);
		} else {
			CHECK(r.experts == want_n && r.bytes == want_b, "%s: %lld experts, %llu bytes;"
			      " want %lld, %llu", modes[md], (long long)r.experts,
			      (unsigned long long)r.bytes, (long long)want_n,
			      (unsigned long long)want_b);
			/* page-rounded: at least the bytes, at most two more pages per tensor */
			CHECK(r.populated_bytes >= want_b &&
				      r.populated_bytes <= want_b + (uint64_t)(12 * want_n * page),
			      "%s: %llu bytes populated for %llu", modes[md],
			      (unsigned long long)r.populated_bytes, (unsigned long long)want_b);
		}
		if (md == 3)
			CHECK((r.locked && r.locked_bytes >= want_b) || (!r.locked && r.note[0]),
			      "lock: locked %d (%llu bytes), note '%s'", r.locked,
			      (unsigned long long)r.locked_bytes, r.note);
		else
			CHECK(!r.locked && r.locked_bytes == 0, "%s: nothing locked", modes[md]);
		/* the check: every page, all resident after the populate; nothing without a set */
		CHECK(moet_model_resident_check(m, 1) == 0, "%s: check: %s", modes[md],
		      moet_errmsg());
		CHECK(moet_model_resident_check(m, 0) == MOET_EINVAL, "stride 0 accepted");
		moet_model_resident_report(m, &r);
		if (md == 2)
			CHECK(r.checks == 0 && r.pages_checked == 0, "off: checks %llu",
			      (unsigned long long)r.checks);
		else
			/* a page two tensors share is checked for each of them */
			CHECK(r.checks == 1 && r.pages_checked * (uint64_t)page >= r.populated_bytes &&
				      r.pages_resident == r.pages_checked && r.evicted_ranges == 0 &&
				      !r.evicted_example[0],
			      "%s: check: %llu of %llu pages resident, %llu evicted", modes[md],
			      (unsigned long long)r.pages_resident,
			      (unsigned long long)r.pages_checked,
			      (unsigned long long)r.evicted_ranges);
		memset(got, 0xAB, n_logits * sizeof(float));
		CHECK(moet_test_ragged_run(m, SEQS, STEPS, 1, got) == 0, "%s run: %s", modes[md],
		      moet_errmsg());
		CHECK(!memcmp(got, ref, n_logits * sizeof(float)), "%s: logits differ", modes[md]);
	}

	/* no CPU expert; then no placement: zeros */
	for (int64_t i = 0; i < L * E; i++)
		own[i] = 0;
	CHECK(moet_model_set_placement(m, own, 1) == 0, "all on the device: %s", moet_errmsg());
	moet_resident_report r;
	moet_model_resident_report(m, &r);
	CHECK(r.experts == 0 && r.populated_bytes == 0, "all on the device: %lld experts",
	      (long long)r.experts);
	for (int64_t i = 0; i < L * E; i++)
		own[i] = -1;
	CHECK(moet_model_set_placement(m, own, 0) == 0, "all on the CPU: %s", moet_errmsg());
	moet_model_resident_report(m, &r);
	CHECK(r.experts > want_n, "all on the CPU: %lld experts", (long long)r.experts);
	CHECK(moet_model_set_placement(m, NULL, 0) == 0, "release: %s", moet_errmsg());
	moet_model_resident_report(m, &r);
	CHECK(r.experts == 0 && r.bytes == 0, "released: %lld experts", (long long)r.experts);

	/* a bad value: refused, naming the variable */
	setenv("MOET_CPU_RESIDENT", "yes", 1);
	CHECK(moet_model_set_placement(m, own, 0) == MOET_EINVAL, "MOET_CPU_RESIDENT=yes accepted");
	CHECK(strstr(moet_errmsg(), "MOET_CPU_RESIDENT") != NULL, "detail: %s", moet_errmsg());
	unsetenv("MOET_CPU_RESIDENT");

	moet_ckpt_close(ck);
	free(own);
	free(ref);
	free(got);
	moet_model_close(m);
	free(dir);
	return moet_test_done("test_resident");
}
