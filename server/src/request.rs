//! Request bodies: field types shared by the endpoints, and the checks that
//! turn them into a [`GenRequest`]. Every check answers a 400 that names the
//! field; nothing here panics on input.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use longhaul::sample::{ProbsRequest, SampleParamError, SamplerParams};
use longhaul::scheduler::GenRequest;
use longhaul::tokenizer::ChatMessage;

use crate::error::ApiError;
use crate::{AppState, EngineInfo};

/// Bodies larger than this prepare one at a time ([`off_runtime`]), and
/// are read within the budget of [`Received`].
pub const LARGE_BODY: usize = 1 << 20;

/// The request bodies over [`LARGE_BODY`] being read or waiting to be
/// prepared may take this many times `--body-limit` in all.
pub const BODY_BUDGET_FACTOR: usize = 4;

/// A request body, read whole once its share of the server's budget for
/// large bodies is granted (the [`AppState`]'s `body_budget`, in KiB):
/// the `Content-Length` for a body over [`LARGE_BODY`], the whole body
/// limit where no length is declared. Until then its bytes wait in the
/// client's socket. Without it, every open connection could hold a body
/// of up to the limit while waiting for its turn to prepare: 100
/// concurrent 16 MB prompts took the server to 1.35 GiB, and
/// `--max-connections` allows 256. The share is held until the body is
/// dropped, after its preparation ([`off_runtime`]).
pub struct Received {
    pub bytes: Bytes,
    _budget: Option<OwnedSemaphorePermit>,
}

impl FromRequest<Arc<AppState>> for Received {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        // A chunked body's length is unknown, whatever else is declared.
        let headers = req.headers();
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .filter(|_| !headers.contains_key(header::TRANSFER_ENCODING))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let budget = match declared {
            Some(n) if n <= LARGE_BODY as u64 => None,
            n => {
                let limit = state.config.body_limit as u64;
                let kib = n.unwrap_or(limit).min(limit).div_ceil(1024);
                let kib = u32::try_from(kib).unwrap_or(u32::MAX).max(1);
                let p = {
                    let _waiting = Waiting::count(&state.bodies_waiting);
                    state.body_budget.clone().acquire_many_owned(kib).await
                };
                Some(p.map_err(|_| ApiError::unavailable("the server is shutting down"))?)
            }
        };
        let bytes = Bytes::from_request(req, state).await?;
        Ok(Self {
            bytes,
            _budget: budget,
        })
    }
}

/// Counts one request in `n` while it lives (also when its client leaves
/// and the wait is dropped).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn count(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Self(n)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The KiB of [`Received`]'s budget for `body_limit`: at least what any
/// one body asks for (at least 1 KiB, at most the limit), so that none
/// waits for ever; at most what a semaphore counts.
pub fn body_budget_kib(body_limit: usize) -> usize {
    let kib = body_limit.saturating_mul(BODY_BUDGET_FACTOR).div_ceil(1024);
    kib.clamp(1, Semaphore::MAX_PERMITS)
}

/// Runs `prepare` (a request's own work: parsing its body, rendering the
/// chat template, tokenizing, compiling its grammar) on tokio's blocking
/// pool. Each can take seconds on a large or hostile request (a template
/// runs on a fuel of 2^26, a grammar compiles within bounds of about a
/// second); on one of the server's two async workers that would stall
/// every other connection, `/health` included.
///
/// A body over [`LARGE_BODY`] waits for the one permit of large bodies
/// first, held until its work ends: parsing takes 15-70 bytes of memory
/// per byte of body, and tokenizing 14 MB about a second, so concurrent
/// large requests could take more memory than the machine has, and every
/// core from the running generations. Once it
/// is prepared, the memory its work freed goes back to the system
/// ([`longhaul::alloc::release_free_memory`]).
pub async fn off_runtime<T: Send + 'static>(
    state: &Arc<AppState>,
    body: Received,
    prepare: fn(&AppState, &Bytes) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let permit = if body.bytes.len() > LARGE_BODY {
        let p = state.large_bodies.clone().acquire_owned().await;
        Some(p.map_err(|_| ApiError::unavailable("the server is shutting down"))?)
    } else {
        None
    };
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        let large = permit.is_some();
        let prepared = prepare(&state, &body.bytes);
        drop(body);
        if large {
            longhaul::alloc::release_free_memory();
        }
        drop(permit);
        prepared
    })
    .await
    .map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("the request could not be prepared: {e}"),
        )
    })?
}

/// Parses a JSON body (400 for bad syntax, 422 for the wrong shape).
pub fn parse_json<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(ApiError::from_json)
}

