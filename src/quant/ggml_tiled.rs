//! The numerics of ggml's x86 "tiled" matmul (`ggml-cpu/tiled`), which ggml
//! runs instead of `vec_dot` for the K-quants, IQ4_XS and the 1–3-bit
//! i-quants whenever a MUL_MAT has at least [`MIN_BATCH`] activation rows
//! (for MUL_MAT_ID: rows routed to one expert) and the weights are not
//! repacked. Per (weight row, activation row) and per 256-element block it
//! forms two exact integers, `s1 = sum_e W_e a_e` (weight code times its
//! sub-block scale, times the Q8_K code) and, for the types with mins,
//! `s2 = sum_e M_e a_e` (the sub-block min), then
//! `res = f32(s1) * d0`, `res = fnmadd(dmin, f32(s2), res)` and
//! `acc = fma(res, d_act, acc)`, blocks in order from `acc = 0`.
//!
//! Integer sums are exact whatever order computes them, so each weight
//! block is decoded once per group of activation rows into [`Tile`]: codes
//! `q` (one `i8` per element) and integer scales `sc` and mins `m` (one per
//! 16 elements) with `W = q * sc`, and `d0` such that `d0 * W` is the
//! dequantised value (the i-quants' scales are odd multiples of 1/8 or 1/4,
//! so their `d0` carries that power of two, which keeps `f32(s1) * d0`
//! ggml's bits). `s2 = sum_g m_g * bsums_g`, and `s1` is computed by one of
//! three kernels: AVX2 (`maddubs` + `madd` by the group scales), AVX-512
//! below 16 activation rows (`maddubs` + `dpwssd`), and AVX-512 VNNI from
//! 16 rows on with the activations interleaved 16 rows to a vector
//! (`dpbusd` against broadcast weight codes, bands of 4 weight rows). The
//! decoders are in `ggml_tiled/decoders.rs`. The test module checks every
//! decoder against the type's
//! own (gguf-py-exact) dequantiser through a slow reference that derives
//! `W` and `M` from it: with the block scale set to 1 (and `dmin` to 0) the
//! dequantised value is the sub-block scale times the code, exactly, and
//! with `d = 0, dmin = 1` it is minus the sub-block min.

use super::{BlockQ8K, GgmlBlock};

/// ggml's batch floor: `ggml_tiled_min_batch` (rows >= 8).
pub const MIN_BATCH: usize = 8;

const QK: usize = 256;
const NG: usize = QK / 16;

/// One weight block decoded for the integer sums: element `e` is
/// `d0 * q[e] * sc[e / 16]` minus `dmin * m[e / 16]`.
#[repr(C, align(32))]
pub(super) struct Tile {
    q: [i8; QK],
    sc: [i16; NG],
    m: [i16; NG],
    d0: f32,
    dmin: f32,
}

impl Tile {
    const fn new() -> Self {
        Self {
            q: [0; QK],
            sc: [0; NG],
            m: [0; NG],
            d0: 0.0,
            dmin: 0.0,
        }
    }

    /// The same scale for the two 16-element groups of 32-element
    /// sub-block `ib`.
    #[inline(always)]
    fn sub_scale(&mut self, ib: usize, s: i32) {
        self.sc[2 * ib] = s as i16;
        self.sc[2 * ib + 1] = s as i16;
    }
}

/// How a type's codes enter `maddubs`, whose first operand is unsigned.
#[derive(Clone, Copy)]
pub(super) enum Codes {
    /// Already in `0..=127`.
    Unsigned,
    /// In `-64..=63`: `q + 64` enters, and `64 * sum_g sc_g * bsums_g` is
    /// taken off `s1` (exact: `bsums` are the sums of the Q8_K codes).
    Offset,
    /// Wider (IQ4_XS's `-127..=113`): `|q|` enters, against `a` negated
    /// where `q < 0`.
    Signed,
}

/// A block type ggml's tiled path handles, and its decoder. Every code is
/// in `-127..=127` and every scale in `-128..=128`, so the `maddubs` pairs
/// and the `i32` sums cannot overflow.
pub(super) trait TiledBlock: GgmlBlock<Act = BlockQ8K> {
    /// Sub-block mins (`dmin`) present.
    const HAS_MIN: bool;
    const CODES: Codes;
    /// Codes per scale (and min): 16, or 32 where both groups of a 32-code
    /// sub-block always share theirs.
    const SUB: usize;
    fn decode(&self, t: &mut Tile);
    /// [`TiledBlock::decode`], with AVX2 where the type has a faster way
    /// (the i-quants' grids and signs); the same `Tile`.
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_simd(&self, t: &mut Tile) {
        self.decode(t)
    }
    /// [`TiledBlock::decode_simd`] for the AVX-512 kernels, faster where
    /// 512-bit gathers and masks pay (the i-quants' grids and signs); the
    /// same `Tile`.
    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI, AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_512(&self, t: &mut Tile) {
        self.decode_simd(t)
    }
}

