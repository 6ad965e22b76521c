//! [`Writer`]: builds GGUF v3 files, whole or split the way `llama-gguf-split`
//! splits them, byte-compatible with llama.cpp's `gguf_write_to_file`: each
//! tensor's data starts at a multiple of `general.alignment` and is padded to
//! the next multiple.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::reader::{alignment_of, tensor_bytes, MAX_ARRAY_DEPTH};
use super::split::{
    split_path, writer_prefix, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT,
};
use super::{
    GgufError, MetaValue, Metadata, GGML_MAX_DIMS, GGML_MAX_NAME, GGUF_MAGIC, GGUF_VERSION,
    KEY_ALIGNMENT,
};
use crate::tensor::GgmlType;

/// Produces a tensor's bytes when the writer reaches it.
pub type TensorSource = std::sync::Arc<dyn Fn() -> Result<Vec<u8>, GgufError> + Send + Sync>;

/// A tensor's bytes: in memory, or made on demand while writing (so files
/// larger than memory can be written).
#[derive(Clone)]
enum Data {
    Bytes(Vec<u8>),
    Lazy { len: u64, source: TensorSource },
}

impl Data {
    fn len(&self) -> u64 {
        match self {
            Data::Bytes(b) => b.len() as u64,
            Data::Lazy { len, .. } => *len,
        }
    }
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Data::Bytes(b) => write!(f, "Bytes({})", b.len()),
            Data::Lazy { len, .. } => write!(f, "Lazy({len})"),
        }
    }
}

/// One tensor waiting to be written.
#[derive(Clone, Debug)]
struct Pending {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Data,
}

/// Builds GGUF v3 files from metadata and tensors held in memory.
///
/// ```no_run
/// use longhaul::gguf::{MetaValue, Writer};
/// use longhaul::tensor::GgmlType;
/// let mut w = Writer::new();
/// w.set("general.architecture", MetaValue::String("llama".into()));
/// w.add_tensor("output_norm.weight", &[4], GgmlType::F32, vec![0; 16])?;
/// w.write("tiny.gguf")?;
/// # Ok::<(), longhaul::gguf::GgufError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Writer {
    metadata: Metadata,
    tensors: Vec<Pending>,
    names: HashSet<String>,
}

impl Writer {
    /// An empty writer: no metadata, no tensors.
    pub fn new() -> Self {
        Self::default()
    }

