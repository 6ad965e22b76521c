//! Causal grouped-query attention over the host KV cache, computed in the
//! order of ggml's x86 CPU backend (AVX-512 build, flash attention off):
//!
//! 1. `kq[j] = ggml_vec_dot_f32(q, k_j)`: 4 accumulators of 16 lanes over
//!    steps of 64 (lane `i % 64`), summed pairwise and reduced as GCC's
//!    `_mm512_reduce_add_ps`; a tail past the last 64 is added one product
//!    at a time.
//! 2. `ggml_soft_max_ext`: `w = kq * scale` (masked: -inf), `max`, then
//!    `exp(w - max)` with ggml's vector `ggml_v_expf` over blocks of 16
//!    positions, each block reduced to f32 and summed in f64; optional
//!    per-head sinks (gpt-oss) join the max and the sum (scalar `expf`);
//!    `p = e * (float)(1 / sum)`.
//! 3. `kqv[d] = sum_j v[j][d] * p[j]` as ggml's `mul_mat(v, kq)` runs it:
//!    llamafile's tinyBLAS (one 16-lane accumulator per output) when the
//!    batch has two or more tokens, `ggml_vec_dot_f32` (as in 1.) for one.
//!
//! Over an f16 cache ggml's `mul_mat` converts its f32 operand to f16 (the
//! `vec_dot_type` of F16) before the products: Q is rounded to f16 for 1.
//! (and, now contiguous, goes through tinyBLAS when the batch has two or
//! more tokens; `ggml_vec_dot_f16`, whose tail past the last 64 is summed
//! in f64, for one), and the softmax weights `p` are rounded to f16 for 3.
//!
//! With flash attention (`AttnParams::flash_attn`, llama.cpp's default on
//! the CPU) the arithmetic is ggml's flash-attention kernel instead: see
//! [`super::flash_attn`].
//!
//! llama.cpp pads the key range to a multiple of 256 cells; padded cells
//! have `p = 0` and add exact zeros, so only the lane of each real position
//! matters. Matching these orders bit for bit is what keeps greedy output
//! equal to llama.cpp's on models with outlier activations (SmolLM2).

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::{grain, CpuKv, CpuTensor, KvStore};
use crate::backend::{AttnParams, BackendError, BatchPos};
use crate::quant::ggml_f32::tinyblas_dot;
pub(super) use crate::quant::ggml_f32::{reduce16, vec_dot_f32};

/// `ggml_vec_dot_f16` (AVX-512, no AVX512-FP16) of two rows of f16 values
/// held as f32: the products of [`vec_dot_f32`] over whole steps of 64, the
/// tail added in f64 (`ggml_float`), the sum rounded to f32 at the end.
#[inline(always)]
pub(super) fn vec_dot_f16(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut sum = if np > 0 {
        vec_dot_f32(&x[..np], &y[..np]) as f64
    } else {
        0.0
    };
    for j in np..n {
        sum += (x[j] * y[j]) as f64;
    }
    sum as f32
}

/// `x` rounded to the nearest f16 (ties to even), as ggml's
/// `GGML_CPU_FP32_TO_FP16` (F16C `vcvtps2ph`, rounding mode 0) does it.
#[inline(always)]
pub(super) fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `ggml_v_expf`'s range reduction and polynomial: `exp(x) = j * 2^n`
/// with `n` integral and `j` near 1.
#[inline(always)]
fn expf_parts(x: f32) -> (f32, f32) {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),
        (-n).mul_add(f32::from_bits(0x3f31_7200), x),
    );
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)),
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0));
    (n, j)
}

/// ggml's AVX-512 `ggml_v_expf` for one lane (the vector code has no
/// cross-lane steps): range reduction by FMA, a degree-5 polynomial and
/// `vscalefps`; |n| > 192 saturates to 0 or +inf. Written without branches
/// (out-of-range and NaN lanes are selected at the end) so that loops over
/// it vectorise.
#[inline(always)]
pub(super) fn v_expf(x: f32) -> f32 {
    let (n, j) = expf_parts(x);
    // vscalefps: j * 2^n, rounded once (n clamped first so out-of-range
    // lanes stay well-defined before they are replaced). 2^n may not be an
    // f32, so j is first scaled exactly by 2^(n - k) (j is near 1, the
    // product stays normal) and then by 2^k, the one rounding step; all in
    // f32 lanes so the loops vectorise without 64-bit conversions.
    let nc = n.clamp(-192.0, 192.0);
    let k: i32 = if nc < -126.0 {
        -100
    } else if nc > 127.0 {
        96
    } else {
        0
    };
    let pow2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    let scaled = (j * pow2(nc as i32 - k)) * pow2(k);
    let sat = if n <= 0.0 { 0.0 } else { f32::INFINITY };
    let out = if n.abs() > 192.0 { sat } else { scaled };
    if n.is_nan() {
        j
    } else {
        out
    }
}

