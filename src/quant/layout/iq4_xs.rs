//! IQ4_XS's interleaved layout: groups of eight rows rewritten super-block
//! by super-block so that one vector load holds the same four quant bytes
//! of all eight rows, the rows' `d` are one `vcvtph2ps` and their scales
//! two loads (the byte map is in `simd_x86::packed_iq4xs`'s docs). The
//! eight rows' 136-byte blocks become 1088 bytes holding the same bytes in
//! another order.
//!
//! ggml does not repack IQ4_XS on x86, so llama.cpp at its defaults runs
//! `ggml_vec_dot_iq4_xs_q8_K` for a product of fewer than eight activation
//! rows and its tiled path from there on. This layout keeps both sets of
//! bits, as Q6_K's does (`q6_k`): its kernel sums as the AVX2 `vec_dot`
//! does with one row per lane of each of its eight accumulators, and the
//! tiled path's kernels gather each row's block back from the layout. It
//! is taken on AVX-512 CPUs only (F + BW + VL + VNNI: `vpdpwssd` and the 32
//! registers for the eight accumulators).

use super::GROUP_ROWS;
use crate::tensor::GgmlType;

/// Bytes of an IQ4_XS block and of an eight-row group's super-block.
const BLOCK: usize = 136;
pub(crate) const GROUP_BLOCK: usize = GROUP_ROWS * BLOCK;
/// Where a group super-block keeps its parts: the quant chunks at 0, the
/// rows' `d`, their `scales_h`, their `scales_l`.
pub(crate) const D: usize = 1024;
pub(crate) const SCALES_H: usize = 1040;
pub(crate) const SCALES_L: usize = 1056;
/// Where a plain block keeps them (`d` at 0).
const PLAIN_SCALES_H: usize = 2;
const PLAIN_SCALES_L: usize = 4;
const PLAIN_QS: usize = 8;

/// IQ4_XS in this layout ([`super::plain_bits::PlainBits`]).
pub(super) struct IQ4XS;

impl super::plain_bits::Moved for IQ4XS {
    const TY: GgmlType = GgmlType::IQ4_XS;
    /// Byte `i` of row `r`'s plain block goes to `packed[map(r, i)]`.
    fn map(r: usize, i: usize) -> usize {
        match i {
            0..PLAIN_SCALES_H => D + 2 * r + i,
            PLAIN_SCALES_H..PLAIN_SCALES_L => SCALES_H + 2 * r + (i - PLAIN_SCALES_H),
            PLAIN_SCALES_L..PLAIN_QS => SCALES_L + 4 * r + (i - PLAIN_SCALES_L),
            // 128 quant bytes in 32 chunks of 4: chunk `c` of row `r` at
            // `(8c + r) * 4`.
            _ => {
                let q = i - PLAIN_QS;
                (8 * (q / 4) + r) * 4 + q % 4
            }
        }
    }
    // The 32 quant chunks; `d`, `scales_h` and `scales_l` in twos.
    // One run: the lint's worry (a range meant as its items) is not this.
    #[allow(clippy::single_range_in_vec_init)]
    const CHUNKS: &'static [std::ops::Range<usize>] = &[PLAIN_QS..BLOCK];
    const TWOS: std::ops::Range<usize> = 0..PLAIN_QS;
}

/// The kernels: [`packed_iq4xs::dot8`](crate::quant::simd_x86::packed_iq4xs::dot8)
/// (`vec_dot`'s order whatever `gemm` says), and the tiled path's blocks
/// read from the layout.
#[cfg(target_arch = "x86_64")]
impl super::GroupDot for IQ4XS {
    unsafe fn dot<const N: usize>(
        g: &[u8],
        a: [&[crate::quant::BlockQ8K]; N],
        out: &mut [[f32; GROUP_ROWS]; N],
        _gemm: bool,
    ) {
        crate::quant::simd_x86::packed_iq4xs::dot8(g, a, out)
    }
}

#[cfg(target_arch = "x86_64")]
impl super::plain_bits::PlainBits for IQ4XS {
    type Block = crate::quant::BlockIQ4XS;
    fn blocks(bytes: &[u8]) -> impl crate::quant::ggml_tiled::Blocks<Self::Block> + '_ {
        crate::quant::ggml_tiled::IQ4XSGroups { bytes }
    }
}
