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

/// Two NVFP4 rows against one activation row on AVX-512 CPUs, each row
/// with [`dot_nvfp4_with`]'s bits at the AVX-512 level (its `Vnni` lanes,
/// its FMA chain): row 0 in the low 256 bits of every vector, row 1 in the
/// high. The one-row kernel waits on its chain's two FMAs per block; two
/// chains side by side, decoded and multiplied in 512-bit steps, do not.
pub(crate) fn pair_nvfp4_512(
    _n: usize,
    w0: &[BlockNVFP4],
    w1: &[BlockNVFP4],
    a: &[BlockQ8_0],
) -> [f32; 2] {
    // SAFETY: only selected when CpuCaps::has_avx512().
    unsafe { pair_nvfp4_vnni(w0, w1, a) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pair_nvfp4_vnni(w0: &[BlockNVFP4], w1: &[BlockNVFP4], a: &[BlockQ8_0]) -> [f32; 2] {
    let lut = _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i));
    let m4 = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    // The 128-bit lanes of the decoded rows are (row 0: sub-blocks 0|1,
    // 2|3; row 1: the same) split by `unpack*_epi64` into even and odd
    // sub-blocks; these pick sub-blocks 0, 1 of both rows, then 2, 3.
    let pick01 = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let pick23 = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    let s01 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 4, 4, 4, 4, 5, 5, 5, 5);
    let s23 = _mm512_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3, 6, 6, 6, 6, 7, 7, 7, 7);
    // `Vnni::i8_pairs` on both rows: |x| against y negated where x < 0.
    let pairs = |x: __m512i, y: __m512i| {
        let sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), zero, y);
        _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, _mm512_abs_epi8(x), sy))
    };
    let mut acc = _mm512_setzero_ps();
    for ((x0, x1), y) in w0.iter().zip(w1).zip(a.chunks_exact(2)) {
        let bits = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(x0.qs.as_ptr() as *const __m256i)),
            _mm256_loadu_si256(x1.qs.as_ptr() as *const __m256i),
            1,
        );
        let lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(bits, m4));
        let hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4));
        let (even, odd) = (_mm512_unpacklo_epi64(lo, hi), _mm512_unpackhi_epi64(lo, hi));
        let q01 = _mm512_permutex2var_epi64(even, pick01, odd);
        let q23 = _mm512_permutex2var_epi64(even, pick23, odd);
        let y0 = _mm512_broadcast_i64x4(_mm256_loadu_si256(y[0].qs.as_ptr() as *const __m256i));
        let y1 = _mm512_broadcast_i64x4(_mm256_loadu_si256(y[1].qs.as_ptr() as *const __m256i));
        // ggml's s0..s3 of each row: ue * d of the activation block.
        let h = y[0].d.to_bits() as u32 | (y[1].d.to_bits() as u32) << 16;
        let dy = _mm_cvtph_ps(_mm_cvtsi32_si128(h as i32));
        let dy = _mm256_broadcast_ps(&_mm_unpacklo_ps(dy, dy));
        let s = _mm256_mul_ps(_mm256_set_m128(ue4m3_x4(x1.d), ue4m3_x4(x0.d)), dy);
        let s = _mm512_castps256_ps512(s);
        acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(s01, s), pairs(q01, y0), acc);
        acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(s23, s), pairs(q23, y1), acc);
    }
    [
        hsum_ps(_mm512_castps512_ps256(acc)),
        hsum_ps(_mm512_extractf32x8_ps(acc, 1)),
    ]
}
