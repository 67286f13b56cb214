/* Standalone SVG line plots (reward, pass@1, log-prob gap over steps) for
 * `quads compare` and `quads report`: several named series, each optionally
 * with a shaded band (min to max over seeds), axes with ticks and labels, a
 * legend. No scripts, no external references. */
#ifndef QD_SVG_H
#define QD_SVG_H
#include <stdint.h>
#include "quant/status.h"

typedef struct {
    const char *name;  /* legend text */
    const double *x;   /* (n) */
    const double *y;   /* (n); NaN or Inf points are skipped (the line breaks there) */
    int64_t n;
    const double *lo, *hi; /* (n) or NULL: a shaded band from lo to hi under the line
                              (the spread over seeds); a point where either is not
                              finite breaks it */
} qd_svg_series;

typedef struct {
    const char *title, *xlabel, *ylabel;
    int width, height; /* pixels; 0 = 640 x 400 */
} qd_svg_plot;

/* The SVG document as a malloc'ed string in *out. Series with no finite point
 * still get a legend entry. QD_ERR_ARG when there are no finite points at all. */
qd_status qd_svg_render(char **out, const qd_svg_plot *plot, const qd_svg_series *series, int n_series);
/* qd_svg_render written to path atomically. */
qd_status qd_svg_write(const char *path, const qd_svg_plot *plot, const qd_svg_series *series, int n_series);

/* One plot of metric key over steps with one series per run: metrics[i] is
 * the path of a metrics.jsonl, names[i] its legend text (series read by
 * qd_metrics_read_series). Written to path atomically. */
qd_status qd_svg_write_metric(const char *path, const qd_svg_plot *plot, const char *key,
                              const char *const *metrics, const char *const *names, int n_runs);

/* "Nice" axis ticks covering [lo, hi]: a step of 1, 2 or 5 times a power of ten
 * giving at most max_ticks ticks; *first is the first tick <= lo and the count is
 * returned. lo == hi is widened by one unit around the value. */
int qd_svg_ticks(double lo, double hi, int max_ticks, double *first, double *step);

#endif
