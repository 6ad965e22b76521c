//! llama-server's native endpoints: `/completion`, `/tokenize`,
//! `/detokenize`, `/apply-template`, `/props`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use longhaul::sample::SamplerParams;
use longhaul::scheduler::{FinishReason, GenRequest, GenSummary};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::fields::StopField;
use crate::gen::{self, Piece};
use crate::openai::{data, sse};
use crate::probs::{self, Spliced};
use crate::prompt::PromptField;
use crate::request::{self, MessageIn, ProbsApi, Received, Sampling};
use crate::structured::{self, StructuredFields};
use crate::unsupported;
use crate::AppState;

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    pub n_predict: Option<i64>,
    /// OpenAI's name, accepted here too.
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    pub cache_prompt: Option<bool>,
    pub stop: Option<StopField>,
    /// Absent: the server's `--ignore-eos`.
    pub ignore_eos: Option<bool>,
}

/// llama-server's `generation_settings`: the request's sampler settings
/// over the defaults (`ignore_eos` as asked; llama-server lists its bans in
/// `logit_bias` too, which this list leaves out).
fn settings(
    p: &SamplerParams,
    ignore_eos: bool,
    n_predict: usize,
    stop: &[String],
    n_ctx: usize,
) -> Value {
    json!({
        "n_ctx": n_ctx,
        "n_predict": if n_predict == usize::MAX { -1 } else { n_predict as i64 },
        "temperature": p.temp,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "repeat_penalty": p.repeat_penalty,
        "repeat_last_n": p.repeat_last_n,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        // As llama-server lists it; a ban (-inf) is null in its JSON.
        "logit_bias": p
            .logit_bias
            .iter()
            .map(|&(id, b)| json!({ "bias": if b.is_finite() { json!(b) } else { Value::Null }, "token": id }))
            .collect::<Vec<_>>(),
        "seed": p.seed.map(|s| s as i64).unwrap_or(-1),
        "stop": stop,
        "ignore_eos": ignore_eos,
    })
}

/// The fields of the last object of a completion (streamed or not).
fn final_fields(v: &mut Value, sum: &GenSummary) {
    let stop_type = match (&sum.finish_reason, &sum.stopped_word) {
        (FinishReason::Stop, Some(_)) => "word",
        (FinishReason::Stop, None) => "eos",
        (FinishReason::Length, _) => "limit",
    };
    v["stop"] = json!(true);
    v["stop_type"] = json!(stop_type);
    v["stopping_word"] = json!(sum.stopped_word.clone().unwrap_or_default());
    v["tokens_predicted"] = json!(sum.n_gen);
    v["tokens_evaluated"] = json!(sum.n_prompt);
    v["tokens_cached"] = json!(sum.n_cached);
    v["truncated"] = json!(false);
    v["timings"] = gen::timings(sum);
}

/// A `/completion` request checked, tokenized and compiled: ready to start.
struct Prepared {
    greq: GenRequest,
    generation_settings: Value,
    stream: bool,
}

fn prepare(state: &AppState, body: &Bytes) -> Result<Prepared, ApiError> {
    let r = state.ready()?;
    let req: CompletionRequest = request::parse_json(body)?;
    unsupported::refuse_unimplemented(body)?;
    let want = request::probs_request(body, ProbsApi::Native)?;
    let prompt = req
        .prompt
        .tokenize(r.engine.as_ref(), r.scheduler.n_ctx())?;
    let (field, max) = match (req.n_predict, req.max_tokens) {
        (Some(n), _) => ("n_predict", Some(n)),
        (None, m) => ("max_tokens", m),
    };
    let n_predict = request::n_predict(field, max)?;
    let sampling: Sampling = request::parse_json(body)?;
    let sampler = sampling.params(&r.defaults, r.engine.as_ref())?;
    let stop = req
        .stop
        .map(StopField::into_vec)
        .transpose()?
        .unwrap_or_default();
    let ignore_eos = req.ignore_eos.unwrap_or(r.ignore_eos);
    let generation_settings = settings(&sampler, ignore_eos, n_predict, &stop, r.engine.n_ctx());
    let structured: StructuredFields = request::parse_json(body)?;
    let constraint = structured::constraint(
        r.engine.as_ref(),
        &structured,
        r.default_constraint.as_ref(),
        false,
    )?;
    let greq = GenRequest {
        prompt,
        n_predict,
        sampler,
        stop,
        cache_prompt: req.cache_prompt.unwrap_or(true),
        ignore_eos,
        probs: want,
        constraint,
        special: false,
    };
    request::check_probs(
        &greq,
        ProbsApi::Native,
        r.scheduler.n_ctx(),
        r.engine.tokenizer().n_vocab(),
    )?;
    Ok(Prepared {
        greq,
        generation_settings,
        stream: req.stream,
    })
}

