//! Quantised mat-vec / mat-mul, MUL_MAT_ID and get_rows over GGUF blocks.

use super::{GpuBackend, GpuTensor, GpuWeight};
use crate::backend::BackendError;

fn todo(op: &'static str, w: &GpuWeight) -> BackendError {
    BackendError::Unsupported {
        op,
        backend: "gpu",
        dtype: w.ty,
    }
}

pub(super) fn get_rows(_b: &GpuBackend, w: &GpuWeight, _ids: &[u32]) -> Result<GpuTensor, BackendError> {
    Err(todo("get_rows", w))
}

pub(super) fn matmul(_b: &GpuBackend, w: &GpuWeight, _x: &GpuTensor) -> Result<GpuTensor, BackendError> {
    Err(todo("matmul", w))
}

pub(super) fn mul_mat_id(
    _b: &GpuBackend,
    w: &GpuWeight,
    _x: &GpuTensor,
    _ids: &[u32],
    _n_used: usize,
) -> Result<GpuTensor, BackendError> {
    Err(todo("mul_mat_id", w))
}