    /// The metadata to write (in this order).
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.metadata
    }

    /// The metadata to write.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Name, shape (ggml order) and type of each tensor, in file order;
    /// makes no tensor data.
    pub fn tensor_shapes(&self) -> impl Iterator<Item = (&str, &[u64], GgmlType)> {
        self.tensors
            .iter()
            .map(|t| (t.name.as_str(), t.dims.as_slice(), t.ty))
    }

    /// Keeps only the tensors whose name `keep` accepts (in their order).
    pub fn retain_tensors(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.tensors.retain(|t| keep(&t.name));
        self.names = self.tensors.iter().map(|t| t.name.clone()).collect();
    }

    /// Sets one metadata key, replacing an earlier value in place.
    pub fn set(&mut self, key: &str, v: MetaValue) {
        self.metadata.set(key, v);
    }

    /// Adds a tensor of shape `dims` (ggml order: `dims[0]` is the row length)
    /// whose bytes are `data`. Checks the shape (1 to 4 dimensions, whole
    /// blocks per row, no overflow), that `data` has exactly
    /// `row_bytes(dims[0]) * rows` bytes, and that the name is new and shorter
    /// than llama.cpp's 64-byte limit.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<(), GgufError> {
        let len = data.len() as u64;
        self.push(name, dims, ty, len, Data::Bytes(data))
    }

    /// Adds a tensor whose bytes `source` makes when the file is written
    /// (checked against the shape then); for models larger than memory.
    pub fn add_tensor_lazy(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        source: TensorSource,
    ) -> Result<(), GgufError> {
        let len = tensor_bytes(name, dims, ty)?;
        self.push(name, dims, ty, len, Data::Lazy { len, source })
    }

    fn push(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        len: u64,
        data: Data,
    ) -> Result<(), GgufError> {
        if name.len() >= GGML_MAX_NAME {
            return Err(GgufError::InvalidArgument {
                reason: format!(
                    "tensor name `{name}` is {} bytes; llama.cpp allows at most {}",
                    name.len(),
                    GGML_MAX_NAME - 1
                ),
            });
        }
        if dims.is_empty() {
            return Err(GgufError::InvalidArgument {
                reason: format!("tensor `{name}` has no dimensions; use [1] for a scalar"),
            });
        }
        if dims.len() > GGML_MAX_DIMS {
            return Err(GgufError::TooManyDims {
                name: name.into(),
                n_dims: dims.len() as u64,
            });
        }
        let expected = tensor_bytes(name, dims, ty)?;
        if len != expected {
            return Err(GgufError::DataSize {
                name: name.into(),
                expected,
                got: len,
            });
        }
        if !self.names.insert(name.to_string()) {
            return Err(GgufError::DuplicateTensor { name: name.into() });
        }
        self.tensors.push(Pending {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(())
    }

    /// Writes one GGUF v3 file holding every key and tensor, aligned to
    /// `general.alignment` (default 32).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let tensors: Vec<&Pending> = self.tensors.iter().collect();
        write_file(path.as_ref(), &self.metadata, &tensors, &|_, _| {})
    }

    /// [`Writer::write`], calling `progress(bytes written, total)` after each tensor.
    pub fn write_with_progress(
        &self,
        path: impl AsRef<Path>,
        progress: &dyn Fn(u64, u64),
    ) -> Result<(), GgufError> {
        let tensors: Vec<&Pending> = self.tensors.iter().collect();
        write_file(path.as_ref(), &self.metadata, &tensors, progress)
    }

    /// The paths [`Writer::write_split`] writes for these arguments (empty
    /// when `max_tensors_per_shard` is 0).
    pub fn split_paths(
        &self,
        first_path: impl AsRef<Path>,
        max_tensors_per_shard: usize,
    ) -> Vec<PathBuf> {
        if max_tensors_per_shard == 0 {
            return Vec::new();
        }
        let count = self.tensors.len().div_ceil(max_tensors_per_shard).max(1);
        let prefix = writer_prefix(first_path.as_ref());
        (0..count).map(|i| split_path(&prefix, i, count)).collect()
    }

    /// Writes the model as `PREFIX-00001-of-0000N.gguf` ... with at most
    /// `max_tensors_per_shard` tensors per file, as `llama-gguf-split --split
    /// --split-max-tensors` does: the first shard holds every metadata key,
    /// the others only `split.*` (and `general.alignment` when it is not the
    /// default). Every shard gets `split.no` (u16, 0-based), `split.count`
    /// (u16) and `split.tensors.count` (i32). `first_path` may be the prefix,
    /// `PREFIX.gguf` or the first shard's name. Returns the paths written.
    pub fn write_split(
        &self,
        first_path: impl AsRef<Path>,
        max_tensors_per_shard: usize,
    ) -> Result<Vec<PathBuf>, GgufError> {
        if max_tensors_per_shard == 0 {
            return Err(GgufError::InvalidArgument {
                reason: "max_tensors_per_shard must be at least 1".into(),
            });
        }
        let n = self.tensors.len();
        let count = n.div_ceil(max_tensors_per_shard).max(1);
        let (Ok(count16), Ok(n32)) = (u16::try_from(count), i32::try_from(n)) else {
            return Err(GgufError::InvalidArgument {
                reason: format!(
                    "{n} tensors in {count} shards exceed the split format's limits (65535 shards, 2^31-1 tensors)"
                ),
            });
        };
        let prefix = writer_prefix(first_path.as_ref());
        let mut paths = Vec::with_capacity(count);
        for i in 0..count {
            let mut m = if i == 0 {
                self.metadata.clone()
            } else {
                let mut m = Metadata::new();
                if let Some(a) = self.metadata.get(KEY_ALIGNMENT) {
                    m.set(KEY_ALIGNMENT, a.clone());
                }
                m
            };
            m.set(KEY_SPLIT_NO, MetaValue::U16(i as u16));
            m.set(KEY_SPLIT_COUNT, MetaValue::U16(count16));
            m.set(KEY_SPLIT_TENSORS_COUNT, MetaValue::I32(n32));
            let start = (i * max_tensors_per_shard).min(n);
            let end = (start + max_tensors_per_shard).min(n);
            let tensors: Vec<&Pending> = self.tensors[start..end].iter().collect();
            let path = split_path(&prefix, i, count);
            write_file(&path, &m, &tensors, &|_, _| {})?;
            paths.push(path);
        }
        Ok(paths)
    }
}

