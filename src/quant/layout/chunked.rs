//! The layout of the types whose 32-value blocks are a scale then quant
//! bytes (Q4_0, Q8_0, IQ4_NL, MXFP4): per block, the eight rows' scales,
//! then their quants in 4-byte chunks (the byte map is in the parent
//! module's docs), and the kernels over it (`simd_x86::packed`).

use super::{check_same_len, check_tile, group_geometry, transpose, Interleaved, Rows, GROUP_ROWS};
use crate::quant::ops::ops;
use crate::quant::{QuantError, QuantOps};
use crate::tensor::GgmlType;

/// The types whose blocks are a scale then quant bytes, interleaved in
/// 4-byte chunks.
pub(super) struct Chunked {
    ty: GgmlType,
    /// Bytes of the block's scale.
    scale: usize,
    /// The kernels' instructions.
    #[cfg(target_arch = "x86_64")]
    isa: crate::quant::simd_x86::packed::Isa,
}

#[cfg(target_arch = "x86_64")]
impl Chunked {
    /// Q4_0, Q8_0, IQ4_NL (`f16` scales) and MXFP4 (`e8m0`) on `isa`.
    pub(super) const fn all(isa: crate::quant::simd_x86::packed::Isa) -> [Chunked; 4] {
        [
            Chunked {
                ty: GgmlType::Q4_0,
                scale: 2,
                isa,
            },
            Chunked {
                ty: GgmlType::Q8_0,
                scale: 2,
                isa,
            },
            Chunked {
                ty: GgmlType::IQ4_NL,
                scale: 2,
                isa,
            },
            Chunked {
                ty: GgmlType::MXFP4,
                scale: 1,
                isa,
            },
        ]
    }
}

impl Chunked {
    /// Bytes per block and blocks per row, checking `bytes` holds whole
    /// groups of `k`-value rows.
    fn geometry(&self, k: usize, len: usize) -> Result<(usize, usize), QuantError> {
        Ok((self.ty.type_size(), group_geometry(self.ty, k, len)?))
    }

