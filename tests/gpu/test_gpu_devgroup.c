/*
 * test_gpu_devgroup.c: the expert FFN grouped on the device (gpu/rows_dev.cu,
 * moet_gpu_experts_devgroup, step 2 of the CUDA-graph plan in docs/cuda-graphs.md) gives, bit for
 * bit, what the host-grouped call (moet_gpu_expert_ffn, itself checked against the CPU
 * reference by test_gpu_expert) gives for the same pairs:
 *
 *   1. layers of random experts (F8_E4M3 with block scales, BF16; I x H = 144 x 208: 16-byte
 *      staging and the wide kernel, partial 128-blocks; 67 x 129: the element-by-element
 *      staging; 2048 x 7168, Kimi-K2's, F8) over 64 to 384 experts; batches of 1, 2, 5, 16,
 *      64 and 257 tokens x top_k 8 with ids distinct per token over all experts, over 10 hot
 *      ones, skewed towards low ids, or with repeats within a token; every expert on device 0
 *      or an owner row over {-1, 0, 1} (the experts of other tiers absent from the table);
 *   2. per case: the grouping on the device (moet_gpu_group_pairs), the device-grouped call
 *      under each row-kernel variant and PDL setting (MOET_GPU_ROWS_KERNEL=ref|wide,
 *      MOET_GPU_PDL=0|1) with y and h poisoned before each; device 0's rows of y memcmp-equal
 *      to the host-grouped call's (host grouping: runtime/group_ref.c), every other row still
 *      poison, err 0; every token-count class (1, 2, 3-4, 5-8, 9-16, 17+) must have occurred;
 *   3. the device's reports: max_tok smaller than an expert's pairs (that class is not
 *      launched: OVER_MAX, its rows left alone, the others computed), an expert of device 0
 *      missing from the table (ABSENT);
 *   4. bad arguments: MOET_EINVAL / MOET_ESHAPE / MOET_EUNSUP with a message.
 * Skips (77) without a CUDA device.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "moet_group.h"

#define TOP_K 8
#define MAX_E 384
#define N_CL MOET_GPU_GROUP_N_CLASS

/* One layer: every expert's gate, up and down in one device buffer each, and their scales. */
typedef struct layer {
	moet_dtype dt;
	int64_t I, H, E;
	void *w[3];            /* device: gate, up, down of expert e at e * (I * H * esz) */
	float *s[3];           /* device block scales, NULL for BF16 */
	moet_gpu_expert *view; /* host [E]: the device views */
} layer;

static size_t esz_of(moet_dtype dt)
{
	return dt == MOET_DT_F8_E4M3 ? 1 : 2;
}

static size_t n_blocks(int64_t r, int64_t c)
{
	return (size_t)(((r + 127) / 128) * ((c + 127) / 128));
}

/* Random weights (host fill with edge values for small layers, device fill for large ones)
 * and random positive block scales. */
static int layer_make(layer *L, moet_dtype dt, int64_t I, int64_t H, int64_t E)
{
	memset(L, 0, sizeof(*L));
	*L = (layer){ .dt = dt, .I = I, .H = H, .E = E };
	const size_t per = (size_t)(I * H), esz = esz_of(dt), nb = n_blocks(I, H);
	const int big = per * (size_t)E > ((size_t)64 << 20);
	L->view = calloc((size_t)E, sizeof(*L->view));
	float *sc = malloc(nb * (size_t)E * sizeof(float));
	void *hw = big ? NULL : malloc(per * (size_t)E * esz);
	int rc = (!L->view || !sc || (!big && !hw)) ? -1 : 0;
	for (int m = 0; m < 3 && !rc; m++) {
		if (big) {
			rc = dev_fail(moet_gpu_alloc(per * (size_t)E * esz, &L->w[m]), "alloc");
			rc = rc ? rc : dev_fail(moet_gpu_bench_fill_bytes(L->w[m], per * (size_t)E * esz,
								  rnd(), 0xFE, NULL), "fill");
		} else {
			fill_weights(dt, hw, per * (size_t)E, m == 1);
			rc = (L->w[m] = up(hw, per * (size_t)E * esz)) ? 0 : -1;
		}
		if (!rc && dt == MOET_DT_F8_E4M3) {
			for (size_t b = 0; b < nb * (size_t)E; b++)
				sc[b] = (1.0f + rnd_unit() * 0.5f) * 0x1p-6f;
			rc = (L->s[m] = up(sc, nb * (size_t)E * sizeof(float))) ? 0 : -1;
		}
	}
	for (int64_t e = 0; e < E && !rc; e++) {
		moet_mat v[3];
		const int64_t rows[3] = { I, I, H }, cols[3] = { H, H, I };
		for (int m = 0; m < 3; m++)
			v[m] = (moet_mat){ dt, rows[m], cols[m],
					   (uint8_t *)L->w[m] + (size_t)e * per * esz,
					   L->s[m] ? L->s[m] + (size_t)e * nb : NULL };
		L->view[e] = (moet_gpu_expert){ v[0], v[1], v[2], 0 };
	}
	free(sc);
	free(hw);
	CHECK(rc == 0, "layer %lldx%lld x %lld: setup (%s)", (long long)I, (long long)H,
	      (long long)E, moet_errmsg());
	return rc;
}

