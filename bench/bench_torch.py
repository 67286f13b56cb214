#!/usr/bin/env python3
"""The PyTorch baseline of bench/bench_backend: the same model and batch in
transformers' Qwen3MoeForCausalLM, the same ops, the same table and JSON lines.

Ops (each timed per iteration after untimed warm-up iterations; median and
fastest of --iters; on CUDA the device is synchronized before the clock stops):
  train step  mean next-token NLL, backward, clip to global norm 1, AdamW
              step; tokens = B x T. --train-precision: master (the default,
              like QUADS-C's trainer: bf16 model weights, activations and
              gradients, AdamW on fp32 master copies written back each step),
              autocast (fp32 weights, forward under bf16 autocast; transformers'
              grouped_mm experts are outside autocast and run in fp32 then) or
              bf16 (bf16 weights and AdamW state);
  forward     bf16 weights, no grad: logits and the next-token log-probs of the
              same B x T tokens;
  rollout     bf16 weights, model.generate with the KV cache: B prompts of P
              tokens, M new tokens each (min_new_tokens = max_new_tokens, no
              EOS), sampling at temperature 1 with top-k and top-p off (or
              greedy with --temperature 0); tokens = B x M, prefill included.

Models: "tiny" (models/tiny via from_pretrained) or "moe8", built in memory
(8 layers, hidden 1024, 32 experts top-4, expert width 512, 16 heads, 4 KV
heads, head_dim 64, vocab 32000) with transformers' random init (normal std
0.02, norms 1) from --seed. Runs on CUDA when present, else on the CPU
(slowly: use small sizes there).

    python3 bench/bench_torch.py --model moe8 --batch 8 --seq 256 --json torch.jsonl
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import transformers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

OPS = ("train step", "forward", "rollout")
PRECISION = {"master": "bf16 weights + fp32 master in AdamW", "autocast": "fp32 weights + bf16 autocast",
             "bf16": "bf16 weights and AdamW"}


def moe8_config(layers):
    """The moe8 shape of bench_backend.c (moe8_config)."""
    return Qwen3MoeConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=512,
        num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
        num_experts=32, num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=1,
        rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        initializer_range=0.02, use_cache=True)


def a3b_config(layers):
    """The a3b shape of bench_backend.c (a3b_config): Qwen3-30B-A3B's layers."""
    return Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
        rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        initializer_range=0.02, use_cache=True)


def build_model(a, device):
    """The model in float32 on device, with the experts and attention
    implementations asked for (else transformers' defaults)."""
    torch.manual_seed(a.seed)
    if a.model == "tiny":
        model = Qwen3MoeForCausalLM.from_pretrained(a.tiny_dir, dtype=torch.float32).to(device)
    else:
        with torch.device(device):
            model = Qwen3MoeForCausalLM((a3b_config if a.model == "a3b" else moe8_config)(a.layers))
    if a.experts:
        model.set_experts_implementation(a.experts)
    if a.attn:
        model.set_attn_implementation(a.attn)
    return model


def impl_note(model):
    cfg = model.config
    return "experts %s, attention %s" % (getattr(cfg, "_experts_implementation", "?"),
                                         getattr(cfg, "_attn_implementation", "?"))


def timed(fn, a, device):
    """Median and fastest milliseconds of fn over a.iters after a.warmup calls."""
    times = []
    for k in range(a.warmup + a.iters):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(k)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if k >= a.warmup:
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times), min(times)


def train_op(model, a, device, tokens):
    """One AdamW step per call, in the precision of a.train_precision (see the
    top of the file); returns the step function and what it keeps alive."""
    master = None
    if a.train_precision == "master":
        master = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    if a.train_precision != "autocast":
        model.to(torch.bfloat16)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(master or params, lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.train_precision == "autocast")

    def step(_k):
        model.zero_grad(set_to_none=True)
        with autocast:
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        if master:
            for m, p in zip(master, params):
                m.grad = p.grad.float()
        torch.nn.utils.clip_grad_norm_(master or params, 1.0)
        opt.step()
        if master:
            with torch.no_grad():
                for m, p in zip(master, params):
                    p.copy_(m)
    return step, (opt, master)


def forward_op(model, tokens):
    def fwd(_k):
        with torch.no_grad():
            logits = model(input_ids=tokens).logits.float()
            logp = torch.log_softmax(logits[:, :-1], dim=-1)
            logp.gather(-1, tokens[:, 1:, None])
    return fwd


def rollout_op(model, a, prompt):
    mask = torch.ones_like(prompt)
    sample = a.temperature > 0
    kw = dict(do_sample=True, temperature=a.temperature, top_k=0, top_p=1.0) if sample else dict(do_sample=False)

    def gen(k):
        torch.manual_seed(a.seed + k)
        with torch.no_grad():
            out = model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=a.new_tokens,
                                 min_new_tokens=a.new_tokens, use_cache=True, pad_token_id=0,
                                 eos_token_id=None, **kw)
        if out.shape != (a.batch, a.prompt + a.new_tokens):
            raise RuntimeError("generate returned shape %s, expected (%d, %d)"
                               % (tuple(out.shape), a.batch, a.prompt + a.new_tokens))
    return gen


