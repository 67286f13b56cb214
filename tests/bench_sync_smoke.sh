#!/bin/sh
# make check: bench/bench_backend's weight-sync op on the CPU (the tiny model):
# a row per recipe, each ok, device to device (one backend, one memory), in
# the JSON lines with the fields of docs/results/train-h200.jsonl (op
# "weight_sync", engine, recipe, mode, ms, bandwidth_fraction over the fp32
# sync of the run, commit). The GPU's numbers come from bench/run_train_h200.sh.
set -u
srcdir=${srcdir:-.}
json=${TMPDIR:-/tmp}/bench_sync_smoke.$$.jsonl
trap 'rm -f "$json"' EXIT
recipes=fp32,bf16,fp8,nvfp4,quads
if ! bench/bench_backend --backend cpu --model tiny --tiny-dir "$srcdir/models/tiny" --ops "weight sync" \
    --recipes "$recipes" --iters 2 --warmup 1 --threads 1 --commit smoke --json "$json" >/dev/null; then
    echo "bench_sync_smoke: bench_backend failed" >&2
    exit 1
fi
for r in $(echo "$recipes" | tr , ' '); do
    n=$(grep -c "\"recipe\":\"$r\",\"op\":\"weight_sync\",\"status\":\"ok\".*\"engine\":\"quads\",\"commit\":\"smoke\",\"ms\":.*\"device_to_device\":true,.*\"bandwidth_fraction\":" "$json")
    if [ "$n" != 1 ]; then
        echo "bench_sync_smoke: recipe $r: no ok weight_sync row with the issue's fields in:" >&2
        cat "$json" >&2
        exit 1
    fi
done
echo "bench_sync_smoke: $(wc -l <"$json") weight_sync rows ok"
