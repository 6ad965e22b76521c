//! Flash attention over the host KV cache in the arithmetic of ggml-cpu's
//! `ggml_compute_forward_flash_attn_ext_f16` (x86 AVX-512 build without
//! AVX512-FP16), which is what llama.cpp runs on the CPU by default
//! (`-fa auto`). llama.cpp casts an f32 cache to f16 before this op, so K
//! and V are always f16 values here (an f32 cache is rounded as it is read).
//! ggml picks one of three kernels per op; each query row's result depends
//! only on which one, never on how ggml tiles or splits the rows:
//!
//! - **one chunk** (fewer than 64 tokens in the batch): Q rounded to f16;
//!   per visible cell `s = ggml_vec_dot_f16(k, q) * scale`, then the online
//!   softmax: on a new maximum `ms = expf(M_old - s)` scales the f16 value
//!   accumulator (`ggml_vec_scale_f16`), otherwise `vs = expf(s - M)`; the
//!   accumulator takes `v * vs` (`ggml_vec_mad_f16`: fused in f32, rounded
//!   to f16 each step) and `S = ms * S + vs` (GCC contracts it to one FMA).
//!   Sinks join at the end in f32 (`S = S * ms + vs`, not contracted), then
//!   the row is scaled by `1 / S`.
//! - **tiled** (64 tokens or more): Q stays f32; per tile of 64 cells
//!   `kq = Q K^T` as `simd_gemm` runs it (one fused chain over the head
//!   dims from +0), `* scale`, masked cells `-inf`; the tile's max updates
//!   `M` (`expf(M_old - M)` scales the f32 accumulator and `S`); `S` adds
//!   `ggml_vec_soft_max_f32` (`ggml_v_expf` over blocks of 16, each block
//!   reduced and summed in f64); the accumulator takes `p V` (one fused
//!   chain over the tile's cells). Tiles no row can see are skipped.
//! - **split KV** (one token, 512 cells or more): the cells are cut into
//!   one chunk per thread, each computed as in "one chunk" (sinks in the
//!   first), and the chunks' `(M, S, acc)` are merged in order with
//!   `acc = acc * expf(M - M') + acc_c * expf(M_c - M')` (contracted).
//!
//! "Cells" are llama.cpp's: position `j` of the sequence is cell `j`, and
//! the op sees `n_kv = max(256, pad256(positions used))` cells, capped at
//! the cache size padded to 256 (the rest masked); only the split decision
//! and its chunk bounds depend on `n_kv` and on the thread count (`-t`), as
//! in ggml. `expf` is the C library's, as ggml calls it.
//!
//! With `head_dim_v != head_dim` (ggml's `DK != DV`) the scores take the
//! `DK` elements of Q and K and the accumulator the `DV` of V, in every
//! kernel; nothing else changes (ggml's kernels loop over `DK` and `DV`
//! alike). A K-only cache's V is llama.cpp's view of K (the first `DV` of
//! each K head row), cast to f16 with K when the cache is f32.

use rayon::prelude::*;

use super::attention::{reduce16, v_expf16, vec_dot_f16, KvRows, KvView, Portable, Widen};
use super::{grain, CpuTensor};
use crate::backend::{AttnParams, BatchPos};

/// `GGML_FA_TILE_Q` and `GGML_FA_TILE_KV` (ggml-cpu/common.h).
const TILE_Q: usize = 64;
const TILE_KV: usize = 64;
/// ggml's split-KV kernel runs for single-token ops over this many cells.
const SPLIT_MIN_KV: usize = 512;

/// The cells llama.cpp's op sees for a sequence whose cache holds `n_ctx`
/// positions and whose last position is `n_pos - 1`.
fn n_kv_cells(n_ctx: usize, n_pos: usize) -> usize {
    let pad = |n: usize| n.div_ceil(256) * 256;
    pad(n_ctx).min(pad(n_pos).max(256))
}

/// The running state of one query head: max, sum and value accumulator.
struct HeadState<'a> {
    m: f32,
    s: f32,
    acc: &'a mut [f32],
}

/// Scratch of one work item.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    acc: Vec<f32>,
    m: Vec<f32>,
    s: Vec<f32>,
    /// Tiled kernel: the K tile transposed (`[hd][TILE_KV]`), the V tile
    /// (`[TILE_KV][hd]`) and one row's scores.
    kt: Vec<f32>,
    vt: Vec<f32>,
    kq: Vec<f32>,
    /// Split kernel: the merged state of each head.
    fin: Vec<f32>,
}

