//! The CPU placement: rayon over rows, quantised weights read in place from
//! the memory-mapped GGUF (or from host slot memory), activations quantised to
//! the weight type's dot-product partner (Q8_0 / Q8_1 / Q8_K / F16) as ggml does.

mod attention;
mod cols;
mod delta_chunked;
mod flash_attn;
mod grain;
mod matmul;
#[cfg(test)]
mod mla_tests;
mod ops;
mod recurrent;

use std::sync::Arc;

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::{
    check_attention, contract, Act, AttnParams, Backend, BackendError, BatchPos, DeltaNetParams,
    Glu, KvShape, RopeParams, SlotStore, SlotTensor,
};
use crate::gguf;
use crate::quant::layout::{self, Interleaved};
use crate::tensor::GgmlType;

/// Host activations, row-major `[rows, cols]`.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl CpuTensor {
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            data: vec![0.0; rows * cols],
            rows,
            cols,
        }
    }
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// Where a weight's bytes live.
#[derive(Clone)]
pub enum WeightBytes {
    /// A tensor of a memory-mapped GGUF shard.
    Mapped {
        model: Arc<gguf::Model>,
        info: gguf::TensorInfo,
    },
    /// Bytes owned by the process (converted tensors).
    Host(Arc<Vec<u8>>),
    /// A stacked weight over expert slots: one buffer per slot, so that a
    /// slot can be refilled while a weight over the others is in use.
    Slots(Arc<Vec<Arc<Vec<u8>>>>),
}

/// A read-only weight: ggml dims (`dims[0]` = row length) and its type.
#[derive(Clone)]
pub struct CpuWeight {
    pub ty: GgmlType,
    pub dims: Vec<u64>,
    bytes: WeightBytes,
    /// The bytes are in this interleaved layout (`--repack`), not GGUF's
    /// plain rows.
    layout: Option<&'static dyn Interleaved>,
}

impl CpuWeight {
    /// A weight over a GGUF tensor, read in place from the mapping.
    pub fn mapped(model: &Arc<gguf::Model>, t: &gguf::TensorInfo) -> Self {
        Self {
            ty: t.ty,
            dims: t.dims.clone(),
            bytes: WeightBytes::Mapped {
                model: model.clone(),
                info: t.clone(),
            },
            layout: None,
        }
    }

    /// A weight over host bytes (must hold `dims` elements of `ty`).
    pub fn host(ty: GgmlType, dims: Vec<u64>, bytes: Arc<Vec<u8>>) -> Self {
        Self {
            ty,
            dims,
            bytes: WeightBytes::Host(bytes),
            layout: None,
        }
    }

    /// The layout of the weight's bytes (`None`: GGUF's plain rows).
    pub fn layout(&self) -> Option<&'static dyn Interleaved> {
        self.layout
    }

    /// All bytes in GGUF's plain rows: borrowed, or for an interleaved
    /// weight converted back (for the ops that read rows one by one).
    pub(super) fn plain_bytes(&self) -> Result<std::borrow::Cow<'_, [u8]>, BackendError> {
        let Some(il) = self.layout else {
            return Ok(std::borrow::Cow::Borrowed(self.bytes()));
        };
        let mut v = self.bytes().to_vec();
        il.deinterleave(self.row_len(), &mut v)?;
        Ok(std::borrow::Cow::Owned(v))
    }

    /// All bytes of the weight.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            // The range was validated against the file when the model was
            // opened; an empty slice (impossible in practice) fails the
            // length checks of every consumer instead of panicking.
            WeightBytes::Mapped { model, info } => model.tensor_data(info).unwrap_or(&[]),
            WeightBytes::Host(v) => v,
            // No single slice: consumers of stacked weights use `matrix`.
            WeightBytes::Slots(_) => &[],
        }
    }

    /// The `len` bytes of matrix `e` of a stacked weight (of the whole
    /// weight at `e` = 0 when it is 2-D), or `None` when the weight holds
    /// fewer.
    pub fn matrix(&self, e: usize, len: usize) -> Option<&[u8]> {
        match &self.bytes {
            WeightBytes::Slots(v) => v.get(e).and_then(|b| b.get(..len)),
            _ => {
                let at = e.checked_mul(len)?;
                self.bytes().get(at..at.checked_add(len)?)
            }
        }
    }

    /// Elements per row (`ne0`).
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }

    /// Rows per matrix (`ne1`; 1 for vectors).
    pub fn n_rows(&self) -> usize {
        self.dims.get(1).copied().unwrap_or(1) as usize
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        (self.row_len() / self.ty.block_size()) * self.ty.type_size()
    }

    /// The weight's values as f32 (vectors: norms, biases, sinks).
    pub fn to_f32(&self) -> Result<Vec<f32>, BackendError> {
        let n: u64 = self.dims.iter().product();
        let mut out = vec![0.0; n as usize];
        crate::quant::dequantize_row(self.ty, &self.plain_bytes()?, &mut out)?;
        Ok(out)
    }
}