/// The top-level fields of a JSON body named in `names`, as an object
/// (a repeated field: its last value, as a `Value` parse keeps), or `null`
/// for JSON that is not an object. The rest of the body is checked but
/// left unparsed, where the checks that read a few fields used to parse
/// the whole body into a `Value` tree again, 32 bytes and more an element:
/// an 8M-id prompt took the server to 0.93 GiB.
pub fn pick_fields<'n>(
    body: &[u8],
    names: impl IntoIterator<Item = &'n str>,
) -> Result<Value, serde_json::Error> {
    let whole: &serde_json::value::RawValue = serde_json::from_slice(body)?;
    if !whole.get().starts_with('{') {
        return Ok(Value::Null);
    }
    let top: std::collections::HashMap<String, &serde_json::value::RawValue> =
        serde_json::from_str(whole.get())?;
    let mut picked = serde_json::Map::new();
    for name in names {
        if let Some(raw) = top.get(name) {
            picked.insert(name.to_string(), serde_json::from_str(raw.get())?);
        }
    }
    Ok(Value::Object(picked))
}

/// `stop`: one string or a list of them.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        let v = match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        };
        v.into_iter().filter(|s| !s.is_empty()).collect()
    }
}

/// A chat message's `content`: a string or a list of parts.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum ContentField {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug, Clone)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
pub struct MessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<ContentField>,
    /// An assistant message's tool calls (OpenAI's shape).
    #[serde(default)]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` message: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// Tool calls as a chat template reads them: each `function.arguments`
/// JSON string (OpenAI's spelling) parsed into its object, as llama.cpp
/// does for templates that write `arguments | tojson`.
fn template_tool_calls(calls: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    calls
        .into_iter()
        .map(|mut c| {
            if let Some(args) = c.pointer_mut("/function/arguments") {
                if let Some(parsed) = args
                    .as_str()
                    .and_then(|a| serde_json::from_str::<serde_json::Value>(a).ok())
                {
                    *args = parsed;
                }
            }
            c
        })
        .collect()
}

/// Checks the messages and converts them for the chat template.
pub fn chat_messages(msgs: Vec<MessageIn>) -> Result<Vec<ChatMessage>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::invalid_field(
            "messages",
            "`messages` is empty; give at least one message",
        ));
    }
    msgs.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match m.content {
                None => String::new(),
                Some(ContentField::Text(s)) => s,
                Some(ContentField::Parts(parts)) => {
                    let mut s = String::new();
                    for p in parts {
                        match (p.kind.as_str(), p.text) {
                            ("text", Some(t)) => s.push_str(&t),
                            (kind, _) => {
                                return Err(ApiError::invalid_field(
                                    "messages",
                                    format!("messages[{i}]: content parts of type `{kind}` are not supported (text only)"),
                                ))
                            }
                        }
                    }
                    s
                }
            };
            let mut msg = ChatMessage::new(m.role, content);
            msg.tool_calls = template_tool_calls(m.tool_calls.unwrap_or_default());
            msg.tool_call_id = m.tool_call_id;
            msg.name = m.name;
            Ok(msg)
        })
        .collect()
}

/// Tokenises a rendered chat prompt: the template spells out BOS itself.
/// Refused before it is encoded where it cannot fit `n_ctx`, as
/// [`PromptField::tokenize`].
pub fn tokenize_rendered(
    engine: &dyn EngineInfo,
    text: &str,
    n_ctx: usize,
) -> Result<Vec<u32>, ApiError> {
    let tok = engine.tokenizer();
    refuse_unfitting(tok.min_tokens(text, false, true), n_ctx)?;
    tok.encode(text, false, true)
        .map_err(|e| ApiError::invalid_field("messages", e.to_string()))
}

/// The context check of [`crate::gen::start`] (a prompt takes fewer than
/// `n_ctx` tokens), made on a lower bound of the prompt's length before
/// encoding it (about a second of a core for a 16 MB body). The bound counts a raw fragment's bytes over the
/// vocabulary's longest token, so it refuses only prompts that the exact
/// check would refuse too.
pub(crate) fn refuse_unfitting(at_least: usize, n_ctx: usize) -> Result<(), ApiError> {
    if at_least < n_ctx {
        return Ok(());
    }
    Err(ApiError::invalid_field(
        "messages/prompt",
        format!("the prompt has at least {at_least} tokens but the context holds {n_ctx}; shorten it or start the server with a larger -c/--ctx-size"),
    ))
}

