/*
 * heatmap.c: the SVG heatmap of a profile and a placement (moet_heatmap.h).
 *
 * Layout, in SVG user units (pixels):
 *
 *   +--------------------------------------------------------------+
 *   | title (model, profile, phase)                    MARGIN_TOP  |
 *   | subtitle (placement, hit rate, GPU experts)                  |
 *   | "layer 1" [cw x ch cells ............................]       |
 *   | "layer 2" [.........................................]       |
 *   | expert ticks 0, 64, 128 ...                                  |
 *   | legend: ramp of 11 swatches 0 .. 1, GPU swatches with counts |
 *   +--------------------------------------------------------------+
 *
 * Cell sizes adapt to the geometry (the grid is about 1200 x 600 at most, each cell at least
 * 2 x 4). Text is escaped (& < > " ') so any path can be in the title.
 *
 * NOTE: the ramp is YlOrRd-like, nine stops chosen here with falling luminance, interpolated
 * linearly per channel; each channel falls or stays between consecutive stops, so the
 * luminance of the interpolation falls too (test_heatmap checks it on a fine grid).
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_heatmap.h"

#define MARGIN_LEFT 70
#define MARGIN_TOP 64
#define MARGIN_RIGHT 20
#define GRID_W 1200
#define GRID_H 600

/* Stops of the ramp (every channel non-increasing from one stop to the next). */
static const uint8_t ramp[][3] = {
	{ 255, 255, 229 }, { 255, 247, 188 }, { 254, 227, 145 }, { 254, 196, 79 },
	{ 254, 153, 41 },  { 236, 112, 20 },  { 204, 76, 6 },    { 153, 52, 4 },
	{ 102, 37, 2 },
};
#define N_RAMP ((int)(sizeof(ramp) / sizeof(ramp[0])))

static const char *const gpu_colors[] = {
	"#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#e377c2", "#3b3b98", "#bcbd22", "#0b6e4f",
};
#define N_GPU_COLORS ((int)(sizeof(gpu_colors) / sizeof(gpu_colors[0])))

uint32_t moet_heatmap_color(double f)
{
	if (!(f > 0))
		f = 0;
	if (f > 1)
		f = 1;
	double x = f * (N_RAMP - 1);
	int i = (int)x;
	if (i >= N_RAMP - 1)
		i = N_RAMP - 2;
	double t = x - i;
	uint32_t c = 0;
	for (int k = 0; k < 3; k++) {
		double v = ramp[i][k] + t * (ramp[i + 1][k] - ramp[i][k]);
		c = (c << 8) | (uint32_t)lround(v);
	}
	return c;
}

/* ---- a growable text buffer --------------------------------------------------------------- */

typedef struct buf {
	char *p;
	size_t n, cap;
	int err;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...)
{
	if (b->err)
		return;
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
		va_end(ap);
		if (k < 0) {
			b->err = MOET_EINVAL;
			return;
		}
		if ((size_t)k < b->cap - b->n) {
			b->n += (size_t)k;
			return;
		}
		size_t cap = (b->cap + (size_t)k + 1) * 2;
		char *q = realloc(b->p, cap);
		if (!q) {
			b->err = MOET_ENOMEM;
			return;
		}
		b->p = q;
		b->cap = cap;
	}
}

/* Text content with & < > " ' escaped. */
static void put_text(buf *b, const char *s)
{
	for (; s && *s; s++) {
		switch (*s) {
		case '&': put(b, "&amp;"); break;
		case '<': put(b, "&lt;"); break;
		case '>': put(b, "&gt;"); break;
		case '"': put(b, "&quot;"); break;
		case '\'': put(b, "&apos;"); break;
		default:
			/* NOTE: control characters are not allowed in XML 1.0: shown as '?'. */
			put(b, "%c", (unsigned char)*s < 0x20 ? '?' : *s);
		}
	}
}

/* ---- the picture -------------------------------------------------------------------------- */

