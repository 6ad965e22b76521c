//! Plain floating-point "blocks" of one element: F32, F16 (IEEE binary16) and
//! BF16 (the top 16 bits of an f32). Each is its own activation type, as in
//! ggml (`vec_dot_type` of F16 is F16, of BF16 is BF16).
//!
//! Dots accumulate in f64 like ggml's scalar `ggml_vec_dot_f32/f16/bf16`
//! (`ggml_float`); the SIMD kernels accumulate in f32 lanes.

use super::{ActBlock, GgmlBlock, QuantError};
use crate::tensor::GgmlType;
use half::{bf16, f16};

/// ggml's `ggml_compute_fp32_to_bf16`: NaNs become quiet NaNs, everything
/// else rounds to nearest even.
#[inline]
pub(crate) fn f32_to_bf16(x: f32) -> bf16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return bf16::from_bits(((u >> 16) | 64) as u16);
    }
    let r = (u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16;
    bf16::from_bits(r as u16)
}

#[inline(always)]
pub(crate) fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

impl ActBlock for f32 {
    const TYPE: GgmlType = GgmlType::F32;
    const BLOCK: usize = 1;
    #[inline(always)]
    fn quantize_act(x: &[f32], out: &mut [Self]) {
        out.copy_from_slice(x);
    }
}

impl GgmlBlock for f32 {
    const TYPE: GgmlType = GgmlType::F32;
    const BLOCK: usize = 1;
    const HAS_FROM_F32: bool = true;
    type Act = f32;
    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        out.copy_from_slice(blocks);
    }
    fn vec_dot(_n: usize, w: &[Self], a: &[f32]) -> f32 {
        let mut sum = 0.0f64;
        for (x, y) in w.iter().zip(a) {
            sum += (x * y) as f64;
        }
        sum as f32
    }
    fn from_f32(x: &[f32], out: &mut [Self]) -> Result<(), QuantError> {
        out.copy_from_slice(x);
        Ok(())
    }
    x86_kernels!(avx2: dot_f32, avx512: dot_f32);
}

impl ActBlock for f16 {
    const TYPE: GgmlType = GgmlType::F16;
    const BLOCK: usize = 1;
    #[inline(always)]
    fn quantize_act(x: &[f32], out: &mut [Self]) {
        for (o, v) in out.iter_mut().zip(x) {
            *o = f16::from_f32(*v);
        }
    }
}

impl GgmlBlock for f16 {
    const TYPE: GgmlType = GgmlType::F16;
    const BLOCK: usize = 1;
    const HAS_FROM_F32: bool = true;
    type Act = f16;
    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (o, v) in out.iter_mut().zip(blocks) {
            *o = v.to_f32();
        }
    }
    fn vec_dot(_n: usize, w: &[Self], a: &[f16]) -> f32 {
        let mut sum = 0.0f64;
        for (x, y) in w.iter().zip(a) {
            sum += (x.to_f32() * y.to_f32()) as f64;
        }
        sum as f32
    }
    fn from_f32(x: &[f32], out: &mut [Self]) -> Result<(), QuantError> {
        <f16 as ActBlock>::quantize_act(x, out);
        Ok(())
    }
    x86_kernels!(avx2: dot_f16);
}

impl ActBlock for bf16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const BLOCK: usize = 1;
    #[inline(always)]
    fn quantize_act(x: &[f32], out: &mut [Self]) {
        for (o, v) in out.iter_mut().zip(x) {
            *o = f32_to_bf16(*v);
        }
    }
}

impl GgmlBlock for bf16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const BLOCK: usize = 1;
    const HAS_FROM_F32: bool = true;
    type Act = bf16;
    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (o, v) in out.iter_mut().zip(blocks) {
            *o = bf16_to_f32(*v);
        }
    }
    fn vec_dot(_n: usize, w: &[Self], a: &[bf16]) -> f32 {
        let mut sum = 0.0f64;
        for (x, y) in w.iter().zip(a) {
            sum += (bf16_to_f32(*x) * bf16_to_f32(*y)) as f64;
        }
        sum as f32
    }
    fn from_f32(x: &[f32], out: &mut [Self]) -> Result<(), QuantError> {
        <bf16 as ActBlock>::quantize_act(x, out);
        Ok(())
    }
    x86_kernels!(avx2: dot_bf16);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nan() {
        assert_eq!(f32_to_bf16(1.0).to_bits(), 0x3f80);
        // 1 + 2^-8 is a tie between 1.0 and 1 + 2^-7: rounds to even (1.0).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)).to_bits(), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)).to_bits(), 0x3f82);
        let nan = f32_to_bf16(f32::from_bits(0x7f80_0001));
        assert!(bf16_to_f32(nan).is_nan());
    }
}
