//! AVX2 + FMA + F16C dot kernels (x86_64).
//!
//! Each public function here is a safe wrapper over a `#[target_feature]`
//! kernel. They are only handed out by `GgmlBlock::simd_dot` when
//! [`CpuCaps::has_avx2`](super::CpuCaps::has_avx2) is true (the `_pdep`
//! ones also need [`CpuCaps::bmi2`](super::CpuCaps::bmi2)), which is what
//! makes the `unsafe` calls sound; nothing else in the crate calls them.
//!
//! Integer work per block is exact (the same integers as the reference
//! kernels); only the float accumulation order differs (8 f32 lanes, summed
//! at the end), as in ggml's AVX2 code. Q8 activation quants are assumed to
//! be in `[-127, 127]` (the sign trick of `mul_sum_i8_pairs`).

use super::common::{e8m0_to_f32_half, KVALUES_IQ4NL, KVALUES_MXFP4};
use super::{
    BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockNVFP4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0,
    BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use half::{bf16, f16};
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn h2f(h: f16) -> f32 {
    // `vmovd` then `vcvtph2ps`: `vmovd` writes the whole register, so the
    // conversion starts no dependency on whatever the register held before
    // (a `vpinsrw`, as `f16::to_f32` compiles, would chain every block onto
    // the previous block's FMA; `half`'s integer fallback branches).
    // LLVM turns the intrinsics' `vmovd` back into a `vpinsrw` (only lane 0
    // is live), hence the two instructions in `asm!`.
    let v: __m128;
    std::arch::asm!(
        "vmovd {v}, {h:e}",
        "vcvtph2ps {v}, {v}",
        h = in(reg) h.to_bits() as u32,
        v = out(xmm_reg) v,
        options(pure, nomem, nostack, preserves_flags),
    );
    _mm_cvtss_f32(v)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// 32 nibbles -> 32 bytes in element order (low nibbles of the 16 bytes are
/// elements 0..16, high nibbles 16..32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles_32(qs: &[u8; 16]) -> __m256i {
    // The 16 bytes in both lanes straight from memory, the high lane then
    // shifted by 4: no lane-crossing insert (port 5 bounds these loops).
    let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs.as_ptr() as *const __m128i));
    let b = _mm256_srlv_epi64(t, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(b, _mm256_set1_epi8(0x0F))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load32(p: &[i8]) -> __m256i {
    debug_assert!(p.len() >= 32);
    _mm256_loadu_si256(p.as_ptr() as *const __m256i)
}

/// Sum of adjacent products of signed bytes, as 8 i32 lanes. `y` must not
/// hold -128 where `x` is negative (sign trick).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mul_sum_i8_pairs(x: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// Sum of adjacent products of unsigned `x` (< 128) and signed `y`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mul_sum_u8_i8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// How the 32-weight kernels sum each four byte products into an i32 lane:
/// AVX2's `maddubs` + `madd` by ones ([`Madd`]) or AVX-512 VNNI's one
/// `vpdpbusd` (`simd_x86_512::Vnni`). Both give the same integers, so a
/// kernel body generic over them gives the same bits either way (ggml's
/// `mul_sum_i8_pairs_float` switches the same way in its VNNI build).
pub(super) trait LaneSums {
    /// Signed `x` by signed `y` in `[-127, 127]` (the sign trick).
    unsafe fn i8_pairs(x: __m256i, y: __m256i) -> __m256i;
    /// Unsigned `x` (< 128) by signed `y`.
    unsafe fn u8_i8(x: __m256i, y: __m256i) -> __m256i;
    /// `acc + u8_i8(x, y)`, lane by lane.
    unsafe fn u8_i8_acc(acc: __m256i, x: __m256i, y: __m256i) -> __m256i;
}

/// [`LaneSums`] with AVX2 instructions.
pub(super) struct Madd;
impl LaneSums for Madd {
    #[inline(always)]
    unsafe fn i8_pairs(x: __m256i, y: __m256i) -> __m256i {
        mul_sum_i8_pairs(x, y)
    }
    #[inline(always)]
    unsafe fn u8_i8(x: __m256i, y: __m256i) -> __m256i {
        mul_sum_u8_i8(x, y)
    }
    #[inline(always)]
    unsafe fn u8_i8_acc(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_add_epi32(acc, mul_sum_u8_i8(x, y))
    }
}

macro_rules! safe_wrapper {
    ($name:ident, $inner:ident, $w:ty, $a:ty) => {
        pub(crate) fn $name(_n: usize, w: &[$w], a: &[$a]) -> f32 {
            // SAFETY: only selected when CpuCaps::has_avx2() (and, for the
            // `_pdep` kernels, CpuCaps::bmi2; see module docs).
            unsafe { $inner(w, a) }
        }
    };
}

safe_wrapper!(dot_f32, dot_f32_avx2, f32, f32);
safe_wrapper!(dot_f16, dot_f16_avx2, f16, f16);
safe_wrapper!(dot_bf16, dot_bf16_avx2, bf16, bf16);
safe_wrapper!(dot_q4_0, dot_q4_0_avx2, BlockQ4_0, BlockQ8_0);
safe_wrapper!(dot_q4_1, dot_q4_1_avx2, BlockQ4_1, BlockQ8_1);
safe_wrapper!(dot_q8_0, dot_q8_0_avx2, BlockQ8_0, BlockQ8_0);
safe_wrapper!(dot_mxfp4, dot_mxfp4_avx2, BlockMXFP4, BlockQ8_0);
safe_wrapper!(dot_iq4_nl, dot_iq4_nl_avx2, BlockIQ4NL, BlockQ8_0);
safe_wrapper!(dot_q4_k, dot_q4_k_avx2, BlockQ4K, BlockQ8K);
safe_wrapper!(dot_q6_k, dot_q6_k_avx2, BlockQ6K, BlockQ8K);
safe_wrapper!(dot_q5_0, dot_q5_0_avx2, BlockQ5_0, BlockQ8_0);
safe_wrapper!(dot_q5_1, dot_q5_1_avx2, BlockQ5_1, BlockQ8_1);
safe_wrapper!(dot_q2_k, dot_q2_k_avx2, BlockQ2K, BlockQ8K);
safe_wrapper!(dot_q3_k, dot_q3_k_avx2, BlockQ3K, BlockQ8K);
safe_wrapper!(dot_q5_k, dot_q5_k_avx2, BlockQ5K, BlockQ8K);
safe_wrapper!(dot_iq4_xs, dot_iq4_xs_avx2, BlockIQ4XS, BlockQ8K);
safe_wrapper!(dot_nvfp4, dot_nvfp4_avx2, BlockNVFP4, BlockQ8_0);

mod nvfp4;
pub(crate) mod packed;
pub(crate) mod packed_iq4xs;
pub(crate) mod packed_k;
pub(crate) mod packed_q2k;
pub(crate) mod packed_q6k;
use nvfp4::dot_nvfp4_avx2;
pub(super) use nvfp4::dot_nvfp4_with;
pub(crate) use nvfp4::pair_nvfp4_512;
mod iq_tiles;
pub(crate) use iq_tiles::{tile_iq1_m, tile_iq1_s, tile_iq3_s, tile_iq3_xxs, tile_nvfp4};

/// Shared float loop: `load(i)` gives 8 f32 from element `i`.
macro_rules! float_dot {
    ($w:ident, $a:ident, $load:expr, $conv:expr) => {{
        let n = $w.len().min($a.len());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                let x = $load($w.as_ptr().add(i + 8 * k));
                let y = $load($a.as_ptr().add(i + 8 * k));
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps($load($w.as_ptr().add(i)), $load($a.as_ptr().add(i)), acc[0]);
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut sum = hsum_ps(s);
        while i < n {
            sum += $conv($w[i]) * $conv($a[i]);
            i += 1;
        }
        sum
    }};
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32_avx2(w: &[f32], a: &[f32]) -> f32 {
    float_dot!(w, a, |p: *const f32| _mm256_loadu_ps(p), |v: f32| v)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_avx2(w: &[f16], a: &[f16]) -> f32 {
    float_dot!(
        w,
        a,
        |p: *const f16| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        |v: f16| h2f(v)
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16_avx2(w: &[bf16], a: &[bf16]) -> f32 {
    float_dot!(
        w,
        a,
        |p: *const bf16| {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
        },
        |v: bf16| super::float::bf16_to_f32(v)
    )
}

/// The f16 scale fields of a 32-weight block and its activation block:
/// `[dx, dy, mx, sy]`, giving `d = dx * dy` and (Q4_1 / Q5_1) `m = mx * sy`;
/// `extra` multiplies `d` (MXFP4's E8M0 scale, whose `dx` is 1).
pub(super) trait BlockScales<A> {
    fn halves(&self, y: &A) -> [u16; 4];
    #[inline(always)]
    fn extra(&self) -> f32 {
        1.0
    }
}

macro_rules! scales {
    ($w:ty, $a:ty, |$x:ident, $y:ident| $h:expr) => {
        impl BlockScales<$a> for $w {
            #[inline(always)]
            fn halves(&self, $y: &$a) -> [u16; 4] {
                let $x = self;
                $h
            }
        }
    };
}

scales!(BlockQ4_0, BlockQ8_0, |x, y| [
    x.d.to_bits(),
    y.d.to_bits(),
    0,
    0
]);
scales!(BlockQ5_0, BlockQ8_0, |x, y| [
    x.d.to_bits(),
    y.d.to_bits(),
    0,
    0
]);
scales!(BlockQ8_0, BlockQ8_0, |x, y| [
    x.d.to_bits(),
    y.d.to_bits(),
    0,
    0
]);
scales!(BlockIQ4NL, BlockQ8_0, |x, y| [
    y.d.to_bits(),
    x.d.to_bits(),
    0,
    0
]);
scales!(BlockQ4_1, BlockQ8_1, |x, y| [
    x.d.to_bits(),
    y.d.to_bits(),
    x.m.to_bits(),
    y.s.to_bits()
]);
scales!(BlockQ5_1, BlockQ8_1, |x, y| [
    x.d.to_bits(),
    y.d.to_bits(),
    x.m.to_bits(),
    y.s.to_bits()
]);

impl BlockScales<BlockQ8_0> for BlockMXFP4 {
    #[inline(always)]
    fn halves(&self, y: &BlockQ8_0) -> [u16; 4] {
        [y.d.to_bits(), f16::ONE.to_bits(), 0, 0]
    }
    #[inline(always)]
    fn extra(&self) -> f32 {
        e8m0_to_f32_half(self.e)
    }
}

/// Two halves converted with one `vcvtph2ps` from a general register
/// (`vmovd` writes the whole vector: no false dependency, see [`h2f`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn h2f_pair(a: u16, b: u16) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128((a as u32 | (b as u32) << 16) as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// `a * b` of two halves, each converted by table lookup as ggml's x86
/// build does (`ggml_table_f32_f16`): two loads instead of the conversion's
/// vector shuffles, which compete with the kernels' own for port 5.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn h2f_mul(a: u16, b: u16) -> f32 {
    let t = f16_table();
    t[a as usize] * t[b as usize]
}

/// Every f16 bit pattern as f32 (256 KiB, built on first use).
fn f16_table() -> &'static [f32; 1 << 16] {
    static TABLE: std::sync::OnceLock<Box<[f32; 1 << 16]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        // Built on the heap (a 256 KiB array temporary could overflow a
        // small thread stack).
        let t: Vec<f32> = (0..=u16::MAX).map(|i| f16::from_bits(i).to_f32()).collect();
        t.into_boxed_slice()
            .try_into()
            .unwrap_or_else(|_| unreachable!())
    })
}

/// `sum_j bsums[j] * m[j / 2]` = `sum_k m[k] * (bsums[2k] + bsums[2k+1])`:
/// the min term of Q4_K / Q5_K.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mins_dot(bsums: &[i16; 16], m: &[u8; 8]) -> i32 {
    let bs = _mm256_loadu_si256(bsums.as_ptr() as *const __m256i);
    let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(m.as_ptr() as *const __m128i));
    let p = _mm_madd_epi16(mins, pairs);
    let p = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
    _mm_cvtsi128_si32(_mm_add_epi32(p, _mm_shuffle_epi32(p, 1)))
}

