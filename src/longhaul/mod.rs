//! Longhaul: routed experts are not resident. Each MoE layer owns a fixed
//! number of expert slots in a backend slot store; at the layer's sync point
//! the planner ([`cache::LayerCache`]) maps the batch's expert ids to slots,
//! the loader reads missing experts from the GGUF shard that owns them with
//! positional reads straight into their slots, and the backend computes over
//! the slots with slot ids. This module knows files and slots; it knows
//! nothing about architectures or concrete backends.

pub mod advisor;
pub mod cache;
mod fill;
mod loader;
pub mod lookahead;
mod stats;
pub mod trace;
#[cfg(target_os = "linux")]
pub mod uring;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use crate::backend::{BackendError, SlotStore, SlotTensor};
use crate::gguf::{self, GgufError, TensorInfo};
pub use cache::{LayerCache, Policy, Wave};
use fill::{Arrival, ReadCtx, SliceRead};
pub use fill::{Fill, ReadGate};
#[cfg(target_os = "linux")]
use fill::{RingReads, RING_WAVE};
pub use loader::{
    io_scope, prepare_files, read_parallel, read_parallel_converting, release_pages, IoScope,
};
pub use lookahead::{AutoLookahead, Lookahead, LookaheadChoice};
pub use stats::{steps_floor_tps, steps_total, CacheStats, StepClock, StepCost};

#[derive(Debug, thiserror::Error)]
pub enum LonghaulError {
    #[error("--longhaul-cache {budget_gib:.3} GiB holds no expert per layer: one expert in each of the {n_layers} MoE layers needs {min_gib:.3} GiB; raise --longhaul-cache to at least that")]
    BudgetTooSmall {
        budget_gib: f64,
        min_gib: f64,
        n_layers: usize,
    },
    #[error("routed tensor `{name}` has no expert axis (dims {dims:?})")]
    NotStacked { name: String, dims: Vec<u64> },
    #[error("reading experts of layer {layer} from {path}: {source}; check that the model file is still there and readable, then retry")]
    Read {
        layer: usize,
        path: String,
        source: GgufError,
    },
    /// The file changed while experts were read from it: the bytes read are
    /// not used (their slots stay empty).
    #[error("layer {layer}: {source}")]
    FileChanged { layer: usize, source: GgufError },
    #[error("internal error: layer {layer}'s plan expected expert {expert} in slot {slot}, which no longer holds it; nothing was computed from it, retry the request")]
    StalePlan {
        layer: usize,
        expert: u32,
        slot: u32,
    },
    #[error(transparent)]
    Backend(#[from] BackendError),
}

const GIB: f64 = (1u64 << 30) as f64;

/// Bytes in the largest binary unit that keeps a digit before the point.
pub fn fmt_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / GIB),
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// Longhaul settings: the expert budget (`--longhaul-cache`) and the policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LonghaulConfig {
    pub budget_bytes: u64,
    pub policy: Policy,
    /// Lookahead prefetch: while layer L computes, read the experts layer
    /// L+1's router picks from layer L's input (always, never, or where
    /// decode steps measure faster with it).
    pub prefetch: Lookahead,
    /// Checksum every expert slice when it is first read and compare every
    /// later read of it (`--longhaul-verify`): a file rewritten in place is
    /// caught at the first expert whose bytes differ.
    pub verify: bool,
    /// Expert reads with direct I/O where the file system allows it
    /// (`--longhaul-io dio`, the default): the slots are the cache, so the
    /// page cache's copy, its eviction and its CPU time are waste.
    pub direct_io: bool,
    /// Decode-sized waves' direct reads submitted at once through io_uring
    /// by the sync point's thread (`--longhaul-io uring`, Linux), the
    /// slices that land converted into their slots on the compute threads.
    /// Larger waves, and every wave where the kernel gives no ring, go
    /// through the I/O threads; slices direct I/O refuses are read buffered.
    pub uring: bool,
}

/// Where a routed tensor's experts live in the file.
#[derive(Clone, Debug)]
struct ExpertTensor {
    shard: usize,
    offset: u64,
    expert_bytes: u64,
    /// Bytes of the whole stacked tensor.
    len: u64,
}

