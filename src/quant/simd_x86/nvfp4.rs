//! NVFP4 x Q8_0 with AVX2: ggml's x86 `ggml_vec_dot_nvfp4_q8_0` arithmetic.
//! Each 256-bit product vector holds two sub-blocks (lanes 0-3 and 4-7), each
//! lane scaled by its sub-block's `ue4m3 * d8` and accumulated with one FMA,
//! so the float order, and the result, equal ggml's.

use super::super::common::KVALUES_MXFP4;
use super::super::nvfp4::{ue4m3_to_f32_half, BlockNVFP4};
use super::super::BlockQ8_0;
use super::{h2f, hsum_ps, load32, mul_sum_i8_pairs};
use std::arch::x86_64::*;

/// The 16 bytes at `qs` as the 32 grid values of two sub-blocks in element
/// order: sub-block 0 (low nibbles, then high) in the low half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn two_sub_blocks(lut: __m128i, qs: &[u8]) -> __m256i {
    let m4 = _mm_set1_epi8(0x0F);
    let bits = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
    let lo = _mm_shuffle_epi8(lut, _mm_and_si128(bits, m4));
    let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(bits, 4), m4));
    _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_nvfp4_avx2(w: &[BlockNVFP4], a: &[BlockQ8_0]) -> f32 {
    let lut = _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a.chunks_exact(2)) {
        let p01 = mul_sum_i8_pairs(two_sub_blocks(lut, &x.qs[..16]), load32(&y[0].qs));
        let p23 = mul_sum_i8_pairs(two_sub_blocks(lut, &x.qs[16..]), load32(&y[1].qs));
        let (dy0, dy1) = (h2f(y[0].d), h2f(y[1].d));
        let s = |i: usize, dy: f32| ue4m3_to_f32_half(x.d[i]) * dy;
        let s01 = _mm256_set_m128(_mm_set1_ps(s(1, dy0)), _mm_set1_ps(s(0, dy0)));
        let s23 = _mm256_set_m128(_mm_set1_ps(s(3, dy1)), _mm_set1_ps(s(2, dy1)));
        acc = _mm256_fmadd_ps(s01, _mm256_cvtepi32_ps(p01), acc);
        acc = _mm256_fmadd_ps(s23, _mm256_cvtepi32_ps(p23), acc);
    }
    hsum_ps(acc)
}
