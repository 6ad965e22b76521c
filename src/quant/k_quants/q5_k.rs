//! Q5_K: 5-bit K-quant, 176 bytes per 256 weights.
//!
//! Layout (`block_q5_K`): `d: f16`, `dmin: f16`, `scales: [u8; 12]` (as
//! Q4_K), `qh: [u8; 32]` (bit `k` of byte `l` is the fifth bit of weight
//! `32k + l`), `qs: [u8; 128]` (low nibbles as Q4_K).
//! `x = d * sc * q - dmin * m`.

use super::accumulate_8_lanes;
use crate::quant::common::{f16_to_f32, get_scale_min_k4, scale_mins_k4};
use crate::quant::{BlockQ8K, GgmlBlock, QK_K};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

impl BlockQ5K {
    /// The eight (scale, min) pairs.
    #[inline(always)]
    pub(crate) fn scale_mins(&self) -> ([u8; 8], [u8; 8]) {
        scale_mins_k4(&self.scales)
    }

    /// The 256 unsigned quants (0..32) in element order.
    pub(crate) fn quants(&self) -> [i8; QK_K] {
        let mut a = [0i8; QK_K];
        for (c, q) in self.qs.chunks_exact(32).enumerate() {
            let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
            for l in 0..32 {
                let h1 = if self.qh[l] & m1 != 0 { 16 } else { 0 };
                let h2 = if self.qh[l] & m2 != 0 { 16 } else { 0 };
                a[64 * c + l] = ((q[l] & 0xF) + h1) as i8;
                a[64 * c + 32 + l] = ((q[l] >> 4) + h2) as i8;
            }
        }
        a
    }
}

impl GgmlBlock for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const BLOCK: usize = QK_K;
    type Act = BlockQ8K;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let (d, min) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
            let q = b.quants();
            for (j, (y, q)) in y.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
                let (sc, m) = get_scale_min_k4(j, &b.scales);
                let (dl, ml) = (d * sc as f32, min * m as f32);
                for (o, &q) in y.iter_mut().zip(q) {
                    *o = dl * q as f32 - ml;
                }
            }
        }
    }

    /// `ggml_vec_dot_q5_K_q8_K` (8 float lanes, mins via `bsums`).
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sums = [0.0f32; 8];
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let (mut sc, mut m) = ([0i32; 8], [0i32; 8]);
            for j in 0..8 {
                let (s, mm) = get_scale_min_k4(j, &x.scales);
                sc[j] = s as i32;
                m[j] = mm as i32;
            }
            let sumi: i32 = (0..16).map(|j| y.bsums[j] as i32 * m[j / 2]).sum();
            let aux32 = accumulate_8_lanes(&x.quants(), &y.qs, 32, &sc);
            let d = f16_to_f32(x.d) * y.d;
            for l in 0..8 {
                sums[l] += d * aux32[l] as f32;
            }
            let dmin = f16_to_f32(x.dmin) * y.d;
            sumf -= dmin * sumi as f32;
        }
        sums.iter().fold(sumf, |acc, s| acc + s)
    }

    x86_kernels!(avx2: dot_q5_k);
}
