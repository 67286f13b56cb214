/* backends/cuda: the exact-mode kernels of the CUDA backend, each the twin of
 * one function of the CPU backend (backends/cpu/cpu_ops.c, named in each
 * comment) computing every output with the CPU's operations in the CPU's order,
 * so the bits are the CPU's (NUMERICS.md §6). nvcc runs with -fmad=false; the
 * transcendentals are backends/exact_math.h's.
 *
 * All pointers are device pointers; work is enqueued on the legacy default
 * stream (in order); a launch error is QD_ERR_DEVICE naming the kernel, file
 * and line. Letters as in the CPU backend: N tokens, C hidden, H/KV heads, D
 * head_dim, E experts, K experts per token, V vocab, R routed rows. */
#ifndef QD_CUDA_KERNELS_H
#define QD_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#include "quant/status.h"
#include "backends/ops.h"

/* dst (n) = BF16-rounded src (round_bf16). */
qd_status qdk_round_bf16(float *dst, const float *src, size_t n);
/* dst (n) = the BF16 bit patterns of src rounded to nearest even (fast mode's
 * BF16 GEMM operands; exact for values already rounded to BF16). */
qd_status qdk_bf16_bits(uint16_t *dst, const float *src, size_t n);
/* dst (n) = BF16 bits of src / s[0] (s on the device; 0 where s[0] is 0):
 * a per-tensor fake-quant weight's E2M1 x E4M3 part (fast mode's QUADS_AQAT16). */
qd_status qdk_bf16_bits_div(uint16_t *dst, const float *src, size_t n, const float *s);
/* dst (rows, cols) compact = qdk_bf16_bits of the column block src[r][0 .. cols-1],
 * rows of stride ld (fast mode's BF16 operands of a wide product, a block at a time). */
/* Ranges of a grouped k_bf16_bits_div (dst[j] = BF16 bits of src[j] / *s[j], n[j] values) */
#define QDK_DIV_GROUP 64
typedef struct {
    uint16_t *dst[QDK_DIV_GROUP];
    const float *src[QDK_DIV_GROUP];
    size_t n[QDK_DIV_GROUP];
    const float *s[QDK_DIV_GROUP];
} qdk_div_group;
qd_status qdk_bf16_bits_div_group(const qdk_div_group *g, int m);
qd_status qdk_bf16_bits_cols(uint16_t *dst, const float *src, int64_t rows, int64_t cols, int64_t ld);
/* x (N, C) = embedding rows of tok (model_forward). */
qd_status qdk_embed(float *x, const float *emb, const int32_t *tok, int N, int C);
/* x (N, C) = embedding rows of tok of a table of BF16 bits (a rollout's, embed_w16). */
qd_status qdk_embed_w16(float *x, const uint16_t *emb, const int32_t *tok, int N, int C);
/* grads of the embedding (V, C) += dres (N, C) rows at tok, tokens ascending (model_backward). */
/* work (qdk_embed_backward_work_bytes, 0 for N <= QDK_EMBED_SORT_MIN) or NULL: the tokens grouped
 * by a sort first (the same bits) */
#define QDK_EMBED_SORT_MIN 256
size_t qdk_embed_backward_work_bytes(int N);
qd_status qdk_embed_backward(float *gemb, const float *dres, const int32_t *tok, int N, int C, void *work);

/* How the products' operands lie in memory (row-major, contiguous), named as
 * BLAS names C = op(A) . op(B), with op(A) (M, K) and op(B) (K, N):
 * QDK_NT: A (M, K), B stored (N, K): x . W^T (matmul_forward);
 * QDK_NN: A (M, K), B (K, N): dinp = dout . W (matmul_backward);
 * QDK_TN: A stored (K, M), B (K, N): dW = dout^T . x (matmul_backward). */
