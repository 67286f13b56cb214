#!/bin/bash
# bench/run_train_h200.sh: the trainer's benchmark (issue 13) on the GPU
# machine, from a tree built here and carried (bench/bench_backend,
# tests/gpu/check_ops and tests/gpu/bundle_libs.sh's .devrun/lib), in under 9
# minutes. Each step runs under its own cap (seconds, in brackets, times
# CAP_SCALE) and all together under BUDGET_S [520]:
#   0. tests/gpu/check_ops 1 [60]: every op CUDA vs CPU, the grouped weight
#      quantize (nvfp4_quantize_weights) among them, before anything is timed;
#   1. the weight sync of a3b (Qwen3-30B-A3B's layer shapes) at LAYERS [4]
#      (3.1B parameters): bench_backend --ops "weight sync", a trainer and a
#      lean rollout on the H200, qd_backend_sync_from timed per recipe of
#      SYNC_RECIPES [fp32,bf16,fp8,nvfp4,quads] (fp32: a copy of the master,
#      the copy bandwidth the others are a fraction of; COPY_TBS overrides it),
#      SYNC_ITERS [5] [100];
#   2. train steps (zero_grad, forward, backward, AdamW with the sync) of a3b
#      at LAYERS, B [16] x T [1024] tokens (planned 107 GB for the trainer),
#      recipes TRAIN_RECIPES [bf16,fp8,nvfp4,quads] (the issue asks for every recipe), exact [120] then fast [80];
#   3. transformers eager (bench_torch.py, bf16 weights, fp32 master AdamW) on
#      the same a3b shape and batch [90];
#   4. moe8 (8 layers, hidden 1024, 32 experts top-4), MOE_B [16] x MOE_T
#      [1024], exact [45] and fast [35], and transformers on it [45].
# ITERS [2] WARMUP [1] for the train steps. The rows (bench/train_rows.py:
# model, engine, recipe, mode, op "train_step" / "weight_sync", tokens_per_s
# or ms, mfu over 989 TFLOP/s or bandwidth_fraction, commit) are appended to
# OUTDIR/train.jsonl; tables and logs in OUTDIR; every table printed at the end.
#     bash bench/run_train_h200.sh [OUTDIR]       (default: $OUT, else /tmp/bench_train)
# COMMIT [git rev-parse --short HEAD] PYTHON [python3]; a smoke test of the
# script without a GPU: BACKEND=cpu TORCH_DEVICE=cpu CHECK=0 with small sizes
# (LAYERS=1 B=1 T=16 MOE_B=1 MOE_T=16).
# The size lists are meant to split into words:
# shellcheck disable=SC2086
set -u
out=${1:-${OUT:-/tmp/bench_train}}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
py=${PYTHON:-python3}
bb=bench/bench_backend
be=${BACKEND:-cuda}
tdev=${TORCH_DEVICE:-cuda}
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
budget=${BUDGET_S:-520}
scale=${CAP_SCALE:-1}
L=${LAYERS:-4}
it="--iters ${ITERS:-2} --warmup ${WARMUP:-1}"
a3b="--model a3b --layers $L --batch ${B:-16} --seq ${T:-1024}"
moe="--model moe8 --batch ${MOE_B:-16} --seq ${MOE_T:-1024}"
tr=(--recipes "${TRAIN_RECIPES:-bf16,fp8,nvfp4,quads}" --ops "train step" --peak-tflops 989 --commit "$commit")
copy=()
[ -n "${COPY_TBS:-}" ] && copy=(--copy-tb-per-s "$COPY_TBS")

for f in "$bb" $([ "${CHECK:-1}" = 1 ] && echo tests/gpu/check_ops); do
    [ -x "$f" ] || { echo "run_train_h200: $f not found: build it first (./configure --with-cuda-arch=90a && make)" >&2; exit 1; }
done

# shellcheck source=bench/steps.sh
. bench/steps.sh
step_show() { grep -v "bits equal\|within" "$1" | tail -40; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
echo "host: $(nproc) cores; commit $commit; output in $out"
"$bb" $a3b --ops "train step,weight sync" --recipes "${SYNC_RECIPES:-fp32,bf16,fp8,nvfp4,quads}" --plan-only \
    >"$out/plan.md" 2>&1
cat "$out/plan.md"

[ "${CHECK:-1}" = 1 ] && step check_ops 60 tests/gpu/check_ops 1
step sync_a3b 100 "$bb" --backend "$be" --mode exact --model a3b --layers "$L" --ops "weight sync" \
    --recipes "${SYNC_RECIPES:-fp32,bf16,fp8,nvfp4,quads}" --iters "${SYNC_ITERS:-5}" --warmup 1 "${copy[@]}" \
    --commit "$commit" --json "$out/sync_a3b.jsonl"
step train_a3b_exact 120 "$bb" --backend "$be" --mode exact $a3b $it "${tr[@]}" --json "$out/train_a3b_exact.jsonl"
step torch_a3b 90 "$py" bench/bench_torch.py $a3b $it --device "$tdev" --ops "train step" --json "$out/torch_a3b.jsonl"
step train_moe8_exact 45 "$bb" --backend "$be" --mode exact $moe $it "${tr[@]}" --json "$out/train_moe8_exact.jsonl"
step train_a3b_fast 80 "$bb" --backend "$be" --mode fast $a3b $it "${tr[@]}" --json "$out/train_a3b_fast.jsonl"
step train_moe8_fast 35 "$bb" --backend "$be" --mode fast $moe $it "${tr[@]}" --json "$out/train_moe8_fast.jsonl"
step torch_moe8 45 "$py" bench/bench_torch.py $moe $it --device "$tdev" --ops "train step" --json "$out/torch_moe8.jsonl"

for t in "${tables[@]}"; do
    [ -f "$out/$t.jsonl" ] && cat "$out/$t.jsonl"
done |
    "$py" bench/train_rows.py --commit "$commit" >"$out/rows.new" || failed=1
cat "$out/rows.new" >>"$out/train.jsonl"
echo "================ rows appended to $out/train.jsonl ($(($(date +%s) - start)) s) ================"
cat "$out/rows.new"
rm -f "$out/rows.new"
for t in "${tables[@]}"; do
    [ "$t" = check_ops ] && continue
    echo "== $t"
    cat "$out/$t.txt"
    echo
done
exit $failed
