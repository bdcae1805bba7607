/*
 * test_heatmap.c: the SVG heatmap (placement/moet_heatmap.h) and `moet-hybrid heatmap`.
 *
 * - The color ramp: luminance never rises as the frequency grows (a fine grid over [0, 1]),
 *   and the ends differ clearly.
 * - A picture in memory (5 layers, layer 0 dense, 40 experts, 3 GPUs): well-formed XML by a
 *   small checker here (every tag closed in order, attributes quoted, only the five XML
 *   entities); exactly one cell per (MoE layer, expert) and none for the dense layer; one
 *   residency bar per GPU-resident expert with the owner's GPU; within a layer a cell with
 *   more routings is never lighter; a title with < & > in the model name stays well-formed.
 * - Faults: an owner out of range, no MoE layer: one line each.
 * - The binary on a tiny checkpoint with a profile and a placement made here: exit 0, a
 *   well-formed file with the placement's hit rate (our own count) in the title; a bad
 *   placement file is one line.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "moet_config.h"
#include "moet_err.h"
#include "moet_gen.h"
#include "moet_heatmap.h"
#include "moet_placement.h"
#include "moet_profile.h"
#include "moet_test.h"

static double lum(uint32_t c)
{
	return 0.2126 * (double)(c >> 16) + 0.7152 * (double)((c >> 8) & 255) +
	       0.0722 * (double)(c & 255);
}

static void test_ramp(void)
{
	double prev = lum(moet_heatmap_color(0));
	for (int i = 1; i <= 1000; i++) {
		double y = lum(moet_heatmap_color(i / 1000.0));
		CHECK(y <= prev + 1e-9, "luminance rises at f = %.3f: %.3f -> %.3f", i / 1000.0,
		      prev, y);
		prev = y;
	}
	CHECK(lum(moet_heatmap_color(0)) - lum(moet_heatmap_color(1)) > 150, "ramp too flat");
	CHECK(moet_heatmap_color(-1) == moet_heatmap_color(0) &&
	      moet_heatmap_color(7) == moet_heatmap_color(1) &&
	      moet_heatmap_color(NAN) == moet_heatmap_color(0), "clamping");
}

/* A small XML checker: tags nest and close in order, attribute values quoted, entities
 * known, one root element. 0 or the byte offset + 1 of the first fault. */
static size_t xml_check(const char *s)
{
	char stack[64][32];
	int depth = 0, roots = 0;
	const char *p = s;
	if (!strncmp(p, "<?xml", 5)) {
		p = strstr(p, "?>");
		if (!p)
			return 1;
		p += 2;
	}
	while (*p) {
		if (*p == '&') {
			static const char *const ent[] = { "&amp;", "&lt;", "&gt;", "&quot;",
							   "&apos;" };
			int ok = 0;
			for (int i = 0; i < 5; i++)
				ok |= !strncmp(p, ent[i], strlen(ent[i]));
			if (!ok)
				return (size_t)(p - s) + 1;
			p++;
			continue;
		}
		if (*p == '>')
			return (size_t)(p - s) + 1;
		if (*p != '<') {
			p++;
			continue;
		}
		int closing = p[1] == '/';
		const char *q = p + 1 + closing;
		size_t n = strspn(q, "abcdefghijklmnopqrstuvwxyz");
		if (!n || n >= 32)
			return (size_t)(p - s) + 1;
		char name[32];
		memcpy(name, q, n);
		name[n] = 0;
		q += n;
		/* attributes: name="value" */
		for (;;) {
			q += strspn(q, " \n");
			if (*q == '>' || (*q == '/' && q[1] == '>'))
				break;
			size_t an = strspn(q, "abcdefghijklmnopqrstuvwxyz"
					      "ABCDEFGHIJKLMNOPQRSTUVWXYZ-:");
			if (!an || q[an] != '=' || q[an + 1] != '"')
				return (size_t)(q - s) + 1;
			const char *v = q + an + 2;
			const char *end = strchr(v, '"');
			if (!end || memchr(v, '<', (size_t)(end - v)))
				return (size_t)(q - s) + 1;
			q = end + 1;
		}
		int self = *q == '/';
		p = q + (self ? 2 : 1);
		if (closing) {
			if (!depth || strcmp(stack[depth - 1], name))
				return (size_t)(q - s) + 1;
			depth--;
		} else if (!self) {
			if (depth == 64)
				return (size_t)(q - s) + 1;
			if (!depth)
				roots++;
			snprintf(stack[depth++], 32, "%s", name);
		} else if (!depth) {
			roots++;
		}
	}
	return depth || roots != 1 ? strlen(s) + 1 : 0;
}

