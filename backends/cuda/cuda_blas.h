/* backends/cuda: the GEMMs of the CUDA backend's fast mode through cuBLASLt
 * (docs/numerics.md §7), and the native Blackwell NVFP4 W4A4 product.
 *
 * Fast mode is not bit-exact: each product is checked against the exact
 * reference by relative error (tests/gpu/check_blas.cu states the bounds).
 *
 * All matrices are row-major device pointers; float32 outputs. Shapes use a
 * linear layer's names: M rows (tokens), N output features, K input features;
 * the forward is y (M, N) = x (M, K) . W (N, K)^T. beta is 0 (overwrite) or 1
 * (accumulate into the output, as backward passes do); other values work too.
 * Work runs on the legacy default stream and is only enqueued: read the output
 * after a synchronizing call. A cuBLASLt failure returns QD_ERR_DEVICE (or
 * QD_ERR_UNSUPPORTED when no algorithm exists for the shape) with a message
 * naming the cuBLASLt call, the file and the line.
 *
 * State: one cuBLASLt handle, a 32 MiB workspace and a cache of matmul plans
 * per device (cudaGetDevice() at the call), made on first use and freed by
 * qd_cuda_blas_release(). Calls on one device must not run concurrently. */
#ifndef QD_CUDA_BLAS_H
#define QD_CUDA_BLAS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "quant/quant.h"

/* ---- BF16 inputs (bit patterns, uint16_t), float32 accumulate and output */
/* y (M, N) = x (M, K) . w (N, K)^T + beta * y */
qd_status qd_cuda_gemm_bf16(float *y, const uint16_t *x, const uint16_t *w, int64_t M, int64_t N,
                            int64_t K, float beta);
/* dx (M, K) = dy (M, N) . w (N, K) + beta * dx */
qd_status qd_cuda_gemm_bf16_dx(float *dx, const uint16_t *dy, const uint16_t *w, int64_t M, int64_t N,
                               int64_t K, float beta);
/* the forward and dx with alpha times the product (a fake-quant weight's
 * per-tensor scale: its E2M1 x E4M3 part is a BF16 value) */
qd_status qd_cuda_gemm_bf16_scaled(float *y, const uint16_t *x, const uint16_t *w, int64_t M, int64_t N,
                                   int64_t K, float alpha, float beta);
qd_status qd_cuda_gemm_bf16_dx_scaled(float *dx, const uint16_t *dy, const uint16_t *w, int64_t M, int64_t N,
                                      int64_t K, float alpha, float beta);
/* dw (N, K) = dy (M, N)^T . x (M, K) + beta * dw */
qd_status qd_cuda_gemm_bf16_dw(float *dw, const uint16_t *dy, const uint16_t *x, int64_t M, int64_t N,
                               int64_t K, float beta);

/* Benchmarks only: every dense product (the functions above and below, not
 * the grouped ones) runs cuBLASLt's heuristic candidate i of up to 8 (in its
 * order of expected speed), QD_ERR_UNSUPPORTED where it has fewer or that
 * one refuses; -1 (the default): the first that runs. */
void qd_cuda_lt_force(int i);

/* ---- float32 inputs, CUBLAS_COMPUTE_32F (true float32 products, never TF32) */
qd_status qd_cuda_gemm_f32(float *y, const float *x, const float *w, int64_t M, int64_t N, int64_t K,
                           float beta);
qd_status qd_cuda_gemm_f32_dx(float *dx, const float *dy, const float *w, int64_t M, int64_t N,
                              int64_t K, float beta);
qd_status qd_cuda_gemm_f32_dw(float *dw, const float *dy, const float *x, int64_t M, int64_t N,
                              int64_t K, float beta);

/* ---- The experts' products (MoE): E products over the row ranges off[e] ..
 * off[e+1]-1 (off host, E + 1 entries, non-decreasing) of row-major
 * activations, expert e's weight w[e] (N, K) (host array of device pointers).
 * BF16 inputs: one cublasLtMatmul per expert with rows, all with the
 * algorithms cuBLASLt's heuristic chose once for the shape family (the
 * experts' problems differ only in their row count; plans cached as above);
 * float32 inputs: one cublasGemmEx per expert (cuBLAS chooses its kernels per
 * call). QUADS_EXPERT_GEMM=loop|grouped|lt overrides: one cublasGemmEx each,
 * one cublasGemmGroupedBatchedEx for all (pointer arrays uploaded through a
 * ring of pinned buffers), or cublasLtMatmul (BF16 only). Where a path does not
 * apply (a pointer off 16 bytes, a type or shape it refuses), the loop. All
 * enqueued back to back on the legacy default stream (no host
 * synchronization). An expert without rows is skipped (its dw unchanged). One
 * cuBLAS handle per device, beside the cuBLASLt state above (freed with it). */
