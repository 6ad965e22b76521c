//! Q4_0: symmetric 4-bit, 32 weights in 18 bytes.
//!
//! Layout (`block_q4_0`): `d: f16`, `qs: [u8; 16]`. Byte `j` holds weight `j`
//! in its low nibble and weight `j + 16` in its high nibble;
//! `x = d * (q - 8)`. Dotted against Q8_0.

use super::common::{f16_to_f32, f32_to_f16};
use super::{BlockQ8_0, GgmlBlock, QuantError};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

impl GgmlBlock for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const BLOCK: usize = 32;
    const HAS_FROM_F32: bool = true;
    type Act = BlockQ8_0;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
            let d = f16_to_f32(b.d);
            for (j, &q) in b.qs.iter().enumerate() {
                y[j] = ((q & 0xF) as i32 - 8) as f32 * d;
                y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
            }
        }
    }

    /// `ggml_vec_dot_q4_0_q8_0`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8_0]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let (mut s0, mut s1) = (0i32, 0i32);
            for j in 0..16 {
                s0 += ((x.qs[j] & 0xF) as i32 - 8) * y.qs[j] as i32;
                s1 += ((x.qs[j] >> 4) as i32 - 8) * y.qs[j + 16] as i32;
            }
            sumf += (s0 + s1) as f32 * f16_to_f32(x.d) * f16_to_f32(y.d);
        }
        sumf
    }

    /// `quantize_row_q4_0_ref`: `d = max / -8` with `max` the signed value of
    /// largest magnitude.
    fn from_f32(x: &[f32], out: &mut [Self]) -> Result<(), QuantError> {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in x {
                if amax < v.abs() {
                    amax = v.abs();
                    max = v;
                }
            }
            let d = max / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            b.d = f32_to_f16(d);
            for j in 0..16 {
                let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
                let q1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
                b.qs[j] = q0 | (q1 << 4);
            }
        }
        Ok(())
    }

    x86_kernels!(avx2: dot_q4_0, avx512: dot_q4_0);
}