enum { L = 5, E = 40, G = 3 };

static void test_picture(void)
{
	double sc[L * E];
	int16_t own[L * E];
	uint8_t is_moe[L] = { 0, 1, 1, 1, 1 };
	const char *names[G] = { "gpu0", "gpu1", "big-gpu" };
	int64_t resident = 0;
	for (int64_t l = 0; l < L; l++)
		for (int64_t e = 0; e < E; e++) {
			int64_t r = (e * 7 + 3 * l) % E;
			sc[l * E + e] = l ? floor(1000.0 / (1.0 + (double)r * (double)l)) : 0;
			own[l * E + e] = (int16_t)(l && r < 6 ? r % G : -1);
			resident += own[l * E + e] >= 0;
		}
	moet_heatmap_in in = { .model = "m<&>\"'", .profile = "p.json", .phase = "decode",
			       .placement = "x.yaml", .n_layers = L, .n_experts = E, .scores = sc,
			       .is_moe = is_moe, .owner = own, .n_gpus = G, .gpu_names = names,
			       .hit_rate = 0.5 };
	char *svg = NULL;
	CHECK(moet_heatmap_svg(&in, &svg) == 0, "%s", moet_errmsg());
	if (!svg)
		return;
	size_t bad = xml_check(svg);
	CHECK(bad == 0, "not well-formed at byte %zu: %.60s", bad - 1, svg + (bad ? bad - 1 : 0));
	CHECK(strstr(svg, "m&lt;&amp;&gt;&quot;&apos;") && strstr(svg, "hit rate 0.5000"),
	      "title");
	int seen[L * E] = { 0 }, cells = 0, bars = 0;
	double freq[L * E];
	uint32_t col[L * E];
	const char *p = svg;
	while ((p = strstr(p, "<rect class=\"cell\""))) {
		int64_t l = -1, e = -1;
		double f = -1;
		unsigned c = 0;
		int n = sscanf(p, "<rect class=\"cell\" data-layer=\"%" SCNd64 "\" data-expert=\"%"
			       SCNd64 "\" data-freq=\"%lf\"", &l, &e, &f);
		const char *fill = strstr(p, "fill=\"#");
		if (n == 3 && l >= 0 && l < L && e >= 0 && e < E && fill &&
		    sscanf(fill, "fill=\"#%6x\"", &c) == 1) {
			seen[l * E + e]++;
			freq[l * E + e] = f;
			col[l * E + e] = c;
		} else {
			CHECK(0, "cell: %.80s", p);
		}
		/* The bar, if any, follows its cell. */
		const char *next = strstr(p + 1, "<rect class=");
		if (next && !strncmp(next, "<rect class=\"gpu\"", 17)) {
			int g = -1;
			sscanf(next, "<rect class=\"gpu\" data-gpu=\"%d\"", &g);
			CHECK(l >= 0 && e >= 0 && g == own[l * E + e], "bar of layer %" PRId64
			      " expert %" PRId64 ": gpu %d", l, e, g);
			bars++;
		}
		cells++;
		p++;
	}
	CHECK(cells == (L - 1) * E, "%d cells, want %d", cells, (L - 1) * E);
	CHECK(bars == resident, "%d bars, %" PRId64 " resident", bars, resident);
	for (int64_t l = 0; l < L; l++) {
		double mx = 0;
		for (int64_t e = 0; e < E; e++)
			mx = sc[l * E + e] > mx ? sc[l * E + e] : mx;
		for (int64_t e = 0; e < E; e++) {
			const int64_t i = l * E + e;
			CHECK(seen[i] == (l ? 1 : 0), "layer %" PRId64 " expert %" PRId64
			      ": %d cells", l, e, seen[i]);
			if (!l)
				continue;
			CHECK(fabs(freq[i] - sc[i] / mx) < 1e-6, "freq %g want %g", freq[i],
			      sc[i] / mx);
			for (int64_t j = 0; j < E; j++)
				if (sc[i] > sc[l * E + j])
					CHECK(lum(col[i]) <= lum(col[l * E + j]),
					      "layer %" PRId64 ": expert %" PRId64
					      " busier but lighter than %" PRId64, l, e, j);
		}
	}
	free(svg);
	svg = NULL;
	own[3 * E + 2] = G;
	CHECK(moet_heatmap_svg(&in, &svg) == MOET_EINVAL && strstr(moet_errmsg(), "layer 3 "
	      "expert 2: owner 3 of 3 GPUs"), "%s", moet_errmsg());
	memset(is_moe, 0, sizeof(is_moe));
	in.owner = NULL;
	CHECK(moet_heatmap_svg(&in, &svg) == MOET_EINVAL && strstr(moet_errmsg(), "no MoE"),
	      "%s", moet_errmsg());
	free(svg);
}

