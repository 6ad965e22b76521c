//! Weight layouts: where a matrix's bytes sit for the CPU kernels.
//!
//! GGUF bytes are the on-disk truth; the *plain* layout is them, row after
//! row. The *interleaved* layout ([`Interleaved`]) is a pure function of
//! them: groups of [`GROUP_ROWS`] consecutive rows, each group in the same
//! bytes the rows held, rewritten block by block so that one vector load
//! holds the same four bytes of all eight rows. Its kernels put one row in
//! each of the eight f32 lanes: a block's scales become one `vcvtph2ps`, an
//! activation's four bytes are broadcast once for eight rows, and the
//! result needs no horizontal sum per row. Their numerics are llama.cpp's at
//! its defaults (`--repack` on), where ggml's CPU repack interleaves the
//! same matrices:
//!
//! - Q4_0, IQ4_NL and MXFP4 sum as ggml's x86 repack kernels do: per block
//!   and row, the 32 products in integers, then one
//!   `acc = fma(f32(sum), d_w * d_a, acc)`. This is not the plain kernels'
//!   order (ggml's `vec_dot` runs eight FMA lanes per block and a final
//!   horizontal sum), so these results differ from the plain layout's in
//!   the last bits, as llama.cpp's do between `--repack` on and off.
//! - Q8_0, which ggml does not repack on x86, keeps the plain kernels' bits:
//!   lane `j` of the plain 8-lane chain (bytes `4j..4j + 4` of a block)
//!   becomes accumulator `j` here, with row `r` in lane `r`, and the final
//!   `hsum` tree `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))` is the
//!   same adds on whole vectors. Q6_K and IQ4_XS ([`q6_k`], [`iq4_xs`],
//!   AVX-512 only), which ggml does not repack on x86 either, do the same
//!   with `vec_dot`'s super-block lanes, and take its tiled path's bits for
//!   batches of its size.
//!
//! A group of `b`-byte blocks (a scale first: `f16`, or MXFP4's one-byte
//! `e8m0`; then quant bytes) is laid out block by block: the eight rows'
//! scales (`8s` bytes for `s`-byte scales), then their quant bytes in 4-byte
//! chunks, chunk `c` of row `r` at `8s + (8c + r) * 4`. The size is unchanged, so a group occupies exactly the bytes of its plain
//! rows and a row range aligned to groups is the same byte range in both.
//!
//! Only matrices whose row count is a multiple of [`GROUP_ROWS`] are
//! interleaved (llama.cpp's CPU repack has the same rule), and only where
//! the running CPU has the kernels ([`interleaved`]).

use super::ops::CpuCaps;
use super::QuantError;
use crate::tensor::GgmlType;

mod chunked;
pub(crate) mod iq4_xs;
mod plain_bits;
pub(crate) mod q2_k;
pub(crate) mod q4_k;
pub(crate) mod q6_k;
mod stream;
mod transpose;

pub use stream::interleave_streamed;

/// Rows per interleaved group.
pub const GROUP_ROWS: usize = 8;

