//! AVX2 kernels over the interleaved layout of `quant::layout`: one group of
//! eight rows against one activation row, row `r` in f32 lane `r`. On
//! AVX-512 VNNI CPUs the same bodies sum each lane's byte products with one
//! `vpdpbusd` ([`LaneSums`]: the same integers, so the same bits).
//!
//! Two summation orders, each the one llama.cpp runs at its defaults
//! (`--repack` on) for the type:
//!
//! - Q8_0, which ggml's CPU repack leaves alone on x86, keeps `vec_dot`'s:
//!   accumulator `j` is lane `j` of the plain kernel's 8-lane chain (bytes
//!   `4j..4j + 4` of each block, as `mul_sum_i8_pairs` sums them), fed by
//!   the same exact integers and the same `fma(d, sum, acc)` per block, and
//!   the eight are reduced by `hsum_ps`'s tree on whole vectors: each lane's
//!   result is the plain kernel's bits for its row.
//! - Q4_0, IQ4_NL and MXFP4, which ggml repacks into its `*_8x8` blocks
//!   whenever a matrix has whole groups of 8 rows, take the order of its
//!   x86 repack kernels (`gemv_q4_b32_8x8_q8_0_lut_avx` and the gemm beside
//!   it, AVX2 and AVX-512 alike): a block's 32 products summed in integers,
//!   then one `acc = fma(f32(sum), d_w * d_a, acc)` per block and row.

use super::super::common::{KVALUES_IQ4NL, KVALUES_MXFP4};
use super::super::BlockQ8_0;
use super::{h2f, LaneSums, Madd};
use crate::quant::simd_x86_512::Vnni;
use std::arch::x86_64::*;

/// The interleaved types' blocks: Q8_0's bytes, or a 4-bit type's codes
/// through its value table.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// Signed bytes, `f16` scale.
    Q8_0,
    /// `nibble - 8`, `f16` scale.
    Q4_0,
    /// `KVALUES_IQ4NL`, `f16` scale.
    Iq4Nl,
    /// `KVALUES_MXFP4`, `e8m0` scale (half of its power of two).
    Mxfp4,
}

impl Kind {
    /// The kinds in the order of [`Raw`]'s `K` parameter.
    const ALL: [Kind; 4] = [Kind::Q8_0, Kind::Q4_0, Kind::Iq4Nl, Kind::Mxfp4];

    /// Bytes of one block of eight rows (scales, then 128 or 256 bytes of
    /// quants).
    const fn group_block(self) -> usize {
        match self {
            Kind::Q8_0 => 8 * 34,
            Kind::Mxfp4 => 8 + 128,
            Kind::Q4_0 | Kind::Iq4Nl => 16 + 128,
        }
    }
}

/// Q4_0's codes as values: `nibble - 8`.
const Q4_0_VALUES: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];

/// The instructions the kernels run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX2 + FMA + F16C (`maddubs` + `madd`).
    Avx2,
    /// AVX-512 F + BW + VL + VNNI on top (`vpdpbusd` on 256 bits).
    Vnni,
}

/// Eight rows (`g`: one interleaved group of `a.len()` blocks per row)
/// against `a`, decoding each block in place, in the kind's order (module
/// docs).
pub(crate) fn dot(isa: Isa, kind: Kind, g: &[u8], a: &[BlockQ8_0], out: &mut [f32; 8]) {
    assert!(
        g.len() >= a.len() * kind.group_block(),
        "interleaved group too short"
    );
    // SAFETY: `layout::interleaved` hands these kernels out only when
    // CpuCaps::has_avx2() (with `Isa::Vnni` only when has_avx512()); the
    // bounds are checked above.
    unsafe {
        match kind {
            Kind::Q8_0 => dot_isa(isa, &Raw::<0>::new(g), kind, a, out),
            Kind::Q4_0 => dot_isa(isa, &Raw::<1>::new(g), kind, a, out),
            Kind::Iq4Nl => dot_isa(isa, &Raw::<2>::new(g), kind, a, out),
            Kind::Mxfp4 => dot_isa(isa, &Raw::<3>::new(g), kind, a, out),
        }
    }
}

#[inline(always)]
unsafe fn dot_isa<B: Blocks>(isa: Isa, w: &B, kind: Kind, a: &[BlockQ8_0], out: &mut [f32; 8]) {
    match isa {
        Isa::Avx2 => dot_avx2(w, kind, a, out),
        Isa::Vnni => dot_vnni(w, kind, a, out),
    }
}

