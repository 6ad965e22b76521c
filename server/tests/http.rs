//! Every endpoint over real HTTP on loopback, streamed and not, and each
//! error in OpenAI's error shape. Generation tests use the tiny random
//! Qwen3-MoE fixture (fast, no chat template); chat tests use SmolLM2.

mod common;

use std::path::Path;

use common::*;
use longhaul_server::HttpConfig;
use serde_json::{json, Value};

const PROMPT: &str = "The quick brown fox";

/// llama-server's greedy answer to "What is the capital of France?" with
/// SmolLM2-135M-Instruct Q4_1, max_tokens 40.
const LLAMA_SERVER_CHAT: &str =
    "L'Étoile, la Marseillaise, la femme au roi, la femme au roi, la femme au roi, la femme au roi,";

fn text_of(chunks: &[Value], pointer: &str) -> String {
    chunks
        .iter()
        .filter_map(|c| c.pointer(pointer).and_then(Value::as_str))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_while_loading_then_ok() {
    let s = start(
        &fixture(),
        Opts {
            loading: true,
            ..Opts::default()
        },
    );
    let c = client();
    let r = c.get(format!("{}/health", s.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let v: Value = r.json().await.unwrap();
    assert!(error_message(503, &v).contains("Loading"));
    let (st, v) = post(
        &c,
        &format!("{}/v1/completions", s.url),
        &json!({"prompt": "hi"}),
    )
    .await;
    assert_eq!(st, 503);
    error_message(503, &v);
    s.state.set_ready(load_ready(&fixture(), &Opts::default()));
    let (st, body) = get(&c, &format!("{}/health", s.url)).await;
    assert_eq!(st, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"status": "ok"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_props_and_not_found() {
    let s = start(&fixture(), Opts::default());
    let c = client();
    let (st, body) = get(&c, &format!("{}/v1/models", s.url)).await;
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "qwen3moe-f32.gguf");
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["meta"]["n_ctx"], 256);

    let (st, body) = get(&c, &format!("{}/props", s.url)).await;
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["total_slots"], 2);
    assert_eq!(v["default_generation_settings"]["n_ctx"], 256);
    assert!(v["model_path"]
        .as_str()
        .unwrap()
        .ends_with("qwen3moe-f32.gguf"));

    let (st, body) = get(&c, &format!("{}/nope", s.url)).await;
    assert_eq!(st, 404);
    error_message(404, &serde_json::from_str(&body).unwrap());
    let (st, body) = get(&c, &format!("{}/v1/completions", s.url)).await;
    assert_eq!(st, 405);
    error_message(405, &serde_json::from_str(&body).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_streamed_and_not_agree() {
    let s = start(&fixture(), Opts::default());
    let c = client();
    let url = format!("{}/v1/completions", s.url);
    let req = json!({"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let (st, v) = post(&c, &url, &req).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 12);
    let n_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(n_prompt > 0);
    assert_eq!(v["usage"]["total_tokens"].as_u64().unwrap(), n_prompt + 12);

    // Streamed: the same text, a finish reason, usage on request, then [DONE].
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let chunks = post_sse(&c, &url, &sreq).await;
    assert_eq!(chunks.last().unwrap(), "[DONE]");
    assert_eq!(text_of(&chunks, "/choices/0/text"), text);
    let fin: Vec<_> = chunks
        .iter()
        .filter_map(|c| {
            c.pointer("/choices/0/finish_reason")
                .and_then(Value::as_str)
        })
        .collect();
    assert_eq!(fin, ["length"]);
    let usage = &chunks[chunks.len() - 2];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 12);

    // The prompt as token ids gives the same output.
    let (_, toks) = post(
        &c,
        &format!("{}/tokenize", s.url),
        &json!({"content": PROMPT, "add_special": true}),
    )
    .await;
    let mut treq = req.clone();
    treq["prompt"] = toks["tokens"].clone();
    let (st, v) = post(&c, &url, &treq).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], text.as_str());
    assert_eq!(v["usage"]["prompt_tokens"].as_u64().unwrap(), n_prompt);

    // A stop string cuts the text before it.
    let stop: String = text.chars().skip(4).take(3).collect();
    let mut stop_req = req.clone();
    stop_req["stop"] = json!([stop.clone(), "never-seen-XYZ"]);
    let (st, v) = post(&c, &url, &stop_req).await;
    assert_eq!(st, 200, "{v}");
    let cut = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(cut, &text[..text.find(&stop).unwrap()]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // The same among 1,024 strings (the most a request may give: each is
    // checked at every step of every slot); 1,025 are a 400 naming `stop`.
    let mut many: Vec<String> = (0..1022).map(|i| format!("never-{i}-XYZ")).collect();
    many.push(stop.clone());
    many.push("never-seen-XYZ".into());
    stop_req["stop"] = json!(many);
    let (st, v) = post(&c, &url, &stop_req).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"].as_str(), Some(cut));
    many.push("one-too-many".into());
    stop_req["stop"] = json!(many);
    let (st, v) = post(&c, &url, &stop_req).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "stop", "{v}");
    // So is one string past 1 MiB of stop strings in all.
    stop_req["stop"] = json!([stop.clone(), "x".repeat((1 << 20) + 1 - stop.len())]);
    let (st, v) = post(&c, &url, &stop_req).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "stop", "{v}");
    stop_req["stop"] = json!([stop.clone(), "x".repeat((1 << 20) - stop.len())]);
    let (st, v) = post(&c, &url, &stop_req).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"].as_str(), Some(cut));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_completion_streamed_and_not() {
    let s = start(&fixture(), Opts::default());
    let c = client();
    let url = format!("{}/completion", s.url);
    let req = json!({"prompt": PROMPT, "n_predict": 10, "temperature": 0, "ignore_eos": true, "cache_prompt": true});
    let (st, v) = post(&c, &url, &req).await;
    assert_eq!(st, 200, "{v}");
    let content = v["content"].as_str().unwrap().to_string();
    assert_eq!(v["stop"], true);
    assert_eq!(v["stop_type"], "limit");
    assert_eq!(v["tokens_predicted"], 10);
    let t = &v["timings"];
    assert_eq!(t["predicted_n"], 10);
    assert!(t["prompt_n"].as_u64().unwrap() > 0);
    // In llama-server's order (`server_slot_stats::to_json`): serde_json's
    // `preserve_order` keeps keys as written and as received.
    let keys: Vec<&str> = t.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "cache_n",
            "prompt_n",
            "prompt_ms",
            "prompt_per_token_ms",
            "prompt_per_second",
            "predicted_n",
            "predicted_ms",
            "predicted_per_token_ms",
            "predicted_per_second"
        ]
    );
    for k in [
        "prompt_ms",
        "prompt_per_second",
        "predicted_ms",
        "predicted_per_second",
        "predicted_per_token_ms",
    ] {
        assert!(t[k].as_f64().unwrap() > 0.0, "{k}: {t}");
    }
    assert_eq!(v["generation_settings"]["n_predict"], 10);

    // Again with cache_prompt: the prompt prefix is reused, same content.
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let chunks = post_sse(&c, &url, &sreq).await;
    assert_ne!(
        chunks.last().unwrap(),
        "[DONE]",
        "native streams end without [DONE]"
    );
    assert_eq!(text_of(&chunks, "/content"), content);
    let last = chunks.last().unwrap();
    assert_eq!(last["stop"], true);
    assert_eq!(last["tokens_predicted"], 10);
    assert!(last["timings"]["cache_n"].as_u64().unwrap() > 0, "{last}");
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["stop"] == false));

    // n_predict 0: nothing generated.
    let (st, v) = post(&c, &url, &json!({"prompt": PROMPT, "n_predict": 0})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["content"], "");
    assert_eq!(v["tokens_predicted"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize() {
    let s = start(&fixture(), Opts::default());
    let c = client();
    let (st, v) = post(
        &c,
        &format!("{}/tokenize", s.url),
        &json!({"content": PROMPT}),
    )
    .await;
    assert_eq!(st, 200);
    let ids = v["tokens"].clone();
    assert!(!ids.as_array().unwrap().is_empty());
    let (st, v) = post(
        &c,
        &format!("{}/detokenize", s.url),
        &json!({"tokens": ids}),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(v["content"], PROMPT);
    let (st, v) = post(
        &c,
        &format!("{}/tokenize", s.url),
        &json!({"content": PROMPT, "with_pieces": true}),
    )
    .await;
    assert_eq!(st, 200);
    let pieces: String = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["piece"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(pieces, PROMPT);
    let (st, v) = post(
        &c,
        &format!("{}/detokenize", s.url),
        &json!({"tokens": [1, 999999999]}),
    )
    .await;
    assert_eq!(st, 400);
    assert!(error_message(400, &v).contains("out of range"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streamed_and_not_smollm2() {
    let s = start(
        &smollm2(),
        Opts {
            n_ctx: 512,
            ..Opts::default()
        },
    );
    let c = client();
    let url = format!("{}/v1/chat/completions", s.url);
    let req = json!({
        "model": "whatever",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 40,
        "temperature": 0,
    });
    let (st, v) = post(&c, &url, &req).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // llama-server (tools/compare-llama-server.py) answers exactly this
    // for the same request: same template rendering, tokens and output.
    assert_eq!(content, LLAMA_SERVER_CHAT, "{v}");
    let fin = v["choices"][0]["finish_reason"]
        .as_str()
        .unwrap()
        .to_string();
    let n_gen = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(
        fin == "stop" && n_gen < 40 || fin == "length" && n_gen == 40,
        "{v}"
    );

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let chunks = post_sse(&c, &url, &sreq).await;
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(text_of(&chunks, "/choices/0/delta/content"), content);
    assert_eq!(chunks.last().unwrap(), "[DONE]");
    let usage = &chunks[chunks.len() - 2];
    assert_eq!(usage["usage"]["completion_tokens"].as_u64().unwrap(), n_gen);
    let fins: Vec<_> = chunks
        .iter()
        .filter_map(|c| {
            c.pointer("/choices/0/finish_reason")
                .and_then(Value::as_str)
        })
        .collect();
    assert_eq!(fins, [fin.as_str()]);

    // max_completion_tokens and content parts.
    let req2 = json!({
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}],
        "max_completion_tokens": 3,
        "temperature": 0,
    });
    let (st, v) = post(&c, &url, &req2).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert!(content.starts_with(v["choices"][0]["message"]["content"].as_str().unwrap()));

    // Sampling with a seed is reproducible.
    let seeded = json!({
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 16, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "min_p": 0.01, "seed": 42,
    });
    let (_, a) = post(&c, &url, &seeded).await;
    let (_, b) = post(&c, &url, &seeded).await;
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );

    // /apply-template renders SmolLM2's template (with its default system message).
    let (st, v) = post(
        &c,
        &format!("{}/apply-template", s.url),
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let p = v["prompt"].as_str().unwrap();
    assert!(p.contains("<|im_start|>user\nHi<|im_end|>"), "{p}");
    assert!(p.ends_with("<|im_start|>assistant\n"), "{p}");

    // A chat prompt over the context is refused after it is encoded
    // (about 600 tokens, but only 3 KB), or before where its length shows
    // it cannot fit (1 MiB: the message gives the lower bound).
    for (content, says) in [
        ("word ".repeat(600), "the prompt has 6"),
        ("word ".repeat(1 << 18), "the prompt has at least"),
    ] {
        let body = json!({"messages": [{"role": "user", "content": content}]});
        let (st, v) = post(&c, &url, &body).await;
        assert_eq!(st, 400, "{v}");
        let m = error_message(400, &v);
        assert!(m.contains(says) && m.contains("context holds 512"), "{m}");
        assert_eq!(v["error"]["param"], "messages/prompt", "{v}");
    }
}

/// transformers' render of Qwen3's template for `messages` with
/// `enable_thinking` set to `on` (tests/fixtures/templates/goldens.json,
/// tools/template_goldens.py).
fn qwen3_golden(messages: &Value, on: bool) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/templates");
    let goldens: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("goldens.json")).unwrap()).unwrap();
    let g = goldens
        .as_array()
        .unwrap()
        .iter()
        .find(|g| {
            g["template"] == "Qwen-Qwen3-0.6B.jinja"
                && g["messages"] == *messages
                && g["kwargs"] == json!({ "enable_thinking": on })
        })
        .unwrap();
    g["text"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_template_kwargs_reasoning_effort_and_reasoning_content_reach_the_template() {
    // SmolLM2 served with Qwen3's template and `--reasoning off`, as
    // llama-server takes them: the request's `chat_template_kwargs` replace
    // the server's, `reasoning_effort: "none"` turns thinking off, an
    // assistant's `reasoning_content` is given to the template, and an
    // `enable_thinking` that is a string is refused.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/templates");
    let qwen3 = std::fs::read_to_string(dir.join("Qwen-Qwen3-0.6B.jinja")).unwrap();
    let hi = json!([{"role": "user", "content": "Hi"}]);
    let (on, off) = (qwen3_golden(&hi, true), qwen3_golden(&hi, false));
    assert_ne!(on, off);
    let s = start(
        &smollm2(),
        Opts {
            n_ctx: 512,
            chat_template: Some(qwen3.clone()),
            template_kwargs: json!({"enable_thinking": false})
                .as_object()
                .unwrap()
                .clone(),
            ..Default::default()
        },
    );
    let c = client();
    let apply = format!("{}/apply-template", s.url);
    for (body, want) in [
        (json!({ "messages": hi }), &off),
        (
            json!({ "messages": hi, "chat_template_kwargs": {"enable_thinking": true} }),
            &on,
        ),
        (
            json!({ "messages": hi, "chat_template_kwargs": {"enable_thinking": true}, "reasoning_effort": "none" }),
            &on,
        ),
        (
            json!({ "messages": hi, "chat_template_kwargs": null, "reasoning_effort": "high" }),
            &off,
        ),
    ] {
        let (st, v) = post(&c, &apply, &body).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["prompt"].as_str().unwrap(), want.as_str(), "{body}");
    }
    // An assistant's `reasoning_content` reaches the template, which writes
    // it back as a thought.
    let thought = json!([
        {"role": "user", "content": "Think first: 3*3?"},
        {"role": "assistant", "content": "9", "reasoning_content": "three threes"},
    ]);
    let want = qwen3_golden(&thought, false);
    assert!(want.contains("<think>\nthree threes\n</think>"), "{want}");
    let body = json!({ "messages": thought, "add_generation_prompt": false });
    let (st, v) = post(&c, &apply, &body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["prompt"].as_str().unwrap(), want);

    let bad = json!({ "messages": hi, "chat_template_kwargs": {"enable_thinking": "false"} });
    let (st, v) = post(&c, &apply, &bad).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "chat_template_kwargs", "{v}");
    assert!(
        error_message(400, &v).contains("expected boolean, got string"),
        "{v}"
    );

    // The chat endpoint renders the same prompts: its prompt is the
    // golden's tokens (SmolLM2 adds no BOS).
    let chat = format!("{}/v1/chat/completions", s.url);
    let tokens = |text: &str| {
        let body = json!({ "content": text, "add_special": true });
        let (c, url) = (c.clone(), format!("{}/tokenize", s.url));
        async move {
            let (st, v) = post(&c, &url, &body).await;
            assert_eq!(st, 200, "{v}");
            v["tokens"].as_array().unwrap().len() as u64
        }
    };
    for (kwargs, want) in [(json!({"enable_thinking": true}), &on), (json!({}), &off)] {
        let body = json!({ "messages": hi, "chat_template_kwargs": kwargs, "max_tokens": 1 });
        let (st, v) = post(&c, &chat, &body).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(
            v["usage"]["prompt_tokens"].as_u64(),
            Some(tokens(want).await),
            "{kwargs}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors_have_openai_shape() {
    let s = start(
        &fixture(),
        Opts {
            n_ctx: 64,
            ..Opts::default()
        },
    );
    let c = client();
    let comp = format!("{}/v1/completions", s.url);
    let chat = format!("{}/v1/chat/completions", s.url);

    // Malformed JSON: 400.
    let r = c
        .post(&comp)
        .header("content-type", "application/json")
        .body("{\"prompt\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    error_message(400, &r.json::<Value>().await.unwrap());
    // Well-formed JSON of the wrong shape: 422.
    for (url, body) in [
        (&comp, json!({"max_tokens": 4})),
        (&comp, json!({"prompt": "x", "max_tokens": "four"})),
        (&chat, json!({"messages": 5})),
        (&chat, json!({"messages": [{"content": "no role"}]})),
        (&comp, json!({"prompt": [1.5]})),
    ] {
        let (st, v) = post(&c, url, &body).await;
        assert_eq!(st, 422, "{body}: {v}");
        error_message(422, &v);
    }
    // Invalid values: 400 naming the field.
    for (url, body, field) in [
        (&comp, json!({"prompt": "x", "n": 2}), "n"),
        // Out of f32's range: infinite. (A negative temperature is greedy
        // and top_p 1.5 is top_p 1, as in llama.cpp; the full table of
        // sampling values, shared with the CLI, is in cli/tests/sampling.rs.)
        (
            &comp,
            json!({"prompt": "x", "temperature": 1e39}),
            "temperature",
        ),
        (
            &comp,
            json!({"prompt": "x", "repeat_penalty": 0}),
            "repeat_penalty",
        ),
        (
            &comp,
            json!({"prompt": "x", "max_tokens": -5}),
            "max_tokens",
        ),
        (&comp, json!({"prompt": [5, 99999999]}), "prompt"),
        (&comp, json!({"prompt": ["a", "b"]}), "prompt"),
        (&chat, json!({"messages": []}), "messages"),
        // The fixture has no chat template.
        (
            &chat,
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            "messages",
        ),
    ] {
        let (st, v) = post(&c, url, &body).await;
        assert_eq!(st, 400, "{body}: {v}");
        error_message(400, &v);
        assert_eq!(v["error"]["param"], field, "{v}");
    }
    // A prompt longer than the context: 400 saying the limit.
    let long = "word ".repeat(200);
    for url in [&comp, &format!("{}/completion", s.url)] {
        let (st, v) = post(&c, url, &json!({"prompt": long, "max_tokens": 4})).await;
        assert_eq!(st, 400, "{v}");
        let m = error_message(400, &v);
        assert!(m.contains("context holds 64"), "{m}");
    }
    // One that cannot fit by its length alone is refused before it is
    // encoded (the message gives the lower bound), as are chat prompts.
    let huge = "word ".repeat(1 << 18);
    for (url, body) in [
        (&comp, json!({"prompt": huge})),
        (
            &format!("{}/completion", s.url),
            json!({"prompt": [1, huge]}),
        ),
    ] {
        let (st, v) = post(&c, url, &body).await;
        assert_eq!(st, 400, "{v}");
        let m = error_message(400, &v);
        assert!(
            m.contains("has at least") && m.contains("context holds 64"),
            "{m}"
        );
        assert_eq!(v["error"]["param"], "messages/prompt", "{v}");
    }
    // The server is still fine.
    let (st, v) = post(
        &c,
        &comp,
        &json!({"prompt": "x", "max_tokens": 2, "ignore_eos": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_and_body_limit() {
    let s = start(
        &fixture(),
        Opts {
            http: HttpConfig {
                api_key: Some("sekrit".into()),
                body_limit: 1024,
                ..HttpConfig::default()
            },
            ..Opts::default()
        },
    );
    let c = client();
    let url = format!("{}/v1/completions", s.url);
    let body = json!({"prompt": "hi", "max_tokens": 2});
    let r = c.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert!(error_message(401, &r.json::<Value>().await.unwrap()).contains("API key"));
    let r = c
        .post(&url)
        .bearer_auth("wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c.get(format!("{}/v1/models", s.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .post(&url)
        .bearer_auth("sekrit")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // /health needs no key.
    let (st, _) = get(&c, &format!("{}/health", s.url)).await;
    assert_eq!(st, 200);
    // Over the body limit: 413.
    let big = json!({"prompt": "x".repeat(4096)});
    let r = c
        .post(&url)
        .bearer_auth("sekrit")
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    error_message(413, &r.json::<Value>().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_tokens_and_longhaul() {
    let s = start(
        &fixture(),
        Opts {
            longhaul: true,
            ..Opts::default()
        },
    );
    let c = client();
    let (st, v) = post(
        &c,
        &format!("{}/completion", s.url),
        &json!({"prompt": PROMPT, "n_predict": 6, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let r = c.get(format!("{}/metrics", s.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = r.text().await.unwrap();
    let value = |name: &str| metric(&text, name);
    assert!(value("prompt_tokens_total") > 0.0);
    // The scheduler counts evaluated tokens: the last sampled one is not.
    assert!(value("tokens_predicted_total") >= 5.0, "{text}");
    assert!(value("tokens_predicted_seconds_total") > 0.0);
    assert!(value("requests_processing") <= 1.0);
    assert_eq!(value("longhaul_enabled"), 1.0);
    assert!(value("longhaul_bytes_read_total") > 0.0, "{text}");
    assert!(value("longhaul_misses_total") > 0.0);
    let hr = value("longhaul_hit_rate");
    assert!((0.0..=1.0).contains(&hr));
    value("longhaul_io_seconds_total");
    assert!(text.contains("# TYPE longhaul:prompt_tokens_total counter"));
}

/// A hybrid model (Qwen3-Next: recurrent DeltaNet layers) on four slots:
/// four concurrent greedy requests each answer what it answers alone, and a
/// request that shares an earlier prompt but not its reply resumes from
/// that prompt's checkpoint, counted in `/metrics`, with a fresh run's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_slots_batch_and_resume_from_checkpoints() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/qwen3next-f32.gguf");
    let s = start(
        &path,
        Opts {
            n_slots: 4,
            ..Opts::default()
        },
    );
    let c = client();
    let url = format!("{}/completion", s.url);
    let body = |p: &str, cache: bool| json!({"prompt": p, "n_predict": 8, "temperature": 0, "ignore_eos": true, "cache_prompt": cache});
    let prompts = [
        "The quick brown fox",
        "A mixture of experts routes every token",
        "def fibonacci(n):",
        "The capital of France is Paris. The capital of Italy is",
    ];
    let mut alone = Vec::new();
    for p in prompts {
        let (st, v) = post(&c, &url, &body(p, false)).await;
        assert_eq!(st, 200, "{v}");
        alone.push(v["content"].as_str().unwrap().to_string());
    }
    let bodies: Vec<Value> = prompts.iter().map(|p| body(p, false)).collect();
    let together = futures_util::future::join_all(bodies.iter().map(|b| post(&c, &url, b))).await;
    for ((st, v), want) in together.iter().zip(&alone) {
        assert_eq!(*st, 200, "{v}");
        assert_eq!(v["content"].as_str().unwrap(), want, "batched vs alone");
    }
    // One slot's cache now holds a long prompt and its reply; a request
    // sharing the prompt only goes back to its checkpoint.
    let long = "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14159";
    let follow = format!("{long} and 2.71828");
    let (_, fresh) = post(&c, &url, &body(&follow, false)).await;
    let (st, _) = post(&c, &url, &body(long, true)).await;
    assert_eq!(st, 200);
    let (st, v) = post(&c, &url, &body(&follow, true)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["content"], fresh["content"], "resumed vs fresh");
    let (_, text) = get(&c, &format!("{}/metrics", s.url)).await;
    let value = |name: &str| metric(&text, name);
    assert!(value("checkpoints_created_total") >= 1.0, "{text}");
    assert!(value("checkpoints_restored_total") >= 1.0, "{text}");
}
