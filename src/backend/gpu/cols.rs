//! Column-layout ops on device activations: reshape (a new shape over the
//! same buffer), column ranges of every group and per-group concatenation
//! (`shaders/copy_cols.wgsl`), and gates per element or per group
//! (`shaders/mul_act.wgsl`, with the activations of
//! `shaders/activation.wgsl`). Shapes are checked by
//! [`crate::backend::contract`].

use super::ops::{groups, simple};
use super::{Arg, GpuBackend, GpuTensor};
use crate::backend::{contract, Act, BackendError};

const COPY_COLS: &str = include_str!("../../../shaders/copy_cols.wgsl");
const MUL_ACT: &str = include_str!("../../../shaders/mul_act.wgsl");

pub(super) fn reshape(t: GpuTensor, rows: usize, cols: usize) -> Result<GpuTensor, BackendError> {
    contract::reshape((t.rows, t.cols), rows, cols)?;
    Ok(GpuTensor { rows, cols, ..t })
}

/// Where [`copy_cols`] reads and writes: a row of groups of `width`
/// columns, the range starting at `offset` of each.
struct Cols<'a> {
    t: &'a GpuTensor,
    width: usize,
    offset: usize,
}

/// Copies `len` columns of each of the `n` (row, group) pairs of `src`
/// into `dst`.
fn copy_cols(
    b: &GpuBackend,
    src: Cols,
    dst: Cols,
    n: usize,
    len: usize,
) -> Result<(), BackendError> {
    if n == 0 || len == 0 {
        return Ok(());
    }
    let pipe = simple(b, "copy_cols", COPY_COLS, &[], 0)?;
    b.ctx().dispatch(
        &pipe,
        &[Arg::Buf(&src.t.buf), Arg::Buf(&dst.t.buf)],
        &[
            n as u32,
            len as u32,
            src.width as u32,
            src.offset as u32,
            dst.width as u32,
            dst.offset as u32,
        ],
        groups(b, n * len),
    );
    Ok(())
}

pub(super) fn split_cols(
    b: &GpuBackend,
    x: &GpuTensor,
    group: usize,
    start: usize,
    len: usize,
) -> Result<GpuTensor, BackendError> {
    let n_groups = contract::split_cols(x.cols, group, start, len)?;
    let out = b.tensor(x.rows, n_groups * len)?;
    let src = Cols {
        t: x,
        width: group,
        offset: start,
    };
    let dst = Cols {
        t: &out,
        width: len,
        offset: 0,
    };
    copy_cols(b, src, dst, x.rows * n_groups, len)?;
    Ok(out)
}

pub(super) fn concat_cols(
    b: &GpuBackend,
    a: &GpuTensor,
    ga: usize,
    x: &GpuTensor,
    gb: usize,
) -> Result<GpuTensor, BackendError> {
    let n_groups = contract::concat_cols((a.rows, a.cols), ga, (x.rows, x.cols), gb)?;
    let w = ga + gb;
    let out = b.tensor(a.rows, n_groups * w)?;
    let n = a.rows * n_groups;
    for (src, len, offset) in [(a, ga, 0), (x, gb, ga)] {
        let s = Cols {
            t: src,
            width: len,
            offset: 0,
        };
        let d = Cols {
            t: &out,
            width: w,
            offset,
        };
        copy_cols(b, s, d, n, len)?;
    }
    Ok(out)
}

pub(super) fn mul_act(
    b: &GpuBackend,
    x: &mut GpuTensor,
    g: &GpuTensor,
    act: Act,
) -> Result<(), BackendError> {
    let per = contract::mul_act((x.rows, x.cols), (g.rows, g.cols))?;
    let n = x.rows * x.cols;
    if n == 0 {
        return Ok(());
    }
    let pipe = super::recurrent::act_pipeline(b, "mul_act", MUL_ACT, act)?;
    b.ctx().dispatch(
        &pipe,
        &[Arg::Buf(&x.buf), Arg::Buf(&g.buf)],
        &[n as u32, per as u32],
        groups(b, n),
    );
    Ok(())
}
