//! IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S against Q8_K on AVX-512 (F +
//! BW + VL + VNNI) CPUs: the i32 lanes of ggml's AVX2
//! `ggml_vec_dot_iq{2,3}_*_q8_K` (see iq2.rs, iq3.rs) from fewer
//! instructions, then their float steps, so ggml's bits.
//!
//! Each format is a [`SignedGrid`]: its codes are grid magnitudes, each
//! with a sign bit, and a scale per 16 or 32 codes. Per super-block it
//! prepares what its steps read (IQ2_XXS: the 64 bytes of `qs` split once
//! into grid indices and sign words with `vpcompressd`; the 7-bit sign
//! fields of IQ2_XXS, IQ2_XS and IQ3_XXS become ggml's sign bytes
//! `KSIGNS_IQ2XS`, seven bits and their parity) and its 16 scales. Each
//! step covers two 32-code sub-blocks: their grid points in one gather and
//! their 64 sign bits, which are directly the mask of a masked negation of
//! the activations, in place of ggml's `_mm256_sign_epi8` against 8-byte
//! table entries (the same bytes, -128 included). Then `maddubs` (grid
//! bytes of at most 62: no saturation) and `vpdpwssd` by each 16 codes'
//! `2 s + 1`. The lanes are ggml's `sumi1 + sumi2`; one FMA per super-block
//! and ggml's `hsum_float_8` follow. ggml_tiled.rs decodes the same steps
//! into its tiles.

use super::super::iq_tables::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use super::super::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockQ8K, QK_K};
use super::iq2::{scales_16, PARITY_80};
use super::{h2f, hsum_ps};
use half::f16;
use std::arch::x86_64::*;

/// An i-quant whose codes are grid magnitudes with a sign each, read 64
/// codes (two sub-blocks) per step.
pub(crate) trait SignedGrid {
    /// What a super-block's steps read, prepared once.
    type Prep;
    /// ggml's factor on the row's sum.
    const FACTOR: f32;
    fn d(&self) -> f16;
    /// The prepared parts, and the 16 scales `2 s + 1` (one per 16 codes)
    /// in both 16-bit halves of 32-bit lanes.
    /// # Safety
    /// AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C.
    unsafe fn prep(&self) -> (Self::Prep, __m512i);
    /// Step `j`'s 64 grid magnitudes and sign bits (bit `k`: code
    /// `64 j + k` is negative).
    /// # Safety
    /// As [`SignedGrid::prep`]; `j < 4`.
    unsafe fn step(&self, p: &Self::Prep, j: usize) -> (__m512i, u64);
}

macro_rules! dots {
    ($($name:ident, $inner:ident: $b:ty;)*) => {$(
        pub(crate) fn $name(_n: usize, w: &[$b], a: &[BlockQ8K]) -> f32 {
            // SAFETY: only selected when CpuCaps::has_avx512().
            unsafe { $inner(w, a) }
        }

        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $inner(w: &[$b], a: &[BlockQ8K]) -> f32 {
            dot::<$b>(w, a)
        }
    )*};
}

dots! {
    dot_iq2_xxs_512, dot_iq2_xxs_vnni: BlockIQ2XXS;
    dot_iq2_xs_512, dot_iq2_xs_vnni: BlockIQ2XS;
    dot_iq2_s_512, dot_iq2_s_vnni: BlockIQ2S;
    dot_iq3_xxs_512, dot_iq3_xxs_vnni: BlockIQ3XXS;
    dot_iq3_s_512, dot_iq3_s_vnni: BlockIQ3S;
}

/// The body of the dots above; inlined into their `target_feature`
/// functions.
#[inline(always)]
unsafe fn dot<B: SignedGrid>(w: &[B], a: &[BlockQ8K]) -> f32 {
    let zero = _mm512_setzero_si512();
    let scale_at = quarter_scales();
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = h2f(x.d()) * y.d;
        let (p, scales) = x.prep();
        let mut sumi = _mm512_setzero_si512();
        for (j, scale_j) in scale_at.iter().enumerate() {
            let (g, signs) = x.step(&p, j);
            let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(64 * j) as *const _);
            let q8s = _mm512_mask_sub_epi8(q8, signs, zero, q8);
            let dot = _mm512_maddubs_epi16(g, q8s);
            sumi = _mm512_dpwssd_epi32(sumi, dot, _mm512_permutexvar_epi32(*scale_j, scales));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), halves(sumi), acc);
    }
    let sum = hsum_ps(acc);
    if B::FACTOR == 1.0 {
        sum
    } else {
        B::FACTOR * sum
    }
}

/// Step j's scales for a scale per 16 codes (4 lanes each): 4j, 4j + 1,
/// 4j + 2, 4j + 3.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn quarter_scales() -> [__m512i; 4] {
    std::array::from_fn(|j| {
        let j = 4 * j as i32;
        let (a, b, c, d) = (j, j + 1, j + 2, j + 3);
        _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d)
    })
}