static void layer_free(layer *L)
{
	for (int m = 0; m < 3; m++) {
		moet_gpu_free(L->w[m]);
		moet_gpu_free(L->s[m]);
	}
	free(L->view);
}

/* The device table of a layer with the experts resident[e] != 0 (uploaded). */
static moet_gpu_expert_ptrs *table_up(const layer *L, const uint8_t *resident,
				      moet_gpu_expert_geom *geom)
{
	moet_gpu_expert *v = malloc((size_t)L->E * sizeof(*v));
	moet_gpu_expert_ptrs *t = malloc((size_t)L->E * sizeof(*t));
	moet_gpu_expert_ptrs *d = NULL;
	if (v && t) {
		for (int64_t e = 0; e < L->E; e++) {
			v[e] = L->view[e];
			if (!resident[e])
				v[e].gate.data = NULL;
		}
		int rc = moet_gpu_expert_table(v, L->E, t, geom);
		CHECK(rc == 0, "expert table: %s", moet_errmsg());
		if (!rc)
			d = up(t, (size_t)L->E * sizeof(*t));
	}
	free(v);
	free(t);
	return d;
}

/* ids distinct per token, expert e drawn as E * u^3: a few experts take most tokens */
static void skewed_ids(int32_t *ids, int64_t n, int64_t E)
{
	for (int64_t t = 0; t < n; t++)
		for (int i = 0; i < TOP_K; i++) {
			int again;
			do {
				const double u = (double)(rnd() >> 11) * 0x1p-53;
				ids[t * TOP_K + i] = (int32_t)((double)E * u * u * u);
				again = 0;
				for (int j = 0; j < i; j++)
					again |= ids[t * TOP_K + j] == ids[t * TOP_K + i];
			} while (again);
		}
}

static int class_of(int n)
{
	return n <= 1 ? 0 : n == 2 ? 1 : n <= 4 ? 2 : n <= 8 ? 3 : n <= 16 ? 4 : 5;
}

static int seen_class[N_CL], seen_partial; /* classes met; a 17+ expert of n % 16 != 0 */
static int n_cases;
static long long n_rows_checked;

/* The group buffers of moet_gpu_group_pairs for P pairs, in one device block. */
typedef struct groups {
	void *blk;
	moet_gpu_group_bufs b;
} groups;

static int groups_make(groups *g, int64_t P, int n_dev)
{
	const size_t T = (size_t)n_dev + 1, X = MAX_E;
	const size_t len[10] = { (size_t)P * sizeof(moet_gpu_pair), (size_t)P * 4, T * 4, T * 4,
		X * sizeof(moet_gpu_group_exp), X * sizeof(moet_gpu_group_exp), N_CL * 4,
		N_CL * 4, 4, 12 };
	size_t off[10], at = 0;
	for (int i = 0; i < 10; i++) {
		off[i] = at;
		at += (len[i] + 255) & ~(size_t)255;
	}
	if (dev_fail(moet_gpu_alloc(at, &g->blk), "alloc"))
		return -1;
	uint8_t *d = g->blk;
	g->b = (moet_gpu_group_bufs){ (moet_gpu_pair *)(d + off[0]), (int32_t *)(d + off[1]),
		(int32_t *)(d + off[2]), (int32_t *)(d + off[3]),
		(moet_gpu_group_exp *)(d + off[4]), (moet_gpu_group_exp *)(d + off[5]),
		(int32_t *)(d + off[6]), (int32_t *)(d + off[7]), (int32_t *)(d + off[8]),
		(int32_t *)(d + off[9]) };
	return 0;
}

/* What a case expects of err, and of which experts' rows. */
enum { EXPECT_CLEAN, EXPECT_OVER_MAX, EXPECT_ABSENT };

