//! Kernels over Q4_K's interleaved layout (`quant::layout`'s `q4_k`):
//! groups of eight rows, one row per 32-bit lane, against Q8_K activation
//! rows, in the order of ggml's x86 repack kernels (`q4_K_8x8_q8_K`, its
//! gemv and gemm, AVX2 and AVX-512 alike), which llama.cpp runs at its
//! defaults: per super-block and row, two exact integers,
//!
//! - `isum = Σ_j scale_j · Σ_{i in sub-block j} q4_i · q8_i` and
//! - `imin = Σ_j min_j · (bsums[2j] + bsums[2j + 1])`,
//!
//! then `acc = fma(f32(isum), d_w · d_a, acc)`,
//! `acc_min = fma(f32(imin), dmin_w · d_a, acc_min)`, and at the end
//! `acc - acc_min`. That is the gemv's order; ggml's 4-row gemm (a
//! MUL_MAT's rows in fours) takes the same two sums and FMAs per 64 values
//! (sub-blocks `2i` and `2i + 1`) instead: the kernels' `GEMM` parameter.
//! Any way of computing the integers gives the same bits.
//!
//! A group's super-block (1152 bytes, [`GROUP_BLOCK`]): the eight rows'
//! `d` (`f16`, 16 bytes), their `dmin` (16 bytes), the 6-bit scales and
//! mins of entry `e = 8j + r` (sub-block `j`, row `r`): low four bits of
//! the scale and of the min in byte `32 + e` (scale in the low nibble),
//! their top two bits in nibble `e % 2` of byte `96 + e / 2` (scale's in
//! bits 0..2, min's in 2..4); then the quants in 4-byte chunks, chunk `c`
//! of row `r` at `128 + (8c + r) · 4`. Chunk `c`'s low nibbles are values
//! `4(c % 8)..+4` of sub-block `2(c / 8)`, its high nibbles the same
//! values of sub-block `2(c / 8) + 1`.

use super::super::layout::q4_k::{DMIN, GROUP_BLOCK, QS, SCALES_HI, SCALES_LO};
use super::super::BlockQ8K;
use std::arch::x86_64::*;

/// The scales' and mins' bytes of one group super-block at `p` as two
/// 64-byte vectors (entry `8j + r`).
#[inline(always)]
unsafe fn scale_min_bytes_512(p: *const u8) -> (__m512i, __m512i) {
    let lo = _mm512_loadu_si512(p.add(SCALES_LO) as *const _);
    let w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(p.add(SCALES_HI) as *const __m256i));
    // Byte 2i: the low nibble of byte i, byte 2i + 1: its high nibble.
    let h = _mm512_or_si512(
        _mm512_and_si512(w, _mm512_set1_epi16(0x000F)),
        _mm512_and_si512(_mm512_slli_epi16::<4>(w), _mm512_set1_epi16(0x0F00)),
    );
    let (m4, m30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    let sc = _mm512_or_si512(
        _mm512_and_si512(lo, m4),
        _mm512_and_si512(_mm512_slli_epi16::<4>(h), m30),
    );
    let mn = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi16::<4>(lo), m4),
        _mm512_and_si512(_mm512_slli_epi16::<2>(h), m30),
    );
    (sc, mn)
}

/// Sub-block `j`'s sixteen values from the two groups' byte vectors
/// (`lo`/`hi`: their 64-bit interleave) as i32 lanes.
#[inline(always)]
unsafe fn lanes_of(lo: __m512i, hi: __m512i, j: usize) -> __m512i {
    let v = if j.is_multiple_of(2) { lo } else { hi };
    let x = match j / 2 {
        0 => _mm512_extracti32x4_epi32::<0>(v),
        1 => _mm512_extracti32x4_epi32::<1>(v),
        2 => _mm512_extracti32x4_epi32::<2>(v),
        _ => _mm512_extracti32x4_epi32::<3>(v),
    };
    _mm512_cvtepu8_epi32(x)
}

/// Two groups' super-block `b` read in place: sixteen rows.
struct Raw16<'a> {
    g0: &'a [u8],
    g1: &'a [u8],
}

