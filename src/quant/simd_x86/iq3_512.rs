//! IQ3_XXS and IQ3_S against Q8_K on AVX-512 (F + BW + VL + VNNI) CPUs:
//! the i32 lanes of ggml's AVX2 `ggml_vec_dot_iq3_xxs_q8_K` and
//! `ggml_vec_dot_iq3_s_q8_K` (see iq3.rs) from fewer instructions, then
//! their one FMA chain and `hsum_float_8`, so ggml's bits. As in
//! iq2_512.rs: two sub-blocks per step, their 16 grid points in one gather,
//! the signs as the mask of a masked negation of the activations (the same
//! bytes as ggml's `sign` and `xor`/`sub`, -128 included), `maddubs` (grid
//! bytes of at most 62: no saturation) and `vpdpwssd` by each sub-block's
//! `2 s + 1`.

use super::iq2_512::{half_scales, halves, odd_pairs, sign_bytes};
use super::{h2f, hsum_ps};
use crate::quant::iq_tables::{IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::{BlockIQ3S, BlockIQ3XXS, BlockQ8K, QK_K};
use std::arch::x86_64::*;

pub(crate) fn dot_iq3_xxs_512(_n: usize, w: &[BlockIQ3XXS], a: &[BlockQ8K]) -> f32 {
    // SAFETY: only selected when CpuCaps::has_avx512().
    unsafe { dot_iq3_xxs_vnni(w, a) }
}

pub(crate) fn dot_iq3_s_512(_n: usize, w: &[BlockIQ3S], a: &[BlockQ8K]) -> f32 {
    // SAFETY: only selected when CpuCaps::has_avx512().
    unsafe { dot_iq3_s_vnni(w, a) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_iq3_xxs_vnni(w: &[BlockIQ3XXS], a: &[BlockQ8K]) -> f32 {
    let grid = IQ3XXS_GRID.as_ptr() as *const i32;
    let zero = _mm512_setzero_si512();
    let scale_at = half_scales();
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = h2f(x.d) * y.d;
        // After the 64 grid indices, one word per sub-block: four 7-bit
        // sign fields and the 4-bit scale.
        let sw = _mm512_zextsi256_si512(_mm256_loadu_si256(
            x.qs.as_ptr().add(QK_K / 4) as *const __m256i
        ));
        let scales = odd_pairs(_mm512_srli_epi32(sw, 28));
        let mut signs = [0u64; 4];
        _mm256_storeu_si256(
            signs.as_mut_ptr() as *mut __m256i,
            _mm512_castsi512_si256(sign_bytes(sw)),
        );
        let mut sumi = _mm512_setzero_si512();
        for (j, scale_j) in scale_at.iter().enumerate() {
            let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(64 * j) as *const _);
            let q8s = _mm512_mask_sub_epi8(q8, signs[j], zero, q8);
            let gi =
                _mm512_cvtepu8_epi32(_mm_loadu_si128(x.qs.as_ptr().add(16 * j) as *const __m128i));
            let g = _mm512_i32gather_epi32::<4>(gi, grid);
            let dot = _mm512_maddubs_epi16(g, q8s);
            sumi = _mm512_dpwssd_epi32(sumi, dot, _mm512_permutexvar_epi32(*scale_j, scales));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), halves(sumi), acc);
    }
    0.25 * hsum_ps(acc)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_iq3_s_vnni(w: &[BlockIQ3S], a: &[BlockQ8K]) -> f32 {
    let grid = IQ3S_GRID.as_ptr() as *const i32;
    let zero = _mm512_setzero_si512();
    let bit8 = _mm512_set1_epi32(256);
    let scale_at = half_scales();
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = h2f(x.d) * y.d;
        // Sub-block ib's scale: nibble ib % 2 of scales[ib / 2].
        let sc = _mm512_zextsi256_si512(_mm256_cvtepu8_epi32(_mm_cvtsi32_si128(
            i32::from_le_bytes(x.scales),
        )));
        let sc = _mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0),
            sc,
        );
        let sc = _mm512_srlv_epi32(
            sc,
            _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0),
        );
        let scales = odd_pairs(_mm512_and_si512(sc, _mm512_set1_epi32(0xF)));
        let mut sumi = _mm512_setzero_si512();
        for (j, scale_j) in scale_at.iter().enumerate() {
            let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(64 * j) as *const _);
            // Bit k of the 64 sign bits: weight k is negative.
            let s = u64::from_le_bytes(x.signs[8 * j..8 * j + 8].try_into().unwrap_or([0; 8]));
            let q8s = _mm512_mask_sub_epi8(q8, s, zero, q8);
            // Index k: qs byte k, and bit k of these two qh bytes as bit 8.
            let low =
                _mm512_cvtepu8_epi32(_mm_loadu_si128(x.qs.as_ptr().add(16 * j) as *const __m128i));
            let high = u16::from_le_bytes([x.qh[2 * j], x.qh[2 * j + 1]]);
            let gi = _mm512_mask_or_epi32(low, high, low, bit8);
            let g = _mm512_i32gather_epi32::<4>(gi, grid);
            let dot = _mm512_maddubs_epi16(g, q8s);
            sumi = _mm512_dpwssd_epi32(sumi, dot, _mm512_permutexvar_epi32(*scale_j, scales));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), halves(sumi), acc);
    }
    hsum_ps(acc)
}