static void legend(buf *b, const moet_heatmap_in *in, int y, const int64_t *per_gpu)
{
	put(b, "<g class=\"legend\" font-size=\"12\">\n");
	put(b, "<text x=\"%d\" y=\"%d\">routings / the layer's busiest expert:</text>\n",
	    MARGIN_LEFT, y + 12);
	for (int i = 0; i <= 10; i++) {
		uint32_t c = moet_heatmap_color(sqrt(i / 10.0));
		put(b, "<rect class=\"ramp\" x=\"%d\" y=\"%d\" width=\"24\" height=\"14\" "
		    "fill=\"#%06x\" stroke=\"#999\" stroke-width=\"0.5\"/>\n",
		    MARGIN_LEFT + 250 + 26 * i, y + 1, c);
		if (i % 5 == 0)
			put(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%.1f</text>\n",
			    MARGIN_LEFT + 262 + 26 * i, y + 30, i / 10.0);
	}
	put(b, "<text x=\"%d\" y=\"%d\">(color: square root)</text>\n", MARGIN_LEFT + 250 + 290,
	    y + 12);
	if (in->owner) {
		int x = MARGIN_LEFT;
		put(b, "<text x=\"%d\" y=\"%d\">bar under a cell: resident on</text>\n", x, y + 52);
		x += 190;
		for (int g = 0; g < in->n_gpus; g++) {
			put(b, "<rect class=\"swatch\" x=\"%d\" y=\"%d\" width=\"14\" "
			    "height=\"14\" fill=\"%s\"/>\n<text x=\"%d\" y=\"%d\">", x, y + 41,
			    gpu_colors[g % N_GPU_COLORS], x + 18, y + 52);
			put_text(b, in->gpu_names ? in->gpu_names[g] : "gpu");
			put(b, " (%" PRId64 ")</text>\n", per_gpu[g]);
			x += 30 + 8 * (int)strlen(in->gpu_names ? in->gpu_names[g] : "gpu") + 40;
		}
		put(b, "<text x=\"%d\" y=\"%d\">no bar: CPU</text>\n", x, y + 52);
	}
	put(b, "</g>\n");
}

