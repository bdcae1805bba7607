/*
 * resident.c: the CPU tier's experts made resident in host RAM when a placement is bound
 * (MOET_CPU_RESIDENT, docs/residency.md "In the engine"), through cpu/moet_residency.h:
 *
 *   placement bound (dispatch.c)            the checkpoint's shard mappings, registered
 *     -> every routed expert owned by -1    its six tensors (gate, up, down; codes, scales)
 *        (the CPU tier), every MoE layer    as ranges of one set
 *     -> populate                           every page read in and mapped now (MADV_WILLNEED,
 *                                           MADV_POPULATE_READ): no page fault and no disk read
 *                                           inside a decode step later
 *     -> lock (MOET_CPU_RESIDENT=lock)      mlock where RLIMIT_MEMLOCK / CAP_IPC_LOCK allow,
 *                                           else a note saying why (not an error)
 *
 * The set lives with the placement (the model's `res`) and is destroyed before the next one or
 * the checkpoint's unmapping (destroy munlocks). Populating only reads the bytes the CPU tier
 * reads anyway: the bits cannot change (tests/runtime/test_resident.c compares logits).
 *
 * NOTE (NUMA). The CPU tier's team spreads every expert's rows over all its workers
 * (cpu/exec.c), so no node "owns" an expert; on a host of several nodes the ranges are tagged
 * round-robin over the nodes, expert by expert, and populated with MOET_RES_PLACE (each node's
 * thread reads its share), so that each node's memory holds about 1/N of the tier. On one node
 * (CI, the H200 host) the ranges are untagged and one thread reads them. Not yet run on a host
 * of several nodes.
 */
#include <numa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "moet_env.h"
#include "moet_err.h"

void moet_resident_release(moet_model *m)
{
	moet_res_destroy(m->res);
	m->res = NULL;
	memset(&m->res_report, 0, sizeof(m->res_report));
}

/* Adds the ranges of one expert matrix (its codes and, where present, its block scales). */
static int add_mat(moet_res *rs, const moet_mat *w, int node, const char *label, size_t *bytes)
{
	int rc = moet_res_add_range(rs, w->data, moet_mat_data_bytes(w), node, label, NULL);
	*bytes += moet_mat_data_bytes(w);
	if (!rc && w->scale_inv && moet_mat_scale_bytes(w)) {
		rc = moet_res_add_range(rs, w->scale_inv, moet_mat_scale_bytes(w), node, label, NULL);
		*bytes += moet_mat_scale_bytes(w);
	}
	return rc;
}

int moet_resident_bind(moet_model *m, const int16_t *owner)
{
	static const char *const modes[] = { "populate", "off", "lock" };
	int mode = 0, rc = moet_env_choice("MOET_CPU_RESIDENT", modes, 3, &mode);
	moet_resident_release(m); /* the report too */
	if (rc || mode == 1 || !owner || !m->ck)
		return rc;
	const int64_t L = m->cfg.num_hidden_layers, E = m->cfg.n_routed_experts;
	const int n_nodes = numa_available() < 0 ? 1 : numa_max_node() + 1;
	moet_res *rs = NULL;
	if ((rc = moet_res_create(&rs)))
		return rc;
	for (int i = 0; i < moet_ckpt_shard_count(m->ck) && !rc; i++)
		if (moet_ckpt_shard_bytes(m->ck, i))
			rc = moet_res_add_mapping(rs, moet_ckpt_shard_base(m->ck, i),
						  moet_ckpt_shard_bytes(m->ck, i));
	size_t bytes = 0;
	int64_t n_exp = 0;
	for (int64_t l = 0; l < L && !rc; l++) {
		if (!m->layers[l].is_moe || !m->layers[l].experts_host)
			continue;
		for (int64_t e = 0; e < E && !rc; e++) {
			if (owner[l * E + e] >= 0)
				continue;
			const moet_ffn_w *w = &m->layers[l].experts_host[e];
			const int node = n_nodes > 1 ? (int)(n_exp % n_nodes) : MOET_RES_NO_NODE;
			char label[MOET_RES_LABEL_BYTES];
			snprintf(label, sizeof(label), "model.layers.%lld.mlp.experts.%lld",
				 (long long)l, (long long)e);
			if (!(rc = add_mat(rs, &w->gate, node, label, &bytes)) &&
			    !(rc = add_mat(rs, &w->up, node, label, &bytes)))
				rc = add_mat(rs, &w->down, node, label, &bytes);
			n_exp++;
		}
	}
	moet_res_populate_report pop = { 0 };
	if (!rc && n_exp)
		rc = moet_res_populate(rs, n_nodes > 1 ? MOET_RES_PLACE : 0, &pop);
	moet_res_lock_report lk = { 0 };
	if (!rc && n_exp && mode == 2)
		rc = moet_res_lock(rs, &lk);
	if (rc) {
		moet_res_destroy(rs);
		return moet_err_prefix(rc, "MOET_CPU_RESIDENT=%s: the CPU tier's experts",
				       modes[mode]);
	}
	moet_resident_report *r = &m->res_report;
	r->experts = n_exp;
	r->bytes = bytes;
	r->populated_bytes = pop.bytes;
	r->populate_ns = pop.ns;
	r->locked = lk.locked;
	r->locked_bytes = lk.locked ? lk.bytes : 0;
	snprintf(r->note, sizeof(r->note), "%s", mode == 2 && !lk.locked ? lk.note : "");
	m->res = rs;
	return 0;
}

int moet_model_resident_check(moet_model *m, size_t stride_pages)
{
	if (!stride_pages)
		return moet_err(MOET_EINVAL, "resident check: stride 0");
	if (!m->res)
		return 0;
	moet_res_check_report cr;
	size_t n_lost = 0;
	int rc = moet_res_check(m->res, stride_pages, &cr);
	if (!rc)
		rc = moet_res_evicted(m->res, NULL, 0, &n_lost);
	if (rc)
		return moet_err_prefix(rc, "resident check of the CPU tier");
	moet_resident_report *r = &m->res_report;
	r->checks++;
	r->pages_checked = cr.pages_checked;
	r->pages_resident = cr.pages_resident;
	r->evicted_ranges = n_lost;
	r->evicted_example[0] = '\0';
	if (n_lost) {
		int id = -1;
		size_t n1 = 0;
		if (!moet_res_evicted(m->res, &id, 1, &n1) && n1 && id >= 0)
			moet_res_describe(m->res, id, r->evicted_example,
					  sizeof(r->evicted_example));
	}
	return 0;
}

void moet_model_resident_report(const moet_model *m, moet_resident_report *out)
{
	*out = m->res_report;
}
