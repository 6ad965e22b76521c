//! GGUF files: reader (mmap + positional reads, split shards), writer, metadata.
//!
//! This layer knows files, shards, metadata and where each tensor's bytes live
//! (`shard`, `offset`, `len`). It never interprets tensor data: it does not
//! import `quant` or `model`.
//!
//! Layout of a GGUF v2/v3 file (all integers little-endian; see llama.cpp's
//! `ggml/src/gguf.cpp`):
//!
//! ```text
//! "GGUF"  u32 version  i64 n_tensors  i64 n_kv
//! n_kv x      { string key, u32 type, value }          string = u64 len + bytes
//!                                                      array  = u32 type + u64 n + n values
//! n_tensors x { string name, u32 n_dims (<= 4), u64 ne[n_dims], u32 ggml type,
//!               u64 offset relative to the data section }
//! padding to `general.alignment` (default 32), then the data section; each
//! tensor starts at a multiple of the alignment.
//! ```
//!
//! - [`parse_header`] is a pure parser over the bytes of one file.
//! - [`Model`] opens a single file or the first shard of a split model
//!   (`NAME-00001-of-0000N.gguf`, as `llama-gguf-split` writes it).
//! - [`Writer`] builds GGUF v3 files, whole or split.
//!
//! Nothing here panics on input: every malformed file yields a [`GgufError`].

pub mod identity;
mod metadata;
mod model;
mod reader;
pub mod split;
mod writer;

use std::path::PathBuf;

pub use metadata::{MetaType, MetaValue, Metadata};
pub use model::{Model, ReadFault, Shard, DIRECT_ALIGN, DIRECT_WHOLE};
pub use reader::{parse_header, Header};
pub use writer::{partial_path, TensorSource, Writer};

use crate::tensor::GgmlType;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The version [`Writer`] writes.
pub const GGUF_VERSION: u32 = 3;
/// Data alignment when `general.alignment` is absent.
pub const GGUF_DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key holding the data alignment (a u32 power of two).
pub const KEY_ALIGNMENT: &str = "general.alignment";
/// `GGML_MAX_DIMS`: a tensor has at most this many dimensions.
pub const GGML_MAX_DIMS: usize = 4;
/// `GGML_MAX_NAME`: llama.cpp rejects tensor names of this many bytes or more.
pub const GGML_MAX_NAME: usize = 64;

/// Where one tensor's bytes live. Produced by the reader; never interprets the data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.ffn_gate_exps.weight`.
    pub name: String,
    /// Shape in ggml order: `dims[0]` is `ne0`, the row length (contiguous elements).
    pub dims: Vec<u64>,
    /// Element / block type.
    pub ty: GgmlType,
    /// Index into [`Model::shards`] of the file holding the data.
    pub shard: usize,
    /// Absolute byte offset of the data in that shard's file.
    pub offset: u64,
    /// Data size in bytes (without alignment padding).
    pub len: u64,
}

impl TensorInfo {
    /// Number of elements (product of `dims`; 1 for a zero-dimensional tensor).
    /// Saturates instead of overflowing; the reader rejects shapes that overflow.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Elements per row: `dims[0]` (`ne0`), or 1 for a zero-dimensional tensor.
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of `dims[1..]`.
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(d))
    }
}

