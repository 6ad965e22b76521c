//! One forward pass: embed the batch, run every layer (a pre-norm attention
//! block and a pre-norm FFN block, each added to the residual stream), norm,
//! and project the rows asked for to logits.

use super::blocks::{attention, ffn, Pass};
use super::{BatchLogits, Logits, Model, ModelError};
use crate::backend::{Backend, BatchPos};

/// The repeating layers over `x`, whose rows are the tokens of `seqs` in
/// order (sequence `i` owns `seqs[i].n_tokens` consecutive rows and its own
/// KV caches `kvs[i]`). Every op runs over all rows at once; rope and
/// attention take each row's sequence into account, so each row is computed
/// exactly as it would be alone.
fn layers<'s, B: Backend>(
    m: &'s Model<B>,
    kvs: &mut [&mut [B::Kv]],
    mut x: B::Tensor,
    seqs: &[BatchPos],
    io: &crate::longhaul::IoScope<'s>,
) -> Result<B::Tensor, ModelError> {
    let p = Pass { m, seqs, io };
    let b = &m.backend;
    for (il, layer) in m.layers.iter().enumerate() {
        let mut layer_kvs: Vec<&mut B::Kv> = kvs.iter_mut().map(|kv| &mut kv[il]).collect();
        let h = p.norm(&x, &layer.attn_norm)?;
        let a = attention::forward(&p, &layer.attn, &mut layer_kvs, &h)?;
        b.add(&mut x, &a)?;
        let h = p.norm(&x, &layer.ffn_norm)?;
        let f = ffn::forward(&p, il, &layer.ffn, &h)?;
        b.add(&mut x, &f)?;
    }
    Ok(x)
}

pub(super) fn forward<B: Backend>(
    m: &Model<B>,
    kv: &mut [B::Kv],
    tokens: &[u32],
    pos0: usize,
    want: Logits,
) -> Result<Vec<f32>, ModelError> {
    Ok(forward_multi(m, &mut [kv], &[(tokens, pos0)], want)?.into_first())
}

/// Runs several sequences in one batch: `seqs[i] = (tokens, pos0)` with KV
/// caches `kvs[i]`. Returns each sequence's logits (last row or all rows).
pub(super) fn forward_multi<B: Backend>(
    m: &Model<B>,
    kvs: &mut [&mut [B::Kv]],
    seqs: &[(&[u32], usize)],
    want: Logits,
) -> Result<BatchLogits, ModelError> {
    let b = &m.backend;
    let hp = &m.hp;
    if kvs.len() != seqs.len() || kvs.iter().any(|kv| kv.len() != m.layers.len()) {
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
    for &(t, pos0) in seqs.iter().filter(|(t, _)| !t.is_empty()) {
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
        });
    }
    if tokens.is_empty() {
        return Ok(BatchLogits {
            data: Vec::new(),
            spans: vec![0..0; seqs.len()],
        });
    }
    // Sequences without tokens take no part in the batch.
    let mut active: Vec<&mut [B::Kv]> = kvs
        .iter_mut()
        .zip(seqs)
        .filter(|(_, (t, _))| !t.is_empty())
        .map(|(kv, _)| &mut **kv)
        .collect();
    let x = b.get_rows(&m.tok_embd, &tokens)?;
    // Longhaul's lookahead reads run on the I/O pool while layers compute.
    let x = crate::longhaul::io_scope(|io| layers(m, &mut active, x, &spans, io))?;
    let rows: Vec<usize> = match want {
        Logits::All => (0..tokens.len()).collect(),
        Logits::Last => spans
            .iter()
            .scan(0, |end, s| {
                *end += s.n_tokens;
                Some(*end - 1)
            })
            .collect(),
    };
    let x = if rows.len() == tokens.len() {
        x
    } else {
        b.gather_rows(&x, &rows)?
    };
    let x = b.rms_norm(&x, &m.output_norm, hp.n_embd, hp.eps)?;
    let logits = b.take_host(b.matmul(&m.output, &x)?)?;
    // Each sequence's rows of the one buffer.
    let mut spans = Vec::with_capacity(seqs.len());
    let mut at = 0;
    for (t, _) in seqs {
        let n = match (t.is_empty(), want) {
            (true, _) => 0,
            (false, Logits::Last) => 1,
            (false, Logits::All) => t.len(),
        };
        spans.push(at * hp.n_vocab..(at + n) * hp.n_vocab);
        at += n;
    }
    Ok(BatchLogits {
        data: logits,
        spans,
    })
}
