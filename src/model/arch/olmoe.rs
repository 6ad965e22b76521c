//! OLMoE: QK-norm over the whole q and k projections; softmax routing
//! without renormalisation; no shared expert.

use super::{ArchSpec, Family, SwaPattern};
use crate::backend::{Backend, RopeMode};
use crate::model::blocks::attention::{GqaDecl, Want};
use crate::model::blocks::ffn::MoeDecl;
use crate::model::blocks::{Attention, Ffn, Gqa, Layer, Loader, MoeFfn, QkNorm, Scoring};
use crate::model::ModelError;

pub const SPEC: ArchSpec = ArchSpec {
    name: "olmoe",
    family: Family::Olmoe,
    swa: SwaPattern::NONE,
};

pub fn layer<B: Backend>(l: &Loader<B>, il: usize) -> Result<Layer<B::Weight>, ModelError> {
    let hp = l.hp;
    let attn = GqaDecl {
        qk_norm: Want::Req,
        qk_norm_over: QkNorm::Whole,
        ..GqaDecl::PLAIN
    };
    let moe = MoeDecl::routed(hp.routing(Scoring::Softmax, false));
    Ok(Layer {
        attn_norm: l.layer_norm(il, "attn_norm")?,
        attn: Attention::Gqa(Gqa::load(l, il, attn, hp.rope(RopeMode::Neox))?),
        ffn_norm: l.layer_norm(il, "ffn_norm")?,
        ffn: Ffn::Moe(MoeFfn::load(l, il, moe)?),
    })
}
