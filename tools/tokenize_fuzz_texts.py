#!/usr/bin/env python3
"""Write tests/goldens/tokenize/fuzz-texts.json: seeded random texts for the
tokenizer's differential test against llama.cpp's llama-tokenize (the
goldens come from tools/tokenize_goldens.sh). The texts mix what tokenizers
treat unlike each other: words of many scripts, contractions, whitespace
runs, digit runs, emoji and combining marks, control bytes (some have no
token in SmolLM2's vocabulary), supplementary-plane characters, and the
special tokens' texts; two long texts pass SentencePiece's 4 KiB chunks."""
import json
import os
import random

random.seed(20261207)
WORDS = ["the", "The", "hello", "world", "naïve", "café", "über", "Straße", "東京", "日本語",
         "한국어", "привет", "مرحبا", "नमस्ते", "😀", "👍🏽", "🇫🇷", "e\u0301", "ﬁ", "x²", "½", "٣",
         "１２３", "don't", "I'LL", "we're", "it's", "'s", "<|im_start|>", "<|im_end|>",
         "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<|endoftext|>",
         "\u00a0", "\u3000", "\u2028", "\u200b", "\ufeff", "\x00", "\x04", "\x06", "\x13", "\x1b",
         "\x1d", "\x7f", "\U00050000", "\U00090000", "<0x41>", "▁", "Ġ", "def", "return", "{", "}",
         "()", "=>", "...", "--", "**", "#", "$", "%", "&&", "||", "/*", "*/", "\\", "`", "~", "^",
         "|", "http://example.com/a?b=c&d=e"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\t\t", " " * 17, "\n" * 5,
          " \t \n"]


def piece():
    r = random.random()
    if r < 0.45:
        return random.choice(WORDS)
    if r < 0.7:
        return random.choice(SPACES)
    if r < 0.8:
        return "".join(random.choice("0123456789") for _ in range(random.randint(1, 12)))
    if r < 0.9:
        lo, hi = random.choice([(0x20, 0x7e), (0xa0, 0x2fff), (0x3000, 0x9fff), (0xac00, 0xd7a3),
                                (0x1f300, 0x1faff)])
        return chr(random.randint(lo, hi))
    return random.choice(WORDS) + random.choice(WORDS)


cases = []
for i in range(300):
    n = random.choice([1, 2, 3, 5, 10, 30, 100])
    cases.append({"name": f"fuzz{i}", "parse_special": random.random() < 0.5,
                  "add_special": random.random() < 0.5,
                  "text": "".join(piece() for _ in range(n))})
cases.append({"name": "long_mixed", "parse_special": False, "add_special": False,
              "text": "".join(piece() for _ in range(1500))})
flat = ["the", "quick", "brown", "fox", "naïve", "東京", "don't", "x²", "123"]
cases.append({"name": "long_flat", "parse_special": False, "add_special": False,
              "text": " ".join(random.choice(flat) for _ in range(2500))})
cases.append({"name": "long_runs", "parse_special": False, "add_special": False,
              "text": "a" + " " * 5000 + "b" + "\n" * 3000 + "c" + "\t" * 2000 + "d"})
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "goldens",
                   "tokenize", "fuzz-texts.json")
with open(out, "w", encoding="utf-8") as f:
    f.write('{"cases": [\n' + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases)
            + "\n]}\n")
print(f"wrote {os.path.normpath(out)} ({len(cases)} cases)")
