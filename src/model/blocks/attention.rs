//! Attention blocks. [`Gqa`] is grouped-query attention as llama.cpp's
//! `build_attn` runs it, with the options the families differ in: q/k/v and
//! output biases, QK-norm per head or over the whole projection, sinks, a
//! sliding window and rope parameters of the layer's own.

use super::{matmuls, Loader, Pass};
use crate::backend::{Act, AttnParams, Backend, RopeParams};
use crate::model::ModelError;

/// Whether an architecture's layer has a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Never: a file that has it is refused ([`Loader::finish`]).
    No,
    /// Used when the file has it.
    Opt,
    /// A file without it is refused, naming it.
    Req,
}

impl Want {
    /// Loads `name` as this says.
    pub fn load<B: Backend>(
        self,
        l: &Loader<B>,
        name: &str,
        dims: &[u64],
    ) -> Result<Option<B::Weight>, ModelError> {
        match self {
            Want::No => Ok(None),
            Want::Opt => l.opt(name, dims),
            Want::Req => l.req(name, dims).map(Some),
        }
    }
}

/// What RMS-normalises q and k before rope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// Each head on its own, weight `[head_dim]` (Qwen3, GLM-4.5, Laguna).
    Head,
    /// The whole projection, weight `[n_head * head_dim]` (OLMoE).
    Whole,
}

/// The attention tensors an architecture has.
#[derive(Clone, Copy, Debug)]
pub struct GqaDecl {
    pub qkv_bias: Want,
    pub out_bias: Want,
    /// QK-norm weights, and what they normalise over.
    pub qk_norm: Want,
    pub qk_norm_over: QkNorm,
    pub sinks: bool,
    /// An output gate `act(attn_gate · h)` on the attention output before
    /// `attn_output`, one value per head or per element as the tensor's
    /// width says (Laguna's softplus gate).
    pub out_gate: Option<Act>,
    /// The q projection carries a sigmoid output gate: per head, `head_dim`
    /// query values then `head_dim` gate values (Qwen3-Next, Qwen3.5).
    pub q_gate: bool,
}

impl GqaDecl {
    /// Plain attention: no biases, no QK-norm, no sinks, no gate.
    pub const PLAIN: GqaDecl = GqaDecl {
        qkv_bias: Want::No,
        out_bias: Want::No,
        qk_norm: Want::No,
        qk_norm_over: QkNorm::Head,
        sinks: false,
        out_gate: None,
        q_gate: false,
    };
}

/// Grouped-query attention weights and the layer's attention settings.
pub struct Gqa<W> {
    pub wq: W,
    pub wk: W,
    pub wv: W,
    pub wo: W,
    pub bq: Option<W>,
    pub bk: Option<W>,
    pub bv: Option<W>,
    pub bo: Option<W>,
    /// QK-norm weights, and what they normalise over.
    pub qk_norm: Option<(W, W, QkNorm)>,
    pub sinks: Option<W>,
    pub out_gate: Option<(W, Act)>,
    /// See [`GqaDecl::q_gate`].
    pub q_gate: bool,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope: RopeParams,
    /// Sliding window of this layer (`None`: full causal).
    pub window: Option<u32>,
}

/// A layer's attention block (its token mixer).
pub enum Attention<W> {
    Gqa(Gqa<W>),
    /// Multi-head latent attention (DeepSeek).
    Mla(super::mla::Mla<W>),
    /// Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): a recurrent
    /// state per sequence instead of a KV cache.
    DeltaNet(super::deltanet::DeltaNet<W>),
}

impl<W> Attention<W> {
    /// `(K, V)` values per position this layer's KV cache holds (none for
    /// a recurrent layer).
    pub fn kv_widths(&self) -> (usize, usize) {
        match self {
            Attention::Gqa(a) => (a.n_head_kv * a.head_dim, a.n_head_kv * a.head_dim),
            Attention::Mla(a) => a.kv_widths(),
            Attention::DeltaNet(_) => (0, 0),
        }
    }
}

