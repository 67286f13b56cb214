#!/usr/bin/env python3
"""Records which code points HF `tokenizers` (Oniguruma regexes) puts in the
character classes that byte-level BPE pre-tokenizers use: \\s, \\S, \\p{L},
\\p{N} and [^\\s\\p{L}\\p{N}]. The Check suite runs the same classes through our
PCRE2 pre-tokenizer on every code point and compares.

    python3 tests/ref/make_regex_class_fixture.py tests/fixtures/tokenizer

Output: regex_classes.json, {"tokenizers": version, "classes": [{"pattern",
"ranges": [[first, last], ...]}]} with inclusive code point ranges (U+0001..U+10FFFF,
surrogates excluded).
"""
import json
import os
import sys

import tokenizers
from tokenizers import Regex, pre_tokenizers

PATTERNS = [r"\s", r"\S", r"\p{L}", r"\p{N}", r"[^\s\p{L}\p{N}]"]


def members(pattern, cps, text):
    """Code points the pattern matches: those a Removed split leaves uncovered."""
    split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
    covered = bytearray(len(text))
    for _, (a, b) in split.pre_tokenize_str(text):
        covered[a:b] = b"\x01" * (b - a)
    return [cps[i] for i in range(len(text)) if not covered[i]]


def ranges(sorted_cps):
    out = []
    for c in sorted_cps:
        if out and out[-1][1] + 1 == c:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tokenizer"
    cps = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(map(chr, cps))
    classes = [{"pattern": p, "ranges": ranges(members(p, cps, text))} for p in PATTERNS]
    with open(os.path.join(out, "regex_classes.json"), "w") as f:
        json.dump({"tokenizers": tokenizers.__version__, "classes": classes}, f, separators=(",", ":"))
    print({c["pattern"]: len(c["ranges"]) for c in classes})


if __name__ == "__main__":
    main()