typedef enum { QDK_NN, QDK_NT, QDK_TN } qdk_layout;
/* C = the product, or C += it (gradients accumulate). */
typedef enum { QDK_OVERWRITE, QDK_ACCUMULATE } qdk_store;
/* The element type of an operand: float32, BF16 bit patterns, E4M3 codes. */
typedef enum { QDK_F32, QDK_BF16, QDK_E4M3 } qdk_elem;

/* C (M, N) (= or +=, store) sum_k op(A)(m, k) * op(B)(k, n), k ascending from
 * 0, float32 operands laid out as layout says: matmul_forward and both
 * products of matmul_backward, tiled through shared memory with each output's
 * sum kept in one thread. */
qd_status qdk_matmul(float *c, const float *a, const float *b, int M, int N, int K, qdk_layout layout,
                     qdk_store store);
/* C (M, N) = A (M, K) . W (N, K)^T (W float32, or BF16 bits: w_elem QDK_F32 or
 * QDK_BF16), qdk_matmul's bits (k ascending from 0, two roundings a step) in
 * a faster shape. prec QD_PREC_BF16: the operands are expected to be BF16
 * values; each K-stage of a CTA checks that they are (and that no product can
 * leave float32's range or grid) and then uses fmaf, which gives the same
 * bits. K % 8 == 0. */
qd_status qdk_matmul_wt(float *c, const float *a, const void *w, qdk_elem w_elem, int M, int N, int K,
                        qd_prec prec);
/* Independent products of one launch (MoE experts): item g is qdk_matmul's
 * C (M, N) = op(A) . op(B) with its own pointers and sizes, all of one layout
 * and store; elem QDK_F32, or QDK_E4M3: A and B are E4M3 codes and C is
 * scaled as qdk_fp8_gemm's. The same bits as one call per item. */
typedef struct {
    const void *a, *b;
    float *c;
    const float *sa, *sb;   /* E4M3 only: decode scales (M), (N) */
    int M, N, K;
} qdk_mm_item;
qd_status qdk_matmul_grouped(const qdk_mm_item *items, int n, qdk_layout layout, qdk_store store, qdk_elem elem);
/* y (M, N) = (sum_k e4m3(qa[m][k]) * e4m3(qw[n][k])) * (sa_inv[m] * sw_inv[n]) (qd_fp8_gemm). */
qd_status qdk_fp8_gemm(float *y, const uint8_t *qa, const float *sa_inv, const uint8_t *qw,
                       const float *sw_inv, int M, int N, int K);

/* rmsnorm_forward: out (rows, C), rstd (rows). In place (out == inp) allowed. */
qd_status qdk_rmsnorm(float *out, float *rstd, const float *inp, const float *w, int rows, int C, float eps);
/* rmsnorm_backward: dinp (rows, C) += (set: = 0.0f + that, dinp not read), dw (C) +=
 * (rows ascending). */
qd_status qdk_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                               const float *rstd, int rows, int C, int set);
/* rmsnorm_backward in fast mode's order: dinp as above; dw (C) += the sums of
 * chunks of QDK_RMSNORM_CHUNK rows, chunks ascending (a fixed order, not the
 * CPU's). work: at least ceil(rows / QDK_RMSNORM_CHUNK) * C floats. */
#define QDK_RMSNORM_CHUNK 512
qd_status qdk_rmsnorm_backward_fast(float *dinp, float *dw, float *work, const float *dout, const float *inp,
                                    const float *w, const float *rstd, int rows, int C, int set);
/* rope_forward (QD_ROPE_FORWARD) or rope_backward (QD_ROPE_INVERSE), in place on x (N, nh, D). */
qd_status qdk_rope(float *x, const int32_t *pos, const float *cosb, const float *sinb, int N, int nh, int D,
                   qd_rope_dir dir);

/* attend() for every (query n, head h): keys s = 0..pos[n] at rows kbase[n] + s
 * of kb, vb (rows of KV*D floats); p saved in att (N, H, Tm). Serves the
 * prefill (kbase = first token of the sequence) and the KV-cache decode
 * (kbase = the cache row's first slot). */
qd_status qdk_attend(float *out, float *att, const float *q, const float *kb, const float *vb,
                     const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int D, int Tm);
