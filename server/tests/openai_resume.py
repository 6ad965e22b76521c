"""One greedy chat completion through the official `openai` client; prints
its text, usage and llama.cpp `timings` as one JSON line, so that a test
can compare a run before a server restart with one after it.

Usage: python openai_resume.py BASE_URL
"""
import json
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="none")
model = client.models.list().data[0].id
r = client.chat.completions.create(
    model=model,
    messages=[
        {"role": "system", "content": "You are a patient geography teacher."},
        {"role": "user", "content": "Name the capitals of France, Italy and Spain, and say one thing about each."},
    ],
    max_tokens=24,
    temperature=0,
)
timings = (r.model_extra or {}).get("timings") or {}
print(json.dumps({
    "content": r.choices[0].message.content,
    "prompt_tokens": r.usage.prompt_tokens,
    "cached_tokens": r.usage.prompt_tokens_details.cached_tokens,
    "prompt_n": timings.get("prompt_n"),
}))
