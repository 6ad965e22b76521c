//! What distinguishes the supported architectures. Each is a small table of
//! choices over one shared block builder (`block.rs`); hyperparameters come
//! from metadata.

use super::hparams::Gating;
use crate::backend::{Glu, RopeMode};

/// Architecture-specific choices of the shared transformer block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchSpec {
    /// GGUF `general.architecture` value.
    pub name: &'static str,
    pub rope: RopeMode,
    pub gating: Gating,
    /// Renormalise the chosen experts' weights to sum to one.
    pub norm_topk: bool,
    pub glu: Glu,
    /// Name of the pre-FFN norm tensor (`blk.N.<name>.weight`).
    pub ffn_norm: &'static str,
    /// Default sliding-window period (0: no sliding-window layers).
    pub swa_pattern: u32,
}

/// llama (dense such as SmolLM2, or Mixtral-style MoE when expert_count > 0).
pub const LLAMA: ArchSpec = ArchSpec {
    name: "llama",
    rope: RopeMode::Norm,
    gating: Gating::Softmax,
    norm_topk: true,
    glu: Glu::SwiGlu,
    ffn_norm: "ffn_norm",
    swa_pattern: 0,
};

/// Qwen2-MoE: shared expert behind a sigmoid gate, un-normalised top-k.
pub const QWEN2MOE: ArchSpec = ArchSpec {
    name: "qwen2moe",
    rope: RopeMode::Neox,
    gating: Gating::Softmax,
    norm_topk: false,
    glu: Glu::SwiGlu,
    ffn_norm: "ffn_norm",
    swa_pattern: 0,
};

/// Qwen3-MoE: QK-norm, normalised top-k.
pub const QWEN3MOE: ArchSpec = ArchSpec {
    name: "qwen3moe",
    rope: RopeMode::Neox,
    gating: Gating::Softmax,
    norm_topk: true,
    glu: Glu::SwiGlu,
    ffn_norm: "ffn_norm",
    swa_pattern: 0,
};

/// gpt-oss: sinks, alternating sliding-window layers, biases, clamped SwiGLU.
pub const GPT_OSS: ArchSpec = ArchSpec {
    name: "gpt-oss",
    rope: RopeMode::Neox,
    gating: Gating::SoftmaxWeight,
    norm_topk: false,
    glu: Glu::SwiGluOai {
        alpha: 1.702,
        limit: 7.0,
    },
    ffn_norm: "post_attention_norm",
    swa_pattern: 2,
};

/// Every supported architecture.
pub const SUPPORTED: [ArchSpec; 4] = [LLAMA, QWEN2MOE, QWEN3MOE, GPT_OSS];

/// The spec for `name`, if supported.
pub fn lookup(name: &str) -> Option<ArchSpec> {
    SUPPORTED.iter().copied().find(|a| a.name == name)
}

/// Names of the supported architectures, for error messages.
pub fn supported_names() -> String {
    SUPPORTED
        .iter()
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}
