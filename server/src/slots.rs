//! llama-server's slot endpoints: `GET /slots` (what each slot holds and
//! serves) and `POST /slots/{id}?action=save|restore|erase`, whose files
//! live in `--slot-save-path` (see [`longhaul::statefile`]).
//!
//! A file name is a plain name inside that directory: anything that could
//! leave it (a separator, `..`, an absolute path, NUL, a hidden or
//! whitespace-padded name) is a 400, and so is a name that is a symbolic
//! link in the directory (the files are opened without following links as
//! well, so a link planted between the check and the open fails too).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use longhaul::scheduler::{SlotAction, SlotError, SlotReply};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::request::Received;
use crate::AppState;

/// `GET /slots`: one object per slot, llama-server's fields where it has
/// them (`id`, `id_task`, `n_ctx`, `is_processing`, `next_token`) and
/// longhaul's `state` and `n_cached` (tokens whose state the slot holds).
/// `?fail_on_no_slot=1` answers 503 when no slot is idle.
pub async fn list(
    State(state): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let r = state.ready()?;
    if !r.slots_endpoint {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "This server does not support slots endpoint. Start it with `--slots`",
        ));
    }
    let slots = r.scheduler.slots();
    let fail = q
        .get("fail_on_no_slot")
        .is_some_and(|v| v != "0" && v != "false");
    if fail && slots.iter().all(|s| s.task.is_some()) {
        return Err(ApiError::unavailable("no slot available"));
    }
    let out: Vec<Value> = slots
        .iter()
        .map(|s| {
            let (id_task, state) = match &s.task {
                None => (-1, "idle"),
                Some(t) if t.prefilling => (t.id_task as i64, "processing_prompt"),
                Some(t) => (t.id_task as i64, "generating"),
            };
            let next = s.task.as_ref().map(|t| {
                json!({
                    "has_next_token": true,
                    "n_remain": if t.n_predict == usize::MAX { -1 } else { (t.n_predict - t.n_decoded.min(t.n_predict)) as i64 },
                    "n_decoded": t.n_decoded,
                })
            });
            json!({
                "id": s.id,
                "id_task": id_task,
                "n_ctx": s.n_ctx,
                "is_processing": s.task.is_some(),
                "state": state,
                "n_cached": s.n_cached,
                "n_prompt_tokens": s.task.as_ref().map(|t| t.n_prompt),
                "next_token": next.unwrap_or_else(|| json!({
                    "has_next_token": false, "n_remain": 0, "n_decoded": 0
                })),
            })
        })
        .collect();
    Ok(Json(Value::Array(out)).into_response())
}

/// `POST /slots/{id}?action=save|restore|erase`.
pub async fn action(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Received,
) -> Result<Response, ApiError> {
    let r = state.ready()?;
    let id: usize = id
        .parse()
        .map_err(|_| ApiError::bad_request(format!("`{id}` is not a slot id")))?;
    let filename = || -> Result<std::path::PathBuf, ApiError> {
        let Some(dir) = &r.slot_save_path else {
            return Err(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "This server does not support slots action. Start it with `--slot-save-path DIR`",
            ));
        };
        let v: Value = if body.bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body.bytes).map_err(ApiError::from_json)?
        };
        let Some(name) = v.get("filename").and_then(Value::as_str) else {
            return Err(ApiError::invalid_field(
                "filename",
                "give the file name in `filename`",
            ));
        };
        if !longhaul::statefile::valid_name(name) {
            return Err(ApiError::invalid_field(
                "filename",
                format!("Invalid filename {name:?}: give a plain file name inside --slot-save-path (no path, no `..`, not hidden)"),
            ));
        }
        let path = dir.join(name);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(ApiError::invalid_field(
                "filename",
                format!("Invalid filename {name:?}: it is a symbolic link in --slot-save-path"),
            ));
        }
        Ok(path)
    };
    let act = match q.get("action").map(String::as_str) {
        Some("save") => SlotAction::Save(filename()?),
        Some("restore") => SlotAction::Restore(filename()?),
        Some("erase") => SlotAction::Erase,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid action `{other}`: use save, restore or erase"
            )))
        }
        None => return Err(ApiError::bad_request("give ?action=save, restore or erase")),
    };
    let name = match &act {
        SlotAction::Save(p) | SlotAction::Restore(p) => p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        SlotAction::Erase => String::new(),
    };
    let reply = r
        .scheduler
        .slot_action(id, act)
        .await
        .map_err(|e| match e {
            SlotError::NoSlot { .. } => ApiError::bad_request(e.to_string()),
            SlotError::File(msg) => ApiError::bad_request(msg),
            SlotError::ShuttingDown => ApiError::unavailable(e.to_string()),
        })?;
    let body = match reply {
        SlotReply::Saved {
            n_saved,
            n_written,
            ms,
        } => json!({
            "id_slot": id, "filename": name, "n_saved": n_saved, "n_written": n_written,
            "timings": {"save_ms": ms},
        }),
        SlotReply::Restored {
            n_restored,
            n_read,
            ms,
        } => json!({
            "id_slot": id, "filename": name, "n_restored": n_restored, "n_read": n_read,
            "timings": {"restore_ms": ms},
        }),
        SlotReply::Erased { n_erased } => json!({"id_slot": id, "n_erased": n_erased}),
    };
    Ok(Json(body).into_response())
}
