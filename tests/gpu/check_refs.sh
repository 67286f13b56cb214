#!/bin/sh
# On the GPU machine (it has transformers and torch): the transformers reference
# fixtures regenerate there equal to the committed ones, and transformers loads
# checkpoint folders written by quads with the logits quads computed.
#     tests/gpu/check_refs.sh SAVED IDS
# SAVED holds folders (config.json, model.safetensors, logits.bin) made on the
# development machine with qd_checkpoint_save and
# `quads forward --model F --ids IDS --precision fp32 --dump-logits F/logits.bin`.
set -u
cd "$(dirname "$0")/../.."
saved=$1
ids=$2
status=0
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
tmp=$(mktemp -d)
if python3 tests/ref/qwen3moe_reference.py --out "$tmp" --compare tests/fixtures/hf_models; then
    echo "reference fixtures regenerated here: equal to the committed ones"
else
    echo "reference fixtures regenerated here: DIFFERENT"; status=1
fi
rm -rf "$tmp"
for d in "$saved"/*/; do
    python3 tests/ref/check_hf_load.py "$d" "$ids" "$d/logits.bin" 2>/dev/null || status=1
done
[ "$status" = 0 ] && echo "check_refs.sh: PASS" || echo "check_refs.sh: FAIL"
exit "$status"
