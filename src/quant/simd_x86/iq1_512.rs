//! IQ1_S and IQ1_M against Q8_K on AVX-512 (F + BW + VL + VNNI) CPUs: the
//! i32 lanes of ggml's AVX2 `ggml_vec_dot_iq1_s_q8_K` and
//! `ggml_vec_dot_iq1_m_q8_K` (see iq1.rs) from fewer instructions, then
//! their float steps, so ggml's bits.
//!
//! - The 32 grid indices of a super-block (8 low bits from `qs`, 3 from
//!   `qh`) are built once, as 16-bit lanes of one vector; each step of two
//!   sub-blocks gathers its 8 grid points.
//! - ggml multiplies the grid values (-1, 0, 1) as `maddubs(|g|, sign(q,
//!   g))`. Here the grid is read with 1 added to each byte ([`GRID_PLUS_1`],
//!   0..2, unsigned), so `maddubs(g + 1, q) - maddubs(1, q)` gives the same
//!   i16 pairs `g * q` for every activation ggml's Q8_K quantiser makes
//!   (`-127..=127`; only -128, which it never makes, would differ).
//! - The delta term `maddubs(1, sign(q, delta))` is `maddubs(1, q)` negated
//!   in the i16 lanes of the groups whose delta is negative (a mask from
//!   the `qh` sign bits).
//! - `vpdpwssd` applies each 16 weights' `2 s + 1`; the two halves of the
//!   vector (the even and the odd sub-block) added at the end are ggml's
//!   `sumi1` and `sumi2` lanes.

use super::grid_512::{halves, odd_pairs, quarter_scales, sub_block_pairs};
use super::{h2f, hsum_ps};
use crate::quant::iq1::IQ1_DELTA;
use crate::quant::iq_tables::IQ1S_GRID;
use crate::quant::{BlockIQ1M, BlockIQ1S, BlockQ8K};
use std::arch::x86_64::*;

/// `IQ1S_GRID` with 1 added to each byte: values 0, 1, 2.
static GRID_PLUS_1: [u64; 2048] = grid_plus_1();

const fn grid_plus_1() -> [u64; 2048] {
    let mut t = [0u64; 2048];
    let mut i = 0;
    while i < 2048 {
        let mut b = 0;
        while b < 8 {
            let v = (IQ1S_GRID[i] >> (8 * b)) as u8 as i8;
            t[i] |= ((v + 1) as u8 as u64) << (8 * b);
            b += 1;
        }
        i += 1;
    }
    t
}

/// What both the dots here and ggml_tiled's AVX-512 decoder read of an
/// IQ1 block: its 32 grid indices (8 bits from `qs`, 3 from `qh`) and its
/// 16 scales `2 s + 1`, one per 16 codes, in both 16-bit halves of 32-bit
/// lanes.
pub(crate) trait Iq1Parts {
    /// # Safety
    /// AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C.
    unsafe fn parts(&self) -> ([u16; 32], __m512i);
}

impl Iq1Parts for BlockIQ1S {
    /// Group l of sub-block ib: high index bits `3 l..` of `qh[ib]`; the
    /// sub-block's scale in bits 12..15.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn parts(&self) -> ([u16; 32], __m512i) {
        // Group g's high bits: word g / 4 of qh, shifted by 3 (g % 4).
        let spread = _mm512_set_epi64(
            0x0007_0007_0007_0007,
            0x0006_0006_0006_0006,
            0x0005_0005_0005_0005,
            0x0004_0004_0004_0004,
            0x0003_0003_0003_0003,
            0x0002_0002_0002_0002,
            0x0001_0001_0001_0001,
            0,
        );
        let shifts = _mm512_set1_epi64(0x0009_0006_0003_0000);
        let qh = _mm512_castsi128_si512(_mm_loadu_si128(self.qh.as_ptr() as *const __m128i));
        let high = _mm512_srlv_epi16(_mm512_permutexvar_epi16(spread, qh), shifts);
        let high = _mm512_slli_epi16(_mm512_and_si512(high, _mm512_set1_epi16(7)), 8);
        let low = _mm512_cvtepu8_epi16(_mm256_loadu_si256(self.qs.as_ptr() as *const __m256i));
        let mut index = [0u16; 32];
        _mm512_storeu_si512(index.as_mut_ptr() as *mut _, _mm512_or_si512(low, high));
        let s = _mm512_zextsi256_si512(_mm256_cvtepu16_epi32(_mm_loadu_si128(
            self.qh.as_ptr() as *const __m128i
        )));
        let s = _mm512_and_si512(_mm512_srli_epi32(s, 12), _mm512_set1_epi32(7));
        (index, sub_block_pairs(s))
    }
}

