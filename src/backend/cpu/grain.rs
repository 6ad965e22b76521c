//! How finely a parallel loop splits. Handing part of a loop to another
//! thread costs a few microseconds (a steal, and a wake-up when that thread
//! was idle), which is more than a small model's whole op: a 256x256
//! mat-vec, or the rope of four heads. Each loop says roughly how much work
//! one of its items is, in multiply-adds of the quantised dot kernels, and
//! rayon splits it only into parts of at least [`GRAIN`]; below that the
//! calling thread runs the whole loop. The numbers only move the split
//! points, never what a work item computes.

/// The least work a loop hands to another thread: about 4 us on one core
/// of a 2-3 GHz x86 (the integer dot kernels run 32 to 64 multiply-adds
/// per instruction).
pub(super) const GRAIN: usize = 1 << 17;

/// One f32 multiply-add of the attention kernels (8 or 16 per instruction).
pub(super) const FLOP: usize = 4;
/// One value of an element-wise loop (a norm, rope, quantising a row).
pub(super) const VALUE: usize = 16;
/// One value through `expf` (SiLU, SwiGLU).
pub(super) const EXP: usize = 64;

/// Items per split for a loop whose items each do `work_per_item`, for
/// rayon's `with_min_len`.
pub(super) fn min_items(work_per_item: usize) -> usize {
    GRAIN.div_ceil(work_per_item.max(1))
}
