#!/bin/bash
# bench/profile_decode_h200.sh: where a decode step's time goes, per kernel, on
# the GPU machine (ncu), from a tree built here and carried (bench/bench_backend,
# .devrun from tests/gpu/bundle_libs.sh). The a3b model (bench/run_decode_h200.sh)
# at LAYERS [4], batch B [64], prompt 128, 64 new tokens, MODE [exact], RECIPE
# [nvfp4]: ncu skips the weight setup and prefill (SKIP [9000] launches) and
# times COUNT [800] launches of the decode steps at the clocks the GPU runs at
# (--clock-control none), one line per kernel and grid;
# DETAIL (a regex of kernel names, e.g. 'w4a4_mma_kernel') adds ncu's speed of
# light, occupancy and warp-stall sections for DCOUNT [3] of its launches after
# DSKIP [40]; STALL (a regex too) the cycles a warp spends stalled an issued
# instruction, by reason (ncu's smsp__average_warp_latency_issue_stalled_*), with
# the warps active and the issue rate a scheduler, for one launch after SSKIP [300].
#     bench/profile_decode_h200.sh [OUTDIR]
set -u
out=${1:-${OUT:-/tmp/profile_decode}}
mkdir -p "$out" || exit 1
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
run="bench/bench_backend --backend cuda --mode ${MODE:-exact} --recipe ${RECIPE:-nvfp4} --model a3b --layers ${LAYERS:-4}
     --prompt 128 --new-tokens 64 --iters 1 --warmup 0 --ops rollout --batch ${B:-64}"
# shellcheck disable=SC2086
timeout 300 ncu --clock-control none --launch-skip "${SKIP:-9000}" --launch-count "${COUNT:-800}" --print-summary per-kernel \
    --metrics gpu__time_duration.sum $run >"$out/ncu_kernels.txt" 2>&1 || echo "ncu failed: see $out/ncu_kernels.txt"
# one line a kernel and grid: launches, mean us, total us; largest total first
grep -E "^  [a-zA-Z_]|gpu__time_duration" "$out/ncu_kernels.txt" | paste - - |
    awk -f bench/ncu_table.awk | sort -g -r | tee "$out/kernels.txt"
if [ -n "${DETAIL:-}" ]; then
    # shellcheck disable=SC2086
    timeout 200 ncu --clock-control none -k regex:"$DETAIL" --launch-skip "${DSKIP:-40}" --launch-count "${DCOUNT:-3}" --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis $run >"$out/ncu_detail.txt" 2>&1
    grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issued Warp|Grid Size|Shared Memory Per Block|Stall" \
        "$out/ncu_detail.txt" | cut -c1-150 | head -80
fi
if [ -n "${STALL:-}" ]; then
    # shellcheck disable=SC2086
    timeout 200 ncu --clock-control none -k regex:"$STALL" --launch-skip "${SSKIP:-300}" --launch-count 1 \
        --metrics regex:smsp__average_warp_latency_issue_stalled_.*_per_warp_active.ratio,smsp__warps_active.avg.per_cycle_active,smsp__issue_active.avg.per_cycle_active,gpu__time_duration.sum \
        $run >"$out/ncu_stall.txt" 2>&1
    # the reasons above 0.05 cycles, largest first
    grep -E "stalled_|warps_active|issue_active|gpu__time" "$out/ncu_stall.txt" |
        sed 's/smsp__average_warp_latency_issue_stalled_//; s/_per_warp_active.ratio//' |
        awk '$NF + 0 > 0.05' | sort -k3 -g -r | head -20
fi
