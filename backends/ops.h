/* backends/: the device ops the one model driver (backends/model.c) calls, in
 * the style of ggml's backend ops: the driver holds the model's structure
 * (forward, backward, generate, the recipe table, buffers, AdamW, RAC state,
 * diagnostics) and a backend implements only these ops over its own memory.
 * The CPU's are backends/cpu/cpu_ops.c (the definitions of the numbers); the
 * CUDA twins are backends/cuda/cuda_ops.cu, each under the same slot name.
 *
 * Pointers marked "dev" are the backend's memory (host memory on the CPU):
 * the driver never reads them, it moves bytes with to_dev/to_host. "host"
 * arrays are ordinary host memory. Exact-mode ops give the CPU's bits on every
 * backend (NUMERICS.md §6); a backend in fast mode may compute the products
 * and attention in another order (§7). An optional slot is NULL where a
 * backend does not need it; the driver then does without (or falls back, as
 * said at the slot).
 *
 * Letters as everywhere in backends/: N tokens, C hidden, H / KV heads, D
 * head_dim, E experts, K experts per token, I an FFN width, V vocab, R routed
 * rows, IC / OC a linear's in / out features. */
#ifndef QD_OPS_H
#define QD_OPS_H

#include <stddef.h>
#include <stdint.h>
#include "backends/backend.h"
#include "backends/router.h"
#include "backends/sampling.h"
#include "quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a float product's operands were rounded: a fast-mode backend may use a
 * BF16 GEMM when both are BF16 values (QD_PREC_BF16), or when x is and W is a
 * per-tensor fake-quant weight, (e2m1 * e4m3) * s_dec (QD_PREC_BF16_X: AQAT's
 * linears; the BF16 part and s_dec as alpha). Exact mode ignores it. */
typedef enum { QD_PREC_F32 = 0, QD_PREC_BF16, QD_PREC_BF16_X } qd_prec;

/* The most linears one rac_multi or w4a4_gemm_multi call takes (q, k, v). */
#define QD_RAC_MULTI 4

/* RoPE's rotation, or its transpose (the backward's). */
typedef enum { QD_ROPE_FORWARD = 0, QD_ROPE_INVERSE } qd_rope_dir;

/* matmul_grouped_backward16b's add: dinp added to (else overwritten); dw
 * overwritten (else added to) for the experts with rows; head_backward's
 * flags: QD_BWD_DW_SET alone. matmul_backward's, rmsnorm_backward's and
 * attend_backward's flags: QD_BWD_DX_SET, their input gradients (dinp; dq,
 * dk, dv) set to 0.0f + what they would add (the bits of adding into zeros,
 * without the zeros: the driver's first writer of a buffer), else added to.
 * Exact mode keeps those bits; fast mode's stores may keep a -0.0 that adding
 * into zeros would have made +0.0 (within its bounds). */
typedef enum { QD_BWD_DX_ADD = 1, QD_BWD_DW_SET = 2, QD_BWD_DX_SET = 4 } qd_bwd_flags;

/* qk_norm_rope's operands (rows of D: q (N, H, D), k and v (N, KV, D)). */
typedef struct qd_qk_args {
    float *qr, *rstd_q, *kr, *rstd_k;
    const float *q, *wq, *k, *wk;
    const int32_t *pos;
    const float *cosb, *sinb;
    int N, H, KV, D;
    float eps;
    float *kc, *vc; /* NULL: no store */
    const float *v;
    const int32_t *row;
    int Tc;
} qd_qk_args;

/* diag_add's flags: QD_DIAG_SET, each sum from 0.0 (else added to acc) */
typedef enum { QD_DIAG_SET = 1 } qd_diag_flags;

/* Phases of a step, for an optional profiler (QUADS_CUDA_PROFILE); the
 * backward's own parts after QD_PH_SYNC (QD_PH_BWD: the rest of it). */
typedef enum {
    QD_PH_OTHER, QD_PH_ATTN_LIN, QD_PH_ATTN, QD_PH_ROUTE, QD_PH_EXPERTS, QD_PH_HEAD, QD_PH_LOGP, QD_PH_SAMPLE,
    QD_PH_BWD, QD_PH_OPT, QD_PH_SYNC, QD_PH_BWD_HEAD, QD_PH_BWD_EXPERTS, QD_PH_BWD_ROUTE, QD_PH_BWD_ATTN_LIN,
    QD_PH_BWD_ATTN, QD_PH_COUNT
} qd_phase;

