//! IQ3_XXS and IQ3_S: 3-bit i-quants, groups of 4 unsigned magnitudes taken
//! from a lattice grid, with one sign bit per weight. Both hold 256 weights
//! as eight sub-blocks of 32 and are dotted against Q8_K.
//!
//! IQ3_XXS (`block_iq3_xxs`, 98 bytes): `d: f16`, `qs: [u8; 96]`. The first
//! 64 bytes are grid indices, 8 per sub-block, each picking 4 magnitudes of
//! [`IQ3XXS_GRID`]. The last 32 bytes are one little-endian `u32` per
//! sub-block: bits `7l..7l + 7` (`l` = 0..4) index [`KSIGNS_IQ2XS`], whose bit
//! `j` negates weight `j` of the `l`-th group of 8 (the eighth sign is the
//! parity of the other seven), and bits 28..32 are a 4-bit scale `s`:
//! `x = d * (0.5 + s) * 0.5 * grid * sign`. The dot product uses the integer
//! scale `2s + 1` and multiplies the sum by 1/4.
//!
//! IQ3_S (`block_iq3_s`, 110 bytes): `d: f16`, `qs: [u8; 64]`,
//! `qh: [u8; 8]`, `signs: [u8; 32]`, `scales: [u8; 4]`. Grid index `k`
//! (0..8) of sub-block `ib` is `qs[8ib + k] | (bit k of qh[ib]) << 8`, into
//! the 512 entries of [`IQ3S_GRID`]; `signs[4ib + l]` bit `j` negates weight
//! `j` of the `l`-th group of 8; sub-block `ib` has the 4-bit scale `s` in
//! the low (even `ib`) or high (odd `ib`) nibble of `scales[ib / 2]`:
//! `x = d * (1 + 2s) * grid * sign`.

use super::common::f16_to_f32;
use super::iq_tables::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::{BlockQ8K, GgmlBlock, QK_K};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ3XXS {
    pub d: f16,
    pub qs: [u8; 3 * QK_K / 8],
}
const _: () = assert!(std::mem::size_of::<BlockIQ3XXS>() == 98);

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ3S {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}
const _: () = assert!(std::mem::size_of::<BlockIQ3S>() == 110);

