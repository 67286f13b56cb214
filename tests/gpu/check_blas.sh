#!/bin/sh
# On the GPU machine: the fast mode's cuBLASLt GEMMs and the experts' cuBLAS products (backends/cuda/cuda_blas)
# against exact CPU references (tests/gpu/check_blas), one table: op, shape,
# max abs error, max relative error, bound, PASS/FAIL; and the W4A4 path the
# device gets ("emulated" required on the H200). Writes the table to
# OUTDIR/check_blas.log (default $OUT, else the current directory).
#
#     bash tests/gpu/check_blas.sh [OUTDIR]
#
# Typical use: configure and build here (make tests/gpu/check_blas), then on the
# GPU machine run `bash tests/gpu/check_blas.sh "$OUT"` with the ignored binary
# tests/gpu/check_blas carried along (it is all the run needs besides the script).
#
# From a configured tree with CUDA (./configure --with-cuda-arch="90a 100a 120a").
# The program is built when it is missing (make tests/gpu/check_blas); when a
# source looks newer it is rebuilt if make can, else the existing one runs with
# a warning (the GPU machine lacks the jansson/utf8proc/curl headers: build it
# on the development machine and carry the tree, as for check_backend). It links
# the static CUDA runtime and the shared libcublasLt.so.13.
set -u
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-.}}
mkdir -p "$out"
prog=tests/gpu/check_blas
# only with the configured tree's Makefile: without one, make's built-in rule
# would "build" the program by copying this script
build() { [ -f Makefile ] && make "$prog"; }
if [ ! -x "$prog" ]; then
    build || { echo "check_blas.sh: no $prog and no configured tree to build it in"; exit 2; }
elif [ -n "$(find backends/cuda/cuda_blas.cu backends/cuda/cuda_blas.h tests/gpu/check_blas.cu \
        -newer "$prog" 2>/dev/null)" ]; then
    build >"$out/check_blas_build.log" 2>&1 ||
        echo "check_blas.sh: WARNING: sources newer than $prog and make failed" \
             "(see $out/check_blas_build.log); running the existing binary"
fi
nvidia-smi -L 2>/dev/null || true
"$prog" >"$out/check_blas.log" 2>&1
status=$?
cat "$out/check_blas.log"
[ "$status" = 0 ] && echo "check_blas.sh: PASS" || echo "check_blas.sh: FAIL (exit $status)"
exit "$status"
