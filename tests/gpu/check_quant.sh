#!/bin/sh
# On the GPU machine: backends/cuda against quant/ bit for bit (tests/gpu/check_quant),
# then the numpy + ml_dtypes golden vectors regenerated and compared by sha256
# with the committed fixture. Logs go to OUTDIR (default $OUT, else the current
# directory). Builds the program first when it is missing (needs a configured tree).
#     tests/gpu/check_quant.sh [OUTDIR]        ROWS=n to shrink the random tensors
set -u
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-.}}
mkdir -p "$out"
[ -x tests/gpu/check_quant ] || make tests/gpu/check_quant || exit 2
status=0

nvidia-smi -L 2>/dev/null || true
tests/gpu/check_quant "${ROWS:-4096}" tests/fixtures/nvfp4_golden.bin >"$out/check_quant.log" 2>&1 || status=1
cat "$out/check_quant.log"

fixture=tests/fixtures/nvfp4_golden.bin
if [ -f "$fixture" ]; then
    tmp=$(mktemp -d)
    if python3 tests/ref/nvfp4_golden.py "$tmp/golden.bin" >"$out/golden.log" 2>&1; then
        want=$(sha256sum "$fixture" | cut -d' ' -f1)
        got=$(sha256sum "$tmp/golden.bin" | cut -d' ' -f1)
        if [ "$want" = "$got" ]; then
            echo "golden vectors regenerated here: sha256 $got equals the fixture's"
        else
            echo "golden vectors regenerated here: sha256 $got, fixture $want: DIFFERENT"
            status=1
        fi
    else
        echo "tests/ref/nvfp4_golden.py failed:"; cat "$out/golden.log"
        status=1
    fi
    rm -rf "$tmp"
fi
[ "$status" = 0 ] && echo "check_quant.sh: PASS" || echo "check_quant.sh: FAIL"
exit "$status"
