//! Qwen3-MoE: QK-norm per head; softmax routing, renormalised.

use super::{ArchSpec, Family, SwaPattern};
use crate::backend::{Backend, RopeMode};
use crate::model::blocks::attention::{GqaDecl, Want};
use crate::model::blocks::ffn::MoeDecl;
use crate::model::blocks::{Attention, Ffn, Gqa, Layer, Loader, MoeFfn, Scoring};
use crate::model::ModelError;

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen3moe",
    family: Family::Qwen3Moe,
    swa: SwaPattern::NONE,
};

pub fn layer<B: Backend>(l: &Loader<B>, il: usize) -> Result<Layer<B::Weight>, ModelError> {
    let hp = l.hp;
    let attn = GqaDecl {
        qk_norm: Want::Req,
        ..GqaDecl::PLAIN
    };
    let moe = MoeDecl::routed(hp.routing(Scoring::Softmax, true));
    Ok(Layer {
        attn_norm: l.layer_norm(il, "attn_norm")?,
        attn: Attention::Gqa(Gqa::load(l, il, attn, hp.rope(RopeMode::Neox))?),
        ffn_norm: l.layer_norm(il, "ffn_norm")?,
        ffn: Ffn::Moe(MoeFfn::load(l, il, moe)?),
    })
}
