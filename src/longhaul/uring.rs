//! Batched direct reads through io_uring (`--longhaul-io uring`): the
//! thread at a layer's sync point submits all of a wave's slices in one
//! system call, into aligned buffers, and takes each slice as its read
//! completes ([`Batch::poll`]), with no I/O thread woken to start a read
//! or to hand one back. A slice the ring cannot serve (direct I/O off or
//! refused for its file) is handed back to be read the usual way; a kernel
//! without io_uring (or a sandbox that forbids it) gives no [`Batch`].

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Mutex;

use io_uring::{opcode, squeue, types, IoUring};

use crate::gguf::{self, GgufError, DIRECT_ALIGN as ALIGN};

/// Entries of a ring: the most reads a [`Batch`] keeps in flight.
pub const DEPTH: usize = 64;

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
const FREE_MAX: usize = 2 * DEPTH;

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

/// What became of one slice of a [`Batch`].
pub enum Landed {
    /// Read in full.
    Bytes(Bounce),
    /// Not read here (direct I/O off or refused for the file, or the ring
    /// failed): read it another way.
    Elsewhere,
    Failed(GgufError),
}

/// Rings not in use, so that a wave does not pay for setting one up.
static RINGS: Mutex<Vec<IoUring>> = Mutex::new(Vec::new());

/// Whether this kernel gives a process an io_uring (a sandbox's seccomp
/// filter may refuse it).
pub fn available() -> bool {
    ring().map(give_back).is_some()
}

fn ring() -> Option<IoUring> {
    let free = RINGS.lock().ok().and_then(|mut r| r.pop());
    free.or_else(|| IoUring::new(DEPTH as u32).ok())
}

fn give_back(ring: IoUring) {
    if let Ok(mut r) = RINGS.lock() {
        r.push(ring);
    }
}

/// A read in flight: the aligned range `start..start + span` of the file
/// open as `fd`, `done` bytes of it in so far.
struct Op {
    fd: RawFd,
    start: u64,
    span: usize,
    done: usize,
    bounce: Bounce,
}

/// Direct reads of a list of slices through one ring, up to `depth` in
/// flight. Dropping it (also while unwinding) waits for every read still in
/// flight, since the kernel writes into their buffers until they complete;
/// if even that fails, their buffers are leaked rather than freed under the
/// kernel.
pub struct Batch {
    ring: Option<IoUring>,
    slices: Vec<Slice>,
    /// Per slice, its read while in flight.
    ops: Vec<Option<Op>>,
    /// The slices in submission order, and for each whether the kernel
    /// starts the next one only once it completes (a chain).
    order: Vec<(usize, bool)>,
    /// Slices `order[..next]` were submitted or handed over.
    next: usize,
    in_flight: usize,
    depth: usize,
}

impl Batch {
    /// A batch of `slices` with at most `depth` (1..=[`DEPTH`]) reads in
    /// flight; `None` when the system gives no io_uring.
    pub fn new(slices: Vec<Slice>, depth: usize) -> Option<Batch> {
        Some(Batch {
            ring: Some(ring()?),
            ops: (0..slices.len()).map(|_| None).collect(),
            order: (0..slices.len()).map(|i| (i, false)).collect(),
            slices,
            next: 0,
            in_flight: 0,
            depth: depth.clamp(1, DEPTH),
        })
    }

    /// A batch of at most [`DEPTH`] slices, all submitted at once as
    /// `chains` chains that the kernel reads side by side, each one slice
    /// after another: chain `c` holds slices `c`, `c + chains`, ... So the
    /// slices land in about their order at the disk's full bandwidth, and
    /// the first ones are in while the last are still being read (with
    /// every slice in flight at once, they would all land near the end).
    /// `None` when the system gives no io_uring or there are too many
    /// slices.
    pub fn chained(slices: Vec<Slice>, chains: usize) -> Option<Batch> {
        let n = slices.len();
        if n > DEPTH {
            return None;
        }
        let chains = chains.max(1);
        let order = (0..chains)
            .flat_map(|c| (c..n).step_by(chains))
            .map(|i| (i, i + chains < n))
            .collect();
        let mut batch = Batch::new(slices, n)?;
        batch.order = order;
        Some(batch)
    }

    /// Whether every slice has been handed over.
    pub fn done(&self) -> bool {
        self.next == self.order.len() && self.in_flight == 0
    }

