//! The longhaul runtime of a model ([`Runtime`]: streamed layers, lookahead
//! prefetch, routing trace) and the MoE sync point in longhaul mode: route,
//! plan, load, remap expert ids to slot ids, compute. The planner and loader
//! live in `crate::longhaul`; this file only ties them to a layer's experts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

use super::blocks::ffn::{self, Experts, Ffn, MoeFfn, ROUTED};
use super::blocks::Pass;
use super::{Model, ModelError};
use crate::backend::{Backend, SlotStore};
use crate::gguf::{self, TensorInfo};
use crate::longhaul::trace::TraceWriter;
use crate::longhaul::{
    self, AutoLookahead, CacheStats, LonghaulConfig, Lookahead, LookaheadChoice, ReadGate,
    StreamedLayer,
};

/// What a model needs at run time beyond its weights: in longhaul mode the
/// streamed experts of each MoE layer and the lookahead prefetch; in any
/// mode, where routing decisions are recorded (`--trace-experts`).
pub struct Runtime<S: SlotStore> {
    /// Per layer: its streamed experts (`None` for dense layers, or
    /// everywhere in resident mode).
    streamed: Vec<Option<Mutex<StreamedLayer<S>>>>,
    /// Slots per MoE layer in longhaul mode.
    n_slots: usize,
    lookahead: LookaheadMode,
    /// Per layer, the flag that stops a prefetch not yet started once the
    /// layer's own sync point arrives.
    prefetch_cancel: Vec<AtomicBool>,
    trace: Option<TraceWriter>,
}

impl<S: SlotStore> Runtime<S> {
    /// A resident model's runtime over `n_layer` layers.
    pub(super) fn resident(n_layer: usize) -> Self {
        Runtime {
            streamed: (0..n_layer).map(|_| None).collect(),
            n_slots: 0,
            lookahead: LookaheadMode::Fixed(false),
            prefetch_cancel: (0..n_layer).map(|_| AtomicBool::new(false)).collect(),
            trace: None,
        }
    }

    /// Layer `il`'s streamed experts, in longhaul mode.
    pub(super) fn streamed(&self, il: usize) -> Option<&Mutex<StreamedLayer<S>>> {
        self.streamed.get(il).and_then(Option::as_ref)
    }

    pub(super) fn n_slots(&self) -> usize {
        self.n_slots
    }

    /// Whether a pass of `n_tokens` rows reads ahead. Under `auto`, a
    /// single-token pass is timed from here to [`Runtime::passed`].
    pub(super) fn pass_arm(&self, n_tokens: usize) -> PassArm {
        match &self.lookahead {
            LookaheadMode::Fixed(on) => PassArm {
                on: *on,
                started: None,
            },
            LookaheadMode::Auto(a) => PassArm {
                on: measured(a).arm(),
                started: (n_tokens == 1).then(std::time::Instant::now),
            },
        }
    }

    /// A pass that [`Runtime::pass_arm`] started has produced its logits.
    pub(super) fn passed(&self, arm: PassArm) {
        if let (Some(t), LookaheadMode::Auto(a)) = (arm.started, &self.lookahead) {
            measured(a).record(arm.on, t.elapsed());
        }
    }

    /// `--longhaul-prefetch auto`'s last measurement.
    pub(super) fn lookahead_choice(&self) -> Option<LookaheadChoice> {
        match &self.lookahead {
            LookaheadMode::Fixed(_) => None,
            LookaheadMode::Auto(a) => measured(a).choice(),
        }
    }

    pub(super) fn set_trace(&mut self, t: TraceWriter) {
        self.trace = Some(t);
    }

    /// Records layer `il`'s routing, when tracing.
    /// Whether a routing trace is attached.
    pub(crate) fn traced(&self) -> bool {
        self.trace.is_some()
    }

    pub(super) fn record(&self, il: usize, ids: &[u32], k: usize) {
        if let Some(t) = &self.trace {
            // A trace is a diagnostic: a failed write must not stop generation.
            let _ = t.record(il, ids, k);
        }
    }

    /// Cache statistics per layer (`None` in resident mode; dense layers
    /// report zeros).
    pub(super) fn stats(&self) -> Option<Vec<CacheStats>> {
        if self.streamed.iter().all(Option::is_none) {
            return None;
        }
        Some(
            self.streamed
                .iter()
                .map(|l| {
                    l.as_ref()
                        .map(|l| l.lock().map(|g| g.stats).unwrap_or_default())
                        .unwrap_or_default()
                })
                .collect(),
        )
    }

    /// The policy each streamed layer's cache evicts by now (LRU or LFU;
    /// see [`crate::longhaul::Policy::Auto`]), dense and resident layers
    /// left out.
    pub(super) fn evicting_by(&self) -> Vec<crate::longhaul::Policy> {
        self.streamed
            .iter()
            .flatten()
            .map(|l| {
                l.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .cache
                    .evicting_by()
            })
            .collect()
    }

