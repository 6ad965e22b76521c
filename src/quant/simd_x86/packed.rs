//! AVX2 kernels over the interleaved layout of `quant::layout`: one group of
//! eight rows against one activation row, row `r` in f32 lane `r`.
//!
//! Accumulator `j` is lane `j` of the plain kernel's 8-lane chain (bytes
//! `4j..4j + 4` of each block, as `mul_sum_i8_pairs` sums them), fed by the
//! same exact integers and the same `fma(d, sum, acc)` per block, and the
//! eight are reduced by `hsum_ps`'s tree on whole vectors: each lane's result
//! is the plain kernel's bits for its row.

use super::super::common::{KVALUES_IQ4NL, KVALUES_MXFP4};
use super::super::BlockQ8_0;
use super::{h2f, mul_sum_i8_pairs};
use std::arch::x86_64::*;

/// Bytes of one block of eight rows: Q8_0.
const Q8_0_GROUP_BLOCK: usize = 8 * 34;

/// The 4-bit types: their value table and scale.
#[derive(Clone, Copy)]
pub(crate) enum Nib4 {
    /// `nibble - 8`, `f16` scale.
    Q4_0,
    /// `KVALUES_IQ4NL`, `f16` scale.
    Iq4Nl,
    /// `KVALUES_MXFP4`, `e8m0` scale (half of its power of two).
    Mxfp4,
}

impl Nib4 {
    /// Bytes of one scale.
    const fn scale_bytes(self) -> usize {
        match self {
            Nib4::Mxfp4 => 1,
            _ => 2,
        }
    }
}

/// Eight rows of a 4-bit type (`g`: one interleaved group of `a.len()`
/// blocks per row) against `a`; `two`: the plain kernel's two chains (even
/// and odd blocks, an odd last block by the scalar tail) rather than one.
pub(crate) fn nib4(ty: Nib4, two: bool, g: &[u8], a: &[BlockQ8_0], out: &mut [f32; 8]) {
    let gbb = 8 * ty.scale_bytes() + 128;
    assert!(g.len() >= a.len() * gbb, "interleaved group too short");
    let table: &[i8; 16] = match ty {
        Nib4::Q4_0 => &Q4_0_VALUES,
        Nib4::Iq4Nl => &KVALUES_IQ4NL,
        Nib4::Mxfp4 => &KVALUES_MXFP4,
    };
    // SAFETY: `layout::interleaved` hands these out only when
    // CpuCaps::has_avx2(); the bounds are checked above.
    unsafe {
        match (ty, two) {
            (Nib4::Mxfp4, true) => nib4_avx2::<true, true>(g, a, table, out),
            (Nib4::Mxfp4, false) => nib4_avx2::<true, false>(g, a, table, out),
            (_, true) => nib4_avx2::<false, true>(g, a, table, out),
            (_, false) => nib4_avx2::<false, false>(g, a, table, out),
        }
    }
}

/// Q4_0's codes as values: `nibble - 8`.
const Q4_0_VALUES: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];

/// Eight Q8_0 rows against `a` (see [`nib4`]).
pub(crate) fn q8_0(g: &[u8], a: &[BlockQ8_0], out: &mut [f32; 8]) {
    assert!(
        g.len() >= a.len() * Q8_0_GROUP_BLOCK,
        "interleaved Q8_0 group too short"
    );
    // SAFETY: as in `nib4`.
    unsafe { q8_0_avx2(g, a, out) }
}

/// The eight rows' MXFP4 scales times the activation's: ggml's
/// `fp16(y.d) * e8m0_half(x.e)` per lane (`e8m0_to_f32_half`: `(e - 1) << 23`
/// as f32 bits, `0x200000 << e` for `e < 2`).
#[inline(always)]
unsafe fn e8m0_scales(blk: *const u8, y: &BlockQ8_0) -> __m256 {
    let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk as *const __m128i));
    let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    let small = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let is_small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    let x = _mm256_castsi256_ps(_mm256_blendv_epi8(normal, small, is_small));
    _mm256_mul_ps(_mm256_set1_ps(h2f(y.d)), x)
}

/// The eight rows' `d_w * d_a` (the plain kernels' scalar product, per lane).
#[inline(always)]
unsafe fn scales(blk: *const u8, y: &BlockQ8_0) -> __m256 {
    let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
    _mm256_mul_ps(dw, _mm256_set1_ps(h2f(y.d)))
}

/// Bytes `4j..4j + 4` of an activation block in every i32 lane.
#[inline(always)]
unsafe fn act_chunk(y: &BlockQ8_0, j: usize) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(
        y.qs.as_ptr().add(4 * j) as *const i32
    ))
}

