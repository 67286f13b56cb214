"""Turns bench_torch.py and bench_backend rollout rows (JSON lines on stdin) of
the a3b model into the rows of docs/results/decode-h200.jsonl (stdout):
engine, recipe, mode, batch, prompt, new_tokens, tokens_per_s, step_ms,
step_bytes, roofline_fraction, vs_transformers, commit.

step_ms is the generate's wall time over its new tokens (the prefill
included, so an upper bound of one decode step). step_bytes is what one
decode step at this batch must read: every expert a batch of B rows touches
(expected count, experts drawn uniformly: E (1 - (1 - k/E)^B) of E), the
attention weights, the router and the lm_head, each at its stored width
(NVFP4 4.5 bits a weight: E2M1 plus an E4M3 scale per 16; FP8 8 bits plus a
float32 scale a row; BF16 16; router and lm_head BF16 always), plus the KV
cache read (float32 keys and values of prompt + new/2 positions on average).
roofline_fraction = step_bytes / (step_ms * copy bandwidth).

Rows of one configuration (engine, recipe, mode, batch, prompt, new tokens)
from several processes (bench/run_decode_h200.sh REPEAT=N: batch 1 spreads
~10% between processes) become one row, the median by tokens/s (the lower
middle one of an even count), with runs, tokens_per_s_min and _max added.

A quads row whose recipe is not nvfp4 also gets vs_nvfp4: its tokens/s over
nvfp4's in the same process and configuration (bench_backend's "process"
field), the median over the processes that ran both (the lower middle one),
with vs_nvfp4_min and _max where there are several: the quads recipe's
target is a ratio, and batch 1's spread between processes is larger than
the ratio's."""
import argparse
import json
import sys

HIDDEN, EXPERTS, TOPK, WIDTH, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 2048, 128, 8, 768, 32, 4, 128, 151936
BITS = {"bf16": 16.0, "fp8": 8.0, "nvfp4": 4.5, "nvfp4-rac": 4.5, "quads": 4.5, "fp32": 32.0}


def step_bytes(recipe, batch, prompt, new_tokens, layers):
    bits = BITS.get(recipe, 16.0)
    touched = EXPERTS * (1.0 - (1.0 - TOPK / EXPERTS) ** batch)
    experts = touched * 3 * WIDTH * HIDDEN * bits / 8
    attn = (HIDDEN * HEADS * HEAD_DIM * 2 + HIDDEN * KV_HEADS * HEAD_DIM * 2) * bits / 8
    router = HIDDEN * EXPERTS * 2
    kv = batch * (prompt + new_tokens / 2) * KV_HEADS * HEAD_DIM * 2 * 4
    return layers * (experts + attn + router + kv) + VOCAB * HIDDEN * 2


def cfg_of(r):
    return (r.get("program"), r["recipe"], r.get("mode"), r["batch"], r["prompt"], r["new_tokens"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--copy-tbs", type=float, required=True, help="measured copy bandwidth, TB/s")
    p.add_argument("--commit", required=True)
    a = p.parse_args()
    rows = [json.loads(l) for l in sys.stdin if l.strip()]
    base = {}
    for r in rows:
        if r.get("program") == "bench_torch" and r.get("status") == "ok":
            base[(r["batch"], r["prompt"], r["new_tokens"])] = r["tokens_per_s"]
    groups = {}
    for r in rows:
        if r.get("op") != "rollout" or r.get("status") != "ok":
            continue
        groups.setdefault(cfg_of(r), []).append(r)
    for runs in groups.values():
        runs.sort(key=lambda x: x["tokens_per_s"])
        r = runs[(len(runs) - 1) // 2]
        torch = r.get("program") == "bench_torch"
        key = (r["batch"], r["prompt"], r["new_tokens"])
        step_ms = r["ms_per_iter"] / r["new_tokens"]
        by = step_bytes(r["recipe"], r["batch"], r["prompt"], r["new_tokens"], a.layers)
        out = {"engine": "transformers" if torch else "quads", "recipe": r["recipe"],
               "mode": "eager" if torch else r["mode"], "batch": r["batch"], "prompt": r["prompt"],
               "new_tokens": r["new_tokens"], "layers": a.layers, "tokens_per_s": round(r["tokens_per_s"], 1),
               "step_ms": round(step_ms, 3), "step_bytes": int(by),
               "roofline_fraction": round(by / (step_ms * 1e-3 * a.copy_tbs * 1e12), 4),
               "vs_transformers": round(r["tokens_per_s"] / base[key], 3) if key in base else None,
               "commit": a.commit}
        if len(runs) > 1:
            out["runs"] = len(runs)
            out["tokens_per_s_min"] = round(runs[0]["tokens_per_s"], 1)
            out["tokens_per_s_max"] = round(runs[-1]["tokens_per_s"], 1)
        if not torch and r["recipe"] != "nvfp4":
            ref = {x.get("process"): x["tokens_per_s"]
                   for x in groups.get((r.get("program"), "nvfp4") + cfg_of(r)[2:], []) if x.get("process")}
            ratios = sorted(x["tokens_per_s"] / ref[x["process"]] for x in runs
                            if x.get("process") in ref and ref[x["process"]] > 0)
            if ratios:
                out["vs_nvfp4"] = round(ratios[(len(ratios) - 1) // 2], 3)
                if len(ratios) > 1:
                    out["vs_nvfp4_min"] = round(ratios[0], 3)
                    out["vs_nvfp4_max"] = round(ratios[-1], 3)
        print(json.dumps(out))


if __name__ == "__main__":
    main()
