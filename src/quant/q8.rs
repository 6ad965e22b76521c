//! 8-bit blocks: Q8_0 (a weight type and the activation type of Q4_0, Q5_0,
//! Q8_0, IQ4_NL and MXFP4), Q8_1 (activations for Q4_1 / Q5_1) and Q8_K
//! (activations for the K-quants and IQ4_XS).

use super::common::{f16_to_f32, f32_to_f16, nearest_int};
use super::{ActBlock, GgmlBlock, QuantError, QK_K};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Q8_0, 34 bytes for 32 weights: `d: f16`, `qs: [i8; 32]`; `x[j] = d * qs[j]`.
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// Q8_1, 36 bytes for 32 values: `d: f16`, `s: f16` (= `d * sum(qs)`, used
/// by the Q4_1 / Q5_1 dots for the min term), `qs: [i8; 32]`.
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

/// Q8_K, 292 bytes for 256 values: `d: f32`, `qs: [i8; 256]`, and
/// `bsums: [i16; 16]`, the sums of each 16 consecutive `qs` (the K-quant dots
/// use them for the min / offset terms).
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

/// Symmetric 8-bit quantisation of 32 activations exactly as ggml's x86 CPU
/// path (`quantize_row_q8_0` / `_q8_1` in `ggml-cpu/arch/x86/quants.c`):
/// `d = amax / 127`, multiplier `127 / amax`, round half to even. (The
/// portable `_ref` version uses `1 / d` and `roundf`; trained models with
/// outlier activations are sensitive enough that the difference shows in
/// greedy output, so we follow the path llama.cpp really runs.) Returns `(d, qs)`.
#[inline(always)]
fn q8_32(x: &[f32]) -> (f32, [i8; 32]) {
    // The largest |v| over eight independent lanes (so it vectorises); a
    // maximum is the same in any order, and `max` skips NaNs either way.
    let mut lanes = [0.0f32; 8];
    for c in x.chunks_exact(8) {
        for (m, v) in lanes.iter_mut().zip(c) {
            *m = m.max(v.abs());
        }
    }
    let amax = x
        .chunks_exact(8)
        .remainder()
        .iter()
        .fold(lanes.iter().fold(0.0f32, |m, &v| m.max(v)), |m, v| {
            m.max(v.abs())
        });
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, v) in qs.iter_mut().zip(x) {
        *q = round_even(v * id) as i8;
    }
    (d, qs)
}

/// Round half to even for `|x| < 2^22` (activations scaled to ±127): adding
/// and subtracting 1.5 * 2^23 leaves the nearest integer under the default
/// rounding mode. `f32::round_ties_even` compiles to a libm call (`rintf`)
/// on baseline x86-64, which dominated activation quantisation.
#[inline(always)]
fn round_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

impl ActBlock for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const BLOCK: usize = 32;
    /// `quantize_row_q8_0_ref`.
    #[inline(always)]
    fn quantize_act(x: &[f32], out: &mut [Self]) {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
            let (d, qs) = q8_32(x);
            *b = BlockQ8_0 {
                d: f32_to_f16(d),
                qs,
            };
        }
    }
}

impl GgmlBlock for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const BLOCK: usize = 32;
    const HAS_FROM_F32: bool = true;
    type Act = BlockQ8_0;
    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
            let d = f16_to_f32(b.d);
            for (o, q) in y.iter_mut().zip(b.qs) {
                *o = q as f32 * d;
            }
        }
    }
    /// `ggml_vec_dot_q8_0_q8_0`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8_0]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let sumi: i32 =
                x.qs.iter()
                    .zip(&y.qs)
                    .map(|(&p, &q)| p as i32 * q as i32)
                    .sum();
            sumf += sumi as f32 * (f16_to_f32(x.d) * f16_to_f32(y.d));
        }
        sumf
    }
    fn from_f32(x: &[f32], out: &mut [Self]) -> Result<(), QuantError> {
        Self::quantize_act(x, out);
        Ok(())
    }
    // No AVX-512 kernel: ggml runs the 8-lane AVX2 order on AVX-512 CPUs
    // too, and pairing blocks in 16 lanes would change the float sums.
    x86_kernels!(avx2: dot_q8_0, avx512: dot_q8_0);
}

