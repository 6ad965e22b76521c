//! Kernels over Q2_K's interleaved layout (`quant::layout`'s `q2_k`):
//! groups of eight rows, one row per 32-bit lane, against Q8_K activation
//! rows, in the order of ggml's x86 `q2_K_8x8_q8_K` kernels, which
//! llama.cpp runs at its defaults on AVX-512 CPUs: per super-block and row,
//! two exact integers,
//!
//! - `isum = Σ_j scale_j · Σ_{i in sub-block j} q2_i · q8_i` and
//! - `imin = Σ_j min_j · bsums[j]` (sixteen sub-blocks of sixteen values),
//!
//! then `acc = fma(f32(isum), d_w · d_a, acc)`,
//! `acc_min = fma(f32(imin), dmin_w · d_a, acc_min)`, and at the end
//! `acc - acc_min`. That is the gemv's order; ggml's 4-row gemm takes the
//! same two sums and FMAs per 128 values (each half of the super-block)
//! instead: the kernels' `gemm` argument. Any way of computing the integers
//! gives the same bits.
//!
//! A group's super-block (672 bytes, [`GROUP_BLOCK`]): the eight rows' `d`
//! (`f16`, 16 bytes), their `dmin` (16 bytes), the scale-and-min bytes of
//! entry `8j + r` (sub-block `j`, row `r`; scale in the low nibble) at
//! `32 + 8j + r`, then the quants in 4-byte chunks, chunk `c` of row `r`
//! at `160 + (8c + r) · 4`. Bits `2s..2s + 2` of chunk `c`'s bytes are
//! values `16q + 4(c % 4)..+4` of sub-block `8h + 2s + q`, where
//! `h = c / 8` and `q = (c / 4) % 2`.

use super::super::layout::q2_k::{DMIN, GROUP_BLOCK, QS, SCALES};
use super::super::BlockQ8K;
use std::arch::x86_64::*;

/// One group (`nb` super-blocks of [`GROUP_BLOCK`] bytes at `g`) against
/// `N` activation rows at once (each weight chunk unpacked once for all of
/// them): row `t`'s eight products in `out[t]`, in the gemm's order when
/// `gemm`, else the gemv's.
///
/// A sub-block's sixteen products fit an i16 (at most 16 · 3 · 128), so
/// the two sub-blocks of one shift go as an i16 pair per row through one
/// `vpmaddwd` with their scales, and the mins in pairs of sub-blocks with
/// the activation's block sums the same way. The integers are the same
/// whatever the grouping, so are the bits.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 VL + VNNI; `g` must hold
/// as many group super-blocks as each of `a` holds blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot8<const N: usize>(
    g: &[u8],
    a: [&[BlockQ8K]; N],
    out: &mut [[f32; 8]; N],
    gemm: bool,
) {
    let nb = a.first().map_or(0, |a| a.len());
    debug_assert!(g.len() >= nb * GROUP_BLOCK && a.iter().all(|a| a.len() == nb));
    let m3 = _mm256_set1_epi8(3);
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); N];
    let mut acc_min = [_mm256_setzero_ps(); N];
    // Sub-blocks j and j + 1's scale-and-min bytes as i16 pairs per row
    // (j's low): the scales' and the mins'.
    let pairs = |p: *const u8, j: usize| {
        let byte = |j: usize| {
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(SCALES + 8 * j) as *const __m128i))
        };
        let both = _mm256_or_si256(byte(j), _mm256_slli_epi32::<16>(byte(j + 1)));
        (
            _mm256_and_si256(both, _mm256_set1_epi16(0x0F)),
            _mm256_srli_epi16::<4>(both),
        )
    };
    for b in 0..nb {
        let p = g.as_ptr().add(b * GROUP_BLOCK);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let dmw = _mm256_cvtph_ps(_mm_loadu_si128(p.add(DMIN) as *const __m128i));
        let (mut isum, mut imin) = ([zero; N], [zero; N]);
        for h in 0..2 {
            for s in 0..4 {
                let shift = _mm_cvtsi32_si128(2 * s as i32);
                // Sub-blocks 8h + 2s (q = 0) and 8h + 2s + 1 (q = 1).
                let j = 8 * h + 2 * s;
                let mut dot = [[zero; 2]; N];
                for cc in 0..8 {
                    let c = 8 * h + cc;
                    let w = _mm256_loadu_si256(p.add(QS + 32 * c) as *const __m256i);
                    let v = _mm256_and_si256(_mm256_srl_epi16(w, shift), m3);
                    let at = 128 * h + 32 * s + 4 * cc;
                    for t in 0..N {
                        let y = a[t].as_ptr().add(b);
                        let act = _mm256_set1_epi32(
                            ((*y).qs.as_ptr().add(at) as *const i32).read_unaligned(),
                        );
                        dot[t][cc / 4] = _mm256_dpbusd_epi32(dot[t][cc / 4], v, act);
                    }
                }
                let (sc, mn) = pairs(p, j);
                for t in 0..N {
                    let [d0, d1] = dot[t];
                    let d = _mm256_blend_epi16::<0xAA>(d0, _mm256_slli_epi32::<16>(d1));
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(d, sc));
                    let y = a[t].as_ptr().add(b);
                    let bs = ((*y).bsums.as_ptr().add(j) as *const i32).read_unaligned();
                    imin[t] =
                        _mm256_add_epi32(imin[t], _mm256_madd_epi16(mn, _mm256_set1_epi32(bs)));
                }
            }
            if gemm || h == 1 {
                for t in 0..N {
                    let dy = _mm256_set1_ps((*a[t].as_ptr().add(b)).d);
                    let (d, dmin) = (_mm256_mul_ps(dw, dy), _mm256_mul_ps(dmw, dy));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), d, acc[t]);
                    acc_min[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin[t]), dmin, acc_min[t]);
                    (isum[t], imin[t]) = (zero, zero);
                }
            }
        }
    }
    for t in 0..N {
        _mm256_storeu_ps(out[t].as_mut_ptr(), _mm256_sub_ps(acc[t], acc_min[t]));
    }
}