/// Row `j` (elements `at..at + len`) of `rows` as f16 values in f32.
#[inline(always)]
fn load_f16<W: Widen>(rows: KvRows, at: usize, len: usize, buf: &mut Vec<f32>) {
    buf.resize(len, 0.0);
    match rows {
        KvRows::F16(_) => {
            rows.row::<W>(at, len, buf);
        }
        KvRows::F32(v) => W::round(&v[at..at + len], buf),
    }
}

/// `ggml_vec_scale_f16`: `y = f16(y * v)`.
#[inline(always)]
fn scale_f16<W: Widen>(y: &mut [f32], v: f32) {
    for x in y.iter_mut() {
        *x *= v;
    }
    round_in_place::<W>(y);
}

/// `ggml_vec_mad_f16`: `y = f16(x * v + y)`, fused in f32.
#[inline(always)]
fn mad_f16<W: Widen>(y: &mut [f32], x: &[f32], v: f32) {
    for (y, x) in y.iter_mut().zip(x) {
        *y = x.mul_add(v, *y);
    }
    round_in_place::<W>(y);
}

#[inline(always)]
fn round_in_place<W: Widen>(y: &mut [f32]) {
    let mut tmp = [0f32; 64];
    for c in y.chunks_mut(64) {
        W::round(c, &mut tmp[..c.len()]);
        c.copy_from_slice(&tmp[..c.len()]);
    }
}

/// Cells `range` (visible ones: `lo..=qp`) of kv head `kvh` into the states
/// of its query heads (`q` holds their f16-rounded rows back to back): the
/// "one chunk" kernel.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn one_chunk<W: Widen>(
    kv: &KvView,
    kvh: usize,
    (hd, dv): (usize, usize),
    q: &[f32],
    cells: std::ops::Range<usize>,
    scale: f32,
    heads: &mut [HeadState],
    k: &mut Vec<f32>,
    v: &mut Vec<f32>,
) {
    for j in cells {
        load_f16::<W>(kv.k, j * kv.n_embd_k + kvh * hd, hd, k);
        load_f16::<W>(kv.v, j * kv.n_embd_v + kvh * kv.v_head, dv, v);
        for (h, qrow) in heads.iter_mut().zip(q.chunks_exact(hd)) {
            let s = vec_dot_f16(k, qrow) * scale;
            let (ms, vs);
            if s > h.m {
                ms = (h.m - s).exp();
                h.m = s;
                vs = 1.0;
                scale_f16::<W>(h.acc, ms);
            } else {
                ms = 1.0;
                vs = (s - h.m).exp();
            }
            mad_f16::<W>(h.acc, v, vs);
            h.s = ms.mul_add(h.s, vs);
        }
    }
}

/// A sink logit joins a head's state (f32 accumulator).
#[inline(always)]
fn add_sink(h: &mut HeadState, sink: f32) {
    let (mut ms, mut vs) = (1.0f32, 1.0f32);
    if sink > h.m {
        ms = (h.m - sink).exp();
        h.m = sink;
        h.acc.iter_mut().for_each(|x| *x *= ms);
    } else {
        vs = (sink - h.m).exp();
    }
    h.s = h.s * ms + vs;
}

/// `V /= S` into `dst`.
#[inline(always)]
fn finish(h: &HeadState, dst: &mut [f32]) {
    let inv = if h.s == 0.0 { 0.0 } else { 1.0 / h.s };
    for (d, a) in dst.iter_mut().zip(h.acc.iter()) {
        *d = *a * inv;
    }
}

/// Which of ggml's kernels the op of a sequence runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    OneChunk,
    Tiled,
    Split { chunk: usize, n_kv: usize },
}

fn kernel(kv: &KvView, pos: BatchPos, n_threads: usize) -> Kernel {
    let n_kv = n_kv_cells(kv.n_ctx, pos.pos0 + pos.n_tokens);
    if pos.n_tokens == 1 && n_kv >= SPLIT_MIN_KV {
        Kernel::Split {
            chunk: n_kv.div_ceil(n_threads.max(1)),
            n_kv,
        }
    } else if pos.n_tokens >= TILE_Q {
        Kernel::Tiled
    } else {
        Kernel::OneChunk
    }
}