/// Where a tiled kernel reads its weight blocks: plain rows of `B`, or an
/// interleaved layout's groups ([`Q6KGroups`], [`IQ4XSGroups`]), decoded
/// into the same [`Tile`] as the plain bytes give.
pub(super) trait Blocks<B: TiledBlock> {
    /// Blocks in all rows.
    fn len(&self) -> usize;
    /// Decodes block `j` of row `r` (rows of `nb` blocks).
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    unsafe fn decode_at(&self, nb: usize, r: usize, j: usize, t: &mut Tile);
    /// [`Blocks::decode_at`] in the AVX-512 kernels.
    /// # Safety
    /// As [`TiledBlock::decode_512`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_at_512(&self, nb: usize, r: usize, j: usize, t: &mut Tile) {
        self.decode_at(nb, r, j, t)
    }
}

impl<B: TiledBlock> Blocks<B> for [B] {
    fn len(&self) -> usize {
        <[B]>::len(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_at(&self, nb: usize, r: usize, j: usize, t: &mut Tile) {
        self[r * nb + j].decode_simd(t)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_at_512(&self, nb: usize, r: usize, j: usize, t: &mut Tile) {
        self[r * nb + j].decode_512(t)
    }
}

mod layouts;
pub(super) use layouts::{IQ4XSGroups, Q6KGroups};

mod decoders;

/// Activation rows sharing one decoded weight block in the AVX2 kernel and
/// the AVX-512 one below 16 rows.
const TILE_T: usize = 64;

/// Lengths the kernels accept: `nb` blocks per row, whole rows, one output
/// per (weight row, activation row). The callers in `ops` check them first;
/// here a mismatch writes nothing.
fn shape_ok(nb: usize, nw: usize, na: usize, nout: usize) -> bool {
    nb != 0 && nw.is_multiple_of(nb) && na.is_multiple_of(nb) && nout == (nw / nb) * (na / nb)
}

/// `out[t * nr + r]` = row `r` of `w` (rows of `nb` blocks) times
/// activation row `t` of `a`, with ggml's tiled-path bits, on AVX2 + FMA
/// (selected only where `CpuCaps::has_avx2`, see `ops::BatchKernel`).
#[cfg(target_arch = "x86_64")]
pub(super) fn tiled_avx2<B: TiledBlock>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
    if shape_ok(nb, w.len(), a.len(), out.len()) {
        // SAFETY: only selected where CpuCaps::has_avx2() (AVX2, FMA).
        unsafe { avx2::tiled(nb, w, a, out) }
    }
}

/// [`tiled_avx2`] on AVX-512 F/BW/VL/VNNI (selected only where
/// `CpuCaps::has_avx512`): the same integers, so the same bits.
#[cfg(target_arch = "x86_64")]
pub(super) fn tiled_avx512<B: TiledBlock>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
    // SAFETY: only selected where CpuCaps::has_avx512().
    unsafe { tiled_blocks_avx512(nb, w, a, out) }
}

/// [`tiled_avx512`] on any source of blocks: an interleaved layout's
/// groups ([`Q6KGroups`], [`IQ4XSGroups`]) give the plain rows' bits.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/VNNI (where those layouts exist).
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn tiled_blocks_avx512<B: TiledBlock, W: Blocks<B> + ?Sized>(
    nb: usize,
    w: &W,
    a: &[BlockQ8K],
    out: &mut [f32],
) {
    if !shape_ok(nb, w.len(), a.len(), out.len()) {
        return;
    }
    // Below 16 rows the interleaved lanes would sit idle.
    if a.len() / nb >= 16 {
        vnni16::tiled(nb, w, a, out)
    } else {
        avx512::tiled(nb, w, a, out)
    }
}

/// [`tiled_avx2`] in plain Rust, the same sums and float steps (ggml's
/// tiled path is x86-only, so nothing selects this; the tests hold the SIMD
/// kernels to it).
#[cfg(test)]
fn portable<B: TiledBlock>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
    let (nr, nt) = (w.len() / nb, a.len() / nb);
    let mut tile = Tile::new();
    out.fill(0.0);
    for (r, row) in w.chunks_exact(nb).enumerate() {
        for (j, x) in row.iter().enumerate() {
            x.decode(&mut tile);
            for t in 0..nt {
                let y = &a[t * nb + j];
                let mut s1 = 0i32;
                for (g, (q, a)) in tile
                    .q
                    .chunks_exact(16)
                    .zip(y.qs.chunks_exact(16))
                    .enumerate()
                {
                    let s: i32 = q.iter().zip(a).map(|(&q, &a)| q as i32 * a as i32).sum();
                    s1 += s * tile.sc[g] as i32;
                }
                let mut res = s1 as f32 * tile.d0;
                if B::HAS_MIN {
                    let s2: i32 = tile
                        .m
                        .iter()
                        .zip(&y.bsums)
                        .map(|(&m, &b)| m as i32 * b as i32)
                        .sum();
                    res = (-tile.dmin).mul_add(s2 as f32, res);
                }
                let o = &mut out[t * nr + r];
                *o = res.mul_add(y.d, *o);
            }
        }
    }
}

