/* The CPU backend: the device ops of backends/ops.h in float32 with OpenMP,
 * the readable reference that defines the numbers (NUMERICS.md §6). The model
 * itself (forward, backward, generate, recipes, AdamW, RAC, diagnostics) is
 * backends/model.c, shared with the CUDA backend, whose ops
 * (backends/cuda/cuda_ops.cu) are the twins of these, slot for slot.
 *
 * Reduction orders (the exact mode's definition):
 * - a dot product or matrix product output: acc = 0, acc += a_k * b_k for k
 *   ascending; a gradient is computed the same way into a fresh accumulator,
 *   then added to the gradient buffer (gradients always accumulate with +=);
 * - RMSNorm: sum of squares in the warp order (lanes i mod 32, then halving),
 *   then / C; softmax and log-softmax: max ascending, sum of exp(x - max)
 *   ascending, then a division (the vocabulary's log-softmax is the
 *   sampler's lane tree, backends/sampling.h);
 * - MoE output: per token, expert outputs times weights summed in ascending
 *   expert index (as HF's loop over experts); renormalization sums the top-k
 *   weights in rank order;
 * - the gradient norm's chunks: double sums over fixed 4096-float chunks
 *   (added in ascending order by the driver).
 * OpenMP splits rows/outputs only, so the bits do not depend on thread count,
 * and every op but attention works row by row. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "backends/exact_math.h"
#include "backends/layout.h"
#include "backends/ops.h"
#include "backends/router.h"
#include "quant/quant.h"

typedef struct {
    int num_threads;  /* 0: the runtime's default */
} cpu_dev;

static int nthreads(const cpu_dev *d)
{
#ifdef _OPENMP
    return d->num_threads > 0 ? d->num_threads : omp_get_max_threads();
#else
    (void)d;
    return 1;
#endif
}

#define NT(dev) nthreads((const cpu_dev *)(dev))

/* ------------------------------------------------------------------------ */
/* memory: host memory                                                       */

static qd_status cpu_alloc(void *dev, void **p, size_t bytes, const char *what)
{
    (void)dev;
    *p = NULL;
    if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) {
        *p = NULL;
        return qd_error(QD_ERR_NOMEM, "cpu backend: out of memory for %s (%zu bytes)", what, bytes);
    }
    memset(*p, 0, bytes);
    return QD_OK;
}

static void cpu_release(void *dev, void *p)
{
    (void)dev;
    free(p);
}

static qd_status cpu_zero(void *dev, void *p, size_t bytes)
{
    (void)dev;
    memset(p, 0, bytes);
    return QD_OK;
}

static qd_status cpu_copy(void *dev, void *dst, const void *src, size_t bytes)
{
    (void)dev;
    if (bytes)
        memmove(dst, src, bytes);
    return QD_OK;
}

static int cpu_memory_id(void *dev)
{
    (void)dev;
    return 0; /* one process: every context reads every buffer */
}

/* MemAvailable and MemTotal of /proc/meminfo (kB), else sysconf's pages. */
static qd_status cpu_mem_info(void *dev, size_t *free_bytes, size_t *total_bytes)
{
    (void)dev;
    unsigned long long avail = 0, total = 0, v;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &v) == 1)
            avail = v * 1024;
        else if (sscanf(line, "MemTotal: %llu kB", &v) == 1)
            total = v * 1024;
    }
    if (f)
        fclose(f);
    long page = sysconf(_SC_PAGESIZE), av = sysconf(_SC_AVPHYS_PAGES), ph = sysconf(_SC_PHYS_PAGES);
    if (!avail && page > 0 && av > 0)
        avail = (unsigned long long)av * (unsigned long long)page;
    if (!total && page > 0 && ph > 0)
        total = (unsigned long long)ph * (unsigned long long)page;
    if (!avail)
        return qd_error(QD_ERR_IO, "cpu backend: available memory unknown (neither /proc/meminfo nor sysconf)");
    *free_bytes = (size_t)avail;
    *total_bytes = (size_t)total;
    return QD_OK;
}

/* quant/'s OpenMP regions follow the runtime's default: set it to the
 * backend's thread count for the duration of one call. */
static int cpu_enter(void *dev)
{
#ifdef _OPENMP
    int saved = omp_get_max_threads();
    if (((cpu_dev *)dev)->num_threads > 0)
        omp_set_num_threads(((cpu_dev *)dev)->num_threads);
    return saved;
#else
    (void)dev;
    return 1;
#endif
}

static void cpu_leave(void *dev, int saved)
{
    (void)dev;
#ifdef _OPENMP
    omp_set_num_threads(saved);
#else
    (void)saved;
#endif
}

/* ------------------------------------------------------------------------ */
/* layer functions: outputs first, then inputs and weights, then shapes       */

#define QD_ROWS 32 /* rows per tile of matmul_forward */

/* out (N, OC) = inp (N, IC) . w (OC, IC)^T, ascending ic. Rows are taken in
 * tiles of QD_ROWS, transposed, so that the innermost loop runs over the
 * tile's rows: each output still sums over ic in ascending order (the bits
 * are those of the plain triple loop) and the compiler can vectorize it. */
/* Output o of tile t: the tile's rows (xt's layout) . wr, i ascending. */
static void matmul_tile(float *out, const float *xt, const float *wr, int t, int o, int N, int IC, int OC)
{
    float acc[QD_ROWS] = {0.0f};
    const float *x = xt + (size_t)t * IC * QD_ROWS;
    int rows = N - t * QD_ROWS < QD_ROWS ? N - t * QD_ROWS : QD_ROWS;
    for (int i = 0; i < IC; i++)
        for (int r = 0; r < rows; r++)
            acc[r] += x[(size_t)i * QD_ROWS + r] * wr[i];
    for (int r = 0; r < rows; r++)
        out[(size_t)(t * QD_ROWS + r) * OC + o] = acc[r];
}

/* The rows of inp (N, IC) in tiles of QD_ROWS, transposed: (tiles, IC, QD_ROWS). */
static float *matmul_tiles(const float *inp, int N, int IC)
{
    int tiles = (N + QD_ROWS - 1) / QD_ROWS;
    float *xt = malloc(sizeof(float) * ((size_t)tiles * QD_ROWS * IC + 1));
    for (int n = 0; xt && n < tiles * QD_ROWS; n++)
        for (int i = 0; i < IC; i++)
            xt[((size_t)(n / QD_ROWS) * IC + i) * QD_ROWS + n % QD_ROWS] = n < N ? inp[(size_t)n * IC + i] : 0.0f;
    return xt;
}

static void matmul_forward(float *out, const float *inp, const float *w, int N, int IC, int OC, int nt)
{
    int tiles = (N + QD_ROWS - 1) / QD_ROWS;
    float *xt = matmul_tiles(inp, N, IC);
#pragma omp parallel for collapse(2) num_threads(nt) schedule(static)
    for (int t = 0; t < tiles; t++)
        for (int o = 0; o < OC; o++)
            matmul_tile(out, xt, w + (size_t)o * IC, t, o, N, IC, OC);
    free(xt);
}

