//! IQ2_XXS, IQ2_XS and IQ2_S: 2-bit i-quants. Every group of 8 weights is
//! one point of an E8-like lattice grid (8 unsigned magnitudes from
//! {8, 25, 43}, packed in a `u64`, see [`IQ2XXS_GRID`]) and 8 sign bits;
//! a block holds 256 weights (`QK_K`) as 8 sub-blocks of 32 (four groups).
//! All three are dotted against Q8_K and dequantise as
//! `x = d * (0.5 + ls) / 4 * grid[j] * (sign_j ? -1 : 1)` with a 4-bit `ls`.
//!
//! IQ2_XXS (`block_iq2_xxs`, 66 bytes, 2.0625 bpw): `d: f16`,
//! `qs: [u16; 32]`. Sub-block `ib` reads `qs[4ib..4ib + 4]` as two
//! little-endian `u32`, `a0` and `a1`: byte `l` of `a0` is the grid index of
//! group `l` (256-point [`IQ2XXS_GRID`]); bits `7l..7l + 7` of `a1` index
//! [`KSIGNS_IQ2XS`] (seven stored sign bits, the eighth makes the number of
//! minus signs even), and `a1 >> 28` is the sub-block's scale `ls`.
//!
//! IQ2_XS (`block_iq2_xs`, 74 bytes, 2.3125 bpw): `d: f16`,
//! `qs: [u16; 32]`, `scales: [u8; 8]`. Group `l` of sub-block `ib` is
//! `q = qs[4ib + l]`: grid index `q & 511` (512-point [`IQ2XS_GRID`]), sign
//! byte `KSIGNS_IQ2XS[q >> 9]`. `scales[ib]` holds two scales: the low
//! nibble for groups 0-1 (weights 0..16), the high nibble for groups 2-3.
//!
//! IQ2_S (`block_iq2_s`, 82 bytes, 2.5625 bpw): `d: f16`, `qs: [u8; 64]`,
//! `qh: [u8; 8]`, `scales: [u8; 8]`. The first 32 `qs` bytes are the low
//! 8 bits of the grid indices (byte `4ib + l`), bits `2l..2l + 2` of `qh[ib]`
//! the top two bits (1024-point [`IQ2S_GRID`]); the last 32 are the sign
//! bytes, one per group, all 8 bits stored. Scales as IQ2_XS.
//!
//! The dot products follow `ggml_vec_dot_iq2_*_q8_K`: integer sums scaled by
//! `2 * ls + 1` per 16 weights, `sumf += d * bsum` per block, and
//! `0.125 * sumf` at the end.

use super::common::f16_to_f32;
use super::iq_tables::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS};
use super::{BlockQ8K, GgmlBlock, QK_K};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ2XXS {
    pub d: f16,
    pub qs: [u16; QK_K / 8],
}
const _: () = assert!(std::mem::size_of::<BlockIQ2XXS>() == 66);

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ2XS {
    pub d: f16,
    pub qs: [u16; QK_K / 8],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIQ2XS>() == 74);

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ2S {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIQ2S>() == 82);

impl BlockIQ2XXS {
    /// Sub-block `ib`'s two words `(a0, a1)`: grid bytes; signs and scale.
    #[inline(always)]
    pub(crate) fn aux(&self, ib: usize) -> (u32, u32) {
        let q = &self.qs[4 * ib..4 * ib + 4];
        (
            q[0] as u32 | (q[1] as u32) << 16,
            q[2] as u32 | (q[3] as u32) << 16,
        )
    }
}

/// What the three layouts share: per group of 8, a grid point and its sign
/// bits; per 16 weights, a 4-bit scale.
pub(crate) trait Iq2Groups {
    fn d(&self) -> f16;
    /// The grid point (8 magnitudes) and sign byte of group `l` of
    /// sub-block `ib`.
    fn group(&self, ib: usize, l: usize) -> (u64, u8);
    /// The 4-bit scale of half `h` (groups `2h`, `2h + 1`) of sub-block `ib`.
    fn ls(&self, ib: usize, h: usize) -> u32;
}

