//! Q4_K's interleaved layout: groups of eight rows rewritten super-block by
//! super-block so that one vector load holds the same four quant bytes of
//! all eight rows, the rows' `d`/`dmin` are one `vcvtph2ps` each and their
//! scales and mins unpack with a few vector instructions (the byte map is
//! in `simd_x86::packed_k`'s docs). The eight rows' 144-byte blocks become
//! 1152 bytes of the same size; the 12 bytes of packed 6-bit scales and
//! mins per row are re-encoded, not moved, so the layout is a pure,
//! invertible function of the GGUF bytes but not a permutation of them.
//!
//! The kernels sum as ggml's x86 `q4_K_8x8_q8_K` kernels do (llama.cpp's
//! default `--repack`, which interleaves Q4_K matrices of whole 8-row
//! groups on every AVX2 CPU): per super-block and row, the scaled quant
//! products and the mins by the activation's block sums as two exact
//! integers, one FMA each, and their difference at the end. That is not
//! `ggml_vec_dot_q4_K_q8_K`'s order, so results differ from the plain
//! layout's in the last bits, as llama.cpp's do between `--repack` on and
//! off.

use super::{check_same_len, group_geometry, Interleaved, Rows, GROUP_ROWS};
use crate::quant::common::pack_scale_min_k4;
use crate::quant::QuantError;
use crate::tensor::GgmlType;

/// Bytes of a Q4_K block and of an eight-row group's super-block.
const BLOCK: usize = 144;
pub(crate) const GROUP_BLOCK: usize = GROUP_ROWS * BLOCK;
/// Where a group super-block keeps its parts (the map is in
/// `simd_x86::packed_k`'s docs): the rows' `d` at 0, their `dmin`, the low
/// and the top bits of their scales and mins, the quant chunks.
pub(crate) const DMIN: usize = 16;
pub(crate) const SCALES_LO: usize = 32;
pub(crate) const SCALES_HI: usize = 96;
pub(crate) const QS: usize = 128;

/// Q4_K on the CPU's kernels: eight rows per AVX2 vector, or sixteen (two
/// groups) per AVX-512 one.
pub(super) struct SuperBlocked {
    pub(super) avx512: bool,
}

