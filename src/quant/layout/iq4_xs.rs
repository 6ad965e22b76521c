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

use super::{Interleaved, Rows, GROUP_ROWS};
use crate::quant::QuantError;
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

/// IQ4_XS on the CPU's AVX-512 kernel.
pub(super) struct Interleaved8;

/// Byte `i` of plain block `blk` of row `r` goes to `packed[map(r, i)]`.
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

impl super::Moved for Interleaved8 {
    const TY: GgmlType = GgmlType::IQ4_XS;
    fn map(r: usize, i: usize) -> usize {
        map(r, i)
    }
    // The 32 quant chunks; `d`, `scales_h` and `scales_l` in twos.
    const FOURS: std::ops::Range<usize> = PLAIN_QS..BLOCK;
    const TWOS: std::ops::Range<usize> = 0..PLAIN_QS;
}

/// [`packed_iq4xs::dot8`](crate::quant::simd_x86::packed_iq4xs::dot8) as a
/// group kernel (`vec_dot`'s order whatever `gemm` says).
#[cfg(target_arch = "x86_64")]
struct Kernel;

#[cfg(target_arch = "x86_64")]
impl super::GroupDot for Kernel {
    unsafe fn dot<const N: usize>(
        g: &[u8],
        a: [&[crate::quant::BlockQ8K]; N],
        out: &mut [[f32; GROUP_ROWS]; N],
        _gemm: bool,
    ) {
        crate::quant::simd_x86::packed_iq4xs::dot8(g, a, out)
    }
}

impl Interleaved for Interleaved8 {
    fn ty(&self) -> GgmlType {
        GgmlType::IQ4_XS
    }

    fn interleave_from(&self, k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
        super::interleave_moved::<Self>(k, src, dst)
    }

    fn deinterleave(&self, k: usize, bytes: &mut [u8]) -> Result<(), QuantError> {
        super::deinterleave_moved::<Self>(k, bytes)
    }

    fn dot_tile(
        &self,
        k: usize,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
        _rows: Rows,
        batch: usize,
    ) -> Result<(), QuantError> {
        // SAFETY: this layout is only handed out on CPUs with AVX-512 F +
        // BW + VL + VNNI (`interleaved_with_caps`).
        #[cfg(target_arch = "x86_64")]
        unsafe {
            let blocks = crate::quant::ggml_tiled::IQ4XSGroups { bytes: w };
            super::plain_bits_tile::<Kernel, _>(GgmlType::IQ4_XS, k, w, acts, out, batch, &blocks)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (k, w, acts, out, batch);
            Err(QuantError::Unsupported {
                ty: GgmlType::IQ4_XS,
                what: "interleaved kernels",
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_is_a_bijection_and_moves_pieces_whole() {
        let mut to = vec![false; GROUP_BLOCK];
        for r in 0..GROUP_ROWS {
            for i in 0..BLOCK {
                assert!(!to[map(r, i)], "packed byte {} twice", map(r, i));
                to[map(r, i)] = true;
            }
            let mut blk: [u8; BLOCK] = std::array::from_fn(|i| i as u8);
            let mut packed = [0u8; GROUP_BLOCK];
            super::super::move_block::<Interleaved8>(r, &mut blk, &mut packed, true);
            for i in 0..BLOCK {
                assert_eq!(packed[map(r, i)], i as u8, "row {r} byte {i}");
            }
        }
        assert!(to.iter().all(|&t| t));
    }
}
