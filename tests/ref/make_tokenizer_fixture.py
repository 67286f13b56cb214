#!/usr/bin/env python3
"""Builds the tokenizer reference fixture with Hugging Face `tokenizers`.

Trains a small Qwen2-style byte-level BPE (NFC normalizer, the Qwen2 Split regex
+ ByteLevel pre-tokenizer, ByteLevel decoder, ChatML special tokens appended
after the trained vocabulary) on a mixed corpus written below, and records the
ids HF gives for a list of hard texts plus its decodes.

    pip install tokenizers
    python3 tests/ref/make_tokenizer_fixture.py tests/fixtures/tokenizer

Outputs (small, committed):
    qwen2_bpe.json   the tokenizer.json (merges in the [a, b] array form)
    cases.json       [{"text", "ids", "decoded", "decoded_skip"}] for every hard text
    chat.json        a ChatML conversation: the formatted text and HF's ids
    decodes.json     [{"ids", "decoded"}]: every single id, and prefixes of multi-byte cases
    gpt2_bpe.json    a GPT-2-style layout (NFKC; Split on "--" Removed; ByteLevel with its
                     regex and add_prefix_space; ignore_merges), and gpt2_cases.json its
                     ids for the same texts
"""
import json
import os
import random
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,
                        normalizers, pre_tokenizers, processors, trainers)

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's a well-known pangram.",
    "Reinforcement learning of mixture-of-experts language models with 4-bit rollouts.",
    "We'll see whether they've finished; I'm sure you're right and she'd agree.",
    "def forward(self, x):\n    h = self.norm(x)\n    return x + self.mlp(h)\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i] * b[i];\n}\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 1,000,000 -17 +5",
    "Let $x^2 + y^2 = r^2$; then the area is \\pi r^2 and the answer is \\boxed{12}.",
    "你好，世界！这是一个测试。我们在训练一个分词器。",
    "日本語のテキストも少し入れておきます。カタカナとひらがな。",
    "한국어 문장도 있습니다. 안녕하세요!",
    "Emoji: 😀 😂 👍 🎉 🚀 ❤️ 👩‍💻 and flags 🇯🇵 🇺🇸.",
    "Café, naïve, résumé, coöperate, Ångström, façade, jalapeño, Straße.",
    "Привет, мир! Это тест токенизатора. Ελληνικά γράμματα: αβγδε.",
    "مرحبا بالعالم. שלום עולם. नमस्ते दुनिया।",
    "Whitespace   runs\t\ttabs\n\nnewlines\r\nand   trailing   ",
    "<html><body><p class=\"x\">Hello &amp; goodbye</p></body></html>",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "Q: What is 17 * 23? A: 17 * 23 = 391. The final answer is 391.",
    "user: solve the equation 3x + 5 = 20\nassistant: x = 5",
    "aaaaaaaa bbbb hmmmm zzzz!!! ???... ---- **** ____ ====",
    "The answer's the teacher's; it's John's and the students' work, isn't it?",
]

HARD_TEXTS = [
    "Hello, world!",
    "",
    " ",
    "   leading spaces and trailing   ",
    "tabs\tand\nnewlines\r\n\r\nmixed \t \n end",
    "x   \n  y\n\n\n",
    "\n\n\n",
    "    indented\n        more\n",
    "numbers 1234567890 and 3.14159, 1,000,000 -42",
    "abc123def 2x+3y=7",
    "don't I'm we'll you're they've she'd it's DON'T I'M WE'LL THEY'VE",
    "'ſ 'ſt 'S 'T quote' 's",
    "Emoji 👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇩🇪 keycap 1️⃣ ❤️",
    "你好，世界！日本語のテキスト。한국어 텍스트",
    "cafe\u0301 vs caf\u00e9, A\u030a vs \u00c5, e\u0301\u0302, \u1100\u1161\u11a8",
    "\u2126 ohm, \u212b angstrom, \u0071\u0307\u0323",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>text<|endoftext|>",
    "<|end|> <|endof <|endoftext|",
    "a<think>b</think>c <think> x",
    "x<tool call>y <tool call> <tool",
    "Non-breaking\u00a0space\u2003em\u3000ideo\u0085nel\u2028ls\u2029ps\u180emvs\u200bzw end",
    "\u000b\u000c\u001c\u001d\u001e\u001f ctl",
    "nul\u0000byte \u0001\u007f",
    "مرحبا שלום नमस्ते Привет Ελληνικά",
    "∑_{i=1}^n x_i² ≤ √2 ≈ 1.414 ∞ ½ ① Ⅻ ٣ １２３ ３.５",
    "def f(x):\n    return x**2  # comment\n\n\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ǅungla İstanbul ß ẞ ﬁ ŉ",
    "!!!???...,,,;;;:::---___***",
    "the the the the. The THE tHe",
    "QUADS and QUADS-C, not QUAD",
    "\U0001f600\U0001f600 \U00010348 \U0001d49c",
    # Long runs: BPE over thousands of symbols, regex backtracking over long whitespace.
    "a" * 3000,
    " " * 2000 + "x" + " " * 2000,
    "\n" * 1500 + "\t \n" * 500,
    "1" * 800 + "ab" * 700,
]

