//! The qwen3next layout: hybrid layers (three of every
//! [`LinearAttn::full_attn_interval`] gated DeltaNet linear attention, the
//! last one gated full attention), every FFN a softmax-routed MoE plus a
//! sigmoid-gated shared expert. Keys, tensor names and shapes are what
//! llama.cpp's converter writes for Qwen3-Next (`convert_hf_to_gguf.py`'s
//! `Qwen3NextModel`) and its loader creates (`src/models/qwen3next.cpp`),
//! checked against a real conversion's dump.

use std::sync::Arc;

use super::{add, router_row_scales, Fill, SynthError, SynthSpec};
use crate::gguf::{MetaType, MetaValue, Writer};
use crate::tensor::GgmlType;

/// Gated DeltaNet linear attention of a hybrid layout (qwen3next):
/// llama.cpp's `ssm_*` hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearAttn {
    /// Key (and query) heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`ssm.time_step_rank`), a multiple of the key heads.
    pub n_v_heads: usize,
    /// Size of every key and value head (`ssm.state_size`).
    pub head_dim: usize,
    /// Taps of the causal convolution (`ssm.conv_kernel`).
    pub d_conv: usize,
    /// Every this-many-th layer is full attention, the others linear
    /// (`full_attention_interval`, and `attention.recurrent_layers`).
    pub full_attn_interval: usize,
}

impl LinearAttn {
    /// Whether layer `il` is linear attention (recurrent).
    pub fn is_recurrent(&self, il: usize) -> bool {
        !(il + 1).is_multiple_of(self.full_attn_interval)
    }

    /// Channels of the convolution: q, k and v side by side.
    fn conv_channels(&self) -> usize {
        (2 * self.n_k_heads + self.n_v_heads) * self.head_dim
    }

    /// Why these shapes cannot be built, if they cannot.
    pub(super) fn check(&self) -> Result<(), String> {
        if self.n_k_heads == 0 || self.head_dim == 0 || self.full_attn_interval == 0 {
            return Err(format!("zero-sized linear attention {self:?}"));
        }
        if !self.n_v_heads.is_multiple_of(self.n_k_heads) || self.n_v_heads == 0 {
            return Err(format!(
                "{} linear-attention value heads are not a multiple of {} key heads",
                self.n_v_heads, self.n_k_heads
            ));
        }
        if self.d_conv < 2 {
            return Err(format!(
                "a convolution of {} taps (want 2 or more)",
                self.d_conv
            ));
        }
        Ok(())
    }
}

/// The `qwen3next.*` keys, as the converter writes them for Qwen3-Next.
pub(super) fn set_hparams(w: &mut Writer, s: &SynthSpec, la: &LinearAttn) {
    let a = s.arch.name();
    for (k, v) in [
        ("context_length", s.n_ctx_train),
        ("embedding_length", s.n_embd),
        ("block_count", s.n_layer),
        ("feed_forward_length", s.n_ff),
        ("attention.head_count", s.n_head),
        ("attention.head_count_kv", s.n_head_kv),
        ("attention.key_length", s.head_dim),
        ("attention.value_length", s.head_dim),
        ("rope.dimension_count", s.n_rot()),
        ("expert_count", s.n_expert),
        ("expert_used_count", s.n_expert_used),
        ("expert_feed_forward_length", s.n_ff_exp),
        (
            "expert_shared_feed_forward_length",
            s.n_ff_exp * s.n_expert_shared,
        ),
        ("ssm.conv_kernel", la.d_conv),
        ("ssm.state_size", la.head_dim),
        ("ssm.group_count", la.n_k_heads),
        ("ssm.time_step_rank", la.n_v_heads),
        ("ssm.inner_size", la.n_v_heads * la.head_dim),
        ("full_attention_interval", la.full_attn_interval),
    ] {
        w.set(&format!("{a}.{k}"), MetaValue::U32(v as u32));
    }
    for (k, v) in [
        ("rope.freq_base", 10_000_000.0),
        ("attention.layer_norm_rms_epsilon", 1e-6),
    ] {
        w.set(&format!("{a}.{k}"), MetaValue::F32(v));
    }
    let recurrent = (0..s.n_layer)
        .map(|il| MetaValue::Bool(la.is_recurrent(il)))
        .collect();
    w.set(
        &format!("{a}.attention.recurrent_layers"),
        MetaValue::Array(MetaType::Bool, recurrent),
    );
}

