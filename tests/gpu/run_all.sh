#!/bin/sh
# On the GPU machine, from a tree built on the development box and carried
# over (the device tool's `carry`): the whole CUDA check in one call.
#   0. tests/gpu/check_ops: every op of backends/ops.h, CUDA vs CPU on the same
#      inputs (tests/op_cases.c): exact mode bit for bit, fast mode within each
#      slot's bound, so a mismatch names the op;
#      then once more (one seed) with the W4A4 MMA kernel one block an MMA
#      (QUADS_W4A4_PAIR=0) and with 2, 4 and 8 row tiles a CTA forced, with the W4A4 decode kernel forced
#      (QUADS_W4A4_DEC=1, with QUADS_W4A4_DEC_RT=2 too) and left out (=0, with
#      QUADS_MATVEC_CHAIN=0 and QUADS_RAC_FUSED=0), with the W4A4 MMA kernel's 4-warp
#      CTAs forced, with the split-K W4A4 kernel forced (QUADS_W4A4_SPLITK=1), with the
#      FP16 W4A4 kernels forced and left out (QUADS_W4A4_H16, QUADS_W4A4_HPRE), and with fast
#      mode's BF16 backward taking dy 8 columns a block (QUADS_DY16_BYTES=1024),
#      the lm_head's way; and with every one of the experts' BF16 products on
#      the wgmma kernel (QUADS_EXPERT_GEMM=wgmma; by default only the forward's),
#      and with every one on cuBLASLt (QUADS_EXPERT_GEMM=lt), and with the fused
#      attention on its mma.sync kernels (QUADS_FLASH_WG=0; wgmma on Hopper by default),
#      and with the opt-ins of 2026-12-05c (the lm_head backward's dy bits by
#      the hardware's exp, 32 rows a block for the narrow rmsnorms, the
#      embedding's backward with its tokens sorted, AdamW's two-float4 kernel,
#      RoPE a warp a row, q/k/v's input converted to BF16 once: QUADS_DLOGIT_FAST=1 QUADS_RMSNORM_ROWS=1 QUADS_EMBED_SORT=1
#      QUADS_ADAMW_U2=1 QUADS_ROPE_ROWS=1 QUADS_HOLD_X=1);
#   1. tests/gpu/check_backend (then again with QUADS_AQAT16=0 QUADS_CUDA_GRAPH=0, with
#      QUADS_GATE_UP=0 QUADS_ADAMW_BITS=0 QUADS_ROUND_INPUT=1 QUADS_WGMMA_BWD=1, and with
#      the opt-ins QUADS_LAZY_ZERO=1 QUADS_DLOGIT_FAST=1 QUADS_RMSNORM_ROWS=1
#      QUADS_EMBED_SORT=1 QUADS_ADAMW_U2=1 QUADS_ROPE_ROWS=1 QUADS_HOLD_X=1 QUADS_MOE_DEV_ROWS=4096):
#      whole models, every recipe and role, CUDA vs
#      CPU: exact mode bit for bit, fast mode within stated relative errors;
#      and with QUADS_CUDA_GRAPH=1 (the decode steps' CUDA graphs, the default,
#      logged: how many were recorded and run, and what refused a recording);
#   2. tests/gpu/check_blas: the fast-mode GEMMs and the W4A4 path choice;
#   3. `quads rl` (the default config) on the CPU and on the CUDA backend in
#      exact mode: metrics.jsonl compared value for value (timings aside) and
#      the final checkpoints byte for byte; and once in fast mode (runs, and
#      its final held-out pass@1 is printed). The CPU run starts first, in the
#      background on half the cores (RL_CPU_THREADS), while 0-2 run (it took
#      ~52 s of a run_all.sh past 330 s on an H100's 16 cores; exact mode's
#      numbers do not depend on the thread count);
#   4. `quads rl` with the replay recipes on CUDA in exact mode, 10 steps:
#      every step's log-prob gap exactly 0 (mean and max |dlogp|, k3 KL).
# quads needs shared libraries the GPU machine lacks (utf8proc, ...): the
# caller carries them in .devrun/lib (tests/gpu/bundle_libs.sh makes it).
#     sh tests/gpu/run_all.sh [OUTDIR]
set -u
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-.}}
mkdir -p "$out"
runs=${TMPDIR:-/tmp}/quads-runs
rm -rf "$runs"
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
nvidia-smi -L 2>/dev/null || true
rc=0
# ./quads needs the libraries of .devrun/lib: said once here, not as a cascade
# of failed runs in step 3 (on the device machine a path ignored only by
# .git/info/exclude does not stay between calls: unpack it in the same call)
if ! ./quads --version >/dev/null 2>&1; then
    echo "run_all.sh: ./quads does not start: $(./quads --version 2>&1 | head -1)" >&2
    echo "run_all.sh: build it, run tests/gpu/bundle_libs.sh and carry .devrun/lib in this call" >&2
    rc=1