/// The interleaved layout of one weight type and its kernels.
pub trait Interleaved: Send + Sync {
    /// The weight type.
    fn ty(&self) -> GgmlType;
    /// Writes the interleaved layout of `src` (plain rows of `k` values, a
    /// multiple of [`GROUP_ROWS`] of them) to `dst`, of the same length: one
    /// pass from where the bytes were read to where they are kept (a slot
    /// fills from the direct-read buffer this way).
    fn interleave_from(&self, k: usize, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError>;
    /// [`Interleaved::interleave_from`] in place, through a copy of one
    /// group at a time.
    fn interleave(&self, k: usize, bytes: &mut [u8]) -> Result<(), QuantError> {
        let nb = group_geometry(self.ty(), k, bytes.len())?;
        let mut scratch = vec![0u8; nb * self.ty().type_size() * GROUP_ROWS];
        for group in bytes.chunks_exact_mut(scratch.len()) {
            scratch.copy_from_slice(group);
            self.interleave_from(k, &scratch, group)?;
        }
        Ok(())
    }
    /// The inverse of [`Interleaved::interleave`].
    fn deinterleave(&self, k: usize, bytes: &mut [u8]) -> Result<(), QuantError>;
    /// `out[t * n_rows + r]`: interleaved weight row `r` of `w` (whole
    /// groups) against activation row `t` of `acts` (rows of `k` values in
    /// the type's activation format), in the order of llama.cpp's kernels
    /// for the type at its defaults (module docs), those `rows` names. The
    /// whole product has `batch` activation rows (1 for a mat-vec; see
    /// [`QuantOps::vec_dot_tile_batch`]): for the types ggml does not
    /// repack, its kernel depends on that count.
    fn dot_tile(
        &self,
        k: usize,
        w: &[u8],
        acts: &[u8],
        out: &mut [f32],
        rows: Rows,
        batch: usize,
    ) -> Result<(), QuantError>;
}

/// Which of ggml's repack kernels llama.cpp runs on a product's activation
/// rows. Its gemv and its 4-row gemm sum alike for the 32-value types but
/// not for Q4_K (the gemm takes one FMA per 64 values, the gemv one per
/// super-block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Every row through the gemv: a mat-vec, or an expert's rows (ggml's
    /// repacked MUL_MAT_ID runs the gemv row by row).
    Gemv,
    /// A MUL_MAT's rows: the first `n - n % 4` of the batch through the
    /// gemm, in fours, the rest through the gemv. `acts` must then start a
    /// multiple of four rows into the batch, and only the batch's last tile
    /// may hold a count of rows that is not a multiple of four: of a tile of
    /// `nt` rows, the first `nt - nt % 4` are the gemm's.
    Tiles,
}

/// The interleaved layout of `ty` when the running CPU has its kernels
/// (AVX2 + FMA + F16C, summing with `vpdpbusd` where AVX-512 VNNI is
/// there; `LONGHAUL_NO_SIMD=1` turns it off with the SIMD kernels): Q4_0,
/// Q8_0, IQ4_NL, MXFP4 and Q4_K (its own layout, [`q4_k`]); on AVX-512
/// CPUs, where ggml repacks it too, Q2_K ([`q2_k`]), and Q6_K and IQ4_XS,
/// with the plain kernels' bits ([`q6_k`], [`iq4_xs`]).
pub fn interleaved(ty: GgmlType) -> Option<&'static dyn Interleaved> {
    interleaved_with_caps(ty, CpuCaps::detect())
}

fn interleaved_with_caps(ty: GgmlType, caps: CpuCaps) -> Option<&'static dyn Interleaved> {
    if !caps.has_avx2() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use super::simd_x86::packed::Isa;
        use chunked::Chunked;
        static AVX2: [Chunked; 4] = Chunked::all(Isa::Avx2);
        static VNNI: [Chunked; 4] = Chunked::all(Isa::Vnni);
        static Q4_K_AVX2: q4_k::SuperBlocked = q4_k::SuperBlocked { avx512: false };
        static Q4_K_512: q4_k::SuperBlocked = q4_k::SuperBlocked { avx512: true };
        let set = if caps.has_avx512() { &VNNI } else { &AVX2 };
        if let Some(c) = set.iter().find(|c| c.ty() == ty) {
            return Some(c);
        }
        if ty == GgmlType::Q4_K {
            return Some(if caps.has_avx512() {
                &Q4_K_512
            } else {
                &Q4_K_AVX2
            });
        }
        // ggml repacks Q2_K on AVX-512 CPUs only; Q6_K and IQ4_XS, which
        // it does not repack on x86, take layouts of the same bits there
        // ([`q6_k`], [`iq4_xs`]).
        if ty == GgmlType::Q2_K && caps.has_avx512() {
            return Some(&q2_k::Interleaved8);
        }
        if ty == GgmlType::Q6_K && caps.has_avx512() {
            static Q6_K: plain_bits::PlainBitsLayout<q6_k::Q6K> = plain_bits::PlainBitsLayout::NEW;
            return Some(&Q6_K);
        }
        if ty == GgmlType::IQ4_XS && caps.has_avx512() {
            static IQ4_XS: plain_bits::PlainBitsLayout<iq4_xs::IQ4XS> =
                plain_bits::PlainBitsLayout::NEW;
            return Some(&IQ4_XS);
        }
    }
    let _ = ty;
    None
}

