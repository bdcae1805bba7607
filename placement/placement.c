/*
 * placement.c: the resolved placement table, its memory accounting, and the writer.
 *
 * The table is owner[layer][expert] (int16: a GPU index or MOET_PLACEMENT_CPU), one row per
 * layer of the model, dense layers included (all CPU, never set), so that the engine indexes
 * it with the layer number it already has. place_yaml.c fills it from a file; the planner
 * fills it with moet_placement_set_owner and writes it with moet_placement_write.
 *
 * Accounting. A GPU's total = sum of expert_bytes[l][e] over the (l, e) it owns + its share
 * of the dense part + its reserve. The share is all of sz->dense_bytes for `dense: NAME` (on
 * that GPU) and moet_placement_dense_share's for `split`.
 * `split` counts what the engine's tensor-parallel split (runtime/tp.c, MOET_TP) puts on each
 * GPU: each GPU its rows of the split matrices (common/moet_tpsplit.h, sizes from the
 * geometry), the first GPU also everything left whole (embedding, norms, q_a, kv_a, routers,
 * tensors of no known part); over more than MOET_PLACEMENT_TP_MAX GPUs an even share.
 *
 * Writer. Every MoE layer is written explicitly (no default), so that the planner can put its
 * comment (expected hit rate) above each; expert sets as sorted "a-b,c" strings, always
 * quoted so that they read the same in block and flow context.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "place_int.h"

#define GIB(b) ((double)(b) / (double)(1ull << 30))

int place_name_ok(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n >= MOET_PLACEMENT_NAME_BYTES || !strcmp(s, "cpu"))
		return -1;
	if (!((s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z') || s[0] == '_'))
		return -1;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '.' || c == '-'))
			return -1;
	}
	return 0;
}

int place_alloc(const char *label, const moet_config *cf, moet_placement **out)
{
	*out = NULL;
	if (cf->num_hidden_layers <= 0 || cf->n_routed_experts < 0 ||
	    cf->num_hidden_layers > (1 << 20) || cf->n_routed_experts > (1 << 20))
		return moet_err(MOET_EINVAL, "%s: geometry out of range (%" PRId64 " layers, %"
				PRId64 " experts)", label, cf->num_hidden_layers,
				cf->n_routed_experts);
	moet_placement *p = calloc(1, sizeof(*p));
	if (!p)
		return moet_err(MOET_ENOMEM, "out of memory");
	p->n_layers = cf->num_hidden_layers;
	p->n_experts = cf->n_routed_experts;
	p->dense_gpu = MOET_PLACEMENT_DENSE_SPLIT;
	size_t n = (size_t)p->n_layers * (size_t)p->n_experts;
	p->label = strdup(label);
	p->is_moe = calloc((size_t)p->n_layers, 1);
	p->owner = malloc((n ? n : 1) * sizeof(int16_t));
	if (!p->label || !p->is_moe || !p->owner) {
		moet_placement_free(p);
		return moet_err(MOET_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < n; i++)
		p->owner[i] = MOET_PLACEMENT_CPU;
	for (int64_t l = 0; l < p->n_layers; l++)
		p->is_moe[l] = moet_config_is_moe_layer(cf, l);
	*out = p;
	return 0;
}

void moet_placement_free(moet_placement *p)
{
	if (!p)
		return;
	free(p->label);
	free(p->gpus);
	free(p->is_moe);
	free(p->owner);
	free(p);
}

int moet_placement_create(const char *label, const moet_config *cf, int n_gpus,
			  const moet_placement_gpu *gpus, int dense_gpu, moet_placement **out)
{
	moet_placement *p = NULL;
	*out = NULL;
	if (n_gpus < 0 || n_gpus > MOET_PLACEMENT_MAX_GPUS)
		return moet_err(MOET_EINVAL, "%s: %d GPUs (at most %d)", label, n_gpus,
				MOET_PLACEMENT_MAX_GPUS);
	if (dense_gpu != MOET_PLACEMENT_DENSE_SPLIT && (dense_gpu < 0 || dense_gpu >= n_gpus))
		return moet_err(MOET_EINVAL, "%s: dense GPU %d out of range", label, dense_gpu);
	for (int g = 0; g < n_gpus; g++) {
		if (!memchr(gpus[g].name, 0, sizeof(gpus[g].name)) || place_name_ok(gpus[g].name))
			return moet_err(MOET_EINVAL, "%s: GPU %d: bad name (letters, digits, _ . -,"
					" starting with a letter or _, not \"cpu\")", label, g);
		for (int h = 0; h < g; h++)
			if (!strcmp(gpus[g].name, gpus[h].name))
				return moet_err(MOET_EINVAL, "%s: GPU name %s given twice", label,
						gpus[g].name);
		if (!gpus[g].budget_bytes)
			return moet_err(MOET_EINVAL, "%s: gpu %s: budget 0", label, gpus[g].name);
	}
	int rc = place_alloc(label, cf, &p);
	if (rc)
		return rc;
	if (n_gpus) {
		p->gpus = malloc((size_t)n_gpus * sizeof(*p->gpus));
		if (!p->gpus) {
			moet_placement_free(p);
			return moet_err(MOET_ENOMEM, "out of memory");
		}
		memcpy(p->gpus, gpus, (size_t)n_gpus * sizeof(*p->gpus));
	}
	p->n_gpus = n_gpus;
	p->dense_gpu = dense_gpu;
	*out = p;
	return 0;
}

int moet_placement_set_owner(moet_placement *p, int64_t layer, int64_t expert, int owner)
{
	if (layer < 0 || layer >= p->n_layers || expert < 0 || expert >= p->n_experts)
		return moet_err(MOET_ERANGE, "%s: (layer %" PRId64 ", expert %" PRId64 ") out of "
				"range", p->label, layer, expert);
	if (owner < MOET_PLACEMENT_CPU || owner >= p->n_gpus)
		return moet_err(MOET_ERANGE, "%s: owner %d out of range (%d GPUs)", p->label, owner,
				p->n_gpus);
	if (!p->is_moe[layer])
		return moet_err(MOET_EINVAL, "%s: layer %" PRId64 " is not a MoE layer", p->label,
				layer);
	p->owner[layer * p->n_experts + expert] = (int16_t)owner;
	return 0;
}

/* ---- accessors ---------------------------------------------------------------------------- */

