//! Flash attention over the GPU KV cache.

use super::{GpuBackend, GpuTensor, GpuWeight};
use crate::backend::{AttnParams, BackendError, BatchPos};
use crate::tensor::GgmlType;

/// One layer's KV cache on the device.
pub struct GpuKv {
    pub n_ctx: usize,
    pub n_embd_k: usize,
    pub n_embd_v: usize,
    pub dtype: GgmlType,
}

pub(super) fn new_kv(
    _b: &GpuBackend,
    n_ctx: usize,
    n_embd_k: usize,
    n_embd_v: usize,
    dtype: GgmlType,
) -> Result<GpuKv, BackendError> {
    Ok(GpuKv {
        n_ctx,
        n_embd_k,
        n_embd_v,
        dtype,
    })
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    _b: &GpuBackend,
    kv: &mut GpuKv,
    _q: &GpuTensor,
    _k: &GpuTensor,
    _v: &GpuTensor,
    _sinks: Option<&GpuWeight>,
    _pos: BatchPos,
    _p: &AttnParams,
) -> Result<GpuTensor, BackendError> {
    Err(BackendError::Unsupported {
        op: "attention",
        backend: "gpu",
        dtype: kv.dtype,
    })
}
