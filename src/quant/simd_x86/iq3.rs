//! AVX2 kernels of IQ3_XXS and IQ3_S against Q8_K: ggml's
//! `ggml_vec_dot_iq3_xxs_q8_K` / `ggml_vec_dot_iq3_s_q8_K` (x86 AVX2 path),
//! with the same integer work and the same float accumulation (one 8-lane
//! FMA chain per row, reduced by `hsum_float_8`), so the results are
//! bit-identical to ggml's. ggml has no AVX-512 variant of these; on
//! AVX-512 CPUs longhaul runs grid_512.rs, the same integer lanes and float
//! steps in less time.

use super::{h2f, hsum_ps, load32};
use crate::quant::iq_tables::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use crate::quant::{BlockIQ3S, BlockIQ3XXS, BlockQ8K, QK_K};
use std::arch::x86_64::*;

safe_wrapper!(dot_iq3_xxs, dot_iq3_xxs_avx2, BlockIQ3XXS, BlockQ8K);
safe_wrapper!(dot_iq3_s, dot_iq3_s_avx2, BlockIQ3S, BlockQ8K);

/// ggml's `keven_signs_q2xs`: [`KSIGNS_IQ2XS`] spread to 8 bytes, -1 where
/// the bit is set and 1 elsewhere (a `_mm256_sign_epi8` operand).
pub(super) static KEVEN_SIGNS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut k = 0;
    while k < 128 {
        let s = KSIGNS_IQ2XS[k];
        let mut j = 0;
        while j < 8 {
            let b: u64 = if (s >> j) & 1 != 0 { 0xFF } else { 0x01 };
            t[k] |= b << (8 * j);
            j += 1;
        }
        k += 1;
    }
    t
};

/// Eight 4-byte grid entries, entry `i` in lane `i` (`_mm256_set_epi32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn grid_x8(grid: &[u32], idx: [usize; 8]) -> __m256i {
    let g = |i: usize| grid[idx[i]] as i32;
    _mm256_set_epi32(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0))
}

/// `sum(maddubs(grid, ±q8) * (2s + 1))` as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled_dot(q: __m256i, q8s: __m256i, ls: u16) -> __m256i {
    let dot = _mm256_maddubs_epi16(q, q8s);
    _mm256_madd_epi16(dot, _mm256_set1_epi16((2 * ls + 1) as i16))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq3_xxs_avx2(w: &[BlockIQ3XXS], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = h2f(x.d) * y.d;
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            let q8_1 = load32(&y.qs[32 * ib..]);
            let q8_2 = load32(&y.qs[32 * ib + 32..]);
            let idx = |o: usize| std::array::from_fn(|k| x.qs[8 * ib + o + k] as usize);
            let q3_1 = grid_x8(&IQ3XXS_GRID, idx(0));
            let q3_2 = grid_x8(&IQ3XXS_GRID, idx(8));
            // Both sub-blocks' scale-and-signs words in one read.
            let o = QK_K / 4 + 4 * ib;
            let aux = u64::from_le_bytes(x.qs[o..o + 8].try_into().unwrap_or([0; 8]));
            let (aux1, aux2) = (aux as u32, (aux >> 32) as u32);
            let signs = |aux: u32| {
                let s = |l: u32| KEVEN_SIGNS[(aux >> (7 * l) & 127) as usize] as i64;
                _mm256_set_epi64x(s(3), s(2), s(1), s(0))
            };
            let q8s_1 = _mm256_sign_epi8(q8_1, signs(aux1));
            let q8s_2 = _mm256_sign_epi8(q8_2, signs(aux2));
            sumi1 = _mm256_add_epi32(sumi1, scaled_dot(q3_1, q8s_1, (aux1 >> 28) as u16));
            sumi2 = _mm256_add_epi32(sumi2, scaled_dot(q3_2, q8s_2, (aux2 >> 28) as u16));
        }
        let s = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc);
    }
    0.25 * hsum_ps(acc)
}

/// The byte mask of `signs` (weight `j` of the 32 is bit `j`): 0xFF where
/// set, bytes picked by `k_mask1` and bits by `k_mask2`, as ggml does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn sign_mask(signs: u32) -> __m256i {
    let mask1 = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let mask2 = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let bits = _mm256_and_si256(
        _mm256_shuffle_epi8(_mm256_set1_epi32(signs as i32), mask1),
        mask2,
    );
    _mm256_cmpeq_epi8(bits, mask2)
}

/// `q8` negated where the 32 bits of `signs` are set (see [`sign_mask`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn apply_signs(q8: __m256i, signs: u32) -> __m256i {
    let s = sign_mask(signs);
    _mm256_sub_epi8(_mm256_xor_si256(s, q8), s)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq3_s_avx2(w: &[BlockIQ3S], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = h2f(x.d) * y.d;
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            let q8_1 = load32(&y.qs[32 * ib..]);
            let q8_2 = load32(&y.qs[32 * ib + 32..]);
            let q3_1 = grid_x8(&IQ3S_GRID, std::array::from_fn(|k| x.index(ib, k)));
            let q3_2 = grid_x8(&IQ3S_GRID, std::array::from_fn(|k| x.index(ib + 1, k)));
            let signs = |ib: usize| {
                let s = &x.signs[4 * ib..4 * ib + 4];
                u32::from_le_bytes([s[0], s[1], s[2], s[3]])
            };
            let q8s_1 = apply_signs(q8_1, signs(ib));
            let q8s_2 = apply_signs(q8_2, signs(ib + 1));
            let sc = x.scales[ib / 2] as u16;
            sumi1 = _mm256_add_epi32(sumi1, scaled_dot(q3_1, q8s_1, sc & 0xF));
            sumi2 = _mm256_add_epi32(sumi2, scaled_dot(q3_2, q8s_2, sc >> 4));
        }
        let s = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc);
    }
    hsum_ps(acc)
}