/* matmul_forward with w (OC, IC) BF16 bits: each row widened to float32 (exact) first. */
static qd_status matmul_forward_w16(float *out, const float *inp, const uint16_t *w, int N, int IC, int OC, int nt)
{
    int tiles = (N + QD_ROWS - 1) / QD_ROWS, bad = 0;
    float *xt = matmul_tiles(inp, N, IC);
#pragma omp parallel num_threads(nt) reduction(|:bad)
    {
        float *wr = malloc(sizeof(float) * ((size_t)IC + 1));
        bad = !wr || !xt;
#pragma omp for collapse(2) schedule(static)
        for (int t = 0; t < tiles; t++)
            for (int o = 0; o < OC; o++) {
                for (int i = 0; wr && i < IC; i++)
                    wr[i] = qd_bf16_to_f32(w[(size_t)o * IC + i]);
                if (wr && xt)
                    matmul_tile(out, xt, wr, t, o, N, IC, OC);
            }
        free(wr);
    }
    free(xt);
    return bad ? qd_error(QD_ERR_NOMEM, "cpu backend: matmul of BF16 weights (%d x %d)", OC, IC) : QD_OK;
}

/* dinp (N, IC) += dout . w (ascending oc; set: = 0.0f + that); dw (OC, IC) += dout^T . inp
 * (ascending n). Either output may be NULL. */
static void matmul_backward(float *dinp, float *dw, const float *dout, const float *inp,
                            const float *w, int N, int IC, int OC, int nt, int set)
{
    if (dinp) {
#pragma omp parallel num_threads(nt)
        {
            float *acc = malloc(sizeof(float) * (size_t)IC);
#pragma omp for schedule(static)
            for (int n = 0; n < N; n++) {
                memset(acc, 0, sizeof(float) * (size_t)IC);
                for (int o = 0; o < OC; o++) {
                    float d = dout[(size_t)n * OC + o];
                    const float *wr = w + (size_t)o * IC;
                    for (int i = 0; i < IC; i++)
                        acc[i] += d * wr[i];
                }
                for (int i = 0; i < IC; i++)
                    dinp[(size_t)n * IC + i] = (set ? 0.0f : dinp[(size_t)n * IC + i]) + acc[i];
            }
            free(acc);
        }
    }
    if (dw) {
#pragma omp parallel num_threads(nt)
        {
            float *acc = malloc(sizeof(float) * (size_t)IC);
#pragma omp for schedule(static)
            for (int o = 0; o < OC; o++) {
                memset(acc, 0, sizeof(float) * (size_t)IC);
                for (int n = 0; n < N; n++) {
                    float d = dout[(size_t)n * OC + o];
                    const float *x = inp + (size_t)n * IC;
                    for (int i = 0; i < IC; i++)
                        acc[i] += d * x[i];
                }
                for (int i = 0; i < IC; i++)
                    dw[(size_t)o * IC + i] += acc[i];
            }
            free(acc);
        }
    }
}

/* out (N, C) = w * (x * rstd), rstd = 1/sqrt(sum(x^2)/C + eps); rstd saved (N).
 * The sum of squares in the warp order (docs/numerics.md section 6): x_i^2
 * into lane i mod 32, each lane ascending in i, then the lanes pairwise
 * halving (lane[j] + lane[j + h], h = 16, 8, 4, 2, 1). */
static void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                            float eps, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float lane[32] = {0.0f};
        for (int i = 0; i < C; i++)
            lane[i % 32] += x[i] * x[i];
        for (int h = 16; h > 0; h /= 2)
            for (int j = 0; j < h; j++)
                lane[j] = lane[j] + lane[j + h];
        float ss = lane[0];
        float r = qd_rsqrtf(ss / (float)C + eps);
        for (int i = 0; i < C; i++)
            out[(size_t)n * C + i] = w[i] * (x[i] * r);
        rstd[n] = r;
    }
}

/* y_i = w_i x_i r: dw_i += dy_i x_i r; dx_i += r (w_i dy_i) - x_i r^3 / C sum_j (w_j dy_j x_j).
 * dw is accumulated over rows in ascending n (one thread). */
static void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int C, int nt, int set)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        float r = rstd[n], dot = 0.0f;
        for (int i = 0; i < C; i++)
            dot += (w[i] * dy[i]) * x[i];
        float k = ((r * r) * r) * (dot / (float)C);
        for (int i = 0; i < C; i++)
            dinp[(size_t)n * C + i] = (set ? 0.0f : dinp[(size_t)n * C + i]) + (r * (w[i] * dy[i]) - x[i] * k);
    }
    for (int i = 0; i < C; i++) {
        float acc = 0.0f;
        for (int n = 0; n < N; n++)
            acc += dout[(size_t)n * C + i] * (inp[(size_t)n * C + i] * rstd[n]);
        dw[i] += acc;
    }
}

/* RoPE, HF rotate_half: out[i] = x[i] cos - x[i+D/2] sin, out[i+D/2] = x[i+D/2] cos + x[i] sin,
 * angle pos * inv_freq[i]. x, out: (N, nh, D), in place allowed. */
static void rope_forward(float *out, const float *inp, const int32_t *pos, const float *cosb,
                         const float *sinb, int N, int nh, int D)
{
    int h2 = D / 2;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nh; h++) {
            const float *x = inp + ((size_t)n * nh + h) * D;
            float *y = out + ((size_t)n * nh + h) * D;
            const float *cs = cosb + (size_t)pos[n] * h2, *sn = sinb + (size_t)pos[n] * h2;
            for (int i = 0; i < h2; i++) {
                float a = x[i], b = x[i + h2];
                y[i] = a * cs[i] - b * sn[i];
                y[i + h2] = b * cs[i] + a * sn[i];
            }
        }
}

/* The transpose rotation; dinp may alias dout. */
static void rope_backward(float *dinp, const float *dout, const int32_t *pos, const float *cosb,
                          const float *sinb, int N, int nh, int D)
{
    int h2 = D / 2;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nh; h++) {
            const float *dy = dout + ((size_t)n * nh + h) * D;
            float *dx = dinp + ((size_t)n * nh + h) * D;
            const float *cs = cosb + (size_t)pos[n] * h2, *sn = sinb + (size_t)pos[n] * h2;
            for (int i = 0; i < h2; i++) {
                float a = dy[i], b = dy[i + h2];
                dx[i] = a * cs[i] + b * sn[i];
                dx[i + h2] = b * cs[i] - a * sn[i];
            }
        }
}

/* One query qv (D) over keys and values s = 0..t at kb + s*stride, vb + s*stride:
 * p (t+1) = softmax(q.k * scale), out (D) = sum_s p[s] v[s], ascending s.
 * The prefill and the KV-cache decode both call this, so they agree bit for bit. */
static void attend(float *out, float *p, const float *qv, const float *kb, const float *vb, size_t stride,
                   int t, int D, float scale)
{
    float mx = -INFINITY, sum = 0.0f;
    for (int s = 0; s <= t; s++) {
        const float *kv = kb + (size_t)s * stride;
        float dot = 0.0f;
        for (int i = 0; i < D; i++)
            dot += qv[i] * kv[i];
        p[s] = dot * scale;
        mx = fmaxf(mx, p[s]);
    }
    for (int s = 0; s <= t; s++) {
        p[s] = qd_expf(p[s] - mx);
        sum += p[s];
    }
    for (int s = 0; s <= t; s++)
        p[s] = p[s] / sum;
    for (int i = 0; i < D; i++) {
        float acc = 0.0f;
        for (int s = 0; s <= t; s++)
            acc += p[s] * vb[(size_t)s * stride + i];
        out[i] = acc;
    }
}

