//! AVX2 kernels over Q4_K's interleaved layout (`quant::layout`): one
//! group of eight rows against one Q8_K activation row, row `r` in f32 lane
//! `r`. A group block is the eight rows' 16 header bytes (`d`, `dmin`, the
//! 12 scale bytes) then `qs` in 4-byte chunks: chunk `8c + j` holds bytes
//! `32c + 4j..+4`, whose low nibbles are elements `4j..4j + 4` of sub-block
//! `2c` and high nibbles the same of sub-block `2c + 1`.
//!
//! Two sets of bits, as the plain kernels:
//! - [`vec_dot`]: `ggml_vec_dot_q4_K_q8_K`'s AVX2 path. Its lane `j` holds,
//!   over the 8 sub-blocks, `sc * sum` of elements `4j..4j + 4`; here that
//!   is accumulator `j`, and the min term's 4-lane chain is 4 accumulators,
//!   reduced by `hsum_ps` and `hsum_ps4`'s trees on whole vectors.
//! - [`tiled`]: ggml's tiled path (8+ rows routed to a matrix): per block
//!   the exact `s1`, `s2`, then `f32(s1) * d0`, `fnmadd(dmin, f32(s2))` and
//!   `fma(res, d_act, acc)` per lane, as `ggml_tiled`'s epilogue.

use super::super::common::scale_mins_k4;
use super::super::BlockQ8K;
use std::arch::x86_64::*;

/// Bytes of one block of eight rows.
pub(crate) const GROUP_BLOCK: usize = 8 * 144;

/// One group block decoded: codes per (sub-block, chunk), per-row scales
/// and mins as `madd` operands, and the rows' `d` and `dmin`.
pub(crate) struct Block {
    /// `[s][j]`: the 8 rows' codes of elements `4j..4j + 4` of sub-block `s`.
    codes: [[__m256i; 8]; 8],
    /// `[s]`: each row's scale of sub-block `s` in both i16 halves.
    sc: [__m256i; 8],
    /// `[k]`: each row's mins `2k` and `2k + 1` as an i16 pair.
    mins: [__m256i; 4],
    d: __m256,
    dmin: __m256,
}

