//! A wave's reads in flight ([`Fill`]): on the I/O threads, one task per
//! slice answering on a channel, or (`--longhaul-io uring`) through an
//! io_uring that the sync point's thread drives ([`RingReads`]); either
//! way each slice lands in its lent slot buffer in the store's layout.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Instant;

#[cfg(target_os = "linux")]
use rayon::prelude::*;

use super::loader::{piece_len, read_slice, Convert};
#[cfg(target_os = "linux")]
use super::uring;
#[cfg(doc)]
use super::StreamedLayer;
use super::Wave;
use crate::gguf::{self, GgufError};

/// One finished read of a [`Fill`]: its job, its buffer back, and its
/// checksum (0 unless verifying), `None` for a speculative read dropped
/// before it started, or the shard and error of the failure.
pub(super) struct Done {
    pub(super) job: usize,
    pub(super) buf: Vec<u8>,
    pub(super) res: Result<Option<u32>, (usize, GgufError)>,
    /// Read through io_uring.
    pub(super) ring: bool,
}

/// A wave whose missing experts are being read on the I/O pool while the
/// layer computes over the experts already in their slots (see
/// [`StreamedLayer::start_wave`]), or a lookahead's speculative reads (see
/// [`StreamedLayer::start_prefetch`]). Jobs are `(expert, tensor)` reads,
/// expert-major in the order of the wave's loads.
pub struct Fill {
    pub(super) wave: Wave,
    /// The wave's experts whose bytes are in their slots and not yet handed
    /// out by [`Fill::take_ready`].
    pub(super) ready: Vec<u32>,
    /// `None`: the store cannot lend its slots, and the reads were made
    /// before `start_wave` returned.
    pub(super) rx: Option<mpsc::Receiver<Done>>,
    /// Each job's `(tensor, slot)`.
    pub(super) which: Vec<(usize, usize)>,
    /// Buffers back from finished jobs whose expert is not yet complete.
    pub(super) bufs: Vec<Option<Vec<u8>>>,
    pub(super) crcs: Vec<u32>,
    /// Jobs not yet finished, per load.
    pub(super) left: Vec<usize>,
    /// Per load: a job of it was dropped before its read (speculation
    /// cancelled), so its slot stays empty.
    pub(super) dropped: Vec<bool>,
    pub(super) pending: usize,
    pub(super) error: Option<(usize, GgufError)>,
    /// Bytes of the jobs read so far.
    pub(super) bytes: u64,
    pub(super) started: Instant,
    /// Lookahead reads: their time is not a demand read's.
    pub(super) speculative: bool,
    /// The first `spec_loads` loads are a lookahead's (see
    /// [`Fill::adopt`]); `spec_bytes` of `bytes` are theirs.
    pub(super) spec_loads: usize,
    pub(super) spec_bytes: u64,
    /// Per load: its expert is not needed, so a failed or dropped read of it
    /// only leaves its slot empty, and it is never computed.
    pub(super) optional: Vec<bool>,
    /// A lookahead's per-load flags: a read not yet started once its
    /// load's flag is set is dropped.
    pub(super) skip: Option<Arc<[AtomicBool]>>,
    /// A lookahead's channel, kept for the demand reads of the wave that
    /// adopts it.
    pub(super) tx: Option<mpsc::Sender<Done>>,
    /// The reads, where they go through io_uring (then `rx` is `None`).
    #[cfg(target_os = "linux")]
    pub(super) ring: Option<RingReads>,
    /// Its reads on the I/O threads not yet read: a wave's, with those of
    /// the lookahead it took over.
    pub(super) gate: Arc<ReadGate>,
    /// A lookahead's: the demand reads its reads start after.
    pub(super) after: Option<Arc<ReadGate>>,
}

/// The reads of a wave still to finish on the I/O threads, its own and
/// those of a lookahead it took over (see [`Fill::demand_gate`]). A
/// lookahead's reads spawned behind them each wait here until all are
/// read: the guesses never share the disk with the reads the sync point is
/// waiting for, and yet start the moment those are in, not when the sync
/// point's thread, computing the cached experts, next looks.
#[derive(Default)]
pub struct ReadGate {
    left: Mutex<usize>,
    done: Condvar,
}