/* The cache layout of attend's keys for query n: rows kbase[n] + s. Query
 * heads are independent, so any split over (n, h) gives the same bits. */
static void attention_forward(float *out, float *att, const float *q, const float *kb, const float *vb,
                              const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int D, int Tm,
                              int nt)
{
    float scale = qd_attn_scale(D);
    int HD = H * D, KD = KV * D, grp = H / KV;
#pragma omp parallel for collapse(2) num_threads(nt) schedule(dynamic)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            size_t base = (size_t)kbase[n] * KD + (size_t)(h / grp) * D;
            attend(out + (size_t)n * HD + h * D, att + ((size_t)n * H + h) * Tm, q + (size_t)n * HD + h * D,
                   kb + base, vb + base, (size_t)KD, pos[n], D, scale);
        }
}

/* Backward of attention_forward; dq, dk, dv += (each thread owns one
 * (sequence, kv head), so the order over t and the group's heads is fixed). */
static void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *att,
                               const float *q, const float *k, const float *v, const int32_t *seq_off,
                               int B, int Tm, int H, int KV, int D, int nt)
{
    float scale = qd_attn_scale(D);
    int HD = H * D, KD = KV * D, grp = H / KV;
#pragma omp parallel num_threads(nt)
    {
        float *dp = malloc(sizeof(float) * (size_t)Tm);
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < KV; kh++) {
                int off = seq_off[b], len = seq_off[b + 1] - off;
                for (int h = kh * grp; h < (kh + 1) * grp; h++)
                    for (int t = 0; t < len; t++) {
                        const float *p = att + ((size_t)(off + t) * H + h) * Tm;
                        const float *dy = dout + (size_t)(off + t) * HD + h * D;
                        const float *qv = q + (size_t)(off + t) * HD + h * D;
                        float *dqv = dq + (size_t)(off + t) * HD + h * D;
                        float pdp = 0.0f;
                        for (int s = 0; s <= t; s++) {
                            const float *vv = v + (size_t)(off + s) * KD + kh * D;
                            float acc = 0.0f;
                            for (int i = 0; i < D; i++)
                                acc += dy[i] * vv[i];
                            dp[s] = acc;
                            pdp += p[s] * acc;
                        }
                        for (int s = 0; s <= t; s++) {
                            float ds = (p[s] * (dp[s] - pdp)) * scale; /* d(q.k) */
                            const float *kv = k + (size_t)(off + s) * KD + kh * D;
                            float *dkv = dk + (size_t)(off + s) * KD + kh * D;
                            float *dvv = dv + (size_t)(off + s) * KD + kh * D;
                            for (int i = 0; i < D; i++) {
                                dqv[i] += ds * kv[i];
                                dkv[i] += ds * qv[i];
                                dvv[i] += p[s] * dy[i];
                            }
                        }
                    }
            }
        free(dp);
    }
}

/* h (R, I) = silu(g) * u. */
static void swiglu_forward(float *h, const float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h[i] = qd_siluf(g[i]) * u[i];
}

/* dg, du = dh * u * silu'(g), dh * silu(g); silu'(g) = s (1 + g (1 - s)). Overwrites. */
static void swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float s = qd_sigmoidf(g[i]);
        dg[i] = (dh[i] * u[i]) * (s * (1.0f + g[i] * (1.0f - s)));
        du[i] = dh[i] * qd_siluf(g[i]);
    }
}

/* ------------------------------------------------------------------------ */
/* the ops (backends/ops.h), each the definition its CUDA twin matches       */

static qd_status cpu_round_bf16(void *dev, float *dst, const float *src, size_t n)
{
    (void)dev;
    for (size_t i = 0; i < n; i++)
        dst[i] = qd_round_bf16(src[i]);
    return QD_OK;
}

static qd_status cpu_add(void *dev, float *out, const float *a, const float *b, size_t n)
{
    (void)dev;
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
    return QD_OK;
}

static qd_status cpu_embed(void *dev, float *x, const float *emb, const int32_t *tok, int N, int C)
{
    (void)dev;
    for (int n = 0; n < N; n++)
        memcpy(x + (size_t)n * C, emb + (size_t)tok[n] * C, sizeof(float) * C);
    return QD_OK;
}

static qd_status cpu_to_bf16(void *dev, uint16_t *dst, const float *src, size_t n)
{
#pragma omp parallel for num_threads(NT(dev)) schedule(static)
    for (size_t i = 0; i < n; i++)
        dst[i] = qd_bf16_from_f32(src[i]);
    return QD_OK;
}

static qd_status cpu_embed_w16(void *dev, float *x, const uint16_t *emb, const int32_t *tok, int N, int C)
{
    (void)dev;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++)
            x[(size_t)n * C + i] = qd_bf16_to_f32(emb[(size_t)tok[n] * C + i]);
    return QD_OK;
}

/* embedding rows, ascending n */
static qd_status cpu_embed_backward(void *dev, float *gemb, const float *dres, const int32_t *tok, int N, int C)
{
    (void)dev;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++)
            gemb[(size_t)tok[n] * C + i] += dres[(size_t)n * C + i];
    return QD_OK;
}

static qd_status cpu_rmsnorm(void *dev, float *out, float *rstd, const float *x, const float *w, int rows, int C,
                             float eps)
{
    rmsnorm_forward(out, rstd, x, w, rows, C, eps, NT(dev));
    return QD_OK;
}

static qd_status cpu_rmsnorm_backward(void *dev, float *dinp, float *dw, const float *dout, const float *x,
                                      const float *w, const float *rstd, int rows, int C, int flags)
{
    rmsnorm_backward(dinp, dw, dout, x, w, rstd, rows, C, NT(dev), flags & QD_BWD_DX_SET);
    return QD_OK;
}

static qd_status cpu_rope(void *dev, float *x, const int32_t *pos, const float *cosb, const float *sinb, int N,
                          int nh, int D, qd_rope_dir dir)
{
    (void)dev;
    if (dir == QD_ROPE_INVERSE)
        rope_backward(x, x, pos, cosb, sinb, N, nh, D);
    else
        rope_forward(x, x, pos, cosb, sinb, N, nh, D);
    return QD_OK;
}

static qd_status cpu_matmul(void *dev, float *out, const float *x, const float *w, int N, int IC, int OC,
                            qd_prec prec)
{
    (void)prec;
    matmul_forward(out, x, w, N, IC, OC, NT(dev));
    return QD_OK;
}

static qd_status cpu_matmul_w16(void *dev, float *out, const float *x, const uint16_t *w, int N, int IC, int OC,
                                qd_prec prec)
{
    (void)prec;
    return matmul_forward_w16(out, x, w, N, IC, OC, NT(dev));
}

/* The row block-floating-point product (docs/numerics.md §3b): each row's
 * mantissas under its one exponent, every output the exact integer dot
 * product of two rows' mantissas (exact, so any order gives it) rounded once. */
