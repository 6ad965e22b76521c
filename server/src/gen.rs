//! Running one generation for a handler: submission, the event stream
//! reduced to text pieces, shutdown aborts, and collection for non-streamed
//! answers.

use futures_util::stream::{self, Stream};
use longhaul::scheduler::{FinishReason, GenEvent, GenFailure, GenRequest, GenStream, GenSummary};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::Ready;

/// What a handler relays: text, then exactly one `Done` or `Error`.
pub enum Piece {
    Text(String),
    /// A token of a request that asked for probabilities: its text (maybe
    /// empty) and probabilities. Every sampled token comes as one.
    Token {
        text: String,
        probs: crate::probs::Probs,
    },
    Done(GenSummary),
    Error(ApiError),
}

/// A started generation, or one that needs no engine work (`n_predict` 0).
pub enum Started {
    Running(GenStream),
    Empty(GenSummary),
}

/// Submits `req` (checks the context limit first so that `n_predict: 0`
/// answers the same errors as any other request).
pub fn start(ready: &Ready, req: GenRequest) -> Result<Started, ApiError> {
    let n_ctx = ready.scheduler.n_ctx();
    // A model file that changed under the server serves nothing (the engine
    // checks again before every step).
    ready.engine.check_files().map_err(ApiError::unavailable)?;
    if req.prompt.is_empty() {
        return Err(longhaul::scheduler::SchedulerError::EmptyPrompt.into());
    }
    if req.prompt.len() >= n_ctx {
        return Err(longhaul::scheduler::SchedulerError::PromptTooLong {
            n_prompt: req.prompt.len(),
            n_ctx,
        }
        .into());
    }
    if req.n_predict == 0 {
        return Ok(Started::Empty(GenSummary {
            finish_reason: FinishReason::Length,
            n_prompt: req.prompt.len(),
            n_cached: 0,
            n_gen: 0,
            prompt_ms: 0.0,
            gen_ms: 0.0,
            stopped_word: None,
            spec: Default::default(),
        }));
    }
    Ok(Started::Running(ready.scheduler.submit(req)?))
}

/// The generation as a stream of pieces; empty token texts are skipped. When
/// `abort` turns true (shutdown), the generation is cancelled and the stream
/// ends with a 503 error. Dropping the stream cancels the generation.
pub fn pieces(started: Started, abort: watch::Receiver<bool>) -> impl Stream<Item = Piece> {
    let (gen, first) = match started {
        Started::Running(g) => (Some(g), None),
        Started::Empty(s) => (None, Some(Piece::Done(s))),
    };
    stream::unfold(
        (gen, first, abort),
        |(mut gen, mut first, mut abort)| async move {
            if let Some(p) = first.take() {
                return Some((p, (gen, first, abort)));
            }
            let g = gen.as_mut()?;
            loop {
                let aborted = tokio::select! {
                    ev = g.next() => Err(ev),
                    _ = abort.wait_for(|&v| v) => Ok(()),
                };
                let ev = match aborted {
                    Err(ev) => ev,
                    Ok(()) => {
                        g.cancel();
                        let e = ApiError::unavailable(
                            "the server is shutting down; the generation was cancelled",
                        );
                        return Some((Piece::Error(e), (None, None, abort)));
                    }
                };
                let piece = match ev {
                    Some(GenEvent::Token {
                        id,
                        text,
                        probs: Some(p),
                    }) => {
                        let piece = Piece::Token {
                            text,
                            probs: (id, p),
                        };
                        return Some((piece, (gen, first, abort)));
                    }
                    Some(GenEvent::Token { text, .. }) if text.is_empty() => continue,
                    Some(GenEvent::Token { text, .. }) => {
                        return Some((Piece::Text(text), (gen, first, abort)))
                    }
                    Some(GenEvent::Done(s)) => Piece::Done(s),
                    Some(GenEvent::Error(GenFailure::Constraint(msg))) => {
                        Piece::Error(ApiError::bad_request(format!(
                            "the request's grammar or JSON schema failed during generation ({msg}); \
                             simplify it (fewer alternatives at one point, fewer optional properties)"
                        )))
                    }
                    Some(GenEvent::Error(GenFailure::Engine(msg))) => Piece::Error(ApiError::new(
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        format!("generation failed: {msg}"),
                    )),
                    None => Piece::Error(ApiError::unavailable(
                        "the engine stopped before the generation finished",
                    )),
                };
                return Some((piece, (None, None, abort)));
            }
        },
    )
}

/// Runs a generation to its end: the full text, the probabilities of
/// every token when the request asked for them, and the summary.
pub async fn collect_with_probs(
    started: Started,
    abort: watch::Receiver<bool>,
) -> Result<(String, Vec<crate::probs::Probs>, GenSummary), ApiError> {
    use futures_util::StreamExt;
    let s = pieces(started, abort);
    futures_util::pin_mut!(s);
    let mut text = String::new();
    let mut probs = Vec::new();
    while let Some(p) = s.next().await {
        match p {
            Piece::Text(t) => text.push_str(&t),
            Piece::Token { text: t, probs: p } => {
                text.push_str(&t);
                probs.push(p);
            }
            Piece::Done(sum) => return Ok((text, probs, sum)),
            Piece::Error(e) => return Err(e),
        }
    }
    Err(ApiError::unavailable(
        "the generation ended without a result",
    ))
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(s: &GenSummary) -> &'static str {
    match s.finish_reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// The `usage` object.
pub fn usage(s: &GenSummary) -> serde_json::Value {
    serde_json::json!({
        "prompt_tokens": s.n_prompt,
        "completion_tokens": s.n_gen,
        "total_tokens": s.n_prompt + s.n_gen,
        "prompt_tokens_details": { "cached_tokens": s.n_cached },
    })
}

/// llama.cpp's `timings` object.
pub fn timings(s: &GenSummary) -> serde_json::Value {
    let n_eval = s.n_prompt.saturating_sub(s.n_cached);
    let per_tok = |ms: f64, n: usize| if n == 0 { 0.0 } else { ms / n as f64 };
    let per_sec = |ms: f64, n: usize| if ms <= 0.0 { 0.0 } else { 1e3 * n as f64 / ms };
    let mut t = serde_json::json!({
        "cache_n": s.n_cached,
        "prompt_n": n_eval,
        "prompt_ms": s.prompt_ms,
        "prompt_per_token_ms": per_tok(s.prompt_ms, n_eval),
        "prompt_per_second": per_sec(s.prompt_ms, n_eval),
        "predicted_n": s.n_gen,
        "predicted_ms": s.gen_ms,
        "predicted_per_token_ms": per_tok(s.gen_ms, s.n_gen),
        "predicted_per_second": per_sec(s.gen_ms, s.n_gen),
    });
    // As llama-server: the draft counts when the request speculated.
    if s.spec.n_drafted > 0 {
        t["draft_n"] = s.spec.n_drafted.into();
        t["draft_n_accepted"] = s.spec.n_accepted.into();
    }
    t
}
