//! MXFP4 (OCP microscaling FP4): 32 E2M1 values sharing one E8M0 exponent.
//!
//! Layout (`block_mxfp4`, 17 bytes): `e: u8` (scale `2^(e - 127)`),
//! `qs: [u8; 16]`, nibbles as Q4_0 (byte `j` = values `j` low, `j + 16`
//! high). ggml stores the E2M1 grid doubled ([`KVALUES_MXFP4`]) and halves
//! the scale: `x = kv[q] * e8m0_half(e)`. Dotted against Q8_0.

use super::common::{e8m0_to_f32_half, f16_to_f32, KVALUES_MXFP4};
use super::{BlockQ8_0, GgmlBlock, QuantError};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockMXFP4 {
    pub e: u8,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockMXFP4>() == 17);

/// Index of the grid value nearest `x / d` (`best_index_mxfp4`; first wins).
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0usize;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i;
            best_err = err;
        }
    }
    best as u8
}

impl GgmlBlock for BlockMXFP4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    const BLOCK: usize = 32;
    const HAS_FROM_F32: bool = true;
    type Act = BlockQ8_0;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
            let d = e8m0_to_f32_half(b.e);
            for (j, &q) in b.qs.iter().enumerate() {
                y[j] = KVALUES_MXFP4[(q & 0xF) as usize] as f32 * d;
                y[j + 16] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
            }
        }
    }

    /// `ggml_vec_dot_mxfp4_q8_0`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8_0]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = f16_to_f32(y.d) * e8m0_to_f32_half(x.e);
            let (mut s1, mut s2) = (0i32, 0i32);
            for j in 0..16 {
                s1 += y.qs[j] as i32 * KVALUES_MXFP4[(x.qs[j] & 0xF) as usize] as i32;
                s2 += y.qs[j + 16] as i32 * KVALUES_MXFP4[(x.qs[j] >> 4) as usize] as i32;
            }
            sumf += d * (s1 + s2) as f32;
        }
        sumf
    }

    /// `quantize_row_mxfp4_ref`: shared exponent `floor(log2(amax)) - 2`,
    /// then the nearest grid point per value.
    fn from_f32(x: &[f32], out: &mut [Self]) -> Result<(), QuantError> {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
            let amax = x
                .iter()
                .fold(0.0f32, |m, v| if m < v.abs() { v.abs() } else { m });
            let e = if amax > 0.0 {
                (amax.log2().floor() - 2.0 + 127.0) as u8
            } else {
                0
            };
            let d = e8m0_to_f32_half(e);
            b.e = e;
            for j in 0..16 {
                b.qs[j] = best_index(x[j], d) | (best_index(x[j + 16], d) << 4);
            }
        }
        Ok(())
    }

    x86_kernels!(avx2: dot_mxfp4, avx512: dot_mxfp4);
}