/// Writes one file at `path`, through `NAME.partial` in the same folder
/// renamed to `NAME` once complete: an interrupted write (Ctrl-C, a full
/// disk) never leaves a truncated file under the final name, and a failed
/// one removes its partial file.
fn write_file(
    path: &Path,
    metadata: &Metadata,
    tensors: &[&Pending],
    progress: &dyn Fn(u64, u64),
) -> Result<(), GgufError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(GgufError::MissingFolder {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
        });
    }
    let partial = partial_path(path);
    let res = write_contents(path, &partial, metadata, tensors, progress).and_then(|()| {
        std::fs::rename(&partial, path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })
    });
    if res.is_err() {
        // Best effort: the error that matters is the write's.
        let _ = std::fs::remove_file(&partial);
    }
    res
}

/// `DIR/NAME.partial` for `DIR/NAME`: where [`write_file`] writes first.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

/// Writes the header, tensor table, padding and aligned tensor data of the
/// file `path` into `partial` (errors name `path`).
fn write_contents(
    path: &Path,
    partial: &Path,
    metadata: &Metadata,
    tensors: &[&Pending],
    progress: &dyn Fn(u64, u64),
) -> Result<(), GgufError> {
    let alignment = alignment_of(metadata)?;
    let pad = |n: u64| (n.next_multiple_of(alignment) - n) as usize;

    let mut h = Vec::new();
    h.extend(GGUF_MAGIC);
    h.extend(GGUF_VERSION.to_le_bytes());
    h.extend((tensors.len() as u64).to_le_bytes());
    h.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata.iter() {
        put_str(&mut h, key);
        if key == KEY_ALIGNMENT {
            // llama.cpp requires the u32 type for this key.
            put_value(&mut h, key, &MetaValue::U32(alignment as u32), true, 0)?;
        } else {
            put_value(&mut h, key, value, true, 0)?;
        }
    }
    let mut offset = 0u64;
    for t in tensors {
        put_str(&mut h, &t.name);
        h.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            h.extend(d.to_le_bytes());
        }
        h.extend((t.ty as u32).to_le_bytes());
        h.extend(offset.to_le_bytes());
        offset += t.data.len();
        offset += pad(offset) as u64;
    }
    let header_pad = pad(h.len() as u64);
    h.resize(h.len() + header_pad, 0);

    let io = |source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut w = BufWriter::new(File::create(partial).map_err(io)?);
    w.write_all(&h).map_err(io)?;
    let total: u64 = tensors.iter().map(|t| t.data.len()).sum();
    let mut done = 0u64;
    for t in tensors {
        match &t.data {
            Data::Bytes(b) => w.write_all(b).map_err(io)?,
            Data::Lazy { len, source } => {
                let b = source()?;
                if b.len() as u64 != *len {
                    return Err(GgufError::DataSize {
                        name: t.name.clone(),
                        expected: *len,
                        got: b.len() as u64,
                    });
                }
                w.write_all(&b).map_err(io)?;
            }
        }
        done += t.data.len();
        progress(done, total);
        let n = pad(t.data.len()) as u64;
        std::io::copy(&mut std::io::repeat(0).take(n), &mut w).map_err(io)?;
    }
    w.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// Encodes `v`; `with_type` writes its type id first (not for array elements).
