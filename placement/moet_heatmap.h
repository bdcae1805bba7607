/*
 * moet_heatmap.h: a picture of a routing profile and a placement, as SVG text
 * (`moet-hybrid heatmap`, docs/profile-and-plan.md).
 *
 *   title: model, profile (phase), placement, hit rate
 *   layer 1  [cell][cell][cell] ... one cell per routed expert, color = routing frequency
 *   layer 2  [cell][cell][cell]     normalized per layer (the layer's busiest expert = 1)
 *   ...      a bar along the bottom of a cell in its GPU's color: resident on that GPU
 *   legend:  the color ramp 0 .. 1 of the layer maximum; one swatch per GPU with its count
 *
 * Only MoE layers get a row. Color: f = sqrt(count / layer max) (the square root spreads
 * the long tail of rarely routed experts over the ramp) mapped onto a sequential ramp from
 * pale yellow to dark red whose luminance falls monotonically: more routings, darker cell.
 * The SVG is written by hand: rects, text, no scripts, no external references. Structure
 * that tests rely on: each cell is `<rect class="cell" data-layer="L" data-expert="E"
 * data-freq="F" fill="#rrggbb" .../>`, each residency bar `<rect class="gpu" data-gpu="G"
 * .../>`.
 */
#ifndef MOET_HEATMAP_H
#define MOET_HEATMAP_H

#include <stdint.h>

typedef struct moet_heatmap_in {
	const char *model;            /* title parts (may be NULL) */
	const char *profile;
	const char *phase;            /* "decode" ... */
	const char *placement;        /* NULL: no residency drawn */
	int64_t n_layers, n_experts;
	const double *scores;         /* [n_layers x n_experts] routings */
	const uint8_t *is_moe;        /* [n_layers]: rows to draw */
	const int16_t *owner;         /* [n_layers x n_experts] GPU or -1; NULL: no placement */
	int n_gpus;
	const char *const *gpu_names; /* [n_gpus] */
	double hit_rate;              /* < 0: not shown */
} moet_heatmap_in;

/* The color of frequency f in [0, 1] (clamped) as 0xRRGGBB. Darker as f grows. */
uint32_t moet_heatmap_color(double f);

/* The SVG document (malloc'd, NUL-terminated). MOET_EINVAL for an empty geometry or an owner
 * out of range; MOET_ENOMEM. */
int moet_heatmap_svg(const moet_heatmap_in *in, char **out_text);

/* moet_heatmap_svg into a file (replaced). MOET_EIO naming the path. */
int moet_heatmap_save(const moet_heatmap_in *in, const char *path);

#endif
