#!/bin/sh
# On the GPU machine: the CUDA backend against the CPU backend
# (tests/gpu/check_backend): every op of the backend interface, every recipe,
# both roles, exact mode bit for bit and fast mode within its stated bounds,
# for the five test checkpoints and models/tiny; prints the table and writes
# it to OUTDIR/check_backend.log (default $OUT, else the current directory).
# Builds the program first when it is missing (needs a configured tree).
# tests/gpu/run_all.sh runs this and the rest of the GPU checks in one call.
#     tests/gpu/check_backend.sh [OUTDIR]
set -u
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-.}}
mkdir -p "$out"
[ -x tests/gpu/check_backend ] || { [ -f Makefile ] && make tests/gpu/check_backend; } || exit 2
nvidia-smi -L 2>/dev/null || true
tests/gpu/check_backend >"$out/check_backend.log" 2>&1
status=$?
cat "$out/check_backend.log"
[ "$status" = 0 ] && echo "check_backend.sh: PASS" || echo "check_backend.sh: FAIL"
exit "$status"