int moet_placement_n_gpus(const moet_placement *p) { return p->n_gpus; }
int moet_placement_dense_gpu(const moet_placement *p) { return p->dense_gpu; }
int64_t moet_placement_n_layers(const moet_placement *p) { return p->n_layers; }
int64_t moet_placement_n_experts(const moet_placement *p) { return p->n_experts; }
const char *moet_placement_label(const moet_placement *p) { return p->label; }
const int16_t *moet_placement_owners(const moet_placement *p) { return p->owner; }

const moet_placement_gpu *moet_placement_gpu_at(const moet_placement *p, int g)
{
	return g >= 0 && g < p->n_gpus ? &p->gpus[g] : NULL;
}

int moet_placement_owner(const moet_placement *p, int64_t layer, int64_t expert)
{
	if (layer < 0 || layer >= p->n_layers || expert < 0 || expert >= p->n_experts)
		return MOET_PLACEMENT_CPU;
	return p->owner[layer * p->n_experts + expert];
}

/* ---- accounting --------------------------------------------------------------------------- */

uint64_t moet_placement_dense_share(const moet_placement_sizes *sz, int n_gpus, int dense_gpu,
				    int g)
{
	if (g < 0 || g >= n_gpus)
		return 0;
	if (dense_gpu != MOET_PLACEMENT_DENSE_SPLIT)
		return dense_gpu == g ? sz->dense_bytes : 0;
	if (n_gpus == 1)
		return sz->dense_bytes;
	if (n_gpus <= MOET_PLACEMENT_TP_MAX) /* the engine's split (MOET_TP) */
		return sz->tp_bytes[n_gpus][g] + (g == 0 ? sz->tp_whole : 0);
	/* NOTE: more GPUs than the split spans: an even share (the engine refuses such a file) */
	return sz->dense_bytes / (uint64_t)n_gpus +
	       (g == 0 ? sz->dense_bytes % (uint64_t)n_gpus : 0);
}