/* The same for a prefill (seq_off, host, nseq + 1 entries: the packing of
 * model.c, kbase the sequence's first row), the same bits: with
 * QUADS_ATT_PREFILL=1 and heads of 128, one CTA a tile of 128 (query, head)
 * pairs of a sequence and KV head reading the keys and values once for all of
 * them; else qdk_attend. */
qd_status qdk_attend_prefill(float *out, float *att, const float *q, const float *kb, const float *vb,
                             const int32_t *kbase, const int32_t *pos, const int32_t *seq_off, int nseq, int N,
                             int H, int KV, int D, int Tm);
/* Fast mode (NUMERICS.md §7): the same attention in one fused kernel, one warp
 * per (query, head), keys split across the lanes, warp-shuffle max and sum,
 * hardware exp; not bit-equal to qdk_attend (relative error stated in
 * tests/gpu/check_backend.cu). Writes att as qdk_attend does (backward reads it). */
qd_status qdk_attend_fast(float *out, float *att, const float *q, const float *kb, const float *vb,
                          const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int D, int Tm);
/* attention_backward over packed sequences (pos (N) the position of each token,
 * slen (N) the length of its sequence): dq, dk, dv (zeroed by the caller) get
 * the CPU's sums; ds is scratch (N, H, Tm). */
qd_status qdk_attend_backward(float *dq, float *dk, float *dv, float *ds, const float *dout, const float *att,
                              const float *q, const float *k, const float *v, const int32_t *pos,
                              const int32_t *slen, int N, int H, int KV, int D, int Tm);
/* store_kv: keys kr and values v (N, KV*D) into the caches (rows, Tc, KV*D) at (row[n], pos[n]). */
qd_status qdk_store_kv(float *kc, float *vc, const float *kr, const float *v, const int32_t *row,
                       const int32_t *pos, int N, int Tc, int KD);

qd_status qdk_add(float *out, const float *a, const float *b, size_t n);
/* the fused rows ops (ops.h), their kernels' bits (the first three in cuda_quant.cu) */
#define QDK_FR_MAXK 32 /* qdk_combine_add_rmsnorm's most experts a token */
qd_status qdk_add_rmsnorm(float *sum, float *out, float *rstd, const float *a, const float *b, const float *w,
                          int rows, int C, float eps, qd_nvfp4 *q);
qd_status qdk_combine_add_rmsnorm(float *sum, float *out, float *rstd, const float *res, const float *y,
                                  const float *row_w, const int32_t *tok_rows, int N, int K, int C, const float *w,
                                  float eps, qd_nvfp4 *q);
qd_status qdk_swiglu_nvfp4(qd_nvfp4 *q, float *h, const float *g, const float *u, int rows, int I);
qd_status qdk_qk_norm_rope(const qd_qk_args *a);
/* xe NULL: the rows only quantized, each from x[row_tok[r]] (no float copy) */
qd_status qdk_gather_nvfp4(qd_nvfp4 *q, float *xe, const float *x, const int32_t *row_tok, int R, int C);
/* softmax_rows + topk_row + the renormalization of route(): probs (N, E) in
 * place, topk and topw (N, K) in rank order. */
qd_status qdk_route(int32_t *topk, float *topw, float *probs, int N, int E, int K, qd_topk_norm norm);
/* qd_moe_group on the device: exp_off (E + 1, device) and the row tables
 * (N*K); topk NULL: a dense MLP (E = K = 1). scratch: N*K + E ints. */
qd_status qdk_moe_group(int32_t *exp_off, int32_t *row_tok, float *row_w, int32_t *row_rank, int32_t *tok_rows,
                        int32_t *scratch, const int32_t *topk, const float *topw, int N, int E, int K);
