//! GLM-4.5 / 4.6 / 4.5-Air: partial rotary (`rope.dimension_count` below
//! the head size), q/k/v biases, optional QK-norm per head; leading dense
//! layers, then sigmoid routing with a selection bias, renormalised and
//! scaled as the metadata says, plus shared experts. The FFN's norm is
//! `post_attention_norm`; NextN layers after the trunk are not loaded.

use super::{ArchSpec, Family, SwaPattern};
use crate::backend::{Backend, RopeMode};
use crate::model::blocks::attention::{GqaDecl, Want};
use crate::model::blocks::ffn::MoeDecl;
use crate::model::blocks::{Attention, Ffn, Gqa, Layer, Loader, Scoring};
use crate::model::ModelError;

pub const SPEC: ArchSpec = ArchSpec {
    name: "glm4moe",
    family: Family::Glm4Moe,
    swa: SwaPattern::NONE,
};

pub fn layer<B: Backend>(l: &Loader<B>, il: usize) -> Result<Layer<B::Weight>, ModelError> {
    let hp = l.hp;
    let attn = GqaDecl {
        qkv_bias: Want::Opt,
        qk_norm: Want::Opt,
        ..GqaDecl::PLAIN
    };
    let shared = if hp.n_expert_shared > 0 {
        Want::Req
    } else {
        Want::No
    };
    let moe = MoeDecl {
        select_bias: Want::Req,
        shared,
        n_ff_shared: hp.n_ff_exp * hp.n_expert_shared,
        ..MoeDecl::routed(hp.routing(
            hp.expert_gating.unwrap_or(Scoring::Sigmoid),
            hp.expert_weights_norm,
        ))
    };
    Ok(Layer {
        attn_norm: l.layer_norm(il, "attn_norm")?,
        attn: Attention::Gqa(Gqa::load(l, il, attn, hp.rope(RopeMode::Neox))?),
        ffn_norm: l.layer_norm(il, "post_attention_norm")?,
        ffn: Ffn::dense_lead_then_moe(l, il, moe)?,
    })
}