/// The driver of one instruction set: groups of [`TILE_T`] activation
/// rows against every weight row; per weight block, eight activation rows'
/// `s1` (and `s2`) lanes are reduced together and their float steps
/// (`res = f32(s1) * d0`, `fnmadd(dmin, f32(s2), res)`, `fma(res, d_act,
/// acc)`) run in the eight lanes of a vector, the same operations per lane
/// as ggml's scalar epilogue. The module supplies `Vecs`, `vecs` (a decoded
/// block in registers) and `sums` (one block pair's `s1`, `s2` lanes).
#[cfg(target_arch = "x86_64")]
macro_rules! tiled_driver {
    ($features:literal) => {
        /// Lane `t` of the result: the sum of the lanes of `v[t]`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
            let h01 = _mm256_hadd_epi32(v[0], v[1]);
            let h23 = _mm256_hadd_epi32(v[2], v[3]);
            let h45 = _mm256_hadd_epi32(v[4], v[5]);
            let h67 = _mm256_hadd_epi32(v[6], v[7]);
            let lo = _mm256_hadd_epi32(h01, h23);
            let hi = _mm256_hadd_epi32(h45, h67);
            _mm256_add_epi32(
                _mm256_permute2x128_si256(lo, hi, 0x20),
                _mm256_permute2x128_si256(lo, hi, 0x31),
            )
        }

        const GROUPS: usize = TILE_T / 8;

        #[target_feature(enable = $features)]
        pub(super) unsafe fn tiled<B: TiledBlock, W: Blocks<B> + ?Sized>(
            nb: usize,
            w: &W,
            a: &[BlockQ8K],
            out: &mut [f32],
        ) {
            let (nr, nt) = (w.len() / nb, a.len() / nb);
            let mut tile = Tile::new();
            // Per block of the row, each group's activation scales.
            let mut dv = vec![[_mm256_setzero_ps(); GROUPS]; nb];
            let mut t0 = 0;
            while t0 < nt {
                let tn = (nt - t0).min(TILE_T);
                let ag = &a[t0 * nb..(t0 + tn) * nb];
                for (j, dv) in dv.iter_mut().enumerate() {
                    let mut d = [0f32; TILE_T];
                    for (t, d) in d[..tn].iter_mut().enumerate() {
                        *d = ag[t * nb + j].d;
                    }
                    for (g, dv) in dv.iter_mut().enumerate() {
                        *dv = _mm256_loadu_ps(d.as_ptr().add(8 * g));
                    }
                }
                for r in 0..nr {
                    let mut acc = [_mm256_setzero_ps(); GROUPS];
                    for j in 0..nb {
                        w.decode_at(nb, r, j, &mut tile);
                        let v = vecs::<B>(&tile);
                        let d0 = _mm256_set1_ps(tile.d0);
                        let dmin = _mm256_set1_ps(tile.dmin);
                        for (g, acc) in acc.iter_mut().enumerate().take(tn.div_ceil(8)) {
                            let mut s1 = [_mm256_setzero_si256(); 8];
                            let mut s2 = [_mm256_setzero_si256(); 8];
                            for t in 0..(tn - 8 * g).min(8) {
                                (s1[t], s2[t]) = sums::<B>(&v, &ag[(8 * g + t) * nb + j]);
                            }
                            let mut res = _mm256_mul_ps(_mm256_cvtepi32_ps(reduce8(&s1)), d0);
                            if B::HAS_MIN {
                                res = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(reduce8(&s2)), res);
                            }
                            *acc = _mm256_fmadd_ps(res, dv[j][g], *acc);
                        }
                    }
                    let mut lanes = [0f32; TILE_T];
                    for (g, &acc) in acc.iter().enumerate() {
                        _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * g), acc);
                    }
                    for (t, &v) in lanes[..tn].iter().enumerate() {
                        out[(t0 + t) * nr + r] = v;
                    }
                }
                t0 += tn;
            }
        }
    };
}

/// AVX2: per 32 elements `maddubs` (codes as `u8`, see [`Codes`]) and a
/// `madd` by the two group scales.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Blocks, Codes, Tile, TiledBlock, QK, TILE_T};
    use crate::quant::BlockQ8K;
    use std::arch::x86_64::*;

    /// A decoded block as vectors: the `maddubs` operands `u` (and the
    /// sign source `q` for [`Codes::Signed`]), each 32-element chunk's two
    /// group scales as 16 `i16` lanes (8 per 16 elements: the lanes of
    /// `maddubs` over the chunk), `-64` times the scales, and the mins.
    pub(super) struct Vecs {
        u: [__m256i; QK / 32],
        q: [__m256i; QK / 32],
        sc: [__m256i; QK / 32],
        off: __m256i,
        m: __m256i,
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn vecs<B: TiledBlock>(t: &Tile) -> Vecs {
        let scv = _mm256_loadu_si256(t.sc.as_ptr() as *const __m256i);
        let mut v = Vecs {
            u: [_mm256_setzero_si256(); QK / 32],
            q: [_mm256_setzero_si256(); QK / 32],
            sc: [_mm256_setzero_si256(); QK / 32],
            off: _mm256_mullo_epi16(scv, _mm256_set1_epi16(-64)),
            m: _mm256_loadu_si256(t.m.as_ptr() as *const __m256i),
        };
        for k in 0..QK / 32 {
            let q = _mm256_loadu_si256(t.q.as_ptr().add(32 * k) as *const __m256i);
            v.q[k] = q;
            v.u[k] = match B::CODES {
                Codes::Unsigned => q,
                Codes::Offset => _mm256_add_epi8(q, _mm256_set1_epi8(64)),
                Codes::Signed => _mm256_abs_epi8(q),
            };
            v.sc[k] =
                _mm256_set_m128i(_mm_set1_epi16(t.sc[2 * k + 1]), _mm_set1_epi16(t.sc[2 * k]));
        }
        v
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sums<B: TiledBlock>(v: &Vecs, y: &BlockQ8K) -> (__m256i, __m256i) {
        let mut acc = _mm256_setzero_si256();
        for k in 0..QK / 32 {
            let mut a = _mm256_loadu_si256(y.qs.as_ptr().add(32 * k) as *const __m256i);
            if let Codes::Signed = B::CODES {
                a = _mm256_sign_epi8(a, v.q[k]);
            }
            let p = _mm256_maddubs_epi16(v.u[k], a);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, v.sc[k]));
        }
        let b = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
        if let Codes::Offset = B::CODES {
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(b, v.off));
        }
        let s2 = if B::HAS_MIN {
            _mm256_madd_epi16(v.m, b)
        } else {
            _mm256_setzero_si256()
        };
        (acc, s2)
    }

    tiled_driver!("avx2,fma");
}

