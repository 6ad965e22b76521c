//! The ops of recurrent (linear-attention) layers on device activations:
//! element-wise activations (`shaders/act.wgsl` over
//! `shaders/activation.wgsl`), a broadcast vector multiply
//! (`shaders/mul_vec.wgsl`), gated DeltaNet's L2 norm (the L2 variant of
//! `shaders/rms_norm.wgsl`), the short causal convolution with its carried
//! state (`shaders/ssm_conv.wgsl`) and the gated delta rule
//! (`shaders/gated_delta_net.wgsl`). States stay on the device: the kernels
//! read and rewrite them in place. Each sequence's state is its own buffer,
//! so the two stateful ops dispatch once per sequence (the delta rule once
//! per chunk of its tokens), every sequence's rows found by their offset in
//! the shared activations. Shapes are checked by
//! [`crate::backend::contract`].

use super::ops::{groups, norm_groups, simple, simple_parts};
use super::{Arg, GpuBackend, GpuTensor, GpuWeight};
use crate::backend::{contract, Act, BackendError, BatchPos, DeltaNetParams, KHeadMap};
use crate::tensor::GgmlType;

const ACTIVATION: &str = include_str!("../../../shaders/activation.wgsl");
const ACT: &str = include_str!("../../../shaders/act.wgsl");
const MUL_VEC: &str = include_str!("../../../shaders/mul_vec.wgsl");
const SSM_CONV: &str = include_str!("../../../shaders/ssm_conv.wgsl");
const GATED_DELTA_NET: &str = include_str!("../../../shaders/gated_delta_net.wgsl");

/// Largest head size of the gated delta net kernel: one invocation per
/// column of the state, and WebGPU guarantees workgroups of 256.
const MAX_DELTA_HEAD: usize = 256;

/// Tokens of one gated delta net dispatch; a longer sequence takes several,
/// its state written back between them (bit for bit what one dispatch
/// would carry). This bounds how long one dispatch runs: a whole prompt in
/// one would risk the OS's GPU watchdog, and Mesa 22.3's lavapipe was seen
/// to stop writing outputs after about 250 tokens of one dispatch at
/// S = 128 (500 at S = 64; cause unknown).
const DELTA_CHUNK: usize = 64;

fn shape(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// The pipeline of `kernel` (a source that calls `activation`) for `act`.
pub(super) fn act_pipeline(
    b: &GpuBackend,
    name: &'static str,
    kernel: &'static str,
    act: Act,
) -> Result<std::sync::Arc<wgpu::ComputePipeline>, BackendError> {
    let (softplus, silu) = ((act == Act::Softplus) as u32, (act == Act::Silu) as u32);
    simple_parts(
        b,
        name,
        &[ACTIVATION, kernel],
        &[("SOFTPLUS", softplus), ("SILU", silu)],
        softplus | silu << 1,
    )
}

pub(super) fn act(b: &GpuBackend, x: &mut GpuTensor, act: Act) -> Result<(), BackendError> {
    let n = x.rows * x.cols;
    if n == 0 {
        return Ok(());
    }
    let pipe = act_pipeline(b, "act", ACT, act)?;
    b.ctx()
        .dispatch(&pipe, &[Arg::Buf(&x.buf)], &[n as u32], groups(b, n));
    Ok(())
}

pub(super) fn mul_vec(
    b: &GpuBackend,
    x: &mut GpuTensor,
    w: &GpuWeight,
) -> Result<(), BackendError> {
    contract::mul_vec(x.cols, w.ne.iter().product())?;
    if w.ty != GgmlType::F32 || w.parts.len() != 1 {
        return Err(shape(
            "mul_vec",
            format!(
                "weight {:?} of {}: the GPU reads f32 vectors in one part",
                w.ne,
                w.ty.name()
            ),
        ));
    }
    let n = x.rows * x.cols;
    if n == 0 {
        return Ok(());
    }
    let pipe = simple(b, "mul_vec", MUL_VEC, &[], 0)?;
    b.ctx().dispatch(
        &pipe,
        &[Arg::Buf(&x.buf), Arg::Buf(&w.parts[0].buf)],
        &[x.rows as u32, x.cols as u32],
        groups(b, n),
    );
    Ok(())
}

pub(super) fn l2_norm(
    b: &GpuBackend,
    x: &GpuTensor,
    group: usize,
    eps: f32,
) -> Result<GpuTensor, BackendError> {
    contract::l2_norm(x.cols, group)?;
    // ggml_rms_norm(x, eps / n) then ggml_scale(1 / sqrt(n)): both factors
    // rounded to f32 as the CPU rounds them.
    let (eps_n, post) = (eps / group as f32, 1.0 / (group as f32).sqrt());
    norm_groups(b, x, None, group, eps_n, post)
}

/// The row offset and length of each sequence, in order.
fn seq_rows(seqs: &[BatchPos]) -> impl Iterator<Item = (usize, usize)> + '_ {
    seqs.iter().scan(0, |r0, s| {
        let at = *r0;
        *r0 += s.n_tokens;
        Some((at, s.n_tokens))
    })
}

