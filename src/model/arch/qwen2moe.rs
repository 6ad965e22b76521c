//! Qwen2-MoE: q/k/v biases; softmax routing without renormalisation; a
//! shared expert behind a sigmoid gate.

use super::{ArchSpec, Family, SwaPattern};
use crate::backend::{Backend, RopeMode};
use crate::model::blocks::attention::{GqaDecl, Want};
use crate::model::blocks::ffn::MoeDecl;
use crate::model::blocks::{Attention, Ffn, Gqa, Layer, Loader, MoeFfn, Scoring};
use crate::model::ModelError;

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen2moe",
    family: Family::Qwen2Moe,
    swa: SwaPattern::NONE,
};

pub fn layer<B: Backend>(l: &Loader<B>, il: usize) -> Result<Layer<B::Weight>, ModelError> {
    let hp = l.hp;
    let attn = GqaDecl {
        qkv_bias: Want::Req,
        ..GqaDecl::PLAIN
    };
    let moe = MoeDecl {
        shared: Want::Opt,
        n_ff_shared: hp.n_ff_shexp,
        shared_gate: Want::Opt,
        ..MoeDecl::routed(hp.routing(Scoring::Softmax, false))
    };
    Ok(Layer {
        attn_norm: l.layer_norm(il, "attn_norm")?,
        attn: Attention::Gqa(Gqa::load(l, il, attn, hp.rope(RopeMode::Neox))?),
        ffn_norm: l.layer_norm(il, "ffn_norm")?,
        ffn: Ffn::Moe(MoeFfn::load(l, il, moe)?),
    })
}
