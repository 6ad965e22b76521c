//! IQ2_XXS, IQ2_XS and IQ2_S against Q8_K on AVX-512 (F + BW + VL + VNNI)
//! CPUs: the i32 lanes of ggml's AVX2 `ggml_vec_dot_iq2_*_q8_K` (see
//! iq2.rs), from fewer instructions, then their float steps. IQ2_XXS
//! first; IQ2_XS and IQ2_S follow the same plan with their own index and
//! sign bits and a scale per 16 weights.
//!
//! IQ2_XXS: Per super-block the 64 bytes of
//! `qs` are read as one vector and split once into the grid indices and
//! the sign words (`vpcompressd`); the sign words become ggml's sign bytes
//! (`KSIGNS_IQ2XS`: seven stored bits and their parity), which are then
//! directly the byte masks of a masked negation of the activations, in
//! place of `_mm256_sign_epi8` against 8-byte table entries. Two 32-weight
//! sub-blocks go per step: their 8 grid points in one gather, `maddubs`,
//! and `vpdpwssd` by each sub-block's `2 * ls + 1`. The integer lanes are
//! the same sums as ggml's `sumi1 + sumi2` (exact: `maddubs` cannot
//! saturate on grid bytes of at most 43), so the result is ggml's bits.

use super::super::iq_tables::IQ2XXS_GRID;
use super::super::iq_tables::{IQ2S_GRID, IQ2XS_GRID};
use super::super::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockQ8K};
use super::iq2::scales_16;
use super::iq2::PARITY_80;
use super::{h2f, hsum_ps};
use std::arch::x86_64::*;

pub(crate) fn dot_iq2_xxs_512(_n: usize, w: &[BlockIQ2XXS], a: &[BlockQ8K]) -> f32 {
    // SAFETY: only selected when CpuCaps::has_avx512().
    unsafe { dot_iq2_xxs_vnni(w, a) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_iq2_xxs_vnni(w: &[BlockIQ2XXS], a: &[BlockQ8K]) -> f32 {
    let grid = IQ2XXS_GRID.as_ptr() as *const i64;
    let zero = _mm512_setzero_si512();
    let scale_at = half_scales();
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = h2f(x.d) * y.d;
        // Sub-block ib: u32 word 2 ib holds its four grid indices, word
        // 2 ib + 1 its four 7-bit sign fields and its 4-bit scale.
        let q = _mm512_loadu_si512(x.qs.as_ptr() as *const _);
        let index = _mm512_maskz_compress_epi32(0x5555, q);
        let sw = _mm512_maskz_compress_epi32(0xAAAA, q);
        let scales = odd_pairs(_mm512_srli_epi32(sw, 28));
        let mut signs = [0u64; 4];
        let mut indices = [0u64; 4];
        _mm256_storeu_si256(
            signs.as_mut_ptr() as *mut __m256i,
            _mm512_castsi512_si256(sign_bytes(sw)),
        );
        _mm256_storeu_si256(
            indices.as_mut_ptr() as *mut __m256i,
            _mm512_castsi512_si256(index),
        );
        let mut sumi = _mm512_setzero_si512();
        for (j, scale_j) in scale_at.iter().enumerate() {
            let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(64 * j) as *const _);
            let q8s = _mm512_mask_sub_epi8(q8, signs[j], zero, q8);
            let gi = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128(indices[j] as i64));
            let g = _mm512_i64gather_epi64::<8>(gi, grid);
            let dot = _mm512_maddubs_epi16(g, q8s);
            sumi = _mm512_dpwssd_epi32(sumi, dot, _mm512_permutexvar_epi32(*scale_j, scales));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), halves(sumi), acc);
    }
    0.125 * hsum_ps(acc)
}