    /// Bytes of the expert slots (the longhaul budget actually used).
    pub(super) fn slot_bytes(&self) -> u64 {
        self.streamed
            .iter()
            .flatten()
            .map(|l| l.lock().map(|g| g.slots.bytes()).unwrap_or(0))
            .sum()
    }
}

/// `--longhaul-prefetch`: a fixed switch, or `auto`'s measurements.
enum LookaheadMode {
    Fixed(bool),
    Auto(Mutex<AutoLookahead>),
}

impl From<Lookahead> for LookaheadMode {
    fn from(l: Lookahead) -> Self {
        match l {
            Lookahead::Off => Self::Fixed(false),
            Lookahead::On => Self::Fixed(true),
            Lookahead::Auto => Self::Auto(Mutex::new(AutoLookahead::new())),
        }
    }
}

/// `auto`'s state. Nothing panics while it is held, so even a poisoned lock
/// would guard a whole state: it is used as it is.
fn measured(a: &Mutex<AutoLookahead>) -> std::sync::MutexGuard<'_, AutoLookahead> {
    a.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether one forward pass reads ahead, and since when it is timed.
#[derive(Clone, Copy, Debug)]
pub(super) struct PassArm {
    pub on: bool,
    started: Option<std::time::Instant>,
}

/// The largest one-expert size over the layers' routed tensors.
fn expert_bytes(layers: &[(usize, Vec<&TensorInfo>)]) -> Result<u64, ModelError> {
    // Layers may store their experts in different types (the "dynamic"
    // low-bit mixes): each layer's slots take its own size, so one slot in
    // every layer costs the sum; as a per-layer figure, its mean rounded up
    // (n_layers times it never falls short of the sum).
    let mut sum = 0u64;
    for (_, ts) in layers {
        sum += longhaul::slot_tensors(ts, false)?
            .iter()
            .map(|t| t.bytes)
            .sum::<u64>();
    }
    Ok(sum.div_ceil(layers.len().max(1) as u64))
}

/// The routed tensors of every MoE layer, the NextN head's (loaded for an
/// MTP drafter) after the trunk's.
fn routed<'a, B: Backend>(
    m: &Model<B>,
    file: &'a gguf::Model,
) -> Vec<(usize, Vec<&'a TensorInfo>)> {
    let nextn = m.nextn.as_ref().map(|n| (n.il, &n.layer));
    m.layers
        .iter()
        .enumerate()
        .chain(nextn)
        .filter(|(_, l)| matches!(l.ffn, Ffn::Moe(_)))
        .map(|(il, _)| {
            (
                il,
                ROUTED
                    .iter()
                    .filter_map(|n| file.tensor(&format!("blk.{il}.{n}")))
                    .collect(),
            )
        })
        .collect()
}

/// `(MoE layers, bytes of one expert across a layer's routed tensors)`: one
/// slot in every MoE layer costs their product.
pub(super) fn slot_cost<B: Backend>(m: &Model<B>) -> Result<(usize, u64), ModelError> {
    let layers = routed(m, &m.file);
    Ok((layers.len(), expert_bytes(&layers)?))
}

/// Switches every MoE layer of `m` to streamed experts under `cfg`'s budget;
/// with `repack`, slots hold the backend's kernel layout.
pub(super) fn attach<B: Backend>(
    m: &mut Model<B>,
    cfg: LonghaulConfig,
    repack: bool,
) -> Result<(), ModelError> {
    let file = m.file.clone();
    let layers = routed(m, &file);
    if layers.is_empty() {
        return Err(ModelError::NoExperts {
            arch: m.hp.arch.clone(),
        });
    }
    let expert_bytes = expert_bytes(&layers)?;
    let n_slots =
        longhaul::slots_for_budget(cfg.budget_bytes, layers.len(), expert_bytes, m.hp.n_expert)?;
    for (il, ts) in layers {
        let specs = longhaul::slot_tensors(&ts, repack)?;
        let slots = m.backend.new_slots(&specs, n_slots)?;
        let l = StreamedLayer::new(il, &ts, slots, n_slots, cfg.policy)?.batched_reads(cfg.uring);
        m.runtime.streamed[il] = Some(Mutex::new(if cfg.verify { l.verify_reads() } else { l }));
    }
    m.runtime.n_slots = n_slots;
    m.runtime.lookahead = cfg.prefetch.into();
    Ok(())
}

