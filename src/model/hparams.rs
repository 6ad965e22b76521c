//! Hyperparameters read from GGUF metadata (`{arch}.*` keys), never hard-coded.

use super::blocks::{Routing, Scoring};
use super::ModelError;
use crate::backend::{RopeMode, RopeParams};
use crate::gguf::Metadata;

/// Model hyperparameters. Names follow llama.cpp (`n_embd`, `n_head_kv`,
/// `n_ff_exp`, `n_expert_used`, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct Hparams {
    pub arch: String,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    /// Query heads of layer 0 (`attention.head_count`), and of each layer
    /// where the file gives an array.
    pub n_head: usize,
    pub n_head_layer: Vec<usize>,
    pub n_head_kv: usize,
    /// Per-head key/value size (`attention.key_length`, default n_embd / n_head).
    pub head_dim: usize,
    pub n_rot: usize,
    pub n_ff: usize,
    pub eps: f32,
    pub rope_freq_base: f32,
    pub rope_freq_scale: f32,
    pub rope_yarn: bool,
    pub n_ctx_orig_yarn: u32,
    pub yarn_beta_fast: f32,
    pub yarn_beta_slow: f32,
    pub rope_attn_factor: f32,
    pub yarn_log_mul: f32,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
    pub expert_weights_scale: f32,
    /// Expert groups (`expert_group_count`, 1: none) and the groups a token
    /// may choose from (`expert_group_used_count`).
    pub n_expert_groups: usize,
    pub n_group_used: usize,
    /// Sliding-window size and which layers use it.
    pub n_swa: u32,
    pub swa_layers: Vec<bool>,
    /// Sliding-window layers' own rope (`rope.freq_base_swa`,
    /// `rope.dimension_count_swa`), where a family has one (Laguna).
    pub rope_freq_base_swa: Option<f32>,
    pub n_rot_swa: Option<usize>,
    /// Leading layers with a dense FFN (`leading_dense_block_count`).
    pub n_layer_dense_lead: usize,
    /// Shared experts (`expert_shared_count`).
    pub n_expert_shared: usize,
    /// Renormalise the chosen experts' weights (`expert_weights_norm`).
    pub expert_weights_norm: bool,
    /// The router's scoring as the file states it (`expert_gating_func`:
    /// 1 softmax, 2 sigmoid, 3 softmax over the chosen); `None` when absent.
    pub expert_gating: Option<Scoring>,
    /// Value head size (`attention.value_length`, default `head_dim`).
    pub head_dim_v: usize,
    /// MLA: q and kv LoRA ranks (`attention.q_lora_rank`, 0 when absent;
    /// `attention.kv_lora_rank`) and the per-head sizes of the decompressed
    /// keys and values (`attention.key_length_mla`, `value_length_mla`).
    pub n_lora_q: usize,
    pub n_lora_kv: usize,
    pub head_dim_k_mla: usize,
    pub head_dim_v_mla: usize,
    /// NextN/MTP layers after the repeating ones (`nextn_predict_layers`):
    /// counted in `block_count` by llama.cpp; loaded only for MTP drafting.
    pub n_nextn: usize,
    /// Whether the first NextN layer is loaded (an MTP drafter asked for
    /// it; see [`crate::model::LoadOptions::mtp`]).
    pub mtp: bool,
    /// The linear-attention (gated DeltaNet) shapes, when the file has
    /// `ssm.*` keys (Qwen3-Next, Qwen3.5).
    pub ssm: Option<Ssm>,
    /// Which layers are recurrent (linear attention): the file's
    /// `attention.recurrent_layers`, else every layer but each
    /// `full_attention_interval`-th (default 4) when there is an `ssm`.
    pub recurrent_layers: Vec<bool>,
    /// `rope.dimension_sections` (multi-section rope), when present.
    pub rope_sections: Option<[u32; 4]>,
}

/// A gated DeltaNet layer's sizes, llama.cpp's `ssm_*` hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ssm {
    /// Causal convolution taps (`ssm.conv_kernel`).
    pub d_conv: usize,
    /// Value width, `n_v_heads * head_dim` (`ssm.inner_size`).
    pub d_inner: usize,
    /// Key (and value) head size (`ssm.state_size`).
    pub head_dim: usize,
    /// Value heads (`ssm.time_step_rank`).
    pub n_v_heads: usize,
    /// Key heads (`ssm.group_count`).
    pub n_k_heads: usize,
}