/// The query heads of kv head `kvh` for token `t` of a sequence.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn attend_item<W: Widen>(
    kv: &KvView,
    qs: &[f32],
    sinks: Option<&[f32]>,
    pos: BatchPos,
    p: &AttnParams,
    t: usize,
    kvh: usize,
    kernel: Kernel,
    sc: &mut Scratch,
    dst: &mut [f32],
) {
    if kernel == Kernel::Tiled {
        let rows = TiledRows {
            qs,
            q_stride: qs.len(),
            pos,
            ts: t..t + 1,
            kvh,
        };
        let stride = dst.len();
        tiled_rows::<W>(kv, sinks, p, &rows, sc, dst, stride);
        return;
    }
    let (hd, dv) = (p.head_dim, p.head_dim_v);
    let group = p.n_head / p.n_head_kv;
    let qp = pos.pos0 + t;
    let lo = window_start(p, qp);
    let sink = |g: usize| sinks.map(|s| s[kvh * group + g]);
    let Scratch {
        q,
        k,
        v,
        acc,
        m,
        s,
        fin,
        ..
    } = sc;
    acc.clear();
    acc.resize(group * dv, 0.0);
    match kernel {
        Kernel::OneChunk => {
            q.resize(qs.len(), 0.0);
            W::round(qs, q);
            let mut heads: Vec<HeadState> = acc
                .chunks_exact_mut(dv)
                .map(|acc| HeadState {
                    m: f32::NEG_INFINITY,
                    s: 0.0,
                    acc,
                })
                .collect();
            one_chunk::<W>(kv, kvh, (hd, dv), q, lo..qp + 1, p.scale, &mut heads, k, v);
            for (g, (h, dst)) in heads.iter_mut().zip(dst.chunks_exact_mut(dv)).enumerate() {
                if let Some(s) = sink(g) {
                    add_sink(h, s);
                }
                finish(h, dst);
            }
        }
        Kernel::Split { chunk, n_kv } => {
            q.resize(qs.len(), 0.0);
            W::round(qs, q);
            // The merged state of each head: M, S and the accumulator.
            m.clear();
            m.resize(group, f32::NEG_INFINITY);
            s.clear();
            s.resize(group, 0.0);
            fin.clear();
            fin.resize(group * dv, 0.0);
            let mut c0 = 0;
            while c0 < n_kv {
                let c1 = (c0 + chunk).min(n_kv);
                acc.iter_mut().for_each(|x| *x = 0.0);
                let mut heads: Vec<HeadState> = acc
                    .chunks_exact_mut(dv)
                    .map(|acc| HeadState {
                        m: f32::NEG_INFINITY,
                        s: 0.0,
                        acc,
                    })
                    .collect();
                let cells = c0.max(lo)..c1.min(qp + 1);
                if !cells.is_empty() {
                    one_chunk::<W>(kv, kvh, (hd, dv), q, cells, p.scale, &mut heads, k, v);
                }
                for (g, h) in heads.iter_mut().enumerate() {
                    if c0 == 0 {
                        if let Some(sn) = sink(g) {
                            add_sink(h, sn);
                        }
                    }
                    if h.s == 0.0 {
                        continue;
                    }
                    let m_new = m[g].max(h.m);
                    let (so, sn) = ((m[g] - m_new).exp(), (h.m - m_new).exp());
                    for (f, a) in fin[g * dv..(g + 1) * dv].iter_mut().zip(h.acc.iter()) {
                        *f = f.mul_add(so, *a * sn);
                    }
                    s[g] = s[g].mul_add(so, h.s * sn);
                    m[g] = m_new;
                }
                c0 = c1;
            }
            for (g, dst) in dst.chunks_exact_mut(dv).enumerate() {
                let inv = if s[g] != 0.0 { 1.0 / s[g] } else { 1.0 };
                for (d, f) in dst.iter_mut().zip(&fin[g * dv..(g + 1) * dv]) {
                    *d = *f * inv;
                }
            }
        }
        // Handled above.
        Kernel::Tiled => {}
    }
}

/// The first cell a query at position `qp` sees.
fn window_start(p: &AttnParams, qp: usize) -> usize {
    match p.window {
        Some(w) => (qp + 1).saturating_sub(w as usize),
        None => 0,
    }
}

/// Consecutive query rows `ts` of one sequence (at `pos`) for kv head
/// `kvh`: row `t`'s query heads are `qs[(t - ts.start) * q_stride..]`,
/// `group * head_dim` values.
struct TiledRows<'a> {
    qs: &'a [f32],
    q_stride: usize,
    pos: BatchPos,
    ts: std::ops::Range<usize>,
    kvh: usize,
}