/// ggml's sign bytes (`KSIGNS_IQ2XS`) of the sign words in `sw`: byte `l`
/// of each 32-bit lane is its bits `7 l..7 l + 7`, with their parity as
/// bit 7 (the eighth sign, which makes the minus signs even in number).
/// Bits 28.. of each lane (a scale) are ignored.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn sign_bytes(sw: __m512i) -> __m512i {
    let low4 = _mm512_set1_epi8(0x0F);
    let parity = _mm512_broadcast_i32x4(_mm_loadu_si128(PARITY_80.as_ptr() as *const __m128i));
    let m7 = |shift: u32| _mm512_set1_epi32(0x7F << (8 * shift));
    let fields = _mm512_or_si512(
        _mm512_or_si512(
            _mm512_and_si512(sw, m7(0)),
            _mm512_and_si512(_mm512_slli_epi32(sw, 1), m7(1)),
        ),
        _mm512_or_si512(
            _mm512_and_si512(_mm512_slli_epi32(sw, 2), m7(2)),
            _mm512_and_si512(_mm512_slli_epi32(sw, 3), m7(3)),
        ),
    );
    let odd = _mm512_xor_si512(
        _mm512_shuffle_epi8(parity, _mm512_and_si512(fields, low4)),
        _mm512_shuffle_epi8(parity, _mm512_and_si512(_mm512_srli_epi16(fields, 4), low4)),
    );
    _mm512_or_si512(fields, odd)
}

pub(crate) fn dot_iq2_xs_512(_n: usize, w: &[BlockIQ2XS], a: &[BlockQ8K]) -> f32 {
    // SAFETY: only selected when CpuCaps::has_avx512().
    unsafe { dot_iq2_xs_vnni(w, a) }
}

pub(crate) fn dot_iq2_s_512(_n: usize, w: &[BlockIQ2S], a: &[BlockQ8K]) -> f32 {
    // SAFETY: only selected when CpuCaps::has_avx512().
    unsafe { dot_iq2_s_vnni(w, a) }
}

/// Step j's scales for a scale per 16 weights (4 lanes each): 4j, 4j + 1,
/// 4j + 2, 4j + 3.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn quarter_scales() -> [__m512i; 4] {
    std::array::from_fn(|j| {
        let j = 4 * j as i32;
        let (a, b, c, d) = (j, j + 1, j + 2, j + 3);
        _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d)
    })
}

/// The 16 scales `2 s + 1` of an IQ2_XS / IQ2_S block, one per 16 weights
/// in weight order, each in both 16-bit halves of a 32-bit lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn scale_pairs(scales: &[u8; 8]) -> __m512i {
    let s = _mm512_cvtepu8_epi32(scales_16(scales));
    _mm512_or_si512(s, _mm512_slli_epi32(s, 16))
}

/// IQ2_XS: each 16-bit `qs` word is a 9-bit grid index and 7 sign bits
/// (ggml's `KSIGNS_IQ2XS` parity as the eighth).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_iq2_xs_vnni(w: &[BlockIQ2XS], a: &[BlockQ8K]) -> f32 {
    let grid = IQ2XS_GRID.as_ptr() as *const i64;
    let zero = _mm512_setzero_si512();
    let parity = _mm512_broadcast_i32x4(_mm_loadu_si128(PARITY_80.as_ptr() as *const __m128i));
    let scale_at = quarter_scales();
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = h2f(x.d) * y.d;
        let q = _mm512_loadu_si512(x.qs.as_ptr() as *const _);
        let mut index = [0u16; 32];
        _mm512_storeu_si512(
            index.as_mut_ptr() as *mut _,
            _mm512_and_si512(q, _mm512_set1_epi16(511)),
        );
        // The seven sign bits, and their parity as bit 7: the xor folds
        // bits 4-6 onto 0-2, the shuffle reads 4-bit parity.
        let partial = _mm512_srli_epi16(q, 9);
        let folded = _mm512_xor_si512(partial, _mm512_srli_epi16(q, 13));
        let full = _mm512_or_si512(partial, _mm512_shuffle_epi8(parity, folded));
        let mut signs = [0u64; 4];
        _mm256_storeu_si256(
            signs.as_mut_ptr() as *mut __m256i,
            _mm512_cvtepi16_epi8(full),
        );
        let scales = scale_pairs(&x.scales);
        let mut sumi = _mm512_setzero_si512();
        for (j, scale_j) in scale_at.iter().enumerate() {
            let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(64 * j) as *const _);
            let q8s = _mm512_mask_sub_epi8(q8, signs[j], zero, q8);
            let gi =
                _mm512_cvtepu16_epi64(_mm_loadu_si128(index.as_ptr().add(8 * j) as *const __m128i));
            let g = _mm512_i64gather_epi64::<8>(gi, grid);
            let dot = _mm512_maddubs_epi16(g, q8s);
            sumi = _mm512_dpwssd_epi32(sumi, dot, _mm512_permutexvar_epi32(*scale_j, scales));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), halves(sumi), acc);
    }
    0.125 * hsum_ps(acc)
}

