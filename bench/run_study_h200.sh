#!/bin/bash
# bench/run_study_h200.sh: issue 17's study on the GPU machine. A MoE wide
# enough that NVFP4 behaves as at scale (default: hidden 512, 8 layers, 8/2
# heads of 64, 32 experts top-4 of width 256, 106M parameters; 32 NVFP4
# blocks a row where the tiny model has 4) is trained by `quads sft` on the
# two-operation arithmetic until its greedy bf16 held-out pass@1 reaches
# STOP_AT, then `quads compare` runs `quads rl` with every recipe x 3 seeds
# (one seed at a time, all its recipes, JOBS at once),
# the same config otherwise, each final checkpoint evaluated at the rollout's
# precision and in bf16, and `quads ablate` measures activation vs weight
# error per layer on the SFT model.
#
# From a tree configured and built here with CUDA (./configure
# --with-cuda-arch=90a && make quads; sh tests/gpu/bundle_libs.sh for
# .devrun/lib), carried to the GPU machine:
#     bash bench/run_study_h200.sh [OUTDIR]        (default: $OUT, else /tmp/quads-study-out)
#
# One call does what BUDGET_S allows and stops; the next call on the same
# machine continues where it stopped: the SFT model stays in WORK, and
# `quads compare --continue` keeps finished runs and resumes cut ones from
# their checkpoints (checkpoint.every CKPT_EVERY). Every call ends with the report of
# what WORK holds (`quads compare --report-only`: runs not yet run are listed
# as missing, runs cut short as incomplete; neither is averaged). A fresh
# machine starts over (WORK is gone; the SFT is deterministic in exact mode,
# so it makes the same model again).
#
# Across sessions (a fresh machine): PRIOR=path/to/runs.tar.gz (an earlier
# call's, carried into the tree) puts its runs in WORK before anything runs;
# its finished runs are kept (the SFT, made again, is the same bits in exact
# mode, and with the same WORK, so model.path, the configs match), its
# unfinished ones start again, its ablation is kept. The tarball carries the
# model's sha256: after the SFT, prior runs of another model are set aside
# (WORK/study.prior-other-model.PID) and the study starts over.
#
# Environment (defaults in brackets):
#   WORK [/tmp/quads-study]  the SFT model, the runs, logs
#   PRIOR []                 an earlier call's runs.tar.gz
#   BUDGET_S [540]           wall seconds of this call (the device tool allows 600 a command)
#   RECIPES [bf16,fp8,nvfp4,nvfp4-aqat,nvfp4-rac,quads,nvfp4-sym-qat,nvfp4-replay,quads-replay]
#   SEEDS [1,2,3]  STEPS [100]  EVAL_EVERY [25]  EVAL_LIMIT [256]
#   LR [2e-6]  (trainer.lr of every RL run; CKPT_EVERY [25] its checkpoints)
#   JOBS [3]  RL runs at once (quads compare --jobs: a process each; on an
#             H100, 2026-12-07, three at once took ~175 s for 100 steps each,
#             each step 2-3x slower than alone: not measured against three in a
#             row; each run's numbers are those of a run alone, its tokens/s not)
#   BACKEND [cuda]  MODE [exact]   (of the RL runs and the ablation)
#   TASK [arith2]   (two operations, operands 0..99)
#   HIDDEN [512] LAYERS [8] HEADS [8] KV_HEADS [2] HEAD_DIM [64] EXPERTS [32] TOP_K [4] MOE_INTER [256]
#   SFT_STEPS [8000] SFT_BATCH [64] SFT_LR [5e-4] SFT_WARMUP [100] SFT_EVERY [250] STOP_AT [0.4]
#   SFT_SEED [1000] SFT_MODE [exact] SFT_PROBLEMS [200000]
# The learning rate: `quads rl`'s default (1e-4, set for the tiny model)
# wrecks this model in a few steps. On an H100 (2026-12-07, the SFT model
# above at bf16 held-out pass@1 0.457, the bf16 recipe, exact mode, seed 1):
# with 1e-4 the held-out pass@1 was 0.035 at step 25 and 0.023 at step 100
# (seed 2's training reward fell from 0.58 to 0.09 in four steps the same
# way); 40 steps of 3e-5 ended at 0.270, of 1e-5 at 0.461, of 2e-6 at 0.469.
# LR is one value for every recipe (no recipe is tuned to a target).
#
# The held-out problems of the RL evals (eval.seed 7) are not the SFT's stop
# set (its seed, SFT_SEED), and the RL training pools (run.seed 1..3) are not
# the SFT's (SFT_SEED).
#
# OUTDIR gets at most 8 files (the device tool's limit): study.log, sft.log,
# report.md, report.json, reward.svg, pass1.svg, gap.svg and runs.tar.gz
# (every run's config.json, metrics.jsonl without the per-linear error
# arrays, and layers.json; the SFT model's config.json, ablate.md and
# ablate.json).
# shellcheck disable=SC2086,SC2116,SC2012
set -u

