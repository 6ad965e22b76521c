//! A draft model for speculative decoding: llama.cpp's `draft-simple`
//! (`common/speculative.cpp`, `-md/--spec-draft-model`). A small model that
//! shares the target's vocabulary follows the sequence in its own state and
//! proposes its most likely next tokens, one forward pass each; the target
//! verifies them in one batch as it does n-gram drafts.
//!
//! As in llama.cpp, the drafter picks the best of its top 10 candidates and
//! stops when that candidate's probability (a softmax over the ten) falls
//! under `p_min`, after `n_max` tokens, or at the end of the context; a draft
//! shorter than `n_min` is dropped. The proposal is deterministic (a point
//! mass), so [`crate::sample::Sampler::verify`] keeps the target's
//! distribution exactly.
//!
//! The drafter is resident: it never takes a share of the target's expert
//! budget, and [`ModelDrafter::bytes`] is its own memory.

use std::path::Path;
use std::sync::Arc;

use crate::backend::Backend;
use crate::engine::{Engine, EngineError, EngineParams};
use crate::model::Logits;
use crate::spec::{DraftParams, DraftSource};
use crate::state::{HiddenRows, LayerState, SeqState};
use crate::tokenizer::Tokenizer;

/// Candidates the drafter's probabilities are taken over (llama.cpp's
/// draft sampler: `top_k = 10`, then a softmax over them).
const DRAFT_TOP_K: usize = 10;

/// A draft model and its sequence (the model may be shared: each server
/// slot drafts with its own sequence).
pub struct ModelDrafter<B: Backend> {
    engine: Arc<Engine<B>>,
    kv: SeqState<B>,
    /// The tokens `kv` holds.
    tokens: Vec<u32>,
    params: DraftParams,
    /// The target's vocabulary size: a drafted id past it ends the draft.
    n_vocab_target: usize,
}

impl<B: Backend> ModelDrafter<B> {
    /// Loads the draft model at `path` on `backend`, resident, with the
    /// target's context size (`params.n_ctx`, as llama.cpp sizes the draft
    /// context), and checks that its vocabulary is the target's.
    pub fn load(
        path: &Path,
        backend: B,
        params: EngineParams,
        target: &Tokenizer,
        draft: DraftParams,
    ) -> Result<Self, EngineError> {
        let engine = Arc::new(Self::load_model(path, backend, params)?);
        Self::new(engine, target, draft)
    }

    /// Loads a draft model to share: resident, whatever `params` says of
    /// longhaul.
    pub fn load_model(
        path: &Path,
        backend: B,
        mut params: EngineParams,
    ) -> Result<Engine<B>, EngineError> {
        params.longhaul = None;
        Engine::load(path, backend, params)
    }

    /// A drafter with a sequence of its own over the loaded `engine`,
    /// checked against the target's vocabulary.
    pub fn new(
        engine: Arc<Engine<B>>,
        target: &Tokenizer,
        draft: DraftParams,
    ) -> Result<Self, EngineError> {
        check_vocab(target, &engine.tokenizer)?;
        let kv = engine.new_kv()?;
        Ok(Self {
            engine,
            kv,
            tokens: Vec::new(),
            params: draft,
            n_vocab_target: target.n_vocab(),
        })
    }

    /// Memory the drafter holds: its weights and its sequence state.
    pub fn bytes(&self) -> u64 {
        let e = &self.engine;
        held_bytes(&e.model, self.kv.n_ctx(), 1, e.params.kv_type)
    }

    /// Evaluates `tokens` into the drafter's sequence before its first
    /// draft, as the target evaluates a prompt, so that drafting after
    /// them evaluates only what follows (a benchmark times the two apart).
    pub fn prime(&mut self, tokens: &[u32]) -> Result<(), EngineError> {
        match tokens.split_last() {
            Some((&last, rest)) => self.follow(rest, last).map(|_| ()),
            None => Ok(()),
        }
    }

    /// The draft model.
    pub fn engine(&self) -> &Engine<B> {
        &self.engine
    }

