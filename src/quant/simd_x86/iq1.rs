//! AVX2 kernels of IQ1_S and IQ1_M against Q8_K: ggml's
//! `ggml_vec_dot_iq1_s_q8_K` / `ggml_vec_dot_iq1_m_q8_K` (x86 AVX2 path),
//! with the same integer work and the same float accumulation, so the
//! results are bit-identical to ggml's:
//! - IQ1_S: one 8-lane FMA chain for the grid term and a scalar FMA chain
//!   (`accum1 += d * sumi1`, contracted by GCC) for the delta term, added
//!   as `hsum(accum) + IQ1S_DELTA * accum1`;
//! - IQ1_M: two 8-lane FMA chains, `hsum(accum1) + IQ1M_DELTA * hsum(accum2)`.
//!
//! ggml has no AVX-512 variant of these; on AVX-512 CPUs longhaul runs
//! iq1_512.rs, the same integer lanes and float steps in less time.

use super::{h2f, hsum_ps, load32};
use crate::quant::iq1::IQ1_DELTA;
use crate::quant::iq_tables::IQ1S_GRID;
use crate::quant::{BlockIQ1M, BlockIQ1S, BlockQ8K};
use std::arch::x86_64::*;

safe_wrapper!(dot_iq1_s, dot_iq1_s_avx2, BlockIQ1S, BlockQ8K);
safe_wrapper!(dot_iq1_m, dot_iq1_m_avx2, BlockIQ1M, BlockQ8K);
safe_wrapper!(dot_iq1_s_pdep, dot_iq1_s_bmi2, BlockIQ1S, BlockQ8K);
safe_wrapper!(dot_iq1_m_pdep, dot_iq1_m_bmi2, BlockIQ1M, BlockQ8K);

/// Four 8-byte grid entries, entry `i` in 64-bit lane `i`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn grid_x4(idx: [usize; 4]) -> __m256i {
    let g = |i: usize| IQ1S_GRID[idx[i]] as i64;
    _mm256_set_epi64x(g(3), g(2), g(1), g(0))
}

/// ggml's `mul_add_epi8`: `maddubs(|x|, sign(y, x))`, 16 i16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_add_epi8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// How a group of four 11-bit grid indices is put together, as four 16-bit
/// lanes of a word: `qs` holds the four low bytes, `hi` the four 3-bit high
/// parts (in its low 12 bits for IQ1_S, in the low 3 bits of each of its
/// four nibbles for IQ1_M).
trait Spread {
    /// IQ1_S: high part `l` in bits `3l..3l + 3` of `hi`.
    unsafe fn iq1_s(qs: u32, hi: u16) -> u64;
    /// IQ1_M: high part `l` in bits `4l..4l + 3` of `hi`.
    unsafe fn iq1_m(qs: u32, hi: u16) -> u64;
    /// IQ1_M: for the 8 groups of two sub-blocks (nibble `k` of `qh`, sign
    /// in its bit 3), 8 bytes of 1, or of -1 where the delta is negative.
    unsafe fn iq1_m_deltas(qh: u32) -> (__m256i, __m256i);
}

/// Shifts and masks, lane by lane.
struct Shifts;
impl Shifts {
    /// High part `l` in bits `step * l..step * l + 3` of `hi`.
    #[inline(always)]
    fn spread(qs: u32, hi: u16, step: u32) -> u64 {
        (0..4).fold(0, |p, l| {
            let i = (qs >> (8 * l)) as u64 & 0xFF | ((hi >> (step * l)) as u64 & 7) << 8;
            p | i << (16 * l)
        })
    }
}
impl Spread for Shifts {
    #[inline(always)]
    unsafe fn iq1_s(qs: u32, hi: u16) -> u64 {
        Self::spread(qs, hi, 3)
    }
    #[inline(always)]
    unsafe fn iq1_m(qs: u32, hi: u16) -> u64 {
        Self::spread(qs, hi, 4)
    }
    #[inline(always)]
    unsafe fn iq1_m_deltas(qh: u32) -> (__m256i, __m256i) {
        let (one64, mone8) = (_mm256_set1_epi64x(1), _mm256_set1_epi8(1));
        let qhv = _mm256_set1_epi64x(qh as i64);
        let half = |h: i64| {
            let bits = _mm256_srlv_epi64(qhv, _mm256_set_epi64x(15 + h, 11 + h, 7 + h, 3 + h));
            let neg = _mm256_cmpeq_epi64(_mm256_and_si256(bits, one64), one64);
            _mm256_or_si256(neg, mone8)
        };
        (half(0), half(16))
    }
}

