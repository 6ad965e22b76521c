//! The state of one sequence: one entry per layer (an attention layer's KV
//! cache, or a recurrent layer's convolution inputs and DeltaNet matrices),
//! the number of positions it holds, and the checkpoints of its recurrent
//! part that let it go back.
//!
//! An attention-only state rewinds to any earlier position (the cache rows
//! past it are overwritten later). A recurrent state cannot: it is a
//! summary of every token so far. It goes back only to a checkpoint, a copy
//! of the recurrent layers taken at a position (llama.cpp's context
//! checkpoints, `--ctx-checkpoints`), or to the start; [`SeqState::rewind`]
//! says where it landed and the caller evaluates the tokens from there, so
//! that a rewind never leaves a state that disagrees with its position.

use crate::backend::Backend;
use crate::model::{BatchLogits, Logits, Model, ModelError};
use crate::tensor::GgmlType;

/// One layer's part of a sequence's state.
pub enum LayerState<B: Backend> {
    /// An attention layer's KV cache.
    Kv(B::Kv),
    /// A gated DeltaNet layer: the convolution's last `d_conv - 1` inputs
    /// `[d_conv - 1, channels]` and one `S x S` matrix per value head
    /// `[n_v_heads, S * S]` (see [`Backend::gated_delta_net`]).
    Recurrent { conv: B::Tensor, ssm: B::Tensor },
}

/// The recurrent layers' state at `pos`, copied to the host.
struct Checkpoint {
    pos: usize,
    /// `(conv, ssm)` of each recurrent layer, in layer order.
    layers: Vec<(Vec<f32>, Vec<f32>)>,
}

/// A sequence's state copied to the host ([`SeqState::save`]): the
/// positions held and each layer's part, in layer order.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedState {
    pub n_past: usize,
    pub layers: Vec<SavedLayer>,
}

/// One layer of a [`SavedState`].
#[derive(Clone, Debug, PartialEq)]
pub enum SavedLayer {
    /// [`Backend::kv_read`] of the positions held.
    Kv(Vec<u8>),
    /// A recurrent layer's convolution inputs and DeltaNet matrices.
    Recurrent { conv: Vec<f32>, ssm: Vec<f32> },
}

impl SavedLayer {
    /// Bytes this layer takes in a state file.
    pub fn bytes(&self) -> usize {
        match self {
            SavedLayer::Kv(b) => b.len(),
            SavedLayer::Recurrent { conv, ssm } => 4 * (conv.len() + ssm.len()),
        }
    }
}

/// The final-norm rows (llama.cpp's `h_nextn`) of the positions a sequence
/// evaluated, kept for an MTP drafter ([`crate::draft::MtpDrafter`]) until
/// it has read them: row `p` is what the trunk computed for the token at
/// position `p`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HiddenRows {
    n_embd: usize,
    /// Position of the first row held.
    pos0: usize,
    data: Vec<f32>,
    /// The row of the last position held before the latest truncation that
    /// dropped rows.
    dropped: Vec<f32>,
}

impl HiddenRows {
    pub fn new(n_embd: usize) -> Self {
        Self {
            n_embd,
            ..Self::default()
        }
    }

    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// How many rows are held.
    pub fn n_rows(&self) -> usize {
        self.data.len() / self.n_embd.max(1)
    }

    /// One past the last position held.
    pub fn end(&self) -> usize {
        self.pos0 + self.n_rows()
    }

    /// The row of position `pos`, when held.
    pub fn row(&self, pos: usize) -> Option<&[f32]> {
        let i = pos.checked_sub(self.pos0)?;
        self.data.get(i * self.n_embd..(i + 1) * self.n_embd)
    }

    /// Rows of the positions from `at` on; what was held from `at` on is
    /// replaced (a sequence that went back and evaluated again). Rows that
    /// would not follow the ones held replace them all.
    pub fn record(&mut self, at: usize, rows: &[f32]) {
        if at < self.pos0 || at > self.end() {
            self.data.clear();
            self.pos0 = at;
        }
        self.truncate(at);
        self.data.extend_from_slice(rows);
    }

