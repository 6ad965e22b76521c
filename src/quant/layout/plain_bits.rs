//! The layouts that keep the plain kernels' bits for the types ggml does
//! not repack on x86 (Q6_K, IQ4_XS): each moves a plain block's bytes in
//! fixed pieces to their places in an eight-row group ([`Moved`]), and
//! runs its group kernel below ggml's tiled floor and the tiled path's
//! kernels over the layout from there on ([`PlainBits`]).

use super::{check_same_len, group_geometry, transpose, GROUP_ROWS};
#[cfg(target_arch = "x86_64")]
use super::{groups_in_fours, GroupDot, Interleaved, Rows, SuperBlockTile};
use crate::quant::QuantError;
use crate::tensor::GgmlType;

/// A [`Moved`] layout that keeps the plain kernels' bits for a type ggml
/// does not repack on x86 (Q6_K, IQ4_XS; taken on AVX-512 CPUs only): a
/// mat-vec and every part of a product of fewer than ggml's tiled floor
/// take `vec_dot`'s bits through its group kernel ([`GroupDot`], four
/// activation rows at a time); larger batches the tiled path's, its
/// kernels reading each block from the layout ([`PlainBits::blocks`]).
#[cfg(target_arch = "x86_64")]
pub(super) trait PlainBits: Moved + GroupDot {
    type Block: crate::quant::ggml_tiled::TiledBlock;
    /// The layout's bytes (whole groups) as the tiled kernels' blocks.
    fn blocks(bytes: &[u8]) -> impl crate::quant::ggml_tiled::Blocks<Self::Block> + '_;
}

/// The [`Interleaved`] of a [`PlainBits`] layout.
#[cfg(target_arch = "x86_64")]
pub(super) struct PlainBitsLayout<M>(std::marker::PhantomData<M>);

#[cfg(target_arch = "x86_64")]
impl<M> PlainBitsLayout<M> {
    pub(super) const NEW: Self = Self(std::marker::PhantomData);
}

#[cfg(target_arch = "x86_64")]
impl<M: PlainBits + Send + Sync> Interleaved for PlainBitsLayout<M> {
    fn ty(&self) -> GgmlType {
        M::TY
    }

    fn interleave_from(&self, k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
        interleave_moved::<M>(k, src, dst)
    }

    fn deinterleave(&self, k: usize, bytes: &mut [u8]) -> Result<(), QuantError> {
        deinterleave_moved::<M>(k, bytes)
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
        let tile = SuperBlockTile::new(M::TY, k, w.len(), acts, out.len(), Rows::Gemv)?;
        let (nb, n_rows) = (tile.nb, tile.n_rows);
        // SAFETY: these layouts are only handed out on CPUs with AVX-512 F
        // + BW + VL + VNNI (`interleaved_with_caps`); the lengths are
        // checked, `w` holds whole groups of `nb` super-blocks.
        unsafe {
            if batch >= crate::quant::ggml_tiled::MIN_BATCH {
                crate::quant::ggml_tiled::tiled_blocks_avx512(nb, &M::blocks(w), &tile.acts, out);
            } else {
                let gb = nb * M::TY.type_size() * GROUP_ROWS;
                groups_in_fours::<M>(w, gb, &tile.rows(), 0, n_rows, out);
            }
        }
        Ok(())
    }
}

/// A layout that moves each plain block's bytes, in pieces of 4 and of 2
/// bytes, to their places in the group super-block (Q6_K, IQ4_XS): the same
/// bytes in another order.
pub(super) trait Moved {
    const TY: GgmlType;
    /// Where byte `i` of row `r`'s plain block goes in the group
    /// super-block; a piece's bytes go to consecutive places.
    fn map(r: usize, i: usize) -> usize;
    /// The plain bytes moved in 4-byte pieces, run by run, and those moved
    /// in 2-byte pieces: the whole block between them. A run's chunk `c`
    /// of row `r` goes to `map(0, run.start) + (8c + r) * 4`, so it moves
    /// as one [`transpose::chunks`].
    const CHUNKS: &'static [std::ops::Range<usize>];
    const TWOS: std::ops::Range<usize>;
}

/// Moves row `r`'s plain block to (`to_packed`) or from its places in a
/// group super-block, one fixed-size load and store per piece.
#[inline(always)]
fn move_block<M: Moved>(r: usize, blk: &mut [u8], packed: &mut [u8], to_packed: bool) {
    #[inline(always)]
    fn mv<const N: usize>(blk: &mut [u8], packed: &mut [u8], i: usize, at: usize, to: bool) {
        let x: &mut [u8; N] = (&mut blk[i..i + N]).try_into().expect("a piece");
        let y: &mut [u8; N] = (&mut packed[at..at + N]).try_into().expect("a piece");
        if to {
            *y = *x
        } else {
            *x = *y
        }
    }
    for i in M::CHUNKS.iter().flat_map(|run| run.clone().step_by(4)) {
        mv::<4>(blk, packed, i, M::map(r, i), to_packed);
    }
    for i in M::TWOS.step_by(2) {
        mv::<2>(blk, packed, i, M::map(r, i), to_packed);
    }
}

