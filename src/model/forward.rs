//! One forward pass: embed the batch, run every layer (a pre-norm attention
//! block and a pre-norm FFN block, each added to the residual stream), norm,
//! and project the rows asked for to logits.

use super::blocks::{attention, deltanet, ffn, Attention, Layer, Pass};
use super::{BatchLogits, Logits, Model, ModelError};
use crate::backend::{Backend, BatchPos};
use crate::state::LayerState;

/// Layer `il`'s part of each sequence's state, as `want` takes it out of a
/// [`LayerState`] (`None` when the state was made for another model).
fn layer_states<'a, B: Backend, T>(
    states: &'a mut [&mut [LayerState<B>]],
    il: usize,
    want: impl Fn(&'a mut LayerState<B>) -> Option<T>,
) -> Result<Vec<T>, ModelError> {
    states
        .iter_mut()
        .map(|s| {
            let s: &'a mut LayerState<B> = &mut s[il];
            want(s).ok_or_else(|| ModelError::BadHparam {
                key: "state".into(),
                reason: format!("layer {il}'s state is of another kind than the layer"),
            })
        })
        .collect()
}

/// One repeating layer over `x`: the pre-norm attention block, then the
/// pre-norm FFN block, each added to the residual stream. `il` names the
/// layer's weights (and its streamed experts); `is` its part of each state.
pub(super) fn layer_step<'s, B: Backend>(
    p: &Pass<'_, 's, B>,
    il: usize,
    layer: &'s Layer<B::Weight>,
    kvs: &mut [&mut [LayerState<B>]],
    is: usize,
    mut x: B::Tensor,
) -> Result<B::Tensor, ModelError> {
    let b = p.b();
    let h = p.norm(&x, &layer.attn_norm)?;
    let a = match &layer.attn {
        Attention::DeltaNet(d) => {
            let mut st = layer_states(kvs, is, |s| match s {
                LayerState::Recurrent { conv, ssm } => Some((conv, ssm)),
                LayerState::Kv(_) => None,
            })?;
            deltanet::forward(p, d, &mut st, &h)?
        }
        a => {
            let mut layer_kvs = layer_states(kvs, is, |s| match s {
                LayerState::Kv(kv) => Some(kv),
                LayerState::Recurrent { .. } => None,
            })?;
            attention::forward(p, a, &mut layer_kvs, &h)?
        }
    };
    b.add(&mut x, &a)?;
    let h = p.norm(&x, &layer.ffn_norm)?;
    let f = ffn::forward(p, il, &layer.ffn, &h, &x)?;
    b.add(&mut x, &f)?;
    Ok(x)
}

/// The repeating layers over `x`, whose rows are the tokens of `seqs` in
/// order (sequence `i` owns `seqs[i].n_tokens` consecutive rows and its own
/// state `kvs[i]`). Every op runs over all rows at once; rope, attention
/// and the recurrent ops take each row's sequence into account, so each
/// row is computed exactly as it would be alone.
fn layers<'s, B: Backend>(
    m: &'s Model<B>,
    kvs: &mut [&mut [LayerState<B>]],
    mut x: B::Tensor,
    seqs: &[BatchPos],
    io: &crate::longhaul::IoScope<'s>,
    lookahead: bool,
) -> Result<B::Tensor, ModelError> {
    let p = Pass {
        m,
        seqs,
        io,
        lookahead,
    };
    for (il, layer) in m.layers.iter().enumerate() {
        x = layer_step(&p, il, layer, kvs, il, x)?;
    }
    Ok(x)
}

pub(super) fn forward<B: Backend>(
    m: &Model<B>,
    kv: &mut [LayerState<B>],
    tokens: &[u32],
    pos0: usize,
    want: Logits,
) -> Result<Vec<f32>, ModelError> {
    Ok(forward_multi(m, &mut [kv], &[(tokens, pos0)], &[want], false)?.into_first())
}

