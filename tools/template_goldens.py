#!/usr/bin/env python3
"""Renders every chat template in tests/fixtures/templates/*.jinja with
Hugging Face transformers (render_jinja_template, the code behind
apply_chat_template) over a few fixed conversations, each with the chat_template_kwargs llama.cpp
gives it (enable_thinking true and false; reasoning_effort where the template
reads it), and writes the texts
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
    (
        [
            {"role": "user", "content": "Think first: 3*3?"},
            {"role": "assistant", "content": "9", "reasoning_content": "three threes"},
        ],
        False,
    ),
]


def kwargs_for(source):
    """llama-server always defines enable_thinking (true where the template
    has a thinking mode): both values; reasoning_effort where it is read."""
    out = [{"enable_thinking": True}, {"enable_thinking": False}]
    if "reasoning_effort" in source:
        out.append({"enable_thinking": False, "reasoning_effort": "high"})
    return out


def main():
    goldens = []
    for path in sorted(DIR.glob("*.jinja")):
        source = path.read_text()
        for messages, add_generation_prompt in CONVERSATIONS:
            for kwargs in kwargs_for(source):
                texts, _ = render_jinja_template(
                    [messages],
                    chat_template=source,
                    add_generation_prompt=add_generation_prompt,
                    bos_token="",
                    eos_token="",
                    **kwargs,
                )
                goldens.append(
                    {
                        "template": path.name,
                        "messages": messages,
                        "add_generation_prompt": add_generation_prompt,
                        "kwargs": kwargs,
                        "text": texts[0],
                    }
                )
    out = DIR / "goldens.json"
    out.write_text(json.dumps(goldens, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(goldens)} renders -> {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