/// One interleaved group decoded for several activation rows: per block,
/// the eight rows' weight scales as f32 and, per lane chunk `j`, the 32
/// signed values (4 per row) and their magnitudes, so each activation row
/// costs only the sign trick's second half, `maddubs`, `madd` and the FMA.
pub(crate) struct Decoded {
    /// `[block][j]`: signed values, then magnitudes (`16` per block).
    vals: Vec<__m256i>,
    /// `[block]`: the rows' weight scales.
    scales: Vec<__m256>,
    /// The decoded kind.
    kind: Kind,
}

impl Decoded {
    pub(crate) fn new() -> Self {
        Self {
            vals: Vec::new(),
            scales: Vec::new(),
            kind: Kind::Q8_0,
        }
    }

    /// Decodes group `g` of `nb` blocks.
    pub(crate) fn decode(&mut self, kind: Kind, g: &[u8], nb: usize) {
        assert!(
            g.len() >= nb * kind.group_block(),
            "interleaved group too short"
        );
        // SAFETY: as in `dot`; bounds checked above.
        unsafe {
            self.vals.resize(nb * 16, _mm256_setzero_si256());
            self.scales.resize(nb, _mm256_setzero_ps());
            self.kind = kind;
            let (vals, scales) = (&mut self.vals, &mut self.scales);
            match kind {
                Kind::Q8_0 => decode_avx2(&Raw::<0>::new(g), nb, vals, scales),
                Kind::Q4_0 => decode_avx2(&Raw::<1>::new(g), nb, vals, scales),
                Kind::Iq4Nl => decode_avx2(&Raw::<2>::new(g), nb, vals, scales),
                Kind::Mxfp4 => decode_avx2(&Raw::<3>::new(g), nb, vals, scales),
            }
        }
    }

    /// Eight rows against activation row `a` (the decoded blocks), in
    /// [`dot`]'s order.
    pub(crate) fn dot(&self, isa: Isa, a: &[BlockQ8_0], out: &mut [f32; 8]) {
        assert!(self.scales.len() >= a.len(), "decoded group too short");
        // SAFETY: as in `dot`; lengths checked above.
        unsafe { dot_isa(isa, self, self.kind, a, out) }
    }
}

/// The weight blocks of one group as the kernels read them: decoded in
/// place ([`Raw`]) or from a [`Decoded`] group. Lane chunk `j` of a block
/// is bytes `4j..4j + 4` of each row's block: 32 signed values.
trait Blocks {
    /// Block `b`'s eight rows' weight scales.
    unsafe fn scales(&self, b: usize) -> __m256;
    /// Block `b`'s lane chunks `c` and `4 + c` (`c < 4`).
    unsafe fn pair(&self, b: usize, c: usize) -> (__m256i, __m256i);
    /// The magnitudes of block `b`'s chunk `j`, whose values are `v`.
    unsafe fn magnitudes(&self, b: usize, j: usize, v: __m256i) -> __m256i;
}

/// An interleaved group read in place; `K` indexes [`Kind::ALL`], so each
/// kind's kernels are compiled apart.
struct Raw<'a, const K: usize> {
    g: &'a [u8],
    lut: __m256i,
}

impl<'a, const K: usize> Raw<'a, K> {
    const KIND: Kind = Kind::ALL[K];

    #[inline(always)]
    unsafe fn new(g: &'a [u8]) -> Self {
        let table: &[i8; 16] = match Self::KIND {
            Kind::Iq4Nl => &KVALUES_IQ4NL,
            Kind::Mxfp4 => &KVALUES_MXFP4,
            Kind::Q4_0 | Kind::Q8_0 => &Q4_0_VALUES,
        };
        let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
        Self { g, lut }
    }
}

impl<const K: usize> Blocks for Raw<'_, K> {
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> __m256 {
        let blk = self.g.as_ptr().add(b * Self::KIND.group_block());
        match Self::KIND {
            Kind::Mxfp4 => e8m0_lanes(blk),
            _ => _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i)),
        }
    }

    #[inline(always)]
    unsafe fn pair(&self, b: usize, c: usize) -> (__m256i, __m256i) {
        let blk = self.g.as_ptr().add(b * Self::KIND.group_block());
        let load = |at: usize| blk.add(at) as *const __m256i;
        match Self::KIND {
            Kind::Q8_0 => (
                _mm256_loadu_si256(load(16 + 32 * c)),
                _mm256_loadu_si256(load(16 + 32 * (4 + c))),
            ),
            kind => {
                // Chunk c of the 16 bytes holds elements 4c.. in its low
                // nibbles (lane c) and 16 + 4c.. in its high nibbles
                // (lane 4 + c).
                let sb = if let Kind::Mxfp4 = kind { 8 } else { 16 };
                let x = _mm256_loadu_si256(load(sb + 32 * c));
                let m4 = _mm256_set1_epi8(0x0F);
                (
                    _mm256_shuffle_epi8(self.lut, _mm256_and_si256(x, m4)),
                    _mm256_shuffle_epi8(self.lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4)),
                )
            }
        }
    }

    #[inline(always)]
    unsafe fn magnitudes(&self, _b: usize, _j: usize, v: __m256i) -> __m256i {
        _mm256_sign_epi8(v, v)
    }
}

