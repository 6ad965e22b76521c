//! Speculative decoding in the slots: each slot's drafter, the draft a
//! decoding slot adds to the step's batch, and the verification of its rows
//! afterwards (the scheduler's side of [`Engine::generate_spec`]).

use std::sync::Arc;

use super::{Active, Slot, Worker};
use crate::backend::Backend;
use crate::draft::{ModelDrafter, MtpDrafter};
use crate::engine::Engine;
use crate::model::Logits;
use crate::spec::{counts_accepted, Drafter, SpecParams, SpecType};

/// How the slots speculate (`--spec-type`, `-md`): each slot has a drafter
/// of its own; a draft model is shared, with a sequence per slot.
pub struct Speculation<B: Backend> {
    pub params: SpecParams,
    /// The draft model of `draft-simple`, loaded resident.
    pub draft: Option<Arc<Engine<B>>>,
}

impl<B: Backend> Speculation<B> {
    /// No speculation.
    pub fn none() -> Self {
        Self {
            params: SpecParams::default(),
            draft: None,
        }
    }
}

impl<B: Backend + 'static> Worker<B> {
    /// A slot's drafter, as `spec` says. A draft model's sequence that
    /// cannot be allocated leaves the slot without one (it decodes plainly).
    pub(super) fn new_drafter(&self) -> Option<Drafter> {
        match (self.spec.params.kind, &self.spec.draft) {
            (SpecType::DraftSimple, Some(model)) => {
                match ModelDrafter::new(
                    model.clone(),
                    &self.engine.tokenizer,
                    self.spec.params.draft,
                ) {
                    Ok(d) => Some(Drafter::Model(Box::new(d))),
                    Err(e) => {
                        eprintln!("a slot decodes without its draft model: {e}");
                        None
                    }
                }
            }
            (SpecType::DraftMtp, _) => {
                let e = &self.engine;
                match MtpDrafter::new(e.clone(), e.params.n_ctx, self.spec.params.draft) {
                    Ok(d) => Some(Drafter::Model(Box::new(d))),
                    Err(e) => {
                        eprintln!("a slot decodes without its MTP drafter: {e}");
                        None
                    }
                }
            }
            _ => self.spec.params.drafter(),
        }
    }

    /// A prompt chunk of slot `s` ran and more follow: an MTP head catches
    /// up on it now (it drafts after the last), so the slot keeps about one
    /// chunk's rows for it.
    pub(super) fn follow_prompt(s: &mut Slot<B>) {
        if let Some(d) = s.drafter.as_mut() {
            if let Err(e) = d.observe(&s.cached, s.kv.hidden_mut()) {
                eprintln!("the draft head could not follow the prompt (the slot drafts without it until it starts over): {e}");
            }
        }
    }

    /// The draft of a decoding slot: none without a drafter, with a grammar
    /// or token probabilities to report, without room in the context or
    /// the request, or where a recurrent state cannot checkpoint.
    pub(super) fn draft(engine: &Engine<B>, s: &mut Slot<B>) -> Vec<u32> {
        let (Some(a), Some(d)) = (&s.active, s.drafter.as_mut()) else {
            return Vec::new();
        };
        if a.constraint.is_some() || a.job.req.probs.is_some() {
            return Vec::new();
        }
        // As Engine::generate_spec: the context keeps one position free and
        // the draft and the token after it stay within n_predict.
        let room =
            s.kv.n_ctx()
                .saturating_sub(s.kv.n_past() + 2)
                .min(a.job.req.n_predict.saturating_sub(a.n_gen + 1));
        if room == 0 {
            return Vec::new();
        }
        let draft = match d.draft(&s.cached, a.pending, room, s.kv.hidden_mut()) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("a draft failed (the slot decodes without it): {e}");
                return Vec::new();
            }
        };
        if draft.is_empty() || !s.kv.is_recurrent() {
            return draft;
        }
        match s.kv.checkpoint(&engine.model.backend) {
            Ok(true) => draft,
            _ => Vec::new(),
        }
    }

    /// Verifies a slot's draft: `toks` (the pending token, then the draft)
    /// were evaluated with `rows` of logits, one per token. Emits the
    /// accepted prefix and the token after it, as
    /// [`Engine::generate_spec`] does, and takes the sequence back past the
    /// rest. Returns whether the request is finished and how many tokens
    /// it emitted.
    pub(super) fn verify(
        engine: &Engine<B>,
        s: &mut Slot<B>,
        a: &mut Active,
        toks: &[u32],
        rows: &[f32],
    ) -> Result<(bool, usize), String> {
        let n_vocab = engine.model.hp.n_vocab;
        let row = |j: usize| &rows[j * n_vocab..(j + 1) * n_vocab];
        let n_ctx = s.kv.n_ctx();
        let n0 = s.kv.n_past() - toks.len();
        s.cached.extend_from_slice(toks);
        let draft = &toks[1..];
        let (mut n_emitted, mut n_accepted, mut finished) = (0, 0, false);
        for (j, &d) in draft.iter().enumerate() {
            let (t, ok) = a.sampler.verify(row(j), &a.history, d, &[(d, 1.0)]);
            n_emitted += 1;
            let eog = engine.tokenizer.is_eog(t);
            n_accepted += usize::from(counts_accepted(ok, eog, j, draft.len()));
            finished = Self::accept(engine, a, t, None, false, n0 + 1 + j, n_ctx);
            if finished || !ok {
                break;
            }
        }
        if !finished && n_accepted == draft.len() {
            let t = a.sampler.sample(row(draft.len()), &a.history);
            n_emitted += 1;
            finished = Self::accept(engine, a, t, None, false, n0 + 1 + draft.len(), n_ctx);
        }
        a.spec.n_batches += 1;
        a.spec.n_drafted += draft.len();
        a.spec.n_accepted += n_accepted;
        if let Some(d) = a.done.as_mut() {
            d.spec = a.spec;
        }
        if let Some(d) = s.drafter.as_mut() {
            d.accept(n_accepted);
        }
        // Keep the pending token and every emitted token but the last.
        let keep = n0 + n_emitted;
        s.cached.truncate(keep);
        let backend = &engine.model.backend;
        let held = s.kv.rewind(backend, keep).map_err(|e| e.to_string())?;
        if held < keep {
            // A recurrent state went back to its checkpoint at n0.
            s.kv.eval(&engine.model, &s.cached[held..keep], Logits::Last)
                .map_err(|e| e.to_string())?;
        }
        Ok((finished, n_emitted))
    }
}