typedef struct qd_ops {
    const char *name;                                   /* "cpu", "cuda" */
    /* ---- memory: every buffer of the model is made and moved through these */
    qd_status (*alloc)(void *dev, void **p, size_t bytes, const char *what); /* zeroed, 256-byte aligned */
    void (*release)(void *dev, void *p);                /* NULL is fine */
    qd_status (*zero)(void *dev, void *p, size_t bytes);
    qd_status (*to_dev)(void *dev, void *dst, const void *src_host, size_t bytes);
    qd_status (*to_host)(void *dev, void *dst_host, const void *src, size_t bytes);
    /* dst = src, both dev memory of this context or of one with the same
     * memory_id (a weight sync between instances, qd_backend_sync_from) */
    qd_status (*copy)(void *dev, void *dst, const void *src, size_t bytes);
    /* Where this context's memory lives: two contexts of one ops table with
     * the same id read each other's buffers (the CPU: 0, the process's memory;
     * CUDA: the device ordinal). */
    int (*memory_id)(void *dev);
    /* Bytes free for new buffers where this context allocates, and the total
     * (CUDA: cudaMemGetInfo; the CPU: MemAvailable of /proc/meminfo, else
     * sysconf's available pages). */
    qd_status (*mem_info)(void *dev, size_t *free_bytes, size_t *total_bytes);
    /* Bytes the ops keep beside the driver's buffers for a model of nfloats
     * parameters (the CUDA fast mode's BF16 copy of the working weights);
     * optional (none). */
    size_t (*own_bytes)(void *dev, size_t nfloats);
    /* The device finished every op enqueued so far; a non-finite input seen by
     * a quantizer since the last call is QD_ERR_NONFINITE. Optional (CPU ops are
     * synchronous and report at once). */
    qd_status (*finish)(void *dev);
    /* Around every call of the backend interface (the CPU sets its thread
     * count); optional. */
    int (*enter)(void *dev);
    void (*leave)(void *dev, int token);
    /* Profiler mark: the time since the last mark goes to the phase it opened;
     * optional. report prints the totals (at free). */
    void (*mark)(void *dev, qd_phase ph);
    void (*report)(void *dev);
    /* The working copy the products read changed (weight sync): a fast-mode
     * backend may derive its own copies (BF16 bits). Optional. */
    qd_status (*weights_changed)(void *dev, const float *wk, size_t n);

    /* ---- elementwise and rows */
    qd_status (*round_bf16)(void *dev, float *dst, const float *src, size_t n);   /* dst = bf16(src) */
    qd_status (*add)(void *dev, float *out, const float *a, const float *b, size_t n);
    qd_status (*embed)(void *dev, float *x, const float *emb, const int32_t *tok, int N, int C);
    /* gemb (V, C) += dres rows at tok, tokens ascending */
    qd_status (*embed_backward)(void *dev, float *gemb, const float *dres, const int32_t *tok, int N, int C);
    /* out (rows, C) = w * (x * rstd), rstd = rsqrt(sum(x^2)/C + eps) saved (rows) */
    qd_status (*rmsnorm)(void *dev, float *out, float *rstd, const float *x, const float *w, int rows, int C,
                         float eps);
    /* dinp (rows, C) += (flags QD_BWD_DX_SET: =), dw (C) += (rows ascending) */
    qd_status (*rmsnorm_backward)(void *dev, float *dinp, float *dw, const float *dout, const float *x,
                                  const float *w, const float *rstd, int rows, int C, int flags);
    /* HF rotate_half RoPE in place on x (N, nh, D) at positions pos (N), or its transpose */
    qd_status (*rope)(void *dev, float *x, const int32_t *pos, const float *cosb, const float *sinb, int N,
                      int nh, int D, qd_rope_dir dir);
    /* Fused rows (decode's launches; the bits of the ops they replace, run
     * in the order said). Optional each: where NULL the driver runs those ops.
     * add_rmsnorm: sum = a + b (rows, C), then rmsnorm(out, rstd, sum, w),
     * then (q non-NULL: rows x C, per-row scales) nvfp4_quantize(q, out). */
    qd_status (*add_rmsnorm)(void *dev, float *sum, float *out, float *rstd, const float *a, const float *b,
                             const float *w, int rows, int C, float eps, qd_nvfp4 *q);
    /* combine_add_rmsnorm: sum = res + combine(y, row_w, tok_rows) (N, C),
     * then rmsnorm(out, rstd, sum, w), then (q) nvfp4_quantize(q, out). */
    qd_status (*combine_add_rmsnorm)(void *dev, float *sum, float *out, float *rstd, const float *res,
                                     const float *y, const float *row_w, const int32_t *tok_rows, int N, int K,
                                     int C, const float *w, float eps, qd_nvfp4 *q);
    /* swiglu_nvfp4: swiglu(h, g, u, rows * I), then nvfp4_quantize(q, h)
     * (q: rows x I, per-row scales). */
    qd_status (*swiglu_nvfp4)(void *dev, qd_nvfp4 *q, float *h, const float *g, const float *u, int rows, int I);
    /* qk_norm_rope: rmsnorm(qr, rstd_q, q, wq) over N*H rows of D and
     * rmsnorm(kr, rstd_k, k, wk) over N*KV, rope(QD_ROPE_FORWARD) of both at
     * pos, then (kc non-NULL) store_kv(kc, vc, kr, v, row, pos, N, Tc, KV*D). */
    qd_status (*qk_norm_rope)(void *dev, const struct qd_qk_args *a);
    /* gather_nvfp4: gather(xe, x, row_tok, R, C), then (q non-NULL: R x C,
     * per-row scales) nvfp4_quantize(q, xe): the experts' gate/up input.
     * keep 0 (q non-NULL): the caller reads nothing of xe back (a generate's
     * step without diagnostics), so a backend may leave it unwritten and
     * quantize each row from x[row_tok[r]] directly (the same row, so the
     * same bits). */
    qd_status (*gather_nvfp4)(void *dev, qd_nvfp4 *q, float *xe, const float *x, const int32_t *row_tok, int R,
                              int C, int keep);

    /* ---- weights kept as BF16 bit patterns (a rollout instance's embedding,
     * router, lm_head): the bits of embed and matmul given the same values as
     * float32. Optional (all three or none): where NULL the driver keeps those
     * weights as float32. */
    qd_status (*to_bf16)(void *dev, uint16_t *dst, const float *src, size_t n); /* dst = bits of bf16(src) */
    qd_status (*embed_w16)(void *dev, float *x, const uint16_t *emb, const int32_t *tok, int N, int C);
    /* matmul with w (OC, IC) BF16 bits; IC % 8 == 0 */
    qd_status (*matmul_w16)(void *dev, float *out, const float *x, const uint16_t *w, int N, int IC, int OC,
                            qd_prec prec);

    /* ---- float products: out (N, OC) = x (N, IC) . w (OC, IC)^T, ic ascending */
    qd_status (*matmul)(void *dev, float *out, const float *x, const float *w, int N, int IC, int OC,
                        qd_prec prec);
    /* dinp (N, IC) += dout . w (oc ascending; flags QD_BWD_DX_SET: =); dw (OC, IC) +=
     * dout^T . x (n ascending); either may be NULL */
    qd_status (*matmul_backward)(void *dev, float *dinp, float *dw, const float *dout, const float *x,
                                 const float *w, int N, int IC, int OC, int flags);
    /* The experts of a layer: rows off[e] .. off[e+1]-1 (host, E + 1) of x and
     * out times w[e] (host array of dev pointers); the bits of one matmul per
     * expert (prec as matmul's). Optional: where NULL the driver calls matmul
     * per expert on its rows (in fast mode, then, the plain op's fast path). */
    qd_status (*matmul_grouped)(void *dev, float *out, const float *x, const float *const *w, const int32_t *off,
                                int E, int IC, int OC, qd_prec prec);
    /* The same rows: matmul_backward per expert into dinp's rows and dw[e].
     * Optional: where NULL the driver calls matmul_backward per expert. */
    qd_status (*matmul_grouped_backward)(void *dev, float *dinp, float *const *dw, const float *dout,
                                         const float *x, const float *const *w, const int32_t *off, int E,
                                         int IC, int OC);

    /* ---- the experts on BF16 activations (optional, all five or none): where
     * experts16 says so (the CUDA fast mode with BF16 products), the driver
     * keeps an expert input that is only rounded to BF16 (gate's and up's
     * gathered rows, down's SwiGLU) as BF16 bits instead of float32 values:
     * the same values at half the bytes, and no copy rounded or converted for
     * each product. gather16 and swiglu16: the BF16 bits of gather's and
     * swiglu's values; the grouped products: matmul_grouped and
     * matmul_grouped_backward of the values those bits hold. */
    int (*experts16)(void *dev);
    qd_status (*gather16)(void *dev, uint16_t *xe, const float *x, const int32_t *row_tok, int R, int C);
    qd_status (*swiglu16)(void *dev, uint16_t *h, const float *g, const float *u, size_t n);
    qd_status (*matmul_grouped16)(void *dev, float *out, const uint16_t *x, const float *const *w,
                                  const int32_t *off, int E, int IC, int OC, qd_prec prec);
    qd_status (*matmul_grouped_backward16)(void *dev, float *dinp, float *const *dw, const float *dout,
                                           const uint16_t *x, const float *const *w, const int32_t *off, int E,
                                           int IC, int OC);
    /* ---- and their backward's products read as BF16 bits (optional, all three or
     * none; where experts16 says so): moe_dy16 and swiglu_backward16 write the
     * BF16 bits (round to nearest even) of moe_dy's dy and swiglu_backward's dg,
     * du (dwt as moe_dy's), the only thing the products read of them
     * (swiglu_backward16 over rows x cols elements, dg's and du's rows ld
     * apart: ld = cols for arrays of their own, 2 cols with du = dg + cols
     * for [dg | du] rows, gate's and up's products in one);
     * matmul_grouped_backward16b is matmul_grouped_backward16 with dout as such
     * bits (the same products, without a float32 array written and read again
     * to be converted), dinp's rows added to where add has QD_BWD_DX_ADD,
     * else overwritten (no zeroed array to add to), and the dw of every
     * expert overwritten where add has QD_BWD_DW_SET (an expert without rows
     * gets zeros: the driver's lazy zero_grad does not zero those gradients
     * first), else added to. */
    qd_status (*moe_dy16)(void *dev, uint16_t *dy, float *dwt, const float *dout, const float *y,
                          const float *row_w, const int32_t *row_rank, const int32_t *tok_rows, int N, int K, int C);
    qd_status (*swiglu_backward16)(void *dev, uint16_t *dg, uint16_t *du, const float *dh, const float *g,
                                   const float *u, size_t rows, int cols, int ld);
    qd_status (*matmul_grouped_backward16b)(void *dev, float *dinp, float *const *dw, const uint16_t *dout,
                                            const uint16_t *x, const float *const *w, const int32_t *off, int E,
                                            int IC, int OC, int add);

    /* ---- quantizers and quantized products (quant/quant.h's definitions) */
    qd_status (*fp8_quantize_rows)(void *dev, uint8_t *q, float *scale_inv, const float *x, int rows, int cols);
    /* y (M, N) = (sum_k qa*qw) * (sa_inv[m] * sw_inv[n]) */
    qd_status (*fp8_gemm)(void *dev, float *y, const uint8_t *qa, const float *sa_inv, const uint8_t *qw,
                          const float *sw_inv, int M, int N, int K);
    /* fp8_gemm of the experts' rows (off as matmul_grouped's) with weight
     * qw[e], sw_inv[e]. Optional: where NULL the driver calls fp8_gemm per
     * expert. */
    qd_status (*fp8_gemm_grouped)(void *dev, float *y, const uint8_t *qa, const float *sa_inv,
                                  const uint8_t *const *qw, const float *const *sw_inv, const int32_t *off, int E,
                                  int N, int K);
    /* q (a qd_nvfp4 whose buffers are dev memory) = quantize(x) */
    qd_status (*nvfp4_quantize)(void *dev, qd_nvfp4 *q, const float *x);
    qd_status (*nvfp4_fake_quant)(void *dev, float *out, const float *x, int rows, int cols, qd_scale_kind scale);
    /* the canonical W4A4 product (NUMERICS.md §3) */
    qd_status (*w4a4_gemm)(void *dev, float *y, const qd_nvfp4 *a, const qd_nvfp4 *w);
    /* w4a4_gemm of the experts' rows of a (per-row scales; off as
     * matmul_grouped's) with w[e]. Optional: where NULL the driver calls
     * w4a4_gemm per expert on a view of those rows of a. */
    qd_status (*w4a4_gemm_grouped)(void *dev, float *y, const qd_nvfp4 *a, const qd_nvfp4 *const *w,
                                   const int32_t *off, int E);
    /* y[i] = w4a4_gemm(a[i], w[i]) for count (<= QD_RAC_MULTI) products (q, k
     * and v; host arrays), the bits of w4a4_gemm per product. Optional: where
     * NULL the driver calls w4a4_gemm per product. */
    qd_status (*w4a4_gemm_multi)(void *dev, float *const *y, const qd_nvfp4 *const *a, const qd_nvfp4 *const *w,
                                 int count);
    /* RAC (§5): err (K, double) += per-channel squared activation error of x (rows, K) */
    qd_status (*rac_error)(void *dev, double *err, const float *x, int rows, int K);
    qd_status (*rac_augment_act)(void *dev, qd_nvfp4 *out, const float *x, int rows, int K, const int64_t *ch,
                                 int64_t n);
    qd_status (*rac_augment_weight)(void *dev, qd_nvfp4 *out, const float *w, int N, int K, const int64_t *ch,
                                    int64_t n);
    /* Weights of one shape at a sync: for i < count, q[i] (N, K + n, one global
     * scale each) = quantize([x[i], x[i][:, ch[i]]]) (host arrays of dev
     * pointers; x[i] (N, K); ch[i] n channels, ignored when n = 0): the bits of
     * nvfp4_quantize (n = 0) or rac_augment_weight per tensor, in a few
     * launches. A non-finite weight may be reported at the next finish.
     * Optional: where NULL the driver calls those per tensor. */
    qd_status (*nvfp4_quantize_weights)(void *dev, qd_nvfp4 *const *q, const float *const *x,
                                        const int64_t *const *ch, int count, int N, int K, int64_t n);
    /* Per-tensor fake-quant weights at a sync: for i < count, out[i] (N, K) =
     * nvfp4_fake_quant(x[i], N, K, QD_SCALE_PER_TENSOR) (host arrays of dev
     * pointers; AQAT's working weights), the bits of the op per tensor, in a
     * few launches. Optional, and QD_ERR_UNSUPPORTED with nothing enqueued
     * where the backend does not batch: the driver then calls the op per tensor. */
    qd_status (*nvfp4_fake_quant_weights)(void *dev, float *const *out, const float *const *x, int count, int N,
                                          int K);
    /* RAC channel sets at a sync, qd_rac_select of each of count linears: for
     * i < count the qd_rac_count(ratio, K[i]) channels of largest err + off[i]
     * (dev, K[i] doubles; ties to the lower channel), ascending, into ch +
     * off[i] (dev), the other entries of those K[i] left as they are; off, K
     * host arrays. A non-finite error is QD_ERR_ARG naming it (CUDA:
     * QD_ERR_NONFINITE at the next finish). */
    qd_status (*rac_select)(void *dev, int64_t *ch, const double *err, const size_t *off, const int *K, int count,
                            double ratio);
    /* RAC over the experts of a layer: for each e, rows off[e] .. off[e+1]-1
     * (host) of x (R, K): rac_error into err[e] (unless err is NULL: no
     * statistics) and rac_augment_act with ch[e] (host arrays of dev pointers;
     * n channels each) into those rows of a (R, K + n). The bits of the two
     * ops per expert. Optional: where NULL the driver calls them per expert. */
    qd_status (*rac_grouped)(void *dev, qd_nvfp4 *a, double *const *err, const int64_t *const *ch,
                             const int32_t *off, int E, const float *x, int K, int64_t n);
    /* RAC of count (<= QD_RAC_MULTI) linears of one input x (R = off[E], K)
     * (q, k and v; the experts' gate and up): for i < count, rac_grouped(a[i],
     * err ? err[i] : NULL, ch[i], off, E, x, K, n[i]) (err[i], ch[i]: host
     * arrays of E dev pointers; one linear is E = 1, off = {0, R}). The bits
     * of rac_grouped per linear. Optional: where NULL the driver calls
     * rac_grouped (or rac_error and rac_augment_act) per linear. */
    qd_status (*rac_multi)(void *dev, qd_nvfp4 *const *a, double *const *const *err, const int64_t *const *const *ch,
                           const int64_t *n, int count, const int32_t *off, int E, const float *x, int K);
    /* out (rows, K) = qd_rac_fake_quant: the activation a RAC product multiplies,
     * folded back to K channels (the replay trainer's backward input) */
    qd_status (*rac_fake_quant)(void *dev, float *out, const float *x, int rows, int K, const int64_t *ch,
                                int64_t n);
    /* diagnostics: per row err[r] = sum (x - xh)^2, nrm[r] = sum x^2 (double, ascending) */
    qd_status (*sqerr_rows)(void *dev, double *err, double *nrm, const float *x, const float *xh, int rows,
                            int cols);

    /* ---- attention (GQA: query head h reads kv head h / (H/KV)) */
    /* query n over keys s = 0..pos[n] at rows kbase[n] + s of kb, vb (rows of
     * KV*D floats): att (N, H, Tm) the probabilities (0 for s > pos[n] where
     * written), out (N, H*D). seq_off (host, nseq + 1 entries) or NULL: a
     * prefill's packing, sequence b's tokens at rows seq_off[b] ..
     * seq_off[b+1]-1 with kbase and pos as it implies (NULL in decode); a
     * backend may take another route with it (CUDA fast mode: cuBLAS batched
     * products per sequence and head, att then 0 for pos[n] < s < Tm; under
     * the BF16 recipes a fused kernel that writes only what its backward
     * reads to att: there att is the backend's, read by attend_backward only) */
    qd_status (*attend)(void *dev, float *out, float *att, const float *q, const float *kb, const float *vb,
                        const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int D, int Tm,
                        const int32_t *seq_off, int nseq);
    /* packed sequences (pos (N) position in its sequence, slen (N) its length):
     * dq, dk, dv += (flags QD_BWD_DX_SET: =, else zeroed by the caller); ds scratch (N, H, Tm), undefined on
     * entry (the op sets what it reads: 2 GB a layer at a3b's 16 x 1,024 tokens
     * that the fused kernel never needs zeroed); seq_off as
     * attend's (the same as the forward's: att and out as it wrote them; out
     * is read by the CUDA fast mode's fused kernel only) */
    qd_status (*attend_backward)(void *dev, float *dq, float *dk, float *dv, float *ds, const float *dout,
                                 const float *out, const float *att, const float *q, const float *k, const float *v,
                                 const int32_t *pos, const int32_t *slen, int N, int H, int KV, int D, int Tm,
                                 const int32_t *seq_off, int nseq, int flags);
    /* kr, v (N, KV*D) into the caches (rows, Tc, KV*D) at (row[n], pos[n]) */
    qd_status (*store_kv)(void *dev, float *kc, float *vc, const float *kr, const float *v, const int32_t *row,
                          const int32_t *pos, int N, int Tc, int KD);

    /* ---- MoE (backends/router.h, backends/layout.h) */
    /* probs (N, E) softmax in place; topk, topw (N, K) rank order, weighted as norm says */
    qd_status (*route)(void *dev, int32_t *topk, float *topw, float *probs, int N, int E, int K, qd_topk_norm norm);
    /* qd_moe_group's rows: exp_off (host, E + 1); row_tok, row_w, row_rank,
     * tok_rows (dev, N*K); topk NULL: a dense MLP (E = K = 1) */
    qd_status (*moe_group)(void *dev, int32_t *exp_off, int32_t *row_tok, float *row_w, int32_t *row_rank,
                           int32_t *tok_rows, const int32_t *topk, const float *topw, int N, int E, int K);
    /* Device-side expert offsets (a decode step with no host synchronization
     * for its experts): moe_group with the offsets left in d_off (dev, E + 1;
     * nothing to the host); w4a4_gemm_grouped and rac_multi reading them there,
     * no expert with more than maxrows rows (the caller's bound: a token picks
     * an expert at most once, so N), R = d_off[E] given by the caller (N K).
     * Optional, all three: where any is NULL the driver takes the host offsets. */
    qd_status (*moe_group_dev)(void *dev, int32_t *d_off, int32_t *row_tok, float *row_w, int32_t *row_rank,
                               int32_t *tok_rows, const int32_t *topk, const float *topw, int N, int E, int K);
    qd_status (*w4a4_gemm_grouped_dev)(void *dev, float *y, const qd_nvfp4 *a, const qd_nvfp4 *const *w,
                                       const int32_t *d_off, int E, int maxrows);
    qd_status (*rac_multi_dev)(void *dev, qd_nvfp4 *const *a, double *const *const *err,
                               const int64_t *const *const *ch, const int64_t *n, int count, const int32_t *d_off,
                               int E, int R, const float *x, int K);
    qd_status (*gather)(void *dev, float *xe, const float *x, const int32_t *row_tok, int R, int C);
    qd_status (*swiglu)(void *dev, float *h, const float *g, const float *u, size_t n);
    qd_status (*swiglu_backward)(void *dev, float *dg, float *du, const float *dh, const float *g, const float *u,
                                 size_t n);
    /* out (N, C) = per token, its rows tok_rows (N, K) of y times row_w, in order */
    qd_status (*combine)(void *dev, float *out, const float *y, const float *row_w, const int32_t *tok_rows,
                         int N, int K, int C);
    /* dy (R, C) = dout row * row_w; dwt (N, K) = dout . y per rank */
    qd_status (*moe_dy)(void *dev, float *dy, float *dwt, const float *dout, const float *y, const float *row_w,
                        const int32_t *row_rank, const int32_t *tok_rows, int N, int K, int C);
    /* dinp (N, C) += dxe rows of each token, in its tok_rows order */
    qd_status (*unroute)(void *dev, float *dinp, const float *dxe, const int32_t *tok_rows, int N, int K, int C);
    /* dlog (N, E) overwritten: the router's softmax and renormalization backward */
    qd_status (*router_backward)(void *dev, float *dlog, const float *dwt, const float *probs,
                                 const int32_t *topk, const float *topw, int N, int E, int K, qd_topk_norm norm);

    /* ---- log-probs, sampling, the optimizer */
    /* logp (N) = log_softmax(logits / T)[tgt] as the sampler normalizes
     * (backends/sampling.h), 0 where tgt < 0; lse (N) saved. NONFINITE names
     * the token whose logit / T overflows. */
    qd_status (*logprob)(void *dev, float *logp, float *lse, const float *logits, const int32_t *tgt, int N,
                         int V, float T);
    /* dlogits (N, V) = dlogp * (onehot(tgt) - softmax(logits / T)) / T */
    qd_status (*logprob_backward)(void *dev, float *dlogits, const float *dlogp, const float *logits,
                                  const float *lse, const int32_t *tgt, int N, int V, float T);
    /* The lm_head's backward from the log-probs in one op: dinp (N, IC) +=
     * dl . w and dw (V, IC) += dl^T . x, dl = logprob_backward's dlogits,
     * which need not be stored (the CUDA fast mode makes their BF16 bits a
     * block of columns at a time: N x V floats are 10 GB at a3b's 16 x 1024
     * tokens). Optional, and QD_ERR_UNSUPPORTED with nothing enqueued where
     * the backend does not fuse (exact mode): the driver then calls
     * logprob_backward and matmul_backward. flags QD_BWD_DW_SET: dw
     * overwritten instead (the lazy zero_grad's). */
    qd_status (*head_backward)(void *dev, float *dinp, float *dw, const float *dlogp, const float *logits,
                               const float *lse, const int32_t *tgt, const float *x, const float *w, int N, int IC,
                               int V, float T, int flags);
    /* out (host, B): qd_sample_row of each row of logits (B, V) at (seq_ids[b], positions[b]).
     * Optional: where NULL the driver copies the logits to the host (to_host)
     * and samples there (qd_sample_batch, backends/sampling.c). */
    qd_status (*sample)(void *dev, qd_sample_result *out, const float *logits, int B, int V,
                        const qd_sample_params *p, const uint64_t *seq_ids, const uint32_t *positions);
    /* part[k] (double, dev) = sum of g^2 over floats 4096k .. 4096k+4095, ascending */
    qd_status (*sumsq_chunks)(void *dev, double *part, const float *g, size_t n);
    qd_status (*adamw)(void *dev, float *p, const float *g, float *m, float *v, size_t n, const qd_adamw *o,
                       float wd, float gscale, float bc1, float bc2);
    /* adamw, and wk (n) = round_bf16 of the updated p in the same pass (a BF16
     * recipe's working copy; the CUDA fast mode writes its BF16 bits too).
     * Optional: where NULL the weight sync rounds the master afterwards. */
    qd_status (*adamw_round)(void *dev, float *p, const float *g, float *m, float *v, float *wk, size_t n,
                             const qd_adamw *o, float wd, float gscale, float bc1, float bc2);
    /* adamw_round for a working copy whose floats no op reads (the experts'
     * BF16 linears in CUDA's fast mode, whose products read the BF16 bits it
     * keeps): only those bits written, wk's floats left as they were (stale
     * until the next set_weights). QD_ERR_UNSUPPORTED, nothing done, where
     * the backend keeps no such bits for wk. Optional. */
    qd_status (*adamw_bits)(void *dev, float *p, const float *g, float *m, float *v, const float *wk, size_t n,
                            const qd_adamw *o, float wd, float gscale, float bc1, float bc2);
    /* Whether matmul, matmul_w16 (QD_PREC_BF16) and matmul_backward of N rows,
     * IC into OC read x only through its BF16 bits (round to nearest even, the
     * bits of round_bf16(x)), so the driver need not round a BF16 linear's
     * input first (a pass over it, written and read again). Optional: NULL = no. */
    int (*rounds_bf16_input)(void *dev, int N, int IC, int OC);
    /* x (n floats) stays unchanged until the next call (x NULL: no longer
     * held): products of several linears of that one input (q, k and v
     * forward and backward) may reuse what they made of it (CUDA's fast mode:
     * its BF16 bits, converted once, not once a linear). Optional. */
    void (*hold_input)(void *dev, const float *x, size_t n);
    /* Diagnostics' sums kept on the device, so that measuring a linear does
     * not wait for the device: for each of nsets (1 to 32) sets k and g <
     * nseg, s = slot[k nseg + g], over r = off[g] .. off[g+1]-1 ascending,
     * acc[2 s] += e[r] and acc[2 s + 1] += e[rows + r] (double; e as
     * sqerr_rows writes it: err then nrm), each sum starting from 0.0
     * instead of acc where flags has QD_DIAG_SET. off host (nseg + 1
     * entries), or NULL with d_off (dev) instead; slot host (nsets nseg),
     * distinct within a call. The bits of e copied to the host and added
     * there in that order. Optional: where NULL the driver does just that. */
    qd_status (*diag_add)(void *dev, double *acc, const double *e, int rows, const int32_t *off,
                          const int32_t *d_off, const int32_t *slot, int nseg, int nsets, int flags);
    /* Diagnostics' weight error at a sync, count weights of one shape (N, K)
     * in one call: for i < count and row r, e[i N + r] = sum (x - xh)^2 and
     * e[count N + i N + r] = sum x^2 over the row's K columns ascending
     * (double), x = x[i]'s row, xh = xh[i]'s (its per-tensor fake-quant)
     * where xh is not NULL, else q[i]'s first K columns dequantized (a W4A4
     * linear's codes, RAC's augmented ones too: their first K columns are
     * quantize(x[i])'s). x, xh, q: host arrays of dev pointers / host structs
     * of dev buffers. The bits of sqerr_rows per weight against its
     * fake-quant. Optional: where NULL the driver measures a weight at a time. */
    qd_status (*sqerr_weights)(void *dev, double *e, const float *const *x, const float *const *xh,
                               const qd_nvfp4 *const *q, int count, int N, int K);
    /* ---- The row block-floating-point product (docs/numerics.md §3b; the
     * order of the lm_head's exact product where its weights are BF16
     * values): bfp_weights makes wq (dev, qd_bfp_bytes(OC, IC)) from the
     * weights (OC, IC), given as BF16 bits w16 or as floats wf (taken as their
     * BF16 roundings; one of the two NULL); matmul_bfp: out (N, OC) = x (N,
     * IC) . w^T, each output the exact integer dot product of the rows'
     * mantissas, rounded once (a row holding a NaN or an infinity, a float
     * weight rounding to one included, gives NaN outputs). IC % 16 == 0,
     * IC <= 16384; wq on 16 bytes (as alloc gives). Optional (both or
     * neither). */
    qd_status (*bfp_weights)(void *dev, void *wq, const uint16_t *w16, const float *wf, int OC, int IC);
    qd_status (*matmul_bfp)(void *dev, float *out, const float *x, const void *wq, int N, int IC, int OC);
    /* ---- Step graphs (a decode step's ops recorded once, then replayed by
     * one launch): graph_begin starts recording this thread's ops (none run
     * until replayed); graph_end stops it and, where ok and every op was one a
     * recording can hold (a copy to or from the host, a synchronization or an
     * allocation is not: the op returns QD_ERR_UNSUPPORTED with no message
     * while recording), keeps the recording under key (a few are kept, the
     * least recently run replaced), else QD_ERR_UNSUPPORTED; graph_run
     * enqueues key's recording, QD_ERR_UNSUPPORTED where none is kept or a
     * buffer the backend owns was freed since it was made; graph_drop forgets
     * every recording (their buffers are about to go). The caller keeps what a
     * recording read the same: its buffers, shapes and arguments; only the
     * contents of device buffers change between runs. Optional (all four or
     * none). */
    qd_status (*graph_begin)(void *dev);
    qd_status (*graph_end)(void *dev, uint64_t key, int ok);
    qd_status (*graph_run)(void *dev, uint64_t key);
    void (*graph_drop)(void *dev);
} qd_ops;