/// The rows of a super-block in one vector width (`I` bytes or i32 lanes,
/// `F` f32 lanes, one row per lane): sixteen on AVX-512, eight on AVX2;
/// read in place or [`Decoded`].
trait Blocks {
    type I: Copy;
    type F: Copy;
    /// Per sub-block `j`: the rows' scales and mins, i32 lanes (on AVX2 the
    /// scales in both 16-bit halves too); the mins in both halves.
    unsafe fn scales(&self, b: usize, sc: &mut [Self::I; 8], mn: &mut [Self::I; 8]);
    /// `d` and `dmin` of the rows.
    unsafe fn d(&self, b: usize) -> (Self::F, Self::F);
    /// Chunk `c`'s low and high nibbles as bytes.
    unsafe fn chunk(&self, b: usize, c: usize) -> (Self::I, Self::I);
}

/// Two halves as one 512-bit vector.
#[inline(always)]
unsafe fn join512(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

impl Blocks for Raw16<'_> {
    type I = __m512i;
    type F = __m512;

    #[inline(always)]
    unsafe fn scales(&self, b: usize, sc: &mut [__m512i; 8], mn: &mut [__m512i; 8]) {
        let at = b * GROUP_BLOCK;
        let (s0, m0) = scale_min_bytes_512(self.g0.as_ptr().add(at));
        let (s1, m1) = scale_min_bytes_512(self.g1.as_ptr().add(at));
        // 128-bit lane L of the low interleave: sub-block 2L of g0 then of
        // g1; of the high one: sub-block 2L + 1.
        let (slo, shi) = (_mm512_unpacklo_epi64(s0, s1), _mm512_unpackhi_epi64(s0, s1));
        let (mlo, mhi) = (_mm512_unpacklo_epi64(m0, m1), _mm512_unpackhi_epi64(m0, m1));
        for j in 0..8 {
            sc[j] = lanes_of(slo, shi, j);
            let m = lanes_of(mlo, mhi, j);
            mn[j] = _mm512_or_si512(m, _mm512_slli_epi32::<16>(m));
        }
    }

    #[inline(always)]
    unsafe fn d(&self, b: usize) -> (__m512, __m512) {
        let at = b * GROUP_BLOCK;
        let (p0, p1) = (self.g0.as_ptr().add(at), self.g1.as_ptr().add(at));
        let half = |p: *const u8| _mm_loadu_si128(p as *const __m128i);
        let join = |a: __m128i, b: __m128i| {
            _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b))
        };
        (
            join(half(p0), half(p1)),
            join(half(p0.add(DMIN)), half(p1.add(DMIN))),
        )
    }

    #[inline(always)]
    unsafe fn chunk(&self, b: usize, c: usize) -> (__m512i, __m512i) {
        let at = b * GROUP_BLOCK + QS + 32 * c;
        let x = join512(
            _mm256_loadu_si256(self.g0.as_ptr().add(at) as *const __m256i),
            _mm256_loadu_si256(self.g1.as_ptr().add(at) as *const __m256i),
        );
        let m4 = _mm512_set1_epi8(0x0F);
        (
            _mm512_and_si512(x, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4),
        )
    }
}

/// Rows decoded once for a batch of activation rows: per super-block, the
/// chunks' nibbles as bytes, the scales and mins as [`Blocks::scales`] gives
/// them, and `d`/`dmin`. [`Decoded16`] on AVX-512, [`Decoded8`] on AVX2.
pub(crate) struct Decoded<I, F> {
    /// `[b][c][half]`: chunk `c`'s low (`half` 0) or high nibbles.
    vals: Vec<I>,
    /// `[b][j]`: scales, then `[b][8 + j]`: mins.
    scales: Vec<I>,
    /// `[b]`: `(d, dmin)`.
    d: Vec<(F, F)>,
}

/// Two groups (sixteen rows) decoded for more than four activation rows.
pub(crate) type Decoded16 = Decoded<__m512i, __m512>;
/// One group (eight rows) decoded for more than one activation row.
pub(crate) type Decoded8 = Decoded<__m256i, __m256>;