/// The tiled kernel for `rows`, results to `dst` (row `t`'s query heads
/// at `(t - ts.start) * dst_stride`). Each K/V tile is converted once for
/// all the rows; each row then runs exactly ggml's per-row steps over the
/// tiles holding a cell it sees, in order, as if it were alone: cells it
/// does not see score `-inf` and add a zero V row, as ggml's masked cells
/// do, so its bits do not depend on the other rows.
#[inline(always)]
fn tiled_rows<W: Widen>(
    kv: &KvView,
    sinks: Option<&[f32]>,
    p: &AttnParams,
    rows: &TiledRows,
    sc: &mut Scratch,
    dst: &mut [f32],
    dst_stride: usize,
) {
    let (hd, dv) = (p.head_dim, p.head_dim_v);
    let group = p.n_head / p.n_head_kv;
    let (pos, kvh, n) = (rows.pos, rows.kvh, rows.ts.len());
    if n == 0 {
        return;
    }
    let Scratch {
        k,
        v,
        acc,
        m,
        s,
        kt,
        vt,
        kq,
        ..
    } = sc;
    m.clear();
    m.resize(n * group, f32::NEG_INFINITY);
    s.clear();
    s.resize(n * group, 0.0);
    acc.clear();
    acc.resize(n * group * dv, 0.0);
    kt.resize(hd * TILE_KV, 0.0);
    vt.resize(TILE_KV * dv, 0.0);
    kq.resize(TILE_KV, 0.0);
    // The cells some row sees: the window start grows with the position.
    // Only they are loaded; the others' scores are masked and their V rows
    // never read.
    let lo_all = window_start(p, pos.pos0 + rows.ts.start);
    let qp_all = pos.pos0 + rows.ts.end - 1;
    for ic in (lo_all / TILE_KV * TILE_KV..=qp_all).step_by(TILE_KV) {
        for tk in lo_all.saturating_sub(ic).min(TILE_KV)..(qp_all + 1 - ic).min(TILE_KV) {
            let j = ic + tk;
            load_f16::<W>(kv.k, j * kv.n_embd_k + kvh * hd, hd, k);
            for (dk, x) in k.iter().enumerate() {
                kt[dk * TILE_KV + tk] = *x;
            }
            load_f16::<W>(kv.v, j * kv.n_embd_v + kvh * kv.v_head, dv, v);
            vt[tk * dv..(tk + 1) * dv].copy_from_slice(v);
        }
        for (r, t) in rows.ts.clone().enumerate() {
            let qp = pos.pos0 + t;
            let lo = window_start(p, qp);
            // ggml visits the tiles holding a cell the row sees.
            if ic < lo / TILE_KV * TILE_KV || ic > qp {
                continue;
            }
            let seen = |tk: usize| (lo..=qp).contains(&(ic + tk));
            let qrows = &rows.qs[r * rows.q_stride..][..group * hd];
            for (g, qrow) in qrows.chunks_exact(hd).enumerate() {
                let h = r * group + g;
                // kq[tk] = sum_dk q[dk] * k[tk][dk], one fused chain per
                // cell, the tile's chains in registers.
                let mut chains = [0f32; TILE_KV];
                for (kr, &qd) in kt.as_chunks::<TILE_KV>().0.iter().zip(qrow) {
                    for (a, kx) in chains.iter_mut().zip(kr) {
                        *a = kx.mul_add(qd, *a);
                    }
                }
                kq.copy_from_slice(&chains);
                for (tk, x) in kq.iter_mut().enumerate() {
                    *x = if seen(tk) {
                        *x * p.scale + 0.0
                    } else {
                        f32::NEG_INFINITY
                    };
                }
                let tile_max = kq.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let m_old = m[h];
                let m_new = m_old.max(tile_max);
                let acch = &mut acc[h * dv..(h + 1) * dv];
                if m_new > m_old {
                    let ms = (m_old - m_new).exp();
                    acch.iter_mut().for_each(|x| *x *= ms);
                    s[h] *= ms;
                }
                m[h] = m_new;
                let mut sum = 0f64;
                for blk in kq.as_chunks_mut::<16>().0 {
                    for x in blk.iter_mut() {
                        *x -= m_new;
                    }
                    v_expf16(blk);
                    sum += reduce16(blk) as f64;
                }
                s[h] = (s[h] as f64 + sum) as f32;
                // acc[d] += v[tk][d] * p[tk] over the cells in order, one
                // fused chain per dimension; 64 dimensions at a time in
                // registers, then the rest. The row sees cells `s0..s1` of
                // the tile; each cell it does not see adds `0 * 0` (a zero V
                // row, `p = 0`), which changes only a `-0` sum (to `+0`), so
                // the cells before and after the seen ones add it once each.
                let (s0, s1) = (
                    lo.saturating_sub(ic).min(TILE_KV),
                    (qp + 1 - ic).min(TILE_KV),
                );
                let seen_v = &vt[s0 * dv..s1 * dv];
                let pv = &kq[s0..s1];
                let (full, rest) = acch.as_chunks_mut::<PV_DIMS>();
                for (ci, ac) in full.iter_mut().enumerate() {
                    let mut chains = *ac;
                    if s0 > 0 {
                        chains.iter_mut().for_each(|a| *a = 0f32.mul_add(0.0, *a));
                    }
                    for (vrow, &pk) in seen_v.chunks_exact(dv).zip(pv) {
                        if let Some(vr) = vrow[ci * PV_DIMS..].first_chunk::<PV_DIMS>() {
                            for (a, x) in chains.iter_mut().zip(vr) {
                                *a = x.mul_add(pk, *a);
                            }
                        }
                    }
                    if s1 < TILE_KV {
                        chains.iter_mut().for_each(|a| *a = 0f32.mul_add(0.0, *a));
                    }
                    *ac = chains;
                }
                let d0 = full.len() * PV_DIMS;
                if !rest.is_empty() {
                    if s0 > 0 {
                        rest.iter_mut().for_each(|a| *a = 0f32.mul_add(0.0, *a));
                    }
                    for (vrow, &pk) in seen_v.chunks_exact(dv).zip(pv) {
                        for (a, x) in rest.iter_mut().zip(&vrow[d0..]) {
                            *a = x.mul_add(pk, *a);
                        }
                    }
                    if s1 < TILE_KV {
                        rest.iter_mut().for_each(|a| *a = 0f32.mul_add(0.0, *a));
                    }
                }
            }
        }
    }
    for r in 0..n {
        for g in 0..group {
            let h = r * group + g;
            let mut hs = HeadState {
                m: m[h],
                s: s[h],
                acc: &mut acc[h * dv..(h + 1) * dv],
            };
            if let Some(sn) = sinks.map(|sk| sk[kvh * group + g]) {
                // The tiled kernel scales the accumulator but keeps M.
                let (mut ms, mut vs) = (1.0f32, 1.0f32);
                if sn > hs.m {
                    ms = (hs.m - sn).exp();
                    hs.acc.iter_mut().for_each(|x| *x *= ms);
                } else {
                    vs = (sn - hs.m).exp();
                }
                hs.s = hs.s * ms + vs;
            }
            finish(&hs, &mut dst[r * dst_stride + g * dv..][..dv]);
        }
    }
}

