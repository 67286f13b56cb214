#!/bin/bash
# bench/run_h200.sh: the issue-6 benchmark on the GPU machine, in under 4 minutes.
#
# In a tree configured and built with the CUDA backend (./configure
# --with-cuda-arch=90a && make bench/bench_backend; on the development box, then
# carried, with tests/gpu/bundle_libs.sh's .devrun/lib), run
#     bench/run_h200.sh [OUTDIR]            (default: $OUT, else /tmp/bench_h200)
# It runs, in this order, each under its own time cap (seconds, in brackets)
# and all together under BUDGET_S:
#   1. bench_torch.py, tiny model [30]   (PyTorch + transformers baseline, bf16)
#   2. bench_torch.py, moe8 [50]
#   3. bench_backend --backend cuda, moe8, exact mode [45]   (--vs the torch rows)
#   4. bench_backend --backend cuda, moe8, fast mode [45]
#   5. bench_backend --backend cuda, tiny, exact mode [20]
#   6. bench_backend --backend cuda, tiny, fast mode [20]
#   7. bench_backend --backend cpu, tiny, exact mode [25] (the host's cores, for comparison)
# and prints every table again at the end. Logs, tables and JSON lines go to
# OUTDIR (all.jsonl: every row of every run). A recipe or op a backend does not
# have is an "n/a" row with the backend's reason; a step cut by its cap lists
# the rows it had finished (bench_backend logs each on stderr).
#
# Sizes are environment variables (defaults in brackets):
#   TINY_B [16] TINY_T [128] TINY_P [32] TINY_M [64] TINY_ITERS [5]
#   MOE_B [8] MOE_T [256] MOE_P [64] MOE_M [64] MOE_ITERS [2] MOE_LAYERS [8]
#   WARMUP [1] RECIPES [bf16,fp8,nvfp4,quads] MODES [exact fast] BUDGET_S [225]
#   CAP_SCALE [1] (multiplies every cap)
#   BUILD [.] (the build tree holding bench/bench_backend; relative to the source root) PYTHON [python3]
#   TORCH_DEVICE [cuda] (cpu: a smoke test of the script where there is no GPU)
#   TORCH_TRAIN [master] (bench_torch.py --train-precision: master, autocast or bf16)
# The size lists ($tiny, $moe) and $(vs ...) are meant to split into words:
# shellcheck disable=SC2086,SC2046
set -u

out=${1:-${OUT:-/tmp/bench_h200}}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
build=${BUILD:-.}
bb=$build/bench/bench_backend
py=${PYTHON:-python3}
recipes=${RECIPES:-bf16,fp8,nvfp4,quads}
modes=${MODES:-exact fast}
warmup=${WARMUP:-1}
budget=${BUDGET_S:-225}
scale=${CAP_SCALE:-1}
tdev=${TORCH_DEVICE:-cuda}
ttrain=${TORCH_TRAIN:-master}
tiny="--model tiny --batch ${TINY_B:-16} --seq ${TINY_T:-128} --prompt ${TINY_P:-32} --new-tokens ${TINY_M:-64}
      --iters ${TINY_ITERS:-5} --warmup $warmup"
moe="--model moe8 --layers ${MOE_LAYERS:-8} --batch ${MOE_B:-8} --seq ${MOE_T:-256} --prompt ${MOE_P:-64}
     --new-tokens ${MOE_M:-64} --iters ${MOE_ITERS:-2} --warmup $warmup"

if [ ! -x "$bb" ]; then
    echo "run_h200: $bb not found: build it first (./configure --with-cuda-arch=90a && make bench/bench_backend)" >&2
    exit 1
fi
if [ ! -f models/tiny/config.json ]; then
    echo "run_h200: models/tiny/config.json not found beside bench/" >&2
    exit 1
fi

# shellcheck source=bench/steps.sh
. bench/steps.sh

# vs MODEL: the --vs option naming the torch rows of MODEL, if that step wrote them
vs() {
    [ -s "$out/torch_$1.jsonl" ] && echo "--vs $out/torch_$1.jsonl"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
echo "host: $(nproc) cores; output in $out"
echo

step torch_tiny 30 "$py" bench/bench_torch.py $tiny --device "$tdev" --train-precision "$ttrain" \
    --json "$out/torch_tiny.jsonl"
step torch_moe8 50 "$py" bench/bench_torch.py $moe --device "$tdev" --train-precision "$ttrain" \
    --json "$out/torch_moe8.jsonl"
for mode in $modes; do
    step "cuda_moe8_$mode" 45 "$bb" --backend cuda --mode "$mode" --recipe "$recipes" $moe \
        $(vs moe8) --json "$out/cuda_moe8_$mode.jsonl"
done
for mode in $modes; do
    step "cuda_tiny_$mode" 20 "$bb" --backend cuda --mode "$mode" --recipe "$recipes" $tiny \
        $(vs tiny) --json "$out/cuda_tiny_$mode.jsonl"
done
step cpu_tiny_exact 25 "$bb" --backend cpu --mode exact --recipe "$recipes" $tiny \
    $(vs tiny) --json "$out/cpu_tiny_exact.jsonl"

for t in "${tables[@]}"; do
    [ -f "$out/$t.jsonl" ] && cat "$out/$t.jsonl"
done >"$out/all.jsonl"
echo "================ all tables ($(($(date +%s) - start)) s) ================"
for t in "${tables[@]}"; do
    echo "== $t"
    cat "$out/$t.txt"
    echo
done
exit $failed