impl ReadGate {
    /// Nothing in it panics while the lock is held, so even a poisoned lock
    /// guards a whole count.
    fn left(&self) -> std::sync::MutexGuard<'_, usize> {
        self.left.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks until every demand read counted in is done.
    pub(super) fn wait(&self) {
        let left = self.left();
        let _open = self
            .done
            .wait_while(left, |n| *n > 0)
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// One demand read counted in a [`ReadGate`] from its making until it is
/// dropped: answered, never spawned, or unwound by a panic, so the gate
/// always opens.
pub(super) struct Arrival(Arc<ReadGate>);

impl Arrival {
    pub(super) fn new(gate: &Arc<ReadGate>) -> Self {
        *gate.left() += 1;
        Arrival(gate.clone())
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        let mut left = self.0.left();
        *left = left.saturating_sub(1);
        if *left == 0 {
            self.0.done.notify_all();
        }
    }
}

impl Fill {
    /// A fill of `wave` with nothing in flight: its cached experts (those
    /// it does not load) are ready.
    pub(super) fn new(wave: &Wave, n_tensors: usize, speculative: bool) -> Self {
        let which: Vec<(usize, usize)> = wave
            .loads
            .iter()
            .flat_map(|&(_, s)| (0..n_tensors).map(move |t| (t, s as usize)))
            .collect();
        Fill {
            ready: wave
                .experts
                .iter()
                .map(|&(e, _)| e)
                .filter(|e| !wave.loads.iter().any(|l| l.0 == *e))
                .collect(),
            wave: wave.clone(),
            rx: None,
            bufs: (0..which.len()).map(|_| None).collect(),
            crcs: vec![0; which.len()],
            left: vec![n_tensors; wave.loads.len()],
            dropped: vec![false; wave.loads.len()],
            pending: 0,
            error: None,
            bytes: 0,
            started: Instant::now(),
            speculative,
            spec_loads: if speculative { wave.loads.len() } else { 0 },
            spec_bytes: 0,
            optional: vec![false; wave.loads.len()],
            skip: speculative.then(|| wave.loads.iter().map(|_| AtomicBool::new(false)).collect()),
            tx: None,
            which,
            #[cfg(target_os = "linux")]
            ring: None,
            gate: Arc::default(),
            after: None,
        }
    }

    /// What a lookahead started now should read after: this wave's reads
    /// on the I/O threads (none, for a wave of cached experts), or
    /// `None` where they do not run there (through the io_uring that the
    /// sync point's thread drives, or made before `start_wave` returned):
    /// such a wave starts its lookahead once the sync point sees its reads
    /// in.
    pub fn demand_gate(&self) -> Option<Arc<ReadGate>> {
        #[cfg(target_os = "linux")]
        if self.ring.is_some() {
            return None;
        }
        (self.rx.is_some() || self.wave.loads.is_empty()).then(|| self.gate.clone())
    }

    /// The reads answered since the last call: at least one when `block`
    /// (an empty list then means only that a read went on after a short
    /// read), else those at hand; `None` when every reader is gone with
    /// reads unanswered.
    pub(super) fn answers(&mut self, file: &gguf::Model, block: bool) -> Option<Vec<Done>> {
        #[cfg(target_os = "linux")]
        if let Some(ring) = &mut self.ring {
            let answers = ring.poll(file, block);
            return (!answers.is_empty() || !ring.batch.done()).then_some(answers);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = file;
        let rx = self.rx.as_ref()?;
        if block {
            return rx.recv().ok().map(|d| vec![d]);
        }
        match rx.try_recv() {
            Ok(d) => Some(vec![d]),
            Err(mpsc::TryRecvError::Empty) => Some(Vec::new()),
            Err(mpsc::TryRecvError::Disconnected) => None,
        }
    }

    /// Whether reads were started for the wave (on the I/O threads or
    /// through io_uring), rather than made before `start_wave` returned.
    pub(super) fn reads_started(&self) -> bool {
        #[cfg(target_os = "linux")]
        if self.ring.is_some() {
            return true;
        }
        self.rx.is_some()
    }

    /// Forgets the reads started (all answered), as [`Fill::reads_started`].
    pub(super) fn end_reads(&mut self) -> bool {
        let started = self.reads_started();
        self.rx = None;
        #[cfg(target_os = "linux")]
        {
            self.ring = None;
        }
        started
    }

    /// Drops every read of a lookahead not yet started.
    pub(super) fn skip_all(&mut self) {
        if let Some(skip) = &self.skip {
            skip.iter().for_each(|f| f.store(true, Ordering::Relaxed));
        }
        self.tx = None;
    }

    /// Makes this lookahead's reads part of `wave` (planned by
    /// [`super::LayerCache::plan_landing`] around them): its loads stay
    /// first, those whose experts the batch does not use become optional
    /// (and their reads not yet started are dropped), and the wave's own
    /// loads follow, to be read on the same channel. The wave's experts
    /// that it neither loads nor adopts are ready.
    pub(super) fn adopt(&mut self, wave: &Wave, n_tensors: usize) {
        let adopted: Vec<u32> = self.wave.loads.iter().map(|l| l.0).collect();
        let mut unused = Vec::new();
        for (li, &load) in self.wave.loads.iter().enumerate() {
            if wave.experts.iter().any(|x| x.0 == load.0) {
                continue;
            }
            self.optional[li] = true;
            if let Some(skip) = &self.skip {
                skip[li].store(true, Ordering::Relaxed);
            }
            unused.push(load);
        }
        self.ready = wave
            .experts
            .iter()
            .map(|&(e, _)| e)
            .filter(|e| !adopted.contains(e) && !wave.loads.iter().any(|l| l.0 == *e))
            .collect();
        for &(_, s) in &wave.loads {
            for t in 0..n_tensors {
                self.which.push((t, s as usize));
                self.bufs.push(None);
                self.crcs.push(0);
            }
            self.left.push(n_tensors);
            self.dropped.push(false);
            self.optional.push(false);
        }
        self.spec_loads = adopted.len();
        self.wave.loads.extend_from_slice(&wave.loads);
        self.wave.experts = wave.experts.iter().copied().chain(unused).collect();
        self.speculative = false;
        self.after = None;
        self.started = Instant::now();
    }

    /// The loads whose reads all completed, and their checksums.
    pub(super) fn landed(&self, n_tensors: usize) -> (Vec<(u32, u32)>, Vec<u32>) {
        let n_t = n_tensors.max(1);
        let (loads, crcs): (Vec<(u32, u32)>, Vec<&[u32]>) = self
            .wave
            .loads
            .iter()
            .zip(self.crcs.chunks(n_t))
            .zip(&self.dropped)
            .filter(|(_, d)| !**d)
            .map(|((l, c), _)| (*l, c))
            .unzip();
        (loads, crcs.concat())
    }

    /// Whether reads of the wave are still in flight.
    pub fn pending(&self) -> bool {
        self.pending > 0
    }

    /// The wave's experts that can be computed now and were not yet taken.
    pub fn take_ready(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.ready)
    }
}

/// One slice of a [`Fill`]'s reads: job `job` (tensor `tensor` of its
/// expert) into the lent slot buffer `buf`, answered on `tx`.
pub(super) struct SliceRead {
    pub(super) job: usize,
    /// A lookahead's flags and this read's load among them.
    pub(super) skip: Option<(Arc<[AtomicBool]>, usize)>,
    pub(super) tensor: usize,
    pub(super) shard: usize,
    pub(super) offset: u64,
    pub(super) buf: Vec<u8>,
    pub(super) tx: mpsc::Sender<Done>,
    /// Its place in its fill's gate (a lookahead's counts once a wave
    /// takes the lookahead over).
    pub(super) arrival: Option<Arrival>,
    /// A lookahead read's: the demand reads it starts after.
    pub(super) after: Option<Arc<ReadGate>>,
}

/// What every read of a [`Fill`] shares.
#[derive(Clone)]
pub(super) struct ReadCtx<'s> {
    pub(super) file: &'s gguf::Model,
    pub(super) checksum: bool,
    pub(super) convert: Option<crate::backend::SlotConverter>,
}

impl ReadCtx<'_> {
    /// Answers `r` with `res`. The receiver is gone only when the sync
    /// point gave up; the slot is then recorded empty and gets a fresh
    /// buffer.
    pub(super) fn answer(r: SliceRead, res: Result<Option<u32>, (usize, GgufError)>) {
        let _ = r.tx.send(Done {
            job: r.job,
            buf: r.buf,
            res,
            ring: false,
        });
    }

