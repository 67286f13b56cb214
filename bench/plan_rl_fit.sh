#!/bin/bash
# bench/plan_rl_fit.sh: the largest Qwen3-MoE with Qwen3-30B-A3B's layer shapes
# whose `quads rl` step fits one GPU (issue 13), from the memory plans alone
# (bench_backend --plan-only: no weights, no device; runs anywhere). A step on
# one GPU holds the trainer (float32 master, gradients, AdamW moments, the
# activations of one micro-batch of MICRO [8] sequences of PROMPT [128] +
# NEW [1024] tokens; CUDA fast mode adds its BF16 copy of the working weights,
# 2 bytes a parameter: FAST [1]) and the lean rollout (NVFP4 codes, RAC at
# 0.25, the KV cache of PROMPTS [16] x GROUP [16] sequences of PROMPT + NEW
# tokens), recipe RECIPE [quads]; RECOMPUTE=1: the trainer recomputes each
# layer's activations in the backward (trainer.recompute: one layer's set
# held, not every layer's). For L = 1 .. 48 layers it prints both
# plans' totals and their sum, and the largest L whose sum plus MARGIN_GB [6]
# (the CUDA context, cuBLAS's workspaces, the ops' own scratch) stays under
# GPU_GB [139.8] (an H200's memory as cudaMemGetInfo reports it), with the
# trainer's largest parts at that L.
#     bash bench/plan_rl_fit.sh
set -u
cd "$(dirname "$0")/.." || exit 1
bb=bench/bench_backend
[ -x "$bb" ] || { echo "plan_rl_fit: $bb not found: build it first (make bench/bench_backend)" >&2; exit 1; }
R=${RECIPE:-quads} P=${PROMPT:-128} M=${NEW:-1024} MB=${MICRO:-8} GB=$(( ${PROMPTS:-16} * ${GROUP:-16} ))
gpu=${GPU_GB:-139.8} margin=${MARGIN_GB:-6} fast=${FAST:-1}
# the plan table's "total" column of the row of ROLE, in bytes (units B, kB, MB, GB, TB: powers of 1000)
total() {
    awk -F'|' -v role="$1" '
        function bytes(s,   v, u) { split(s, a, " "); v = a[1]; u = a[2]
            return v * (u == "TB" ? 1e12 : u == "GB" ? 1e9 : u == "MB" ? 1e6 : u == "kB" ? 1e3 : 1) }
        $5 ~ " " role " " { print bytes($(NF - 1)); exit }'
}
col() { # column I of the trainer's row, in bytes
    awk -F'|' -v i="$1" '
        function bytes(s,   v, u) { split(s, a, " "); v = a[1]; u = a[2]
            return v * (u == "TB" ? 1e12 : u == "GB" ? 1e9 : u == "MB" ? 1e6 : u == "kB" ? 1e3 : 1) }
        $5 ~ " trainer " { print bytes($i); exit }'
}
part() { # the trainer's table columns at one L, largest first
    awk -F'|' -v role=trainer 'NR == 3 { for (i = 6; i < NF - 1; i++) h[i] = $i }
        $5 ~ " " role " " { for (i = 6; i < NF - 1; i++) printf "%s:%s\n", h[i], $i }' | sed 's/  */ /g'
}
printf "| layers | parameters | trainer | rollout | sum (+ BF16 copy %s) | fits %s GB less %s |\n|---:|---:|---:|---:|---:|---|\n" \
    "$([ "$fast" = 1 ] && echo yes || echo no)" "$gpu" "$margin"
best=0
for L in $(seq 1 48); do
    tp=$("$bb" --plan-only --model a3b --layers "$L" --recipes "$R" --ops "train step" --batch "$MB" --seq $((P + M)) \
        $([ "${RECOMPUTE:-0}" = 1 ] && echo --recompute) 2>/dev/null)
    rp=$("$bb" --plan-only --model a3b --layers "$L" --recipes "$R" --ops rollout --batch "$GB" --prompt "$P" \
        --new-tokens "$M" 2>/dev/null)
    t=$(echo "$tp" | total trainer) r=$(echo "$rp" | total rollout)
    n=$(echo "$tp" | col 6 | awk '{ printf "%.0f", $1 / 4 }') # parameters: the float32 master's bytes / 4
    [ -z "$t" ] || [ -z "$r" ] && { echo "plan_rl_fit: no plan at $L layers" >&2; exit 1; }
    s=$(awk -v t="$t" -v r="$r" -v n="${n:-0}" -v f="$fast" 'BEGIN { printf "%.0f", t + r + (f == 1 ? 2 * n : 0) }')
    ok=$(awk -v s="$s" -v g="$gpu" -v m="$margin" 'BEGIN { print (s + m * 1e9 <= g * 1e9) ? "yes" : "no" }')
    [ "$ok" = yes ] && best=$L && bestp=$tp
    awk -v L="$L" -v n="${n:-0}" -v t="$t" -v r="$r" -v s="$s" -v ok="$ok" \
        'BEGIN { printf "| %d | %.2fB | %.1f GB | %.1f GB | %.1f GB | %s |\n", L, n / 1e9, t / 1e9, r / 1e9, s / 1e9, ok }'
    [ "$ok" = no ] && [ "$L" -gt $((best + 2)) ] && break
done
echo
echo "largest: $best layers (recipe $R, micro-batch $MB x $((P + M)), rollout $GB x ($P + $M)$([ "${RECOMPUTE:-0}" = 1 ] && echo ", activations recomputed"))"
[ "$best" -gt 0 ] && echo "its trainer plan:" && echo "$bestp" | part
