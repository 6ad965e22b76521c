//! AVX2 kernels of IQ2_XXS, IQ2_XS and IQ2_S against Q8_K: ggml's x86
//! `ggml_vec_dot_iq2_*_q8_K` AVX2 paths, which are also what ggml runs on
//! AVX-512 CPUs (it has no wider variant of these). On AVX-512 CPUs
//! longhaul runs grid_512.rs instead: the same integer lanes and float
//! steps from gathers and masks, so the same bits in less time.
//!
//! Each 32-weight sub-block becomes four grid points (`_mm256_set_epi64x`),
//! the signs are applied to the activations, `maddubs` pairs the unsigned
//! grid bytes with them and `madd` applies the `2 * ls + 1` scale per 16
//! weights. The integer lanes are exact (grid bytes are at most 43, so no
//! `maddubs` saturation), so lane `k` of a block's sum is the scaled sum of
//! weights `4k..4k + 4` of every sub-block, as in ggml; then one
//! `_mm256_fmadd_ps` per block, ggml's `hsum_float_8` and `0.125 *` at the
//! end give ggml's float result bit for bit.

use super::super::iq_tables::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use super::super::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockQ8K};
use super::{h2f, hsum_ps, load32, scale_pair};
use std::arch::x86_64::*;

safe_wrapper!(dot_iq2_xxs, dot_iq2_xxs_avx2, BlockIQ2XXS, BlockQ8K);
safe_wrapper!(dot_iq2_xs, dot_iq2_xs_avx2, BlockIQ2XS, BlockQ8K);
safe_wrapper!(dot_iq2_s, dot_iq2_s_avx2, BlockIQ2S, BlockQ8K);

/// ggml's `keven_signs_q2xs`: entry `k` is the 8 bytes +1 / -1 of the sign
/// byte `KSIGNS_IQ2XS[k]` (bit `j` set: byte `j` is -1).
pub(super) static KEVEN_SIGNS: [u64; 128] = keven_signs();

const fn keven_signs() -> [u64; 128] {
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
}

/// 0x80 where the 4-bit index has an odd number of set bits (ggml's
/// `k_bit_helper`): the eighth sign bit of IQ2_XS, whose minus signs are
/// even in number.
pub(super) static PARITY_80: [u8; 16] = parity_80();

const fn parity_80() -> [u8; 16] {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = ((i as u32).count_ones() as u8 & 1) << 7;
        i += 1;
    }
    t
}

/// Four u64 (grid points, sign vectors) as one vector, `g[0]` lowest.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn u64x4(g: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq2_xxs_avx2(w: &[BlockIQ2XXS], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = h2f(x.d) * y.d;
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            let q8_1 = load32(&y.qs[32 * ib..]);
            let q8_2 = load32(&y.qs[32 * ib + 32..]);
            let (a0, a1) = x.aux(ib);
            let (a2, a3) = x.aux(ib + 1);
            let grid =
                |a: u32| u64x4([0, 1, 2, 3].map(|l| IQ2XXS_GRID[(a >> (8 * l)) as usize & 255]));
            let signs =
                |a: u32| u64x4([0, 1, 2, 3].map(|l| KEVEN_SIGNS[(a >> (7 * l)) as usize & 127]));
            let dot1 = _mm256_maddubs_epi16(grid(a0), _mm256_sign_epi8(q8_1, signs(a1)));
            let dot2 = _mm256_maddubs_epi16(grid(a2), _mm256_sign_epi8(q8_2, signs(a3)));
            let ls1 = (a1 >> 28) as i16;
            let ls2 = (a3 >> 28) as i16;
            let p1 = _mm256_madd_epi16(dot1, _mm256_set1_epi16(2 * ls1 + 1));
            let p2 = _mm256_madd_epi16(dot2, _mm256_set1_epi16(2 * ls2 + 1));
            sumi1 = _mm256_add_epi32(sumi1, p1);
            sumi2 = _mm256_add_epi32(sumi2, p2);
        }
        let sumi = _mm256_add_epi32(sumi1, sumi2);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    0.125 * hsum_ps(acc)
}

/// The 16 scales `2 * nibble + 1` of an IQ2_XS / IQ2_S block as bytes, one
/// per 16 weights in weight order (low nibble of `scales[ib]`, then high).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scales_16(scales: &[u8; 8]) -> __m128i {
    let m4 = _mm_set1_epi8(0xF);
    let s = _mm_set1_epi64x(i64::from_le_bytes(*scales));
    let s = _mm_unpacklo_epi8(
        _mm_and_si128(s, m4),
        _mm_and_si128(_mm_srli_epi16(s, 4), m4),
    );
    _mm_add_epi8(_mm_slli_epi16(s, 1), _mm_set1_epi8(1))
}