/// Adds layer `il`'s tensors: the norms, gated DeltaNet or gated full
/// attention, the router, the routed experts and the gated shared expert.
///
/// Values keep activations of unit scale: matrices `U(-a, a)` with `a =
/// sqrt(3 / fan_in)` (unit variance out for unit variance in), norms `1 +-
/// 0.2` (the converter bakes HF's `1 + w` in; `ssm_norm` is stored as is,
/// and HF initialises it to one), a convolution of unit gain, beta near a
/// half, and decays `exp(ssm_a * softplus(alpha + dt_bias))` with `ssm_a =
/// -exp(U(ln 0.1, ln 16))` (`-exp(A_log)`, as stored) and `dt_bias` in
/// `(-2, 0)`: per token between about 0.99 and 1e-7, never a NaN.
pub(super) fn add_layer(
    w: &mut Writer,
    s: &SynthSpec,
    la: &LinearAttn,
    il: usize,
) -> Result<(), SynthError> {
    let e = s.n_embd as u64;
    let (x, ff) = (s.n_expert as u64, s.n_ff_exp as u64);
    let amp = |k: u64| (3.0 / k as f32).sqrt();
    let (f32_, dense, experts) = (GgmlType::F32, s.dense_type, s.expert_type);
    let mut t = |name: &str, dims: &[u64], ty: GgmlType, fill: Fill| {
        add(w, s.seed, &format!("blk.{il}.{name}"), dims, ty, fill)
    };
    t("attn_norm.weight", &[e], f32_, Fill::norm())?;
    if la.is_recurrent(il) {
        let (hk, hv, sd) = (la.n_k_heads as u64, la.n_v_heads as u64, la.head_dim as u64);
        let (conv, value) = (la.conv_channels() as u64, hv * sd);
        let (lo, hi) = (0.1f32.ln(), 16f32.ln());
        t(
            "ssm_a",
            &[hv],
            f32_,
            Fill {
                map: Some(|v| -v.exp()),
                ..Fill::around((lo + hi) / 2.0, (hi - lo) / 2.0)
            },
        )?;
        let taps = la.d_conv as u64;
        t(
            "ssm_conv1d.weight",
            &[taps, conv],
            f32_,
            Fill::uniform(amp(taps)),
        )?;
        t("ssm_dt.bias", &[hv], f32_, Fill::around(-1.0, 1.0))?;
        // Per key head, the betas of its value heads then their alphas.
        t("ssm_ba.weight", &[e, 2 * hv], dense, Fill::uniform(amp(e)))?;
        debug_assert_eq!(conv, 2 * hk * sd + value);
        t("attn_qkv.weight", &[e, conv], dense, Fill::uniform(amp(e)))?;
        t(
            "attn_gate.weight",
            &[e, value],
            dense,
            Fill::uniform(amp(e)),
        )?;
        t("ssm_norm.weight", &[sd], f32_, Fill::norm())?;
        t(
            "ssm_out.weight",
            &[value, e],
            dense,
            Fill::uniform(amp(value)),
        )?;
    } else {
        let (hd, nh) = (s.head_dim as u64, s.n_head as u64);
        let kv = s.n_head_kv as u64 * hd;
        // Per head, the query then its output gate.
        t(
            "attn_q.weight",
            &[e, 2 * nh * hd],
            dense,
            Fill::uniform(amp(e)),
        )?;
        t("attn_k.weight", &[e, kv], dense, Fill::uniform(amp(e)))?;
        t("attn_v.weight", &[e, kv], dense, Fill::uniform(amp(e)))?;
        t(
            "attn_output.weight",
            &[nh * hd, e],
            dense,
            Fill::uniform(amp(nh * hd)),
        )?;
        t("attn_q_norm.weight", &[hd], f32_, Fill::norm())?;
        t("attn_k_norm.weight", &[hd], f32_, Fill::norm())?;
    }
    t("post_attention_norm.weight", &[e], f32_, Fill::norm())?;
    // A softmax router as qwen3moe's.
    let router = Fill {
        row_scale: router_row_scales(s.seed, il, s.n_expert, s.router_skew).map(Arc::from),
        ..Fill::uniform(amp(e) * 4.0)
    };
    t("ffn_gate_inp.weight", &[e, x], f32_, router)?;
    for (m, dims, k) in [
        ("gate", [e, ff, x], e),
        ("up", [e, ff, x], e),
        ("down", [ff, e, x], ff),
    ] {
        let name = format!("ffn_{m}_exps.weight");
        t(&name, &dims, experts, Fill::uniform(amp(k)))?;
    }
    let sh = ff * s.n_expert_shared as u64;
    t(
        "ffn_gate_shexp.weight",
        &[e, sh],
        dense,
        Fill::uniform(amp(e)),
    )?;
    t(
        "ffn_up_shexp.weight",
        &[e, sh],
        dense,
        Fill::uniform(amp(e)),
    )?;
    t(
        "ffn_down_shexp.weight",
        &[sh, e],
        dense,
        Fill::uniform(amp(sh)),
    )?;
    // The shared expert's gate: one row, as the converter writes it.
    t(
        "ffn_gate_inp_shexp.weight",
        &[e, 1],
        f32_,
        Fill::uniform(amp(e)),
    )
}