/*
 * One routing of n tokens over the layer (ids mode: 0..2 moet_test_routing_ids's, 3 skewed),
 * owner row or not, max_tok (0: n when ids are distinct per token, else n * TOP_K), against
 * the host-grouped call. expect: EXPECT_ABSENT drops expert `gone` from the table.
 */
static void run_case(const layer *L, int64_t n, int mode, int owned, int64_t max_tok,
		     int expect, int gone)
{
	const int64_t P = n * TOP_K, E = L->E, H = L->H, I = L->I;
	const int n_dev = owned ? 2 : 1;
	char what[160];
	snprintf(what, sizeof(what), "%s %lldx%lld E %lld n %lld ids %d owner %d max_tok %lld",
		 L->dt == MOET_DT_F8_E4M3 ? "F8" : "BF16", (long long)I, (long long)H,
		 (long long)E, (long long)n, mode, owned, (long long)max_tok);
	int32_t *ids = malloc((size_t)P * sizeof(*ids)), *tok = malloc((size_t)P * sizeof(*tok));
	int16_t owner[MAX_E];
	uint8_t resident[MAX_E];
	float *x = malloc((size_t)(n * H) * sizeof(float));
	const size_t ybytes = (size_t)(P * H) * sizeof(float);
	const size_t hbytes = moet_gpu_expert_scratch_bytes(P, I);
	float *yr = malloc(ybytes), *yd = malloc(ybytes);
	uint8_t *poison = malloc(ybytes > hbytes ? ybytes : hbytes);
	moet_gpu_group_bufs r = { 0 };
	r.pairs = malloc((size_t)P * sizeof(*r.pairs));
	r.slot = malloc((size_t)P * 4);
	r.tier_first = malloc(12), r.tier_count = malloc(12);
	r.dev0 = malloc(MAX_E * sizeof(*r.dev0)), r.dev0_class = malloc(MAX_E * sizeof(*r.dev0));
	r.class_first = malloc(N_CL * 4), r.class_count = malloc(N_CL * 4);
	r.n_dev0 = malloc(4), r.err = malloc(12);
	moet_gpu_expert *ge = malloc(MAX_E * sizeof(*ge));
	groups g = { 0 };
	void *gscr = NULL, *dx = NULL, *dids = NULL, *dtok = NULL, *dy = NULL, *dyr = NULL;
	void *dh = NULL, *downer = NULL;
	int32_t *derr = NULL;
	moet_gpu_expert_ptrs *dtab = NULL;
	moet_gpu_expert_geom geom;
	size_t gneed = 0;
	n_cases++;
	if (!ids || !tok || !x || !yr || !yd || !poison || !r.pairs || !r.slot || !r.tier_first ||
	    !r.tier_count || !r.dev0 || !r.dev0_class || !r.class_first || !r.class_count ||
	    !r.n_dev0 || !r.err || !ge) {
		CHECK(0, "%s: out of host memory", what);
		goto out;
	}
	if (mode == 3)
		skewed_ids(ids, n, E);
	else
		moet_test_routing_ids(ids, n, TOP_K, E, mode, &rng_state);
	if (max_tok == 0)
		max_tok = mode == 2 ? P : n;
	for (int64_t e = 0; e < E; e++) {
		owner[e] = (int16_t)(owned ? (int)(rnd() % 3) - 1 : 0);
		resident[e] = owner[e] == 0 && e != gone;
	}
	for (int64_t i = 0; i < n * H; i++)
		x[i] = (rnd() % 16) ? rnd_unit() * 2.0f : 0.0f;

	/* host grouping and the host-grouped call */
	int rc = moet_group_ref(ids, P, E, owned ? owner : NULL, n_dev, &r);
	CHECK(rc == 0, "%s: group_ref: %s", what, moet_errmsg());
	const int n0 = r.tier_count[0], nx = *r.n_dev0;
	for (int i = 0; i < nx; i++) {
		ge[i] = L->view[r.dev0[i].expert];
		ge[i].n_tok = r.dev0[i].n_tok;
		if (expect == EXPECT_CLEAN) {
			seen_class[class_of(r.dev0[i].n_tok)]++;
			seen_partial |= r.dev0[i].n_tok > 16 && r.dev0[i].n_tok % 16;
		}
	}
	for (int q = 0; q < n0; q++)
		tok[q] = (int32_t)(r.pairs[q].pair / TOP_K);
	memset(poison, 0xFF, ybytes > hbytes ? ybytes : hbytes);
	rc = rc ? rc : moet_gpu_group_scratch_bytes(P, E, &gneed);
	rc = rc ? rc : groups_make(&g, P, n_dev);
	rc = rc || !(gscr = up(NULL, gneed)) || !(dx = up(x, (size_t)(n * H) * 4)) ||
	     !(dids = up(ids, (size_t)P * 4)) || !(dtok = up(tok, (size_t)(n0 ? n0 : 1) * 4)) ||
	     !(dy = up(poison, ybytes)) || !(dyr = up(poison, ybytes)) ||
	     !(dh = up(NULL, hbytes)) || !(derr = up(NULL, 4)) ||
	     !(downer = up(owner, (size_t)E * 2)) || !(dtab = table_up(L, resident, &geom));
	if (rc) {
		CHECK(0, "%s: setup: %s", what, moet_errmsg());
		goto out;
	}
	rc = dev_fail(moet_gpu_expert_ffn(ge, nx, dx, n, dtok, dh, hbytes, dyr, NULL), what);
	rc = rc ? rc : down(yr, dyr, ybytes);
	rc = rc ? rc : dev_fail(moet_gpu_group_pairs(dids, P, E, owned ? downer : NULL, n_dev,
						     gscr, gneed, &g.b, NULL), what);
	static const char *const variant[2] = { "ref", "wide" }, *const pdl[2] = { "0", "1" };
	for (int vp = 0; vp < 4 && !rc; vp++) {
		setenv("MOET_GPU_ROWS_KERNEL", variant[vp / 2], 1);
		setenv("MOET_GPU_PDL", pdl[vp % 2], 1);
		int32_t err = -1;
		rc = dev_fail(moet_gpu_copy_h2d(dy, poison, ybytes), "h2d");
		rc = rc ? rc : dev_fail(moet_gpu_copy_h2d(dh, poison, hbytes), "h2d");
		rc = rc ? rc : dev_fail(moet_gpu_experts_devgroup(&geom, dtab, &g.b, P, TOP_K,
								  max_tok, dx, n, dh, hbytes, dy,
								  derr, NULL), what);
		rc = rc ? rc : down(yd, dy, ybytes);
		rc = rc ? rc : down(&err, derr, 4);
		unsetenv("MOET_GPU_ROWS_KERNEL");
		unsetenv("MOET_GPU_PDL");
		if (rc)
			break;
		const int want = expect == EXPECT_OVER_MAX ? MOET_GPU_DEVGROUP_OVER_MAX :
				 expect == EXPECT_ABSENT ? MOET_GPU_DEVGROUP_ABSENT : 0;
		CHECK(err == want, "%s [%s, pdl %s]: err %d, want %d", what, variant[vp / 2],
		      pdl[vp % 2], err, want);
		/* device 0's rows: equal, or (skipped experts) poison; the other rows: poison */
		for (int i = 0; i < nx; i++) {
			const moet_gpu_group_exp *x0 = &r.dev0[i];
			const int skipped = (expect == EXPECT_OVER_MAX &&
					     class_of(x0->n_tok) > class_of((int)max_tok)) ||
					    (expect == EXPECT_ABSENT && x0->expert == gone);
			const size_t at = (size_t)x0->first * (size_t)H;
			const size_t cnt = (size_t)x0->n_tok * (size_t)H;
			char w2[240];
			snprintf(w2, sizeof(w2), "%s [%s, pdl %s] expert %d (%d pairs at %d)", what,
				 variant[vp / 2], pdl[vp % 2], x0->expert, x0->n_tok, x0->first);
			if (!same_bits(w2, yd + at, skipped ? (const float *)poison : yr + at,
				       cnt, 0))
				break;
			n_rows_checked += skipped ? 0 : x0->n_tok;
		}
		same_bits(what, yd + (size_t)n0 * H, (const float *)poison, (size_t)(P - n0) * H, 0);
	}
out:
	moet_gpu_free(g.blk), moet_gpu_free(gscr), moet_gpu_free(dx), moet_gpu_free(dids);
	moet_gpu_free(dtok), moet_gpu_free(dy), moet_gpu_free(dyr), moet_gpu_free(dh);
	moet_gpu_free(derr), moet_gpu_free(downer), moet_gpu_free(dtab);
	free(ids), free(tok), free(x), free(yr), free(yd), free(poison), free(ge);
	free(r.pairs), free(r.slot), free(r.tier_first), free(r.tier_count), free(r.dev0);
	free(r.dev0_class), free(r.class_first), free(r.class_count), free(r.n_dev0), free(r.err);
}

