//! The numerics of ggml's x86 "tiled" matmul (`ggml-cpu/tiled`), which ggml
//! runs instead of `vec_dot` for the K-quants, IQ4_XS and the 1–3-bit
//! i-quants whenever a MUL_MAT has at least [`MIN_BATCH`] activation rows
//! (for MUL_MAT_ID: rows routed to one expert) and the weights are not
//! repacked. Per (weight row, activation row) and per 256-element block it
//! forms two exact integers, `s1 = sum_e W_e a_e` (weight code times its
//! sub-block scale, times the Q8_K code) and, for the types with mins,
//! `s2 = sum_e M_e a_e` (the sub-block min), then
//! `res = f32(s1) * d0`, `res = fnmadd(dmin, f32(s2), res)` and
//! `acc = fma(res, d_act, acc)`, blocks in order from `acc = 0`.
//!
//! Integer sums are exact whatever order computes them, so each weight
//! block is decoded once per group of activation rows into [`Tile`]: codes
//! `q` (one `i8` per element) and integer scales `sc` and mins `m` (one per
//! 16 elements) with `W = q * sc`, and `d0` such that `d0 * W` is the
//! dequantised value (the i-quants' scales are odd multiples of 1/8 or 1/4,
//! so their `d0` carries that power of two, which keeps `f32(s1) * d0`
//! ggml's bits). `s1` is then a sign/`maddubs`/`madd` chain and `s2 = sum_g
//! m_g * bsums_g`. The test module checks every decoder against the type's
//! own (gguf-py-exact) dequantiser through a slow reference that derives
//! `W` and `M` from it: with the block scale set to 1 (and `dmin` to 0) the
//! dequantised value is the sub-block scale times the code, exactly, and
//! with `d = 0, dmin = 1` it is minus the sub-block min.

use super::common::KVALUES_IQ4NL;
use super::iq1::{grid8, IQ1_DELTA};
use super::iq2::Iq2Groups;
use super::iq_tables::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::{
    BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4XS,
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, GgmlBlock,
};
use half::f16;

/// ggml's batch floor: `ggml_tiled_min_batch` (rows >= 8).
pub const MIN_BATCH: usize = 8;

const QK: usize = 256;
const NG: usize = QK / 16;

/// One weight block decoded for the integer sums: element `e` is
/// `d0 * q[e] * sc[e / 16]` minus `dmin * m[e / 16]`.
#[repr(C, align(32))]
pub(super) struct Tile {
    q: [i8; QK],
    sc: [i16; NG],
    m: [i16; NG],
    d0: f32,
    dmin: f32,
}

impl Tile {
    const fn new() -> Self {
        Self {
            q: [0; QK],
            sc: [0; NG],
            m: [0; NG],
            d0: 0.0,
            dmin: 0.0,
        }
    }

    /// The same scale for the two 16-element groups of 32-element
    /// sub-block `ib`.
    #[inline(always)]
    fn sub_scale(&mut self, ib: usize, s: i32) {
        self.sc[2 * ib] = s as i16;
        self.sc[2 * ib + 1] = s as i16;
    }
}

/// A block type ggml's tiled path handles, and its decoder. Every code is
/// in `-127..=127` and every scale in `-128..=128`, so the `maddubs` pairs
/// and the `i32` sums cannot overflow.
pub(super) trait TiledBlock: GgmlBlock<Act = BlockQ8K> {
    /// Sub-block mins (`dmin`) present.
    const HAS_MIN: bool;
    fn decode(&self, t: &mut Tile);
}

impl TiledBlock for BlockQ2K {
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        for (g, &s) in self.scales.iter().enumerate() {
            t.sc[g] = (s & 0xF) as i16;
            t.m[g] = (s >> 4) as i16;
        }
        // Group g = 8n + 2j + h: bits 2j of bytes 32n + 16h .. + 16.
        for n in 0..2 {
            for j in 0..4 {
                for h in 0..2 {
                    let src = &self.qs[32 * n + 16 * h..32 * n + 16 * h + 16];
                    let g = 8 * n + 2 * j + h;
                    for (q, &b) in t.q[16 * g..16 * g + 16].iter_mut().zip(src) {
                        *q = ((b >> (2 * j)) & 3) as i8;
                    }
                }
            }
        }
        t.d0 = self.d.to_f32();
        t.dmin = self.dmin.to_f32();
    }
}

