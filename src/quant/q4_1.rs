//! Q4_1: asymmetric 4-bit, 32 weights in 20 bytes.
//!
//! Layout (`block_q4_1`): `d: f16`, `m: f16`, `qs: [u8; 16]` (nibbles as
//! Q4_0: byte `j` = weights `j` low, `j + 16` high); `x = d * q + m`.
//! Dotted against Q8_1, whose `s` field carries the min term.

use super::common::{f16_to_f32, f32_to_f16};
use super::{BlockQ8_1, GgmlBlock, QuantError};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

impl GgmlBlock for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const BLOCK: usize = 32;
    const HAS_FROM_F32: bool = true;
    type Act = BlockQ8_1;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
            let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
            for (j, &q) in b.qs.iter().enumerate() {
                y[j] = (q & 0xF) as f32 * d + m;
                y[j + 16] = (q >> 4) as f32 * d + m;
            }
        }
    }

    /// `ggml_vec_dot_q4_1_q8_1`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8_1]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let (mut s0, mut s1) = (0i32, 0i32);
            for j in 0..16 {
                s0 += (x.qs[j] & 0xF) as i32 * y.qs[j] as i32;
                s1 += (x.qs[j] >> 4) as i32 * y.qs[j + 16] as i32;
            }
            sumf += (f16_to_f32(x.d) * f16_to_f32(y.d)) * (s0 + s1) as f32
                + f16_to_f32(x.m) * f16_to_f32(y.s);
        }
        sumf
    }

    /// `quantize_row_q4_1_ref`.
    fn from_f32(x: &[f32], out: &mut [Self]) -> Result<(), QuantError> {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
            let (mut min, mut max) = (f32::MAX, -f32::MAX);
            for &v in x {
                min = if v < min { v } else { min };
                max = if v > max { v } else { max };
            }
            let d = (max - min) / 15.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            b.d = f32_to_f16(d);
            b.m = f32_to_f16(min);
            for j in 0..16 {
                let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
                let q1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
                b.qs[j] = q0 | (q1 << 4);
            }
        }
        Ok(())
    }

    x86_kernels!(avx2: dot_q4_1, avx512: dot_q4_1);
}
