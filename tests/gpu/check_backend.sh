#!/bin/sh
# On the GPU machine: the CUDA backend's forward against the CPU backend's, bit
# for bit (tests/gpu/check_backend), for the five test checkpoints and
# models/tiny; prints the table and writes it to OUTDIR/check_backend.log
# (default $OUT, else the current directory). Builds the program first when
# it is missing (needs a configured tree).
#     tests/gpu/check_backend.sh [OUTDIR]
set -u
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-.}}
mkdir -p "$out"
[ -x tests/gpu/check_backend ] || make tests/gpu/check_backend || exit 2
nvidia-smi -L 2>/dev/null || true
tests/gpu/check_backend >"$out/check_backend.log" 2>&1
status=$?
cat "$out/check_backend.log"
[ "$status" = 0 ] && echo "check_backend.sh: PASS" || echo "check_backend.sh: FAIL"
exit "$status"