/// Runs several sequences in one batch: `seqs[i] = (tokens, pos0)` with
/// states `kvs[i]`. Returns each sequence's logits as `wants[i]` asks
/// (last row or all rows; `Steps` rows attend as decode steps). With
/// `hidden`, also every row of the final norm's output (llama.cpp's
/// `h_nextn`, what an MTP head reads), all sequences' rows in batch order.
pub(super) fn forward_multi<B: Backend>(
    m: &Model<B>,
    kvs: &mut [&mut [LayerState<B>]],
    seqs: &[(&[u32], usize)],
    wants: &[Logits],
    hidden: bool,
) -> Result<BatchLogits, ModelError> {
    let b = &m.backend;
    let hp = &m.hp;
    if kvs.len() != seqs.len()
        || wants.len() != seqs.len()
        || kvs.iter().any(|kv| kv.len() != m.layers.len())
    {
        return Err(ModelError::BadHparam {
            key: "kv".into(),
            reason: format!(
                "{} cache sets for {} sequences of {} layers",
                kvs.len(),
                seqs.len(),
                m.layers.len()
            ),
        });
    }
    let mut tokens = Vec::new();
    let mut spans = Vec::new();
    for (&(t, pos0), &want) in seqs.iter().zip(wants).filter(|((t, _), _)| !t.is_empty()) {
        if let Some(&id) = t.iter().find(|&&id| id as usize >= hp.n_vocab) {
            return Err(ModelError::BadToken {
                id,
                n_vocab: hp.n_vocab,
            });
        }
        tokens.extend_from_slice(t);
        spans.push(BatchPos {
            pos0,
            n_tokens: t.len(),
            steps: want == Logits::Steps,
        });
    }
    if tokens.is_empty() {
        return Ok(BatchLogits {
            data: Vec::new(),
            spans: vec![0..0; seqs.len()],
            hidden: Vec::new(),
        });
    }
    // Sequences without tokens take no part in the batch.
    let mut active: Vec<&mut [LayerState<B>]> = kvs
        .iter_mut()
        .zip(seqs)
        .filter(|(_, (t, _))| !t.is_empty())
        .map(|(kv, _)| &mut **kv)
        .collect();
    let arm = m.runtime.pass_arm(tokens.len());
    let x = b.get_rows(&m.tok_embd, &tokens)?;
    // Longhaul's lookahead reads run on the I/O pool while layers compute.
    let x = crate::longhaul::io_scope(|io| layers(m, &mut active, x, &spans, io, arm.on))?;
    // The rows each sequence returns: its last, or all of them.
    let mut rows: Vec<usize> = Vec::with_capacity(tokens.len());
    let mut start = 0;
    for (s, &want) in spans.iter().zip(
        wants
            .iter()
            .zip(seqs)
            .filter(|(_, (t, _))| !t.is_empty())
            .map(|(w, _)| w),
    ) {
        match want {
            Logits::Last => rows.push(start + s.n_tokens - 1),
            Logits::All | Logits::Steps => rows.extend(start..start + s.n_tokens),
        }
        start += s.n_tokens;
    }
    // The norm is per row: with `hidden`, every row is normed and then the
    // logit rows are taken, which gives the bits of taking them first.
    let x = if hidden {
        b.rms_norm(&x, &m.output_norm, hp.n_embd, hp.eps)?
    } else {
        x
    };
    let hidden_rows = if hidden { b.to_host(&x)? } else { Vec::new() };
    let x = if rows.len() == tokens.len() {
        x
    } else {
        b.gather_rows(&x, &rows)?
    };
    let x = if hidden {
        x
    } else {
        b.rms_norm(&x, &m.output_norm, hp.n_embd, hp.eps)?
    };
    let logits = b.take_host(b.matmul(&m.output, &x)?)?;
    m.runtime.passed(arm);
    // Each sequence's rows of the one buffer.
    let mut spans = Vec::with_capacity(seqs.len());
    let mut at = 0;
    for ((t, _), &want) in seqs.iter().zip(wants) {
        let n = match (t.is_empty(), want) {
            (true, _) => 0,
            (false, Logits::Last) => 1,
            (false, Logits::All | Logits::Steps) => t.len(),
        };
        spans.push(at * hp.n_vocab..(at + n) * hp.n_vocab);
        at += n;
    }
    Ok(BatchLogits {
        data: logits,
        spans,
        hidden: hidden_rows,
    })
}