int moet_heatmap_svg(const moet_heatmap_in *in, char **out_text)
{
	const int64_t L = in->n_layers, E = in->n_experts;
	int64_t rows = 0, per_gpu[64] = { 0 };
	if (L < 1 || E < 1 || (in->owner && (in->n_gpus < 1 || in->n_gpus > 64)))
		return moet_err(MOET_EINVAL, "heatmap: %" PRId64 " layers x %" PRId64
				" experts, %d GPUs", L, E, in->n_gpus);
	for (int64_t l = 0; l < L; l++) {
		rows += in->is_moe[l] != 0;
		for (int64_t e = 0; in->owner && e < E; e++) {
			int g = in->owner[l * E + e];
			if (g < -1 || g >= in->n_gpus)
				return moet_err(MOET_EINVAL, "heatmap: layer %" PRId64
						" expert %" PRId64 ": owner %d of %d GPUs", l, e, g,
						in->n_gpus);
			if (g >= 0 && in->is_moe[l])
				per_gpu[g]++;
		}
	}
	if (!rows)
		return moet_err(MOET_EINVAL, "heatmap: no MoE layer to draw");
	const int cw = (int)(GRID_W / E > 16 ? 16 : GRID_W / E < 2 ? 2 : GRID_W / E);
	const int ch = (int)(GRID_H / rows > 18 ? 18 : GRID_H / rows < 4 ? 4 : GRID_H / rows);
	const int gw = cw * (int)E, gh = ch * (int)rows;
	const int width = MARGIN_LEFT + (gw > 760 ? gw : 760) + MARGIN_RIGHT;
	const int height = MARGIN_TOP + gh + 34 + 70;
	buf b = { 0 };
	put(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
	    "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n", width, height, width, height);
	put(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
	put(&b, "<text x=\"%d\" y=\"22\" font-size=\"16\" font-weight=\"bold\">", MARGIN_LEFT);
	put_text(&b, in->model ? in->model : "model");
	put(&b, ": ");
	put_text(&b, in->phase ? in->phase : "");
	put(&b, " routings of ");
	put_text(&b, in->profile ? in->profile : "a profile");
	put(&b, "</text>\n<text x=\"%d\" y=\"42\" font-size=\"13\">", MARGIN_LEFT);
	if (in->placement) {
		int64_t tot = 0;
		for (int g = 0; g < in->n_gpus; g++)
			tot += per_gpu[g];
		put(&b, "placement ");
		put_text(&b, in->placement);
		put(&b, ": %" PRId64 " experts on %d GPU%s", tot, in->n_gpus,
		    in->n_gpus > 1 ? "s" : "");
		if (in->hit_rate >= 0)
			put(&b, ", hit rate %.4f", in->hit_rate);
	} else {
		put(&b, "no placement");
	}
	put(&b, "; %" PRId64 " MoE layers x %" PRId64 " experts</text>\n", rows, E);
	int64_t r = 0;
	for (int64_t l = 0; l < L; l++) {
		if (!in->is_moe[l])
			continue;
		const double *s = in->scores + l * E;
		double mx = 0;
		for (int64_t e = 0; e < E; e++)
			mx = s[e] > mx ? s[e] : mx;
		const int y = MARGIN_TOP + (int)r * ch;
		if (ch >= 9 || r % ((10 + ch - 1) / ch) == 0)
			put(&b, "<text x=\"%d\" y=\"%d\" font-size=\"%d\" text-anchor=\"end\">"
			    "layer %" PRId64 "</text>\n", MARGIN_LEFT - 6, y + ch - 1,
			    ch < 11 ? 10 : 11, l);
		for (int64_t e = 0; e < E; e++) {
			const double f = mx > 0 ? s[e] / mx : 0;
			const int x = MARGIN_LEFT + (int)e * cw;
			put(&b, "<rect class=\"cell\" data-layer=\"%" PRId64 "\" data-expert=\"%"
			    PRId64 "\" data-freq=\"%.6f\" x=\"%d\" y=\"%d\" width=\"%d\" "
			    "height=\"%d\" fill=\"#%06x\"/>\n", l, e, f, x, y, cw, ch,
			    moet_heatmap_color(sqrt(f)));
			const int g = in->owner ? in->owner[l * E + e] : -1;
			if (g >= 0) {
				const int bh = ch / 3 > 2 ? ch / 3 : 2;
				put(&b, "<rect class=\"gpu\" data-gpu=\"%d\" x=\"%d\" y=\"%d\" "
				    "width=\"%d\" height=\"%d\" fill=\"%s\"/>\n", g, x,
				    y + ch - bh, cw, bh, gpu_colors[g % N_GPU_COLORS]);
			}
		}
		r++;
	}
	put(&b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
	    "stroke=\"#444\" stroke-width=\"0.5\"/>\n", MARGIN_LEFT, MARGIN_TOP, gw, gh);
	const int64_t step = E <= 16 ? 1 : E <= 64 ? 8 : E <= 256 ? 32 : 64;
	for (int64_t e = 0; e < E; e += step)
		put(&b, "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%" PRId64
		    "</text>\n", MARGIN_LEFT + (int)e * cw + cw / 2, MARGIN_TOP + gh + 12, e);
	put(&b, "<text x=\"%d\" y=\"%d\" font-size=\"11\">expert</text>\n",
	    MARGIN_LEFT + gw + 6 > width - 44 ? width - 44 : MARGIN_LEFT + gw + 6,
	    MARGIN_TOP + gh + 12);
	legend(&b, in, MARGIN_TOP + gh + 34, per_gpu);
	put(&b, "</svg>\n");
	if (b.err) {
		free(b.p);
		return moet_err(b.err, "heatmap: out of memory");
	}
	*out_text = b.p;
	return 0;
}

int moet_heatmap_save(const moet_heatmap_in *in, const char *path)
{
	char *text = NULL;
	int rc = moet_heatmap_svg(in, &text);
	if (rc)
		return rc;
	FILE *f = fopen(path, "wb");
	size_t n = strlen(text);
	int ok = f && fwrite(text, 1, n, f) == n;
	if (f && fclose(f))
		ok = 0;
	free(text);
	return ok ? 0 : moet_err(MOET_EIO, "%s: cannot write", path);
}