/// Renders `messages` through the model's template (400 if it has none or
/// the template refuses them, e.g. a `raise_exception` on a bad role order).
pub fn render_chat(
    engine: &dyn EngineInfo,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<String, ApiError> {
    engine
        .apply_template(messages, add_generation_prompt)
        .map_err(|e| ApiError::invalid_field("messages", e.to_string()))
}

/// Sampling fields common to every generation endpoint (`None` = the
/// server's default from the command line).
#[derive(Default, Debug, Clone, serde::Deserialize)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_k: Option<i32>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// OpenAI's `{"token id": bias}` or llama-server's `[[id or text, bias]]`
    /// (a bias of `false` bans the token); replaces the server's default.
    pub logit_bias: Option<Value>,
    pub seed: Option<i64>,
}

impl Sampling {
    /// The request's settings over `defaults`, checked by the validator
    /// the CLI also uses ([`SamplerParams::validate`]): a refused value is
    /// a 400 naming its field.
    pub fn params(
        &self,
        defaults: &SamplerParams,
        engine: &dyn EngineInfo,
    ) -> Result<SamplerParams, ApiError> {
        let invalid = |e: SampleParamError| ApiError::invalid_field(e.field(), e.to_string());
        let mut p = defaults.clone();
        if let Some(v) = self.temperature {
            p.temp = v;
        }
        if let Some(v) = self.top_k {
            p.top_k = v;
        }
        if let Some(v) = self.top_p {
            p.top_p = v;
        }
        if let Some(v) = self.min_p {
            p.min_p = v;
        }
        if let Some(v) = self.repeat_penalty {
            p.repeat_penalty = v;
        }
        if let Some(v) = self.repeat_last_n {
            p.repeat_last_n = v;
        }
        if let Some(v) = self.presence_penalty {
            p.presence_penalty = v;
        }
        if let Some(v) = self.frequency_penalty {
            p.frequency_penalty = v;
        }
        if let Some(v) = self.logit_bias.as_ref().filter(|v| !v.is_null()) {
            p.logit_bias = logit_bias(v, engine)?;
        }
        if let Some(s) = self.seed {
            p.seed = SamplerParams::seed_from_i64(s).map_err(invalid)?;
        }
        p.validate().map_err(invalid)?;
        p.check_vocab(engine.tokenizer().n_vocab())
            .map_err(invalid)?;
        Ok(p)
    }
}

/// A token budget field: `None` and `-1` mean "until the context is full".
pub fn n_predict(field: &str, v: Option<i64>) -> Result<usize, ApiError> {
    match v {
        None | Some(-1) => Ok(usize::MAX),
        Some(n) if n >= 0 => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        Some(n) => Err(ApiError::invalid_field(
            field,
            format!("{field} {n} is invalid: give a count >= 0 (-1 = no limit)"),
        )),
    }
}

/// `logit_bias` in the forms llama-server reads: an object `{"15043": 1.0}`
/// (OpenAI's; a key that is not a number is text, each of its tokens
/// biased) or a list of `[id or text, bias]` pairs; a bias is a number, or
/// `false` to ban the token (`-inf`). Where llama-server skips an entry it
/// cannot read, this is a 400 naming the field.
fn logit_bias(v: &Value, engine: &dyn EngineInfo) -> Result<Vec<(u32, f32)>, ApiError> {
    let field_err =
        |msg: String| ApiError::invalid_field("logit_bias", format!("logit_bias: {msg}"));
    let bias_of = |key: &str, b: &Value| -> Result<f32, ApiError> {
        match b {
            Value::Number(n) => Ok(n.as_f64().unwrap_or(f64::NAN) as f32),
            Value::Bool(false) => Ok(f32::NEG_INFINITY),
            other => Err(field_err(format!(
                "the bias of {key} is {other}; give a number, or false to ban the token"
            ))),
        }
    };
    let tok = engine.tokenizer();
    let n_vocab = tok.n_vocab();
    let mut out = Vec::new();
    let mut push = |key: &Value, bias: f32| -> Result<(), ApiError> {
        match key {
            Value::Number(n) => match n.as_u64().filter(|&id| id < n_vocab as u64) {
                Some(id) => out.push((id as u32, bias)),
                None => {
                    return Err(field_err(format!(
                        "token id {n} is out of range (the vocabulary has {n_vocab} tokens)"
                    )))
                }
            },
            Value::String(text) => {
                let ids = tok
                    .encode(text, false, false)
                    .map_err(|e| field_err(e.to_string()))?;
                out.extend(ids.into_iter().map(|id| (id, bias)));
            }
            other => {
                return Err(field_err(format!(
                    "{other} is not a token: give a token id or a text"
                )))
            }
        }
        Ok(())
    };
    match v {
        Value::Object(map) => {
            for (k, b) in map {
                let bias = bias_of(&format!("\"{k}\""), b)?;
                let key = match k.trim().parse::<i64>() {
                    Ok(id) => Value::from(id),
                    Err(_) => Value::String(k.clone()),
                };
                push(&key, bias)?;
            }
        }
        Value::Array(pairs) => {
            for pair in pairs {
                match pair.as_array().map(Vec::as_slice) {
                    Some([key, b]) => {
                        let bias = bias_of(&key.to_string(), b)?;
                        push(key, bias)?;
                    }
                    _ => return Err(field_err(format!("{pair} is not a [token, bias] pair"))),
                }
            }
        }
        other => {
            return Err(field_err(format!(
            "{other} is neither an object {{\"token id\": bias}} nor a list of [token, bias] pairs"
        )))
        }
    }
    Ok(out)
}

