//! OpenAI's API: `/v1/models`, `/v1/chat/completions`, `/v1/completions`,
//! non-streamed JSON or server-sent events (`data: {chunk}` ... then
//! `data: [DONE]`).

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use longhaul::scheduler::{GenRequest, GenSummary};
use longhaul::toolcall::ToolFormat;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::fields::StopField;
use crate::gen::{self, Piece};
use crate::probs::{self, Spliced};
use crate::prompt::PromptField;
use crate::request::{self, MessageIn, ProbsApi, Received, Sampling};
use crate::structured::{self, StructuredFields};
use crate::tools::{self, ToolStream};
use crate::unsupported;
use crate::{new_id, unix_now, AppState};

pub async fn models(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let r = state.ready()?;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": r.model_id,
            "object": "model",
            "created": r.created,
            "owned_by": "longhaul",
            "meta": {
                "n_ctx": r.engine.n_ctx(),
                "n_vocab": r.engine.tokenizer().n_vocab(),
                "n_slots": r.n_slots,
            },
        }],
    })))
}

#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields both OpenAI generation endpoints take, read by [`Common::parse`].
#[derive(Deserialize, Debug, Default)]
pub struct Common {
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    #[serde(skip)]
    pub sampling: Sampling,
    pub stop: Option<StopField>,
    pub n: Option<i64>,
    /// Absent: the server's `--ignore-eos`.
    pub ignore_eos: Option<bool>,
    pub cache_prompt: Option<bool>,
    #[serde(skip)]
    pub structured: StructuredFields,
}

impl Common {
    /// Reads the fields from the whole body, the sampling and constraint
    /// fields each in a pass of their own. Not `#[serde(flatten)]`: that
    /// buffers every field the outer struct does not name as serde's
    /// `Content` before reading it, so 16 MiB of `logit_bias` pairs took
    /// the server to 1.23 GiB (see [`crate::fields`]).
    fn parse(body: &[u8]) -> Result<Self, ApiError> {
        Ok(Self {
            sampling: request::parse_json(body)?,
            structured: request::parse_json(body)?,
            ..request::parse_json(body)?
        })
    }

    /// `stream_options.include_usage`.
    fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    /// Checks the fields and builds the engine request for `prompt`.
    fn request(self, state: &AppState, prompt: Vec<u32>) -> Result<GenRequest, ApiError> {
        let r = state.ready()?;
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid_field(
                    "n",
                    format!("n = {n}: this server generates one choice per request (n = 1)"),
                ));
            }
        }
        let (field, max) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => ("max_completion_tokens", Some(m)),
            (None, m) => ("max_tokens", m),
        };
        let n_predict = request::n_predict(field, max)?;
        let sampler = self.sampling.params(&r.defaults, r.engine.as_ref())?;
        let constraint = structured::constraint(
            r.engine.as_ref(),
            &self.structured,
            r.default_constraint.as_ref(),
            true,
        )?;
        Ok(GenRequest {
            prompt,
            n_predict,
            sampler,
            stop: self
                .stop
                .map(StopField::into_vec)
                .transpose()?
                .unwrap_or_default(),
            cache_prompt: self.cache_prompt.unwrap_or(true),
            ignore_eos: self.ignore_eos.unwrap_or(r.ignore_eos),
            probs: None,
            constraint,
            special: false,
        })
    }
}

#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    pub messages: Vec<MessageIn>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Read in a pass of its own (no `#[serde(flatten)]`: see
    /// [`Common::parse`]).
    #[serde(skip)]
    pub template: request::TemplateFields,
    /// Read by [`Common::parse`].
    #[serde(skip)]
    pub common: Common,
}

/// A chat request rendered, tokenized and compiled: ready to start.
struct PreparedChat {
    greq: GenRequest,
    format: Option<ToolFormat>,
    stream: bool,
    include_usage: bool,
}

