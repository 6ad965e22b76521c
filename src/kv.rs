//! The one place a sequence's state is sized ([`check_kv_size`]), above the
//! backends, so that a context from a flag or a file is checked against
//! memory before any backend allocates it. The state itself is
//! [`crate::state::SeqState`].

use crate::mem::human_bytes;
use crate::model::{Hparams, ModelError};
use crate::tensor::GgmlType;

/// Bytes the KV caches of `n_seq` sequences of `n_ctx` positions take: per
/// attention layer and position, a key and a value row of `dtype` as wide
/// as [`Hparams::kv_widths`] says (the latent alone for DeepSeek's MLA).
/// Saturates at `u64::MAX`.
pub fn kv_cache_bytes(hp: &Hparams, n_ctx: usize, n_seq: usize, dtype: GgmlType) -> u64 {
    let (k, v) = hp.kv_widths();
    let bytes = |n: usize| dtype.row_bytes(n as u64).unwrap_or(u64::MAX) as u128;
    let row = bytes(k) + if v == 0 { 0 } else { bytes(v) };
    // An MTP drafter's NextN layer holds a cache of its own per sequence.
    let n_layer = hp.n_layer_kv() + hp.n_nextn_loaded();
    let total = row * n_layer as u128 * n_ctx as u128 * n_seq as u128;
    u64::try_from(total).unwrap_or(u64::MAX)
}

/// Bytes the states of `n_seq` sequences of `n_ctx` positions take: their
/// KV caches ([`kv_cache_bytes`]) and per sequence the recurrent layers'
/// state ([`Hparams::recurrent_bytes`], f32, whatever the context).
/// Saturates at `u64::MAX`.
pub fn kv_bytes(hp: &Hparams, n_ctx: usize, n_seq: usize, dtype: GgmlType) -> u64 {
    let rec = hp.recurrent_bytes().saturating_mul(n_seq as u64);
    kv_cache_bytes(hp, n_ctx, n_seq, dtype).saturating_add(rec)
}

/// Checks that `n_seq` KV caches of `n_ctx` positions fit in the memory this
/// process can still get ([`crate::mem::available_for_allocation`]) and
/// returns their size in bytes. `from_model`: `n_ctx` is the trained
/// context that `-c 0` stands for (said in the message). Every KV cache,
/// on any backend, is sized through here ([`crate::model::Model::new_state`]); the engine
/// calls it once more for all its sequences before loading weights.
pub fn check_kv_size(
    hp: &Hparams,
    n_ctx: usize,
    n_seq: usize,
    dtype: GgmlType,
    from_model: bool,
) -> Result<u64, ModelError> {
    let bytes = kv_bytes(hp, n_ctx, n_seq, dtype);
    match crate::mem::available_for_allocation() {
        Some(available) if bytes > available => Err(ModelError::KvTooLarge {
            n_ctx,
            n_seq,
            from_model,
            bytes,
            available: Some(available),
        }),
        _ => Ok(bytes),
    }
}

/// The message of [`ModelError::KvTooLarge`].
pub(crate) fn too_large_message(
    n_ctx: usize,
    n_seq: usize,
    from_model: bool,
    bytes: u64,
    available: Option<u64>,
) -> String {
    let mut what = if from_model {
        format!("-c 0 (the model's trained context of {n_ctx})")
    } else {
        format!("-c {n_ctx}")
    };
    if n_seq > 1 {
        what += &format!(" with -np {n_seq}");
    }
    let why = match available {
        Some(a) => format!(" but {} is available", human_bytes(a)),
        None => ", which could not be allocated".into(),
    };
    let fix = match (from_model, n_seq > 1) {
        (true, false) => "give a smaller context with -c/--ctx-size",
        (true, true) => "give a smaller context with -c/--ctx-size or lower -np/--parallel",
        (false, false) => "lower -c/--ctx-size",
        (false, true) => "lower -c/--ctx-size or -np/--parallel",
    };
    format!(
        "{what} needs {} of KV cache{why}; {fix}",
        human_bytes(bytes)
    )
}