/// The 4 grid bytes of a packed `u32` entry.
#[inline(always)]
fn grid4(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

impl BlockIQ3XXS {
    /// The scale-and-signs word of sub-block `ib` (0..8).
    #[inline(always)]
    pub(crate) fn aux(&self, ib: usize) -> u32 {
        let o = QK_K / 4 + 4 * ib;
        u32::from_le_bytes([self.qs[o], self.qs[o + 1], self.qs[o + 2], self.qs[o + 3]])
    }
}

impl BlockIQ3S {
    /// The 9-bit grid index `k` (0..8) of sub-block `ib` (0..8).
    #[inline(always)]
    pub(crate) fn index(&self, ib: usize, k: usize) -> usize {
        self.qs[8 * ib + k] as usize | ((self.qh[ib] as usize) << (8 - k) & 256)
    }

    /// The integer scale `2s + 1` of sub-block `ib` (0..8).
    #[inline(always)]
    pub(crate) fn scale(&self, ib: usize) -> i32 {
        2 * ((self.scales[ib / 2] >> (4 * (ib % 2))) & 0xF) as i32 + 1
    }
}

/// `±v`: negated where bit `j` of `signs` is set.
#[inline(always)]
fn signed(v: f32, signs: u8, j: usize) -> f32 {
    if signs >> j & 1 != 0 {
        -v
    } else {
        v
    }
}

/// `±g * q8`, as `signed` for integers.
#[inline(always)]
fn signed_i(g: u8, q8: i8, signs: u8, j: usize) -> i32 {
    let p = g as i32 * q8 as i32;
    if signs >> j & 1 != 0 {
        -p
    } else {
        p
    }
}

impl GgmlBlock for BlockIQ3XXS {
    const TYPE: GgmlType = GgmlType::IQ3_XXS;
    const BLOCK: usize = QK_K;
    type Act = BlockQ8K;

    /// `dequantize_row_iq3_xxs`.
    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = f16_to_f32(b.d);
            for (ib, y) in y.chunks_exact_mut(32).enumerate() {
                let aux = b.aux(ib);
                let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
                for (l, y) in y.chunks_exact_mut(8).enumerate() {
                    let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
                    let g1 = grid4(IQ3XXS_GRID[b.qs[8 * ib + 2 * l] as usize]);
                    let g2 = grid4(IQ3XXS_GRID[b.qs[8 * ib + 2 * l + 1] as usize]);
                    for j in 0..4 {
                        y[j] = signed(db * g1[j] as f32, signs, j);
                        y[j + 4] = signed(db * g2[j] as f32, signs, j + 4);
                    }
                }
            }
        }
    }

    /// `ggml_vec_dot_iq3_xxs_q8_K_generic`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = f16_to_f32(x.d) * y.d;
            let mut bsum = 0i32;
            for ib in 0..QK_K / 32 {
                let aux = x.aux(ib);
                let ls = 2 * (aux >> 28) as i32 + 1;
                let mut sumi = 0i32;
                for l in 0..4 {
                    let q8 = &y.qs[32 * ib + 8 * l..];
                    let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
                    let g1 = grid4(IQ3XXS_GRID[x.qs[8 * ib + 2 * l] as usize]);
                    let g2 = grid4(IQ3XXS_GRID[x.qs[8 * ib + 2 * l + 1] as usize]);
                    for j in 0..4 {
                        sumi += signed_i(g1[j], q8[j], signs, j);
                        sumi += signed_i(g2[j], q8[j + 4], signs, j + 4);
                    }
                }
                bsum += sumi * ls;
            }
            sumf += d * bsum as f32;
        }
        0.25 * sumf
    }

    x86_kernels!(avx2: dot_iq3_xxs, avx512: dot_iq3_xxs);
}

impl GgmlBlock for BlockIQ3S {
    const TYPE: GgmlType = GgmlType::IQ3_S;
    const BLOCK: usize = QK_K;
    type Act = BlockQ8K;

    /// `dequantize_row_iq3_s`.
    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = f16_to_f32(b.d);
            for (ib, y) in y.chunks_exact_mut(32).enumerate() {
                let db = d * b.scale(ib) as f32;
                for (l, y) in y.chunks_exact_mut(8).enumerate() {
                    let signs = b.signs[4 * ib + l];
                    let g1 = grid4(IQ3S_GRID[b.index(ib, 2 * l)]);
                    let g2 = grid4(IQ3S_GRID[b.index(ib, 2 * l + 1)]);
                    for j in 0..4 {
                        y[j] = signed(db * g1[j] as f32, signs, j);
                        y[j + 4] = signed(db * g2[j] as f32, signs, j + 4);
                    }
                }
            }
        }
    }

    /// `ggml_vec_dot_iq3_s_q8_K_generic`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = f16_to_f32(x.d) * y.d;
            let mut bsum = 0i32;
            for ib in 0..QK_K / 32 {
                let mut sumi = 0i32;
                for l in 0..4 {
                    let q8 = &y.qs[32 * ib + 8 * l..];
                    let signs = x.signs[4 * ib + l];
                    let g1 = grid4(IQ3S_GRID[x.index(ib, 2 * l)]);
                    let g2 = grid4(IQ3S_GRID[x.index(ib, 2 * l + 1)]);
                    for j in 0..4 {
                        sumi += signed_i(g1[j], q8[j], signs, j);
                        sumi += signed_i(g2[j], q8[j + 4], signs, j + 4);
                    }
                }
                bsum += sumi * x.scale(ib);
            }
            sumf += d * bsum as f32;
        }
        sumf
    }

    x86_kernels!(avx2: dot_iq3_s, avx512: dot_iq3_s);
}
