//! Q6_K: 6-bit K-quant, 210 bytes per 256 weights.
//!
//! Layout (`block_q6_K`): `ql: [u8; 128]` (low nibbles), `qh: [u8; 64]` (high
//! bit pairs), `scales: [i8; 16]` (one per 16 weights), `d: f16`. Each
//! 128-weight half uses 64 `ql` and 32 `qh` bytes: for `l < 32`, weights
//! `l`, `l+32`, `l+64`, `l+96` take `ql[l]` low, `ql[l+32]` low, `ql[l]` high,
//! `ql[l+32]` high nibbles and bit pairs 0, 2, 4, 6 of `qh[l]`.
//! `x = d * sc * (q - 32)`.

use super::accumulate_8_lanes;
use crate::quant::common::{
    f16_to_f32, f32_to_f16, make_qx_quants_rmse1, nearest_int, GROUP_MAX_EPS,
};
use crate::quant::{BlockQ8K, GgmlBlock, QuantError, QK_K};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl BlockQ6K {
    /// The 256 signed quants (-32..32) in element order.
    pub(crate) fn quants(&self) -> [i8; QK_K] {
        let mut a = [0i8; QK_K];
        for h in 0..2 {
            let (ql, qh) = (&self.ql[64 * h..64 * h + 64], &self.qh[32 * h..32 * h + 32]);
            let a = &mut a[128 * h..128 * h + 128];
            for l in 0..32 {
                a[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                a[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                a[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                a[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        a
    }
}

impl GgmlBlock for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const BLOCK: usize = QK_K;
    const HAS_FROM_F32: bool = true;
    type Act = BlockQ8K;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = f16_to_f32(b.d);
            let q = b.quants();
            for (g, (y, q)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
                let ds = d * b.scales[g] as f32;
                for (o, &q) in y.iter_mut().zip(q) {
                    *o = ds * q as f32;
                }
            }
        }
    }

    /// `ggml_vec_dot_q6_K_q8_K` (8 float lanes).
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sums = [0.0f32; 8];
        for (x, y) in w.iter().zip(a) {
            let scales = x.scales.map(|s| s as i32);
            let aux32 = accumulate_8_lanes(&x.quants(), &y.qs, 16, &scales);
            let d = f16_to_f32(x.d) * y.d;
            for l in 0..8 {
                sums[l] += d * aux32[l] as f32;
            }
        }
        sums.iter().fold(0.0, |acc, s| acc + s)
    }

    /// `quantize_row_q6_K_ref`: `make_qx_quants(16, 32, ..., rmse_type 1)`
    /// per 16 weights, 8-bit signed scales relative to the largest.
    fn from_f32(x: &[f32], out: &mut [Self]) -> Result<(), QuantError> {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
            let mut l = [0i8; QK_K];
            let mut scales = [0.0f32; 16];
            let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
            for ib in 0..16 {
                let s = make_qx_quants_rmse1(
                    32,
                    &x[16 * ib..16 * ib + 16],
                    &mut l[16 * ib..16 * ib + 16],
                );
                scales[ib] = s;
                if s.abs() > max_abs_scale {
                    max_abs_scale = s.abs();
                    max_scale = s;
                }
            }
            *b = BlockQ6K::zeroed();
            if max_abs_scale < GROUP_MAX_EPS {
                continue;
            }
            let iscale = -128.0 / max_scale;
            b.d = f32_to_f16(1.0 / iscale);
            for ib in 0..16 {
                b.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
            }
            for j in 0..16 {
                let d = f16_to_f32(b.d) * b.scales[j] as f32;
                if d == 0.0 {
                    continue;
                }
                for ii in 0..16 {
                    let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                    l[16 * j + ii] = (q + 32) as i8;
                }
            }
            for h in 0..2 {
                let l = &l[128 * h..128 * h + 128];
                for i in 0..32 {
                    let q = |k: usize| l[i + 32 * k] as u8;
                    b.ql[64 * h + i] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
                    b.ql[64 * h + i + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
                    b.qh[32 * h + i] =
                        (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
                }
            }
        }
        Ok(())
    }

    x86_kernels!(avx2: dot_q6_k, avx512: dot_q6_k);
}