static void test_cli(const char *tmp)
{
	char dir[1024], prof[1024], place[1024], svgf[1024], *out = NULL;
	moet_gen_params gp;
	moet_config cf;
	moet_profile *p = NULL;
	snprintf(dir, sizeof(dir), "%s/ck", tmp);
	snprintf(prof, sizeof(prof), "%s/p.json", tmp);
	snprintf(place, sizeof(place), "%s/p.yaml", tmp);
	snprintf(svgf, sizeof(svgf), "%s/h.svg", tmp);
	moet_gen_params_init(&gp);
	gp.n_layers = 3;
	if (moet_gen_checkpoint(dir, &gp) || moet_config_load(dir, &cf) ||
	    moet_profile_create(&cf, &p)) {
		CHECK(0, "setup: %s", moet_errmsg());
		goto done;
	}
	const int64_t NE = cf.n_routed_experts;
	double hit = 0, all = 0;
	for (int64_t l = 0; l < cf.num_hidden_layers; l++)
		for (int64_t e = 0; moet_config_is_moe_layer(&cf, l) && e < NE; e++) {
			uint64_t c = 10 + (uint64_t)((e * 13 + l) % NE);
			p->counts[moet_profile_at(p, MOET_PROFILE_DECODE, l) + e] = c;
			all += (double)c;
			hit += e < 4 ? (double)c : 0;
		}
	CHECK(moet_profile_save(p, prof) == 0, "%s", moet_errmsg());
	const char *yaml = "gpus:\n  - {name: a, budget: 1GiB}\n  - {name: b, budget: 1GiB}\n"
			   "default: {a: \"0-1\", b: \"2-3\"}\n";
	CHECK(moet_test_write_file(place, yaml, strlen(yaml)) == 0, "write");
	int st = moet_test_cli(&out, "heatmap --model %s --profile %s --placement %s --out %s", dir, prof,
		     place, svgf);
	char want[64];
	snprintf(want, sizeof(want), "hit rate %.4f", hit / all);
	CHECK(st == 0 && out && strstr(out, want), "heatmap: exit %d, want '%s'\n%s", st, want,
	      out ? out : "");
	free(out);
	out = NULL;
	FILE *f = fopen(svgf, "r");
	char *text = calloc(1, 1 << 20);
	if (f && text) {
		size_t n = fread(text, 1, (1 << 20) - 1, f);
		CHECK(n > 0 && xml_check(text) == 0 && strstr(text, want), "%s: %zu bytes", svgf,
		      n);
	} else {
		CHECK(0, "%s not written", svgf);
	}
	if (f)
		fclose(f);
	free(text);
	const char *bad = "gpus:\n  - {name: a, budget: 1GiB}\ndefault: {a: \"0-999\"}\n";
	CHECK(moet_test_write_file(place, bad, strlen(bad)) == 0, "write");
	st = moet_test_cli(&out, "heatmap --model %s --profile %s --placement %s --out %s", dir, prof, place,
		 svgf);
	CHECK(st == 1 && out && !strncmp(out, "moet-hybrid heatmap: ", 21) && strstr(out, ":3:") &&
	      strchr(out, '\n') == out + strlen(out) - 1, "bad placement: %s", out ? out : "");
done:
	free(out);
	moet_profile_free(p);
}

int main(void)
{
	char *tmp = moet_test_mkdtemp("heatmap");
	if (!tmp)
		return 1;
	test_ramp();
	test_picture();
	test_cli(tmp);
	free(tmp);
	return moet_test_done("test_heatmap");
}