    /// Starts reads up to the depth, then hands each slice whose read
    /// completed to `landed(i, what)` (slice `i`), waiting for at least one
    /// when `wait` and reads are in flight. Every slice is handed over
    /// exactly once.
    pub fn poll(&mut self, file: &gguf::Model, wait: bool, mut landed: impl FnMut(usize, Landed)) {
        let io_err = |shard: usize, source| GgufError::Io {
            path: file
                .shards()
                .get(shard)
                .map(|s| s.path.clone())
                .unwrap_or_default(),
            source,
        };
        while self.next < self.order.len() && self.in_flight < self.depth {
            let (i, link) = self.order[self.next];
            self.next += 1;
            let sl = self.slices[i];
            let fd = match file.direct_file(sl.shard, sl.offset, sl.len) {
                Ok(Some(f)) => f.as_raw_fd(),
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
                fd,
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
            if let Err(e) = self.push(op, i, link) {
                landed(i, Landed::Failed(io_err(sl.shard, e)));
            }
        }
        if self.in_flight == 0 {
            return;
        }
        let done = match self.reap(wait) {
            Ok(done) => done,
            Err(e) => {
                // The ring failed: wait out the reads in flight (or leak
                // their buffers), fail them, and hand the rest back.
                let left: Vec<usize> = (0..self.ops.len())
                    .filter(|&i| self.ops[i].is_some())
                    .collect();
                self.drain();
                for i in left {
                    let e = std::io::Error::new(e.kind(), e.to_string());
                    landed(i, Landed::Failed(io_err(self.slices[i].shard, e)));
                }
                for &(i, _) in &self.order[self.next..] {
                    landed(i, Landed::Elsewhere);
                }
                self.next = self.order.len();
                return;
            }
        };
        let mut resubmitted = false;
        for (i, res) in done {
            let Some(mut op) = self.ops.get_mut(i).and_then(Option::take) else {
                continue;
            };
            let sl = self.slices[i];
            let want = op.bounce.skip + op.bounce.len;
            let fail = |e: std::io::Error| Landed::Failed(io_err(sl.shard, e));
            match res {
                // The file system took the open but not the alignment.
                r if r == -libc::EINVAL && op.done == 0 => landed(i, Landed::Elsewhere),
                r if r == -libc::EINTR || r == -libc::EAGAIN => {
                    resubmitted = true;
                    if let Err(e) = self.push(op, i, false) {
                        landed(i, fail(e));
                    }
                }
                r if r < 0 => landed(i, fail(std::io::Error::from_raw_os_error(-r))),
                0 => landed(i, fail(std::io::ErrorKind::UnexpectedEof.into())),
                n => {
                    op.done += n as usize;
                    if op.done >= want {
                        landed(i, Landed::Bytes(op.bounce));
                    } else {
                        // A short read: the rest from where it stopped.
                        resubmitted = true;
                        if let Err(e) = self.push(op, i, false) {
                            landed(i, fail(e));
                        }
                    }
                }
            }
        }
        if resubmitted {
            if let Some(ring) = &mut self.ring {
                // A failure here shows at the next reap.
                let _ = ring.submit();
            }
        }
    }

    /// Queues `op`'s read of its remaining bytes as slice `i`, submitting
    /// the queue when it is full; with `link`, the next entry queued starts
    /// once this read completes, whatever its result (a hard link: a short
    /// read or an error does not cancel it).
    fn push(&mut self, op: Op, i: usize, link: bool) -> std::io::Result<()> {
        let Some(ring) = &mut self.ring else {
            return Err(std::io::Error::other("no ring"));
        };
        let at = op.bounce.lead + op.done;
        // SAFETY: `at + (span - done)` lies inside `op.bounce.buf` (`span`
        // bytes after `lead` were reserved by `buffer`), and the buffer
        // outlives the read: `Batch` owns it until the read's completion
        // has been reaped, and its `Drop` waits for reads still in flight.
        let ptr = unsafe { op.bounce.buf.as_ptr().add(at) as *mut u8 };
        let len = (op.span - op.done) as u32;
        let entry = opcode::Read::new(types::Fd(op.fd), ptr, len)
            .offset(op.start + op.done as u64)
            .build()
            .flags(if link {
                squeue::Flags::IO_HARDLINK
            } else {
                squeue::Flags::empty()
            })
            .user_data(i as u64);
        // SAFETY: as above, the entry's buffer stays valid until completion.
        if unsafe { ring.submission().push(&entry) }.is_err() {
            ring.submit()?;
            // SAFETY: as above.
            unsafe { ring.submission().push(&entry) }
                .map_err(|_| std::io::Error::other("io_uring submission queue full"))?;
        }
        self.ops[i] = Some(op);
        self.in_flight += 1;
        Ok(())
    }

    /// Submits what is queued and returns the completions as `(slice,
    /// result)`, waiting for at least one when `wait`.
    fn reap(&mut self, wait: bool) -> std::io::Result<Vec<(usize, i32)>> {
        let Some(ring) = &mut self.ring else {
            return Ok(Vec::new());
        };
        loop {
            let r = if wait {
                ring.submit_and_wait(1)
            } else {
                ring.submit()
            };
            match r {
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

    /// Waits for every read in flight; if the ring fails meanwhile, leaks
    /// their buffers and the ring (the kernel may still write into them).
    fn drain(&mut self) {
        while self.in_flight > 0 {
            match self.reap(true) {
                Ok(done) => {
                    for (i, _) in done {
                        if let Some(op) = self.ops.get_mut(i) {
                            *op = None;
                        }
                    }
                }
                Err(_) => {
                    for op in self.ops.iter_mut().filter_map(Option::take) {
                        std::mem::forget(op.bounce);
                    }
                    std::mem::forget(self.ring.take());
                    self.in_flight = 0;
                }
            }
        }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.drain();
        if let Some(ring) = self.ring.take() {
            give_back(ring);
        }
    }
}
