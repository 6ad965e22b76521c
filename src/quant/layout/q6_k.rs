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

use super::{check_same_len, group_geometry, Interleaved, Rows, GROUP_ROWS};
use crate::quant::QuantError;
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

/// Q6_K on the CPU's AVX-512 kernel.
pub(super) struct Interleaved8;

/// Byte `i` of plain block `blk` of row `r` goes to `packed[map(r, i)]`.
/// Every part but `d` is moved in runs of whole 2- or 4-byte pieces.
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

/// Moves one plain block of row `r` to or from its places in a group
/// super-block: `to_packed` copies `blk` into `packed`, else back. The
/// pieces have fixed sizes, so each is one load and one store.
#[inline(always)]
fn move_block(r: usize, blk: &mut [u8; BLOCK], packed: &mut [u8; GROUP_BLOCK], to_packed: bool) {
    let mut mv = |plain: usize, at: usize, n: usize| {
        let (x, y) = (&mut blk[plain..plain + n], &mut packed[at..at + n]);
        if to_packed {
            y.copy_from_slice(x)
        } else {
            x.copy_from_slice(y)
        }
    };
    // The 48 four-byte chunks of `ql` then `qh` (`QH` is where chunk 32
    // lands, so one formula places both).
    for c in 0..(PLAIN_SCALES / 4) {
        mv(4 * c, map(r, 4 * c), 4);
    }
    for p in 0..8 {
        mv(PLAIN_SCALES + 2 * p, map(r, PLAIN_SCALES + 2 * p), 2);
    }
    mv(PLAIN_D, map(r, PLAIN_D), 2);
}

/// Copies `nb` super-blocks of one interleaved group `g` back into the
/// eight rows' plain blocks in `plain` (`nb` blocks per row).
fn unpack_group(nb: usize, g: &[u8], plain: &mut [u8]) {
    let mut packed = [0u8; GROUP_BLOCK];
    for (b, src) in g.chunks_exact(GROUP_BLOCK).take(nb).enumerate() {
        packed.copy_from_slice(src);
        for r in 0..GROUP_ROWS {
            let at = (r * nb + b) * BLOCK;
            let blk: &mut [u8; BLOCK] = (&mut plain[at..at + BLOCK]).try_into().expect("one block");
            move_block(r, blk, &mut packed, false);
        }
    }
}

impl Interleaved for Interleaved8 {
    fn ty(&self) -> GgmlType {
        GgmlType::Q6_K
    }

    fn interleave_from(&self, k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
        let nb = group_geometry(GgmlType::Q6_K, k, src.len())?;
        check_same_len(GgmlType::Q6_K, src.len(), dst.len())?;
        let gb = nb * GROUP_BLOCK;
        for (src, dst) in src.chunks_exact(gb).zip(dst.chunks_exact_mut(gb)) {
            for (b, out) in dst.chunks_exact_mut(GROUP_BLOCK).enumerate() {
                let mut packed = [0u8; GROUP_BLOCK];
                for r in 0..GROUP_ROWS {
                    let at = (r * nb + b) * BLOCK;
                    let mut blk: [u8; BLOCK] = src[at..at + BLOCK].try_into().expect("one block");
                    move_block(r, &mut blk, &mut packed, true);
                }
                out.copy_from_slice(&packed);
            }
        }
        Ok(())
    }

    fn deinterleave(&self, k: usize, bytes: &mut [u8]) -> Result<(), QuantError> {
        let nb = group_geometry(GgmlType::Q6_K, k, bytes.len())?;
        let mut copy = vec![0u8; nb * GROUP_BLOCK];
        for group in bytes.chunks_exact_mut(nb * GROUP_BLOCK) {
            copy.copy_from_slice(group);
            unpack_group(nb, &copy, group);
        }
        Ok(())
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
        #[cfg(target_arch = "x86_64")]
        {
            use crate::quant::ggml_tiled::{self, MIN_BATCH};
            use crate::quant::simd_x86::packed_q6k;
            // Q6_K is not repacked by ggml on x86: a mat-vec and every
            // part of a product of fewer than MIN_BATCH rows take
            // `vec_dot`'s bits (`Rows` does not matter), larger batches the
            // tiled path's, its blocks decoded from this layout.
            let tile = super::SuperBlockTile::new(
                GgmlType::Q6_K,
                k,
                w.len(),
                acts,
                out.len(),
                Rows::Gemv,
            )?;
            let (nb, n_rows) = (tile.nb, tile.n_rows);
            if batch >= MIN_BATCH {
                // SAFETY: AVX-512 F/BW/VL/VNNI as below; the kernel checks
                // the lengths (`SuperBlockTile::new` has).
                unsafe { ggml_tiled::tiled_q6k_groups_avx512(nb, w, &tile.acts, out) };
                return Ok(());
            }
            let rows = tile.rows();
            // Up to four activation rows at a time, each weight chunk
            // unpacked once for them.
            for (gi, g) in w.chunks_exact(nb * GROUP_BLOCK).enumerate() {
                for (ti, a) in rows.chunks(4).enumerate() {
                    let mut res = [[0f32; GROUP_ROWS]; 4];
                    // SAFETY: this layout is only handed out on CPUs with
                    // AVX-512 F + BW + VL + VNNI (`interleaved_with_caps`),
                    // and `g` holds `nb` group super-blocks, as many as each
                    // activation row holds blocks.
                    unsafe {
                        match *a {
                            [a0, a1, a2, a3] => packed_q6k::dot8(g, [a0, a1, a2, a3], &mut res),
                            [a0, a1, a2] => {
                                let r = (&mut res[..3]).try_into().expect("three rows");
                                packed_q6k::dot8(g, [a0, a1, a2], r)
                            }
                            [a0, a1] => {
                                let r = (&mut res[..2]).try_into().expect("two rows");
                                packed_q6k::dot8(g, [a0, a1], r)
                            }
                            [a0] => {
                                let r = (&mut res[..1]).try_into().expect("one row");
                                packed_q6k::dot8(g, [a0], r)
                            }
                            _ => {}
                        }
                    }
                    for (t, r) in res.iter().take(a.len()).enumerate() {
                        let at = (4 * ti + t) * n_rows + gi * GROUP_ROWS;
                        out[at..at + GROUP_ROWS].copy_from_slice(r);
                    }
                }
            }
            Ok(())
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (k, w, acts, out, batch);
            Err(QuantError::Unsupported {
                ty: GgmlType::Q6_K,
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
            // `move_block` moves what `map` says, byte by byte.
            let mut blk: [u8; BLOCK] = std::array::from_fn(|i| i as u8);
            let mut packed = [0u8; GROUP_BLOCK];
            move_block(r, &mut blk, &mut packed, true);
            for i in 0..BLOCK {
                assert_eq!(packed[map(r, i)], i as u8, "row {r} byte {i}");
            }
        }
        assert!(to.iter().all(|&t| t));
    }
}