    /// Brings the drafter's sequence to `tokens` + `sampled` and returns
    /// the logits after it: the common prefix stays, the rest is evaluated.
    fn follow(&mut self, tokens: &[u32], sampled: u32) -> Result<Vec<f32>, EngineError> {
        let n = tokens.len() + 1;
        let at = |i: usize| if i < tokens.len() { tokens[i] } else { sampled };
        let common = self
            .tokens
            .iter()
            .enumerate()
            .take_while(|&(i, &t)| i < n && at(i) == t)
            .count();
        // At least the last token is evaluated again, for its logits.
        let keep = common.min(n - 1);
        let held = self.kv.rewind(&self.engine.model.backend, keep)?;
        self.tokens.truncate(held);
        let rest: Vec<u32> = (held..n).map(at).collect();
        let logits = self.engine.eval(&mut self.kv, &rest, Logits::Last);
        if logits.is_err() {
            // What the state holds past `held` is unknown: start over next time.
            self.kv.reset(&self.engine.model.backend)?;
            self.tokens.clear();
        } else {
            self.tokens.extend_from_slice(&rest);
        }
        logits
    }
}

impl<B: Backend> DraftSource for ModelDrafter<B> {
    fn draft(
        &mut self,
        tokens: &[u32],
        sampled: u32,
        n_max: usize,
        _hidden: Option<&mut HiddenRows>,
    ) -> Result<Vec<u32>, EngineError> {
        let n_max = n_max.min(self.params.n_max);
        if n_max == 0 {
            return Ok(Vec::new());
        }
        let mut logits = self.follow(tokens, sampled)?;
        // A recurrent drafter goes back through a checkpoint at the draft's start.
        if self.kv.is_recurrent() {
            self.kv.checkpoint(&self.engine.model.backend)?;
        }
        let mut out = Vec::new();
        loop {
            let (id, p) = best_of_top_k(&logits, DRAFT_TOP_K);
            if p < self.params.p_min || id as usize >= self.n_vocab_target {
                break;
            }
            out.push(id);
            if out.len() >= n_max || self.kv.n_past() + 1 > self.kv.n_ctx() {
                break;
            }
            match self.engine.eval(&mut self.kv, &[id], Logits::Last) {
                Ok(l) => {
                    self.tokens.push(id);
                    logits = l;
                }
                Err(e) => {
                    self.kv.reset(&self.engine.model.backend)?;
                    self.tokens.clear();
                    return Err(e);
                }
            }
        }
        if out.len() < self.params.n_min {
            out.clear();
        }
        Ok(out)
    }
}

/// llama.cpp's `draft-mtp` with one trained head (`common/speculative.cpp`,
/// its qwen35 / glm4moe mode): the target's NextN layer
/// ([`crate::model::nextn`]) follows the sequence in a KV cache of its own,
/// the token at each position paired with the target's final-norm row of
/// the position before (zeros before the first), and drafts by feeding its
/// best token and its own row back, `n_max` times (`--spec-draft-n-max`).
/// Candidates, `p_min` and `n_min` are as [`ModelDrafter`]'s. As llama-server
/// does after each draft, the head keeps the positions the target holds and
/// forgets the drafted ones.
pub struct MtpDrafter<B: Backend> {
    engine: Arc<Engine<B>>,
    kv: LayerState<B>,
    n_ctx: usize,
    /// The tokens at the head's positions `0..tokens.len()`.
    tokens: Vec<u32>,
    params: DraftParams,
    /// The probability of each token of the last draft.
    probs: Vec<f32>,
}

impl<B: Backend> MtpDrafter<B> {
    /// A drafter over `engine`'s NextN head (loaded with
    /// [`crate::model::LoadOptions::mtp`]), with a KV cache of `n_ctx`
    /// positions in the engine's cache type.
    pub fn new(
        engine: Arc<Engine<B>>,
        n_ctx: usize,
        params: DraftParams,
    ) -> Result<Self, EngineError> {
        let kv = engine.model.new_nextn_state(n_ctx, engine.params.kv_type)?;
        Ok(Self {
            engine,
            kv,
            n_ctx,
            tokens: Vec::new(),
            params,
            probs: Vec::new(),
        })
    }

    /// The probability of each token of the last draft (a softmax over the
    /// head's ten best logits, what llama.cpp's drafter logs).
    pub fn last_probs(&self) -> &[f32] {
        &self.probs
    }