impl Blocks for Decoded {
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> __m256 {
        *self.scales.get_unchecked(b)
    }

    #[inline(always)]
    unsafe fn pair(&self, b: usize, c: usize) -> (__m256i, __m256i) {
        (
            *self.vals.get_unchecked(16 * b + c),
            *self.vals.get_unchecked(16 * b + 4 + c),
        )
    }

    #[inline(always)]
    unsafe fn magnitudes(&self, b: usize, j: usize, _v: __m256i) -> __m256i {
        *self.vals.get_unchecked(16 * b + 8 + j)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_avx2<const K: usize>(
    raw: &Raw<K>,
    nb: usize,
    vals: &mut [__m256i],
    scales: &mut [__m256],
) {
    for b in 0..nb {
        scales[b] = raw.scales(b);
        for c in 0..4 {
            let (lo, hi) = raw.pair(b, c);
            let v = &mut vals[16 * b..16 * b + 16];
            (v[c], v[4 + c]) = (lo, hi);
            v[8 + c] = raw.magnitudes(b, c, lo);
            v[12 + c] = raw.magnitudes(b, 4 + c, hi);
        }
    }
}

/// Eight `e8m0` bytes as `e8m0_to_f32_half` values: `(e - 1) << 23` as f32
/// bits, `0x200000 << e` for `e < 2`.
#[inline(always)]
unsafe fn e8m0_lanes(blk: *const u8) -> __m256 {
    let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk as *const __m128i));
    let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    let small = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let is_small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(normal, small, is_small))
}

/// Bytes `4j..4j + 4` of an activation block in every i32 lane.
#[inline(always)]
unsafe fn act_chunk(y: &BlockQ8_0, j: usize) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(
        y.qs.as_ptr().add(4 * j) as *const i32
    ))
}

/// Chunk `j` (values `v`) of block `b` against activation block `y`, added
/// to `acc`: each row's exact `mul_sum_i8_pairs` (|w| by sign(y, w)).
#[inline(always)]
unsafe fn lane_sum<S: LaneSums, B: Blocks>(
    acc: __m256i,
    w: &B,
    b: usize,
    j: usize,
    v: __m256i,
    y: &BlockQ8_0,
) -> __m256i {
    let sy = _mm256_sign_epi8(act_chunk(y, j), v);
    S::u8_i8_acc(acc, w.magnitudes(b, j, v), sy)
}

/// The eight rows' `d_w * d_a` of block `b` (the plain kernels' scalar
/// product, per lane).
#[inline(always)]
unsafe fn block_scale<B: Blocks>(w: &B, b: usize, y: &BlockQ8_0) -> __m256 {
    _mm256_mul_ps(w.scales(b), _mm256_set1_ps(h2f(y.d)))
}

/// `vec_dot`'s order: one FMA chain per lane chunk over the blocks of `a`,
/// reduced by `hsum_ps`'s tree.
#[inline(always)]
unsafe fn lane_chains<S: LaneSums, B: Blocks>(w: &B, a: &[BlockQ8_0]) -> __m256 {
    let mut acc = [_mm256_setzero_ps(); 8];
    let zero = _mm256_setzero_si256();
    for (b, y) in a.iter().enumerate() {
        let d = block_scale(w, b, y);
        for c in 0..4 {
            let (lo, hi) = w.pair(b, c);
            let (plo, phi) = (
                lane_sum::<S, B>(zero, w, b, c, lo, y),
                lane_sum::<S, B>(zero, w, b, 4 + c, hi, y),
            );
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(plo), acc[c]);
            acc[4 + c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(phi), acc[4 + c]);
        }
    }
    reduce(&acc)
}