/* The fused rows ops as the ops they stand for, one after the other on o's
 * backend (the CPU's definitions; a backend's fallback). */
static inline qd_status qd_add_rmsnorm_ops(const qd_ops *o, void *dev, float *sum, float *out, float *rstd,
                                           const float *a, const float *b, const float *w, int rows, int C,
                                           float eps, qd_nvfp4 *q)
{
    qd_status st = o->add(dev, sum, a, b, (size_t)rows * C);
    if (!st)
        st = o->rmsnorm(dev, out, rstd, sum, w, rows, C, eps);
    return st || !q ? st : o->nvfp4_quantize(dev, q, out);
}

static inline qd_status qd_combine_add_rmsnorm_ops(const qd_ops *o, void *dev, float *sum, float *out, float *rstd,
                                                   const float *res, const float *y, const float *row_w,
                                                   const int32_t *tok_rows, int N, int K, int C, const float *w,
                                                   float eps, qd_nvfp4 *q)
{
    qd_status st = o->combine(dev, sum, y, row_w, tok_rows, N, K, C);
    return st ? st : qd_add_rmsnorm_ops(o, dev, sum, out, rstd, res, sum, w, N, C, eps, q);
}

static inline qd_status qd_swiglu_nvfp4_ops(const qd_ops *o, void *dev, qd_nvfp4 *q, float *h, const float *g,
                                            const float *u, int rows, int I)
{
    qd_status st = o->swiglu(dev, h, g, u, (size_t)rows * I);
    return st ? st : o->nvfp4_quantize(dev, q, h);
}

