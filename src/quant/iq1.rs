//! IQ1_S and IQ1_M: 1.56 / 1.75-bit i-quants. Groups of 8 ternary values
//! (-1, 0, 1) come from the 2048-entry lattice [`IQ1S_GRID`] (one signed byte
//! per value), shifted by `±delta` (`IQ1S_DELTA` = `IQ1M_DELTA` = 1/8) and
//! scaled by an odd 3-bit integer scale. Both hold 256 weights as eight
//! sub-blocks of 32 and are dotted against Q8_K; the delta term of the dot
//! product comes from Q8_K's block sums (`bsums`, IQ1_S) or from the
//! activation sums per 8 (IQ1_M).
//!
//! IQ1_S (`block_iq1_s`, 50 bytes): `d: f16`, `qs: [u8; 32]`,
//! `qh: [u16; 8]`. Sub-block `ib` has four groups of 8; group `l` uses grid
//! entry `qs[4ib + l] | ((qh[ib] >> 3l) & 7) << 8`; bits 12..15 of `qh[ib]`
//! are the scale `s`, bit 15 the delta's sign:
//! `x = d * (2s + 1) * (grid + delta)`, `delta = -1/8` if bit 15 is set, else
//! `+1/8`.
//!
//! IQ1_M (`block_iq1_m`, 56 bytes): `qs: [u8; 32]`, `qh: [u8; 16]`,
//! `scales: [u8; 8]` (four little-endian `u16`, `sc[0..4]`). There is no `d`
//! field: the f16 super-block scale is split across the top nibbles of the
//! four `sc` words (`sc[0] >> 12` is its low nibble, `sc[3] & 0xF000` its high
//! one; ggml's `iq1m_scale_t`). Group `l` (0..4) of sub-block `ib` uses grid
//! entry `qs[4ib + l] | (n & 7) << 8` where `n` is the low (even `l`) or high
//! (odd `l`) nibble of `qh[2ib + l / 2]`, and bit 3 of `n` is the sign of its
//! delta. Each half (16 weights) of sub-block `ib` has its own 3-bit scale:
//! bits `6(ib % 2)..+3` (first half) and `6(ib % 2) + 3..+3` (second half)
//! of `sc[ib / 2]`; `x = d * (2s + 1) * (grid + delta)`.

use super::common::f16_to_f32;
use super::iq_tables::IQ1S_GRID;
use super::{BlockQ8K, GgmlBlock, QK_K};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// ggml's `IQ1S_DELTA` (and `IQ1M_DELTA`, which is the same).
pub(crate) const IQ1_DELTA: f32 = 0.125;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ1S {
    pub d: f16,
    pub qs: [u8; QK_K / 8],
    pub qh: [u16; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIQ1S>() == 50);

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIQ1M>() == 56);

/// The 8 signed grid values of entry `idx`.
#[inline(always)]
pub(crate) fn grid8(idx: usize) -> [i8; 8] {
    IQ1S_GRID[idx].to_le_bytes().map(|b| b as i8)
}

impl BlockIQ1S {
    /// The 11-bit grid index of group `l` (0..4) of sub-block `ib` (0..8).
    #[inline(always)]
    pub(crate) fn index(&self, ib: usize, l: usize) -> usize {
        self.qs[4 * ib + l] as usize | ((self.qh[ib] as usize >> (3 * l)) & 7) << 8
    }

    /// The integer scale `2s + 1` of sub-block `ib`.
    #[inline(always)]
    pub(crate) fn scale(&self, ib: usize) -> i32 {
        2 * ((self.qh[ib] >> 12) & 7) as i32 + 1
    }

    /// -1 when the delta of sub-block `ib` is negative, else 1.
    #[inline(always)]
    pub(crate) fn delta_sign(&self, ib: usize) -> i32 {
        if self.qh[ib] & 0x8000 != 0 {
            -1
        } else {
            1
        }
    }
}

impl BlockIQ1M {
    /// Scale word `k` (0..4).
    #[inline(always)]
    pub(crate) fn sc(&self, k: usize) -> u16 {
        u16::from_le_bytes([self.scales[2 * k], self.scales[2 * k + 1]])
    }