/// One expert's slice of each stacked routed tensor (the expert axis is the
/// last ggml dim, so expert `e` is `expert_bytes` at `offset + e * expert_bytes`).
pub fn slot_tensors(
    tensors: &[&TensorInfo],
    repack: bool,
) -> Result<Vec<SlotTensor>, LonghaulError> {
    tensors
        .iter()
        .map(|t| {
            let n_expert = *t.dims.last().unwrap_or(&0);
            if t.dims.len() < 2 || n_expert == 0 || t.len % n_expert != 0 {
                return Err(LonghaulError::NotStacked {
                    name: t.name.clone(),
                    dims: t.dims.clone(),
                });
            }
            Ok(SlotTensor {
                ty: t.ty,
                dims: t.dims[..t.dims.len() - 1].to_vec(),
                bytes: t.len / n_expert,
                repack,
            })
        })
        .collect()
}

/// Slots per MoE layer for a budget: `budget / (n_layers * expert_bytes)`,
/// rounded down, at most every expert.
pub fn slots_for_budget(
    budget: u64,
    n_layers: usize,
    expert_bytes: u64,
    n_expert: usize,
) -> Result<usize, LonghaulError> {
    let per_slot = (n_layers as u64).max(1) * expert_bytes.max(1);
    let n = (budget / per_slot) as usize;
    if n == 0 {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(LonghaulError::BudgetTooSmall {
            budget_gib: gib(budget),
            min_gib: gib(per_slot),
            n_layers,
        });
    }
    Ok(n.min(n_expert))
}

/// The streamed experts of one MoE layer: planner, slots and file layout.
pub struct StreamedLayer<S: SlotStore> {
    layer: usize,
    pub cache: LayerCache,
    pub slots: S,
    tensors: Vec<ExpertTensor>,
    pub stats: CacheStats,
    /// Experts of the last prefetch, until the next batch is planned.
    prefetched: Vec<u32>,
    /// Speculative reads started by [`StreamedLayer::start_prefetch`] and
    /// not yet settled.
    inflight: Option<Fill>,
    /// A lookahead's reads still in flight that the batch planned by
    /// [`StreamedLayer::plan_adopting`] uses, for its wave to take over.
    adopted: Option<Fill>,
    /// With `--longhaul-verify`: the CRC-32 of each `(expert, tensor)` slice
    /// as first read, at `expert * n_tensors + tensor`.
    checksums: Option<Vec<Option<u32>>>,
    /// Reads through io_uring ([`LonghaulConfig::uring`]).
    uring: bool,
}

impl<S: SlotStore> StreamedLayer<S> {
    /// `tensors` are the layer's stacked routed tensors, in the order of the
    /// slot store's tensors.
    pub fn new(
        layer: usize,
        tensors: &[&TensorInfo],
        slots: S,
        n_slots: usize,
        policy: Policy,
    ) -> Result<Self, LonghaulError> {
        let specs = slot_tensors(tensors, false)?;
        let n_expert = tensors
            .first()
            .and_then(|t| t.dims.last())
            .copied()
            .unwrap_or(0) as usize;
        Ok(Self {
            layer,
            cache: LayerCache::new(n_expert, n_slots, policy),
            slots,
            tensors: tensors
                .iter()
                .zip(&specs)
                .map(|(t, s)| ExpertTensor {
                    shard: t.shard,
                    offset: t.offset,
                    expert_bytes: s.bytes,
                    len: t.len,
                })
                .collect(),
            stats: CacheStats::default(),
            prefetched: Vec::new(),
            inflight: None,
            adopted: None,
            checksums: None,
            uring: false,
        })
    }

    /// Submits each decode-sized wave's reads in one batch through
    /// io_uring (see [`LonghaulConfig::uring`]) instead of one positional
    /// read per I/O thread.
    pub fn batched_reads(mut self, on: bool) -> Self {
        self.uring = on;
        self
    }

    /// Checksums every expert slice read from now on (see
    /// [`LonghaulConfig::verify`]).
    pub fn verify_reads(mut self) -> Self {
        self.checksums = Some(vec![None; self.cache.n_expert() * self.tensors.len()]);
        self
    }