fn prepare_chat(state: &AppState, body: &Bytes) -> Result<PreparedChat, ApiError> {
    let r = state.ready()?;
    let req = ChatRequest {
        common: Common::parse(body)?,
        template: request::parse_json(body)?,
        ..request::parse_json(body)?
    };
    unsupported::refuse_unimplemented(body)?;
    let want = request::probs_request(body, ProbsApi::Chat)?;
    let plan = tools::plan(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
        r.engine.template_source(),
        req.common.structured.any(),
    )?;
    let messages = request::chat_messages(req.messages)?;
    let tools = plan.as_ref().map(|p| p.tools.as_slice());
    let text = request::render_chat(r.engine.as_ref(), &messages, true, tools, &req.template)?;
    let prompt = request::tokenize_rendered(r.engine.as_ref(), &text, r.scheduler.n_ctx())?;
    let stream = req.common.stream;
    let include_usage = req.common.include_usage();
    let mut greq = req.common.request(state, prompt)?;
    greq.probs = want;
    if let Some(spec) = plan.as_ref().and_then(|p| p.constraint.as_ref()) {
        let requested = structured::Requested {
            spec: spec.clone(),
            field: "tools",
        };
        greq.constraint = Some(structured::compile(r.engine.as_ref(), &requested)?);
    }
    let format = plan.map(|p| p.format);
    greq.special = format.is_some_and(|f| f.needs_special_tokens());
    let n_vocab = r.engine.tokenizer().n_vocab();
    request::check_probs(&greq, ProbsApi::Chat, r.scheduler.n_ctx(), n_vocab)?;
    Ok(PreparedChat {
        greq,
        format,
        stream,
        include_usage,
    })
}

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Received,
) -> Result<Response, ApiError> {
    let PreparedChat {
        greq,
        format,
        stream,
        include_usage,
    } = request::off_runtime(&state, body, prepare_chat).await?;
    let r = state.ready()?;
    let want = greq.probs;
    let post = want.is_some_and(|w| w.post_sampling);
    let started = gen::start(r, greq)?;
    let id = new_id("chatcmpl");
    let created = unix_now();
    let model = r.model_id.clone();
    if !stream {
        let (text, ps, sum) = gen::collect_with_probs(started, state.abort.clone()).await?;
        // `logprobs.content` is written in by `Spliced`.
        let logprobs = match want {
            Some(_) => json!({ "content": null }),
            None => Value::Null,
        };
        let (message, finish) = match format {
            Some(f) => {
                let parsed = f.parse(&text);
                let finish = if parsed.tool_calls.is_empty() {
                    gen::finish_reason(&sum)
                } else {
                    "tool_calls"
                };
                (tools::message(&parsed), finish)
            }
            None => (
                json!({ "role": "assistant", "content": text }),
                gen::finish_reason(&sum),
            ),
        };
        let v = json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish,
            }],
            "usage": gen::usage(&sum),
            "timings": gen::timings(&sum),
        });
        if want.is_none() {
            return Ok(Json(v).into_response());
        }
        let with = probs::entries(r.engine.tokenizer(), &ps, post);
        return Ok(Json(Spliced {
            value: &v,
            pointer: "/choices/0/logprobs/content",
            with: &with,
        })
        .into_response());
    }
    let chunk = move |delta: Value, finish: Option<&str>| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }],
        })
    };
    let first = data(&chunk(json!({"role": "assistant", "content": ""}), None));
    let engine = r.engine.clone();
    let mut tool_stream = format.map(ToolStream::new);
    let events = gen::pieces(started, state.abort.clone()).flat_map(move |p| {
        // Text goes through the tool-call scanner when tools were given: a
        // possible call is held back and sent as `tool_calls` at the end.
        let mut content = |t: String| match tool_stream.as_mut() {
            Some(ts) => ts.push(&t),
            None => t,
        };
        let evs = match p {
            Piece::Text(t) => {
                let t = content(t);
                if t.is_empty() {
                    vec![]
                } else {
                    vec![data(&chunk(json!({ "content": t }), None))]
                }
            }
            Piece::Token { text, probs: p } => {
                let mut c = chunk(json!({ "content": content(text) }), None);
                c["choices"][0]["logprobs"] = json!({ "content": null });
                vec![data(&Spliced {
                    value: &c,
                    pointer: "/choices/0/logprobs/content",
                    with: &probs::entries(engine.tokenizer(), &[p], post),
                })]
            }
            Piece::Done(sum) => {
                let mut finish = gen::finish_reason(&sum);
                let mut evs = Vec::new();
                if let Some(ts) = tool_stream.as_mut() {
                    let (deltas, called) = ts.finish();
                    evs.extend(deltas.into_iter().map(|d| data(&chunk(d, None))));
                    if called {
                        finish = "tool_calls";
                    }
                }
                evs.extend(stream_end(
                    chunk(json!({}), Some(finish)),
                    include_usage.then(|| chunk(json!({}), None)),
                    &sum,
                ));
                evs
            }
            Piece::Error(e) => vec![data(&e.body()), done()],
        };
        stream::iter(evs)
    });
    Ok(sse(stream::once(async move { first }).chain(events)))
}

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    #[serde(default)]
    pub echo: bool,
    /// Read by [`Common::parse`].
    #[serde(skip)]
    pub common: Common,
}

