//! Concurrent positional reads of expert slices straight into their slots,
//! and of resident tensors at load (converted into the backend's layout on
//! the reading threads), on a small I/O thread pool separate from the
//! compute threads, and advice to the kernel to drop the pages read (the
//! slots are the cache; keeping the same bytes in the page cache would
//! double the memory).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use rayon::prelude::*;

use crate::gguf::{self, GgufError};

/// One read: `dst.len()` bytes at `offset` of shard `shard`.
pub(super) struct Job<'a> {
    pub shard: usize,
    pub offset: u64,
    pub dst: &'a mut [u8],
}

pub(super) fn io_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let n = std::env::var("LONGHAUL_IO_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8usize);
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .thread_name(|i| format!("longhaul-io-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

#[cfg(target_os = "linux")]
pub(super) fn drop_pages(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise only reads its integer arguments; a bad range is
    // reported through the return value, which is advisory and ignored.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn drop_pages(_file: &std::fs::File, _offset: u64, _len: u64) {}

/// Turns off kernel readahead for expert reads: pages read ahead of a slice
/// would stay in the page cache after the slice's own pages are dropped.
#[cfg(target_os = "linux")]
pub(super) fn advise_random(file: &gguf::Model) {
    use std::os::fd::AsRawFd;
    for s in 0..file.shards().len() {
        if let Some(f) = file.file(s) {
            // SAFETY: as in `drop_pages`; advisory only.
            unsafe {
                libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn advise_random(_file: &gguf::Model) {}

/// Runs every job; returns the bytes read and, with `checksum`, the CRC-32
/// of each job's bytes in job order (else empty), or the shard and error of
/// a failure. Jobs not yet started when `cancel` is set fail with
/// `Interrupted`.
pub(super) fn read_all(
    file: &gguf::Model,
    jobs: Vec<Job<'_>>,
    cancel: Option<&AtomicBool>,
    checksum: bool,
) -> Result<(u64, Vec<u32>), (usize, GgufError)> {
    let run = |jobs: Vec<Job<'_>>| {
        jobs.into_par_iter()
            .map(|j| {
                if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                    let source = std::io::Error::new(
                        std::io::ErrorKind::Interrupted,
                        "speculative read cancelled",
                    );
                    let path = file
                        .shards()
                        .get(j.shard)
                        .map(|s| s.path.clone())
                        .unwrap_or_default();
                    return Err((j.shard, GgufError::Io { path, source }));
                }
                file.read_at(j.shard, j.offset, j.dst)
                    .map_err(|e| (j.shard, e))?;
                Ok(if checksum { crc32fast::hash(j.dst) } else { 0 })
            })
            .collect::<Result<Vec<u32>, _>>()
    };
    let total: u64 = jobs.iter().map(|j| j.dst.len() as u64).sum();
    let crcs = match io_pool() {
        Some(pool) => pool.install(|| run(jobs))?,
        None => run(jobs)?,
    };
    Ok((total, if checksum { crcs } else { Vec::new() }))
}

/// The scope longhaul's lookahead reads are spawned on while layers compute.
pub type IoScope<'s> = rayon::Scope<'s>;

/// Runs `f` with a scope whose spawned tasks run on the longhaul I/O pool
/// (for reads that overlap compute), waiting for them before returning.
pub fn io_scope<'s, R>(f: impl FnOnce(&IoScope<'s>) -> R) -> R {
    match io_pool() {
        Some(pool) => pool.in_place_scope(f),
        None => rayon::in_place_scope(f),
    }
}

/// Reads `dst.len()` bytes at `offset` of shard `shard` as concurrent
/// positional reads of 8 MiB pieces on the longhaul I/O pool: resident
/// tensors copied at load go at the disk's bandwidth, not one read's.
pub fn read_parallel(
    file: &gguf::Model,
    shard: usize,
    offset: u64,
    dst: &mut [u8],
) -> Result<(), GgufError> {
    const PIECE: usize = 8 << 20;
    if dst.len() <= PIECE {
        return file.read_at(shard, offset, dst);
    }
    let jobs = dst
        .chunks_mut(PIECE)
        .enumerate()
        .map(|(i, dst)| Job {
            shard,
            offset: offset + (i * PIECE) as u64,
            dst,
        })
        .collect();
    read_all(file, jobs, None, false)
        .map(|_| ())
        .map_err(|(_, e)| e)
}

/// [`read_parallel`] for a matrix that takes a backend layout: each piece
/// (a whole number of `pieces.unit` bytes, about 4 MiB, so that direct I/O
/// hands it over in one buffer) is converted on the
/// thread that read it as soon as its read is in, straight from the direct
/// read's buffer where direct I/O serves it, while other pieces are still
/// being read: the load goes at the disk's bandwidth, not that plus the
/// conversion's time.
pub fn read_parallel_converting(
    file: &gguf::Model,
    shard: usize,
    offset: u64,
    dst: &mut [u8],
    pieces: &crate::backend::RepackPieces,
) -> Result<(), GgufError> {
    use rayon::prelude::*;
    let unit = pieces.unit.max(1);
    if !dst.len().is_multiple_of(unit) {
        return Err(GgufError::Io {
            path: Default::default(),
            source: std::io::Error::other(format!(
                "{} bytes to convert in pieces of {unit}",
                dst.len()
            )),
        });
    }
    let piece = piece_len(unit);
    let read = |i: usize, dst: &mut [u8]| {
        let at = offset + (i * piece) as u64;
        read_slice(file, shard, at, dst, false, Some((&*pieces.convert, unit)))
    };
    let run = |dst: &mut [u8]| {
        dst.par_chunks_mut(piece)
            .enumerate()
            .try_for_each(|(i, dst)| read(i, dst).map(drop))
    };
    match io_pool() {
        Some(pool) => pool.install(|| run(dst)),
        None => run(dst),
    }
}

/// How a slice read by [`read_slice`] takes its store's layout:
/// `convert(dst, src)` writes `dst` from `src`, or in place when `src` is
/// `None`.
pub(super) type Convert<'a> =
    &'a (dyn Fn(&mut [u8], Option<&[u8]>) -> Result<(), crate::backend::BackendError> + Sync);

/// Reads one slice into `buf`, in the layout `convert` gives it, which
/// converts pieces of whole numbers of its `unit` bytes: piece by piece,
/// each straight from the direct read's buffer where direct I/O serves it
/// (up to [`gguf::DIRECT_WHOLE`] bytes a read), else after a
/// [`gguf::Model::read_at`] into `buf`, in place. Without `convert` the bytes
/// stay as read. Returns the CRC-32 of the bytes as read when `checksum`,
/// else 0.
pub(super) fn read_slice(
    file: &gguf::Model,
    shard: usize,
    offset: u64,
    buf: &mut [u8],
    checksum: bool,
    convert: Option<(Convert<'_>, usize)>,
) -> Result<u32, GgufError> {
    let mut crc = crc32fast::Hasher::new();
    let mut read = |at: usize, dst: &mut [u8], convert: Option<Convert<'_>>| {
        read_piece(
            file,
            shard,
            offset + at as u64,
            dst,
            checksum.then_some(&mut crc),
            convert,
        )
    };
    match convert {
        // A slice larger than one direct read (the experts of DeepSeek-V3,
        // GLM-4.5, gpt-oss) goes in pieces of whole units that fit one,
        // each converted as it lands.
        Some((convert, unit)) => {
            let piece = piece_len(unit);
            for (i, dst) in buf.chunks_mut(piece).enumerate() {
                read(i * piece, dst, Some(convert))?;
            }
        }
        None => read(0, buf, None)?,
    }
    Ok(if checksum { crc.finalize() } else { 0 })
}

/// Bytes of a converting read's pieces: as many whole `unit`s as one direct
/// read hands over in one buffer, at least one.
pub(super) fn piece_len(unit: usize) -> usize {
    let unit = unit.max(1);
    (gguf::DIRECT_WHOLE / unit).max(1) * unit
}

/// One piece of [`read_slice`], its bytes as read added to `crc`.
fn read_piece(
    file: &gguf::Model,
    shard: usize,
    offset: u64,
    buf: &mut [u8],
    mut crc: Option<&mut crc32fast::Hasher>,
    convert: Option<Convert<'_>>,
) -> Result<(), GgufError> {
    let converted = |e: crate::backend::BackendError| GgufError::Io {
        path: Default::default(),
        source: std::io::Error::other(e.to_string()),
    };
    if let Some(convert) = convert {
        let len = buf.len();
        let direct = file.read_direct_with(shard, offset, len, |src| {
            if let Some(crc) = crc.as_deref_mut() {
                crc.update(src);
            }
            convert(buf, Some(src))
        })?;
        if let Some(done) = direct {
            return done.map_err(converted);
        }
    }
    file.read_at(shard, offset, buf)?;
    if let Some(crc) = crc {
        crc.update(buf);
    }
    if let Some(convert) = convert {
        convert(buf, None).map_err(converted)?;
    }
    Ok(())
}

/// Prepares a model's files for streaming: no kernel readahead, whose pages
/// would outlive the slices they were read next to. Call before reading.
pub fn prepare_files(file: &gguf::Model) {
    advise_random(file);
}

/// Advises the kernel to drop the page cache of a range already copied into
/// memory (resident tensors in longhaul mode, expert slices in slots).
pub fn release_pages(file: &gguf::Model, shard: usize, offset: u64, len: u64) {
    if let Some(f) = file.file(shard) {
        drop_pages(f, offset, len);
    }
}