out=${1:-${OUT:-/tmp/quads-study-out}}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH="$PWD/.devrun/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive
q=$PWD/quads
work=${WORK:-/tmp/quads-study}
budget=${BUDGET_S:-540}
recipes=${RECIPES:-bf16,fp8,nvfp4,nvfp4-aqat,nvfp4-rac,quads,nvfp4-sym-qat,nvfp4-replay,quads-replay}
seeds=${SEEDS:-1,2,3}
task=${TASK:-arith2}
backend=${BACKEND:-cuda}
mode=${MODE:-exact}
start=$(date +%s)
jobs=${JOBS:-3}
case "$jobs" in '' | *[!0-9]* | 0) echo "run_study_h200: JOBS=$jobs: a whole number of at least 1" >&2; exit 1 ;; esac
log=$work/study.log

if [ ! -x "$q" ]; then
    echo "run_study_h200: $q not found: build it first (./configure --with-cuda-arch=90a && make quads)" >&2
    exit 1
fi
mkdir -p "$work" || exit 1

left() { echo $((budget - ($(date +%s) - start))); }
say() { echo "$*" | tee -a "$log"; }

# The seconds a step may take: what is left of the budget less 40 s for the
# report and the packing at the end.
cap() {
    local l
    l=$(($(left) - 40))
    [ "$l" -lt 0 ] && l=0
    echo "$l"
}

say "== $(date -u +%FT%TZ): run_study_h200, budget ${budget}s, work $work"
if [ -n "${PRIOR:-}" ] && [ ! -d "$work/study" ]; then
    tar xzf "$PRIOR" -C "$work" --wildcards 'study/*' || { say "PRIOR=$PRIOR: cannot unpack"; exit 1; }
    say "runs of $PRIOR unpacked into $work/study"
    # the checksum of the model the prior runs started from (checked after the SFT)
    tar xzf "$PRIOR" -O model.sha256 >"$work/prior.sha256" 2>/dev/null || rm -f "$work/prior.sha256"
    touch "$work/prior.pending" # checked once this call or a later one has the model
    # the ablation measured the same SFT model (exact mode: the same bits): kept
    if tar xzf "$PRIOR" -C "$work" ablate.json ablate.md 2>/dev/null; then
        say "the ablation of $PRIOR kept ($work/ablate.json)"
    else
        rm -f "$work/ablate.json" "$work/ablate.md"
    fi
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /' | tee -a "$log"