    /// Writes `src`'s interleaved groups to `dst` (same length) in the
    /// plain layout: the plain-spoken inverse map the tests check
    /// [`Interleaved::interleave_from`] against.
    fn deinterleave_from(&self, k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
        let (bb, nb) = self.geometry(k, src.len())?;
        check_same_len(self.ty, src.len(), dst.len())?;
        let rb = nb * bb;
        let (sb, chunks) = (self.scale, (bb - self.scale) / 4);
        for (src, dst) in src
            .chunks_exact(rb * GROUP_ROWS)
            .zip(dst.chunks_exact_mut(rb * GROUP_ROWS))
        {
            for b in 0..nb {
                let packed = b * bb * GROUP_ROWS;
                for r in 0..GROUP_ROWS {
                    let plain = r * rb + b * bb;
                    let mut mv = |p: usize, q: usize, len: usize| {
                        dst[plain + p..plain + p + len]
                            .copy_from_slice(&src[packed + q..packed + q + len]);
                    };
                    mv(0, sb * r, sb);
                    for c in 0..chunks {
                        mv(sb + 4 * c, 8 * sb + (8 * c + r) * 4, 4);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Eight results as the kernels' fixed-size output.
#[cfg(target_arch = "x86_64")]
fn lanes(o: &mut [f32]) -> &mut [f32; GROUP_ROWS] {
    o.try_into().expect("GROUP_ROWS lanes")
}

impl Interleaved for Chunked {
    fn ty(&self) -> GgmlType {
        self.ty
    }

    fn interleave_from(&self, k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
        let (bb, nb) = self.geometry(k, src.len())?;
        check_same_len(self.ty, src.len(), dst.len())?;
        let (rb, sb) = (nb * bb, self.scale);
        for (src, dst) in src
            .chunks_exact(rb * GROUP_ROWS)
            .zip(dst.chunks_exact_mut(rb * GROUP_ROWS))
        {
            for (b, out) in dst.chunks_exact_mut(bb * GROUP_ROWS).enumerate() {
                let (scales, quants) = out.split_at_mut(sb * GROUP_ROWS);
                let blocks: [&[u8]; GROUP_ROWS] =
                    std::array::from_fn(|r| &src[r * rb + b * bb..][..bb]);
                // The scales' widths as constants (a call to `memcpy` per
                // row otherwise).
                for (r, blk) in blocks.iter().enumerate() {
                    match sb {
                        1 => scales[r] = blk[0],
                        2 => scales[2 * r..2 * r + 2].copy_from_slice(&blk[..2]),
                        _ => scales[sb * r..][..sb].copy_from_slice(&blk[..sb]),
                    }
                }
                // Chunk `c` of row `r` at `(8c + r) * 4` of the quants.
                transpose::chunks(blocks.map(|blk| &blk[sb..]), quants);
            }
        }
        Ok(())
    }

    fn deinterleave(&self, k: usize, bytes: &mut [u8]) -> Result<(), QuantError> {
        let copy = bytes.to_vec();
        self.deinterleave_from(k, &copy, bytes)
    }

    fn dot_tile(
        &self,
        k: usize,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
        _rows: Rows,
        _batch: usize,
    ) -> Result<(), QuantError> {
        let (bb, nb) = self.geometry(k, w.len())?;
        let n_rows = w.len() / (nb * bb);
        let op: &dyn QuantOps = ops(self.ty)?;
        let act_ty = op.act_type();
        let arb = act_ty.row_bytes(k as u64).unwrap_or(0) as usize;
        check_tile(self.ty, n_rows, arb, acts.len(), out.len())?;
        #[cfg(target_arch = "x86_64")]
        {
            let acts: std::borrow::Cow<[crate::quant::BlockQ8_0]> =
                crate::quant::cast_or_copy(act_ty, "interleaved activations", acts)?;
            use crate::quant::simd_x86::packed;
            let gb = nb * bb * GROUP_ROWS;
            let n_acts = acts.len() / nb.max(1);
            let kind = match self.ty {
                GgmlType::Q8_0 => packed::Kind::Q8_0,
                GgmlType::Q4_0 => packed::Kind::Q4_0,
                GgmlType::IQ4_NL => packed::Kind::Iq4Nl,
                _ => packed::Kind::Mxfp4,
            };
            // On AVX-512 the 4-bit kinds take their values as unsigned
            // bytes (`packed::offset`), which needs each activation block's
            // byte sum.
            let offset = self.isa == packed::Isa::Vnni && self.ty != GgmlType::Q8_0;
            let mut done = 0;
            if offset {
                // Pairs of groups (16 rows) against four activation rows at
                // a time, read in place for up to four rows, decoded once per
                // pair for more.
                let mut sums = Vec::new();
                packed::act_sums(&acts, &mut sums);
                let rows: Vec<&[crate::quant::BlockQ8_0]> = acts.chunks_exact(nb).collect();
                let row_sums: Vec<&[i32]> = sums.chunks_exact(nb).collect();
                let mut res = [[0f32; 2 * GROUP_ROWS]; 4];
                let mut dec = packed::OffsetDecoded16::new();
                for (pi, pair) in w.chunks_exact(2 * gb).enumerate() {
                    let (g0, g1) = (&pair[..gb], &pair[gb..]);
                    if n_acts > 4 {
                        dec.decode(kind, g0, g1, nb);
                    }
                    for (ti, (a, s)) in rows.chunks(4).zip(row_sums.chunks(4)).enumerate() {
                        let r = &mut res[..a.len()];
                        if n_acts > 4 {
                            dec.dot(a, s, r);
                        } else {
                            packed::dot16_offset(kind, g0, g1, a, s, r);
                        }
                        for (t, r) in r.iter().enumerate() {
                            let at = (4 * ti + t) * n_rows + pi * 2 * GROUP_ROWS;
                            out[at..at + 2 * GROUP_ROWS].copy_from_slice(r);
                        }
                    }
                    done += 2;
                }
            }
            let q8_512 = self.isa == packed::Isa::Vnni && !offset;
            if n_acts == 1 {
                // A mat-vec: each weight byte is used once, decoded in place
                // (Q8_0 on AVX-512: two groups per vector).
                if q8_512 {
                    let pairs = w.chunks_exact(2 * gb);
                    for (pair, res) in pairs.zip(out.chunks_exact_mut(2 * GROUP_ROWS)) {
                        let res = res.try_into().expect("two groups of lanes");
                        packed::dot16(&pair[..gb], &pair[gb..], &acts, res);
                        done += 2;
                    }
                }
                let rest = w.chunks_exact(gb).zip(out.chunks_exact_mut(GROUP_ROWS));
                for (g, res) in rest.skip(done) {
                    packed::dot(self.isa, kind, g, &acts, lanes(res));
                }
                return Ok(());
            }
            // Several activation rows: each group decoded once for all (Q8_0
            // on AVX-512: pairs of groups in 16 lanes).
            if q8_512 {
                let mut dec = packed::Decoded16::new();
                for (pi, pair) in w.chunks_exact(2 * gb).enumerate() {
                    dec.decode(&pair[..gb], &pair[gb..], nb);
                    for (t, a) in acts.chunks_exact(nb).enumerate() {
                        let at = t * n_rows + pi * 2 * GROUP_ROWS;
                        let o = &mut out[at..at + 2 * GROUP_ROWS];
                        dec.dot(a, o.try_into().expect("two groups of lanes"));
                    }
                    done += 2;
                }
            }
            let mut dec = packed::Decoded::new();
            for (gi, g) in w.chunks_exact(gb).enumerate().skip(done) {
                dec.decode(kind, g, nb);
                for (t, a) in acts.chunks_exact(nb).enumerate() {
                    let at = t * n_rows + gi * GROUP_ROWS;
                    dec.dot(self.isa, a, lanes(&mut out[at..at + GROUP_ROWS]));
                }
            }
            Ok(())
        }
        #[cfg(not(target_arch = "x86_64"))]
        Err(QuantError::Unsupported {
            ty: self.ty,
            what: "interleaved kernels",
        })
    }
}