/// One layer's KV cache on the host, f16 (default) or f32. A K-only cache
/// (`n_embd_v` 0, see [`Backend::new_kv`]) has an empty `v`.
pub struct CpuKv {
    k: KvStore,
    v: KvStore,
    n_ctx: usize,
    n_embd_k: usize,
    n_embd_v: usize,
}

enum KvStore {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

/// `n` copies of `zero`, or [`BackendError::OutOfMemory`] when they cannot
/// be allocated (instead of an abort).
fn try_filled<T: Copy>(n: usize, zero: T, what: &'static str) -> Result<Vec<T>, BackendError> {
    let oom = || BackendError::OutOfMemory {
        what,
        bytes: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    };
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| oom())?;
    v.resize(n, zero);
    Ok(v)
}

impl CpuKv {
    fn shape(&self) -> KvShape {
        KvShape {
            n_ctx: self.n_ctx,
            n_embd_k: self.n_embd_k,
            n_embd_v: self.n_embd_v,
        }
    }
}

impl KvStore {
    /// `n` zeroed elements (`n` = None: the size overflowed).
    fn new(dtype: GgmlType, n: Option<usize>) -> Result<Self, BackendError> {
        let what = "the KV cache";
        let n = n.ok_or(BackendError::OutOfMemory {
            what,
            bytes: u64::MAX,
        });
        match dtype {
            GgmlType::F16 => Ok(KvStore::F16(try_filled(n?, f16::ZERO, what)?)),
            GgmlType::F32 => Ok(KvStore::F32(try_filled(n?, 0.0, what)?)),
            other => Err(BackendError::Unsupported {
                op: "kv cache",
                backend: "cpu",
                dtype: other,
            }),
        }
    }
    fn bytes(&self) -> &[u8] {
        match self {
            KvStore::F16(v) => bytemuck::cast_slice(v),
            KvStore::F32(v) => bytemuck::cast_slice(v),
        }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            KvStore::F16(v) => bytemuck::cast_slice_mut(v),
            KvStore::F32(v) => bytemuck::cast_slice_mut(v),
        }
    }
    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            // `half`'s slice conversion: F16C where the CPU has it, and the
            // same round-to-nearest-even as `f16::from_f32` either way.
            KvStore::F16(v) => v[at..at + src.len()].convert_from_f32_slice(src),
            KvStore::F32(v) => v[at..at + src.len()].copy_from_slice(src),
        }
    }
}

/// Expert slots in host memory: for each routed tensor, one buffer per slot
/// holding one expert's slice. Separate buffers let the longhaul loader fill
/// some slots ([`SlotStore::detach`]) while the layer computes over the others.
pub struct HostSlots {
    tensors: Vec<SlotTensor>,
    /// `bufs[tensor][slot]`.
    bufs: Vec<Vec<Arc<Vec<u8>>>>,
    n_slots: usize,
    /// Per tensor: the interleaved layout its slots hold (`--repack`) and
    /// the row length it is interleaved at.
    layouts: Arc<Vec<Option<MatrixLayout>>>,
    /// Slots written through `slots_mut`, converted at `commit`.
    unconverted: Vec<(usize, usize)>,
}

