//! DeepSeek-V2, V2-Lite, V3, R1 and Kimi K2 (`deepseek2`): multi-head
//! latent attention (optional q LoRA); leading dense layers, then a router
//! scoring by softmax or sigmoid (`expert_gating_func`) with an optional
//! selection bias and group-limited top-k, renormalised and scaled as the
//! metadata says, plus shared experts. NextN layers are not loaded.

use super::{ArchSpec, Family, SwaPattern};
use crate::backend::{Backend, RopeMode};
use crate::model::blocks::attention::Want;
use crate::model::blocks::ffn::MoeDecl;
use crate::model::blocks::mla::Mla;
use crate::model::blocks::{Attention, Ffn, Layer, Loader, Scoring};
use crate::model::ModelError;

pub const SPEC: ArchSpec = ArchSpec {
    name: "deepseek2",
    family: Family::Deepseek2,
    swa: SwaPattern::NONE,
};

pub fn layer<B: Backend>(l: &Loader<B>, il: usize) -> Result<Layer<B::Weight>, ModelError> {
    let hp = l.hp;
    let moe = MoeDecl {
        select_bias: Want::Opt,
        shared: Want::Req,
        n_ff_shared: hp.n_ff_exp * hp.n_expert_shared,
        ..MoeDecl::routed(hp.routing(
            hp.expert_gating.unwrap_or(Scoring::Softmax),
            hp.expert_weights_norm,
        ))
    };
    Ok(Layer {
        attn_norm: l.layer_norm(il, "attn_norm")?,
        attn: Attention::Mla(Mla::load(l, il, hp.rope(RopeMode::Norm))?),
        ffn_norm: l.layer_norm(il, "ffn_norm")?,
        ffn: Ffn::dense_lead_then_moe(l, il, moe)?,
    })
}
