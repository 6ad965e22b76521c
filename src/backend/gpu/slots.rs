//! Expert slots in GPU buffers. Each routed tensor of a layer gets
//! `n_slots` slices, split into buffers of at most one storage binding.
//! The longhaul loader `pread`s missing experts straight into a mapped
//! `MAP_WRITE | COPY_SRC` staging buffer taken from a small reused ring;
//! [`SlotStore::commit`] unmaps it and records `copy_buffer_to_buffer` into
//! the slots, ordered before every kernel recorded afterwards.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{Ctx, GpuError, GpuWeight, WeightPart};
use crate::backend::{BackendError, SlotStore, SlotTensor};
use crate::tensor::GgmlType;

/// Staging buffers kept for reuse (per layer).
const RING: usize = 2;

struct Staging {
    buf: wgpu::Buffer,
    /// Set by the map callback once the buffer is writable again.
    mapped: Arc<AtomicBool>,
}

/// The staging buffer handed out by `slots_mut`, waiting for `commit`.
struct Open {
    staging: Staging,
    view: wgpu::BufferViewMut,
    /// `(staging offset, tensor, slot, bytes)`.
    copies: Vec<(u64, usize, usize, u64)>,
}

struct Layout {
    /// Bytes from one slot to the next (the expert's bytes rounded up to 4).
    stride: u64,
    parts: Vec<WeightPart>,
}

pub struct GpuSlots {
    ctx: Arc<Ctx>,
    tensors: Vec<SlotTensor>,
    n_slots: usize,
    layout: Vec<Layout>,
    ring: Vec<Staging>,
    open: Option<Open>,
}

impl GpuSlots {
    pub(super) fn new(
        ctx: Arc<Ctx>,
        tensors: &[SlotTensor],
        n_slots: usize,
    ) -> Result<Self, BackendError> {
        let lim = ctx.caps.max_binding;
        let mut layout = Vec::with_capacity(tensors.len());
        for t in tensors {
            let stride = t.bytes.max(4).next_multiple_of(4);
            if stride > lim {
                return Err(GpuError::TooLarge {
                    what: "one expert slot".into(),
                    bytes: stride,
                    limit: lim,
                }
                .into());
            }
            let per = (lim / stride) as usize;
            let mut parts = Vec::new();
            let mut first = 0;
            while first < n_slots {
                let count = per.min(n_slots - first);
                let buf = ctx.storage(count as u64 * stride, "expert slots")?;
                parts.push(WeightPart { buf, first, count });
                first += count;
            }
            layout.push(Layout { stride, parts });
        }
        Ok(Self {
            ctx,
            tensors: tensors.to_vec(),
            n_slots,
            layout,
            ring: Vec::new(),
            open: None,
        })
    }

    /// Tensor `t` of the store as a stacked weight `[dims.., n_slots]`.
    pub(super) fn weight(&self, t: usize) -> Result<GpuWeight, BackendError> {
        let (spec, lay) =
            self.tensors
                .get(t)
                .zip(self.layout.get(t))
                .ok_or_else(|| BackendError::Shape {
                    op: "slot_weight",
                    detail: format!("no slot tensor {t}"),
                })?;
        let bad = || BackendError::Shape {
            op: "slot_weight",
            detail: format!("slot tensor {:?} of {}", spec.dims, spec.ty.name()),
        };
        let ne0 = *spec.dims.first().ok_or_else(bad)? as usize;
        let row_bytes = ne0 / spec.ty.block_size() * spec.ty.type_size();
        let ne = match spec.dims.len() {
            // Per-expert bias vectors: rows of an f32 matrix, one per slot.
            1 if spec.ty == GgmlType::F32 => [ne0, self.n_slots, 1],
            2 => [ne0, spec.dims[1] as usize, self.n_slots],
            _ => return Err(bad()),
        };
        Ok(GpuWeight {
            ty: spec.ty,
            ne,
            row_bytes,
            expert_stride: lay.stride,
            parts: lay.parts.clone(),
        })
    }

    /// A mapped staging buffer of at least `size` bytes from the ring, or a
    /// new one.
    fn take_staging(&mut self, size: u64) -> Result<Staging, GpuError> {
        if let Some(i) = self.ring.iter().position(|s| s.buf.size() >= size) {
            let s = self.ring.swap_remove(i);
            while !s.mapped.load(Ordering::Acquire) {
                self.ctx.wait()?;
            }
            return Ok(s);
        }
        let buf = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("expert staging"),
            size: size.next_power_of_two().max(1 << 16),
            usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        Ok(Staging {
            buf,
            mapped: Arc::new(AtomicBool::new(true)),
        })
    }

    fn finish(&mut self) -> Result<(), BackendError> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        drop(open.view);
        open.staging.buf.unmap();
        let lay = &self.layout;
        let staging = &open.staging.buf;
        self.ctx.record(|enc| {
            for &(src, t, slot, len) in &open.copies {
                let l = &lay[t];
                if let Some(p) = l
                    .parts
                    .iter()
                    .find(|p| slot >= p.first && slot < p.first + p.count)
                {
                    let dst = (slot - p.first) as u64 * l.stride;
                    enc.copy_buffer_to_buffer(staging, src, &p.buf, dst, len.next_multiple_of(4));
                }
            }
        });
        // The copies must be submitted before the buffer can be mapped again.
        self.ctx.flush();
        open.staging.mapped.store(false, Ordering::Release);
        let flag = open.staging.mapped.clone();
        open.staging
            .buf
            .slice(..)
            .map_async(wgpu::MapMode::Write, move |r| {
                if r.is_ok() {
                    flag.store(true, Ordering::Release);
                }
            });
        if self.ring.len() < RING {
            self.ring.push(open.staging);
        }
        Ok(())
    }
}

impl SlotStore for GpuSlots {
    fn slots_mut(&mut self, which: &[(usize, usize)]) -> Result<Vec<&mut [u8]>, BackendError> {
        self.finish()?;
        let mut offs = Vec::with_capacity(which.len());
        let mut total = 0u64;
        for &(t, s) in which {
            let spec = self
                .tensors
                .get(t)
                .filter(|_| s < self.n_slots)
                .ok_or_else(|| BackendError::Shape {
                    op: "slots_mut",
                    detail: format!("slot ({t}, {s}) is out of range"),
                })?;
            offs.push((total, t, s, spec.bytes));
            total += spec.bytes.next_multiple_of(4);
        }
        crate::backend::distinct_slots(which)?;
        let staging = self.take_staging(total.max(4))?;
        let mut view = staging
            .buf
            .slice(..total.max(4))
            .get_mapped_range_mut()
            .map_err(|e| GpuError::Lost(e.to_string()))?;
        let base: NonNull<u8> = view.slice(..).as_raw_element_ptr();
        self.open = Some(Open {
            staging,
            view,
            copies: offs.clone(),
        });
        // SAFETY: the ranges are disjoint, inside the mapped range, and stay
        // mapped while `self.open` holds the view, which outlives the returned
        // borrows of `self`. The slices are only written (by `pread`), never
        // read, as mapped write-combining memory requires.
        Ok(offs
            .iter()
            .map(|&(off, _, _, len)| unsafe {
                std::slice::from_raw_parts_mut(base.as_ptr().add(off as usize), len as usize)
            })
            .collect())
    }

    fn commit(&mut self) -> Result<(), BackendError> {
        self.finish()
    }

    fn bytes(&self) -> u64 {
        self.layout
            .iter()
            .flat_map(|l| l.parts.iter().map(|p| p.count as u64 * l.stride))
            .sum()
    }
}
