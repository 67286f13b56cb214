/* quant/: the NVFP4 and FP8 quantizers, the canonical W4A4 product, RAC
 * augmentation, fake-quant and error statistics (docs/numerics.md). The CPU
 * implementation here is the reference; backends/cuda has a twin of each.
 * Scalar codecs live in quant/numerics.h (shared with the CUDA kernels).
 *
 * Layouts: a matrix is row-major (rows, cols) with cols = K along the
 * reduction. NVFP4 codes are packed two a byte (element 2i in the low nibble),
 * (rows, cols/2); block scales are E4M3 codes (rows, cols/16) in ModelOpt's
 * row-major layout; the swizzled 128x4-tile layout is a separate conversion. */
#ifndef QD_QUANT_H
#define QD_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include "quant/numerics.h"
#include "quant/status.h"

/* The scope of an NVFP4 global scale (§2, §4): one for the whole tensor
 * (weights) or one per row (activations: one token). The values are the 0 / 1
 * of the per_row word in the golden files (tests/ref/nvfp4_golden.py). */
typedef enum { QD_SCALE_PER_TENSOR = 0, QD_SCALE_PER_ROW = 1 } qd_scale_kind;

/* An NVFP4 matrix. The struct owns its buffers when made by qd_nvfp4_alloc. */
typedef struct {
    int64_t rows, cols;     /* cols = K, a multiple of 16 */
    uint8_t *codes;         /* (rows, cols/2) packed E2M1 */
    uint8_t *scales;        /* (rows, cols/16) E4M3 block scales */
    float *s_dec;           /* (rows) when per_row, else (1): global decode scale */
    qd_scale_kind per_row;  /* QD_SCALE_PER_ROW (activations, §4) or QD_SCALE_PER_TENSOR */
} qd_nvfp4;

/* QD_ERR_ARG when scale is neither kind. */
qd_status qd_nvfp4_alloc(qd_nvfp4 *q, int64_t rows, int64_t cols, qd_scale_kind scale);
void qd_nvfp4_free(qd_nvfp4 *q);

/* Absolute maximum of n floats; QD_ERR_NONFINITE (and *amax untouched) if any is NaN/Inf. */
qd_status qd_amax(float *amax, const float *x, int64_t n);
/* Index of the first NaN/Inf of x (n), or -1 when all are finite. A
 * vectorized OR of the exponent bits, in parallel (OpenMP) over pieces of
 * large inputs unless called from a parallel region: the check of whole
 * weight buffers (a serial isfinite loop took seconds on 3B parameters). */
int64_t qd_first_nonfinite(const float *x, int64_t n);

/* Quantizes x (rows, cols) into q (allocated with the same shape and per_row).
 * The whole input is checked first: on a non-finite value q is left untouched. */
qd_status qd_nvfp4_quantize(qd_nvfp4 *q, const float *x);
/* Quantizes rows of x with given global encode scales (one per row, or one if
 * !q->per_row) instead of their own amax: RAC's residual blocks (§5). Each s_enc
 * must be finite and > 0 (QD_ERR_ARG); q->s_dec gets S_dec(s_enc). */
qd_status qd_nvfp4_quantize_with(qd_nvfp4 *q, const float *x, const float *s_enc);
/* Row helpers (ggml-style reference names): one row of k elements (k a multiple
 * of 16) with the scope's encode scale -> codes (k/2) and scales (k/16); and back,
 * out (k) = (e2m1 * s_b) * s_dec. No finiteness check: callers validate first. */
void qd_quantize_row_nvfp4_ref(uint8_t *codes, uint8_t *scales, const float *x, int64_t k,
                               float s_enc);
void qd_dequantize_row_nvfp4(float *out, const uint8_t *codes, const uint8_t *scales, int64_t k,
                             float s_dec);
/* x_hat = dequant(q), (rows, cols). */
void qd_nvfp4_dequantize(float *out, const qd_nvfp4 *q);
/* out = dequant(quantize(x)); the straight-through gradient is the identity (§5). */
qd_status qd_nvfp4_fake_quant(float *out, const float *x, int64_t rows, int64_t cols, qd_scale_kind scale);