fi
# the CPU's `quads rl` (step 3's reference) in the background from the start
cpu_rl=
if [ -z "${REF_CPU_METRICS:-}" ]; then
    ncpu=$(nproc 2>/dev/null || echo 2)
    OMP_NUM_THREADS=${RL_CPU_THREADS:-$(( ncpu > 3 ? ncpu / 2 : 1 ))} /usr/bin/time -f "cpu exact rl: %e s" \
        ./quads rl --quiet --backend cpu --mode exact --set run.dir="$runs/rl_cpu_exact" \
        >"$out/rl_cpu_exact.log" 2>&1 &
    cpu_rl=$!
fi
echo "== check_ops"
timeout 300 tests/gpu/check_ops >"$out/check_ops.log" 2>&1 || rc=1
grep -v "bits equal\|within" "$out/check_ops.log" | tail -8
# ops1 NAME "WHAT" [VAR=VALUE ...]: check_ops with one seed under those
# switches, its log in $out/check_ops_NAME.log, its verdict line shown
ops1() {
    name=$1 what=$2
    shift 2
    echo "== check_ops 1, $what"
    env "$@" timeout 300 tests/gpu/check_ops 1 >"$out/check_ops_$name.log" 2>&1 || rc=1
    tail -1 "$out/check_ops_$name.log"
}
ops1 dec "the W4A4 decode kernel forced for every product, in tiles of 8 rows (QUADS_W4A4_DEC=1; by default where no group has more than 8)" \
    QUADS_W4A4_DEC=1
ops1 dec2 "the decode kernel forced with 2 weight rows a thread (QUADS_W4A4_DEC_RT=2; by default for up to 2 rows where CTAs are many)" \
    QUADS_W4A4_DEC=1 QUADS_W4A4_DEC_RT=2
ops1 nodec "no decode kernels (QUADS_W4A4_DEC=0: small W4A4 products on the MMA kernel's 1-warp CTAs; QUADS_MATVEC_CHAIN=0: one-row x.W^T on k_matvec_wt; QUADS_RAC_FUSED=0: RAC's activation rows in three launches; QUADS_BFP_MATVEC=0: the row BFP product of 1-4 rows on the tensor-core kernel)" \
    QUADS_W4A4_DEC=0 QUADS_MATVEC_CHAIN=0 QUADS_RAC_FUSED=0 QUADS_BFP_MATVEC=0
ops1 w4 "no decode kernel and the W4A4 MMA kernel's 4-warp CTAs forced (small cases take 1-warp CTAs by default)" \
    QUADS_W4A4_DEC=0 QUADS_MMA_WARPS=4
ops1 splitk "the split-K W4A4 kernel forced for every product (QUADS_W4A4_SPLITK=1; by default only where CTAs are few)" \
    QUADS_W4A4_SPLITK=1
ops1 k16 "the W4A4 MMA kernel one block an MMA (QUADS_W4A4_PAIR=0; by default two where K is a multiple of 256; QUADS_W4A4_STREAM=0: small groups on it too)" \
    QUADS_W4A4_PAIR=0 QUADS_W4A4_STREAM=0
ops1 h16 "the FP16 W4A4 kernel forced for every product, on mma.sync (QUADS_W4A4_H16=1 QUADS_W4A4_HWG=0; by default the prefill's, on wgmma on Hopper where K allows)" QUADS_W4A4_H16=1 QUADS_W4A4_HWG=0
ops1 noh16 "the FP16 W4A4 kernel never (QUADS_W4A4_H16=0)" QUADS_W4A4_H16=0
ops1 hwg "the FP16 W4A4 kernel forced for every product, on wgmma where K allows (QUADS_W4A4_HWG=1, the default since 2026-12-07: one wgmma m64n64k16 a block)" \
    QUADS_W4A4_H16=1 QUADS_W4A4_HWG=1