    /// Plans a batch (see [`LayerCache::plan`]) and counts hits and misses,
    /// after settling a lookahead's reads still in flight (see
    /// [`StreamedLayer::settle_prefetch`]).
    pub fn plan(&mut self, file: &gguf::Model, ids: &[u32]) -> Vec<Wave> {
        self.settle_prefetch(file);
        let waves = self.cache.plan(ids);
        let used = self.prefetched.iter().filter(|e| ids.contains(e)).count() as u64;
        let prefetched = !self.prefetched.is_empty();
        self.count_plan(&waves, prefetched.then_some(used));
        waves
    }

    /// [`StreamedLayer::plan`] without waiting for a lookahead's reads still
    /// in flight, where the batch fits in one wave beside them
    /// ([`LayerCache::plan_landing`]): the experts they bring that the batch
    /// uses are computed as soon as they land, the others' reads not yet
    /// started are dropped, and the wave's own reads start at once, with
    /// the cached experts computed meanwhile. The wave must then go through
    /// [`StreamedLayer::start_wave`] (or [`StreamedLayer::load`]).
    pub fn plan_adopting(&mut self, file: &gguf::Model, ids: &[u32]) -> Vec<Wave> {
        let Some(fill) = self.inflight.take() else {
            return self.plan(file, ids);
        };
        let Some(wave) = self.cache.plan_landing(ids, &fill.wave.loads) else {
            self.inflight = Some(fill);
            return self.plan(file, ids);
        };
        let used = fill
            .wave
            .loads
            .iter()
            .filter(|l| wave.experts.iter().any(|x| x.0 == l.0))
            .count() as u64;
        self.prefetched.clear();
        self.adopted = Some(fill);
        let waves = vec![wave];
        self.count_plan(&waves, Some(used));
        waves
    }

    /// Counts a plan's hits and misses, and with `used`, how many experts
    /// of the last lookahead it uses.
    fn count_plan(&mut self, waves: &[Wave], used: Option<u64>) {
        let mut misses = 0;
        for w in waves {
            misses += w.loads.len() as u64;
            self.stats.hits += (w.experts.len() - w.loads.len()) as u64;
        }
        self.stats.misses += misses;
        if let Some(used) = used {
            self.stats.prefetch_used += used;
            self.stats.prefetch_wanted += used + misses;
            self.prefetched.clear();
        }
        self.stats.waves += waves.len() as u64;
        if waves.len() > 1 {
            self.stats.multi_wave_batches += 1;
        }
    }

    /// Reads the wave's missing experts into their slots and records the
    /// wave resident. On failure the wave's load slots stay empty (they were
    /// recorded empty before the first byte was written), so a retry reads
    /// them again and nothing computes from a partly written slot.
    pub fn load(&mut self, file: &gguf::Model, wave: &Wave) -> Result<(), LonghaulError> {
        self.begin_wave(file, wave)?;
        self.read_blocking(file, &wave.loads)?;
        self.cache.finish_wave(wave);
        Ok(())
    }

    /// [`LayerCache::begin_wave`], its stale plan as this layer's error,
    /// after settling a lookahead still in flight (whose slots are recorded
    /// empty, so a plan may have taken them).
    fn begin_wave(&mut self, file: &gguf::Model, wave: &Wave) -> Result<(), LonghaulError> {
        self.settle_prefetch(file);
        self.cache.begin_wave(wave).map_err(|s| self.stale(s))
    }

    fn stale(&self, s: cache::StaleWave) -> LonghaulError {
        LonghaulError::StalePlan {
            layer: self.layer,
            expert: s.expert,
            slot: s.slot,
        }
    }

    /// Reads `loads` into their slots while the caller waits, counting the
    /// wait as both read and blocked time.
    fn read_blocking(
        &mut self,
        file: &gguf::Model,
        loads: &[(u32, u32)],
    ) -> Result<(), LonghaulError> {
        let t0 = Instant::now();
        let res = self.read(file, loads, None);
        self.stats.io_time += t0.elapsed();
        self.stats.read_time += t0.elapsed();
        self.stats.bytes_read += res.as_ref().copied().unwrap_or(0);
        res.map(drop)
    }

