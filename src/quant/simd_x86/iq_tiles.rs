//! Tile kernels of IQ3_XXS, IQ3_S, IQ1_S, IQ1_M and NVFP4 (AVX2, also what
//! AVX-512 machines run, as for their one-row kernels): each weight block
//! is decoded once (grid bytes, sign masks and scales into a small stack
//! buffer of vectors) and then dotted against up to [`TILE_ACTS`]
//! activation rows. Every (weight row, activation row) pair runs exactly
//! the integer operations of the one-row kernel (`iq3`, `iq1`, `nvfp4`),
//! giving the same i32 lanes, and the same float FMAs into its own
//! accumulator, reduced at the end as the one-row kernel reduces; so each
//! result is bit-identical to it.

use super::super::common::KVALUES_MXFP4;
use super::super::nvfp4::BlockNVFP4;
use super::iq3::{grid_x8, sign_mask, KEVEN_SIGNS};
use super::nvfp4::{scales_x4, two_sub_blocks};
use super::{h2f, hsum_ps, load32, mul_sum_i8_pairs, tile_shape};
use crate::quant::iq1::IQ1_DELTA;
use crate::quant::iq_tables::{IQ1S_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::{BlockIQ1M, BlockIQ1S, BlockIQ3S, BlockIQ3XXS, BlockQ8K, BlockQ8_0};
use std::arch::x86_64::*;

/// Activation rows sharing one decoded weight block.
const TILE_ACTS: usize = 8;

/// A weight block type whose blocks decode once for many activations.
trait Tiled: Sized {
    /// The activation block; a weight block spans `A_PER_W` of them.
    type A;
    const A_PER_W: usize;
    /// One decoded weight block.
    type Dec;
    /// One pair's running sums (all-zero bits are the start).
    type Acc: Copy;
    /// # Safety
    /// AVX2, FMA and F16C.
    unsafe fn decode(x: &Self) -> Self::Dec;
    /// Adds block `x` (decoded) times the activation blocks `y` to `acc`.
    /// # Safety
    /// As `decode`; `y` holds `A_PER_W` blocks.
    unsafe fn step(x: &Self::Dec, y: *const Self::A, acc: &mut Self::Acc);
    /// # Safety
    /// As `decode`.
    unsafe fn finish(acc: Self::Acc) -> f32;
}

/// `out[t * nr + r] = dot(row r of w, row t of a)`: groups of
/// [`TILE_ACTS`] activation rows (kept in cache) against every weight row,
/// each weight block decoded once per group. Inconsistent lengths write
/// nothing (the callers in `ops` check them first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn drive_tiled<W: Tiled>(nb: usize, w: &[W], a: &[W::A], out: &mut [f32]) {
    let nab = nb * W::A_PER_W;
    if !tile_shape(nb, w.len(), a.len() / W::A_PER_W, out.len())
        || !a.len().is_multiple_of(W::A_PER_W)
    {
        return;
    }
    let (nr, nt) = (w.len() / nb, a.len() / nab);
    let mut t0 = 0;
    while t0 < nt {
        let tn = (nt - t0).min(TILE_ACTS);
        let ag = a.as_ptr().add(t0 * nab);
        for (r, row) in w.chunks_exact(nb).enumerate() {
            // SAFETY: all-zero bits are the accumulators' start (0.0 lanes).
            let mut acc: [W::Acc; TILE_ACTS] = std::mem::zeroed();
            for (j, x) in row.iter().enumerate() {
                let d = W::decode(x);
                let y = ag.add(j * W::A_PER_W);
                for (t, acc) in acc[..tn].iter_mut().enumerate() {
                    W::step(&d, y.add(t * nab), acc);
                }
            }
            for (t, &acc) in acc[..tn].iter().enumerate() {
                out[(t0 + t) * nr + r] = W::finish(acc);
            }
        }
        t0 += tn;
    }
}

/// `maddubs(q, q8s)` times the scale vector `sc`, as 8 i32 lanes (the
/// one-row kernels' `scaled_dot`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled(q: __m256i, q8s: __m256i, sc: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, q8s), sc)
}

/// A decoded IQ3 block: grid bytes, sign operands, scales `2s + 1` as
/// 16-bit lanes, and the block scale.
struct Iq3Dec {
    q: [__m256i; 8],
    s: [__m256i; 8],
    sc: [__m256i; 8],
    d: f32,
}