impl Iq1Parts for BlockIQ1M {
    /// Group g's high index bits: the low 3 bits of nibble g of `qh`.
    /// Scale i (half i % 2 of sub-block i / 2): bits `3 (i % 4)..` of scale
    /// word i / 4.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn parts(&self) -> ([u16; 32], __m512i) {
        let m7 = _mm512_set1_epi32(7);
        // Dword i of `high` holds groups 2i and 2i + 1 as its two halves.
        let qh = _mm512_cvtepu8_epi32(_mm_loadu_si128(self.qh.as_ptr() as *const __m128i));
        let high = _mm512_or_si512(
            _mm512_slli_epi32(_mm512_and_si512(qh, m7), 8),
            _mm512_slli_epi32(_mm512_and_si512(qh, _mm512_set1_epi32(0x70)), 20),
        );
        let low = _mm512_cvtepu8_epi16(_mm256_loadu_si256(self.qs.as_ptr() as *const __m256i));
        let mut index = [0u16; 32];
        _mm512_storeu_si512(index.as_mut_ptr() as *mut _, _mm512_or_si512(low, high));
        // Dword i holds scale words 2 (i / 8) and 2 (i / 8) + 1, so scale i
        // is `16 (i / 4 % 2) + 3 (i % 4)` bits up.
        let sc = u64::from_le_bytes(self.scales);
        let words = _mm512_inserti64x4(
            _mm512_set1_epi32(sc as i32),
            _mm256_set1_epi32((sc >> 32) as i32),
            1,
        );
        let shifts = _mm512_setr_epi32(0, 3, 6, 9, 16, 19, 22, 25, 0, 3, 6, 9, 16, 19, 22, 25);
        (
            index,
            odd_pairs(_mm512_and_si512(_mm512_srlv_epi32(words, shifts), m7)),
        )
    }
}

/// Step j's 8 grid points (groups 8j..8j + 8) from `grid`: `IQ1S_GRID`, or
/// [`GRID_PLUS_1`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn iq1_step(index: &[u16; 32], j: usize, grid: &[u64; 2048]) -> __m512i {
    let gi = _mm512_cvtepu16_epi64(_mm_loadu_si128(index.as_ptr().add(8 * j) as *const __m128i));
    _mm512_i64gather_epi64::<8>(gi, grid.as_ptr() as *const i64)
}

pub(crate) fn dot_iq1_s_512(_n: usize, w: &[BlockIQ1S], a: &[BlockQ8K]) -> f32 {
    // SAFETY: only selected when CpuCaps::has_avx512().
    unsafe { dot_iq1_s_vnni(w, a) }
}

/// ggml's IQ1_S steps: one 8-lane FMA chain for the grid term and a scalar
/// FMA chain for the delta term (`d * sumi1`, its sub-block sums from the
/// activations' `bsums`), `hsum(accum) + IQ1S_DELTA * accum1`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_iq1_s_vnni(w: &[BlockIQ1S], a: &[BlockQ8K]) -> f32 {
    let ones = _mm512_set1_epi8(1);
    let scale_at = quarter_scales();
    let mut accum = _mm256_setzero_ps();
    let mut accum1 = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let (index, scales) = x.parts();
        let mut sumi = _mm512_setzero_si512();
        for (j, scale_j) in scale_at.iter().enumerate() {
            let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(64 * j) as *const _);
            let g = iq1_step(&index, j, &GRID_PLUS_1);
            let dot = _mm512_sub_epi16(_mm512_maddubs_epi16(g, q8), _mm512_maddubs_epi16(ones, q8));
            sumi = _mm512_dpwssd_epi32(sumi, dot, _mm512_permutexvar_epi32(*scale_j, scales));
        }
        let mut sumi1 = 0i32;
        for ib in 0..8 {
            let bsum = y.bsums[2 * ib] as i32 + y.bsums[2 * ib + 1] as i32;
            sumi1 += bsum * x.delta_sign(ib) * x.scale(ib);
        }
        let d = y.d * h2f(x.d);
        accum = _mm256_fmadd_ps(_mm256_set1_ps(d), halves(sumi), accum);
        accum1 = d.mul_add(sumi1 as f32, accum1);
    }
    hsum_ps(accum) + IQ1_DELTA * accum1
}

pub(crate) fn dot_iq1_m_512(_n: usize, w: &[BlockIQ1M], a: &[BlockQ8K]) -> f32 {
    // SAFETY: only selected when CpuCaps::has_avx512().
    unsafe { dot_iq1_m_vnni(w, a) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_iq1_m_vnni(w: &[BlockIQ1M], a: &[BlockQ8K]) -> f32 {
    let zero = _mm512_setzero_si512();
    let ones = _mm512_set1_epi8(1);
    let scale_at = quarter_scales();
    let mut accum1 = _mm256_setzero_ps();
    let mut accum2 = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let (index, scales) = x.parts();
        let mut sumi1 = _mm512_setzero_si512();
        let mut sumi2 = _mm512_setzero_si512();
        for (j, scale_j) in scale_at.iter().enumerate() {
            let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(64 * j) as *const _);
            let g = iq1_step(&index, j, &GRID_PLUS_1);
            let sum_q = _mm512_maddubs_epi16(ones, q8);
            let dot1 = _mm512_sub_epi16(_mm512_maddubs_epi16(g, q8), sum_q);
            // Bit 3 of nibble k of these 4 qh bytes: group k's delta is
            // negative; its 8 bytes are i16 lanes 4k..4k + 4.
            let qh4 = u32::from_le_bytes(x.qh[4 * j..4 * j + 4].try_into().unwrap_or([0; 4]));
            let neg = ((qh4 & 0x8888_8888) >> 3) * 0xF;
            let dot2 = _mm512_mask_sub_epi16(sum_q, neg, zero, sum_q);
            let scale = _mm512_permutexvar_epi32(*scale_j, scales);
            sumi1 = _mm512_dpwssd_epi32(sumi1, dot1, scale);
            sumi2 = _mm512_dpwssd_epi32(sumi2, dot2, scale);
        }
        let d = _mm256_set1_ps(y.d * h2f(x.d()));
        accum1 = _mm256_fmadd_ps(d, halves(sumi1), accum1);
        accum2 = _mm256_fmadd_ps(d, halves(sumi2), accum2);
    }
    hsum_ps(accum1) + IQ1_DELTA * hsum_ps(accum2)
}