/// [`v_expf`] over a block of 16 lanes (one AVX-512 vector in ggml).
#[inline(always)]
pub(super) fn v_expf16(x: &mut [f32; 16]) {
    for v in x.iter_mut() {
        *v = v_expf(*v);
    }
}

/// Scratch of one work item (a token's heads).
struct Row {
    /// The query rows rounded to f16 (an f16 cache).
    q16: Vec<f32>,
    /// Each query head's scores, then weights.
    w: Vec<f32>,
    /// 16 lane rows of one head's weighted value sum.
    acc: Vec<f32>,
    /// One key or value row converted from an f16 cache.
    kv: Vec<f32>,
    /// Each head's largest score.
    max: Vec<f32>,
}

/// A sequence's cached keys or values (`n_embd` per position), read in place.
#[derive(Clone, Copy)]
pub(super) enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

/// The keys and values of positions `0..n` of one sequence. An f16 cache is
/// converted one head row at a time as the row is used (exact, so the
/// results are those of an f32 copy) rather than copied whole per call.
///
/// The value row of kv head `h` at position `j` is `v[j * n_embd_v + h *
/// v_head..][..head_dim_v]`. A K-only cache is viewed as llama.cpp views
/// it (`ggml_view_4d` of K with `ne0 = head_dim_v` and K's strides):
/// `v` is the key rows, `n_embd_v = n_embd_k` and `v_head = head_dim`.
pub(super) struct KvView<'a> {
    pub(super) k: KvRows<'a>,
    pub(super) v: KvRows<'a>,
    pub(super) n_embd_k: usize,
    /// Elements between the value rows of consecutive positions.
    pub(super) n_embd_v: usize,
    /// Elements between the value rows of consecutive kv heads.
    pub(super) v_head: usize,
    /// Positions the cache holds (its `n_ctx`).
    pub(super) n_ctx: usize,
}

fn rows(store: &KvStore, n: usize) -> KvRows<'_> {
    match store {
        KvStore::F32(v) => KvRows::F32(&v[..n]),
        KvStore::F16(v) => KvRows::F16(&v[..n]),
    }
}

/// Halves to floats: `half`'s portable conversion, or F16C inlined into
/// the FMA build of [`attend_group`].
pub(super) trait Widen {
    fn widen(src: &[f16], dst: &mut [f32]);
    /// Each `src[i]` rounded to f16 ([`round_f16`]) into `dst[i]`.
    fn round(src: &[f32], dst: &mut [f32]);
}

pub(super) struct Portable;