impl Ssm {
    /// Channels of the convolution: q, k and v side by side.
    pub fn conv_channels(&self) -> usize {
        self.d_inner + 2 * self.n_k_heads * self.head_dim
    }

    /// Floats of one layer's recurrent state: the convolution's last
    /// `d_conv - 1` inputs and one `S x S` matrix per value head.
    pub fn state_floats(&self) -> usize {
        (self.d_conv - 1) * self.conv_channels() + self.n_v_heads * self.head_dim * self.head_dim
    }
}

/// An architecture's default sliding-window layer pattern (llama.cpp's
/// `set_swa_pattern`), which `attention.sliding_window_pattern` overrides
/// with a period or a per-layer array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwaPattern {
    /// 0: no sliding-window layers unless the file lists them.
    pub period: u32,
    /// The full-attention layer comes first in each period (Laguna) rather
    /// than last (gpt-oss).
    pub dense_first: bool,
}

impl SwaPattern {
    pub const NONE: SwaPattern = SwaPattern {
        period: 0,
        dense_first: false,
    };
}

/// The largest plausible value of each size hyperparameter. A value above
/// its limit comes from a corrupt or hostile file, and is rejected before
/// anything is sized from it (a `block_count` of 2^32 once asked for a 6 TB
/// layer table). Each limit is the largest value of any released model times
/// a margin, so a real model never hits one.
pub mod limits {
    /// Repeating layers: llama.cpp's `LLAMA_MAX_LAYERS` (it asserts on
    /// more); the deepest released model has 126 (Llama 3.1 405B).
    pub const N_LAYER: u64 = 512;
    /// Routed experts per layer: llama.cpp's `LLAMA_MAX_EXPERTS` (1024
    /// since Kimi K3; it asserts on more); Qwen3-Next has 512.
    pub const N_EXPERT: u64 = 1024;
    /// Embedding width: 8x the widest released model (16384, Llama 3.1 405B).
    pub const N_EMBD: u64 = 1 << 17;
    /// Attention heads (query or KV): 8x the most of any released model
    /// (128, DeepSeek-V3 and Llama 3.1 405B).
    pub const N_HEAD: u64 = 1 << 10;
    /// Per-head key/value size: 7x the largest released (576, DeepSeek's
    /// MLA keys; ordinary heads are at most 256).
    pub const HEAD_DIM: u64 = 1 << 12;
    /// Feed-forward width (dense, expert or shared expert): 20x the widest
    /// released (53248, Llama 3.1 405B).
    pub const N_FF: u64 = 1 << 20;
    /// Vocabulary (rows of `token_embd.weight`): 8x the largest released
    /// (262144, Gemma 3).
    pub const N_VOCAB: u64 = 1 << 21;
    /// Trained context and other position counts: llama.cpp reads
    /// `context_length` as a u32. Whether a context of this size fits in
    /// memory is checked when a KV cache is sized ([`crate::kv`]).
    pub const N_CTX: u64 = u32::MAX as u64;
}

fn key(arch: &str, k: &str) -> String {
    format!("{arch}.{k}")
}

/// `value` of `key` if it is at most `max`, else [`ModelError::HparamTooLarge`].
fn at_most(key: String, value: u64, max: u64, what: &'static str) -> Result<usize, ModelError> {
    match usize::try_from(value) {
        Ok(v) if value <= max => Ok(v),
        _ => Err(ModelError::HparamTooLarge {
            key,
            value,
            max,
            what,
        }),
    }
}

/// A float hyperparameter must be finite and inside what `ok` accepts
/// (`want` says what that is, for the message).
fn float_in(key: String, value: f32, want: &'static str, ok: bool) -> Result<f32, ModelError> {
    if value.is_finite() && ok {
        Ok(value)
    } else {
        Err(ModelError::BadFloatHparam { key, value, want })
    }
}

