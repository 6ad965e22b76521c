//! Qwen3-Next and Qwen3.5-MoE: hybrid layers, three of every four gated
//! DeltaNet linear attention (a recurrent state per sequence) and the
//! fourth gated full attention (QK-norm per head, partial rotary, a sigmoid
//! output gate carried in the q projection); every FFN a softmax-routed MoE
//! with renormalised weights and a sigmoid-gated shared expert. The norm
//! before the FFN is `post_attention_norm`. Qwen3.5 projects DeltaNet's
//! beta and alpha separately and maps its key heads onto value heads by
//! tiling; Qwen3-Next fuses the two projections and repeats each key head.

use super::{ArchSpec, Family, SwaPattern};
use crate::backend::{Backend, KHeadMap, RopeMode};
use crate::model::blocks::attention::{GqaDecl, Want};
use crate::model::blocks::deltanet::{DeltaNet, DeltaNetDecl};
use crate::model::blocks::ffn::MoeDecl;
use crate::model::blocks::{Attention, Ffn, Gqa, Layer, Loader, MoeFfn, Scoring};
use crate::model::ModelError;

pub const QWEN3NEXT: ArchSpec = ArchSpec {
    name: "qwen3next",
    family: Family::Qwen3Next,
    swa: SwaPattern::NONE,
};

pub const QWEN35MOE: ArchSpec = ArchSpec {
    name: "qwen35moe",
    family: Family::Qwen35Moe,
    swa: SwaPattern::NONE,
};

/// Layer `il`; `qwen35` selects Qwen3.5's DeltaNet layout and rope.
pub fn layer<B: Backend>(
    l: &Loader<B>,
    il: usize,
    qwen35: bool,
) -> Result<Layer<B::Weight>, ModelError> {
    let hp = l.hp;
    let attn = if hp.is_recurrent(il) {
        let d = DeltaNetDecl {
            fused_ba: !qwen35,
            k_map: if qwen35 {
                KHeadMap::Tile
            } else {
                KHeadMap::Interleave
            },
        };
        Attention::DeltaNet(DeltaNet::load(l, il, d)?)
    } else {
        let decl = GqaDecl {
            qk_norm: Want::Req,
            q_gate: true,
            ..GqaDecl::PLAIN
        };
        Attention::Gqa(Gqa::load(l, il, decl, rope(l, qwen35)?)?)
    };
    let n_ff_shared = if hp.n_ff_shexp > 0 {
        hp.n_ff_shexp
    } else {
        hp.n_ff
    };
    let moe = MoeDecl {
        shared: Want::Req,
        n_ff_shared,
        shared_gate: Want::Req,
        ..MoeDecl::routed(hp.routing(Scoring::Softmax, true))
    };
    Ok(Layer {
        attn_norm: l.layer_norm(il, "attn_norm")?,
        attn,
        ffn_norm: l.layer_norm(il, "post_attention_norm")?,
        ffn: Ffn::Moe(MoeFfn::load(l, il, moe)?),
    })
}

/// NEOX rope over `rope.dimension_count` dims. Qwen3.5's multi-section
/// rope (IMROPE) gives text tokens the same position in its first three
/// sections and position 0 in the fourth (llama.cpp's text-only
/// positions), so with no fourth section it is NEOX rope; a file with one
/// is refused.
fn rope<B: Backend>(l: &Loader<B>, qwen35: bool) -> Result<crate::backend::RopeParams, ModelError> {
    let hp = l.hp;
    if let (true, Some(s)) = (qwen35, hp.rope_sections) {
        if s[3] != 0 {
            return Err(ModelError::BadHparam {
                key: format!("{}.rope.dimension_sections", hp.arch),
                reason: format!(
                    "{s:?} has a fourth section, which text-only positions would not rotate; \
                     longhaul runs multi-section rope only where it equals NEOX rope"
                ),
            });
        }
    }
    Ok(hp.rope(RopeMode::Neox))
}