impl Widen for Portable {
    #[inline(always)]
    fn widen(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn round(src: &[f32], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = round_f16(*s);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) struct F16c;

#[cfg(target_arch = "x86_64")]
impl Widen for F16c {
    #[inline(always)]
    fn widen(src: &[f16], dst: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        let (s8, s_tail) = src[..n].as_chunks::<8>();
        let (d8, d_tail) = dst[..n].as_chunks_mut::<8>();
        for (s, d) in s8.iter().zip(d8) {
            // SAFETY: only inlined into `attend_group_fma`, whose callers
            // checked AVX2 and F16C (`has_fma`); both pointers cover 8 lanes.
            unsafe {
                let h = _mm_loadu_si128(s.as_ptr() as *const __m128i);
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
        for (s, d) in s_tail.iter().zip(d_tail) {
            *d = s.to_f32();
        }
    }
    #[inline(always)]
    fn round(src: &[f32], dst: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        let (s8, s_tail) = src[..n].as_chunks::<8>();
        let (d8, d_tail) = dst[..n].as_chunks_mut::<8>();
        for (s, d) in s8.iter().zip(d8) {
            // SAFETY: as in `widen`; both pointers cover 8 lanes.
            unsafe {
                let x = _mm256_loadu_ps(s.as_ptr());
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
        for (s, d) in s_tail.iter().zip(d_tail) {
            *d = round_f16(*s);
        }
    }
}

/// Positions ahead whose key or value row is requested while one is used:
/// a long cache streams from memory, and the rows of one kv head are
/// `n_embd` apart, a stride the hardware prefetchers follow poorly.
const PREFETCH_AHEAD: usize = 8;

impl<'a> KvRows<'a> {
    /// Asks for elements `at..at + len` (a later row) to be cached.
    #[inline(always)]
    pub(super) fn prefetch(self, at: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let (p, bytes) = match self {
                KvRows::F32(v) if at + len <= v.len() => (v[at..].as_ptr() as *const i8, len * 4),
                KvRows::F16(v) if at + len <= v.len() => (v[at..].as_ptr() as *const i8, len * 2),
                _ => return,
            };
            for off in (0..bytes).step_by(64) {
                // SAFETY: prefetching has no effect on memory; the address
                // lies inside the slice.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off)) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (at, len);
    }

    /// Elements `at..at + N` as floats: borrowed, or widened into `tmp`.
    #[inline(always)]
    fn chunk<'b, W: Widen, const N: usize>(self, at: usize, tmp: &'b mut [f32; N]) -> &'b [f32; N]
    where
        'a: 'b,
    {
        match self {
            KvRows::F32(v) => v[at..].first_chunk::<N>().unwrap_or(tmp),
            KvRows::F16(v) => {
                W::widen(&v[at..at + N], tmp);
                tmp
            }
        }
    }

    /// Row `at..at + len` as floats: borrowed, or widened into `buf`.
    #[inline(always)]
    pub(super) fn row<'b, W: Widen>(self, at: usize, len: usize, buf: &'b mut Vec<f32>) -> &'b [f32]
    where
        'a: 'b,
    {
        match self {
            KvRows::F32(v) => &v[at..at + len],
            KvRows::F16(v) => {
                buf.resize(len, 0.0);
                W::widen(&v[at..at + len], buf);
                buf
            }
        }
    }
}

/// The query heads of kv heads `heads` (`group` query heads each), for one
/// token `t`: each key and value row is widened once and used by every
/// head of its group, and the rows of all `heads` are read together (one
/// stretch of memory per position). Every head's scores, softmax and
/// weighted sum run exactly as for that head alone (the heads only
/// interleave).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn attend_group<W: Widen>(
    kv: &KvView,
    q: &CpuTensor,
    row0: usize,
    sinks: Option<&[f32]>,
    pos: BatchPos,
    p: &AttnParams,
    t: usize,
    heads: std::ops::Range<usize>,
    row: &mut Row,
    dst: &mut [f32],
) {
    let (hd, dv) = (p.head_dim, p.head_dim_v);
    let group = p.n_head / p.n_head_kv;
    let qp = pos.pos0 + t;
    let lo = match p.window {
        Some(w) => (qp + 1).saturating_sub(w as usize),
        None => 0,
    };
    let (h0, nh) = (heads.start, heads.len());
    // This token's query heads of `heads`, in order: row `hi * group + g`
    // is head `(h0 + hi) * group + g`.
    let qr = (row0 + t) * q.cols + h0 * group * hd;
    let qs = &q.data[qr..qr + nh * group * hd];
    let f16_cache = matches!(kv.k, KvRows::F16(_));
    // Scores of query row r in w[r * n_pad..], padded with masked cells to
    // whole blocks of 16.
    let n_pad = (qp + 1).div_ceil(16) * 16;
    let Row {
        q16,
        w,
        acc,
        kv: buf,
        max,
    } = row;
    let qs: &[f32] = if f16_cache {
        q16.resize(qs.len(), 0.0);
        W::round(qs, q16);
        q16
    } else {
        qs
    };
    // tinyBLAS takes the batch's f16 products when it accepts the length.
    let kq_tinyblas = f16_cache && pos.n_tokens >= 2 && hd.is_multiple_of(16);
    w.clear();
    w.resize(nh * group * n_pad, f32::NEG_INFINITY);
    max.clear();
    max.resize(nh * group, f32::NEG_INFINITY);
    // The first rows, then each row PREFETCH_AHEAD positions ahead as the
    // scores go (the values are read after the softmax: asked for now).
    let (k_at, v_at) = (
        |j: usize| j * kv.n_embd_k + h0 * hd,
        |j: usize| j * kv.n_embd_v + h0 * kv.v_head,
    );
    let v_len = (nh - 1) * kv.v_head + dv;
    for j in lo..(lo + PREFETCH_AHEAD).min(qp + 1) {
        kv.k.prefetch(k_at(j), nh * hd);
        kv.v.prefetch(v_at(j), v_len);
    }
    for j in lo..=qp {
        kv.k.prefetch(k_at(j + PREFETCH_AHEAD), nh * hd);
        kv.v.prefetch(v_at(j + PREFETCH_AHEAD), v_len);
        for (hi, qh) in qs.chunks_exact(group * hd).enumerate() {
            let k = kv.k.row::<W>(k_at(j) + hi * hd, hd, buf);
            for (g, qrow) in qh.chunks_exact(hd).enumerate() {
                let r = hi * group + g;
                let dot = if kq_tinyblas {
                    tinyblas_dot(k, qrow)
                } else if f16_cache {
                    vec_dot_f16(k, qrow)
                } else {
                    vec_dot_f32(k, qrow)
                };
                let s = dot * p.scale;
                w[r * n_pad + j] = s;
                max[r] = max[r].max(s);
            }
        }
    }
    for (r, w) in w.chunks_exact_mut(n_pad).enumerate() {
        let sink = sinks.map(|s| s[h0 * group + r]);
        let mut max = max[r];
        if let Some(s) = sink {
            max = max.max(s);
        }
        let mut sum = 0f64;
        for blk in w.as_chunks_mut::<16>().0 {
            for v in blk.iter_mut() {
                *v -= max;
            }
            v_expf16(blk);
            sum += reduce16(blk) as f64;
        }
        if let Some(s) = sink {
            sum += (s - max).exp() as f64;
        }
        let inv = (1.0 / sum) as f32;
        w.iter_mut().for_each(|v| *v *= inv);
        if f16_cache {
            w.iter_mut().for_each(|v| *v = round_f16(*v));
        }
    }
    // KQV: lanes of 16 positions (tinyBLAS) or 64 (vec_dot_f32); lane `l`
    // sums the positions `j = l (mod lanes)` in order. Each lane's sum is
    // computed whole in registers, 16 dims at a time, and the lanes are
    // combined as ggml reduces them: 64 lanes first as `(l + 32) + (l + 16
    // + 48)` into 16, then the 16-lane reduction. An empty lane is +0 (a
    // chain starting at +0 never becomes -0), which adds nothing.
    let lanes = if pos.n_tokens >= 2 { 16 } else { 64 };
    let chunks = dv / 16;
    acc.clear();
    acc.resize(16 * dv, 0.0);
    for (r, dst) in dst.chunks_exact_mut(dv).enumerate() {
        let kvh = h0 + r / group;
        let pg = &w[r * n_pad..r * n_pad + qp + 1];
        let span = LaneSpan {
            v: kv.v,
            stride: kv.n_embd_v,
            lo,
            qp,
            lanes,
            p: pg,
        };
        for c in 0..chunks {
            span.lane_rows::<W, 16>(kvh * kv.v_head, 16 * c, dv, acc);
        }
        // Dims past the last whole 16, one at a time.
        for d in 16 * chunks..dv {
            span.lane_rows::<W, 1>(kvh * kv.v_head, d, dv, acc);
        }
        reduce16_rows(acc, dv, dst);
    }
}

/// One head's value rows and weights for the weighted sum: positions
/// `lo..=qp` of `v` (rows `stride` apart) with weights `p[j]`, summed in
/// `lanes` lanes (`j % lanes`).
struct LaneSpan<'a> {
    v: KvRows<'a>,
    stride: usize,
    lo: usize,
    qp: usize,
    lanes: usize,
    p: &'a [f32],
}

impl LaneSpan<'_> {
    /// Lane `l`'s sum for dims `off..off + N` of each row: `sum_j v[j][d] *
    /// p[j]` over `j = l (mod lanes)` in `lo..=qp`, fused multiply-adds in
    /// position order from +0.
    #[inline(always)]
    fn lane<W: Widen, const N: usize>(&self, off: usize, l: usize) -> [f32; N] {
        let mut a = [0f32; N];
        let mut tmp = [0f32; N];
        // First position at or after `lo` in lane `l`.
        let mut j = l + (self.lo.saturating_sub(l)).div_ceil(self.lanes) * self.lanes;
        while j <= self.qp {
            let x = self.v.chunk::<W, N>(j * self.stride + off, &mut tmp);
            let pj = self.p[j];
            for i in 0..N {
                a[i] = x[i].mul_add(pj, a[i]);
            }
            j += self.lanes;
        }
        a
    }

    /// Dims `d0..d0 + N` of the 16 lane rows `acc[l * hd..]` of the head
    /// whose dims start at `head`: 64 lanes combined as ggml's reduction
    /// starts, `(l + 32) + (l + 16 + 48)`, or the 16 lanes as they are.
    #[inline(always)]
    fn lane_rows<W: Widen, const N: usize>(
        &self,
        head: usize,
        d0: usize,
        hd: usize,
        acc: &mut [f32],
    ) {
        let off = head + d0;
        for l in 0..16 {
            let r = if self.lanes == 64 {
                let a0 = self.lane::<W, N>(off, l);
                let a2 = self.lane::<W, N>(off, l + 32);
                let a1 = self.lane::<W, N>(off, l + 16);
                let a3 = self.lane::<W, N>(off, l + 48);
                std::array::from_fn::<f32, N, _>(|i| (a0[i] + a2[i]) + (a1[i] + a3[i]))
            } else {
                self.lane::<W, N>(off, l)
            };
            acc[l * hd + d0..l * hd + d0 + N].copy_from_slice(&r);
        }
    }
}

/// [`reduce16`] of every column `d` of 16 lane rows (`acc[l * hd + d]`),
/// computed row-wise so it vectorises over `d`; the same additions in the
/// same order as [`reduce16`] per column. Clobbers `acc`.
#[inline(always)]
fn reduce16_rows(acc: &mut [f32], hd: usize, dst: &mut [f32]) {
    let (lo, hi) = acc.split_at_mut(8 * hd);
    // t[i] = a[i + 8] + a[i]
    for i in 0..8 {
        let (t, a) = (&mut lo[i * hd..(i + 1) * hd], &hi[i * hd..(i + 1) * hd]);
        for (t, a) in t.iter_mut().zip(a) {
            *t += *a;
        }
    }
    // u[i] = t[i + 4] + t[i]
    let (lo, hi) = lo.split_at_mut(4 * hd);
    for i in 0..4 {
        let (u, t) = (&mut lo[i * hd..(i + 1) * hd], &hi[i * hd..(i + 1) * hd]);
        for (u, t) in u.iter_mut().zip(t) {
            *u += *t;
        }
    }
    // (u0 + u2) + (u1 + u3)
    let (u0, rest) = lo.split_at(hd);
    let (u1, rest) = rest.split_at(hd);
    let (u2, u3) = rest.split_at(hd);
    for ((((o, a0), a1), a2), a3) in dst.iter_mut().zip(u0).zip(u1).zip(u2).zip(&u3[..hd]) {
        *o = (*a0 + *a2) + (*a1 + *a3);
    }
}

/// [`attend_group`] compiled with FMA instructions (`mul_add` is otherwise a
/// libm call); the results are the same.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_group_fma(
    kv: &KvView,
    q: &CpuTensor,
    row0: usize,
    sinks: Option<&[f32]>,
    pos: BatchPos,
    p: &AttnParams,
    t: usize,
    heads: std::ops::Range<usize>,
    row: &mut Row,
    dst: &mut [f32],
) {
    attend_group::<F16c>(kv, q, row0, sinks, pos, p, t, heads, row, dst)
}

pub(super) fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Attention for several sequences at once: `q` holds their rows back to
/// back (`seqs[i].n_tokens` rows each) and `kvs[i]` is sequence `i`'s cache,
/// already holding its new keys and values; the shapes were checked by
/// [`crate::backend::check_attention`]. One parallel pass over every
/// (token, kv head); each row is computed exactly as for its sequence alone.
/// With `head_dim_v != head_dim` the scores use the `head_dim` elements of
/// Q and K and the weighted sum the `head_dim_v` of V, as ggml's
/// `mul_mat(k, q)` and `mul_mat(v, kq)` do; a K-only cache's V (ggml's
/// `ggml_cont(ggml_transpose(view of K))`, an exact copy in the cache type)
/// is read in place.
pub(super) fn attend(
    kvs: &[&CpuKv],
    q: &CpuTensor,
    sinks: Option<&[f32]>,
    seqs: &[BatchPos],
    p: &AttnParams,
) -> Result<CpuTensor, BackendError> {
    let dv = p.head_dim_v;
    let n_rows: usize = seqs.iter().map(|s| s.n_tokens).sum();
    let fma = has_fma();
    let views: Vec<KvView> = kvs
        .iter()
        .zip(seqs)
        .map(|(kv, pos)| {
            let n_pos = pos.pos0 + pos.n_tokens;
            let k = rows(&kv.k, n_pos * kv.n_embd_k);
            if kv.n_embd_v == 0 {
                // K-only: V is a view of K (first head_dim_v of each head).
                KvView {
                    k,
                    v: k,
                    n_embd_k: kv.n_embd_k,
                    n_embd_v: kv.n_embd_k,
                    v_head: p.head_dim,
                    n_ctx: kv.n_ctx,
                }
            } else {
                KvView {
                    k,
                    v: rows(&kv.v, n_pos * kv.n_embd_v),
                    n_embd_k: kv.n_embd_k,
                    n_embd_v: kv.n_embd_v,
                    v_head: dv,
                    n_ctx: kv.n_ctx,
                }
            }
        })
        .collect();
    // First row of each sequence.
    let mut starts = Vec::with_capacity(seqs.len());
    let mut r = 0;
    for s in seqs {
        starts.push(r);
        r += s.n_tokens;
    }
    if p.flash_attn {
        return Ok(super::flash_attn::attend(
            &views, q, sinks, seqs, &starts, p, fma,
        ));
    }
    let mut out = CpuTensor::zeros(q.rows, p.n_head * dv);
    // One work item per token (all its heads: each key and value row is one
    // stretch of memory), or per (token, kv head) when there are too few
    // tokens to keep every thread busy. The heads of a GQA group are
    // adjacent in the output row.
    let group = p.n_head / p.n_head_kv;
    let per_item = if n_rows >= 2 * rayon::current_num_threads() {
        p.n_head_kv
    } else {
        1
    };
    let items_per_tok = p.n_head_kv / per_item;
    // An item reads every key and value its rows see.
    let seen = seqs.iter().map(|s| s.pos0 + s.n_tokens).max().unwrap_or(0);
    let item_work = per_item * group * (p.head_dim + dv) * seen * grain::FLOP;
    out.data
        .par_chunks_mut((per_item * group * dv).max(1))
        .with_min_len(grain::min_items(item_work))
        .enumerate()
        .for_each_init(
            || Row {
                q16: Vec::new(),
                w: Vec::new(),
                acc: Vec::new(),
                kv: Vec::new(),
                max: Vec::new(),
            },
            |row, (i, dst)| {
                let tok = i / items_per_tok;
                let h0 = i % items_per_tok * per_item;
                let heads = h0..h0 + per_item;
                let s = starts.partition_point(|&st| st <= tok) - 1;
                let (kv, pos, row0) = (&views[s], seqs[s], starts[s]);
                let t = tok - row0;
                #[cfg(target_arch = "x86_64")]
                if fma {
                    // SAFETY: has_fma() checked the CPU.
                    unsafe { attend_group_fma(kv, q, row0, sinks, pos, p, t, heads, row, dst) };
                    return;
                }
                let _ = fma;
                attend_group::<Portable>(kv, q, row0, sinks, pos, p, t, heads, row, dst)
            },
        );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_expf16_equals_v_expf_lane_by_lane() {
        let mut xs: Vec<f32> = (-40000..40000).map(|i| i as f32 * 0.0037).collect();
        xs.extend([
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -200.0,
            200.0,
            -103.9,
            88.7,
            0.0,
            -0.0,
        ]);
        xs.resize(xs.len().div_ceil(16) * 16, 1.5);
        for c in xs.chunks(16) {
            let mut v: [f32; 16] = c.try_into().unwrap();
            v_expf16(&mut v);
            for (a, &x) in v.iter().zip(c) {
                let b = v_expf(x);
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{x}: {a} vs {b}"
                );
            }
        }
    }

