//! gpt-oss: attention sinks, alternating sliding-window layers, biases on
//! every projection and expert, softmax over the chosen experts' logits,
//! clamped SwiGLU; the FFN's norm is named `post_attention_norm`.

use super::{ArchSpec, Family, SwaPattern};
use crate::backend::{Backend, Glu, RopeMode};
use crate::model::blocks::attention::{GqaDecl, Want};
use crate::model::blocks::ffn::MoeDecl;
use crate::model::blocks::{Attention, Ffn, Gqa, Layer, Loader, MoeFfn, Scoring};
use crate::model::ModelError;

pub const SPEC: ArchSpec = ArchSpec {
    name: "gpt-oss",
    family: Family::GptOss,
    swa: SwaPattern {
        period: 2,
        dense_first: false,
    },
};

pub fn layer<B: Backend>(l: &Loader<B>, il: usize) -> Result<Layer<B::Weight>, ModelError> {
    let hp = l.hp;
    let attn = GqaDecl {
        qkv_bias: Want::Req,
        out_bias: Want::Req,
        sinks: true,
        ..GqaDecl::PLAIN
    };
    let moe = MoeDecl {
        glu: Glu::SwiGluOai {
            alpha: 1.702,
            limit: 7.0,
        },
        router_bias: Want::Req,
        expert_bias: Want::Req,
        ..MoeDecl::routed(hp.routing(Scoring::SoftmaxWeight, false))
    };
    Ok(Layer {
        attn_norm: l.layer_norm(il, "attn_norm")?,
        attn: Attention::Gqa(Gqa::load(l, il, attn, hp.rope(RopeMode::Neox))?),
        ffn_norm: l.layer_norm(il, "post_attention_norm")?,
        ffn: Ffn::Moe(MoeFfn::load(l, il, moe)?),
    })
}
