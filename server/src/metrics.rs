//! `/metrics` in Prometheus' text format, llama-server's names under the
//! `longhaul:` prefix, plus the expert cache's statistics.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::AppState;

pub async fn metrics(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let r = state.ready()?;
    let m = r.scheduler.metrics();
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(out, "# HELP longhaul:{name} {help}");
        let _ = writeln!(out, "# TYPE longhaul:{name} {kind}");
        let _ = writeln!(out, "longhaul:{name} {value}");
    };
    put(
        "prompt_tokens_total",
        "counter",
        "Number of prompt tokens processed.",
        m.prompt_tokens_total.to_string(),
    );
    put(
        "prompt_seconds_total",
        "counter",
        "Prompt process time.",
        m.prompt_seconds_total.to_string(),
    );
    put(
        "tokens_predicted_total",
        "counter",
        "Number of generation tokens processed.",
        m.gen_tokens_total.to_string(),
    );
    put(
        "tokens_predicted_seconds_total",
        "counter",
        "Predict process time.",
        m.gen_seconds_total.to_string(),
    );
    let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    put(
        "prompt_tokens_seconds",
        "gauge",
        "Average prompt throughput in tokens/s.",
        rate(m.prompt_tokens_total, m.prompt_seconds_total).to_string(),
    );
    put(
        "predicted_tokens_seconds",
        "gauge",
        "Average generation throughput in tokens/s.",
        rate(m.gen_tokens_total, m.gen_seconds_total).to_string(),
    );
    put(
        "requests_processing",
        "gauge",
        "Number of requests processing.",
        m.requests_processing.to_string(),
    );
    put(
        "requests_deferred",
        "gauge",
        "Number of requests deferred (waiting for a slot).",
        m.requests_deferred.to_string(),
    );
    put("n_slots", "gauge", "Parallel slots.", r.n_slots.to_string());
    put(
        "spec_decode_num_draft_tokens_total",
        "counter",
        "Speculative: Total draft tokens generated",
        m.spec_draft_tokens.to_string(),
    );
    put(
        "spec_decode_num_accepted_tokens_total",
        "counter",
        "Speculative: Total draft tokens accepted by the target model",
        m.spec_accepted_tokens.to_string(),
    );
    put(
        "spec_decode_num_drafts_total",
        "counter",
        "Speculative: Total speculative decoding verification steps",
        m.spec_drafts.to_string(),
    );
    put(
        "checkpoints_created_total",
        "counter",
        "Recurrent-state checkpoints made while processing prompts (hybrid models).",
        m.checkpoints_created.to_string(),
    );
    put(
        "checkpoints_restored_total",
        "counter",
        "Requests that resumed a shared prompt prefix from a checkpoint.",
        m.checkpoints_restored.to_string(),
    );
    put(
        "prompt_reprefills_total",
        "counter",
        "Requests of a hybrid model whose shared prefix had no checkpoint, evaluated again from the start.",
        m.prefix_reprefills.to_string(),
    );
    put(
        "state_saves_total",
        "counter",
        "Sequence states written to files (slot saves, --slot-persist, context-cache spills).",
        m.state_saves.to_string(),
    );
    put(
        "state_bytes_written_total",
        "counter",
        "Bytes of sequence state files written.",
        m.state_bytes_written.to_string(),
    );
    put(
        "state_restores_total",
        "counter",
        "Sequence states restored from files.",
        m.state_restores.to_string(),
    );
    put(
        "state_bytes_read_total",
        "counter",
        "Bytes of sequence state files read.",
        m.state_bytes_read.to_string(),
    );
    put(
        "state_prompt_tokens_reused_total",
        "counter",
        "Prompt tokens not evaluated because a restored state held them.",
        m.state_tokens_reused.to_string(),
    );
    put(
        "model_file_changed",
        "gauge",
        "1 when a model file changed since it was loaded (requests fail until it is put back or the server restarts).",
        u8::from(r.engine.check_files().is_err()).to_string(),
    );
    put(
        "longhaul_enabled",
        "gauge",
        "1 when routed experts are streamed from disk (--longhaul).",
        u8::from(m.longhaul.is_some()).to_string(),
    );
    let lh = m.longhaul.unwrap_or_default();
    put(
        "longhaul_hits_total",
        "counter",
        "Expert uses served from the cache.",
        lh.hits.to_string(),
    );
    put(
        "longhaul_misses_total",
        "counter",
        "Expert uses that needed a read.",
        lh.misses.to_string(),
    );
    put(
        "longhaul_hit_rate",
        "gauge",
        "Expert cache hit rate (hits / (hits + misses)).",
        lh.hit_rate().to_string(),
    );
    put(
        "longhaul_bytes_read_total",
        "counter",
        "Expert bytes read from the model file(s).",
        lh.bytes_read.to_string(),
    );
    put(
        "longhaul_io_seconds_total",
        "counter",
        "Time the engine was blocked on expert reads.",
        lh.io_time.as_secs_f64().to_string(),
    );
    put(
        "longhaul_read_seconds_total",
        "counter",
        "Time demand reads of experts were in flight (compute overlaps part of it).",
        lh.read_time.as_secs_f64().to_string(),
    );
    put(
        "longhaul_overlapped_total",
        "counter",
        "Experts computed while reads of their wave were in flight.",
        lh.overlapped.to_string(),
    );
    put(
        "longhaul_prefetched_total",
        "counter",
        "Experts read ahead by lookahead prefetch.",
        lh.prefetched.to_string(),
    );
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response())
}