/// BMI2's `pdep`, one per part (ggml's `__BMI2__` path). Selected only where
/// `pdep` is fast ([`CpuCaps::bmi2`](crate::quant::CpuCaps)).
struct Pdep;
impl Spread for Pdep {
    #[inline(always)]
    unsafe fn iq1_s(qs: u32, hi: u16) -> u64 {
        _pdep_u64(qs as u64, 0x00FF_00FF_00FF_00FF) | _pdep_u64(hi as u64, 0x0700_0700_0700_0700)
    }
    #[inline(always)]
    unsafe fn iq1_m(qs: u32, hi: u16) -> u64 {
        _pdep_u64(qs as u64, 0x00FF_00FF_00FF_00FF)
            | _pdep_u64(hi as u64 & 0x7777, 0x0F00_0F00_0F00_0F00)
    }
    #[inline(always)]
    unsafe fn iq1_m_deltas(qh: u32) -> (__m256i, __m256i) {
        // Sign bit `k` to bit 7 of byte `k`, each byte then widened to 8.
        let s = _pdep_u64(qh as u64 & 0x8888_8888, 0xF0F0_F0F0_F0F0_F0F0);
        let mone8 = _mm256_set1_epi8(1);
        let half = |b: u64| {
            let v = _mm256_cvtepi8_epi64(_mm_cvtsi32_si128(b as i32));
            _mm256_or_si256(v, mone8)
        };
        (half(s), half(s >> 32))
    }
}

/// The four grid entries of the indices packed by [`Spread`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn grid_packed(p: u64) -> __m256i {
    // Indices are 11 bits; the mask lets the bounds checks go.
    grid_x4(std::array::from_fn(|l| (p >> (16 * l)) as usize & 0x7FF))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq1_s_avx2(w: &[BlockIQ1S], a: &[BlockQ8K]) -> f32 {
    dot_iq1_s_with::<Shifts>(w, a)
}

#[target_feature(enable = "avx2,fma,f16c,bmi2")]
unsafe fn dot_iq1_s_bmi2(w: &[BlockIQ1S], a: &[BlockQ8K]) -> f32 {
    dot_iq1_s_with::<Pdep>(w, a)
}

#[target_feature(enable = "avx2,fma,f16c,bmi2")]
unsafe fn dot_iq1_m_bmi2(w: &[BlockIQ1M], a: &[BlockQ8K]) -> f32 {
    dot_iq1_m_with::<Pdep>(w, a)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq1_m_avx2(w: &[BlockIQ1M], a: &[BlockQ8K]) -> f32 {
    dot_iq1_m_with::<Shifts>(w, a)
}

/// Inlined into the `target_feature` functions above.
#[inline(always)]
unsafe fn dot_iq1_s_with<S: Spread>(w: &[BlockIQ1S], a: &[BlockQ8K]) -> f32 {
    let mut accum = _mm256_setzero_ps();
    let mut accum1 = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let mut sumi = _mm256_setzero_si256();
        let mut sumi1 = 0i32;
        for ib in (0..8).step_by(2) {
            let qs = u64::from_le_bytes(x.qs[4 * ib..4 * ib + 8].try_into().unwrap_or([0; 8]));
            let q1_1 = grid_packed(S::iq1_s(qs as u32, x.qh[ib]));
            let q1_2 = grid_packed(S::iq1_s((qs >> 32) as u32, x.qh[ib + 1]));
            let dot1 = mul_add_epi8(q1_1, load32(&y.qs[32 * ib..]));
            let dot2 = mul_add_epi8(q1_2, load32(&y.qs[32 * ib + 32..]));
            let (ls1, ls2) = (x.scale(ib), x.scale(ib + 1));
            let p1 = _mm256_madd_epi16(dot1, _mm256_set1_epi16(ls1 as i16));
            let p2 = _mm256_madd_epi16(dot2, _mm256_set1_epi16(ls2 as i16));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p1, p2));
            let bsum = |k: usize| y.bsums[k] as i32 + y.bsums[k + 1] as i32;
            sumi1 += bsum(2 * ib) * x.delta_sign(ib) * ls1
                + bsum(2 * ib + 2) * x.delta_sign(ib + 1) * ls2;
        }
        let d = y.d * h2f(x.d);
        accum = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), accum);
        accum1 = d.mul_add(sumi1 as f32, accum1);
    }
    hsum_ps(accum) + IQ1_DELTA * accum1
}