ops1 hwg128 "the same, 128 activation rows a CTA (QUADS_W4A4_HWG_NA=128: m64n128k16)" \
    QUADS_W4A4_H16=1 QUADS_W4A4_HWG=1 QUADS_W4A4_HWG_NA=128
ops1 hwgpipe "the same, 64 rows, each block's wgmma in flight while the block before is added (QUADS_W4A4_HWG_PIPE=1)" \
    QUADS_W4A4_H16=1 QUADS_W4A4_HWG=1 QUADS_W4A4_HWG_PIPE=1
ops1 hwgpipe2 "the same at two CTAs an SM (QUADS_W4A4_HWG_PIPE=2, opt-in)" \
    QUADS_W4A4_H16=1 QUADS_W4A4_HWG=1 QUADS_W4A4_HWG_PIPE=2
ops1 hwgwgs4 "the same, 256 weight rows a CTA of four warpgroups (QUADS_W4A4_HWG_WGS=4)" \
    QUADS_W4A4_H16=1 QUADS_W4A4_HWG=1 QUADS_W4A4_HWG_WGS=4
ops1 hpre "the FP16 W4A4 kernel on activations made FP16 first forced for every product of one weight matrix and q, k, v (QUADS_W4A4_HPRE=1; by default q, k, v at 9-256 rows)" \
    QUADS_W4A4_HPRE=1
ops1 nohpre "that kernel never (QUADS_W4A4_HPRE=0)" QUADS_W4A4_HPRE=0
ops1 ilp "both FP16 W4A4 kernels forced, their full row tiles one at a time (QUADS_W4A4_ILP=0; by default four)" \
    QUADS_W4A4_ILP=0 QUADS_W4A4_H16=1
ops1 ilphpre "the same on the FP16-activation kernel (QUADS_W4A4_ILP=0 QUADS_W4A4_HPRE=1)" \
    QUADS_W4A4_ILP=0 QUADS_W4A4_HPRE=1
for nt in 2 4 8; do
    ops1 "nt$nt" "the W4A4 MMA kernel with $nt row tiles a CTA forced (QUADS_W4A4_NT_GROUPED, QUADS_W4A4_NT; 4-warp CTAs; not the streaming kernel)" \
        QUADS_W4A4_NT_GROUPED=$nt QUADS_W4A4_NT=$nt QUADS_MMA_WARPS=4 QUADS_W4A4_STREAM=0
done
ops1 stream "the W4A4 decode products with every warp streaming its own weight rows wherever that kernel applies (QUADS_W4A4_STREAM=1; by default grouped products of 9-16 rows a group, or of few rows in many groups)" \
    QUADS_W4A4_STREAM=1
ops1 nostream "the streaming kernel never (QUADS_W4A4_STREAM=0)" QUADS_W4A4_STREAM=0
ops1 stream2 "the same, 32-block stages (QUADS_W4A4_STREAM_CFG=2) where K allows" QUADS_W4A4_STREAM=1 QUADS_W4A4_STREAM_CFG=2
ops1 stream0 "the same, 4 stages and the weight scales through a table (QUADS_W4A4_STREAM_CFG=0; by default 2 stages, the hardware's E4M3 conversion)" QUADS_W4A4_STREAM=1 QUADS_W4A4_STREAM_CFG=0
ops1 streamrg "the same, 2 slabs of 64 weight rows a CTA everywhere (QUADS_W4A4_STREAM_RG=2; by default 2 where that leaves 3 waves, else 1)" QUADS_W4A4_STREAM=1 QUADS_W4A4_STREAM_RG=2
ops1 stream7 "the same, the E2M1 table and the MMAs' starting accumulators as constants (QUADS_W4A4_STREAM_CFG=7; by default held in registers)" QUADS_W4A4_STREAM=1 QUADS_W4A4_STREAM_CFG=7
ops1 streamrg4 "the same, 4 slabs and 3 stages (QUADS_W4A4_STREAM_RG=4 QUADS_W4A4_STREAM_CFG=5)" QUADS_W4A4_STREAM=1 QUADS_W4A4_STREAM_RG=4 QUADS_W4A4_STREAM_CFG=5
ops1 nostreamci "the streaming kernel's copies indexed by the stage, divided out of it (QUADS_W4A4_STREAM_CI=0; by default since 2026-12-07 issued from counters), wherever it applies, and with 2 slabs a CTA" \
    QUADS_W4A4_STREAM_CI=0 QUADS_W4A4_STREAM=1 QUADS_W4A4_STREAM_RG=2