/// The layout a matrix of `n_rows` rows of `ty` takes when its bytes are
/// prepared for the CPU kernels: [`interleaved`] for whole groups of rows.
pub fn for_matrix(ty: GgmlType, n_rows: usize) -> Option<&'static dyn Interleaved> {
    (n_rows > 0 && n_rows.is_multiple_of(GROUP_ROWS))
        .then(|| interleaved(ty))
        .flatten()
}

/// Bytes of one group of [`GROUP_ROWS`] rows of `k` values of `ty`: the
/// smallest piece of a matrix its layout converts alone.
pub fn group_bytes(ty: GgmlType, k: usize) -> Option<usize> {
    Some(ty.row_bytes(k as u64)? as usize * GROUP_ROWS)
}

/// Whether a matrix of `n_rows` rows of `ty` is interleaved ([`for_matrix`]).
pub fn interleaves(ty: GgmlType, n_rows: usize) -> bool {
    for_matrix(ty, n_rows).is_some()
}

/// Checks that a conversion's destination is as long as its source.
fn check_same_len(ty: GgmlType, src: usize, dst: usize) -> Result<(), QuantError> {
    if src != dst {
        return Err(QuantError::BadLength {
            ty,
            what: "interleave destination",
            unit: "bytes (the source's length)",
            expected: src,
            got: dst,
        });
    }
    Ok(())
}

/// Blocks per row of `ty`, checking `len` bytes hold whole groups of
/// `k`-value rows.
fn group_geometry(ty: GgmlType, k: usize, len: usize) -> Result<usize, QuantError> {
    let (bs, bb) = (ty.block_size(), ty.type_size());
    let bad = |what, unit, expected, got| QuantError::BadLength {
        ty,
        what,
        unit,
        expected,
        got,
    };
    if k == 0 || !k.is_multiple_of(bs) {
        return Err(bad(
            "interleaved row",
            "values (whole blocks)",
            k.div_ceil(bs) * bs,
            k,
        ));
    }
    let group = k / bs * bb * GROUP_ROWS;
    if !len.is_multiple_of(group) {
        return Err(bad(
            "interleaved matrix",
            "bytes (whole 8-row groups)",
            len / group * group,
            len,
        ));
    }
    Ok(k / bs)
}

/// Checks that `out` holds one result per weight row (`n_rows`) and
/// activation row (`acts_len` bytes of `arb`-byte rows).
fn check_tile(
    ty: GgmlType,
    n_rows: usize,
    arb: usize,
    acts_len: usize,
    out_len: usize,
) -> Result<(), QuantError> {
    if arb == 0 || !acts_len.is_multiple_of(arb) || out_len != n_rows * (acts_len / arb) {
        return Err(QuantError::BadLength {
            ty,
            what: "interleaved dot_tile output",
            unit: "values (weight rows x activation rows)",
            expected: n_rows * (acts_len / arb.max(1)),
            got: out_len,
        });
    }
    Ok(())
}

/// What the super-block layouts' `dot_tile` works on: blocks per row,
/// weight rows, the Q8_K activation rows, and how many of those (from the
/// first) ggml's gemm takes, in fours ([`Rows`]).
#[cfg(target_arch = "x86_64")]
struct SuperBlockTile<'a> {
    nb: usize,
    n_rows: usize,
    acts: std::borrow::Cow<'a, [super::BlockQ8K]>,
    n_gemm: usize,
}

#[cfg(target_arch = "x86_64")]
impl<'a> SuperBlockTile<'a> {
    /// Checks a `dot_tile` of `ty` (super-blocks against Q8_K) and views
    /// its activations as blocks.
    fn new(
        ty: GgmlType,
        k: usize,
        w_len: usize,
        acts: &'a [u8],
        out_len: usize,
        rows_of: Rows,
    ) -> Result<Self, QuantError> {
        let nb = group_geometry(ty, k, w_len)?;
        let n_rows = w_len / (nb * ty.type_size());
        let arb = nb * std::mem::size_of::<super::BlockQ8K>();
        check_tile(ty, n_rows, arb, acts.len(), out_len)?;
        let acts = super::cast_or_copy(GgmlType::Q8_K, "interleaved activations", acts)?;
        let n_act = acts.len() / nb;
        let n_gemm = match rows_of {
            Rows::Tiles => n_act / 4 * 4,
            Rows::Gemv => 0,
        };
        Ok(SuperBlockTile {
            nb,
            n_rows,
            acts,
            n_gemm,
        })
    }

