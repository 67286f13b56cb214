#!/bin/bash
# bench/probe_experts_h200.sh: one GPU call's worth of evidence on the experts'
# W4A4 product (issue 12), from a tree built here and carried (bench/bench_quant,
# bench/bench_backend, tests/gpu/check_ops, .devrun from tests/gpu/bundle_libs.sh):
#   1. bench/bench_quant --moe: the grouped product at a3b's shapes, two blocks an
#      MMA beside one, bits compared (exit 1 where they differ), with the default
#      CTAs and with 1-warp CTAs (QUADS_MMA_WARPS=1);
#   2. tests/gpu/check_ops 1 with the MMA kernel's configurations (two blocks an MMA
#      or one, 2 / 8 row tiles forced, no decode kernel): CUDA against the CPU;
#   3. the warp-stall reasons of the experts' kernel in an a3b-4 exact decode at
#      batch B [64] (bench/profile_decode_h200.sh STALL=w4a4_mma_kernel);
#   4. a3b-4 exact nvfp4 and quads rollouts at batch B, 64 new tokens and 1 (the
#      prefill), two blocks an MMA and one.
#     bench/probe_experts_h200.sh [OUTDIR]
set -u -o pipefail
out=${1:-${OUT:-/tmp/probe_experts}}
mkdir -p "$out" || exit 1
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
# the MMA kernel is what this probes: since f7b4f30 decode's experts at batch
# 16-64 take the streaming kernel by default (bench_quant --moe sets its own)
export QUADS_W4A4_STREAM=0
rc=0
echo "== bench_quant --moe"
timeout 150 bench/bench_quant 20 --moe | tail -12 || rc=1
echo "== bench_quant --moe, 1-warp CTAs"
QUADS_MMA_WARPS=1 timeout 150 bench/bench_quant 20 --moe | tail -10 || rc=1
for e in "QUADS_W4A4_PAIR=1" "QUADS_W4A4_PAIR=0" "QUADS_W4A4_NT_GROUPED=2 QUADS_W4A4_NT=2 QUADS_MMA_WARPS=4" \
    "QUADS_W4A4_NT_GROUPED=8 QUADS_W4A4_NT=8 QUADS_MMA_WARPS=4" "QUADS_W4A4_DEC=0 QUADS_MMA_WARPS=1"; do
    # shellcheck disable=SC2086
    env $e timeout 150 tests/gpu/check_ops 1 >"$out/check_ops.log" 2>&1 || rc=1
    echo "== check_ops 1, $e: $(tail -1 "$out/check_ops.log")"
done
echo "== stall reasons of w4a4_mma_kernel (batch ${B:-64})"
STALL=w4a4_mma_kernel B=${B:-64} bash bench/profile_decode_h200.sh "$out/profile" | tail -24
for p in 1 0; do
    for m in 64 1; do
        echo "== a3b-4 exact, batch ${B:-64}, $m new tokens, QUADS_W4A4_PAIR=$p"
        QUADS_W4A4_PAIR=$p timeout 120 bench/bench_backend --backend cuda --mode exact --recipes nvfp4,quads --model a3b \
            --layers 4 --batch "${B:-64}" --prompt 128 --new-tokens $m --iters 2 --warmup 1 --ops rollout 2>&1 | tail -2 || rc=1
    done
done
exit $rc
