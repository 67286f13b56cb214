#!/usr/bin/env python3
"""Loads model folders written by qd_checkpoint_save (models/checkpoint.c)
with transformers' from_pretrained and compares them with the fixture they
were saved from: every tensor must equal the fixture's (after rounding to
bfloat16 when the folder was saved as BF16), and for an F32 save the logits
of a few token ids must agree within 1e-5.

  python3 -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install torch transformers safetensors numpy
  # save each fixture with the library (e.g. a 10-line C program calling
  # qd_checkpoint_open_backend + qd_checkpoint_save), then:
  /tmp/refvenv/bin/python tests/ref/check_checkpoint_save.py SAVED_DIR tests/fixtures/hf_models/NAME

Exit status 1 on any difference.
"""
import sys

import torch
import transformers


def main(saved, fixture):
    ours = transformers.AutoModelForCausalLM.from_pretrained(saved)
    ref = transformers.AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.float32)
    if type(ours) is not type(ref):
        print(f"class {type(ours).__name__} != {type(ref).__name__}")
        return 1
    dtype = ours.dtype  # from config.json's torch_dtype
    want = {k: v.to(dtype) for k, v in ref.state_dict().items()}
    got = ours.state_dict()
    if set(got) != set(want):
        print("tensor names differ:", sorted(set(got) ^ set(want))[:5])
        return 1
    worst = max(float((got[k].float() - want[k].float()).abs().max()) for k in got)
    ids = torch.tensor([[1, 5, 7, 9, 3, 2]])
    with torch.no_grad():
        # both in float32, with the reference's weights rounded as ours were
        diff = float((ours.float()(ids).logits - ref.to(dtype).float()(ids).logits).abs().max())
    print(f"{type(ours).__name__} {dtype}: max tensor diff {worst:.3g}, max logit diff {diff:.3g}")
    # a BF16 model also rebuilds its rotary tables in bfloat16, so its logits
    # are reported only; the tensors are the check there
    return 0 if worst == 0 and (dtype != torch.float32 or diff <= 1e-5) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