    /// Memory the drafter holds beyond the target's: the head's KV cache.
    pub fn bytes(&self) -> u64 {
        let b = &self.engine.model.backend;
        match &self.kv {
            LayerState::Kv(kv) => {
                let (shape, t) = b.kv_shape(kv);
                crate::backend::kv_bytes_of(shape, t, self.n_ctx)
                    .map(|(k, v)| (k + v) as u64)
                    .unwrap_or(0)
            }
            LayerState::Recurrent { .. } => 0,
        }
    }

    /// Runs the head over the positions the target evaluated since it last
    /// did (or since the first token that differs) and returns the trunk row
    /// of the last position, the next draft's `h`; the rows read are
    /// released. `None` where a row is missing (a restored state): the head
    /// then drafts again once the sequence starts over below what it holds.
    fn catch_up(
        &mut self,
        tokens: &[u32],
        h: &mut HiddenRows,
    ) -> Result<Option<Vec<f32>>, EngineError> {
        let (n, e) = (tokens.len(), h.n_embd());
        if n == 0 || n > self.n_ctx || e != self.engine.model.hp.n_embd {
            return Ok(None);
        }
        let from = self
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        self.tokens.truncate(from);
        // The trunk rows before positions from..=n (the last for the draft).
        let Some(rows) = catch_up_rows(h, from, n) else {
            h.release_before(n - 1);
            return Ok(None);
        };
        let (rows, last) = rows.split_at((n - from) * e);
        if from < n {
            let m = &self.engine.model;
            m.forward_nextn(&mut self.kv, &tokens[from..], rows, from)?;
            self.tokens.extend_from_slice(&tokens[from..]);
        }
        // Position n - 1's row is the next draft's; older ones are read.
        h.release_before(n - 1);
        Ok(Some(last.to_vec()))
    }
}

impl<B: Backend> DraftSource for MtpDrafter<B> {
    fn needs_hidden(&self) -> bool {
        true
    }

    fn observe(
        &mut self,
        tokens: &[u32],
        hidden: Option<&mut HiddenRows>,
    ) -> Result<(), EngineError> {
        if let Some(h) = hidden {
            self.catch_up(tokens, h)?;
        }
        Ok(())
    }

    fn draft(
        &mut self,
        tokens: &[u32],
        sampled: u32,
        n_max: usize,
        hidden: Option<&mut HiddenRows>,
    ) -> Result<Vec<u32>, EngineError> {
        let n_max = n_max.min(self.params.n_max);
        let n = tokens.len();
        self.probs.clear();
        let Some(h) = hidden else {
            return Ok(Vec::new());
        };
        if n_max == 0 || n == 0 || n + 1 > self.n_ctx {
            return Ok(Vec::new());
        }
        let Some(last) = self.catch_up(tokens, h)? else {
            return Ok(Vec::new());
        };
        let m = &self.engine.model;
        let mut out = Vec::new();
        let (mut tok, mut h_in, mut pos) = (sampled, last, n);
        while pos < self.n_ctx {
            let o = m.forward_nextn(&mut self.kv, &[tok], &h_in, pos)?;
            let (id, p) = best_of_top_k(&o.logits, DRAFT_TOP_K);
            if p < self.params.p_min || id as usize >= m.hp.n_vocab {
                break;
            }
            out.push(id);
            self.probs.push(p);
            if out.len() >= n_max {
                break;
            }
            (tok, h_in, pos) = (id, o.hidden, pos + 1);
        }
        if out.len() < self.params.n_min {
            out.clear();
            self.probs.clear();
        }
        Ok(out)
    }
}

/// The trunk rows the head pairs with positions `from..=n`: the row of the
/// position before each (zeros before position 0). Where the target went
/// back past rows it no longer keeps (a cached prompt's prefix), position
/// `from` pairs, as with llama.cpp's `pending_h`, with the last row it held
/// before. `None` when a row is missing otherwise.
fn catch_up_rows(h: &HiddenRows, from: usize, n: usize) -> Option<Vec<f32>> {
    let e = h.n_embd();
    let mut rows = Vec::with_capacity((n + 1 - from) * e);
    for p in from..=n {
        match p.checked_sub(1) {
            None => rows.resize(rows.len() + e, 0.0),
            Some(q) => {
                let r = h
                    .row(q)
                    .or_else(|| (p == from).then(|| h.last_dropped()).flatten())?;
                rows.extend_from_slice(r);
            }
        }
    }
    Some(rows)
}