/// `2 s + 1` of each 32-bit lane's `s` in both its 16-bit halves.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn odd_pairs(s: __m512i) -> __m512i {
    let s = _mm512_add_epi32(_mm512_slli_epi32(s, 1), _mm512_set1_epi32(1));
    _mm512_or_si512(s, _mm512_slli_epi32(s, 16))
}

/// [`odd_pairs`] of the 8 sub-block scales in lanes 0..8, each for its two
/// groups of 16 codes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn sub_block_pairs(s: __m512i) -> __m512i {
    let twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    odd_pairs(_mm512_permutexvar_epi32(twice, s))
}

/// ggml's `sumi1 + sumi2`: the two halves' lanes added, as floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn halves(v: __m512i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_add_epi32(
        _mm512_castsi512_si256(v),
        _mm512_extracti64x4_epi64(v, 1),
    ))
}

/// ggml's sign bytes (`KSIGNS_IQ2XS`) of the sign words in `sw`: byte `l`
/// of each 32-bit lane is its bits `7 l..7 l + 7`, with their parity as
/// bit 7 (the eighth sign, which makes the minus signs even in number).
/// Bits 28.. of each lane (a scale) are ignored.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn sign_bytes(sw: __m512i) -> __m512i {
    let low4 = _mm512_set1_epi8(0x0F);
    let parity = _mm512_broadcast_i32x4(_mm_loadu_si128(PARITY_80.as_ptr() as *const __m128i));
    let m7 = |shift: u32| _mm512_set1_epi32(0x7F << (8 * shift));
    let fields = _mm512_or_si512(
        _mm512_or_si512(
            _mm512_and_si512(sw, m7(0)),
            _mm512_and_si512(_mm512_slli_epi32(sw, 1), m7(1)),
        ),
        _mm512_or_si512(
            _mm512_and_si512(_mm512_slli_epi32(sw, 2), m7(2)),
            _mm512_and_si512(_mm512_slli_epi32(sw, 3), m7(3)),
        ),
    );
    let odd = _mm512_xor_si512(
        _mm512_shuffle_epi8(parity, _mm512_and_si512(fields, low4)),
        _mm512_shuffle_epi8(parity, _mm512_and_si512(_mm512_srli_epi16(fields, 4), low4)),
    );
    _mm512_or_si512(fields, odd)
}

/// The low 256 bits of `v` as four words.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn words(v: __m256i) -> [u64; 4] {
    let mut w = [0u64; 4];
    _mm256_storeu_si256(w.as_mut_ptr() as *mut __m256i, v);
    w
}

/// The 16 scales of IQ2_XS / IQ2_S: a nibble per 16 codes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn nibble_pairs(scales: &[u8; 8]) -> __m512i {
    let s = _mm512_cvtepu8_epi32(scales_16(scales));
    _mm512_or_si512(s, _mm512_slli_epi32(s, 16))
}

/// IQ2_XXS: u32 word `2 ib` of `qs` holds sub-block ib's four grid indices,
/// word `2 ib + 1` its four 7-bit sign fields and its 4-bit scale.
impl SignedGrid for BlockIQ2XXS {
    /// The steps' grid indices (a byte each) and sign bits.
    type Prep = ([u64; 4], [u64; 4]);
    const FACTOR: f32 = 0.125;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prep(&self) -> (Self::Prep, __m512i) {
        let q = _mm512_loadu_si512(self.qs.as_ptr() as *const _);
        let index = _mm512_maskz_compress_epi32(0x5555, q);
        let sw = _mm512_maskz_compress_epi32(0xAAAA, q);
        let signs = words(_mm512_castsi512_si256(sign_bytes(sw)));
        let index = words(_mm512_castsi512_si256(index));
        ((index, signs), sub_block_pairs(_mm512_srli_epi32(sw, 28)))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step(&self, p: &Self::Prep, j: usize) -> (__m512i, u64) {
        let gi = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128(p.0[j] as i64));
        let g = _mm512_i64gather_epi64::<8>(gi, IQ2XXS_GRID.as_ptr() as *const i64);
        (g, p.1[j])
    }
}

