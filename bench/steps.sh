# bench/steps.sh: the timed steps of the H200 benchmark scripts (sourced by
# bench/run_h200.sh and bench/run_train_h200.sh; they set out, budget, scale).
# step NAME CAP CMD...: runs CMD for at most CAP x scale seconds and what is
# left of budget (seconds since start); stdout (the table) to NAME.txt and the
# screen (through step_show, which a script may redefine), stderr to NAME.log.
# shellcheck shell=bash disable=SC2034,SC2154
start=$(date +%s)
failed=0
tables=()

step_show() { cat "$1"; }

step() {
    local name=$1 cap left rc
    cap=$(awk -v c="$2" -v s="$scale" 'BEGIN { printf "%d", c * s }')
    shift 2
    left=$((budget - ($(date +%s) - start)))
    [ "$cap" -lt "$left" ] && left=$cap
    tables+=("$name")
    rm -f "$out/$name.jsonl"
    if [ "$left" -lt 5 ]; then
        echo "== $name: skipped, the ${budget}s budget is spent" | tee "$out/$name.txt"
        failed=1
        return
    fi
    echo "== $name (at most $left s): $*"
    timeout -k 5 "$left" "$@" >"$out/$name.txt" 2>"$out/$name.log"
    rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        { echo "TIMED OUT after $left s; the rows it had finished:"; grep '^bench_backend: ' "$out/$name.log"; } \
            >>"$out/$name.txt"
    elif [ $rc -ne 0 ]; then
        { echo "exit $rc; the end of $out/$name.log:"; tail -5 "$out/$name.log"; } >>"$out/$name.txt"
    fi
    [ $rc -ne 0 ] && failed=1
    step_show "$out/$name.txt"
    echo
}
