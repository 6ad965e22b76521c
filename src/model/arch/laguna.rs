//! Laguna (poolside): QK-norm per head and a softplus output gate on the
//! attention (per head or per element, as `attn_gate`'s width says); an
//! optional sliding window on three layers of every four after a full one,
//! those layers with plain rope of their own; leading dense layers, then
//! sigmoid routing with a selection bias and an always-on shared expert.

use super::{ArchSpec, Family, SwaPattern};
use crate::backend::{Act, Backend, RopeMode};
use crate::model::blocks::attention::{GqaDecl, Want};
use crate::model::blocks::ffn::MoeDecl;
use crate::model::blocks::{Attention, Ffn, Gqa, Layer, Loader, Scoring};
use crate::model::ModelError;

pub const SPEC: ArchSpec = ArchSpec {
    name: "laguna",
    family: Family::Laguna,
    swa: SwaPattern {
        period: 4,
        dense_first: true,
    },
};

pub fn layer<B: Backend>(l: &Loader<B>, il: usize) -> Result<Layer<B::Weight>, ModelError> {
    let hp = l.hp;
    let attn = GqaDecl {
        qk_norm: Want::Req,
        out_gate: Some(Act::Softplus),
        ..GqaDecl::PLAIN
    };
    let rope = if hp.swa_layers.get(il).copied().unwrap_or(false) {
        hp.rope_swa(RopeMode::Neox)
    } else {
        hp.rope(RopeMode::Neox)
    };
    // One shared expert unless the file says otherwise, its width given
    // directly (routed and shared widths may differ).
    let n_shared = if hp.n_expert_shared == 0 {
        1
    } else {
        hp.n_expert_shared
    };
    let n_ff_shared = if hp.n_ff_shexp == 0 {
        hp.n_ff_exp * n_shared
    } else {
        hp.n_ff_shexp
    };
    let moe = MoeDecl {
        select_bias: Want::Req,
        shared: Want::Req,
        n_ff_shared,
        ..MoeDecl::routed(hp.routing(
            hp.expert_gating.unwrap_or(Scoring::Sigmoid),
            hp.expert_weights_norm,
        ))
    };
    Ok(Layer {
        attn_norm: l.layer_norm(il, "attn_norm")?,
        attn: Attention::Gqa(Gqa::load(l, il, attn, rope)?),
        ffn_norm: l.layer_norm(il, "ffn_norm")?,
        ffn: Ffn::dense_lead_then_moe(l, il, moe)?,
    })
}
