#!/bin/bash
# bench/ab_train_h200.sh: kernel variants of fast mode's train step side by
# side (issue 13) on the GPU machine, from a tree built here and carried
# (bench/bench_backend, tests/gpu/bundle_libs.sh's .devrun/lib), in about
# ROUNDS x variants x 10 s plus a minute (4-5 minutes with the defaults). The
# MODEL [a3b] (bench/run_train_h200.sh; or moe8) at LAYERS [4; moe8: 8], B [16] x T [1024] tokens,
# RECIPE [bf16]; each variant is a set of environment settings, VARIANTS
# ';'-separated:
#   default: the kernels the defaults choose;
#   QUADS_EXPERT_GEMM=lt: every one of the experts' BF16 products on cuBLASLt;
#   QUADS_EXPERT_GEMM=wgmma QUADS_WGMMA_CFG=0, 2, 4, 5: every one on cuda_grouped.cu's
#     wgmma kernel in that configuration (by default only the forward's, in 0 or
#     2; 4 and 5 store or add C through the bulk copy engine);
#   QUADS_FLASH_WG=0: the fused attention's mma.sync kernels;
#   QUADS_LOGPROB_FAST=0: the log-probs' two passes (the exact kernel) instead of one;
#   QUADS_EXPERTS_BWD16=0: the experts' backward with float32 dy, dg, du and zero fills;
#   QUADS_DY16_BYTES=2 GiB: the lm_head's backward in 3 blocks of columns, not 10;
#   --recompute: the trainer recomputes each layer's activations in the backward
#     (a word starting with -- is an argument of bench_backend, not a setting);
#   QUADS_ADAMW_BITS=0: AdamW writes the experts' float32 working copy too (by
#     default only its BF16 bits, the only copy fast mode's products read);
#   QUADS_GATE_UP=0: gate's and up's backward as two products (by default one);
#   QUADS_ROUND_INPUT=1: a BF16 linear's input rounded by the driver first (by
#     default left to the products' conversion to BF16 bits);
#   QUADS_WGMMA_BWD=1: the experts' backward products on the wgmma kernel
#     (configuration 4, the bulk-copy epilogue; the default since 2026-12-05,
#     =0 for cuBLASLt);
#   the first three together (the defaults of the morning of 2026-12-05);
#   QUADS_DLOGIT_FAST=1: the lm_head backward's dy bits with the hardware's exp
#     (not the exact expression's division and qd_expf a value; default since
#     2026-12-05, as are the next two: =0 for the old paths);
#   QUADS_RMSNORM_ROWS=1: q_norm and k_norm 32 rows a block (not one block a row);
#   QUADS_EMBED_SORT=1: the embedding's backward with its tokens sorted first (not
#     one thread a column over all tokens);
#   QUADS_ADAMW_U2=1: AdamW's kernel with two float4 of each array in flight a thread;
#   QUADS_LAZY_ZERO=1: zero_grad leaves the experts' and the lm_head's weight
#     gradients to be overwritten by their products (10.9 of the 12.4 GB zeroed a step);
#   QUADS_ROPE_ROWS=1: RoPE a warp a (token, head) row (one 32-bit division a thread);
#   QUADS_HOLD_X=1: q's, k's and v's products convert their one input to BF16 once
#     (forward and backward), not once each;
#   the seven together;
#   QUADS_LT_TUNE=1: each cuBLASLt product on the fastest of the heuristic's
#     candidates, timed at its first call (by default the first that runs);
# ROUNDS [1] rounds (2 or more to confirm a difference), the variants
# alternating within each (one process a variant a round: ITERS [2] steps
# after WARMUP [1]; the H200's clocks and the host vary between processes, so
# a variant's rounds are interleaved with the others'). Then PROFILE [1]: one
# profiled step (QUADS_CUDA_PROFILE=last) of
# the first variant and of the last. Prints one table: variant, the median
# over its rounds of bench_backend's median ms a step, tokens/s, against the
# first variant. Logs in OUTDIR.
#     bash bench/ab_train_h200.sh [OUTDIR]       (default: $OUT, else /tmp/ab_train)
# OP=rollout (bench/ab_decode_h200.sh sets it): the rollout instead (bench_backend's
# "rollout" row: B [64] prompts of P [128] tokens, M [64] new tokens, MODE
# [exact], RECIPE [nvfp4], tokens/s of the generated tokens), default variants
# the decode kernels' opt-ins (DECODE_VARIANTS below).
# No smoke test on a CPU: a3b does not fit the development box (23 GB for one layer).
set -u
out=${1:-${OUT:-/tmp/ab_train}}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
[ -x bench/bench_backend ] || { echo "ab_train_h200: bench/bench_backend not found: build it first" >&2; exit 1; }
default_variants="default;QUADS_EXPERT_GEMM=lt;QUADS_EXPERT_GEMM=wgmma QUADS_WGMMA_CFG=0"
default_variants="$default_variants;QUADS_EXPERT_GEMM=wgmma QUADS_WGMMA_CFG=2"
default_variants="$default_variants;QUADS_EXPERT_GEMM=wgmma QUADS_WGMMA_CFG=4;QUADS_EXPERT_GEMM=wgmma QUADS_WGMMA_CFG=5"
default_variants="$default_variants;QUADS_FLASH_WG=0;QUADS_LOGPROB_FAST=0;QUADS_EXPERTS_BWD16=0"
default_variants="$default_variants;QUADS_DY16_BYTES=2147483648;--recompute;QUADS_ADAMW_BITS=0;QUADS_GATE_UP=0"
default_variants="$default_variants;QUADS_ROUND_INPUT=1;QUADS_WGMMA_BWD=1"
default_variants="$default_variants;QUADS_ADAMW_BITS=0 QUADS_GATE_UP=0 QUADS_ROUND_INPUT=1"
default_variants="$default_variants;QUADS_DLOGIT_FAST=1;QUADS_RMSNORM_ROWS=1;QUADS_EMBED_SORT=1;QUADS_ADAMW_U2=1"
default_variants="$default_variants;QUADS_LAZY_ZERO=1;QUADS_ROPE_ROWS=1;QUADS_HOLD_X=1;QUADS_LT_TUNE=1"
default_variants="$default_variants;QUADS_DLOGIT_FAST=1 QUADS_RMSNORM_ROWS=1 QUADS_EMBED_SORT=1 QUADS_ADAMW_U2=1 QUADS_LAZY_ZERO=1 QUADS_ROPE_ROWS=1 QUADS_HOLD_X=1"
# the decode's switches (OP=rollout): the defaults of before 2026-12-06 (no
# streaming W4A4 kernel, the lm_head's BFP on mma.sync, the FP16 prefill
# kernels' full tiles one at a time), each of those alone, the streaming
# kernel wherever it applies, its configuration before 2026-12-06 (4 stages,
# the scales through a table, a slab a CTA), 3 stages, the constants not held
# in registers (the default before 2026-12-06d), a slab a CTA, the expert
# offsets on the device, the MoE rows in three launches, no fused rows kernels,
# the streaming kernel's row tiles listed before each product (each the default
# before 2026-12-07: QUADS_MOE_GROUP1=0, QUADS_FUSED_ROWS=0, QUADS_GFD_INLINE=0),
# the device offsets' row tiles one thread an expert (QUADS_GFD_CTA=1, with
# QUADS_GFD_INLINE=0), programmatic dependent launch (QUADS_PDL=1), the
# router's x.W^T with all of K in flight (QUADS_RING_DEEP=1), the sampler's
# exponentials where its lanes add them (QUADS_SAMPLE_FUSED=1), the
# streaming kernel's copies indexed by the stage (QUADS_W4A4_STREAM_CI=0; by
# default issued from counters since 2026-12-07) and its weight scales
# converted once a stage (QUADS_W4A4_STREAM_CFG=9)
decode_variants="default;QUADS_W4A4_STREAM=0 QUADS_BFP_WGMMA=0 QUADS_W4A4_ILP=0;QUADS_W4A4_STREAM=0"
decode_variants="$decode_variants;QUADS_BFP_WGMMA=0;QUADS_W4A4_ILP=0;QUADS_W4A4_STREAM=1"
decode_variants="$decode_variants;QUADS_W4A4_STREAM_CFG=0 QUADS_W4A4_STREAM_RG=1;QUADS_W4A4_STREAM_CFG=5;QUADS_W4A4_STREAM_CFG=7;QUADS_W4A4_STREAM_RG=1;QUADS_MOE_DEV_ROWS=4096"
decode_variants="$decode_variants;QUADS_MOE_GROUP1=0;QUADS_FUSED_ROWS=0;QUADS_GFD_INLINE=0;QUADS_GFD_CTA=1 QUADS_GFD_INLINE=0;QUADS_PDL=1;QUADS_RING_DEEP=1;QUADS_SAMPLE_FUSED=1"
decode_variants="$decode_variants;QUADS_W4A4_STREAM_CI=0;QUADS_W4A4_STREAM_CFG=9"
model=${MODEL:-a3b}
layers=${LAYERS:-$([ "$model" = moe8 ] && echo 8 || echo 4)}
if [ "${OP:-train}" = rollout ]; then
    IFS=';' read -r -a variants <<<"${VARIANTS:-$decode_variants}"
    op="rollout"
    run=(bench/bench_backend --backend "${BACKEND:-cuda}" --mode "${MODE:-exact}" --recipe "${RECIPE:-nvfp4}"
         --model "$model" --layers "$layers" --batch "${B:-64}" --prompt "${P:-128}" --new-tokens "${M:-64}"
         --ops rollout)
    tokens=$(( ${B:-64} * ${M:-64} ))
