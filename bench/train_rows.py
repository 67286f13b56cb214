"""Turns bench_backend rows (train step, weight sync) and bench_torch.py train
step rows (JSON lines on stdin) into the rows of docs/results/train-h200.jsonl
(stdout): model, engine, recipe, mode, op ("train_step", "weight_sync"),
batch, seq, tokens_per_s or ms, mfu or bandwidth_fraction, commit.

A train step's mfu is its FLOPs (bench_backend's flops_per_iter: 6 x active
parameters x tokens plus attention, PaLM's 6N + 12 L H Q T a token) over
the step's time and --peak-tflops (H200 dense BF16: 989); a transformers row
takes the FLOPs of the quads row of the same model and sizes (the same
model). A sync's bandwidth_fraction is bench_backend's: bytes (the trainer's
master read once, the rollout's copies written) over the time and the copy
bandwidth (the fp32 sync of the same run, or --copy-tb-per-s there)."""
import argparse
import json
import sys


def model_name(r):
    return "%s-%d" % (r["model"], r["layers"]) if r["model"] == "a3b" else r["model"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--commit", required=True)
    a = p.parse_args()
    rows = [json.loads(l) for l in sys.stdin if l.strip()]
    flops = {}
    for r in rows:
        if r.get("program") == "bench_backend" and r.get("op") == "train step" and "flops_per_iter" in r:
            flops[(r["model"], r["layers"], r["batch"], r["seq"])] = r["flops_per_iter"]
    for r in rows:
        op = {"train step": "train_step", "weight_sync": "weight_sync"}.get(r.get("op"))
        if op is None or (r.get("program") == "bench_torch" and op != "train_step"):
            continue
        torch = r.get("program") == "bench_torch"
        out = {"model": model_name(r), "engine": "transformers" if torch else "quads", "recipe": r["recipe"],
               "mode": "eager" if torch else r["mode"], "op": op, "status": r["status"]}
        if r["status"] != "ok":
            out["reason"] = r.get("reason", "")
        elif op == "weight_sync":
            out.update(ms=round(r["ms"], 4), bytes=int(r["bytes"]), tb_per_s=round(r["tb_per_s"], 3),
                       bandwidth_fraction=round(r["bandwidth_fraction"], 4) if "bandwidth_fraction" in r else None,
                       device_to_device=r.get("device_to_device"))
        else:
            f = flops.get((r["model"], r["layers"], r["batch"], r["seq"]))
            ms = r["ms_per_iter"]
            out.update(batch=r["batch"], seq=r["seq"], ms=round(ms, 2), tokens_per_s=round(r["tokens_per_s"], 1),
                       mfu=round(f / (ms * 1e-3) / (a.peak_tflops * 1e12), 4) if f else None)
            if torch:
                out["precision"] = r.get("precision")
        out["commit"] = a.commit
        print(json.dumps(out))


if __name__ == "__main__":
    main()