    /// The scaling step as ggml's `vscalefps` defines it: `j * 2^n`
    /// computed exactly in f64 and rounded once to f32.
    fn scalef_f64(x: f32) -> f32 {
        let (n, j) = expf_parts(x);
        if n.is_nan() {
            return j;
        }
        if n.abs() > 192.0 {
            return if n <= 0.0 { 0.0 } else { f32::INFINITY };
        }
        (j as f64 * 2f64.powi(n as i32)) as f32
    }

    #[test]
    fn v_expf_rounds_once_like_vscalefps() {
        // Normal, subnormal, underflowing and overflowing results.
        let mut xs: Vec<f32> = (-1_100_000..1_000_000).map(|i| i as f32 * 1e-4).collect();
        xs.extend((0..200_000).map(|i| -104.0 + i as f32 * 1e-4));
        xs.extend((0..20_000).map(|i| 87.0 + i as f32 * 1e-4));
        xs.extend((0..4_000).map(|i| -140.0 - i as f32 * 0.01));
        xs.extend([
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            133.0,
            -133.0,
            0.0,
            -0.0,
        ]);
        for &x in &xs {
            let (a, b) = (v_expf(x), scalef_f64(x));
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{x}: {a:e} vs {b:e}"
            );
        }
    }

    #[test]
    fn v_expf_is_close_to_exp_and_saturates() {
        for i in -2000..2000 {
            let x = i as f32 * 0.043;
            let (a, b) = (v_expf(x), x.exp());
            assert!(((a - b) / b).abs() < 4e-7, "{x}: {a} vs {b}");
        }
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(-200.0), 0.0);
        assert_eq!(v_expf(200.0), f32::INFINITY);
    }

    #[test]
    fn vec_dot_f32_sums_every_product() {
        for n in [1usize, 16, 63, 64, 65, 130, 256] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).sin()).collect();
            let y: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).cos()).collect();
            let want: f64 = x.iter().zip(&y).map(|(a, b)| (a * b) as f64).sum();
            assert!((vec_dot_f32(&x, &y) as f64 - want).abs() < 1e-5, "n {n}");
        }
    }

    /// GCC's `_mm512_reduce_add_ps`, written out for the reference.
    fn ref_reduce16(a: &[f32]) -> f32 {
        let t: Vec<f32> = (0..8).map(|i| a[i + 8] + a[i]).collect();
        let u: Vec<f32> = (0..4).map(|i| t[i + 4] + t[i]).collect();
        (u[0] + u[2]) + (u[1] + u[3])
    }

    /// `ggml_vec_dot_f32` (AVX-512): accumulator `(i % 64) / 16`, lane
    /// `i % 16`, over whole steps of 64; the tail one product at a time.
    fn ref_vec_dot(x: &[f32], y: &[f32]) -> f32 {
        let np = x.len() & !63;
        let mut acc = [[0f32; 16]; 4];
        for i in 0..np {
            let (k, l) = ((i % 64) / 16, i % 16);
            acc[k][l] = x[i].mul_add(y[i], acc[k][l]);
        }
        let mut sum = 0f32;
        if np > 0 {
            let r: Vec<f32> = (0..16)
                .map(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]))
                .collect();
            sum = ref_reduce16(&r);
        }
        for i in np..x.len() {
            sum += x[i] * y[i];
        }
        sum
    }

    /// One head of one token as the module comment describes ggml's order,
    /// position by position, with no regrouping: scores, softmax over blocks
    /// of 16, then `kqv[d]` over all cached positions in lanes `j % lanes`.
    #[allow(clippy::too_many_arguments)]
    fn ref_head(
        k: &[f32],
        v: &[f32],
        n_embd: usize,
        q: &[f32],
        kvh: usize,
        qp: usize,
        lo: usize,
        scale: f32,
        sink: Option<f32>,
        lanes: usize,
        f16_cache: bool,
    ) -> Vec<f32> {
        let hd = q.len();
        // ggml's f16 mul_mat: Q rounded to f16; tinyBLAS for a batch
        // (whole 16s), ggml_vec_dot_f16 (f64 tail) otherwise.
        let q: Vec<f32> = if f16_cache {
            q.iter().map(|&x| round_f16(x)).collect()
        } else {
            q.to_vec()
        };
        let dot = |k: &[f32]| -> f32 {
            if !f16_cache {
                return ref_vec_dot(k, &q);
            }
            if lanes == 16 && hd.is_multiple_of(16) {
                let mut a = [0f32; 16];
                for i in 0..hd {
                    a[i % 16] = k[i].mul_add(q[i], a[i % 16]);
                }
                return ref_reduce16(&a);
            }
            let np = hd & !63;
            let mut s = ref_vec_dot(&k[..np], &q[..np]) as f64;
            for i in np..hd {
                s += (k[i] * q[i]) as f64;
            }
            s as f32
        };
        let row = |c: &[f32], j: usize| c[j * n_embd + kvh * hd..][..hd].to_vec();
        let n_pad = (qp + 1).div_ceil(16) * 16;
        let mut w = vec![f32::NEG_INFINITY; n_pad];
        for (j, w) in w.iter_mut().enumerate().take(qp + 1).skip(lo) {
            *w = dot(&row(k, j)) * scale;
        }
        let mut max = w.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        if let Some(s) = sink {
            max = max.max(s);
        }
        let mut sum = 0f64;
        for blk in w.chunks_mut(16) {
            for x in blk.iter_mut() {
                *x = v_expf(*x - max);
            }
            sum += ref_reduce16(blk) as f64;
        }
        if let Some(s) = sink {
            sum += (s - max).exp() as f64;
        }
        let inv = (1.0 / sum) as f32;
        let mut acc = vec![vec![0f32; hd]; lanes];
        for j in 0..=qp {
            let mut p = w[j] * inv;
            if f16_cache {
                p = round_f16(p);
            }
            let vr = row(v, j);
            for d in 0..hd {
                acc[j % lanes][d] = vr[d].mul_add(p, acc[j % lanes][d]);
            }
        }
        (0..hd)
            .map(|d| {
                let lane: Vec<f32> = (0..lanes).map(|l| acc[l][d]).collect();
                if lanes == 64 {
                    let r: Vec<f32> = (0..16)
                        .map(|l| (lane[l] + lane[32 + l]) + (lane[16 + l] + lane[48 + l]))
                        .collect();
                    ref_reduce16(&r)
                } else {
                    ref_reduce16(&lane)
                }
            })
            .collect()
    }

    /// `attend` over several sequences at once (decode rows and a prompt
    /// chunk, f16 and f32 caches, GQA, windows, sinks, head dims with a dot
    /// tail) equals the position-by-position reference bit for bit.
    #[test]
    fn attend_matches_ggml_order_bit_for_bit() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move |amp: f32| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * amp
        };
        let cases = [
            // (head_dim, n_head, n_head_kv, window, sinks, f16)
            (64, 9, 3, None, false, true),
            (64, 4, 4, Some(7), true, false),
            (80, 4, 2, None, true, true),
            (128, 2, 1, Some(40), false, false),
            // Dims past the last whole 16.
            (72, 2, 1, None, false, true),
        ];
        for (hd, n_head, n_head_kv, window, with_sinks, f16_cache) in cases {
            let p = AttnParams {
                n_head,
                n_head_kv,
                head_dim: hd,
                head_dim_v: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                window,
                flash_attn: false,
            };
            // (pos0, n_tokens): decode rows at short and long contexts,
            // and a prompt chunk past position 0.
            let seqs = [
                BatchPos {
                    pos0: 0,
                    n_tokens: 1,
                    steps: false,
                },
                BatchPos {
                    pos0: 150,
                    n_tokens: 1,
                    steps: false,
                },
                BatchPos {
                    pos0: 60,
                    n_tokens: 5,
                    steps: false,
                },
                BatchPos {
                    pos0: 63,
                    n_tokens: 1,
                    steps: false,
                },
            ];
            let n_embd = n_head_kv * hd;
            // Each sequence's cache, with its exact values for the reference.
            let kvs: Vec<(CpuKv, Vec<f32>, Vec<f32>)> = seqs
                .iter()
                .map(|s| {
                    let n = (s.pos0 + s.n_tokens) * n_embd;
                    let mut k: Vec<f32> = (0..n).map(|_| rnd(2.0)).collect();
                    let mut v: Vec<f32> = (0..n).map(|_| rnd(1.0)).collect();
                    let store = |x: &mut Vec<f32>| {
                        if f16_cache {
                            x.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
                            KvStore::F16(x.iter().map(|&x| f16::from_f32(x)).collect())
                        } else {
                            KvStore::F32(x.clone())
                        }
                    };
                    let (k_store, v_store) = (store(&mut k), store(&mut v));
                    let kv = CpuKv {
                        k: k_store,
                        v: v_store,
                        n_ctx: n / n_embd,
                        n_embd_k: n_embd,
                        n_embd_v: n_embd,
                    };
                    (kv, k, v)
                })
                .collect();
            let n_rows: usize = seqs.iter().map(|s| s.n_tokens).sum();
            let q = CpuTensor {
                data: (0..n_rows * n_head * hd).map(|_| rnd(3.0)).collect(),
                rows: n_rows,
                cols: n_head * hd,
            };
            let sinks: Option<Vec<f32>> =
                with_sinks.then(|| (0..n_head).map(|_| rnd(4.0)).collect());
            let refs: Vec<&CpuKv> = kvs.iter().map(|(kv, _, _)| kv).collect();
            let out = attend(&refs, &q, sinks.as_deref(), &seqs, &p).unwrap();
            // Each sequence alone (one-token sequences split their work by
            // kv head, the batch by token) gives the same rows.
            let mut r0 = 0;
            for (i, s) in seqs.iter().enumerate() {
                let rows = r0 * q.cols..(r0 + s.n_tokens) * q.cols;
                let q1 = CpuTensor {
                    data: q.data[rows.clone()].to_vec(),
                    rows: s.n_tokens,
                    cols: q.cols,
                };
                let one = attend(&refs[i..=i], &q1, sinks.as_deref(), &seqs[i..=i], &p).unwrap();
                let same = one
                    .data
                    .iter()
                    .zip(&out.data[rows])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "hd {hd}: sequence {i} alone differs from the batch");
                r0 += s.n_tokens;
            }
            let mut row = 0;
            for (s, (_, k, v)) in seqs.iter().zip(&kvs) {
                let lanes = if s.n_tokens >= 2 { 16 } else { 64 };
                for t in 0..s.n_tokens {
                    let qp = s.pos0 + t;
                    let lo = window.map_or(0, |w| (qp + 1).saturating_sub(w as usize));
                    for h in 0..n_head {
                        let qh = &q.data[row * q.cols + h * hd..][..hd];
                        let kvh = h / (n_head / n_head_kv);
                        let sink = sinks.as_ref().map(|s| s[h]);
                        let want = ref_head(
                            k, v, n_embd, qh, kvh, qp, lo, p.scale, sink, lanes, f16_cache,
                        );
                        let got = &out.data[row * out.cols + h * hd..][..hd];
                        for (d, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(
                                g.to_bits(),
                                w.to_bits(),
                                "hd {hd} pos {qp} head {h} dim {d}: {g} vs {w}"
                            );
                        }
                    }
                    row += 1;
                }
            }
        }
    }
}
