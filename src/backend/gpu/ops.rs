//! Element-wise and row ops: rms_norm, rope, glu, add, biases, scaling,
//! weighted sums, row gathers and scatters. One thread per output value
//! unless noted; indices beyond 65535 workgroups use a 2-D grid.

use super::{Arg, GpuBackend, GpuTensor, GpuWeight, KernelKey};
use crate::backend::rope_math::{rope_cache, yarn_corr_dims};
use crate::backend::{contract, BackendError, BatchPos, Glu, RopeMode, RopeParams};

const RMS_NORM: &str = include_str!("../../../shaders/rms_norm.wgsl");
const ROPE: &str = include_str!("../../../shaders/rope.wgsl");
const GLU: &str = include_str!("../../../shaders/glu.wgsl");
const ADD: &str = include_str!("../../../shaders/add.wgsl");
const ADD_BIAS: &str = include_str!("../../../shaders/add_bias.wgsl");
const SCALE_ROWS: &str = include_str!("../../../shaders/scale_rows.wgsl");
const WEIGHTED_SUM: &str = include_str!("../../../shaders/weighted_sum.wgsl");
const COPY_ROWS: &str = include_str!("../../../shaders/copy_rows.wgsl");

fn shape(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// A kernel whose constants are fixed by `variant`: compiled once per
/// device and variant.
pub(super) fn simple(
    b: &GpuBackend,
    name: &'static str,
    src: &'static str,
    consts: &[(&str, u32)],
    variant: u32,
) -> Result<std::sync::Arc<wgpu::ComputePipeline>, BackendError> {
    simple_parts(b, name, &[src], consts, variant)
}

/// [`simple`] over a kernel made of several sources (shared functions
/// first, the kernel last).
pub(super) fn simple_parts(
    b: &GpuBackend,
    name: &'static str,
    parts: &[&'static str],
    consts: &[(&str, u32)],
    variant: u32,
) -> Result<std::sync::Arc<wgpu::ComputePipeline>, BackendError> {
    let ctx = b.ctx();
    Ok(ctx.pipeline(&KernelKey::new(name).variant(variant), || {
        ctx.source(parts, consts)
    })?)
}

/// Workgroups of 256 threads covering `n` items.
pub(super) fn groups(b: &GpuBackend, n: usize) -> [u32; 3] {
    b.ctx().grid(n.div_ceil(256) as u32)
}

fn f32s(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// `dst[map[i].1] = src[map[i].0]` for rows of `cols`.
fn copy_rows(
    b: &GpuBackend,
    src: &GpuTensor,
    dst: &GpuTensor,
    map: &[[u32; 2]],
) -> Result<(), BackendError> {
    if map.is_empty() || src.cols == 0 {
        return Ok(());
    }
    let ctx = b.ctx();
    let pipe = simple(b, "copy_rows", COPY_ROWS, &[], 0)?;
    let m = ctx.upload_temp(bytemuck::cast_slice(map), "row map")?;
    ctx.dispatch(
        &pipe,
        &[Arg::Buf(&src.buf), Arg::Buf(&dst.buf), Arg::Buf(&m)],
        &[map.len() as u32, src.cols as u32],
        groups(b, map.len() * src.cols),
    );
    Ok(())
}

pub(super) fn gather_rows(
    b: &GpuBackend,
    x: &GpuTensor,
    rows: &[usize],
) -> Result<GpuTensor, BackendError> {
    contract::gather_rows(x.rows, rows)?;
    let out = b.tensor(rows.len(), x.cols)?;
    let map: Vec<[u32; 2]> = rows
        .iter()
        .enumerate()
        .map(|(i, &r)| [r as u32, i as u32])
        .collect();
    copy_rows(b, x, &out, &map)?;
    Ok(out)
}

pub(super) fn scatter_rows(
    b: &GpuBackend,
    dst: &mut GpuTensor,
    src: &GpuTensor,
    rows: &[usize],
) -> Result<(), BackendError> {
    contract::scatter_rows((dst.rows, dst.cols), (src.rows, src.cols), rows)?;
    let map: Vec<[u32; 2]> = rows
        .iter()
        .enumerate()
        .map(|(i, &r)| [i as u32, r as u32])
        .collect();
    copy_rows(b, src, dst, &map)
}

pub(super) fn add_bias(
    b: &GpuBackend,
    x: &mut GpuTensor,
    w: &GpuWeight,
    ids: Option<&[u32]>,
) -> Result<(), BackendError> {
    let (n, rows) = (w.ne[0], w.ne[1]);
    match ids {
        None => {
            contract::add_bias(x.cols, w.ne.iter().product())?;
            let bias = bias_buffer("add_bias", w)?;
            let pipe = simple(b, "add_bias", ADD_BIAS, &[("IDS", 0)], 0)?;
            b.ctx().dispatch(
                &pipe,
                &[Arg::Buf(&x.buf), Arg::Buf(bias)],
                &[x.rows as u32, x.cols as u32],
                groups(b, x.rows * x.cols),
            );
        }
        Some(ids) => {
            contract::add_bias_id((x.rows, x.cols), (n, rows), ids)?;
            let bias = bias_buffer("add_bias_id", w)?;
            let idb = b.ctx().upload_temp(bytemuck::cast_slice(ids), "bias ids")?;
            add_bias_rows(b, x, bias, &idb)?;
        }
    }
    Ok(())
}

/// The buffer of a bias the kernels read: f32 in one part.
pub(super) fn bias_buffer<'w>(
    op: &'static str,
    w: &'w GpuWeight,
) -> Result<&'w wgpu::Buffer, BackendError> {
    if w.ty != crate::tensor::GgmlType::F32 || w.parts.len() != 1 {
        return Err(shape(
            op,
            format!(
                "bias {:?} of {}: the GPU reads f32 biases in one part",
                w.ne,
                w.ty.name()
            ),
        ));
    }
    Ok(&w.parts[0].buf)
}

/// ggml's add_id over checked shapes: row `r` of `x` gets row `ids[r]` of
/// `bias` (`ids` u32 on the device).
pub(super) fn add_bias_rows(
    b: &GpuBackend,
    x: &mut GpuTensor,
    bias: &wgpu::Buffer,
    ids: &wgpu::Buffer,
) -> Result<(), BackendError> {
    let pipe = simple(b, "add_bias_id", ADD_BIAS, &[("IDS", 1)], 1)?;
    b.ctx().dispatch(
        &pipe,
        &[Arg::Buf(&x.buf), Arg::Buf(bias), Arg::Buf(ids)],
        &[x.rows as u32, x.cols as u32],
        groups(b, x.rows * x.cols),
    );
    Ok(())
}

pub(super) fn add(b: &GpuBackend, a: &mut GpuTensor, x: &GpuTensor) -> Result<(), BackendError> {
    contract::add((a.rows, a.cols), (x.rows, x.cols))?;
    let n = a.rows * a.cols;
    let pipe = simple(b, "add", ADD, &[], 0)?;
    b.ctx().dispatch(
        &pipe,
        &[Arg::Buf(&a.buf), Arg::Buf(&x.buf)],
        &[n as u32],
        groups(b, n),
    );
    Ok(())
}

pub(super) fn scale_rows(b: &GpuBackend, x: &mut GpuTensor, s: &[f32]) -> Result<(), BackendError> {
    contract::scale_rows(x.rows, s.len())?;
    let ctx = b.ctx();
    let pipe = simple(b, "scale_rows", SCALE_ROWS, &[("GATE", 0)], 0)?;
    let sb = ctx.upload_temp(f32s(s), "row scales")?;
    ctx.dispatch(
        &pipe,
        &[Arg::Buf(&x.buf), Arg::Buf(&sb)],
        &[x.rows as u32, x.cols as u32],
        groups(b, x.rows * x.cols),
    );
    Ok(())
}

/// [`scale_rows`] by the gate `g [rows, 1]` as llama.cpp's shared-expert
/// gate: `silu(g) / g` (`shaders/scale_rows.wgsl` with GATE).
pub(super) fn scale_rows_gated(
    b: &GpuBackend,
    x: &mut GpuTensor,
    g: &GpuTensor,
) -> Result<(), BackendError> {
    if g.cols != 1 {
        return Err(shape(
            "scale_rows_gated",
            format!("gate of {} columns: give one per row", g.cols),
        ));
    }
    contract::scale_rows(x.rows, g.rows)?;
    let pipe = simple(b, "scale_rows_gated", SCALE_ROWS, &[("GATE", 1)], 1)?;
    b.ctx().dispatch(
        &pipe,
        &[Arg::Buf(&x.buf), Arg::Buf(&g.buf)],
        &[x.rows as u32, x.cols as u32],
        groups(b, x.rows * x.cols),
    );
    Ok(())
}

pub(super) fn rms_norm(
    b: &GpuBackend,
    x: &GpuTensor,
    w: &GpuWeight,
    group: usize,
    eps: f32,
) -> Result<GpuTensor, BackendError> {
    contract::rms_norm(x.cols, group, w.ne[0])?;
    if w.ty != crate::tensor::GgmlType::F32 || w.parts.len() != 1 {
        return Err(shape(
            "rms_norm",
            format!(
                "weight {:?} of {}: the GPU reads f32 norm weights in one part",
                w.ne,
                w.ty.name()
            ),
        ));
    }
    norm_groups(b, x, Some(&w.parts[0].buf), group, eps, 0.0)
}

/// `shaders/rms_norm.wgsl` over groups of `group` columns of `x`: times the
/// weight `w [group]`, or without one (its L2 variant) times `post`.
pub(super) fn norm_groups(
    b: &GpuBackend,
    x: &GpuTensor,
    w: Option<&wgpu::Buffer>,
    group: usize,
    eps: f32,
    post: f32,
) -> Result<GpuTensor, BackendError> {
    let ctx = b.ctx();
    const WG: u32 = 64;
    let (name, l2) = match w {
        Some(_) => ("rms_norm", 0),
        None => ("l2_norm", 1),
    };
    let pipe = simple(b, name, RMS_NORM, &[("WG", WG), ("L2", l2)], WG)?;
    let out = b.tensor(x.rows, x.cols)?;
    let n_groups = x.rows * x.cols / group;
    let mut args = vec![Arg::Buf(&x.buf)];
    args.extend(w.map(Arg::Buf));
    args.push(Arg::Buf(&out.buf));
    ctx.dispatch(
        &pipe,
        &args,
        &[group as u32, n_groups as u32, eps.to_bits(), post.to_bits()],
        ctx.grid(n_groups as u32),
    );
    Ok(out)
}

pub(super) fn rope(
    b: &GpuBackend,
    x: &mut GpuTensor,
    head_dim: usize,
    pos: BatchPos,
    p: &RopeParams,
) -> Result<(), BackendError> {
    contract::rope((x.rows, x.cols), head_dim, p.n_rot, pos.n_tokens)?;
    let half = p.n_rot / 2;
    if half == 0 || x.rows == 0 {
        return Ok(());
    }
    let corr = yarn_corr_dims(p.n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow);
    let mut table = vec![(0f32, 0f32); x.rows * half];
    for (t, row) in table.chunks_mut(half).enumerate() {
        rope_cache(p, (pos.pos0 + t) as f32, corr, row);
    }
    let flat: Vec<f32> = table.iter().flat_map(|&(c, s)| [c, s]).collect();
    let ctx = b.ctx();
    let cs = ctx.upload_temp(f32s(&flat), "rope table")?;
    let pipe = simple(b, "rope", ROPE, &[], 0)?;
    let n = x.rows * (x.cols / head_dim) * half;
    ctx.dispatch(
        &pipe,
        &[Arg::Buf(&x.buf), Arg::Buf(&cs)],
        &[
            x.cols as u32,
            head_dim as u32,
            half as u32,
            (p.mode == RopeMode::Neox) as u32,
            x.rows as u32,
        ],
        groups(b, n),
    );
    Ok(())
}

pub(super) fn glu(
    b: &GpuBackend,
    gate: &GpuTensor,
    up: &GpuTensor,
    kind: Glu,
) -> Result<GpuTensor, BackendError> {
    contract::glu((gate.rows, gate.cols), (up.rows, up.cols))?;
    let (oai, alpha, limit) = match kind {
        Glu::SwiGlu => (0, 0.0f32, 0.0f32),
        Glu::SwiGluOai { alpha, limit } => (1, alpha, limit),
    };
    let pipe = simple(b, "glu", GLU, &[("OAI", oai)], oai)?;
    let out = b.tensor(gate.rows, gate.cols)?;
    let n = gate.rows * gate.cols;
    b.ctx().dispatch(
        &pipe,
        &[Arg::Buf(&gate.buf), Arg::Buf(&up.buf), Arg::Buf(&out.buf)],
        &[n as u32, alpha.to_bits(), limit.to_bits()],
        groups(b, n),
    );
    Ok(out)
}

pub(super) fn weighted_sum(
    b: &GpuBackend,
    x: &GpuTensor,
    w: &[f32],
    n_used: usize,
) -> Result<GpuTensor, BackendError> {
    let n_tok = contract::weighted_sum(x.rows, w.len(), n_used)?;
    let wb = b.ctx().upload_temp(f32s(w), "pair weights")?;
    weighted_sum_rows(b, x, &wb, n_tok, n_used)
}

/// `shaders/weighted_sum.wgsl` over checked shapes: `n_tok` groups of
/// `n_used` rows of `x`, weighted by `w` (one f32 per row, on the device).
pub(super) fn weighted_sum_rows(
    b: &GpuBackend,
    x: &GpuTensor,
    w: &wgpu::Buffer,
    n_tok: usize,
    n_used: usize,
) -> Result<GpuTensor, BackendError> {
    let out = b.tensor(n_tok, x.cols)?;
    let pipe = simple(b, "weighted_sum", WEIGHTED_SUM, &[], 0)?;
    b.ctx().dispatch(
        &pipe,
        &[Arg::Buf(&x.buf), Arg::Buf(w), Arg::Buf(&out.buf)],
        &[n_tok as u32, x.cols as u32, n_used as u32],
        groups(b, n_tok * x.cols),
    );
    Ok(out)
}