/// `hsum_ps`'s tree over the eight lane accumulators.
#[inline(always)]
unsafe fn reduce(acc: &[__m256; 8], out: &mut [f32; 8]) {
    let s04 = _mm256_add_ps(acc[0], acc[4]);
    let s26 = _mm256_add_ps(acc[2], acc[6]);
    let s15 = _mm256_add_ps(acc[1], acc[5]);
    let s37 = _mm256_add_ps(acc[3], acc[7]);
    let r = _mm256_add_ps(_mm256_add_ps(s04, s26), _mm256_add_ps(s15, s37));
    _mm256_storeu_ps(out.as_mut_ptr(), r);
}

/// One FMA chain over blocks `first, first + step, ..` of `a`: the eight
/// lane accumulators.
#[inline(always)]
unsafe fn nib4_chain<const E8M0: bool>(
    g: &[u8],
    a: &[BlockQ8_0],
    lut: __m256i,
    first: usize,
    step: usize,
) -> [__m256; 8] {
    let mut acc = [_mm256_setzero_ps(); 8];
    let m4 = _mm256_set1_epi8(0x0F);
    let (sb, gbb) = if E8M0 { (8, 8 + 128) } else { (16, 16 + 128) };
    for b in (first..a.len()).step_by(step) {
        let (blk, y) = (g.as_ptr().add(b * gbb), &a[b]);
        let d = if E8M0 {
            e8m0_scales(blk, y)
        } else {
            scales(blk, y)
        };
        // Chunk c (bytes 4c..4c + 4 of the 16) holds elements 4c.. in its low
        // nibbles (lane c) and 16 + 4c.. in its high nibbles (lane 4 + c).
        for c in 0..4 {
            let v = _mm256_loadu_si256(blk.add(sb + 32 * c) as *const __m256i);
            let lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
            let hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            let plo = mul_sum_i8_pairs(lo, act_chunk(y, c));
            let phi = mul_sum_i8_pairs(hi, act_chunk(y, 4 + c));
            acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(plo), acc[c]);
            acc[4 + c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(phi), acc[4 + c]);
        }
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nib4_avx2<const E8M0: bool, const TWO: bool>(
    g: &[u8],
    a: &[BlockQ8_0],
    table: &[i8; 16],
    out: &mut [f32; 8],
) {
    let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
    if !TWO {
        reduce(&nib4_chain::<E8M0>(g, a, lut, 0, 1), out);
        return;
    }
    // `lut4_pairs`: even and odd blocks in two chains, `hsum(acc1 + acc2)`;
    // the chains are independent, so one after the other.
    let even = a.len() & !1;
    let e = nib4_chain::<E8M0>(g, &a[..even], lut, 0, 2);
    let o = nib4_chain::<E8M0>(g, &a[..even], lut, 1, 2);
    let sum: [__m256; 8] = std::array::from_fn(|j| _mm256_add_ps(e[j], o[j]));
    reduce(&sum, out);
    if even == a.len() {
        return;
    }
    // `lut4_tail`: the odd last block, `sumf = fma(d, f32(sumi), sumf)` with
    // the block's whole integer sum.
    let gbb = if E8M0 { 8 + 128 } else { 16 + 128 };
    let (blk, y) = (g.as_ptr().add(even * gbb), &a[even]);
    let sb = if E8M0 { 8 } else { 16 };
    let d = if E8M0 {
        e8m0_scales(blk, y)
    } else {
        scales(blk, y)
    };
    let m4 = _mm256_set1_epi8(0x0F);
    let mut sumi = _mm256_setzero_si256();
    for c in 0..4 {
        let v = _mm256_loadu_si256(blk.add(sb + 32 * c) as *const __m256i);
        let lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
        let hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
        sumi = _mm256_add_epi32(sumi, mul_sum_i8_pairs(lo, act_chunk(y, c)));
        sumi = _mm256_add_epi32(sumi, mul_sum_i8_pairs(hi, act_chunk(y, 4 + c)));
    }
    let sumf = _mm256_loadu_ps(out.as_ptr());
    let r = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), sumf);
    _mm256_storeu_ps(out.as_mut_ptr(), r);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_avx2(g: &[u8], a: &[BlockQ8_0], out: &mut [f32; 8]) {
    let mut acc = [_mm256_setzero_ps(); 8];
    for (b, y) in a.iter().enumerate() {
        let blk = g.as_ptr().add(b * Q8_0_GROUP_BLOCK);
        let d = scales(blk, y);
        for (j, acc) in acc.iter_mut().enumerate() {
            let v = _mm256_loadu_si256(blk.add(16 + 32 * j) as *const __m256i);
            let p = mul_sum_i8_pairs(v, act_chunk(y, j));
            *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), *acc);
        }
    }
    reduce(&acc, out);
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
}

impl Decoded {
    pub(crate) fn new() -> Self {
        Self {
            vals: Vec::new(),
            scales: Vec::new(),
        }
    }