fn put_value(
    out: &mut Vec<u8>,
    key: &str,
    v: &MetaValue,
    with_type: bool,
    depth: usize,
) -> Result<(), GgufError> {
    if with_type {
        out.extend((v.meta_type() as u32).to_le_bytes());
    }
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend(x.to_le_bytes()),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
        MetaValue::Array(ty, items) => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::NestingTooDeep {
                    key: key.into(),
                    max: MAX_ARRAY_DEPTH,
                });
            }
            out.extend((*ty as u32).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                if item.meta_type() != *ty {
                    return Err(GgufError::InvalidArgument {
                        reason: format!(
                            "metadata key `{key}`: an array of {ty:?} holds a {:?} value",
                            item.meta_type()
                        ),
                    });
                }
                // Nested arrays carry their own element type and count.
                put_value(out, key, item, false, depth + 1)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{parse_header, MetaType};

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("longhaul-writer-{}-{name}", std::process::id()))
    }

    #[test]
    fn add_tensor_checks_shape_and_size() {
        let mut w = Writer::new();
        w.add_tensor("a", &[4, 2], GgmlType::F32, vec![0; 32])
            .unwrap();
        let e = w
            .add_tensor("a", &[4], GgmlType::F32, vec![0; 16])
            .unwrap_err();
        assert!(matches!(e, GgufError::DuplicateTensor { .. }));
        let e = w
            .add_tensor("b", &[4], GgmlType::F32, vec![0; 15])
            .unwrap_err();
        assert!(
            matches!(
                e,
                GgufError::DataSize {
                    expected: 16,
                    got: 15,
                    ..
                }
            ),
            "{e}"
        );
        let e = w
            .add_tensor("c", &[100], GgmlType::Q4_K, vec![])
            .unwrap_err();
        assert!(matches!(e, GgufError::BadBlockMultiple { .. }));
        let e = w
            .add_tensor("d", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4])
            .unwrap_err();
        assert!(matches!(e, GgufError::TooManyDims { .. }));
        let long = "x".repeat(64);
        let e = w
            .add_tensor(&long, &[1], GgmlType::F32, vec![0; 4])
            .unwrap_err();
        assert!(matches!(e, GgufError::InvalidArgument { .. }));
    }

    #[test]
    fn mixed_array_is_rejected() {
        let mut w = Writer::new();
        w.set("k", MetaValue::Array(MetaType::U8, vec![MetaValue::I8(1)]));
        let p = tmp("mixed.gguf");
        let e = w.write(&p).unwrap_err();
        assert!(matches!(e, GgufError::InvalidArgument { .. }), "{e}");
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn layout_is_aligned_and_alignment_written_as_u32() {
        let mut w = Writer::new();
        w.set(KEY_ALIGNMENT, MetaValue::U64(64));
        w.add_tensor("a", &[3], GgmlType::F32, vec![1; 12]).unwrap();
        w.add_tensor("b", &[32], GgmlType::Q8_0, vec![2; 34])
            .unwrap();
        let p = tmp("aligned.gguf");
        w.write(&p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        let h = parse_header(&bytes).unwrap();
        assert_eq!(h.alignment, 64);
        assert_eq!(h.metadata.get(KEY_ALIGNMENT), Some(&MetaValue::U32(64)));
        assert_eq!(h.data_offset % 64, 0);
        assert_eq!(h.tensors[0].offset, h.data_offset);
        assert_eq!(h.tensors[1].offset, h.data_offset + 64);
        assert_eq!(bytes.len() as u64, h.data_offset + 128);
        let _ = std::fs::remove_file(p);
    }

    /// While a file is written (Ctrl-C could come at any moment), the final
    /// name holds what it held before and the bytes go to the partial file;
    /// a failed write leaves neither a partial file nor a changed final one.
    #[test]
    fn the_final_name_changes_only_when_the_file_is_complete() {
        use std::sync::{Arc, Mutex};
        let dir = tmp("atomic");
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.gguf");
        std::fs::write(&p, b"previous").unwrap();
        type Seen = Mutex<Vec<(Vec<u8>, bool)>>;
        let seen: Arc<Seen> = Arc::default();
        let lazy = |fail: bool| -> TensorSource {
            let (p, seen) = (p.clone(), seen.clone());
            Arc::new(move || {
                let now = std::fs::read(&p).unwrap_or_default();
                seen.lock().unwrap().push((now, partial_path(&p).exists()));
                if fail {
                    Err(GgufError::InvalidArgument {
                        reason: "source failed".into(),
                    })
                } else {
                    Ok(vec![7; 16])
                }
            })
        };
        let mut w = Writer::new();
        w.add_tensor_lazy("a", &[4], GgmlType::F32, lazy(false))
            .unwrap();
        w.write(&p).unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![(b"previous".to_vec(), true)]);
        let complete = std::fs::read(&p).unwrap();
        assert_eq!(parse_header(&complete).unwrap().tensors.len(), 1);
        assert!(!partial_path(&p).exists());

        let mut w = Writer::new();
        w.add_tensor_lazy("a", &[4], GgmlType::F32, lazy(false))
            .unwrap();
        w.add_tensor_lazy("b", &[4], GgmlType::F32, lazy(true))
            .unwrap();
        let e = w.write(&p).unwrap_err();
        assert!(e.to_string().contains("source failed"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), complete);
        assert!(!partial_path(&p).exists());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_missing_folder_is_named() {
        let p = tmp("no-folder").join("m.gguf");
        let e = Writer::new().write(&p).unwrap_err();
        assert!(
            matches!(&e, GgufError::MissingFolder { dir, .. } if *dir == tmp("no-folder")),
            "{e}"
        );
    }
}