    /// Forgets the positions from `n` on.
    pub fn truncate(&mut self, n: usize) {
        let keep = n.saturating_sub(self.pos0).min(self.n_rows());
        if keep * self.n_embd < self.data.len() {
            let last = self.data.len() - self.n_embd;
            self.dropped.clear();
            self.dropped.extend_from_slice(&self.data[last..]);
        }
        self.data.truncate(keep * self.n_embd);
    }

    /// The row of the last position held before the latest truncation that
    /// dropped rows: what llama.cpp's MTP drafter still pairs the next
    /// position with (its `pending_h`) after the sequence went back past
    /// the rows kept.
    pub fn last_dropped(&self) -> Option<&[f32]> {
        (self.dropped.len() == self.n_embd && self.n_embd > 0).then_some(&self.dropped[..])
    }

    /// Forgets the rows before `pos` (the drafter has read them).
    pub fn release_before(&mut self, pos: usize) {
        let drop = pos.saturating_sub(self.pos0).min(self.n_rows());
        self.data.drain(..drop * self.n_embd);
        self.pos0 += drop;
    }

    /// Forgets every row; the next one recorded starts anew.
    pub fn clear(&mut self) {
        self.data.clear();
        self.dropped.clear();
        self.pos0 = 0;
    }
}

/// llama.cpp's default `--ctx-checkpoints` (`n_ctx_checkpoints`).
pub const DEFAULT_CHECKPOINTS: usize = 32;

/// One sequence's state over every layer of a model.
pub struct SeqState<B: Backend> {
    layers: Vec<LayerState<B>>,
    n_ctx: usize,
    n_past: usize,
    checkpoints: Vec<Checkpoint>,
    max_checkpoints: usize,
    /// A reset did not complete: the recurrent layers hold garbage, and
    /// nothing is evaluated until a reset succeeds.
    poisoned: bool,
    /// The final-norm rows of the positions evaluated, when an MTP drafter
    /// reads them ([`SeqState::keep_hidden`]).
    hidden: Option<HiddenRows>,
}

impl<B: Backend> SeqState<B> {
    /// A fresh state of `n_ctx` positions, KV caches in `dtype` (F16 by
    /// default, F32 on request), keeping up to [`DEFAULT_CHECKPOINTS`].
    pub fn new(model: &Model<B>, n_ctx: usize, dtype: GgmlType) -> Result<Self, ModelError> {
        Ok(Self {
            layers: model.new_state(n_ctx, dtype)?,
            n_ctx,
            n_past: 0,
            checkpoints: Vec::new(),
            max_checkpoints: DEFAULT_CHECKPOINTS,
            poisoned: false,
            hidden: None,
        })
    }

    /// Keeps the final-norm rows (`n_embd` wide) of every position evaluated
    /// from now on, for an MTP drafter ([`SeqState::hidden_mut`]).
    pub fn keep_hidden(&mut self, n_embd: usize) {
        if self.hidden.as_ref().is_none_or(|h| h.n_embd() != n_embd) {
            self.hidden = Some(HiddenRows::new(n_embd));
        }
    }

    /// The rows kept by [`SeqState::keep_hidden`], of positions below
    /// [`SeqState::n_past`] only (a rewind drops the others).
    pub fn hidden_mut(&mut self) -> Option<&mut HiddenRows> {
        let n = self.n_past;
        let h = self.hidden.as_mut()?;
        h.truncate(n);
        Some(h)
    }

