//! Element-wise and row ops: rms_norm, rope, glu, add, biases, scaling,
//! weighted sums, row gathers and scatters.

use super::{GpuBackend, GpuTensor, GpuWeight};
use crate::backend::{BackendError, BatchPos, Glu, RopeParams};
use crate::tensor::GgmlType;

fn todo(op: &'static str) -> BackendError {
    BackendError::Unsupported { op, backend: "gpu", dtype: GgmlType::F32 }
}

pub(super) fn gather_rows(_b: &GpuBackend, _x: &GpuTensor, _rows: &[usize]) -> Result<GpuTensor, BackendError> { Err(todo("gather_rows")) }
pub(super) fn scatter_rows(_b: &GpuBackend, _d: &mut GpuTensor, _s: &GpuTensor, _rows: &[usize]) -> Result<(), BackendError> { Err(todo("scatter_rows")) }
pub(super) fn add_bias(_b: &GpuBackend, _x: &mut GpuTensor, _w: &GpuWeight, _ids: Option<&[u32]>) -> Result<(), BackendError> { Err(todo("add_bias")) }
pub(super) fn add(_b: &GpuBackend, _a: &mut GpuTensor, _x: &GpuTensor) -> Result<(), BackendError> { Err(todo("add")) }
pub(super) fn scale_rows(_b: &GpuBackend, _x: &mut GpuTensor, _s: &[f32]) -> Result<(), BackendError> { Err(todo("scale_rows")) }
pub(super) fn rms_norm(_b: &GpuBackend, _x: &GpuTensor, _w: &GpuWeight, _g: usize, _eps: f32) -> Result<GpuTensor, BackendError> { Err(todo("rms_norm")) }
pub(super) fn rope(_b: &GpuBackend, _x: &mut GpuTensor, _hd: usize, _pos: BatchPos, _p: &RopeParams) -> Result<(), BackendError> { Err(todo("rope")) }
pub(super) fn glu(_b: &GpuBackend, _g: &GpuTensor, _u: &GpuTensor, _k: Glu) -> Result<GpuTensor, BackendError> { Err(todo("glu")) }
pub(super) fn weighted_sum(_b: &GpuBackend, _x: &GpuTensor, _w: &[f32], _n: usize) -> Result<GpuTensor, BackendError> { Err(todo("weighted_sum")) }
