//! IQ4_NL and IQ4_XS: 4-bit indices into the non-linear grid
//! [`KVALUES_IQ4NL`] (-127..113).
//!
//! IQ4_NL (`block_iq4_nl`, 18 bytes / 32 weights): `d: f16`, `qs: [u8; 16]`,
//! nibbles as Q4_0 (byte `j` = weights `j` low, `j + 16` high);
//! `x = d * kv[q]`. Dotted against Q8_0.
//!
//! IQ4_XS (`block_iq4_xs`, 136 bytes / 256 weights): `d: f16`,
//! `scales_h: u16`, `scales_l: [u8; 4]`, `qs: [u8; 128]`. Eight sub-blocks of
//! 32 have 6-bit scales `ls = lo4 | hi2 << 4` (low nibble of
//! `scales_l[ib / 2]` for even `ib`, high for odd; `hi2` = bits `2ib..2ib+2`
//! of `scales_h`), `x = d * (ls - 32) * kv[q]`; each sub-block's 16 `qs`
//! bytes are nibble-packed as IQ4_NL. Dotted against Q8_K.

use super::common::{f16_to_f32, KVALUES_IQ4NL};
use super::{BlockQ8K, BlockQ8_0, GgmlBlock, QK_K};
use crate::tensor::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockIQ4NL>() == 18);

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ4XS {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIQ4XS>() == 136);

/// `sum(kv[lo(qs[j])] * q8[j] + kv[hi(qs[j])] * q8[j + 16])` over 16 bytes.
#[inline(always)]
fn dot_nl16(qs: &[u8], q8: &[i8]) -> i32 {
    let (mut s1, mut s2) = (0i32, 0i32);
    for j in 0..16 {
        s1 += q8[j] as i32 * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as i32;
        s2 += q8[j + 16] as i32 * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
    }
    s1 + s2
}

impl GgmlBlock for BlockIQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const BLOCK: usize = 32;
    type Act = BlockQ8_0;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(32)) {
            let d = f16_to_f32(b.d);
            for (j, &q) in b.qs.iter().enumerate() {
                y[j] = d * KVALUES_IQ4NL[(q & 0xF) as usize] as f32;
                y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
            }
        }
    }

    /// `ggml_vec_dot_iq4_nl_q8_0`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8_0]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = f16_to_f32(y.d) * f16_to_f32(x.d);
            sumf += d * dot_nl16(&x.qs, &y.qs) as f32;
        }
        sumf
    }

    x86_kernels!(avx2: dot_iq4_nl, avx512: dot_iq4_nl);
}

impl BlockIQ4XS {
    /// The 6-bit scale of sub-block `ib` (0..8), minus 32.
    #[inline(always)]
    pub(crate) fn scale(&self, ib: usize) -> i32 {
        let lo = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let hi = ((self.scales_h >> (2 * ib)) & 3) as u8;
        (lo | (hi << 4)) as i32 - 32
    }
}

impl GgmlBlock for BlockIQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    const BLOCK: usize = QK_K;
    type Act = BlockQ8K;

    fn to_f32(blocks: &[Self], out: &mut [f32]) {
        for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = f16_to_f32(b.d);
            for (ib, (y, qs)) in y
                .chunks_exact_mut(32)
                .zip(b.qs.chunks_exact(16))
                .enumerate()
            {
                let dl = d * b.scale(ib) as f32;
                for j in 0..16 {
                    y[j] = dl * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f32;
                    y[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
                }
            }
        }
    }

    /// `ggml_vec_dot_iq4_xs_q8_K`.
    fn vec_dot(_n: usize, w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d4d8 = f16_to_f32(x.d) * y.d;
            for ib in 0..QK_K / 32 {
                let dl = d4d8 * x.scale(ib) as f32;
                let s = dot_nl16(&x.qs[16 * ib..16 * ib + 16], &y.qs[32 * ib..32 * ib + 32]);
                sumf += dl * s as f32;
            }
        }
        sumf
    }

    x86_kernels!(avx2: dot_iq4_xs);
}
