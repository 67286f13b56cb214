/* The swizzled ("128x4 tiled") block-scale layout that cuBLASLt's block-scaled
 * GEMM reads with CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 (and cuDNN/CUTLASS
 * with their F8_128x4 layouts).
 *
 * Layout, from the cuBLAS documentation "1D Block Scaling Factors Layout"
 * (https://docs.nvidia.com/cuda/cublas/index.html#d-block-scaling-factors-layout)
 * as restated by nvmath-python's get_block_scale_offset
 * (https://docs.nvidia.com/cuda/nvmath-python/latest/host-apis/linalg/generated/
 * nvmath.linalg.advanced.helpers.matmul.get_block_scale_offset.html) and the cuDNN
 * frontend note "MXFP8 scale factor 128x4 layout": the (rows, scale_cols) matrix is
 * padded to (128·R, 4·C) and cut into 128x4 tiles of 512 bytes, stored tile-row
 * major (all C tiles of rows 0..127 first). Inside a tile, the scale of (r, c) sits
 * at (r % 32)·16 + ((r % 128) / 32)·4 + (c % 4). The nvmath page's worked example
 * (M = K = 128, so 8 scale columns) gives offset 82 for (5, 2) and 593 for (5, 5);
 * tests/test_quant.c checks both. */
#include <string.h>
#include "quant/quant.h"

#define TILE_ROWS 128
#define TILE_COLS 4
#define TILE_BYTES (TILE_ROWS * TILE_COLS)

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* Byte offset of scale (r, c) in the swizzled buffer. */
static size_t swizzled_offset(int64_t r, int64_t c, int64_t scale_cols)
{
    int64_t tiles_per_row = round_up(scale_cols, TILE_COLS) / TILE_COLS;
    int64_t tile = (r / TILE_ROWS) * tiles_per_row + c / TILE_COLS;
    int64_t inner = (r % 32) * 16 + ((r % TILE_ROWS) / 32) * 4 + c % TILE_COLS;
    return (size_t)(tile * TILE_BYTES + inner);
}

size_t qd_scales_swizzled_size(int64_t rows, int64_t scale_cols)
{
    return (size_t)(round_up(rows, TILE_ROWS) * round_up(scale_cols, TILE_COLS));
}

void qd_scales_swizzle(uint8_t *dst, const uint8_t *src, int64_t rows, int64_t scale_cols)
{
    memset(dst, 0, qd_scales_swizzled_size(rows, scale_cols));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < scale_cols; c++)
            dst[swizzled_offset(r, c, scale_cols)] = src[r * scale_cols + c];
}

void qd_scales_unswizzle(uint8_t *dst, const uint8_t *src, int64_t rows, int64_t scale_cols)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < scale_cols; c++)
            dst[r * scale_cols + c] = src[swizzled_offset(r, c, scale_cols)];
}
