//! AVX2 tile kernels of IQ2_XXS, IQ2_XS and IQ2_S: several weight rows
//! against several Q8_K activation rows, each pair bit-identical to the
//! one-row kernels in `iq2` (the kernels ggml runs on AVX2 and AVX-512).
//!
//! The one-row kernels spend most of their time decoding a block (grid
//! look-ups, sign bits, scales) that a tile uses for every activation row.
//! Here each block of a group of weight rows is decoded once, into signed
//! grid bytes (`±grid`, at most 43 in magnitude) and the `2 * ls + 1` i16
//! scale vectors of its 8 sub-blocks, and every activation row of the tile
//! then costs three integer ops per 32 weights: with `u = q8 + 128` (an
//! unsigned byte), `madd(maddubs(u, w), sc)` is `sc * (q8 . w) + sc *
//! (128 . w)`, and the second term, fixed per weight block, is taken off
//! once. Nothing saturates (`2 * 255 * 43 < 2^15`), so every i32 lane is
//! exactly the one-row kernel's lane (the scaled sum of weights `4k..4k + 4`
//! of every sub-block); the float side is the same `_mm256_fmadd_ps` per
//! block into the pair's own accumulator and the same `0.125 * hsum` at the
//! end, so the results are the same bits.

use super::super::iq_tables::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use super::super::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockQ8K};
use super::iq2::{scales_16, sign_masks, u64x4, KEVEN_SIGNS, PARITY_80};
use super::{h2f, hsum_ps, load32, prefetch_rows, scale_pair, tile_shape};
use half::f16;
use std::arch::x86_64::*;

/// One decoded block: per sub-block the signed grid bytes (weight order)
/// and the i16 scales of `madd` (one per two weights).
struct Decoded {
    w: [__m256i; 8],
    sc: [__m256i; 8],
}

/// A block type the tile kernel can decode.
trait Iq2Tile: Copy {
    fn d(&self) -> f16;
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    unsafe fn decode(&self, out: &mut Decoded);
}

impl Iq2Tile for BlockIQ2XXS {
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn decode(&self, out: &mut Decoded) {
        decode_xxs(self, out)
    }
}

impl Iq2Tile for BlockIQ2XS {
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn decode(&self, out: &mut Decoded) {
        decode_xs(self, out)
    }
}

impl Iq2Tile for BlockIQ2S {
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn decode(&self, out: &mut Decoded) {
        decode_s(self, out)
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_xxs(x: &BlockIQ2XXS, out: &mut Decoded) {
    for ib in 0..8 {
        let (a0, a1) = x.aux(ib);
        let g = u64x4([0, 1, 2, 3].map(|l| IQ2XXS_GRID[(a0 >> (8 * l)) as usize & 255]));
        let s = u64x4([0, 1, 2, 3].map(|l| KEVEN_SIGNS[(a1 >> (7 * l)) as usize & 127]));
        out.w[ib] = _mm256_sign_epi8(g, s);
        out.sc[ib] = _mm256_set1_epi16(2 * (a1 >> 28) as i16 + 1);
    }
}

/// `dot_iq2_xs_avx2`'s decoding, one block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_xs(x: &BlockIQ2XS, out: &mut Decoded) {
    let mone = _mm256_set1_epi8(1);
    let spread_1 = _mm256_set_epi64x(
        0x0606_0606_0606_0606,
        0x0404_0404_0404_0404,
        0x0202_0202_0202_0202,
        0,
    );
    let spread_2 = _mm256_add_epi8(spread_1, _mm256_set1_epi8(8));
    let parity = _mm256_broadcastsi128_si256(_mm_loadu_si128(PARITY_80.as_ptr() as *const __m128i));
    let m511 = _mm256_set1_epi16(511);
    let scales = scales_16(&x.scales);
    for ib in (0..8).step_by(4) {
        let q2 = _mm256_loadu_si256(x.qs.as_ptr().add(4 * ib) as *const __m256i);
        let mut gindex = [0u16; 16];
        _mm256_storeu_si256(
            gindex.as_mut_ptr() as *mut __m256i,
            _mm256_and_si256(q2, m511),
        );
        let partial = _mm256_srli_epi16(q2, 9);
        let folded = _mm256_xor_si256(partial, _mm256_srli_epi16(q2, 13));
        let full = _mm256_or_si256(partial, _mm256_shuffle_epi8(parity, folded));
        let full_1 = _mm256_permute2x128_si256(full, full, 0x00);
        let full_2 = _mm256_permute2x128_si256(full, full, 0x11);
        let signs = [
            (full_1, spread_1),
            (full_1, spread_2),
            (full_2, spread_1),
            (full_2, spread_2),
        ]
        .map(|(f, s)| _mm256_or_si256(sign_masks(f, s), mone));
        for k in 0..4 {
            let g = u64x4([0, 1, 2, 3].map(|l| IQ2XS_GRID[gindex[4 * k + l] as usize & 511]));
            out.w[ib + k] = _mm256_sign_epi8(g, signs[k]);
            let sc = _mm_shuffle_epi8(scales, scale_pair(ib + k));
            out.sc[ib + k] = _mm256_cvtepi8_epi16(sc);
        }
    }
}

/// `dot_iq2_s_avx2`'s decoding, one block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_s(x: &BlockIQ2S, out: &mut Decoded) {
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let m4 = _mm_set1_epi8(0xF);
    let aux = u64::from_le_bytes(x.scales);
    let s8 = _mm_and_si128(_mm_set_epi64x((aux >> 4) as i64, aux as i64), m4);
    let s8 = _mm_add_epi8(_mm_slli_epi16(s8, 1), _mm_set1_epi8(1));
    let scales16 = _mm256_cvtepi8_epi16(s8);
    for sb in 0..8 {
        let qh = x.qh[sb] as usize;
        let g = u64x4(
            [0, 1, 2, 3]
                .map(|l| IQ2S_GRID[x.qs[4 * sb + l] as usize | ((qh << (8 - 2 * l)) & 0x300)]),
        );
        let s4 = u32::from_le_bytes(x.qs[32 + 4 * sb..36 + 4 * sb].try_into().unwrap_unchecked());
        let s = sign_masks(_mm256_set1_epi32(s4 as i32), spread);
        out.w[sb] = _mm256_sub_epi8(_mm256_xor_si256(s, g), s);
        let pick = _mm256_set1_epi16((((2 * sb + 1) << 8) | (2 * sb)) as i16);
        out.sc[sb] = _mm256_shuffle_epi8(scales16, pick);
    }
}

