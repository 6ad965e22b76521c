//! NVFP4 x Q8_0 with AVX2: ggml's x86 `ggml_vec_dot_nvfp4_q8_0` arithmetic.
//! Each 256-bit product vector holds two sub-blocks (lanes 0-3 and 4-7), each
//! lane scaled by its sub-block's `ue4m3 * d8` and accumulated with one FMA,
//! so the float order, and the result, equal ggml's.

use super::super::common::KVALUES_MXFP4;
use super::super::nvfp4::{ue4m3_to_f32_half, BlockNVFP4};
use super::super::BlockQ8_0;
use super::{hsum_ps, load32, LaneSums, Madd};
use half::f16;
use std::arch::x86_64::*;

/// The 16 bytes at `qs` as the 32 grid values of two sub-blocks in element
/// order: sub-block 0 (low nibbles, then high) in the low half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn two_sub_blocks(lut: __m128i, qs: &[u8]) -> __m256i {
    let m4 = _mm_set1_epi8(0x0F);
    let bits = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
    let lo = _mm_shuffle_epi8(lut, _mm_and_si128(bits, m4));
    let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(bits, 4), m4));
    _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi))
}

/// [`ue4m3_to_f32_half`] of every byte (ggml's `ggml_table_f32_ue4m3`).
static UE4M3_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = ue4m3_to_f32_half(i as u8);
        i += 1;
    }
    t
};

/// The four halved sub-block scales of a block, lane `s` for sub-block `s`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn ue4m3_x4(d: [u8; 4]) -> __m128 {
    let u = |i: usize| UE4M3_HALF[d[i] as usize];
    _mm_set_ps(u(3), u(2), u(1), u(0))
}

/// The lane scales `ue[s] * dy` of the two product vectors (sub-blocks 0-1
/// against the first Q8_0 block's `d0`, 2-3 against `d1`): one float
/// product per sub-block, as ggml's `s0..s3`. The halves convert together
/// from a `movd` (no dependency on a live register).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scales_x4(ue: __m128, d0: f16, d1: f16) -> (__m256, __m256) {
    let h = d0.to_bits() as u32 | (d1.to_bits() as u32) << 16;
    let dy = _mm_cvtph_ps(_mm_cvtsi32_si128(h as i32));
    let s = _mm256_castps128_ps256(_mm_mul_ps(ue, _mm_unpacklo_ps(dy, dy)));
    (
        _mm256_permutevar8x32_ps(s, _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0)),
        _mm256_permutevar8x32_ps(s, _mm256_set_epi32(3, 3, 3, 3, 2, 2, 2, 2)),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn dot_nvfp4_avx2(w: &[BlockNVFP4], a: &[BlockQ8_0]) -> f32 {
    dot_nvfp4_with::<Madd>(w, a)
}

/// The body of [`dot_nvfp4_avx2`] for either [`LaneSums`].
#[inline(always)]
pub(in super::super) unsafe fn dot_nvfp4_with<S: LaneSums>(
    w: &[BlockNVFP4],
    a: &[BlockQ8_0],
) -> f32 {
    let lut = _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a.chunks_exact(2)) {
        let p01 = S::i8_pairs(two_sub_blocks(lut, &x.qs[..16]), load32(&y[0].qs));
        let p23 = S::i8_pairs(two_sub_blocks(lut, &x.qs[16..]), load32(&y[1].qs));
        let (s01, s23) = scales_x4(ue4m3_x4(x.d), y[0].d, y[1].d);
        acc = _mm256_fmadd_ps(s01, _mm256_cvtepi32_ps(p01), acc);
        acc = _mm256_fmadd_ps(s23, _mm256_cvtepi32_ps(p23), acc);
    }
    hsum_ps(acc)
}