impl Tiled for BlockIQ3XXS {
    type A = BlockQ8K;
    const A_PER_W: usize = 1;
    type Dec = Iq3Dec;
    type Acc = __m256;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(x: &Self) -> Iq3Dec {
        let mut dec = Iq3Dec {
            q: [_mm256_setzero_si256(); 8],
            s: [_mm256_setzero_si256(); 8],
            sc: [_mm256_setzero_si256(); 8],
            d: h2f(x.d),
        };
        for ib in 0..8 {
            dec.q[ib] = grid_x8(
                &IQ3XXS_GRID,
                std::array::from_fn(|k| x.qs[8 * ib + k] as usize),
            );
            let aux = x.aux(ib);
            let s = |l: u32| KEVEN_SIGNS[(aux >> (7 * l) & 127) as usize] as i64;
            dec.s[ib] = _mm256_set_epi64x(s(3), s(2), s(1), s(0));
            dec.sc[ib] = _mm256_set1_epi16((2 * (aux >> 28) as u16 + 1) as i16);
        }
        dec
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(x: &Iq3Dec, y: *const BlockQ8K, acc: &mut __m256) {
        let y = &*y;
        let d = x.d * y.d;
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            let q8s_1 = _mm256_sign_epi8(load32(&y.qs[32 * ib..]), x.s[ib]);
            let q8s_2 = _mm256_sign_epi8(load32(&y.qs[32 * ib + 32..]), x.s[ib + 1]);
            sumi1 = _mm256_add_epi32(sumi1, scaled(x.q[ib], q8s_1, x.sc[ib]));
            sumi2 = _mm256_add_epi32(sumi2, scaled(x.q[ib + 1], q8s_2, x.sc[ib + 1]));
        }
        let s = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, *acc);
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(acc: __m256) -> f32 {
        0.25 * hsum_ps(acc)
    }
}

impl Tiled for BlockIQ3S {
    type A = BlockQ8K;
    const A_PER_W: usize = 1;
    type Dec = Iq3Dec;
    type Acc = __m256;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(x: &Self) -> Iq3Dec {
        let mut dec = Iq3Dec {
            q: [_mm256_setzero_si256(); 8],
            s: [_mm256_setzero_si256(); 8],
            sc: [_mm256_setzero_si256(); 8],
            d: h2f(x.d),
        };
        for ib in 0..8 {
            dec.q[ib] = grid_x8(&IQ3S_GRID, std::array::from_fn(|k| x.index(ib, k)));
            let s = &x.signs[4 * ib..4 * ib + 4];
            dec.s[ib] = sign_mask(u32::from_le_bytes([s[0], s[1], s[2], s[3]]));
            let ls = (x.scales[ib / 2] as u16 >> (4 * (ib % 2))) & 0xF;
            dec.sc[ib] = _mm256_set1_epi16((2 * ls + 1) as i16);
        }
        dec
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(x: &Iq3Dec, y: *const BlockQ8K, acc: &mut __m256) {
        let y = &*y;
        let d = x.d * y.d;
        // `apply_signs` of the one-row kernel with its mask precomputed.
        let signed = |q8: __m256i, s: __m256i| _mm256_sub_epi8(_mm256_xor_si256(s, q8), s);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            let q8s_1 = signed(load32(&y.qs[32 * ib..]), x.s[ib]);
            let q8s_2 = signed(load32(&y.qs[32 * ib + 32..]), x.s[ib + 1]);
            sumi1 = _mm256_add_epi32(sumi1, scaled(x.q[ib], q8s_1, x.sc[ib]));
            sumi2 = _mm256_add_epi32(sumi2, scaled(x.q[ib + 1], q8s_2, x.sc[ib + 1]));
        }
        let s = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, *acc);
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum_ps(acc)
    }
}

/// Four 8-byte IQ1 grid entries, entry `i` in 64-bit lane `i`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn grid1_x4(idx: [usize; 4]) -> __m256i {
    let g = |i: usize| IQ1S_GRID[idx[i]] as i64;
    _mm256_set_epi64x(g(3), g(2), g(1), g(0))
}

/// A decoded IQ1_S block: grid bytes and their absolute values, scales as
/// 16-bit lanes, `delta_sign * scale` per sub-block, and the block scale.
struct Iq1sDec {
    q: [__m256i; 8],
    aq: [__m256i; 8],
    sc: [__m256i; 8],
    ds: [i32; 8],
    d: f32,
}

