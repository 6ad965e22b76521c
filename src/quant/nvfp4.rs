//! NVFP4 (NVIDIA's FP4): 64 E2M1 values in four sub-blocks of 16, each with
//! its own unsigned E4M3 scale.
//!
//! Layout (`block_nvfp4`, 36 bytes / 64 weights): `d: [u8; 4]` (UE4M3
//! scales, one per sub-block of 16), `qs: [u8; 32]`. Sub-block `s` owns
//! bytes `qs[8s..8s + 8]`: byte `j` holds value `j` in its low nibble and
//! value `j + 8` in its high nibble. ggml stores the E2M1 grid doubled
//! ([`KVALUES_MXFP4`]) and halves the scale (see [`ue4m3_to_f32_half`]):
//! `x = kv[q] * ue4m3_half(d[s])`. Dotted against Q8_0: one NVFP4 block
//! spans two Q8_0 blocks (sub-blocks 0-1 the first, 2-3 the second).

use super::common::{f16_to_f32, KVALUES_MXFP4};
use super::{BlockQ8_0, GgmlBlock};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockNVFP4 {
    pub d: [u8; 4],
    pub qs: [u8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockNVFP4>() == 36);

/// Half the value of an unsigned E4M3 scale (`ggml_ue4m3_to_fp32`): bias 7,
/// subnormals `m * 2^-9`, 0 and the NaN code 0x7F read as 0. Every result is
/// exact in f32.
pub(crate) const fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = ((x >> 3) & 0xF) as i32;
    let man = (x & 7) as u32;
    // The value is man * 2^-9 (exp 0) or (8 + man) * 2^(exp - 10), halved.
    let (m, e) = if exp == 0 {
        (man, -10)
    } else {
        (8 + man, exp - 11)
    };
    m as f32 * f32::from_bits(((127 + e) as u32) << 23)
}

impl GgmlBlock for BlockNVFP4 {
    const TYPE: GgmlType = GgmlType::NVFP4;
    const BLOCK: usize = 64;
    type Act = BlockQ8_0;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(64)) {
            for (s, (y, qs)) in y.chunks_exact_mut(16).zip(b.qs.chunks_exact(8)).enumerate() {
                let d = ue4m3_to_f32_half(b.d[s]);
                for (j, &q) in qs.iter().enumerate() {
                    y[j] = KVALUES_MXFP4[(q & 0xF) as usize] as f32 * d;
                    y[j + 8] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
                }
            }
        }
    }

    /// `ggml_vec_dot_nvfp4_q8_0_generic`: `a` holds two Q8_0 blocks per block.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8_0]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a.chunks_exact(2)) {
            for s in 0..4 {
                let d = ue4m3_to_f32_half(x.d[s]);
                let y = &y[s / 2];
                let off = (s % 2) * 16;
                let qs = &x.qs[8 * s..8 * s + 8];
                let mut sumi = 0i32;
                for (j, &q) in qs.iter().enumerate() {
                    sumi += y.qs[off + j] as i32 * KVALUES_MXFP4[(q & 0xF) as usize] as i32;
                    sumi += y.qs[off + j + 8] as i32 * KVALUES_MXFP4[(q >> 4) as usize] as i32;
                }
                sumf += f16_to_f32(y.d) * d * sumi as f32;
            }
        }
        sumf
    }

    x86_kernels!(avx2: dot_nvfp4, avx512: dot_nvfp4);

    fn simd_pair(caps: super::CpuCaps) -> Option<super::PairDotFn<Self>> {
        #[cfg(target_arch = "x86_64")]
        if caps.has_avx512() {
            return Some(super::simd_x86_512::pair_nvfp4);
        }
        let _ = caps;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ue4m3_matches_ggml_formula() {
        // ggml_ue4m3_to_fp32: ldexpf(man, -9) or ldexpf(1 + man/8, exp - 7), times 0.5.
        for x in 0..=255u8 {
            let exp = ((x >> 3) & 0xF) as i32;
            let man = (x & 7) as f64;
            let want = if x & 0x7F == 0 || x & 0x7F == 0x7F && x == 0x7F {
                0.0
            } else if exp == 0 {
                man * 2f64.powi(-9) * 0.5
            } else {
                (1.0 + man / 8.0) * 2f64.powi(exp - 7) * 0.5
            };
            if x == 0 || x == 0x7F {
                assert_eq!(ue4m3_to_f32_half(x), 0.0, "{x:#x}");
            } else {
                assert_eq!(ue4m3_to_f32_half(x) as f64, want, "{x:#x}");
            }
        }
    }
}