impl TiledBlock for BlockQ3K {
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        for (o, s) in t.sc.iter_mut().zip(self.scales16()) {
            *o = s as i16;
        }
        t.q = self.quants();
        t.d0 = self.d.to_f32();
    }
}

/// Q4_K and Q5_K: a 6-bit scale and min per 32 elements.
#[inline(always)]
fn k4_scales(t: &mut Tile, (sc, m): ([u8; 8], [u8; 8]), d: f16, dmin: f16) {
    for ib in 0..8 {
        t.sub_scale(ib, sc[ib] as i32);
        t.m[2 * ib] = m[ib] as i16;
        t.m[2 * ib + 1] = m[ib] as i16;
    }
    t.d0 = d.to_f32();
    t.dmin = dmin.to_f32();
}

impl TiledBlock for BlockQ4K {
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        k4_scales(t, self.scale_mins(), self.d, self.dmin);
        for (c, src) in self.qs.chunks_exact(32).enumerate() {
            for (l, &b) in src.iter().enumerate() {
                t.q[64 * c + l] = (b & 0xF) as i8;
                t.q[64 * c + 32 + l] = (b >> 4) as i8;
            }
        }
    }
}

impl TiledBlock for BlockQ5K {
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        k4_scales(t, self.scale_mins(), self.d, self.dmin);
        t.q = self.quants();
    }
}

impl TiledBlock for BlockQ6K {
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        for (o, &s) in t.sc.iter_mut().zip(&self.scales) {
            *o = s as i16;
        }
        t.q = self.quants();
        t.d0 = self.d.to_f32();
    }
}

impl TiledBlock for BlockIQ4XS {
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        for (ib, src) in self.qs.chunks_exact(16).enumerate() {
            t.sub_scale(ib, self.scale(ib));
            for (j, &b) in src.iter().enumerate() {
                t.q[32 * ib + j] = KVALUES_IQ4NL[(b & 0xF) as usize];
                t.q[32 * ib + 16 + j] = KVALUES_IQ4NL[(b >> 4) as usize];
            }
        }
        t.d0 = self.d.to_f32();
    }
}

/// Eight grid magnitudes at `q`, negated where bit `j` of `signs` is set.
#[inline(always)]
fn signed8(q: &mut [i8], grid: [u8; 8], signs: u8) {
    for (j, (q, g)) in q.iter_mut().zip(grid).enumerate() {
        *q = if signs >> j & 1 != 0 {
            -(g as i8)
        } else {
            g as i8
        };
    }
}

/// IQ2_*: `(0.5 + ls) / 4 * grid = (2 ls + 1) * grid / 8`.
#[inline(always)]
fn decode_iq2<B: Iq2Groups>(x: &B, t: &mut Tile) {
    for ib in 0..8 {
        for h in 0..2 {
            t.sc[2 * ib + h] = (2 * x.ls(ib, h) + 1) as i16;
        }
        for l in 0..4 {
            let (grid, signs) = x.group(ib, l);
            signed8(&mut t.q[32 * ib + 8 * l..], grid.to_le_bytes(), signs);
        }
    }
    t.d0 = x.d().to_f32() * 0.125;
}

macro_rules! iq2_tiled {
    ($($b:ty),*) => {$(
        impl TiledBlock for $b {
            const HAS_MIN: bool = false;
            #[inline(always)]
            fn decode(&self, t: &mut Tile) {
                decode_iq2(self, t)
            }
        }
    )*};
}
iq2_tiled!(BlockIQ2XXS, BlockIQ2XS, BlockIQ2S);

/// Two 4-magnitude grid points as eight.
#[inline(always)]
fn grid_pair(g1: u32, g2: u32) -> [u8; 8] {
    (g1 as u64 | (g2 as u64) << 32).to_le_bytes()
}

