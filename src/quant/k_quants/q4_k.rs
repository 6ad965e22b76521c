//! Q4_K: 4-bit K-quant, 144 bytes per 256 weights.
//!
//! Layout (`block_q4_K`): `d: f16`, `dmin: f16`, `scales: [u8; 12]` (eight
//! 6-bit scales and eight 6-bit mins, packed as in [`get_scale_min_k4`]),
//! `qs: [u8; 128]`. Each 64-weight chunk uses 32 bytes: weights `0..32` in
//! the low nibbles (sub-block `2c`), `32..64` in the high nibbles (`2c+1`).
//! `x = d * sc * q - dmin * m`.

use super::accumulate_8_lanes;
use crate::quant::common::{
    f16_to_f32, f32_to_f16, get_scale_min_k4, make_qkx2_quants, nearest_int, pack_scale_min_k4,
    scale_mins_k4,
};
use crate::quant::{BlockQ8K, GgmlBlock, QuantError, QK_K};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

impl BlockQ4K {
    /// The eight (scale, min) pairs.
    #[inline(always)]
    pub(crate) fn scale_mins(&self) -> ([u8; 8], [u8; 8]) {
        scale_mins_k4(&self.scales)
    }
}

impl GgmlBlock for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const BLOCK: usize = QK_K;
    const HAS_FROM_F32: bool = true;
    type Act = BlockQ8K;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let (d, min) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
            let (sc, m) = b.scale_mins();
            for (c, (y, q)) in y
                .chunks_exact_mut(64)
                .zip(b.qs.chunks_exact(32))
                .enumerate()
            {
                let (d1, m1) = (d * sc[2 * c] as f32, min * m[2 * c] as f32);
                let (d2, m2) = (d * sc[2 * c + 1] as f32, min * m[2 * c + 1] as f32);
                for l in 0..32 {
                    y[l] = d1 * (q[l] & 0xF) as f32 - m1;
                    y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
                }
            }
        }
    }

    /// `ggml_vec_dot_q4_K_q8_K` (8 float lanes, mins via `bsums`).
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sums = [0.0f32; 8];
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let mut aux8 = [0i8; QK_K];
            for (c, q) in x.qs.chunks_exact(32).enumerate() {
                for l in 0..32 {
                    aux8[64 * c + l] = (q[l] & 0xF) as i8;
                    aux8[64 * c + 32 + l] = (q[l] >> 4) as i8;
                }
            }
            let (sc, m) = x.scale_mins();
            let sumi: i32 = (0..16).map(|j| y.bsums[j] as i32 * m[j / 2] as i32).sum();
            let scales = sc.map(|s| s as i32);
            let aux32 = accumulate_8_lanes(&aux8, &y.qs, 32, &scales);
            let d = f16_to_f32(x.d) * y.d;
            for l in 0..8 {
                sums[l] += d * aux32[l] as f32;
            }
            let dmin = f16_to_f32(x.dmin) * y.d;
            sumf -= dmin * sumi as f32;
        }
        sums.iter().fold(sumf, |acc, s| acc + s)
    }

    /// `quantize_row_q4_K_ref`: per 32 weights `make_qkx2_quants(15, ...)`
    /// with weights `rms + |x|`, then 6-bit scales relative to the maxima.
    fn from_f32(x: &[f32], out: &mut [Self]) -> Result<(), QuantError> {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
            let mut l = [0u8; QK_K];
            let mut laux = [0u8; 32];
            let mut weights = [0.0f32; 32];
            let (mut scales, mut mins) = ([0.0f32; 8], [0.0f32; 8]);
            let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
            for j in 0..8 {
                let xs = &x[32 * j..32 * j + 32];
                let sum_x2: f32 = xs.iter().fold(0.0, |s, v| s + v * v);
                let av_x = (sum_x2 / 32.0).sqrt();
                for (w, v) in weights.iter_mut().zip(xs) {
                    *w = av_x + v.abs();
                }
                let (s, m) = make_qkx2_quants(
                    15,
                    xs,
                    &weights,
                    &mut l[32 * j..32 * j + 32],
                    &mut laux,
                    -1.0,
                    0.1,
                    20,
                    false,
                );
                scales[j] = s;
                mins[j] = m;
                if s > max_scale {
                    max_scale = s;
                }
                if m > max_min {
                    max_min = m;
                }
            }
            let inv_scale = if max_scale > 0.0 {
                63.0 / max_scale
            } else {
                0.0
            };
            let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
            let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
            for j in 0..8 {
                ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
                lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
            }
            b.scales = pack_scale_min_k4(&ls, &lm);
            b.d = f32_to_f16(max_scale / 63.0);
            b.dmin = f32_to_f16(max_min / 63.0);
            for j in 0..8 {
                let (sc, m) = get_scale_min_k4(j, &b.scales);
                let d = f16_to_f32(b.d) * sc as f32;
                if d == 0.0 {
                    continue;
                }
                let dm = f16_to_f32(b.dmin) * m as f32;
                for ii in 0..32 {
                    l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, 15) as u8;
                }
            }
            for (c, q) in b.qs.chunks_exact_mut(32).enumerate() {
                for i in 0..32 {
                    q[i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
                }
            }
        }
        Ok(())
    }

    x86_kernels!(avx2: dot_q4_k);
}