ops1 nostreamci1 "the same with the default slabs, the experts' device-offset launches among them" QUADS_W4A4_STREAM_CI=0
ops1 stream9 "the same with each stage's weight scales converted to floats once by the warp (QUADS_W4A4_STREAM_CFG=9, opt-in), wherever the streaming kernel applies and by default" \
    QUADS_W4A4_STREAM_CFG=9 QUADS_W4A4_STREAM=1
ops1 stream9d "the same, by default (the experts' device-offset launches)" QUADS_W4A4_STREAM_CFG=9
ops1 nopart "products whose K is a multiple of 64 but not of 256 (streaming kernel) or 128 (wgmma prefill kernel) on the kernels before their PART twins (QUADS_W4A4_PART=0; the twins by default since 2026-12-07d: the QUADS recipe's down projection, 768 + 192 RAC channels)" QUADS_W4A4_PART=0
ops1 bfpwg "the row BFP product of 1-4 rows on wgmma too (QUADS_BFP_MATVEC=0; past 4 rows wgmma by default on Hopper)" \
    QUADS_BFP_MATVEC=0
ops1 bfpmma "the row BFP product on the int8 mma.sync kernel (QUADS_BFP_WGMMA=0)" QUADS_BFP_WGMMA=0 QUADS_BFP_MATVEC=0
ops1 bfpwait "the row BFP product on wgmma with 3 stages, each stage's products waited for (QUADS_BFP_WG_PIPE=0; by default 4, one in flight)" QUADS_BFP_WG_PIPE=0
ops1 bfpbk64 "the row BFP product on wgmma in 8 stages of 64 bytes of K, 6 in flight (QUADS_BFP_WG_BK64=1, opt-in; by default 4 of 128, 2 in flight), every row count" QUADS_BFP_WG_BK64=1 QUADS_BFP_MATVEC=0
ops1 bfpwg3 "the row BFP product on wgmma with three warpgroups a CTA, 192 vocabulary rows, 3 stages (QUADS_BFP_WG3=1, opt-in), every row count" QUADS_BFP_WG3=1 QUADS_BFP_MATVEC=0
ops1 rowwide "the row quantizers (qk_row: rows, fused rows, gather, RAC's rows) one block a thread only under as many rows as SMs (QUADS_ROW_WIDE=0; by default since 2026-12-08 wherever their warps fit half of every SM)" QUADS_ROW_WIDE=0
ops1 gather4 "the experts' row gather (the QUADS recipe's, fast mode's float one) a value a thread (QUADS_GATHER4=0; by default since 2026-12-08 a float4 a thread, its index in 32 bits)" QUADS_GATHER4=0
ops1 frilp "the fused rows' sums (residual add, MoE combine + add before the norm) 4 values a thread with all their loads in flight, the q/k norms + RoPE + KV store with a row's loads issued at its start, the SwiGLU rows 4 values a thread (QUADS_FR_ILP=1, opt-in)" QUADS_FR_ILP=1
ops1 rx8 "RMSNorm's dx and the MoE combine's backward (dy, dL/dweight) in blocks of 8 rows (QUADS_RX8=1, opt-in; by default 32)" QUADS_RX8=1
ops1 swiglu4 "fast mode's SwiGLU and its backward on BF16 outputs four values a thread (QUADS_SWIGLU4=1, opt-in)" QUADS_SWIGLU4=1
ops1 thin "x.W^T of 9-127 rows over few outputs (the router at batch 16-64) on the register-staged thin tiles, not the cp.async ring (QUADS_MATMUL_RING=0)" QUADS_MATMUL_RING=0
ops1 samplefused "the device sampler's exponentials computed where each lane adds them (QUADS_SAMPLE_FUSED=1, opt-in)" QUADS_SAMPLE_FUSED=1
ops1 moegroup1 "the MoE rows grouped in three launches (QUADS_MOE_GROUP1=0; by default since 2026-12-07 one block's token masks in one launch)" QUADS_MOE_GROUP1=0
ops1 fusedrows "no fused rows kernels: add + rmsnorm, combine + add + rmsnorm + quantize, SwiGLU + quantize, q/k norms + RoPE + the KV store, gather + quantize as the ops' own kernels one after the other (QUADS_FUSED_ROWS=0; each one launch by default since 2026-12-07)" QUADS_FUSED_ROWS=0
ops1 gfdcta "the device offsets' groups and row tiles listed one thread an expert (QUADS_GFD_CTA=1, opt-in, with QUADS_GFD_INLINE=0 so that the streaming kernel's are listed too; by default one warp walking the experts 32 at a time)" QUADS_GFD_CTA=1 QUADS_GFD_INLINE=0
ops1 gfdinline "the streaming kernel's expert row tiles listed by a launch before each product (QUADS_GFD_INLINE=0; by default since 2026-12-07 its CTAs find their expert and row tile from the device offsets themselves)" QUADS_GFD_INLINE=0
ops1 pdl "every kernel launched with programmatic stream serialization, its CTAs started before its predecessor ends and waiting for it (QUADS_PDL=1, opt-in)" QUADS_PDL=1
ops1 attpre "the exact prefill's attention a tile of 128 (query, head) pairs of a sequence a CTA, its keys and values staged once for them (QUADS_ATT_PREFILL=1, opt-in; by default a CTA a query)" QUADS_ATT_PREFILL=1
ops1 gatherdrop "gather_nvfp4 with keep 0 writing the float copy too (QUADS_GATHER_DROP=0; by default since 2026-12-07 each row quantized from its token's row, no copy)" QUADS_GATHER_DROP=0
ops1 ringdeep "x.W^T of 9-127 rows over few outputs (the router at batch 16-64) with every stage of K in flight from the start (QUADS_RING_DEEP=1, opt-in; by default a ring of 4)" QUADS_RING_DEEP=1
ops1 fp8chain "fast mode's FP8 experts on the exact kernel's E4M3 chain (QUADS_FP8_GROUPED=0; the tensor cores by default)" QUADS_FP8_GROUPED=0
ops1 dy16 "fast mode's BF16 backward with dy a block of 8 columns (QUADS_DY16_BYTES)" QUADS_DY16_BYTES=1024
ops1 wgmma "every one of the experts' BF16 products on the wgmma kernel (QUADS_EXPERT_GEMM=wgmma; by default the forward's)" \
    QUADS_EXPERT_GEMM=wgmma