typedef enum {
    QD_GEMM_F32 = 0, /* CUBLAS_COMPUTE_32F: float32 products, never TF32 */
    QD_GEMM_TF32 = 1 /* CUBLAS_COMPUTE_32F_FAST_TF32: the tensor cores read each float input
                      * as TF32 (10 mantissa bits: relative change at most 2^-10, none for a
                      * BF16 value), products summed in float32 */
} qd_gemm_math;

/* One problem of a grouped product: row-major C (M, N) = alpha op(A) (M, K) .
 * op(B) (K, N) + beta C, contiguous rows (lda K, or M when ta; ldb N, or K when
 * tb; ldc N). */
typedef struct {
    const void *A, *B;
    float *C;
    int M, N, K;
    float alpha;
} qd_grp_gemm;

/* G such products with BF16 operands (float32 accumulate and C), one launch
 * per 64 (cuda_grouped.cu: QUADS_EXPERT_GEMM=mma); every N equal. ta, tb as
 * above. QD_ERR_UNSUPPORTED with nothing enqueued where a problem's
 * contiguous dimension is not a multiple of 8 or a pointer is off 16 bytes. */
qd_status qd_cuda_grouped_mma_bf16(const qd_grp_gemm *g, int G, int ta, int tb, float beta);
/* The same on Hopper's warpgroup MMA (cuda_grouped.cu: QUADS_EXPERT_GEMM=wgmma):
 * configuration cfg of qd_cuda_grouped_wgmma_configs() (tile and pipeline; -1:
 * QUADS_WGMMA_CFG, else 0). QD_ERR_UNSUPPORTED also on a device other than
 * compute capability 9.0, an odd N or C off 8 bytes. */
qd_status qd_cuda_grouped_wgmma_bf16(const qd_grp_gemm *g, int G, int ta, int tb, float beta, int cfg);
int qd_cuda_grouped_wgmma_configs(void);

/* y rows (N) = alpha[e] x rows (K) . w[e]^T, overwritten: BF16 bits in, float32
 * accumulate and out; alpha (host, E) NULL for all 1 */
qd_status qd_cuda_gemm_grouped_bf16(float *y, const uint16_t *x, const uint16_t *const *w, const float *alpha,
                                    const int32_t *off, int E, int64_t N, int64_t K);
/* the same with float32 inputs under math */
qd_status qd_cuda_gemm_grouped_f32(float *y, const float *x, const float *const *w, const int32_t *off, int E,
                                   int64_t N, int64_t K, qd_gemm_math math);
/* The backward, accumulating (beta = 1): dx rows (K) += dy rows (N) . w[e];
 * dw[e] (N, K) += dy rows^T . x rows. dx or dw may be NULL (not computed). */
qd_status qd_cuda_gemm_grouped_f32_backward(float *dx, float *const *dw, const float *dy, const float *x,
                                            const float *const *w, const int32_t *off, int E, int64_t N,
                                            int64_t K, qd_gemm_math math);
/* the same with BF16 bits in (float32 accumulate): dx and dw float32; dx rows
 * += alpha[e] dy rows . w[e] (alpha host, NULL for all 1) */
qd_status qd_cuda_gemm_grouped_bf16_backward(float *dx, float *const *dw, const uint16_t *dy, const uint16_t *x,
                                             const uint16_t *const *w, const float *alpha, const int32_t *off,
                                             int E, int64_t N, int64_t K);
/* the same with dx's rows overwritten (add without bit 0: dx = alpha dy . w) or added to (bit 0),
 * and dw (the experts with rows) added to, or overwritten where add has bit 1 */