impl TiledBlock for BlockIQ3XXS {
    const HAS_MIN: bool = false;
    /// `(0.5 + ls) / 2 * grid = (2 ls + 1) * grid / 4`.
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        for ib in 0..8 {
            let aux = self.aux(ib);
            t.sub_scale(ib, 2 * (aux >> 28) as i32 + 1);
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
                let g1 = IQ3XXS_GRID[self.qs[8 * ib + 2 * l] as usize];
                let g2 = IQ3XXS_GRID[self.qs[8 * ib + 2 * l + 1] as usize];
                signed8(&mut t.q[32 * ib + 8 * l..], grid_pair(g1, g2), signs);
            }
        }
        t.d0 = self.d.to_f32() * 0.25;
    }
}

impl TiledBlock for BlockIQ3S {
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        for ib in 0..8 {
            t.sub_scale(ib, self.scale(ib));
            for l in 0..4 {
                let g1 = IQ3S_GRID[self.index(ib, 2 * l)];
                let g2 = IQ3S_GRID[self.index(ib, 2 * l + 1)];
                signed8(
                    &mut t.q[32 * ib + 8 * l..],
                    grid_pair(g1, g2),
                    self.signs[4 * ib + l],
                );
            }
        }
        t.d0 = self.d.to_f32();
    }
}

/// IQ1_*: `ls * (grid + delta)` with `delta = ±1/8`: codes `8 grid ± 1`.
#[inline(always)]
fn iq1_group(q: &mut [i8], grid: [i8; 8], delta: i32) {
    for (q, g) in q.iter_mut().zip(grid) {
        *q = (8 * g as i32 + delta) as i8;
    }
}

const _: () = assert!(IQ1_DELTA == 0.125);

impl TiledBlock for BlockIQ1S {
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        for ib in 0..8 {
            t.sub_scale(ib, self.scale(ib));
            let delta = self.delta_sign(ib);
            for l in 0..4 {
                iq1_group(&mut t.q[32 * ib + 8 * l..], grid8(self.index(ib, l)), delta);
            }
        }
        t.d0 = self.d.to_f32() * 0.125;
    }
}

impl TiledBlock for BlockIQ1M {
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        for ib in 0..8 {
            let (s1, s2) = self.scales(ib);
            t.sc[2 * ib] = s1 as i16;
            t.sc[2 * ib + 1] = s2 as i16;
            for l in 0..4 {
                let delta = self.delta_sign(ib, l);
                iq1_group(&mut t.q[32 * ib + 8 * l..], grid8(self.index(ib, l)), delta);
            }
        }
        t.d0 = self.d().to_f32() * 0.125;
    }
}

/// Activation rows sharing one decoded weight block.
const TILE_T: usize = 16;

