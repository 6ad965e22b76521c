#!/usr/bin/env python3
"""Renders every chat template in tests/fixtures/templates/*.jinja with
Hugging Face transformers (render_jinja_template, the code behind
apply_chat_template) over a few fixed conversations, and writes the texts
to tests/fixtures/templates/goldens.json, which the tests of
src/tokenizer/chat.rs render again and compare byte for byte.

    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install transformers
    /tmp/tfenv/bin/python tools/template_goldens.py

No model and no torch: transformers renders templates with jinja2 alone.
"""
import json
import pathlib

from transformers.utils.chat_template_utils import render_jinja_template

ROOT = pathlib.Path(__file__).resolve().parent.parent
DIR = ROOT / "tests" / "fixtures" / "templates"

CONVERSATIONS = [
    # (messages, add_generation_prompt)
    ([{"role": "user", "content": "Hi"}], True),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "What is 2+2?"},
        ],
        True,
    ),
    (
        [
            {"role": "user", "content": "Think first: 3*3?"},
            {"role": "assistant", "content": "<think>\nthree threes\n</think>\n\n9"},
        ],
        False,
    ),
]


def main():
    goldens = []
    for path in sorted(DIR.glob("*.jinja")):
        source = path.read_text()
        for messages, add_generation_prompt in CONVERSATIONS:
            texts, _ = render_jinja_template(
                [messages],
                chat_template=source,
                add_generation_prompt=add_generation_prompt,
                bos_token="",
                eos_token="",
            )
            goldens.append(
                {
                    "template": path.name,
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "text": texts[0],
                }
            )
    out = DIR / "goldens.json"
    out.write_text(json.dumps(goldens, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(goldens)} renders -> {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