impl Tiled for BlockIQ1S {
    type A = BlockQ8K;
    const A_PER_W: usize = 1;
    type Dec = Iq1sDec;
    /// The grid term's lanes and the delta term.
    type Acc = (__m256, f32);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(x: &Self) -> Iq1sDec {
        let mut dec = Iq1sDec {
            q: [_mm256_setzero_si256(); 8],
            aq: [_mm256_setzero_si256(); 8],
            sc: [_mm256_setzero_si256(); 8],
            ds: [0; 8],
            d: h2f(x.d),
        };
        for ib in 0..8 {
            let q = grid1_x4(std::array::from_fn(|l| x.index(ib, l)));
            dec.q[ib] = q;
            dec.aq[ib] = _mm256_sign_epi8(q, q);
            let ls = x.scale(ib);
            dec.sc[ib] = _mm256_set1_epi16(ls as i16);
            dec.ds[ib] = x.delta_sign(ib) * ls;
        }
        dec
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(x: &Iq1sDec, y: *const BlockQ8K, acc: &mut (__m256, f32)) {
        let y = &*y;
        let mut sumi = _mm256_setzero_si256();
        let mut sumi1 = 0i32;
        for ib in (0..8).step_by(2) {
            let q8_1 = load32(&y.qs[32 * ib..]);
            let q8_2 = load32(&y.qs[32 * ib + 32..]);
            let dot1 = _mm256_maddubs_epi16(x.aq[ib], _mm256_sign_epi8(q8_1, x.q[ib]));
            let dot2 = _mm256_maddubs_epi16(x.aq[ib + 1], _mm256_sign_epi8(q8_2, x.q[ib + 1]));
            let p1 = _mm256_madd_epi16(dot1, x.sc[ib]);
            let p2 = _mm256_madd_epi16(dot2, x.sc[ib + 1]);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p1, p2));
            let bsum = |k: usize| y.bsums[k] as i32 + y.bsums[k + 1] as i32;
            sumi1 += bsum(2 * ib) * x.ds[ib] + bsum(2 * ib + 2) * x.ds[ib + 1];
        }
        let d = y.d * x.d;
        acc.0 = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc.0);
        acc.1 = d.mul_add(sumi1 as f32, acc.1);
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(acc: (__m256, f32)) -> f32 {
        hsum_ps(acc.0) + IQ1_DELTA * acc.1
    }
}

/// A decoded IQ1_M block: grid bytes and their absolute values, the delta
/// sign operands, the scale of each sub-block's halves as 16-bit lanes, and
/// the block scale.
struct Iq1mDec {
    q: [__m256i; 8],
    aq: [__m256i; 8],
    delta: [__m256i; 8],
    sc: [__m256i; 8],
    d: f32,
}

