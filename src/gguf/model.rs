//! [`Model`]: one GGUF model on disk, a single file or the shards of a split
//! model, memory-mapped, with a tensor table that says which shard and which
//! byte range holds each tensor. Reads are either slices of the mmap
//! ([`Model::tensor_data`]) or positional reads ([`Model::read_at`]) for the
//! streaming loader.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::identity::{fingerprint, Stamp};
use super::split::{
    split_path, split_prefix, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT,
};
use super::{parse_header, GgufError, Header, Metadata, TensorInfo};

/// One file of a model.
#[derive(Debug)]
pub struct Shard {
    /// Path the file was opened from.
    pub path: PathBuf,
    /// File length in bytes.
    pub len: u64,
    /// GGUF version of this file.
    pub version: u32,
    /// Alignment of this file's data section.
    pub alignment: u64,
    mmap: Option<Mmap>,
    file: File,
    data_offset: u64,
    identity: std::sync::Mutex<Identity>,
    /// The same open file reopened with `O_DIRECT`, on the first direct
    /// read (`None` inside: the file system refuses direct I/O).
    direct: std::sync::OnceLock<Option<File>>,
}

/// What a shard was at open (or when last found restored), and the last
/// stamp found to be a different file (not fingerprinted again).
#[derive(Debug)]
struct Identity {
    stamp: Stamp,
    fingerprint: u64,
    refused: Option<Stamp>,
}

impl Shard {
    fn bytes(&self) -> &[u8] {
        self.mmap.as_deref().unwrap_or(&[])
    }

    /// See [`Model::check_files`]; `revalidate` allows fingerprinting a
    /// changed shard and adopting it when it is the same file again.
    fn check(&self, revalidate: bool) -> Result<(), GgufError> {
        let io = |source| GgufError::Io {
            path: self.path.clone(),
            source,
        };
        let changed = |what: String| GgufError::FileChanged {
            path: self.path.clone(),
            what,
        };
        let now = Stamp::of_file(&self.file).map_err(io)?;
        let at_path = Stamp::of_path(&self.path).map_err(io)?;
        let mut id = self.identity.lock().unwrap_or_else(|p| p.into_inner());
        // Another file under the name: what the descriptor reads is still
        // the original, but it is no longer what the user points at.
        if let Some(p) = at_path.filter(|p| (p.dev, p.ino) != (now.dev, now.ino)) {
            return Err(changed(id.stamp.describe_change(&p)));
        }
        if now == id.stamp {
            return Ok(());
        }
        if !revalidate || now.len != id.stamp.len || id.refused == Some(now) {
            return Err(changed(id.stamp.describe_change(&now)));
        }
        let fp = fingerprint(&self.file, now.len, self.data_offset).map_err(io)?;
        // Still being written while it was hashed: not settled yet.
        if Stamp::of_file(&self.file).map_err(io)? != now {
            return Err(changed(id.stamp.describe_change(&now)));
        }
        if fp != id.fingerprint {
            id.refused = Some(now);
            return Err(changed(id.stamp.describe_change(&now)));
        }
        id.stamp = now;
        id.refused = None;
        Ok(())
    }
}

/// One model: one or more shards, the first shard's metadata, and every
/// tensor's location.
///
/// The files are memory-mapped read-only. As with every mmap-based reader,
/// truncating or rewriting a file while a `Model` is open is not supported.
#[derive(Debug)]
pub struct Model {
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    shards: Vec<Shard>,
    fault: FaultSeam,
    /// Whether [`Model::read_at`] bypasses the page cache (see
    /// [`Model::set_direct_io`]).
    direct_io: std::sync::atomic::AtomicBool,
}

/// A fault-injection seam for tests: called before every positional read
/// with `(shard, offset, len)`; an error it returns fails that read as if the
/// device had reported it.
pub type ReadFault =
    std::sync::Arc<dyn Fn(usize, u64, usize) -> Option<std::io::Error> + Send + Sync>;

#[derive(Default)]
struct FaultSeam(std::sync::RwLock<Option<ReadFault>>);

impl std::fmt::Debug for FaultSeam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultSeam")
    }
}

// The streaming loader reads shards from many threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Model>();
};