def base_row(a, device, cfg, op):
    return {"program": "bench_torch", "model": a.model, "backend": "torch-" + device.type,
            "mode": "eager", "recipe": "bf16", "op": op, "status": "ok", "batch": a.batch,
            "seq": a.seq, "prompt": a.prompt, "new_tokens": a.new_tokens, "iters": a.iters,
            "warmup": a.warmup, "threads": torch.get_num_threads(), "layers": cfg.num_hidden_layers,
            "torch": torch.__version__, "transformers": transformers.__version__}


def measure(row, fn, a, device, tokens_per_iter):
    try:
        ms, ms_min = timed(fn, a, device)
    except (RuntimeError, ValueError, TypeError) as e:  # torch.OutOfMemoryError is a RuntimeError
        row["status"], row["reason"] = "error", "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])
        return row
    row.update(tokens_per_iter=tokens_per_iter, ms_per_iter=ms, ms_min=ms_min,
               tokens_per_s=1e3 * tokens_per_iter / ms, vs_bf16=1.0)
    return row


def run(a, device):
    model = build_model(a, device)
    cfg = model.config
    g = torch.Generator().manual_seed(a.seed + 1)
    tokens = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=g).to(device)
    prompt = torch.randint(0, cfg.vocab_size, (a.batch, a.prompt), generator=g).to(device)
    rows = []
    if "train step" in a.ops:
        row = base_row(a, device, cfg, "train step")
        row["precision"] = PRECISION[a.train_precision]
        step, state = train_op(model, a, device, tokens)
        rows.append(measure(row, step, a, device, a.batch * a.seq))
        del state, step
        model.zero_grad(set_to_none=True)
    model.to(torch.bfloat16).eval()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    for op, fn, n in (("forward", forward_op(model, tokens), a.batch * a.seq),
                      ("rollout", rollout_op(model, a, prompt), a.batch * a.new_tokens)):
        if op in a.ops:
            row = base_row(a, device, cfg, op)
            row["precision"] = "bf16 weights"
            rows.append(measure(row, fn, a, device, n))
    for r in rows:
        r["note"] = impl_note(model)
    return model, rows


def print_table(a, cfg, rows, device):
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, %d threads" % torch.get_num_threads()
    print("model %s: hidden %d, %d layers, %d experts top-%d (width %d), %d heads / %d kv, vocab %d, %d parameters"
          % (a.model, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok,
             cfg.moe_intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size,
             a.nparams))
    print("torch %s, transformers %s, %s; batch %d; train/forward seq %d; rollout prompt %d + %d new "
          "(temperature %g); warmup %d, iters %d; seed %d\n"
          % (torch.__version__, transformers.__version__, name, a.batch, a.seq, a.prompt, a.new_tokens,
             a.temperature, a.warmup, a.iters, a.seed))
    print("| model | backend | mode | recipe | op | tokens/iter | ms/iter (median) | ms (min) | tokens/s | vs bf16 | note |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        head = "| %s | %s | %s | %s | %s | " % (r["model"], r["backend"], r["mode"], r["recipe"], r["op"])
        if r["status"] == "ok":
            print(head + "%d | %.3f | %.3f | %.1f | %.3f | %s; %s |" % (
                r["tokens_per_iter"], r["ms_per_iter"], r["ms_min"], r["tokens_per_s"], r["vs_bf16"],
                r["precision"], r["note"]))
        else:
            print(head + "- | error | - | error | - | error: %s |" % r["reason"])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("tiny", "moe8", "a3b"), default="tiny")
    p.add_argument("--tiny-dir", default="models/tiny")
    p.add_argument("--layers", type=int, default=8, help="moe8's layers (default 8)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    p.add_argument("--train-precision", choices=tuple(PRECISION), default="master")
    p.add_argument("--ops", default=",".join(OPS), help="comma list of: " + ", ".join(OPS))
    p.add_argument("--experts", default=None, help="transformers experts_implementation (default: its own)")
    p.add_argument("--attn", default=None, help="transformers attn_implementation (default: its own)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the rows as JSON lines")
    a = p.parse_args(argv)
    a.ops = [s.strip() for s in a.ops.split(",") if s.strip()]
    bad = [o for o in a.ops if o not in OPS]
    if bad or not a.ops:
        p.error("--ops: unknown %s (valid: %s)" % (bad, ", ".join(OPS)))
    for name in ("layers", "batch", "seq", "prompt", "new_tokens", "iters"):
        if getattr(a, name) < (2 if name == "seq" else 1):
            p.error("--%s: too small" % name.replace("_", "-"))
    if a.warmup < 0 or a.temperature < 0:
        p.error("--warmup and --temperature must be >= 0")
    return a


def main(argv):
    a = parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_torch: --device cuda: no CUDA device")
    device = torch.device("cuda" if a.device != "cpu" and torch.cuda.is_available() else "cpu")
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.model == "tiny" and not os.path.isfile(os.path.join(a.tiny_dir, "config.json")):
        sys.exit("bench_torch: --tiny-dir %s: no config.json (run from the source root or pass --tiny-dir)"
                 % a.tiny_dir)
    model, rows = run(a, device)
    a.nparams = sum(p.numel() for p in model.parameters())
    print_table(a, model.config, rows, device)
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