CHAT = [
    ("system", "You are a helpful assistant."),
    ("user", "What is 2+2? Answer with \\boxed{}."),
    ("assistant", "2+2 = 4, so \\boxed{4}."),
    ("user", "Thanks! 👍"),
]
CHAT_TEMPLATE = "<|im_start|>{role}\n{content}<|im_end|>\n"
CHAT_GENERATION = "<|im_start|>assistant\n"


def synthetic_corpus():
    """Made-up words from syllables (seeded), so training finds enough merges."""
    rng = random.Random(1234)
    syl = ["ka", "ri", "to", "men", "str", "ing", "tion", "pre", "con", "ex", "al", "ver",
           "qu", "ph", "th", "ou", "ei", "sch", "ck", "ly", "ment", "ness", "über", "çã"]
    lines = []
    for _ in range(200):
        words = ["".join(rng.choice(syl) for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(3, 12))]
        lines.append(" ".join(words) + rng.choice([".", "!", "?", ",", "\n", " 12", " 3.5"]))
    return lines


def build():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4 + synthetic_corpus(), trainer)
    # Qwen appends its special tokens after the BPE vocabulary, unnormalized.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    # Non-special added tokens: "<|end" overlaps "<|endoftext|>" (longest match
    # wins); "<think>" is matched after normalization; "<tool call>" has a
    # character outside the byte-level alphabet (decoded from its raw UTF-8).
    tok.add_tokens([AddedToken("<|end", special=False, normalized=False),
                    AddedToken("<think>", special=False, normalized=True),
                    AddedToken("</think>", special=False, normalized=False),
                    AddedToken("<tool call>", special=False, normalized=False)])
    return tok


def build_gpt2_style():
    """A second layout: NFKC in a Sequence, a Split on a plain string with behavior
    Removed, ByteLevel with its own regex and add_prefix_space, BPE with ignore_merges."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("--", behavior="removed"),  # a String pattern, matches dropped
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4 + synthetic_corpus(), trainer)
    # Llama-3 style: a word that is a vocabulary entry is taken whole, before any
    # merge; "ĠQUADS" is one that no merge sequence builds.
    spec = json.loads(tok.to_str())
    spec["model"]["ignore_merges"] = True
    spec["model"]["vocab"]["\u0120QUADS"] = len(spec["model"]["vocab"])
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return tok


def case(tok, text):
    ids = tok.encode(text).ids
    return {"text": text, "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True)}


def write_lines(f, items):
    """A JSON array with one item per line (small, and diffs stay readable)."""
    f.write("[\n" + ",\n".join(json.dumps(x, ensure_ascii=True) for x in items) + "\n]\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tokenizer"
    os.makedirs(out, exist_ok=True)
    tok = build()
    path = os.path.join(out, "qwen2_bpe.json")
    tok.save(path, pretty=False)
    # Re-load what was saved so the ids come from the file the C side reads.
    tok = Tokenizer.from_file(path)
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        write_lines(f, [case(tok, t) for t in HARD_TEXTS])
    text = "".join(CHAT_TEMPLATE.replace("{role}", r).replace("{content}", c) for r, c in CHAT)
    text += CHAT_GENERATION
    chat = {"template": CHAT_TEMPLATE, "generation": CHAT_GENERATION,
            "messages": [{"role": r, "content": c} for r, c in CHAT],
            "text": text, "ids": tok.encode(text).ids}
    with open(os.path.join(out, "chat.json"), "w", encoding="utf-8") as f:
        json.dump(chat, f, ensure_ascii=True, indent=1)
    # Decodes of every single id (partial UTF-8 becomes U+FFFD) and of every
    # prefix of the multi-byte cases.
    multi = [c for c in HARD_TEXTS if any(ord(ch) > 0x7ff for ch in c)]
    prefixes = [tok.encode(t).ids for t in multi]
    prefixes = [ids[:k] for ids in prefixes for k in range(1, min(len(ids), 12) + 1)]
    decodes = [{"ids": [i], "decoded": tok.decode([i], skip_special_tokens=False)}
               for i in range(tok.get_vocab_size())]
    decodes += [{"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)} for ids in prefixes]
    with open(os.path.join(out, "decodes.json"), "w", encoding="utf-8") as f:
        write_lines(f, decodes)
    gpt2 = build_gpt2_style()
    gpt2_path = os.path.join(out, "gpt2_bpe.json")
    gpt2.save(gpt2_path, pretty=False)
    gpt2 = Tokenizer.from_file(gpt2_path)
    with open(os.path.join(out, "gpt2_cases.json"), "w", encoding="utf-8") as f:
        write_lines(f, [{"text": t, "ids": gpt2.encode(t).ids} for t in HARD_TEXTS])
    print(f"vocab {tok.get_vocab_size()} ({os.path.getsize(path)} bytes), {len(HARD_TEXTS)} cases")


if __name__ == "__main__":
    main()