/// Opens, maps and parses one file.
fn open_shard(path: &Path) -> Result<(Shard, Header), GgufError> {
    let io = |source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    // Mapping a directory fails with ENODEV ("No such device").
    if meta.is_dir() {
        return Err(GgufError::IsDirectory {
            path: path.to_path_buf(),
        });
    }
    let len = meta.len();
    // An empty file cannot be mapped; it fails to parse as truncated anyway.
    let mmap = if len == 0 {
        None
    } else {
        // SAFETY: the mapping is read-only and private to this process; the
        // documented contract of `Model` is that files are not modified while open.
        Some(unsafe { Mmap::map(&file) }.map_err(io)?)
    };
    let header = parse_header(mmap.as_deref().unwrap_or(&[])).map_err(|e| e.in_file(path))?;
    let stamp = Stamp::of_file(&file).map_err(io)?;
    let identity = Identity {
        stamp,
        fingerprint: fingerprint(&file, len, header.data_offset).map_err(io)?,
        refused: None,
    };
    let shard = Shard {
        path: path.to_path_buf(),
        len,
        version: header.version,
        alignment: header.alignment,
        mmap,
        file,
        data_offset: header.data_offset,
        identity: std::sync::Mutex::new(identity),
        direct: std::sync::OnceLock::new(),
    };
    Ok((shard, header))
}

/// An optional integer key as usize; a present key of another type is an error.
fn opt_usize(m: &Metadata, key: &str, path: &Path) -> Result<Option<usize>, GgufError> {
    m.opt(key, Metadata::get_u64)
        .map_err(|e| e.in_file(path))?
        .map(|v| {
            usize::try_from(v).map_err(|_| GgufError::ShardMismatch {
                path: path.to_path_buf(),
                reason: format!("`{key}` is {v}, which is not a plausible value"),
            })
        })
        .transpose()
}

