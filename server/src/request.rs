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

use longhaul::engine::EngineError;
use longhaul::sample::{ProbsRequest, SampleParamError, SamplerParams};
use longhaul::scheduler::GenRequest;
use longhaul::tokenizer::{ChatMessage, ChatTemplateError, TemplateArgs, TemplateKwargs};

use crate::error::ApiError;
use crate::{AppState, EngineInfo};

/// Bodies larger than this prepare alone ([`off_runtime`]), and are read
/// within the budget of [`Received`].
pub const LARGE_BODY: usize = 1 << 20;

/// Bodies larger than this (up to [`LARGE_BODY`]) prepare side by side
/// within a budget of one body of the limit in all ([`off_runtime`]).
pub const SHARED_BODY: usize = 64 << 10;

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

/// The KiB of [`off_runtime`]'s budget for `body_limit`: one body of the
/// limit (at least 1 KiB, at most what a semaphore counts and one
/// acquire takes).
pub fn prepare_budget_kib(body_limit: usize) -> u32 {
    let kib = body_limit.div_ceil(1024).clamp(1, Semaphore::MAX_PERMITS);
    u32::try_from(kib).unwrap_or(u32::MAX)
}

/// Runs `prepare` (a request's own work: parsing its body, rendering the
/// chat template, tokenizing, compiling its grammar) on tokio's blocking
/// pool. Each can take seconds on a large or hostile request (a template
/// runs on a fuel of 2^26, a grammar compiles within bounds of about a
/// second); on one of the server's two async workers that would stall
/// every other connection, `/health` included.
///
/// Preparing takes memory: 2 to 30 bytes per byte of body where fields
/// are read element by element (a prompt of ids, `logit_bias`, schemas,
/// stop strings: [`crate::fields`]), about 30 where the template needs a
/// `Value` (`tools`, `messages`). So preparations share a budget of one
/// body of the limit (the [`AppState`]'s `preparing`, in KiB): a body over
/// [`LARGE_BODY`] takes all of it and prepares alone (tokenizing 14 MB
/// also takes about a second of every core from the running generations),
/// one over [`SHARED_BODY`] takes its size, and smaller ones take none.
/// Without the share, 64 bodies of 1 MiB of `tools` prepared side by side
/// took the server from 0.15 to 1.49 GiB, and `--max-connections` allows
/// 256. Once a large body is prepared, the memory its work freed goes back
/// to the system ([`longhaul::alloc::release_free_memory`]).
pub async fn off_runtime<T: Send + 'static>(
    state: &Arc<AppState>,
    body: Received,
    prepare: fn(&AppState, &Bytes) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let len = body.bytes.len();
    let all = prepare_budget_kib(state.config.body_limit);
    let share = match len {
        n if n > LARGE_BODY => all,
        n if n > SHARED_BODY => u32::try_from(n.div_ceil(1024)).unwrap_or(u32::MAX).min(all),
        _ => 0,
    };
    let permit = if share > 0 {
        let p = state.preparing.clone().acquire_many_owned(share).await;
        Some(p.map_err(|_| ApiError::unavailable("the server is shutting down"))?)
    } else {
        None
    };
    let large = len > LARGE_BODY;
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
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
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(ApiError::from_json)
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
    /// An assistant message's thoughts, given back to the template.
    #[serde(default)]
    pub reasoning_content: Option<String>,
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
            msg.reasoning_content = m.reasoning_content;
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

/// The fields of a chat request that reach its template beside the
/// messages: llama-server's `chat_template_kwargs` (over the server's
/// `--chat-template-kwargs`) and OpenAI's `reasoning_effort`.
#[derive(Deserialize, Debug, Default)]
pub struct TemplateFields {
    pub chat_template_kwargs: Option<TemplateKwargs>,
    pub reasoning_effort: Option<String>,
}

/// Renders `messages` through the model's template with the request's
/// `tools` and [`TemplateFields`] (400 if it has none, the kwargs are
/// refused, or the template refuses the messages, e.g. a `raise_exception`
/// on a bad role order).
pub fn render_chat(
    engine: &dyn EngineInfo,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    tools: Option<&[Value]>,
    fields: &TemplateFields,
) -> Result<String, ApiError> {
    let args = TemplateArgs {
        tools,
        kwargs: fields.chat_template_kwargs.as_ref(),
        reasoning_effort: fields.reasoning_effort.as_deref(),
    };
    engine
        .apply_template_with(messages, add_generation_prompt, &args)
        .map_err(|e| {
            let field = match e {
                EngineError::Template(ChatTemplateError::Kwargs(_)) => "chat_template_kwargs",
                _ => "messages",
            };
            ApiError::invalid_field(field, e.to_string())
        })
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
    /// Kept as the body's text and read entry by entry
    /// ([`crate::fields::logit_bias`]).
    pub logit_bias: Option<Box<serde_json::value::RawValue>>,
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
        if let Some(raw) = &self.logit_bias {
            p.logit_bias = crate::fields::logit_bias(raw, engine.tokenizer())?;
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
    let body = crate::fields::pick_fields(body, &fields).map_err(ApiError::from_json)?;
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
