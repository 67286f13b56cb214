"""Reference logits of the tiny random Qwen3-MoE of tests/test_backend_cpu.c,
computed in float64 with numpy from the Hugging Face modeling_qwen3_moe.py
math (RMSNorm, q/k norm, rotate_half RoPE, GQA via repeat_kv, causal softmax,
router softmax -> top-k -> optional renormalization, SwiGLU experts, dense
layers from mlp_only_layers). The weights and tokens come from the same
splitmix64 stream as the C test, so only the logits are stored.

Run: python3 tests/ref/qwen3moe_tiny_ref.py  (writes tests/fixtures/qwen3moe_tiny_*.bin)
Output: float32 little-endian logits (17 tokens, 64) of the packed valid tokens.
"""
import os
import numpy as np

M64 = (1 << 64) - 1


class Rng:
    def __init__(self, seed):
        self.s = seed

    def urand(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return ((z ^ (z >> 31)) >> 11) * 2.0**-53

    def sym(self):
        return 2.0 * self.urand() - 1.0


V, C, I_DENSE, I_MOE, L, H, KV, D, E, K = 64, 32, 32, 16, 2, 4, 2, 16, 8, 2
THETA, EPS = 10000.0, 1e-6
LENGTHS, T = [7, 4, 6], 7


def param_shapes(tied):
    shapes = [("model.embed_tokens.weight", V, C)]
    for l in range(L):
        p = f"model.layers.{l}."
        shapes += [(p + "input_layernorm.weight", 1, C), (p + "self_attn.q_proj.weight", H * D, C),
                   (p + "self_attn.k_proj.weight", KV * D, C), (p + "self_attn.v_proj.weight", KV * D, C),
                   (p + "self_attn.o_proj.weight", C, H * D), (p + "self_attn.q_norm.weight", 1, D),
                   (p + "self_attn.k_norm.weight", 1, D), (p + "post_attention_layernorm.weight", 1, C)]
        if l == 0:  # mlp_only_layers = [0]
            shapes += [(p + "mlp.gate_proj.weight", I_DENSE, C), (p + "mlp.up_proj.weight", I_DENSE, C),
                       (p + "mlp.down_proj.weight", C, I_DENSE)]
        else:
            shapes += [(p + "mlp.gate.weight", E, C)]
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                shapes += [(q + "gate_proj.weight", I_MOE, C), (q + "up_proj.weight", I_MOE, C),
                           (q + "down_proj.weight", C, I_MOE)]
    shapes += [("model.norm.weight", 1, C)]
    if not tied:
        shapes += [("lm_head.weight", V, C)]
    return shapes


def random_weights(tied, seed):
    rng, w = Rng(seed), {}
    for name, rows, cols in param_shapes(tied):
        norm, emb = rows == 1, "embed" in name
        a = 0.2 if norm else (1.0 if emb else np.sqrt(3.0 / cols))
        vals = [np.float32((1.0 if norm else 0.0) + a * rng.sym()) for _ in range(rows * cols)]
        w[name] = np.array(vals, dtype=np.float32).astype(np.float64).reshape(rows, cols)
        if norm:
            w[name] = w[name][0]
    return w


def tokens(seed):
    rng, seqs = Rng(seed), []
    for n in LENGTHS:
        row = [int(rng.urand() * 64) if t < n else 9999 for t in range(T)]
        seqs.append(row[:n])
    return seqs


def rms(x, w):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS))


def rope(x, n):  # x (n, heads, D)
    inv = np.array([np.float32(1.0 / THETA ** (2 * i / D)) for i in range(D // 2)], dtype=np.float64)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1)
    return x * cos + rot * sin


def silu(x):
    return x / (1.0 + np.exp(-x))


def mlp(x, w, p):
    return (silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def moe(x, w, p, norm_topk):
    logits = x @ w[p + "mlp.gate.weight"].T
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for n in range(x.shape[0]):
        top = np.argsort(-prob[n], kind="stable")[:K]
        wt = prob[n, top] / (prob[n, top].sum() if norm_topk else 1.0)
        for e, c in sorted(zip(top, wt)):
            out[n] += c * mlp(x[n:n + 1], w, p + f"mlp.experts.{e}.")[0]
    return out


def forward(seq, w, tied, norm_topk):
    n = len(seq)
    x = w["model.embed_tokens.weight"][seq]
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rms((h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, H, D), w[p + "self_attn.q_norm.weight"])
        k = rms((h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, KV, D), w[p + "self_attn.k_norm.weight"])
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, KV, D)
        q, k = rope(q, n), rope(k, n)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)  # repeat_kv
        s = np.einsum("thd,shd->hts", q, k) * D ** -0.5
        s = np.where(np.tril(np.ones((n, n), bool))[None], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(n, H * D)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        x = x + (mlp(h, w, p + "mlp.") if l == 0 else moe(h, w, p, norm_topk))
    h = rms(x, w["model.norm.weight"])
    return h @ (w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]).T


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    for tied, norm_topk, seed in [(0, 1, 81), (1, 0, 91)]:
        w = random_weights(tied, seed)
        logits = np.concatenate([forward(s, w, tied, norm_topk) for s in tokens(seed + 1)])
        out = os.path.join(here, "..", "fixtures", f"qwen3moe_tiny_tied{tied}.bin")
        logits.astype("<f4").tofile(out)
        print(out, logits.shape, float(np.abs(logits).max()))


if __name__ == "__main__":
    main()
