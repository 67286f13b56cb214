#!/usr/bin/env python3
"""Checks that Hugging Face transformers loads a checkpoint folder written by
quads (config.json + model.safetensors) and computes the same logits as
`quads forward --precision fp32`.

    quads forward --model DIR --ids 1,2,3 --precision fp32 --dump-logits L.bin
    python3 tests/ref/check_hf_load.py DIR 1,2,3 L.bin [--tol 1e-4]

L.bin is raw little-endian float32 [T, V]. Prints the class transformers chose,
the parameter count and the max relative logit error (max|a-b| / max|b|);
exits 1 when that exceeds --tol or loading fails. Runs on the GPU machine
(transformers, torch) in float32 on the CPU device, eager attention.
"""
import argparse
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("ids")
    ap.add_argument("logits")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    ids = [int(x) for x in a.ids.split(",")]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].float().numpy()
    ours = np.fromfile(a.logits, dtype="<f4").reshape(len(ids), -1)
    if ours.shape != ref.shape:
        print(f"{a.model}: shape {ours.shape} vs transformers {ref.shape}")
        return 1
    err = float(np.abs(ours - ref).max() / np.abs(ref).max())
    n = sum(p.numel() for p in model.parameters())
    ok = err <= a.tol
    print(f"{a.model}: {type(model).__name__}, {n} parameters, T={len(ids)}, "
          f"max relative logit error {err:.3e} ({'ok' if ok else 'FAIL'}, tol {a.tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