ops1 lt "every one of the experts' BF16 products on cuBLASLt (QUADS_EXPERT_GEMM=lt)" QUADS_EXPERT_GEMM=lt
ops1 flashwg "fast mode's fused attention on the mma.sync kernels (QUADS_FLASH_WG=0; wgmma on Hopper by default)" \
    QUADS_FLASH_WG=0
grep "attend" "$out/check_ops_flashwg.log" | grep fast16
echo "== check_ops 1, the opt-ins: dy bits by the hardware's exp, rmsnorm 32 rows a block, the embedding's backward sorted, AdamW two float4 a thread, RoPE a warp a row (QUADS_DLOGIT_FAST=1 QUADS_RMSNORM_ROWS=1 QUADS_EMBED_SORT=1 QUADS_ADAMW_U2=1 QUADS_ROPE_ROWS=1 QUADS_HOLD_X=1; QUADS_LT_TUNE=1: cuBLASLt's fastest candidate a product)"
QUADS_DLOGIT_FAST=1 QUADS_RMSNORM_ROWS=1 QUADS_EMBED_SORT=1 QUADS_ADAMW_U2=1 QUADS_ROPE_ROWS=1 QUADS_HOLD_X=1 QUADS_LT_TUNE=1 timeout 300 tests/gpu/check_ops >"$out/check_ops_optin.log" 2>&1 || rc=1
tail -1 "$out/check_ops_optin.log"
echo "== check_backend"
timeout 400 tests/gpu/check_backend >"$out/check_backend.log" 2>"$out/check_backend.err" || rc=1
grep -v " yes$" "$out/check_backend.log" | grep -v " within " | head -30
grep " fast " "$out/check_backend.log" | sort -k6 -g -r | head -4
tail -3 "$out/check_backend.err"
tail -1 "$out/check_backend.log"
echo "== check_backend, QUADS_AQAT16=0 (fast mode's AQAT forward in float32 instead of BF16 bits and a scale) QUADS_CUDA_GRAPH=0 (every decode step's kernels launched from the host)"
QUADS_AQAT16=0 QUADS_CUDA_GRAPH=0 timeout 400 tests/gpu/check_backend >"$out/check_backend_aqat32.log" 2>"$out/check_backend_aqat32.err" || rc=1
grep -v " yes$" "$out/check_backend_aqat32.log" | grep -v " within " | head -10
tail -1 "$out/check_backend_aqat32.log"
echo "== check_backend, QUADS_GATE_UP=0 QUADS_ADAMW_BITS=0 QUADS_ROUND_INPUT=1 QUADS_WGMMA_BWD=1 (gate|up's backward as two products, AdamW writing the experts' floats too, BF16 linears' inputs rounded first; the experts' backward on the wgmma kernel)"
QUADS_GATE_UP=0 QUADS_ADAMW_BITS=0 QUADS_ROUND_INPUT=1 QUADS_WGMMA_BWD=1 timeout 400 tests/gpu/check_backend >"$out/check_backend_old.log" 2>"$out/check_backend_old.err" || rc=1
grep -v " yes$" "$out/check_backend_old.log" | grep -v " within " | head -10
tail -1 "$out/check_backend_old.log"
echo "== check_backend with the opt-ins of 2026-12-05c/d (QUADS_LAZY_ZERO=1: the experts' weight gradients overwritten, not zeroed first; QUADS_DLOGIT_FAST=1 QUADS_RMSNORM_ROWS=1 QUADS_EMBED_SORT=1 QUADS_ADAMW_U2=1 QUADS_ROPE_ROWS=1 QUADS_HOLD_X=1; QUADS_MOE_DEV_ROWS=4096: every decode's expert offsets on the device; and QUADS_LT_TUNE=1 QUADS_ATT_PREFILL=1; QUADS_W4A4_HWG=0 QUADS_GATHER_DROP=0: the paths before 2026-12-07's defaults)"
QUADS_MOE_DEV_ROWS=4096 QUADS_LAZY_ZERO=1 QUADS_DLOGIT_FAST=1 QUADS_RMSNORM_ROWS=1 QUADS_EMBED_SORT=1 QUADS_ADAMW_U2=1 QUADS_ROPE_ROWS=1 QUADS_HOLD_X=1 QUADS_LT_TUNE=1 QUADS_ATT_PREFILL=1 QUADS_W4A4_HWG=0 QUADS_GATHER_DROP=0 timeout 400 tests/gpu/check_backend >"$out/check_backend_optin.log" 2>"$out/check_backend_optin.err" || rc=1
grep -v " yes$" "$out/check_backend_optin.log" | grep -v " within " | head -10
tail -1 "$out/check_backend_optin.log"
echo "== check_backend with the opt-ins of 2026-12-05i (QUADS_W4A4_STREAM=1: decode's W4A4 products on the streaming kernel wherever it applies, with QUADS_MOE_DEV_ROWS=4096 its device-offset form too; QUADS_FP8_GROUPED=0: fast FP8 experts on the exact kernel's chain) and of 2026-12-06h (QUADS_GFD_CTA=1: the device offsets' row tiles one thread an expert, with QUADS_GFD_INLINE=0 so that they are listed) and 2026-12-07 (QUADS_PDL=1: programmatic dependent launch; QUADS_RING_DEEP=1: the router's x.W^T with all of K in flight; QUADS_ROW_WIDE=0 QUADS_GATHER4=0: the row quantizers and the row gather as before 2026-12-08; QUADS_FR_ILP=1, QUADS_RX8=1 and QUADS_SWIGLU4=1: the fused rows' sums 4 values a thread, RMSNorm's dx and the MoE combine's backward 8 rows a block, fast SwiGLU 4 values a thread); and the defaults of before 2026-12-07 (QUADS_MOE_GROUP1=0 QUADS_FUSED_ROWS=0)"
QUADS_MOE_DEV_ROWS=4096 QUADS_W4A4_STREAM=1 QUADS_FP8_GROUPED=0 QUADS_MOE_GROUP1=0 QUADS_FUSED_ROWS=0 QUADS_GFD_CTA=1 QUADS_GFD_INLINE=0 QUADS_PDL=1 QUADS_RING_DEEP=1 QUADS_ROW_WIDE=0 QUADS_GATHER4=0 QUADS_FR_ILP=1 QUADS_RX8=1 QUADS_SWIGLU4=1 timeout 400 tests/gpu/check_backend >"$out/check_backend_optin2.log" 2>"$out/check_backend_optin2.err" || rc=1
grep -v " yes$" "$out/check_backend_optin2.log" | grep -v " within " | head -10
tail -1 "$out/check_backend_optin2.log"
echo "== check_backend with QUADS_CUDA_GRAPH=1 (decode steps recorded once as a CUDA graph and replayed, the default, with the recordings logged)"
QUADS_CUDA_GRAPH=1 timeout 400 tests/gpu/check_backend >"$out/check_backend_graph.log" 2>"$out/check_backend_graph.err" || rc=1
grep -v " yes$" "$out/check_backend_graph.log" | grep -v " within " | head -10
grep "step graphs" "$out/check_backend_graph.err" | sort | uniq -c | sort -rn | head -5
tail -1 "$out/check_backend_graph.log"
echo "== check_blas"
timeout 120 tests/gpu/check_blas >"$out/check_blas.log" 2>&1 || rc=1
tail -30 "$out/check_blas.log"
echo "== quads rl: cpu and cuda, exact mode; cuda fast mode"
# REF_CPU_METRICS: a CPU run's metrics.jsonl from the same code (skips the CPU run)
[ -n "${REF_CPU_METRICS:-}" ] && cp "$REF_CPU_METRICS" "$out/metrics_cpu_exact.jsonl"
if [ -n "$cpu_rl" ]; then
    wait "$cpu_rl" || { rc=1; tail -5 "$out/rl_cpu_exact.log"; }
    tail -3 "$out/rl_cpu_exact.log"
    cp "$runs/rl_cpu_exact/metrics.jsonl" "$out/metrics_cpu_exact.jsonl" 2>/dev/null
