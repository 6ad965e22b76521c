"""Drives a running longhaul-server with the official `openai` client.

Usage: python openai_client.py BASE_URL   (e.g. http://127.0.0.1:8080/v1)
Exits non-zero (an AssertionError) when a response is not what OpenAI's
API promises. Greedy SmolLM2-135M-Instruct answers are pinned to
llama-server's.
"""
import sys

import openai

LLAMA_SERVER_CHAT = (
    "L'Étoile, la Marseillaise, la femme au roi, la femme au roi, "
    "la femme au roi, la femme au roi,"
)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]

client = openai.OpenAI(base_url=sys.argv[1], api_key="test-key")

models = client.models.list()
model = models.data[0].id
assert model.endswith(".gguf"), model

# Chat, not streamed.
r = client.chat.completions.create(
    model=model, messages=QUESTION, max_tokens=40, temperature=0
)
assert r.object == "chat.completion", r
assert len(r.choices) == 1
c = r.choices[0]
assert c.message.role == "assistant"
assert c.message.content == LLAMA_SERVER_CHAT, repr(c.message.content)
assert c.finish_reason == "length", c.finish_reason
assert r.usage.completion_tokens == 40, r.usage
assert r.usage.prompt_tokens == 37, r.usage
assert r.usage.total_tokens == 77, r.usage

# Chat, streamed, with usage.
parts, finish, usage = [], [], None
for chunk in client.chat.completions.create(
    model=model,
    messages=QUESTION,
    max_tokens=40,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage = chunk.usage
    for ch in chunk.choices:
        if ch.delta.content:
            parts.append(ch.delta.content)
        if ch.finish_reason:
            finish.append(ch.finish_reason)
assert "".join(parts) == LLAMA_SERVER_CHAT, repr("".join(parts))
assert finish == ["length"], finish
assert usage is not None and usage.completion_tokens == 40, usage

# A stop string ends the reply early with finish_reason "stop".
r = client.chat.completions.create(
    model=model, messages=QUESTION, max_tokens=40, temperature=0, stop=["Marseillaise"]
)
assert r.choices[0].message.content == "L'Étoile, la ", repr(r.choices[0].message.content)
assert r.choices[0].finish_reason == "stop"

# Completions, not streamed and streamed.
r = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=8, temperature=0
)
text = r.choices[0].text
assert text, r
assert r.choices[0].finish_reason in ("stop", "length")
assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0, r.usage
streamed = "".join(
    ch.text
    for chunk in client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
    )
    for ch in chunk.choices
)
assert streamed == text, (streamed, text)

# Log probabilities: the client parses them into its types; greedy, so the
# sampled token is the most likely one and top_logprobs are sorted.
r = client.chat.completions.create(
    model=model, messages=QUESTION, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
)
content = r.choices[0].logprobs.content
assert len(content) == r.usage.completion_tokens, (content, r.usage)
for t in content:
    assert len(t.top_logprobs) == 3, t
    lps = [x.logprob for x in t.top_logprobs]
    assert lps == sorted(lps, reverse=True), lps
    assert t.token == t.top_logprobs[0].token and t.logprob == lps[0], t
    assert t.logprob <= 0 and isinstance(t.bytes, list), t
streamed = []
for chunk in client.chat.completions.create(
    model=model, messages=QUESTION, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
    stream=True,
):
    for ch in chunk.choices:
        if ch.logprobs is not None and ch.logprobs.content:
            streamed.extend(ch.logprobs.content)
assert [t.token for t in streamed] == [t.token for t in content], (streamed, content)
r = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2
)
lp = r.choices[0].logprobs
assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens, lp
assert all(len(t) <= 2 for t in lp.top_logprobs), lp
assert lp.text_offset[0] == 0, lp

# Errors surface as the client's exception types.
try:
    client.chat.completions.create(model=model, messages=QUESTION, n=2)
    raise AssertionError("n=2 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
bad = openai.OpenAI(base_url=sys.argv[1], api_key="wrong")
try:
    bad.models.list()
    raise AssertionError("a wrong API key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401

print("openai client: all checks passed")