qd_status qd_cuda_gemm_grouped_bf16_backward_to(float *dx, float *const *dw, const uint16_t *dy, const uint16_t *x,
                                                const uint16_t *const *w, const float *alpha, const int32_t *off,
                                                int E, int64_t N, int64_t K, int add);

/* ---- FP8 E4M3 with one decode scale per row (quant/'s qd_fp8_quantize_rows codes):
 * y[m][n] = (sum_k qa[m][k] * qw[n][k]) * (sa_inv[m] * sw_inv[n]).
 * qa (M, K), sa_inv (M), qw (N, K), sw_inv (N); K a multiple of 16 (cuBLASLt's
 * FP8 rows must be 16-byte aligned). cuBLASLt computes the unscaled product
 * (precise accumulation, CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0); a small kernel
 * then applies the two scales in the CPU's order. */
qd_status qd_cuda_gemm_fp8(float *y, const uint8_t *qa, const float *sa_inv, const uint8_t *qw,
                           const float *sw_inv, int64_t M, int64_t N, int64_t K);

/* The same product for every expert in one launch (cuda_fp8.cu; fast mode's FP8
 * experts): rows off[e] .. off[e+1]-1 of qa and sa_inv (off on the host, E + 1
 * entries) against qw[e] (N, K) and sw_inv[e]; E4M3 tensor cores (sm_89 and
 * later), float32 sums a stage of 128 k added in float32, then the scales in
 * the CPU's order. qd_cuda_fp8_grouped_ok: K a multiple of 16 and every
 * operand on 16 bytes (else QD_ERR_SHAPE). */
int qd_cuda_fp8_grouped_ok(const uint8_t *qa, const uint8_t *const *qw, int E, int64_t K);
qd_status qd_cuda_gemm_fp8_grouped(float *y, const uint8_t *qa, const float *sa_inv, const uint8_t *const *qw,
                                   const float *const *sw_inv, const int32_t *off, int E, int64_t N, int64_t K);

/* ---- W4A4 (NVFP4 x NVFP4). a (M, K) and w (N, K) are device qd_nvfp4
 * (backends/cuda/cuda_quant.h: row-major, unswizzled scales). */
typedef enum {
    QD_W4A4_EMULATED = 0,      /* qd_cuda_w4a4_gemm(_tc): the canonical order, CPU bits */
    QD_W4A4_CUBLASLT_NVFP4 = 1 /* cuBLASLt block-scaled FP4 (Blackwell), tolerance only */
} qd_w4a4_path;

/* The path the fast mode uses on the current device: cuBLASLt NVFP4 when the
 * compute capability's major is 10 or 12, this binary carries device code for
 * it (an sm_100a/sm_120a target) and the loaded cuBLASLt is 12.8 or newer;
 * else the emulated kernels. Hopper (9.x) always gets QD_W4A4_EMULATED. */
qd_w4a4_path qd_cuda_w4a4_path(void);
/* "cublaslt-nvfp4" or "emulated". */
const char *qd_cuda_w4a4_path_name(qd_w4a4_path p);

/* y (M, N) through cuBLASLt's block-scaled FP4 matmul: the codes as
 * CUDA_R_4F_E2M1, the block scales swizzled on the device into the
 * VEC16_UE4M3 128x4 layout, alpha = 1, then y[m][n] *= s_dec_a[m] * s_dec_w[n]
 * (each per row or per tensor as its per_row says) in a small kernel: alpha is
 * one scalar and cannot carry per-token activation scales. K must be a
 * multiple of 32. QD_ERR_UNSUPPORTED when qd_cuda_w4a4_path() is not native. */
qd_status qd_cuda_w4a4_gemm_native(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w);
/* The fast mode's W4A4: native where qd_cuda_w4a4_path() says so (and K % 32
 * == 0), else qd_cuda_w4a4_gemm_tc (the canonical bits). */
qd_status qd_cuda_w4a4_gemm_fast(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w);

/* Device twin of qd_scales_swizzle: src (rows, scale_cols) E4M3 codes,
 * row-major -> dst, qd_scales_swizzled_size(rows, scale_cols) bytes, padding 0. */
qd_status qd_cuda_scales_swizzle(uint8_t *dst, const uint8_t *src, int64_t rows, int64_t scale_cols);

