#!/usr/bin/env python3
"""Reference logits and gradients of tiny random-weight Qwen3-MoE / Qwen3 checkpoints.

The reference is Hugging Face `transformers` + PyTorch autograd in float32 on the
CPU (eager attention, eager experts): code nobody in this project wrote. The C CPU
backend (issue 3) loads each checkpoint folder and must reproduce `logits` and the
`grad.*` tensors of reference.safetensors.

For every config in CONFIGS it writes tests/fixtures/hf_models/<name>/:
  config.json, model.safetensors   the checkpoint, written by save_pretrained
                                   (hub tensor names, one tensor per expert:
                                   model.layers.N.mlp.experts.E.gate_proj.weight)
  reference.safetensors            ids, lengths, logits, logits_f64, logprobs, coef,
                                   router_topk, router_logits, grad.<tensor name>
                                   (see tests/ref/README.md for shapes)

The weights are drawn with numpy per hub tensor name (seeded by config seed and
the name), so they do not depend on how a transformers version lays parameters
out in memory; the script checks that what save_pretrained wrote equals them.

`logits_f64` comes from a separate float64 implementation of the same math in
this file (transformers' own model.double() still rounds inside RMSNorm and the
softmaxes to float32); the script checks it against the transformers float32
logits and writes the float32-vs-float64 gaps into the metadata, so the C side
can see the float32 noise level.

    python3 tests/ref/qwen3moe_reference.py [--out DIR] [--only NAME ...]
    python3 tests/ref/qwen3moe_reference.py --out /tmp/again --compare tests/fixtures/hf_models

--compare DIR: after writing, compare every tensor with the same file under DIR;
weights and ids must be equal, the rest within float32 noise; exit 1 otherwise.
"""
import argparse
import json
import os
import platform
import sys
import zlib

import numpy as np
import safetensors
import torch
import transformers
from safetensors.numpy import load_file, save_file
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

LENGTHS = (7, 12, 16)  # B = 3 sequences, run one at a time (no padding influence)
ROPE_THETA = 10000.0
RMS_EPS = 1e-6
MIN_ROUTER_GAP = 1e-3  # top-k vs next expert probability gap required at every token

# Every field here changes the math; "hub_config" rewrites config.json into the
# hub's key spelling (num_experts, top-level rope_theta, torch_dtype), which is what
# published Qwen3 checkpoints use; the others keep what this transformers writes.
CONFIGS = {
    "qwen3moe_gqa_untied": dict(
        moe=True, seed=101, vocab=64, hidden=32, heads=4, kv_heads=2, layers=2,
        tied=False, norm_topk=True, sparse_step=1, mlp_only=[], hub_config=False),
    "qwen3moe_mha_tied_nonorm": dict(
        moe=True, seed=202, vocab=96, hidden=64, heads=4, kv_heads=4, layers=2,
        tied=True, norm_topk=False, sparse_step=1, mlp_only=[], hub_config=True),
    "qwen3moe_mqa_sparse2": dict(
        moe=True, seed=303, vocab=128, hidden=32, heads=4, kv_heads=1, layers=3,
        tied=False, norm_topk=True, sparse_step=2, mlp_only=[], hub_config=False),
    "qwen3moe_mlponly0": dict(
        moe=True, seed=404, vocab=80, hidden=48, heads=4, kv_heads=2, layers=3,
        tied=False, norm_topk=True, sparse_step=1, mlp_only=[0], hub_config=True),
    "qwen3_dense": dict(
        moe=False, seed=505, vocab=64, hidden=32, heads=4, kv_heads=2, layers=2,
        tied=False, hub_config=True),
}
HEAD_DIM = 16
INTERMEDIATE = 64
MOE_INTERMEDIATE = 32
EXPERTS = 8
TOP_K = 2


def moe_layer_ids(spec):
    """Which decoder layers are sparse, by the rule of Qwen3MoeDecoderLayer."""
    if not spec["moe"]:
        return []
    return [i for i in range(spec["layers"])
            if i not in spec["mlp_only"] and (i + 1) % spec["sparse_step"] == 0]