/// `out[t * nr + r]` = row `r` of `w` (rows of `nb` blocks) times
/// activation row `t` of `a`, with ggml's tiled-path bits. Selected only
/// where the CPU has AVX2 and FMA (`ops::BatchKernel`); inconsistent
/// lengths write nothing (the callers in `ops` check them first).
pub(super) fn tiled<B: TiledBlock>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
    if nb == 0 || !w.len().is_multiple_of(nb) || !a.len().is_multiple_of(nb) {
        return;
    }
    if out.len() != (w.len() / nb) * (a.len() / nb) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: only selected where CpuCaps::has_avx2() (AVX2, FMA).
    unsafe {
        avx2::tiled(nb, w, a, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    portable(nb, w, a, out)
}

/// [`tiled`] in plain Rust, the same sums and float steps (ggml's tiled
/// path is x86-only, so nothing selects this elsewhere; the tests hold the
/// SIMD kernel to it).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn portable<B: TiledBlock>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
    let (nr, nt) = (w.len() / nb, a.len() / nb);
    let mut tile = Tile::new();
    out.fill(0.0);
    for (r, row) in w.chunks_exact(nb).enumerate() {
        for (j, x) in row.iter().enumerate() {
            x.decode(&mut tile);
            for t in 0..nt {
                let y = &a[t * nb + j];
                let mut s1 = 0i32;
                for (g, (q, a)) in tile
                    .q
                    .chunks_exact(16)
                    .zip(y.qs.chunks_exact(16))
                    .enumerate()
                {
                    let s: i32 = q.iter().zip(a).map(|(&q, &a)| q as i32 * a as i32).sum();
                    s1 += s * tile.sc[g] as i32;
                }
                let mut res = s1 as f32 * tile.d0;
                if B::HAS_MIN {
                    let s2: i32 = tile
                        .m
                        .iter()
                        .zip(&y.bsums)
                        .map(|(&m, &b)| m as i32 * b as i32)
                        .sum();
                    res = (-tile.dmin).mul_add(s2 as f32, res);
                }
                let o = &mut out[t * nr + r];
                *o = res.mul_add(y.d, *o);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Tile, TiledBlock, NG, QK, TILE_T};
    use crate::quant::BlockQ8K;
    use std::arch::x86_64::*;

    /// A decoded block as vectors: codes, their magnitudes, and each
    /// 32-element chunk's two group scales as 16 `i16` lanes (the lanes of
    /// `maddubs` over that chunk: 8 per 16 elements).
    struct Vecs {
        q: [__m256i; QK / 32],
        aq: [__m256i; QK / 32],
        sc: [__m256i; QK / 32],
        m: __m256i,
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn vecs(t: &Tile) -> Vecs {
        let mut v = Vecs {
            q: [_mm256_setzero_si256(); QK / 32],
            aq: [_mm256_setzero_si256(); QK / 32],
            sc: [_mm256_setzero_si256(); QK / 32],
            m: _mm256_loadu_si256(t.m.as_ptr() as *const __m256i),
        };
        for k in 0..QK / 32 {
            let q = _mm256_loadu_si256(t.q.as_ptr().add(32 * k) as *const __m256i);
            v.q[k] = q;
            v.aq[k] = _mm256_abs_epi8(q);
            v.sc[k] =
                _mm256_set_m128i(_mm_set1_epi16(t.sc[2 * k + 1]), _mm_set1_epi16(t.sc[2 * k]));
        }
        v
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        let r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0b01_00_11_10));
        let r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0b10_11_00_01));
        _mm_cvtsi128_si32(r)
    }

    /// `(s1, s2)` of one decoded block against one activation block.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sums(v: &Vecs, y: &BlockQ8K, min: bool) -> (i32, i32) {
        let mut acc = _mm256_setzero_si256();
        for k in 0..QK / 32 {
            let a = _mm256_loadu_si256(y.qs.as_ptr().add(32 * k) as *const __m256i);
            let p = _mm256_maddubs_epi16(v.aq[k], _mm256_sign_epi8(a, v.q[k]));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, v.sc[k]));
        }
        let s2 = if min {
            let b = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
            hsum_i32(_mm256_madd_epi16(v.m, b))
        } else {
            0
        };
        (hsum_i32(acc), s2)
    }

    const _: () = assert!(NG == 16);

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tiled<B: TiledBlock>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
        let (nr, nt) = (w.len() / nb, a.len() / nb);
        let mut tile = Tile::new();
        let mut t0 = 0;
        while t0 < nt {
            let tn = (nt - t0).min(TILE_T);
            let ag = &a[t0 * nb..(t0 + tn) * nb];
            for (r, row) in w.chunks_exact(nb).enumerate() {
                let mut acc = [0f32; TILE_T];
                for (j, x) in row.iter().enumerate() {
                    x.decode(&mut tile);
                    let v = vecs(&tile);
                    let (d0, dmin) = (tile.d0, tile.dmin);
                    for (t, acc) in acc[..tn].iter_mut().enumerate() {
                        let y = &ag[t * nb + j];
                        let (s1, s2) = sums(&v, y, B::HAS_MIN);
                        let mut res = s1 as f32 * d0;
                        if B::HAS_MIN {
                            res = (-dmin).mul_add(s2 as f32, res);
                        }
                        *acc = res.mul_add(y.d, *acc);
                    }
                }
                for (t, &acc) in acc[..tn].iter().enumerate() {
                    out[(t0 + t) * nr + r] = acc;
                }
            }
            t0 += tn;
        }
    }
}