impl Hparams {
    /// Reads the hyperparameters of architecture `arch`. `swa` is the
    /// architecture's default sliding-window pattern.
    ///
    /// Every size is checked against its limit in [`limits`] and every
    /// float must be finite and in range before any value is used, so that
    /// nothing is sized from a corrupt value.
    pub fn from_metadata(
        md: &Metadata,
        n_vocab: usize,
        swa: SwaPattern,
    ) -> Result<Self, ModelError> {
        let arch = md.architecture()?.to_string();
        let a = arch.as_str();
        // A size key: absent -> `d` (when optional), present -> at most `max`.
        let size = |k: &str, d: Option<usize>, max: u64, what| -> Result<usize, ModelError> {
            match (md.opt(&key(a, k), Metadata::get_u64)?, d) {
                (Some(v), _) => at_most(key(a, k), v, max, what),
                (None, Some(d)) => Ok(d),
                (None, None) => Err(crate::gguf::GgufError::MissingKey { key: key(a, k) }.into()),
            }
        };
        let opt_f = |k: &str, d: f32| -> Result<f32, ModelError> {
            Ok(md.opt(&key(a, k), Metadata::get_f32)?.unwrap_or(d))
        };
        use limits as l;
        let positive = |k: &str, v: usize| -> Result<usize, ModelError> {
            if v == 0 {
                Err(ModelError::BadHparam {
                    key: key(a, k),
                    reason: "is 0; it must be positive".into(),
                })
            } else {
                Ok(v)
            }
        };

        at_most(
            "token_embd.weight rows".into(),
            n_vocab as u64,
            l::N_VOCAB,
            "vocabulary",
        )?;
        let n_embd = size("embedding_length", None, l::N_EMBD, "embedding width")?;
        let n_embd = positive("embedding_length", n_embd)?;
        let n_layer_all = size("block_count", None, l::N_LAYER, "layer count")?;
        let n_nextn = size(
            "nextn_predict_layers",
            Some(0),
            l::N_LAYER,
            "NextN layer count",
        )?;
        if n_nextn >= n_layer_all.max(1) {
            return Err(ModelError::BadHparam {
                key: key(a, "nextn_predict_layers"),
                reason: format!("{n_nextn} of {n_layer_all} layers"),
            });
        }
        let n_layer = positive("block_count", n_layer_all - n_nextn)?;
        // A per-layer array (Laguna) or one count for every layer; like
        // llama.cpp, `n_head` alone means layer 0's.
        let hk = key(a, "attention.head_count");
        let n_head_layer: Vec<usize> = match md.get(&hk) {
            Some(crate::gguf::MetaValue::Array(_, v)) => {
                if v.len() < n_layer {
                    return Err(ModelError::BadHparam {
                        key: hk,
                        reason: format!("{} entries for {n_layer} layers", v.len()),
                    });
                }
                v.iter()
                    .take(n_layer)
                    .map(|x| {
                        let n = x.as_i128().filter(|&n| n > 0).ok_or_else(|| {
                            ModelError::BadHparam {
                                key: hk.clone(),
                                reason: format!("{x:?} is not a positive head count"),
                            }
                        })?;
                        at_most(hk.clone(), n as u64, l::N_HEAD, "head count")
                    })
                    .collect::<Result<_, _>>()?
            }
            _ => {
                let n = size("attention.head_count", None, l::N_HEAD, "head count")?;
                vec![positive("attention.head_count", n)?; n_layer]
            }
        };
        let n_head = n_head_layer[0];
        let n_head_kv = size(
            "attention.head_count_kv",
            Some(n_head),
            l::N_HEAD,
            "KV head count",
        )?;
        if let Some(&h) = n_head_layer
            .iter()
            .find(|&&h| n_head_kv == 0 || h % n_head_kv != 0)
        {
            return Err(ModelError::BadHparam {
                key: key(a, "attention.head_count_kv"),
                reason: format!("{n_head_kv} does not divide {h} heads"),
            });
        }
        let head_dim = size(
            "attention.key_length",
            Some(n_embd / n_head),
            l::HEAD_DIM,
            "head size",
        )?;
        let head_dim = positive("attention.key_length", head_dim)?;
        let n_rot = size(
            "rope.dimension_count",
            Some(head_dim),
            l::HEAD_DIM,
            "rotated dimensions",
        )?;
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::BadHparam {
                key: key(a, "rope.dimension_count"),
                reason: format!("{n_rot} for heads of {head_dim}"),
            });
        }
        let n_ctx_train = size("context_length", Some(4096), l::N_CTX, "context length")?;
        let n_ctx_train = positive("context_length", n_ctx_train)?;
        let scaling = md.opt(&key(a, "rope.scaling.type"), |m, k| {
            m.get_str(k).map(str::to_string)
        })?;
        let k_factor = key(a, "rope.scaling.factor");
        let factor = opt_f("rope.scaling.factor", 0.0)?;
        // 0 means "no scaling"; otherwise rope's frequency scale is 1/factor.
        let ok = factor == 0.0 || (factor > 0.0 && (1.0 / factor).is_finite());
        let factor = float_in(k_factor, factor, "0 (none) or positive", ok)?;
        let rope_freq_scale = if factor == 0.0 || scaling.as_deref() == Some("none") {
            1.0
        } else {
            1.0 / factor
        };
        let n_expert = size("expert_count", Some(0), l::N_EXPERT, "expert count")?;
        let n_expert_used = size(
            "expert_used_count",
            Some(0),
            l::N_EXPERT,
            "experts per token",
        )?;
        if n_expert > 0 && (n_expert_used == 0 || n_expert_used > n_expert) {
            return Err(ModelError::BadHparam {
                key: key(a, "expert_used_count"),
                reason: format!("{n_expert_used} of {n_expert} experts"),
            });
        }
        let n_expert_groups = size("expert_group_count", Some(1), l::N_EXPERT, "expert groups")?;
        let n_expert_groups = n_expert_groups.max(1);
        let n_group_used = size(
            "expert_group_used_count",
            Some(n_expert_groups),
            l::N_EXPERT,
            "expert groups used",
        )?;
        if n_expert_groups > 1
            && (n_expert % n_expert_groups != 0
                || n_group_used == 0
                || n_group_used > n_expert_groups
                || n_expert_used > n_group_used * (n_expert / n_expert_groups))
        {
            return Err(ModelError::BadHparam {
                key: key(a, "expert_group_count"),
                reason: format!(
                    "{n_expert_groups} groups of {n_expert} experts, {n_group_used} used, for top-{n_expert_used}"
                ),
            });
        }
        let n_swa = size(
            "attention.sliding_window",
            Some(0),
            l::N_CTX,
            "sliding window",
        )? as u32;
        let swa_key = key(a, "attention.sliding_window_pattern");
        let swa_layers: Vec<bool> = match md.get(&swa_key) {
            Some(crate::gguf::MetaValue::Array(_, v)) => {
                if v.len() < n_layer {
                    return Err(ModelError::BadHparam {
                        key: swa_key,
                        reason: format!("{} entries for {n_layer} layers", v.len()),
                    });
                }
                v.iter()
                    .take(n_layer)
                    .map(|x| n_swa > 0 && matches!(x, crate::gguf::MetaValue::Bool(true)))
                    .collect()
            }
            _ => {
                let period = size(
                    "attention.sliding_window_pattern",
                    Some(swa.period as usize),
                    l::N_LAYER,
                    "sliding-window period",
                )? as u32;
                (0..n_layer as u32)
                    .map(|il| {
                        n_swa > 0
                            && swa.period > 0
                            && (period == 0
                                || if swa.dense_first {
                                    il % period != 0
                                } else {
                                    il % period < period - 1
                                })
                    })
                    .collect()
            }
        };
        let n_ff = size(
            "feed_forward_length",
            Some(0),
            l::N_FF,
            "feed-forward width",
        )?;
        let n_ctx_orig_yarn = size(
            "rope.scaling.original_context_length",
            Some(n_ctx_train),
            l::N_CTX,
            "original context length",
        )? as u32;
        // Floats: finite, and in the range their formula needs.
        let f = |k: &str, d: f32, want: &'static str, ok: fn(f32) -> bool| {
            let v = opt_f(k, d)?;
            float_in(key(a, k), v, want, ok(v))
        };
        // rms_norm divides by sqrt(mean + eps): eps must be positive, and
        // one or more would swamp any activation.
        let eps = f("attention.layer_norm_rms_epsilon", 1e-5, "in (0, 1)", |v| {
            v > 0.0 && v < 1.0
        })?;
        let rope_freq_base = f("rope.freq_base", 10000.0, "positive", |v| v > 0.0)?;
        // YaRN's correction dims take log(n_ctx_orig / (2 pi beta)).
        let yarn_beta_fast = f("rope.scaling.yarn_beta_fast", 32.0, "positive", |v| v > 0.0)?;
        let yarn_beta_slow = f("rope.scaling.yarn_beta_slow", 1.0, "positive", |v| v > 0.0)?;
        let rope_attn_factor = f("rope.scaling.attn_factor", 1.0, "positive", |v| v > 0.0)?;
        let yarn_log_mul = f(
            "rope.scaling.yarn_log_multiplier",
            0.0,
            "0 (none) or positive",
            |v| v >= 0.0,
        )?;
        // llama.cpp's deepseek2 loader cancels the 0.1 its converter puts
        // into the multiplier ([TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]).
        let yarn_log_mul = if a == "deepseek2" {
            yarn_log_mul / 0.1
        } else {
            yarn_log_mul
        };
        let expert_weights_scale = f("expert_weights_scale", 0.0, "0 (none) or positive", |v| {
            v >= 0.0
        })?;
        let head_dim_v = size(
            "attention.value_length",
            Some(head_dim),
            l::HEAD_DIM,
            "value head size",
        )?;
        let expert_gating = match md.opt(&key(a, "expert_gating_func"), Metadata::get_u32)? {
            None | Some(0) => None,
            Some(1) => Some(Scoring::Softmax),
            Some(2) => Some(Scoring::Sigmoid),
            Some(3) => Some(Scoring::SoftmaxWeight),
            Some(v) => {
                return Err(ModelError::BadHparam {
                    key: key(a, "expert_gating_func"),
                    reason: format!("{v} is not a gating longhaul knows (1 softmax, 2 sigmoid, 3 softmax over the chosen)"),
                })
            }
        };
        let rope_freq_base_swa = md
            .opt(&key(a, "rope.freq_base_swa"), Metadata::get_f32)?
            .map(|v| float_in(key(a, "rope.freq_base_swa"), v, "positive", v > 0.0))
            .transpose()?;
        let n_rot_swa = md
            .opt(&key(a, "rope.dimension_count_swa"), Metadata::get_u64)?
            .map(|v| {
                at_most(
                    key(a, "rope.dimension_count_swa"),
                    v,
                    l::HEAD_DIM,
                    "rotated dimensions",
                )
            })
            .transpose()?;
        let ssm = match md.opt(&key(a, "ssm.conv_kernel"), Metadata::get_u64)? {
            None => None,
            Some(_) => {
                let d_conv = size("ssm.conv_kernel", None, 64, "convolution taps")?;
                let d_inner = size("ssm.inner_size", None, l::N_EMBD, "linear-attention width")?;
                let head_dim = size("ssm.state_size", None, l::HEAD_DIM, "state head size")?;
                let n_v_heads = size("ssm.time_step_rank", None, l::N_HEAD, "value heads")?;
                let n_k_heads = size("ssm.group_count", None, l::N_HEAD, "key heads")?;
                let ok = d_conv >= 2
                    && head_dim > 0
                    && n_k_heads > 0
                    && n_v_heads % n_k_heads == 0
                    && d_inner == n_v_heads * head_dim;
                if !ok {
                    return Err(ModelError::BadHparam {
                        key: key(a, "ssm.*"),
                        reason: format!(
                            "conv kernel {d_conv}, inner size {d_inner}, state size {head_dim}, \
                             {n_v_heads} value heads, {n_k_heads} key heads: want a kernel of 2 or \
                             more and value heads of the state size, a multiple of the key heads"
                        ),
                    });
                }
                Some(Ssm {
                    d_conv,
                    d_inner,
                    head_dim,
                    n_v_heads,
                    n_k_heads,
                })
            }
        };
        let rk = key(a, "attention.recurrent_layers");
        let recurrent_layers: Vec<bool> = match (ssm, md.get(&rk)) {
            (None, _) => vec![false; n_layer],
            (Some(_), Some(crate::gguf::MetaValue::Array(_, v))) => {
                if v.len() < n_layer {
                    return Err(ModelError::BadHparam {
                        key: rk,
                        reason: format!("{} entries for {n_layer} layers", v.len()),
                    });
                }
                v.iter()
                    .take(n_layer)
                    .map(|x| match x {
                        crate::gguf::MetaValue::Bool(b) => *b,
                        x => x.as_i128().is_some_and(|n| n != 0),
                    })
                    .collect()
            }
            (Some(_), _) => {
                let every = size(
                    "full_attention_interval",
                    Some(4),
                    l::N_LAYER,
                    "full-attention interval",
                )?;
                let every = positive("full_attention_interval", every)?;
                (0..n_layer).map(|il| (il + 1) % every != 0).collect()
            }
        };
        let sk = key(a, "rope.dimension_sections");
        let rope_sections = match md.get(&sk) {
            Some(crate::gguf::MetaValue::Array(_, v)) => {
                let mut s = [0u32; 4];
                for (d, x) in s.iter_mut().zip(v) {
                    *d = x
                        .as_i128()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| ModelError::BadHparam {
                            key: sk.clone(),
                            reason: format!("{x:?} is not a section size"),
                        })?;
                }
                Some(s)
            }
            _ => None,
        };
        let n_layer_dense_lead = size(
            "leading_dense_block_count",
            Some(0),
            l::N_LAYER,
            "leading dense layers",
        )?;
        Ok(Hparams {
            rope_freq_base_swa,
            n_rot_swa,
            n_layer_dense_lead,
            n_expert_shared: size(
                "expert_shared_count",
                Some(0),
                l::N_EXPERT,
                "shared experts",
            )?,
            expert_weights_norm: md
                .opt(&key(a, "expert_weights_norm"), Metadata::get_bool)?
                .unwrap_or(false),
            expert_gating,
            head_dim_v,
            n_lora_q: size("attention.q_lora_rank", Some(0), l::N_FF, "q LoRA rank")?,
            n_lora_kv: size("attention.kv_lora_rank", Some(0), l::N_FF, "kv LoRA rank")?,
            head_dim_k_mla: size(
                "attention.key_length_mla",
                Some(0),
                l::HEAD_DIM,
                "MLA key head size",
            )?,
            head_dim_v_mla: size(
                "attention.value_length_mla",
                Some(0),
                l::HEAD_DIM,
                "MLA value head size",
            )?,
            n_nextn,
            mtp: false,
            ssm,
            recurrent_layers,
            rope_sections,
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_head,
            n_head_layer,
            n_head_kv,
            head_dim,
            n_rot,
            n_ff,
            eps,
            rope_freq_base,
            rope_freq_scale,
            rope_yarn: scaling.as_deref() == Some("yarn"),
            n_ctx_orig_yarn,
            yarn_beta_fast,
            yarn_beta_slow,
            rope_attn_factor,
            yarn_log_mul,
            n_expert,
            n_expert_used,
            // Mixtral-style llama files give the expert size as feed_forward_length.
            n_ff_exp: size(
                "expert_feed_forward_length",
                Some(n_ff),
                l::N_FF,
                "expert feed-forward width",
            )?,
            n_ff_shexp: size(
                "expert_shared_feed_forward_length",
                Some(0),
                l::N_FF,
                "shared-expert feed-forward width",
            )?,
            expert_weights_scale,
            n_expert_groups,
            n_group_used,
            n_swa,
            swa_layers,
            arch,
        })
    }

    /// NextN layers loaded: the first with [`Hparams::mtp`], else none.
    pub fn n_nextn_loaded(&self) -> usize {
        usize::from(self.mtp && self.n_nextn > 0)
    }

    /// True for the tensors of the NextN layers after the trunk that are
    /// not loaded (all of them, or all but the first with [`Hparams::mtp`]).
    pub fn is_skipped(&self, tensor: &str) -> bool {
        let first = self.n_layer + self.n_nextn_loaded();
        tensor
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|il| il >= first)
    }

    /// The model's rope with pairing `mode`, as llama.cpp's context sets it.
    pub fn rope(&self, mode: RopeMode) -> RopeParams {
        let (ext_factor, attn_factor) = self.yarn_factors();
        RopeParams {
            mode,
            n_rot: self.n_rot,
            freq_base: self.rope_freq_base,
            freq_scale: self.rope_freq_scale,
            n_ctx_orig: self.n_ctx_orig_yarn,
            ext_factor,
            attn_factor,
            beta_fast: self.yarn_beta_fast,
            beta_slow: self.yarn_beta_slow,
        }
    }

    /// The rope of sliding-window layers where a family gives them their
    /// own (Laguna): plain rope over `rope.dimension_count_swa` dims at
    /// `rope.freq_base_swa`, no YaRN, as llama.cpp's laguna graph sets it.
    pub fn rope_swa(&self, mode: RopeMode) -> RopeParams {
        RopeParams {
            mode,
            n_rot: self.n_rot_swa.unwrap_or(self.n_rot),
            freq_base: self.rope_freq_base_swa.unwrap_or(self.rope_freq_base),
            freq_scale: 1.0,
            n_ctx_orig: self.n_ctx_train as u32,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 0.0,
            beta_slow: 0.0,
        }
    }

    /// The router settings from metadata, with the architecture's scoring
    /// and renormalisation.
    pub fn routing(&self, scoring: Scoring, norm: bool) -> Routing {
        Routing {
            scoring,
            n_expert: self.n_expert,
            n_used: self.n_expert_used,
            norm,
            scale: self.expert_weights_scale,
            n_group: self.n_expert_groups,
            n_group_used: self.n_group_used,
        }
    }

    /// Whether layer `il` is recurrent (gated DeltaNet, no KV cache).
    pub fn is_recurrent(&self, il: usize) -> bool {
        self.recurrent_layers.get(il).copied().unwrap_or(false)
    }

    /// Layers with a KV cache (all but the recurrent ones).
    pub fn n_layer_kv(&self) -> usize {
        self.n_layer - self.recurrent_layers.iter().filter(|&&r| r).count()
    }

    /// Bytes of one sequence's recurrent state (f32), over every recurrent
    /// layer; 0 for attention-only models.
    pub fn recurrent_bytes(&self) -> u64 {
        let n = (self.n_layer - self.n_layer_kv()) as u64;
        self.ssm.map_or(0, |s| n * s.state_floats() as u64 * 4)
    }

    /// `(K, V)` values per position in each layer's KV cache: per-head keys
    /// and values, or for DeepSeek's absorbed MLA the latent keys alone,
    /// whose leading values are the values.
    pub fn kv_widths(&self) -> (usize, usize) {
        let k = self.n_head_kv * self.head_dim;
        if self.arch == "deepseek2" {
            (k, 0)
        } else {
            (k, self.n_head_kv * self.head_dim_v)
        }
    }

    /// `(ext_factor, attn_factor)` for rope, as llama.cpp's context derives them.
    pub fn yarn_factors(&self) -> (f32, f32) {
        let mut attn = 1.0f32;
        let ext = if self.rope_yarn { 1.0f32 } else { 0.0 };
        if ext != 0.0 {
            let factor = 1.0 / self.rope_freq_scale;
            let mscale = |scale: f32, m: f32| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            attn = if self.yarn_log_mul != 0.0 {
                // DeepSeek-V2 gives mscale as mscale_all_dim (llama.cpp's
                // context special-cases the architecture the same way).
                let m = if self.arch == "deepseek2" && self.yarn_log_mul != 1.0 {
                    self.yarn_log_mul
                } else {
                    1.0
                };
                mscale(factor, m) / mscale(factor, self.yarn_log_mul)
            } else {
                mscale(factor, 1.0)
            };
            attn *= 1.0 / (1.0 + 0.1 * factor.ln());
        }
        (ext, attn * self.rope_attn_factor)
    }
}