impl<I: Copy, F: Copy> Blocks for Decoded<I, F> {
    type I = I;
    type F = F;

    #[inline(always)]
    unsafe fn scales(&self, b: usize, sc: &mut [I; 8], mn: &mut [I; 8]) {
        let s = self.scales.get_unchecked(16 * b..16 * b + 16);
        sc.copy_from_slice(&s[..8]);
        mn.copy_from_slice(&s[8..]);
    }

    #[inline(always)]
    unsafe fn d(&self, b: usize) -> (F, F) {
        *self.d.get_unchecked(b)
    }

    #[inline(always)]
    unsafe fn chunk(&self, b: usize, c: usize) -> (I, I) {
        let at = 64 * b + 2 * c;
        (
            *self.vals.get_unchecked(at),
            *self.vals.get_unchecked(at + 1),
        )
    }
}

impl<I: Copy, F: Copy> Decoded<I, F> {
    pub(crate) fn new() -> Self {
        Self {
            vals: Vec::new(),
            scales: Vec::new(),
            d: Vec::new(),
        }
    }

    /// Decodes `nb` super-blocks of `w` (`zero`: a zero vector of each
    /// kind); inlined into the callers' `target_feature` functions.
    #[inline(always)]
    unsafe fn fill<W: Blocks<I = I, F = F>>(&mut self, w: &W, nb: usize, zero: (I, F)) {
        self.vals.resize(64 * nb, zero.0);
        self.scales.resize(16 * nb, zero.0);
        self.d.resize(nb, (zero.1, zero.1));
        let (mut sc, mut mn) = ([zero.0; 8], [zero.0; 8]);
        for b in 0..nb {
            w.scales(b, &mut sc, &mut mn);
            self.scales[16 * b..16 * b + 8].copy_from_slice(&sc);
            self.scales[16 * b + 8..16 * b + 16].copy_from_slice(&mn);
            self.d[b] = w.d(b);
            for c in 0..32 {
                let (lo, hi) = w.chunk(b, c);
                self.vals[64 * b + 2 * c] = lo;
                self.vals[64 * b + 2 * c + 1] = hi;
            }
        }
    }
}

impl Decoded16 {
    /// Decodes groups `g0` and `g1` of `nb` super-blocks each.
    ///
    /// Only where `CpuCaps::has_avx512()`.
    pub(crate) fn decode(&mut self, g0: &[u8], g1: &[u8], nb: usize) {
        assert!(
            g0.len() >= nb * GROUP_BLOCK && g1.len() >= nb * GROUP_BLOCK,
            "interleaved Q4_K group too short"
        );
        // SAFETY: as in `dot16`; bounds checked above.
        unsafe { self.decode_512(&Raw16 { g0, g1 }, nb) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode_512(&mut self, w: &Raw16, nb: usize) {
        self.fill(w, nb, (_mm512_setzero_si512(), _mm512_setzero_ps()));
    }

    /// The decoded rows against one to four activation rows, as [`dot16`].
    pub(crate) fn dot(&self, a: &[&[BlockQ8K]], out: &mut [[f32; 16]], gemm: bool) {
        assert!(
            (1..=4).contains(&a.len())
                && a.len() == out.len()
                && a.iter().all(|a| a.len() == self.d.len()),
            "decoded Q4_K groups and activation rows disagree"
        );
        // SAFETY: as in `decode`; lengths checked above.
        unsafe { tile16_any(self, a, out, gemm) }
    }
}

/// [`tile16`] for `a.len()` rows and `gemm`.
#[inline(always)]
unsafe fn tile16_any<W: Blocks<I = __m512i, F = __m512>>(
    w: &W,
    a: &[&[BlockQ8K]],
    out: &mut [[f32; 16]],
    gemm: bool,
) {
    match (a.len(), gemm) {
        (4, false) => tile16::<_, 4, false>(w, a, out),
        (4, true) => tile16::<_, 4, true>(w, a, out),
        (3, false) => tile16::<_, 3, false>(w, a, out),
        (3, true) => tile16::<_, 3, true>(w, a, out),
        (2, false) => tile16::<_, 2, false>(w, a, out),
        (2, true) => tile16::<_, 2, true>(w, a, out),
        (_, false) => tile16::<_, 1, false>(w, a, out),
        (_, true) => tile16::<_, 1, true>(w, a, out),
    }
}

/// Activation bytes `at..at + 4` of `y` in every i32 lane.
#[inline(always)]
unsafe fn act16(y: &BlockQ8K, at: usize) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(y.qs.as_ptr().add(at) as *const i32))
}

