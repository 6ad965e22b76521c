//! Each type's [`TiledBlock`] decoder: its codes, scales and mins into a
//! [`Tile`], portable and with AVX2 and AVX-512 (the i-quants' grids and
//! signs, IQ4_XS's table, Q3_K's bits).

use super::super::common::KVALUES_IQ4NL;
use super::super::iq1::{grid8, IQ1_DELTA};
use super::super::iq2::Iq2Groups;
use super::super::iq_tables::{IQ1S_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::super::{
    BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4XS,
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K,
};
use super::{Codes, Tile, TiledBlock};
use half::f16;

impl TiledBlock for BlockQ2K {
    const HAS_MIN: bool = true;
    const SUB: usize = 16;
    const CODES: Codes = Codes::Unsigned;
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
    const SUB: usize = 16;
    const CODES: Codes = Codes::Offset;
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        for (o, s) in t.sc.iter_mut().zip(self.scales16()) {
            *o = s as i16;
        }
        t.q = self.quants();
        t.d0 = self.d.to_f32();
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_simd(&self, t: &mut Tile) {
        for (o, s) in t.sc.iter_mut().zip(self.scales16()) {
            *o = s as i16;
        }
        simd::q3k_codes(t, &self.qs, &self.hmask);
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
    const SUB: usize = 32;
    const CODES: Codes = Codes::Unsigned;
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
    const SUB: usize = 32;
    const CODES: Codes = Codes::Unsigned;
    #[inline(always)]
    fn decode(&self, t: &mut Tile) {
        k4_scales(t, self.scale_mins(), self.d, self.dmin);
        t.q = self.quants();
    }
}

impl TiledBlock for BlockQ6K {
    const HAS_MIN: bool = false;
    const SUB: usize = 16;
    const CODES: Codes = Codes::Offset;
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
    const SUB: usize = 32;
    const CODES: Codes = Codes::Signed;
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
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_simd(&self, t: &mut Tile) {
        for ib in 0..8 {
            t.sub_scale(ib, self.scale(ib));
        }
        simd::iq4_codes(t, &self.qs);
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
    ($($b:ty: $sub:literal),*) => {$(
        impl TiledBlock for $b {
            const HAS_MIN: bool = false;
            const CODES: Codes = Codes::Offset;
            const SUB: usize = $sub;
            #[inline(always)]
            fn decode(&self, t: &mut Tile) {
                decode_iq2(self, t)
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn decode_simd(&self, t: &mut Tile) {
                for ib in 0..8 {
                    for h in 0..2 {
                        t.sc[2 * ib + h] = (2 * self.ls(ib, h) + 1) as i16;
                    }
                    let gs: [(u64, u8); 4] = std::array::from_fn(|l| self.group(ib, l));
                    simd::signed32(t, ib, gs.map(|g| g.0), gs.map(|g| g.1));
                }
                t.d0 = self.d().to_f32() * 0.125;
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn decode_512(&self, t: &mut Tile) {
                simd512::signed(self, t);
                t.d0 = self.d().to_f32() * 0.125;
            }
        }
    )*};
}
iq2_tiled!(BlockIQ2XXS: 32, BlockIQ2XS: 16, BlockIQ2S: 16);

/// Two 4-magnitude grid points as eight.
#[inline(always)]
fn grid_pair(g1: u32, g2: u32) -> [u8; 8] {
    (g1 as u64 | (g2 as u64) << 32).to_le_bytes()
}

impl TiledBlock for BlockIQ3XXS {
    const HAS_MIN: bool = false;
    const SUB: usize = 32;
    const CODES: Codes = Codes::Offset;
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
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_simd(&self, t: &mut Tile) {
        for ib in 0..8 {
            let aux = self.aux(ib);
            t.sub_scale(ib, 2 * (aux >> 28) as i32 + 1);
            let g = std::array::from_fn(|l| {
                let g = |k: usize| grid_entry(&IQ3XXS_GRID, self.qs[8 * ib + 2 * l + k] as usize);
                g(0) as u64 | (g(1) as u64) << 32
            });
            let s = std::array::from_fn(|l| KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize]);
            simd::signed32(t, ib, g, s);
        }
        t.d0 = self.d.to_f32() * 0.25;
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_512(&self, t: &mut Tile) {
        simd512::signed(self, t);
        t.d0 = self.d.to_f32() * 0.25;
    }
}

impl TiledBlock for BlockIQ3S {
    const HAS_MIN: bool = false;
    const SUB: usize = 32;
    const CODES: Codes = Codes::Offset;
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
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_simd(&self, t: &mut Tile) {
        for ib in 0..8 {
            t.sub_scale(ib, self.scale(ib));
            let g = std::array::from_fn(|l| {
                let g = |k: usize| grid_entry(&IQ3S_GRID, self.index(ib, 2 * l + k));
                g(0) as u64 | (g(1) as u64) << 32
            });
            let s = std::array::from_fn(|l| self.signs[4 * ib + l]);
            simd::signed32(t, ib, g, s);
        }
        t.d0 = self.d.to_f32();
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_512(&self, t: &mut Tile) {
        simd512::signed(self, t);
        t.d0 = self.d.to_f32();
    }
}

/// Entry `i` of a 4-byte grid as a plain scalar load. A volatile read on
/// purpose: with AVX-512 enabled, LLVM turns eight neighbouring table loads
/// into a `vpgatherqd`, which stalls the decode (IQ3_S 32-token products
/// ~1.3x slower than with scalar loads).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn grid_entry(grid: &[u32], i: usize) -> u32 {
    // SAFETY: a valid, aligned reference (bounds-checked by the indexing).
    unsafe { std::ptr::read_volatile(&grid[i]) }
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
    const SUB: usize = 32;
    const CODES: Codes = Codes::Offset;
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
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_simd(&self, t: &mut Tile) {
        for ib in 0..8 {
            t.sub_scale(ib, self.scale(ib));
            let g = std::array::from_fn(|l| IQ1S_GRID[self.index(ib, l)]);
            simd::iq1_32(t, ib, g, [self.delta_sign(ib); 4]);
        }
        t.d0 = self.d.to_f32() * 0.125;
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_512(&self, t: &mut Tile) {
        simd512::iq1_s(self, t);
        t.d0 = self.d.to_f32() * 0.125;
    }
}

impl TiledBlock for BlockIQ1M {
    const HAS_MIN: bool = false;
    const SUB: usize = 16;
    const CODES: Codes = Codes::Offset;
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
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_simd(&self, t: &mut Tile) {
        for ib in 0..8 {
            let (s1, s2) = self.scales(ib);
            t.sc[2 * ib] = s1 as i16;
            t.sc[2 * ib + 1] = s2 as i16;
            let g = std::array::from_fn(|l| IQ1S_GRID[self.index(ib, l)]);
            simd::iq1_32(t, ib, g, std::array::from_fn(|l| self.delta_sign(ib, l)));
        }
        t.d0 = self.d().to_f32() * 0.125;
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_512(&self, t: &mut Tile) {
        simd512::iq1_m(self, t);
        t.d0 = self.d().to_f32() * 0.125;
    }
}

/// AVX2 pieces of the decoders (the i-quants, IQ4_XS, Q3_K): 32 codes at a
/// time.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{Tile, KVALUES_IQ4NL};
    use std::arch::x86_64::*;

    /// Byte `j` is -1 where bit `j` of the index is set, else 1.
    static SIGN_BYTES: [u64; 256] = {
        let mut t = [0u64; 256];
        let mut k = 0;
        while k < 256 {
            let mut j = 0;
            while j < 8 {
                let b: u64 = if (k >> j) & 1 != 0 { 0xFF } else { 0x01 };
                t[k] |= b << (8 * j);
                j += 1;
            }
            k += 1;
        }
        t
    };

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn x4(v: [u64; 4]) -> __m256i {
        _mm256_set_epi64x(v[3] as i64, v[2] as i64, v[1] as i64, v[0] as i64)
    }

    /// Sub-block `ib`'s codes: four 8-byte grid points `g`, negated where
    /// the bits of their sign bytes `s` are set.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn signed32(t: &mut Tile, ib: usize, g: [u64; 4], s: [u8; 4]) {
        let q = _mm256_sign_epi8(x4(g), x4(s.map(|s| SIGN_BYTES[s as usize])));
        _mm256_storeu_si256(t.q.as_mut_ptr().add(32 * ib) as *mut __m256i, q);
    }

    /// IQ4_XS's codes: each sub-block's 16 bytes, low nibbles then high,
    /// through the non-linear table.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn iq4_codes(t: &mut Tile, qs: &[u8; 128]) {
        let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
        let table = _mm256_broadcastsi128_si256(table);
        let m4 = _mm_set1_epi8(0xF);
        for ib in 0..8 {
            let b = _mm_loadu_si128(qs.as_ptr().add(16 * ib) as *const __m128i);
            let lo = _mm_and_si128(b, m4);
            let hi = _mm_and_si128(_mm_srli_epi16(b, 4), m4);
            let q = _mm256_shuffle_epi8(table, _mm256_set_m128i(hi, lo));
            _mm256_storeu_si256(t.q.as_mut_ptr().add(32 * ib) as *mut __m256i, q);
        }
    }

    /// Q3_K's codes: 2-bit `(qs >> 2j) & 3`, minus 4 where the `hmask`
    /// bit is clear (element `128 n + 32 j + l`: byte `32 n + l`, bit
    /// `4 n + j` of `hmask[l]`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn q3k_codes(t: &mut Tile, qs: &[u8; 64], hmask: &[u8; 32]) {
        let hm = _mm256_loadu_si256(hmask.as_ptr() as *const __m256i);
        let (m3, four) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
        for n in 0..2 {
            let q = _mm256_loadu_si256(qs.as_ptr().add(32 * n) as *const __m256i);
            for j in 0..4 {
                let v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j as i32)), m3);
                let bit = _mm256_set1_epi8((1u8 << (4 * n + j)) as i8);
                let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
                let c = _mm256_sub_epi8(v, _mm256_and_si256(clear, four));
                let o = t.q.as_mut_ptr().add(128 * n + 32 * j) as *mut __m256i;
                _mm256_storeu_si256(o, c);
            }
        }
    }

    /// Sub-block `ib`'s IQ1 codes `8 g + delta` of four 8-byte grid points
    /// (bytes -1, 0, 1) with their delta signs.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn iq1_32(t: &mut Tile, ib: usize, g: [u64; 4], delta: [i32; 4]) {
        let g = x4(g);
        let g2 = _mm256_add_epi8(g, g);
        let g4 = _mm256_add_epi8(g2, g2);
        let g8 = _mm256_add_epi8(g4, g4);
        let d = x4(delta.map(|d| {
            if d < 0 {
                u64::MAX
            } else {
                0x0101_0101_0101_0101
            }
        }));
        let q = _mm256_add_epi8(g8, d);
        _mm256_storeu_si256(t.q.as_mut_ptr().add(32 * ib) as *mut __m256i, q);
    }
}