/// The `(d, m)` of one block pair (see [`BlockScales`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn block_scales<W: BlockScales<A>, A>(x: &W, y: &A) -> (f32, f32) {
    let h = x.halves(y);
    (h2f_mul(h[0], h[1]) * x.extra(), h2f_mul(h[2], h[3]))
}

/// Calls `body(x, y, d, m)` for every block pair (see [`BlockScales`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn each_block<W: BlockScales<A>, A>(
    w: &[W],
    a: &[A],
    mut body: impl FnMut(&W, &A, f32, f32),
) {
    for (x, y) in w.iter().zip(a) {
        let (d, m) = block_scales(x, y);
        body(x, y, d, m);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0_avx2(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    dot_q4_0_with::<Madd>(w, a)
}

/// `ggml_vec_dot_q4_0_q8_0`: one 8-lane FMA chain. The bodies `*_with` are
/// inlined into a `target_feature` function per [`LaneSums`].
#[inline(always)]
pub(super) unsafe fn dot_q4_0_with<S: LaneSums>(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    // A loop, not `each_block`'s closure: closures here would not
    // inherit the caller's target features.
    for (x, y) in w.iter().zip(a) {
        let (d, _) = block_scales(x, y);
        let qx = _mm256_sub_epi8(nibbles_32(&x.qs), _mm256_set1_epi8(8));
        let p = S::i8_pairs(qx, load32(&y.qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1_avx2(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    dot_q4_1_with::<Madd>(w, a)
}

/// `ggml_vec_dot_q4_1_q8_1`.
#[inline(always)]
pub(super) unsafe fn dot_q4_1_with<S: LaneSums>(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    // A loop, not `each_block`'s closure: closures here would not
    // inherit the caller's target features.
    for (x, y) in w.iter().zip(a) {
        let (d, _) = block_scales(x, y);
        // ggml's `summs += m * s` is contracted to an FMA by GCC.
        let (m, sy) = h2f_pair(x.m.to_bits(), y.s.to_bits());
        summs = m.mul_add(sy, summs);
        let p = S::u8_i8(nibbles_32(&x.qs), load32(&y.qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    }
    hsum_ps(acc) + summs
}

/// Exact for any bytes (including -128): widens to i16 before multiplying.
/// Lane `i` holds the products of bytes `4i..4i + 4`, as ggml's
/// `mul_sum_i8_pairs_float`, and the blocks accumulate into one 8-lane FMA
/// chain reduced by `hsum_float_8`: the same float result as
/// `ggml_vec_dot_q8_0_q8_0` and llamafile's tinyBLAS Q8_0 GEMM.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q8_0_avx2(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    each_block(w, a, |x, y, d, _| {
        // ggml's `mul_sum_i8_pairs_float(qx, qy)`: the weights may hold
        // -128 (its magnitude is the unsigned 128); the activations do not.
        let p = mul_sum_i8_pairs(load32(&x.qs), load32(&y.qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    });
    hsum_ps(acc)
}

/// `ggml_vec_dot_mxfp4_q8_0`'s AVX2 path, to the bit: block pairs in two
/// 8-lane FMA chains (even and odd blocks), `hsum(acc1 + acc2)`, then an odd
/// last block by [`lut4_tail`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_mxfp4_avx2(w: &[BlockMXFP4], a: &[BlockQ8_0]) -> f32 {
    dot_mxfp4_with::<Madd>(w, a)
}

#[inline(always)]
pub(super) unsafe fn dot_mxfp4_with<S: LaneSums>(w: &[BlockMXFP4], a: &[BlockQ8_0]) -> f32 {
    // ggml's `fp16(y.d) * e8m0_half(x.e)`.
    let scale = |x: &BlockMXFP4, y: &BlockQ8_0| h2f(y.d) * e8m0_to_f32_half(x.e);
    let (s, even) = lut4_pairs::<S, _>(&KVALUES_MXFP4, w, a, |x| &x.qs, scale);
    lut4_tail(&KVALUES_MXFP4, s, &w[even..], &a[even..], |x| &x.qs, scale)
}

/// The block pairs of ggml's AVX2 MXFP4 / IQ4_NL dots: two 8-lane FMA
/// chains (even and odd blocks), `hsum(acc1 + acc2)`. Returns the sum and
/// the blocks done (the caller's tail does the rest, as ggml's scalar loop).
#[inline(always)]
unsafe fn lut4_pairs<S: LaneSums, W>(
    table: &[i8; 16],
    w: &[W],
    a: &[BlockQ8_0],
    qs: impl Fn(&W) -> &[u8; 16],
    scale: impl Fn(&W, &BlockQ8_0) -> f32,
) -> (f32, usize) {
    let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
    let even = w.len().min(a.len()) & !1;
    let mut acc = [_mm256_setzero_ps(); 2];
    for (x, y) in w[..even].chunks_exact(2).zip(a[..even].chunks_exact(2)) {
        for k in 0..2 {
            let d = scale(&x[k], &y[k]);
            let vals = _mm256_shuffle_epi8(lut, nibbles_32(qs(&x[k])));
            let p = S::i8_pairs(vals, load32(&y[k].qs));
            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc[k]);
        }
    }
    (hsum_ps(_mm256_add_ps(acc[0], acc[1])), even)
}

/// ggml's scalar loop after the block pairs of its MXFP4 / IQ4_NL dots:
/// `sumf += d * sumi` per block (contracted to an FMA by GCC).
#[inline(always)]
unsafe fn lut4_tail<W>(
    table: &[i8; 16],
    mut sumf: f32,
    w: &[W],
    a: &[BlockQ8_0],
    qs: impl Fn(&W) -> &[u8; 16],
    scale: impl Fn(&W, &BlockQ8_0) -> f32,
) -> f32 {
    for (x, y) in w.iter().zip(a) {
        let (d, q) = (scale(x, y), qs(x));
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += y.qs[j] as i32 * table[(q[j] & 0xF) as usize] as i32;
            sumi += y.qs[j + 16] as i32 * table[(q[j] >> 4) as usize] as i32;
        }
        sumf = d.mul_add(sumi as f32, sumf);
    }
    sumf
}

/// `ggml_vec_dot_iq4_nl_q8_0`'s AVX2 path, to the bit: block pairs in two
/// 8-lane FMA chains (even and odd blocks), `hsum(acc1 + acc2)`, then an odd
/// last block by [`lut4_tail`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_nl_avx2(w: &[BlockIQ4NL], a: &[BlockQ8_0]) -> f32 {
    dot_iq4_nl_with::<Madd>(w, a)
}

#[inline(always)]
pub(super) unsafe fn dot_iq4_nl_with<S: LaneSums>(w: &[BlockIQ4NL], a: &[BlockQ8_0]) -> f32 {
    let scale = |x: &BlockIQ4NL, y: &BlockQ8_0| h2f_mul(y.d.to_bits(), x.d.to_bits());
    let (s, even) = lut4_pairs::<S, _>(&KVALUES_IQ4NL, w, a, |x| &x.qs, scale);
    lut4_tail(&KVALUES_IQ4NL, s, &w[even..], &a[even..], |x| &x.qs, scale)
}

/// The min term of one Q4_K / Q5_K block as ggml's AVX2 kernel keeps it:
/// `acc_m + dmin * (mins[k] * (bsums[2k] + bsums[2k+1]))` in four f32
/// lanes (one FMA per block, `dmin = -(y.d * x.dmin)`), reduced by
/// [`hsum_ps4`] at the end.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mins_fma(acc_m: __m128, bsums: &[i16; 16], m: &[u8; 8], dmin: f32) -> __m128 {
    let bs = _mm256_loadu_si256(bsums.as_ptr() as *const __m256i);
    let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(m.as_ptr() as *const __m128i));
    let prod = _mm_madd_epi16(mins, pairs);
    _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m)
}

