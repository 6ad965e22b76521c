//! Hyperparameters read from GGUF metadata (`{arch}.*` keys), never hard-coded.

use super::ModelError;
use crate::gguf::Metadata;

/// How the router's logits become expert weights (llama.cpp's
/// `llama_expert_gating_func_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// softmax over all experts, then top-k of the probabilities.
    Softmax,
    /// top-k of the raw logits, then softmax over the chosen ones (gpt-oss).
    SoftmaxWeight,
}

/// Model hyperparameters. Names follow llama.cpp (`n_embd`, `n_head_kv`,
/// `n_ff_exp`, `n_expert_used`, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct Hparams {
    pub arch: String,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
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
    /// Sliding-window size and which layers use it.
    pub n_swa: u32,
    pub swa_layers: Vec<bool>,
}

fn key(arch: &str, k: &str) -> String {
    format!("{arch}.{k}")
}

impl Hparams {
    /// Reads the hyperparameters of architecture `arch`. `swa_pattern` is the
    /// architecture's default sliding-window period (0: no sliding window).
    pub fn from_metadata(
        md: &Metadata,
        n_vocab: usize,
        swa_pattern: u32,
    ) -> Result<Self, ModelError> {
        let arch = md.architecture()?.to_string();
        let a = arch.as_str();
        let u = |k: &str| -> Result<usize, ModelError> { Ok(md.get_u64(&key(a, k))? as usize) };
        let opt_u = |k: &str, d: usize| -> Result<usize, ModelError> {
            Ok(md
                .opt(&key(a, k), Metadata::get_u64)?
                .map(|v| v as usize)
                .unwrap_or(d))
        };
        let opt_f = |k: &str, d: f32| -> Result<f32, ModelError> {
            Ok(md.opt(&key(a, k), Metadata::get_f32)?.unwrap_or(d))
        };

        let n_embd = u("embedding_length")?;
        let n_layer = u("block_count")?;
        let n_head = u("attention.head_count")?;
        if n_head == 0 || n_embd == 0 || n_layer == 0 {
            return Err(ModelError::BadHparam {
                key: key(a, "attention.head_count"),
                reason: "must be positive".into(),
            });
        }
        let n_head_kv = opt_u("attention.head_count_kv", n_head)?;
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ModelError::BadHparam {
                key: key(a, "attention.head_count_kv"),
                reason: format!("{n_head_kv} does not divide {n_head} heads"),
            });
        }
        let head_dim = opt_u("attention.key_length", n_embd / n_head)?;
        let n_rot = opt_u("rope.dimension_count", head_dim)?;
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::BadHparam {
                key: key(a, "rope.dimension_count"),
                reason: format!("{n_rot} for heads of {head_dim}"),
            });
        }
        let n_ctx_train = opt_u("context_length", 4096)?;
        let scaling = md.opt(&key(a, "rope.scaling.type"), |m, k| {
            m.get_str(k).map(str::to_string)
        })?;
        let factor = opt_f("rope.scaling.factor", 0.0)?;
        let rope_freq_scale = if factor == 0.0 || scaling.as_deref() == Some("none") {
            1.0
        } else {
            1.0 / factor
        };
        let n_expert = opt_u("expert_count", 0)?;
        let n_expert_used = opt_u("expert_used_count", 0)?;
        if n_expert > 0 && (n_expert_used == 0 || n_expert_used > n_expert) {
            return Err(ModelError::BadHparam {
                key: key(a, "expert_used_count"),
                reason: format!("{n_expert_used} of {n_expert} experts"),
            });
        }
        let n_swa = opt_u("attention.sliding_window", 0)? as u32;
        let pattern = opt_u("attention.sliding_window_pattern", swa_pattern as usize)? as u32;
        let swa_layers = (0..n_layer as u32)
            .map(|il| n_swa > 0 && swa_pattern > 0 && (pattern == 0 || il % pattern < pattern - 1))
            .collect();
        let n_ff = opt_u("feed_forward_length", 0)?;
        Ok(Hparams {
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            n_ff,
            eps: opt_f("attention.layer_norm_rms_epsilon", 1e-5)?,
            rope_freq_base: opt_f("rope.freq_base", 10000.0)?,
            rope_freq_scale,
            rope_yarn: scaling.as_deref() == Some("yarn"),
            n_ctx_orig_yarn: opt_u("rope.scaling.original_context_length", n_ctx_train)? as u32,
            yarn_beta_fast: opt_f("rope.scaling.yarn_beta_fast", 32.0)?,
            yarn_beta_slow: opt_f("rope.scaling.yarn_beta_slow", 1.0)?,
            rope_attn_factor: opt_f("rope.scaling.attn_factor", 1.0)?,
            yarn_log_mul: opt_f("rope.scaling.yarn_log_multiplier", 0.0)?,
            n_expert,
            n_expert_used,
            // Mixtral-style llama files give the expert size as feed_forward_length.
            n_ff_exp: opt_u("expert_feed_forward_length", n_ff)?,
            n_ff_shexp: opt_u("expert_shared_feed_forward_length", 0)?,
            expert_weights_scale: opt_f("expert_weights_scale", 0.0)?,
            n_swa,
            swa_layers,
            arch,
        })
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
                mscale(factor, 1.0) / mscale(factor, self.yarn_log_mul)
            } else {
                mscale(factor, 1.0)
            };
            attn *= 1.0 / (1.0 + 0.1 * factor.ln());
        }
        (ext, attn * self.rope_attn_factor)
    }
}