/// A token-probability count field (`n_probs`, `logprobs`, `top_logprobs`):
/// `None` when absent or null, else a count >= 0.
fn count_field(body: &Value, field: &str) -> Result<Option<usize>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
            ApiError::invalid_field(field, format!("{field} {v} is invalid: give a count >= 0"))
        }),
    }
}

/// Which endpoint's spelling of the probability fields a request uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbsApi {
    /// `/v1/chat/completions`: `logprobs: true` and `top_logprobs: N`.
    Chat,
    /// `/v1/completions`: `logprobs: N`.
    Completions,
    /// llama-server's `/completion`: `n_probs: N` (`logprobs` as its alias).
    Native,
}

/// Most probabilities one request may ask for: alternatives per token
/// times tokens it may generate. A non-streamed answer holds them all
/// (8 bytes each) and writes about 95 bytes of JSON for each, so this
/// keeps one answer under about 0.4 GB; it allows 20 alternatives for
/// 200,000 tokens, or a 262,144-token vocabulary for 16 tokens. Unbounded,
/// one request for the whole vocabulary at every token of a long context
/// could take more memory than the machine has (llama-server has no bound).
pub const MAX_PROBS_PER_REQUEST: usize = 1 << 22;

/// Refuses a request whose probabilities could pass
/// [`MAX_PROBS_PER_REQUEST`]: each of its tokens, up to `n_predict` or the
/// slot's context `n_ctx` after the prompt, lists the sampled token and at
/// most `n_top` alternatives of the vocabulary.
pub fn check_probs(
    req: &GenRequest,
    api: ProbsApi,
    n_ctx: usize,
    n_vocab: usize,
) -> Result<(), ApiError> {
    let Some(want) = req.probs else {
        return Ok(());
    };
    let per_token = want.n_top.min(n_vocab).max(1);
    let max_gen = req.n_predict.min(n_ctx.saturating_sub(req.prompt.len()));
    let total = per_token.saturating_mul(max_gen);
    if total <= MAX_PROBS_PER_REQUEST {
        return Ok(());
    }
    let (field, count) = match api {
        ProbsApi::Chat => ("top_logprobs", "max_tokens"),
        ProbsApi::Completions => ("logprobs", "max_tokens"),
        ProbsApi::Native => ("n_probs", "n_predict"),
    };
    Err(ApiError::invalid_field(
        field,
        format!(
            "{field} asks for {per_token} probabilities for each of up to {max_gen} tokens \
             ({total}), over this server's {MAX_PROBS_PER_REQUEST} per request: lower {field} \
             or {count}"
        ),
    ))
}