/// ggml's reduction of the four-lane min accumulator: `(l0 + l2) + (l1 + l3)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps4(v: __m128) -> f32 {
    let r = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// `ggml_vec_dot_q4_K_q8_K`'s AVX2 path, to the bit.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k_avx2(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let (sc, m) = x.scale_mins();
        acc_m = mins_fma(acc_m, &y.bsums, &m, -(y.d * h2f(x.dmin)));
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            let q4 = _mm256_loadu_si256(x.qs.as_ptr().add(32 * c) as *const __m256i);
            let lo = _mm256_and_si256(q4, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            let plo = _mm256_maddubs_epi16(lo, load32(&y.qs[64 * c..]));
            let phi = _mm256_maddubs_epi16(hi, load32(&y.qs[64 * c + 32..]));
            let plo = _mm256_madd_epi16(plo, _mm256_set1_epi16(sc[2 * c] as i16));
            let phi = _mm256_madd_epi16(phi, _mm256_set1_epi16(sc[2 * c + 1] as i16));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
        }
        let d = _mm256_set1_ps(y.d * h2f(x.d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) + hsum_ps4(acc_m)
}

/// ggml's `get_scale_shuffle(ib)`: byte `2ib` eight times, then `2ib + 1`
/// (a table, as ggml's: one load instead of building the vector); Q6_K
/// and the IQ2 formats pick pairs of scales with it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_pair(ib: usize) -> __m128i {
    _mm_loadu_si128(SCALE_PAIR[ib & 7].as_ptr() as *const __m128i)
}