/// Per-weight sign masks of 32 weights: output byte `j` is 0xFF where bit
/// `j % 8` of the sign byte `spread[j]` picks from `signs` (within its
/// 128-bit lane) is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn sign_masks(signs: __m256i, spread: __m256i) -> __m256i {
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(
        _mm256_and_si256(_mm256_shuffle_epi8(signs, spread), bit),
        bit,
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq2_xs_avx2(w: &[BlockIQ2XS], a: &[BlockQ8K]) -> f32 {
    let mone = _mm256_set1_epi8(1);
    // Bytes 0, 2, 4, 6 (then 8, 10, 12, 14) of each 128-bit lane, each
    // repeated 8 times: the sign bytes of 4 groups of the u16 lanes below.
    let spread_1 = _mm256_set_epi64x(
        0x0606_0606_0606_0606,
        0x0404_0404_0404_0404,
        0x0202_0202_0202_0202,
        0,
    );
    let spread_2 = _mm256_add_epi8(spread_1, _mm256_set1_epi8(8));
    let parity = _mm256_broadcastsi128_si256(_mm_loadu_si128(PARITY_80.as_ptr() as *const __m128i));
    let m511 = _mm256_set1_epi16(511);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = h2f(x.d) * y.d;
        let scales = scales_16(&x.scales);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(4) {
            let q2 = _mm256_loadu_si256(x.qs.as_ptr().add(4 * ib) as *const __m256i);
            let mut gindex = [0u16; 16];
            _mm256_storeu_si256(
                gindex.as_mut_ptr() as *mut __m256i,
                _mm256_and_si256(q2, m511),
            );
            // Seven stored sign bits, and their parity as the eighth: the
            // xor folds bits 4-6 onto 0-2, the shuffle reads 4-bit parity.
            let partial = _mm256_srli_epi16(q2, 9);
            let folded = _mm256_xor_si256(partial, _mm256_srli_epi16(q2, 13));
            let full = _mm256_or_si256(partial, _mm256_shuffle_epi8(parity, folded));
            let full_1 = _mm256_permute2x128_si256(full, full, 0x00);
            let full_2 = _mm256_permute2x128_si256(full, full, 0x11);
            let q8s = [
                (full_1, spread_1),
                (full_1, spread_2),
                (full_2, spread_1),
                (full_2, spread_2),
            ]
            .map(|(f, s)| _mm256_or_si256(sign_masks(f, s), mone));
            let mut dot = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let g = u64x4([0, 1, 2, 3].map(|l| IQ2XS_GRID[gindex[4 * k + l] as usize & 511]));
                let q8 = _mm256_sign_epi8(load32(&y.qs[32 * (ib + k)..]), q8s[k]);
                let sc = _mm_shuffle_epi8(scales, scale_pair(ib + k));
                dot[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(g, q8), _mm256_cvtepi8_epi16(sc));
            }
            sumi1 = _mm256_add_epi32(sumi1, dot[0]);
            sumi2 = _mm256_add_epi32(sumi2, dot[1]);
            sumi1 = _mm256_add_epi32(sumi1, dot[2]);
            sumi2 = _mm256_add_epi32(sumi2, dot[3]);
        }
        let sumi = _mm256_add_epi32(sumi1, sumi2);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    0.125 * hsum_ps(acc)
}

/// ggml's `get_scale_shuffle_k4(sb)`: i16 lane `sb` of each 128-bit half,
/// repeated (bytes `2sb`, `2sb + 1` throughout).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_pick_k4(sb: usize) -> __m256i {
    _mm256_loadu_si256(SCALE_K4[sb & 7].as_ptr() as *const __m256i)
}

static SCALE_K4: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut sb = 0;
    while sb < 8 {
        let mut j = 0;
        while j < 32 {
            t[sb][j] = (2 * sb + j % 2) as u8;
            j += 1;
        }
        sb += 1;
    }
    t
};

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq2_s_avx2(w: &[BlockIQ2S], a: &[BlockQ8K]) -> f32 {
    // Byte 0 eight times, then 1 (low lane); 2, then 3 (high lane).
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = h2f(x.d) * y.d;
        // i16 lanes: the low nibbles (lanes 0..8), then the high ones.
        let m4 = _mm_set1_epi8(0xF);
        let aux = u64::from_le_bytes(x.scales);
        let s8 = _mm_and_si128(_mm_set_epi64x((aux >> 4) as i64, aux as i64), m4);
        let s8 = _mm_add_epi8(_mm_slli_epi16(s8, 1), _mm_set1_epi8(1));
        let scales16 = _mm256_cvtepi8_epi16(s8);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            let mut p = [_mm256_setzero_si256(); 2];
            for (k, p) in p.iter_mut().enumerate() {
                let sb = ib + k;
                let qh = x.qh[sb] as usize;
                let g =
                    u64x4([0, 1, 2, 3].map(|l| {
                        IQ2S_GRID[x.qs[4 * sb + l] as usize | ((qh << (8 - 2 * l)) & 0x300)]
                    }));
                let s4 = u32::from_le_bytes(
                    x.qs[32 + 4 * sb..36 + 4 * sb].try_into().unwrap_unchecked(),
                );
                let s = sign_masks(_mm256_set1_epi32(s4 as i32), spread);
                let q8 = load32(&y.qs[32 * sb..]);
                let q8s = _mm256_sub_epi8(_mm256_xor_si256(s, q8), s);
                // ggml's `get_scale_shuffle_k4(sb)`: i16 lane `sb` of each
                // 128-bit half (the low, then the high nibble of scales[sb]).
                let sc = _mm256_shuffle_epi8(scales16, scale_pick_k4(sb));
                *p = _mm256_madd_epi16(_mm256_maddubs_epi16(g, q8s), sc);
            }
            sumi1 = _mm256_add_epi32(sumi1, p[0]);
            sumi2 = _mm256_add_epi32(sumi2, p[1]);
        }
        let sumi = _mm256_add_epi32(sumi1, sumi2);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    0.125 * hsum_ps(acc)
}