/// [`Interleaved::interleave_from`] of a [`Moved`] layout: the runs of
/// chunks as transposes, the 2-byte pieces one by one.
fn interleave_moved<M: Moved>(k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
    let nb = group_geometry(M::TY, k, src.len())?;
    check_same_len(M::TY, src.len(), dst.len())?;
    let (bb, gb) = (M::TY.type_size(), M::TY.type_size() * GROUP_ROWS);
    for (src, dst) in src.chunks_exact(nb * gb).zip(dst.chunks_exact_mut(nb * gb)) {
        for (b, packed) in dst.chunks_exact_mut(gb).enumerate() {
            let rows: [&[u8]; GROUP_ROWS] =
                std::array::from_fn(|r| &src[(r * nb + b) * bb..][..bb]);
            for run in M::CHUNKS {
                let at = M::map(0, run.start);
                let out = &mut packed[at..at + GROUP_ROWS * run.len()];
                transpose::chunks(rows.map(|blk| &blk[run.clone()]), out);
            }
            for (r, blk) in rows.iter().enumerate() {
                for i in M::TWOS.step_by(2) {
                    let at = M::map(r, i);
                    packed[at..at + 2].copy_from_slice(&blk[i..i + 2]);
                }
            }
        }
    }
    Ok(())
}

/// [`Interleaved::deinterleave`] of a [`Moved`] layout.
fn deinterleave_moved<M: Moved>(k: usize, bytes: &mut [u8]) -> Result<(), QuantError> {
    let nb = group_geometry(M::TY, k, bytes.len())?;
    let (bb, gb) = (M::TY.type_size(), M::TY.type_size() * GROUP_ROWS);
    let mut copy = vec![0u8; nb * gb];
    for group in bytes.chunks_exact_mut(nb * gb) {
        copy.copy_from_slice(group);
        for (b, packed) in copy.chunks_exact_mut(gb).enumerate() {
            for r in 0..GROUP_ROWS {
                let blk = &mut group[(r * nb + b) * bb..][..bb];
                move_block::<M>(r, blk, packed, false);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::layout::{iq4_xs, q6_k};

    #[test]
    fn moved_layouts_map_each_byte_once_and_move_pieces_whole() {
        fn check<M: Moved>() {
            let (bb, gb) = (M::TY.type_size(), M::TY.type_size() * GROUP_ROWS);
            // The pieces cover the block once.
            let fours = || M::CHUNKS.iter().flat_map(|run| run.clone());
            let mut cover: Vec<usize> = fours().chain(M::TWOS).collect();
            cover.sort_unstable();
            assert_eq!(cover, (0..bb).collect::<Vec<_>>(), "{}", M::TY);
            assert!(
                M::CHUNKS.iter().all(|run| run.len() % 4 == 0) && M::TWOS.len() % 2 == 0,
                "{}",
                M::TY
            );
            // Each run is one transpose of chunks, as `interleave_moved`
            // moves it.
            for (run, r) in M::CHUNKS
                .iter()
                .flat_map(|run| (0..GROUP_ROWS).map(move |r| (run, r)))
            {
                for i in run.clone() {
                    let (c, j) = ((i - run.start) / 4, (i - run.start) % 4);
                    let at = M::map(0, run.start) + (GROUP_ROWS * c + r) * 4 + j;
                    assert_eq!(M::map(r, i), at, "{} row {r} byte {i}", M::TY);
                }
            }
            let mut to = vec![false; gb];
            for r in 0..GROUP_ROWS {
                for i in 0..bb {
                    assert!(
                        !to[M::map(r, i)],
                        "{}: packed byte {} twice",
                        M::TY,
                        M::map(r, i)
                    );
                    to[M::map(r, i)] = true;
                }
                // `move_block` moves what `map` says, byte by byte, both ways.
                let mut blk: Vec<u8> = (0..bb).map(|i| i as u8).collect();
                let mut packed = vec![0u8; gb];
                move_block::<M>(r, &mut blk, &mut packed, true);
                for i in 0..bb {
                    assert_eq!(packed[M::map(r, i)], i as u8, "{} row {r} byte {i}", M::TY);
                }
                let mut back = vec![0u8; bb];
                move_block::<M>(r, &mut back, &mut packed, false);
                assert_eq!(back, blk, "{} row {r}", M::TY);
            }
            assert!(
                to.iter().all(|&t| t),
                "{}: a packed byte is never written",
                M::TY
            );
        }
        check::<q6_k::Q6K>();
        check::<iq4_xs::IQ4XS>();
    }
}
