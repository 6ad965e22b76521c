//! Batched direct reads through io_uring (`--longhaul-io uring`): one I/O
//! thread submits a wave's slices (as many in flight as the I/O pool has
//! threads) into aligned buffers and hands each slice over as soon as its
//! read completes, instead of one blocking `pread` per I/O thread. A slice
//! the ring cannot serve (direct I/O off or refused for its file) is handed
//! back to be read the usual way; a kernel without io_uring (or a sandbox
//! that forbids it) makes [`read_batch`] hand every slice back.

use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring};

use crate::gguf::{self, GgufError, DIRECT_ALIGN as ALIGN};

/// Entries of each thread's ring. [`read_batch`] keeps fewer reads in
/// flight (the I/O pool's thread count): a deeper queue shares the disk
/// among more slices at once, so every expert of a wave lands later and
/// compute waits longer for its first one. On the Qwen3-30B-A3B-shaped
/// preset under 8 GiB, 64 reads in flight cost a 64-token prompt 30% of
/// its speed against 8.
const DEPTH: u32 = 64;

/// One slice to read: `len` bytes at `offset` of shard `shard`.
#[derive(Clone, Copy, Debug)]
pub struct Slice {
    pub shard: usize,
    pub offset: u64,
    pub len: usize,
}

/// An aligned read buffer holding a slice's bytes at `skip..skip + len`;
/// back to a shared free list when dropped.
pub struct Bounce {
    buf: Vec<u8>,
    lead: usize,
    skip: usize,
    len: usize,
}

impl Bounce {
    /// The slice's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.lead + self.skip..self.lead + self.skip + self.len]
    }
}

/// Free bounce buffers, so that a token's reads do not allocate (and zero)
/// a megabyte apiece. Bounded: a prompt's burst is not kept afterwards.
static FREE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
const FREE_MAX: usize = 2 * DEPTH as usize;

impl Drop for Bounce {
    fn drop(&mut self) {
        if let Ok(mut free) = FREE.lock() {
            if free.len() < FREE_MAX {
                free.push(std::mem::take(&mut self.buf));
            }
        }
    }
}

/// A buffer of at least `n` bytes plus an alignment block.
fn buffer(n: usize) -> Vec<u8> {
    let mut b = FREE
        .lock()
        .ok()
        .and_then(|mut f| f.pop())
        .unwrap_or_default();
    if b.len() < n + ALIGN {
        b.resize(n + ALIGN, 0);
    }
    b
}

/// What became of one slice of [`read_batch`].
pub enum Landed {
    /// Read in full.
    Bytes(Bounce),
    /// Not read here (direct I/O off or refused for the file, or no ring):
    /// read it another way.
    Elsewhere,
    /// Not started: `cancelled` said so first.
    Dropped,
    Failed(GgufError),
}

thread_local! {
    /// Each I/O thread's ring, made on its first batch: `None` inside when
    /// the kernel refused one (then every batch is handed back).
    static RING: RefCell<Option<Option<IoUring>>> = const { RefCell::new(None) };
}

/// Whether this kernel gives a process an io_uring (a sandbox's seccomp
/// filter may refuse it).
pub fn available() -> bool {
    IoUring::new(2).is_ok()
}

/// A read in flight: the aligned range `start..start + span` of the
/// file, `done` bytes of it in so far.
struct Op<'f> {
    slice: usize,
    file: &'f std::fs::File,
    start: u64,
    span: usize,
    done: usize,
    bounce: Bounce,
}

/// The ring of the current thread with its reads in flight. Dropping it
/// (also while unwinding) waits for every read still in flight, since the
/// kernel writes into their buffers until they complete; if even that
/// fails, their buffers are leaked rather than freed under the kernel.
struct Flight<'f> {
    ring: Option<IoUring>,
    ops: Vec<Option<Op<'f>>>,
    in_flight: usize,
}

impl<'f> Flight<'f> {
    /// Queues `op`'s read of its remaining bytes.
    fn push(&mut self, op: Op<'f>, key: usize) -> std::io::Result<()> {
        let Some(ring) = &mut self.ring else {
            return Err(std::io::Error::other("no ring"));
        };
        let at = op.bounce.lead + op.done;
        // SAFETY: the buffer range lies inside `op.bounce.buf` (`span`
        // bytes after `lead` were reserved by `buffer`), and the buffer
        // outlives the read: `Flight` owns it until the read's completion
        // has been reaped, and its `Drop` waits for reads still in flight.
        let ptr = unsafe { op.bounce.buf.as_ptr().add(at) as *mut u8 };
        let len = (op.span - op.done) as u32;
        let entry = opcode::Read::new(types::Fd(op.file.as_raw_fd()), ptr, len)
            .offset(op.start + op.done as u64)
            .build()
            .user_data(key as u64);
        // SAFETY: as above, the entry's buffer stays valid until completion.
        if unsafe { ring.submission().push(&entry) }.is_err() {
            ring.submit()?;
            // SAFETY: as above.
            unsafe { ring.submission().push(&entry) }
                .map_err(|_| std::io::Error::other("io_uring submission queue full"))?;
        }
        self.ops[key] = Some(op);
        self.in_flight += 1;
        Ok(())
    }

