#!/usr/bin/env python3
"""Golden NVFP4 vectors from an independent implementation.

Follows docs/numerics.md §2 step by step with numpy float32 arithmetic and the
ml_dtypes casts (float8_e4m3fn, float4_e2m1fn: round to nearest even), without
any code from quant/. tests/test_quant.c reads the output and compares codes,
block scales and global decode scales bit for bit with qd_nvfp4_quantize.

Deterministic (fixed seed): re-running it anywhere must reproduce the committed
fixture; the last line printed is the sha256 of the file.

    python3 tests/ref/nvfp4_golden.py [OUT]   (default tests/fixtures/nvfp4_golden.bin)

File format, little-endian:
    b"QDG1", u32 ncases, then per case:
    u32 rows, u32 cols, u32 per_row, u32 name_len, name bytes,
    f32 x[rows*cols], u8 codes[rows*cols/2], u8 scales[rows*cols/16],
    f32 s_dec[rows if per_row else 1]
"""
import hashlib
import os
import struct
import sys

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
BLOCK = 16
ROWS, COLS = 8, 512


def global_scales(amax):
    """Steps 2-3: S_enc = min(2688/amax, FLT_MAX), 1 if amax or S_enc is 0; S_dec = 1/S_enc in double."""
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = F32(2688.0) / F32(amax)
    s_enc = min(F32(s_enc), FLT_MAX)
    if F32(amax) == 0 or s_enc == 0:
        s_enc = F32(1.0)
    s_dec = F32(1.0 / np.float64(s_enc))
    return F32(s_enc), s_dec


def quantize_scope(x, s_enc, s_dec):
    """Steps 4-6 over the rows of one scope; returns (codes (n,), scales (n/16,))."""
    blocks = x.reshape(-1, BLOCK)
    amax_b = np.max(np.abs(blocks), axis=1).astype(F32)
    enc6 = F32(s_enc * (F32(1.0) / F32(6.0)))            # 1/6 folded into S_enc first
    with np.errstate(over="ignore"):
        target = (amax_b * enc6).astype(F32)
    target = np.minimum(target, F32(448.0))
    scales = target.astype(ml_dtypes.float8_e4m3fn)
    with np.errstate(divide="ignore", over="ignore"):
        inv = (F32(1.0) / (scales.astype(F32) * s_dec)).astype(F32)
    inv = np.minimum(inv, FLT_MAX)                         # all-zero block: 1/0 -> FLT_MAX
    with np.errstate(over="ignore"):
        v = (blocks * inv[:, None]).astype(F32)
    # the spec saturates |v| > 6 to 6; clamping first keeps the sign (and -0.0) intact
    v = np.clip(v, F32(-6.0), F32(6.0))
    codes = v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(-1) & 0xF
    # the spec's sign rule: the code's sign is the float's sign bit (-0.0 and -0.1 give 0x8);
    # ml_dtypes does the same, checked here rather than assumed
    sign = (v.reshape(-1).view(np.uint32) >> 31).astype(np.uint8)
    assert np.array_equal(codes >> 3, sign)
    return codes.astype(np.uint8), scales.view(np.uint8).reshape(-1)


def quantize(x, per_row):
    rows = x.shape[0]
    scopes = [x[r:r + 1] for r in range(rows)] if per_row else [x]
    codes, scales, s_decs = [], [], []
    for sc in scopes:
        s_enc, s_dec = global_scales(np.max(np.abs(sc)))
        c, s = quantize_scope(sc, s_enc, s_dec)
        codes.append(c)
        scales.append(s)
        s_decs.append(s_dec)
    c = np.concatenate(codes)
    packed = (c[0::2] | (c[1::2] << 4)).astype(np.uint8)  # element 2i in the low nibble
    return packed, np.concatenate(scales), np.array(s_decs, dtype=F32)