/// ggml's repack order: per block, the 32 products summed in integers,
/// then one `fma(f32(sum), d_w * d_a, acc)`.
#[inline(always)]
unsafe fn block_sums<S: LaneSums, B: Blocks>(w: &B, a: &[BlockQ8_0]) -> __m256 {
    let mut acc = _mm256_setzero_ps();
    for (b, y) in a.iter().enumerate() {
        let mut sum = _mm256_setzero_si256();
        for c in 0..4 {
            let (lo, hi) = w.pair(b, c);
            sum = lane_sum::<S, B>(sum, w, b, c, lo, y);
            sum = lane_sum::<S, B>(sum, w, b, 4 + c, hi, y);
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), block_scale(w, b, y), acc);
    }
    acc
}

/// `hsum_ps`'s tree over the eight lane accumulators.
#[inline(always)]
unsafe fn reduce(acc: &[__m256; 8]) -> __m256 {
    let s04 = _mm256_add_ps(acc[0], acc[4]);
    let s26 = _mm256_add_ps(acc[2], acc[6]);
    let s15 = _mm256_add_ps(acc[1], acc[5]);
    let s37 = _mm256_add_ps(acc[3], acc[7]);
    _mm256_add_ps(_mm256_add_ps(s04, s26), _mm256_add_ps(s15, s37))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2<B: Blocks>(w: &B, kind: Kind, a: &[BlockQ8_0], out: &mut [f32; 8]) {
    dot_with::<Madd, B>(w, kind, a, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_vnni<B: Blocks>(w: &B, kind: Kind, a: &[BlockQ8_0], out: &mut [f32; 8]) {
    dot_with::<Vnni, B>(w, kind, a, out)
}

/// The kernel body, inlined into a `target_feature` function per
/// [`LaneSums`].
#[inline(always)]
unsafe fn dot_with<S: LaneSums, B: Blocks>(w: &B, kind: Kind, a: &[BlockQ8_0], out: &mut [f32; 8]) {
    let r = match kind {
        Kind::Q8_0 => lane_chains::<S, B>(w, a),
        _ => block_sums::<S, B>(w, a),
    };
    _mm256_storeu_ps(out.as_mut_ptr(), r);
}

/// Two consecutive interleaved Q8_0 groups (16 rows) decoded for several
/// activation rows on AVX-512 (the 4-bit kinds: [`OffsetDecoded16`]): per
/// block, the 16 rows' weight scales and, per lane chunk `j`, the 64 values'
/// magnitudes with their signs as a mask
/// (`vpsignb` has no 512-bit form: the activation is negated under the mask
/// instead, which gives the same products since `|w| = 0` where `w = 0`).
/// Lanes 0..8 are the first group's rows, 8..16 the second's; each lane
/// runs [`Decoded`]'s order on the same integers, so the bits are the same.
pub(crate) struct Decoded16 {
    /// `[block][j]`: magnitudes (`8` per block).
    mags: Vec<__m512i>,
    /// `[block][j]`: which bytes are negative.
    neg: Vec<__mmask64>,
    /// `[block]`: the rows' weight scales.
    scales: Vec<__m512>,
}

impl Decoded16 {
    pub(crate) fn new() -> Self {
        Self {
            mags: Vec::new(),
            neg: Vec::new(),
            scales: Vec::new(),
        }
    }

    /// Decodes Q8_0 groups `g0` and `g1` of `nb` blocks each.
    ///
    /// Only where `CpuCaps::has_avx512()` (`layout` hands out `Isa::Vnni`
    /// only there).
    pub(crate) fn decode(&mut self, g0: &[u8], g1: &[u8], nb: usize) {
        let need = nb * Kind::Q8_0.group_block();
        assert!(
            g0.len() >= need && g1.len() >= need,
            "interleaved group too short"
        );
        // SAFETY: the caller's CPU has AVX-512 F/BW/VL/VNNI (above); bounds
        // checked above.
        unsafe {
            self.mags.resize(nb * 8, _mm512_setzero_si512());
            self.neg.resize(nb * 8, 0);
            self.scales.resize(nb, _mm512_setzero_ps());
            self.decode_512(&Raw16::new(g0, g1), nb);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode_512(&mut self, raw: &Raw16, nb: usize) {
        for b in 0..nb {
            self.scales[b] = raw.scales(b);
            for c in 0..4 {
                let [lo, hi] = raw.pair(b, c);
                for (j, (m, n)) in [(c, lo), (4 + c, hi)] {
                    self.mags[8 * b + j] = m;
                    self.neg[8 * b + j] = n;
                }
            }
        }
    }

    /// Sixteen rows against activation row `a`, in [`dot`]'s order.
    pub(crate) fn dot(&self, a: &[BlockQ8_0], out: &mut [f32; 16]) {
        assert!(self.scales.len() >= a.len(), "decoded group too short");
        // SAFETY: as in `decode`; lengths checked above.
        unsafe { dot_512(self, a, out) }
    }
}

/// Sixteen rows (`g0` then `g1`: two interleaved Q8_0 groups of `a.len()`
/// blocks) against `a`, decoding each block in place on AVX-512; the bits
/// of [`dot`] on each group.
///
/// Only where `CpuCaps::has_avx512()`.
pub(crate) fn dot16(g0: &[u8], g1: &[u8], a: &[BlockQ8_0], out: &mut [f32; 16]) {
    let need = a.len() * Kind::Q8_0.group_block();
    assert!(
        g0.len() >= need && g1.len() >= need,
        "interleaved group too short"
    );
    // SAFETY: the caller's CPU has AVX-512 F/BW/VL/VNNI (above); bounds
    // checked above.
    unsafe { dot_512(&Raw16::new(g0, g1), a, out) }
}

/// The blocks of two groups in 16 lanes, as the 512-bit kernels read them.
trait Blocks16 {
    /// Block `b`'s sixteen rows' weight scales.
    unsafe fn scales(&self, b: usize) -> __m512;
    /// Block `b`'s lane chunks `c` and `4 + c` (`c < 4`): magnitudes and
    /// sign masks.
    unsafe fn pair(&self, b: usize, c: usize) -> [(__m512i, __mmask64); 2];
}

impl Blocks16 for Decoded16 {
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> __m512 {
        *self.scales.get_unchecked(b)
    }

    #[inline(always)]
    unsafe fn pair(&self, b: usize, c: usize) -> [(__m512i, __mmask64); 2] {
        let (lo, hi) = (8 * b + c, 8 * b + 4 + c);
        [
            (*self.mags.get_unchecked(lo), *self.neg.get_unchecked(lo)),
            (*self.mags.get_unchecked(hi), *self.neg.get_unchecked(hi)),
        ]
    }
}

/// Two interleaved Q8_0 groups read in place, 16 lanes at a time.
struct Raw16<'a> {
    g0: Raw<'a, 0>,
    g1: Raw<'a, 0>,
}

impl<'a> Raw16<'a> {
    #[inline(always)]
    unsafe fn new(g0: &'a [u8], g1: &'a [u8]) -> Self {
        Self {
            g0: Raw::new(g0),
            g1: Raw::new(g1),
        }
    }
}

impl Blocks16 for Raw16<'_> {
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> __m512 {
        join512_ps(self.g0.scales(b), self.g1.scales(b))
    }

    #[inline(always)]
    unsafe fn pair(&self, b: usize, c: usize) -> [(__m512i, __mmask64); 2] {
        let ((lo0, hi0), (lo1, hi1)) = (self.g0.pair(b, c), self.g1.pair(b, c));
        let (lo, hi) = (join512(lo0, lo1), join512(hi0, hi1));
        [
            (_mm512_abs_epi8(lo), _mm512_movepi8_mask(lo)),
            (_mm512_abs_epi8(hi), _mm512_movepi8_mask(hi)),
        ]
    }
}

/// One chunk's 16 rows against activation block `y`'s bytes `4j..4j + 4`:
/// each row's exact sum of four byte products.
#[inline(always)]
unsafe fn lane_sum16(mags: __m512i, neg: __mmask64, j: usize, y: &BlockQ8_0) -> __m512i {
    let y4 = act16(y, j);
    let sy = _mm512_mask_sub_epi8(y4, neg, _mm512_setzero_si512(), y4);
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), mags, sy)
}

#[inline(always)]
unsafe fn block_scale16<B: Blocks16>(w: &B, b: usize, y: &BlockQ8_0) -> __m512 {
    _mm512_mul_ps(w.scales(b), _mm512_set1_ps(h2f(y.d)))
}

/// [`lane_chains`] on 16 lanes.
#[inline(always)]
unsafe fn lane_chains16<B: Blocks16>(w: &B, a: &[BlockQ8_0]) -> __m512 {
    let mut acc = [_mm512_setzero_ps(); 8];
    for (b, y) in a.iter().enumerate() {
        let d = block_scale16(w, b, y);
        for c in 0..4 {
            let [(ml, nl), (mh, nh)] = w.pair(b, c);
            let (plo, phi) = (lane_sum16(ml, nl, c, y), lane_sum16(mh, nh, 4 + c, y));
            acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(plo), acc[c]);
            acc[4 + c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(phi), acc[4 + c]);
        }
    }
    reduce512(&acc)
}