static qd_status bfp_shape(int N, int IC, int OC, const char *what)
{
    if (!qd_bfp_shape_ok(N, IC, OC))
        return qd_error(QD_ERR_SHAPE, "cpu backend: %s: in-features %d: a multiple of 16 up to %d wanted", what, IC,
                        QD_BFP_MAX_IC);
    return QD_OK;
}

/* The largest |v|'s bits of n floats (NaN and infinity sort above every finite value). */
static uint32_t bfp_amax(const float *v, int n)
{
    uint32_t m = 0;
    for (int i = 0; i < n; i++) {
        uint32_t a = qd_f32_bits(v[i]) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    return m;
}

/* w (BF16 bits) of row o, element i: w16's, or wf's rounded */
static uint16_t bfp_w16(const uint16_t *w16, const float *wf, size_t at)
{
    return w16 ? w16[at] : qd_bf16_from_f32(wf[at]);
}

static qd_status cpu_bfp_weights(void *dev, void *wq, const uint16_t *w16, const float *wf, int OC, int IC)
{
    QD_TRY(bfp_shape(0, IC, OC, "bfp_weights"));
    int32_t *F = (int32_t *)wq;
    int8_t *hi = (int8_t *)((char *)wq + qd_bfp_hi_at(OC));
    uint8_t *lo = (uint8_t *)(hi + (size_t)OC * IC);
    memset(F + OC, 0, qd_bfp_hi_at(OC) - sizeof(int32_t) * (size_t)OC); /* the padding: every byte written */
#pragma omp parallel for num_threads(NT(dev)) schedule(static)
    for (int o = 0; o < OC; o++) {
        size_t r = (size_t)o * IC;
        uint32_t amax = 0;
        for (int i = 0; i < IC; i++) {
            uint32_t a = (uint32_t)(bfp_w16(w16, wf, r + i) & 0x7fffu) << 16;
            amax = a > amax ? a : amax;
        }
        int f = qd_bfp_exponent(amax);
        F[o] = f;
        for (int i = 0; i < IC; i++) {
            int32_t W = f == QD_BFP_NONFINITE ? 0 : qd_bfp_mant((uint32_t)bfp_w16(w16, wf, r + i) << 16, f, QD_BFP_PW);
            uint32_t l = (uint32_t)W & 255u;
            lo[(size_t)o * IC + i] = (uint8_t)l;
            hi[(size_t)o * IC + i] = (int8_t)((W - (int32_t)l) / 256);
        }
    }
    return QD_OK;
}

/* The mantissas' products are below 2^37 and their sums below IC 2^37 <=
 * 2^51: every one is exact in double, so the sum is S in any order. Rows go
 * in tiles of QD_ROWS as matmul_forward's (the innermost loop over a tile's
 * rows, which the compiler vectorizes); the rows past the last full tile
 * (all of them below QD_ROWS rows: decode) one at a time, each a dot product
 * in four partial sums (not a tile padded with zero rows: at one row that was
 * 32 times the work). */
static qd_status cpu_matmul_bfp(void *dev, float *out, const float *x, const void *wq, int N, int IC, int OC)
{
    QD_TRY(bfp_shape(N, IC, OC, "matmul_bfp"));
    if (!N || !OC)
        return QD_OK;
    const int32_t *F = (const int32_t *)wq;
    const int8_t *hi = (const int8_t *)((const char *)wq + qd_bfp_hi_at(OC));
    const uint8_t *lo = (const uint8_t *)(hi + (size_t)OC * IC);
    int tiles = N / QD_ROWS, rest = N - tiles * QD_ROWS, nt = tiles * QD_ROWS;
    double *xt = malloc(sizeof(double) * ((size_t)N * IC + 1));
    int32_t *E = malloc(sizeof(int32_t) * (size_t)N);
    if (!xt || !E) {
        free(xt), free(E);
        return qd_error(QD_ERR_NOMEM, "cpu backend: matmul_bfp (%d x %d)", N, IC);
    }
    /* X as double: the full tiles (tiles, IC, QD_ROWS), then the rest (rest, IC) */
    double *xr = xt + (size_t)nt * IC;
    for (int n = 0; n < N; n++) {
        const float *r = x + (size_t)n * IC;
        int e = qd_bfp_exponent(bfp_amax(r, IC));
        E[n] = e;
        double *d = n < nt ? xt + (size_t)(n / QD_ROWS) * IC * QD_ROWS + n % QD_ROWS : xr + (size_t)(n - nt) * IC;
        size_t step = n < nt ? QD_ROWS : 1;
        for (int i = 0; i < IC; i++)
            d[(size_t)i * step] = e == QD_BFP_NONFINITE ? 0.0 : (double)qd_bfp_mant(qd_f32_bits(r[i]), e, QD_BFP_PX);
    }
    int bad = 0;
#pragma omp parallel num_threads(NT(dev)) reduction(|:bad)
    {
        double *W = malloc(sizeof(double) * (size_t)IC);
        bad = !W;
#pragma omp for schedule(static)
        for (int o = 0; o < OC; o++) {
            if (!W)
                continue;
            for (int i = 0; i < IC; i++)
                W[i] = (double)(256 * (int32_t)hi[(size_t)o * IC + i] + lo[(size_t)o * IC + i]);
            for (int t = 0; t < tiles; t++) {
                double acc[QD_ROWS] = {0.0};
                const double *xtt = xt + (size_t)t * IC * QD_ROWS;
                for (int i = 0; i < IC; i++)
                    for (int r = 0; r < QD_ROWS; r++)
                        acc[r] += xtt[(size_t)i * QD_ROWS + r] * W[i];
                for (int r = 0; r < QD_ROWS; r++)
                    out[(size_t)(t * QD_ROWS + r) * OC + o] = qd_bfp_out((int64_t)acc[r], E[t * QD_ROWS + r], F[o]);
            }
            for (int r = 0; r < rest; r++) {
                const double *xv = xr + (size_t)r * IC;
                double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
                for (int i = 0; i < IC; i += 4) { /* IC a multiple of 16 */
                    a0 += xv[i] * W[i];
                    a1 += xv[i + 1] * W[i + 1];
                    a2 += xv[i + 2] * W[i + 2];
                    a3 += xv[i + 3] * W[i + 3];
                }
                out[(size_t)(nt + r) * OC + o] = qd_bfp_out((int64_t)((a0 + a1) + (a2 + a3)), E[nt + r], F[o]);
            }
        }
        free(W);
    }
    free(xt), free(E);
    return bad ? qd_error(QD_ERR_NOMEM, "cpu backend: matmul_bfp (%d x %d)", OC, IC) : QD_OK;
}

static qd_status cpu_matmul_backward(void *dev, float *dinp, float *dw, const float *dout, const float *x,
                                     const float *w, int N, int IC, int OC, int flags)
{
    matmul_backward(dinp, dw, dout, x, w, N, IC, OC, NT(dev), flags & QD_BWD_DX_SET);
    return QD_OK;
}

static qd_status cpu_matmul_grouped(void *dev, float *out, const float *x, const float *const *w, const int32_t *off,
                                    int E, int IC, int OC, qd_prec prec)
{
    (void)prec;
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        if (m)
            matmul_forward(out + (size_t)r0 * OC, x + (size_t)r0 * IC, w[e], m, IC, OC, NT(dev));
    }
    return QD_OK;
}

