//! Q5_0 and Q5_1: 5-bit, 32 weights per block.
//!
//! Layout (`block_q5_0`, 22 bytes): `d: f16`, `qh: [u8; 4]`, `qs: [u8; 16]`;
//! (`block_q5_1`, 24 bytes): `d: f16`, `m: f16`, `qh`, `qs`. The low four
//! bits come from `qs` like Q4_0 (byte `j` = weights `j` low nibble, `j + 16`
//! high nibble); bit 4 of weight `i` is bit `i` of the little-endian `u32`
//! in `qh`. Q5_0: `x = d * (q - 16)` against Q8_0; Q5_1: `x = d * q + m`
//! against Q8_1.

use super::common::{f16_to_f32, f32_to_f16};
use super::{BlockQ8_0, BlockQ8_1, GgmlBlock, QuantError};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

/// The 32 unsigned 5-bit quants of a block, in element order.
#[inline(always)]
fn unpack5(qh: [u8; 4], qs: &[u8; 16]) -> [i32; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0i32; 32];
    for j in 0..16 {
        q[j] = ((qs[j] & 0xF) as u32 | (((qh >> j) & 1) << 4)) as i32;
        q[j + 16] = ((qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4)) as i32;
    }
    q
}

/// Packs 32 five-bit quants into `(qh, qs)`.
fn pack5(q: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for j in 0..16 {
        qs[j] = (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4);
        qh |= ((q[j] as u32 & 0x10) >> 4) << j;
        qh |= ((q[j + 16] as u32 & 0x10) >> 4) << (j + 16);
    }
    (qh.to_le_bytes(), qs)
}

impl GgmlBlock for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const BLOCK: usize = 32;
    const HAS_FROM_F32: bool = true;
    type Act = BlockQ8_0;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
            let d = f16_to_f32(b.d);
            for (o, q) in y.iter_mut().zip(unpack5(b.qh, &b.qs)) {
                *o = (q - 16) as f32 * d;
            }
        }
    }

    /// `ggml_vec_dot_q5_0_q8_0`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8_0]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let q = unpack5(x.qh, &x.qs);
            let sumi: i32 = q
                .iter()
                .zip(&y.qs)
                .map(|(&q, &v)| (q - 16) * v as i32)
                .sum();
            sumf += (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32;
        }
        sumf
    }

    /// `quantize_row_q5_0_ref`.
    fn from_f32(x: &[f32], out: &mut [Self]) -> Result<(), QuantError> {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in x {
                if amax < v.abs() {
                    amax = v.abs();
                    max = v;
                }
            }
            let d = max / -16.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut q = [0u8; 32];
            for (q, &v) in q.iter_mut().zip(x) {
                *q = ((v * id + 16.5) as i8).min(31) as u8;
            }
            let (qh, qs) = pack5(&q);
            *b = BlockQ5_0 {
                d: f32_to_f16(d),
                qh,
                qs,
            };
        }
        Ok(())
    }

    x86_kernels!(avx2: dot_q5_0, avx512: dot_q5_0);
}

impl GgmlBlock for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const BLOCK: usize = 32;
    const HAS_FROM_F32: bool = true;
    type Act = BlockQ8_1;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
            let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
            for (o, q) in y.iter_mut().zip(unpack5(b.qh, &b.qs)) {
                *o = q as f32 * d + m;
            }
        }
    }

    /// `ggml_vec_dot_q5_1_q8_1`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8_1]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let q = unpack5(x.qh, &x.qs);
            let sumi: i32 = q.iter().zip(&y.qs).map(|(&q, &v)| q * v as i32).sum();
            sumf += (f16_to_f32(x.d) * f16_to_f32(y.d)) * sumi as f32
                + f16_to_f32(x.m) * f16_to_f32(y.s);
        }
        sumf
    }

    /// `quantize_row_q5_1_ref`.
    fn from_f32(x: &[f32], out: &mut [Self]) -> Result<(), QuantError> {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
            let (mut min, mut max) = (f32::MAX, -f32::MAX);
            for &v in x {
                min = if v < min { v } else { min };
                max = if v > max { v } else { max };
            }
            let d = (max - min) / 31.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut q = [0u8; 32];
            for (q, &v) in q.iter_mut().zip(x) {
                *q = (((v - min) * id + 0.5) as i8).min(31) as u8;
            }
            let (qh, qs) = pack5(&q);
            *b = BlockQ5_1 {
                d: f32_to_f16(d),
                m: f32_to_f16(min),
                qh,
                qs,
            };
        }
        Ok(())
    }

    x86_kernels!(avx2: dot_q5_1, avx512: dot_q5_1);
}