static inline qd_status qd_qk_norm_rope_ops(const qd_ops *o, void *dev, const qd_qk_args *a)
{
    qd_status st = o->rmsnorm(dev, a->qr, a->rstd_q, a->q, a->wq, a->N * a->H, a->D, a->eps);
    if (!st)
        st = o->rmsnorm(dev, a->kr, a->rstd_k, a->k, a->wk, a->N * a->KV, a->D, a->eps);
    if (!st)
        st = o->rope(dev, a->qr, a->pos, a->cosb, a->sinb, a->N, a->H, a->D, QD_ROPE_FORWARD);
    if (!st)
        st = o->rope(dev, a->kr, a->pos, a->cosb, a->sinb, a->N, a->KV, a->D, QD_ROPE_FORWARD);
    if (!st && a->kc)
        st = o->store_kv(dev, a->kc, a->vc, a->kr, a->v, a->row, a->pos, a->N, a->Tc, a->KV * a->D);
    return st;
}

static inline qd_status qd_gather_nvfp4_ops(const qd_ops *o, void *dev, qd_nvfp4 *q, float *xe, const float *x,
                                            const int32_t *row_tok, int R, int C, int keep)
{
    (void)keep; /* xe written either way */
    qd_status st = o->gather(dev, xe, x, row_tok, R, C);
    return st || !q ? st : o->nvfp4_quantize(dev, q, xe);
}