impl Tiled for BlockIQ1M {
    type A = BlockQ8K;
    const A_PER_W: usize = 1;
    type Dec = Iq1mDec;
    /// The grid term's lanes and the delta term's.
    type Acc = (__m256, __m256);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(x: &Self) -> Iq1mDec {
        // The scale vectors exactly as the one-row kernel builds them.
        let mask = _mm256_set1_epi16(0x7);
        let mone = _mm256_set1_epi16(1);
        let sc = u64::from_le_bytes(x.scales);
        let scales =
            _mm256_srlv_epi64(_mm256_set1_epi64x(sc as i64), _mm256_set_epi64x(9, 3, 6, 0));
        let scales = _mm256_add_epi16(_mm256_slli_epi16(_mm256_and_si256(scales, mask), 1), mone);
        let mut idx1 = _mm256_set1_epi16(0x0100);
        let mut idx2 = _mm256_add_epi8(idx1, _mm256_set1_epi8(8));
        let mut dec = Iq1mDec {
            q: [_mm256_setzero_si256(); 8],
            aq: [_mm256_setzero_si256(); 8],
            delta: [_mm256_setzero_si256(); 8],
            sc: [_mm256_setzero_si256(); 8],
            d: h2f(x.d()),
        };
        for ib in 0..8 {
            let q = grid1_x4(std::array::from_fn(|l| x.index(ib, l)));
            dec.q[ib] = q;
            dec.aq[ib] = _mm256_sign_epi8(q, q);
            let s = |l: usize| {
                if x.delta_sign(ib, l) < 0 {
                    -1i64
                } else {
                    0x0101_0101_0101_0101
                }
            };
            dec.delta[ib] = _mm256_set_epi64x(s(3), s(2), s(1), s(0));
        }
        for ib in (0..8).step_by(2) {
            dec.sc[ib] = _mm256_shuffle_epi8(scales, idx1);
            dec.sc[ib + 1] = _mm256_shuffle_epi8(scales, idx2);
            idx1 = _mm256_add_epi8(idx1, _mm256_set1_epi8(2));
            idx2 = _mm256_add_epi8(idx2, _mm256_set1_epi8(2));
        }
        dec
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(x: &Iq1mDec, y: *const BlockQ8K, acc: &mut (__m256, __m256)) {
        let y = &*y;
        let mone8 = _mm256_set1_epi8(1);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            let q8_1 = load32(&y.qs[32 * ib..]);
            let q8_2 = load32(&y.qs[32 * ib + 32..]);
            let dot1 = _mm256_maddubs_epi16(x.aq[ib], _mm256_sign_epi8(q8_1, x.q[ib]));
            let dot2 = _mm256_maddubs_epi16(x.aq[ib + 1], _mm256_sign_epi8(q8_2, x.q[ib + 1]));
            let dot3 = _mm256_maddubs_epi16(mone8, _mm256_sign_epi8(q8_1, x.delta[ib]));
            let dot4 = _mm256_maddubs_epi16(mone8, _mm256_sign_epi8(q8_2, x.delta[ib + 1]));
            let p1 = _mm256_madd_epi16(dot1, x.sc[ib]);
            let p2 = _mm256_madd_epi16(dot2, x.sc[ib + 1]);
            let p3 = _mm256_madd_epi16(dot3, x.sc[ib]);
            let p4 = _mm256_madd_epi16(dot4, x.sc[ib + 1]);
            sumi1 = _mm256_add_epi32(sumi1, _mm256_add_epi32(p1, p2));
            sumi2 = _mm256_add_epi32(sumi2, _mm256_add_epi32(p3, p4));
        }
        let d = _mm256_set1_ps(y.d * x.d);
        acc.0 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), acc.0);
        acc.1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), acc.1);
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(acc: (__m256, __m256)) -> f32 {
        hsum_ps(acc.0) + IQ1_DELTA * hsum_ps(acc.1)
    }
}

/// A decoded NVFP4 block: the grid values of sub-blocks 0-1 and 2-3, and
/// the four halved UE4M3 scales.
struct Nvfp4Dec {
    q01: __m256i,
    q23: __m256i,
    ue: __m128,
}

impl Tiled for BlockNVFP4 {
    type A = BlockQ8_0;
    const A_PER_W: usize = 2;
    type Dec = Nvfp4Dec;
    type Acc = __m256;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(x: &Self) -> Nvfp4Dec {
        let lut = _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i);
        Nvfp4Dec {
            q01: two_sub_blocks(lut, &x.qs[..16]),
            q23: two_sub_blocks(lut, &x.qs[16..]),
            ue: super::nvfp4::ue4m3_x4(x.d),
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(x: &Nvfp4Dec, y: *const BlockQ8_0, acc: &mut __m256) {
        let (y0, y1) = (&*y, &*y.add(1));
        let p01 = mul_sum_i8_pairs(x.q01, load32(&y0.qs));
        let p23 = mul_sum_i8_pairs(x.q23, load32(&y1.qs));
        let (s01, s23) = scales_x4(x.ue, y0.d, y1.d);
        *acc = _mm256_fmadd_ps(s01, _mm256_cvtepi32_ps(p01), *acc);
        *acc = _mm256_fmadd_ps(s23, _mm256_cvtepi32_ps(p23), *acc);
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn finish(acc: __m256) -> f32 {
        hsum_ps(acc)
    }
}

macro_rules! iq_tile {
    ($($name:ident: $w:ty, $a:ty;)*) => {
        $(pub(crate) fn $name(nb: usize, w: &[$w], a: &[$a], out: &mut [f32]) {
            // SAFETY: only selected when CpuCaps::has_avx2() (see module
            // docs); `drive_tiled` checks the lengths.
            unsafe { drive_tiled(nb, w, a, out) }
        })*
    };
}

iq_tile! {
    tile_iq3_xxs: BlockIQ3XXS, BlockQ8K;
    tile_iq3_s: BlockIQ3S, BlockQ8K;
    tile_iq1_s: BlockIQ1S, BlockQ8K;
    tile_iq1_m: BlockIQ1M, BlockQ8K;
    tile_nvfp4: BlockNVFP4, BlockQ8_0;
}