fi
for b in cuda:exact cuda:fast; do
    be=${b%:*} mo=${b#*:}
    /usr/bin/time -f "$be $mo rl: %e s" ./quads rl --quiet --backend "$be" --mode "$mo" \
        --set run.dir="$runs/rl_${be}_$mo" >"$out/rl_${be}_$mo.log" 2>&1 || { rc=1; tail -5 "$out/rl_${be}_$mo.log"; }
    tail -3 "$out/rl_${be}_$mo.log"
    cp "$runs/rl_${be}_$mo/metrics.jsonl" "$out/metrics_${be}_$mo.jsonl" 2>/dev/null
done
python3 tests/gpu/compare_metrics.py "$out/metrics_cpu_exact.jsonl" "$out/metrics_cuda_exact.jsonl" || rc=1
if [ -d "$runs/rl_cpu_exact" ]; then
    last=$(ls -d "$runs"/rl_cpu_exact/step_* | tail -1 | xargs basename)
    for f in model.safetensors optimizer.bin rac.bin state.json; do
        cmp "$runs/rl_cpu_exact/$last/$f" "$runs/rl_cuda_exact/$last/$f" && echo "$last/$f: identical" || rc=1
    done
fi
# the replay recipes on CUDA in exact mode: the trainer's forward is the
# rollout's, so every step's log-prob gap is exactly 0 (the CPU suite asserts
# it there; check_backend has CUDA = CPU for their ops)
echo "== quads rl --set rollout.recipe=nvfp4-replay / quads-replay, cuda exact, 10 steps: the gap exactly 0"
for rec in nvfp4-replay quads-replay; do
    ./quads rl --quiet --backend cuda --mode exact --set rollout.recipe=$rec --set run.steps=10 --set eval.every=0 \
        --set run.dir="$runs/rl_cuda_$rec" >"$out/rl_cuda_$rec.log" 2>&1 || { rc=1; tail -5 "$out/rl_cuda_$rec.log"; }
    python3 - "$runs/rl_cuda_$rec/metrics.jsonl" "$rec" <<'PYEOF' || rc=1
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [o for o in steps if "gap" in o]
bad = [o["step"] for o in steps if o["gap"]["mean_abs"] != 0 or o["gap"]["max_abs"] != 0 or o["gap"]["k3_kl"] != 0]
toks = sum(o["gap"]["tokens"] for o in steps)
print("%s: %d steps, %d tokens, gap (mean, max |dlogp|, k3 KL) not 0 at steps %s" % (sys.argv[2], len(steps), toks, bad or "none"))
sys.exit(1 if bad or len(steps) < 10 or toks == 0 else 0)
PYEOF
done
echo "run_all.sh: $([ $rc = 0 ] && echo PASS || echo FAIL)"
exit $rc