static void test_matrix(void)
{
	static const int64_t ns[] = { 1, 2, 5, 16, 64, 257 };
	static const struct {
		moet_dtype dt;
		int64_t I, H, E;
	} shapes[] = { { MOET_DT_F8_E4M3, 144, 208, 64 }, { MOET_DT_F8_E4M3, 144, 208, 384 },
		       { MOET_DT_BF16, 144, 208, 256 }, { MOET_DT_F8_E4M3, 67, 129, 64 } };
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		layer L;
		const double t0 = moet_test_now_ms();
		if (layer_make(&L, shapes[s].dt, shapes[s].I, shapes[s].H, shapes[s].E))
			continue;
		for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
			for (int mode = 0; mode < 4; mode++)
				for (int owned = 0; owned < 2; owned++)
					run_case(&L, ns[a], mode, owned, 0, EXPECT_CLEAN, -1);
		/* max_tok n_pairs where n would do: the same bits, more launches */
		run_case(&L, 16, 3, 0, 16 * TOP_K, EXPECT_CLEAN, -1);
		if (s == 0) {
			/* skewed: experts of 5+ pairs in classes that max_tok 4 leaves out */
			run_case(&L, 64, 3, 0, 4, EXPECT_OVER_MAX, -1);
			run_case(&L, 64, 3, 0, 0, EXPECT_ABSENT, 0); /* expert 0: skewed, always hit */
		}
		printf("%s %lldx%lld, %lld experts: %.0f ms\n",
		       shapes[s].dt == MOET_DT_F8_E4M3 ? "F8" : "BF16", (long long)shapes[s].I,
		       (long long)shapes[s].H, (long long)shapes[s].E, moet_test_now_ms() - t0);
		layer_free(&L);
	}
	/* Kimi-K2's expert geometry: 64 experts of 2048 x 7168 (2.8 GB), if memory permits */
	layer L;
	const double t0 = moet_test_now_ms();
	if (layer_make(&L, MOET_DT_F8_E4M3, 2048, 7168, 64) == 0) {
		static const int64_t kn[] = { 1, 5, 64, 257 };
		for (size_t a = 0; a < sizeof(kn) / sizeof(kn[0]); a++)
			run_case(&L, kn[a], a == 3 ? 3 : 0, a == 2, 0, EXPECT_CLEAN, -1);
		printf("F8 2048x7168, 64 experts: %.0f ms\n", moet_test_now_ms() - t0);
	}
	layer_free(&L);
	printf("cases %d, rows checked %lld; experts by class:", n_cases, n_rows_checked);
	for (int c = 0; c < N_CL; c++) {
		printf(" %d", seen_class[c]);
		CHECK(seen_class[c] > 0, "no expert of token-count class %d occurred", c);
	}
	printf("\n");
	CHECK(seen_partial, "no expert of 17+ tokens with a partial token tile occurred");
}