/* Swizzled block-scale layout of cuBLASLt VEC16_UE4M3: rows padded to 128,
 * scale columns padded to 4, 512-byte tiles; padding bytes are 0. */
size_t qd_scales_swizzled_size(int64_t rows, int64_t scale_cols);
void qd_scales_swizzle(uint8_t *dst, const uint8_t *src, int64_t rows, int64_t scale_cols);
void qd_scales_unswizzle(uint8_t *dst, const uint8_t *src, int64_t rows, int64_t scale_cols);

/* FP8 E4M3 with one scale per row (weights per output channel, activations per
 * token): scale = 448/amax, q = e4m3(x*scale), x ~ q * scale_inv. */
/* One row (k) of codes; returns its scale_inv. No finiteness check. */
float qd_quantize_row_fp8_ref(uint8_t *q, const float *x, int64_t k);
qd_status qd_fp8_quantize_rows(uint8_t *q, float *scale_inv, const float *x, int64_t rows, int64_t cols);
void qd_fp8_dequantize_rows(float *out, const uint8_t *q, const float *scale_inv, int64_t rows, int64_t cols);

/* The canonical W4A4 product (§3): y (M, N) = A (M, K) . W (N, K)^T.
 * OpenMP over outputs; the per-output block order is fixed, so the bits do not
 * depend on the thread count. A and W must have the same cols (QD_ERR_SHAPE).
 * Each side's S_dec is per row or per tensor as its per_row says (normally A per
 * row, W per tensor). */
qd_status qd_w4a4_gemm(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w);
/* FP8 product: y = (sum over k ascending of qa*qw) * (sa_inv[m] * sw_inv[n]). */
void qd_fp8_gemm(float *y, const uint8_t *qa, const float *sa_inv, const uint8_t *qw,
                 const float *sw_inv, int64_t M, int64_t N, int64_t K);

/* RAC (§5). err (K) += sum over rows of (x - x_hat)^2 per channel, x_hat the
 * per-row NVFP4 dequantization; r = x - x_hat in float32, squared and summed in
 * double, rows in ascending order. */
qd_status qd_rac_error_accumulate(double *err, const float *x, int64_t rows, int64_t K);
/* Picks floor(ratio*K/16)*16 channels of largest err (ties: lower index), written
 * ascending into channels (room for K); returns their count, or -1 (message set)
 * when ratio is outside [0, 1], K is not a multiple of 16 or an err is not finite.
 * floor() allows 1e-9 of slack so that ratio*K just below a multiple of 16 in
 * binary (0.29*1600) still counts as that multiple. */
int64_t qd_rac_select(int64_t *channels, const double *err, int64_t K, double ratio);
/* How many channels qd_rac_select picks: floor(ratio K / 16) 16 (with its slack). */
int64_t qd_rac_count(double ratio, int64_t K);
/* Augmented activations (rows, K+n): [quantize(x), quantize_with(S_enc(x), r[S])].
 * out is allocated by the caller with shape (rows, K+n); its per_row picks the
 * scope of S_enc (1: per token, the default of §4). n = |S| is a multiple of 16. */
qd_status qd_rac_augment_act(qd_nvfp4 *out, const float *x, int64_t rows, int64_t K,
                             const int64_t *channels, int64_t n);
/* Augmented weight (N, K+n): [W, W[:, S]] quantized with W's global scale
 * (out allocated by the caller, (N, K+n), per_row normally 0). The copies never
 * raise the amax, so the main columns get exactly quantize(W)'s bits. */
qd_status qd_rac_augment_weight(qd_nvfp4 *out, const float *w, int64_t N, int64_t K,
                                const int64_t *channels, int64_t n);
/* The activation a RAC product multiplies, folded back to K channels (the
 * replay trainer's straight-through input, docs/numerics.md §5): the
 * per-token augmented row of qd_rac_augment_act dequantized, out (rows, K) =
 * x_hat, plus on channel channels[j] its residual's dequantization (one float
 * add). n = 0 is qd_nvfp4_fake_quant per row, bit for bit. */
qd_status qd_rac_fake_quant(float *out, const float *x, int64_t rows, int64_t K, const int64_t *channels,
                            int64_t n);

#endif