pub(super) fn ssm_conv(
    b: &GpuBackend,
    x: &GpuTensor,
    w: &GpuWeight,
    states: &mut [&mut GpuTensor],
    seqs: &[BatchPos],
) -> Result<GpuTensor, BackendError> {
    const OP: &str = "ssm_conv";
    let shapes: Vec<(usize, usize)> = states.iter().map(|s| (s.rows, s.cols)).collect();
    let dims: Vec<u64> = match w.ne {
        [k, c, 1] => vec![k as u64, c as u64],
        ne => ne.iter().map(|&d| d as u64).collect(),
    };
    let d_conv = contract::ssm_conv((x.rows, x.cols), &dims, &shapes, seqs)?;
    if w.ty != GgmlType::F32 {
        return Err(BackendError::Unsupported {
            op: OP,
            backend: "GPU",
            dtype: w.ty,
        });
    }
    if w.parts.iter().map(|p| p.count).sum::<usize>() != x.cols {
        return Err(shape(
            OP,
            format!("kernel {:?} has no data on the device", w.ne),
        ));
    }
    let out = b.tensor(x.rows, x.cols)?;
    let pipe = simple(b, OP, SSM_CONV, &[], 0)?;
    for (state, (r0, n)) in states.iter_mut().zip(seq_rows(seqs)) {
        if n == 0 {
            continue;
        }
        // The weight's parts hold consecutive channels: one dispatch each.
        for part in &w.parts {
            b.ctx().dispatch(
                &pipe,
                &[
                    Arg::Buf(&x.buf),
                    Arg::Buf(&part.buf),
                    Arg::Buf(&state.buf),
                    Arg::Buf(&out.buf),
                ],
                &[
                    r0 as u32,
                    n as u32,
                    x.cols as u32,
                    d_conv as u32,
                    part.first as u32,
                    part.count as u32,
                ],
                groups(b, part.count),
            );
        }
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn gated_delta_net(
    b: &GpuBackend,
    q: &GpuTensor,
    k: &GpuTensor,
    v: &GpuTensor,
    g: &GpuTensor,
    beta: &GpuTensor,
    states: &mut [&mut GpuTensor],
    seqs: &[BatchPos],
    p: &DeltaNetParams,
) -> Result<GpuTensor, BackendError> {
    const OP: &str = "gated_delta_net";
    let shapes: Vec<(usize, usize)> = states.iter().map(|s| (s.rows, s.cols)).collect();
    let dims = |t: &GpuTensor| (t.rows, t.cols);
    contract::gated_delta_net(
        p,
        dims(q),
        dims(k),
        dims(v),
        dims(g),
        dims(beta),
        &shapes,
        seqs,
    )?;
    let s = p.head_dim;
    if s > MAX_DELTA_HEAD {
        return Err(shape(
            OP,
            format!("heads of {s}: the GPU kernel takes heads of at most {MAX_DELTA_HEAD}"),
        ));
    }
    let out = b.tensor(q.rows, p.n_v_heads * s)?;
    let pipe = simple(b, OP, GATED_DELTA_NET, &[("S", s as u32)], s as u32)?;
    let tile = (p.k_map == KHeadMap::Tile) as u32;
    let scale = 1.0f32 / (s as f32).sqrt();
    for (state, (r0, n)) in states.iter_mut().zip(seq_rows(seqs)) {
        for c0 in (0..n).step_by(DELTA_CHUNK) {
            let (r0, n) = (r0 + c0, DELTA_CHUNK.min(n - c0));
            b.ctx().dispatch(
                &pipe,
                &[
                    Arg::Buf(&q.buf),
                    Arg::Buf(&k.buf),
                    Arg::Buf(&v.buf),
                    Arg::Buf(&g.buf),
                    Arg::Buf(&beta.buf),
                    Arg::Buf(&state.buf),
                    Arg::Buf(&out.buf),
                ],
                &[
                    r0 as u32,
                    n as u32,
                    p.n_k_heads as u32,
                    p.n_v_heads as u32,
                    tile,
                    scale.to_bits(),
                ],
                b.ctx().grid(p.n_v_heads as u32),
            );
        }
    }
    Ok(out)
}