/// AVX-512 decoders of the i-quants: the one-row kernels' steps
/// (`simd_x86::SignedGrid`, `simd_x86::Iq1Parts`) writing the same `Tile`
/// codes and scales as the AVX2 decoders.
#[cfg(target_arch = "x86_64")]
mod simd512 {
    use super::{Tile, IQ1S_GRID};
    use crate::quant::simd_x86::{iq1_step, Iq1Parts, SignedGrid};
    use crate::quant::{BlockIQ1M, BlockIQ1S};
    use std::arch::x86_64::*;

    /// The tile's 16 scales from lanes holding each in both 16-bit halves.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn put_scales(t: &mut Tile, pairs: __m512i) {
        _mm256_storeu_si256(
            t.sc.as_mut_ptr() as *mut __m256i,
            _mm512_cvtepi32_epi16(pairs),
        );
    }

    /// Codes `±g` from the steps of a [`SignedGrid`], and its scales.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn signed<B: SignedGrid>(x: &B, t: &mut Tile) {
        let (p, scales) = x.prep();
        put_scales(t, scales);
        for j in 0..4 {
            let (g, signs) = x.step(&p, j);
            let q = _mm512_mask_sub_epi8(g, signs, _mm512_setzero_si512(), g);
            _mm512_storeu_si512(t.q.as_mut_ptr().add(64 * j) as *mut _, q);
        }
    }

    /// IQ1: codes `8 g + delta` from the steps' grid points, `delta` -1 in
    /// the 8-code groups that `neg(j)` marks, else 1.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn iq1<B: Iq1Parts>(x: &B, t: &mut Tile, neg: impl Fn(usize) -> __mmask8) {
        let (index, scales) = x.parts();
        put_scales(t, scales);
        for j in 0..4 {
            let g = iq1_step(&index, j, &IQ1S_GRID);
            let g2 = _mm512_add_epi8(g, g);
            let g4 = _mm512_add_epi8(g2, g2);
            let g8 = _mm512_add_epi8(g4, g4);
            let delta = _mm512_or_si512(_mm512_movm_epi64(neg(j)), _mm512_set1_epi8(1));
            let q = _mm512_add_epi8(g8, delta);
            _mm512_storeu_si512(t.q.as_mut_ptr().add(64 * j) as *mut _, q);
        }
    }

    /// IQ1_S: sub-block ib's delta is negative where bit 15 of `qh[ib]` is set.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn iq1_s(x: &BlockIQ1S, t: &mut Tile) {
        iq1(x, t, |j| {
            let neg = |ib: usize| (x.qh[ib] >> 15) as u8 & 1;
            (neg(2 * j) * 0x0F) | (neg(2 * j + 1) * 0xF0)
        })
    }

    /// IQ1_M: group k's delta is negative where bit 3 of nibble k of `qh`
    /// is set.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn iq1_m(x: &BlockIQ1M, t: &mut Tile) {
        let shifts = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
        iq1(x, t, |j| {
            let qh4 = u32::from_le_bytes(x.qh[4 * j..4 * j + 4].try_into().unwrap_or([0; 4]));
            let nibbles = _mm512_srlv_epi64(_mm512_set1_epi64(qh4 as i64), shifts);
            _mm512_test_epi64_mask(nibbles, _mm512_set1_epi64(8))
        })
    }
}