    /// Submits what is queued and returns the completions of at least one
    /// read as `(key, result)`.
    fn reap(&mut self) -> std::io::Result<Vec<(usize, i32)>> {
        let Some(ring) = &mut self.ring else {
            return Ok(Vec::new());
        };
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => break,
                Err(e) => return Err(e),
            }
        }
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        self.in_flight -= done.len().min(self.in_flight);
        Ok(done)
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        while self.in_flight > 0 {
            match self.reap() {
                Ok(done) => {
                    for (key, _) in done {
                        if let Some(slot) = self.ops.get_mut(key) {
                            *slot = None;
                        }
                    }
                }
                Err(_) => {
                    // The kernel may still write into these buffers.
                    for op in self.ops.iter_mut().filter_map(Option::take) {
                        std::mem::forget(op.bounce);
                    }
                    return;
                }
            }
        }
        if let Some(ring) = self.ring.take() {
            RING.with(|r| *r.borrow_mut() = Some(Some(ring)));
        }
    }
}

/// Reads every slice of `slices` with direct I/O, as many at a time as
/// the I/O pool has threads, calling `landed(i, what)` once for each slice `i`, as its read
/// completes (in completion order, on this thread). A slice not yet
/// submitted when `cancelled()` turns true is [`Landed::Dropped`]. Returns
/// the number of slices read here.
pub fn read_batch(
    file: &gguf::Model,
    slices: &[Slice],
    cancelled: impl Fn() -> bool,
    mut landed: impl FnMut(usize, Landed),
) -> u64 {
    let ring = RING.with(|r| {
        r.borrow_mut()
            .get_or_insert_with(|| IoUring::new(DEPTH).ok())
            .take()
    });
    let Some(ring) = ring else {
        RING.with(|r| *r.borrow_mut() = Some(None));
        for i in 0..slices.len() {
            landed(i, Landed::Elsewhere);
        }
        return 0;
    };
    let io_err = |shard: usize, source| GgufError::Io {
        path: file
            .shards()
            .get(shard)
            .map(|s| s.path.clone())
            .unwrap_or_default(),
        source,
    };
    let mut flight = Flight {
        ring: Some(ring),
        ops: (0..slices.len()).map(|_| None).collect(),
        in_flight: 0,
    };
    let depth = super::loader::io_threads().clamp(1, DEPTH as usize);
    let mut read = 0u64;
    let mut next = 0;
    loop {
        while next < slices.len() && flight.in_flight < depth {
            let i = next;
            next += 1;
            let sl = slices[i];
            if cancelled() {
                landed(i, Landed::Dropped);
                continue;
            }
            let f = match file.direct_file(sl.shard, sl.offset, sl.len) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    landed(i, Landed::Elsewhere);
                    continue;
                }
                Err(e) => {
                    landed(i, Landed::Failed(e));
                    continue;
                }
            };
            let start = sl.offset - sl.offset % ALIGN as u64;
            let skip = (sl.offset - start) as usize;
            let span = (skip + sl.len).next_multiple_of(ALIGN);
            let buf = buffer(span);
            let lead = buf.as_ptr().align_offset(ALIGN);
            let op = Op {
                slice: i,
                file: f,
                start,
                span,
                done: 0,
                bounce: Bounce {
                    buf,
                    lead,
                    skip,
                    len: sl.len,
                },
            };
            if let Err(e) = flight.push(op, i) {
                landed(i, Landed::Failed(io_err(sl.shard, e)));
            }
        }
        if flight.in_flight == 0 {
            break;
        }
        let done = match flight.reap() {
            Ok(done) => done,
            Err(e) => {
                // Drop waits for the reads still in flight (or leaks their
                // buffers); every slice not yet landed fails.
                let left: Vec<usize> = flight.ops.iter().flatten().map(|o| o.slice).collect();
                drop(flight);
                for i in left {
                    let e = std::io::Error::new(e.kind(), e.to_string());
                    landed(i, Landed::Failed(io_err(slices[i].shard, e)));
                }
                for i in next..slices.len() {
                    landed(i, Landed::Elsewhere);
                }
                return read;
            }
        };
        for (key, res) in done {
            let Some(mut op) = flight.ops.get_mut(key).and_then(Option::take) else {
                continue;
            };
            let sl = slices[op.slice];
            let want = op.bounce.skip + op.bounce.len;
            let fail = |e: std::io::Error| Landed::Failed(io_err(sl.shard, e));
            match res {
                // The file system took the open but not the alignment.
                r if r == -libc::EINVAL && op.done == 0 => landed(op.slice, Landed::Elsewhere),
                r if r == -libc::EINTR || r == -libc::EAGAIN => {
                    let slice = op.slice;
                    if let Err(e) = flight.push(op, key) {
                        landed(slice, fail(e));
                    }
                }
                r if r < 0 => landed(op.slice, fail(std::io::Error::from_raw_os_error(-r))),
                0 => landed(op.slice, fail(std::io::ErrorKind::UnexpectedEof.into())),
                n => {
                    op.done += n as usize;
                    if op.done >= want {
                        read += 1;
                        landed(op.slice, Landed::Bytes(op.bounce));
                    } else {
                        // A short read: the rest from where it stopped.
                        let slice = op.slice;
                        if let Err(e) = flight.push(op, key) {
                            landed(slice, fail(e));
                        }
                    }
                }
            }
        }
    }
    read
}