static void test_args(void)
{
	layer L;
	if (layer_make(&L, MOET_DT_F8_E4M3, 144, 208, 64))
		return;
	enum { n = 2, P = n * TOP_K };
	uint8_t resident[64];
	memset(resident, 1, sizeof(resident));
	moet_gpu_expert_geom geom, bad;
	moet_gpu_expert_ptrs *dtab = table_up(&L, resident, &geom), tab[64];
	groups g = { 0 };
	const size_t hb = moet_gpu_expert_scratch_bytes(P, L.I);
	/* x has a float more than n rows: the misaligned-x call reads from dx + 1 */
	void *dx = up(NULL, (size_t)(n * L.H + 1) * 4), *dy = up(NULL, (size_t)(P * L.H) * 4);
	void *dh = up(NULL, hb), *dids = NULL, *gscr = NULL;
	int32_t *derr = up(NULL, 4), err = 7, ids[P];
	size_t gneed = 0;
	moet_test_routing_ids(ids, n, TOP_K, L.E, 0, &rng_state);
	if (!dtab || groups_make(&g, P, 1) || !dx || !dy || !dh || !derr ||
	    moet_gpu_group_scratch_bytes(P, L.E, &gneed) || !(gscr = up(NULL, gneed)) ||
	    !(dids = up(ids, sizeof(ids))) ||
	    moet_gpu_group_pairs(dids, P, L.E, NULL, 1, gscr, gneed, &g.b, NULL)) {
		CHECK(0, "args: setup: %s", moet_errmsg());
		goto out;
	}
#define DG(geom_, tab_, grp_, np_, k_, mt_, x_, hb_, err_)                                     \
	moet_gpu_experts_devgroup(geom_, tab_, grp_, np_, k_, mt_, x_, n, dh, hb_, dy, err_, NULL)
	CHECK(DG(NULL, dtab, &g.b, P, TOP_K, n, dx, hb, derr) == MOET_EINVAL, "NULL geometry");
	CHECK(DG(&geom, NULL, &g.b, P, TOP_K, n, dx, hb, derr) == MOET_EINVAL, "NULL table");
	CHECK(DG(&geom, dtab, NULL, P, TOP_K, n, dx, hb, derr) == MOET_EINVAL, "NULL groups");
	CHECK(DG(&geom, dtab, &g.b, P, TOP_K, n, dx, hb, NULL) == MOET_EINVAL, "NULL err");
	CHECK(DG(&geom, dtab, &g.b, P, TOP_K, n, NULL, hb, derr) == MOET_EINVAL, "NULL x");
	CHECK(DG(&geom, dtab, &g.b, P, 0, n, dx, hb, derr) == MOET_EINVAL, "top_k 0");
	CHECK(DG(&geom, dtab, &g.b, P, TOP_K, 0, dx, hb, derr) == MOET_EINVAL, "max_tok 0");
	CHECK(DG(&geom, dtab, &g.b, MOET_GPU_GROUP_MAX_PAIRS + 1, TOP_K, n, dx, hb, derr) ==
	      MOET_EINVAL && strstr(moet_errmsg(), "pairs"), "too many pairs: %s", moet_errmsg());
	CHECK(DG(&geom, dtab, &g.b, P, TOP_K, n, dx, hb - 1, derr) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "scratch"), "small scratch: %s", moet_errmsg());
	CHECK(DG(&geom, dtab, &g.b, P, TOP_K, n, (float *)dx + 1, hb, derr) == 0,
	      "x 4-byte aligned (no 16-byte staging): %s", moet_errmsg());
	bad = geom;
	bad.dtype = MOET_DT_F32;
	CHECK(DG(&bad, dtab, &g.b, P, TOP_K, n, dx, hb, derr) == MOET_EUNSUP, "F32 weights");
	bad = geom;
	bad.inter = 0;
	CHECK(DG(&bad, dtab, &g.b, P, TOP_K, n, dx, hb, derr) == MOET_EINVAL, "I 0");
	CHECK(moet_gpu_copy_h2d(derr, &err, 4) == 0 &&
	      DG(&geom, dtab, &g.b, 0, TOP_K, n, NULL, 0, derr) == 0 && down(&err, derr, 4) == 0 &&
	      err == 0, "no pairs: err %d (%s)", err, moet_errmsg());