def make_config(spec):
    common = dict(
        vocab_size=spec["vocab"], hidden_size=spec["hidden"], head_dim=HEAD_DIM,
        intermediate_size=INTERMEDIATE, num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"], num_key_value_heads=spec["kv_heads"],
        max_position_embeddings=128, rms_norm_eps=RMS_EPS,
        tie_word_embeddings=spec["tied"], hidden_act="silu", attention_bias=False)
    rope = dict(rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    if not spec["moe"]:
        return Qwen3Config(**common, **rope)
    moe = dict(moe_intermediate_size=MOE_INTERMEDIATE, num_experts=EXPERTS,
               num_experts_per_tok=TOP_K, norm_topk_prob=spec["norm_topk"],
               decoder_sparse_step=spec["sparse_step"], mlp_only_layers=list(spec["mlp_only"]))
    try:
        return Qwen3MoeConfig(**common, **rope, **moe)
    except TypeError:  # transformers versions before rope_parameters
        return Qwen3MoeConfig(**common, rope_theta=ROPE_THETA, **moe)


def hub_shapes(spec):
    """name -> shape of every tensor of the hub checkpoint layout."""
    h, v, hd, I, mi = spec["hidden"], spec["vocab"], HEAD_DIM, INTERMEDIATE, MOE_INTERMEDIATE
    out = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not spec["tied"]:
        out["lm_head.weight"] = (v, h)
    moe = moe_layer_ids(spec)
    for i in range(spec["layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"] = (spec["heads"] * hd, h)
        out[p + "self_attn.k_proj.weight"] = (spec["kv_heads"] * hd, h)
        out[p + "self_attn.v_proj.weight"] = (spec["kv_heads"] * hd, h)
        out[p + "self_attn.o_proj.weight"] = (h, spec["heads"] * hd)
        out[p + "self_attn.q_norm.weight"] = (hd,)
        out[p + "self_attn.k_norm.weight"] = (hd,)
        if i in moe:
            out[p + "mlp.gate.weight"] = (EXPERTS, h)
            for e in range(EXPERTS):
                out[p + f"mlp.experts.{e}.gate_proj.weight"] = (mi, h)
                out[p + f"mlp.experts.{e}.up_proj.weight"] = (mi, h)
                out[p + f"mlp.experts.{e}.down_proj.weight"] = (h, mi)
        else:
            out[p + "mlp.gate_proj.weight"] = (I, h)
            out[p + "mlp.up_proj.weight"] = (I, h)
            out[p + "mlp.down_proj.weight"] = (h, I)
    return out


def draw_weights(spec):
    """Hub-named float32 weights, scaled so logits and routing are far from uniform."""
    out = {}
    for name, shape in hub_shapes(spec).items():
        rng = np.random.default_rng([spec["seed"], zlib.crc32(name.encode())])
        z = rng.standard_normal(shape)
        if name.endswith("norm.weight"):  # RMSNorm gains near 1
            w = 1.0 + 0.1 * z
        elif name == "model.embed_tokens.weight":  # also the head when tied: logits rms ~1.5
            w = z * (1.5 / np.sqrt(shape[1]))
        elif name.endswith("mlp.gate.weight"):  # router logits of spread ~2
            w = z * (2.0 / np.sqrt(shape[1]))
        else:  # linear layers: output rms ~1.2x input rms
            w = z * (1.2 / np.sqrt(shape[1]))
        out[name] = w.astype(np.float32)
    return out


def hub_views(model, spec):
    """hub name -> function(tensor of the model's parameter) -> hub-shaped view.

    transformers 5 keeps a layer's experts fused, gate_up_proj [E, 2*I, H] (gate rows
    first, as its forward chunks them) and down_proj [E, H, I]; older versions keep
    one module per expert under the hub names. The returned pairs are
    (parameter, getter) so weights can be set and gradients read the same way."""
    params = dict(model.named_parameters())
    mi = MOE_INTERMEDIATE
    views = {}
    for name in hub_shapes(spec):
        if name in params:
            views[name] = (params[name], lambda t: t)
            continue
        if name == "lm_head.weight" or ".mlp.experts." not in name:
            raise SystemExit(f"model has no parameter for checkpoint tensor {name}")
        prefix, rest = name.split(".mlp.experts.")
        e, proj = int(rest.split(".")[0]), rest.split(".")[1]
        if proj in ("gate_proj", "up_proj"):
            fused = params[prefix + ".mlp.experts.gate_up_proj"]
            lo = 0 if proj == "gate_proj" else mi
            views[name] = (fused, lambda t, e=e, lo=lo: t[e, lo:lo + mi, :])
        else:
            views[name] = (params[prefix + ".mlp.experts.down_proj"], lambda t, e=e: t[e])
    return views


def build_model(spec, cfg):
    cls = Qwen3MoeForCausalLM if spec["moe"] else Qwen3ForCausalLM
    kwargs = dict(attn_implementation="eager", dtype=torch.float32)
    if spec["moe"]:
        kwargs["experts_implementation"] = "eager"
    while True:  # drop keywords that an older transformers does not know
        try:
            return cls._from_config(cfg, **kwargs).eval()
        except (TypeError, ValueError) as err:
            if "experts_implementation" in kwargs and "experts_implementation" in str(err):
                del kwargs["experts_implementation"]
            elif "dtype" in kwargs:
                kwargs["torch_dtype"] = kwargs.pop("dtype")
            else:
                raise


def load_model(spec, folder):
    cls = Qwen3MoeForCausalLM if spec["moe"] else Qwen3ForCausalLM
    kwargs = dict(attn_implementation="eager", dtype=torch.float32)
    if spec["moe"]:
        kwargs["experts_implementation"] = "eager"
    try:
        return cls.from_pretrained(folder, **kwargs).eval()
    except (TypeError, ValueError):
        kwargs.pop("experts_implementation", None)
        kwargs["torch_dtype"] = kwargs.pop("dtype")
        return cls.from_pretrained(folder, **kwargs).eval()


def set_weights(model, spec, weights):
    views = hub_views(model, spec)
    with torch.no_grad():
        for name, w in weights.items():
            param, get = views[name]
            get(param.data).copy_(torch.from_numpy(w))
    if spec["tied"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def draw_batch(spec):
    rng = np.random.default_rng([spec["seed"], 7])
    B, T = len(LENGTHS), max(LENGTHS)
    ids = np.zeros((B, T), np.int32)
    coef = np.zeros((B, T - 1), np.float32)
    for b, L in enumerate(LENGTHS):
        ids[b, :L] = rng.integers(1, spec["vocab"], L)
        coef[b, :L - 1] = rng.uniform(-1.0, 1.0, L - 1)
    return ids, np.array(LENGTHS, np.int32), coef


class RouterTap:
    """Forward hooks on every router: its logits and the top-k it chose."""

    def __init__(self, model, spec):
        self.calls = []
        self.handles = []
        for i in moe_layer_ids(spec):
            gate = model.model.layers[i].mlp.gate
            self.handles.append(gate.register_forward_hook(self.hook))
        self.k = TOP_K

    def hook(self, module, args, out):
        if isinstance(out, tuple):  # transformers 5: (logits, scores, indices)
            logits, idx = out[0], out[-1]
        else:  # a plain nn.Linear router: top-k of the softmax, as the block does
            logits = out
            idx = torch.topk(torch.softmax(out.float(), -1), self.k, dim=-1).indices
        self.calls.append((logits.detach().reshape(-1, logits.shape[-1]).clone(),
                           idx.detach().reshape(-1, self.k).clone()))

    def close(self):
        for h in self.handles:
            h.remove()


def hf_run(model, spec, ids, lengths, coef):
    """Per-sequence float32 forward and one backward of sum(coef * logprobs)."""
    B, T = ids.shape
    V, nm = spec["vocab"], len(moe_layer_ids(spec))
    logits = np.zeros((B, T, V), np.float32)
    logprobs = np.zeros((B, T - 1), np.float32)
    topk = np.full((nm, B * T, TOP_K), -1, np.int32)
    rlogits = np.zeros((nm, B * T, EXPERTS), np.float32)
    model.zero_grad(set_to_none=True)
    tap = RouterTap(model, spec)
    for b in range(B):
        L = int(lengths[b])
        x = torch.from_numpy(ids[b:b + 1, :L].astype(np.int64))
        tap.calls.clear()
        out = model(input_ids=x, use_cache=False).logits[0]  # [L, V]
        lp = torch.log_softmax(out, dim=-1)[:-1].gather(1, x[0, 1:, None])[:, 0]  # [L-1]
        loss = (torch.from_numpy(coef[b, :L - 1]) * lp).sum()
        loss.backward()
        logits[b, :L] = out.detach().numpy()
        logprobs[b, :L - 1] = lp.detach().numpy()
        assert len(tap.calls) == nm, "router hook count"
        for m, (rl, idx) in enumerate(tap.calls):
            rlogits[m, b * T:b * T + L] = rl.numpy()
            topk[m, b * T:b * T + L] = idx.numpy()
    tap.close()
    grads = {}
    for name, (param, get) in hub_views(model, spec).items():
        grads[name] = get(param.grad).detach().numpy().astype(np.float32).copy()
    return dict(logits=logits, logprobs=logprobs, router_topk=topk, router_logits=rlogits), grads


# ---- independent float64 implementation, hub tensor names --------------------------

def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w


def rope(x, pos):
    """x [L, heads, hd]: rotate (first half, second half) pairs, Qwen/Llama style."""
    hd = x.shape[-1]
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos[:, None].double() * inv[None, :]  # [L, hd/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    rot = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * cos + rot * sin


def f64_forward(W, spec, ids):
    """Logits [L, V] of one sequence in float64; W holds hub-named float64 tensors."""
    L = ids.shape[0]
    nh, nkv, hd = spec["heads"], spec["kv_heads"], HEAD_DIM
    moe = moe_layer_ids(spec)
    x = W["model.embed_tokens.weight"][ids]
    pos = torch.arange(L)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    for i in range(spec["layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, W[p + "input_layernorm.weight"])
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(L, nh, hd)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).view(L, nkv, hd)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(L, nkv, hd)
        q = rope(rms_norm(q, W[p + "self_attn.q_norm.weight"]), pos)
        k = rope(rms_norm(k, W[p + "self_attn.k_norm.weight"]), pos)
        k = k.repeat_interleave(nh // nkv, dim=1)  # query head j uses kv head j // (nh/nkv)
        v = v.repeat_interleave(nh // nkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        a = torch.softmax(s.masked_fill(~causal, float("-inf")), -1)
        o = torch.einsum("hqk,khd->qhd", a, v).reshape(L, nh * hd)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"])
        if i in moe:
            prob = torch.softmax(h @ W[p + "mlp.gate.weight"].T, -1)  # [L, E]
            top, idx = torch.topk(prob, TOP_K, dim=-1)
            if spec["norm_topk"]:
                top = top / top.sum(-1, keepdim=True)
            y = torch.zeros_like(h)
            for t in range(L):
                for j in range(TOP_K):
                    e = f"{p}mlp.experts.{int(idx[t, j])}."
                    g = h[t] @ W[e + "gate_proj.weight"].T
                    u = h[t] @ W[e + "up_proj.weight"].T
                    y[t] = y[t] + top[t, j] * ((torch.nn.functional.silu(g) * u) @ W[e + "down_proj.weight"].T)
        else:
            g = h @ W[p + "mlp.gate_proj.weight"].T
            u = h @ W[p + "mlp.up_proj.weight"].T
            y = (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
        x = x + y
    x = rms_norm(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if spec["tied"] else W["lm_head.weight"]
    return x @ head.T


def f64_run(weights, spec, ids, lengths, coef):
    W = {n: torch.from_numpy(w.astype(np.float64)).requires_grad_(True) for n, w in weights.items()}
    B, T = ids.shape
    logits = np.zeros((B, T, spec["vocab"]), np.float64)
    for b in range(B):
        L = int(lengths[b])
        x = torch.from_numpy(ids[b, :L].astype(np.int64))
        out = f64_forward(W, spec, x)
        lp = torch.log_softmax(out, -1)[:-1].gather(1, x[1:, None])[:, 0]
        (torch.from_numpy(coef[b, :L - 1].astype(np.float64)) * lp).sum().backward()
        logits[b, :L] = out.detach().numpy()
    return logits, {n: w.grad.numpy() for n, w in W.items()}


# ---- checks and files -----------------------------------------------------------------

def router_gap(rlogits, lengths, T):
    """Smallest gap between the k-th and (k+1)-th router probability over real tokens."""
    gap = np.inf
    for b, L in enumerate(lengths):
        for rl in rlogits[:, b * T:b * T + L]:
            p = np.sort(np.exp(rl - rl.max(-1, keepdims=True)), -1)[:, ::-1]
            p = p / p.sum(-1, keepdims=True)
            gap = min(gap, float((p[:, TOP_K - 1] - p[:, TOP_K]).min()))
    return gap


def rel(a, b):
    """max |a - b| / max |b|: the error measure the metadata reports."""
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def hub_style_config(path):
    """Spell config.json as published Qwen3 checkpoints do."""
    with open(path) as f:
        cfg = json.load(f)
    if "num_local_experts" in cfg:
        cfg["num_experts"] = cfg.pop("num_local_experts")
    rp = cfg.pop("rope_parameters", None)
    if rp is not None:
        assert rp.get("rope_type", "default") == "default", rp
        cfg["rope_theta"] = rp["rope_theta"]
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    with open(path, "w") as f:
        json.dump(dict(sorted(cfg.items())), f, indent=2)
        f.write("\n")


def save_checkpoint(model, spec, weights, folder):
    """save_pretrained, then make sure model.safetensors has the hub layout and our weights."""
    model.save_pretrained(folder, safe_serialization=True)
    path = os.path.join(folder, "model.safetensors")
    saved = load_file(path)
    layout = "per-expert"
    if set(saved) != set(weights):
        # Keep what transformers wrote for the record and write the hub layout ourselves.
        layout = "transformers wrote: " + ",".join(sorted(set(saved) - set(weights)))[:200]
        os.replace(path, os.path.join(folder, "model.transformers.safetensors"))
        save_file(weights, path, metadata={"format": "pt"})
        saved = load_file(path)
    for name, w in weights.items():
        if saved[name].dtype != np.float32 or not np.array_equal(saved[name], w):
            raise SystemExit(f"{folder}: saved {name} differs from the drawn weight")
    if spec["hub_config"]:
        hub_style_config(os.path.join(folder, "config.json"))
    return layout


def make_one(name, spec, out_dir):
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    cfg = make_config(spec)
    seed0 = spec["seed"]
    for attempt in range(50):  # reseed until routing is clear-cut and covers all experts
        spec = dict(spec, seed=seed0 + 1000 * attempt)
        weights = draw_weights(spec)
        ids, lengths, coef = draw_batch(spec)
        torch.manual_seed(0)
        model = build_model(spec, cfg)
        set_weights(model, spec, weights)
        ref, grads = hf_run(model, spec, ids, lengths, coef)
        gap = router_gap(ref["router_logits"], lengths, ids.shape[1]) if moe_layer_ids(spec) else 1.0
        # Every expert of every MoE layer gets a token, so every expert has a gradient.
        used = all(np.isin(np.arange(EXPERTS), r).all() for r in ref["router_topk"])
        if gap >= MIN_ROUTER_GAP and used:
            break
    else:
        raise SystemExit(f"{name}: no seed without router near-ties and idle experts")

    T = ids.shape[1]
    layout = save_checkpoint(model, spec, weights, folder)
    # The saved folder must load back to the same numbers (config spelling included).
    again, _ = hf_run(load_model(spec, folder), spec, ids, lengths, coef)
    if not np.array_equal(again["logits"], ref["logits"]):
        raise SystemExit(f"{name}: reloaded checkpoint gives other logits, max diff "
                         f"{np.abs(again['logits'] - ref['logits']).max()}")

    # Right-padded batch with an attention mask: padding must not change real tokens.
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    with torch.no_grad():
        padded = model(input_ids=torch.from_numpy(ids.astype(np.int64)),
                       attention_mask=torch.from_numpy(mask), use_cache=False).logits.numpy()
    pad_gap = max(float(np.abs(padded[b, :L] - ref["logits"][b, :L]).max()) for b, L in enumerate(lengths))

    logits64, grads64 = f64_run(weights, spec, ids, lengths, coef)
    with torch.no_grad():  # transformers' own double run, for the record only
        md = model.double()
        hf64 = np.stack([np.pad(md(input_ids=torch.from_numpy(ids[b:b + 1, :L].astype(np.int64)),
                                   use_cache=False).logits[0].numpy(), ((0, T - L), (0, 0)))
                         for b, L in enumerate(lengths)])
    logit_rel = rel(ref["logits"], logits64)
    grad_rel = max(rel(grads[n], grads64[n]) for n in grads)
    if logit_rel > 1e-4 or grad_rel > 1e-3:
        raise SystemExit(f"{name}: float64 re-implementation disagrees with transformers "
                         f"(logits {logit_rel:.2e}, grads {grad_rel:.2e})")

    tensors = dict(ids=ids, lengths=lengths, coef=coef, logits_f64=logits64, **ref)
    tensors.update({"grad." + n: g for n, g in grads.items()})
    meta = {
        "config": name, "seed": str(spec["seed"]), "device": "cpu", "dtype": "float32",
        "attn_implementation": "eager", "torch": torch.__version__,
        "transformers": transformers.__version__, "safetensors": safetensors.__version__,
        "numpy": np.__version__, "python": platform.python_version(),
        "machine": platform.machine(), "torch_threads": str(torch.get_num_threads()),
        "moe_layers": ",".join(map(str, moe_layer_ids(spec))), "top_k": str(TOP_K),
        "checkpoint_layout": layout, "config_spelling": "hub" if spec["hub_config"] else "transformers",
        "loss": "sum over b,t of coef[b,t] * logprobs[b,t]; each sequence run alone",
        "router_min_prob_gap": f"{gap:.3e}",
        "logits_f32_vs_f64_rel": f"{logit_rel:.3e}",
        "logits_hf_double_vs_f64_rel": f"{rel(hf64, logits64):.3e}",
        "grads_f32_vs_f64_max_rel": f"{grad_rel:.3e}",
        "padded_batch_max_abs_diff": f"{pad_gap:.3e}",
    }
    save_file(tensors, os.path.join(folder, "reference.safetensors"), metadata=meta)
    print(f"{name}: seed {spec['seed']} layout {layout} router gap {gap:.2e} "
          f"logits f32/f64 {logit_rel:.2e} grads f32/f64 {grad_rel:.2e} padded {pad_gap:.1e}")


def compare(out_dir, ref_dir, names):
    """Weights, ids and routes must be equal; float results within float32 noise."""
    bad = 0
    for name in names:
        for fname in ("model.safetensors", "reference.safetensors"):
            a = load_file(os.path.join(out_dir, name, fname))
            b = load_file(os.path.join(ref_dir, name, fname))
            if set(a) != set(b):
                print(f"{name}/{fname}: tensor names differ")
                bad += 1
                continue
            for k in sorted(a):
                exact = fname == "model.safetensors" or a[k].dtype == np.int32
                err = 0.0 if np.array_equal(a[k], b[k]) else rel(a[k].astype(np.float64), b[k].astype(np.float64))
                if (exact and err != 0.0) or err > 1e-5:
                    print(f"{name}/{fname}: {k} differs, rel {err:.2e}")
                    bad += 1
        print(f"{name}: compared")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "fixtures", "hf_models"))
    ap.add_argument("--only", nargs="*", default=sorted(CONFIGS))
    ap.add_argument("--compare", help="folder of earlier output to compare with")
    args = ap.parse_args()
    torch.set_num_threads(1)  # one reduction order for the float32 sums
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__} transformers {transformers.__version__} "
          f"safetensors {safetensors.__version__} numpy {np.__version__} python {platform.python_version()}")
    for name in args.only:
        make_one(name, CONFIGS[name], args.out)
    if args.compare and compare(args.out, args.compare, args.only):
        sys.exit(1)


if __name__ == "__main__":
    main()
