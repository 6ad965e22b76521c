//! Model identity: what a shard was when it was opened, so that a file
//! changed under a running process is noticed before its bytes are used.
//!
//! A shard's [`Stamp`] is its device, inode, size, modification time and
//! status-change time. `ctime` cannot be set by a user, so any write, any
//! truncation and any `touch -r`/`cp -p` that restores the modification time
//! still changes it. A stamp that differs from the one recorded at open
//! means the bytes may differ: the shard's [`fingerprint`] (its header and a
//! fixed sample of data blocks) is then compared with the one taken at open.
//! An equal fingerprint with an equal size is taken as the same file put
//! back (a restore in place), and its new stamp is adopted; anything else is
//! a changed file, refused until the process restarts.
//!
//! What this cannot see: a change that keeps the size and touches none of
//! the sampled blocks is taken for a restore. Per-read checks make the window
//! small for streamed experts (see `crate::longhaul`), and a mapped tensor
//! read while the file is being rewritten can still see the new bytes, or
//! SIGBUS if the file shrinks in the middle of a forward pass: checks run
//! before each pass, not during it.

use std::fs::File;
use std::hash::Hasher;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

/// How many data blocks the fingerprint samples, and their size.
const SAMPLES: u64 = 32;
const SAMPLE_BYTES: u64 = 4096;
/// Header bytes hashed at most (the metadata and tensor table of real
/// models is a few MiB; the vocabulary dominates).
const HEADER_BYTES: u64 = 32 << 20;

/// A shard's identity as the file system reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Stamp {
    pub fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// The stamp of an open file (`fstat`).
    pub fn of_file(f: &File) -> std::io::Result<Stamp> {
        Ok(Stamp::of(&f.metadata()?))
    }

    /// The stamp of what `path` names now (`stat`); `None` if nothing does
    /// (an unlinked file stays readable through its descriptor).
    pub fn of_path(path: &Path) -> std::io::Result<Option<Stamp>> {
        match std::fs::metadata(path) {
            Ok(m) => Ok(Some(Stamp::of(&m))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// What differs between `self` (recorded) and `now`, in words.
    pub fn describe_change(&self, now: &Stamp) -> String {
        if (self.dev, self.ino) != (now.dev, now.ino) {
            "it was replaced by another file".into()
        } else if self.len != now.len {
            format!("its size changed from {} to {} bytes", self.len, now.len)
        } else {
            "it was rewritten".into()
        }
    }
}

/// A hash of the shard's header (up to `HEADER_BYTES`) and of `SAMPLES`
/// blocks spread evenly over its data section, read with positional reads.
pub fn fingerprint(f: &File, len: u64, data_offset: u64) -> std::io::Result<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write_u64(len);
    let mut buf = vec![0u8; 1 << 20];
    let head = data_offset.min(len).min(HEADER_BYTES);
    let mut at = 0u64;
    while at < head {
        let n = (head - at).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], at)?;
        h.write(&buf[..n]);
        at += n as u64;
    }
    let data = len.saturating_sub(data_offset);
    if data > 0 {
        for i in 0..SAMPLES {
            let off = data_offset + data / SAMPLES * i;
            let n = SAMPLE_BYTES.min(len - off) as usize;
            f.read_exact_at(&mut buf[..n], off)?;
            h.write(&buf[..n]);
        }
    }
    Ok(h.finish())
}