static qd_status cpu_matmul_grouped_backward(void *dev, float *dinp, float *const *dw, const float *dout,
                                             const float *x, const float *const *w, const int32_t *off, int E,
                                             int IC, int OC)
{
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        if (m)
            matmul_backward(dinp + (size_t)r0 * IC, dw[e], dout + (size_t)r0 * OC, x + (size_t)r0 * IC, w[e], m,
                            IC, OC, NT(dev), 0);
    }
    return QD_OK;
}

static qd_status cpu_fp8_quantize_rows(void *dev, uint8_t *q, float *scale_inv, const float *x, int rows, int cols)
{
    (void)dev;
    return qd_fp8_quantize_rows(q, scale_inv, x, rows, cols);
}

static qd_status cpu_fp8_gemm(void *dev, float *y, const uint8_t *qa, const float *sa_inv, const uint8_t *qw,
                              const float *sw_inv, int M, int N, int K)
{
    (void)dev;
    qd_fp8_gemm(y, qa, sa_inv, qw, sw_inv, M, N, K);
    return QD_OK;
}

static qd_status cpu_fp8_gemm_grouped(void *dev, float *y, const uint8_t *qa, const float *sa_inv,
                                      const uint8_t *const *qw, const float *const *sw_inv, const int32_t *off,
                                      int E, int N, int K)
{
    (void)dev;
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        if (m)
            qd_fp8_gemm(y + (size_t)r0 * N, qa + (size_t)r0 * K, sa_inv + r0, qw[e], sw_inv[e], m, N, K);
    }
    return QD_OK;
}

static qd_status cpu_nvfp4_quantize(void *dev, qd_nvfp4 *q, const float *x)
{
    (void)dev;
    return qd_nvfp4_quantize(q, x);
}

static qd_status cpu_nvfp4_quantize_weights(void *dev, qd_nvfp4 *const *q, const float *const *x,
                                            const int64_t *const *ch, int count, int N, int K, int64_t n)
{
    (void)dev;
    for (int i = 0; i < count; i++)
        QD_TRY(n ? qd_rac_augment_weight(q[i], x[i], N, K, ch[i], n) : qd_nvfp4_quantize(q[i], x[i]));
    return QD_OK;
}

/* The linears in parallel (a sort each); a failure is redone on this thread
 * for its message (thread-local). */
static qd_status cpu_rac_select(void *dev, int64_t *ch, const double *err, const size_t *off, const int *K,
                                int count, double ratio)
{
    (void)dev;
    int bad = 0;
    #pragma omp parallel for schedule(dynamic, 4) reduction(|:bad)
    for (int i = 0; i < count; i++)
        bad |= qd_rac_select(ch + off[i], err + off[i], K[i], ratio) < 0;
    for (int i = 0; i < count && bad; i++)
        if (qd_rac_select(ch + off[i], err + off[i], K[i], ratio) < 0)
            return QD_ERR_ARG;
    return QD_OK;
}

static qd_status cpu_nvfp4_fake_quant(void *dev, float *out, const float *x, int rows, int cols,
                                      qd_scale_kind scale)
{
    (void)dev;
    return qd_nvfp4_fake_quant(out, x, rows, cols, scale);
}

static qd_status cpu_w4a4_gemm(void *dev, float *y, const qd_nvfp4 *a, const qd_nvfp4 *w)
{
    (void)dev;
    return qd_w4a4_gemm(y, a, w);
}

/* Rows r0 .. r0+m-1 of a per-row NVFP4 matrix. */
static qd_nvfp4 rows_of(const qd_nvfp4 *a, int r0, int m)
{
    qd_nvfp4 v = *a;
    v.rows = m;
    v.codes = a->codes + (size_t)r0 * (size_t)(a->cols / 2);
    v.scales = a->scales + (size_t)r0 * (size_t)(a->cols / 16);
    v.s_dec = a->s_dec + r0;
    return v;
}

static qd_status cpu_w4a4_gemm_grouped(void *dev, float *y, const qd_nvfp4 *a, const qd_nvfp4 *const *w,
                                       const int32_t *off, int E)
{
    (void)dev;
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        qd_nvfp4 v = rows_of(a, r0, m);
        if (m)
            QD_TRY(qd_w4a4_gemm(y + (size_t)r0 * (size_t)w[e]->rows, &v, w[e]));
    }
    return QD_OK;
}

/* The device offsets are host memory here: the host ops on them. */
static qd_status cpu_w4a4_gemm_grouped_dev(void *dev, float *y, const qd_nvfp4 *a, const qd_nvfp4 *const *w,
                                           const int32_t *d_off, int E, int maxrows)
{
    (void)maxrows;
    return cpu_w4a4_gemm_grouped(dev, y, a, w, d_off, E);
}

/* one product after the other */
static qd_status cpu_w4a4_gemm_multi(void *dev, float *const *y, const qd_nvfp4 *const *a, const qd_nvfp4 *const *w,
                                     int count)
{
    (void)dev;
    if (count < 0 || count > QD_RAC_MULTI)
        return qd_error(QD_ERR_ARG, "cpu backend: w4a4_gemm_multi of %d products (at most %d)", count, QD_RAC_MULTI);
    for (int i = 0; i < count; i++)
        QD_TRY(qd_w4a4_gemm(y[i], a[i], w[i]));
    return QD_OK;
}

static qd_status cpu_rac_error(void *dev, double *err, const float *x, int rows, int K)
{
    (void)dev;
    return qd_rac_error_accumulate(err, x, rows, K);
}

static qd_status cpu_rac_augment_act(void *dev, qd_nvfp4 *out, const float *x, int rows, int K, const int64_t *ch,
                                     int64_t n)
{
    (void)dev;
    return qd_rac_augment_act(out, x, rows, K, ch, n);
}

static qd_status cpu_rac_augment_weight(void *dev, qd_nvfp4 *out, const float *w, int N, int K, const int64_t *ch,
                                        int64_t n)
{
    (void)dev;
    return qd_rac_augment_weight(out, w, N, K, ch, n);
}

/* one expert after the other, each on its rows */
static qd_status cpu_rac_grouped(void *dev, qd_nvfp4 *a, double *const *err, const int64_t *const *ch,
                                 const int32_t *off, int E, const float *x, int K, int64_t n)
{
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        if (!m)
            continue;
        qd_nvfp4 v = rows_of(a, r0, m);
        if (err)
            QD_TRY(cpu_rac_error(dev, err[e], x + (size_t)r0 * K, m, K));
        QD_TRY(cpu_rac_augment_act(dev, &v, x + (size_t)r0 * K, m, K, ch[e], n));
    }
    return QD_OK;
}