/// Comma-separated names of every ggml type this crate knows, for error messages.
fn supported_types() -> String {
    GgmlType::ALL
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Errors of the file layer. Every variant says what was wrong and, where
/// there is one, what the user can do about it.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// A shard changed (size, inode or contents) after it was opened.
    #[error("model file {path} changed while in use ({what}); longhaul stopped using it so that no output mixes two files: put the original back, or restart with the file you mean to use")]
    FileChanged { path: PathBuf, what: String },
    /// A required metadata key is absent.
    #[error("GGUF metadata key `{key}` is missing; the file was not written for this architecture or is incomplete")]
    MissingKey { key: String },
    /// A metadata key has a type the caller cannot use.
    #[error("GGUF metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    /// An operating-system error on a file.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An error while parsing one file of a model; `source` says what was wrong.
    /// [`GgufError::root`] strips this context.
    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<GgufError>,
    },
    /// The data ends before a field that should be there.
    #[error("the file ends before {what} (needed at byte {offset}); it is truncated (an interrupted download?) or not a GGUF file")]
    Truncated { what: String, offset: u64 },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: it starts with {found:02x?} instead of \"GGUF\"")]
    BadMagic { found: Vec<u8> },
    /// The version field says big-endian, a version this crate does not read, or 0.
    #[error("GGUF version {version} is not supported; this reader supports versions 2 and 3 (re-convert the model with a current llama.cpp `convert_hf_to_gguf.py`)")]
    UnsupportedVersion { version: u32 },
    /// The version field reads as a byte-swapped small number.
    #[error("this GGUF file is big-endian (its version field reads {version:#010x}); only little-endian GGUF files are supported, re-convert the model without --bigendian")]
    BigEndian { version: u32 },
    /// A count or length cannot fit in what is left of the file: corrupt data,
    /// rejected before allocating.
    #[error("{what} at byte {offset} is {count}, but only {remaining} bytes of the file remain; the file is corrupt or truncated")]
    ImplausibleCount {
        what: String,
        count: u64,
        offset: u64,
        remaining: u64,
    },
    /// A metadata key is empty.
    #[error("metadata key #{index} is empty; the file is corrupt")]
    EmptyKey { index: u64 },
    /// A metadata key appears twice.
    #[error("metadata key `{key}` appears twice; the file is corrupt")]
    DuplicateKey { key: String },
    /// A metadata value has a type id outside GGUF's 0..=12.
    #[error("metadata key `{key}` has unknown GGUF value type {id} (known: 0..=12); the file is corrupt or from a newer GGUF revision")]
    UnknownMetaType { key: String, id: u32 },
    /// Arrays nested deeper than this reader allows.
    #[error("metadata key `{key}` nests arrays more than {max} deep; the file is corrupt")]
    NestingTooDeep { key: String, max: usize },
    /// A key or tensor name that is not UTF-8.
    #[error("{what} at byte {offset} is not valid UTF-8; the file is corrupt")]
    InvalidUtf8 { what: String, offset: u64 },
    /// `general.alignment` is zero or not a power of two.
    #[error("`general.alignment` is {alignment}; it must be a nonzero power of two")]
    BadAlignment { alignment: u64 },
    /// A tensor has more than [`GGML_MAX_DIMS`] dimensions.
    #[error("tensor `{name}` has {n_dims} dimensions; GGUF allows at most 4")]
    TooManyDims { name: String, n_dims: u64 },
    /// The element count or byte size of a tensor does not fit in 63 bits.
    #[error("tensor `{name}`: the product of its dimensions (or its size in bytes) overflows; the file is corrupt")]
    DimOverflow { name: String },
    /// A tensor type id this crate does not know.
    #[error("tensor `{name}` has ggml type id {id}, which this build does not support (supported: {}); re-quantize the model to a supported type", supported_types())]
    UnknownType { name: String, id: u32 },
    /// A row length that is not a whole number of blocks of the tensor's type.
    #[error("tensor `{name}` of type {ty} has rows of {row_len} elements, which is not a multiple of the type's block size {block_size}")]
    BadBlockMultiple {
        name: String,
        ty: GgmlType,
        row_len: u64,
        block_size: usize,
    },
    /// A tensor offset that is not a multiple of the file's alignment.
    #[error("tensor `{name}` starts at data offset {offset}, which is not a multiple of the alignment {alignment}; the file is corrupt")]
    Misaligned {
        name: String,
        offset: u64,
        alignment: u64,
    },
    /// A tensor's bytes extend past the end of its file.
    #[error("tensor `{name}` occupies bytes {offset}..{offset}+{len} but the file has only {file_len} bytes; it is truncated (an interrupted download?) or corrupt")]
    TensorOutOfBounds {
        name: String,
        offset: u64,
        len: u64,
        file_len: u64,
    },
    /// A tensor's bytes run into those of the tensor after it in the table
    /// (e.g. its type was changed to a larger one without moving the data).
    #[error("tensor `{name}` occupies bytes {offset}..{} but the next tensor `{next}` starts at byte {next_offset}: their data overlap; the file is corrupt (re-download or re-convert it)", offset.saturating_add(*len))]
    TensorOverlap {
        name: String,
        offset: u64,
        len: u64,
        next: String,
        next_offset: u64,
    },
    /// A tensor whose data starts before that of the tensor before it in
    /// the table (GGUF stores tensor data in table order).
    #[error("tensor `{name}` starts at byte {offset}, before `{previous}` (byte {previous_offset}) which comes first in the tensor table; tensor data must be stored in table order, the file is corrupt (re-download or re-convert it)")]
    TensorOutOfOrder {
        name: String,
        offset: u64,
        previous: String,
        previous_offset: u64,
    },
    /// The same tensor name appears twice (in one file or across shards).
    #[error("tensor `{name}` appears more than once; the file is corrupt, or shards of different models were mixed")]
    DuplicateTensor { name: String },
    /// A tensor the caller requires is not in the model.
    #[error("tensor `{name}` is not in the model; the file was converted for another architecture or is incomplete")]
    MissingTensor { name: String },
    /// A shard of a split model is not on disk.
    #[error("shard {} of {count} is missing: {} does not exist; download every part of the split model into the same folder", index + 1, path.display())]
    ShardMissing {
        path: PathBuf,
        /// 0-based shard number (`split.no`).
        index: usize,
        count: usize,
    },
    /// A shard that does not belong with the others.
    #[error("{}: {reason}", path.display())]
    ShardMismatch { path: PathBuf, reason: String },
    /// A positional read outside a shard, or of a shard that does not exist.
    #[error("read of {len} bytes at offset {offset} in shard {shard} is out of range (shard length {file_len}, {n_shards} shards)")]
    ReadOutOfRange {
        shard: usize,
        offset: u64,
        len: u64,
        file_len: u64,
        n_shards: usize,
    },
    /// Tensor data handed to the writer has the wrong size.
    #[error("tensor `{name}` has {got} bytes of data, but its shape and type need {expected}")]
    DataSize {
        name: String,
        expected: u64,
        got: u64,
    },
    /// The folder a file is to be written into does not exist.
    #[error("cannot write {}: the folder {} does not exist; create it first or choose another path", path.display(), dir.display())]
    MissingFolder { path: PathBuf, dir: PathBuf },
    /// A path names a directory where a GGUF file was expected.
    #[error("{} is a directory; {DIRECTORY_FIX}", path.display())]
    IsDirectory { path: PathBuf },
    /// A writer argument that cannot produce a valid file.
    #[error("cannot write GGUF: {reason}")]
    InvalidArgument { reason: String },
}