/// The per-token probabilities a request asks for, from its raw body.
/// Every endpoint also takes llama-server's `n_probs` (on when > 0) and
/// `post_sampling_probs`. `top_logprobs` without `logprobs: true` is a 400,
/// as in llama-server.
pub fn probs_request(body: &Bytes, api: ProbsApi) -> Result<Option<ProbsRequest>, ApiError> {
    let fields = ["n_probs", "top_logprobs", "logprobs", "post_sampling_probs"];
    let body = pick_fields(body, fields).map_err(ApiError::from_json)?;
    let n_probs = count_field(&body, "n_probs")?.filter(|&n| n > 0);
    let n_top = match api {
        ProbsApi::Chat => {
            let top = count_field(&body, "top_logprobs")?;
            match body.get("logprobs") {
                // llama-server lists 20 alternatives when `top_logprobs`
                // is not given (OpenAI lists none).
                Some(Value::Bool(true)) => Some(top.unwrap_or(20)),
                None | Some(Value::Null) | Some(Value::Bool(false)) => {
                    if top.is_some() {
                        return Err(ApiError::invalid_field(
                            "top_logprobs",
                            "top_logprobs requires logprobs to be set to true",
                        ));
                    }
                    n_probs
                }
                Some(v) => {
                    return Err(ApiError::invalid_field(
                        "logprobs",
                        format!(
                            "logprobs {v} is invalid: give true or false (and top_logprobs: N)"
                        ),
                    ))
                }
            }
        }
        ProbsApi::Completions => match body.get("logprobs") {
            Some(Value::Bool(b)) => b.then_some(0).or(n_probs),
            _ => count_field(&body, "logprobs")?.or(n_probs),
        },
        ProbsApi::Native => match n_probs {
            Some(n) => Some(n),
            None => count_field(&body, "logprobs")?.filter(|&n| n > 0),
        },
    };
    let post_sampling = match body.get("post_sampling_probs") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ApiError::invalid_field(
                "post_sampling_probs",
                format!("post_sampling_probs {v} is invalid: give true or false"),
            ))
        }
    };
    Ok(n_top.map(|n_top| ProbsRequest {
        n_top,
        post_sampling,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(n_top: usize, n_prompt: usize, n_predict: usize) -> GenRequest {
        GenRequest {
            prompt: vec![1; n_prompt],
            n_predict,
            sampler: SamplerParams::default(),
            stop: vec![],
            cache_prompt: true,
            ignore_eos: false,
            probs: Some(ProbsRequest {
                n_top,
                post_sampling: false,
            }),
            constraint: None,
            special: false,
        }
    }

    /// `pick_fields` gives what a whole `Value` parse gives for the named
    /// fields: nested values, the last of a repeated field, nothing for a
    /// field not named, `null` for JSON that is not an object, and the
    /// same syntax errors.
    #[test]
    fn picked_fields_are_those_of_the_whole_value() {
        let body = br#" {"a": [1, {"b": null}], "skip": [[1,2],"x"], "c": 1, "c": {"d": 2}, "e\u0041": true} "#;
        let whole: Value = serde_json::from_slice(body).unwrap();
        let picked = pick_fields(body, ["a", "c", "eA", "absent"]).unwrap();
        let want: serde_json::Map<String, Value> = ["a", "c", "eA"]
            .into_iter()
            .map(|k| (k.to_string(), whole[k].clone()))
            .collect();
        assert_eq!(picked, Value::Object(want));
        assert_eq!(picked["c"], serde_json::json!({"d": 2}));
        assert_eq!(pick_fields(b" [1, 2] ", ["a"]).unwrap(), Value::Null);
        assert_eq!(pick_fields(b"3", ["a"]).unwrap(), Value::Null);
        for bad in [
            &b"{\"a\": 1,}"[..],
            b"{\"a\": [1}",
            b"",
            b"{} x",
            b"{\"a\": \"\xff\"}",
        ] {
            assert!(serde_json::from_slice::<Value>(bad).is_err());
            assert!(
                pick_fields(bad, ["a"]).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_probability_bound_counts_what_a_request_can_generate() {
        let (n_ctx, n_vocab) = (4096, 49_152);
        let check = |r: &GenRequest, api| check_probs(r, api, n_ctx, n_vocab);
        // 49,152 × 85 = 4,177,920 fits 2^22; × 86 = 4,227,072 does not.
        assert!(check(&asking(49_152, 10, 85), ProbsApi::Native).is_ok());
        let e = check(&asking(49_152, 10, 86), ProbsApi::Native).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n_probs"));
        assert!(e.message.contains("4227072"), "{}", e.message);
        // Past the vocabulary counts as the vocabulary (llama-server lists
        // at most every token).
        assert!(check(&asking(usize::MAX, 10, 85), ProbsApi::Native).is_ok());
        // No n_predict: the context after the prompt bounds the tokens.
        // 1,024 × 4,096 = 2^22 fits; with a prompt it is fewer tokens.
        assert!(check(&asking(1024, 0, usize::MAX), ProbsApi::Chat).is_ok());
        let e = check(&asking(1025, 0, usize::MAX), ProbsApi::Chat).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        assert!(check(&asking(1025, 100, usize::MAX), ProbsApi::Chat).is_ok());
        // `logprobs: true` without alternatives still lists the sampled
        // token: one per token.
        let e = check_probs(
            &asking(0, 0, usize::MAX),
            ProbsApi::Completions,
            1 << 23,
            10,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logprobs"));
        let mut none = asking(usize::MAX, 0, usize::MAX);
        none.probs = None;
        assert!(check(&none, ProbsApi::Native).is_ok());
    }
}