    /// Reads `r` with a positional read on this thread, into the store's
    /// layout, unless its lookahead skip flag is set first.
    pub(super) fn read_one(&self, mut r: SliceRead) {
        // The demand reads a lookahead read waits for were spawned before
        // it, by the same thread, into the pool's first-in-first-out queue:
        // none of them can be waiting for this thread. Demand reads spawned
        // later (the next layer's) come after the sync point that waited
        // for all of these, so by then the gate is open.
        if let Some(gate) = &r.after {
            gate.wait();
        }
        let skipped = r
            .skip
            .as_ref()
            .is_some_and(|(f, li)| f.get(*li).is_some_and(|f| f.load(Ordering::Relaxed)));
        let res = if skipped {
            Ok(None)
        } else {
            let read = Mutex::new(r.arrival.take());
            self.read_into(r.tensor, r.shard, r.offset, &mut r.buf, &read)
        };
        Self::answer(r, res);
    }

    /// Reads tensor `tensor`'s slice at `offset` of `shard` into `buf`, in
    /// the store's layout; its checksum as read (0 unless verifying). A
    /// demand read's `arrival` is dropped once the bytes are read, before
    /// their conversion: the lookahead's reads behind it need the disk, not
    /// the layout.
    pub(super) fn read_into(
        &self,
        tensor: usize,
        shard: usize,
        offset: u64,
        buf: &mut [u8],
        arrival: &Mutex<Option<Arrival>>,
    ) -> Result<Option<u32>, (usize, GgufError)> {
        let to_slot = self.convert.as_ref().map(|c| {
            let f = &c.convert;
            let unit = c.units.get(tensor).copied().unwrap_or(buf.len());
            // `read_slice` converts each piece once, after its read.
            let (pieces, converted) = (buf.len().div_ceil(piece_len(unit)), AtomicUsize::new(0));
            (
                move |buf: &mut [u8], src: Option<&[u8]>| {
                    if converted.fetch_add(1, Ordering::Relaxed) + 1 >= pieces {
                        drop(arrival.lock().unwrap_or_else(|p| p.into_inner()).take());
                    }
                    f(tensor, buf, src)
                },
                unit,
            )
        });
        let to_slot = to_slot.as_ref().map(|(f, unit)| (f as Convert<'_>, *unit));
        read_slice(self.file, shard, offset, buf, self.checksum, to_slot)
            .map(Some)
            .map_err(|e| (shard, e))
    }

    /// Writes tensor `tensor`'s slice, read elsewhere into `src`, into
    /// `buf` in the store's layout; its checksum as read.
    #[cfg(target_os = "linux")]
    pub(super) fn convert_from(
        &self,
        tensor: usize,
        shard: usize,
        buf: &mut [u8],
        src: &[u8],
    ) -> Result<Option<u32>, (usize, GgufError)> {
        let crc = if self.checksum {
            crc32fast::hash(src)
        } else {
            0
        };
        match &self.convert {
            Some(c) => (c.convert)(tensor, buf, Some(src)).map_err(|e| {
                let source = std::io::Error::other(e.to_string());
                let path = self
                    .file
                    .shards()
                    .get(shard)
                    .map(|s| s.path.clone())
                    .unwrap_or_default();
                (shard, GgufError::Io { path, source })
            })?,
            None => buf.copy_from_slice(src),
        }
        Ok(Some(crc))
    }
}

/// Most slices a demand wave reads through io_uring (`--longhaul-io
/// uring`): every slice of 8 experts of 3 routed tensors, a decode step's
/// worth. The sync point's thread submits them at once and takes them as
/// they land, but starts no new read while it computes, so larger waves (a
/// prompt's) go through the I/O threads, which keep the disk busy
/// throughout.
#[cfg(target_os = "linux")]
pub(super) const RING_WAVE: usize = 24;

/// A demand wave's reads through io_uring, driven by the sync point's
/// thread: the slices that land are converted into their lent slot
/// buffers on the compute threads, which would otherwise wait.
#[cfg(target_os = "linux")]
pub(super) struct RingReads {
    pub(super) batch: uring::Batch,
    /// Per job: the lent slot buffer until its slice lands.
    pub(super) lent: Vec<Option<Vec<u8>>>,
    /// Per job: tensor, shard and offset.
    pub(super) at: Vec<(usize, usize, u64)>,
    pub(super) checksum: bool,
    pub(super) convert: Option<crate::backend::SlotConverter>,
    /// Jobs answered at submission, not yet handed out.
    pub(super) early: Vec<Done>,
}

#[cfg(target_os = "linux")]
impl RingReads {
    /// Every job that landed since the last poll, as a [`Done`]; waits for
    /// at least one when `wait` and none is at hand.
    pub(super) fn poll(&mut self, file: &gguf::Model, wait: bool) -> Vec<Done> {
        let mut out = std::mem::take(&mut self.early);
        let wait = wait && out.is_empty();
        let ctx = ReadCtx {
            file,
            checksum: self.checksum,
            convert: self.convert.clone(),
        };
        let lent = &mut self.lent;
        let mut landed = Vec::new();
        self.batch.poll(file, wait, |job, what| {
            if let Some(buf) = lent.get_mut(job).and_then(Option::take) {
                landed.push((job, what, buf));
            }
        });
        // Slices landed together are converted on the compute threads,
        // which wait with this one.
        let at = &self.at;
        let done: Vec<Done> = landed
            .into_par_iter()
            .map(|(job, what, mut buf)| {
                let (tensor, shard, offset) = at[job];
                let ring = matches!(what, uring::Landed::Bytes(_));
                let res = match what {
                    uring::Landed::Bytes(src) => {
                        ctx.convert_from(tensor, shard, &mut buf, src.bytes())
                    }
                    uring::Landed::Elsewhere => {
                        ctx.read_into(tensor, shard, offset, &mut buf, &Mutex::new(None))
                    }
                    uring::Landed::Failed(e) => Err((shard, e)),
                };
                Done {
                    job,
                    buf,
                    res,
                    ring,
                }
            })
            .collect();
        out.extend(done);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A demand read counts in its wave's gate while its bytes are read and
    /// is out of it when they convert: the lookahead's reads queued behind
    /// it get the disk while it converts, never while it reads.
    #[test]
    fn a_demand_read_leaves_its_gate_once_read_before_it_converts() {
        let dir = std::env::temp_dir().join(format!("longhaul-gate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("tiny.gguf");
        crate::synth::write(&crate::synth::SynthSpec::tiny(), &path).expect("write");
        let file = gguf::Model::open(&path).expect("open");
        let t = file
            .tensor("blk.0.ffn_up_exps.weight")
            .expect("tensor")
            .clone();
        let len = t.len as usize / 2;
        let gate = Arc::new(ReadGate::default());
        // The gate's count when the read is made, and when it converts.
        let (at_read, at_convert) = (
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(Mutex::new(Vec::new())),
        );
        let (g, r) = (gate.clone(), at_read.clone());
        file.set_read_fault(Some(Arc::new(move |_, _, _| {
            r.lock().unwrap().push(*g.left());
            None
        })));
        let (g, c) = (gate.clone(), at_convert.clone());
        let convert: crate::backend::SlotConvert = Arc::new(move |_, dst, src| {
            c.lock().unwrap().push(*g.left());
            if let Some(src) = src {
                dst.copy_from_slice(src);
            }
            Ok(())
        });
        let ctx = ReadCtx {
            file: &file,
            checksum: false,
            convert: Some(crate::backend::SlotConverter {
                units: Arc::from([len]),
                convert,
            }),
        };
        let (tx, rx) = mpsc::channel();
        ctx.read_one(SliceRead {
            job: 0,
            skip: None,
            tensor: 0,
            shard: t.shard,
            offset: t.offset,
            buf: vec![0; len],
            tx,
            arrival: Some(Arrival::new(&gate)),
            after: None,
        });
        file.set_read_fault(None);
        assert_eq!(*at_read.lock().unwrap(), [1], "counted while reading");
        assert_eq!(*at_convert.lock().unwrap(), [0], "out before converting");
        let done = rx.recv().expect("answered");
        assert!(matches!(done.res, Ok(Some(_))));
        let mut want = vec![0; len];
        file.read_at(t.shard, t.offset, &mut want).expect("read");
        assert!(done.buf == want, "the slice's bytes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