    /// Starts a wave: its cached experts are ready at once
    /// ([`Fill::take_ready`]), and its missing experts are read on `io`
    /// straight into buffers lent by the slot store, each expert ready as
    /// soon as its reads are in ([`StreamedLayer::wait_loaded`]). A store
    /// that lends no buffers is filled here, before returning. Run
    /// [`StreamedLayer::finish_wave`] once nothing is pending. Until then
    /// the load slots stay recorded empty, so after any failure nothing is
    /// recorded from the wave's reads and a retry reads them again.
    pub fn start_wave<'s>(
        &mut self,
        file: &'s gguf::Model,
        wave: &Wave,
        io: &IoScope<'s>,
    ) -> Result<Fill, LonghaulError> {
        if let Some(mut fill) = self.adopted.take() {
            let landing = fill.wave.loads.clone();
            if let Err(s) = self.cache.begin_wave_landing(wave, &landing) {
                fill.skip_all();
                self.inflight = Some(fill);
                self.settle_prefetch(file);
                return Err(self.stale(s));
            }
            let first = fill.wave.loads.len();
            fill.adopt(wave, self.tensors.len());
            let spawned = self.spawn_reads(file, &mut fill, io, first);
            fill.tx = None;
            let e = match spawned {
                Ok(true) => return Ok(fill),
                // The store lent the lookahead its slots but not the wave.
                Ok(false) => LonghaulError::Backend(BackendError::Shape {
                    op: "start_wave",
                    detail: "the slot store stopped lending its slots".into(),
                }),
                Err(e) => e,
            };
            // Nothing of the wave was lent; the lookahead's reads are waited
            // out and their buffers put back, all recorded empty.
            while fill.pending() && self.wait_loaded(file, &mut fill).is_ok() {}
            return Err(e);
        }
        self.begin_wave(file, wave)?;
        let mut fill = Fill::new(wave, self.tensors.len(), false);
        if wave.loads.is_empty() {
            return Ok(fill);
        }
        #[cfg(target_os = "linux")]
        if self.uring && fill.which.len() <= RING_WAVE && self.start_ring(file, &mut fill)? {
            return Ok(fill);
        }
        if !self.spawn_reads(file, &mut fill, io, 0)? {
            self.read_blocking(file, &wave.loads)?;
            fill.ready.extend(wave.loads.iter().map(|l| l.0));
        }
        Ok(fill)
    }

    /// Lends the slots of `fill`'s loads (already recorded empty) and
    /// submits all their reads through an io_uring, which
    /// [`StreamedLayer::wait_loaded`] takes as they land. Returns false,
    /// having read nothing, when the store cannot lend its slots or the
    /// system gives no io_uring.
    #[cfg(target_os = "linux")]
    fn start_ring(&mut self, file: &gguf::Model, fill: &mut Fill) -> Result<bool, LonghaulError> {
        let n_t = self.tensors.len();
        let at: Vec<(usize, usize, u64)> = (0..fill.which.len())
            .map(|job| {
                let e = fill.wave.loads[job / n_t].0;
                let t = &self.tensors[job % n_t];
                (job % n_t, t.shard, t.offset + e as u64 * t.expert_bytes)
            })
            .collect();
        let lent = match self.slots.detach(&fill.which) {
            Some(lent) => lent?,
            None => return Ok(false),
        };
        let slices = at
            .iter()
            .zip(&lent)
            .map(|(&(_, shard, offset), buf)| uring::Slice {
                shard,
                offset,
                len: buf.len(),
            })
            .collect();
        // One chain per routed tensor: an expert's slices are read side by
        // side, and experts one after another, so the first is computed
        // while the next are read.
        let Some(batch) = uring::Batch::chained(slices, n_t) else {
            // No ring: the slots take their buffers back, still recorded
            // empty, for the I/O threads to read.
            self.slots.attach(&fill.which, lent)?;
            return Ok(false);
        };
        fill.pending += lent.len();
        let mut ring = RingReads {
            batch,
            lent: lent.into_iter().map(Some).collect(),
            at,
            checksum: self.checksums.is_some(),
            convert: self.slots.converter(),
            early: Vec::new(),
        };
        // Submit now: the reads run while the wave's cached experts compute.
        ring.early = ring.poll(file, false);
        fill.ring = Some(ring);
        Ok(true)
    }

    /// Lends the slots of `fill`'s loads from `from_load` on (already
    /// recorded empty) and spawns their reads on `io`, each slice one task's
    /// positional read, taking the store's layout on the reading thread; a
    /// lookahead's read not yet started once its skip flag is set is
    /// dropped. Returns false, having read
    /// nothing, when the store cannot lend its slots.
    fn spawn_reads<'s>(
        &mut self,
        file: &'s gguf::Model,
        fill: &mut Fill,
        io: &IoScope<'s>,
        from_load: usize,
    ) -> Result<bool, LonghaulError> {
        let n_t = self.tensors.len();
        let first = from_load * n_t;
        if first == fill.which.len() {
            return Ok(true);
        }
        let lent = match self.slots.detach(&fill.which[first..]) {
            Some(lent) => lent?,
            None => return Ok(false),
        };
        let tx = match &fill.tx {
            Some(tx) => tx.clone(),
            None => {
                let (tx, rx) = mpsc::channel();
                fill.rx = Some(rx);
                tx
            }
        };
        if fill.speculative {
            fill.tx = Some(tx.clone());
        }
        let reads: Vec<SliceRead> = lent
            .into_iter()
            .enumerate()
            .map(|(i, buf)| {
                let job = first + i;
                let e = fill.wave.loads[job / n_t].0;
                let ti = job % n_t;
                let t = &self.tensors[ti];
                SliceRead {
                    job,
                    skip: fill
                        .skip
                        .clone()
                        .filter(|f| job / n_t < f.len())
                        .map(|f| (f, job / n_t)),
                    tensor: ti,
                    shard: t.shard,
                    offset: t.offset + e as u64 * t.expert_bytes,
                    buf,
                    tx: tx.clone(),
                    arrival: Some(Arrival::new(&fill.gate)),
                    after: fill.after.clone(),
                }
            })
            .collect();
        fill.pending += reads.len();
        let ctx = ReadCtx {
            file,
            checksum: self.checksums.is_some(),
            convert: self.slots.converter(),
        };
        for r in reads {
            let ctx = ctx.clone();
            io.spawn(move |_| ctx.read_one(r));
        }
        Ok(true)
    }

    /// Blocks until at least one more expert of `fill` is read (or nothing
    /// is pending), puts the buffers of every expert read so far back into
    /// their slots and makes those experts ready. After a failed read it
    /// waits for the rest of the wave's reads, returns every buffer, and
    /// fails with the read's error.
    pub fn wait_loaded(
        &mut self,
        file: &gguf::Model,
        fill: &mut Fill,
    ) -> Result<(), LonghaulError> {
        self.take_loaded(file, fill, true)
    }

    /// [`StreamedLayer::wait_loaded`] without the wait: takes in the reads
    /// of `fill` that have already answered, and returns.
    pub fn poll_loaded(
        &mut self,
        file: &gguf::Model,
        fill: &mut Fill,
    ) -> Result<(), LonghaulError> {
        self.take_loaded(file, fill, false)
    }

    fn take_loaded(
        &mut self,
        file: &gguf::Model,
        fill: &mut Fill,
        mut block: bool,
    ) -> Result<(), LonghaulError> {
        if !fill.reads_started() {
            return Ok(());
        }
        let n_t = self.tensors.len().max(1);
        let t0 = Instant::now();
        while fill.pending > 0 {
            let Some(answers) = fill.answers(file, block) else {
                // Every reader is gone with reads unanswered (a read task
                // panicked): their slots stay empty and get fresh buffers.
                fill.pending = 0;
                let path = file
                    .shards()
                    .first()
                    .map(|s| s.path.clone())
                    .unwrap_or_default();
                let source = std::io::Error::other("an expert read ended without a result");
                fill.error
                    .get_or_insert((0, GgufError::Io { path, source }));
                break;
            };
            if answers.is_empty() && !block {
                break;
            }
            for d in answers {
                fill.pending -= 1;
                let li = d.job / n_t;
                match d.res {
                    Ok(Some(crc)) => {
                        fill.crcs[d.job] = crc;
                        fill.bytes += d.buf.len() as u64;
                        if li < fill.spec_loads {
                            fill.spec_bytes += d.buf.len() as u64;
                        }
                        self.stats.uring_reads += d.ring as u64;
                    }
                    // An expert the batch does not use may fail to load.
                    Ok(None) | Err(_) if fill.optional[li] => fill.dropped[li] = true,
                    Ok(None) => fill.dropped[li] = true,
                    Err(e) => {
                        fill.error.get_or_insert(e);
                    }
                }
                fill.bufs[d.job] = Some(d.buf);
                fill.left[li] -= 1;
                if fill.left[li] == 0 && fill.error.is_none() {
                    let jobs = li * n_t..(li + 1) * n_t;
                    let bufs = fill.bufs[jobs.clone()]
                        .iter_mut()
                        .filter_map(Option::take)
                        .collect();
                    self.slots.attach(&fill.which[jobs], bufs)?;
                    // A dropped read leaves its expert's slot empty.
                    if !fill.dropped[li] && !fill.optional[li] {
                        fill.ready.push(fill.wave.loads[li].0);
                        block = false;
                    }
                }
                if fill.error.is_some() {
                    block = true;
                }
            }
        }
        self.stats.io_time += t0.elapsed();
        if fill.pending > 0 {
            return Ok(());
        }
        if !fill.speculative {
            self.stats.read_time += fill.started.elapsed();
        }
        let Some((shard, source)) = fill.error.take() else {
            return Ok(());
        };
        // Give every buffer back; their slots stay recorded empty.
        let (which, bufs): (Vec<_>, Vec<_>) = fill
            .which
            .iter()
            .zip(&mut fill.bufs)
            .filter_map(|(w, b)| Some((*w, b.take()?)))
            .unzip();
        let attached = self.slots.attach(&which, bufs);
        self.release_all(file);
        attached?;
        let path = file
            .shards()
            .get(shard)
            .map(|s| s.path.display().to_string())
            .unwrap_or_default();
        Err(LonghaulError::Read {
            layer: self.layer,
            path,
            source,
        })
    }

    /// Records `fill`'s wave resident once none of its reads is pending:
    /// makes the slots visible to the backend, drops the reads' pages, and
    /// checks the file is unchanged and (with `--longhaul-verify`) the
    /// checksums, before any load slot is recorded as filled.
    pub fn finish_wave(
        &mut self,
        file: &gguf::Model,
        fill: &mut Fill,
    ) -> Result<(), LonghaulError> {
        if fill.pending() {
            return Err(LonghaulError::Backend(
                crate::backend::BackendError::Shape {
                    op: "finish_wave",
                    detail: "reads of the wave are still in flight".into(),
                },
            ));
        }
        let n_t = self.tensors.len();
        if fill.end_reads() {
            let (landed, crcs) = fill.landed(n_t);
            self.stats.bytes_read += fill.bytes;
            self.stats.prefetch_bytes += fill.spec_bytes;
            self.stats.adopted_bytes += fill.spec_bytes;
            self.check_landed(file, &landed, crcs)?;
        }
        // A lookahead's read of an expert the batch uses is never dropped
        // (see `Fill::adopt`); were it, the batch would miss that expert.
        let missing = (0..fill.wave.loads.len()).find(|&li| fill.dropped[li] && !fill.optional[li]);
        if let Some(li) = missing {
            return Err(LonghaulError::Backend(BackendError::Shape {
                op: "finish_wave",
                detail: format!("expert {} of the wave was not read", fill.wave.loads[li].0),
            }));
        }
        let dropped: Vec<u32> = (0..fill.wave.loads.len())
            .filter(|&li| fill.dropped[li])
            .map(|li| fill.wave.loads[li].0)
            .collect();
        let adopted = (0..fill.spec_loads).filter(|&li| !fill.dropped[li]).count();
        self.stats.prefetched += adopted as u64;
        if dropped.is_empty() {
            self.cache.finish_wave(&fill.wave);
        } else {
            let mut wave = fill.wave.clone();
            wave.experts.retain(|(e, _)| !dropped.contains(e));
            self.cache.finish_wave(&wave);
        }
        Ok(())
    }

    /// What must hold before `loads` (read through lent buffers, now back
    /// in their slots) are recorded as filled: the slots made visible to the
    /// backend, the reads' pages dropped, the file unchanged, and (with
    /// `--longhaul-verify`) each slice's checksum `crcs` (expert-major, as
    /// read) equal to its first read's.
    fn check_landed(
        &mut self,
        file: &gguf::Model,
        loads: &[(u32, u32)],
        crcs: Vec<u32>,
    ) -> Result<(), LonghaulError> {
        self.land(file)?;
        self.check_sums(file, loads, crcs)
    }

    /// After reads into lent slot buffers: the slots made visible to the
    /// backend, the reads' pages dropped (also when that fails), and the
    /// file checked unchanged, since bytes read while it changed are not the
    /// model's. Nothing read may be recorded as filled before this passes.
    fn land(&mut self, file: &gguf::Model) -> Result<(), LonghaulError> {
        let committed = self.slots.commit();
        self.release_all(file);
        committed?;
        file.files_unchanged()
            .map_err(|source| LonghaulError::FileChanged {
                layer: self.layer,
                source,
            })
    }

    /// Drops the page cache of every stacked routed tensor of the layer.
    fn release_all(&self, file: &gguf::Model) {
        // Whole tensors, not slice by slice: the kernel keeps any page-cache
        // folio only partly inside a range, and large folios straddle slice
        // boundaries.
        for t in &self.tensors {
            release_pages(file, t.shard, t.offset, t.len);
        }
    }

    /// Starts speculative reads of `predicted` experts (deduplicated by the
    /// caller) on `io` and returns at once: the layer is not held while they
    /// run. Their slots are recorded empty and lent to the reads until
    /// [`StreamedLayer::settle_prefetch`] (which the next [`StreamedLayer::plan`]
    /// runs first) takes them back and records the experts read in full.
    /// The layer's next batch takes over the reads still in flight
    /// ([`StreamedLayer::plan_adopting`]) or settles them; either way reads
    /// not yet started whose experts it does not use are dropped, so its
    /// own demand reads never queue behind them. With `after` (the reads of
    /// the layer before, from [`Fill::demand_gate`]), each read, spawned
    /// now, waits for those before it starts. Returns false, starting
    /// nothing, when the store cannot lend its slots (use
    /// [`StreamedLayer::prefetch`]).
    pub fn start_prefetch<'s>(
        &mut self,
        file: &'s gguf::Model,
        predicted: &[u32],
        io: &IoScope<'s>,
        after: Option<Arc<ReadGate>>,
    ) -> bool {
        if self.slots.detach(&[]).is_none() {
            return false;
        }
        self.stats.guessed += predicted.len() as u64;
        self.settle_prefetch(file);
        let loads = self.cache.prefetch(predicted);
        if loads.is_empty() {
            return true;
        }
        self.cache.begin_loads(&loads);
        let wave = Wave {
            experts: loads.clone(),
            loads,
        };
        let mut fill = Fill::new(&wave, self.tensors.len(), true);
        fill.after = after;
        // A store that fails to lend keeps its slots, recorded empty.
        if let Ok(true) = self.spawn_reads(file, &mut fill, io, 0) {
            self.inflight = Some(fill);
        }
        true
    }

    /// Waits for the reads of a [`StreamedLayer::start_prefetch`] still in
    /// flight, puts every lent buffer back, and records the experts whose
    /// reads all completed (after the file and checksum checks a demand wave
    /// makes). A failed or dropped read is not an error: its slot stays
    /// empty, and so do all of them when the file changed.
    pub fn settle_prefetch(&mut self, file: &gguf::Model) {
        // A lookahead planned around but not taken over by a wave.
        if let Some(fill) = self.adopted.take() {
            self.inflight.get_or_insert(fill);
        }
        let Some(mut fill) = self.inflight.take() else {
            return;
        };
        fill.skip_all();
        let mut done = Vec::new();
        while fill.pending() {
            let waited = self.wait_loaded(file, &mut fill);
            done.extend(fill.take_ready());
            if waited.is_err() {
                break;
            }
        }
        self.stats.bytes_read += fill.bytes;
        self.stats.prefetch_bytes += fill.bytes;
        if fill.pending() || fill.error.is_some() {
            return;
        }
        // The experts read in full, with their slices' checksums.
        let n_t = self.tensors.len().max(1);
        let (loads, crcs): (Vec<(u32, u32)>, Vec<&[u32]>) = fill
            .wave
            .loads
            .iter()
            .zip(fill.crcs.chunks(n_t))
            .filter(|((e, _), _)| done.contains(e))
            .unzip();
        let crcs = crcs.concat();
        if self.check_landed(file, &loads, crcs).is_err() {
            return;
        }
        self.cache.finish_loads(&loads);
        self.stats.prefetched += loads.len() as u64;
        self.prefetched = loads.iter().map(|l| l.0).collect();
    }

    /// Speculatively reads `predicted` experts (deduplicated by the caller)
    /// into slots. Reads not started when `cancel` is set are dropped; a
    /// failed or cancelled prefetch leaves its slots empty and is not an error.
    pub fn prefetch(&mut self, file: &gguf::Model, predicted: &[u32], cancel: &AtomicBool) {
        // Too late: the layer's own sync point came first.
        if cancel.load(Ordering::Relaxed) {
            return;
        }
        self.stats.guessed += predicted.len() as u64;
        self.settle_prefetch(file);
        let loads = self.cache.prefetch(predicted);
        if loads.is_empty() {
            return;
        }
        self.cache.begin_loads(&loads);
        if let Ok(bytes) = self.read(file, &loads, Some(cancel)) {
            self.cache.finish_loads(&loads);
            self.stats.prefetched += loads.len() as u64;
            self.stats.prefetch_bytes += bytes;
            self.stats.bytes_read += bytes;
            self.prefetched = loads.iter().map(|l| l.0).collect();
        }
    }

    /// Reads `loads` into their slots (already recorded empty by the caller).
    fn read(
        &mut self,
        file: &gguf::Model,
        loads: &[(u32, u32)],
        cancel: Option<&AtomicBool>,
    ) -> Result<u64, LonghaulError> {
        if loads.is_empty() {
            return Ok(0);
        }
        let which: Vec<(usize, usize)> = loads
            .iter()
            .flat_map(|&(_, s)| (0..self.tensors.len()).map(move |t| (t, s as usize)))
            .collect();
        let res = {
            let dsts = self.slots.slots_mut(&which)?;
            let jobs: Vec<loader::Job> = loads
                .iter()
                .flat_map(|&(e, _)| self.tensors.iter().map(move |t| (t, e)))
                .zip(dsts)
                .map(|((t, e), dst)| loader::Job {
                    shard: t.shard,
                    offset: t.offset + e as u64 * t.expert_bytes,
                    dst,
                })
                .collect();
            loader::read_all(file, jobs, cancel, self.checksums.is_some())
        };
        self.land(file)?;
        let (bytes, crcs) = res.map_err(|(shard, source)| {
            let path = file
                .shards()
                .get(shard)
                .map(|s| s.path.display().to_string())
                .unwrap_or_default();
            LonghaulError::Read {
                layer: self.layer,
                path,
                source,
            }
        })?;
        self.check_sums(file, loads, crcs)?;
        Ok(bytes)
    }

    /// With `--longhaul-verify`: records each `(expert, tensor)` checksum of
    /// `loads` (expert-major, as read) the first time, and fails on one that
    /// differs from an earlier read.
    fn check_sums(
        &mut self,
        file: &gguf::Model,
        loads: &[(u32, u32)],
        crcs: Vec<u32>,
    ) -> Result<(), LonghaulError> {
        if let Some(sums) = &mut self.checksums {
            let n_t = self.tensors.len();
            let keys = loads
                .iter()
                .flat_map(|&(e, _)| (0..n_t).map(move |t| (e, t)));
            // Record first, compare later; a mismatch records nothing.
            let mut fresh = Vec::new();
            for ((e, t), crc) in keys.zip(crcs) {
                let at = e as usize * n_t + t;
                match sums.get(at).copied().flatten() {
                    Some(old) if old != crc => {
                        let path = file
                            .shards()
                            .get(self.tensors[t].shard)
                            .map(|s| s.path.clone())
                            .unwrap_or_default();
                        return Err(LonghaulError::FileChanged {
                            layer: self.layer,
                            source: GgufError::FileChanged {
                                path,
                                what: format!(
                                    "expert {e} read with checksum {crc:08x}, earlier {old:08x}"
                                ),
                            },
                        });
                    }
                    Some(_) => {}
                    None => fresh.push((at, crc)),
                }
            }
            for (at, crc) in fresh {
                sums[at] = Some(crc);
            }
        }
        Ok(())
    }
}