static SCALE_PAIR: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut ib = 0;
    while ib < 8 {
        let mut j = 0;
        while j < 16 {
            t[ib][j] = (2 * ib + j / 8) as u8;
            j += 1;
        }
        ib += 1;
    }
    t
};

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k_avx2(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x03);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        // The -32 offset, folded into the block sums of the activations:
        // 32 * (scales[2k] * bsums[2k] + scales[2k+1] * bsums[2k+1]) off
        // lane k, as ggml does (the lanes are rounded to f32 one by one).
        let bs = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.scales.as_ptr() as *const __m128i));
        let bias = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
        let sc8 = _mm_loadu_si128(x.scales.as_ptr() as *const __m128i);
        let mut sumi = _mm256_set1_epi32(0);
        for h in 0..2 {
            let ql0 = _mm256_loadu_si256(x.ql.as_ptr().add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(x.ql.as_ptr().add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(x.qh.as_ptr().add(32 * h) as *const __m256i);
            let hb = |s: i32| {
                let v = match s {
                    0 => qh,
                    2 => _mm256_srli_epi16(qh, 2),
                    4 => _mm256_srli_epi16(qh, 4),
                    _ => _mm256_srli_epi16(qh, 6),
                };
                _mm256_slli_epi16(_mm256_and_si256(v, m2), 4)
            };
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), hb(0)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), hb(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), hb(4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), hb(6)),
            ];
            for (k, q) in q.iter().enumerate() {
                let g = 8 * h + 2 * k;
                let p = _mm256_maddubs_epi16(*q, load32(&y.qs[128 * h + 32 * k..]));
                // Scales g (low half) and g + 1 (high half) as i16, picked
                // by a byte shuffle, as ggml's `get_scale_shuffle`.
                let s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, scale_pair(g / 2)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
            }
        }
        sumi = _mm256_sub_epi32(sumi, bias);
        let d = _mm256_set1_ps(y.d * h2f(x.d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// The 32 bits of `qh` as 32 bytes: 0xFF where the bit is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bits_32(qh: [u8; 4]) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(i32::from_le_bytes(qh)), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0_avx2(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    dot_q5_0_with::<Madd>(w, a)
}

/// `ggml_vec_dot_q5_0_q8_0`.
#[inline(always)]
pub(super) unsafe fn dot_q5_0_with<S: LaneSums>(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    // A loop, not `each_block`'s closure: closures here would not
    // inherit the caller's target features.
    for (x, y) in w.iter().zip(a) {
        let (d, _) = block_scales(x, y);
        // Where the fifth bit is clear, set the top nibble: nibble - 16 as i8.
        let hi = _mm256_andnot_si256(bits_32(x.qh), _mm256_set1_epi8(0xF0u8 as i8));
        let qx = _mm256_or_si256(nibbles_32(&x.qs), hi);
        let p = S::i8_pairs(qx, load32(&y.qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_1_avx2(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    dot_q5_1_with::<Madd>(w, a)
}

/// `ggml_vec_dot_q5_1_q8_1`.
#[inline(always)]
pub(super) unsafe fn dot_q5_1_with<S: LaneSums>(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    // A loop, not `each_block`'s closure: closures here would not
    // inherit the caller's target features.
    for (x, y) in w.iter().zip(a) {
        let (d, _) = block_scales(x, y);
        // ggml's `summs += m * s` is contracted to an FMA by GCC.
        let (m, sy) = h2f_pair(x.m.to_bits(), y.s.to_bits());
        summs = m.mul_add(sy, summs);
        let hi = _mm256_and_si256(bits_32(x.qh), _mm256_set1_epi8(0x10));
        let qx = _mm256_or_si256(nibbles_32(&x.qs), hi);
        let p = S::u8_i8(qx, load32(&y.qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    }
    hsum_ps(acc) + summs
}

/// ggml's `get_scale_shuffle_q3k(i)`: i16 element `2i` in the low 128-bit
/// lane, `2i + 1` in the high one.
static Q3K_SCALE_SHUFFLE: [[u8; 32]; 4] = {
    let mut t = [[0u8; 32]; 4];
    let mut i = 0;
    while i < 4 {
        let mut k = 0;
        while k < 32 {
            t[i][k] = (4 * i + 2 * (k / 16) + k % 2) as u8;
            k += 1;
        }
        i += 1;
    }
    t
};

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q2_k_avx2(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        // bsums[j] * (scales[j] >> 4) in i32 pairs, into the same FMA chain
        // as the quants with `dmin = -(y.d * x.dmin)`, as ggml does.
        let sc = _mm_loadu_si128(x.scales.as_ptr() as *const __m128i);
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F)));
        let bs = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
        let p = _mm256_madd_epi16(mins, bs);
        let dmin = -(y.d * h2f(x.dmin));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(p), acc);
        // The 16 scales as i16, each half of the block's in both 128-bit
        // lanes; a table shuffle per 32 weights picks the pair (ggml's
        // `get_scale_shuffle_q3k`).
        let all = _mm256_cvtepu8_epi16(_mm_and_si128(sc, _mm_set1_epi8(0x0F)));
        let (lo, hi) = (
            _mm256_castsi256_si128(all),
            _mm256_extracti128_si256(all, 1),
        );
        let scales = [_mm256_set_m128i(lo, lo), _mm256_set_m128i(hi, hi)];
        let mut sumi = _mm256_setzero_si256();
        for (h, scales) in scales.iter().enumerate() {
            let q2 = _mm256_loadu_si256(x.qs.as_ptr().add(32 * h) as *const __m256i);
            for (j, pick) in Q3K_SCALE_SHUFFLE.iter().enumerate() {
                let v = match j {
                    0 => q2,
                    1 => _mm256_srli_epi16(q2, 2),
                    2 => _mm256_srli_epi16(q2, 4),
                    _ => _mm256_srli_epi16(q2, 6),
                };
                let p = _mm256_maddubs_epi16(
                    _mm256_and_si256(v, m3),
                    load32(&y.qs[128 * h + 32 * j..]),
                );
                let pick = _mm256_loadu_si256(pick.as_ptr() as *const __m256i);
                sumi = _mm256_add_epi32(
                    sumi,
                    _mm256_madd_epi16(p, _mm256_shuffle_epi8(*scales, pick)),
                );
            }
        }
        let d = _mm256_set1_ps(y.d * h2f(x.d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q3_k_avx2(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let one = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        // The 16 6-bit scales (minus 32) as i16, each half of the block's in
        // both 128-bit lanes, as for Q2_K.
        let w = x.scale_words();
        let s8 = _mm_set_epi32(w[3] as i32, w[2] as i32, w[1] as i32, w[0] as i32);
        let all = _mm256_cvtepi8_epi16(_mm_sub_epi8(s8, _mm_set1_epi8(32)));
        let (lo, hi) = (
            _mm256_castsi256_si128(all),
            _mm256_extracti128_si256(all, 1),
        );
        let scales = [_mm256_set_m128i(lo, lo), _mm256_set_m128i(hi, hi)];
        let hbits = _mm256_loadu_si256(x.hmask.as_ptr() as *const __m256i);
        let mut sumi = _mm256_setzero_si256();
        for (h, scales) in scales.iter().enumerate() {
            let q2 = _mm256_loadu_si256(x.qs.as_ptr().add(32 * h) as *const __m256i);
            for (j, pick) in Q3K_SCALE_SHUFFLE.iter().enumerate() {
                let v = _mm256_and_si256(_mm256_srl_epi16(q2, _mm_cvtsi32_si128(2 * j as i32)), m3);
                let bit = _mm256_and_si256(
                    _mm256_srl_epi16(hbits, _mm_cvtsi32_si128((4 * h + j) as i32)),
                    one,
                );
                // A clear high bit subtracts 4.
                let sub = _mm256_slli_epi16(_mm256_andnot_si256(bit, one), 2);
                let q8 = load32(&y.qs[128 * h + 32 * j..]);
                let p =
                    _mm256_sub_epi16(_mm256_maddubs_epi16(v, q8), _mm256_maddubs_epi16(sub, q8));
                let pick = _mm256_loadu_si256(pick.as_ptr() as *const __m256i);
                sumi = _mm256_add_epi32(
                    sumi,
                    _mm256_madd_epi16(p, _mm256_shuffle_epi8(*scales, pick)),
                );
            }
        }
        let d = _mm256_set1_ps(h2f(x.d) * y.d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_k_avx2(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let (sc, m) = x.scale_mins();
        acc_m += h2f(x.dmin) * y.d * mins_dot(&y.bsums, &m) as f32;
        let hbits = _mm256_loadu_si256(x.qh.as_ptr() as *const __m256i);
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            let q4 = _mm256_loadu_si256(x.qs.as_ptr().add(32 * c) as *const __m256i);
            let hb = |k: i32| {
                let b = _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(k)), one);
                _mm256_slli_epi16(b, 4)
            };
            let lo = _mm256_or_si256(_mm256_and_si256(q4, m4), hb(2 * c as i32));
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4),
                hb(2 * c as i32 + 1),
            );
            let plo = _mm256_maddubs_epi16(lo, load32(&y.qs[64 * c..]));
            let phi = _mm256_maddubs_epi16(hi, load32(&y.qs[64 * c + 32..]));
            let plo = _mm256_madd_epi16(plo, _mm256_set1_epi16(sc[2 * c] as i16));
            let phi = _mm256_madd_epi16(phi, _mm256_set1_epi16(sc[2 * c + 1] as i16));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
        }
        let d = _mm256_set1_ps(h2f(x.d) * y.d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - acc_m
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_xs_avx2(w: &[BlockIQ4XS], a: &[BlockQ8K]) -> f32 {
    let lut =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let qs: &[u8; 16] = x.qs[16 * ib..16 * ib + 16].try_into().unwrap_unchecked();
            let vals = _mm256_shuffle_epi8(lut, nibbles_32(qs));
            let q8 = load32(&y.qs[32 * ib..]);
            let p = _mm256_maddubs_epi16(_mm256_sign_epi8(vals, vals), _mm256_sign_epi8(q8, vals));
            sumi = _mm256_add_epi32(
                sumi,
                _mm256_madd_epi16(p, _mm256_set1_epi16(x.scale(ib) as i16)),
            );
        }
        let d = _mm256_set1_ps(h2f(x.d) * y.d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

mod iq1;
mod iq1_512;
pub(crate) use iq1_512::{dot_iq1_m_512, dot_iq1_s_512, iq1_step, Iq1Parts};
mod iq3;
pub(crate) use iq1::{dot_iq1_m, dot_iq1_m_pdep, dot_iq1_s, dot_iq1_s_pdep};
pub(crate) use iq3::{dot_iq3_s, dot_iq3_xxs};
mod grid_512;
mod iq2;
pub(crate) use grid_512::{
    dot_iq2_s_512, dot_iq2_xs_512, dot_iq2_xxs_512, dot_iq3_s_512, dot_iq3_xxs_512, SignedGrid,
};
pub(crate) use iq2::{dot_iq2_s, dot_iq2_xs, dot_iq2_xxs};
mod iq2_tiles;
pub(crate) use iq2_tiles::{tile_iq2_s, tile_iq2_xs, tile_iq2_xxs};

mod tiles;
pub(super) use tiles::{
    drive, prefetch_rows, shapes, tile_iq4_nl, tile_kernels, tile_q4_0, tile_q4_1, tile_q4_k,
    tile_q5_0, tile_q8_0, tile_shape, tile_wrapper, Q0Block, Shapes, PREFETCH_ROWS,
};