pub async fn completion(
    State(state): State<Arc<AppState>>,
    body: Received,
) -> Result<Response, ApiError> {
    let Prepared {
        greq,
        generation_settings,
        stream,
    } = request::off_runtime(&state, body, prepare).await?;
    let r = state.ready()?;
    let want = greq.probs;
    let post = want.is_some_and(|w| w.post_sampling);
    let started = gen::start(r, greq)?;
    let model = r.model_id.clone();
    if !stream {
        let (text, ps, sum) = gen::collect_with_probs(started, state.abort.clone()).await?;
        let mut v = json!({
            "content": text,
            "model": model,
            "generation_settings": generation_settings,
        });
        if want.is_none() {
            final_fields(&mut v, &sum);
            return Ok(Json(v).into_response());
        }
        // Its place, ahead of the final fields; written in by `Spliced`.
        v["completion_probabilities"] = Value::Null;
        final_fields(&mut v, &sum);
        let with = probs::entries(r.engine.tokenizer(), &ps, post);
        return Ok(Json(Spliced {
            value: &v,
            pointer: "/completion_probabilities",
            with: &with,
        })
        .into_response());
    }
    let engine = r.engine.clone();
    let events = gen::pieces(started, state.abort.clone()).map(move |p| match p {
        Piece::Text(t) => data(&json!({ "content": t, "stop": false })),
        Piece::Token { text, probs: p } => data(&Spliced {
            value: &json!({ "content": text, "stop": false, "completion_probabilities": null }),
            pointer: "/completion_probabilities",
            with: &probs::entries(engine.tokenizer(), &[p], post),
        }),
        Piece::Done(sum) => {
            let mut v = json!({
                "content": "",
                "model": model,
                "generation_settings": generation_settings,
            });
            final_fields(&mut v, &sum);
            data(&v)
        }
        Piece::Error(e) => data(&e.body()),
    });
    Ok(sse(events.chain(stream::empty())))
}

#[derive(Deserialize, Debug)]
pub struct TokenizeRequest {
    pub content: String,
    #[serde(default)]
    pub add_special: bool,
    #[serde(default = "yes")]
    pub parse_special: bool,
    #[serde(default)]
    pub with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// `/tokenize`'s answer. Typed rather than a `Value` tree: a 14 MB text
/// is 7M tokens, 224 MB as `Value` numbers and 4 GB more as `Value` pieces.
#[derive(Serialize)]
pub struct Tokens<T> {
    tokens: Vec<T>,
}

/// A token with its piece (`with_pieces`).
#[derive(Serialize)]
pub struct TokenPiece {
    id: u32,
    piece: PieceText,
}

/// A piece that is not valid UTF-8 (part of a character) is given as bytes.
#[derive(Serialize)]
#[serde(untagged)]
pub enum PieceText {
    Text(String),
    Bytes(Vec<u8>),
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Received,
) -> Result<Response, ApiError> {
    request::off_runtime(&state, body, tokenize_now).await
}

fn tokenize_now(state: &AppState, body: &Bytes) -> Result<Response, ApiError> {
    let r = state.ready()?;
    let req: TokenizeRequest = request::parse_json(body)?;
    let tok = r.engine.tokenizer();
    let ids = tok
        .encode(&req.content, req.add_special, req.parse_special)
        .map_err(|e| ApiError::invalid_field("content", e.to_string()))?;
    if !req.with_pieces {
        return Ok(Json(Tokens { tokens: ids }).into_response());
    }
    let tokens = ids
        .iter()
        .map(|&id| TokenPiece {
            id,
            piece: match String::from_utf8(tok.token_to_piece(id)) {
                Ok(s) => PieceText::Text(s),
                Err(e) => PieceText::Bytes(e.into_bytes()),
            },
        })
        .collect();
    Ok(Json(Tokens::<TokenPiece> { tokens }).into_response())
}

#[derive(Deserialize, Debug)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Received,
) -> Result<Json<Value>, ApiError> {
    request::off_runtime(&state, body, detokenize_now).await
}

fn detokenize_now(state: &AppState, body: &Bytes) -> Result<Json<Value>, ApiError> {
    let r = state.ready()?;
    let req: DetokenizeRequest = request::parse_json(body)?;
    let tok = r.engine.tokenizer();
    let n_vocab = tok.n_vocab();
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ApiError::invalid_field(
            "tokens",
            format!("token id {bad} is out of range (the vocabulary has {n_vocab} tokens)"),
        ));
    }
    Ok(Json(json!({ "content": tok.decode(&req.tokens) })))
}

#[derive(Deserialize, Debug)]
pub struct ApplyTemplateRequest {
    pub messages: Vec<MessageIn>,
    #[serde(default = "yes")]
    pub add_generation_prompt: bool,
    /// Read in a pass of its own (no `#[serde(flatten)]`: see
    /// `openai::Common::parse`).
    #[serde(skip)]
    pub template: request::TemplateFields,
}

pub async fn apply_template(
    State(state): State<Arc<AppState>>,
    body: Received,
) -> Result<Json<Value>, ApiError> {
    request::off_runtime(&state, body, apply_template_now).await
}

fn apply_template_now(state: &AppState, body: &Bytes) -> Result<Json<Value>, ApiError> {
    let r = state.ready()?;
    let req = ApplyTemplateRequest {
        template: request::parse_json(body)?,
        ..request::parse_json(body)?
    };
    let messages = request::chat_messages(req.messages)?;
    let prompt = request::render_chat(
        r.engine.as_ref(),
        &messages,
        req.add_generation_prompt,
        None,
        &req.template,
    )?;
    Ok(Json(json!({ "prompt": prompt })))
}

pub async fn props(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let r = state.ready()?;
    let tok = r.engine.tokenizer();
    let piece = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(tok.token_to_piece_with(i, true)).into_owned())
            .unwrap_or_default()
    };
    Ok(Json(json!({
        "default_generation_settings": {
            "n_ctx": r.engine.n_ctx(),
            "params": settings(&r.defaults, r.ignore_eos, usize::MAX, &[], r.engine.n_ctx()),
        },
        "total_slots": r.n_slots,
        "model_path": r.model_path,
        "model_alias": r.model_id,
        "chat_template": r.engine.template_source().unwrap_or(""),
        "bos_token": piece(tok.bos()),
        "eos_token": piece(tok.eos()),
        "build_info": format!("longhaul-server {}", env!("CARGO_PKG_VERSION")),
    }))
    .into_response())
}