/* xe (R, C) = rows row_tok of x (N, C) (mlp_forward's gather). */
qd_status qdk_gather(float *xe, const float *x, const int32_t *row_tok, int R, int C);
qd_status qdk_swiglu(float *h, const float *g, const float *u, size_t n);
/* BF16 bits of qdk_gather's and qdk_swiglu's values; their float32 values back */
qd_status qdk_gather16(uint16_t *xe, const float *x, const int32_t *row_tok, int R, int C);
qd_status qdk_swiglu16(uint16_t *h, const float *g, const float *u, size_t n);
qd_status qdk_bf16_float(float *out, const uint16_t *x, size_t n);
qd_status qdk_swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n);
/* the same, dg and du as BF16 bits (qdk_bf16_bits's of the float values) */
qd_status qdk_swiglu_backward16(uint16_t *dg, uint16_t *du, const float *dh, const float *g, const float *u,
                                 size_t rows, int cols, int ld);
/* out (N, C) = per token, sum over its rows tok_rows (N, K) of y * row_w (mlp_forward). */
qd_status qdk_combine(float *out, const float *y, const float *row_w, const int32_t *tok_rows, int N, int K,
                      int C);
/* mlp_backward's first loop: dy (R, C) = dout row * row_w; dwt (N, K) = dout . y per rank. */
qd_status qdk_moe_dy(float *dy, float *dwt, const float *dout, const float *y, const float *row_w,
                     const int32_t *row_rank, const int32_t *tok_rows, int N, int K, int C);
/* the same, dy as BF16 bits */
qd_status qdk_moe_dy16(uint16_t *dy, float *dwt, const float *dout, const float *y, const float *row_w,
                       const int32_t *row_rank, const int32_t *tok_rows, int N, int K, int C);
/* dinp (N, C) += dxe rows of each token, in its tok_rows order. */
qd_status qdk_unroute(float *dinp, const float *dxe, const int32_t *tok_rows, int N, int K, int C);
/* router_backward: dlog (N, E) overwritten. */
qd_status qdk_router_backward(float *dlog, const float *dwt, const float *probs, const int32_t *topk,
                              const float *topw, int N, int E, int K, qd_topk_norm norm);

/* logprob_forward: logp (N), lse (N); s (N, V) scratch when T != 1; *bad (device
 * int) = 1 + the token whose logit / T overflows. */
qd_status qdk_logprob(float *logp, float *lse, float *s, const float *logits, const int32_t *tgt, int N,
                      int V, float T, int *bad);
/* Fast mode's: the same outputs in one pass over each row (the softmax's max
 * and sum online, lanes combined by a tree: another order of the sum, and
 * logp = x_t - lse with one rounding less), no scratch. */
qd_status qdk_logprob_fast(float *logp, float *lse, const float *logits, const int32_t *tgt, int N, int V, float T,
                           int *bad);
/* qd_sample_batch's rows without a top-k or top-p cut (top_k <= 0 or >= V,
 * top_p >= 1; T = 0 greedy): token, logprob, logprob_kept (B) of logits (B, V)
 * at (seed, sid[b], spos[b]) (device arrays); *bad (device int) = 1 when a
 * logit or logit / T is not finite (the results are then unspecified). work:
 * device scratch of qdk_sample_work_bytes(B, V). */
qd_status qdk_sample(int32_t *tok, float *lp, float *lpk, const float *logits, int B, int V, float T,
                     uint64_t seed, const uint64_t *sid, const uint32_t *spos, int *bad, void *work);
size_t qdk_sample_work_bytes(int B, int V);
/* logprob_backward: dlogits (N, V). */
/* dy16 (N, nc) = the BF16 bits of qdk_logprob_backward's columns c0 .. c0 + nc - 1; fast: with fast
 * mode's arithmetic (x * (1 / T), the hardware's exp) where the rows allow 16-byte loads */
qd_status qdk_logprob_backward_bf16_cols(uint16_t *dy16, const float *dlogp, const float *logits, const float *lse,
                                         const int32_t *tgt, int N, int V, float T, int c0, int nc, int fast);
qd_status qdk_logprob_backward(float *dlogits, const float *dlogp, const float *logits, const float *lse,
                               const int32_t *tgt, int N, int V, float T);