    /// The super-block scale, gathered from the top nibbles of the scale words.
    #[inline(always)]
    pub(crate) fn d(&self) -> f16 {
        let sc = [self.sc(0), self.sc(1), self.sc(2), self.sc(3)];
        f16::from_bits(
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000),
        )
    }

    /// The integer scales `2s + 1` of the two halves of sub-block `ib`.
    #[inline(always)]
    pub(crate) fn scales(&self, ib: usize) -> (i32, i32) {
        let sc = self.sc(ib / 2) >> (6 * (ib % 2));
        (2 * (sc & 7) as i32 + 1, 2 * ((sc >> 3) & 7) as i32 + 1)
    }

    /// The nibble of group `l` (0..4) of sub-block `ib`: index bits 8..11
    /// and, in bit 3, the delta's sign.
    #[inline(always)]
    fn nibble(&self, ib: usize, l: usize) -> usize {
        (self.qh[2 * ib + l / 2] as usize >> (4 * (l % 2))) & 0xF
    }

    /// The 11-bit grid index of group `l` (0..4) of sub-block `ib` (0..8).
    #[inline(always)]
    pub(crate) fn index(&self, ib: usize, l: usize) -> usize {
        self.qs[4 * ib + l] as usize | (self.nibble(ib, l) & 7) << 8
    }

    /// -1 when the delta of group `l` of sub-block `ib` is negative, else 1.
    #[inline(always)]
    pub(crate) fn delta_sign(&self, ib: usize, l: usize) -> i32 {
        if self.nibble(ib, l) & 8 != 0 {
            -1
        } else {
            1
        }
    }
}

/// `sum(grid[j] * q8[j])` over one group of 8.
#[inline(always)]
fn dot8(grid: [i8; 8], q8: &[i8]) -> i32 {
    grid.iter()
        .zip(q8)
        .map(|(&g, &q)| g as i32 * q as i32)
        .sum()
}

impl GgmlBlock for BlockIQ1S {
    const TYPE: GgmlType = GgmlType::IQ1_S;
    const BLOCK: usize = QK_K;
    type Act = BlockQ8K;

    /// `dequantize_row_iq1_s`.
    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = f16_to_f32(b.d);
            for (ib, y) in y.chunks_exact_mut(32).enumerate() {
                let dl = d * b.scale(ib) as f32;
                let delta = b.delta_sign(ib) as f32 * IQ1_DELTA;
                for (l, y) in y.chunks_exact_mut(8).enumerate() {
                    for (y, g) in y.iter_mut().zip(grid8(b.index(ib, l))) {
                        *y = dl * (g as f32 + delta);
                    }
                }
            }
        }
    }

    /// `ggml_vec_dot_iq1_s_q8_K_generic`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let (mut sumi, mut sumi1) = (0i32, 0i32);
            for ib in 0..QK_K / 32 {
                let ls = x.scale(ib);
                let lsum: i32 = (0..4)
                    .map(|l| dot8(grid8(x.index(ib, l)), &y.qs[32 * ib + 8 * l..]))
                    .sum();
                sumi += ls * lsum;
                let bsum = y.bsums[2 * ib] as i32 + y.bsums[2 * ib + 1] as i32;
                sumi1 += ls * x.delta_sign(ib) * bsum;
            }
            sumf += f16_to_f32(x.d) * y.d * (sumi as f32 + IQ1_DELTA * sumi1 as f32);
        }
        sumf
    }

    x86_kernels!(avx2: dot_iq1_s, avx512: dot_iq1_s, bmi2: dot_iq1_s_pdep);
}

impl GgmlBlock for BlockIQ1M {
    const TYPE: GgmlType = GgmlType::IQ1_M;
    const BLOCK: usize = QK_K;
    type Act = BlockQ8K;

    /// `dequantize_row_iq1_m`.
    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = f16_to_f32(b.d());
            for (ib, y) in y.chunks_exact_mut(32).enumerate() {
                let (ls1, ls2) = b.scales(ib);
                let dl = [d * ls1 as f32, d * ls2 as f32];
                for (l, y) in y.chunks_exact_mut(8).enumerate() {
                    let delta = b.delta_sign(ib, l) as f32 * IQ1_DELTA;
                    for (y, g) in y.iter_mut().zip(grid8(b.index(ib, l))) {
                        *y = dl[l / 2] * (g as f32 + delta);
                    }
                }
            }
        }
    }

    /// `ggml_vec_dot_iq1_m_q8_K_generic`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let (mut sumi1, mut sumi2) = (0i32, 0i32);
            for ib in 0..QK_K / 32 {
                let (mut sum1, mut sum2) = ([0i32; 2], [0i32; 2]);
                for l in 0..4 {
                    let q8 = &y.qs[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                    sum1[l / 2] += dot8(grid8(x.index(ib, l)), q8);
                    let lsum2: i32 = q8.iter().map(|&q| q as i32).sum();
                    sum2[l / 2] += lsum2 * x.delta_sign(ib, l);
                }
                let (ls1, ls2) = x.scales(ib);
                sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
                sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
            }
            sumf += f16_to_f32(x.d()) * y.d * (sumi1 as f32 + IQ1_DELTA * sumi2 as f32);
        }
        sumf
    }

    x86_kernels!(avx2: dot_iq1_m, avx512: dot_iq1_m, bmi2: dot_iq1_m_pdep);
}