/// `bsums[2j]` and `bsums[2j + 1]` of `y` as the two halves of every i32
/// lane.
#[inline(always)]
unsafe fn bsums16(y: &BlockQ8K, j: usize) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(
        y.bsums.as_ptr().add(2 * j) as *const i32
    ))
}

/// Sixteen rows (`g0` then `g1`, `nb` super-blocks each) against one to
/// four activation rows `a[t]`, row `t`'s results in `out[t]`, read in
/// place: ggml's repack order, its gemm's where `gemm` (module docs).
///
/// Only where `CpuCaps::has_avx512()`.
pub(crate) fn dot16(g0: &[u8], g1: &[u8], a: &[&[BlockQ8K]], out: &mut [[f32; 16]], gemm: bool) {
    let nb = a.first().map_or(0, |a| a.len());
    assert!(
        g0.len() >= nb * GROUP_BLOCK
            && g1.len() >= nb * GROUP_BLOCK
            && (1..=4).contains(&a.len())
            && a.len() == out.len()
            && a.iter().all(|a| a.len() == nb),
        "interleaved Q4_K groups and activation rows disagree"
    );
    let w = Raw16 { g0, g1 };
    // SAFETY: `layout` hands these kernels out only when the CPU has
    // AVX-512 F/BW/VL/VNNI; bounds checked above.
    unsafe { tile16_any(&w, a, out, gemm) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile16<W: Blocks<I = __m512i, F = __m512>, const N: usize, const GEMM: bool>(
    w: &W,
    a: &[&[BlockQ8K]],
    out: &mut [[f32; 16]],
) {
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); N];
    let mut acc_min = [_mm512_setzero_ps(); N];
    let (mut sc, mut mn) = ([zero; 8], [zero; 8]);
    for b in 0..a[0].len() {
        w.scales(b, &mut sc, &mut mn);
        let (d, dmin) = w.d(b);
        // `acc += f32(isum) * d * d_a`, `acc_min += f32(imin) * dmin * d_a`
        // for activation row `t`.
        let fma = |acc: &mut [__m512; N], acc_min: &mut [__m512; N], t: usize, isum, imin| {
            let da = _mm512_set1_ps(a[t].get_unchecked(b).d);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, da), acc[t]);
            acc_min[t] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(imin),
                _mm512_mul_ps(dmin, da),
                acc_min[t],
            );
        };
        // `Σ_j mn_j · (bsums[2j] + bsums[2j + 1])` over `js` for row `t`.
        let mins = |t: usize, js: std::ops::Range<usize>| {
            let y = a[t].get_unchecked(b);
            js.fold(zero, |imin, j| {
                _mm512_dpwssd_epi32(imin, mn[j], bsums16(y, j))
            })
        };
        let mut isum = [zero; N];
        for i in 0..4 {
            let (mut s_lo, mut s_hi) = ([zero; N], [zero; N]);
            for c in 0..8 {
                let (lo, hi) = w.chunk(b, 8 * i + c);
                for t in 0..N {
                    let y = a[t].get_unchecked(b);
                    s_lo[t] = _mm512_dpbusd_epi32(s_lo[t], lo, act16(y, 64 * i + 4 * c));
                    s_hi[t] = _mm512_dpbusd_epi32(s_hi[t], hi, act16(y, 64 * i + 32 + 4 * c));
                }
            }
            for t in 0..N {
                let lo = _mm512_mullo_epi32(s_lo[t], sc[2 * i]);
                let hi = _mm512_mullo_epi32(s_hi[t], sc[2 * i + 1]);
                let sum = _mm512_add_epi32(lo, hi);
                if GEMM {
                    fma(&mut acc, &mut acc_min, t, sum, mins(t, 2 * i..2 * i + 2));
                } else {
                    isum[t] = _mm512_add_epi32(isum[t], sum);
                }
            }
        }
        if !GEMM {
            for (t, &isum) in isum.iter().enumerate() {
                fma(&mut acc, &mut acc_min, t, isum, mins(t, 0..8));
            }
        }
    }
    for t in 0..N {
        _mm512_storeu_ps(out[t].as_mut_ptr(), _mm512_sub_ps(acc[t], acc_min[t]));
    }
}

