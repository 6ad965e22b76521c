//! Quantised matrix products on the CPU: activations are quantised once per
//! row to the weight type's dot partner, then each weight row is dotted with
//! integer kernels (`quant::QuantOps::vec_dot_rows`), rayon-parallel over row
//! chunks. MUL_MAT_ID groups (token, expert) pairs by expert and touches only
//! experts that have tokens.

use rayon::prelude::*;

use super::{grain, CpuTensor, CpuWeight};
use crate::backend::{contract, BackendError};
use crate::quant::layout::{self, Interleaved};
use crate::quant::{self, QuantOps};
use crate::tensor::GgmlType;

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// Quantises every row of `x` to `act_ty`; returns the bytes and the row stride.
pub(super) fn quantize_rows(
    act_ty: GgmlType,
    x: &CpuTensor,
) -> Result<(Vec<u8>, usize), BackendError> {
    let arb = act_ty.row_bytes(x.cols as u64).ok_or_else(|| {
        shape_err(
            "matmul",
            format!("rows of {} are not whole {act_ty} blocks", x.cols),
        )
    })? as usize;
    let mut acts = vec![0u8; arb * x.rows];
    acts.par_chunks_mut(arb.max(1))
        .zip(x.data.par_chunks(x.cols.max(1)))
        .with_min_len(grain::min_items(x.cols * grain::VALUE))
        .try_for_each_init(Vec::new, |tmp, (dst, row)| -> Result<(), BackendError> {
            tmp.clear();
            quant::quantize_activations(act_ty, row, tmp)?;
            if tmp.len() != dst.len() {
                return Err(shape_err(
                    "matmul",
                    format!(
                        "activation row of {} bytes, expected {}",
                        tmp.len(),
                        dst.len()
                    ),
                ));
            }
            dst.copy_from_slice(tmp);
            Ok(())
        })?;
    Ok((acts, arb))
}

/// Tokens per tile of batched products.
const TILE: usize = 16;
/// Tokens per tile where ggml's tiled-path kernels run
/// ([`quant::QuantOps::has_batch_kernel`]): they decode each weight block
/// once per call and interleave the tile's activations, so a taller tile
/// spreads both over more products.
const BATCH_TILE: usize = 64;

/// Tokens per tile of `m` in a product of `batch` activation rows.
fn tile_tokens(m: &Matrix, batch: usize) -> usize {
    if m.ops.has_batch_kernel(batch) {
        BATCH_TILE
    } else {
        TILE
    }
}
/// Weight rows per tile: the tile kernels prepare the tile's activations
/// once per call, so taller tiles spread that over more rows (64 rows of
/// a 4096-wide Q4_1 matrix are 144 KiB, in L2 while the tile's tokens pass).
const TILE_ROWS: usize = 64;

/// Rows per parallel work item: enough to amortise scheduling, small enough to
/// keep every thread busy; whole groups of an interleaved matrix.
fn chunk_rows(m: &Matrix, n_tok: usize) -> usize {
    let n = m.n;
    let threads = rayon::current_num_threads().max(1);
    let target = n.div_ceil(threads * 8).max(1);
    let min = if n_tok > 1 { 4 } else { 16 };
    let rows = target.clamp(min.min(n), 256).max(1);
    match m.layout {
        Some(_) => rows.next_multiple_of(layout::GROUP_ROWS),
        None => rows,
    }
}

struct Matrix<'a> {
    ops: &'static dyn QuantOps,
    /// The interleaved layout of the bytes, if not GGUF's plain rows: row
    /// ranges are then whole groups and products run its kernels.
    layout: Option<&'static dyn Interleaved>,
    /// The bytes of each matrix (one for a 2-D weight, one per expert of a
    /// stacked one; `None` for experts a product does not use).
    mats: Vec<Option<&'a [u8]>>,
    /// The kernels llama.cpp runs on the activation rows of an interleaved
    /// matrix's products (a MUL_MAT's or an expert's).
    rows: layout::Rows,
    k: usize,
    n: usize,
    rb: usize,
}

impl Matrix<'_> {
    /// Matrix `e`'s bytes (present for every matrix the product uses).
    fn bytes(&self, e: usize) -> &[u8] {
        self.mats.get(e).copied().flatten().unwrap_or(&[])
    }

    /// `out[t * rows + r]`: rows `w_rows` against the `acts` rows, in this
    /// matrix's layout: a mat-vec (`batch` `None`) or part of a product of
    /// `batch` activation rows (see [`QuantOps::vec_dot_tile_batch`]).
    fn products(
        &self,
        w_rows: &[u8],
        acts: &[u8],
        out: &mut [f32],
        batch: Option<usize>,
    ) -> Result<(), quant::QuantError> {
        match (self.layout, batch) {
            (Some(il), b) => il.dot_tile(self.k, w_rows, acts, out, self.rows, b.unwrap_or(1)),
            (None, None) => self.ops.vec_dot_rows(self.k, w_rows, acts, out),
            (None, Some(b)) => self.ops.vec_dot_tile_batch(self.k, w_rows, acts, out, b),
        }
    }
}