/* ---- Fast mode's prefill attention (the attend / attend_backward ops of
 * backends/ops.h with a prefill's packing): per sequence b (rows seq_off[b] ..
 * seq_off[b+1]-1, host, nseq + 1 entries, length L) and head h (kv head h /
 * (H/KV)), row-major products batched through cublasGemmBatchedEx over the
 * (sequence, head) pairs of one length (pointer arrays built on the host,
 * uploaded through a pinned buffer): S = scale Q K^T into att (N, H, Tm), a
 * softmax over s <= pos[n] in place (__expf; 0 for pos[n] < s < Tm), out = P V.
 * The backward: dP = dY V^T into ds, ds = P (dP - sum_s P dP) scale (0 past
 * pos[n]), dq += ds K, dk += ds^T Q and dv += P^T dY summed over the group's
 * heads (one batched call per head of the group, beta 1). The products under
 * math (TF32 under BF16 recipes); the whole square L x L is computed, the
 * softmax zeroes its upper triangle. pos (N) on the device. */
qd_status qd_cuda_attend_gemm(float *out, float *att, const float *q, const float *k, const float *v,
                              const int32_t *pos, const int32_t *seq_off, int nseq, int N, int H, int KV, int D,
                              int Tm, qd_gemm_math math);
qd_status qd_cuda_attend_gemm_backward(float *dq, float *dk, float *dv, float *ds, const float *dout,
                                       const float *att, const float *q, const float *k, const float *v,
                                       const int32_t *pos, const int32_t *seq_off, int nseq, int N, int H, int KV,
                                       int D, int Tm, qd_gemm_math math);

/* ---- Fast mode's fused prefill attention under the BF16 recipes
 * (backends/cuda/cuda_flash.cu): the same packing as qd_cuda_attend_gemm,
 * causal within each sequence, q, k, v, P, dout and dS rounded to BF16 for the
 * tensor cores (float32 sums), the hardware exp2. The forward writes out and,
 * per (row n, head h), the base-2 log-sum-exp of its scaled scores at att[n H
 * + h], the rest of att its scratch (BF16 copies of q, k, v); the backward
 * reads those and the forward's out (dout . out per row into ds's first N H
 * floats, ds's rest its scratch) and adds to dq, dk, dv (set: writes them, every
 * row once, not read). qd_cuda_flash_fits:
 * whether it takes these shapes (D 64 or 128, H a multiple of KV, att and ds
 * of N H Tm floats large enough for its scratch) and QUADS_FLASH is not 0; the
 * caller makes the same choice for both directions. */
int qd_cuda_flash_fits(int N, int D, int H, int KV, int Tm);
/* The kernels the fused attention takes: 1 the wgmma ones (compute capability
 * 9.0 only), 0 the mma.sync ones, -1 (the default) QUADS_FLASH_WG (0: mma.sync;
 * else wgmma where the device has it).
 * Set by benchmarks to time both in one process. */
extern int qd_cuda_flash_wg;
/* A small table for the device through the pinned ring of the batched
 * products' pointer arrays: *host (bytes, 16-byte aligned) to fill, then the
 * upload (stream 0) gives its device copy, valid for the work enqueued before
 * the ring's slot comes round again. */
qd_status qd_cuda_blas_table(size_t bytes, void **host);
qd_status qd_cuda_blas_table_upload(size_t bytes, void **dev);
qd_status qd_cuda_flash_attend(float *out, float *att, const float *q, const float *k, const float *v,
                               const int32_t *seq_off, int nseq, int N, int H, int KV, int D, int Tm);
qd_status qd_cuda_flash_attend_backward(float *dq, float *dk, float *dv, float *ds, const float *dout,
                                        const float *out, const float *att, const float *q, const float *k,
                                        const float *v, const int32_t *seq_off, int nseq, int N, int H, int KV,
                                        int D, int Tm, int set);

/* att[n][h][s] = 0 for pos[n] < s < Tm (the fast prefill's fallback kernel
 * writes s <= pos[n] only; qd_cuda_attend_gemm_backward reads whole rows) */
qd_status qd_cuda_attend_zero_tail(float *att, const int32_t *pos, int N, int H, int Tm);

/* Frees the current device's handles, workspace and plans (the next call makes them again). */
void qd_cuda_blas_release(void);

#ifdef __cplusplus
}
#endif

#endif