/// [`dot_with`] on 16 lanes, for Q8_0.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_512<B: Blocks16>(w: &B, a: &[BlockQ8_0], out: &mut [f32; 16]) {
    _mm512_storeu_ps(out.as_mut_ptr(), lane_chains16(w, a));
}

/// Two 8-lane halves of f32 as one 16-lane vector.
#[inline(always)]
unsafe fn join512_ps(lo: __m256, hi: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
        _mm256_castps_pd(hi),
    ))
}

/// Two 8-lane halves as one 16-lane vector.
#[inline(always)]
unsafe fn join512(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// [`reduce`]'s tree on 16 lanes.
#[inline(always)]
unsafe fn reduce512(acc: &[__m512; 8]) -> __m512 {
    let s04 = _mm512_add_ps(acc[0], acc[4]);
    let s26 = _mm512_add_ps(acc[2], acc[6]);
    let s15 = _mm512_add_ps(acc[1], acc[5]);
    let s37 = _mm512_add_ps(acc[3], acc[7]);
    _mm512_add_ps(_mm512_add_ps(s04, s26), _mm512_add_ps(s15, s37))
}

/// The 4-bit kinds on AVX-512 as unsigned bytes: each value plus the kind's
/// [`offset`] (Q4_0's nibbles as they are, `value + 8`; IQ4_NL's and
/// MXFP4's through a table of `value + 128`), so one `vpdpbusd` multiplies
/// them by the activation's signed bytes with no sign trick. A block's sum
/// starts at `-offset * sum(a)` (the activation block's byte sum), which
/// leaves the exact integer of [`block_sums`]: the same bits.
///
/// Only for `Kind::Q4_0`, `Kind::Iq4Nl` and `Kind::Mxfp4`.
pub(crate) const fn offset(kind: Kind) -> i32 {
    match kind {
        Kind::Q4_0 => 8,
        _ => 128,
    }
}

/// The byte sums of activation blocks `a` (for [`offset`]).
pub(crate) fn act_sums(a: &[BlockQ8_0], out: &mut Vec<i32>) {
    out.extend(
        a.iter()
            .map(|y| y.qs.iter().map(|&q| q as i32).sum::<i32>()),
    );
}

/// `KVALUES_* + 128` as unsigned bytes, in all four 128-bit lanes.
#[inline(always)]
unsafe fn offset_lut(table: &[i8; 16]) -> __m512i {
    let mut u = [0u8; 16];
    for (u, &v) in u.iter_mut().zip(table) {
        *u = (v as i32 + 128) as u8;
    }
    _mm512_broadcast_i32x4(_mm_loadu_si128(u.as_ptr() as *const __m128i))
}

/// Two interleaved groups of a 4-bit kind read in place as offset bytes.
struct Offset16<'a, const K: usize> {
    g0: &'a [u8],
    g1: &'a [u8],
    lut: __m512i,
}