def tie_matrix(rng):
    """Every element lands exactly on an E2M1 tie (0.25, 0.75, ..., 5) after scaling:
    S_enc = 2^j (row/tensor amax 2688*2^-j), block scales 2^e exact powers of two."""
    j = 10
    x = np.zeros((ROWS, COLS), dtype=F32)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=F32)
    for r in range(ROWS):
        for b in range(COLS // BLOCK):
            e = int(rng.integers(-6, 7))                   # block scale 2^e in E4M3 normal range
            unit = F32(2.0 ** (e - j))
            blk = rng.choice(ties, BLOCK) * rng.choice(np.array([-1, 1], dtype=F32), BLOCK)
            blk[int(rng.integers(0, BLOCK))] = 6.0          # the block max: s_b = 2^e exactly
            x[r, b * BLOCK:(b + 1) * BLOCK] = blk * unit
        x[r, 0] = F32(2688.0 * 2.0 ** -j)                  # scope amax: S_enc = 2^j exactly
        x[r, 1:BLOCK] = 0.0                                # keep that block's max unique
    return x


def zero_blocks(rng):
    x = rng.standard_normal((ROWS, COLS)).astype(F32)
    blocks = x.reshape(ROWS, -1, BLOCK)
    for r in range(ROWS):
        for b in rng.choice(blocks.shape[1], 8, replace=False):
            blocks[r, b] = 0.0
        blocks[r, int(rng.integers(blocks.shape[1]))] = -0.0   # negative zeros: codes 0x8
    x[5] = 0.0                                             # an all-zero row: amax 0, S_enc 1
    x[6] = -0.0
    return blocks.reshape(ROWS, COLS)


def wide_range(rng):
    """Per-block magnitudes 2^-24..2^6: block scales from E4M3 subnormals to saturation."""
    x = rng.standard_normal((ROWS, COLS)).astype(F32)
    mult = (2.0 ** rng.integers(-24, 7, (ROWS, COLS // BLOCK, 1))).astype(F32)
    return (x.reshape(ROWS, -1, BLOCK) * mult).reshape(ROWS, COLS).astype(F32)


def cases(rng):
    normal = lambda: rng.standard_normal((ROWS, COLS)).astype(F32)
    yield "normal", normal()
    yield "student_t2", rng.standard_t(2, (ROWS, COLS)).astype(F32)
    yield "cauchy_clipped", np.clip(rng.standard_cauchy((ROWS, COLS)), -1e6, 1e6).astype(F32)
    yield "tiny_1e-30", (normal() * F32(1e-30)).astype(F32)
    yield "subnormal_1e-40", (normal() * np.float64(1e-40)).astype(F32)   # S_dec subnormal
    yield "huge_1e30", (normal() * F32(1e30)).astype(F32)
    yield "near_flt_max", (np.clip(normal(), -3.0, 3.0) * F32(1e38)).astype(F32)
    yield "zero_blocks", zero_blocks(rng)
    yield "ties", tie_matrix(rng)
    yield "wide_range", wide_range(rng)
    yield "uniform_grid", (rng.integers(-48, 49, (ROWS, COLS)) * F32(0.125)).astype(F32)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "nvfp4_golden.bin")
    rng = np.random.default_rng(20260)
    recs = []
    for name, x in cases(rng):
        assert x.dtype == F32 and np.all(np.isfinite(x)), name
        for per_row in (0, 1):
            packed, scales, s_dec = quantize(x, per_row)
            nm = f"{name}/{'row' if per_row else 'tensor'}".encode()
            recs.append(struct.pack("<4I", ROWS, COLS, per_row, len(nm)) + nm +
                        x.astype("<f4").tobytes() + packed.tobytes() + scales.tobytes() +
                        s_dec.astype("<f4").tobytes())
    blob = b"QDG1" + struct.pack("<I", len(recs)) + b"".join(recs)
    with open(out + ".tmp", "wb") as f:
        f.write(blob)
    os.replace(out + ".tmp", out)
    print(f"numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}: "
          f"{len(recs)} cases, {len(blob)} bytes -> {out}")
    print("sha256", hashlib.sha256(blob).hexdigest())


if __name__ == "__main__":
    main()
