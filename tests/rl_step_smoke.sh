#!/bin/sh
# make check: bench/run_rl_step_h200.sh on the CPU with the tiny model (2
# steps of 2 prompts x 2 samples, 8 tokens): it runs, prints the step split,
# and appends one "rl_step" row a step with the rollout, the log-prob
# forwards (time.logprob_s: the script fails without it), the rest of train
# and the weight sync, none negative and summing to no more than the step. The GPU's numbers come from
# the script on the H200 at the paper's shape.
set -u
srcdir=$(cd "${srcdir:-.}" && pwd) # absolute: the script runs from the source tree's root
out=$(mktemp -d "${TMPDIR:-/tmp}/rl_step_smoke.XXXXXX") || exit 1
trap 'rm -rf "$out"' EXIT
if ! BACKEND=cpu MODE=exact RECIPE=quads MODEL_DIR="$srcdir/models/tiny" PROMPTS=2 SAMPLES=2 TOKENS=8 STEPS=2 \
    MICRO=2 COMMIT=smoke QUADS="$PWD/quads" bash "$srcdir/bench/run_rl_step_h200.sh" "$out" >"$out/stdout" 2>&1; then
    echo "rl_step_smoke: bench/run_rl_step_h200.sh failed:" >&2
    cat "$out/stdout" "$out/rl.log" >&2
    exit 1
fi
python3 - "$out/train.jsonl" <<'PY' || { cat "$out/stdout" >&2; exit 1; }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 2, rows
for r in rows:
    assert r["op"] == "rl_step" and r["status"] == "ok" and r["recipe"] == "quads" and r["commit"] == "smoke", r
    parts = [r["rollout_ms"], r["logprob_ms"], r["train_rest_ms"], r["sync_ms"]]
    assert r["rollout_ms"] > 0 and all(p >= 0 for p in parts), r
    assert sum(parts) <= r["ms"] + 1.0, r
print("rl_step_smoke: %d rl_step rows ok" % len(rows))
PY
