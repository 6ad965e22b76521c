//! AVX2 kernels over the interleaved layout of `quant::layout`: one group of
//! eight rows against one activation row, row `r` in f32 lane `r`.
//!
//! Accumulator `j` is lane `j` of the plain kernel's 8-lane chain (bytes
//! `4j..4j + 4` of each block, as `mul_sum_i8_pairs` sums them), fed by the
//! same exact integers and the same `fma(d, sum, acc)` per block, and the
//! eight are reduced by `hsum_ps`'s tree on whole vectors: each lane's result
//! is the plain kernel's bits for its row.

use super::super::BlockQ8_0;
use super::{h2f, mul_sum_i8_pairs};
use std::arch::x86_64::*;

/// Bytes of one block of eight rows: Q4_0.
const Q4_0_GROUP_BLOCK: usize = 8 * 18;
/// Bytes of one block of eight rows: Q8_0.
const Q8_0_GROUP_BLOCK: usize = 8 * 34;

/// Eight Q4_0 rows (`g`: one interleaved group of `a.len()` blocks per row)
/// against `a`.
pub(crate) fn q4_0(g: &[u8], a: &[BlockQ8_0], out: &mut [f32; 8]) {
    assert!(
        g.len() >= a.len() * Q4_0_GROUP_BLOCK,
        "interleaved Q4_0 group too short"
    );
    // SAFETY: `layout::interleaved` hands this out only when
    // CpuCaps::has_avx2(); the bounds are checked above.
    unsafe { q4_0_avx2(g, a, out) }
}

/// Eight Q8_0 rows against `a` (see [`q4_0`]).
pub(crate) fn q8_0(g: &[u8], a: &[BlockQ8_0], out: &mut [f32; 8]) {
    assert!(
        g.len() >= a.len() * Q8_0_GROUP_BLOCK,
        "interleaved Q8_0 group too short"
    );
    // SAFETY: as in `q4_0`.
    unsafe { q8_0_avx2(g, a, out) }
}

/// The eight rows' `d_w * d_a` (the plain kernels' scalar product, per lane).
#[inline(always)]
unsafe fn scales(blk: *const u8, y: &BlockQ8_0) -> __m256 {
    let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
    _mm256_mul_ps(dw, _mm256_set1_ps(h2f(y.d)))
}

/// Bytes `4j..4j + 4` of an activation block in every i32 lane.
#[inline(always)]
unsafe fn act_chunk(y: &BlockQ8_0, j: usize) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(
        y.qs.as_ptr().add(4 * j) as *const i32
    ))
}

/// `hsum_ps`'s tree over the eight lane accumulators.
#[inline(always)]
unsafe fn reduce(acc: &[__m256; 8], out: &mut [f32; 8]) {
    let s04 = _mm256_add_ps(acc[0], acc[4]);
    let s26 = _mm256_add_ps(acc[2], acc[6]);
    let s15 = _mm256_add_ps(acc[1], acc[5]);
    let s37 = _mm256_add_ps(acc[3], acc[7]);
    let r = _mm256_add_ps(_mm256_add_ps(s04, s26), _mm256_add_ps(s15, s37));
    _mm256_storeu_ps(out.as_mut_ptr(), r);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_avx2(g: &[u8], a: &[BlockQ8_0], out: &mut [f32; 8]) {
    let mut acc = [_mm256_setzero_ps(); 8];
    let (m4, eight) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(8));
    for (b, y) in a.iter().enumerate() {
        let blk = g.as_ptr().add(b * Q4_0_GROUP_BLOCK);
        let d = scales(blk, y);
        // Chunk c (bytes 4c..4c + 4 of the 16) holds elements 4c.. in its low
        // nibbles (lane c) and 16 + 4c.. in its high nibbles (lane 4 + c).
        for c in 0..4 {
            let v = _mm256_loadu_si256(blk.add(16 + 32 * c) as *const __m256i);
            let lo = _mm256_sub_epi8(_mm256_and_si256(v, m4), eight);
            let hi = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), eight);
            let plo = mul_sum_i8_pairs(lo, act_chunk(y, c));
            let phi = mul_sum_i8_pairs(hi, act_chunk(y, 4 + c));
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(plo), acc[c]);
            acc[4 + c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(phi), acc[4 + c]);
        }
    }
    reduce(&acc, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_avx2(g: &[u8], a: &[BlockQ8_0], out: &mut [f32; 8]) {
    let mut acc = [_mm256_setzero_ps(); 8];
    for (b, y) in a.iter().enumerate() {
        let blk = g.as_ptr().add(b * Q8_0_GROUP_BLOCK);
        let d = scales(blk, y);
        for (j, acc) in acc.iter_mut().enumerate() {
            let v = _mm256_loadu_si256(blk.add(16 + 32 * j) as *const __m256i);
            let p = mul_sum_i8_pairs(v, act_chunk(y, j));
            *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), *acc);
        }
    }
    reduce(&acc, out);
}
