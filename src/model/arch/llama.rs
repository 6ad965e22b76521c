//! llama: dense (SmolLM2, Llama 3) or Mixtral-style MoE when `expert_count`
//! is above zero. Optional q/k/v/o biases; softmax routing, renormalised.

use super::{ArchSpec, Family, SwaPattern};
use crate::backend::{Backend, RopeMode};
use crate::model::blocks::attention::{GqaDecl, Want};
use crate::model::blocks::ffn::MoeDecl;
use crate::model::blocks::{Attention, DenseFfn, Ffn, Gqa, Layer, Loader, MoeFfn, Scoring};
use crate::model::ModelError;

pub const SPEC: ArchSpec = ArchSpec {
    name: "llama",
    family: Family::Llama,
    swa: SwaPattern::NONE,
};

pub fn layer<B: Backend>(l: &Loader<B>, il: usize) -> Result<Layer<B::Weight>, ModelError> {
    let hp = l.hp;
    let attn = GqaDecl {
        qkv_bias: Want::Opt,
        out_bias: Want::Opt,
        ..GqaDecl::PLAIN
    };
    let ffn = if hp.n_expert > 0 {
        Ffn::Moe(MoeFfn::load(
            l,
            il,
            MoeDecl::routed(hp.routing(Scoring::Softmax, true)),
        )?)
    } else {
        Ffn::Dense(DenseFfn::load(l, il, "", hp.n_ff)?)
    };
    Ok(Layer {
        attn_norm: l.layer_norm(il, "attn_norm")?,
        attn: Attention::Gqa(Gqa::load(l, il, attn, hp.rope(RopeMode::Norm))?),
        ffn_norm: l.layer_norm(il, "ffn_norm")?,
        ffn,
    })
}