/// The best candidate (highest logit, lowest id on ties) and its
/// probability under a softmax over the `k` best logits.
fn best_of_top_k(logits: &[f32], k: usize) -> (u32, f32) {
    let mut top: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || top.len() == k && l <= top[k - 1].0 {
            continue;
        }
        let at = top.partition_point(|&(tl, _)| tl >= l);
        top.insert(at, (l, i as u32));
        top.truncate(k);
    }
    let Some(&(max, id)) = top.first() else {
        return (0, 0.0);
    };
    let sum: f32 = top.iter().map(|&(l, _)| (l - max).exp()).sum();
    (id, 1.0 / sum)
}

/// What a draft model at `path` will hold, read from its file before it is
/// loaded: its weights and `n_seq` sequences of `n_ctx` positions of
/// `kv_type` ([`ModelDrafter::bytes`] per sequence once loaded).
pub fn draft_bytes<B: Backend>(
    path: &Path,
    backend: &B,
    n_ctx: usize,
    n_seq: usize,
    kv_type: crate::tensor::GgmlType,
) -> Result<u64, EngineError> {
    let file = crate::gguf::Model::open(path).map_err(|err| EngineError::Load {
        path: path.display().to_string(),
        err,
    })?;
    let shapes = crate::model::Model::load_shapes(backend.clone(), Arc::new(file))?;
    Ok(held_bytes(&shapes, n_ctx, n_seq, kv_type))
}

/// What a resident draft model `m` holds with `n_seq` sequences of `n_ctx`
/// positions: its weights, KV caches and recurrent states.
pub fn held_bytes<B: Backend>(
    m: &crate::model::Model<B>,
    n_ctx: usize,
    n_seq: usize,
    kv_type: crate::tensor::GgmlType,
) -> u64 {
    let kv = crate::kv::kv_cache_bytes(&m.hp, n_ctx, n_seq, kv_type);
    m.loaded_bytes() + kv + m.hp.recurrent_bytes() * n_seq as u64
}

/// llama.cpp's `common_speculative_are_compatible`: the same vocabulary
/// type, the same BOS/EOS handling, sizes within 128 tokens, and the same
/// token texts from id 5 on.
pub fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<(), EngineError> {
    let bad = |why: String| Err(EngineError::DraftVocab(why));
    if target.vocab_type() != draft.vocab_type() {
        return bad(format!(
            "vocabulary types differ ({:?} vs {:?})",
            target.vocab_type(),
            draft.vocab_type()
        ));
    }
    let specials = |t: &Tokenizer| (t.add_bos(), t.add_bos().then(|| t.bos()).flatten());
    if specials(target) != specials(draft) {
        return bad("BOS tokens differ".into());
    }
    let eos = |t: &Tokenizer| (t.add_eos(), t.add_eos().then(|| t.eos()).flatten());
    if eos(target) != eos(draft) {
        return bad("EOS tokens differ".into());
    }
    let (nt, nd) = (target.n_vocab(), draft.n_vocab());
    if nt.abs_diff(nd) > 128 {
        return bad(format!(
            "vocabulary sizes differ by more than 128 ({nt} vs {nd})"
        ));
    }
    for id in 5..nt.min(nd) as u32 {
        if target.token_text(id) != draft.token_text(id) {
            return bad(format!(
                "token {id} is {:?} in the target and {:?} in the draft",
                target.token_text(id),
                draft.token_text(id)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_of_top_k_softmaxes_the_ten_best_only() {
        // Eleven logits: the worst one is outside the ten and does not count.
        let mut logits = vec![0.0f32; 11];
        logits[3] = 2.0;
        logits[10] = -50.0;
        let (id, p) = best_of_top_k(&logits, 10);
        assert_eq!(id, 3);
        let e = 2.0f32.exp();
        assert!((p - e / (e + 9.0)).abs() < 1e-6, "{p}");
    }

    #[test]
    fn best_of_top_k_breaks_ties_by_lower_id() {
        let logits = [1.0f32, 3.0, 3.0, -1.0];
        assert_eq!(best_of_top_k(&logits, 10).0, 1);
        let (_, p) = best_of_top_k(&[5.0f32, 5.0], 10);
        assert!((p - 0.5).abs() < 1e-6);
    }
}