/* Diagnostics: per row r of x, xh (rows, cols): err[r] = sum (x - xh)^2,
 * nrm[r] = sum x^2 in double, ascending (measure_act_error / measure_weight_error). */
qd_status qdk_sqerr_rows(double *err, double *nrm, const float *x, const float *xh, int rows, int cols);
/* diag_add (backends/ops.h): for each of nsets (<= 32) sets k, segment g's
 * rows off[g] .. off[g+1]-1 of e (err then nrm, 2 rows doubles) added in
 * order into acc[2 s], acc[2 s + 1], s = slot[k nseg + g] (from 0.0 where
 * set); off (nseg + 1) and slot (nsets nseg) on the device. */
qd_status qdk_diag_add(double *acc, const double *e, int rows, const int32_t *off, const int32_t *slot, int nseg,
                       int nsets, int set);
/* sqerr_weights (backends/ops.h) over a table of count weights of one shape
 * (N, K) on the device: x, xh (NULL: the codes, scales and s_dec of a
 * per-tensor NVFP4 matrix of cols columns, its first K dequantized). */
typedef struct {
    const float *x, *xh;
    const uint8_t *codes, *scales;
    const float *s_dec;
    long long cols;
} qdk_sqw;
qd_status qdk_sqerr_weights(double *e, const qdk_sqw *t, int count, int N, int K);
/* qd_rac_error_accumulate's sum: err (K) += sum over rows ascending of (x - xh)^2. */
qd_status qdk_rac_error(double *err, const float *x, const float *xh, int rows, int K);

/* The same per expert: rows off[e] .. off[e+1]-1 (device, E + 1) into err[e]
 * (a device array of E device pointers). */
qd_status qdk_rac_error_grouped(double *const *err, const float *x, const float *xh, const int32_t *off, int E,
                                int K);

/* qd_rac_fake_quant's fold: out (rows, K) = deq's first K columns, then
 * out[r][ch[j]] += deq[r][K + j] (deq (rows, K + n), the dequantized augmented
 * rows; the channels are distinct). */
qd_status qdk_rac_fold(float *out, const float *deq, const int64_t *ch, int rows, int K, int64_t n);

/* grad_norm's partial sums: part[k] = sum of g^2 (double) over floats 4096k.. ascending. */
qd_status qdk_sumsq_chunks(double *part, const float *g, size_t n);
/* adamw_tensor over n floats. */
/* qdk_adamw, and wk = round_bf16 of the updated p, bits its BF16 bits (either may be NULL) */
qd_status qdk_adamw_round(float *p, const float *g, float *m, float *v, float *wk, uint16_t *bits, size_t n, float lr,
                          float beta1, float beta2, float eps, float wd, float gscale, float bc1, float bc2);
qd_status qdk_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                    float eps, float wd, float gscale, float bc1, float bc2);

/* backends/cuda/cuda_bfp.cu, the row block-floating-point product (cpu_bfp_weights,
 * cpu_matmul_bfp): wq (qd_bfp_bytes(OC, IC)) from the weights' BF16 bits w16 or
 * floats wf (rounded); out = x . w^T through ws, qdk_bfp_rows_bytes(N, IC) bytes
 * of scratch (x's mantissas). */
qd_status qdk_bfp_weights(void *wq, const uint16_t *w16, const float *wf, int OC, int IC);
size_t qdk_bfp_rows_bytes(int N, int IC);
qd_status qdk_matmul_bfp(float *out, const float *x, const void *wq, void *ws, int N, int IC, int OC);
/* qdk_matmul_bfp past 4 rows on Hopper's wgmma (k_matmul_bfp_wg): 1 where the
 * device has it, 0 never, -1 (default) as QUADS_BFP_WGMMA says (unset: where
 * the device has it). The same bits either way (benchmarks and tests). */
extern int qd_cuda_bfp_wgmma;

#ifdef __cplusplus
}
#endif

#endif