#undef DG
	/* the table */
	moet_gpu_expert v[64];
	memcpy(v, L.view, sizeof(v));
	CHECK(moet_gpu_expert_table(NULL, 64, tab, &geom) == MOET_EINVAL, "NULL experts");
	CHECK(moet_gpu_expert_table(v, 0, tab, &geom) == MOET_EINVAL, "no experts");
	v[3].up.rows++;
	CHECK(moet_gpu_expert_table(v, 64, tab, &geom) == MOET_ESHAPE &&
	      strstr(moet_errmsg(), "expert 3"), "bad up: %s", moet_errmsg());
	v[3] = L.view[3];
	v[5].down.data = (uint8_t *)v[5].down.data + 1;
	CHECK(moet_gpu_expert_table(v, 64, tab, &geom) == 0 && !geom.down16 && geom.up16,
	      "a misaligned down: %s", moet_errmsg());
	for (int e = 0; e < 64; e++)
		v[e].gate.data = NULL;
	CHECK(moet_gpu_expert_table(v, 64, tab, &geom) == MOET_EINVAL &&
	      strstr(moet_errmsg(), "resident"), "none resident: %s", moet_errmsg());
	printf("arguments: %s\n", moet_errmsg());
out:
	moet_gpu_free(dtab), moet_gpu_free(g.blk), moet_gpu_free(dx), moet_gpu_free(dy);
	moet_gpu_free(dh), moet_gpu_free(derr), moet_gpu_free(dids), moet_gpu_free(gscr);
	layer_free(&L);
}

int main(void)
{
	const char *why = NULL;
	if (moet_gpu_count(&why) == 0) {
		printf("skip: no GPU (%s)\n", why ? why : "?");
		return MOET_TEST_SKIP;
	}
	test_matrix();
	test_args();
	return moet_test_done("test_gpu_devgroup");
}
