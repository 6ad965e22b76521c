//! Concurrent positional reads of expert slices straight into their slots,
//! on a small I/O thread pool separate from the compute threads, and advice
//! to the kernel to drop the pages read (the slots are the cache; keeping the
//! same bytes in the page cache would double the memory).

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
