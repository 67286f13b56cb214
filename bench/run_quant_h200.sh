#!/bin/sh
# bench/run_quant_h200.sh: the NVFP4 quantize kernels (issue 13) on the GPU
# machine, from a tree built here and carried (tests/gpu/check_quant,
# bench/bench_quant and tests/gpu/bundle_libs.sh's .devrun/lib):
#   1. bench/bench_quant --quantize: per shape and case the new kernels beside the
#      ones before (bits compared), time, bytes moved, TB/s and the fraction of
#      the device-to-device copy bandwidth measured in the same run; its JSON
#      lines (the rows of docs/results/train-h200.jsonl) go to OUTDIR/quantize.jsonl;
#   2. tests/gpu/check_quant.sh: every quantizer against quant/ bit for bit
#      (the branch-free encoders on all 2^32 floats, the benchmark's shapes and
#      the layout edges, float32 and BF16 in, per tensor and per row, fake-quant,
#      RAC, W4A4, non-finite inputs, the numpy golden vectors).
# The table is printed last.
#     sh bench/run_quant_h200.sh [OUTDIR]        REPS [30], COMMIT [git rev-parse --short HEAD]
set -u
out=${1:-${OUT:-/tmp/bench_quant}}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
rc=0
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
echo "== bench_quant --quantize (commit $commit)"
timeout 240 bench/bench_quant "${REPS:-30}" --quantize --json "$out/quantize.jsonl" --commit "$commit" \
    >"$out/bench_quant.md" 2>"$out/bench_quant.err" || { rc=1; tail -5 "$out/bench_quant.err"; }
cat "$out/quantize.jsonl" 2>/dev/null
echo "== check_quant"
timeout 330 sh tests/gpu/check_quant.sh "$out" >"$out/check_quant.out" 2>&1 || rc=1
grep -v " yes |$" "$out/check_quant.out" | tail -25
echo
cat "$out/bench_quant.md"
echo "run_quant_h200.sh: $([ $rc = 0 ] && echo PASS || echo FAIL)"
exit $rc
