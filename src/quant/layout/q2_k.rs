//! Q2_K's interleaved layout: groups of eight rows rewritten super-block by
//! super-block so that one vector load holds the same four quant bytes of
//! all eight rows, their `d`/`dmin` are one `vcvtph2ps` each and one
//! 8-byte load gives a sub-block's scale-and-min byte of every row (the
//! byte map is in `simd_x86::packed_q2k`'s docs). The eight rows' 84-byte
//! blocks become 672 bytes holding the same bytes in another order.
//!
//! ggml interleaves Q2_K only on AVX-512 CPUs (`q2_K_8x8_q8_K`, llama.cpp's
//! default `--repack`), so only those take this layout here: elsewhere
//! Q2_K keeps the plain layout and `ggml_vec_dot_q2_K_q8_K`'s bits, as
//! llama.cpp does there. The kernels sum as ggml's repack kernels do: per
//! super-block and row, the scaled quant products and the mins by the
//! activation's block sums as two exact integers, one FMA each, and their
//! difference at the end; not the plain kernel's order, so results differ
//! from the plain layout's in the last bits, as llama.cpp's do between
//! `--repack` on and off.

use super::{check_same_len, group_geometry, Interleaved, Rows, GROUP_ROWS};
use crate::quant::QuantError;
use crate::tensor::GgmlType;

/// Bytes of a Q2_K block and of an eight-row group's super-block.
const BLOCK: usize = 84;
pub(crate) const GROUP_BLOCK: usize = GROUP_ROWS * BLOCK;
/// Where a group super-block keeps its parts: the rows' `d` at 0, their
/// `dmin`, the scale-and-min bytes, the quant chunks.
pub(crate) const DMIN: usize = 16;
pub(crate) const SCALES: usize = 32;
pub(crate) const QS: usize = 160;
/// Where a plain block keeps them.
const PLAIN_QS: usize = 16;
const PLAIN_D: usize = 80;

/// Q2_K on the CPU's AVX-512 kernels.
pub(super) struct Interleaved8;

/// Byte `i` of plain block `blk` of row `r` goes to `packed[map(r, i)]`.
fn map(r: usize, i: usize) -> usize {
    match i {
        // Sixteen scale-and-min bytes: entry `8j + r`.
        0..PLAIN_QS => SCALES + 8 * i + r,
        // Sixty-four quant bytes in sixteen 4-byte chunks.
        PLAIN_QS..PLAIN_D => {
            let q = i - PLAIN_QS;
            QS + (8 * (q / 4) + r) * 4 + q % 4
        }
        // `d` then `dmin`.
        _ => {
            let x = i - PLAIN_D;
            DMIN * (x / 2) + 2 * r + x % 2
        }
    }
}

/// [`packed_q2k::dot8`](crate::quant::simd_x86::packed_q2k::dot8) as a
/// group kernel.
#[cfg(target_arch = "x86_64")]
struct Kernel;

#[cfg(target_arch = "x86_64")]
impl super::GroupDot for Kernel {
    unsafe fn dot<const N: usize>(
        g: &[u8],
        a: [&[crate::quant::BlockQ8K]; N],
        out: &mut [[f32; GROUP_ROWS]; N],
        gemm: bool,
    ) {
        crate::quant::simd_x86::packed_q2k::dot8(g, a, out, gemm)
    }
}

impl Interleaved for Interleaved8 {
    fn ty(&self) -> GgmlType {
        GgmlType::Q2_K
    }

    fn interleave_from(&self, k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
        let nb = group_geometry(GgmlType::Q2_K, k, src.len())?;
        check_same_len(GgmlType::Q2_K, src.len(), dst.len())?;
        let gb = nb * GROUP_BLOCK;
        for (src, dst) in src.chunks_exact(gb).zip(dst.chunks_exact_mut(gb)) {
            for (b, packed) in dst.chunks_exact_mut(GROUP_BLOCK).enumerate() {
                // `map`'s three parts: `d` and `dmin` in twos, the scale
                // bytes one by one, the quants in chunks.
                let rows: [&[u8]; GROUP_ROWS] =
                    std::array::from_fn(|r| &src[(r * nb + b) * BLOCK..][..BLOCK]);
                for (r, blk) in rows.iter().enumerate() {
                    packed[2 * r..2 * r + 2].copy_from_slice(&blk[PLAIN_D..PLAIN_D + 2]);
                    packed[DMIN + 2 * r..DMIN + 2 * r + 2].copy_from_slice(&blk[PLAIN_D + 2..]);
                }
                let (head, quants) = packed.split_at_mut(QS);
                super::transpose::bytes(rows.map(|b| &b[..PLAIN_QS]), &mut head[SCALES..]);
                super::transpose::chunks(rows.map(|b| &b[PLAIN_QS..PLAIN_D]), quants);
            }
        }
        Ok(())
    }

    fn deinterleave(&self, k: usize, bytes: &mut [u8]) -> Result<(), QuantError> {
        let nb = group_geometry(GgmlType::Q2_K, k, bytes.len())?;
        for group in bytes.chunks_exact_mut(nb * GROUP_BLOCK) {
            let copy = group.to_vec();
            for (b, packed) in copy.chunks_exact(GROUP_BLOCK).enumerate() {
                for r in 0..GROUP_ROWS {
                    let blk = &mut group[(r * nb + b) * BLOCK..][..BLOCK];
                    for (i, byte) in blk.iter_mut().enumerate() {
                        *byte = packed[map(r, i)];
                    }
                }
            }
        }
        Ok(())
    }

    fn dot_tile(
        &self,
        k: usize,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
        rows_of: Rows,
        _batch: usize,
    ) -> Result<(), QuantError> {
        #[cfg(target_arch = "x86_64")]
        {
            let tile =
                super::SuperBlockTile::new(GgmlType::Q2_K, k, w.len(), acts, out.len(), rows_of)?;
            let (nb, n_rows, n_gemm) = (tile.nb, tile.n_rows, tile.n_gemm);
            // Four activation rows at a time (ggml's gemm tile), each
            // weight chunk unpacked once for them.
            // SAFETY: this layout is only handed out on CPUs with AVX-512
            // F + BW + VL + VNNI (`interleaved_with_caps`), and `w` holds
            // whole groups of `nb` super-blocks, as many as each activation
            // row holds blocks.
            unsafe {
                super::groups_in_fours::<Kernel>(
                    w,
                    nb * GROUP_BLOCK,
                    &tile.rows(),
                    n_gemm,
                    n_rows,
                    out,
                )
            };
            Ok(())
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (k, w, acts, out, rows_of);
            Err(QuantError::Unsupported {
                ty: GgmlType::Q2_K,
                what: "interleaved kernels",
            })
        }
    }
}