int moet_placement_usage_of(const moet_placement *p, const moet_placement_sizes *sz, int g,
			    moet_placement_usage *out)
{
	memset(out, 0, sizeof(*out));
	if (g < MOET_PLACEMENT_CPU || g >= p->n_gpus)
		return moet_err(MOET_EINVAL, "%s: no GPU %d", p->label, g);
	if (sz->n_layers != p->n_layers || sz->n_experts != p->n_experts)
		return moet_err(MOET_EINVAL, "%s: sizes are for %" PRId64 " layers x %" PRId64
				" experts, the placement for %" PRId64 " x %" PRId64, p->label,
				sz->n_layers, sz->n_experts, p->n_layers, p->n_experts);
	bool any_moe = false;
	out->min_per_layer = INT64_MAX;
	for (int64_t l = 0; l < p->n_layers; l++) {
		if (!p->is_moe[l])
			continue;
		any_moe = true;
		int64_t n = 0;
		const int16_t *row = p->owner + l * p->n_experts;
		const uint64_t *bytes = sz->expert_bytes + l * sz->n_experts;
		for (int64_t e = 0; e < p->n_experts; e++)
			if (row[e] == g) {
				n++;
				out->expert_bytes += bytes[e];
			}
		out->n_experts += n;
		out->min_per_layer = n < out->min_per_layer ? n : out->min_per_layer;
		out->max_per_layer = n > out->max_per_layer ? n : out->max_per_layer;
	}
	if (!any_moe)
		out->min_per_layer = 0;
	if (g == MOET_PLACEMENT_CPU) {
		out->dense_bytes = p->n_gpus ? 0 : sz->dense_bytes;
	} else {
		const moet_placement_gpu *G = &p->gpus[g];
		out->dense_bytes = moet_placement_dense_share(sz, p->n_gpus, p->dense_gpu, g);
		out->reserve_bytes = G->reserve_bytes;
		out->budget_bytes = G->budget_bytes;
	}
	out->total_bytes = out->expert_bytes + out->dense_bytes + out->reserve_bytes;
	return 0;
}

int moet_placement_check(const moet_placement *p, const moet_placement_sizes *sz)
{
	for (int g = 0; g < p->n_gpus; g++) {
		moet_placement_usage u;
		int rc = moet_placement_usage_of(p, sz, g, &u);
		if (rc)
			return rc;
		if (u.total_bytes <= u.budget_bytes)
			continue;
		char where[16] = "";
		if (p->gpus[g].line > 0)
			snprintf(where, sizeof(where), ":%d", p->gpus[g].line);
		return moet_err(MOET_ERANGE, "%s%s: gpu %s over its budget: %" PRIu64 " bytes "
				"(%.2f GiB = experts %.2f + dense %.2f + reserve %.2f) > budget %"
				PRIu64 " bytes (%.2f GiB); %" PRId64 " experts, %" PRId64 "-%"
				PRId64 " per layer (sizes from the %s)", p->label, where,
				p->gpus[g].name, u.total_bytes, GIB(u.total_bytes),
				GIB(u.expert_bytes), GIB(u.dense_bytes), GIB(u.reserve_bytes),
				u.budget_bytes, GIB(u.budget_bytes), u.n_experts,
				u.min_per_layer, u.max_per_layer,
				sz->from_ckpt ? "checkpoint" : "geometry");
	}
	return 0;
}

/* ---- sizes as text ------------------------------------------------------------------------ */

int moet_placement_parse_bytes(const char *s, uint64_t *out)
{
	static const struct { const char *unit; uint64_t mul; } units[] = {
		{ "", 1 }, { "B", 1 }, { "KB", 1000ull }, { "MB", 1000000ull },
		{ "GB", 1000000000ull }, { "TB", 1000000000000ull }, { "KiB", 1ull << 10 },
		{ "MiB", 1ull << 20 }, { "GiB", 1ull << 30 }, { "TiB", 1ull << 40 },
	};
	const uint64_t limit = 1ull << 60;
	const char *p = s;
	uint64_t whole = 0, frac = 0, frac_div = 1;
	int n_digits = 0;
	*out = 0;
	while (*p >= '0' && *p <= '9') {
		whole = whole * 10 + (uint64_t)(*p++ - '0');
		if (whole > limit)
			goto bad;
		n_digits++;
	}
	if (*p == '.') {
		p++;
		while (*p >= '0' && *p <= '9') {
			if (frac_div == 1000)
				goto bad; /* at most 3 decimals */
			frac = frac * 10 + (uint64_t)(*p++ - '0');
			frac_div *= 10;
			n_digits++;
		}
	}
	if (!n_digits)
		goto bad;
	while (*p == ' ')
		p++;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(p, units[i].unit))
			continue;
		if (frac_div > 1 && units[i].mul == 1)
			goto bad; /* fractions of a byte */
		if (whole > limit / units[i].mul)
			goto bad;
		*out = whole * units[i].mul + frac * units[i].mul / frac_div;
		return 0;
	}
bad:
	return moet_err(MOET_EFORMAT, "'%s' is not a byte size (bytes, or a number with at most "
			"3 decimals and a unit B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; below 2^60)",
			s);
}