/// One group (`g`, `a.len()` super-blocks) against one activation row,
/// read in place, on AVX2 (`maddubs` sums in 16 bits per sub-block, as
/// ggml's AVX2 kernels do, then `madd` by the scales): ggml's repack order,
/// its gemm's where `gemm`.
///
/// Only where `CpuCaps::has_avx2()`.
pub(crate) fn dot8(g: &[u8], a: &[BlockQ8K], out: &mut [f32; 8], gemm: bool) {
    assert!(
        g.len() >= a.len() * GROUP_BLOCK,
        "interleaved Q4_K group too short"
    );
    // SAFETY: `layout` hands these kernels out only when the CPU has
    // AVX2 + FMA + F16C; bounds checked above.
    unsafe { row8_any(&Raw8(g), a, out, gemm) }
}

/// [`row8`] for `gemm`.
#[inline(always)]
unsafe fn row8_any<W: Blocks<I = __m256i, F = __m256>>(
    w: &W,
    a: &[BlockQ8K],
    out: &mut [f32; 8],
    gemm: bool,
) {
    if gemm {
        row8::<W, true>(w, a, out)
    } else {
        row8::<W, false>(w, a, out)
    }
}

/// One group read in place.
struct Raw8<'a>(&'a [u8]);

/// Both nibbles of 16 bytes as 32 bytes (byte `2i`: the low nibble of byte
/// `i`, byte `2i + 1`: its high nibble).
#[inline(always)]
unsafe fn nibble_pairs(p: *const u8) -> __m256i {
    let w = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
    _mm256_or_si256(
        _mm256_and_si256(w, _mm256_set1_epi16(0x000F)),
        _mm256_and_si256(_mm256_slli_epi16::<4>(w), _mm256_set1_epi16(0x0F00)),
    )
}

impl Blocks for Raw8<'_> {
    type I = __m256i;
    type F = __m256;

    #[inline(always)]
    unsafe fn scales(&self, b: usize, sc: &mut [__m256i; 8], mn: &mut [__m256i; 8]) {
        let p = self.0.as_ptr().add(b * GROUP_BLOCK);
        let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        // Scales (bytes[0]) and mins (bytes[1]) of entry 8j + r.
        let mut bytes = [[0u8; 64]; 2];
        for h in 0..2 {
            let lo = _mm256_loadu_si256(p.add(SCALES_LO + 32 * h) as *const __m256i);
            let hi = nibble_pairs(p.add(SCALES_HI + 16 * h));
            let s = _mm256_or_si256(
                _mm256_and_si256(lo, m4),
                _mm256_and_si256(_mm256_slli_epi16::<4>(hi), m30),
            );
            let m = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(lo), m4),
                _mm256_and_si256(_mm256_slli_epi16::<2>(hi), m30),
            );
            _mm256_storeu_si256(bytes[0].as_mut_ptr().add(32 * h) as *mut __m256i, s);
            _mm256_storeu_si256(bytes[1].as_mut_ptr().add(32 * h) as *mut __m256i, m);
        }
        let pairs = |v: &[u8; 64], j: usize| {
            let x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(v.as_ptr().add(8 * j) as *const __m128i));
            _mm256_or_si256(x, _mm256_slli_epi32::<16>(x))
        };
        for j in 0..8 {
            sc[j] = pairs(&bytes[0], j);
            mn[j] = pairs(&bytes[1], j);
        }
    }

    #[inline(always)]
    unsafe fn d(&self, b: usize) -> (__m256, __m256) {
        let p = self.0.as_ptr().add(b * GROUP_BLOCK);
        (
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(DMIN) as *const __m128i)),
        )
    }

    #[inline(always)]
    unsafe fn chunk(&self, b: usize, c: usize) -> (__m256i, __m256i) {
        let p = self.0.as_ptr().add(b * GROUP_BLOCK + QS + 32 * c);
        let x = _mm256_loadu_si256(p as *const __m256i);
        let m4 = _mm256_set1_epi8(0x0F);
        (
            _mm256_and_si256(x, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4),
        )
    }
}