/// How many of each token's `k` predicted experts a lookahead reads: all
/// but the last (of more than two). A wrong guess costs a whole expert's
/// read and its conversion, and the last rank guesses worst: on the
/// Qwen3-30B-A3B-shaped preset (`--router-skew 1`), the first 4, 6, 7 and
/// 8 of 8 held 93.8%, 89.2%, 86.1% and 81.6% of the experts then used.
/// There, with `--longhaul-policy auto`, reading 7 instead of 6 decoded as
/// fast (tg128 and the tg64 after a pp64, within this 2-core machine's
/// noise) and blocked a third less on reads (`run`, 96 tokens: 7.5-8.2 ms
/// per token against 11.3-11.6), for 6% more bytes read; with LRU, which
/// keeps fewer of the guesses cached, 7 had been 5-10% slower.
fn lookahead_rank(k: usize) -> usize {
    if k <= 2 {
        k
    } else {
        k - 1
    }
}

/// Starts reading, on the I/O pool, the experts that the next MoE layer's
/// router picks from `resid`, this layer's residual stream after its
/// attention, under the next MoE layer's own FFN norm: the input that
/// router will see, less this layer's FFN block and the attention blocks
/// between (a guess). Under this layer's norm instead, which weighs the
/// features otherwise, guesses were right less often: on the
/// Qwen3-30B-A3B-shaped preset (`--router-skew 1`, 64 decode steps), the
/// first 6 of 8 held 89.2% of the experts then used against 86.4%.
fn lookahead<'s, B: Backend>(
    p: &Pass<'_, 's, B>,
    il: usize,
    resid: &B::Tensor,
    after: Option<Arc<ReadGate>>,
) -> Result<(), ModelError> {
    let m = p.m;
    let rt = &m.runtime;
    if !p.lookahead {
        return Ok(());
    }
    let Some((next, layer, f)) =
        m.layers
            .iter()
            .enumerate()
            .skip(il + 1)
            .find_map(|(i, l)| match &l.ffn {
                Ffn::Moe(f) => Some((i, l, f)),
                Ffn::Dense(_) => None,
            })
    else {
        return Ok(());
    };
    let Some(target) = rt.streamed(next) else {
        return Ok(());
    };
    let x = p.norm(resid, &layer.ffn_norm)?;
    let (ids, _) = f.router.route(&f.router.logits(&m.backend, &x)?);
    // Each row's experts come best first; the guesses the router ranks
    // last are the ones most often wrong (see `lookahead_rank`).
    let k = f.router.routing.n_used.max(1);
    let keep = lookahead_rank(k);
    let mut predicted = Vec::new();
    let mut seen = vec![false; m.hp.n_expert];
    for e in ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % k < keep)
        .map(|(_, &e)| e)
    {
        if !std::mem::replace(&mut seen[e as usize], true) {
            predicted.push(e);
        }
    }
    let cancel = &rt.prefetch_cancel[next];
    cancel.store(false, Ordering::Relaxed);
    let file = &m.file;
    // The layer is free (its sync point comes after this one's, on this
    // thread): lend its victim slots to reads on the I/O pool and go on.
    let started = match target.try_lock() {
        Ok(mut l) => l.start_prefetch(file, &predicted, p.io, after),
        Err(TryLockError::Poisoned(poisoned)) => poisoned
            .into_inner()
            .start_prefetch(file, &predicted, p.io, after),
        Err(TryLockError::WouldBlock) => return Ok(()),
    };
    if started {
        return Ok(());
    }
    // A store that cannot lend its slots is read under the layer's lock.
    p.io.spawn(move |_| {
        // A lock held by someone else is the layer's own sync point (it holds
        // it from before its demand read until its experts are computed): the
        // prefetch is too late. Waiting for the lock would also hold an I/O
        // thread that the demand read may be queued behind (with one I/O
        // thread, a deadlock).
        let mut l = match target.try_lock() {
            Ok(l) => l,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        l.prefetch(file, &predicted, cancel);
    });
    Ok(())
}

/// The layer's routed expert weights as views over its slots.
fn slot_experts<B: Backend>(
    b: &B,
    l: &StreamedLayer<B::Slots>,
    resident: &Experts<B::Weight>,
) -> Result<Experts<B::Weight>, ModelError> {
    let mut next = 3;
    let mut bias = |present: bool| -> Result<Option<B::Weight>, ModelError> {
        if !present {
            return Ok(None);
        }
        next += 1;
        Ok(Some(b.slot_weight(&l.slots, next - 1)?))
    };
    Ok(Experts {
        gate_b: bias(resident.gate_b.is_some())?,
        up_b: bias(resident.up_b.is_some())?,
        down_b: bias(resident.down_b.is_some())?,
        gate: b.slot_weight(&l.slots, 0)?,
        up: b.slot_weight(&l.slots, 1)?,
        down: b.slot_weight(&l.slots, 2)?,
    })
}