/* The shortest exact form: "139GiB", "32GB", "1536MiB", or plain bytes. */
static void fmt_bytes(uint64_t b, char *buf, size_t n)
{
	static const struct { const char *unit; uint64_t mul; } units[] = {
		{ "TiB", 1ull << 40 }, { "TB", 1000000000000ull }, { "GiB", 1ull << 30 },
		{ "GB", 1000000000ull }, { "MiB", 1ull << 20 }, { "MB", 1000000ull },
		{ "KiB", 1ull << 10 }, { "KB", 1000ull },
	};
	for (size_t i = 0; b && i < sizeof(units) / sizeof(units[0]); i++)
		if (b % units[i].mul == 0) {
			snprintf(buf, n, "%" PRIu64 "%s", b / units[i].mul, units[i].unit);
			return;
		}
	snprintf(buf, n, "%" PRIu64, b);
}

/* ---- writer ------------------------------------------------------------------------------- */

/* `text` as comment lines, each prefixed by `indent` and "# ". */
static void put_comment(FILE *f, const char *indent, const char *text)
{
	const char *s = text;
	while (*s || s == text) {
		const char *nl = strchr(s, '\n');
		size_t n = nl ? (size_t)(nl - s) : strlen(s);
		fprintf(f, "%s#%s%.*s\n", indent, n ? " " : "", (int)n, s);
		if (!nl)
			break;
		s = nl + 1;
	}
}

/* The experts of `row` owned by g as "a-b,c,..." (nothing written if none). */
static void put_set(FILE *f, const int16_t *row, int64_t n, int g)
{
	bool first = true;
	for (int64_t e = 0; e < n;) {
		if (row[e] != g) {
			e++;
			continue;
		}
		int64_t end = e;
		while (end + 1 < n && row[end + 1] == g)
			end++;
		fprintf(f, "%s%" PRId64, first ? "" : ",", e);
		if (end > e)
			fprintf(f, "-%" PRId64, end);
		first = false;
		e = end + 1;
	}
}

int moet_placement_write(const moet_placement *p, const char *header,
			 const char *const *layer_comments, char **out_text)
{
	char *text = NULL, b1[32], b2[32];
	size_t len = 0;
	*out_text = NULL;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return moet_err(MOET_ENOMEM, "out of memory");
	if (header)
		put_comment(f, "", header);
	fprintf(f, "gpus:%s\n", p->n_gpus ? "" : " []");
	for (int g = 0; g < p->n_gpus; g++) {
		fmt_bytes(p->gpus[g].budget_bytes, b1, sizeof(b1));
		fmt_bytes(p->gpus[g].reserve_bytes, b2, sizeof(b2));
		fprintf(f, "  - {name: %s, budget: %s, reserve: %s}\n", p->gpus[g].name, b1, b2);
	}
	fprintf(f, "dense: %s\nlayers:\n", p->dense_gpu == MOET_PLACEMENT_DENSE_SPLIT ?
		"split" : p->gpus[p->dense_gpu].name);
	bool any = false;
	for (int64_t l = 0; l < p->n_layers; l++) {
		if (!p->is_moe[l])
			continue;
		any = true;
		if (layer_comments && layer_comments[l])
			put_comment(f, "  ", layer_comments[l]);
		const int16_t *row = p->owner + l * p->n_experts;
		bool held[MOET_PLACEMENT_MAX_GPUS] = { false }, none = true;
		for (int64_t e = 0; e < p->n_experts; e++)
			if (row[e] >= 0) {
				held[row[e]] = true;
				none = false;
			}
		fprintf(f, "  %" PRId64 ":%s\n", l, none ? " {}" : "");
		for (int g = 0; g < p->n_gpus; g++) {
			if (!held[g])
				continue;
			fprintf(f, "    %s: \"", p->gpus[g].name);
			put_set(f, row, p->n_experts, g);
			fputs("\"\n", f);
		}
	}
	if (!any)
		fputs("  {}\n", f);
	if (fclose(f) || !text) {
		free(text);
		return moet_err(MOET_ENOMEM, "out of memory");
	}
	*out_text = text;
	return 0;
}

int moet_placement_save(const moet_placement *p, const char *path, const char *header,
			const char *const *layer_comments)
{
	char *text = NULL;
	int rc = moet_placement_write(p, header, layer_comments, &text);
	if (rc)
		return rc;
	FILE *f = fopen(path, "w");
	size_t n = strlen(text);
	bool ok = f && fwrite(text, 1, n, f) == n;
	if (f && fclose(f))
		ok = false;
	free(text);
	if (!ok)
		return moet_err(MOET_EIO, "%s: cannot write the placement", path);
	return 0;
}