impl<W> Gqa<W> {
    /// Layer `il`'s attention as `d` declares it, with rope `rope`.
    pub fn load<B: Backend<Weight = W>>(
        l: &Loader<B>,
        il: usize,
        d: GqaDecl,
        rope: RopeParams,
    ) -> Result<Self, ModelError> {
        let hp = l.hp;
        let n = |s: &str| format!("blk.{il}.{s}");
        let e = hp.n_embd as u64;
        let n_head = hp.n_head_layer.get(il).copied().unwrap_or(hp.n_head);
        let (hd, nh, nkv) = (hp.head_dim as u64, n_head as u64, hp.n_head_kv as u64);
        let (q, k) = match d.qk_norm_over {
            QkNorm::Head => (hd, hd),
            QkNorm::Whole => (nh * hd, nkv * hd),
        };
        let qn = d.qk_norm.load(l, &n("attn_q_norm.weight"), &[q])?;
        let kn = d.qk_norm.load(l, &n("attn_k_norm.weight"), &[k])?;
        let qk_norm = match (qn, kn) {
            (Some(qn), Some(kn)) => Some((qn, kn, d.qk_norm_over)),
            (None, None) => None,
            _ => {
                return Err(crate::gguf::GgufError::MissingTensor {
                    name: n("attn_q_norm.weight / attn_k_norm.weight (one without the other)"),
                }
                .into())
            }
        };
        Ok(Gqa {
            wq: l.req(&n("attn_q.weight"), &[e, nh * hd * (1 + d.q_gate as u64)])?,
            wk: l.req(&n("attn_k.weight"), &[e, nkv * hd])?,
            wv: l.req(&n("attn_v.weight"), &[e, nkv * hd])?,
            wo: l.req(&n("attn_output.weight"), &[nh * hd, e])?,
            bq: d.qkv_bias.load(l, &n("attn_q.bias"), &[nh * hd])?,
            bk: d.qkv_bias.load(l, &n("attn_k.bias"), &[nkv * hd])?,
            bv: d.qkv_bias.load(l, &n("attn_v.bias"), &[nkv * hd])?,
            bo: d.out_bias.load(l, &n("attn_output.bias"), &[e])?,
            qk_norm,
            sinks: if d.sinks {
                Some(l.req(&n("attn_sinks.weight"), &[nh])?)
            } else {
                None
            },
            out_gate: match d.out_gate {
                None => None,
                Some(act) => {
                    let name = n("attn_gate.weight");
                    let t = l.file.require_tensor(&name)?;
                    // One gate per head or one per element of the output.
                    let w = t.dims.get(1).copied().unwrap_or(0);
                    let w = if w == nh { nh } else { nh * hd };
                    Some((l.req(&name, &[e, w])?, act))
                }
            },
            q_gate: d.q_gate,
            n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            rope,
            window: hp
                .swa_layers
                .get(il)
                .copied()
                .unwrap_or(false)
                .then_some(hp.n_swa),
        })
    }
}

/// The attention block over the normed input `h`, writing the layer's KV
/// caches `kvs` (one per sequence): its output before the residual add.
pub fn forward<B: Backend>(
    p: &Pass<B>,
    a: &Attention<B::Weight>,
    kvs: &mut [&mut B::Kv],
    h: &B::Tensor,
) -> Result<B::Tensor, ModelError> {
    match a {
        Attention::Gqa(a) => gqa(p, a, kvs, h),
        Attention::Mla(a) => super::mla::forward(p, a, kvs, h),
        Attention::DeltaNet(_) => Err(ModelError::BadHparam {
            key: "state".into(),
            reason: "a recurrent layer was given KV caches".into(),
        }),
    }
}

fn gqa<B: Backend>(
    p: &Pass<B>,
    a: &Gqa<B::Weight>,
    kvs: &mut [&mut B::Kv],
    h: &B::Tensor,
) -> Result<B::Tensor, ModelError> {
    let b = p.b();
    let eps = p.hp().eps;
    let [mut q, mut k, mut v] = matmuls(b, [&a.wq, &a.wk, &a.wv], h)?;
    // Qwen3-Next's q projection: per head, the query then its gate.
    let q_gate = if a.q_gate {
        let hd = a.head_dim;
        let gate = b.split_cols(&q, 2 * hd, hd, hd)?;
        q = b.split_cols(&q, 2 * hd, 0, hd)?;
        Some(gate)
    } else {
        None
    };
    for (t, bias) in [(&mut q, &a.bq), (&mut k, &a.bk), (&mut v, &a.bv)] {
        if let Some(bias) = bias {
            b.add_bias(t, bias)?;
        }
    }
    if let Some((qn, kn, kind)) = &a.qk_norm {
        let (gq, gk) = match kind {
            QkNorm::Head => (a.head_dim, a.head_dim),
            QkNorm::Whole => (a.n_head * a.head_dim, a.n_head_kv * a.head_dim),
        };
        q = b.rms_norm(&q, qn, gq, eps)?;
        k = b.rms_norm(&k, kn, gk, eps)?;
    }
    let params = AttnParams {
        n_head: a.n_head,
        n_head_kv: a.n_head_kv,
        head_dim: a.head_dim,
        head_dim_v: a.head_dim,
        scale: 1.0 / (a.head_dim as f32).sqrt(),
        window: a.window,
        flash_attn: p.m.flash_attn,
    };
    b.rope_multi(&mut q, a.head_dim, p.seqs, &a.rope)?;
    b.rope_multi(&mut k, a.head_dim, p.seqs, &a.rope)?;
    let mut attn = b.attention_multi(kvs, &q, &k, &v, a.sinks.as_ref(), p.seqs, &params)?;
    if let Some((g, act)) = &a.out_gate {
        b.mul_act(&mut attn, &b.matmul(g, h)?, *act)?;
    }
    if let Some(gate) = &q_gate {
        b.mul_act(&mut attn, gate, Act::Sigmoid)?;
    }
    let mut o = b.matmul(&a.wo, &attn)?;
    if let Some(bo) = &a.bo {
        b.add_bias(&mut o, bo)?;
    }
    Ok(o)
}