/* the linears one after the other */
static qd_status cpu_rac_multi(void *dev, qd_nvfp4 *const *a, double *const *const *err,
                               const int64_t *const *const *ch, const int64_t *n, int count, const int32_t *off,
                               int E, const float *x, int K)
{
    if (count < 0 || count > QD_RAC_MULTI)
        return qd_error(QD_ERR_ARG, "cpu backend: rac_multi of %d linears (at most %d)", count, QD_RAC_MULTI);
    for (int i = 0; i < count; i++)
        QD_TRY(cpu_rac_grouped(dev, a[i], err ? err[i] : NULL, ch[i], off, E, x, K, n[i]));
    return QD_OK;
}

static qd_status cpu_rac_multi_dev(void *dev, qd_nvfp4 *const *a, double *const *const *err,
                                   const int64_t *const *const *ch, const int64_t *n, int count, const int32_t *d_off,
                                   int E, int R, const float *x, int K)
{
    if (d_off[E] != R)
        return qd_error(QD_ERR_SHAPE, "cpu backend: rac_multi_dev: %d rows, the offsets say %d", R, (int)d_off[E]);
    return cpu_rac_multi(dev, a, err, ch, n, count, d_off, E, x, K);
}

/* per row, ascending, in double */
static qd_status cpu_rac_fake_quant(void *dev, float *out, const float *x, int rows, int K, const int64_t *ch,
                                   int64_t n)
{
    (void)dev;
    return qd_rac_fake_quant(out, x, rows, K, ch, n);
}

static qd_status cpu_sqerr_rows(void *dev, double *err, double *nrm, const float *x, const float *xh, int rows,
                                int cols)
{
    (void)dev;
    for (int r = 0; r < rows; r++) {
        double e = 0.0, x2 = 0.0;
        for (size_t i = (size_t)r * cols; i < (size_t)(r + 1) * cols; i++) {
            double d = (double)x[i] - (double)xh[i];
            e += d * d;
            x2 += (double)x[i] * (double)x[i];
        }
        err[r] = e;
        nrm[r] = x2;
    }
    return QD_OK;
}

static qd_status cpu_diag_add(void *dev, double *acc, const double *e, int rows, const int32_t *off,
                              const int32_t *d_off, const int32_t *slot, int nseg, int nsets, int flags)
{
    (void)dev;
    const int32_t *o = off ? off : d_off; /* the CPU's device memory is the host's */
    for (int i = 0; i < nsets * nseg; i++) {
        int g = i % nseg;
        double *a = acc + 2 * (size_t)slot[i];
        double err = flags & QD_DIAG_SET ? 0.0 : a[0], nrm = flags & QD_DIAG_SET ? 0.0 : a[1];
        for (int r = o[g]; r < o[g + 1]; r++) {
            err += e[r];
            nrm += e[(size_t)rows + r];
        }
        a[0] = err;
        a[1] = nrm;
    }
    return QD_OK;
}

static qd_status cpu_sqerr_weights(void *dev, double *e, const float *const *x, const float *const *xh,
                                   const qd_nvfp4 *const *q, int count, int N, int K)
{
    (void)dev;
    size_t rows = (size_t)count * (size_t)N;
    #pragma omp parallel for schedule(static)
    for (int64_t ir = 0; ir < (int64_t)rows; ir++) {
        int i = (int)(ir / N), r = (int)(ir % N);
        const float *xr = x[i] + (size_t)r * K;
        double err = 0.0, x2 = 0.0;
        for (int j = 0; j < K; j++) {
            float h;
            if (xh) {
                h = xh[i][(size_t)r * K + j];
            } else {
                const qd_nvfp4 *w = q[i];
                uint8_t byte = w->codes[(size_t)r * (size_t)(w->cols / 2) + j / 2];
                h = qd_nvfp4_dequant1(j & 1 ? byte >> 4 : byte & 0xf,
                                      w->scales[(size_t)r * (size_t)(w->cols / QD_NVFP4_BLOCK) + j / QD_NVFP4_BLOCK],
                                      w->s_dec[0]);
            }
            double d = (double)xr[j] - (double)h;
            err += d * d;
            x2 += (double)xr[j] * (double)xr[j];
        }
        e[ir] = err;
        e[rows + ir] = x2;
    }
    return QD_OK;
}

static qd_status cpu_attend(void *dev, float *out, float *att, const float *q, const float *kb, const float *vb,
                            const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int D, int Tm,
                            const int32_t *seq_off, int nseq)
{
    (void)seq_off, (void)nseq;
    attention_forward(out, att, q, kb, vb, kbase, pos, N, H, KV, D, Tm, NT(dev));
    return QD_OK;
}

/* The packed sequences start where pos is 0 and run slen tokens. */
static qd_status cpu_attend_backward(void *dev, float *dq, float *dk, float *dv, float *ds, const float *dout,
                                     const float *out, const float *att, const float *q, const float *k,
                                     const float *v, const int32_t *pos, const int32_t *slen, int N, int H, int KV,
                                     int D, int Tm, const int32_t *hseq_off, int nseq, int flags)
{
    (void)ds, (void)out, (void)hseq_off, (void)nseq;
    int32_t *seq_off = malloc(sizeof(int32_t) * ((size_t)N + 1));
    if (!seq_off)
        return qd_error(QD_ERR_NOMEM, "cpu backend: attention backward");
    if (flags & QD_BWD_DX_SET) { /* the sums below add into what is there */
        memset(dq, 0, sizeof(float) * (size_t)N * H * D);
        memset(dk, 0, sizeof(float) * (size_t)N * KV * D);
        memset(dv, 0, sizeof(float) * (size_t)N * KV * D);
    }
    int B = 0;
    for (int n = 0; n < N; n += slen[n])
        seq_off[B++] = n;
    seq_off[B] = N;
    attention_backward(dq, dk, dv, dout, att, q, k, v, seq_off, B, Tm, H, KV, D, NT(dev));
    free(seq_off);
    return QD_OK;
}

static qd_status cpu_store_kv(void *dev, float *kc, float *vc, const float *kr, const float *v, const int32_t *row,
                              const int32_t *pos, int N, int Tc, int KD)
{
    (void)dev;
    for (int n = 0; n < N; n++) {
        size_t at = ((size_t)row[n] * Tc + pos[n]) * KD;
        memcpy(kc + at, kr + (size_t)n * KD, sizeof(float) * KD);
        memcpy(vc + at, v + (size_t)n * KD, sizeof(float) * KD);
    }
    return QD_OK;
}

static qd_status cpu_route(void *dev, int32_t *topk, float *topw, float *probs, int N, int E, int K,
                          qd_topk_norm norm)
{
    (void)dev;
    for (int n = 0; n < N; n++) {
        qd_router_softmax(probs + (size_t)n * E, E);
        qd_router_select(topk + (size_t)n * K, topw + (size_t)n * K, probs + (size_t)n * E, E, K, norm);
    }
    return QD_OK;
}

static qd_status cpu_moe_group(void *dev, int32_t *exp_off, int32_t *row_tok, float *row_w, int32_t *row_rank,
                               int32_t *tok_rows, const int32_t *topk, const float *topw, int N, int E, int K)
{
    (void)dev;
    int32_t *cnt = malloc(sizeof(int32_t) * (size_t)E);
    if (!cnt)
        return qd_error(QD_ERR_NOMEM, "cpu backend: routing");
    qd_moe_group(exp_off, row_tok, row_w, row_rank, tok_rows, cnt, topk, topw, N, E, K);
    free(cnt);
    return QD_OK;
}