/// IQ2_S: group k's 10-bit index is `qs[k]` and 2 bits of `qh`; the sign
/// bits (one per weight) follow the indices in `qs`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_iq2_s_vnni(w: &[BlockIQ2S], a: &[BlockQ8K]) -> f32 {
    let grid = IQ2S_GRID.as_ptr() as *const i64;
    let zero = _mm512_setzero_si512();
    let shifts = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    let scale_at = quarter_scales();
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = h2f(x.d) * y.d;
        let scales = scale_pairs(&x.scales);
        let mut sumi = _mm512_setzero_si512();
        for (j, scale_j) in scale_at.iter().enumerate() {
            let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(64 * j) as *const _);
            let s = u64::from_le_bytes(x.qs[32 + 8 * j..40 + 8 * j].try_into().unwrap_or([0; 8]));
            let q8s = _mm512_mask_sub_epi8(q8, s, zero, q8);
            // Group k of the two sub-blocks: bits 2k, 2k + 1 of these qh bytes.
            let qh = u16::from_le_bytes([x.qh[2 * j], x.qh[2 * j + 1]]);
            let high = _mm512_srlv_epi64(_mm512_set1_epi64(qh as i64), shifts);
            let high = _mm512_slli_epi64(_mm512_and_si512(high, _mm512_set1_epi64(3)), 8);
            let low =
                _mm512_cvtepu8_epi64(_mm_loadl_epi64(x.qs.as_ptr().add(8 * j) as *const __m128i));
            let g = _mm512_i64gather_epi64::<8>(_mm512_or_si512(low, high), grid);
            let dot = _mm512_maddubs_epi16(g, q8s);
            sumi = _mm512_dpwssd_epi32(sumi, dot, _mm512_permutexvar_epi32(*scale_j, scales));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), halves(sumi), acc);
    }
    0.125 * hsum_ps(acc)
}

/// Step j's scales: sub-block 2j's in the low 8 lanes, 2j + 1's above.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn half_scales() -> [__m512i; 4] {
    std::array::from_fn(|j| {
        let j = 2 * j as i32;
        _mm512_inserti64x4(_mm512_set1_epi32(j), _mm256_set1_epi32(j + 1), 1)
    })
}

/// `2 s + 1` in both 16-bit halves of each 32-bit lane, for `vpdpwssd`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn odd_pairs(s: __m512i) -> __m512i {
    let s = _mm512_add_epi32(_mm512_slli_epi32(s, 1), _mm512_set1_epi32(1));
    _mm512_or_si512(s, _mm512_slli_epi32(s, 16))
}

/// ggml's `sumi1 + sumi2`: the even and the odd sub-blocks' lanes added.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn halves(v: __m512i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_add_epi32(
        _mm512_castsi512_si256(v),
        _mm512_extracti64x4_epi64(v, 1),
    ))
}
