//! gpt-oss: attention sinks, alternating sliding-window layers, biases on
//! every projection and expert, softmax over the chosen experts' logits,
//! clamped SwiGLU; the FFN's norm is named `post_attention_norm`.

use super::{ArchSpec, Family, SwaPattern};
use crate::backend::{Backend, Glu, RopeMode};
use crate::model::blocks::attention::{GqaDecl, Want};
use crate::model::blocks::ffn::MoeDecl;
use crate::model::blocks::{Attention, Ffn, Gqa, Layer, Loader, MoeFfn, QkNorm, Scoring};
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
        qk_norm: Want::No,
        qk_norm_over: QkNorm::Head,
        sinks: true,
        out_gate: None,
    };
    let moe = MoeDecl {
        routing: hp.routing(Scoring::SoftmaxWeight, false),
        glu: Glu::SwiGluOai {
            alpha: 1.702,
            limit: 7.0,
        },
        router_bias: Want::Req,
        select_bias: Want::No,
        expert_bias: Want::Req,
        shared: Want::No,
        n_ff_shared: 0,
        shared_gate: Want::No,
    };
    Ok(Layer {
        attn_norm: l.layer_norm(il, "attn_norm")?,
        attn: Attention::Gqa(Gqa::load(l, il, attn, hp.rope(RopeMode::Neox))?),
        ffn_norm: l.layer_norm(il, "post_attention_norm")?,
        ffn: Ffn::Moe(MoeFfn::load(l, il, moe)?),
    })
}
