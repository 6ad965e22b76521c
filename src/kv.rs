//! The KV cache of one sequence: one backend cache per layer plus the number
//! of positions already filled.

use crate::backend::Backend;
use crate::model::{BatchLogits, Logits, Model, ModelError};
use crate::tensor::GgmlType;

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
