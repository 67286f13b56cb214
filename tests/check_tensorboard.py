#!/usr/bin/env python3
"""Reads RUN/tb/ back with the `tensorboard` package and compares it with
RUN/metrics.jsonl value for value (tests/test_rl.c runs it; exit 0 when equal,
77 when the tensorboard package is missing: the test skips, saying so).

    python3 tests/check_tensorboard.py RUN [RUN...]

Checks, per run:
- every record of every event file has the right masked CRC-32C of its length
  and of its data (tensorboard's own crc32c, not ours);
- TensorBoard's EventAccumulator (with its restart purge, as the TensorBoard
  UI loads a folder) holds exactly one scalar per (tag, step) of metrics.jsonl
  and nothing else: every number of every line, nested objects as "a/b", the
  per-layer arrays as "quant/act_err/<weight name less model. and .weight>" and
  "router/agree/layer<L>" (RUN/layers.json), each equal to the number as a float32;
- the text summary "config" is RUN/config.json.
"""
import json
import os
import struct
import sys

import numpy as np

try:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
except ImportError as e:
    # 77: skipped (automake's code); ci/install-deps.sh installs the package
    print(f"check_tensorboard: skipped: the tensorboard package is not importable ({e}); "
          "pip install tensorboard (ci/install-deps.sh does)", file=sys.stderr)
    sys.exit(77)


def check_records(path):
    data = open(path, "rb").read()
    pos, n = 0, 0
    while pos < len(data):
        head = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", head)
        (crc_len,) = struct.unpack("<I", data[pos + 8:pos + 12])
        body = data[pos + 12:pos + 12 + length]
        (crc_body,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        assert crc_len == masked_crc32c(head), f"{path}: record {n}: length CRC"
        assert crc_body == masked_crc32c(body), f"{path}: record {n}: data CRC"
        pos += 16 + length
        n += 1
    return n


def expected_scalars(run):
    layers = {}
    if os.path.exists(os.path.join(run, "layers.json")):
        layers = json.load(open(os.path.join(run, "layers.json")))

    def name(x):
        if isinstance(x, int):
            return f"layer{x}"
        x = x[len("model."):] if x.startswith("model.") else x
        return x[:-len(".weight")] if x.endswith(".weight") else x

    want = {}

    def walk(prefix, v, section, step):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}/{k}" if prefix else k, x, section or k, step)
        elif isinstance(v, list):
            names = layers.get(section)
            names = names if names is not None and len(names) == len(v) else None
            for i, x in enumerate(v):
                walk(f"{prefix}/{name(names[i]) if names else i}", x, section, step)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            key = (prefix, step)
            assert key not in want, f"tag {prefix} twice at step {step}"
            want[key] = np.float32(v)

    for line in open(os.path.join(run, "metrics.jsonl")):
        obj = json.loads(line)
        step = obj.pop("step")
        walk("", obj, None, step)
    return want


def check_run(run):
    tb = os.path.join(run, "tb")
    files = sorted(f for f in os.listdir(tb) if "tfevents" in f)
    assert files, f"{tb}: no event file"
    records = sum(check_records(os.path.join(tb, f)) for f in files)
    acc = event_accumulator.EventAccumulator(
        tb, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    got = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            assert (tag, e.step) not in got, f"{tb}: {tag} twice at step {e.step}"
            got[(tag, e.step)] = np.float32(e.value)
    want = expected_scalars(run)
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing, f"{tb}: missing {len(missing)} scalars, e.g. {missing[:3]}"
    assert not extra, f"{tb}: {len(extra)} scalars not in metrics.jsonl, e.g. {extra[:3]}"
    for k, v in want.items():
        assert got[k] == v or (np.isnan(v) and np.isnan(got[k])), f"{tb}: {k}: {got[k]} != {v}"
    texts = acc.Tensors("config")
    assert texts, f"{tb}: no config text"
    text = texts[-1].tensor_proto.string_val[0].decode()
    unindented = "\n".join(line[4:] for line in text.split("\n"))
    assert json.loads(unindented) == json.load(open(os.path.join(run, "config.json"))), f"{tb}: config text"
    tags = {t for t, _ in want}
    print(f"{run}: {len(files)} event file(s), {records} records, {len(want)} scalars "
          f"({len(tags)} tags) equal to metrics.jsonl, config text equal")


def main():
    for run in sys.argv[1:]:
        check_run(run)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"check_tensorboard: {e}", file=sys.stderr)
        sys.exit(1)