#[inline(always)]
unsafe fn dot_iq1_m_with<S: Spread>(w: &[BlockIQ1M], a: &[BlockQ8K]) -> f32 {
    let mask = _mm256_set1_epi16(0x7);
    let mone = _mm256_set1_epi16(1);
    let mone8 = _mm256_set1_epi8(1);
    let mtwo8 = _mm256_set1_epi8(2);
    // The 3-bit scales of the halves: words 0..4 of the low 128 bits are
    // the first halves of even sub-blocks, words 4..8 of odd ones; the high
    // 128 bits hold the second halves (`vpshufb` does not cross lanes).
    let scales_shift = _mm256_set_epi64x(9, 3, 6, 0);
    let mut accum1 = _mm256_setzero_ps();
    let mut accum2 = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let sc = u64::from_le_bytes(x.scales);
        let scales = _mm256_srlv_epi64(_mm256_set1_epi64x(sc as i64), scales_shift);
        let scales = _mm256_add_epi16(_mm256_slli_epi16(_mm256_and_si256(scales, mask), 1), mone);
        // Byte indices repeating one scale word over 8 words.
        let mut scales_idx1 = _mm256_set1_epi16(0x0100);
        let mut scales_idx2 = _mm256_add_epi8(scales_idx1, _mm256_set1_epi8(8));
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            // The two sub-blocks' 8 index bytes and 8 nibbles (group k:
            // bits 4k..4k + 4 of `qh`; bits 0..3 extend the index, bit 3 is
            // the delta's sign), read as one word each.
            let qs = u64::from_le_bytes(x.qs[4 * ib..4 * ib + 8].try_into().unwrap_or([0; 8]));
            let qh = u32::from_le_bytes(x.qh[2 * ib..2 * ib + 4].try_into().unwrap_or([0; 4]));
            let q1_1 = grid_packed(S::iq1_m(qs as u32, qh as u16));
            let q1_2 = grid_packed(S::iq1_m((qs >> 32) as u32, (qh >> 16) as u16));
            let (delta1, delta2) = S::iq1_m_deltas(qh);
            let q8_1 = load32(&y.qs[32 * ib..]);
            let q8_2 = load32(&y.qs[32 * ib + 32..]);
            let dot1 = mul_add_epi8(q1_1, q8_1);
            let dot2 = mul_add_epi8(q1_2, q8_2);
            let dot3 = _mm256_maddubs_epi16(mone8, _mm256_sign_epi8(q8_1, delta1));
            let dot4 = _mm256_maddubs_epi16(mone8, _mm256_sign_epi8(q8_2, delta2));
            let scale1 = _mm256_shuffle_epi8(scales, scales_idx1);
            let scale2 = _mm256_shuffle_epi8(scales, scales_idx2);
            scales_idx1 = _mm256_add_epi8(scales_idx1, mtwo8);
            scales_idx2 = _mm256_add_epi8(scales_idx2, mtwo8);
            let p1 = _mm256_madd_epi16(dot1, scale1);
            let p2 = _mm256_madd_epi16(dot2, scale2);
            let p3 = _mm256_madd_epi16(dot3, scale1);
            let p4 = _mm256_madd_epi16(dot4, scale2);
            sumi1 = _mm256_add_epi32(sumi1, _mm256_add_epi32(p1, p2));
            sumi2 = _mm256_add_epi32(sumi2, _mm256_add_epi32(p3, p4));
        }
        let d = _mm256_set1_ps(y.d * h2f(x.d()));
        accum1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), accum1);
        accum2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), accum2);
    }
    hsum_ps(accum1) + IQ1_DELTA * hsum_ps(accum2)
}
