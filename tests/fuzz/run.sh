#!/bin/sh
# Builds the libFuzzer targets (clang, ASan + UBSan, leaks on) in a copy of the
# tree, build-fuzz/, and runs each for SECONDS (default 4) on a corpus seeded
# from the test fixtures. A crash, leak, sanitizer report or timeout stops the
# run; libFuzzer writes the input to build-fuzz/artifacts/ and this exits 1.
# Usage: tests/fuzz/run.sh [SECONDS [TARGET...]]   (targets: the names after fuzz_)
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
secs=${1:-4}
[ $# -gt 0 ] && shift
targets=${*:-safetensors model_config tokenizer grader rl_config dataset checkpoint}
work=$src/build-fuzz
jobs=$(nproc 2>/dev/null || echo 2)

"$src/ci/copy-tree.sh" "$work"
cd "$work"
if [ ! -f config.status ]; then
    ./autogen.sh >/dev/null 2>&1
    ./configure -q --without-cuda --enable-fuzz CC=clang \
        CFLAGS='-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all'
fi
make -j"$jobs" fuzz >/dev/null

# Seeds: the fixtures each parser already reads (made fresh each run).
rm -rf seeds && mkdir -p seeds artifacts
for t in $targets; do mkdir -p "seeds/$t" "corpus/$t"; done
fx=tests/fixtures
cp $fx/safetensors/*.safetensors $fx/safetensors/sharded/*.safetensors seeds/safetensors/ 2>/dev/null || true
for f in "$fx"/config/*.json "$fx"/hf_models/*/config.json models/tiny/config.json; do
    cp "$f" "seeds/model_config/$(echo "$f" | tr / _)" 2>/dev/null || true
done
cp $fx/tokenizer/gpt2_bpe.json $fx/tokenizer/qwen2_bpe.json seeds/tokenizer/ 2>/dev/null || true
cp models/tiny/tokenizer.json seeds/tokenizer/tiny.json 2>/dev/null || true
cp tests/fuzz/seeds/rl_config/* seeds/rl_config/ 2>/dev/null || true
for f in "$fx"/benchmarks/*.jsonl "$fx"/benchmarks/*.json "$fx"/benchmarks/*.csv; do
    [ -d seeds/dataset ] && head -n 20 "$f" > "seeds/dataset/$(basename "$f")"
done
for d in "$fx"/hf_models/*/; do   # config.json, a NUL, model.safetensors
    [ -d seeds/checkpoint ] && { cat "$d/config.json"; printf '\0'; cat "$d/model.safetensors"; } \
        > "seeds/checkpoint/$(basename "$d")"
done
if [ -d seeds/grader ]; then    # output, a NUL, gold: the grader fixtures' cases
    python3 - "$fx/benchmarks" seeds/grader <<'PY'
import json, sys
src, out = sys.argv[1], sys.argv[2]
n = 0
for name, a, b in (("grader_cases.jsonl", "output", "gold"), ("boxed_extraction_examples.jsonl", "input", None)):
    for line in open(f"{src}/{name}", encoding="utf-8"):
        r = json.loads(line)
        gold = r.get(b, "") if b else ""
        open(f"{out}/{n:05d}", "wb").write(r[a].encode() + b"\0" + str(gold).encode())
        n += 1
PY
fi

# Leaks on. An impossible allocation size returns NULL (the code's out-of-memory
# paths run); one above -rss_limit_mb is still a finding.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
status=0
for t in $targets; do
    printf 'fuzz_%s: ' "$t"
    if ./tests/fuzz/fuzz_"$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
            -artifact_prefix="artifacts/$t-" "corpus/$t" "seeds/$t" > "fuzz_$t.log" 2>&1; then
        grep -o 'Done [0-9]* runs in [0-9]* second(s)' "fuzz_$t.log" || echo ok
    else
        status=1
        echo "FAILED (build-fuzz/fuzz_$t.log, input in build-fuzz/artifacts/)"
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "fuzz_$t.log" | head -n 8
    fi
done
exit "$status"
