//! The GPU placement through wgpu: one WGSL kernel set (`shaders/`) on Metal,
//! Vulkan or DX12. Weights are GGUF blocks uploaded as they are and read in
//! place by the kernels; a tensor larger than the adapter's storage binding
//! limit is split into parts (rows of a matrix, experts of a stacked tensor)
//! and dispatched per part. Activations are f32.

mod attention;
mod cols;
mod context;
mod device;
mod id_plan;
mod matmul;
mod ops;
mod pool;
mod recurrent;
mod route;
mod select;
mod slots;

use std::sync::Arc;

pub use attention::GpuKv;
pub use context::{Arg, Caps, Ctx, KernelKey};
pub use device::{default_adapter, list_adapters, named_adapter, AdapterSummary, DeviceChoice};
pub use matmul::MV_TOK;
pub use pool::{Pooled, POOL_MAX_BYTES};
pub use slots::GpuSlots;

use super::{
    Act, AttnParams, Backend, BackendError, BatchPos, DeltaNetParams, DeviceRoute, Glu, KvShape,
    RopeParams, SlotTensor,
};
use crate::gguf;
use crate::tensor::GgmlType;

/// Errors of the GPU placement.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU adapter found (wgpu saw: {seen}); run on the CPU with -ngl 0, or pick a software adapter with --device NAME")]
    NoAdapter { seen: String },
    #[error(
        "no adapter matches --device {name:?}; available: {available} (see `longhaul devices`)"
    )]
    NoSuchDevice { name: String, available: String },
    #[error("could not open {name}: {detail}")]
    Device { name: String, detail: String },
    #[error("kernel {kernel} failed to compile: {detail}")]
    Shader { kernel: String, detail: String },
    #[error("{what} needs {bytes} bytes in one binding but the adapter allows {limit}; this tensor cannot be split further")]
    TooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },
    #[error("GPU device lost or failed: {0}")]
    Lost(String),
    #[error("GPU error: {0}; if the device ran out of memory, stream the experts (--longhaul --longhaul-cache GIB) or run on the CPU (-ngl 0)")]
    Failed(String),
}

/// User settings for the GPU placement (also read from the environment by
/// [`GpuOptions::from_env`]).
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Adapter choice (`--device NAME` / `LONGHAUL_DEVICE`).
    pub device: DeviceChoice,
    /// Do not use `shader-f16` even when present (`LONGHAUL_GPU_NO_F16=1`).
    pub no_f16: bool,
    /// Do not use subgroup operations (`LONGHAUL_GPU_NO_SUBGROUPS=1`).
    pub no_subgroups: bool,
    /// Lower the storage binding limit (`LONGHAUL_GPU_MAX_BINDING=BYTES`), to
    /// exercise tensor splitting with small models.
    pub max_binding: Option<u64>,
    /// NaN-fill new activations before kernels write them (`LONGHAUL_GPU_POISON=1`).
    pub poison: bool,
}

impl GpuOptions {
    pub fn from_env() -> Self {
        let flag = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty() && v != "0");
        Self {
            device: match std::env::var("LONGHAUL_DEVICE") {
                Ok(n) if !n.is_empty() => DeviceChoice::Named(n),
                _ => DeviceChoice::Auto,
            },
            no_f16: flag("LONGHAUL_GPU_NO_F16"),
            no_subgroups: flag("LONGHAUL_GPU_NO_SUBGROUPS"),
            max_binding: std::env::var("LONGHAUL_GPU_MAX_BINDING")
                .ok()
                .and_then(|v| v.parse().ok()),
            poison: flag("LONGHAUL_GPU_POISON"),
        }
    }
}

/// An activation `[rows, cols]` of f32 in a storage buffer.
#[derive(Clone, Debug)]
pub struct GpuTensor {
    /// Its storage, shared by the tensor's clones and returned to the
    /// device's pool after the last one (derefs to `wgpu::Buffer`).
    pub buf: Arc<Pooled>,
    pub rows: usize,
    pub cols: usize,
}

/// A contiguous piece of a weight in one buffer: `count` rows (2-D) or
/// experts (3-D) starting at `first`.
#[derive(Clone, Debug)]
pub struct WeightPart {
    pub buf: wgpu::Buffer,
    pub first: usize,
    pub count: usize,
}