/// The matrices `used` of `w`, whose rows hold `k` values (the op's contract
/// has checked `k`), products over activation `rows`; errors when the
/// weight's bytes are short of one.
fn matrix<'a>(
    op: &'static str,
    w: &'a CpuWeight,
    k: usize,
    used: impl Iterator<Item = (usize, bool)>,
    rows: layout::Rows,
) -> Result<Matrix<'a>, BackendError> {
    let ops = quant::ops(w.ty)?;
    let n = w.n_rows();
    let rb = w.row_bytes();
    let mats = used
        .map(|(e, used)| {
            if !used {
                return Ok(None);
            }
            w.matrix(e, rb * n).map(Some).ok_or_else(|| {
                shape_err(
                    op,
                    format!("weight holds no {} bytes for matrix {e}", rb * n),
                )
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Matrix {
        ops,
        layout: w.layout(),
        mats,
        rows,
        k,
        n,
        rb,
    })
}

pub(super) fn matmul(w: &CpuWeight, x: &CpuTensor) -> Result<CpuTensor, BackendError> {
    let mut out = matmul_many(&[w], x)?;
    out.pop()
        .ok_or_else(|| shape_err("matmul", "no output".into()))
}

/// `matmul(w, x)` for every `w` of `ws`, in one parallel pass: `x` is
/// quantised once per activation type and the matrices' row chunks are one
/// list of work items (the attention projections and the FFN's gate and up
/// share their input).
pub(super) fn matmul_many(
    ws: &[&CpuWeight],
    x: &CpuTensor,
) -> Result<Vec<CpuTensor>, BackendError> {
    let ms = ws
        .iter()
        .map(|w| {
            let n_mat = w.dims.get(2).copied().unwrap_or(1) as usize;
            contract::matmul(w.row_len(), n_mat, x.cols)?;
            matrix(
                "matmul",
                w,
                x.cols,
                std::iter::once((0, true)),
                layout::Rows::Tiles,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Quantised activations per distinct activation type.
    let mut acts: Vec<(GgmlType, Vec<u8>, usize)> = Vec::new();
    let mut act_of = Vec::with_capacity(ms.len());
    for m in &ms {
        let ty = m.ops.act_type();
        let i = match acts.iter().position(|(t, _, _)| *t == ty) {
            Some(i) => i,
            None => {
                let (a, arb) = quantize_rows(ty, x)?;
                acts.push((ty, a, arb));
                acts.len() - 1
            }
        };
        act_of.push(i);
    }
    let n_tok = x.rows;
    let mut outs: Vec<CpuTensor> = ms.iter().map(|m| CpuTensor::zeros(n_tok, m.n)).collect();
    if n_tok == 0 {
        return Ok(outs);
    }
    let ptrs: Vec<OutPtr> = outs
        .iter_mut()
        .map(|o| OutPtr(o.data.as_mut_ptr()))
        .collect();
    let chunks: Vec<usize> = ms.iter().map(|m| chunk_rows(m, n_tok)).collect();
    let work: Vec<(usize, usize)> = ms
        .iter()
        .enumerate()
        .flat_map(|(i, m)| (0..m.n.div_ceil(chunks[i])).map(move |c| (i, c)))
        .collect();
    let item_work = ms
        .iter()
        .zip(&chunks)
        .map(|(m, &c)| c * m.k)
        .min()
        .unwrap_or(1)
        * n_tok;
    work.par_iter()
        .with_min_len(grain::min_items(item_work))
        .try_for_each_init(Vec::new, |tmp, &(i, c)| {
            let (m, ptr) = (&ms[i], ptrs[i]);
            let (_, acts, arb) = &acts[act_of[i]];
            let arb = *arb;
            let r0 = c * chunks[i];
            let rows = chunks[i].min(m.n - r0);
            let w_rows = &m.bytes(0)[r0 * m.rb..(r0 + rows) * m.rb];
            if n_tok == 1 {
                // SAFETY: r0 + rows <= m.n, the output's single row; these
                // columns belong to this work item only.
                let dst = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(r0), rows) };
                return m.products(w_rows, &acts[..arb], dst, None);
            }
            let tile = tile_tokens(m, n_tok);
            for t0 in (0..n_tok).step_by(tile) {
                let nt = tile.min(n_tok - t0);
                let a_tile = &acts[t0 * arb..(t0 + nt) * arb];
                tile_products(m, w_rows, a_tile, nt, n_tok, tmp, |t, q0, res| {
                    // SAFETY: t0 + t < n_tok and r0 + q0 + res.len() <= m.n,
                    // so the range is in bounds; these output rows' columns
                    // r0..r0 + rows belong to this work item only.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            ptr.get().add((t0 + t) * m.n + r0 + q0),
                            res.len(),
                        )
                    };
                    dst.copy_from_slice(res);
                })?;
            }
            Ok::<(), quant::QuantError>(())
        })?;
    Ok(outs)
}

/// The products of `w_rows` (a work item's weight rows) with the `nt`
/// activation rows of `a_tile`, in tiles of [`TILE_ROWS`] rows: the tile's
/// weight rows and activation rows stay in cache while they are combined.
/// `put(t, q0, res)` receives activation `t`'s results for the tile's rows
/// `q0..q0 + res.len()`. `batch` is the whole product's activation row
/// count, which picks ggml's kernel (see [`quant::QuantOps::vec_dot_tile_batch`]).
#[allow(clippy::too_many_arguments)]
fn tile_products(
    m: &Matrix,
    w_rows: &[u8],
    a_tile: &[u8],
    nt: usize,
    batch: usize,
    tmp: &mut Vec<f32>,
    mut put: impl FnMut(usize, usize, &[f32]),
) -> Result<(), quant::QuantError> {
    let rows = w_rows.len() / m.rb.max(1);
    tmp.resize(TILE_ROWS * nt, 0.0);
    for q0 in (0..rows).step_by(TILE_ROWS) {
        let nq = TILE_ROWS.min(rows - q0);
        let w_tile = &w_rows[q0 * m.rb..(q0 + nq) * m.rb];
        let res = &mut tmp[..nq * nt];
        m.products(w_tile, a_tile, res, Some(batch))?;
        for (t, res) in res.chunks_exact(nq).enumerate() {
            put(t, q0, res);
        }
    }
    Ok(())
}

/// Raw output pointer shared by work items that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every (pair, row) element is written by exactly one work item.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer; a method, so closures capture the whole `OutPtr` (which
    /// is Send) rather than its raw-pointer field.
    fn get(self) -> *mut f32 {
        self.0
    }
}

