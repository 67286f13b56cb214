#!/bin/sh
# On the GPU machine, from a tree built on the development box and carried
# over (the device tool's `carry`): the whole CUDA check in one call.
#   1. tests/gpu/check_backend: every op, recipe and role, CUDA vs CPU, bit for bit;
#   2. `quads rl` (the default config) on the CPU and on the CUDA backend, exact
#      mode, and a comparison of the two metrics.jsonl (timings aside).
# quads needs shared libraries the GPU machine lacks (utf8proc, ...): the
# caller carries them in .devrun/lib (tests/gpu/bundle_libs.sh makes it).
#     sh tests/gpu/run_all.sh [OUTDIR]
set -u
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-.}}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
nvidia-smi -L 2>/dev/null || true
rc=0
echo "== check_backend"
timeout 300 tests/gpu/check_backend >"$out/check_backend.log" 2>"$out/check_backend.err" || rc=1
grep -v " yes$" "$out/check_backend.log" | head -40
tail -3 "$out/check_backend.err"
echo "== quads rl: cpu and cuda, exact mode"
for b in cpu cuda; do
    /usr/bin/time -f "$b rl: %e s" ./quads rl --quiet --set rollout.backend=$b --set run.dir="$out/rl_$b" \
        >"$out/rl_$b.log" 2>&1 || { rc=1; tail -5 "$out/rl_$b.log"; }
    tail -2 "$out/rl_$b.log"
done
python3 tests/gpu/compare_metrics.py "$out/rl_cpu/metrics.jsonl" "$out/rl_cuda/metrics.jsonl" || rc=1
echo "run_all.sh: $([ $rc = 0 ] && echo PASS || echo FAIL)"
exit $rc