    /// Decodes group `g` of `nb` blocks of `ty` (`None`: Q8_0).
    pub(crate) fn decode(&mut self, ty: Option<Nib4>, g: &[u8], nb: usize) {
        let gbb = match ty {
            Some(t) => 8 * t.scale_bytes() + 128,
            None => Q8_0_GROUP_BLOCK,
        };
        assert!(g.len() >= nb * gbb, "interleaved group too short");
        self.vals.resize(nb * 16, unsafe { _mm256_setzero_si256() });
        self.scales.resize(nb, unsafe { _mm256_setzero_ps() });
        // SAFETY: as in `nib4`; bounds checked above.
        unsafe { decode_avx2(ty, g, nb, gbb, &mut self.vals, &mut self.scales) }
    }

    /// Eight rows against activation row `a` (the decoded blocks), with
    /// `two` chains as [`nib4`]'s.
    pub(crate) fn dot(&self, two: bool, a: &[BlockQ8_0], out: &mut [f32; 8]) {
        assert!(self.scales.len() >= a.len(), "decoded group too short");
        // SAFETY: as in `nib4`; lengths checked above.
        unsafe { decoded_dot_avx2(self, two, a, out) }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_avx2(
    ty: Option<Nib4>,
    g: &[u8],
    nb: usize,
    gbb: usize,
    vals: &mut [__m256i],
    scales: &mut [__m256],
) {
    let m4 = _mm256_set1_epi8(0x0F);
    let table: &[i8; 16] = match ty {
        Some(Nib4::Iq4Nl) => &KVALUES_IQ4NL,
        Some(Nib4::Mxfp4) => &KVALUES_MXFP4,
        _ => &Q4_0_VALUES,
    };
    let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
    for b in 0..nb {
        let blk = g.as_ptr().add(b * gbb);
        let v = &mut vals[16 * b..16 * b + 16];
        let sb = match ty {
            Some(Nib4::Mxfp4) => {
                let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk as *const __m128i));
                let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
                let small = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
                let is_small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
                scales[b] = _mm256_castsi256_ps(_mm256_blendv_epi8(normal, small, is_small));
                8
            }
            _ => {
                scales[b] = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
                16
            }
        };
        for c in 0..4 {
            let x = _mm256_loadu_si256(blk.add(sb + 32 * c) as *const __m256i);
            let (lo, hi) = match ty {
                None => (
                    x,
                    _mm256_loadu_si256(blk.add(sb + 32 * (c + 4)) as *const __m256i),
                ),
                Some(_) => (
                    _mm256_shuffle_epi8(lut, _mm256_and_si256(x, m4)),
                    _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4)),
                ),
            };
            v[c] = lo;
            v[4 + c] = hi;
            v[8 + c] = _mm256_sign_epi8(lo, lo);
            v[12 + c] = _mm256_sign_epi8(hi, hi);
        }
    }
}

/// One FMA chain over decoded blocks `first, first + step, ..` of `a`.
#[inline(always)]
unsafe fn decoded_chain(dec: &Decoded, a: &[BlockQ8_0], first: usize, step: usize) -> [__m256; 8] {
    let mut acc = [_mm256_setzero_ps(); 8];
    let ones = _mm256_set1_epi16(1);
    for b in (first..a.len()).step_by(step) {
        let y = &a[b];
        let d = _mm256_mul_ps(*dec.scales.get_unchecked(b), _mm256_set1_ps(h2f(y.d)));
        let v = dec.vals.as_ptr().add(16 * b);
        for (j, acc) in acc.iter_mut().enumerate() {
            // `mul_sum_i8_pairs`: |w| by sign(y, w).
            let sy = _mm256_sign_epi8(act_chunk(y, j), *v.add(j));
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*v.add(8 + j), sy), ones);
            *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), *acc);
        }
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decoded_dot_avx2(dec: &Decoded, two: bool, a: &[BlockQ8_0], out: &mut [f32; 8]) {
    if !two {
        reduce(&decoded_chain(dec, a, 0, 1), out);
        return;
    }
    // As `nib4_avx2`'s two chains and odd last block.
    let even = a.len() & !1;
    let e = decoded_chain(dec, &a[..even], 0, 2);
    let o = decoded_chain(dec, &a[..even], 1, 2);
    let sum: [__m256; 8] = std::array::from_fn(|j| _mm256_add_ps(e[j], o[j]));
    reduce(&sum, out);
    if even == a.len() {
        return;
    }
    let y = &a[even];
    let d = _mm256_mul_ps(dec.scales[even], _mm256_set1_ps(h2f(y.d)));
    let v = &dec.vals[16 * even..16 * even + 16];
    let ones = _mm256_set1_epi16(1);
    let mut sumi = _mm256_setzero_si256();
    for j in 0..8 {
        let sy = _mm256_sign_epi8(act_chunk(y, j), v[j]);
        sumi = _mm256_add_epi32(
            sumi,
            _mm256_madd_epi16(_mm256_maddubs_epi16(v[8 + j], sy), ones),
        );
    }
    let r = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), _mm256_loadu_ps(out.as_ptr()));
    _mm256_storeu_ps(out.as_mut_ptr(), r);
}
