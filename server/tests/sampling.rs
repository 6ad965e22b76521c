//! Sampling fields over HTTP: log probabilities checked against the
//! engine's own logits (computed here, independently of the server, with
//! `Engine::eval`), penalties and logit bias checked against llama.cpp's
//! formulas applied by hand to those logits, and the fields this server
//! does not implement answered with a 400 that names them.

mod common;

use common::*;
use longhaul::backend::cpu::CpuBackend;
use longhaul::engine::{Engine, EngineParams};
use longhaul::model::Logits;
use longhaul::tensor::GgmlType;
use serde_json::{json, Value};

const PROMPT: &str = "The quick brown fox";

/// The engine the test server runs (the same settings as
/// `common::load_ready`), for reference logits.
fn reference_engine() -> Engine<CpuBackend> {
    let params = EngineParams {
        n_ctx: 256,
        n_ubatch: 512,
        kv_type: GgmlType::F16,
        ..Default::default()
    };
    Engine::load(&fixture(), CpuBackend::new(), params).expect("load the fixture")
}

/// The raw logits before each of `gen` (prompt, then one token at a time,
/// as the server decodes).
fn logits_along(e: &Engine<CpuBackend>, prompt: &[u32], gen: &[u32]) -> Vec<Vec<f32>> {
    let mut kv = e.new_kv().expect("kv");
    let mut out = vec![e.eval(&mut kv, prompt, Logits::Last).expect("eval")];
    for &t in &gen[..gen.len().saturating_sub(1)] {
        out.push(e.eval(&mut kv, &[t], Logits::Last).expect("eval"));
    }
    out
}

/// log_softmax in f64.
fn log_softmax(l: &[f32]) -> Vec<f64> {
    let max = l
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
    let lse = max
        + l.iter()
            .map(|&x| (f64::from(x) - max).exp())
            .sum::<f64>()
            .ln();
    l.iter().map(|&x| f64::from(x) - lse).collect()
}

/// Greedy decoding with `adjust` applied to each position's logits
/// (given the history so far): the reference for penalties and bias.
fn greedy_with(
    e: &Engine<CpuBackend>,
    prompt: &[u32],
    n: usize,
    adjust: impl Fn(&mut [f32], &[u32]),
) -> Vec<u32> {
    let mut kv = e.new_kv().expect("kv");
    let mut hist = prompt.to_vec();
    let mut logits = e.eval(&mut kv, prompt, Logits::Last).expect("eval");
    let mut out = Vec::new();
    for _ in 0..n {
        adjust(&mut logits, &hist);
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        out.push(best as u32);
        hist.push(best as u32);
        logits = e.eval(&mut kv, &[best as u32], Logits::Last).expect("eval");
    }
    out
}

