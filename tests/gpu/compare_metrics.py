#!/usr/bin/env python3
"""Compares two metrics.jsonl files of `quads rl` value for value (the "time"
object aside: wall-clock timings differ between machines and backends).
Numbers must be equal as parsed from the JSON text, which quads writes with 17
significant digits, so equal text means equal float64 bits.
    python3 tests/gpu/compare_metrics.py A/metrics.jsonl B/metrics.jsonl
Prints one line per differing field (first 20) and a summary; exit 1 on any
difference or a different number of lines."""
import json
import sys


def walk(a, b, path, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k == "time" and not path:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: missing on one side")
            else:
                walk(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: lengths {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{path}[{i}]", out)
    elif a != b and not (a != a and b != b):
        out.append(f"{path}: {a!r} vs {b!r}")


def main():
    la = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    lb = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
    diffs, fields = [], 0
    if len(la) != len(lb):
        diffs.append(f"{len(la)} vs {len(lb)} lines")
    for i, (a, b) in enumerate(zip(la, lb)):
        d = []
        walk(a, b, "", d)
        diffs += [f"line {i + 1} {x}" for x in d]
        fields += len(json.dumps(a))
    for d in diffs[:20]:
        print(d)
    print(f"compare_metrics: {len(la)} lines, {len(diffs)} differences "
          f"(timings excluded): {'IDENTICAL' if not diffs else 'DIFFERENT'}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
