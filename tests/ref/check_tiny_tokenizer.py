#!/usr/bin/env python3
"""Checks that Hugging Face `tokenizers` reads the tiny model's tokenizer.json
(written by `quads sft --write-tokenizer`) and gives the same ids as our C
tokenizer (`quads tokenize`) on sample texts, and that decoding round-trips.

usage: python3 tests/ref/check_tiny_tokenizer.py QUADS_BINARY TOKENIZER_JSON
Needs: pip install tokenizers. Exits non-zero on the first disagreement."""
import json
import subprocess
import sys

from tokenizers import Tokenizer

SAMPLES = [
    "Q: What is 35 + 79?\nA: 114<|endoftext|>",
    "Q: What is (3 - 12) * 7?\nA: -63<|endoftext|>",
    "Q: What is 0 * 0?\nA: ",
    "What is the answer? the theme, This is it.",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
    "  leading spaces,\ttabs\tand\n\nnewlines  ",
    "unicode: caf\u00e9 \u00fcber \u4e2d\u6587 \U0001F600 \u0100",
    "digits 1234567890 and 3.14159 and -42",
    "",
]


def ours(quads, path, text):
    out = subprocess.run([quads, "tokenize", "--tokenizer", path], input=text.encode(),
                         capture_output=True, check=True)
    return json.loads(out.stdout)


def main():
    quads, path = sys.argv[1], sys.argv[2]
    tok = Tokenizer.from_file(path)
    assert tok.get_vocab_size(with_added_tokens=True) == 272, tok.get_vocab_size(with_added_tokens=True)
    for text in SAMPLES:
        want = tok.encode(text, add_special_tokens=False).ids
        got = ours(quads, path, text)
        if got != want:
            print(f"MISMATCH on {text!r}\n  tokenizers: {want}\n  quads:      {got}")
            return 1
        back = tok.decode(want, skip_special_tokens=False)
        if back != text:
            print(f"ROUND TRIP FAILED on {text!r}: {back!r}")
            return 1
        print(f"ok {len(want):3d} ids  {text[:40]!r}")
    # every id decodes to a non-empty string (the model's vocabulary is fully named)
    for i in range(272):
        assert tok.id_to_token(i), i
    print("all ids agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
