//! The MoE sync point in longhaul mode: route, plan, load, remap expert ids
//! to slot ids, compute. The planner and loader live in `crate::longhaul`;
//! this file only ties them to the layer's expert tensors.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, TryLockError};

use super::block;
use super::{Experts, Ffn, Layer, Model, ModelError};
use crate::backend::Backend;
use crate::gguf::{self, TensorInfo};
use crate::longhaul::{self, LonghaulConfig, StreamedLayer};

/// Routed tensors of a layer in slot-store order: the three matrices, then
/// the per-expert biases an architecture has.
const ROUTED: [&str; 6] = [
    "ffn_gate_exps.weight",
    "ffn_up_exps.weight",
    "ffn_down_exps.weight",
    "ffn_gate_exps.bias",
    "ffn_up_exps.bias",
    "ffn_down_exps.bias",
];

/// The largest one-expert size over the layers' routed tensors.
fn expert_bytes(layers: &[(usize, Vec<&TensorInfo>)]) -> Result<u64, ModelError> {
    let mut max = 0u64;
    for (_, ts) in layers {
        max = max.max(longhaul::slot_tensors(ts)?.iter().map(|t| t.bytes).sum());
    }
    Ok(max)
}

/// The routed tensors of every MoE layer.
fn routed<'a, W>(layers: &[Layer<W>], file: &'a gguf::Model) -> Vec<(usize, Vec<&'a TensorInfo>)> {
    layers
        .iter()
        .enumerate()
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
    let layers = routed(&m.layers, &m.file);
    Ok((layers.len(), expert_bytes(&layers)?))
}

/// Switches every MoE layer of `m` to streamed experts under `cfg`'s budget.
pub(super) fn attach<B: Backend>(m: &mut Model<B>, cfg: LonghaulConfig) -> Result<(), ModelError> {
    if m.hp.n_expert == 0 {
        return Err(ModelError::NoExperts {
            arch: m.hp.arch.clone(),
        });
    }
    let file = m.file.clone();
    let layers = routed(&m.layers, &file);
    let expert_bytes = expert_bytes(&layers)?;
    let n_slots =
        longhaul::slots_for_budget(cfg.budget_bytes, layers.len(), expert_bytes, m.hp.n_expert)?;
    for (il, ts) in layers {
        let specs = longhaul::slot_tensors(&ts)?;
        let slots = m.backend.new_slots(&specs, n_slots)?;
        let l = StreamedLayer::new(il, &ts, slots, n_slots, cfg.policy)?;
        m.streamed[il] = Some(Mutex::new(if cfg.verify { l.verify_reads() } else { l }));
    }
    m.n_slots = n_slots;
    m.prefetch = cfg.prefetch;
    Ok(())
}

/// Starts reading, on the I/O pool, the experts that the next MoE layer's
/// router picks from this layer's FFN input `x` (a guess: the next layer
/// sees `x` after one more attention block).
fn lookahead<'s, B: Backend>(
    m: &'s Model<B>,
    il: usize,
    x: &B::Tensor,
    scope: &rayon::Scope<'s>,
) -> Result<(), ModelError> {
    if !m.prefetch {
        return Ok(());
    }
    let Some((next, Ffn::Moe(f))) = m
        .layers
        .iter()
        .enumerate()
        .skip(il + 1)
        .find(|(_, l)| matches!(l.ffn, Ffn::Moe(_)))
        .map(|(i, l)| (i, &l.ffn))
    else {
        return Ok(());
    };
    let Some(Some(target)) = m.streamed.get(next) else {
        return Ok(());
    };
    let b = &m.backend;
    let mut logits = b.matmul(&f.router, x)?;
    if let Some(rb) = &f.router_b {
        b.add_bias(&mut logits, rb)?;
    }
    let logits = b.to_host(&logits)?;
    let hp = &m.hp;
    let (ids, _) = block::route(
        &logits,
        hp.n_expert,
        hp.n_expert_used,
        m.spec.gating,
        m.spec.norm_topk,
        hp.expert_weights_scale,
    );
    let mut predicted = Vec::new();
    let mut seen = vec![false; hp.n_expert];
    for e in ids {
        if !std::mem::replace(&mut seen[e as usize], true) {
            predicted.push(e);
        }
    }
    let cancel = &m.prefetch_cancel[next];
    cancel.store(false, Ordering::Relaxed);
    let file = &m.file;
    scope.spawn(move |_| {
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

/// Longhaul version of [`block::expert_outputs`]: identical rows, computed
/// from slots, in as many waves as the batch's distinct experts need.
#[allow(clippy::too_many_arguments)]
pub(super) fn expert_outputs<'s, B: Backend>(
    m: &'s Model<B>,
    il: usize,
    layer: &Mutex<StreamedLayer<B::Slots>>,
    resident: &Experts<B::Weight>,
    x: &B::Tensor,
    ids: &[u32],
    k: usize,
    scope: &rayon::Scope<'s>,
) -> Result<B::Tensor, ModelError> {
    let b = &m.backend;
    // Stop a lookahead read of this layer that has not started yet: demand
    // reads never wait behind speculation that is not already in flight.
    if let Some(c) = m.prefetch_cancel.get(il) {
        c.store(true, Ordering::Relaxed);
    }
    // A poisoned lock means an earlier panic mid-update; the planner state is
    // still consistent (loads mark failed slots empty), so keep going.
    let mut l = layer.lock().unwrap_or_else(|p| p.into_inner());
    let waves = l.plan(ids);
    let mut lookahead_started = false;
    let mut slot_of = vec![u32::MAX; m.hp.n_expert];
    if let [wave] = waves.as_slice() {
        l.load(&m.file, wave)?;
        lookahead(m, il, x, scope)?;
        wave.experts
            .iter()
            .for_each(|&(e, s)| slot_of[e as usize] = s);
        let slot_ids: Vec<u32> = ids.iter().map(|&e| slot_of[e as usize]).collect();
        let ex = slot_experts(b, &l, resident)?;
        return block::expert_outputs(b, &ex, x, &slot_ids, k, m.spec.glu);
    }
    let mut out = b.zeros(ids.len(), m.hp.n_embd)?;
    for wave in &waves {
        l.load(&m.file, wave)?;
        if !lookahead_started {
            lookahead(m, il, x, scope)?;
            lookahead_started = true;
        }
        slot_of.iter_mut().for_each(|s| *s = u32::MAX);
        wave.experts
            .iter()
            .for_each(|&(e, s)| slot_of[e as usize] = s);
        let pairs: Vec<usize> = (0..ids.len())
            .filter(|&r| slot_of[ids[r] as usize] != u32::MAX)
            .collect();
        let tokens: Vec<usize> = pairs.iter().map(|r| r / k).collect();
        let slot_ids: Vec<u32> = pairs.iter().map(|&r| slot_of[ids[r] as usize]).collect();
        let xw = b.gather_rows(x, &tokens)?;
        let y = {
            let ex = slot_experts(b, &l, resident)?;
            block::expert_outputs(b, &ex, &xw, &slot_ids, 1, m.spec.glu)?
        };
        b.scatter_rows(&mut out, &y, &pairs)?;
    }
    Ok(out)
}
