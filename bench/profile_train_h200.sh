#!/bin/bash
# bench/profile_train_h200.sh: where a train step's time goes (issue 13), per
# phase and per kernel, on the GPU machine, in under 5 minutes, from a tree
# built here and carried (bench/bench_backend, .devrun from
# tests/gpu/bundle_libs.sh). MODEL [a3b] (bench/run_train_h200.sh; or moe8) at LAYERS
# [4; moe8: 8], B [16] x T [1024] tokens, MODE [fast], RECIPE [nvfp4]: one train step
# (zero_grad, forward, backward, AdamW with the weight sync), no warm-up.
#   1. phases.txt [60 s]: the CUDA backend's wall time per phase
#      (QUADS_CUDA_PROFILE=last: the timed step after one warm-up step, so
#      cuBLAS's first-shape heuristics stay out; it synchronizes at each mark)
#      and the step's time;
#   2. kernels.txt [220 s]: ncu over the same run, COUNT [40000] launches after
#      SKIP [0] at the clocks the GPU runs at (--clock-control none), one line
#      per kernel and grid, largest total first, then the sum of them all. The
#      instance's setup (weight init, its first sync) is counted too: its
#      kernels are the quantizers, the copies and the initializers; once its
#      launch count is known, SKIP leaves it out.
# DETAIL (a regex of kernel names, e.g. 'sm90_xmma|k_attend') adds ncu's speed
# of light, occupancy and warp-stall sections for DCOUNT [3] of its launches
# after DSKIP [40].
#     bash bench/profile_train_h200.sh [OUTDIR]     (default: $OUT, else /tmp/profile_train)
set -u
out=${1:-${OUT:-/tmp/profile_train}}
mkdir -p "$out" || exit 1
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
[ -x bench/bench_backend ] || { echo "profile_train_h200: bench/bench_backend not found: build it first" >&2; exit 1; }
model=${MODEL:-a3b}
layers=${LAYERS:-$([ "$model" = moe8 ] && echo 8 || echo 4)}
run=(bench/bench_backend --backend cuda --mode "${MODE:-fast}" --recipe "${RECIPE:-nvfp4}" --model "$model"
     --layers "$layers" --batch "${B:-16}" --seq "${T:-1024}" --iters 1 --ops "train step")
echo "== phases (QUADS_CUDA_PROFILE=last, one warm-up step): ${run[*]} --warmup 1"
QUADS_CUDA_PROFILE=last timeout 60 "${run[@]}" --warmup 1 >"$out/phases.txt" 2>&1 ||
    echo "the phase run failed: see $out/phases.txt"
grep -v "^$" "$out/phases.txt" | tail -25
echo "== kernels (ncu)"
timeout 220 ncu --clock-control none --launch-skip "${SKIP:-0}" --launch-count "${COUNT:-40000}" --print-summary per-kernel \
    --metrics gpu__time_duration.sum "${run[@]}" --warmup 0 >"$out/ncu_kernels.txt" 2>&1 ||
    echo "ncu failed or timed out (COUNT lower?): see $out/ncu_kernels.txt"
# one line a kernel and grid (bench/ncu_table.awk), largest total first; then the sum
grep -E "^  [a-zA-Z_]|gpu__time_duration" "$out/ncu_kernels.txt" | paste - - | awk -f bench/ncu_table.awk |
    sort -g -r >"$out/kernels.txt"
sum=$(awk '{ t += $1; n += $4 } END { printf "%10.1f us total %6d launches: all kernels", t, n }' "$out/kernels.txt")
echo "$sum" >>"$out/kernels.txt"
head -40 "$out/kernels.txt"
tail -1 "$out/kernels.txt"
if [ -n "${DETAIL:-}" ]; then
    timeout 200 ncu --clock-control none -k regex:"$DETAIL" --launch-skip "${DSKIP:-40}" --launch-count "${DCOUNT:-3}" \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        --section MemoryWorkloadAnalysis "${run[@]}" >"$out/ncu_detail.txt" 2>&1
    grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issued Warp|Grid Size|Shared Memory Per Block|Stall" \
        "$out/ncu_detail.txt" | cut -c1-150 | head -80
fi
