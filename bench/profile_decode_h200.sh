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
# DSKIP [40]; STALL (a regex too) ncu's warp-state (stall reasons) and scheduler
# sections with occupancy, for one launch after SSKIP [300]; SRC (a regex)
# ncu's instruction mix (InstructionStats) and the kernel's SASS with each
# instruction's executed count and stall samples, with the CUDA line it comes
# from (Makefile.am builds with -lineinfo), for one launch after SSKIP, into
# ncu_source.csv (the lines with most samples printed).
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
    # ncu's WarpStateStats and SchedulerStats sections (their metric names
    # differ between ncu versions: the sections do not; a metric regex failed on
    # the H200/H100 machines' ncu on 2026-12-05)
    # shellcheck disable=SC2086
    timeout 200 ncu --clock-control none -k regex:"$STALL" --launch-skip "${SSKIP:-300}" --launch-count 1 \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
        $run >"$out/ncu_stall.txt" 2>&1
    grep -iE "^  [a-zA-Z_].*\(|stall|Warp Cycles|Issued Warp|Eligible|Active Warps|Registers|Achieved Occ|Theoretical Occ|Duration" \
        "$out/ncu_stall.txt" | cut -c1-150 | head -40
fi
if [ -n "${SRC:-}" ]; then
    # shellcheck disable=SC2086
    timeout 200 ncu --clock-control none -k regex:"$SRC" --launch-skip "${SSKIP:-300}" --launch-count 1 \
        --section InstructionStats --section SourceCounters --section WarpStateStats $run >"$out/ncu_mix.txt" 2>&1
    grep -vE "^==|^ *-+ *-+" "$out/ncu_mix.txt" | grep -A60 "Section: Instruction Statistics" | cut -c1-150 | head -40
    # shellcheck disable=SC2086
    timeout 200 ncu --clock-control none -k regex:"$SRC" --launch-skip "${SSKIP:-300}" --launch-count 1 \
        --section SourceCounters --section WarpStateStats --page source --print-source cuda,sass --csv \
        $run >"$out/ncu_source.csv" 2>&1 || echo "ncu --page source failed: see $out/ncu_source.csv"
    wc -l "$out/ncu_source.csv"
fi
