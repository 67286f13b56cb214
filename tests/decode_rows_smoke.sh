#!/bin/sh
# make check: bench/decode_rows.py (the rows of docs/results/decode-h200.jsonl)
# on bench_backend/bench_torch-shaped rows: three processes of one
# configuration collapse into the median one (tokens/s, its step, its ratio to
# transformers) with runs, min and max, and a recipe's ratio to nvfp4 is taken
# within each process (median, min, max); a single run keeps the old fields only;
# failed rows and other ops are left out.
set -u
srcdir=${srcdir:-.}
py=${PYTHON:-python3}
out=$(
    {
        echo '{"program":"bench_torch","op":"rollout","status":"ok","recipe":"bf16","batch":1,"prompt":128,"new_tokens":64,"ms_per_iter":640.0,"tokens_per_s":100.0}'
        k=0
        for t in 1053.4 949.1 1047.2; do
            k=$((k + 1))
            for rt in "nvfp4 $t" "bf16 $(echo "$k" | awk '{print 460 + 20 * (($1 + 1) % 3)}')"; do
                set -- $rt
                ms=$(echo "$2" | awk '{printf "%.6f", 64000.0 / $1}')
                echo "{\"program\":\"bench_backend\",\"op\":\"rollout\",\"status\":\"ok\",\"recipe\":\"$1\",\"mode\":\"exact\",\"batch\":1,\"prompt\":128,\"new_tokens\":64,\"ms_per_iter\":$ms,\"tokens_per_s\":$2,\"process\":\"p$k\"}"
            done
        done
        echo '{"program":"bench_backend","op":"rollout","status":"ok","recipe":"quads","mode":"exact","batch":1,"prompt":128,"new_tokens":64,"ms_per_iter":80.0,"tokens_per_s":800.0}'
        echo '{"program":"bench_backend","op":"rollout","status":"failed","recipe":"fp8","mode":"exact","batch":1,"prompt":128,"new_tokens":64}'
        echo '{"program":"bench_backend","op":"forward","status":"ok","recipe":"nvfp4","mode":"exact","batch":1,"prompt":128,"new_tokens":64,"ms_per_iter":1.0,"tokens_per_s":1.0}'
    } | "$py" "$srcdir/bench/decode_rows.py" --layers 4 --copy-tbs 4.24 --commit smoke
) || { echo "decode_rows_smoke: decode_rows.py failed" >&2; exit 1; }
echo "$out" | "$py" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
by = {(r["engine"], r["recipe"]): r for r in rows}
assert len(rows) == 4, rows
m = by[("quads", "nvfp4")]
assert m["tokens_per_s"] == 1047.2 and m["runs"] == 3, m
assert m["tokens_per_s_min"] == 949.1 and m["tokens_per_s_max"] == 1053.4, m
assert m["vs_transformers"] == 10.472 and abs(m["step_ms"] - 0.955) < 1e-9, m
q = by[("quads", "quads")]
assert "runs" not in q and q["tokens_per_s"] == 800.0 and q["vs_transformers"] == 8.0, q
assert "vs_nvfp4" not in q, q  # no process field: nothing to pair with
# bf16 500 / 460 / 480 in processes p1..p3 beside nvfp4 1053.4 / 949.1 / 1047.2:
# tokens/s median 480 (p3), ratio median 500 / 1053.4 (p1), min 480 / 1047.2 (p3),
# max 460 / 949.1 (p2): the ratios pair rows of one process, not the medians
b = by[("quads", "bf16")]
assert b["tokens_per_s"] == 480.0 and b["runs"] == 3, b
assert b["vs_nvfp4"] == round(500 / 1053.4, 3), b
assert b["vs_nvfp4_min"] == round(480 / 1047.2, 3) and b["vs_nvfp4_max"] == round(460 / 949.1, 3), b
assert "vs_nvfp4" not in m, m
t = by[("transformers", "bf16")]
assert t["mode"] == "eager" and t["vs_transformers"] == 1.0, t
' || { echo "decode_rows_smoke: unexpected rows:" >&2; echo "$out" >&2; exit 1; }
echo "decode_rows_smoke: median of 3 processes, ratios to nvfp4 within a process, single run and baseline rows ok"