/// A weight on the device: GGUF blocks as stored in the file (vectors are
/// converted to f32 at upload).
#[derive(Clone, Debug)]
pub struct GpuWeight {
    pub ty: GgmlType,
    /// `[ne0 (row length), ne1 (rows), ne2 (experts; 1 for a matrix)]`.
    pub ne: [usize; 3],
    pub row_bytes: usize,
    /// Bytes from one expert to the next inside a part (a multiple of 4).
    pub expert_stride: u64,
    /// Split along rows when `ne[2] == 1`, else along experts.
    pub parts: Vec<WeightPart>,
}

impl GpuWeight {
    /// The part holding row (2-D) or expert (3-D) `i`, and `i`'s index in it.
    pub fn part_of(&self, i: usize) -> Option<(&WeightPart, usize)> {
        self.parts
            .iter()
            .find(|p| i >= p.first && i < p.first + p.count)
            .map(|p| (p, i - p.first))
    }
}

/// The GPU backend: a handle to one device (cheap to clone).
#[derive(Clone)]
pub struct GpuBackend {
    ctx: Arc<Ctx>,
    summary: Arc<AdapterSummary>,
}

impl GpuBackend {
    /// Opens the adapter `opts` designates. `Auto` with no GPU is an error
    /// here; the placement decides whether to fall back to the CPU.
    pub fn open(opts: &GpuOptions) -> Result<Self, GpuError> {
        let adapter = device::choose(&opts.device)?.ok_or_else(|| GpuError::NoAdapter {
            seen: {
                let all = list_adapters();
                if all.is_empty() {
                    "nothing".into()
                } else {
                    all.iter()
                        .map(|a| format!("{} ({})", a.name, a.device_type))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            },
        })?;
        let (dev, queue, s) = device::open(&adapter, !opts.no_f16, !opts.no_subgroups)?;
        let lim = dev.limits();
        let caps = Caps {
            f16: dev.features().contains(wgpu::Features::SHADER_F16),
            subgroups: dev.features().contains(wgpu::Features::SUBGROUP),
            subgroup_min: s.subgroup_min,
            subgroup_max: s.subgroup_max,
            max_binding: opts
                .max_binding
                .map_or(lim.max_storage_buffer_binding_size, |m| {
                    m.min(lim.max_storage_buffer_binding_size)
                })
                .max(4096),
            max_workgroups_per_dim: lim.max_compute_workgroups_per_dimension,
            poison: opts.poison,
        };
        Ok(Self {
            ctx: Arc::new(Ctx::new(dev, queue, caps)),
            summary: Arc::new(s),
        })
    }

    pub fn adapter(&self) -> &AdapterSummary {
        &self.summary
    }
    pub fn caps(&self) -> &Caps {
        &self.ctx.caps
    }
    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// Uploads a weight of `dims` (ggml order) from `bytes` as stored in GGUF.
    pub fn upload_weight(
        &self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        bytes: &[u8],
    ) -> Result<GpuWeight, BackendError> {
        let ctx = &self.ctx;
        let lim = ctx.caps.max_binding;
        if dims.iter().skip(1).all(|&d| d == 1) {
            // Vectors (norms, biases, sinks) become f32.
            let n: u64 = dims.iter().product();
            let mut v = vec![0f32; n as usize];
            crate::quant::dequantize_row(ty, bytes, &mut v)?;
            let buf = ctx.upload(bytemuck::cast_slice(&v), name)?;
            return Ok(GpuWeight {
                ty: GgmlType::F32,
                ne: [n as usize, 1, 1],
                row_bytes: n as usize * 4,
                expert_stride: (n * 4).next_multiple_of(4),
                parts: vec![WeightPart {
                    buf,
                    first: 0,
                    count: 1,
                }],
            });
        }
        let ne0 = dims[0] as usize;
        let ne1 = dims.get(1).copied().unwrap_or(1) as usize;
        let ne2 = dims.get(2).copied().unwrap_or(1) as usize;
        if dims.len() > 3 || !ne0.is_multiple_of(ty.block_size()) {
            return Err(BackendError::Shape {
                op: "upload_weight",
                detail: format!("`{name}`: unsupported dims {dims:?} for {}", ty.name()),
            });
        }
        let row_bytes = ne0 / ty.block_size() * ty.type_size();
        let expert_bytes = (row_bytes * ne1) as u64;
        if bytes.len() as u64 != expert_bytes * ne2 as u64 {
            return Err(BackendError::Shape {
                op: "upload_weight",
                detail: format!("`{name}`: {} bytes for dims {dims:?}", bytes.len()),
            });
        }
        let mut parts = Vec::new();
        let expert_stride = expert_bytes.next_multiple_of(4);
        if ne2 == 1 {
            let per = ((lim / row_bytes as u64) as usize).max(1);
            let mut first = 0;
            while first < ne1 {
                let count = per.min(ne1 - first);
                let buf =
                    ctx.upload(&bytes[first * row_bytes..(first + count) * row_bytes], name)?;
                parts.push(WeightPart { buf, first, count });
                first += count;
            }
        } else {
            if expert_stride > lim {
                return Err(GpuError::TooLarge {
                    what: format!("one expert of `{name}`"),
                    bytes: expert_stride,
                    limit: lim,
                }
                .into());
            }
            let per = (lim / expert_stride) as usize;
            let mut first = 0;
            while first < ne2 {
                let count = per.min(ne2 - first);
                let mut data = vec![0u8; count * expert_stride as usize];
                for e in 0..count {
                    let src = (first + e) * expert_bytes as usize;
                    data[e * expert_stride as usize..][..expert_bytes as usize]
                        .copy_from_slice(&bytes[src..src + expert_bytes as usize]);
                }
                let buf = ctx.upload(&data, name)?;
                parts.push(WeightPart { buf, first, count });
                first += count;
            }
        }
        Ok(GpuWeight {
            ty,
            ne: [ne0, ne1, ne2],
            row_bytes,
            expert_stride,
            parts,
        })
    }

    /// A new activation `[rows, cols]` (poisoned when the options ask).
    pub fn tensor(&self, rows: usize, cols: usize) -> Result<GpuTensor, BackendError> {
        let buf = self
            .ctx
            .activation((rows * cols * 4) as u64, "activation")?;
        Ok(GpuTensor { buf, rows, cols })
    }
}

fn shape(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

impl Backend for GpuBackend {
    type Tensor = GpuTensor;
    type Weight = GpuWeight;
    type Kv = GpuKv;
    type Slots = GpuSlots;

    fn name(&self) -> &'static str {
        "GPU"
    }

    fn load_weight(
        &self,
        model: &Arc<gguf::Model>,
        t: &gguf::TensorInfo,
    ) -> Result<GpuWeight, BackendError> {
        let bytes = model
            .tensor_data(t)
            .map_err(|e| shape("load_weight", e.to_string()))?;
        self.upload_weight(&t.name, t.ty, &t.dims, bytes)
    }

    fn placeholder_weight(&self, t: &gguf::TensorInfo) -> Result<GpuWeight, BackendError> {
        let d = |i: usize| t.dims.get(i).copied().unwrap_or(1) as usize;
        Ok(GpuWeight {
            ty: t.ty,
            ne: [d(0), d(1), d(2)],
            row_bytes: 0,
            expert_stride: 0,
            parts: Vec::new(),
        })
    }

    fn weight_from_bytes(
        &self,
        t: &gguf::TensorInfo,
        bytes: Vec<u8>,
    ) -> Result<GpuWeight, BackendError> {
        self.upload_weight(&t.name, t.ty, &t.dims, &bytes)
    }

    fn new_slots(&self, tensors: &[SlotTensor], n_slots: usize) -> Result<GpuSlots, BackendError> {
        GpuSlots::new(self.ctx.clone(), tensors, n_slots)
    }

    fn slot_weight(&self, slots: &GpuSlots, t: usize) -> Result<GpuWeight, BackendError> {
        slots.weight(t)
    }

    fn gather_rows(&self, x: &GpuTensor, rows: &[usize]) -> Result<GpuTensor, BackendError> {
        ops::gather_rows(self, x, rows)
    }

    fn scatter_rows(
        &self,
        dst: &mut GpuTensor,
        src: &GpuTensor,
        rows: &[usize],
    ) -> Result<(), BackendError> {
        ops::scatter_rows(self, dst, src, rows)
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<GpuTensor, BackendError> {
        let t = self.tensor(rows, cols)?;
        self.ctx.record(|enc| enc.clear_buffer(&t.buf, 0, None));
        Ok(t)
    }

    fn from_host(
        &self,
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<GpuTensor, BackendError> {
        if data.len() != rows * cols {
            return Err(shape(
                "from_host",
                format!("{} floats for [{rows}, {cols}]", data.len()),
            ));
        }
        let buf = Pooled::unpooled(self.ctx.upload(bytemuck::cast_slice(&data), "input")?);
        Ok(GpuTensor { buf, rows, cols })
    }

    fn to_host(&self, t: &GpuTensor) -> Result<Vec<f32>, BackendError> {
        let n = t.rows * t.cols;
        let bytes = self.ctx.read(&t.buf, 0, (n * 4) as u64)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    fn shape(&self, t: &GpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn reshape(&self, t: GpuTensor, rows: usize, cols: usize) -> Result<GpuTensor, BackendError> {
        cols::reshape(t, rows, cols)
    }

    fn split_cols(
        &self,
        x: &GpuTensor,
        group: usize,
        start: usize,
        len: usize,
    ) -> Result<GpuTensor, BackendError> {
        cols::split_cols(self, x, group, start, len)
    }

    fn concat_cols(
        &self,
        a: &GpuTensor,
        ga: usize,
        b: &GpuTensor,
        gb: usize,
    ) -> Result<GpuTensor, BackendError> {
        cols::concat_cols(self, a, ga, b, gb)
    }

    fn mul_act(&self, x: &mut GpuTensor, g: &GpuTensor, act: Act) -> Result<(), BackendError> {
        cols::mul_act(self, x, g, act)
    }

    fn act(&self, x: &mut GpuTensor, act: Act) -> Result<(), BackendError> {
        recurrent::act(self, x, act)
    }

    fn mul_vec(&self, x: &mut GpuTensor, w: &GpuWeight) -> Result<(), BackendError> {
        recurrent::mul_vec(self, x, w)
    }

    fn l2_norm(&self, x: &GpuTensor, group: usize, eps: f32) -> Result<GpuTensor, BackendError> {
        recurrent::l2_norm(self, x, group, eps)
    }

    fn ssm_conv(
        &self,
        x: &GpuTensor,
        w: &GpuWeight,
        states: &mut [&mut GpuTensor],
        seqs: &[BatchPos],
    ) -> Result<GpuTensor, BackendError> {
        recurrent::ssm_conv(self, x, w, states, seqs)
    }

    fn gated_delta_net(
        &self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        g: &GpuTensor,
        beta: &GpuTensor,
        states: &mut [&mut GpuTensor],
        seqs: &[BatchPos],
        p: &DeltaNetParams,
    ) -> Result<GpuTensor, BackendError> {
        recurrent::gated_delta_net(self, q, k, v, g, beta, states, seqs, p)
    }

    fn get_rows(&self, w: &GpuWeight, ids: &[u32]) -> Result<GpuTensor, BackendError> {
        matmul::get_rows(self, w, ids)
    }

    fn matmul(&self, w: &GpuWeight, x: &GpuTensor) -> Result<GpuTensor, BackendError> {
        matmul::matmul(self, w, x)
    }

    fn matmul_many(
        &self,
        ws: &[&GpuWeight],
        x: &GpuTensor,
    ) -> Result<Vec<GpuTensor>, BackendError> {
        matmul::matmul_many(self, ws, x)
    }

    fn mul_mat_id(
        &self,
        w: &GpuWeight,
        x: &GpuTensor,
        ids: &[u32],
        n_used: usize,
    ) -> Result<GpuTensor, BackendError> {
        matmul::mul_mat_id(self, w, x, ids, n_used)
    }

    fn add_bias(&self, x: &mut GpuTensor, b: &GpuWeight) -> Result<(), BackendError> {
        ops::add_bias(self, x, b, None)
    }

    fn add_bias_id(
        &self,
        x: &mut GpuTensor,
        b: &GpuWeight,
        ids: &[u32],
    ) -> Result<(), BackendError> {
        ops::add_bias(self, x, b, Some(ids))
    }

    fn add(&self, a: &mut GpuTensor, b: &GpuTensor) -> Result<(), BackendError> {
        ops::add(self, a, b)
    }

    fn scale_rows(&self, x: &mut GpuTensor, s: &[f32]) -> Result<(), BackendError> {
        ops::scale_rows(self, x, s)
    }

    fn rms_norm(
        &self,
        x: &GpuTensor,
        w: &GpuWeight,
        group: usize,
        eps: f32,
    ) -> Result<GpuTensor, BackendError> {
        ops::rms_norm(self, x, w, group, eps)
    }

    fn rope(
        &self,
        x: &mut GpuTensor,
        head_dim: usize,
        pos: BatchPos,
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        ops::rope(self, x, head_dim, pos, p)
    }

    fn glu(&self, gate: &GpuTensor, up: &GpuTensor, kind: Glu) -> Result<GpuTensor, BackendError> {
        ops::glu(self, gate, up, kind)
    }

    fn weighted_sum(
        &self,
        x: &GpuTensor,
        w: &[f32],
        n_used: usize,
    ) -> Result<GpuTensor, BackendError> {
        ops::weighted_sum(self, x, w, n_used)
    }

    fn route_on_device(
        &self,
        logits: &GpuTensor,
        r: &crate::backend::routing::Routing,
        select_bias: Option<&[f32]>,
    ) -> Result<Option<DeviceRoute<GpuTensor>>, BackendError> {
        route::route(self, logits, r, select_bias)
    }

    fn route_ids(&self, r: &DeviceRoute<GpuTensor>) -> Result<Vec<u32>, BackendError> {
        route::ids(self, r)
    }

    fn mul_mat_id_routed(
        &self,
        w: &GpuWeight,
        x: &GpuTensor,
        r: &DeviceRoute<GpuTensor>,
    ) -> Result<GpuTensor, BackendError> {
        matmul::mul_mat_id_routed(self, w, x, r)
    }

    fn mul_mat_id_routed_many(
        &self,
        ws: &[&GpuWeight],
        x: &GpuTensor,
        r: &DeviceRoute<GpuTensor>,
    ) -> Result<Vec<GpuTensor>, BackendError> {
        matmul::mul_mat_id_routed_many(self, ws, x, r)
    }

    fn add_bias_id_routed(
        &self,
        x: &mut GpuTensor,
        b: &GpuWeight,
        r: &DeviceRoute<GpuTensor>,
    ) -> Result<(), BackendError> {
        route::add_bias(self, x, b, r)
    }

    fn scale_rows_gated(&self, x: &mut GpuTensor, g: &GpuTensor) -> Result<(), BackendError> {
        ops::scale_rows_gated(self, x, g)
    }

    fn weighted_sum_routed(
        &self,
        x: &GpuTensor,
        r: &DeviceRoute<GpuTensor>,
    ) -> Result<GpuTensor, BackendError> {
        route::weighted_sum(self, x, r)
    }

    fn new_kv(
        &self,
        n_ctx: usize,
        n_embd_k: usize,
        n_embd_v: usize,
        dtype: GgmlType,
    ) -> Result<GpuKv, BackendError> {
        attention::new_kv(self, n_ctx, n_embd_k, n_embd_v, dtype)
    }

    fn kv_shape(&self, kv: &GpuKv) -> (KvShape, GgmlType) {
        (
            KvShape {
                n_ctx: kv.n_ctx,
                n_embd_k: kv.n_embd_k,
                n_embd_v: kv.n_embd_v,
            },
            kv.dtype,
        )
    }

    fn kv_read(&self, kv: &GpuKv, n: usize) -> Result<Vec<u8>, BackendError> {
        attention::kv_read(self, kv, n)
    }

    fn kv_write(&self, kv: &mut GpuKv, n: usize, bytes: &[u8]) -> Result<(), BackendError> {
        attention::kv_write(self, kv, n, bytes)
    }

    fn attention(
        &self,
        kv: &mut GpuKv,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        sinks: Option<&GpuWeight>,
        pos: BatchPos,
        p: &AttnParams,
    ) -> Result<GpuTensor, BackendError> {
        attention::attention(self, kv, q, k, v, sinks, pos, p)
    }
}
