//! The presets of [`SynthSpec`]: shapes of released models (or of their
//! layers, fewer of them) and small variants for tests.

use super::{LinearAttn, Mla, SynthArch, SynthSpec};
use crate::tensor::GgmlType;

/// Names of the presets [`SynthSpec::preset`] knows, for help and errors.
pub const PRESETS: [&str; 11] = [
    "demo",
    "tiny",
    "micro",
    "qwen3-30b-a3b",
    "gpt-oss-20b",
    "deepseek2-lite",
    "deepseek2-tiny",
    "glm45-air-scaled",
    "glm4moe-tiny",
    "qwen3next-80b-scaled",
    "qwen3next-tiny",
];

impl SynthSpec {
    /// The demo model: 8 layers of 64 experts (4 used), Q4_K experts, ~120 MB.
    pub fn demo() -> Self {
        Self {
            arch: SynthArch::Qwen3Moe,
            n_embd: 512,
            n_layer: 8,
            n_head: 8,
            n_head_kv: 2,
            head_dim: 64,
            n_expert: 64,
            n_expert_used: 4,
            n_ff_exp: 256,
            n_ctx_train: 4096,
            n_swa: 0,
            rope_dim: None,
            n_ff: 0,
            n_layer_dense_lead: 0,
            n_expert_shared: 0,
            mla: None,
            linear: None,
            expert_type: GgmlType::Q4_K,
            dense_type: GgmlType::Q8_0,
            seed: 0x1006a,
            router_skew: 0.0,
        }
    }

    /// Shaped like Qwen3-30B-A3B (48 layers, 128 experts, top-8, n_embd 2048,
    /// n_ff_exp 768, Q4_K): about 17 GB, for longhaul benchmarks.
    pub fn qwen3_30b_a3b() -> Self {
        Self {
            n_embd: 2048,
            n_layer: 48,
            n_head: 32,
            n_head_kv: 4,
            head_dim: 128,
            n_expert: 128,
            n_expert_used: 8,
            n_ff_exp: 768,
            n_ctx_train: 40960,
            expert_type: GgmlType::Q4_K,
            dense_type: GgmlType::Q4_K,
            seed: 30,
            ..Self::demo()
        }
    }

    /// Shaped like gpt-oss-20b (24 layers, 32 experts, top-4, n_embd and
    /// n_ff_exp 2880, 64 query and 8 KV heads of 64, a 128-token sliding
    /// window on even layers, MXFP4 experts, Q8_0 elsewhere): about 11 GB.
    /// The vocabulary is the synthetic byte-level one, not o200k.
    pub fn gpt_oss_20b() -> Self {
        Self {
            arch: SynthArch::GptOss,
            n_embd: 2880,
            n_layer: 24,
            n_head: 64,
            n_head_kv: 8,
            head_dim: 64,
            n_expert: 32,
            n_expert_used: 4,
            n_ff_exp: 2880,
            n_ctx_train: 131072,
            n_swa: 128,
            expert_type: GgmlType::MXFP4,
            dense_type: GgmlType::Q8_0,
            seed: 20,
            ..Self::demo()
        }
    }

    /// Shaped like DeepSeek-V2-Lite: 27 layers (the first dense, FFN 10944),
    /// n_embd 2048, 16 heads of latent attention (kv_lora_rank 512, no query
    /// compression, qk_nope 128 + qk_rope 64, v_head 128), 64 routed experts
    /// (top-6, softmax, weights not renormalised, scale 1) of n_ff_exp 1408
    /// plus 2 shared, YaRN (factor 40 over 4096, as the released config).
    /// Q4_K experts and attention (rows of 1408 and 128 fall back to Q5_0,
    /// as llama-quantize does): 9.2 GB (8.6 GiB). The vocabulary is the
    /// synthetic byte-level one.
    pub fn deepseek2_lite() -> Self {
        Self {
            arch: SynthArch::Deepseek2,
            n_embd: 2048,
            n_layer: 27,
            n_head: 16,
            n_head_kv: 1,
            head_dim: 128 + 64,
            n_expert: 64,
            n_expert_used: 6,
            n_ff_exp: 1408,
            n_ctx_train: 163840,
            rope_dim: Some(64),
            n_ff: 10944,
            n_layer_dense_lead: 1,
            n_expert_shared: 2,
            mla: Some(Mla {
                q_lora_rank: 0,
                kv_lora_rank: 512,
                v_head_dim: 128,
            }),
            expert_type: GgmlType::Q4_K,
            dense_type: GgmlType::Q4_K,
            seed: 16,
            ..Self::demo()
        }
    }

    /// deepseek2-lite's layout at the tiny preset's size (a few MB): 2
    /// layers (the first dense), n_embd 256, 4 latent heads (kv_lora_rank 64,
    /// qk_nope 32 + qk_rope 16, v_head 32), 8 experts (top-2) plus 2 shared.
    pub fn deepseek2_tiny() -> Self {
        Self {
            n_embd: 256,
            n_layer: 2,
            n_head: 4,
            head_dim: 32 + 16,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 256,
            n_ctx_train: 4096,
            rope_dim: Some(16),
            n_ff: 512,
            mla: Some(Mla {
                q_lora_rank: 0,
                kv_lora_rank: 64,
                v_head_dim: 32,
            }),
            dense_type: GgmlType::Q8_0,
            seed: 17,
            ..Self::deepseek2_lite()
        }
    }

