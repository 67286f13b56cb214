/* SVG line plots: a growable text buffer, nice ticks, axes, polylines, legend. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/metrics.h"
#include "orchestrator/svg.h"
#include "quant/fileio.h"

/* Colour-blind-safe palette (Okabe & Ito, 2008). */
static const char *const colors[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                     "#E69F00", "#56B4E9", "#000000", "#F0E442"};

typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...)
{
    for (int tries = 0; !b->oom && tries < 2; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n >= 0 && b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = 2 * (b->cap + (size_t)n + 1);
        char *grown = realloc(b->s, cap);
        if (!grown)
            b->oom = 1;
        else
            b->s = grown, b->cap = cap;
    }
}

/* Text with &, <, >, " escaped. */
static void put_text(sbuf *b, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': put(b, "&amp;"); break;
        case '<': put(b, "&lt;"); break;
        case '>': put(b, "&gt;"); break;
        case '"': put(b, "&quot;"); break;
        default: put(b, "%c", *s);
        }
    }
}

int qd_svg_ticks(double lo, double hi, int max_ticks, double *first, double *step)
{
    if (hi <= lo) {
        double pad = lo != 0 ? fabs(lo) * 0.5 : 1.0;
        lo -= pad, hi += pad;
    }
    if (max_ticks < 2)
        max_ticks = 2;
    double raw = (hi - lo) / (max_ticks - 1), mag = pow(10, floor(log10(raw)));
    static const double mult[] = {1, 2, 5, 10};
    for (int i = 0; i < 4; i++) {
        *step = mult[i] * mag;
        *first = floor(lo / *step) * *step;
        int count = (int)ceil((hi - *first) / *step - 1e-9) + 1;
        if (count <= max_ticks || i == 3)
            return count;
    }
    return 0;
}

typedef struct {
    double x0, x1, y0, y1;        /* data range of the axes */
    double left, right, top, bottom; /* plot area in pixels */
} frame;

static double px(const frame *f, double x) { return f->left + (x - f->x0) / (f->x1 - f->x0) * (f->right - f->left); }
static double py(const frame *f, double y) { return f->bottom - (y - f->y0) / (f->y1 - f->y0) * (f->bottom - f->top); }

/* The finite data range of all series; 0 if there is no finite point. */
static int data_range(const qd_svg_series *s, int ns, double *xlo, double *xhi, double *ylo, double *yhi)
{
    int any = 0;
    for (int i = 0; i < ns; i++)
        for (int64_t j = 0; j < s[i].n; j++) {
            double x = s[i].x[j], y = s[i].y[j];
            if (!isfinite(x) || !isfinite(y))
                continue;
            if (!any || x < *xlo) *xlo = x;
            if (!any || x > *xhi) *xhi = x;
            if (!any || y < *ylo) *ylo = y;
            if (!any || y > *yhi) *yhi = y;
            any = 1;
        }
    return any;
}