# 1. the model: quads sft until greedy bf16 pass@1 >= STOP_AT (or SFT_STEPS)
model=$work/model
if [ ! -f "$model/model.safetensors" ] && [ "$(cap)" -gt 60 ]; then
    rm -rf "$model.tmp"
    sft_args="--out $model.tmp --task $task --steps ${SFT_STEPS:-8000} --batch ${SFT_BATCH:-64}
        --lr ${SFT_LR:-5e-4} --warmup ${SFT_WARMUP:-100} --train-problems ${SFT_PROBLEMS:-200000}
        --seed ${SFT_SEED:-1000} --hidden ${HIDDEN:-512} --layers ${LAYERS:-8} --heads ${HEADS:-8}
        --kv-heads ${KV_HEADS:-2} --head-dim ${HEAD_DIM:-64} --experts ${EXPERTS:-32} --top-k ${TOP_K:-4}
        --moe-intermediate ${MOE_INTER:-256} --eval ${EVAL_LIMIT:-256} --eval-samples 1 --eval-temperature 0
        --eval-precision bf16 --eval-every ${SFT_EVERY:-250} --stop-at ${STOP_AT:-0.4}
        --backend $backend --mode ${SFT_MODE:-exact}"
    say "== sft (at most $(cap) s): quads sft $(echo $sft_args)"
    timeout -k 10 "$(cap)" "$q" sft $sft_args >"$work/sft.log" 2>&1
    rc=$?
    tail -4 "$work/sft.log" | tee -a "$log"
    if [ $rc -ne 0 ]; then
        say "sft: exit $rc$( [ $rc -eq 124 ] && echo ' (out of budget: the next call starts it again)')"
    else
        mv "$model.tmp" "$model"
        grep -q "stopped early" "$work/sft.log" ||
            say "note: the SFT did not reach STOP_AT=${STOP_AT:-0.4} in SFT_STEPS; the study starts from its last pass@1"
    fi
fi

# the model's checksum (each call: a model made again is checked again), packed
# with the runs; the prior runs' model must be this one
if [ -f "$model/model.safetensors" ]; then
    (cd "$work" && sha256sum model/model.safetensors >model.sha256.tmp && mv model.sha256.tmp model.sha256)
fi
if [ -s "$work/model.sha256" ] && [ -e "$work/prior.pending" ]; then
    if [ ! -s "$work/prior.sha256" ]; then
        say "PRIOR has no model checksum (packed before it was added): its runs are kept on exact mode's word; compare this SFT's last line with the prior's sft.log: $(tail -1 "$work/sft.log" 2>/dev/null)"
    elif ! cmp -s "$work/prior.sha256" "$work/model.sha256"; then
        mv "$work/study" "$work/study.prior-other-model.$$"
        say "PRIOR's runs started from another model (sha256 $(cut -c1-16 "$work/prior.sha256") against $(cut -c1-16 "$work/model.sha256")): set aside in $work/study.prior-other-model.$$, the study starts over"
        rm -f "$work/ablate.json" "$work/ablate.md"
    else
        say "PRIOR's runs started from this model (sha256 $(cut -c1-16 "$work/model.sha256")): kept"
    fi
    rm -f "$work/prior.pending"
fi

[ -f "$model/model.safetensors" ] || [ "$(cap)" -gt 60 ] ||
    say "sft: skipped, $(cap) s left of the budget (it cannot resume: give it a call of its own)"

# 2. the ablation of the cause, on the SFT model (once)
if [ -f "$model/model.safetensors" ] && [ ! -s "$work/ablate.json" ] && [ "$(cap)" -gt 30 ]; then
    say "== ablate (at most $(cap) s)"
    timeout -k 10 "$(cap)" "$q" ablate --model "$model" --task "$task" --problems 64 --samples 4 \
        --backend "$backend" --mode "$mode" --out "$work/ablate.json.tmp" >"$work/ablate.md" 2>>"$log" &&
        mv "$work/ablate.json.tmp" "$work/ablate.json"
    tail -6 "$work/ablate.md" | tee -a "$log"
fi

# 3. the RL runs: every recipe x seed, continued from what WORK holds
# each of the JOBS runs on its share of the cores (exact mode's numbers do not
# depend on run.threads, and --continue ignores it)
threads=$(( $(nproc 2>/dev/null || echo 2) / jobs ))
[ "$threads" -lt 1 ] && threads=1
study_args="--recipes $recipes --out $work/study --quiet --set run.threads=$threads
    --set model.path=$model --set data.task=$task --set run.steps=${STEPS:-100}
    --set rollout.backend=$backend --set rollout.mode=$mode --set rollout.max_tokens=12
    --set eval.every=${EVAL_EVERY:-25} --set eval.limit=${EVAL_LIMIT:-256} --set eval.seed=7
    --set trainer.lr=${LR:-2e-6} --set checkpoint.every=${CKPT_EVERY:-25} --set checkpoint.keep_last=1"