/// Activation rows per pass over a row group's blocks (the accumulators of
/// `ROWS x TB` pairs live on the stack).
const TB: usize = 16;
/// Weight rows decoded together: each activation load serves all of them.
const ROWS: usize = 4;

/// `R` weight rows (`w + r * nb`) against `nt <= TB` activation rows
/// (`a + t * nb`), writing `out[t * ld + r]`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group<B: Iq2Tile, const R: usize>(
    nb: usize,
    w: *const B,
    a: *const BlockQ8K,
    nt: usize,
    out: *mut f32,
    ld: usize,
) {
    debug_assert!(nt <= TB);
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); R]; TB];
    let mut dec: [Decoded; R] = std::array::from_fn(|_| Decoded {
        w: [zero; 8],
        sc: [zero; 8],
    });
    let bias = _mm256_set1_epi8(-128);
    for b in 0..nb {
        let mut dw = [0f32; R];
        // Minus the `128 . w` term of every sub-block, scaled.
        let mut neg = [zero; R];
        for r in 0..R {
            let x = &*w.add(r * nb + b);
            x.decode(&mut dec[r]);
            dw[r] = h2f(x.d());
            let mut c = zero;
            for j in 0..8 {
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(bias, dec[r].w[j]), dec[r].sc[j]);
                c = _mm256_add_epi32(c, p);
            }
            neg[r] = _mm256_sub_epi32(zero, c);
        }
        for (t, acc) in acc.iter_mut().enumerate().take(nt) {
            let y = &*a.add(t * nb + b);
            let mut s = neg;
            for j in 0..8 {
                let u = _mm256_xor_si256(load32(&y.qs[32 * j..]), bias);
                for r in 0..R {
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, dec[r].w[j]), dec[r].sc[j]);
                    s[r] = _mm256_add_epi32(s[r], p);
                }
            }
            for r in 0..R {
                let d = _mm256_set1_ps(dw[r] * y.d);
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s[r]), acc[r]);
            }
        }
    }
    for (t, acc) in acc.iter().enumerate().take(nt) {
        for (r, &v) in acc.iter().enumerate() {
            *out.add(t * ld + r) = 0.125 * hsum_ps(v);
        }
    }
}

/// `out[t * nr + r] = dot(row r of w, row t of a)` (rows of `nb` blocks).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<B: Iq2Tile>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
    if !tile_shape(nb, w.len(), a.len(), out.len()) {
        return;
    }
    let (nr, nt) = (w.len() / nb, a.len() / nb);
    let o = out.as_mut_ptr();
    for t0 in (0..nt).step_by(TB) {
        let tn = TB.min(nt - t0);
        let at = a.as_ptr().add(t0 * nb);
        let mut r0 = 0;
        while r0 < nr {
            let wr = w.as_ptr().add(r0 * nb);
            let ot = o.add(t0 * nr + r0);
            if t0 == 0 {
                prefetch_rows(w.as_ptr().wrapping_add((r0 + ROWS) * nb), ROWS * nb);
            }
            if nr - r0 >= ROWS {
                group::<B, ROWS>(nb, wr, at, tn, ot, nr);
                r0 += ROWS;
            } else {
                group::<B, 1>(nb, wr, at, tn, ot, nr);
                r0 += 1;
            }
        }
    }
}

macro_rules! iq2_tile_wrapper {
    ($name:ident, $w:ty) => {
        pub(crate) fn $name(nb: usize, w: &[$w], a: &[BlockQ8K], out: &mut [f32]) {
            // SAFETY: only selected when CpuCaps::has_avx2() (see module
            // docs of `simd_x86`); `tile` checks the lengths.
            unsafe { tile(nb, w, a, out) }
        }
    };
}

iq2_tile_wrapper!(tile_iq2_xxs, BlockIQ2XXS);
iq2_tile_wrapper!(tile_iq2_xs, BlockIQ2XS);
iq2_tile_wrapper!(tile_iq2_s, BlockIQ2S);