pub(super) fn mul_mat_id(
    w: &CpuWeight,
    x: &CpuTensor,
    ids: &[u32],
    n_used: usize,
) -> Result<CpuTensor, BackendError> {
    let n_exp = w.dims.get(2).copied().unwrap_or(1) as usize;
    let contract::MulMatId { n_tok, x_per_tok } =
        contract::mul_mat_id(w.row_len(), n_exp, (x.rows, x.cols), ids, n_used)?;
    // Pairs grouped by expert (ids are below n_exp): (output row, input row).
    let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n_exp];
    for (r, &e) in ids.iter().enumerate() {
        let (t, j) = (r / n_used, r % n_used);
        by_expert[e as usize].push((r, t * x_per_tok + j % x_per_tok));
    }
    let used = by_expert.iter().map(|p| !p.is_empty()).enumerate();
    let m = matrix("mul_mat_id", w, x.cols, used, layout::Rows::Gemv)?;
    if n_tok == 0 {
        return Ok(CpuTensor::zeros(0, m.n));
    }
    let (acts_x, arb) = quantize_rows(m.ops.act_type(), x)?;
    // Activation rows in expert order, so each expert's rows are contiguous
    // for the tile kernels; `first[e]` is the first of expert e's rows.
    let mut acts = Vec::with_capacity(ids.len() * arb);
    let mut first = Vec::with_capacity(n_exp);
    for pairs in &by_expert {
        first.push(acts.len() / arb.max(1));
        for &(_, r_in) in pairs {
            acts.extend_from_slice(&acts_x[r_in * arb..(r_in + 1) * arb]);
        }
    }
    drop(acts_x);
    let chunk = chunk_rows(&m, ids.len());
    let n_chunks = m.n.div_ceil(chunk);
    let work: Vec<(usize, usize)> = by_expert
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.is_empty())
        .flat_map(|(e, _)| (0..n_chunks).map(move |c| (e, c)))
        .collect();
    let mut out = CpuTensor::zeros(ids.len(), m.n);
    let ptr = OutPtr(out.data.as_mut_ptr());
    let item_work = chunk * m.k * ids.len() / work.len().div_ceil(n_chunks).max(1);
    work.par_iter()
        .with_min_len(grain::min_items(item_work))
        .try_for_each_init(Vec::new, |tmp, &(e, c)| {
            let r0 = c * chunk;
            let rows = chunk.min(m.n - r0);
            let w_rows = &m.bytes(e)[r0 * m.rb..(r0 + rows) * m.rb];
            let batch = by_expert[e].len();
            let tile = tile_tokens(&m, batch);
            for (p, pairs) in by_expert[e].chunks(tile).enumerate() {
                let a0 = first[e] + p * tile;
                let a_tile = &acts[a0 * arb..(a0 + pairs.len()) * arb];
                tile_products(&m, w_rows, a_tile, pairs.len(), batch, tmp, |t, q0, res| {
                    let r_out = pairs[t].0;
                    // SAFETY: r_out < ids.len() and r0 + q0 + res.len() <= m.n,
                    // so the range is in bounds; the pairs (r_out, r0 + q0 + i)
                    // belong to this work item only.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            ptr.get().add(r_out * m.n + r0 + q0),
                            res.len(),
                        )
                    };
                    dst.copy_from_slice(res);
                })?;
            }
            Ok::<(), quant::QuantError>(())
        })?;
    Ok(out)
}