/// Writes one group super-block from the eight rows' plain blocks.
///
/// A row's 12 bytes of scales and mins `q` (ggml's `get_scale_min_k4`)
/// give entry `j`'s low nibbles `(q[j] & 15) | (q[j + 4] & 15) << 4` for
/// `j < 4` and `q[j + 4]` itself for `j >= 4`, and its top bits
/// `(q[j] >> 4 & 3) | (q[j + 4] >> 4 & 3) << 2` and
/// `(q[j - 4] >> 6) | (q[j] >> 6) << 2`: four bytes at a time in `u32`s,
/// then moved to their entries `8j + r`.
fn pack(rows: [&[u8; BLOCK]; GROUP_ROWS], packed: &mut [u8; GROUP_BLOCK]) {
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let (mut lo, mut top) = ([[0u8; 8]; GROUP_ROWS], [0u64; GROUP_ROWS]);
    for (r, blk) in rows.iter().enumerate() {
        packed[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
        packed[DMIN + 2 * r..DMIN + 2 * r + 2].copy_from_slice(&blk[2..4]);
        let word = |i: usize| u32::from_le_bytes([blk[i], blk[i + 1], blk[i + 2], blk[i + 3]]);
        let (q0, q4, q8) = (word(4), word(8), word(12));
        let lo03 = (q0 & LOW4) | (q4 & LOW4) << 4;
        let top03 = (q0 >> 4 & LOW2) | (q4 >> 4 & LOW2) << 2;
        let top47 = (q0 >> 6 & LOW2) | (q4 >> 6 & LOW2) << 2;
        lo[r] = (u64::from(lo03) | u64::from(q8) << 32).to_le_bytes();
        top[r] = u64::from(top03) | u64::from(top47) << 32;
    }
    let pairs: [u64; GROUP_ROWS / 2] = std::array::from_fn(|i| top[2 * i] | top[2 * i + 1] << 4);
    entries(&lo, &pairs, packed);
    // Chunk `c` of row `r` at `QS + (8c + r) * 4`.
    super::transpose::chunks(rows.map(|b| &b[16..]), &mut packed[QS..]);
}

/// Writes byte `j` of `lo[r]` to entry `8j + r` of the low nibbles, and
/// byte `j` of `pairs[i]` (rows `2i` and `2i + 1`'s top bits) to byte
/// `4j + i` of the top bits.
fn entries(
    lo: &[[u8; 8]; GROUP_ROWS],
    pairs: &[u64; GROUP_ROWS / 2],
    packed: &mut [u8; GROUP_BLOCK],
) {
    let rows: [&[u8]; GROUP_ROWS] = std::array::from_fn(|r| &lo[r][..]);
    super::transpose::bytes(rows, &mut packed[SCALES_LO..SCALES_HI]);
    for j in 0..8 {
        for (i, pair) in pairs.iter().enumerate() {
            packed[SCALES_HI + 4 * j + i] = (pair >> (8 * j)) as u8;
        }
    }
}

/// Reads one group super-block back into the eight rows' plain blocks.
fn unpack(packed: &[u8; GROUP_BLOCK], rows: &mut [[u8; BLOCK]; GROUP_ROWS]) {
    for (r, blk) in rows.iter_mut().enumerate() {
        blk[0..2].copy_from_slice(&packed[2 * r..2 * r + 2]);
        blk[2..4].copy_from_slice(&packed[DMIN + 2 * r..DMIN + 2 * r + 2]);
        let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
        for j in 0..8 {
            let e = 8 * j + r;
            let (lo, top) = (
                packed[SCALES_LO + e],
                packed[SCALES_HI + e / 2] >> (4 * (e % 2)),
            );
            sc[j] = (lo & 15) | (top & 3) << 4;
            mn[j] = (lo >> 4) | ((top >> 2) & 3) << 4;
        }
        blk[4..16].copy_from_slice(&pack_scale_min_k4(&sc, &mn));
        for (c, chunk) in blk[16..].chunks_exact_mut(4).enumerate() {
            let at = QS + (8 * c + r) * 4;
            chunk.copy_from_slice(&packed[at..at + 4]);
        }
    }
}

impl Interleaved for SuperBlocked {
    fn ty(&self) -> GgmlType {
        GgmlType::Q4_K
    }

    fn interleave_from(&self, k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
        let nb = group_geometry(GgmlType::Q4_K, k, src.len())?;
        check_same_len(GgmlType::Q4_K, src.len(), dst.len())?;
        let gb = nb * GROUP_BLOCK;
        for (src, dst) in src.chunks_exact(gb).zip(dst.chunks_exact_mut(gb)) {
            for (b, packed) in dst.chunks_exact_mut(GROUP_BLOCK).enumerate() {
                let row = |r: usize| -> &[u8; BLOCK] {
                    let at = (r * nb + b) * BLOCK;
                    src[at..at + BLOCK].try_into().expect("one block")
                };
                let packed: &mut [u8; GROUP_BLOCK] = packed.try_into().expect("one group block");
                pack(std::array::from_fn(row), packed);
            }
        }
        Ok(())
    }

    fn deinterleave(&self, k: usize, bytes: &mut [u8]) -> Result<(), QuantError> {
        let nb = group_geometry(GgmlType::Q4_K, k, bytes.len())?;
        let mut rows = [[0u8; BLOCK]; GROUP_ROWS];
        let mut packed = [0u8; GROUP_BLOCK];
        for group in bytes.chunks_exact_mut(nb * GROUP_BLOCK) {
            let copy = group.to_vec();
            for (b, p) in copy.chunks_exact(GROUP_BLOCK).enumerate() {
                packed.copy_from_slice(p);
                unpack(&packed, &mut rows);
                for (r, blk) in rows.iter().enumerate() {
                    let at = (r * nb + b) * BLOCK;
                    group[at..at + BLOCK].copy_from_slice(blk);
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
            use crate::quant::simd_x86::packed_k;
            let tile =
                super::SuperBlockTile::new(GgmlType::Q4_K, k, w.len(), acts, out.len(), rows_of)?;
            let (nb, n_rows, n_gemm) = (tile.nb, tile.n_rows, tile.n_gemm);
            let rows = tile.rows();
            let gb = nb * GROUP_BLOCK;
            let mut done = 0;
            if self.avx512 {
                // Pairs of groups (16 rows) against four activation rows at
                // a time, read in place for up to four rows, decoded once per
                // pair for more.
                let mut res = [[0f32; 2 * GROUP_ROWS]; 4];
                let mut dec = packed_k::Decoded16::new();
                for (pi, pair) in w.chunks_exact(2 * gb).enumerate() {
                    let (g0, g1) = (&pair[..gb], &pair[gb..]);
                    if rows.len() > 4 {
                        dec.decode(g0, g1, nb);
                    }
                    for (ti, a) in rows.chunks(4).enumerate() {
                        let r = &mut res[..a.len()];
                        let gemm = 4 * ti < n_gemm;
                        if rows.len() > 4 {
                            dec.dot(a, r, gemm);
                        } else {
                            packed_k::dot16(g0, g1, a, r, gemm);
                        }
                        for (t, r) in r.iter().enumerate() {
                            let at = (4 * ti + t) * n_rows + pi * 2 * GROUP_ROWS;
                            out[at..at + 2 * GROUP_ROWS].copy_from_slice(r);
                        }
                    }
                    done += 2;
                }
            }
            // The rest group by group, read in place for one activation
            // row, decoded once for more.
            let mut dec = packed_k::Decoded8::new();
            for (gi, g) in w.chunks_exact(gb).enumerate().skip(done) {
                if rows.len() > 1 {
                    dec.decode(g, nb);
                }
                for (t, a) in rows.iter().enumerate() {
                    let at = t * n_rows + gi * GROUP_ROWS;
                    let o = (&mut out[at..at + GROUP_ROWS])
                        .try_into()
                        .expect("a group of lanes");
                    if rows.len() > 1 {
                        dec.dot(a, o, t < n_gemm);
                    } else {
                        packed_k::dot8(g, a, o, t < n_gemm);
                    }
                }
            }
            Ok(())
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (k, w, acts, out, rows_of);
            Err(QuantError::Unsupported {
                ty: GgmlType::Q4_K,
                what: "interleaved kernels",
            })
        }
    }
}