impl Model {
    /// Opens a GGUF model: a single file, or the first shard
    /// (`NAME-00001-of-0000N.gguf`) of a split model, whose other shards are
    /// found next to it by name and validated (`split.no`, `split.count`,
    /// `split.tensors.count`, no tensor in two shards).
    ///
    /// Parse errors come wrapped in [`GgufError::InFile`] naming the file; use
    /// [`GgufError::root`] to match on the cause.
    pub fn open(path: impl AsRef<Path>) -> Result<Model, GgufError> {
        let path = path.as_ref();
        let (first, header) = open_shard(path)?;
        let Header {
            metadata,
            mut tensors,
            ..
        } = header;
        let mut shards = vec![first];

        let count = opt_usize(&metadata, KEY_SPLIT_COUNT, path)?.unwrap_or(1);
        let mut expected_total = None;
        if count > 1 {
            let no = opt_usize(&metadata, KEY_SPLIT_NO, path)?.unwrap_or(0);
            if no != 0 {
                return Err(GgufError::ShardMismatch {
                    path: path.to_path_buf(),
                    reason: format!(
                        "this is shard {} of {count} of a split model; open the first shard (the file named ...-00001-of-{count:05}.gguf)",
                        no + 1
                    ),
                });
            }
            let prefix =
                split_prefix(path, 0, count).ok_or_else(|| GgufError::ShardMismatch {
                    path: path.to_path_buf(),
                    reason: format!(
                        "`split.count` is {count} but the file name does not end in -00001-of-{count:05}.gguf, so the other shards cannot be found; keep the names llama-gguf-split gave them"
                    ),
                })?;
            let total = metadata
                .get_u64(KEY_SPLIT_TENSORS_COUNT)
                .map_err(|e| e.in_file(path))?;
            expected_total = Some(total);
            for index in 1..count {
                let p = split_path(&prefix, index, count);
                if !p.exists() {
                    return Err(GgufError::ShardMissing {
                        path: p,
                        index,
                        count,
                    });
                }
                let (shard, h) = open_shard(&p)?;
                check_shard(&p, &h.metadata, index, count, total)?;
                tensors.extend(
                    h.tensors
                        .into_iter()
                        .map(|t| TensorInfo { shard: index, ..t }),
                );
                shards.push(shard);
            }
        }

        let mut by_name = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if by_name.insert(t.name.clone(), i).is_some() {
                return Err(GgufError::DuplicateTensor {
                    name: t.name.clone(),
                });
            }
        }
        if let Some(total) = expected_total.filter(|&n| n != tensors.len() as u64) {
            return Err(GgufError::ShardMismatch {
                path: path.to_path_buf(),
                reason: format!(
                    "`split.tensors.count` is {total} but the {count} shards hold {} tensors; a shard is from another model or corrupt",
                    tensors.len()
                ),
            });
        }
        Ok(Model {
            metadata,
            tensors,
            by_name,
            shards,
            fault: FaultSeam::default(),
            direct_io: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The first shard's metadata (for a split model, `split.*` keys included).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Every tensor of every shard, in shard order then file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if any.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor named `name`, or [`GgufError::MissingTensor`] naming it.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            name: name.to_string(),
        })
    }

    /// The bytes of `t`, a slice of its shard's memory map.
    pub fn tensor_data(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let (shard, range) = self.range(t.shard, t.offset, t.len)?;
        Ok(&shard.bytes()[range])
    }

    /// Reads `buf.len()` bytes at absolute `offset` of shard `shard` with a
    /// positional read (`pread`), bypassing the memory map. Safe to call from
    /// many threads at once.
    pub fn read_at(&self, shard: usize, offset: u64, buf: &mut [u8]) -> Result<(), GgufError> {
        let s = self.shard_to_read(shard, offset, buf.len())?;
        let io = |source| GgufError::Io {
            path: s.path.clone(),
            source,
        };
        if self.direct_io.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some(done) = direct::read(s, offset, buf) {
                return done.map_err(io);
            }
        }
        s.file.read_exact_at(buf, offset).map_err(io)
    }

    /// Reads `len` bytes at absolute `offset` of shard `shard` with direct
    /// I/O and hands them to `f` where they landed, in the aligned read
    /// buffer: a caller that rewrites the bytes anyway (a slot converting
    /// to its kernels' layout) saves the copy [`Model::read_at`] makes.
    /// `Ok(None)` when direct I/O is off, unavailable for the file or the
    /// read too large for one buffer ([`DIRECT_WHOLE`], per reading thread):
    /// then read with [`Model::read_at`].
    pub fn read_direct_with<R>(
        &self,
        shard: usize,
        offset: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, GgufError> {
        if !self.direct_io.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        let s = self.shard_to_read(shard, offset, len)?;
        direct::read_with(s, offset, len, f)
            .transpose()
            .map_err(|source| GgufError::Io {
                path: s.path.clone(),
                source,
            })
    }

    /// For reads submitted elsewhere (io_uring): after the range check and
    /// the fault seam every read goes through, the shard's file opened with
    /// `O_DIRECT`, whose reads need the offset, length and buffer aligned to
    /// [`DIRECT_ALIGN`]. `Ok(None)` when direct I/O is off or unavailable
    /// for the file: then read with [`Model::read_at`].
    pub fn direct_file(
        &self,
        shard: usize,
        offset: u64,
        len: usize,
    ) -> Result<Option<&File>, GgufError> {
        if !self.direct_io.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        let s = self.shard_to_read(shard, offset, len)?;
        Ok(direct::file(s))
    }

    /// The shard a read of `len` bytes at `offset` goes to, once the range
    /// is checked and no injected fault ([`Model::set_read_fault`]) fails it.
    fn shard_to_read(&self, shard: usize, offset: u64, len: usize) -> Result<&Shard, GgufError> {
        let (s, _) = self.range(shard, offset, len as u64)?;
        let injected = self
            .fault
            .0
            .read()
            .ok()
            .and_then(|g| g.as_ref().and_then(|hook| hook(shard, offset, len)));
        match injected {
            Some(source) => Err(GgufError::Io {
                path: s.path.clone(),
                source,
            }),
            None => Ok(s),
        }
    }

    /// Makes [`Model::read_at`] read with direct I/O (`O_DIRECT`: from the
    /// device into an aligned buffer, then copied, without the page cache's
    /// copy and its eviction work) where the file system allows it, and
    /// buffered elsewhere. Longhaul's expert reads use it: their bytes go
    /// to slots, and the page cache would only hold them a second time.
    pub fn set_direct_io(&self, on: bool) {
        self.direct_io
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Installs (or with `None` removes) a read fault hook; see [`ReadFault`].
    pub fn set_read_fault(&self, hook: Option<ReadFault>) {
        if let Ok(mut g) = self.fault.0.write() {
            *g = hook;
        }
    }

    /// Checks that no shard changed since it was opened (see
    /// [`super::identity`]): the open file and the file at its path must
    /// still be the same, with the same size and times. A shard whose times
    /// changed but whose size and fingerprint did not is taken as restored
    /// and accepted again. Costs two `stat`s per shard when nothing changed.
    pub fn check_files(&self) -> Result<(), GgufError> {
        self.shards.iter().try_for_each(|s| s.check(true))
    }

    /// [`Model::check_files`] without fingerprinting: any change of an open
    /// file's stamp is an error. For use right after reads, whose bytes
    /// count only if the file did not change while they were read.
    pub fn files_unchanged(&self) -> Result<(), GgufError> {
        self.shards.iter().try_for_each(|s| s.check(false))
    }

    /// The files of the model, in `split.no` order.
    /// A hash of what the files say the model is: each shard's length and
    /// its header (metadata and tensor table, the bytes before its data
    /// section), FNV-1a 64, so it is the same in every build. Saved states
    /// carry it ([`crate::statefile`]). Reads the headers again (a few MiB
    /// for real models).
    pub fn content_hash(&self) -> Result<u64, GgufError> {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes {
                h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        let mut buf = vec![0u8; 1 << 20];
        for s in &self.shards {
            eat(&s.len.to_le_bytes());
            let head = s.data_offset.min(s.len);
            let mut at = 0u64;
            while at < head {
                let n = (head - at).min(buf.len() as u64) as usize;
                s.file
                    .read_exact_at(&mut buf[..n], at)
                    .map_err(|source| GgufError::Io {
                        path: s.path.clone(),
                        source,
                    })?;
                eat(&buf[..n]);
                at += n as u64;
            }
        }
        Ok(h)
    }

    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The open file of shard `shard` (e.g. for `posix_fadvise`).
    pub fn file(&self, shard: usize) -> Option<&File> {
        self.shards.get(shard).map(|s| &s.file)
    }

    /// Sum of every tensor's data size in bytes.
    pub fn total_tensor_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |a, t| a.saturating_add(t.len))
    }

    /// Checks that `offset..offset+len` lies inside shard `shard` (and its map).
    fn range(
        &self,
        shard: usize,
        offset: u64,
        len: u64,
    ) -> Result<(&Shard, std::ops::Range<usize>), GgufError> {
        let err = |file_len| GgufError::ReadOutOfRange {
            shard,
            offset,
            len,
            file_len,
            n_shards: self.shards.len(),
        };
        let s = self.shards.get(shard).ok_or_else(|| err(0))?;
        let mapped = s.bytes().len() as u64;
        match offset.checked_add(len) {
            // `end <= mapped`, a usize, so both conversions are lossless.
            Some(end) if end <= mapped && end <= s.len => Ok((s, offset as usize..end as usize)),
            _ => Err(err(s.len)),
        }
    }
}

