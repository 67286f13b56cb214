#!/bin/sh
# On a machine with 2 or more GPUs: dist/'s NCCL communicator between real
# processes (tests/gpu/check_dist): the collectives at every world size from 2
# to the GPUs present, then a rank that exits and a rank that stalls, which the
# others must report within the timeout naming it. Logs go to OUTDIR (default
# $OUT, else the current directory). Builds the program first when it is
# missing (needs a tree configured with CUDA and NCCL).
#     tests/gpu/check_dist.sh [OUTDIR]        MB=n for the all-reduce size (default 64)
set -u
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-.}}
mkdir -p "$out"
[ -x tests/gpu/check_dist ] || make tests/gpu/check_dist || exit 2
nvidia-smi -L 2>/dev/null || true
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$ngpu" -lt 2 ]; then
    echo "check_dist.sh: $ngpu GPU(s): needs 2 or more"
    exit 2
fi
status=0
w=2
while [ "$w" -le "$ngpu" ]; do
    tests/gpu/check_dist --spawn "$w" --mb "${MB:-64}" >"$out/check_dist_w$w.log" 2>&1 || status=1
    cat "$out/check_dist_w$w.log"
    w=$((w * 2))
done
for f in exit hang; do
    tests/gpu/check_dist --spawn 2 --fail "$f" --timeout 5 >"$out/check_dist_fail_$f.log" 2>&1 || status=1
    cat "$out/check_dist_fail_$f.log"
done
[ "$status" = 0 ] && echo "check_dist.sh: PASS" || echo "check_dist.sh: FAIL"
exit "$status"