/// AVX-512 (F, BW, VL, VNNI): per 64 elements `maddubs` and a `dpwssd` by
/// the four group scales; the same integers as the AVX2 kernel.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Blocks, Codes, Tile, TiledBlock, QK, TILE_T};
    use crate::quant::BlockQ8K;
    use std::arch::x86_64::*;

    /// As `avx2::Vecs`, 64 elements per vector (`sc`: 8 lanes per group of
    /// 16); `neg` marks the negative codes of [`Codes::Signed`].
    pub(super) struct Vecs {
        u: [__m512i; QK / 64],
        neg: [__mmask64; QK / 64],
        sc: [__m512i; QK / 64],
        off: __m512i,
        m: __m256i,
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    unsafe fn vecs<B: TiledBlock>(t: &Tile) -> Vecs {
        let scv = _mm256_loadu_si256(t.sc.as_ptr() as *const __m256i);
        let mut v = Vecs {
            u: [_mm512_setzero_si512(); QK / 64],
            neg: [0; QK / 64],
            sc: [_mm512_setzero_si512(); QK / 64],
            off: _mm512_zextsi256_si512(_mm256_mullo_epi16(scv, _mm256_set1_epi16(-64))),
            m: _mm256_loadu_si256(t.m.as_ptr() as *const __m256i),
        };
        for k in 0..QK / 64 {
            let q = _mm512_loadu_si512(t.q.as_ptr().add(64 * k) as *const __m512i);
            v.neg[k] = _mm512_movepi8_mask(q);
            v.u[k] = match B::CODES {
                Codes::Unsigned => q,
                Codes::Offset => _mm512_add_epi8(q, _mm512_set1_epi8(64)),
                Codes::Signed => _mm512_abs_epi8(q),
            };
            let mut lanes = [0i16; 32];
            for (i, l) in lanes.iter_mut().enumerate() {
                *l = t.sc[4 * k + i / 8];
            }
            v.sc[k] = _mm512_loadu_si512(lanes.as_ptr() as *const __m512i);
        }
        v
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    unsafe fn sums<B: TiledBlock>(v: &Vecs, y: &BlockQ8K) -> (__m256i, __m256i) {
        let mut acc = _mm512_setzero_si512();
        for k in 0..QK / 64 {
            let mut a = _mm512_loadu_si512(y.qs.as_ptr().add(64 * k) as *const __m512i);
            if let Codes::Signed = B::CODES {
                a = _mm512_mask_sub_epi8(a, v.neg[k], _mm512_setzero_si512(), a);
            }
            let p = _mm512_maddubs_epi16(v.u[k], a);
            acc = _mm512_dpwssd_epi32(acc, p, v.sc[k]);
        }
        let b = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
        if let Codes::Offset = B::CODES {
            acc = _mm512_dpwssd_epi32(acc, _mm512_zextsi256_si512(b), v.off);
        }
        let acc = _mm256_add_epi32(
            _mm512_castsi512_si256(acc),
            _mm512_extracti64x4_epi64(acc, 1),
        );
        let s2 = if B::HAS_MIN {
            _mm256_madd_epi16(v.m, b)
        } else {
            _mm256_setzero_si256()
        };
        (acc, s2)
    }

    tiled_driver!("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma");
}

/// AVX-512 VNNI with the activations interleaved: a vector holds four
/// consecutive Q8_K codes of each of 16 activation rows, so one `dpbusd`
/// against a broadcast of four weight codes (as `u8`: `q`, or `q ^ 0x80 =
/// q + 128` for the signed ones, with `128 * bsums` taken off) advances 16
/// (weight row, activation row) pairs, each activation vector serves a band
/// of [`BAND`] weight rows, and each sub-block's scale is applied to 16
/// pairs' exact sums at once. Every lane ends with the same `s1` and `s2`
/// as the other kernels, then the same float steps.
#[cfg(target_arch = "x86_64")]
mod vnni16 {
    use super::{Blocks, Codes, Tile, TiledBlock, QK};
    use crate::quant::BlockQ8K;
    use std::arch::x86_64::*;

    const LANES: usize = 16;
    /// Four-code groups per block.
    const KG: usize = QK / 4;
    /// Groups of 16 activation rows interleaved together, so one decoded
    /// weight block serves `GROUPS * 16` rows.
    const GROUPS: usize = 4;
    /// Weight rows sharing each activation vector.
    const BAND: usize = 4;

    /// One group of up to 16 activation rows, interleaved per block `j`.
    #[derive(Default)]
    struct Acts {
        /// `q[j * KG + kg]`: lane `l` = codes `4kg..4kg + 4` of row `l`.
        q: Vec<__m512i>,
        /// `bs[j * 16 + g]`: lane `l` = `bsums[g]` of row `l`; `bs2` the
        /// sums of pairs (32-code sub-blocks), `j * 8 + s`.
        bs: Vec<__m512i>,
        bs2: Vec<__m512i>,
        /// `128 *` the above (the offset codes' correction).
        bs128: Vec<__m512i>,
        bs2_128: Vec<__m512i>,
        /// Lane `l` = the Q8_K scale of row `l`, per block.
        d: Vec<__m512>,
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    unsafe fn interleave(acts: &mut Acts, ag: &[BlockQ8K], nb: usize, tn: usize) {
        // Every element is written below: only the lengths change.
        let zero = _mm512_setzero_si512();
        for (v, n) in [
            (&mut acts.q, KG),
            (&mut acts.bs, 16),
            (&mut acts.bs128, 16),
            (&mut acts.bs2, 8),
            (&mut acts.bs2_128, 8),
        ] {
            v.resize(nb * n, zero);
        }
        acts.d.resize(nb, _mm512_setzero_ps());
        // Lane l gathers from activation row l (rows `nb` blocks apart);
        // lanes past `tn` stay zero.
        let stride = (nb * size_of::<BlockQ8K>()) as i32;
        let idx = _mm512_mullo_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi32(stride),
        );
        let live: __mmask16 = if tn >= LANES { !0 } else { (1u16 << tn) - 1 };
        for j in 0..nb {
            let y = ag.as_ptr().add(j);
            let qs = (*y).qs.as_ptr() as *const i32;
            for (kg, v) in acts.q[j * KG..(j + 1) * KG].iter_mut().enumerate() {
                *v = _mm512_mask_i32gather_epi32::<1>(zero, live, idx, qs.add(kg));
            }
            let bsums = (*y).bsums.as_ptr() as *const u8;
            for g in 0..16 {
                // Two bsums per 32-bit word: keep the low one, sign-extended.
                let w = _mm512_mask_i32gather_epi32::<1>(
                    zero,
                    live,
                    idx,
                    bsums.add(2 * g) as *const i32,
                );
                let v = _mm512_srai_epi32(_mm512_slli_epi32(w, 16), 16);
                acts.bs[j * 16 + g] = v;
                acts.bs128[j * 16 + g] = _mm512_slli_epi32(v, 7);
            }
            for s in 0..8 {
                let v = _mm512_add_epi32(acts.bs[j * 16 + 2 * s], acts.bs[j * 16 + 2 * s + 1]);
                acts.bs2[j * 8 + s] = v;
                acts.bs2_128[j * 8 + s] = _mm512_slli_epi32(v, 7);
            }
            let d = &(*y).d as *const f32;
            acts.d[j] = _mm512_mask_i32gather_ps::<1>(_mm512_setzero_ps(), live, idx, d);
        }
    }

    /// One decoded weight block: its codes as `u8`, four to a word.
    struct Dec {
        u: [u32; KG],
        tile: Tile,
    }

    /// `R` weight rows' decoded block `j` against one interleaved group:
    /// `acc[r] = fma(res, d_act, acc[r])`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    unsafe fn band<B: TiledBlock, const R: usize>(
        dec: &[Dec],
        acts: &Acts,
        j: usize,
        acc: &mut [__m512; R],
    ) {
        let off = !matches!(B::CODES, Codes::Unsigned);
        let zero = _mm512_setzero_si512();
        // Sub-blocks of SUB codes share a scale (and min): their groups'
        // sums are added before the one multiply.
        let (per, ns) = (B::SUB / 4, QK / B::SUB);
        let (bs, bs128) = if B::SUB == 32 {
            (&acts.bs2[j * 8..j * 8 + 8], &acts.bs2_128[j * 8..j * 8 + 8])
        } else {
            (
                &acts.bs[j * 16..j * 16 + 16],
                &acts.bs128[j * 16..j * 16 + 16],
            )
        };
        let aq = &acts.q[j * KG..(j + 1) * KG];
        let mut s1 = [zero; R];
        let mut s2 = [zero; R];
        for s in 0..ns {
            let mut raw = [zero; R];
            for (kg, &a) in aq.iter().enumerate().skip(s * per).take(per) {
                for r in 0..R {
                    let w = _mm512_set1_epi32(dec[r].u[kg] as i32);
                    raw[r] = _mm512_dpbusd_epi32(raw[r], w, a);
                }
            }
            let g = s * B::SUB / 16;
            for r in 0..R {
                if off {
                    raw[r] = _mm512_sub_epi32(raw[r], bs128[s]);
                }
                let sc = _mm512_set1_epi32(dec[r].tile.sc[g] as i32);
                s1[r] = _mm512_add_epi32(s1[r], _mm512_mullo_epi32(raw[r], sc));
                if B::HAS_MIN {
                    let m = _mm512_set1_epi32(dec[r].tile.m[g] as i32);
                    s2[r] = _mm512_add_epi32(s2[r], _mm512_mullo_epi32(bs[s], m));
                }
            }
        }
        for r in 0..R {
            let t = &dec[r].tile;
            let mut res = _mm512_mul_ps(_mm512_cvtepi32_ps(s1[r]), _mm512_set1_ps(t.d0));
            if B::HAS_MIN {
                res = _mm512_fnmadd_ps(_mm512_set1_ps(t.dmin), _mm512_cvtepi32_ps(s2[r]), res);
            }
            acc[r] = _mm512_fmadd_ps(res, acts.d[j], acc[r]);
        }
    }

    /// Rows `r0..r0 + R` of `w` against the interleaved groups.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    unsafe fn rows<B: TiledBlock, W: Blocks<B> + ?Sized, const R: usize>(
        w: &W,
        nb: usize,
        r0: usize,
        acts: &[Acts],
        dec: &mut [Dec; BAND],
        out: &mut [[f32; GROUPS * LANES]],
    ) {
        let flip = if matches!(B::CODES, Codes::Unsigned) {
            0
        } else {
            0x8080_8080u32
        };
        let mut acc = [[_mm512_setzero_ps(); R]; GROUPS];
        for j in 0..nb {
            for (r, dec) in dec.iter_mut().enumerate().take(R) {
                w.decode_at_512(nb, r0 + r, j, &mut dec.tile);
                let flip = _mm512_set1_epi32(flip as i32);
                for k in 0..QK / 64 {
                    let q = _mm512_loadu_si512(dec.tile.q.as_ptr().add(64 * k) as *const __m512i);
                    let u = _mm512_xor_si512(q, flip);
                    _mm512_storeu_si512(dec.u.as_mut_ptr().add(16 * k) as *mut __m512i, u);
                }
            }
            for (acts, acc) in acts.iter().zip(acc.iter_mut()) {
                band::<B, R>(&dec[..R], acts, j, acc);
            }
        }
        for (gi, acc) in acc.iter().enumerate().take(acts.len()) {
            for (r, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(out[r].as_mut_ptr().add(gi * LANES), *acc);
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    pub(super) unsafe fn tiled<B: TiledBlock, W: Blocks<B> + ?Sized>(
        nb: usize,
        w: &W,
        a: &[BlockQ8K],
        out: &mut [f32],
    ) {
        let mut dec: [Dec; BAND] = std::array::from_fn(|_| Dec {
            u: [0; KG],
            tile: Tile::new(),
        });
        ACTS.with_borrow_mut(|acts| run::<B, W>(nb, w, a, out, &mut dec, acts))
    }

    thread_local! {
        /// Each thread's interleaved activations, kept between calls.
        static ACTS: std::cell::RefCell<[Acts; GROUPS]> = Default::default();
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    unsafe fn run<B: TiledBlock, W: Blocks<B> + ?Sized>(
        nb: usize,
        w: &W,
        a: &[BlockQ8K],
        out: &mut [f32],
        dec: &mut [Dec; BAND],
        acts: &mut [Acts; GROUPS],
    ) {
        let (nr, nt) = (w.len() / nb, a.len() / nb);
        let mut lanes = [[0f32; GROUPS * LANES]; BAND];
        let mut t0 = 0;
        while t0 < nt {
            let tn = (nt - t0).min(GROUPS * LANES);
            let ng = tn.div_ceil(LANES);
            for (gi, acts) in acts.iter_mut().enumerate().take(ng) {
                let (g0, gn) = (t0 + gi * LANES, (tn - gi * LANES).min(LANES));
                interleave(acts, &a[g0 * nb..(g0 + gn) * nb], nb, gn);
            }
            let mut r0 = 0;
            while r0 < nr {
                let rn = if nr - r0 >= BAND {
                    rows::<B, W, BAND>(w, nb, r0, &acts[..ng], dec, &mut lanes);
                    BAND
                } else {
                    rows::<B, W, 1>(w, nb, r0, &acts[..ng], dec, &mut lanes);
                    1
                };
                for (r, lanes) in lanes.iter().enumerate().take(rn) {
                    for (t, &v) in lanes[..tn].iter().enumerate() {
                        out[(t0 + t) * nr + r0 + r] = v;
                    }
                }
                r0 += rn;
            }
            t0 += tn;
        }
    }
}

/// The slow reference the decoders are tested against: `W` and `M` from
/// the dequantiser at unit scales (the form `tests/quant_formats.rs` holds
/// to llama.cpp's own matmul outputs in an earlier revision).
#[cfg(test)]
mod reference {
    use super::{TiledBlock, QK};
    use crate::quant::{
        BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS,
        BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
    };
    use half::f16;

    /// The block's `d` and `dmin`, and the block with them replaced.
    pub(crate) trait Scales: TiledBlock {
        fn scales(&self) -> (f32, f32);
        fn with_scales(&self, d: f16, dmin: f16) -> Self;
    }

    macro_rules! plain_d {
        ($($b:ty),*) => {$(
            impl Scales for $b {
                fn scales(&self) -> (f32, f32) {
                    (self.d.to_f32(), 0.0)
                }
                fn with_scales(&self, d: f16, _dmin: f16) -> Self {
                    Self { d, ..*self }
                }
            }
        )*};
    }
    plain_d!(
        BlockQ3K,
        BlockQ6K,
        BlockIQ4XS,
        BlockIQ2XXS,
        BlockIQ2XS,
        BlockIQ2S,
        BlockIQ3XXS,
        BlockIQ3S,
        BlockIQ1S
    );

    macro_rules! with_min {
        ($($b:ty),*) => {$(
            impl Scales for $b {
                fn scales(&self) -> (f32, f32) {
                    (self.d.to_f32(), self.dmin.to_f32())
                }
                fn with_scales(&self, d: f16, dmin: f16) -> Self {
                    Self { d, dmin, ..*self }
                }
            }
        )*};
    }
    with_min!(BlockQ2K, BlockQ4K, BlockQ5K);

    /// IQ1_M keeps its fp16 scale in the top nibbles of its four scale words.
    impl Scales for BlockIQ1M {
        fn scales(&self) -> (f32, f32) {
            (self.d().to_f32(), 0.0)
        }
        fn with_scales(&self, d: f16, _dmin: f16) -> Self {
            let mut b = *self;
            let h = d.to_bits();
            for k in 0..4 {
                b.scales[2 * k + 1] =
                    (b.scales[2 * k + 1] & 0x0F) | ((((h >> (4 * k)) & 0xF) as u8) << 4);
            }
            b
        }
    }

    /// `8 W`, `M` and `d / 8` of one block, from the dequantiser.
    pub(crate) fn decode<B: Scales>(x: &B) -> ([i32; QK], [i32; QK], f32, f32) {
        let (d, dmin) = x.scales();
        let mut y = [0f32; QK];
        let (mut w, mut m) = ([0i32; QK], [0i32; QK]);
        B::to_f32(
            std::slice::from_ref(&x.with_scales(f16::ONE, f16::ZERO)),
            &mut y,
        );
        for (w, &v) in w.iter_mut().zip(y.iter()) {
            *w = (v * 8.0) as i32;
        }
        if B::HAS_MIN {
            B::to_f32(
                std::slice::from_ref(&x.with_scales(f16::ZERO, f16::ONE)),
                &mut y,
            );
            for (m, &v) in m.iter_mut().zip(y.iter()) {
                *m = -v as i32;
            }
        }
        (w, m, d / 8.0, dmin)
    }

    fn idot(w: &[i32; QK], a: &[i8; QK]) -> i32 {
        w.iter().zip(a).map(|(&w, &a)| w * a as i32).sum()
    }

    pub(crate) fn tiled<B: Scales>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
        let (nr, nt) = (w.len() / nb, a.len() / nb);
        out.fill(0.0);
        for (r, row) in w.chunks_exact(nb).enumerate() {
            for (j, x) in row.iter().enumerate() {
                let (dw, dm, d0, dmin) = decode(x);
                for t in 0..nt {
                    let act = &a[t * nb + j];
                    let mut res = idot(&dw, &act.qs) as f32 * d0;
                    if B::HAS_MIN {
                        res = (-dmin).mul_add(idot(&dm, &act.qs) as f32, res);
                    }
                    let o = &mut out[t * nr + r];
                    *o = res.mul_add(act.d, *o);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reference::{self, Scales};
    use super::*;
    use crate::quant::{
        BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS,
        BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K,
    };
    use bytemuck::Zeroable;
    use half::f16;

    /// Deterministic bytes and scales from the synthetic models' generator.
    struct Rng(crate::synth::Rng);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0.next_u64()
        }
        fn bytes(&mut self, out: &mut [u8]) {
            for b in out {
                *b = self.next() as u8;
            }
        }
        fn scale(&mut self) -> f16 {
            f16::from_f32(0.001 + (self.next() % 1000) as f32 * 1e-4)
        }
    }

    fn weights<B: Scales>(rng: &mut Rng, n: usize) -> Vec<B> {
        (0..n)
            .map(|_| {
                let mut b = B::zeroed();
                rng.bytes(bytemuck::bytes_of_mut(&mut b));
                let (d, dmin) = (rng.scale(), rng.scale());
                b.with_scales(d, dmin)
            })
            .collect()
    }

    /// Q8_K rows as `quantize_row_q8_K` leaves them: codes in -127..=127,
    /// `bsums` the sums of 16 codes.
    fn acts(rng: &mut Rng, n: usize) -> Vec<BlockQ8K> {
        (0..n)
            .map(|_| {
                let mut y = BlockQ8K::zeroed();
                for q in y.qs.iter_mut() {
                    *q = ((rng.next() % 255) as i32 - 127) as i8;
                }
                for (s, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
                    *s = q.iter().map(|&q| q as i16).sum();
                }
                y.d = 1e-3 + (rng.next() % 1000) as f32 * 1e-5;
                y
            })
            .collect()
    }

    /// Weight rows: one band of four and a remainder row.
    const NR: usize = 5;

    /// Every decoder against the dequantiser, then the SIMD kernels and the
    /// portable one against the reference, bit for bit, at batch sizes that
    /// cover full and partial groups of 8 and of 16 rows, and more rows than
    /// one pass interleaves (64).
    fn check<B: Scales>(seed: u64) {
        let mut rng = Rng(crate::synth::Rng(seed));
        let nb = 3;
        let w = weights::<B>(&mut rng, NR * nb);
        let mut tile = Tile::new();
        for x in &w {
            #[cfg(target_arch = "x86_64")]
            if crate::quant::CpuCaps::detect().has_avx2() {
                x.decode(&mut tile);
                let same = |fast: &Tile, how: &str| {
                    assert_eq!(fast.q, tile.q, "{:?} {how} codes", B::TYPE);
                    assert_eq!(fast.sc, tile.sc, "{:?} {how} scales", B::TYPE);
                    assert_eq!(
                        fast.d0.to_bits(),
                        tile.d0.to_bits(),
                        "{:?} {how} d0",
                        B::TYPE
                    );
                };
                let mut fast = Tile::new();
                // SAFETY: AVX2 and FMA checked.
                unsafe { x.decode_simd(&mut fast) };
                same(&fast, "decode_simd");
                if crate::quant::CpuCaps::detect().has_avx512() {
                    let mut wide = Tile::new();
                    // SAFETY: AVX-512 F, BW, VL and VNNI checked.
                    unsafe { x.decode_512(&mut wide) };
                    same(&wide, "decode_512");
                }
            }
            x.decode(&mut tile);
            let (rw, rm, rd0, _) = reference::decode(x);
            for g in (0..16).filter(|g| B::SUB == 32 && g % 2 == 0) {
                assert_eq!(tile.sc[g], tile.sc[g + 1], "{:?}: SUB 32 scales", B::TYPE);
                assert_eq!(tile.m[g], tile.m[g + 1], "{:?}: SUB 32 mins", B::TYPE);
            }
            let f = (tile.d0 / rd0) as i32;
            for e in 0..QK {
                let got = tile.q[e] as i32 * tile.sc[e / 16] as i32 * f;
                assert_eq!(got, rw[e], "{:?} element {e}: q * sc", B::TYPE);
                if B::HAS_MIN {
                    assert_eq!(
                        tile.m[e / 16] as i32,
                        rm[e],
                        "{:?} element {e}: min",
                        B::TYPE
                    );
                }
                let ok = match B::CODES {
                    Codes::Unsigned => (0..=127).contains(&tile.q[e]),
                    Codes::Offset => (-64..=63).contains(&tile.q[e]),
                    Codes::Signed => tile.q[e] != i8::MIN,
                };
                assert!(
                    ok,
                    "{:?}: code {} outside its Codes range",
                    B::TYPE,
                    tile.q[e]
                );
            }
        }
        for nt in [8, 16, 23, 40, 70] {
            let a = acts(&mut rng, nt * nb);
            let mut want = vec![0f32; NR * nt];
            reference::tiled(nb, &w, &a, &mut want);
            let mut got = vec![f32::NAN; NR * nt];
            portable(nb, &w, &a, &mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{:?} portable, {nt} rows", B::TYPE);
            #[cfg(target_arch = "x86_64")]
            {
                let caps = crate::quant::CpuCaps::detect();
                type Kernel<B> = fn(usize, &[B], &[BlockQ8K], &mut [f32]);
                let kernels: [(&str, bool, Kernel<B>); 2] = [
                    ("avx2", caps.has_avx2(), tiled_avx2::<B>),
                    ("avx512", caps.has_avx512(), tiled_avx512::<B>),
                ];
                for (name, _, k) in kernels.into_iter().filter(|k| k.1) {
                    got.fill(f32::NAN);
                    k(nb, &w, &a, &mut got);
                    assert_eq!(bits(&got), bits(&want), "{:?} {name}, {nt} rows", B::TYPE);
                }
            }
        }
    }

    #[test]
    fn tiled_kernels_equal_the_dequantiser_reference() {
        for seed in 1..4u64 {
            check::<BlockQ2K>(seed);
            check::<BlockQ3K>(seed);
            check::<BlockQ4K>(seed);
            check::<BlockQ5K>(seed);
            check::<BlockQ6K>(seed);
            check::<BlockIQ4XS>(seed);
            check::<BlockIQ2XXS>(seed);
            check::<BlockIQ2XS>(seed);
            check::<BlockIQ2S>(seed);
            check::<BlockIQ3XXS>(seed);
            check::<BlockIQ3S>(seed);
            check::<BlockIQ1S>(seed);
            check::<BlockIQ1M>(seed);
        }
    }
}
