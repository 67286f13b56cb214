#!/bin/bash
# bench/run_decode_h200.sh: the rollout engine's benchmark (issue 12) on the GPU
# machine, from a tree built here and carried (bench/bench_backend and
# tests/gpu/bundle_libs.sh's .devrun/lib).
#
# The model: "a3b", Qwen3-30B-A3B's layer shapes (hidden 2048, 128 experts
# top-8 of width 768, 32 / 4 heads of 128, vocab 151936) at LAYERS depth [4],
# random weights (bench_backend.c a3b_config; bench_torch.py a3b_config builds
# the same shape for transformers). Rollout: B prompts of P tokens, M new
# tokens, temperature 1, no top-k/top-p, no stop (every row gets M tokens).
#   1. transformers eager (bf16) on the same shape and sizes (bench_torch.py);
#   2. bench_backend --backend cuda, recipes RECIPES, each mode of MODES.
# Rows go to OUTDIR/decode.jsonl (bench/decode_rows.py: engine, recipe, mode,
# batch, prompt, new_tokens, tokens_per_s, step_ms, roofline_fraction, ratio
# to transformers, commit; vs_nvfp4: a recipe's tokens/s over nvfp4's in the
# same process, the median over REPEAT processes), the tables to OUTDIR/*.md.
#     bench/run_decode_h200.sh [OUTDIR]
# Sizes: LAYERS [4] B [64] P [128] M [64] ITERS [2] WARMUP [1] REPEAT [1] (processes
#        a mode; decode_rows.py keeps the median row: B=1 REPEAT=3, batch 1
#        spreads ~10% between processes)
#        COMMIT [git rev-parse --short HEAD: set it where the copy's .git is stale]
#        RECIPES [bf16,fp8,nvfp4,quads] MODES [exact fast] COPY_TBS (device-to-device
#        copy bandwidth, TB/s, the roofline's: unset, measured on this GPU by
#        `bench/bench_quant --copy`, else the H200's 4.24 of DEVICE.md) PYTHON [python3]
# LONG=1: instead, the issue's row alone: all 48 layers of a3b as one rollout
#        instance on one H200 (lean: NVFP4 codes, the float tensors, a float32
#        KV cache; qd_backend_plan 117.2 GiB nvfp4, 121.6 GiB quads), B 64, P 128,
#        M 8192, one timed iteration, recipes LONG_RECIPES [nvfp4,quads], mode
#        exact, within LONG_TIMEOUT [3000] s; the weights are made tensor by
#        tensor (bench_backend's fill), so the host needs ~1.3 GB for them. The
#        plan is printed first (OUTDIR/long_plan.md); OUTDIR/long.err says when
#        an instance's weights are set (its plan against the device's free
#        bytes, the KV cache and activations are then made by the generate);
#        the rows go to OUTDIR/long.jsonl and OUTDIR/decode_long.jsonl. 8,192
#        decode steps of 48 layers take far longer than the 4-layer rows: run
#        it in the background and poll long.err, where bench_backend writes a
#        line at every 512th step (steps done, seconds, ms a step since the
#        line before), so a run cut off by LONG_TIMEOUT still tells its pace.
#        On the H200 on 2026-12-06 (9f3a76c) the nvfp4 instance's plan was
#        117.8 GB with 139.3 GB free, its weights were set within a minute,
#        and its generate had not finished 8,192 steps after ~420 s more.
# shellcheck disable=SC2086
set -u
out=${1:-${OUT:-/tmp/bench_decode}}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
py=${PYTHON:-python3}
L=${LAYERS:-4} B=${B:-64} P=${P:-128} M=${M:-64}
sizes="--model a3b --layers $L --batch $B --prompt $P --new-tokens $M --iters ${ITERS:-2} --warmup ${WARMUP:-1}"
rc=0
# the roofline's copy bandwidth: this GPU's (an H100's HBM is ~30% slower than
# the H200's), unless COPY_TBS says otherwise
if [ -z "${COPY_TBS:-}" ] && [ -x bench/bench_quant ]; then
    COPY_TBS=$(timeout 60 bench/bench_quant --copy 2>/dev/null | awk '$1 == "copy_tbs" && $2 > 0 { print $2 }')
fi
COPY_TBS=${COPY_TBS:-4.24}
echo "== roofline: device-to-device copy $COPY_TBS TB/s"
if [ "${LONG:-0}" = 1 ]; then
    long="--model a3b --layers 48 --batch 64 --prompt 128 --new-tokens 8192 --recipes ${LONG_RECIPES:-nvfp4,quads} --ops rollout"
    echo "== quads cuda exact, a3b x 48 layers, B 64, P 128, M 8192 (one H200, rollout instance)"
    bench/bench_backend $long --plan-only | tee "$out/long_plan.md" || exit 1
    timeout "${LONG_TIMEOUT:-3000}" bench/bench_backend --backend cuda --mode exact $long --iters 1 --warmup 0 \
        --json "$out/long.jsonl" >"$out/long.md" 2>"$out/long.err" || { rc=1; tail -5 "$out/long.err"; }
    cat "$out/long.md"
    $py bench/decode_rows.py --layers 48 --copy-tbs "$COPY_TBS" \
        --commit "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" <"$out/long.jsonl" \
        >"$out/decode_long.jsonl" || rc=1
    cat "$out/decode_long.jsonl"
    exit $rc
fi
echo "== transformers eager, a3b x $L layers, B $B, P $P, M $M"
timeout 300 $py bench/bench_torch.py $sizes --ops rollout --json "$out/torch.jsonl" >"$out/torch.md" 2>"$out/torch.err" ||
    { rc=1; tail -5 "$out/torch.err"; }
cat "$out/torch.md"
for mode in ${MODES:-exact fast}; do
    for k in $(seq 1 "${REPEAT:-1}"); do
        echo "== quads cuda $mode (process $k)"
        timeout 400 bench/bench_backend --backend cuda --mode "$mode" --recipes "${RECIPES:-bf16,fp8,nvfp4,quads}" \
            --ops rollout $sizes --json "$out/quads_$mode.$k.jsonl" --vs "$out/torch.jsonl" \
            >"$out/quads_$mode.$k.md" 2>"$out/quads_$mode.$k.err" || { rc=1; tail -5 "$out/quads_$mode.$k.err"; }
        cat "$out/quads_$mode.$k.md"
    done
done
cat "$out"/torch.jsonl "$out"/quads_*.jsonl 2>/dev/null |
    $py bench/decode_rows.py --layers "$L" --copy-tbs "$COPY_TBS" \
        --commit "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" >"$out/decode.jsonl" || rc=1
cat "$out/decode.jsonl"
exit $rc
