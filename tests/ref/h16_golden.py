#!/usr/bin/env python3
"""FP16 operands of the FP16 W4A4 kernels from an independent implementation.

docs/numerics.md §3 (w4a4_h16_kernel) feeds the FP16 tensor cores a weight code
w as the FP16 of w * 2^-14 and an activation code a of block scale s as the FP16
of a * s, and claims both exact. This script computes, with ml_dtypes' own
decoders (float4_e2m1fn, float8_e4m3fn) and numpy's float16 cast (round to
nearest even), without any code from this project:
  - for each of the 16 E2M1 codes, the FP16 bits of e2m1(code) * 2^-14;
  - for each E2M1 code and each of the 256 E4M3 codes, the FP16 bits of
    float16(e2m1 * e4m3) (the product taken in float64: exact), and whether
    that FP16 value equals the product (0xFFFF and flag 0 for a NaN scale).
tests/test_quant.c compares qd_e2m1x8_h16's bits with the first table and
checks the second: every finite product exact in FP16.

Deterministic: re-running it must reproduce the committed fixture; the last
line printed is the sha256 of the file.

    python3 tests/ref/h16_golden.py [OUT]   (default tests/fixtures/h16_golden.bin)

File format, little-endian: b"QDH1", u16 w[16], then for scale s = 0..255 and
code c = 0..15: u16 bits, u8 exact (1 where float16(e2m1 * e4m3) == the product).
"""
import hashlib
import os
import struct
import sys

import ml_dtypes
import numpy as np


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures",
                                                             "h16_golden.bin")
    e2m1 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)  # one code a byte
    e4m3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    buf = bytearray(b"QDH1")
    w = (e2m1 * 2.0 ** -14).astype(np.float16)
    assert np.all(w.astype(np.float64) == e2m1 * 2.0 ** -14), "w * 2^-14 not exact in FP16"
    buf += w.view(np.uint16).astype("<u2").tobytes()
    exact_all = 0
    for s in range(256):
        for c in range(16):
            if np.isnan(e4m3[s]):
                buf += struct.pack("<HB", 0xFFFF, 0)
                continue
            prod = e2m1[c] * e4m3[s]
            h = np.float16(prod)
            ok = int(float(h) == prod)
            exact_all += ok
            buf += struct.pack("<HB", int(np.array(h).view(np.uint16)), ok)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "wb") as f:
        f.write(bytes(buf))
    print(f"{out}: {len(buf)} bytes, {exact_all} of {16 * 254} finite products exact in FP16")
    print(hashlib.sha256(bytes(buf)).hexdigest())


if __name__ == "__main__":
    main()