/// IQ2_XS: each 16-bit `qs` word is a 9-bit grid index and 7 sign bits.
impl SignedGrid for BlockIQ2XS {
    /// The 32 grid indices and the steps' sign bits.
    type Prep = ([u16; 32], [u64; 4]);
    const FACTOR: f32 = 0.125;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prep(&self) -> (Self::Prep, __m512i) {
        let q = _mm512_loadu_si512(self.qs.as_ptr() as *const _);
        let mut index = [0u16; 32];
        _mm512_storeu_si512(
            index.as_mut_ptr() as *mut _,
            _mm512_and_si512(q, _mm512_set1_epi16(511)),
        );
        // The seven sign bits, and their parity as bit 7: the xor folds
        // bits 4-6 onto 0-2, the shuffle reads 4-bit parity.
        let parity = _mm512_broadcast_i32x4(_mm_loadu_si128(PARITY_80.as_ptr() as *const __m128i));
        let partial = _mm512_srli_epi16(q, 9);
        let folded = _mm512_xor_si512(partial, _mm512_srli_epi16(q, 13));
        let full = _mm512_or_si512(partial, _mm512_shuffle_epi8(parity, folded));
        let signs = words(_mm512_cvtepi16_epi8(full));
        ((index, signs), nibble_pairs(&self.scales))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step(&self, p: &Self::Prep, j: usize) -> (__m512i, u64) {
        let gi = _mm512_cvtepu16_epi64(_mm_loadu_si128(p.0.as_ptr().add(8 * j) as *const __m128i));
        let g = _mm512_i64gather_epi64::<8>(gi, IQ2XS_GRID.as_ptr() as *const i64);
        (g, p.1[j])
    }
}

/// IQ2_S: group k's 10-bit index is `qs[k]` and 2 bits of `qh`; the sign
/// bits (one per code) follow the indices in `qs`.
impl SignedGrid for BlockIQ2S {
    type Prep = ();
    const FACTOR: f32 = 0.125;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prep(&self) -> ((), __m512i) {
        ((), nibble_pairs(&self.scales))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step(&self, _: &(), j: usize) -> (__m512i, u64) {
        let s = u64::from_le_bytes(self.qs[32 + 8 * j..40 + 8 * j].try_into().unwrap_or([0; 8]));
        // Group k of the two sub-blocks: bits 2k, 2k + 1 of these qh bytes.
        let qh = u16::from_le_bytes([self.qh[2 * j], self.qh[2 * j + 1]]);
        let shifts = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
        let high = _mm512_srlv_epi64(_mm512_set1_epi64(qh as i64), shifts);
        let high = _mm512_slli_epi64(_mm512_and_si512(high, _mm512_set1_epi64(3)), 8);
        let low = _mm512_cvtepu8_epi64(_mm_loadl_epi64(
            self.qs.as_ptr().add(8 * j) as *const __m128i
        ));
        let g = _mm512_i64gather_epi64::<8>(
            _mm512_or_si512(low, high),
            IQ2S_GRID.as_ptr() as *const i64,
        );
        (g, s)
    }
}

/// IQ3_XXS: 64 grid indices of 4 magnitudes, then one word per sub-block:
/// four 7-bit sign fields and the 4-bit scale.
impl SignedGrid for BlockIQ3XXS {
    /// The steps' sign bits.
    type Prep = [u64; 4];
    const FACTOR: f32 = 0.25;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prep(&self) -> (Self::Prep, __m512i) {
        let sw = _mm512_zextsi256_si512(_mm256_loadu_si256(
            self.qs.as_ptr().add(QK_K / 4) as *const __m256i
        ));
        let signs = words(_mm512_castsi512_si256(sign_bytes(sw)));
        (signs, sub_block_pairs(_mm512_srli_epi32(sw, 28)))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step(&self, p: &Self::Prep, j: usize) -> (__m512i, u64) {
        let gi = _mm512_cvtepu8_epi32(_mm_loadu_si128(
            self.qs.as_ptr().add(16 * j) as *const __m128i
        ));
        let g = _mm512_i32gather_epi32::<4>(gi, IQ3XXS_GRID.as_ptr() as *const i32);
        (g, p[j])
    }
}

/// IQ3_S: index k is `qs[k]` and bit k of `qh` as its ninth bit; a sign bit
/// per code; sub-block ib's scale is nibble `ib % 2` of `scales[ib / 2]`.
impl SignedGrid for BlockIQ3S {
    type Prep = ();
    const FACTOR: f32 = 1.0;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prep(&self) -> ((), __m512i) {
        let sc = _mm512_zextsi256_si512(_mm256_cvtepu8_epi32(_mm_cvtsi32_si128(
            i32::from_le_bytes(self.scales),
        )));
        let pick = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0);
        let shift = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0);
        let sc = _mm512_srlv_epi32(_mm512_permutexvar_epi32(pick, sc), shift);
        (
            (),
            sub_block_pairs(_mm512_and_si512(sc, _mm512_set1_epi32(0xF))),
        )
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn step(&self, _: &(), j: usize) -> (__m512i, u64) {
        let s = u64::from_le_bytes(self.signs[8 * j..8 * j + 8].try_into().unwrap_or([0; 8]));
        let low = _mm512_cvtepu8_epi32(_mm_loadu_si128(
            self.qs.as_ptr().add(16 * j) as *const __m128i
        ));
        let high = u16::from_le_bytes([self.qh[2 * j], self.qh[2 * j + 1]]);
        let gi = _mm512_mask_or_epi32(low, high, low, _mm512_set1_epi32(256));
        let g = _mm512_i32gather_epi32::<4>(gi, IQ3S_GRID.as_ptr() as *const i32);
        (g, s)
    }
}
