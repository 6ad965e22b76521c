//! GGUF files: reader (mmap + positional reads, split shards), writer, metadata.
//! This layer knows where each tensor's bytes live; it never interprets them.

mod metadata;
pub use metadata::{MetaType, MetaValue, Metadata};

/// Errors of the file layer.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("GGUF metadata key `{key}` is missing; the file was not written for this architecture or is incomplete")]
    MissingKey { key: String },
    #[error("GGUF metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
}
