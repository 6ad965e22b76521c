//! Expert slots in GPU buffers (filled through mapped staging buffers).

use std::sync::Arc;

use super::{Ctx, GpuWeight};
use crate::backend::{BackendError, SlotStore, SlotTensor};

pub struct GpuSlots {
    _ctx: Arc<Ctx>,
}

impl GpuSlots {
    pub(super) fn new(ctx: Arc<Ctx>, _tensors: &[SlotTensor], _n: usize) -> Result<Self, BackendError> {
        Ok(Self { _ctx: ctx })
    }
    pub(super) fn weight(&self, _t: usize) -> Result<GpuWeight, BackendError> {
        Err(BackendError::Shape { op: "slot_weight", detail: "todo".into() })
    }
}

impl SlotStore for GpuSlots {
    fn slots_mut(&mut self, _which: &[(usize, usize)]) -> Result<Vec<&mut [u8]>, BackendError> {
        Err(BackendError::Shape { op: "slots_mut", detail: "todo".into() })
    }
    fn bytes(&self) -> u64 {
        0
    }
}