/// [`tiled_rows`] compiled with AVX2, FMA and F16C.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiled_rows_fma(
    kv: &KvView,
    sinks: Option<&[f32]>,
    p: &AttnParams,
    rows: &TiledRows,
    sc: &mut Scratch,
    dst: &mut [f32],
    dst_stride: usize,
) {
    tiled_rows::<super::attention::F16c>(kv, sinks, p, rows, sc, dst, dst_stride)
}

/// [`attend_item`] compiled with AVX2, FMA and F16C.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_item_fma(
    kv: &KvView,
    qs: &[f32],
    sinks: Option<&[f32]>,
    pos: BatchPos,
    p: &AttnParams,
    t: usize,
    kvh: usize,
    kernel: Kernel,
    sc: &mut Scratch,
    dst: &mut [f32],
) {
    attend_item::<super::attention::F16c>(kv, qs, sinks, pos, p, t, kvh, kernel, sc, dst)
}

/// Flash attention for the rows of several sequences (`starts[i]`: the
/// first row of sequence `i`); shapes were checked by the caller. One
/// parallel item per (token, kv head).
pub(super) fn attend(
    views: &[KvView],
    q: &CpuTensor,
    sinks: Option<&[f32]>,
    seqs: &[BatchPos],
    starts: &[usize],
    p: &AttnParams,
    fma: bool,
) -> CpuTensor {
    let (hd, dv) = (p.head_dim, p.head_dim_v);
    let group = p.n_head / p.n_head_kv;
    let n_threads = rayon::current_num_threads();
    let kernels: Vec<Kernel> = views
        .iter()
        .zip(seqs)
        .map(|(kv, pos)| kernel(kv, *pos, n_threads))
        .collect();
    let cols = p.n_head * dv;
    let mut out = CpuTensor::zeros(q.rows, cols);
    // The work: a tiled sequence's rows in blocks of tokens (all kv heads;
    // each K/V tile is converted once per block and head, not once per
    // row), every other row one (token, kv head) at a time.
    let mut units: Vec<Unit> = Vec::new();
    let mut rest: &mut [f32] = &mut out.data;
    for (si, &st) in starts.iter().enumerate() {
        let end = starts.get(si + 1).copied().unwrap_or(q.rows).min(q.rows);
        let n_rows = end.saturating_sub(st);
        let (seq, tail) = std::mem::take(&mut rest).split_at_mut(n_rows * cols);
        rest = tail;
        if kernels[si] == Kernel::Tiled {
            let block = n_rows.div_ceil(4 * n_threads.max(1)).clamp(1, TILED_BLOCK);
            for (b, dst) in seq.chunks_mut(block * cols).enumerate() {
                units.push(Unit::Block {
                    si,
                    t0: b * block,
                    dst,
                });
            }
        } else {
            for (i, dst) in seq.chunks_mut((group * dv).max(1)).enumerate() {
                units.push(Unit::Item {
                    si,
                    t: i / p.n_head_kv,
                    kvh: i % p.n_head_kv,
                    dst,
                });
            }
        }
    }
    // A unit reads every key and value its rows see.
    let seen = seqs.iter().map(|s| s.pos0 + s.n_tokens).max().unwrap_or(0);
    let unit_work = q.rows * p.n_head * (hd + dv) * seen * grain::FLOP / units.len().max(1);
    units
        .into_par_iter()
        .with_min_len(grain::min_items(unit_work))
        .for_each_init(Scratch::default, |sc, unit| match unit {
            Unit::Item { si, t, kvh, dst } => {
                let (kv, pos) = (&views[si], seqs[si]);
                let qr = (starts[si] + t) * q.cols + kvh * group * hd;
                let qs = &q.data[qr..qr + group * hd];
                #[cfg(target_arch = "x86_64")]
                if fma {
                    // SAFETY: the caller checked the CPU with has_fma().
                    unsafe { attend_item_fma(kv, qs, sinks, pos, p, t, kvh, kernels[si], sc, dst) };
                    return;
                }
                attend_item::<Portable>(kv, qs, sinks, pos, p, t, kvh, kernels[si], sc, dst)
            }
            Unit::Block { si, t0, dst } => {
                let n = dst.len() / cols.max(1);
                for kvh in 0..p.n_head_kv {
                    let rows = TiledRows {
                        qs: &q.data[(starts[si] + t0) * q.cols + kvh * group * hd..],
                        q_stride: q.cols,
                        pos: seqs[si],
                        ts: t0..t0 + n,
                        kvh,
                    };
                    let dst = &mut dst[kvh * group * dv..];
                    #[cfg(target_arch = "x86_64")]
                    if fma {
                        // SAFETY: the caller checked the CPU with has_fma().
                        unsafe { tiled_rows_fma(&views[si], sinks, p, &rows, sc, dst, cols) };
                        continue;
                    }
                    tiled_rows::<Portable>(&views[si], sinks, p, &rows, sc, dst, cols)
                }
            }
        });
    let _ = fma;
    out
}

