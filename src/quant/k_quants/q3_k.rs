//! Q3_K: 3-bit K-quant, 110 bytes per 256 weights.
//!
//! Layout (`block_q3_K`): `hmask: [u8; 32]` (bit `k` of byte `l` is the high
//! bit of weight `32k + l`; a *clear* bit subtracts 4), `qs: [u8; 64]` (low
//! two bits, arranged as Q2_K), `scales: [u8; 12]` (sixteen 6-bit scales
//! biased by 32: low nibbles in bytes 0-7, high bit pairs in bytes 8-11),
//! `d: f16`. `x = d * (sc - 32) * (q2 - (h ? 0 : 4))`.

use super::accumulate_8_lanes;
use crate::quant::common::f16_to_f32;
use crate::quant::{BlockQ8K, GgmlBlock, QK_K};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

impl BlockQ3K {
    /// The 16 unsigned 6-bit scales (bias 32 not yet taken off), four per
    /// little-endian word, in scale order (ggml's `aux` words): scale `j`
    /// has its low nibble in byte `j % 8` (low half for `j < 8`) and its
    /// high bit pair at bits `2 * (j / 4)` of byte `8 + j % 4`.
    #[inline(always)]
    pub(crate) fn scale_words(&self) -> [u32; 4] {
        const K1: u32 = 0x0303_0303;
        const K2: u32 = 0x0f0f_0f0f;
        let q = &self.scales;
        let u = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
        let (a0, a1, t) = (u(0), u(1), u(2));
        [
            (a0 & K2) | ((t & K1) << 4),
            (a1 & K2) | (((t >> 2) & K1) << 4),
            ((a0 >> 4) & K2) | (((t >> 4) & K1) << 4),
            ((a1 >> 4) & K2) | (((t >> 6) & K1) << 4),
        ]
    }

    /// The sixteen signed scales (`sc - 32`), unpacked branch-free.
    #[inline(always)]
    pub(crate) fn scales16(&self) -> [i32; 16] {
        let words = self.scale_words();
        let mut out = [0i32; 16];
        for (k, w) in words.iter().enumerate() {
            for (b, byte) in w.to_le_bytes().iter().enumerate() {
                out[4 * k + b] = *byte as i32 - 32;
            }
        }
        out
    }

    /// The 256 quants in element order, in `-4..=3`.
    pub(crate) fn quants(&self) -> [i8; QK_K] {
        let mut a = [0i8; QK_K];
        let mut m = 1u8;
        let mut o = 0;
        for q in self.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for l in 0..32 {
                    let sub = if self.hmask[l] & m != 0 { 0 } else { 4 };
                    a[o] = ((q[l] >> shift) & 3) as i8 - sub;
                    o += 1;
                }
                m <<= 1;
            }
        }
        a
    }
}

impl GgmlBlock for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const BLOCK: usize = QK_K;
    type Act = BlockQ8K;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = f16_to_f32(b.d);
            let sc = b.scales16();
            for (g, (y, q)) in y
                .chunks_exact_mut(16)
                .zip(b.quants().chunks_exact(16))
                .enumerate()
            {
                let dl = d * sc[g] as f32;
                for (o, &q) in y.iter_mut().zip(q) {
                    *o = dl * q as f32;
                }
            }
        }
    }

    /// `ggml_vec_dot_q3_K_q8_K` (8 float lanes, summed at the end).
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sums = [0.0f32; 8];
        for (x, y) in w.iter().zip(a) {
            let aux32 = accumulate_8_lanes(&x.quants(), &y.qs, 16, &x.scales16());
            let d = f16_to_f32(x.d) * y.d;
            for l in 0..8 {
                sums[l] += d * aux32[l] as f32;
            }
        }
        sums.iter().fold(0.0, |acc, s| acc + s)
    }

    x86_kernels!(avx2: dot_q3_k);
}
