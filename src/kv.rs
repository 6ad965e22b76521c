//! The KV cache of one sequence: one backend cache per layer plus the number
//! of positions already filled.

use crate::backend::Backend;
use crate::model::{Logits, Model, ModelError};
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
