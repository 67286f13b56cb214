/* backends/cuda: the CUDA twins of quant/'s NVFP4 and FP8 quantizers, fake-quant,
 * RAC augmentation and the canonical W4A4 product (docs/numerics.md §1-§5).
 * Every scalar comes from quant/numerics.h, so the bits equal the CPU's by
 * construction; tests/gpu/check_quant.cu verifies it on the device.
 *
 * All pointers are device pointers, including the buffers of a qd_nvfp4 made by
 * qd_cuda_nvfp4_alloc (its layout is quant/quant.h's: codes (rows, cols/2),
 * scales (rows, cols/16), s_dec (rows) or (1)). Work runs on the legacy default
 * stream. The plain functions return after the device finished and report a
 * non-finite input as QD_ERR_NONFINITE; the _async ones only enqueue, and a later
 * qd_cuda_nonfinite_check() reports whether any of them saw a non-finite input. */
#ifndef QD_CUDA_QUANT_H
#define QD_CUDA_QUANT_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* quant/'s headers are C: give them C linkage when a CUDA (C++) file includes them
 * (the system headers above first, so they are not re-read inside the block). */
#ifdef __cplusplus
extern "C" {
#endif
#include "quant/quant.h"

/* Device buffers for an NVFP4 matrix; free with qd_cuda_nvfp4_free. */
qd_status qd_cuda_nvfp4_alloc(qd_nvfp4 *q, int64_t rows, int64_t cols, qd_scale_kind scale);
void qd_cuda_nvfp4_free(qd_nvfp4 *q);

/* Synchronizes, then returns QD_ERR_NONFINITE if an _async call since the last
 * check saw a NaN/Inf (and clears the flag), QD_ERR_DEVICE on a CUDA error. */
qd_status qd_cuda_nonfinite_check(void);

/* *amax (host) = max |x| over n floats; QD_ERR_NONFINITE on NaN/Inf. */
qd_status qd_cuda_amax(float *amax, const float *x, int64_t n);

/* quantize x (rows, cols) into q (same shape; q->per_row picks the scope, §4).
 * The _bf16 variant reads BF16 bit patterns (exactly their float values). */
qd_status qd_cuda_nvfp4_quantize(qd_nvfp4 *q, const float *x);
qd_status qd_cuda_nvfp4_quantize_bf16(qd_nvfp4 *q, const uint16_t *x);
qd_status qd_cuda_nvfp4_quantize_async(qd_nvfp4 *q, const float *x);
qd_status qd_cuda_nvfp4_quantize_bf16_async(qd_nvfp4 *q, const uint16_t *x);
/* quantize with given global encode scales s_enc (rows) or (1) (RAC residuals, §5);
 * s_enc must be finite and > 0 (not checked on the device). On a non-finite input
 * the quantizers return QD_ERR_NONFINITE and q's contents are unspecified. */
qd_status qd_cuda_nvfp4_quantize_with(qd_nvfp4 *q, const float *x, const float *s_enc);
/* out (rows, cols) = dequant(q). */
qd_status qd_cuda_nvfp4_dequantize(float *out, const qd_nvfp4 *q);
qd_status qd_cuda_nvfp4_dequantize_async(float *out, const qd_nvfp4 *q);
/* out = dequant(quantize(x)) in one pass; the gradient is the identity (§5). */
qd_status qd_cuda_nvfp4_fake_quant(float *out, const float *x, int64_t rows, int64_t cols, qd_scale_kind scale);
/* The per-tensor fake-quant (as qd_cuda_nvfp4_fake_quant_async with
 * QD_SCALE_PER_TENSOR, the same bits) that also writes its global decode scale
 * to s_dec (device, one float): out = (e2m1 * e4m3) * s_dec element by element. */
qd_status qd_cuda_nvfp4_fake_quant_sdec_async(float *out, float *s_dec, const float *x, int64_t rows, int64_t cols);
qd_status qd_cuda_nvfp4_fake_quant_async(float *out, const float *x, int64_t rows, int64_t cols,
                                         qd_scale_kind scale);

/* FP8 E4M3, one scale per row: q (rows, cols), scale_inv (rows). */
qd_status qd_cuda_fp8_quantize_rows(uint8_t *q, float *scale_inv, const float *x,
                                    int64_t rows, int64_t cols);
/* The same, enqueued: a non-finite input is reported by qd_cuda_nonfinite_check. */
qd_status qd_cuda_fp8_quantize_rows_async(uint8_t *q, float *scale_inv, const float *x, int64_t rows, int64_t cols);

/* The canonical W4A4 product (§3): y (M, N) = A (M, K) . W (N, K)^T, the
 * per-output block order ascending, so the bits equal qd_w4a4_gemm's. */
qd_status qd_cuda_w4a4_gemm(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w);
qd_status qd_cuda_w4a4_gemm_async(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w);
/* The same product with each block sum p from an integer tensor-core MMA (exact),
 * the same bits: the MMA kernel w4a4_mma_kernel (or, for few rows, its decode and
 * split-K variants) serves these and every grouped product, weights staged
 * through shared memory by coalesced copies, any K % 16 == 0 (else
 * qd_cuda_w4a4_gemm's shape error). */
qd_status qd_cuda_w4a4_gemm_tc(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w);
qd_status qd_cuda_w4a4_gemm_tc_async(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w);
/* The MMA kernels two blocks an MMA (m16n8k32) where K is a multiple of 256:
 * qd_cuda_w4a4_pair = 0 never, 1 there, -1 (default) as QUADS_W4A4_PAIR
 * says (unset: there). The same bits either way (benchmarks and tests). */
extern int qd_cuda_w4a4_pair;
/* The FP16 kernel for many activation rows (w4a4_h16_kernel, one MMA a block
 * and one FFMA a term): qd_cuda_w4a4_h16 = 0 never, 1 always, -1 (default) as
 * QUADS_W4A4_H16 says (unset: a group of 64 rows or more and CTAs for twice
 * the GPU: the prefill). The same bits either way (benchmarks and tests). */
extern int qd_cuda_w4a4_h16;
/* The FP16 kernel's products on the warpgroup MMA (w4a4_hwg_kernel: one wgmma
 * a block for 64 weight rows and 64 or 128 activation rows) wherever the FP16
 * kernel is chosen, on compute capability 9.0 with K a multiple of 128:
 * qd_cuda_w4a4_hwg = 0 never, 1 there, -1 (default) as QUADS_W4A4_HWG says
 * (unset: there, since 2026-12-07). The same bits (benchmarks and tests). */
extern int qd_cuda_w4a4_hwg;
/* The FP16 kernel with the activations made FP16 once (w4a4_hpre_kernel: one
 * weight matrix, or q, k and v in one launch, at 9 to 256 activation rows; by
 * default q, k, v at 9 to 256 rows and one product at 129 to 256):
 * qd_cuda_w4a4_hpre = 0 never, 1 always, -1 (default) as QUADS_W4A4_HPRE
 * says. The same bits either way (benchmarks and tests). */
extern int qd_cuda_w4a4_hpre;
/* The decode kernel (w4a4_dec_kernel: no tensor cores, each thread's weight
 * blocks loaded at once): qd_cuda_w4a4_dec = 0 never, 1 always (in tiles of 8
 * activation rows), -1 (default) as QUADS_W4A4_DEC says (unset: where no
 * group has more than 8 rows and its CTAs are few). The same bits either way
 * (benchmarks and tests). */
extern int qd_cuda_w4a4_dec;
/* The streaming decode kernel (w4a4_stream_kernel: groups of at most 32 rows,
 * or one weight's of at most 64, each warp's weight rows through a ring of
 * its own): qd_cuda_w4a4_stream = 1
 * where it applies, 0 never, -1 (default) as QUADS_W4A4_STREAM says (unset:
 * grouped products of groups of at most 16 rows past the decode kernel's
 * few: w4a4_stream_default). The same bits either way. */
extern int qd_cuda_w4a4_stream;
/* qd_cuda_quant_legacy = 1 (benchmarks only) selects the quantizer kernels before
 * issue 13's (the software encoder one block a thread, a memset and an atomic a
 * warp for the amax) and the RAC pick's O(K^2) rank scan, for the side-by-side
 * tables; the same bits either way. */
extern int qd_cuda_quant_legacy;

/* Grouped (MoE experts): for g < ngroups, rows row_off[g] .. row_off[g+1]-1 of
 * A and y times W = *w[g] (all of one shape), one launch; the same bits as one
 * qd_cuda_w4a4_gemm per group (the same kernel body). row_off is host memory. */
qd_status qd_cuda_w4a4_gemm_grouped_async(float *y, const qd_nvfp4 *a, const qd_nvfp4 *const *w,
                                          const int64_t *row_off, int ngroups);
/* The same with the row offsets on the device (d_off, E + 1, a->rows = R =
 * d_off[E]), no group with more than maxrows rows: the groups with rows
 * compacted on the device, one decode-kernel launch over min(E, R) of them
 * (maxrows <= 8), else one MMA-kernel launch over their row tiles. w0 one
 * expert's weights (every expert of its shape and aligned as w0: the caller
 * checks), tab (dev) the E codes, E scales and E s_dec pointers, ws dev
 * scratch of qd_cuda_w4a4_grouped_dev_ws(R, E) bytes. QD_ERR_SHAPE (nothing
 * queued but, at most, the compaction) where the kernels do not take it:
 * more than 128 experts, K or shared memory past their limits, R past
 * 65,535 tiles of 8. al16: every expert's codes and scales lie on 16 bytes
 * (QUADS_W4A4_STREAM=1's kernel may take them then). */
size_t qd_cuda_w4a4_grouped_dev_ws(int64_t R, int E);
qd_status qd_cuda_w4a4_gemm_grouped_dev_async(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w0, const void *const *tab,
                                              const int32_t *d_off, int E, int64_t R, int64_t maxrows, void *ws,
                                              int al16);

/* RAC (§5). channels (n, device int64, n a multiple of 16, n <= K) index columns
 * of K; they must lie in [0, K) (not checked on the device). out (rows, K+n):
 * [quantize(x), quantize_with(S_enc(x), (x - x_hat)[S])], S_enc per row when
 * out->per_row (§4), else the tensor's. */
qd_status qd_cuda_rac_augment_act(qd_nvfp4 *out, const float *x, int64_t rows, int64_t K,
                                  const int64_t *channels, int64_t n);
/* The same, only enqueued, with caller scratch ws (256-byte aligned) of
 * round_up(rows, 64) + rows * n floats (no allocation; non-finite inputs reach
 * qd_cuda_nonfinite_check). */
qd_status qd_cuda_rac_augment_act_async(qd_nvfp4 *out, const float *x, int64_t rows, int64_t K,
                                        const int64_t *channels, int64_t n, float *ws);
/* The experts of a layer in one go: rows off[g] .. off[g+1]-1 (device, E + 1)
 * use channel set channels[g] (a device array of E device pointers, n each);
 * out per row; the bits of one qd_cuda_rac_augment_act_async per expert; ws as
 * there. */
qd_status qd_cuda_rac_augment_act_grouped_async(qd_nvfp4 *out, const float *x, int64_t rows, int64_t K,
                                                const int64_t *const *channels, const int32_t *off, int E,
                                                int64_t n, float *ws);
/* count (<= QD_CUDA_RAC_MULTI) linears of one input x (rows, K), grouped as
 * there (off, device, E + 1; ch[i] a device array of E device pointers, n[i]
 * channels each; out[i] per row): the bits of the grouped op per linear, in
 * one launch (QUADS_RAC_FUSED=0: the grouped op per linear). ws (256-byte
 * aligned) of qd_cuda_rac_multi_ws(rows, n, count) bytes. */
#define QD_CUDA_RAC_MULTI 4
/* y[i] = a[i] . w[i]^T (the canonical W4A4 product, exact mode) for count
 * (<= 4) products: one decode-kernel launch where every a[i] has the same
 * rows (<= 8) and cols, else one product after the other; the bits of
 * qd_cuda_w4a4_gemm_tc_async per product. */
qd_status qd_cuda_w4a4_gemm_multi_async(float *const *y, const qd_nvfp4 *const *a, const qd_nvfp4 *const *w,
                                        int count);
size_t qd_cuda_rac_multi_ws(int64_t rows, const int64_t *n, int count);
qd_status qd_cuda_rac_multi_async(qd_nvfp4 *const *out, const float *x, int64_t rows, int64_t K,
                                  const int64_t *const *const *ch, const int64_t *n, int count, const int32_t *off,
                                  int E, float *ws);
/* out (N, K+n): [W, W[:, S]] quantized with W's global scale (per tensor, or per
 * row when out->per_row). */
qd_status qd_cuda_rac_augment_weight(qd_nvfp4 *out, const float *w, int64_t N, int64_t K,
                                     const int64_t *channels, int64_t n);
/* Weights of one shape, enqueued: for i < count, q[i] (N, K+n, one scale per
 * tensor) = [x[i], x[i][:, channels[i]]] quantized with x[i]'s global scale
 * (n = 0: quantize(x[i])), the bits of qd_cuda_rac_augment_weight and
 * qd_cuda_nvfp4_quantize per tensor in two launches per 64 tensors; a
 * non-finite weight is reported by qd_cuda_nonfinite_check. */
/* Per-tensor fake-quants of count tensors of one shape (N, K), enqueued in a
 * few launches: out[i] = the bits of qd_cuda_nvfp4_fake_quant (per tensor) of
 * x[i], *s_dec[i] its S_dec where s_dec and s_dec[i] are not NULL, and
 * bits[i] (N x K BF16) the bits of out[i] / S_dec (0 where S_dec is 0) where
 * bits and bits[i] are not NULL. */
qd_status qd_cuda_nvfp4_fake_quant_weights_async(float *const *out, float *const *s_dec, uint16_t *const *bits,
                                                 const float *const *x, int count, int64_t N, int64_t K);
qd_status qd_cuda_nvfp4_quantize_weights_async(qd_nvfp4 *const *q, const float *const *x,
                                               const int64_t *const *channels, int count, int64_t N, int64_t K,
                                               int64_t n);
/* RAC channel sets, enqueued: for i < count, qd_rac_select(ch + off[i], err +
 * off[i], K[i], ratio)'s channels (dev) written, the rest of the K[i] entries
 * left; a non-finite error is reported by qd_cuda_nonfinite_check. */
qd_status qd_cuda_rac_select_async(int64_t *ch, const double *err, const size_t *off, const int *K, int count,
                                   double ratio);

#ifdef __cplusplus
}
#endif

#endif