impl<'a, const K: usize> Offset16<'a, K> {
    const KIND: Kind = Kind::ALL[K];

    #[inline(always)]
    unsafe fn new(g0: &'a [u8], g1: &'a [u8]) -> Self {
        let lut = match Self::KIND {
            Kind::Iq4Nl => offset_lut(&KVALUES_IQ4NL),
            Kind::Mxfp4 => offset_lut(&KVALUES_MXFP4),
            _ => _mm512_setzero_si512(),
        };
        Self { g0, g1, lut }
    }
}

/// Two 8-lane halves of `f16` as one 16-lane vector.
#[inline(always)]
unsafe fn join256(lo: __m128i, hi: __m128i) -> __m256i {
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi)
}

/// Activation block `y`'s bytes `4j..4j + 4` in every i32 lane.
#[inline(always)]
unsafe fn act16(y: &BlockQ8_0, j: usize) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(
        y.qs.as_ptr().add(4 * j) as *const i32
    ))
}

/// Sixteen rows of a 4-bit kind as offset bytes: in place ([`Offset16`])
/// or decoded ([`OffsetDecoded16`]).
trait OffsetBlocks {
    /// The kind's [`offset`].
    const OFF: i32;
    /// Block `b`'s sixteen rows' weight scales.
    unsafe fn scales(&self, b: usize) -> __m512;
    /// Block `b`'s lane chunks `c` and `4 + c` (`c < 4`).
    unsafe fn pair(&self, b: usize, c: usize) -> (__m512i, __m512i);
}