static void axis_ticks(sbuf *b, const frame *f, int vertical, double first, double step, int count)
{
    for (int i = 0; i < count; i++) {
        double v = first + i * step;
        if (fabs(v) < step * 1e-9)
            v = 0; /* print 0, not 1e-17 */
        if (vertical) {
            double y = py(f, v);
            put(b, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", f->left, y, f->right, y);
            put(b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", f->left - 6, y + 4, v);
        } else {
            double x = px(f, v);
            put(b, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, f->top, x, f->bottom);
            put(b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", x, f->bottom + 16, v);
        }
    }
}

/* One polyline per run of consecutive finite points. */
static void series_path(sbuf *b, const frame *f, const qd_svg_series *s, const char *color)
{
    int open = 0;
    for (int64_t j = 0; j < s->n; j++) {
        int ok = isfinite(s->x[j]) && isfinite(s->y[j]);
        if (ok && !open)
            put(b, "<polyline class=\"series\" stroke=\"%s\" points=\"", color);
        if (ok)
            put(b, "%s%.2f,%.2f", open ? " " : "", px(f, s->x[j]), py(f, s->y[j]));
        if (!ok && open)
            put(b, "\"/>\n");
        open = ok;
    }
    if (open)
        put(b, "\"/>\n");
}

static void legend(sbuf *b, const frame *f, const qd_svg_series *s, int ns)
{
    put(b, "<g class=\"legend\">\n");
    for (int i = 0; i < ns; i++) {
        double y = f->top + 8 + 18 * i;
        put(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n",
            f->right + 12, y, f->right + 32, y, colors[i % 8]);
        put(b, "<text x=\"%.1f\" y=\"%.1f\">", f->right + 38, y + 4);
        put_text(b, s[i].name);
        put(b, "</text>\n");
    }
    put(b, "</g>\n");
}

static void labels(sbuf *b, const qd_svg_plot *p, const frame *f, int w, int h)
{
    put(b, "<text class=\"title\" x=\"%d\" y=\"20\" text-anchor=\"middle\">", w / 2);
    put_text(b, p->title);
    put(b, "</text>\n<text class=\"label\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", (f->left + f->right) / 2, h - 8);
    put_text(b, p->xlabel);
    put(b, "</text>\n<text class=\"label\" transform=\"translate(16,%.1f) rotate(-90)\" text-anchor=\"middle\">",
        (f->top + f->bottom) / 2);
    put_text(b, p->ylabel);
    put(b, "</text>\n");
}

qd_status qd_svg_render(char **out, const qd_svg_plot *p, const qd_svg_series *s, int ns)
{
    *out = NULL;
    double xlo = 0, xhi = 0, ylo = 0, yhi = 0, xf, xs, yf, ys;
    if (!data_range(s, ns, &xlo, &xhi, &ylo, &yhi))
        return qd_error(QD_ERR_ARG, "svg %s: no finite point to plot", p->title ? p->title : "");
    int w = p->width > 0 ? p->width : 640, h = p->height > 0 ? p->height : 400;
    int nx = qd_svg_ticks(xlo, xhi, 8, &xf, &xs), ny = qd_svg_ticks(ylo, yhi, 6, &yf, &ys);
    frame f = {xf, xf + (nx - 1) * xs, yf, yf + (ny - 1) * ys, 64, w - 150, 32, h - 48};
    sbuf b = {0};
    put(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n"
            "<style>text{font-family:sans-serif;font-size:12px}.title{font-size:14px;font-weight:bold}"
            ".grid{stroke:#ddd}.axis{stroke:#000;fill:none}.series{fill:none;stroke-width:2}</style>\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n", w, h, w, h);
    labels(&b, p, &f, w, h);
    axis_ticks(&b, &f, 0, xf, xs, nx);
    axis_ticks(&b, &f, 1, yf, ys, ny);
    put(&b, "<rect class=\"axis\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", f.left, f.top,
        f.right - f.left, f.bottom - f.top);
    for (int i = 0; i < ns; i++)
        series_path(&b, &f, &s[i], colors[i % 8]);
    legend(&b, &f, s, ns);
    put(&b, "</svg>\n");
    if (b.oom) {
        free(b.s);
        return qd_error(QD_ERR_NOMEM, "svg %s", p->title ? p->title : "");
    }
    *out = b.s;
    return QD_OK;
}

qd_status qd_svg_write(const char *path, const qd_svg_plot *plot, const qd_svg_series *series, int n_series)
{
    char *text;
    qd_status st = qd_svg_render(&text, plot, series, n_series);
    if (st == QD_OK)
        st = qd_atomic_write(path, text, strlen(text));
    free(text);
    return st;
}

qd_status qd_svg_write_metric(const char *path, const qd_svg_plot *plot, const char *key,
                              const char *const *metrics, const char *const *names, int n_runs)
{
    qd_svg_series *s = calloc((size_t)(n_runs > 0 ? n_runs : 1), sizeof *s);
    if (!s)
        return qd_error(QD_ERR_NOMEM, "%s", path);
    qd_status st = QD_OK;
    for (int i = 0; st == QD_OK && i < n_runs; i++) {
        double *x, *y;
        st = qd_metrics_read_series(metrics[i], key, &x, &y, &s[i].n);
        s[i] = (qd_svg_series){.name = names[i], .x = x, .y = y, .n = s[i].n};
    }
    if (st == QD_OK)
        st = qd_svg_write(path, plot, s, n_runs);
    for (int i = 0; i < n_runs; i++) {
        free((double *)s[i].x);
        free((double *)s[i].y);
    }
    free(s);
    return st;
}
