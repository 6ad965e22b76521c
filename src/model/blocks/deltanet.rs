//! Gated DeltaNet, the linear-attention layer of Qwen3-Next and Qwen3.5, as
//! llama.cpp's graphs run it (`build_layer_attn_linear`):
//!
//! 1. `qkv = attn_qkv · h`, `z = attn_gate · h`, and per value head a beta
//!    `sigmoid(ssm_beta · h)` and a log decay
//!    `g = softplus(ssm_alpha · h + ssm_dt) * ssm_a` (`ssm_a = -exp(A_log)`);
//!    Qwen3-Next projects beta and alpha together (`ssm_ba`, per key head
//!    the betas of its value heads, then their alphas);
//! 2. a causal convolution of `d_conv` taps over `qkv` with the state of
//!    the last `d_conv - 1` inputs, then SiLU, split into q, k and v;
//! 3. q and k L2-normalised per head; the gated delta rule over the heads
//!    with the sequence's `S x S` matrices;
//! 4. RMS norm of each head's output (`ssm_norm`) times `silu(z)`, then
//!    `ssm_out`.

use super::{matmuls, Loader, Pass};
use crate::backend::{Act, Backend, BatchPos, DeltaNetParams, KHeadMap};
use crate::model::ModelError;

/// How a family lays out its DeltaNet tensors.
#[derive(Clone, Copy, Debug)]
pub struct DeltaNetDecl {
    /// Beta and alpha in one projection `ssm_ba` (Qwen3-Next) rather than
    /// `ssm_beta` and `ssm_alpha` (Qwen3.5).
    pub fused_ba: bool,
    pub k_map: KHeadMap,
}

/// Beta and alpha projections.
pub enum BetaAlpha<W> {
    /// `ssm_ba [n_embd, 2 * n_v_heads]`: per key head, `r` betas then `r`
    /// alphas (`r` value heads per key head).
    Fused(W),
    Split {
        beta: W,
        alpha: W,
    },
}

/// One gated DeltaNet layer's weights and shape.
pub struct DeltaNet<W> {
    pub wqkv: W,
    pub wgate: W,
    pub ba: BetaAlpha<W>,
    pub conv: W,
    pub dt_bias: W,
    pub a: W,
    pub norm: W,
    pub out: W,
    pub p: DeltaNetParams,
    pub d_conv: usize,
}

impl<W> DeltaNet<W> {
    /// Layer `il`'s DeltaNet as `d` declares it.
    pub fn load<B: Backend<Weight = W>>(
        l: &Loader<B>,
        il: usize,
        d: DeltaNetDecl,
    ) -> Result<Self, ModelError> {
        let hp = l.hp;
        let ssm = hp.ssm.ok_or_else(|| ModelError::BadHparam {
            key: format!("{}.ssm.conv_kernel", hp.arch),
            reason: "is missing, but the layer is recurrent".into(),
        })?;
        let n = |s: &str| format!("blk.{il}.{s}");
        let e = hp.n_embd as u64;
        let (hv, s) = (ssm.n_v_heads as u64, ssm.head_dim as u64);
        let value = hv * s;
        let channels = ssm.conv_channels() as u64;
        let ba = if d.fused_ba {
            BetaAlpha::Fused(l.req(&n("ssm_ba.weight"), &[e, 2 * hv])?)
        } else {
            BetaAlpha::Split {
                beta: l.req(&n("ssm_beta.weight"), &[e, hv])?,
                alpha: l.req(&n("ssm_alpha.weight"), &[e, hv])?,
            }
        };
        Ok(DeltaNet {
            wqkv: l.req(&n("attn_qkv.weight"), &[e, channels])?,
            wgate: l.req(&n("attn_gate.weight"), &[e, value])?,
            ba,
            conv: l.req(&n("ssm_conv1d.weight"), &[ssm.d_conv as u64, channels])?,
            dt_bias: l.req(&n("ssm_dt.bias"), &[hv])?,
            a: l.req(&n("ssm_a"), &[hv])?,
            norm: l.req(&n("ssm_norm.weight"), &[s])?,
            out: l.req(&n("ssm_out.weight"), &[value, e])?,
            p: DeltaNetParams {
                n_k_heads: ssm.n_k_heads,
                n_v_heads: ssm.n_v_heads,
                head_dim: ssm.head_dim,
                k_map: d.k_map,
            },
            d_conv: ssm.d_conv,
        })
    }

