//! Qwen3-MoE: QK-norm per head; softmax routing, renormalised.

use super::{ArchSpec, Family, SwaPattern};
use crate::backend::{Backend, Glu, RopeMode};
use crate::model::blocks::attention::{GqaDecl, Want};
use crate::model::blocks::ffn::MoeDecl;
use crate::model::blocks::{Attention, Ffn, Gqa, Layer, Loader, MoeFfn, QkNorm, Scoring};
use crate::model::ModelError;

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen3moe",
    family: Family::Qwen3Moe,
    swa: SwaPattern::NONE,
};

pub fn layer<B: Backend>(l: &Loader<B>, il: usize) -> Result<Layer<B::Weight>, ModelError> {
    let hp = l.hp;
    let attn = GqaDecl {
        qkv_bias: Want::No,
        out_bias: Want::No,
        qk_norm: Want::Req,
        qk_norm_over: QkNorm::Head,
        sinks: false,
        out_gate: None,
    };
    let moe = MoeDecl {
        routing: hp.routing(Scoring::Softmax, true),
        glu: Glu::SwiGlu,
        router_bias: Want::No,
        select_bias: Want::No,
        expert_bias: Want::No,
        shared: Want::No,
        n_ff_shared: 0,
        shared_gate: Want::No,
    };
    Ok(Layer {
        attn_norm: l.layer_norm(il, "attn_norm")?,
        attn: Attention::Gqa(Gqa::load(l, il, attn, hp.rope(RopeMode::Neox))?),
        ffn_norm: l.layer_norm(il, "ffn_norm")?,
        ffn: Ffn::Moe(MoeFfn::load(l, il, moe)?),
    })
}
