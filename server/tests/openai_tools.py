"""Tool calls through the official `openai` client, against a running
longhaul-server serving SmolLM2-135M-Instruct with llama.cpp's Qwen2.5
chat template (`--chat-template-file`).

Usage: python openai_tools.py BASE_URL
With tool_choice "required" every sampled reply (temperature 1, several
seeds), streamed and not, must be a call of a declared function whose
arguments parse as JSON and satisfy that function's schema. The schema is
checked here by hand (no validator package is assumed): the required keys,
no others, the types and the enum.
"""
import json
import sys

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 1, "maxLength": 16},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a time zone",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 20}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
MESSAGES = [{"role": "user", "content": "What's the weather like in Paris today?"}]


def check_call(name, arguments):
    args = json.loads(arguments)
    assert isinstance(args, dict), arguments
    if name == "get_weather":
        assert set(args) == {"city", "unit"}, args
        assert isinstance(args["city"], str) and 1 <= len(args["city"]) <= 16, args
        assert args["unit"] in ("celsius", "fahrenheit"), args
    elif name == "get_time":
        assert set(args) == {"zone"}, args
        assert isinstance(args["zone"], str) and len(args["zone"]) <= 20, args
    else:
        raise AssertionError(f"{name!r} is not a declared function")


client = openai.OpenAI(base_url=sys.argv[1], api_key="unused")
model = client.models.list().data[0].id

for seed in (1, 2, 3):
    r = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=seed,
        max_tokens=96,
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    calls = c.message.tool_calls
    assert calls and len(calls) == 1, c.message
    assert calls[0].type == "function" and calls[0].id, calls[0]
    check_call(calls[0].function.name, calls[0].function.arguments)

    # Streamed: the client's deltas assemble into one call.
    name, arguments, finish = None, "", []
    for chunk in client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=seed,
        max_tokens=96,
        stream=True,
    ):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                assert tc.index == 0, tc
                if tc.function.name:
                    name = tc.function.name
                arguments += tc.function.arguments or ""
            if ch.finish_reason:
                finish.append(ch.finish_reason)
    assert finish == ["tool_calls"], finish
    check_call(name, arguments)

# The call and its result go back into the history; the next turn is a
# plain answer when tools are not required.
r = client.chat.completions.create(
    model=model,
    messages=MESSAGES
    + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ],
    tools=TOOLS,
    tool_choice="none",
    temperature=0,
    max_tokens=16,
)
assert r.choices[0].message.content, r
assert not r.choices[0].message.tool_calls, r

print("openai tools: all checks passed")