    /// GLM-4.5-Air's layer shapes in 6 layers instead of 46 (no NextN
    /// layer): n_embd 4096, 96 query and 8 KV heads of 128 with q/k/v biases
    /// and half of each head rotated, the first layer dense (FFN 10944),
    /// then 128 routed experts (top-8, sigmoid with a selection bias,
    /// renormalised, scale 1) of n_ff_exp 1408 plus 1 shared. Q4_K experts
    /// and attention (rows of 1408 and 10944 fall back to Q5_0): about 7.2 GB.
    pub fn glm45_air_scaled() -> Self {
        Self {
            arch: SynthArch::Glm4Moe,
            n_embd: 4096,
            n_layer: 6,
            n_head: 96,
            n_head_kv: 8,
            head_dim: 128,
            n_expert: 128,
            n_expert_used: 8,
            n_ff_exp: 1408,
            n_ctx_train: 131072,
            rope_dim: Some(64),
            n_ff: 10944,
            n_layer_dense_lead: 1,
            n_expert_shared: 1,
            expert_type: GgmlType::Q4_K,
            dense_type: GgmlType::Q4_K,
            seed: 45,
            ..Self::demo()
        }
    }

    /// glm45-air-scaled's layout at the tiny preset's size: 2 layers (the
    /// first dense), n_embd 256, 6 query and 2 KV heads of 64 (32 rotated),
    /// 8 experts (top-2) plus 1 shared.
    pub fn glm4moe_tiny() -> Self {
        Self {
            n_embd: 256,
            n_layer: 2,
            n_head: 6,
            n_head_kv: 2,
            head_dim: 64,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 256,
            n_ctx_train: 4096,
            rope_dim: Some(32),
            n_ff: 512,
            dense_type: GgmlType::Q8_0,
            seed: 46,
            ..Self::glm45_air_scaled()
        }
    }

    /// Qwen3-Next-80B-A3B's layer shapes in 16 layers instead of 48 (no
    /// MTP layer): n_embd 2048; three of every four layers gated DeltaNet
    /// (16 key and 32 value heads of 128, a convolution of 4 taps), the
    /// fourth gated full attention (16 query and 2 KV heads of 256, a
    /// quarter of each head rotated, theta 1e7); every layer 512 routed
    /// experts (top-10, softmax, renormalised) of n_ff_exp 512 plus one
    /// shared expert of 512 behind a sigmoid gate. Q4_K experts and
    /// attention: about 14.9 GB (13.9 GiB). The vocabulary is the synthetic
    /// byte-level one.
    pub fn qwen3next_80b_scaled() -> Self {
        Self {
            arch: SynthArch::Qwen3Next,
            n_embd: 2048,
            n_layer: 16,
            n_head: 16,
            n_head_kv: 2,
            head_dim: 256,
            n_expert: 512,
            n_expert_used: 10,
            n_ff_exp: 512,
            n_ctx_train: 262144,
            rope_dim: Some(64),
            n_ff: 5120,
            n_expert_shared: 1,
            linear: Some(LinearAttn {
                n_k_heads: 16,
                n_v_heads: 32,
                head_dim: 128,
                d_conv: 4,
                full_attn_interval: 4,
            }),
            expert_type: GgmlType::Q4_K,
            dense_type: GgmlType::Q4_K,
            seed: 80,
            ..Self::demo()
        }
    }

    /// qwen3next-80b-scaled's layout at the tiny preset's size (a few MB):
    /// 4 layers (3 linear, 1 full), n_embd 256, linear attention of 2 key
    /// and 4 value heads of 64, full attention of 4 query and 2 KV heads of
    /// 64 (16 rotated), 8 experts (top-2) of 256 plus one shared.
    pub fn qwen3next_tiny() -> Self {
        Self {
            n_embd: 256,
            n_layer: 4,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 256,
            n_ctx_train: 4096,
            rope_dim: Some(16),
            n_ff: 512,
            linear: Some(LinearAttn {
                n_k_heads: 2,
                n_v_heads: 4,
                head_dim: 64,
                d_conv: 4,
                full_attn_interval: 4,
            }),
            dense_type: GgmlType::Q8_0,
            seed: 13,
            ..Self::qwen3next_80b_scaled()
        }
    }

    /// A preset by name: one of [`PRESETS`].
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "demo" => Some(Self::demo()),
            "tiny" => Some(Self::tiny()),
            "micro" => Some(Self::micro()),
            "qwen3-30b-a3b" => Some(Self::qwen3_30b_a3b()),
            "gpt-oss-20b" => Some(Self::gpt_oss_20b()),
            "deepseek2-lite" => Some(Self::deepseek2_lite()),
            "deepseek2-tiny" => Some(Self::deepseek2_tiny()),
            "glm45-air-scaled" => Some(Self::glm45_air_scaled()),
            "glm4moe-tiny" => Some(Self::glm4moe_tiny()),
            "qwen3next-80b-scaled" => Some(Self::qwen3next_80b_scaled()),
            "qwen3next-tiny" => Some(Self::qwen3next_tiny()),
            _ => None,
        }
    }

    /// A small model for tests (a few MB).
    pub fn tiny() -> Self {
        Self {
            n_embd: 256,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 256,
            seed: 7,
            ..Self::demo()
        }
    }

    /// The smallest useful model (about 60 KB, most of it the F32 embedding
    /// of the 259-token vocabulary): one layer of 4 experts (2 used),
    /// n_embd 32, Q8_0 everywhere. Seeds for fuzzing and tests of the load
    /// path; its rows of 32 suit every type with 32-element blocks.
    pub fn micro() -> Self {
        Self {
            n_embd: 32,
            n_layer: 1,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 16,
            n_expert: 4,
            n_expert_used: 2,
            n_ff_exp: 32,
            n_ctx_train: 64,
            expert_type: GgmlType::Q8_0,
            seed: 11,
            ..Self::demo()
        }
    }
}
