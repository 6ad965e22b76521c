//! The KV cache of one sequence: one backend cache per layer plus the number
//! of positions already filled; and the one place a KV cache is sized
//! ([`check_kv_size`]), above the backends, so that a context from a flag or
//! a file is checked against memory before any backend allocates it.

use crate::backend::Backend;
use crate::mem::human_bytes;
use crate::model::{BatchLogits, Hparams, Logits, Model, ModelError};
use crate::tensor::GgmlType;

/// Bytes the KV caches of `n_seq` sequences of `n_ctx` positions take: per
/// layer and position, a key and a value row of `dtype` as wide as
/// [`Hparams::kv_widths`] says (the latent alone for DeepSeek's MLA).
/// Saturates at `u64::MAX`.
pub fn kv_bytes(hp: &Hparams, n_ctx: usize, n_seq: usize, dtype: GgmlType) -> u64 {
    let (k, v) = hp.kv_widths();
    let bytes = |n: usize| dtype.row_bytes(n as u64).unwrap_or(u64::MAX) as u128;
    let row = bytes(k) + if v == 0 { 0 } else { bytes(v) };
    let total = row * hp.n_layer as u128 * n_ctx as u128 * n_seq as u128;
    u64::try_from(total).unwrap_or(u64::MAX)
}

/// Checks that `n_seq` KV caches of `n_ctx` positions fit in the memory this
/// process can still get ([`crate::mem::available_for_allocation`]) and
/// returns their size in bytes. `from_model`: `n_ctx` is the trained
/// context that `-c 0` stands for (said in the message). Every KV cache,
/// on any backend, is sized through here ([`Model::new_kv`]); the engine
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

pub struct KvCache<B: Backend> {
    layers: Vec<B::Kv>,
    n_ctx: usize,
    n_past: usize,
}

impl<B: Backend> KvCache<B> {
    /// A cache of `n_ctx` positions in `dtype` (F16 by default, F32 on request).
    pub fn new(model: &Model<B>, n_ctx: usize, dtype: GgmlType) -> Result<Self, ModelError> {
        Ok(Self {
            layers: model.new_kv(n_ctx, dtype)?,
            n_ctx,
            n_past: 0,
        })
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Positions filled so far (the next token goes to this position).
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Forgets positions from `n` on (the data is overwritten by later writes).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    /// Runs each `tokens[i]` after what `caches[i]` holds, all in one batch,
    /// and returns the last-token logits of each (empty for empty inputs).
    pub fn eval_multi(
        model: &Model<B>,
        caches: &mut [&mut KvCache<B>],
        tokens: &[&[u32]],
    ) -> Result<BatchLogits, ModelError> {
        let seqs: Vec<(&[u32], usize)> = caches
            .iter()
            .zip(tokens)
            .map(|(c, t)| (*t, c.n_past))
            .collect();
        let mut kvs: Vec<&mut [B::Kv]> =
            caches.iter_mut().map(|c| c.layers.as_mut_slice()).collect();
        let out = model.forward_multi(&mut kvs, &seqs, Logits::Last)?;
        for (c, t) in caches.iter_mut().zip(tokens) {
            c.n_past += t.len();
        }
        Ok(out)
    }

    /// Runs `tokens` through `model` at the next positions of this cache
    /// (one forward pass, no ubatch splitting) and returns their logits.
    pub fn eval(
        &mut self,
        model: &Model<B>,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let logits = model.forward(&mut self.layers, tokens, self.n_past, want)?;
        self.n_past += tokens.len();
        Ok(logits)
    }
}