fn ids_of(entries: &Value) -> Vec<u32> {
    entries
        .as_array()
        .expect("entries")
        .iter()
        .map(|t| t["id"].as_u64().expect("id") as u32)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_are_the_log_softmax_of_the_engine_logits() {
    let s = start(&fixture(), Opts::default());
    let c = client();
    let e = reference_engine();
    let prompt = e.tokenize(PROMPT).expect("tokenize");
    let n = 6;
    let (st, v) = post(
        &c,
        &format!("{}/completion", s.url),
        &json!({"prompt": PROMPT, "n_predict": n, "temperature": 0, "ignore_eos": true, "n_probs": 5}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let entries = &v["completion_probabilities"];
    let gen = ids_of(entries);
    assert_eq!(gen.len(), n);
    let reference = logits_along(&e, &prompt, &gen);
    for (k, (t, logits)) in entries
        .as_array()
        .unwrap()
        .iter()
        .zip(&reference)
        .enumerate()
    {
        let lsm = log_softmax(logits);
        let id = gen[k] as usize;
        // The server's values are f32 log-probabilities computed in f64:
        // they agree with ours to f32 rounding.
        let lp = t["logprob"].as_f64().unwrap();
        assert!(
            (lp - lsm[id]).abs() < 1e-5,
            "token {k}: {lp} vs {}",
            lsm[id]
        );
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 5);
        // Sorted, the greedy token first, each value the reference's.
        let mut want: Vec<usize> = (0..lsm.len()).collect();
        want.sort_by(|&a, &b| lsm[b].total_cmp(&lsm[a]).then(a.cmp(&b)));
        assert_eq!(
            top[0]["id"].as_u64(),
            Some(id as u64),
            "greedy = most likely"
        );
        for (j, x) in top.iter().enumerate() {
            let tid = x["id"].as_u64().unwrap() as usize;
            assert_eq!(tid, want[j], "token {k} rank {j}");
            assert!((x["logprob"].as_f64().unwrap() - lsm[tid]).abs() < 1e-5);
            assert!(x["bytes"].is_array() && x["token"].is_string());
        }
    }

    // Streamed: one entry per token, the same values.
    let chunks = post_sse(
        &c,
        &format!("{}/completion", s.url),
        &json!({"prompt": PROMPT, "n_predict": n, "temperature": 0, "ignore_eos": true, "n_probs": 5, "stream": true}),
    )
    .await;
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c.get("completion_probabilities"))
        .flat_map(|p| p.as_array().unwrap().clone())
        .collect();
    assert_eq!(&Value::Array(streamed), entries);

    // OpenAI's legacy completions: the same numbers in its shape.
    let (st, v) = post(
        &c,
        &format!("{}/v1/completions", s.url),
        &json!({"prompt": PROMPT, "max_tokens": n, "temperature": 0, "ignore_eos": true, "logprobs": 3}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let token_lps = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(token_lps.len(), n);
    for (k, x) in token_lps.iter().enumerate() {
        let want = log_softmax(&reference[k])[gen[k] as usize];
        assert!((x.as_f64().unwrap() - want).abs() < 1e-5);
        assert!(lp["top_logprobs"][k].as_object().unwrap().len() <= 3);
    }
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    let chunks = post_sse(
        &c,
        &format!("{}/v1/completions", s.url),
        &json!({"prompt": PROMPT, "max_tokens": n, "temperature": 0, "ignore_eos": true, "logprobs": 3, "stream": true}),
    )
    .await;
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/logprobs/token_logprobs/0").cloned())
        .collect();
    assert_eq!(&streamed, token_lps);

    // After the sampling chain, greedy leaves one token of probability 1.
    let (st, v) = post(
        &c,
        &format!("{}/completion", s.url),
        &json!({"prompt": PROMPT, "n_predict": 2, "temperature": 0, "ignore_eos": true, "n_probs": 4, "post_sampling_probs": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    for (k, t) in v["completion_probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_eq!(t["id"].as_u64(), Some(u64::from(gen[k])));
        assert_eq!(t["prob"].as_f64(), Some(1.0), "{t}");
        assert_eq!(t["top_probs"].as_array().unwrap().len(), 1, "{t}");
    }
    // Without a request for them, no probabilities and no field.
    let (_, v) = post(
        &c,
        &format!("{}/completion", s.url),
        &json!({"prompt": PROMPT, "n_predict": 2, "temperature": 0}),
    )
    .await;
    assert!(v.get("completion_probabilities").is_none(), "{v}");
}

/// One request could ask for the whole vocabulary at every token of its
/// context: before the bound, 200 tokens of SmolLM2's 49,152 took the
/// server to 16 GB. Past the bound each API's field is a 400 naming it,
/// before anything runs; within it, a count past the vocabulary lists the
/// whole vocabulary, as llama-server clamps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probabilities_past_the_per_request_bound_are_a_400() {
    let s = start(
        &smollm2(),
        Opts {
            n_ctx: 1024,
            ..Opts::default()
        },
    );
    let c = client();
    let huge = 1_000_000_000u64;
    let messages = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (
            "/completion",
            json!({"prompt": "hi", "n_probs": huge}),
            "n_probs",
        ),
        (
            "/completion",
            json!({"prompt": "hi", "n_probs": huge, "n_predict": 86}),
            "n_probs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "logprobs": huge}),
            "logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": messages, "logprobs": true, "top_logprobs": huge}),
            "top_logprobs",
        ),
    ];
    for (path, body, field) in cases {
        let (st, v) = post(&c, &format!("{}{path}", s.url), &body).await;
        assert_eq!(st, 400, "{path} {body}: {v}");
        assert_eq!(v["error"]["param"], field, "{v}");
        assert!(error_message(st, &v).contains("per request"), "{v}");
    }
    let (st, v) = post(
        &c,
        &format!("{}/completion", s.url),
        &json!({"prompt": "hi", "n_probs": huge, "n_predict": 2, "temperature": 0}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let entries = v["completion_probabilities"].as_array().expect("entries");
    assert_eq!(entries.len(), 2);
    for e in entries {
        let top = e["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), 49_152);
        assert_eq!(
            top[0]["id"], e["id"],
            "greedy: the sampled token is the most likely"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_logprobs_streamed_and_not() {
    let s = start(&smollm2(), Opts::default());
    let c = client();
    let url = format!("{}/v1/chat/completions", s.url);
    let req = json!({
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 3,
    });
    let (st, v) = post(&c, &url, &req).await;
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for t in &content {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let lps: Vec<f64> = top.iter().map(|x| x["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
        // Greedy: the sampled token is the most likely one.
        assert_eq!(t["id"], top[0]["id"]);
        assert_eq!(t["logprob"], top[0]["logprob"]);
    }
    // The tokens' bytes spell the reply.
    let bytes: Vec<u8> = content
        .iter()
        .flat_map(|t| {
            t["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8)
        })
        .collect();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(String::from_utf8_lossy(&bytes), text);

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let chunks = post_sse(&c, &url, &sreq).await;
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/logprobs/content"))
        .flat_map(|p| p.as_array().unwrap().clone())
        .collect();
    assert_eq!(streamed, content);

    // logprobs without top_logprobs: 20 alternatives, as llama-server's
    // server-common.cpp defaults `top_logprobs` (OpenAI lists none);
    // top_logprobs 0: the sampled token only.
    let (st, v) = post(
        &c,
        &url,
        &json!({"messages": req["messages"], "max_tokens": 2, "temperature": 0, "logprobs": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let t = &v["choices"][0]["logprobs"]["content"][0];
    assert_eq!(t["top_logprobs"].as_array().map(Vec::len), Some(20), "{t}");
    assert_eq!(t["top_logprobs"][0]["id"], t["id"], "greedy: most likely");
    let (st, v) = post(
        &c,
        &url,
        &json!({"messages": req["messages"], "max_tokens": 2, "temperature": 0, "logprobs": true, "top_logprobs": 0}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let t = &v["choices"][0]["logprobs"]["content"][0];
    assert_eq!(t["top_logprobs"], json!([]));
    assert!(t["logprob"].as_f64().unwrap() <= 0.0);
    // top_logprobs needs logprobs, as in llama-server.
    let (st, v) = post(
        &c,
        &url,
        &json!({"messages": req["messages"], "max_tokens": 2, "top_logprobs": 2}),
    )
    .await;
    assert_eq!(st, 400);
    assert_eq!(v["error"]["param"], "top_logprobs", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalties_and_logit_bias_change_greedy_output_as_the_formulas_say() {
    let s = start(&fixture(), Opts::default());
    let c = client();
    let e = reference_engine();
    let prompt = e.tokenize(PROMPT).expect("tokenize");
    let n = 8;
    let gen = |extra: Value| {
        let c = c.clone();
        let url = format!("{}/completion", s.url);
        async move {
            let mut body = json!({"prompt": PROMPT, "n_predict": n, "temperature": 0, "ignore_eos": true, "n_probs": 1});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let (st, v) = post(&c, &url, &body).await;
            assert_eq!(st, 200, "{v}");
            ids_of(&v["completion_probabilities"])
        }
    };
    let plain = gen(json!({})).await;
    assert_eq!(plain, greedy_with(&e, &prompt, n, |_, _| {}));

    // llama.cpp's penalties: a token seen `count` times in the last
    // repeat_last_n loses count * frequency + presence (repeat_penalty 1).
    let penalised = |presence: f32, freq: f32| {
        move |l: &mut [f32], hist: &[u32]| {
            let window = &hist[hist.len().saturating_sub(64)..];
            for (id, x) in l.iter_mut().enumerate() {
                let count = window.iter().filter(|&&t| t as usize == id).count();
                if count > 0 {
                    *x -= count as f32 * freq + presence;
                }
            }
        }
    };
    let got = gen(json!({"presence_penalty": 5.0})).await;
    assert_eq!(got, greedy_with(&e, &prompt, n, penalised(5.0, 0.0)));
    assert_ne!(
        got, plain,
        "the penalty must matter for this check to mean anything"
    );
    let got = gen(json!({"frequency_penalty": 2.0})).await;
    assert_eq!(got, greedy_with(&e, &prompt, n, penalised(0.0, 2.0)));

    // A large negative bias removes the greedy first token; `false` bans it.
    let first = plain[0];
    let banned = move |l: &mut [f32], _: &[u32]| l[first as usize] -= 100.0;
    let want = greedy_with(&e, &prompt, n, banned);
    assert_ne!(want[0], first);
    assert!(!want.contains(&first));
    assert_eq!(
        gen(json!({"logit_bias": {first.to_string(): -100.0}})).await,
        want
    );
    assert_eq!(gen(json!({"logit_bias": [[first, -100.0]]})).await, want);
    assert_eq!(gen(json!({"logit_bias": [[first, false]]})).await, want);
    // Repeats add up, to one entry per vocabulary token in all.
    let n_vocab = e.tokenizer.n_vocab();
    let mut full = vec![json!([first, -100.0])];
    full.resize(n_vocab, json!([first, 0.0]));
    assert_eq!(gen(json!({ "logit_bias": full })).await, want);
    // A repeated object key replaces the earlier one, as a JSON object's
    // parse keeps the last (repeated pairs add up, above).
    let raw = |bias: String| {
        let c = c.clone();
        let url = format!("{}/completion", s.url);
        async move {
            let body = format!(
                r#"{{"prompt": {}, "n_predict": {n}, "temperature": 0, "ignore_eos": true, "n_probs": 1, "logit_bias": {bias}}}"#,
                serde_json::to_string(PROMPT).unwrap()
            );
            let (st, v) = post_raw(&c, &url, body).await;
            assert_eq!(st, 200, "{v}");
            ids_of(&v["completion_probabilities"])
        }
    };
    let f = first;
    assert_eq!(raw(format!(r#"{{"{f}": 5.0, "{f}": -100.0}}"#)).await, want);
    assert_eq!(
        raw(format!(r#"{{"{f}": -100.0, "{f}": 0.0}}"#)).await,
        plain
    );

    // OpenAI's endpoint takes the same map; out-of-range ids are a 400.
    // So is a list longer than the vocabulary (applied at every step).
    let url = format!("{}/v1/completions", s.url);
    full.push(json!([first, 0.0]));
    for bias in [
        json!({n_vocab.to_string(): 1.0}),
        json!([[n_vocab, 1.0]]),
        json!({"5": "x"}),
        json!(full),
    ] {
        let (st, v) = post(
            &c,
            &url,
            &json!({"prompt": PROMPT, "max_tokens": 1, "logit_bias": bias}),
        )
        .await;
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"]["param"], "logit_bias", "{v}");
    }
    let (st, v) = post(
        &c,
        &url,
        &json!({"prompt": PROMPT, "max_tokens": 1, "presence_penalty": "a lot"}),
    )
    .await;
    assert!(st == 400 || st == 422, "{st}: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unimplemented_fields_are_refused_by_name() {
    let s = start(&fixture(), Opts::default());
    let c = client();
    let refused = [
        ("suffix", json!("end")),
        ("best_of", json!(2)),
        ("n", json!(2)),
        ("echo", json!(true)),
        ("mirostat", json!(2)),
        ("typical_p", json!(0.5)),
        ("dry_multiplier", json!(0.8)),
        ("xtc_probability", json!(0.5)),
        ("top_n_sigma", json!(1.0)),
        ("dynatemp_range", json!(0.5)),
        ("adaptive_target", json!(0.3)),
        ("min_keep", json!(5)),
        ("n_indent", json!(4)),
        ("t_max_predict_ms", json!(100)),
        ("samplers", json!(["temperature", "top_k"])),
        ("lora", json!([{"id": 0, "scale": 1.0}])),
        ("return_tokens", json!(true)),
        ("reasoning_format", json!("deepseek")),
    ];
    for endpoint in ["/v1/completions", "/completion"] {
        let url = format!("{}{endpoint}", s.url);
        for (field, value) in &refused {
            let mut body = json!({"prompt": PROMPT, "max_tokens": 1});
            body[field] = value.clone();
            let (st, v) = post(&c, &url, &body).await;
            assert_eq!(st, 400, "{endpoint} {field}: {v}");
            assert_eq!(v["error"]["param"], *field, "{v}");
            assert!(error_message(400, &v).contains(field), "{v}");
        }
    }
    // Neutral values and fields that do not change the output pass.
    let url = format!("{}/v1/completions", s.url);
    let body = json!({
        "prompt": PROMPT, "max_tokens": 1, "best_of": 1, "n": 1, "echo": false,
        "typical_p": 1.0, "mirostat": 0, "dry_multiplier": 0, "xtc_probability": 0,
        "xtc_threshold": 0.1, "top_n_sigma": -1, "samplers": "edskypmxt", "suffix": null,
        "user": "u", "cache_prompt": true, "id_slot": -1, "timings_per_token": false,
        "dry_base": 1.75, "mirostat_tau": 5.0, "reasoning_format": "none",
    });
    let (st, v) = post(&c, &url, &body).await;
    assert_eq!(st, 200, "{v}");
}

#[test]
fn logit_bias_flag_reads_llama_cpp_spelling() {
    // llama.cpp's `--logit-bias 15043+1` / `15043-1` (common/arg.cpp).
    use longhaul_server::args::parse_logit_bias;
    assert_eq!(parse_logit_bias("15043+1"), Ok((15043, 1.0)));
    assert_eq!(parse_logit_bias("15043-1.5"), Ok((15043, -1.5)));
    assert_eq!(parse_logit_bias("2-inf"), Ok((2, f32::NEG_INFINITY)));
    for bad in ["15043", "+1", "15043*1", "x+1", "15043+"] {
        assert!(parse_logit_bias(bad).is_err(), "{bad}");
    }
}

/// llama.cpp's `ignore_eos` bans every end-of-generation token (a `-inf`
/// logit bias each, appended by `common_init_from_params` for
/// `--ignore-eos` and by llama-server's `ignore_eos` field handler), so
/// greedy decoding takes the best other token where the model would end;
/// the server's `--ignore-eos` makes it the default of requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_eos_bans_end_of_generation_tokens_as_llama_cpp_does() {
    let c = client();
    let e = reference_engine();
    let prompt = e.tokenize(PROMPT).expect("tokenize");
    let eog = e.tokenizer.eog_ids();
    let eos = e.tokenizer.eos().expect("the fixture has an EOS");
    assert!(eog.contains(&eos), "{eog:?}");
    // A bias that makes EOS the greedy choice at every step.
    let n = 5;
    let want = greedy_with(&e, &prompt, n, |l, _| {
        l[eos as usize] += 1000.0;
        for &id in &eog {
            l[id as usize] = f32::NEG_INFINITY;
        }
    });
    assert!(want.iter().all(|t| !eog.contains(t)), "{want:?}");
    let body = |ignore_eos: Option<bool>| {
        let mut b = json!({"prompt": PROMPT, "n_predict": n, "temperature": 0,
            "logit_bias": [[eos, 1000.0]], "n_probs": 1});
        if let Some(i) = ignore_eos {
            b["ignore_eos"] = json!(i);
        }
        b
    };
    // The field, then the server's default under `--ignore-eos`.
    for (server_default, field) in [(false, Some(true)), (true, None)] {
        let s = start(
            &fixture(),
            Opts {
                ignore_eos: server_default,
                ..Opts::default()
            },
        );
        let url = format!("{}/completion", s.url);
        let (st, v) = post(&c, &url, &body(field)).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(ids_of(&v["completion_probabilities"]), want, "{v}");
        assert_eq!(v["stop_type"], "limit", "{v}");
        assert_eq!(v["generation_settings"]["ignore_eos"], true, "{v}");
        let (_, props) = get(&c, &format!("{}/props", s.url)).await;
        let props: Value = serde_json::from_str(&props).expect("props");
        assert_eq!(
            props["default_generation_settings"]["params"]["ignore_eos"],
            server_default
        );
        // OpenAI's endpoint bans them too: the same text, to the limit.
        let mut ob = body(field);
        let ob = ob.as_object_mut().expect("object");
        ob.remove("n_predict");
        ob.remove("n_probs");
        ob.insert("max_tokens".into(), json!(n));
        let (st, o) = post(&c, &format!("{}/v1/completions", s.url), &json!(ob)).await;
        assert_eq!(st, 200, "{o}");
        assert_eq!(o["choices"][0]["text"], v["content"], "{o}");
        assert_eq!(o["choices"][0]["finish_reason"], "length", "{o}");
        // Without it the pushed EOS ends the generation at once.
        let (st, v) = post(&c, &url, &body(Some(false))).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["stop_type"], "eos", "{v}");
        assert_eq!(v["tokens_predicted"], 1, "{v}");
    }
}
