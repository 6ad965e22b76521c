//! Q2_K: 2-bit K-quant, 84 bytes per 256 weights.
//!
//! Layout (`block_q2_K`): `scales: [u8; 16]` (per 16 weights: low nibble
//! scale, high nibble min), `qs: [u8; 64]`, `d: f16`, `dmin: f16`. Each
//! 128-weight half uses 32 `qs` bytes; its four 32-weight runs take bit pairs
//! 0-1, 2-3, 4-5, 6-7 of those bytes. `x = d * sc * q - dmin * m`.

use crate::quant::common::f16_to_f32;
use crate::quant::{BlockQ8K, GgmlBlock, QK_K};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

impl GgmlBlock for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const BLOCK: usize = QK_K;
    type Act = BlockQ8K;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let (d, min) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
            let mut is = 0;
            let mut o = 0;
            for q in b.qs.chunks_exact(32) {
                for shift in [0, 2, 4, 6] {
                    for half in 0..2 {
                        let sc = b.scales[is];
                        is += 1;
                        let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
                        for l in 0..16 {
                            y[o] = dl * ((q[16 * half + l] >> shift) & 3) as f32 - ml;
                            o += 1;
                        }
                    }
                }
            }
        }
    }

    /// `ggml_vec_dot_q2_K_q8_K`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let summs: i32 = y
                .bsums
                .iter()
                .zip(&x.scales)
                .map(|(&s, &sc)| s as i32 * (sc >> 4) as i32)
                .sum();
            let dall = y.d * f16_to_f32(x.d);
            let dmin = y.d * f16_to_f32(x.dmin);
            let mut isum = 0i32;
            let mut is = 0;
            let mut q8 = 0;
            for q2 in x.qs.chunks_exact(32) {
                for shift in [0, 2, 4, 6] {
                    for half in 0..2 {
                        let d = (x.scales[is] & 0xF) as i32;
                        is += 1;
                        let mut isuml = 0i32;
                        for l in 16 * half..16 * half + 16 {
                            isuml += y.qs[q8 + l] as i32 * ((q2[l] >> shift) & 3) as i32;
                        }
                        isum += d * isuml;
                    }
                    q8 += 32;
                }
            }
            sumf += dall * isum as f32 - dmin * summs as f32;
        }
        sumf
    }

    x86_kernels!(avx2: dot_q2_k);
}
