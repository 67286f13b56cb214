#!/bin/bash
# bench/run_rl_step_h200.sh: `quads rl` steps at the paper's shape on the GPU
# machine (issue 13): where an RL step's time goes, from a tree built here and
# carried (quads, bench/bench_load, .devrun from tests/gpu/bundle_libs.sh).
#   1. the checkpoint: bench_load writes the a3b shape (Qwen3-30B-A3B's
#      layers: hidden 2048, 128 experts top-8 of width 768, 32 / 4 heads of
#      128, vocab 151936) at LAYERS [4] layers, random BF16 weights, under DIR
#      [/tmp/quads-rl-a3b]; models/tiny's tokenizer goes beside it (its ids
#      are a subset of the vocabulary: the prompts are the arith task's);
#   2. quads rl on it, RECIPE [quads], MODE [fast], STEPS [2] steps of
#      PROMPTS [16] prompts x SAMPLES [16] samples, TOKENS [1024] new tokens
#      (random weights: nearly every sample runs to the limit), trainer
#      micro-batch MICRO [8], no eval (the checkpoint quads rl writes at
#      the end is deleted after);
#   3. the split of each step from metrics.jsonl's time object: rollout,
#      the trainer's log-prob forwards (time.logprob_s), the rest of train
#      (backward and AdamW), weight sync, and each one's share; one row a step
#      appended to OUTDIR/train.jsonl (op "rl_step": model, engine, recipe,
#      mode, ms, tokens_per_s generated, and the parts).
# Sizes smaller than the paper's for a smoke test without a GPU: BACKEND=cpu
# MODE=exact MODEL_DIR=models/tiny PROMPTS=2 SAMPLES=2 TOKENS=8 (no checkpoint
# written).
#     bash bench/run_rl_step_h200.sh [OUTDIR]      (default: $OUT, else /tmp/bench_rl_step)
# COMMIT [git rev-parse --short HEAD] PYTHON [python3] QUADS [./quads] (tests/rl_step_smoke.sh runs
# the smoke test in make check)
set -u
out=${1:-${OUT:-/tmp/bench_rl_step}}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
py=${PYTHON:-python3}
L=${LAYERS:-4} dir=${DIR:-/tmp/quads-rl-a3b}
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
model=${MODEL_DIR:-}
rc=0
if [ -z "$model" ]; then
    model="$dir-L$L"
    echo "== the checkpoint: a3b x $L layers under $model (bench_load)"
    [ -x bench/bench_load ] || { echo "run_rl_step_h200: bench/bench_load not found: build it first" >&2; exit 1; }
    timeout 250 bench/bench_load --a3b-layers "$L" --shards 1 --reps 1 --dir "$model" >"$out/load.md" 2>"$out/load.err" ||
        { echo "bench_load failed: see $out/load.err"; tail -5 "$out/load.err"; exit 1; }
    cp models/tiny/tokenizer.json "$model/" || exit 1
fi
run="$out/run"
rm -rf "$run"
echo "== quads rl: ${RECIPE:-quads}, ${MODE:-fast}, ${STEPS:-2} steps of ${PROMPTS:-16} x ${SAMPLES:-16} samples, ${TOKENS:-1024} tokens"
timeout "${TIMEOUT_S:-1500}" "${QUADS:-./quads}" rl --quiet --backend "${BACKEND:-cuda}" --mode "${MODE:-fast}" \
    --set model.path="$model" --set run.dir="$run" --set run.steps="${STEPS:-2}" \
    --set rollout.recipe="${RECIPE:-quads}" --set rollout.prompts_per_step="${PROMPTS:-16}" \
    --set rollout.group_size="${SAMPLES:-16}" --set rollout.max_tokens="${TOKENS:-1024}" \
    --set trainer.micro_batch="${MICRO:-8}" --set eval.every=0 --set checkpoint.every=0 \
    --set log.tensorboard=false >"$out/rl.log" 2>&1 || { rc=1; echo "quads rl failed: see $out/rl.log"; tail -8 "$out/rl.log"; }
[ -n "${MODEL_DIR:-}" ] || rm -rf "$model"
[ -f "$run/metrics.jsonl" ] || exit 1
$py - "$run/metrics.jsonl" "$out/train.jsonl" "$commit" "$L" "${RECIPE:-quads}" "${MODE:-fast}" \
    "${MODEL_DIR:+custom}" <<'EOF' || rc=1
import json, sys
src, dst, commit, layers, recipe, mode, custom = (sys.argv[1:] + [""])[:7]
name = "custom" if custom else "a3b-%s" % layers
rows = []
print("| step | rollout s | log-prob forwards s | backward + AdamW s | weight sync s | step s | generated tok/s |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for line in open(src):
    m = json.loads(line)
    t = m.get("time", {})
    if "step_s" not in t:
        continue
    ro, tr, lp, sy, st = t["rollout_s"], t["train_s"], t["logprob_s"], t["sync_s"], t["step_s"]
    share = lambda x: "%.3f (%.0f%%)" % (x, 100 * x / st if st > 0 else 0)
    print("| %d | %s | %s | %s | %s | %.3f | %.0f |" % (m["step"], share(ro), share(lp), share(tr - lp), share(sy), st,
                                                        t.get("tokens_per_s", 0)))
    rows.append({"model": name, "engine": "quads", "recipe": recipe, "mode": mode, "op": "rl_step", "status": "ok",
                 "step": m["step"], "ms": round(1e3 * st, 3), "tokens_per_s": round(t.get("tokens_per_s", 0), 1),
                 "rollout_ms": round(1e3 * ro, 3), "logprob_ms": round(1e3 * lp, 3),
                 "train_rest_ms": round(1e3 * (tr - lp), 3), "sync_ms": round(1e3 * sy, 3), "commit": commit})
with open(dst, "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print("%d row(s) appended to %s (the first step includes the instances' first-shape work)" % (len(rows), dst))
EOF
rm -rf "$run"/step_*
exit $rc