    /// The activation rows, `nb` blocks each.
    fn rows(&self) -> Vec<&[super::BlockQ8K]> {
        self.acts.chunks_exact(self.nb).collect()
    }
}

/// A kernel over one group of eight interleaved rows (x86, AVX-512):
/// `dot::<N>(g, a, out, gemm)` puts activation row `t`'s eight products in
/// `out[t]`, each chunk of `g` unpacked once for the `N` (1 to 4) rows;
/// `gemm` picks ggml's 4-row gemm order where the type has one.
#[cfg(target_arch = "x86_64")]
trait GroupDot {
    /// # Safety
    /// The CPU has the kernel's features (AVX-512 F/BW/VL/VNNI); `g` holds
    /// as many group super-blocks as each of `a` holds blocks.
    unsafe fn dot<const N: usize>(
        g: &[u8],
        a: [&[super::BlockQ8K]; N],
        out: &mut [[f32; GROUP_ROWS]; N],
        gemm: bool,
    );
}

/// Every group of `w` (`gb` bytes each) against the activation `rows` four
/// at a time ([`GroupDot`]), the first `n_gemm` of them in the gemm's
/// order: `out[t * n_rows + r]`.
///
/// # Safety
/// As [`GroupDot::dot`], for every group.
#[cfg(target_arch = "x86_64")]
unsafe fn groups_in_fours<K: GroupDot>(
    w: &[u8],
    gb: usize,
    rows: &[&[super::BlockQ8K]],
    n_gemm: usize,
    n_rows: usize,
    out: &mut [f32],
) {
    for (gi, g) in w.chunks_exact(gb).enumerate() {
        for (ti, a) in rows.chunks(4).enumerate() {
            let gemm = 4 * ti < n_gemm;
            let mut res = [[0f32; GROUP_ROWS]; 4];
            match *a {
                [a0, a1, a2, a3] => K::dot(g, [a0, a1, a2, a3], &mut res, gemm),
                [a0, a1, a2] => {
                    let r = (&mut res[..3]).try_into().expect("three rows");
                    K::dot(g, [a0, a1, a2], r, gemm)
                }
                [a0, a1] => {
                    let r = (&mut res[..2]).try_into().expect("two rows");
                    K::dot(g, [a0, a1], r, gemm)
                }
                [a0] => {
                    let r = (&mut res[..1]).try_into().expect("one row");
                    K::dot(g, [a0], r, gemm)
                }
                _ => {}
            }
            for (t, r) in res.iter().take(a.len()).enumerate() {
                let at = (4 * ti + t) * n_rows + gi * GROUP_ROWS;
                out[at..at + GROUP_ROWS].copy_from_slice(r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{ops, quantize_activations};

    /// Deterministic bytes: a xorshift stream, with `f16` scales kept
    /// finite and small.
    fn random_rows(ty: GgmlType, k: usize, rows: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let bb = ty.type_size();
        let mut v: Vec<u8> = (0..k / ty.block_size() * bb * rows)
            .map(|_| next() as u8)
            .collect();
        // Q4_K's `dmin` after its `d`; Q2_K's pair and Q6_K's `d` end
        // their blocks.
        let (scales, at) = match ty {
            GgmlType::Q4_K => (2, 0),
            GgmlType::Q2_K => (2, 80),
            GgmlType::Q6_K => (1, 208),
            _ => (1, 0),
        };
        for blk in v.chunks_exact_mut(bb) {
            for s in 0..scales {
                let d = half::f16::from_f32((next() % 1000) as f32 / 4096.0 - 0.12);
                blk[at + 2 * s..at + 2 * s + 2].copy_from_slice(&d.to_bits().to_le_bytes());
            }
        }
        v
    }

    fn acts(ty: GgmlType, k: usize, n: usize, seed: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut x = seed as f32;
        for _ in 0..n {
            let row: Vec<f32> = (0..k)
                .map(|i| {
                    x = (x * 1.618 + i as f32 * 0.37).fract();
                    (x - 0.5) * 3.0
                })
                .collect();
            let mut q = Vec::new();
            quantize_activations(ty, &row, &mut q).unwrap();
            out.extend_from_slice(&q);
        }
        out
    }

    const TYPES: [GgmlType; 8] = [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
        GgmlType::MXFP4,
        GgmlType::Q4_K,
        GgmlType::Q2_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
    ];

    /// The shapes: one block, two, three, many (even and odd counts, for the
    /// two-chain kernels' odd last block); one group and several; one
    /// activation row (mat-vec) and batches either side of ggml's tiled
    /// floor.
    const SHAPES: [(usize, usize); 6] = [
        (32, 8),
        (64, 8),
        (96, 16),
        (1120, 16),
        (2048, 24),
        (4160, 8),
    ];

    /// [`SHAPES`] in `ty`'s blocks: Q4_K's rows are eight times longer
    /// (one super-block, two, three, many; 16 and 24 rows for AVX-512's
    /// pairs of groups and a lone group).
    fn shapes(ty: GgmlType) -> impl Iterator<Item = (usize, usize)> {
        SHAPES
            .map(|(k, rows)| (k / 32 * ty.block_size(), rows))
            .into_iter()
    }

    #[test]
    fn interleaving_round_trips_and_moves_every_byte() {
        for ty in TYPES {
            let Some(il) = interleaved(ty) else { continue };
            for (k, rows) in shapes(ty) {
                let plain = random_rows(ty, k, rows, k as u64 + rows as u64);
                let mut b = plain.clone();
                il.interleave(k, &mut b).unwrap();
                assert_ne!(b, plain, "{ty} {k}x{rows}: interleaving changed nothing");
                // Q4_K re-encodes its packed scales; the others move bytes.
                let (mut x, mut y) = (b.clone(), plain.clone());
                x.sort_unstable();
                y.sort_unstable();
                assert!(
                    ty == GgmlType::Q4_K || x == y,
                    "{ty} {k}x{rows}: not a permutation"
                );
                // From a source to a destination: the same bytes as in place.
                let mut to = vec![0u8; plain.len()];
                il.interleave_from(k, &plain, &mut to).unwrap();
                assert_eq!(to, b, "{ty} {k}x{rows}: interleave_from");
                // Through the scratch group and the streaming stores, at an
                // odd offset (ordinary stores either side of the streamed
                // pieces): the same bytes again.
                let mut under = vec![0u8; plain.len() + 1];
                interleave_streamed(il, k, &plain, &mut under[1..]).unwrap();
                assert_eq!(under[1..], b, "{ty} {k}x{rows}: interleave_streamed");
                il.deinterleave(k, &mut b).unwrap();
                assert_eq!(b, plain, "{ty} {k}x{rows}: round trip");
            }
        }
    }

    #[test]
    fn interleaved_places_scales_then_chunks_of_every_row() {
        // Block 0 of a Q8_0 group: the scale of row r at 2r, chunk c of row r
        // at 16 + (8c + r) * 4.
        let Some(il) = interleaved(GgmlType::Q8_0) else {
            return;
        };
        let k = 64;
        let plain = random_rows(GgmlType::Q8_0, k, 8, 7);
        let mut b = plain.clone();
        il.interleave(k, &mut b).unwrap();
        let rb = 2 * 34;
        for r in 0..8 {
            assert_eq!(b[2 * r..2 * r + 2], plain[r * rb..r * rb + 2]);
            for c in 0..8 {
                let at = 16 + (8 * c + r) * 4;
                assert_eq!(b[at..at + 4], plain[r * rb + 2 + 4 * c..r * rb + 6 + 4 * c]);
            }
        }
        // Block 1 follows block 0's 8 * 34 bytes.
        assert_eq!(b[8 * 34..8 * 34 + 2], plain[34..36]);
    }

    /// The running CPU's kernel sets: its own and, on an AVX-512 CPU, the
    /// AVX2 one too (both give the same bits).
    fn kernel_sets() -> Vec<CpuCaps> {
        let caps = CpuCaps::detect();
        let mut sets = vec![caps];
        if caps.has_avx512() {
            sets.push(CpuCaps {
                avx512: false,
                ..caps
            });
        }
        sets
    }

    /// ggml's x86 repack kernels (`gemv_q4_b32_8x8_q8_0_lut_avx` and its
    /// gemm) in scalar form, on plain rows: per row, activation row and
    /// block, the 32 products summed in integers, then
    /// `acc = fma(f32(sum), d_w * d_a, acc)`. `out[t * rows + r]`.
    fn ggml_repack_order(ty: GgmlType, k: usize, w: &[u8], a: &[u8]) -> Vec<f32> {
        use crate::quant::common::{e8m0_to_f32_half, KVALUES_IQ4NL, KVALUES_MXFP4};
        let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        let (nb, bb) = (k / 32, ty.type_size());
        let (rows, n) = (w.len() / (nb * bb), a.len() / (nb * 34));
        let mut out = vec![0f32; rows * n];
        for t in 0..n {
            for r in 0..rows {
                let mut acc = 0f32;
                for b in 0..nb {
                    let blk = &w[(r * nb + b) * bb..][..bb];
                    let act = &a[(t * nb + b) * 34..][..34];
                    let (d_w, qs) = match ty {
                        GgmlType::MXFP4 => (e8m0_to_f32_half(blk[0]), &blk[1..]),
                        _ => (f16(blk), &blk[2..]),
                    };
                    let value = |i: usize| {
                        let q = if i < 16 { qs[i] & 15 } else { qs[i - 16] >> 4 };
                        match ty {
                            GgmlType::IQ4_NL => KVALUES_IQ4NL[q as usize] as i32,
                            GgmlType::MXFP4 => KVALUES_MXFP4[q as usize] as i32,
                            _ => q as i32 - 8,
                        }
                    };
                    let sum: i32 = (0..32).map(|i| value(i) * act[2 + i] as i8 as i32).sum();
                    acc = (sum as f32).mul_add(d_w * f16(act), acc);
                }
                out[t * rows + r] = acc;
            }
        }
        out
    }

    /// ggml's x86 repack kernels for a K-quant in scalar form, on plain
    /// rows: per row, activation row and super-block, `sums(r, b, t)` gives
    /// the exact `(isum, imin)` integers of each of the gemm's units (the
    /// gemv adds them up first), each then takes one FMA into `acc` (by
    /// `d · d_a`) and one into `acc_min` (by `dmin · d_a`), and
    /// `acc - acc_min` at the end. The gemm takes the first `n_gemm`
    /// activation rows. `d_dmin(r, b)` are the block's scales.
    fn ggml_k_repack_order(
        (rows, n, nb): (usize, usize, usize),
        n_gemm: usize,
        d_a: impl Fn(usize, usize) -> f32,
        d_dmin: impl Fn(usize, usize) -> (f32, f32),
        sums: impl Fn(usize, usize, usize) -> Vec<(i32, i32)>,
    ) -> Vec<f32> {
        let mut out = vec![0f32; rows * n];
        for t in 0..n {
            for r in 0..rows {
                let (mut acc, mut acc_min) = (0f32, 0f32);
                for b in 0..nb {
                    let (d, dmin) = d_dmin(r, b);
                    let mut units = sums(r, b, t);
                    if t >= n_gemm {
                        let all = units.iter().fold((0, 0), |s, u| (s.0 + u.0, s.1 + u.1));
                        units = vec![all];
                    }
                    for (isum, imin) in units {
                        acc = (isum as f32).mul_add(d * d_a(t, b), acc);
                        acc_min = (imin as f32).mul_add(dmin * d_a(t, b), acc_min);
                    }
                }
                out[t * rows + r] = acc - acc_min;
            }
        }
        out
    }

    fn blocks<B: bytemuck::Pod>(bytes: &[u8]) -> Vec<B> {
        bytes
            .chunks_exact(std::mem::size_of::<B>())
            .map(bytemuck::pod_read_unaligned)
            .collect()
    }

    /// ggml's x86 `q4_K_8x8_q8_K` kernels (AVX2 and AVX-512):
    /// `isum = Σ_j sc_j · Σ q4 · q8` and
    /// `imin = Σ_j m_j · (bsums[2j] + bsums[2j + 1])` over 8 sub-blocks of
    /// 32, units of 64 values in the gemm.
    fn ggml_q4_k_repack_order(k: usize, w: &[u8], a: &[u8], n_gemm: usize) -> Vec<f32> {
        use crate::quant::{BlockQ4K, BlockQ8K};
        let nb = k / 256;
        let (w, a): (Vec<BlockQ4K>, Vec<BlockQ8K>) = (blocks(w), blocks(a));
        let shape = (w.len() / nb, a.len() / nb, nb);
        let sums = |r: usize, b: usize, t: usize| {
            let (x, y) = (&w[r * nb + b], &a[t * nb + b]);
            let (sc, m) = x.scale_mins();
            (0..4)
                .map(|u| {
                    let (mut isum, mut imin) = (0, 0);
                    for j in 2 * u..2 * u + 2 {
                        let q = |l: usize| {
                            let byte = x.qs[32 * (j / 2) + l];
                            (if j % 2 == 0 { byte & 15 } else { byte >> 4 }) as i32
                        };
                        let dot: i32 = (0..32).map(|l| q(l) * y.qs[32 * j + l] as i32).sum();
                        isum += sc[j] as i32 * dot;
                        imin += m[j] as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
                    }
                    (isum, imin)
                })
                .collect()
        };
        let d_dmin = |r: usize, b: usize| (w[r * nb + b].d.to_f32(), w[r * nb + b].dmin.to_f32());
        ggml_k_repack_order(shape, n_gemm, |t, b| a[t * nb + b].d, d_dmin, sums)
    }

    /// ggml's x86 `q2_K_8x8_q8_K` kernels (AVX-512): `isum = Σ_j sc_j · Σ
    /// q2 · q8` and `imin = Σ_j m_j · bsums[j]` over 16 sub-blocks of 16,
    /// units of 128 values in the gemm.
    fn ggml_q2_k_repack_order(k: usize, w: &[u8], a: &[u8], n_gemm: usize) -> Vec<f32> {
        use crate::quant::{BlockQ2K, BlockQ8K};
        let nb = k / 256;
        let (w, a): (Vec<BlockQ2K>, Vec<BlockQ8K>) = (blocks(w), blocks(a));
        let shape = (w.len() / nb, a.len() / nb, nb);
        let sums = |r: usize, b: usize, t: usize| {
            let (x, y) = (&w[r * nb + b], &a[t * nb + b]);
            (0..2)
                .map(|h| {
                    let (mut isum, mut imin) = (0, 0);
                    for j in 8 * h..8 * h + 8 {
                        let (s, q) = ((j % 8) / 2, j % 2);
                        let dot: i32 = (0..16)
                            .map(|i| {
                                let l = 16 * q + i;
                                let v = (x.qs[32 * h + l] >> (2 * s)) & 3;
                                v as i32 * y.qs[128 * h + 32 * s + l] as i32
                            })
                            .sum();
                        isum += (x.scales[j] & 15) as i32 * dot;
                        imin += (x.scales[j] >> 4) as i32 * y.bsums[j] as i32;
                    }
                    (isum, imin)
                })
                .collect()
        };
        let d_dmin = |r: usize, b: usize| (w[r * nb + b].d.to_f32(), w[r * nb + b].dmin.to_f32());
        ggml_k_repack_order(shape, n_gemm, |t, b| a[t * nb + b].d, d_dmin, sums)
    }

    #[test]
    fn interleaved_kernels_give_the_bits_of_llamacpps_kernels_at_its_defaults() {
        // Q8_0, Q6_K and IQ4_XS (not repacked by ggml on x86): the plain
        // kernels' bits, `vec_dot`'s below ggml's tiled floor and its tiled path's
        // from there on (33 rows); the others: ggml's repack order.
        for (ty, caps) in TYPES
            .iter()
            .flat_map(|&t| kernel_sets().into_iter().map(move |c| (t, c)))
        {
            let Some(il) = interleaved_with_caps(ty, caps) else {
                continue;
            };
            let op = ops(ty).unwrap();
            for (k, rows) in shapes(ty) {
                let plain = random_rows(ty, k, rows, 99 + k as u64);
                let mut w = plain.clone();
                il.interleave(k, &mut w).unwrap();
                let runs = [1, 2, 7, 8, 33]
                    .into_iter()
                    .flat_map(|n| [(n, Rows::Gemv), (n, Rows::Tiles)]);
                for (n, rows_of) in runs {
                    let a = acts(op.act_type(), k, n, n as u64);
                    let mut want = vec![0f32; rows * n];
                    let mut got = vec![f32::NAN; rows * n];
                    let n_gemm = if rows_of == Rows::Tiles { n / 4 * 4 } else { 0 };
                    if ty == GgmlType::Q4_K {
                        want = ggml_q4_k_repack_order(k, &plain, &a, n_gemm);
                    } else if ty == GgmlType::Q2_K {
                        want = ggml_q2_k_repack_order(k, &plain, &a, n_gemm);
                    } else if ![GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::IQ4_XS].contains(&ty) {
                        want = ggml_repack_order(ty, k, &plain, &a);
                    } else if n == 1 {
                        op.vec_dot_rows(k, &plain, &a, &mut want).unwrap();
                    } else {
                        op.vec_dot_tile_batch(k, &plain, &a, &mut want, n).unwrap();
                    }
                    il.dot_tile(k, &w, &a, &mut got, rows_of, n).unwrap();
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{ty} {caps:?} k={k} rows={rows} n={n} {rows_of:?} out {i}: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_part_of_a_batch_takes_the_whole_batchs_kernel() {
        // ggml picks Q6_K's and IQ4_XS's kernel by the whole product's row
        // count: a work item's three rows of a 33-row batch take the tiled
        // path's bits, the same three rows as a batch of their own
        // `vec_dot`'s.
        for ty in [GgmlType::Q6_K, GgmlType::IQ4_XS] {
            let Some(il) = interleaved(ty) else { continue };
            let op = ops(ty).unwrap();
            let (k, rows) = (512, 16);
            let plain = random_rows(ty, k, rows, 5);
            let mut w = plain.clone();
            il.interleave(k, &mut w).unwrap();
            let a = acts(op.act_type(), k, 3, 3);
            let mut tiled = vec![0f32; rows * 3];
            let mut own = vec![0f32; rows * 3];
            op.vec_dot_tile_batch(k, &plain, &a, &mut tiled, 33)
                .unwrap();
            op.vec_dot_tile_batch(k, &plain, &a, &mut own, 3).unwrap();
            assert_ne!(tiled, own, "{ty}: the two kernels should differ somewhere");
            for (batch, want) in [(33, &tiled), (3, &own)] {
                let mut got = vec![f32::NAN; rows * 3];
                il.dot_tile(k, &w, &a, &mut got, Rows::Tiles, batch)
                    .unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(want), "{ty} batch {batch}");
            }
        }
    }

    #[test]
    fn bad_geometry_is_an_error_not_a_panic() {
        let Some(il) = interleaved(GgmlType::Q4_0) else {
            return;
        };
        let mut seven_rows = vec![0u8; 18 * 7];
        assert!(il.interleave(32, &mut seven_rows).is_err());
        assert!(il.interleave(33, &mut [0u8; 18 * 8]).is_err());
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K] {
            let Some(il) = interleaved(ty) else { continue };
            let (k, src) = (ty.block_size(), vec![0u8; 8 * ty.type_size()]);
            let mut short = vec![0u8; src.len() - 1];
            assert!(il.interleave_from(k, &src, &mut short).is_err(), "{ty}");
        }
        let w = vec![0u8; 18 * 8];
        assert!(il
            .dot_tile(32, &w, &[0u8; 34], &mut [0f32; 7], Rows::Gemv, 1)
            .is_err());
        assert!(il
            .dot_tile(32, &w, &[0u8; 33], &mut [0f32; 8], Rows::Gemv, 1)
            .is_err());
    }

    #[test]
    fn no_interleaving_without_the_kernels_or_for_ragged_row_counts() {
        assert!(interleaved_with_caps(GgmlType::Q4_0, CpuCaps::NONE).is_none());
        assert!(!interleaves(GgmlType::Q4_0, 12));
        assert!(!interleaves(GgmlType::Q4_K, 12));
        assert!(!interleaves(GgmlType::Q6_K, 12));
        // Q2_K as ggml has it: interleaved on AVX-512 only; Q6_K too.
        let avx2 = CpuCaps {
            avx2: true,
            fma: true,
            f16c: true,
            ..CpuCaps::NONE
        };
        let avx512 = CpuCaps {
            avx512: true,
            ..avx2
        };
        assert!(interleaved_with_caps(GgmlType::Q2_K, avx2).is_none());
        assert!(interleaved_with_caps(GgmlType::Q6_K, avx2).is_none());
        if cfg!(target_arch = "x86_64") {
            assert!(interleaved_with_caps(GgmlType::Q4_K, avx2).is_some());
            assert!(interleaved_with_caps(GgmlType::Q2_K, avx512).is_some());
            assert!(interleaved_with_caps(GgmlType::Q6_K, avx512).is_some());
        }
    }
}