/// Value dimensions the tiled kernel accumulates at a time in registers.
const PV_DIMS: usize = 64;

/// Query rows per work unit of a tiled sequence, at most.
const TILED_BLOCK: usize = 32;

/// One work unit of [`attend`]: token `t` of sequence `si` for one kv head,
/// or rows `t0..` of a tiled sequence for every kv head (`dst`: whole rows).
enum Unit<'a> {
    Item {
        si: usize,
        t: usize,
        kvh: usize,
        dst: &'a mut [f32],
    },
    Block {
        si: usize,
        t0: usize,
        dst: &'a mut [f32],
    },
}

#[cfg(test)]
mod tests {
    use super::super::attention::{attend as attend_all, round_f16};
    use super::super::{CpuKv, KvStore};
    use super::*;
    use half::f16;

    #[test]
    fn n_kv_follows_llamacpp_padding() {
        // max(256, pad256(used)), capped at the padded cache size.
        assert_eq!(n_kv_cells(256, 5), 256);
        assert_eq!(n_kv_cells(4096, 300), 512);
        assert_eq!(n_kv_cells(4096, 512), 512);
        assert_eq!(n_kv_cells(4096, 513), 768);
        assert_eq!(n_kv_cells(600, 600), 768);
        assert_eq!(n_kv_cells(70, 70), 256);
    }