static qd_status cpu_moe_group_dev(void *dev, int32_t *d_off, int32_t *row_tok, float *row_w, int32_t *row_rank,
                                   int32_t *tok_rows, const int32_t *topk, const float *topw, int N, int E, int K)
{
    return cpu_moe_group(dev, d_off, row_tok, row_w, row_rank, tok_rows, topk, topw, N, E, K);
}

static qd_status cpu_gather(void *dev, float *xe, const float *x, const int32_t *row_tok, int R, int C)
{
    (void)dev;
    for (int r = 0; r < R; r++)
        memcpy(xe + (size_t)r * C, x + (size_t)row_tok[r] * C, sizeof(float) * C);
    return QD_OK;
}

static qd_status cpu_swiglu(void *dev, float *h, const float *g, const float *u, size_t n)
{
    (void)dev;
    swiglu_forward(h, g, u, n);
    return QD_OK;
}

static qd_status cpu_swiglu_backward(void *dev, float *dg, float *du, const float *dh, const float *g,
                                     const float *u, size_t n)
{
    (void)dev;
    swiglu_backward(dg, du, dh, g, u, n);
    return QD_OK;
}

/* per token, its expert outputs times their weights in ascending expert order */
static qd_status cpu_combine(void *dev, float *out, const float *y, const float *row_w, const int32_t *tok_rows,
                             int N, int K, int C)
{
    (void)dev;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) {
                int r = tok_rows[n * K + j];
                acc += y[(size_t)r * C + i] * row_w[r];
            }
            out[(size_t)n * C + i] = acc;
        }
    return QD_OK;
}

static qd_status cpu_moe_dy(void *dev, float *dy, float *dwt, const float *dout, const float *y, const float *row_w,
                            const int32_t *row_rank, const int32_t *tok_rows, int N, int K, int C)
{
    (void)dev;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            int r = tok_rows[n * K + j];
            const float *yr = y + (size_t)r * C, *d = dout + (size_t)n * C;
            float acc = 0.0f;
            for (int i = 0; i < C; i++) {
                dy[(size_t)r * C + i] = d[i] * row_w[r];
                acc += d[i] * yr[i];
            }
            dwt[n * K + row_rank[r]] = acc;              /* dL/dweight, rank order */
        }
    return QD_OK;
}

static qd_status cpu_unroute(void *dev, float *dinp, const float *dxe, const int32_t *tok_rows, int N, int K, int C)
{
    (void)dev;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            const float *d = dxe + (size_t)tok_rows[n * K + j] * C;
            for (int i = 0; i < C; i++)
                dinp[(size_t)n * C + i] += d[i];
        }
    return QD_OK;
}

/* dprobs of the chosen experts from dL/dweight, through the optional
 * renormalization w_j = p_j / S, then the softmax backward into dlog. */
static qd_status cpu_router_backward(void *dev, float *dlog, const float *dwt, const float *probs,
                                     const int32_t *topk, const float *topw, int N, int E, int K,
                                     qd_topk_norm norm)
{
    (void)dev;
    for (int n = 0; n < N; n++) {
        float *dl = dlog + (size_t)n * E;
        const float *p = probs + (size_t)n * E;
        const int32_t *ix = topk + (size_t)n * K;
        memset(dl, 0, sizeof(float) * E);                    /* dl holds dprobs first */
        float sum = 0.0f, wdw = 0.0f;
        for (int j = 0; j < K; j++) {
            sum += p[ix[j]];
            wdw += dwt[n * K + j] * topw[n * K + j];
        }
        for (int j = 0; j < K; j++)
            dl[ix[j]] = norm == QD_TOPK_RENORM ? (dwt[n * K + j] - wdw) / sum : dwt[n * K + j];
        float pdp = 0.0f;
        for (int e = 0; e < E; e++)
            pdp += p[e] * dl[e];
        for (int e = 0; e < E; e++)
            dl[e] = p[e] * (dl[e] - pdp);
    }
    return QD_OK;
}

/* s_i = x_i / T, then the sampler's normalizer (backends/sampling.h), so
 * rollout and forward log-probs agree bit for bit at any temperature; lse is
 * m + logz of s. */
static qd_status cpu_logprob(void *dev, float *logp, float *lse, const float *logits, const int32_t *tgt, int N,
                             int V, float T)
{
    (void)dev;
    float *s = T != 1.0f ? malloc(sizeof(float) * (size_t)V) : NULL;
    if (T != 1.0f && !s)
        return qd_error(QD_ERR_NOMEM, "cpu backend: log-probs");
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        if (T != 1.0f) {
            for (int i = 0; i < V; i++) {
                s[i] = l[i] / T;
                if (!isfinite(s[i]) && isfinite(l[i])) {
                    free(s);
                    return qd_error(QD_ERR_NONFINITE, "forward: token %d: logits[%d] / temperature %g overflows",
                                    n, i, (double)T);
                }
            }
            l = s;
        }
        float mx, logz;
        qd_softmax_lognorm(&mx, &logz, l, V);
        lse[n] = mx + logz;
        logp[n] = tgt[n] >= 0 ? (l[tgt[n]] - mx) - logz : 0.0f;
    }
    free(s);
    return QD_OK;
}

/* the softmax from the forward's lse of the scaled logits */
static qd_status cpu_logprob_backward(void *dev, float *dlogits, const float *dlogp, const float *logits,
                                      const float *lse, const int32_t *tgt, int N, int V, float T)
{
    (void)dev;
    for (int n = 0; n < N; n++) {
        float d = tgt[n] >= 0 ? dlogp[n] / T : 0.0f;
        for (int j = 0; j < V; j++) {
            float p = qd_expf(logits[(size_t)n * V + j] / T - lse[n]);
            dlogits[(size_t)n * V + j] = d * ((j == tgt[n] ? 1.0f : 0.0f) - p);
        }
    }
    return QD_OK;
}

static qd_status cpu_sample(void *dev, qd_sample_result *out, const float *logits, int B, int V,
                            const qd_sample_params *p, const uint64_t *seq_ids, const uint32_t *positions)
{
    (void)dev;
    return qd_sample_batch(out, logits, B, V, p, seq_ids, positions);
}

static qd_status cpu_sumsq_chunks(void *dev, double *part, const float *g, size_t n)
{
    size_t nch = (n + 4095) / 4096;
#pragma omp parallel for num_threads(NT(dev)) schedule(static)
    for (size_t k = 0; k < nch; k++) {
        size_t end = (k + 1) * 4096 < n ? (k + 1) * 4096 : n;
        double s = 0.0;
        for (size_t i = k * 4096; i < end; i++)
            s += (double)g[i] * (double)g[i];
        part[k] = s;
    }
    return QD_OK;
}

static qd_status cpu_adamw(void *dev, float *p, const float *g, float *m, float *v, size_t n, const qd_adamw *o,
                           float wd, float gscale, float bc1, float bc2)
{
#pragma omp parallel for num_threads(NT(dev)) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        m[i] = o->beta1 * m[i] + (1.0f - o->beta1) * gi;
        v[i] = o->beta2 * v[i] + (1.0f - o->beta2) * (gi * gi);
        float mh = m[i] / bc1, vh = v[i] / bc2;
        p[i] -= o->lr * (mh / (sqrtf(vh) + o->eps) + wd * p[i]);
    }
    return QD_OK;
}