/// The slow reference the decoders are tested against: `W` and `M` from
/// the dequantiser at unit scales (the form `tests/quant_formats.rs` holds
/// to llama.cpp's own matmul outputs in an earlier revision).
#[cfg(test)]
mod reference {
    use super::{TiledBlock, QK};
    use crate::quant::{
        BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS,
        BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
    };
    use half::f16;

    /// The block's `d` and `dmin`, and the block with them replaced.
    pub(crate) trait Scales: TiledBlock {
        fn scales(&self) -> (f32, f32);
        fn with_scales(&self, d: f16, dmin: f16) -> Self;
    }

    macro_rules! plain_d {
        ($($b:ty),*) => {$(
            impl Scales for $b {
                fn scales(&self) -> (f32, f32) {
                    (self.d.to_f32(), 0.0)
                }
                fn with_scales(&self, d: f16, _dmin: f16) -> Self {
                    Self { d, ..*self }
                }
            }
        )*};
    }
    plain_d!(
        BlockQ3K,
        BlockQ6K,
        BlockIQ4XS,
        BlockIQ2XXS,
        BlockIQ2XS,
        BlockIQ2S,
        BlockIQ3XXS,
        BlockIQ3S,
        BlockIQ1S
    );

    macro_rules! with_min {
        ($($b:ty),*) => {$(
            impl Scales for $b {
                fn scales(&self) -> (f32, f32) {
                    (self.d.to_f32(), self.dmin.to_f32())
                }
                fn with_scales(&self, d: f16, dmin: f16) -> Self {
                    Self { d, dmin, ..*self }
                }
            }
        )*};
    }
    with_min!(BlockQ2K, BlockQ4K, BlockQ5K);

    /// IQ1_M keeps its fp16 scale in the top nibbles of its four scale words.
    impl Scales for BlockIQ1M {
        fn scales(&self) -> (f32, f32) {
            (self.d().to_f32(), 0.0)
        }
        fn with_scales(&self, d: f16, _dmin: f16) -> Self {
            let mut b = *self;
            let h = d.to_bits();
            for k in 0..4 {
                b.scales[2 * k + 1] =
                    (b.scales[2 * k + 1] & 0x0F) | ((((h >> (4 * k)) & 0xF) as u8) << 4);
            }
            b
        }
    }

    /// `8 W`, `M` and `d / 8` of one block, from the dequantiser.
    pub(crate) fn decode<B: Scales>(x: &B) -> ([i32; QK], [i32; QK], f32, f32) {
        let (d, dmin) = x.scales();
        let mut y = [0f32; QK];
        let (mut w, mut m) = ([0i32; QK], [0i32; QK]);
        B::to_f32(
            std::slice::from_ref(&x.with_scales(f16::ONE, f16::ZERO)),
            &mut y,
        );
        for (w, &v) in w.iter_mut().zip(y.iter()) {
            *w = (v * 8.0) as i32;
        }
        if B::HAS_MIN {
            B::to_f32(
                std::slice::from_ref(&x.with_scales(f16::ZERO, f16::ONE)),
                &mut y,
            );
            for (m, &v) in m.iter_mut().zip(y.iter()) {
                *m = -v as i32;
            }
        }
        (w, m, d / 8.0, dmin)
    }

    fn idot(w: &[i32; QK], a: &[i8; QK]) -> i32 {
        w.iter().zip(a).map(|(&w, &a)| w * a as i32).sum()
    }