else
    IFS=';' read -r -a variants <<<"${VARIANTS:-$default_variants}"
    op="train step"
    run=(bench/bench_backend --backend "${BACKEND:-cuda}" --mode "${MODE:-fast}" --recipe "${RECIPE:-bf16}"
         --model "$model" --layers "$layers" --batch "${B:-16}" --seq "${T:-1024}" --ops "train step")
    tokens=$(( ${B:-16} * ${T:-1024} ))
fi
# a variant's words: settings (envs) and bench_backend arguments (args, the words starting with --)
split() {
    envs=() args=()
    local w
    for w in $1; do
        case $w in
        default) ;;
        --*) args+=("$w") ;;
        *) envs+=("$w") ;;
        esac
    done
}
# one process of variant i (its settings in the environment of bench_backend only)
one() {
    local i=$1 r=$2 log="$out/v$1_r$2.log" ms
    split "${variants[$1]}"
    env "${envs[@]}" timeout 120 "${run[@]}" "${args[@]}" --iters "${ITERS:-2}" --warmup "${WARMUP:-1}" >"$log" 2>&1 ||
        { echo "variant $i round $r failed: see $log" >&2; return 1; }
    # the table row's median ms (bench_backend: | model | backend | mode | recipe | op | tokens | ms | ...)
    ms=$(awk -F'|' -v op="$op" 'index($6, op) { gsub(/ /, "", $8); print $8; exit }' "$log")
    case $ms in
    [0-9]*) echo "$ms" ;;
    *) echo "variant $i round $r: no time (${ms:-no row}): see $log" >&2; return 1 ;;
    esac
}
for r in $(seq 1 "${ROUNDS:-1}"); do
    for i in "${!variants[@]}"; do
        ms=$(one "$i" "$r") || ms=""
        echo "$i $ms" >>"$out/times.txt"
        echo "round $r: ${variants[$i]}: ${ms:-failed} ms"
    done