impl<const K: usize> OffsetBlocks for Offset16<'_, K> {
    const OFF: i32 = offset(Self::KIND);

    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> __m512 {
        let at = b * Self::KIND.group_block();
        let (b0, b1) = (self.g0.as_ptr().add(at), self.g1.as_ptr().add(at));
        match Self::KIND {
            Kind::Mxfp4 => join512_ps(e8m0_lanes(b0), e8m0_lanes(b1)),
            _ => _mm512_cvtph_ps(join256(
                _mm_loadu_si128(b0 as *const __m128i),
                _mm_loadu_si128(b1 as *const __m128i),
            )),
        }
    }

    #[inline(always)]
    unsafe fn pair(&self, b: usize, c: usize) -> (__m512i, __m512i) {
        let sb = if let Kind::Mxfp4 = Self::KIND { 8 } else { 16 };
        let at = b * Self::KIND.group_block() + sb + 32 * c;
        let x = join512(
            _mm256_loadu_si256(self.g0.as_ptr().add(at) as *const __m256i),
            _mm256_loadu_si256(self.g1.as_ptr().add(at) as *const __m256i),
        );
        let m4 = _mm512_set1_epi8(0x0F);
        let (lo, hi) = (
            _mm512_and_si512(x, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4),
        );
        match Self::KIND {
            Kind::Q4_0 => (lo, hi),
            _ => (
                _mm512_shuffle_epi8(self.lut, lo),
                _mm512_shuffle_epi8(self.lut, hi),
            ),
        }
    }
}

/// Sixteen rows of a 4-bit kind (`g0` then `g1`) against one to four
/// activation rows `a[t]` (block byte sums `sums[t]`), read in place, row
/// `t`'s results in `out[t]`: ggml's repack order (the bits of [`dot`] on
/// each group).
///
/// Only where `CpuCaps::has_avx512()`, for the 4-bit kinds.
pub(crate) fn dot16_offset(
    kind: Kind,
    g0: &[u8],
    g1: &[u8],
    a: &[&[BlockQ8_0]],
    sums: &[&[i32]],
    out: &mut [[f32; 16]],
) {
    let nb = a.first().map_or(0, |a| a.len());
    let need = nb * kind.group_block();
    assert!(
        g0.len() >= need && g1.len() >= need,
        "interleaved group too short"
    );
    check_rows(nb, a, sums, out);
    // SAFETY: the caller's CPU has AVX-512 F/BW/VL/VNNI (above); bounds
    // checked above.
    unsafe {
        match kind {
            Kind::Q4_0 => offset_rows(&Offset16::<1>::new(g0, g1), a, sums, out),
            Kind::Iq4Nl => offset_rows(&Offset16::<2>::new(g0, g1), a, sums, out),
            Kind::Mxfp4 => offset_rows(&Offset16::<3>::new(g0, g1), a, sums, out),
            Kind::Q8_0 => unreachable!("Q8_0 has no offset kernels"),
        }
    }
}

/// One to four activation rows of `nb` blocks, with their sums and outputs.
fn check_rows(nb: usize, a: &[&[BlockQ8_0]], sums: &[&[i32]], out: &[[f32; 16]]) {
    assert!(
        (1..=4).contains(&a.len())
            && a.len() == sums.len()
            && a.len() == out.len()
            && a.iter()
                .zip(sums)
                .all(|(a, s)| a.len() == nb && s.len() >= nb),
        "interleaved groups and activation rows disagree"
    );
}

/// [`offset_tile`] for `a.len()` (one to four) rows.
#[inline(always)]
unsafe fn offset_rows<W: OffsetBlocks>(
    w: &W,
    a: &[&[BlockQ8_0]],
    sums: &[&[i32]],
    out: &mut [[f32; 16]],
) {
    match a.len() {
        4 => offset_tile::<W, 4>(w, a, sums, out),
        3 => offset_tile::<W, 3>(w, a, sums, out),
        2 => offset_tile::<W, 2>(w, a, sums, out),
        _ => offset_tile::<W, 1>(w, a, sums, out),
    }
}

