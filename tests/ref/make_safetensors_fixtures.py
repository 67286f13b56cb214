#!/usr/bin/env python3
"""Fixtures for tests/test_safetensors.c, written by the Python `safetensors`
package (not by our C writer), with values converted by numpy/ml_dtypes.

  pip install safetensors numpy ml_dtypes
  python3 tests/ref/make_safetensors_fixtures.py tests/fixtures/safetensors

Writes:
  python_ref.safetensors  F32/F16/BF16/F8_E4M3/int tensors; every *_as_f32
                          tensor is numpy's float32 conversion of its partner.
  tiny_moe.safetensors    a one-layer Qwen3-MoE-shaped state dict plus one
                          dense-MLP layer (mostly BF16, one F32, one F16).
  sharded/                the same state dict split in two shards with a
                          model.safetensors.index.json.
  tiny_moe_nvfp4_ref.safetensors
                          the NVFP4 tensors `quads quantize` must produce for
                          tiny_moe (ModelOpt layout), computed here with numpy
                          float32 arithmetic following docs/numerics.md §2 and
                          ml_dtypes' E4M3/E2M1 casts.
"""
import json
import os
import sys

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

F32 = np.float32


def patterns(stride, extra):
    """Every stride-th 16-bit pattern plus hand-picked edge cases."""
    p = list(range(0, 65536, stride)) + extra
    return np.array(p, dtype=np.uint16)


def python_ref(out):
    f16 = patterns(13, [0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0x7E00, 0x8000, 0x8001, 0xFC00])
    bf16 = patterns(13, [0x0001, 0x007F, 0x0080, 0x7F7F, 0x7F80, 0x7FC0, 0x8000, 0x8001, 0xFF80])
    e4m3 = np.arange(256, dtype=np.uint8)
    t = {
        "f32.matrix": (np.arange(15, dtype=F32).reshape(3, 5) * F32(0.25) - F32(1.5)),
        "f16.patterns": f16.view(np.float16),
        "f16.patterns_as_f32": f16.view(np.float16).astype(F32),
        "bf16.patterns": bf16.view(ml_dtypes.bfloat16),
        "bf16.patterns_as_f32": bf16.view(ml_dtypes.bfloat16).astype(F32),
        "f8.e4m3": e4m3.view(ml_dtypes.float8_e4m3fn),
        "f8.e4m3_as_f32": e4m3.view(ml_dtypes.float8_e4m3fn).astype(F32),
        "u8.bytes": np.array([0, 1, 127, 128, 255], dtype=np.uint8),
        "i8.values": np.array([-128, -1, 127], dtype=np.int8),
        "i32.values": np.array([-1, 0, 2**31 - 1, -(2**31)], dtype=np.int32),
        "i64.values": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        "scalar": np.array(3.25, dtype=F32),
        "empty": np.zeros((0, 4), dtype=F32),
    }
    meta = {"format": "pt", "source": "tests/ref/make_safetensors_fixtures.py"}
    save_file(t, os.path.join(out, "python_ref.safetensors"), metadata=meta)


def tiny_moe(rng):
    """Layer 0: attention + 4 experts + router; layer 1: dense SwiGLU MLP."""
    H, Q, KV, I, E, V = 32, 32, 16, 16, 4, 64
    bf = ml_dtypes.bfloat16

    def w(*shape, scale=0.05, dtype=bf):
        return (rng.standard_normal(shape).astype(F32) * F32(scale)).astype(dtype)

    t = {"model.embed_tokens.weight": w(V, H), "lm_head.weight": w(V, H),
         "model.norm.weight": np.ones(H, dtype=bf)}
    for L in range(2):
        p = f"model.layers.{L}."
        t[p + "input_layernorm.weight"] = np.ones(H, dtype=bf)
        t[p + "post_attention_layernorm.weight"] = np.ones(H, dtype=bf)
        t[p + "self_attn.q_proj.weight"] = w(Q, H)
        t[p + "self_attn.k_proj.weight"] = w(KV, H, dtype=np.float16 if L == 0 else bf)
        t[p + "self_attn.v_proj.weight"] = w(KV, H)
        t[p + "self_attn.o_proj.weight"] = w(H, Q, dtype=F32 if L == 0 else bf)
        t[p + "self_attn.q_norm.weight"] = np.ones(8, dtype=bf)
        t[p + "self_attn.k_norm.weight"] = np.ones(8, dtype=bf)
    t["model.layers.0.mlp.gate.weight"] = w(E, H)
    for e in range(E):
        p = f"model.layers.0.mlp.experts.{e}."
        t[p + "gate_proj.weight"] = w(I, H)
        t[p + "up_proj.weight"] = w(I, H)
        # heavy-tailed columns: where 4 bits hurt most
        t[p + "down_proj.weight"] = (rng.standard_t(2, (H, I)).astype(F32) * F32(0.02)).astype(bf)
    for n in ("gate_proj", "up_proj"):
        t[f"model.layers.1.mlp.{n}.weight"] = w(I, H)
    t["model.layers.1.mlp.down_proj.weight"] = w(H, I)
    # an all-zero block and a block of -0.0 (codes 0x8) are quantizer corner cases
    t["model.layers.1.mlp.down_proj.weight"][0, :16] = 0
    t["model.layers.1.mlp.down_proj.weight"][1, :16] = -0.0
    return t


def e4m3(x):
    return np.asarray(x, dtype=F32).astype(ml_dtypes.float8_e4m3fn)


def nvfp4_ref(x):
    """docs/numerics.md §2 for one weight tensor (N, K): codes, scales, S_dec."""
    x = x.astype(F32)
    N, K = x.shape
    with np.errstate(divide="ignore", over="ignore"):
        amax = F32(np.max(np.abs(x)))
        s_enc = np.minimum(F32(2688.0) / amax, F32(np.finfo(F32).max)) if amax else F32(1.0)
        if s_enc == 0:
            s_enc = F32(1.0)
        s_dec = F32(1.0 / np.float64(s_enc))
        blocks = x.reshape(N, K // 16, 16)
        amax_b = np.max(np.abs(blocks), axis=2)
        s_b = e4m3(np.minimum(amax_b * (s_enc * (F32(1.0) / F32(6.0))), F32(448.0)))
        inv = np.minimum(F32(1.0) / (s_b.astype(F32) * s_dec), F32(np.finfo(F32).max))
        v = blocks * inv[:, :, None]
    q = np.clip(v, F32(-6.0), F32(6.0)).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    q = q.reshape(N, K)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return packed, s_b, np.array(s_dec, dtype=F32)


QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/safetensors"
    os.makedirs(os.path.join(out, "sharded"), exist_ok=True)
    python_ref(out)
    t = tiny_moe(np.random.default_rng(20261202))
    meta = {"format": "pt"}
    save_file(t, os.path.join(out, "tiny_moe.safetensors"), metadata=meta)
    names = sorted(t)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: t[n] for n in part}, os.path.join(out, "sharded", fn), metadata=meta)
        weight_map.update({n: fn for n in part})
    total = sum(t[n].nbytes for n in names)
    with open(os.path.join(out, "sharded", "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    ref = {}
    for n in names:
        if n.endswith(".weight") and n.split(".")[-2] in QUANTIZED:
            base = n[: -len(".weight")]
            ref[base + ".weight"], ref[base + ".weight_scale"], ref[base + ".weight_scale_2"] = \
                nvfp4_ref(t[n])
    save_file(ref, os.path.join(out, "tiny_moe_nvfp4_ref.safetensors"), metadata=meta)


if __name__ == "__main__":
    main()