/// An interleaved layout and the row length a matrix takes it at.
type MatrixLayout = (&'static dyn Interleaved, usize);

/// The layout a matrix of `dims` of `ty` takes on the CPU with `--repack`,
/// and its row length.
fn matrix_layout(ty: GgmlType, dims: &[u64]) -> Option<MatrixLayout> {
    let (&k, &n_rows) = (dims.first()?, dims.get(1)?);
    Some((layout::for_matrix(ty, n_rows as usize)?, k as usize))
}

/// Rewrites one expert slice of slot tensor `t` into its layout.
fn convert_slot(
    layouts: &[Option<MatrixLayout>],
    t: usize,
    buf: &mut [u8],
    src: Option<&[u8]>,
) -> Result<(), BackendError> {
    convert_matrix(layouts.get(t).copied().flatten(), buf, src)
}

/// Writes `buf` in `layout` (or as read, without one) from `src`, or in
/// place when `src` is `None`.
fn convert_matrix(
    layout: Option<MatrixLayout>,
    buf: &mut [u8],
    src: Option<&[u8]>,
) -> Result<(), BackendError> {
    match (layout, src) {
        // Nothing reads the slot or the tensor soon: stored past the caches.
        (Some((il, k)), Some(src)) => Ok(layout::interleave_streamed(il, k, src, buf)?),
        (Some((il, k)), None) => Ok(il.interleave(k, buf)?),
        (None, Some(src)) if src.len() == buf.len() => {
            buf.copy_from_slice(src);
            Ok(())
        }
        (None, Some(src)) => Err(shape_err(
            "convert_slot",
            format!("{} bytes for a slot of {}", src.len(), buf.len()),
        )),
        (None, None) => Ok(()),
    }
}

/// A zeroed buffer of `len` bytes whose pages are the process's already:
/// one byte written per 4 KiB page. A fresh allocation is only mapped, and
/// its first writes fault its pages in one at a time, each zeroed and
/// charged then: for the expert cache, on the reading threads while its
/// slots first fill, beside the compute. Taken here, the cache's budget is
/// in memory from the load on (as llama.cpp's buffers are), in parallel.
fn taken(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for i in (0..len).step_by(4096) {
        // Opaque, so the store of the zero the byte holds stays.
        v[i] = std::hint::black_box(0);
    }
    v
}

impl HostSlots {
    /// The buffer of `(t, s)` to write, sized to one expert: an error while a
    /// weight still holds it.
    fn buf_mut(&mut self, t: usize, s: usize) -> Result<&mut Vec<u8>, BackendError> {
        let len = self.tensors.get(t).map(|spec| spec.bytes as usize);
        let (Some(len), Some(a)) = (len, self.bufs.get_mut(t).and_then(|b| b.get_mut(s))) else {
            return Err(shape_err(
                "slots_mut",
                format!("slot ({t}, {s}) is out of range"),
            ));
        };
        let v = Arc::get_mut(a).ok_or_else(|| {
            shape_err(
                "slots_mut",
                "a slot weight is still alive while slots are written".into(),
            )
        })?;
        // A buffer lent out by `detach` and never returned (its read was
        // abandoned) comes back as a fresh one; its slot is recorded empty.
        v.resize(len, 0);
        Ok(v)
    }
}

impl SlotStore for HostSlots {
    fn slots_mut(&mut self, which: &[(usize, usize)]) -> Result<Vec<&mut [u8]>, BackendError> {
        super::distinct_slots(which)?;
        for &(t, s) in which {
            self.buf_mut(t, s)?;
        }
        self.unconverted.extend_from_slice(which);
        // Every requested buffer exists and is unshared; hand them out in order.
        let mut per: Vec<Vec<Option<&mut [u8]>>> = self
            .bufs
            .iter_mut()
            .map(|b| {
                b.iter_mut()
                    .map(|a| Arc::get_mut(a).map(|v| v.as_mut_slice()))
                    .collect()
            })
            .collect();
        which
            .iter()
            .map(|&(t, s)| {
                per[t][s]
                    .take()
                    .ok_or_else(|| shape_err("slots_mut", format!("slot ({t}, {s}) is busy")))
            })
            .collect()
    }

    fn detach(&mut self, which: &[(usize, usize)]) -> Option<Result<Vec<Vec<u8>>, BackendError>> {
        let lent = super::distinct_slots(which).and_then(|()| {
            which
                .iter()
                .map(|&(t, s)| self.buf_mut(t, s).map(std::mem::take))
                .collect()
        });
        Some(lent)
    }

    fn attach(&mut self, which: &[(usize, usize)], bufs: Vec<Vec<u8>>) -> Result<(), BackendError> {
        if which.len() != bufs.len() {
            return Err(shape_err(
                "attach",
                format!("{} buffers for {} slots", bufs.len(), which.len()),
            ));
        }
        for (&(t, s), buf) in which.iter().zip(bufs) {
            let len = self.tensors.get(t).map(|spec| spec.bytes as usize);
            match (len, self.bufs.get_mut(t).and_then(|b| b.get_mut(s))) {
                (Some(len), Some(slot)) if buf.len() == len => *slot = Arc::new(buf),
                _ => {
                    return Err(shape_err(
                        "attach",
                        format!("slot ({t}, {s}) given {} bytes", buf.len()),
                    ))
                }
            }
        }
        Ok(())
    }

    fn bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.bytes * self.n_slots as u64)
            .sum()
    }

    fn commit(&mut self) -> Result<(), BackendError> {
        let mut res = Ok(());
        for (t, s) in std::mem::take(&mut self.unconverted) {
            let Some(buf) = self
                .bufs
                .get_mut(t)
                .and_then(|b| b.get_mut(s))
                .and_then(Arc::get_mut)
            else {
                continue;
            };
            if let Err(e) = convert_slot(&self.layouts, t, buf, None) {
                res = res.and(Err(e));
            }
        }
        res
    }

    fn converter(&self) -> Option<crate::backend::SlotConverter> {
        if self.layouts.iter().all(Option::is_none) {
            return None;
        }
        let layouts = self.layouts.clone();
        // A layout converts whole row groups; a copy, any bytes.
        let units = self
            .layouts
            .iter()
            .zip(&self.tensors)
            .map(|(l, spec)| {
                l.and_then(|(_, k)| layout::group_bytes(spec.ty, k))
                    .unwrap_or(1)
            })
            .collect();
        Some(crate::backend::SlotConverter {
            units,
            convert: Arc::new(move |t, buf: &mut [u8], src: Option<&[u8]>| {
                convert_slot(&layouts, t, buf, src)
            }),
        })
    }
}

