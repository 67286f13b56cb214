#!/usr/bin/env python3
"""An independent numpy forward of the shipped tiny model, written from the
semantics of transformers' Qwen3MoeForCausalLM (RMSNorm, q/k norm per head,
rotate-half RoPE, GQA causal attention, softmax router with top-k and
norm_topk_prob, SwiGLU experts, untied lm_head), greedy-decoding arithmetic
prompts in the pinned task format. Without torch here this is our stand-in for
"transformers loads it": a layout or semantics mismatch gives ~0 accuracy.

usage: python3 tests/ref/check_tiny_model.py models/tiny [N [FIXTURE.json]]
Needs: numpy, safetensors, tokenizers. Prints greedy accuracy on N random
problems (operands 0..99, + - *; train and held-out mixed); the C backend's
greedy held-out pass@1 is 0.480 (models/tiny/README.md). With FIXTURE, writes
each problem with its greedy completion ids and the smallest top-1/top-2 logit
margin along it, for the tiny suite to compare the C backend against
(tests/fixtures/tiny/greedy.json)."""
import json
import random
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, theta):  # x: (T, H, D)
    T, _, D = x.shape
    inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.outer(np.arange(T), inv)
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    half = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + half * sin


def forward(W, c, ids):
    eps, hd = c["rms_norm_eps"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    x = W["model.embed_tokens.weight"][ids].astype(np.float64)
    T = len(ids)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
        q = rope(rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps), c["rope_theta"])
        k = rope(rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps), c["rope_theta"])
        rep = nh // nkv
        out = np.empty((T, nh, hd))
        for i in range(nh):
            s = q[:, i] @ k[:, i // rep].T / np.sqrt(hd) + mask
            a = np.exp(s - s.max(-1, keepdims=True))
            out[:, i] = (a / a.sum(-1, keepdims=True)) @ v[:, i // rep]
        x = x + out.reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        logits = h @ W[p + "mlp.gate.weight"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        moe = np.zeros_like(h)
        for t in range(T):
            top = np.argsort(-probs[t], kind="stable")[: c["num_experts_per_tok"]]
            w = probs[t, top]
            if c.get("norm_topk_prob"):
                w = w / w.sum()
            for e, we in zip(top, w):
                e_ = f"{p}mlp.experts.{e}."
                g = h[t] @ W[e_ + "gate_proj.weight"].T
                u = h[t] @ W[e_ + "up_proj.weight"].T
                moe[t] += we * ((g / (1 + np.exp(-g)) * u) @ W[e_ + "down_proj.weight"].T)
        x = x + moe
    x = rmsnorm(x, W["model.norm.weight"], eps)
    return x @ W["lm_head.weight"].T


def main():
    d = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    c = json.load(open(f"{d}/config.json"))
    W = {k: v.astype(np.float64) for k, v in load_file(f"{d}/model.safetensors").items()}
    tok = Tokenizer.from_file(f"{d}/tokenizer.json")
    end = tok.token_to_id("<|endoftext|>")
    rng = random.Random(12345)
    right = 0
    records = []
    for _ in range(n):
        a, b, op = rng.randint(0, 99), rng.randint(0, 99), rng.choice("+-*")
        gold = str(a + b if op == "+" else a - b if op == "-" else a * b)
        ids = tok.encode(f"Q: What is {a} {op} {b}?\nA: ", add_special_tokens=False).ids
        out = []
        margin = np.inf
        for _ in range(12):
            last = forward(W, c, ids + out)[-1]
            nxt = int(np.argmax(last))
            margin = min(margin, float(last[nxt] - np.partition(last, -2)[-2]))
            out.append(nxt)
            if nxt == end:
                break
        text = tok.decode(out[:-1] if out and out[-1] == end else out, skip_special_tokens=False)
        right += text.strip() == gold
        records.append({"problem": f"What is {a} {op} {b}?", "answer": gold, "completion": out,
                        "min_margin": round(margin, 6)})
    print(f"numpy reference greedy accuracy {right / n:.3f} on {n} problems")
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as f:
            json.dump(records, f, indent=1)
            f.write("\n")
    return 0 if right / n > 0.2 else 1


if __name__ == "__main__":
    sys.exit(main())
