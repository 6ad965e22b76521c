//! Structured output on SmolLM2-135M-Instruct: every sampled completion
//! (temperature 1, several seeds) under a GBNF grammar, a JSON schema or
//! `response_format` parses and validates against the schema with an
//! independent validator (the `jsonschema` crate); tools with
//! `tool_choice: "required"` (the Qwen2.5 template of llama.cpp's
//! models/templates) produce calls of a declared function whose arguments
//! validate; a grammar or schema that does not compile is a 400.

mod common;

use std::path::Path;

use common::*;
use serde_json::{json, Value};

const SEEDS: [u64; 4] = [1, 2, 3, 4];

/// The schema the answers must meet (bounded strings and numbers so that a
/// sampled answer completes within its token budget).
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"enum": ["Paris", "Rome", "Oslo"]},
        },
        "required": ["name", "age", "city"],
        "additionalProperties": false,
    })
}

/// `text` parsed as JSON and checked against `schema` by `jsonschema`.
fn assert_valid(schema: &Value, text: &str, what: &str) -> Value {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(schema).expect("schema");
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{what}: {text:?} fails the schema: {errors:?}"
    );
    v
}

fn qwen_template() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn server(chat_template: Option<String>) -> TestServer {
    start(
        &smollm2(),
        Opts {
            n_ctx: 1024,
            chat_template,
            ..Opts::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gbnf_grammar_every_seed_matches() {
    let s = server(None);
    let c = client();
    // A GBNF grammar as llama.cpp's grammars/README.md writes them: the
    // language of `person_schema` in one spelling, with escapes, classes,
    // bounded repetition and a rule with a dash in its name.
    let grammar = r#"root ::= "{" ws "\"name\": \"" name-chars "\"," ws "\"age\": " age "," ws "\"city\": " city ws "}"
name-chars ::= [A-Z] [a-z]{0,10}
age ::= [0-9] | [1-9] [0-9]
city ::= "\"Paris\"" | "\"Rome\"" | "\"Oslo\""
ws ::= [ ]?
"#;
    for seed in SEEDS {
        let (st, v) = post(
            &c,
            &format!("{}/completion", s.url),
            &json!({
                "prompt": "Describe a person as JSON:",
                "grammar": grammar,
                "temperature": 1.0,
                "seed": seed,
                "n_predict": 64,
            }),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        let text = v["content"].as_str().unwrap();
        assert_valid(
            &person_schema(),
            text,
            &format!("/completion grammar seed {seed}"),
        );
        // A complete grammar ends the generation.
        assert_eq!(v["stop_type"], "eos", "{v}");
    }
    // The same through /v1/completions, streamed.
    let chunks = post_sse(
        &c,
        &format!("{}/v1/completions", s.url),
        &json!({"prompt": "Person:", "grammar": grammar, "temperature": 1.0, "seed": 7, "max_tokens": 64, "stream": true}),
    )
    .await;
    let text: String = chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/text").and_then(Value::as_str))
        .collect();
    assert_valid(&person_schema(), &text, "/v1/completions grammar streamed");
    let fins: Vec<_> = chunks
        .iter()
        .filter_map(|c| {
            c.pointer("/choices/0/finish_reason")
                .and_then(Value::as_str)
        })
        .collect();
    assert_eq!(fins, ["stop"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_and_response_format_every_seed_validates() {
    let s = server(None);
    let c = client();
    let schema = person_schema();
    for seed in SEEDS {
        // llama-server's native `json_schema`.
        let (st, v) = post(
            &c,
            &format!("{}/completion", s.url),
            &json!({
                "prompt": "A person as JSON:",
                "json_schema": schema,
                "temperature": 1.0,
                "seed": seed,
                "n_predict": 96,
            }),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        assert_valid(
            &schema,
            v["content"].as_str().unwrap(),
            &format!("json_schema seed {seed}"),
        );

        // OpenAI's response_format json_schema on chat.
        let (st, v) = post(
            &c,
            &format!("{}/v1/chat/completions", s.url),
            &json!({
                "messages": [{"role": "user", "content": "Invent a person. Answer in JSON."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
                "temperature": 1.0,
                "seed": seed,
                "max_tokens": 96,
            }),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert_valid(&schema, text, &format!("response_format seed {seed}"));
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");

        // json_object: any JSON object.
        let (st, v) = post(
            &c,
            &format!("{}/v1/chat/completions", s.url),
            &json!({
                "messages": [{"role": "user", "content": "Give me a tiny JSON object."}],
                "response_format": {"type": "json_object"},
                "temperature": 1.0,
                "seed": seed,
                "max_tokens": 200,
            }),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        if v["choices"][0]["finish_reason"] == "stop" {
            let text = v["choices"][0]["message"]["content"].as_str().unwrap();
            assert_valid(
                &json!({"type": "object"}),
                text,
                &format!("json_object seed {seed}"),
            );
        }
    }
    // Streamed chat with response_format.
    let chunks = post_sse(
        &c,
        &format!("{}/v1/chat/completions", s.url),
        &json!({
            "messages": [{"role": "user", "content": "A person, as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
            "temperature": 1.0, "seed": 11, "max_tokens": 96, "stream": true,
        }),
    )
    .await;
    let text: String = chunks
        .iter()
        .filter_map(|c| {
            c.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
        })
        .collect();
    assert_valid(&schema, &text, "response_format streamed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_grammars_and_schemas_are_400() {
    let s = server(None);
    let c = client();
    let url = format!("{}/completion", s.url);
    let cases = [
        (
            json!({"prompt": "x", "grammar": "root ::= undefined-rule\n"}),
            "grammar",
            "undefined-rule",
        ),
        (
            json!({"prompt": "x", "grammar": "root ::= \"a\n"}),
            "grammar",
            "GBNF",
        ),
        (
            json!({"prompt": "x", "grammar": "start ::= \"a\"\n"}),
            "grammar",
            "root",
        ),
        (
            json!({"prompt": "x", "json_schema": {"type": "nonsense"}}),
            "json_schema",
            "schema",
        ),
    ];
    for (body, field, needle) in cases {
        let (st, v) = post(&c, &url, &body).await;
        assert_eq!(st, 400, "{body}: {v}");
        let msg = error_message(st, &v);
        assert!(msg.contains(needle), "{body}: {msg}");
        assert_eq!(v["error"]["param"], field, "{v}");
    }
    // Both a schema and a grammar: refused on the OpenAI endpoints, the
    // grammar wins on /completion (llama-server's server-common.cpp and
    // server-schema.cpp).
    let both = json!({"prompt": "x", "json_schema": {"type": "object"}, "grammar": "root ::= \"a\"\n", "max_tokens": 4, "n_predict": 4});
    let (st, v) = post(&c, &format!("{}/v1/completions", s.url), &both).await;
    assert_eq!(st, 400, "{v}");
    assert!(error_message(st, &v).contains("not both"), "{v}");
    let (st, v) = post(&c, &url, &both).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["content"], "a", "{v}");
    let (st, v) = post(
        &c,
        &format!("{}/v1/chat/completions", s.url),
        &json!({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "yaml"}}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(error_message(st, &v).contains("response_format"), "{v}");
}

/// A grammar that compiles but that llguidance cannot follow past its
/// first token (2,500 alternatives at one point, past its 2,000 items in a
/// row) is the request's to change: a 400 with the parser's reason, not a
/// 500, streamed or not; the slot serves the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grammar_that_fails_part_way_is_a_400() {
    let s = server(None);
    let c = client();
    let alts: Vec<String> = (0..2_500).map(|i| format!("\"w{i}\"")).collect();
    let grammar = format!("root ::= {}\n", alts.join(" | "));
    let body =
        json!({"prompt": "Say a word:", "grammar": grammar, "n_predict": 8, "max_tokens": 8});
    for path in ["/completion", "/v1/completions"] {
        let (st, v) = post(&c, &format!("{}{path}", s.url), &body).await;
        assert_eq!(st, 400, "{path}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        let msg = error_message(st, &v);
        assert!(msg.contains("grammar") && msg.contains("2000"), "{msg}");
    }
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    for path in ["/completion", "/v1/completions"] {
        let events = post_sse(&c, &format!("{}{path}", s.url), &streamed).await;
        let err = events
            .iter()
            .find(|e| e.get("error").is_some())
            .unwrap_or_else(|| panic!("{path}: no error event in {events:?}"));
        assert_eq!(err["error"]["code"], 400, "{err}");
    }
    let (st, v) = post(
        &c,
        &format!("{}/completion", s.url),
        &json!({"prompt": "x", "grammar": "root ::= \"yes\" | \"no\"\n", "n_predict": 4}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert!(v["content"] == "yes" || v["content"] == "no", "{v}");
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 1, "maxLength": 16},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": false,
            },
        }},
        {"type": "function", "function": {
            "name": "get_time",
            "description": "Current time in a time zone",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 20}},
                "required": ["zone"],
                "additionalProperties": false,
            },
        }},
    ])
}

/// The schema of the declared function `name`.
fn tool_schema(tools: &Value, name: &str) -> Value {
    tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not a declared function"))["function"]["parameters"]
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_required_gives_valid_calls() {
    let s = server(Some(qwen_template()));
    let c = client();
    let url = format!("{}/v1/chat/completions", s.url);
    let tools = weather_tools();
    for seed in SEEDS {
        let (st, v) = post(
            &c,
            &url,
            &json!({
                "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
                "tools": tools,
                "tool_choice": "required",
                "parallel_tool_calls": false,
                "temperature": 1.0,
                "seed": seed,
                "max_tokens": 96,
            }),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
        let calls = choice["message"]["tool_calls"]
            .as_array()
            .expect("tool_calls");
        assert_eq!(calls.len(), 1, "{v}");
        let f = &calls[0]["function"];
        assert_eq!(calls[0]["type"], "function");
        assert!(
            calls[0]["id"].as_str().is_some_and(|id| !id.is_empty()),
            "{v}"
        );
        let name = f["name"].as_str().unwrap();
        assert_valid(
            &tool_schema(&tools, name),
            f["arguments"].as_str().unwrap(),
            &format!("tool call seed {seed}"),
        );
    }
    // A named function: only that one may be called.
    let (st, v) = post(
        &c,
        &url,
        &json!({
            "messages": [{"role": "user", "content": "Hello"}],
            "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
            "temperature": 1.0, "seed": 5, "max_tokens": 96,
        }),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let f = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(f["name"], "get_time", "{v}");
    assert_valid(
        &tool_schema(&tools, "get_time"),
        f["arguments"].as_str().unwrap(),
        "named",
    );

    // Streamed: the call arrives as delta.tool_calls.
    let chunks = post_sse(
        &c,
        &url,
        &json!({
            "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
            "temperature": 1.0, "seed": 9, "max_tokens": 96, "stream": true,
        }),
    )
    .await;
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/delta/tool_calls/0"))
        .collect();
    assert_eq!(deltas.len(), 1, "{chunks:?}");
    let name = deltas[0]["function"]["name"].as_str().unwrap();
    assert_valid(
        &tool_schema(&tools, name),
        deltas[0]["function"]["arguments"].as_str().unwrap(),
        "streamed call",
    );
    let fins: Vec<_> = chunks
        .iter()
        .filter_map(|c| {
            c.pointer("/choices/0/finish_reason")
                .and_then(Value::as_str)
        })
        .collect();
    assert_eq!(fins, ["tool_calls"]);

    // History with the call and its result renders (Qwen's template writes
    // the call back as <tool_call> and the result as <tool_response>).
    let (st, v) = post(
        &c,
        &format!("{}/apply-template", s.url),
        &json!({"messages": [
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\",\"unit\":\"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
        ]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let p = v["prompt"].as_str().unwrap();
    let call = p
        .split("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ")
        .nth(1)
        .and_then(|rest| rest.split("}\n</tool_call>").next())
        .unwrap_or_else(|| panic!("no <tool_call> in {p}"));
    let args: Value = serde_json::from_str(call).unwrap_or_else(|e| panic!("{e}: {call}"));
    assert_eq!(args, json!({"city": "Rome", "unit": "celsius"}));
    assert!(p.contains("<tool_response>\n21 C\n</tool_response>"), "{p}");

    // Errors: a named function that is not declared, tools on a template
    // without a tool syntax, a grammar with tools.
    let (st, v) = post(
        &c,
        &url,
        &json!({"messages": [{"role": "user", "content": "x"}], "tools": tools,
                "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = post(
        &c,
        &url,
        &json!({"messages": [{"role": "user", "content": "x"}], "tools": tools,
                "tool_choice": "required", "grammar": "root ::= \"a\"\n"}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_need_a_tool_template() {
    // SmolLM2's own template has no tool-call syntax.
    let s = server(None);
    let (st, v) = post(
        &client(),
        &format!("{}/v1/chat/completions", s.url),
        &json!({"messages": [{"role": "user", "content": "x"}], "tools": weather_tools()}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(
        error_message(st, &v).contains("--chat-template-file"),
        "{v}"
    );
}