/// Checks that a non-first shard belongs with the first one.
fn check_shard(
    path: &Path,
    m: &Metadata,
    index: usize,
    count: usize,
    expected_total: u64,
) -> Result<(), GgufError> {
    let mismatch = |reason: String| GgufError::ShardMismatch {
        path: path.to_path_buf(),
        reason,
    };
    let hint =
        "it belongs to another model or another split of this model; re-download or re-split";
    match opt_usize(m, KEY_SPLIT_COUNT, path)? {
        Some(c) if c == count => {}
        Some(c) => {
            return Err(mismatch(format!(
                "`split.count` is {c} but the first shard says {count}; {hint}"
            )))
        }
        None => return Err(mismatch(format!("`split.count` is missing; {hint}"))),
    }
    match opt_usize(m, KEY_SPLIT_NO, path)? {
        Some(no) if no == index => {}
        Some(no) => {
            return Err(mismatch(format!(
                "`split.no` is {no} but this file is named as shard {index} (0-based); {hint}"
            )))
        }
        None => return Err(mismatch(format!("`split.no` is missing; {hint}"))),
    }
    if let Some(total) = m
        .opt(KEY_SPLIT_TENSORS_COUNT, Metadata::get_u64)
        .map_err(|e| e.in_file(path))?
    {
        if total != expected_total {
            return Err(mismatch(format!(
                "`split.tensors.count` is {total} but the first shard says {expected_total}; {hint}"
            )));
        }
    }
    Ok(())
}

/// Alignment of direct reads' offsets, lengths and buffers (4 KiB covers
/// 512-byte and 4 KiB logical blocks).
pub const DIRECT_ALIGN: usize = 4096;

/// Bytes of the largest read [`Model::read_direct_with`] makes in one
/// piece, at any alignment. Each I/O thread keeps a buffer this large (and
/// two alignment blocks) once it has made such a read: small beside the
/// expert budget (8 threads: 32 MiB), large enough for most models' expert
/// slices and for the load's pieces.
pub const DIRECT_WHOLE: usize = 4 << 20;