    /// Keeps at most `n` checkpoints (0: none, so a recurrent state only
    /// rewinds to the start).
    pub fn set_max_checkpoints(&mut self, n: usize) {
        self.max_checkpoints = n;
        let drop = self.checkpoints.len().saturating_sub(n);
        self.checkpoints.drain(..drop);
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Positions filled so far (the next token goes to this position).
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Whether any layer is recurrent (rewinds need checkpoints).
    pub fn is_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerState::Recurrent { .. }))
    }

    /// Positions of the checkpoints held, oldest first.
    pub fn checkpoint_positions(&self) -> Vec<usize> {
        self.checkpoints.iter().map(|c| c.pos).collect()
    }

    /// Goes back to at most `n` positions and returns the positions now
    /// held: `min(n, n_past)` for an attention-only state; for a recurrent
    /// one the latest checkpoint at or before that, else 0 (a fresh
    /// state). The caller evaluates its tokens from the returned position.
    pub fn rewind(&mut self, backend: &B, n: usize) -> Result<usize, ModelError> {
        let n = n.min(self.n_past);
        if n == self.n_past {
            return Ok(n);
        }
        if !self.is_recurrent() {
            self.n_past = n;
            return Ok(n);
        }
        self.back_to(backend, n)?;
        Ok(self.n_past)
    }

    /// Forgets every position and checkpoint (recurrent layers start from
    /// zeros again).
    pub fn reset(&mut self, backend: &B) -> Result<(), ModelError> {
        self.checkpoints.clear();
        self.n_past = 0;
        self.poisoned = true;
        for l in &mut self.layers {
            if let LayerState::Recurrent { conv, ssm } = l {
                let zero = |t: &B::Tensor| {
                    let (r, c) = backend.shape(t);
                    backend.zeros(r, c)
                };
                *conv = zero(conv)?;
                *ssm = zero(ssm)?;
            }
        }
        self.poisoned = false;
        Ok(())
    }

    /// A poisoned state is reset before it is used again.
    fn usable(&mut self, backend: &B) -> Result<(), ModelError> {
        if self.poisoned {
            self.reset(backend)?;
        }
        Ok(())
    }

    /// Copies the recurrent layers at the current position into a
    /// checkpoint (replacing one at the same position, dropping the oldest
    /// beyond the limit). Nothing to do for an attention-only state.
    /// Returns whether a checkpoint was made.
    pub fn checkpoint(&mut self, backend: &B) -> Result<bool, ModelError> {
        if !self.is_recurrent() || self.max_checkpoints == 0 {
            return Ok(false);
        }
        let mut layers = Vec::new();
        for l in &self.layers {
            if let LayerState::Recurrent { conv, ssm } = l {
                layers.push((backend.to_host(conv)?, backend.to_host(ssm)?));
            }
        }
        let pos = self.n_past;
        self.checkpoints.retain(|c| c.pos != pos);
        if self.checkpoints.len() >= self.max_checkpoints {
            self.checkpoints.remove(0);
        }
        self.checkpoints.push(Checkpoint { pos, layers });
        self.checkpoints.sort_by_key(|c| c.pos);
        Ok(true)
    }

    /// A recurrent state goes to the latest checkpoint at or before `n`
    /// (dropping the later ones), or to the start. A restore or reset that
    /// fails leaves the state empty (position 0, no checkpoints) and
    /// poisoned: nothing reads it until a reset succeeds.
    fn back_to(&mut self, backend: &B, n: usize) -> Result<(), ModelError> {
        self.checkpoints.retain(|c| c.pos <= n);
        let Some(c) = self.checkpoints.last() else {
            return self.reset(backend);
        };
        let pos = c.pos;
        let mut saved = c.layers.iter();
        let mut restore = || -> Result<(), ModelError> {
            for l in &mut self.layers {
                if let LayerState::Recurrent { conv, ssm } = l {
                    let Some((cv, sv)) = saved.next() else { break };
                    let (cr, cc) = backend.shape(conv);
                    let (sr, sc) = backend.shape(ssm);
                    *conv = backend.from_host(cv.clone(), cr, cc)?;
                    *ssm = backend.from_host(sv.clone(), sr, sc)?;
                }
            }
            Ok(())
        };
        match restore() {
            Ok(()) => {
                self.n_past = pos;
                Ok(())
            }
            Err(e) => {
                self.checkpoints.clear();
                self.n_past = 0;
                self.poisoned = true;
                Err(e)
            }
        }
    }

    /// After a failed evaluation the recurrent layers may hold part of the
    /// batch: go back to the last checkpoint at or before `n_past` (or the
    /// start), so that the state again matches its position. An
    /// attention-only state is untouched (rows past `n_past` are unused).
    /// If even that fails, the state is poisoned ([`Self::back_to`]).
    fn recover(&mut self, backend: &B) {
        if self.is_recurrent() {
            let _ = self.back_to(backend, self.n_past);
        }
    }

    /// The kinds and sizes of this state's layers in words (`kv 128/128
    /// f16` per attention layer, `recurrent 3x96 4x256` per recurrent one),
    /// comma-separated: what a saved state must match to be restored.
    pub fn layout(&self, backend: &B) -> String {
        let one = |l: &LayerState<B>| match l {
            LayerState::Kv(kv) => {
                let (s, t) = backend.kv_shape(kv);
                format!("kv {}/{} {}", s.n_embd_k, s.n_embd_v, t.name())
            }
            LayerState::Recurrent { conv, ssm } => {
                let ((cr, cc), (sr, sc)) = (backend.shape(conv), backend.shape(ssm));
                format!("recurrent {cr}x{cc} {sr}x{sc}")
            }
        };
        self.layers.iter().map(one).collect::<Vec<_>>().join(",")
    }

    /// Copies the state of the positions held to the host (see
    /// [`Backend::kv_read`]); checkpoints are not part of it.
    pub fn save(&self, backend: &B) -> Result<SavedState, ModelError> {
        let n = self.n_past;
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(match l {
                LayerState::Kv(kv) => SavedLayer::Kv(backend.kv_read(kv, n)?),
                LayerState::Recurrent { conv, ssm } => SavedLayer::Recurrent {
                    conv: backend.to_host(conv)?,
                    ssm: backend.to_host(ssm)?,
                },
            });
        }
        Ok(SavedState { n_past: n, layers })
    }

    /// Replaces this state with `saved` (taken by [`SeqState::save`] of a
    /// state of the same [`SeqState::layout`]). A recurrent state gets a
    /// checkpoint at the restored position. Nothing is written unless every
    /// layer's size matches; a write that fails part-way leaves the state
    /// empty and poisoned (see [`SeqState::reset`]), never a mix.
    pub fn restore(&mut self, backend: &B, saved: &SavedState) -> Result<(), ModelError> {
        let bad = |detail: String| {
            ModelError::Backend(crate::backend::BackendError::Shape {
                op: "restore a sequence state",
                detail,
            })
        };
        if saved.n_past > self.n_ctx {
            return Err(bad(format!(
                "{} positions for a context of {}",
                saved.n_past, self.n_ctx
            )));
        }
        if saved.layers.len() != self.layers.len() {
            return Err(bad(format!(
                "{} layers for a model of {}",
                saved.layers.len(),
                self.layers.len()
            )));
        }
        for (i, (l, s)) in self.layers.iter().zip(&saved.layers).enumerate() {
            let ok = match (l, s) {
                (LayerState::Kv(kv), SavedLayer::Kv(b)) => {
                    let (shape, t) = backend.kv_shape(kv);
                    let (kb, vb) = crate::backend::kv_bytes_of(shape, t, saved.n_past)?;
                    b.len() == kb + vb
                }
                (
                    LayerState::Recurrent { conv, ssm },
                    SavedLayer::Recurrent { conv: c, ssm: m },
                ) => {
                    let ((cr, cc), (sr, sc)) = (backend.shape(conv), backend.shape(ssm));
                    c.len() == cr * cc && m.len() == sr * sc
                }
                _ => false,
            };
            if !ok {
                return Err(bad(format!("layer {i} does not match the saved state's")));
            }
        }
        self.checkpoints.clear();
        self.n_past = 0;
        self.poisoned = true;
        for (l, s) in self.layers.iter_mut().zip(&saved.layers) {
            match (l, s) {
                (LayerState::Kv(kv), SavedLayer::Kv(b)) => backend.kv_write(kv, saved.n_past, b)?,
                (
                    LayerState::Recurrent { conv, ssm },
                    SavedLayer::Recurrent { conv: c, ssm: m },
                ) => {
                    let ((cr, cc), (sr, sc)) = (backend.shape(conv), backend.shape(ssm));
                    *conv = backend.from_host(c.clone(), cr, cc)?;
                    *ssm = backend.from_host(m.clone(), sr, sc)?;
                }
                _ => unreachable!("kinds checked above"),
            }
        }
        self.poisoned = false;
        self.n_past = saved.n_past;
        // The rows kept belong to what the state held before.
        if let Some(h) = &mut self.hidden {
            h.clear();
        }
        // Without it the restored state would only rewind to the start.
        let _ = self.checkpoint(backend);
        Ok(())
    }

    /// Runs each `tokens[i]` after what `states[i]` holds, all in one
    /// batch, and returns the last-token logits of each (empty for empty
    /// inputs). On an error each state is left valid (see
    /// [`SeqState::n_past`]; a recurrent one may have gone back).
    pub fn eval_multi(
        model: &Model<B>,
        states: &mut [&mut SeqState<B>],
        tokens: &[&[u32]],
    ) -> Result<BatchLogits, ModelError> {
        let wants = vec![Logits::Last; tokens.len()];
        Self::eval_multi_with(model, states, tokens, &wants)
    }

    /// [`SeqState::eval_multi`] with the logits of each sequence as
    /// `wants[i]` asks: a speculative verification (`Steps`) beside
    /// decode steps and prompt chunks (`Last`).
    pub fn eval_multi_with(
        model: &Model<B>,
        states: &mut [&mut SeqState<B>],
        tokens: &[&[u32]],
        wants: &[Logits],
    ) -> Result<BatchLogits, ModelError> {
        for st in states.iter_mut() {
            st.usable(&model.backend)?;
        }
        let seqs: Vec<(&[u32], usize)> = states
            .iter()
            .zip(tokens)
            .map(|(c, t)| (*t, c.n_past))
            .collect();
        let hidden = states.iter().any(|c| c.hidden.is_some());
        let mut layers: Vec<&mut [LayerState<B>]> =
            states.iter_mut().map(|c| c.layers.as_mut_slice()).collect();
        let out = model.forward_multi(&mut layers, &seqs, wants, hidden);
        match out {
            Ok(out) => {
                let e = model.hp.n_embd;
                let mut at = 0;
                for (c, t) in states.iter_mut().zip(tokens) {
                    if let (Some(h), Some(rows)) =
                        (&mut c.hidden, out.hidden().get(at * e..(at + t.len()) * e))
                    {
                        h.truncate(c.n_past);
                        h.record(c.n_past, rows);
                    }
                    at += t.len();
                    c.n_past += t.len();
                }
                Ok(out)
            }
            Err(e) => {
                for c in states.iter_mut() {
                    c.recover(&model.backend);
                }
                Err(e)
            }
        }
    }

    /// Runs `tokens` through `model` at the next positions of this state
    /// (one forward pass, no ubatch splitting) and returns their logits.
    pub fn eval(
        &mut self,
        model: &Model<B>,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        if self.hidden.is_some() {
            return Ok(Self::eval_multi_with(model, &mut [self], &[tokens], &[want])?.into_first());
        }
        self.usable(&model.backend)?;
        match model.forward(&mut self.layers, tokens, self.n_past, want) {
            Ok(logits) => {
                self.n_past += tokens.len();
                Ok(logits)
            }
            Err(e) => {
                self.recover(&model.backend);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HiddenRows;

    fn rows(from: usize, n: usize) -> Vec<f32> {
        (from..from + n)
            .flat_map(|p| [p as f32, -(p as f32)])
            .collect()
    }

    #[test]
    fn hidden_rows_follow_the_positions_evaluated() {
        let mut h = HiddenRows::new(2);
        h.record(0, &rows(0, 5));
        assert_eq!((h.end(), h.row(3)), (5, Some(&[3.0, -3.0][..])));
        assert_eq!(h.last_dropped(), None);
        // A verification batch went back: rows 3 and 4 go, 4 is remembered.
        h.truncate(3);
        assert_eq!((h.end(), h.row(3)), (3, None));
        assert_eq!(h.last_dropped(), Some(&[4.0, -4.0][..]));
        // Rows past the end replace nothing; a rewind then re-evaluation
        // replaces what followed.
        h.record(3, &rows(10, 2));
        assert_eq!(h.row(4), Some(&[11.0, -11.0][..]));
        h.record(1, &rows(20, 1));
        assert_eq!((h.end(), h.row(1)), (2, Some(&[20.0, -20.0][..])));
        // Read rows are released; a row before them or after a gap starts anew.
        h.release_before(1);
        assert_eq!((h.row(0), h.row(1).is_some()), (None, true));
        h.record(0, &rows(30, 1));
        assert_eq!((h.end(), h.row(0)), (1, Some(&[30.0, -30.0][..])));
        h.record(5, &rows(40, 1));
        assert_eq!((h.row(0), h.row(5)), (None, Some(&[40.0, -40.0][..])));
        h.clear();
        assert_eq!((h.end(), h.last_dropped()), (0, None));
    }
}