    pub(crate) fn tiled<B: Scales>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
        let (nr, nt) = (w.len() / nb, a.len() / nb);
        out.fill(0.0);
        for (r, row) in w.chunks_exact(nb).enumerate() {
            for (j, x) in row.iter().enumerate() {
                let (dw, dm, d0, dmin) = decode(x);
                for t in 0..nt {
                    let act = &a[t * nb + j];
                    let mut res = idot(&dw, &act.qs) as f32 * d0;
                    if B::HAS_MIN {
                        res = (-dmin).mul_add(idot(&dm, &act.qs) as f32, res);
                    }
                    let o = &mut out[t * nr + r];
                    *o = res.mul_add(act.d, *o);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reference::{self, Scales};
    use super::*;
    use bytemuck::Zeroable;

    /// xorshift64*: deterministic bytes without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn bytes(&mut self, out: &mut [u8]) {
            for b in out {
                *b = self.next() as u8;
            }
        }
        fn scale(&mut self) -> f16 {
            f16::from_f32(0.001 + (self.next() % 1000) as f32 * 1e-4)
        }
    }

    fn weights<B: Scales>(rng: &mut Rng, n: usize) -> Vec<B> {
        (0..n)
            .map(|_| {
                let mut b = B::zeroed();
                rng.bytes(bytemuck::bytes_of_mut(&mut b));
                let (d, dmin) = (rng.scale(), rng.scale());
                b.with_scales(d, dmin)
            })
            .collect()
    }

    /// Q8_K rows as `quantize_row_q8_K` leaves them: codes in -127..=127,
    /// `bsums` the sums of 16 codes.
    fn acts(rng: &mut Rng, n: usize) -> Vec<BlockQ8K> {
        (0..n)
            .map(|_| {
                let mut y = BlockQ8K::zeroed();
                for q in y.qs.iter_mut() {
                    *q = ((rng.next() % 255) as i32 - 127) as i8;
                }
                for (s, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
                    *s = q.iter().map(|&q| q as i16).sum();
                }
                y.d = 1e-3 + (rng.next() % 1000) as f32 * 1e-5;
                y
            })
            .collect()
    }

    /// Every decoder against the dequantiser, then the SIMD kernel and the
    /// portable one against the reference, bit for bit, at the batch sizes
    /// that cover a full group of `TILE_T` and a partial one.
    fn check<B: Scales>(seed: u64) {
        let mut rng = Rng(seed);
        let nb = 3;
        let w = weights::<B>(&mut rng, 4 * nb);
        let mut tile = Tile::new();
        for x in &w {
            x.decode(&mut tile);
            let (rw, rm, rd0, _) = reference::decode(x);
            let f = (tile.d0 / rd0) as i32;
            for e in 0..QK {
                let got = tile.q[e] as i32 * tile.sc[e / 16] as i32 * f;
                assert_eq!(got, rw[e], "{:?} element {e}: q * sc", B::TYPE);
                if B::HAS_MIN {
                    assert_eq!(
                        tile.m[e / 16] as i32,
                        rm[e],
                        "{:?} element {e}: min",
                        B::TYPE
                    );
                }
                assert!(tile.q[e] != i8::MIN, "{:?}: code -128", B::TYPE);
            }
        }
        for nt in [8, 16, 23, 40] {
            let a = acts(&mut rng, nt * nb);
            let mut want = vec![0f32; 4 * nt];
            reference::tiled(nb, &w, &a, &mut want);
            let mut got = vec![f32::NAN; 4 * nt];
            portable(nb, &w, &a, &mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{:?} portable, {nt} rows", B::TYPE);
            if crate::quant::CpuCaps::detect().has_avx2() {
                got.fill(f32::NAN);
                tiled(nb, &w, &a, &mut got);
                assert_eq!(bits(&got), bits(&want), "{:?} avx2, {nt} rows", B::TYPE);
            }
        }
    }

    #[test]
    fn tiled_kernels_equal_the_dequantiser_reference() {
        for seed in 1..4u64 {
            check::<BlockQ2K>(seed);
            check::<BlockQ3K>(seed);
            check::<BlockQ4K>(seed);
            check::<BlockQ5K>(seed);
            check::<BlockQ6K>(seed);
            check::<BlockIQ4XS>(seed);
            check::<BlockIQ2XXS>(seed);
            check::<BlockIQ2XS>(seed);
            check::<BlockIQ2S>(seed);
            check::<BlockIQ3XXS>(seed);
            check::<BlockIQ3S>(seed);
            check::<BlockIQ1S>(seed);
            check::<BlockIQ1M>(seed);
        }
    }
}