/// [`block_sums`] on 16 lanes for `N` activation rows, each chunk loaded
/// once for all of them; a block's sum starts at `-offset * sum(a)`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn offset_tile<W: OffsetBlocks, const N: usize>(
    w: &W,
    a: &[&[BlockQ8_0]],
    sums: &[&[i32]],
    out: &mut [[f32; 16]],
) {
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..a[0].len() {
        let mut sum: [__m512i; N] =
            std::array::from_fn(|t| _mm512_set1_epi32(-W::OFF * *sums[t].get_unchecked(b)));
        for c in 0..4 {
            let (lo, hi) = w.pair(b, c);
            for t in 0..N {
                let y = a[t].get_unchecked(b);
                sum[t] = _mm512_dpbusd_epi32(sum[t], lo, act16(y, c));
                sum[t] = _mm512_dpbusd_epi32(sum[t], hi, act16(y, 4 + c));
            }
        }
        let ws = w.scales(b);
        for t in 0..N {
            let d = _mm512_mul_ps(ws, _mm512_set1_ps(h2f(a[t].get_unchecked(b).d)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), d, acc[t]);
        }
    }
    for t in 0..N {
        _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// Two groups of a 4-bit kind decoded as offset bytes for a batch of more
/// than four activation rows: per block, the sixteen rows' scales and the
/// eight lane chunks, so each group is unpacked once for all rows.
pub(crate) struct OffsetDecoded16 {
    /// `[block][j]`: offset bytes of lane chunk `j`.
    vals: Vec<__m512i>,
    /// `[block]`: the rows' weight scales.
    scales: Vec<__m512>,
    kind: Kind,
}

/// An [`OffsetDecoded16`] of kind `K`.
struct DecodedAs<'a, const K: usize>(&'a OffsetDecoded16);

impl<const K: usize> OffsetBlocks for DecodedAs<'_, K> {
    const OFF: i32 = offset(Kind::ALL[K]);
    #[inline(always)]
    unsafe fn scales(&self, b: usize) -> __m512 {
        *self.0.scales.get_unchecked(b)
    }
    #[inline(always)]
    unsafe fn pair(&self, b: usize, c: usize) -> (__m512i, __m512i) {
        (
            *self.0.vals.get_unchecked(8 * b + c),
            *self.0.vals.get_unchecked(8 * b + 4 + c),
        )
    }
}

impl OffsetDecoded16 {
    pub(crate) fn new() -> Self {
        Self {
            vals: Vec::new(),
            scales: Vec::new(),
            kind: Kind::Q4_0,
        }
    }

    /// Decodes groups `g0` and `g1` of `nb` blocks each (a 4-bit kind).
    ///
    /// Only where `CpuCaps::has_avx512()`.
    pub(crate) fn decode(&mut self, kind: Kind, g0: &[u8], g1: &[u8], nb: usize) {
        let need = nb * kind.group_block();
        assert!(
            g0.len() >= need && g1.len() >= need,
            "interleaved group too short"
        );
        // SAFETY: as in `dot16_offset`; bounds checked above.
        unsafe {
            self.vals.resize(nb * 8, _mm512_setzero_si512());
            self.scales.resize(nb, _mm512_setzero_ps());
            self.kind = kind;
            match kind {
                Kind::Q4_0 => self.decode_512(&Offset16::<1>::new(g0, g1), nb),
                Kind::Iq4Nl => self.decode_512(&Offset16::<2>::new(g0, g1), nb),
                Kind::Mxfp4 => self.decode_512(&Offset16::<3>::new(g0, g1), nb),
                Kind::Q8_0 => unreachable!("Q8_0 has no offset kernels"),
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode_512<const K: usize>(&mut self, w: &Offset16<K>, nb: usize) {
        for b in 0..nb {
            self.scales[b] = w.scales(b);
            for c in 0..4 {
                let (lo, hi) = w.pair(b, c);
                self.vals[8 * b + c] = lo;
                self.vals[8 * b + 4 + c] = hi;
            }
        }
    }

    /// Sixteen rows against one to four activation rows `a[t]` (byte sums
    /// `sums[t]`); row `t`'s results in `out[t]`.
    pub(crate) fn dot(&self, a: &[&[BlockQ8_0]], sums: &[&[i32]], out: &mut [[f32; 16]]) {
        check_rows(self.scales.len(), a, sums, out);
        // SAFETY: as in `decode`; lengths checked above.
        unsafe {
            match self.kind {
                Kind::Q4_0 => offset_rows(&DecodedAs::<1>(self), a, sums, out),
                Kind::Iq4Nl => offset_rows(&DecodedAs::<2>(self), a, sums, out),
                Kind::Mxfp4 => offset_rows(&DecodedAs::<3>(self), a, sums, out),
                Kind::Q8_0 => unreachable!("Q8_0 has no offset kernels"),
            }
        }
    }
}
