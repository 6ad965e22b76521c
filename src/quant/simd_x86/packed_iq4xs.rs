//! The kernel over IQ4_XS's interleaved layout (`quant::layout`'s
//! `iq4_xs`): groups of eight rows, one row per 32-bit lane, against Q8_K
//! activation rows, in the order of ggml's x86 `ggml_vec_dot_iq4_xs_q8_K`
//! (AVX2), which llama.cpp runs at its defaults for products of fewer than
//! eight rows (ggml does not repack IQ4_XS on x86). That kernel keeps
//! eight i32 lanes per super-block: lane `l` sums, over the eight
//! 32-value sub-blocks `j`, the products of values `32j + 4l..+4` (their
//! table values times the activation's) times the sub-block's 6-bit scale
//! minus 32; then `acc_l = fma(d_w · d_a, f32(lane_l), acc_l)` per
//! super-block, and at the end `((acc_0 + acc_4) + (acc_2 + acc_6)) +
//! ((acc_1 + acc_5) + (acc_3 + acc_7))`. Here accumulator `l` is a vector
//! whose lane `r` is row `r`'s `acc_l`, and the tree is the same adds on
//! whole vectors. Any way of computing the lanes' integers gives the same
//! bits.
//!
//! A group's super-block (1088 bytes, [`GROUP_BLOCK`]):
//!
//! - at 0, the rows' `qs` in 4-byte chunks, chunk `c` of row `r` at
//!   `(8c + r) · 4`. With `c = 4j + m`, its low nibbles are values
//!   `4m..+4` of sub-block `j` (lane `m`), its high nibbles values
//!   `16 + 4m..+4` (lane `m + 4`);
//! - at 1024, the rows' `d` (`f16`);
//! - at 1040, their `scales_h` (`u16`);
//! - at 1056, their four `scales_l` bytes.

use super::super::common::KVALUES_IQ4NL;
use super::super::layout::iq4_xs::{D, GROUP_BLOCK, SCALES_H, SCALES_L};
use super::super::BlockQ8K;
use std::arch::x86_64::*;

/// One group (`nb` super-blocks of [`GROUP_BLOCK`] bytes at `g`) against
/// `N` activation rows at once (each weight chunk decoded once for all of
/// them): row `t`'s eight products in `out[t]`, in `vec_dot`'s order.
///
/// Four table values against the activation's four go through ggml's
/// `maddubs(|v|, sign(a, v))` (at most 2 · 127 · 127 per pair, no
/// saturation), then times the sub-block's scale with `vpdpwssd`: the
/// lane's integer exactly.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F + BW + VL + VNNI; `g`
/// must hold as many group super-blocks as each of `a` holds blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot8<const N: usize>(g: &[u8], a: [&[BlockQ8K]; N], out: &mut [[f32; 8]; N]) {
    let nb = a.first().map_or(0, |a| a.len());
    debug_assert!(g.len() >= nb * GROUP_BLOCK && a.iter().all(|a| a.len() == nb));
    let table =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
    let (m4, m3) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi32(3));
    let mut acc = [[_mm256_setzero_ps(); 8]; N];
    for (b, p) in g.chunks_exact(GROUP_BLOCK).take(nb).enumerate() {
        let p = p.as_ptr();
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.add(D) as *const __m128i));
        let y: [&BlockQ8K; N] = std::array::from_fn(|t| &a[t][b]);
        // Sub-block `j`'s scale of each row, minus 32, in both i16 halves
        // of the row's lane.
        let lo = _mm256_loadu_si256(p.add(SCALES_L) as *const __m256i);
        let hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(SCALES_H) as *const __m128i));
        let mut sc = [_mm256_setzero_si256(); 8];
        for (j, sc) in sc.iter_mut().enumerate() {
            let shift = _mm_cvtsi32_si128(4 * j as i32);
            let l4 = _mm256_and_si256(_mm256_srl_epi32(lo, shift), _mm256_set1_epi32(0xF));
            let shift = _mm_cvtsi32_si128(2 * j as i32);
            let h2 = _mm256_and_si256(_mm256_srl_epi32(hi, shift), m3);
            let s = _mm256_sub_epi32(
                _mm256_or_si256(l4, _mm256_slli_epi32::<4>(h2)),
                _mm256_set1_epi32(32),
            );
            *sc = _mm256_blend_epi16::<0xAA>(s, _mm256_slli_epi32::<16>(s));
        }
        let mut lane = [[_mm256_setzero_si256(); 8]; N];
        for (j, &sc) in sc.iter().enumerate() {
            for m in 0..4 {
                let q = _mm256_loadu_si256(p.add(32 * (4 * j + m)) as *const __m256i);
                let v = [
                    _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4)),
                    _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4)),
                ];
                for (h, v) in v.into_iter().enumerate() {
                    let abs = _mm256_sign_epi8(v, v);
                    for t in 0..N {
                        let q8 = y[t].qs.as_ptr().add(32 * j + 16 * h + 4 * m) as *const i32;
                        let act = _mm256_set1_epi32(q8.read_unaligned());
                        let prod = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(act, v));
                        let l = &mut lane[t][4 * h + m];
                        *l = _mm256_dpwssd_epi32(*l, prod, sc);
                    }
                }
            }
        }
        for t in 0..N {
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(y[t].d));
            for (acc, &lane) in acc[t].iter_mut().zip(&lane[t]) {
                *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lane), *acc);
            }
        }
    }
    for t in 0..N {
        let a = &acc[t];
        let even = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
        let odd = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
        _mm256_storeu_ps(out[t].as_mut_ptr(), _mm256_add_ps(even, odd));
    }
}