/// The CPU backend. Threads come from the rayon pool it is run inside.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend
    }
}

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type Kv = CpuKv;
    type Slots = HostSlots;

    fn name(&self) -> &'static str {
        "CPU"
    }

    fn load_weight(
        &self,
        model: &Arc<gguf::Model>,
        t: &gguf::TensorInfo,
    ) -> Result<CpuWeight, BackendError> {
        Ok(CpuWeight::mapped(model, t))
    }

    fn placeholder_weight(&self, t: &gguf::TensorInfo) -> Result<CpuWeight, BackendError> {
        // No bytes: any read of it is a shape error, not a fault on the mapping.
        Ok(CpuWeight::host(t.ty, t.dims.clone(), Arc::new(Vec::new())))
    }

    fn weight_from_bytes(
        &self,
        t: &gguf::TensorInfo,
        bytes: Vec<u8>,
    ) -> Result<CpuWeight, BackendError> {
        if bytes.len() as u64 != t.len {
            return Err(shape_err(
                "weight_from_bytes",
                format!("{} bytes for `{}` of {}", bytes.len(), t.name, t.len),
            ));
        }
        Ok(CpuWeight::host(t.ty, t.dims.clone(), Arc::new(bytes)))
    }

    fn repacks(&self, t: &gguf::TensorInfo) -> bool {
        matrix_layout(t.ty, &t.dims).is_some()
    }

    fn repacked_weight(
        &self,
        t: &gguf::TensorInfo,
        mut bytes: Vec<u8>,
    ) -> Result<CpuWeight, BackendError> {
        // The length first: a short read is a shape error, not a partial
        // interleave.
        if let Some((il, k)) = matrix_layout(t.ty, &t.dims).filter(|_| bytes.len() as u64 == t.len)
        {
            il.interleave(k, &mut bytes)?;
        }
        self.converted_weight(t, bytes)
    }

    fn repack_pieces(&self, t: &gguf::TensorInfo) -> Option<crate::backend::RepackPieces> {
        let (il, k) = matrix_layout(t.ty, &t.dims)?;
        let group = layout::group_bytes(t.ty, k)?;
        Some(crate::backend::RepackPieces {
            unit: group,
            convert: Arc::new(move |dst: &mut [u8], src: Option<&[u8]>| {
                convert_matrix(Some((il, k)), dst, src)
            }),
        })
    }

    fn converted_weight(
        &self,
        t: &gguf::TensorInfo,
        bytes: Vec<u8>,
    ) -> Result<CpuWeight, BackendError> {
        let mut w = self.weight_from_bytes(t, bytes)?;
        w.layout = matrix_layout(t.ty, &t.dims).map(|(il, _)| il);
        Ok(w)
    }

    fn new_slots(&self, tensors: &[SlotTensor], n_slots: usize) -> Result<HostSlots, BackendError> {
        use rayon::prelude::*;
        let bufs = tensors
            .iter()
            .map(|t| {
                (0..n_slots)
                    .into_par_iter()
                    .map(|_| Arc::new(taken(t.bytes as usize)))
                    .collect()
            })
            .collect();
        Ok(HostSlots {
            tensors: tensors.to_vec(),
            bufs,
            n_slots,
            layouts: Arc::new(
                tensors
                    .iter()
                    .map(|t| t.repack.then(|| matrix_layout(t.ty, &t.dims)).flatten())
                    .collect(),
            ),
            unconverted: Vec::new(),
        })
    }

    fn slot_weight(&self, slots: &HostSlots, t: usize) -> Result<CpuWeight, BackendError> {
        let spec = slots
            .tensors
            .get(t)
            .ok_or_else(|| shape_err("slot_weight", format!("no slot tensor {t}")))?;
        let mut dims = spec.dims.clone();
        dims.push(slots.n_slots as u64);
        Ok(CpuWeight {
            ty: spec.ty,
            dims,
            bytes: WeightBytes::Slots(Arc::new(slots.bufs[t].clone())),
            layout: slots.layouts.get(t).copied().flatten().map(|(il, _)| il),
        })
    }

    fn gather_rows(&self, x: &CpuTensor, rows: &[usize]) -> Result<CpuTensor, BackendError> {
        contract::gather_rows(x.rows, rows)?;
        let mut out = CpuTensor::zeros(rows.len(), x.cols);
        for (dst, &r) in out.data.chunks_mut(x.cols.max(1)).zip(rows) {
            dst.copy_from_slice(x.row(r));
        }
        Ok(out)
    }

    fn scatter_rows(
        &self,
        dst: &mut CpuTensor,
        src: &CpuTensor,
        rows: &[usize],
    ) -> Result<(), BackendError> {
        contract::scatter_rows((dst.rows, dst.cols), (src.rows, src.cols), rows)?;
        for (i, &r) in rows.iter().enumerate() {
            dst.data[r * dst.cols..(r + 1) * dst.cols].copy_from_slice(src.row(i));
        }
        Ok(())
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<CpuTensor, BackendError> {
        Ok(CpuTensor::zeros(rows, cols))
    }

    fn from_host(
        &self,
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<CpuTensor, BackendError> {
        if data.len() != rows * cols {
            return Err(shape_err(
                "from_host",
                format!("{} floats for [{rows}, {cols}]", data.len()),
            ));
        }
        Ok(CpuTensor { data, rows, cols })
    }

    fn to_host(&self, t: &CpuTensor) -> Result<Vec<f32>, BackendError> {
        Ok(t.data.clone())
    }

    fn take_host(&self, t: CpuTensor) -> Result<Vec<f32>, BackendError> {
        Ok(t.data)
    }

    fn shape(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn reshape(&self, t: CpuTensor, rows: usize, cols: usize) -> Result<CpuTensor, BackendError> {
        cols::reshape(t, rows, cols)
    }

    fn split_cols(
        &self,
        x: &CpuTensor,
        group: usize,
        start: usize,
        len: usize,
    ) -> Result<CpuTensor, BackendError> {
        cols::split_cols(x, group, start, len)
    }

    fn concat_cols(
        &self,
        a: &CpuTensor,
        ga: usize,
        b: &CpuTensor,
        gb: usize,
    ) -> Result<CpuTensor, BackendError> {
        cols::concat_cols(a, ga, b, gb)
    }

    fn mul_act(&self, x: &mut CpuTensor, g: &CpuTensor, act: Act) -> Result<(), BackendError> {
        cols::mul_act(x, g, act)
    }

    fn act(&self, x: &mut CpuTensor, act: Act) -> Result<(), BackendError> {
        recurrent::act(x, act);
        Ok(())
    }

    fn mul_vec(&self, x: &mut CpuTensor, w: &CpuWeight) -> Result<(), BackendError> {
        recurrent::mul_vec(x, w)
    }

    fn l2_norm(&self, x: &CpuTensor, group: usize, eps: f32) -> Result<CpuTensor, BackendError> {
        recurrent::l2_norm(x, group, eps)
    }

    fn ssm_conv(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        states: &mut [&mut CpuTensor],
        seqs: &[BatchPos],
    ) -> Result<CpuTensor, BackendError> {
        recurrent::ssm_conv(x, w, states, seqs)
    }

    fn gated_delta_net(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        g: &CpuTensor,
        beta: &CpuTensor,
        states: &mut [&mut CpuTensor],
        seqs: &[BatchPos],
        p: &DeltaNetParams,
    ) -> Result<CpuTensor, BackendError> {
        recurrent::gated_delta_net(q, k, v, g, beta, states, seqs, p)
    }

    fn get_rows(&self, w: &CpuWeight, ids: &[u32]) -> Result<CpuTensor, BackendError> {
        ops::get_rows(w, ids)
    }

    fn matmul(&self, w: &CpuWeight, x: &CpuTensor) -> Result<CpuTensor, BackendError> {
        matmul::matmul(w, x)
    }

    fn matmul_many(
        &self,
        ws: &[&CpuWeight],
        x: &CpuTensor,
    ) -> Result<Vec<CpuTensor>, BackendError> {
        matmul::matmul_many(ws, x)
    }

    fn mul_mat_id(
        &self,
        w: &CpuWeight,
        x: &CpuTensor,
        ids: &[u32],
        n_used: usize,
    ) -> Result<CpuTensor, BackendError> {
        matmul::mul_mat_id(w, x, ids, n_used)
    }

    fn add_bias(&self, x: &mut CpuTensor, b: &CpuWeight) -> Result<(), BackendError> {
        let b = b.to_f32()?;
        contract::add_bias(x.cols, b.len())?;
        x.data
            .chunks_mut(x.cols)
            .for_each(|r| r.iter_mut().zip(&b).for_each(|(a, b)| *a += b));
        Ok(())
    }

    fn add_bias_id(
        &self,
        x: &mut CpuTensor,
        b: &CpuWeight,
        ids: &[u32],
    ) -> Result<(), BackendError> {
        let n = b.row_len();
        contract::add_bias_id((x.rows, x.cols), (n, b.n_rows()), ids)?;
        let rb = b.row_bytes();
        let mut bias = vec![0.0; n];
        for (row, &e) in x.data.chunks_mut(n.max(1)).zip(ids) {
            let src = b
                .matrix(e as usize, rb)
                .ok_or_else(|| shape_err("add_bias_id", format!("no bias row for expert {e}")))?;
            crate::quant::dequantize_row(b.ty, src, &mut bias)?;
            row.iter_mut().zip(&bias).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }

    fn add(&self, a: &mut CpuTensor, b: &CpuTensor) -> Result<(), BackendError> {
        contract::add((a.rows, a.cols), (b.rows, b.cols))?;
        a.data.iter_mut().zip(&b.data).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn scale_rows(&self, x: &mut CpuTensor, s: &[f32]) -> Result<(), BackendError> {
        contract::scale_rows(x.rows, s.len())?;
        x.data
            .chunks_mut(x.cols.max(1))
            .zip(s)
            .for_each(|(r, s)| r.iter_mut().for_each(|v| *v *= s));
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        group: usize,
        eps: f32,
    ) -> Result<CpuTensor, BackendError> {
        ops::rms_norm(x, w, group, eps)
    }

    fn rope(
        &self,
        x: &mut CpuTensor,
        head_dim: usize,
        pos: BatchPos,
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        ops::rope(x, head_dim, pos, p)
    }

    fn glu(&self, gate: &CpuTensor, up: &CpuTensor, kind: Glu) -> Result<CpuTensor, BackendError> {
        ops::glu(gate, up, kind)
    }

    fn weighted_sum(
        &self,
        x: &CpuTensor,
        w: &[f32],
        n_used: usize,
    ) -> Result<CpuTensor, BackendError> {
        ops::weighted_sum(x, w, n_used)
    }

    fn new_kv(
        &self,
        n_ctx: usize,
        n_embd_k: usize,
        n_embd_v: usize,
        dtype: GgmlType,
    ) -> Result<CpuKv, BackendError> {
        Ok(CpuKv {
            k: KvStore::new(dtype, n_ctx.checked_mul(n_embd_k))?,
            v: KvStore::new(dtype, n_ctx.checked_mul(n_embd_v))?,
            n_ctx,
            n_embd_k,
            n_embd_v,
        })
    }

    fn kv_shape(&self, kv: &CpuKv) -> (KvShape, GgmlType) {
        let dtype = match kv.k {
            KvStore::F16(_) => GgmlType::F16,
            KvStore::F32(_) => GgmlType::F32,
        };
        (kv.shape(), dtype)
    }

    fn kv_read(&self, kv: &CpuKv, n: usize) -> Result<Vec<u8>, BackendError> {
        let (shape, dtype) = self.kv_shape(kv);
        let (kb, vb) = super::kv_bytes_of(shape, dtype, n)?;
        let mut out = Vec::new();
        out.try_reserve_exact(kb + vb)
            .map_err(|_| BackendError::OutOfMemory {
                what: "a copy of the KV cache",
                bytes: (kb + vb) as u64,
            })?;
        out.extend_from_slice(&kv.k.bytes()[..kb]);
        out.extend_from_slice(&kv.v.bytes()[..vb]);
        Ok(out)
    }

    fn kv_write(&self, kv: &mut CpuKv, n: usize, bytes: &[u8]) -> Result<(), BackendError> {
        let (shape, dtype) = self.kv_shape(kv);
        let (kb, vb) = super::kv_bytes_of(shape, dtype, n)?;
        if bytes.len() != kb + vb {
            return Err(shape_err(
                "kv_write",
                format!(
                    "{} bytes for {n} positions ({} expected)",
                    bytes.len(),
                    kb + vb
                ),
            ));
        }
        kv.k.bytes_mut()[..kb].copy_from_slice(&bytes[..kb]);
        kv.v.bytes_mut()[..vb].copy_from_slice(&bytes[kb..]);
        Ok(())
    }

    fn attention(
        &self,
        kv: &mut CpuKv,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        sinks: Option<&CpuWeight>,
        pos: BatchPos,
        p: &AttnParams,
    ) -> Result<CpuTensor, BackendError> {
        self.attention_multi(&mut [kv], q, k, v, sinks, &[pos], p)
    }

    fn attention_multi(
        &self,
        kvs: &mut [&mut CpuKv],
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        sinks: Option<&CpuWeight>,
        seqs: &[BatchPos],
        p: &AttnParams,
    ) -> Result<CpuTensor, BackendError> {
        let sinks = match sinks {
            Some(w) => Some(w.to_f32()?),
            None => None,
        };
        let shapes: Vec<KvShape> = kvs.iter().map(|kv| kv.shape()).collect();
        check_attention(
            p,
            &shapes,
            seqs,
            (q.rows, q.cols),
            (k.rows, k.cols),
            (v.rows, v.cols),
            sinks.as_ref().map(|s| s.len()),
        )?;
        let mut r0 = 0;
        for (kv, pos) in kvs.iter_mut().zip(seqs) {
            let (kr, vr) = (r0 * k.cols, r0 * v.cols);
            kv.k.write(
                pos.pos0 * kv.n_embd_k,
                &k.data[kr..kr + pos.n_tokens * k.cols],
            );
            // A K-only cache (n_embd_v 0) reads its values from the keys.
            if kv.n_embd_v > 0 {
                kv.v.write(
                    pos.pos0 * kv.n_embd_v,
                    &v.data[vr..vr + pos.n_tokens * v.cols],
                );
            }
            r0 += pos.n_tokens;
        }
        let kvs: Vec<&CpuKv> = kvs.iter().map(|kv| &**kv).collect();
        if seqs.iter().any(|s| s.steps && s.n_tokens > 1) {
            // Every row of a `steps` sequence a one-token sequence over its
            // own cache, which now holds the whole batch: the causal range
            // of row `t` ends at its position, as in the step that
            // evaluated it alone.
            let (kvs, seqs): (Vec<&CpuKv>, Vec<BatchPos>) = kvs
                .iter()
                .zip(seqs)
                .flat_map(|(kv, s)| {
                    let (n, rows) = if s.steps {
                        (s.n_tokens, 1)
                    } else {
                        (1, s.n_tokens)
                    };
                    (0..n).map(move |t| {
                        let one = BatchPos {
                            pos0: s.pos0 + t,
                            n_tokens: rows,
                            steps: false,
                        };
                        (*kv, one)
                    })
                })
                .unzip();
            return attention::attend(&kvs, q, sinks.as_deref(), &seqs, p);
        }
        attention::attend(&kvs, q, sinks.as_deref(), seqs, p)
    }

    fn rope_multi(
        &self,
        x: &mut CpuTensor,
        head_dim: usize,
        seqs: &[BatchPos],
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        ops::rope_rows(x, head_dim, seqs, p)
    }
}
