#!/bin/bash
# bench/run_load_h200.sh: checkpoint loading on the GPU machine (issue 16), from a
# tree built here and carried (bench/bench_load, quads and tests/gpu/bundle_libs.sh's
# .devrun/lib).
#
# The checkpoint: the a3b shape of bench_backend (Qwen3-30B-A3B's layers: hidden
# 2048, 128 experts of width 768, vocab 151936) at 4 layers, random BF16 weights:
# the issue's 6.2 GB checkpoint of 3.1B parameters, one safetensors file (and a
# 4-shard copy), written by bench_load under DIR with its config.json.
#   1. bench_load: the same checkpoint from a warm page cache into float32 by
#      the loader before issue 16 (one thread, tensor by tensor) and by
#      qd_checkpoint_load, fastest of REPS, both buffers compared bit for bit;
#      then loads into fresh memory (first touch included, as quads forward
#      does; plain and MADV_HUGEPAGE) and what quads forward does after the
#      load on the CUDA backend, step by step (init, the finiteness check before
#      and now, set_weights, the forward, the free); then with 4 shards;
#   2. quads forward --backend cuda (and cpu with CPU=1) of 27 token ids on that
#      folder, as the issue timed it (20.8 s on CUDA, 82 s on the CPU before):
#      config, backend, load, upload, weight sync and one forward
#      (QUADS_CUDA_PROFILE=1: the CUDA backend's phases on stderr).
# Prints the tables; logs under OUTDIR.
#     bash bench/run_load_h200.sh [OUTDIR]
# Sizes: LAYERS [4] REPS [3] SHARDS ["1 4"] DIR [/tmp/quads-load] CPU [0] BACKEND [cuda]
set -u
out=${1:-${OUT:-/tmp/bench_load}}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
L=${LAYERS:-4} reps=${REPS:-3} dir=${DIR:-/tmp/quads-load}
rc=0
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
echo "== $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GB memory, $(df -h "$(dirname "$dir")" | awk 'NR == 2 {print $4}') free under $(dirname "$dir")"
for shards in ${SHARDS:-1 4}; do
    d="$dir-a3b-L$L-$shards"
    echo "== bench_load: a3b x $L layers, $shards shard(s), $d"
    extra=()
    [ "$shards" = 1 ] && extra=(--fresh 1 --backend "${BACKEND:-cuda}")
    s0=$(date +%s.%N)
    timeout 250 bench/bench_load --a3b-layers "$L" --shards "$shards" --reps "$reps" --dir "$d" "${extra[@]}" \
        >"$out/load_$shards.md" 2>"$out/load_$shards.err" || { rc=1; tail -5 "$out/load_$shards.err"; }
    cat "$out/load_$shards.md"
    echo "(writing, warming and timing took $(elapsed "$s0") s)"
    du -sb "$d" | awk '{print "files: " $1 " bytes"}'
done
# 27 token ids, as the issue's forward
ids=$(seq -s, 1 27)
d="$dir-a3b-L$L-1"
for b in cuda $([ "${CPU:-0}" = 1 ] && echo cpu); do
    echo "== quads forward --backend $b, 27 tokens, $d"
    s0=$(date +%s.%N)
    how=""
    QUADS_CUDA_PROFILE=1 timeout 150 ./quads forward --model "$d" --ids "$ids" --backend "$b" \
        >"$out/forward_$b.out" 2>"$out/forward_$b.err" || { rc=1; how=" FAILED"; }
    echo "quads forward --backend $b:$how $(elapsed "$s0") s wall (issue 16 before: cuda 20.8 s, cpu 82 s)" |
        tee -a "$out/forward.txt"
    tail -n 20 "$out/forward_$b.err"
    head -c 300 "$out/forward_$b.out"; echo
done
rm -rf "$dir"-a3b-L"$L"-*
echo "== summary (GB = 1e9 bytes; before = the serial loader until issue 16)"
for f in "$out"/load_*.md; do
    [ -f "$f" ] && { head -n 1 "$f"; grep -v -e '^|---' -e '^| loader' -e '^checkpoint' -e '^float32' -e '^$' "$f"; }
done
cat "$out/forward.txt" 2>/dev/null
exit $rc