static qd_status cpu_adamw_round(void *dev, float *p, const float *g, float *m, float *v, float *wk, size_t n,
                                 const qd_adamw *o, float wd, float gscale, float bc1, float bc2)
{
    QD_TRY(cpu_adamw(dev, p, g, m, v, n, o, wd, gscale, bc1, bc2));
#pragma omp parallel for num_threads(NT(dev)) schedule(static)
    for (size_t i = 0; i < n; i++)
        wk[i] = qd_round_bf16(p[i]);
    return QD_OK;
}

/* The fused rows ops (ops.h): the ops they stand for, in their order. */
static const qd_ops cpu_ops;

static qd_status cpu_add_rmsnorm(void *dev, float *sum, float *out, float *rstd, const float *a, const float *b,
                                 const float *w, int rows, int C, float eps, qd_nvfp4 *q)
{
    return qd_add_rmsnorm_ops(&cpu_ops, dev, sum, out, rstd, a, b, w, rows, C, eps, q);
}

static qd_status cpu_combine_add_rmsnorm(void *dev, float *sum, float *out, float *rstd, const float *res,
                                         const float *y, const float *row_w, const int32_t *tok_rows, int N,
                                         int K, int C, const float *w, float eps, qd_nvfp4 *q)
{
    return qd_combine_add_rmsnorm_ops(&cpu_ops, dev, sum, out, rstd, res, y, row_w, tok_rows, N, K, C, w, eps, q);
}

static qd_status cpu_swiglu_nvfp4(void *dev, qd_nvfp4 *q, float *h, const float *g, const float *u, int rows, int I)
{
    return qd_swiglu_nvfp4_ops(&cpu_ops, dev, q, h, g, u, rows, I);
}

static qd_status cpu_qk_norm_rope(void *dev, const qd_qk_args *a) { return qd_qk_norm_rope_ops(&cpu_ops, dev, a); }
static qd_status cpu_gather_nvfp4(void *dev, qd_nvfp4 *q, float *xe, const float *x, const int32_t *row_tok, int R,
                                  int C, int keep)
{
    return qd_gather_nvfp4_ops(&cpu_ops, dev, q, xe, x, row_tok, R, C, keep);
}

static const qd_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .to_dev = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .memory_id = cpu_memory_id,
    .mem_info = cpu_mem_info,
    .enter = cpu_enter,
    .leave = cpu_leave,
    .round_bf16 = cpu_round_bf16,
    .add = cpu_add,
    .embed = cpu_embed,
    .embed_backward = cpu_embed_backward,
    .rmsnorm = cpu_rmsnorm,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope = cpu_rope,
    .add_rmsnorm = cpu_add_rmsnorm,
    .combine_add_rmsnorm = cpu_combine_add_rmsnorm,
    .qk_norm_rope = cpu_qk_norm_rope,
    .gather_nvfp4 = cpu_gather_nvfp4,
    .swiglu_nvfp4 = cpu_swiglu_nvfp4,
    .to_bf16 = cpu_to_bf16,
    .embed_w16 = cpu_embed_w16,
    .matmul_w16 = cpu_matmul_w16,
    .matmul = cpu_matmul,
    .matmul_backward = cpu_matmul_backward,
    .matmul_grouped = cpu_matmul_grouped,
    .matmul_grouped_backward = cpu_matmul_grouped_backward,
    .fp8_quantize_rows = cpu_fp8_quantize_rows,
    .fp8_gemm = cpu_fp8_gemm,
    .fp8_gemm_grouped = cpu_fp8_gemm_grouped,
    .nvfp4_quantize = cpu_nvfp4_quantize,
    .nvfp4_fake_quant = cpu_nvfp4_fake_quant,
    .w4a4_gemm = cpu_w4a4_gemm,
    .w4a4_gemm_grouped = cpu_w4a4_gemm_grouped,
    .rac_error = cpu_rac_error,
    .rac_augment_act = cpu_rac_augment_act,
    .rac_augment_weight = cpu_rac_augment_weight,
    .nvfp4_quantize_weights = cpu_nvfp4_quantize_weights,
    .rac_select = cpu_rac_select,
    .rac_grouped = cpu_rac_grouped,
    .rac_multi = cpu_rac_multi,
    .w4a4_gemm_multi = cpu_w4a4_gemm_multi,
    .rac_fake_quant = cpu_rac_fake_quant,
    .sqerr_rows = cpu_sqerr_rows,
    .attend = cpu_attend,
    .attend_backward = cpu_attend_backward,
    .store_kv = cpu_store_kv,
    .route = cpu_route,
    .moe_group = cpu_moe_group,
    .moe_group_dev = cpu_moe_group_dev,
    .w4a4_gemm_grouped_dev = cpu_w4a4_gemm_grouped_dev,
    .rac_multi_dev = cpu_rac_multi_dev,
    .gather = cpu_gather,
    .swiglu = cpu_swiglu,
    .swiglu_backward = cpu_swiglu_backward,
    .combine = cpu_combine,
    .moe_dy = cpu_moe_dy,
    .unroute = cpu_unroute,
    .router_backward = cpu_router_backward,
    .logprob = cpu_logprob,
    .logprob_backward = cpu_logprob_backward,
    .sample = cpu_sample,
    .sumsq_chunks = cpu_sumsq_chunks,
    .adamw = cpu_adamw,
    .adamw_round = cpu_adamw_round,
    .diag_add = cpu_diag_add,
    .sqerr_weights = cpu_sqerr_weights,
    .bfp_weights = cpu_bfp_weights,
    .matmul_bfp = cpu_matmul_bfp,
};

const qd_ops *qd_cpu_ops(void) { return &cpu_ops; }

void *qd_cpu_dev_new(int num_threads)
{
    cpu_dev *d = calloc(1, sizeof *d);
    if (!d) {
        qd_error(QD_ERR_NOMEM, "cpu backend: context");
        return NULL;
    }
    d->num_threads = num_threads;
    return d;
}

static void cpu_dev_free(void *dev) { free(dev); }

qd_backend *qd_backend_cpu_init(const qd_model_config *cfg, const qd_backend_options *opt)
{
    if (qd_model_config_check(cfg))
        return NULL;
    if ((unsigned)opt->recipe >= QD_RECIPE_COUNT || opt->rac_ratio < 0 || opt->rac_ratio > 1) {
        qd_error(QD_ERR_ARG, "cpu backend: bad recipe or rac_ratio");
        return NULL;
    }
    if (opt->mode != QD_MODE_EXACT) {
        qd_error(QD_ERR_UNSUPPORTED, "cpu backend: mode '%s': the CPU runs exact mode only (fast mode "
                 "is the CUDA backend's)", qd_mode_name(opt->mode) ? qd_mode_name(opt->mode) : "?");
        return NULL;
    }
    cpu_dev *d = qd_cpu_dev_new(opt->num_threads);
    if (!d)
        return NULL;
    return qd_model_backend_new(cfg, opt, &cpu_ops, d, cpu_dev_free);
}