/// Decodes group block `b` of group `g`.
pub(crate) fn decode(g: &[u8], b: usize, out: &mut Block) {
    assert!(
        g.len() >= (b + 1) * GROUP_BLOCK,
        "interleaved Q4_K group too short"
    );
    let blk = &g[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
    let (mut d, mut dmin) = ([0u16; 8], [0u16; 8]);
    let (mut sc, mut mins) = ([[0i32; 8]; 8], [[0i32; 8]; 4]);
    for r in 0..8 {
        let h = &blk[16 * r..16 * r + 16];
        d[r] = u16::from_le_bytes([h[0], h[1]]);
        dmin[r] = u16::from_le_bytes([h[2], h[3]]);
        let (s, m) = scale_mins_k4(h[4..16].try_into().expect("12 scale bytes"));
        for i in 0..8 {
            sc[i][r] = s[i] as i32 * 0x1_0001;
        }
        for k in 0..4 {
            mins[k][r] = m[2 * k] as i32 | (m[2 * k + 1] as i32) << 16;
        }
    }
    // SAFETY: `layout::interleaved` hands Q4_K out only when
    // CpuCaps::has_avx2(); the bounds are checked above.
    unsafe { decode_avx2(blk, &d, &dmin, &sc, &mins, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_avx2(
    blk: &[u8],
    d: &[u16; 8],
    dmin: &[u16; 8],
    sc: &[[i32; 8]; 8],
    mins: &[[i32; 8]; 4],
    out: &mut Block,
) {
    let m4 = _mm256_set1_epi8(0x0F);
    out.d = _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr() as *const __m128i));
    out.dmin = _mm256_cvtph_ps(_mm_loadu_si128(dmin.as_ptr() as *const __m128i));
    for (v, s) in out.sc.iter_mut().zip(sc) {
        *v = _mm256_loadu_si256(s.as_ptr() as *const __m256i);
    }
    for (v, m) in out.mins.iter_mut().zip(mins) {
        *v = _mm256_loadu_si256(m.as_ptr() as *const __m256i);
    }
    let qs = blk.as_ptr().add(128);
    for c in 0..4 {
        for j in 0..8 {
            let v = _mm256_loadu_si256(qs.add(32 * (8 * c + j)) as *const __m256i);
            out.codes[2 * c][j] = _mm256_and_si256(v, m4);
            out.codes[2 * c + 1][j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
    }
}

impl Block {
    pub(crate) fn new() -> Self {
        // SAFETY: all-zero bits are valid vectors.
        unsafe { std::mem::zeroed() }
    }
}

/// Bytes `at..at + 4` of the activation in every i32 lane.
#[inline(always)]
unsafe fn act4(y: &BlockQ8K, at: usize) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(y.qs.as_ptr().add(at) as *const i32))
}

/// Each row's `sum_k madd(mins pair k, bsum pairs 2k, 2k + 1)`: lane `k` of
/// ggml's `_mm_madd_epi16(mins, hadd(bsums))`, here one vector per `k`.
#[inline(always)]
unsafe fn min_products(blk: &Block, y: &BlockQ8K) -> [__m256i; 4] {
    // hadd_epi16: pair i is bsums 2i + 2i+1, wrapping as i16.
    let p = |i: usize| y.bsums[2 * i].wrapping_add(y.bsums[2 * i + 1]) as u16 as i32;
    std::array::from_fn(|k| {
        let pair = _mm256_set1_epi32(p(2 * k) | p(2 * k + 1) << 16);
        _mm256_madd_epi16(blk.mins[k], pair)
    })
}

/// The per-call state of [`vec_dot`]: 8 lane chains and the 4-lane min chain.
pub(crate) struct DotAcc {
    acc: [__m256; 8],
    acc_m: [__m256; 4],
}

impl DotAcc {
    pub(crate) fn new() -> Self {
        // SAFETY: all-zero bits are +0.0 lanes.
        unsafe { std::mem::zeroed() }
    }
}

/// `ggml_vec_dot_q4_K_q8_K`'s block step for the eight rows of `blk`.
pub(crate) fn vec_dot(blk: &Block, y: &BlockQ8K, s: &mut DotAcc) {
    // SAFETY: as in `decode`.
    unsafe { vec_dot_avx2(blk, y, s) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_avx2(blk: &Block, y: &BlockQ8K, s: &mut DotAcc) {
    let yd = _mm256_set1_ps(y.d);
    // `-(y.d * h2f(x.dmin))` and `y.d * h2f(x.d)`, per lane.
    let dmin = _mm256_xor_ps(_mm256_mul_ps(yd, blk.dmin), _mm256_set1_ps(-0.0));
    for (acc, p) in s.acc_m.iter_mut().zip(min_products(blk, y)) {
        *acc = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(p), *acc);
    }
    let d = _mm256_mul_ps(yd, blk.d);
    for j in 0..8 {
        let mut sumi = _mm256_setzero_si256();
        for sb in 0..8 {
            let p = _mm256_maddubs_epi16(blk.codes[sb][j], act4(y, 32 * sb + 4 * j));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, blk.sc[sb]));
        }
        s.acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), s.acc[j]);
    }
}

/// The eight rows' `hsum_ps(acc) + hsum_ps4(acc_m)`.
pub(crate) fn vec_dot_finish(s: &DotAcc, out: &mut [f32; 8]) {
    // SAFETY: as in `decode`.
    unsafe {
        let a = &s.acc;
        let t = _mm256_add_ps(
            _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
            _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])),
        );
        let m = &s.acc_m;
        let tm = _mm256_add_ps(_mm256_add_ps(m[0], m[2]), _mm256_add_ps(m[1], m[3]));
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(t, tm));
    }
}

/// The tiled path's block step: `acc = fma(f32(s1) * d0 - dmin * f32(s2),
/// d_act, acc)` per lane.
pub(crate) fn tiled(blk: &Block, y: &BlockQ8K, acc: &mut [f32; 8]) {
    // SAFETY: as in `decode`.
    unsafe { tiled_avx2(blk, y, acc) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiled_avx2(blk: &Block, y: &BlockQ8K, acc: &mut [f32; 8]) {
    let mut s1 = _mm256_setzero_si256();
    for sb in 0..8 {
        // Eight `maddubs` pairs of codes below 16 and activations of at
        // most 128 in magnitude sum to at most 30720: exact in i16.
        let mut p = _mm256_setzero_si256();
        for j in 0..8 {
            let q = _mm256_maddubs_epi16(blk.codes[sb][j], act4(y, 32 * sb + 4 * j));
            p = _mm256_add_epi16(p, q);
        }
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p, blk.sc[sb]));
    }
    let m = min_products(blk, y);
    let s2 = _mm256_add_epi32(_mm256_add_epi32(m[0], m[1]), _mm256_add_epi32(m[2], m[3]));
    let res = _mm256_mul_ps(_mm256_cvtepi32_ps(s1), blk.d);
    let res = _mm256_fnmadd_ps(blk.dmin, _mm256_cvtepi32_ps(s2), res);
    let a = _mm256_fmadd_ps(res, _mm256_set1_ps(y.d), _mm256_loadu_ps(acc.as_ptr()));
    _mm256_storeu_ps(acc.as_mut_ptr(), a);
}
