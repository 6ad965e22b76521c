//! The NextN/MTP head some files carry after the trunk (GLM-4.5's and
//! DeepSeek-V3's `nextn_predict_layers`), read as llama.cpp's `graph_mtp` of
//! `src/models/glm4-moe.cpp` and `deepseek2.cpp` read it (the decoder layer
//! is the family's own: GQA or MLA attention, MoE FFN with shared experts). For the token `x_p` at position `p`
//! and the trunk's final-norm row `h_{p-1}` of the position before it:
//!
//! ```text
//! u = eh_proj · [enorm(embed(x_p)), hnorm(h_{p-1})]
//! u = one decoder layer (attention over the head's own KV cache, MoE FFN)
//! h = shared_head_norm(u)             (the model's output_norm without it)
//! logits = shared_head_head · h       (the model's output without it)
//! ```
//!
//! `h` is the head's own next row: a draft of several tokens feeds each
//! drafted token back with the `h` of the step before. The head is loaded
//! only when an MTP drafter asks for it ([`super::LoadOptions::mtp`]); its
//! routed experts stream like a trunk layer's in longhaul mode.

use super::blocks::{Layer, Loader, Pass};
use super::forward::layer_step;
use super::{arch, ArchSpec, Model, ModelError};
use crate::backend::{Backend, BatchPos};
use crate::state::LayerState;

/// The weights of one NextN layer.
pub struct Nextn<W> {
    /// The layer's index in the file (`blk.{il}`, after the trunk).
    pub il: usize,
    pub eh_proj: W,
    pub enorm: W,
    pub hnorm: W,
    pub head_norm: Option<W>,
    pub head: Option<W>,
    pub embed: Option<W>,
    pub layer: Layer<W>,
}

impl<W> Nextn<W> {
    /// The first NextN layer of a `spec` file (llama.cpp drafts with one).
    pub(super) fn load<B: Backend<Weight = W>>(
        spec: &ArchSpec,
        l: &Loader<B>,
    ) -> Result<Self, ModelError> {
        let hp = l.hp;
        if hp.n_nextn == 0 {
            return Err(ModelError::NoNextn {
                arch: hp.arch.clone(),
            });
        }
        let il = hp.n_layer;
        let Some(layer) = arch::load_nextn_layer(spec, l, il) else {
            return Err(ModelError::NextnUnsupported {
                arch: hp.arch.clone(),
            });
        };
        let (e, v) = (hp.n_embd as u64, hp.n_vocab as u64);
        let name = |n: &str| format!("blk.{il}.nextn.{n}.weight");
        Ok(Nextn {
            il,
            eh_proj: l.req(&name("eh_proj"), &[2 * e, e])?,
            enorm: l.req(&name("enorm"), &[e])?,
            hnorm: l.req(&name("hnorm"), &[e])?,
            head_norm: l.opt(&name("shared_head_norm"), &[e])?,
            head: l.opt(&name("shared_head_head"), &[e, v])?,
            embed: l.opt(&name("embed_tokens"), &[e, v])?,
            layer: layer?,
        })
    }
}

/// What one pass of the head returns: the logits of the last row and the
/// head's final-norm row of every row (the next step's `h`).
pub struct NextnOut {
    pub logits: Vec<f32>,
    pub hidden: Vec<f32>,
}

/// Runs the head over `tokens` at positions `pos0..` with the trunk rows
/// `h` (`[tokens, n_embd]`, row `i` the row of the position before token
/// `i`), updating its KV cache `kv`.
pub(super) fn forward<B: Backend>(
    m: &Model<B>,
    kv: &mut LayerState<B>,
    tokens: &[u32],
    h: &[f32],
    pos0: usize,
) -> Result<NextnOut, ModelError> {
    let hp = &m.hp;
    let n = m.nextn.as_ref().ok_or_else(|| ModelError::NoNextn {
        arch: hp.arch.clone(),
    })?;
    let e = hp.n_embd;
    if tokens.is_empty() || h.len() != tokens.len() * e {
        return Err(ModelError::BadHparam {
            key: "nextn input".into(),
            reason: format!(
                "{} tokens with {} hidden values of {e}",
                tokens.len(),
                h.len()
            ),
        });
    }
    if let Some(&id) = tokens.iter().find(|&&id| id as usize >= hp.n_vocab) {
        return Err(ModelError::BadToken {
            id,
            n_vocab: hp.n_vocab,
        });
    }
    let b = &m.backend;
    let seqs = [BatchPos {
        pos0,
        n_tokens: tokens.len(),
        steps: false,
    }];
    crate::longhaul::io_scope(|io| {
        // The head is the last layer: no later MoE layer to read ahead for.
        let p = Pass {
            m,
            seqs: &seqs,
            io,
            lookahead: false,
        };
        let x = b.get_rows(n.embed.as_ref().unwrap_or(&m.tok_embd), tokens)?;
        let x = p.norm(&x, &n.enorm)?;
        let hn = p.norm(&b.from_host(h.to_vec(), tokens.len(), e)?, &n.hnorm)?;
        let x = b.matmul(&n.eh_proj, &b.concat_cols(&x, e, &hn, e)?)?;
        let mut kvs = [std::slice::from_mut(kv)];
        let x = layer_step(&p, n.il, &n.layer, &mut kvs, 0, x)?;
        let x = p.norm(&x, n.head_norm.as_ref().unwrap_or(&m.output_norm))?;
        let hidden = b.to_host(&x)?;
        let last = b.gather_rows(&x, &[tokens.len() - 1])?;
        let logits = b.take_host(b.matmul(n.head.as_ref().unwrap_or(&m.output), &last)?)?;
        Ok(NextnOut { logits, hidden })
    })
}