    /// Convolution channels: q, k and v side by side.
    pub fn channels(&self) -> usize {
        (2 * self.p.n_k_heads + self.p.n_v_heads) * self.p.head_dim
    }

    /// `(conv, ssm)` state shapes of one sequence, `(rows, cols)`.
    pub fn state_shapes(&self) -> ((usize, usize), (usize, usize)) {
        let s = self.p.head_dim;
        (
            (self.d_conv - 1, self.channels()),
            (self.p.n_v_heads, s * s),
        )
    }
}

/// The DeltaNet block over the normed input `h`, updating each sequence's
/// `(conv, ssm)` state: its output before the residual add.
pub fn forward<B: Backend>(
    p: &Pass<B>,
    d: &DeltaNet<B::Weight>,
    states: &mut [(&mut B::Tensor, &mut B::Tensor)],
    h: &B::Tensor,
) -> Result<B::Tensor, ModelError> {
    let b = p.b();
    let eps = p.hp().eps;
    let (hk, hv, s) = (d.p.n_k_heads, d.p.n_v_heads, d.p.head_dim);
    let n: usize = p.seqs.iter().map(|q: &BatchPos| q.n_tokens).sum();
    // The input projections share one preparation of `h`.
    let (qkv, z, mut beta, mut g) = match &d.ba {
        BetaAlpha::Split { beta, alpha } => {
            let [qkv, z, beta, alpha] = matmuls(b, [&d.wqkv, &d.wgate, beta, alpha], h)?;
            (qkv, z, beta, alpha)
        }
        BetaAlpha::Fused(w) => {
            let [qkv, z, ba] = matmuls(b, [&d.wqkv, &d.wgate, w], h)?;
            let r = hv / hk;
            let beta = b.split_cols(&ba, 2 * r, 0, r)?;
            let alpha = b.split_cols(&ba, 2 * r, r, r)?;
            (qkv, z, beta, alpha)
        }
    };
    b.act(&mut beta, Act::Sigmoid)?;
    b.add_bias(&mut g, &d.dt_bias)?;
    b.act(&mut g, Act::Softplus)?;
    b.mul_vec(&mut g, &d.a)?;

    let (mut convs, mut ssms): (Vec<&mut B::Tensor>, Vec<&mut B::Tensor>) =
        states.iter_mut().map(|(c, m)| (&mut **c, &mut **m)).unzip();
    let mut conv = b.ssm_conv(&qkv, &d.conv, &mut convs, p.seqs)?;
    b.act(&mut conv, Act::Silu)?;
    let c = d.channels();
    let q = b.l2_norm(&b.split_cols(&conv, c, 0, hk * s)?, s, eps)?;
    let k = b.l2_norm(&b.split_cols(&conv, c, hk * s, hk * s)?, s, eps)?;
    let v = b.split_cols(&conv, c, 2 * hk * s, hv * s)?;
    let o = b.gated_delta_net(&q, &k, &v, &g, &beta, &mut ssms, p.seqs, &d.p)?;
    // The gated norm, per head: rms_norm(o) * silu(z).
    let o = b.rms_norm(&o, &d.norm, s, eps)?;
    let mut o = b.reshape(o, n * hv, s)?;
    b.mul_act(&mut o, &b.reshape(z, n * hv, s)?, Act::Silu)?;
    let o = b.reshape(o, n, hv * s)?;
    Ok(b.matmul(&d.out, &o)?)
}