/// What to do instead of naming a directory as a model.
const DIRECTORY_FIX: &str =
    "pass the .gguf file itself (for a split model, its first shard NAME-00001-of-0000N.gguf)";

impl GgufError {
    /// The error without [`GgufError::InFile`] context (the variant to match on).
    pub fn root(&self) -> &GgufError {
        match self {
            GgufError::InFile { source, .. } => source.root(),
            e => e,
        }
    }

    /// What went wrong with the file at `path`, without repeating the path
    /// when this error starts with it (for messages that name it already).
    pub fn cause_in(&self, path: &std::path::Path) -> String {
        match self {
            GgufError::InFile { path: p, source } if p == path => source.to_string(),
            GgufError::Io { path: p, source } if p == path => source.to_string(),
            GgufError::IsDirectory { path: p } if p == path => {
                format!("it is a directory; {DIRECTORY_FIX}")
            }
            e => e.to_string(),
        }
    }

    /// Adds the path of the file being parsed (not to errors that already name one).
    pub(crate) fn in_file(self, path: &std::path::Path) -> GgufError {
        match self {
            e @ (GgufError::Io { .. }
            | GgufError::InFile { .. }
            | GgufError::IsDirectory { .. }
            | GgufError::ShardMissing { .. }
            | GgufError::ShardMismatch { .. }) => e,
            e => GgufError::InFile {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        }
    }
}