impl Iq2Groups for BlockIQ2XXS {
    #[inline(always)]
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    fn group(&self, ib: usize, l: usize) -> (u64, u8) {
        let (a0, a1) = self.aux(ib);
        let g = IQ2XXS_GRID[(a0 >> (8 * l)) as usize & 255];
        (g, KSIGNS_IQ2XS[(a1 >> (7 * l)) as usize & 127])
    }
    #[inline(always)]
    fn ls(&self, ib: usize, _h: usize) -> u32 {
        self.aux(ib).1 >> 28
    }
}

impl Iq2Groups for BlockIQ2XS {
    #[inline(always)]
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    fn group(&self, ib: usize, l: usize) -> (u64, u8) {
        let q = self.qs[4 * ib + l] as usize;
        (IQ2XS_GRID[q & 511], KSIGNS_IQ2XS[q >> 9])
    }
    #[inline(always)]
    fn ls(&self, ib: usize, h: usize) -> u32 {
        (self.scales[ib] >> (4 * h)) as u32 & 0xF
    }
}

impl Iq2Groups for BlockIQ2S {
    #[inline(always)]
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    fn group(&self, ib: usize, l: usize) -> (u64, u8) {
        let hi = ((self.qh[ib] as usize) << (8 - 2 * l)) & 0x300;
        let g = IQ2S_GRID[self.qs[4 * ib + l] as usize | hi];
        (g, self.qs[QK_K / 8 + 4 * ib + l])
    }
    #[inline(always)]
    fn ls(&self, ib: usize, h: usize) -> u32 {
        (self.scales[ib] >> (4 * h)) as u32 & 0xF
    }
}

/// `dequantize_row_iq2_*`: `db * grid[j]`, negated where the sign bit is set.
fn to_f32<B: Iq2Groups>(blocks: &[B], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d());
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let db = [0, 1].map(|h| d * (0.5 + b.ls(ib, h) as f32) * 0.25);
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let (grid, signs) = b.group(ib, l);
                for (j, y) in y.iter_mut().enumerate() {
                    let v = db[l / 2] * (grid >> (8 * j)) as u8 as f32;
                    *y = if signs & KMASK_IQ2XS[j] != 0 { -v } else { v };
                }
            }
        }
    }
}

/// `ggml_vec_dot_iq2_*_q8_K_generic`.
fn vec_dot<B: Iq2Groups>(w: &[B], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(x.d()) * y.d;
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            for h in 0..2 {
                let mut sumi = 0i32;
                for l in 2 * h..2 * h + 2 {
                    let (grid, signs) = x.group(ib, l);
                    let q8 = &y.qs[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                    for (j, &q) in q8.iter().enumerate() {
                        let g = (grid >> (8 * j)) as u8 as i32 * q as i32;
                        sumi += if signs & KMASK_IQ2XS[j] != 0 { -g } else { g };
                    }
                }
                bsum += sumi * (2 * x.ls(ib, h) as i32 + 1);
            }
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

macro_rules! iq2_block {
    ($b:ty, $ty:ident, $($kernels:tt)*) => {
        impl GgmlBlock for $b {
            const TYPE: GgmlType = GgmlType::$ty;
            const BLOCK: usize = QK_K;
            type Act = BlockQ8K;

            fn to_f32(blocks: &[Self], out: &mut [f32]) {
                to_f32(blocks, out)
            }

            fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8K]) -> f32 {
                vec_dot(w, a)
            }

            x86_kernels!($($kernels)*);
        }
    };
}

iq2_block!(BlockIQ2XXS, IQ2_XXS, avx2: dot_iq2_xxs, avx512: dot_iq2_xxs);
iq2_block!(BlockIQ2XS, IQ2_XS, avx2: dot_iq2_xs, avx512: dot_iq2_xs);
iq2_block!(BlockIQ2S, IQ2_S, avx2: dot_iq2_s, avx512: dot_iq2_s);
