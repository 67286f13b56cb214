#!/bin/bash
# bench/ab_decode_h200.sh: the decode kernels' variants side by side on the
# GPU machine (issue 12): bench/ab_train_h200.sh with OP=rollout (its comment
# has the settings: B, P, M, MODE, RECIPE, VARIANTS, ROUNDS, PROFILE).
#     bash bench/ab_decode_h200.sh [OUTDIR]      (default: $OUT, else /tmp/ab_decode)
out=${1:-${OUT:-/tmp/ab_decode}}
OP=rollout exec bash "$(dirname "$0")/ab_train_h200.sh" "$out"
