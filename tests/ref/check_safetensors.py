#!/usr/bin/env python3
"""Loads safetensors files written by QUADS-C with the Python `safetensors`
package (which validates the header and offsets as the reference does) and
prints each tensor's name, dtype and shape; with --nvfp4, also checks the
ModelOpt NVFP4 layout of every `*.weight_scale_2` group and prints the
relative error of its dequantization against --against FILE.

  pip install safetensors numpy ml_dtypes
  python3 tests/ref/check_safetensors.py OUT/model.safetensors [--against IN.safetensors]
"""
import argparse
import sys

import ml_dtypes
import numpy as np
from safetensors import deserialize, safe_open

F32 = np.float32


def raw(path):
    """All tensors as (dtype string, shape, bytes), parsed and validated by
    safetensors' own Rust code."""
    with open(path, "rb") as fh:
        data = fh.read()
    with safe_open(path, framework="np") as f:
        meta = f.metadata()
    return meta, {k: (v["dtype"], v["shape"], bytes(v["data"])) for k, v in deserialize(data)}


NP = {"F32": F32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "U8": np.uint8,
      "F8_E4M3": ml_dtypes.float8_e4m3fn, "I64": np.int64, "I32": np.int32}


def arr(t):
    dt, shape, b = t
    return np.frombuffer(b, dtype=NP[dt]).reshape(shape)


def deq_nvfp4(codes, scales, s2):
    lo, hi = codes & 0xF, codes >> 4
    q = np.stack([lo, hi], axis=-1).reshape(codes.shape[0], -1)
    v = q.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)
    s = np.repeat(scales.astype(F32), 16, axis=1)
    return (v * s) * F32(s2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--against")
    a = ap.parse_args()
    meta, t = raw(a.file)
    print(f"# metadata {meta}; {len(t)} tensors")
    for k in sorted(t):
        print(k, t[k][0], t[k][1])
    if not a.against:
        return 0
    _, ref = raw(a.against)
    worst = 0.0
    for k in sorted(t):
        if not k.endswith(".weight_scale_2"):
            continue
        base = k[: -len("_scale_2")]
        w = arr(ref[base]).astype(F32)
        codes, scales = arr(t[base]), arr(t[base + "_scale"])
        assert t[base][0] == "U8" and t[base + "_scale"][0] == "F8_E4M3" and t[k][0] == "F32"
        assert list(codes.shape) == [w.shape[0], w.shape[1] // 2], base
        assert list(scales.shape) == [w.shape[0], w.shape[1] // 16], base
        assert t[k][1] == [], base
        d = deq_nvfp4(codes, scales, arr(t[k]))
        rel = float(np.linalg.norm((w - d).astype(np.float64)) / np.linalg.norm(w.astype(np.float64)))
        worst = max(worst, rel)
        print(f"{base}: rel_error {rel:.6f}")
    print(f"# worst rel_error {worst:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