/* bfp_weights' layout: F (OC int32, each row's exponent; zeros up to), from byte
 * qd_bfp_hi_at the mantissas' high bytes W >> 8 (OC x IC int8), then their
 * low bytes W & 255 (OC x IC uint8): W = 256 hi + lo. */
static inline size_t qd_bfp_hi_at(int OC) { return ((size_t)OC * 4 + 255) & ~(size_t)255; }
static inline size_t qd_bfp_bytes(int OC, int IC) { return qd_bfp_hi_at(OC) + 2 * (size_t)OC * (size_t)IC; }
#define QD_BFP_MAX_IC 16384
/* The shapes bfp_weights (N 0) and matmul_bfp take. */
static inline int qd_bfp_shape_ok(int N, int IC, int OC)
{
    return N >= 0 && OC >= 0 && IC > 0 && IC % 16 == 0 && IC <= QD_BFP_MAX_IC;
}

/* The CPU's ops (backends/cpu/cpu_ops.c), for tests that run an op on two backends. */
const qd_ops *qd_cpu_ops(void);
/* A CPU ops context with that many OpenMP threads (0: the runtime's); free with free(). */
void *qd_cpu_dev_new(int num_threads);

/* The CUDA ops (backends/cuda/cuda_ops.cu, linked only where CUDA was built)
 * and an ops context on the current device (weights: the precision of the
 * working weights; QD_PREC_BF16 in fast mode keeps a BF16 copy of them for the
 * BF16 GEMMs); NULL with a message. */