    /// `ggml_vec_dot_f16` written index by index: lane `i % 16` of
    /// accumulator `(i % 64) / 16` over whole steps of 64, the reduction of
    /// GGML_F32x16_REDUCE, the tail in f64.
    fn ref_dot16(x: &[f32], y: &[f32]) -> f32 {
        let n = x.len();
        let np = n & !63;
        let mut acc = [[0f32; 16]; 4];
        for i in 0..np {
            acc[(i % 64) / 16][i % 16] = x[i].mul_add(y[i], acc[(i % 64) / 16][i % 16]);
        }
        let r: Vec<f32> = (0..16)
            .map(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]))
            .collect();
        let mut sum = if np > 0 { ref_reduce(&r) as f64 } else { 0.0 };
        for i in np..n {
            sum += (x[i] * y[i]) as f64;
        }
        sum as f32
    }

    /// `_mm512_reduce_add_ps` as GCC emits it.
    fn ref_reduce(a: &[f32]) -> f32 {
        let t: Vec<f32> = (0..8).map(|i| a[i + 8] + a[i]).collect();
        let u: Vec<f32> = (0..4).map(|i| t[i + 4] + t[i]).collect();
        (u[0] + u[2]) + (u[1] + u[3])
    }

    /// ggml's one-chunk kernel over cells `a..b` for one head: `(M, S, acc)`.
    #[allow(clippy::too_many_arguments)]
    fn ref_chunk(
        k: &dyn Fn(usize) -> Vec<f32>,
        v: &dyn Fn(usize) -> Vec<f32>,
        q: &[f32],
        cells: std::ops::Range<usize>,
        lo: usize,
        qp: usize,
        scale: f32,
    ) -> (f32, f32, Vec<f32>) {
        let q16: Vec<f32> = q.iter().map(|&x| round_f16(x)).collect();
        let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
        let mut acc = vec![0f32; q.len()];
        for j in cells {
            if j < lo || j > qp {
                continue;
            }
            let x = ref_dot16(&k(j), &q16) * scale;
            let (mut ms, mut vs) = (1f32, 1f32);
            if x > m {
                ms = (m - x).exp();
                m = x;
                acc.iter_mut().for_each(|a| *a = round_f16(*a * ms));
            } else {
                vs = (x - m).exp();
            }
            for (a, vd) in acc.iter_mut().zip(v(j)) {
                *a = round_f16(vd.mul_add(vs, *a));
            }
            s = ms.mul_add(s, vs);
        }
        (m, s, acc)
    }

    fn ref_sink(m: &mut f32, s: &mut f32, acc: &mut [f32], sink: f32, keep_m: bool) {
        let (mut ms, mut vs) = (1f32, 1f32);
        if sink > *m {
            ms = (*m - sink).exp();
            if !keep_m {
                *m = sink;
            }
            acc.iter_mut().for_each(|a| *a *= ms);
        } else {
            vs = (sink - *m).exp();
        }
        *s = *s * ms + vs;
    }

    /// ggml's tiled kernel for one head (Q in f32, tiles of 64 cells).
    #[allow(clippy::too_many_arguments)]
    fn ref_tiled(
        k: &dyn Fn(usize) -> Vec<f32>,
        v: &dyn Fn(usize) -> Vec<f32>,
        q: &[f32],
        n_kv: usize,
        lo: usize,
        qp: usize,
        scale: f32,
        sink: Option<f32>,
    ) -> Vec<f32> {
        let hd = q.len();
        let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
        let mut acc = vec![0f32; hd];
        for ic in (0..n_kv).step_by(64) {
            let mut kq: Vec<f32> = (ic..ic + 64)
                .map(|j| {
                    let kj = k(j.min(qp));
                    let mut a = 0f32;
                    for d in 0..hd {
                        a = kj[d].mul_add(q[d], a);
                    }
                    let mask = if j >= lo && j <= qp {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    };
                    a * scale + mask
                })
                .collect();
            let tmax = kq.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if tmax == f32::NEG_INFINITY {
                continue;
            }
            let mn = m.max(tmax);
            if mn > m {
                let ms = (m - mn).exp();
                acc.iter_mut().for_each(|a| *a *= ms);
                s *= ms;
            }
            m = mn;
            let mut sum = 0f64;
            for blk in kq.chunks_mut(16) {
                for x in blk.iter_mut() {
                    *x = super::super::attention::v_expf(*x - mn);
                }
                sum += ref_reduce(blk) as f64;
            }
            s = (s as f64 + sum) as f32;
            for (t, p) in kq.iter().enumerate() {
                let vj = v((ic + t).min(qp));
                for d in 0..hd {
                    acc[d] = vj[d].mul_add(*p, acc[d]);
                }
            }
        }
        if let Some(sn) = sink {
            ref_sink(&mut m, &mut s, &mut acc, sn, true);
        }
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        acc.iter().map(|a| a * inv).collect()
    }

    /// `attend` with flash attention over f16 and f32 caches (GQA, windows,
    /// sinks, a head dim with a dot tail) equals ggml's kernels written
    /// head by head: one chunk for short batches, tiled for 64 tokens or
    /// more, split KV for one token over 512 cells or more.
    #[test]
    fn flash_attention_matches_ggml_kernels_bit_for_bit() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |amp: f32| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * amp
        };
        let n_threads = rayon::current_num_threads();
        let cases = [
            // (head_dim, n_head, n_head_kv, window, sinks, f16 cache)
            (64, 9, 3, None, false, true),
            (64, 4, 4, Some(7), true, false),
            (72, 2, 1, None, true, true),
            (128, 2, 1, Some(100), false, true),
        ];
        for (hd, n_head, n_head_kv, window, with_sinks, f16_cache) in cases {
            let p = AttnParams {
                n_head,
                n_head_kv,
                head_dim: hd,
                head_dim_v: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                window,
                flash_attn: true,
            };
            // (pos0, n_tokens, n_ctx): decode, a short batch, tiled batches
            // past a tile edge (the longer one in several blocks of rows,
            // with blocks whose rows visit different tiles), and split-KV
            // decodes (512 and 768 cells).
            let seqs = [
                (0, 1, 256),
                (60, 5, 256),
                (40, 70, 256),
                (100, 163, 512),
                (300, 1, 1024),
                (600, 1, 1024),
            ];
            let n_embd = n_head_kv * hd;
            let sinks: Option<Vec<f32>> =
                with_sinks.then(|| (0..n_head).map(|_| rnd(4.0)).collect());
            for &(pos0, n_tokens, n_ctx) in &seqs {
                let n = (pos0 + n_tokens) * n_embd;
                let k: Vec<f32> = (0..n).map(|_| rnd(2.0)).collect();
                let v: Vec<f32> = (0..n).map(|_| rnd(1.0)).collect();
                let store = |x: &[f32]| {
                    if f16_cache {
                        KvStore::F16(x.iter().map(|&x| f16::from_f32(x)).collect())
                    } else {
                        KvStore::F32(x.to_vec())
                    }
                };
                let kv = CpuKv {
                    k: store(&k),
                    v: store(&v),
                    n_ctx,
                    n_embd_k: n_embd,
                    n_embd_v: n_embd,
                };
                let q = CpuTensor {
                    data: (0..n_tokens * n_head * hd).map(|_| rnd(3.0)).collect(),
                    rows: n_tokens,
                    cols: n_head * hd,
                };
                let pos = BatchPos {
                    pos0,
                    n_tokens,
                    steps: false,
                };
                let out = attend_all(&[&kv], &q, sinks.as_deref(), &[pos], &p).unwrap();
                let n_kv = n_kv_cells(n_ctx, pos0 + n_tokens);
                for t in 0..n_tokens {
                    let qp = pos0 + t;
                    let lo = window.map_or(0, |w| (qp + 1).saturating_sub(w as usize));
                    for h in 0..n_head {
                        let kvh = h / (n_head / n_head_kv);
                        // Cached rows as llama.cpp's f16 cast leaves them.
                        let row = |c: &Vec<f32>, j: usize| -> Vec<f32> {
                            c[j * n_embd + kvh * hd..][..hd]
                                .iter()
                                .map(|&x| round_f16(x))
                                .collect()
                        };
                        let kr = |j: usize| row(&k, j);
                        let vr = |j: usize| row(&v, j);
                        let qh = &q.data[t * q.cols + h * hd..][..hd];
                        let sink = sinks.as_ref().map(|s| s[h]);
                        let want: Vec<f32> = if n_tokens >= 64 {
                            ref_tiled(&kr, &vr, qh, n_kv, lo, qp, p.scale, sink)
                        } else if n_tokens == 1 && n_kv >= 512 {
                            let chunk = n_kv.div_ceil(n_threads);
                            let (mut mf, mut sf) = (f32::NEG_INFINITY, 0f32);
                            let mut fin = vec![0f32; hd];
                            for c0 in (0..n_kv).step_by(chunk) {
                                let (mut m, mut s, mut acc) = ref_chunk(
                                    &kr,
                                    &vr,
                                    qh,
                                    c0..(c0 + chunk).min(n_kv),
                                    lo,
                                    qp,
                                    p.scale,
                                );
                                if let (0, Some(sn)) = (c0, sink) {
                                    ref_sink(&mut m, &mut s, &mut acc, sn, false);
                                }
                                if s == 0.0 {
                                    continue;
                                }
                                let mn = mf.max(m);
                                let (so, sc) = ((mf - mn).exp(), (m - mn).exp());
                                for d in 0..hd {
                                    fin[d] = fin[d].mul_add(so, acc[d] * sc);
                                }
                                sf = sf.mul_add(so, s * sc);
                                mf = mn;
                            }
                            fin.iter()
                                .map(|a| if sf != 0.0 { a * (1.0 / sf) } else { *a })
                                .collect()
                        } else {
                            let (mut m, mut s, mut acc) =
                                ref_chunk(&kr, &vr, qh, 0..n_kv, lo, qp, p.scale);
                            if let Some(sn) = sink {
                                ref_sink(&mut m, &mut s, &mut acc, sn, false);
                            }
                            let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
                            acc.iter().map(|a| a * inv).collect()
                        };
                        let got = &out.data[t * out.cols + h * hd..][..hd];
                        for (d, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(
                                g.to_bits(),
                                w.to_bits(),
                                "hd {hd} pos0 {pos0} n {n_tokens} token {t} head {h} dim {d}: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }
}