# one seed at a time, every recipe of it: a study cut by the budget (or
# carried over sessions with PRIOR) has whole seeds, each a complete table
for seed in $(echo "$seeds" | tr ',' ' '); do
    [ -f "$model/model.safetensors" ] && [ "$(cap)" -gt 30 ] || break
    say "== compare, seed $seed (at most $(cap) s): quads compare --continue --jobs $jobs --seeds $seed $(echo $study_args)"
    timeout -k 10 "$(cap)" "$q" compare --continue --jobs "$jobs" --seeds "$seed" $study_args >>"$log" 2>&1
    rc=$?
    [ $rc -eq 124 ] && say "compare: out of budget; the next call resumes the cut runs from their checkpoints"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && say "compare: exit $rc (a run failed: the report lists it)"
done

# 4. the report of what WORK holds, and the files back
if [ -f "$model/model.safetensors" ]; then
    "$q" compare --report-only --seeds "$seeds" $study_args >>"$log" 2>&1 || say "report: exit $?"
    # a finished run's checkpoint is not needed again (the report reads metrics.jsonl)
    python3 - "$work/study/report.json" <<'EOF' 2>>"$log"
import json, shutil, sys, glob
for r in json.load(open(sys.argv[1]))["runs"]:
    if r["status"] == "ok":
        for d in glob.glob(r["dir"] + "/step_*"):
            shutil.rmtree(d)
EOF
    for f in report.md report.json reward.svg pass1.svg gap.svg; do
        [ -f "$work/study/$f" ] && cp "$work/study/$f" "$out/"
    done
    [ -f "$out/report.md" ] && sed -n '/^| row | recipe/,/^$/p' "$out/report.md" | tee -a "$log"
fi
# every run's config and metrics, without the per-linear error arrays (800
# numbers a step for this model: they would not fit the 16 MiB a file
# brings back; their means stay, and the per-layer router agreement)
python3 - "$work" "$out/runs.tar.gz" <<'EOF' 2>>"$log"
import glob, io, json, os, sys, tarfile
work, dest = sys.argv[1], sys.argv[2]
def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
def under(pattern):
    return sorted(os.path.relpath(p, work) for p in glob.glob(os.path.join(work, pattern)))
with tarfile.open(dest + ".tmp", "w:gz") as tar:
    # no model yet (the SFT cut by the budget): the prior runs' checksum goes on with them
    if not os.path.exists(os.path.join(work, "model.sha256")) and os.path.exists(os.path.join(work, "prior.sha256")):
        add(tar, "model.sha256", open(os.path.join(work, "prior.sha256"), "rb").read())
    for f in ["model/config.json", "model.sha256", "ablate.md", "ablate.json"] + under("study/*/seed-*/config.json") + \
            under("study/*/seed-*/layers.json"):
        if os.path.exists(os.path.join(work, f)):
            add(tar, f, open(os.path.join(work, f), "rb").read())
    for f in under("study/*/seed-*/metrics.jsonl"):
        lines = []
        for line in open(os.path.join(work, f)):
            try:
                o = json.loads(line)
            except ValueError:
                continue  # a line torn by a kill
            for k in ("act_err", "weight_err"):
                o.get("quant", {}).pop(k, None)
            lines.append(json.dumps(o, separators=(",", ":")))
        add(tar, f, ("\n".join(lines) + "\n").encode())
os.replace(dest + ".tmp", dest)
EOF
cp "$work/sft.log" "$out/sft.log" 2>/dev/null
say "== done in $(($(date +%s) - start)) s; $(ls "$out" | tr '\n' ' ')"
cp "$log" "$out/study.log"