const qd_ops *qd_cuda_ops(void);
void *qd_cuda_dev_new(qd_exec_mode mode, qd_prec weights);
void qd_cuda_dev_free(void *dev);

/* The backend of one model over a device: ops and dev (owned; free_dev(dev)
 * at the end, also when this fails). NULL with a message on a bad config or
 * option, or when out of memory. */
qd_backend *qd_model_backend_new(const qd_model_config *cfg, const qd_backend_options *opt, const qd_ops *ops,
                                 void *dev, void (*free_dev)(void *dev));

/* 1 (the default): a generate's rows with one prompt (a group's samples) share
 * its prefill (the same bits; not while RAC statistics or diagnostics are
 * gathered); 0 (tests and benchmarks, or QUADS_SHARE_PREFILL=0): every row's
 * prompt runs. */
extern int qd_model_share_prefill;

/* 1 (the default): a decode of at most 64 rows (QUADS_MOE_DEV_ROWS) keeps its MoE layers' expert
 * offsets on the device where the ops offer it (moe_group_dev and the two
 * after it; the same bits); 0 (tests, or QUADS_MOE_DEV_OFF=0): on the host. */
extern int qd_model_moe_dev_off;

/* 1 (the default): the forward calls the fused rows ops (add_rmsnorm,
 * combine_add_rmsnorm, swiglu_nvfp4, qk_norm_rope, gather_nvfp4; the activation a fused op
 * quantizes taken by the product after it); 0 (tests, or QUADS_FUSED_ROWS=0):
 * the ops they stand for, one after the other. The same bits. */
extern int qd_model_fused_rows;

#ifdef __cplusplus
}
#endif

#endif /* QD_OPS_H */