/// A `/v1/completions` request checked, tokenized and compiled.
struct Prepared {
    greq: GenRequest,
    stream: bool,
    include_usage: bool,
}

fn prepare(state: &AppState, body: &Bytes) -> Result<Prepared, ApiError> {
    let r = state.ready()?;
    let req = CompletionRequest {
        common: Common::parse(body)?,
        ..request::parse_json(body)?
    };
    unsupported::refuse_unimplemented(body)?;
    let want = request::probs_request(body, ProbsApi::Completions)?;
    if req.echo {
        return Err(ApiError::invalid_field(
            "echo",
            "echo is not supported by this server",
        ));
    }
    let prompt = req
        .prompt
        .tokenize(r.engine.as_ref(), r.scheduler.n_ctx())?;
    let stream = req.common.stream;
    let include_usage = req.common.include_usage();
    let mut greq = req.common.request(state, prompt)?;
    greq.probs = want;
    let n_vocab = r.engine.tokenizer().n_vocab();
    request::check_probs(&greq, ProbsApi::Completions, r.scheduler.n_ctx(), n_vocab)?;
    Ok(Prepared {
        greq,
        stream,
        include_usage,
    })
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Received,
) -> Result<Response, ApiError> {
    let Prepared {
        greq,
        stream,
        include_usage,
    } = request::off_runtime(&state, body, prepare).await?;
    let r = state.ready()?;
    let want = greq.probs;
    let post = want.is_some_and(|w| w.post_sampling);
    let started = gen::start(r, greq)?;
    let id = new_id("cmpl");
    let created = unix_now();
    let model = r.model_id.clone();
    if !stream {
        let (text, ps, sum) = gen::collect_with_probs(started, state.abort.clone()).await?;
        let v = json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": gen::finish_reason(&sum),
            }],
            "usage": gen::usage(&sum),
            "timings": gen::timings(&sum),
        });
        if want.is_none() {
            return Ok(Json(v).into_response());
        }
        let (with, _) = probs::legacy(r.engine.tokenizer(), &ps, 0, post);
        return Ok(Json(Spliced {
            value: &v,
            pointer: "/choices/0/logprobs",
            with: &with,
        })
        .into_response());
    }
    let chunk = move |text: &str, finish: Option<&str>| {
        json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish }],
        })
    };
    let engine = r.engine.clone();
    let mut offset = 0;
    let events = gen::pieces(started, state.abort.clone()).flat_map(move |p| {
        let evs = match p {
            Piece::Text(t) => vec![data(&chunk(&t, None))],
            Piece::Token { text, probs: p } => {
                let p = [p];
                let (lp, next) = probs::legacy(engine.tokenizer(), &p, offset, post);
                offset = next;
                vec![data(&Spliced {
                    value: &chunk(&text, None),
                    pointer: "/choices/0/logprobs",
                    with: &lp,
                })]
            }
            Piece::Done(sum) => stream_end(
                chunk("", Some(gen::finish_reason(&sum))),
                include_usage.then(|| chunk("", None)),
                &sum,
            ),
            Piece::Error(e) => vec![data(&e.body()), done()],
        };
        stream::iter(evs)
    });
    Ok(sse(events))
}

/// The events that end an OpenAI stream: `last` (the chunk with the
/// finish reason) with the timings, then `usage` (an empty chunk, sent when
/// `stream_options.include_usage` asked for it) with no choices and the
/// usage, then `[DONE]`.
fn stream_end(
    mut last: Value,
    usage: Option<Value>,
    sum: &GenSummary,
) -> Vec<Result<Event, Infallible>> {
    last["timings"] = gen::timings(sum);
    let mut v = vec![data(&last)];
    if let Some(mut u) = usage {
        u["choices"] = json!([]);
        u["usage"] = gen::usage(sum);
        v.push(data(&u));
    }
    v.push(done());
    v
}

/// One `data: {json}` event.
pub fn data(v: &impl Serialize) -> Result<Event, Infallible> {
    // Only string keys are written, so this cannot fail; if it did, the
    // client would read why.
    let text = serde_json::to_string(v).unwrap_or_else(|e| {
        let e = ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot write the response: {e}"),
        );
        e.body().to_string()
    });
    Ok(Event::default().data(text))
}

/// `data: [DONE]`.
fn done() -> Result<Event, Infallible> {
    Ok(Event::default().data("[DONE]"))
}

/// A server-sent-events response.
pub fn sse(
    events: impl futures_util::Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> Response {
    Sse::new(events).into_response()
}