impl Decoded8 {
    /// Decodes group `g` of `nb` super-blocks.
    ///
    /// Only where `CpuCaps::has_avx2()`.
    pub(crate) fn decode(&mut self, g: &[u8], nb: usize) {
        assert!(
            g.len() >= nb * GROUP_BLOCK,
            "interleaved Q4_K group too short"
        );
        // SAFETY: as in `dot8`; bounds checked above.
        unsafe { self.decode_avx2(&Raw8(g), nb) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode_avx2(&mut self, w: &Raw8, nb: usize) {
        self.fill(w, nb, (_mm256_setzero_si256(), _mm256_setzero_ps()));
    }

    /// The decoded rows against activation row `a`, as [`dot8`].
    pub(crate) fn dot(&self, a: &[BlockQ8K], out: &mut [f32; 8], gemm: bool) {
        assert_eq!(
            a.len(),
            self.d.len(),
            "decoded Q4_K group and activation row disagree"
        );
        // SAFETY: as in `decode`; lengths checked above.
        unsafe { row8_any(self, a, out, gemm) }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row8<W: Blocks<I = __m256i, F = __m256>, const GEMM: bool>(
    w: &W,
    a: &[BlockQ8K],
    out: &mut [f32; 8],
) {
    let zero = _mm256_setzero_si256();
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = _mm256_setzero_ps();
    let (mut sc, mut mn) = ([zero; 8], [zero; 8]);
    for (b, y) in a.iter().enumerate() {
        w.scales(b, &mut sc, &mut mn);
        let act = |at: usize| {
            _mm256_set1_epi32(std::ptr::read_unaligned(y.qs.as_ptr().add(at) as *const i32))
        };
        // `Σ_j mn_j · (bsums[2j] + bsums[2j + 1])` over `js`.
        let mins = |js: std::ops::Range<usize>| {
            js.fold(zero, |imin, j| {
                let bs = std::ptr::read_unaligned(y.bsums.as_ptr().add(2 * j) as *const i32);
                _mm256_add_epi32(imin, _mm256_madd_epi16(mn[j], _mm256_set1_epi32(bs)))
            })
        };
        let (d, dmin) = w.d(b);
        let da = _mm256_set1_ps(y.d);
        let (dd, dm) = (_mm256_mul_ps(d, da), _mm256_mul_ps(dmin, da));
        let mut isum = zero;
        for i in 0..4 {
            let (mut s_lo, mut s_hi) = (zero, zero);
            for c in 0..8 {
                let (lo, hi) = w.chunk(b, 8 * i + c);
                s_lo = _mm256_add_epi16(s_lo, _mm256_maddubs_epi16(lo, act(64 * i + 4 * c)));
                s_hi = _mm256_add_epi16(s_hi, _mm256_maddubs_epi16(hi, act(64 * i + 32 + 4 * c)));
            }
            let sum = _mm256_add_epi32(
                _mm256_madd_epi16(s_lo, sc[2 * i]),
                _mm256_madd_epi16(s_hi, sc[2 * i + 1]),
            );
            if GEMM {
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), dd, acc);
                let imin = mins(2 * i..2 * i + 2);
                acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), dm, acc_min);
            } else {
                isum = _mm256_add_epi32(isum, sum);
            }
        }
        if !GEMM {
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc);
            acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins(0..8)), dm, acc_min);
        }
    }
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_sub_ps(acc, acc_min));
}
