//! Q6_K's interleaved layout: groups of eight rows rewritten super-block by
//! super-block so that one vector load holds the same four bytes of the
//! low-nibble or the high-bit quants of all eight rows, the rows' `d` are
//! one `vcvtph2ps` and one 16-byte load gives a pair of sub-block scales
//! of every row (the byte map is in `simd_x86::packed_q6k`'s docs). The
//! eight rows' 210-byte blocks become 1680 bytes holding the same bytes in
//! another order.
//!
//! ggml does not repack Q6_K on x86, so llama.cpp at its defaults runs
//! `ggml_vec_dot_q6_K_q8_K` for a product of fewer than
//! [`MIN_BATCH`](crate::quant::ggml_tiled::MIN_BATCH) activation rows and
//! its tiled path from there on. This layout keeps both sets of bits: its
//! kernel sums as the AVX2 `vec_dot` does (eight exact i32 lanes per
//! super-block, one FMA each, the lanes' tree at the end), with one row per
//! lane of each of those eight accumulators instead of one horizontal sum
//! per row; batches of the tiled path's size run its kernels, which decode
//! each block from this layout into the same tile as from the plain bytes. The layout is taken on AVX-512 CPUs only
//! (F + BW + VL + VNNI), whose 32 vector registers and `vpdpwssd` let a
//! group's eight accumulators and its sixteen scale vectors sit beside the
//! quants; on AVX2 the eight-row kernel would run as many instructions per
//! value as the plain one.

use super::GROUP_ROWS;
use crate::tensor::GgmlType;

/// Bytes of a Q6_K block and of an eight-row group's super-block.
const BLOCK: usize = 210;
pub(crate) const GROUP_BLOCK: usize = GROUP_ROWS * BLOCK;
/// Where a group super-block keeps its parts: the low-nibble quant chunks
/// at 0, the high-bit chunks, the scale pairs, the rows' `d`.
pub(crate) const QH: usize = 1024;
pub(crate) const SCALES: usize = 1536;
pub(crate) const D: usize = 1664;
/// Where a plain block keeps them (`ql` at 0).
const PLAIN_QH: usize = 128;
const PLAIN_SCALES: usize = 192;
const PLAIN_D: usize = 208;

/// Q6_K in this layout ([`super::plain_bits::PlainBits`]).
pub(super) struct Q6K;

impl super::plain_bits::Moved for Q6K {
    const TY: GgmlType = GgmlType::Q6_K;
    /// Byte `i` of row `r`'s plain block goes to `packed[map(r, i)]`.
    fn map(r: usize, i: usize) -> usize {
        match i {
            // 128 low-nibble bytes in 32 chunks of 4: chunk `c` of row `r` at
            // `(8c + r) * 4`.
            0..PLAIN_QH => (8 * (i / 4) + r) * 4 + i % 4,
            // 64 high-bit bytes in 16 chunks of 4, the same way.
            PLAIN_QH..PLAIN_SCALES => {
                let q = i - PLAIN_QH;
                QH + (8 * (q / 4) + r) * 4 + q % 4
            }
            // Sixteen scales in pairs: pair `p` of row `r` at `16p + 2r`.
            PLAIN_SCALES..PLAIN_D => {
                let s = i - PLAIN_SCALES;
                SCALES + 16 * (s / 2) + 2 * r + s % 2
            }
            _ => D + 2 * r + (i - PLAIN_D),
        }
    }
    // The 48 four-byte chunks of `ql` then `qh`; the scale pairs and `d`.
    const CHUNKS: &'static [std::ops::Range<usize>] = &[0..PLAIN_QH, PLAIN_QH..PLAIN_SCALES];
    const TWOS: std::ops::Range<usize> = PLAIN_SCALES..BLOCK;
}

/// The kernels: [`packed_q6k::dot8`](crate::quant::simd_x86::packed_q6k::dot8)
/// (`vec_dot`'s order whatever `gemm` says), and the tiled path's blocks
/// read from the layout.
#[cfg(target_arch = "x86_64")]
impl super::GroupDot for Q6K {
    unsafe fn dot<const N: usize>(
        g: &[u8],
        a: [&[crate::quant::BlockQ8K]; N],
        out: &mut [[f32; GROUP_ROWS]; N],
        _gemm: bool,
    ) {
        crate::quant::simd_x86::packed_q6k::dot8(g, a, out)
    }
}

#[cfg(target_arch = "x86_64")]
impl super::plain_bits::PlainBits for Q6K {
    type Block = crate::quant::BlockQ6K;
    fn blocks(bytes: &[u8]) -> impl crate::quant::ggml_tiled::Blocks<Self::Block> + '_ {
        crate::quant::ggml_tiled::Q6KGroups { bytes }
    }
}