/// Direct positional reads: `O_DIRECT` needs the offset, length and buffer
/// aligned to the device's block size, so each read covers the aligned range
/// around the wanted bytes, in a per-thread aligned buffer, and copies them
/// out (one memory copy, as the page cache makes, without its work).
#[cfg(target_os = "linux")]
mod direct {
    use std::cell::RefCell;
    use std::fs::File;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};

    use super::Shard;

    const ALIGN: usize = super::DIRECT_ALIGN;
    /// Bytes per direct read.
    const CHUNK: usize = 2 << 20;

    thread_local! {
        static BOUNCE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }

    /// The shard reopened with `O_DIRECT` through `/proc/self/fd`, so it is
    /// the same open file whatever happened to the path since.
    pub(super) fn file(s: &Shard) -> Option<&File> {
        s.direct
            .get_or_init(|| {
                use std::os::fd::AsRawFd;
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(format!("/proc/self/fd/{}", s.file.as_raw_fd()))
                    .ok()
            })
            .as_ref()
    }

    /// Reads `buf.len()` bytes at `offset`; `None` when direct I/O is not
    /// available for this file (the caller reads buffered).
    pub(super) fn read(s: &Shard, offset: u64, buf: &mut [u8]) -> Option<std::io::Result<()>> {
        let f = file(s)?;
        BOUNCE.with(|b| {
            let mut b = b.borrow_mut();
            if b.len() < CHUNK + 2 * ALIGN {
                b.resize(CHUNK + 2 * ALIGN, 0);
            }
            let lead = b.as_ptr().align_offset(ALIGN);
            let bounce = &mut b[lead..lead + CHUNK + ALIGN];
            let mut done = 0usize;
            while done < buf.len() {
                let at = offset + done as u64;
                let start = at - at % ALIGN as u64;
                let skip = (at - start) as usize;
                let want = (buf.len() - done).min(CHUNK + ALIGN - skip);
                let span = (skip + want).next_multiple_of(ALIGN);
                let got = match read_full(f, &mut bounce[..span], start) {
                    Ok(n) => n,
                    // The file system took the open but not the alignment.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) && done == 0 => return None,
                    Err(e) => return Some(Err(e)),
                };
                if got < skip + want {
                    return Some(Err(std::io::ErrorKind::UnexpectedEof.into()));
                }
                buf[done..done + want].copy_from_slice(&bounce[skip..skip + want]);
                done += want;
            }
            Some(Ok(()))
        })
    }

    /// [`super::DIRECT_WHOLE`]; larger reads go through `read`'s chunks.
    const WHOLE: usize = super::DIRECT_WHOLE;

    thread_local! {
        static WHOLE_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }

    /// Reads `len` bytes at `offset` in one aligned read and calls `f` on
    /// them; `None` when direct I/O is not available for this file or the
    /// read is over [`WHOLE`] bytes.
    pub(super) fn read_with<R>(
        s: &Shard,
        offset: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<std::io::Result<R>> {
        if len > WHOLE {
            return None;
        }
        let start = offset - offset % ALIGN as u64;
        let skip = (offset - start) as usize;
        let span = (skip + len).next_multiple_of(ALIGN);
        let f_ = file(s)?;
        // Out of the thread-local while `f` runs, so that nothing `f` does
        // can find it borrowed.
        let mut b = WHOLE_BUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
        if b.len() < span + ALIGN {
            b.resize(span + ALIGN, 0);
        }
        let lead = b.as_ptr().align_offset(ALIGN);
        let res = match read_full(f_, &mut b[lead..lead + span], start) {
            // The file system took the open but not the alignment.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => None,
            Err(e) => Some(Err(e)),
            Ok(got) if got < skip + len => Some(Err(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(_) => Some(Ok(f(&b[lead + skip..lead + skip + len]))),
        };
        WHOLE_BUF.with(|w| *w.borrow_mut() = b);
        res
    }

    /// Reads into `dst` at `offset` until it is full or the file ends.
    fn read_full(f: &File, dst: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let mut n = 0;
        while n < dst.len() {
            match f.read_at(&mut dst[n..], offset + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }
}

#[cfg(not(target_os = "linux"))]
mod direct {
    pub(super) fn file(_: &super::Shard) -> Option<&std::fs::File> {
        None
    }

    pub(super) fn read(_: &super::Shard, _: u64, _: &mut [u8]) -> Option<std::io::Result<()>> {
        None
    }

    pub(super) fn read_with<R>(
        _: &super::Shard,
        _: u64,
        _: usize,
        _: impl FnOnce(&[u8]) -> R,
    ) -> Option<std::io::Result<R>> {
        None
    }
}
