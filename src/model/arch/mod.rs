//! The supported architectures, one file per family. Each file declares its
//! tensors (required, optional, never) and builds a layer from the shared
//! blocks in [`super::blocks`]; every hyperparameter comes from metadata.

mod deepseek2;
mod glm4moe;
mod gpt_oss;
mod laguna;
mod llama;
mod olmoe;
mod qwen2moe;
mod qwen3moe;
mod qwen3next;

use super::blocks::{Layer, Loader};
use super::hparams::SwaPattern;
use super::ModelError;
use crate::backend::Backend;

/// Which family's file builds the layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Llama,
    Qwen2Moe,
    Qwen3Moe,
    GptOss,
    Olmoe,
    Glm4Moe,
    Deepseek2,
    Laguna,
    Qwen3Next,
    Qwen35Moe,
}

/// An architecture: its GGUF name and what is read before any tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchSpec {
    /// GGUF `general.architecture` value.
    pub name: &'static str,
    pub family: Family,
    /// Default sliding-window layer pattern.
    pub swa: SwaPattern,
}

pub const LLAMA: ArchSpec = llama::SPEC;
pub const QWEN2MOE: ArchSpec = qwen2moe::SPEC;
pub const QWEN3MOE: ArchSpec = qwen3moe::SPEC;
pub const GPT_OSS: ArchSpec = gpt_oss::SPEC;
pub const OLMOE: ArchSpec = olmoe::SPEC;
pub const GLM4MOE: ArchSpec = glm4moe::SPEC;
pub const DEEPSEEK2: ArchSpec = deepseek2::SPEC;
pub const LAGUNA: ArchSpec = laguna::SPEC;
pub const QWEN3NEXT: ArchSpec = qwen3next::QWEN3NEXT;
pub const QWEN35MOE: ArchSpec = qwen3next::QWEN35MOE;

/// Every supported architecture.
pub const SUPPORTED: [ArchSpec; 10] = [
    LLAMA, QWEN2MOE, QWEN3MOE, GPT_OSS, OLMOE, GLM4MOE, DEEPSEEK2, LAGUNA, QWEN3NEXT, QWEN35MOE,
];

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

/// The decoder layer of NextN layer `il`, for the families whose MTP head
/// longhaul runs (`None` for the others).
pub(super) fn load_nextn_layer<B: Backend>(
    spec: &ArchSpec,
    l: &Loader<B>,
    il: usize,
) -> Option<Result<Layer<B::Weight>, ModelError>> {
    match spec.family {
        Family::Glm4Moe => Some(glm4moe::layer(l, il)),
        Family::Deepseek2 => Some(deepseek2::layer(l, il)),
        // Qwen3.5's is a full-attention layer after the hybrid trunk; the
        // `il` past the trunk is not in the recurrent layer list.
        Family::Qwen35Moe => Some(qwen3next::layer(l, il, true)),
        _ => None,
    }
}

/// Layer `il` of a `spec` model, as its family's file declares it.
pub(super) fn load_layer<B: Backend>(
    spec: &ArchSpec,
    l: &Loader<B>,
    il: usize,
) -> Result<Layer<B::Weight>, ModelError> {
    match spec.family {
        Family::Llama => llama::layer(l, il),
        Family::Qwen2Moe => qwen2moe::layer(l, il),
        Family::Qwen3Moe => qwen3moe::layer(l, il),
        Family::GptOss => gpt_oss::layer(l, il),
        Family::Olmoe => olmoe::layer(l, il),
        Family::Glm4Moe => glm4moe::layer(l, il),
        Family::Deepseek2 => deepseek2::layer(l, il),
        Family::Laguna => laguna::layer(l, il),
        Family::Qwen3Next => qwen3next::layer(l, il, false),
        Family::Qwen35Moe => qwen3next::layer(l, il, true),
    }
}