/// Longhaul version of [`ffn::expert_outputs`]: identical rows, computed
/// from slots, in as many waves as the batch's distinct experts need. In a
/// wave, the experts already in slots are computed while the missing ones
/// are read, and each missing one as soon as it is in; every row comes from
/// its own expert whatever the grouping, and the caller sums the rows in
/// their order, so the output does not depend on when reads complete.
/// `resid` is the residual stream `x` was normed from, for the lookahead.
pub(crate) fn expert_outputs<'s, B: Backend>(
    p: &Pass<'_, 's, B>,
    il: usize,
    layer: &Mutex<StreamedLayer<B::Slots>>,
    f: &MoeFfn<B::Weight>,
    x: &B::Tensor,
    resid: &B::Tensor,
    ids: &[u32],
) -> Result<B::Tensor, ModelError> {
    let m = p.m;
    let b = &m.backend;
    let k = f.router.routing.n_used;
    // Stop a lookahead of this layer that has not started yet (one made
    // under the layer's lock, for a store that cannot lend its slots): demand
    // reads never wait behind speculation. A lending store's lookahead reads
    // are taken over or dropped by `plan_adopting`.
    if let Some(c) = m.runtime.prefetch_cancel.get(il) {
        c.store(true, Ordering::Relaxed);
    }
    // A poisoned lock means an earlier panic mid-update; the planner state is
    // still consistent (loads mark failed slots empty), so keep going.
    let mut l = layer.lock().unwrap_or_else(|p| p.into_inner());
    // A lookahead's reads still in flight go on as part of the batch's wave.
    let waves = l.plan_adopting(&m.file, ids);
    // A batch of one wave (a decode step's) starts a lookahead whose reads
    // run once its demand reads are in. One of several (a prompt's) starts
    // none: its
    // later waves' reads would queue behind the guesses, and the next
    // layer's batch, as large, cannot take over reads in flight
    // (`plan_adopting`), so it would only wait for them.
    let mut lookahead_started = waves.len() > 1;
    let mut out: Option<B::Tensor> = None;
    let mut slot_of = vec![u32::MAX; m.hp.n_expert];
    for wave in &waves {
        let mut fill = l.start_wave(&m.file, wave, p.io)?;
        // Where the demand reads run on the I/O threads, the lookahead's
        // reads are queued behind them now, and each waits there until they
        // are all in: the disk goes on to the guesses at once, not when this
        // thread is done computing the cached experts.
        if !lookahead_started {
            if let Some(gate) = fill.demand_gate() {
                lookahead(p, il, resid, Some(gate))?;
                lookahead_started = true;
            }
        }
        loop {
            // Experts already read join the cached ones' compute. Where the
            // lookahead waits for this thread to see the demand reads in
            // (io_uring), a wave whose reads have all landed starts it
            // before that compute.
            if fill.pending() {
                l.poll_loaded(&m.file, &mut fill)?;
            }
            let reading = fill.pending();
            if !reading {
                l.finish_wave(&m.file, &mut fill)?;
                // Otherwise, lookahead reads start once the demand reads are
                // in.
                if !lookahead_started {
                    lookahead(p, il, resid, None)?;
                    lookahead_started = true;
                }
            }
            let ready = fill.take_ready();
            if !ready.is_empty() {
                if reading {
                    l.stats.overlapped += ready.len() as u64;
                }
                slot_of.iter_mut().for_each(|s| *s = u32::MAX);
                for &e in &ready {
                    if let Some(s) = wave.slot_of(e) {
                        slot_of[e as usize] = s;
                    }
                }
                let pairs: Vec<usize> = (0..ids.len())
                    .filter(|&r| slot_of[ids[r] as usize] != u32::MAX)
                    .collect();
                let slot_ids: Vec<u32> = pairs.iter().map(|&r| slot_of[ids[r] as usize]).collect();
                let ex = slot_experts(b, &l, &f.experts)?;
                if pairs.len() == ids.len() {
                    // The whole batch at once: no gather or scatter.
                    return ffn::expert_outputs(b, &ex, x, &slot_ids, k, f.glu);
                }
                let tokens: Vec<usize> = pairs.iter().map(|r| r / k).collect();
                let xw = b.gather_rows(x, &tokens)?;
                let y = ffn::expert_outputs(b, &ex, &xw, &slot_ids, 1, f.glu)?;
                drop(ex);
                let dst = match &mut out {
                    Some(o) => o,
                    None => out.insert(b.zeros(ids.len(), m.hp.n_embd)?),
                };
                b.scatter_rows(dst, &y, &pairs)?;
            }
            if !reading {
                break;
            }
            l.wait_loaded(&m.file, &mut fill)?;
        }
    }
    match out {
        Some(o) => Ok(o),
        None => Ok(b.zeros(ids.len(), m.hp.n_embd)?),
    }
}