done
echo
echo "| variant | ms a $op (median of rounds) | tokens/s | vs the first |"
echo "|---|---:|---:|---:|"
base=""
for i in "${!variants[@]}"; do
    med=$(awk -v i="$i" '$1 == i && NF == 2 { print $2 }' "$out/times.txt" | sort -g |
          awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }')
    if [ -z "$med" ]; then
        echo "| ${variants[$i]} | failed | - | - |"
        continue
    fi
    [ -z "$base" ] && base=$med
    awk -v v="${variants[$i]}" -v m="$med" -v b="$base" -v t="$tokens" \
        'BEGIN { printf "| %s | %.1f | %.0f | %.3fx |\n", v, m, t / (m / 1e3), b / m }'
done
if [ "${PROFILE:-1}" = 1 ]; then
    last=$(( ${#variants[@]} - 1 ))
    for i in 0 "$last"; do
        split "${variants[$i]}"
        echo
        echo "== phases of ${variants[$i]} (QUADS_CUDA_PROFILE=last, one warm-up step)"
        env "${envs[@]}" QUADS_CUDA_PROFILE=last timeout 90 "${run[@]}" "${args[@]}" --iters 1 --warmup 1 \
            >"$out/phases_v$i.txt" 2>&1 ||
            echo "the profiled run failed: see $out/phases_v$i.txt"
        grep -v "^$" "$out/phases_v$i.txt" | tail -25
    done
fi