impl ActBlock for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    const BLOCK: usize = 32;
    /// `quantize_row_q8_1_ref`, including `s = d * sum(qs)`.
    #[inline(always)]
    fn quantize_act(x: &[f32], out: &mut [Self]) {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
            let (d, qs) = q8_32(x);
            let sum: i32 = qs.iter().map(|&q| q as i32).sum();
            *b = BlockQ8_1 {
                d: f32_to_f16(d),
                s: f32_to_f16(sum as f32 * d),
                qs,
            };
        }
    }
}

impl ActBlock for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8_K;
    const BLOCK: usize = QK_K;
    /// `quantize_row_q8_K_ref`: scale `-127 / max` (signed max), quants
    /// clamped to 127, block sums of 16; an all-zero block is all zeros.
    #[inline(always)]
    fn quantize_act(x: &[f32], out: &mut [Self]) {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
            *b = BlockQ8K::zeroed();
            // The largest |v| (a max, so any order gives it), then the first
            // element reaching it: the value a sequential `>` scan keeps.
            // In 8 lanes, then across them: `if a > m { a } else { m }` keeps
            // the same value in any order (NaNs are skipped either way), and
            // in lanes it is one `vmaxps` per 8 values.
            let gt = |m: f32, a: f32| if a > m { a } else { m };
            let mut lanes = [0.0f32; 8];
            for c in x.chunks_exact(8) {
                for (m, v) in lanes.iter_mut().zip(c) {
                    *m = gt(*m, v.abs());
                }
            }
            let amax = lanes.iter().fold(0.0f32, |m, &v| gt(m, v));
            if amax == 0.0 {
                continue;
            }
            let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
            let iscale = -127.0 / max;
            for (q, &v) in b.qs.iter_mut().zip(x) {
                *q = nearest_int(iscale * v).min(127) as i8;
            }
            for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
                *s = q.iter().map(|&v| v as i16).sum();
            }
            b.d = 1.0 / iscale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_1_sum_field_is_d_times_sum() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut b = [BlockQ8_1::zeroed()];
        BlockQ8_1::quantize_act(&x, &mut b);
        let sum: i32 = b[0].qs.iter().map(|&q| q as i32).sum();
        let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        assert_eq!(b[0].s, f32_to_f16(sum as f32 * d));
    }

    #[test]
    fn q8_k_bsums_and_extremes() {
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.1)
            .collect();
        let mut b = [BlockQ8K::zeroed()];
        BlockQ8K::quantize_act(&x, &mut b);
        for j in 0..16 {
            let s: i32 = b[0].qs[j * 16..j * 16 + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(b[0].bsums[j] as i32, s);
        }
        assert!(b[0].qs.iter().all(|&q| q >= -127));
        let zeros = vec![0.0f32; 256];
        BlockQ8K::quantize_act(&zeros, &mut b);
        assert_eq!(b[0], BlockQ8K::zeroed());
    }

    #[test]
    fn q8_k_scale_comes_from_the_first_extreme() {
        // |-1.1| == |1.1|: ggml's scan keeps the first as `max`, so the
        // scale is -127 / first: the first extreme becomes -127, the second
        // +127, and d carries the first one's sign.
        for (first, second) in [(-1.1f32, 1.1f32), (1.1, -1.1)] {
            let mut x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin() * 0.5).collect();
            x[40] = first;
            x[200] = second;
            let mut b = [BlockQ8K::zeroed()];
            BlockQ8K::quantize_act(&x, &mut b);
            assert_eq!(b[0].d, 1.0 / (-127.0 / first));
            assert_eq!((b[0].qs[40], b[0].qs[200]), (-127, 127));
        }
    }
}
