//! AVX-512 VNNI kernels (x86_64, AVX-512 F + BW + VNNI on top of AVX2).
//!
//! `vpdpbusd` multiplies unsigned by signed bytes and sums each four into an
//! i32 lane without the i16 saturation of `maddubs`, so every kernel here is
//! exact in its integer part for any weight bytes. Signed-by-signed products
//! use an offset: `sum(x * y) = sum((x + o) * y) - o * sum(y)` with
//! `x + o >= 0`. The one-row dots of the 32-weight formats (Q8_0, Q4_0,
//! MXFP4, IQ4_NL, NVFP4) stay at 256 bits: `vpdpbusd` on 8 lanes in place
//! of `maddubs` + `madd`, which gives ggml's i32 lanes, in ggml's FMA chains
//! (one chain for Q8_0 / Q4_0 / NVFP4, even and odd blocks for MXFP4 /
//! IQ4_NL), so ggml's bits; putting two blocks in a 512-bit vector would
//! reorder the float sums (see `dot_q8_0_avx2`). Q4_K measured no faster
//! than its AVX2 kernel with 512-bit vectors, so it has none here. The
//! paired tile kernels at the end pair weight rows instead, which keeps
//! every chain.
//!
//! The i-quants' AVX-512 dots (IQ1_S..IQ3_S) live next to their AVX2
//! kernels in `simd_x86/grid_512.rs` and `simd_x86/iq1_512.rs` and are re-exported here.
//!
//! As in simd_x86.rs, the safe wrappers are only handed out when
//! [`CpuCaps::has_avx512`](super::CpuCaps::has_avx512) is true.
//!
//! The AVX-512 intrinsics are stable since Rust 1.89, above the workspace's
//! declared `rust-version` (1.85): the crate needs 1.89 to build on x86_64.

#![allow(clippy::incompatible_msrv)]

use super::simd_x86::{
    block_scales, dot_iq4_nl_with, dot_mxfp4_with, dot_nvfp4_with, dot_q4_0_with, dot_q4_1_with,
    dot_q5_0_with, dot_q5_1_with, drive, h2f, h2f_pair, hsum_ps, load32, prefetch_rows, shapes,
    tile_kernels, tile_shape, tile_wrapper, LaneSums, Shapes, PREFETCH_ROWS,
};
use super::{
    BlockIQ4NL, BlockMXFP4, BlockNVFP4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1,
    BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use std::arch::x86_64::*;

macro_rules! safe_wrapper {
    ($name:ident, $inner:ident, $w:ty, $a:ty) => {
        pub(crate) fn $name(_n: usize, w: &[$w], a: &[$a]) -> f32 {
            // SAFETY: only selected when CpuCaps::has_avx512() (see module docs).
            unsafe { $inner(w, a) }
        }
    };
}

pub(crate) use super::simd_x86::dot_iq1_m_512 as dot_iq1_m;
pub(crate) use super::simd_x86::dot_iq1_s_512 as dot_iq1_s;
pub(crate) use super::simd_x86::dot_iq2_s_512 as dot_iq2_s;
pub(crate) use super::simd_x86::dot_iq2_xs_512 as dot_iq2_xs;
pub(crate) use super::simd_x86::dot_iq2_xxs_512 as dot_iq2_xxs;
pub(crate) use super::simd_x86::dot_iq3_s_512 as dot_iq3_s;
pub(crate) use super::simd_x86::dot_iq3_xxs_512 as dot_iq3_xxs;
pub(crate) use super::simd_x86::pair_nvfp4_512 as pair_nvfp4;
safe_wrapper!(dot_mxfp4, dot_mxfp4_vnni, BlockMXFP4, BlockQ8_0);
safe_wrapper!(dot_iq4_nl, dot_iq4_nl_vnni, BlockIQ4NL, BlockQ8_0);
safe_wrapper!(dot_q6_k, dot_q6_k_512, BlockQ6K, BlockQ8K);
safe_wrapper!(dot_q8_0, dot_q8_0_vnni, BlockQ8_0, BlockQ8_0);
safe_wrapper!(dot_q4_0, dot_q4_0_vnni, BlockQ4_0, BlockQ8_0);
safe_wrapper!(dot_nvfp4, dot_nvfp4_vnni, BlockNVFP4, BlockQ8_0);
safe_wrapper!(dot_q4_1, dot_q4_1_vnni, BlockQ4_1, BlockQ8_1);
safe_wrapper!(dot_q5_0, dot_q5_0_vnni, BlockQ5_0, BlockQ8_0);
safe_wrapper!(dot_q5_1, dot_q5_1_vnni, BlockQ5_1, BlockQ8_1);

/// [`LaneSums`] with AVX-512 VNNI: `|x|` against `y` signed by `x` (or an
/// unsigned `x` as it is), four products per i32 lane in one `vpdpbusd`
/// (exact: `|x| <= 128` unsigned, `y` in `[-127, 127]`), as ggml's
/// `mul_sum_i8_pairs_float` in its VNNI build. The lanes are those of
/// `simd_x86::Madd`, so the kernels give the same bits.
pub(crate) struct Vnni;
impl LaneSums for Vnni {
    #[inline(always)]
    unsafe fn i8_pairs(x: __m256i, y: __m256i) -> __m256i {
        let (ax, sy) = (_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy)
    }
    #[inline(always)]
    unsafe fn u8_i8(x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y)
    }
    #[inline(always)]
    unsafe fn u8_i8_acc(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, x, y)
    }
}

/// `ggml_vec_dot_q8_0_q8_0` as ggml's AVX-512 VNNI build runs it: one block
/// per step, one 8-lane FMA chain (the module docs say why not two blocks).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q8_0_vnni(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let (d, _) = block_scales(x, y);
        let p = Vnni::i8_pairs(load32(&x.qs), load32(&y.qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    }
    hsum_ps(acc)
}

/// The AVX2 bodies of simd_x86.rs with [`Vnni`] sums: ggml's lanes and
/// chains, one instruction fewer per 32 weights.
macro_rules! vnni_dots {
    ($($inner:ident = $body:ident($w:ty, $a:ty);)*) => {$(
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $inner(w: &[$w], a: &[$a]) -> f32 {
            $body::<Vnni>(w, a)
        }
    )*};
}

vnni_dots! {
    dot_q4_0_vnni = dot_q4_0_with(BlockQ4_0, BlockQ8_0);
    dot_q4_1_vnni = dot_q4_1_with(BlockQ4_1, BlockQ8_1);
    dot_q5_0_vnni = dot_q5_0_with(BlockQ5_0, BlockQ8_0);
    dot_q5_1_vnni = dot_q5_1_with(BlockQ5_1, BlockQ8_1);
    dot_nvfp4_vnni = dot_nvfp4_with(BlockNVFP4, BlockQ8_0);
    dot_mxfp4_vnni = dot_mxfp4_with(BlockMXFP4, BlockQ8_0);
    dot_iq4_nl_vnni = dot_iq4_nl_with(BlockIQ4NL, BlockQ8_0);
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn load64(p: &[i8]) -> __m512i {
    debug_assert!(p.len() >= 64);
    _mm512_loadu_si512(p.as_ptr() as *const _)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q6_k_512(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm512_set1_epi8(0x0F);
    let m2 = _mm512_set1_epi8(0x03);
    let zero = _mm512_setzero_si512();
    let groups = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let scales = _mm_loadu_si128(x.scales.as_ptr() as *const __m128i);
        // The -32 offset: 32 * sum_g scales[g] * bsums[g].
        let bs = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
        let bias = _mm256_madd_epi16(bs, _mm256_cvtepi8_epi16(scales));
        let mut sumi = _mm512_sub_epi32(zero, _mm512_zextsi256_si512(_mm256_slli_epi32(bias, 5)));
        for h in 0..2 {
            let ql0 = _mm256_loadu_si256(x.ql.as_ptr().add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(x.ql.as_ptr().add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(x.qh.as_ptr().add(32 * h) as *const __m256i);
            let ql = join(ql0, ql1);
            let qh2 = join(qh, _mm256_srli_epi16(qh, 2));
            // Weights 128h + 0..64, then 128h + 64..128.
            let qa = _mm512_or_si512(
                _mm512_and_si512(ql, m4),
                _mm512_slli_epi16(_mm512_and_si512(qh2, m2), 4),
            );
            let qb = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh2, 4), m2), 4),
            );
            for (k, q) in [qa, qb].into_iter().enumerate() {
                let dp = _mm512_dpbusd_epi32(zero, q, load64(&y.qs[128 * h + 64 * k..]));
                // i32 lane j covers weights 4j..4j+4: scale group 8h + 4k + j / 4.
                let idx = _mm_add_epi8(groups, _mm_set1_epi8((8 * h + 4 * k) as i8));
                let s = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(scales, idx));
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(dp, s));
            }
        }
        // Lanes j and j + 8 hold what ggml's AVX2 kernel sums in lane j
        // (exact integers): fold them before rounding to f32.
        let sumi = _mm256_add_epi32(
            _mm512_castsi512_si256(sumi),
            _mm512_extracti64x4_epi64(sumi, 1),
        );
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(y.d * h2f(x.d)),
            _mm256_cvtepi32_ps(sumi),
            acc,
        );
    }
    hsum_ps(acc)
}

// Tile kernels with 256-bit VNNI (`vpdpbusd` / `vpdpwssd` on ymm, AVX-512 VL)
// and the 32 vector registers of AVX-512: bit-identical to the AVX2 one-row
// kernels (see simd_x86.rs).

/// `acc + madd(maddubs(u, s), 1)` in one instruction (exact for `u` small
/// enough that `maddubs` cannot saturate).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dp_vnni(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, u, s)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dpw_vnni(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, x, y)
}

/// A weight block's values offset to unsigned bytes (`x + 128`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8w_vnni(x: __m256i) -> [__m256i; 2] {
    [
        _mm256_xor_si256(x, _mm256_set1_epi8(-128)),
        _mm256_setzero_si256(),
    ]
}

/// A Q8_0 activation block and `-128 * (sum of each four bytes)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8a_vnni(qs: &[i8; 32]) -> [__m256i; 2] {
    let y = _mm256_loadu_si256(qs.as_ptr() as *const __m256i);
    let sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), y);
    [
        y,
        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 7)),
    ]
}

/// `sum((x + 128) * y) - 128 * sum(y)` per four bytes: `dot_q8_0_avx2`'s lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8p_vnni(x: &[__m256i; 2], y: &[__m256i; 2]) -> __m256i {
    _mm256_dpbusd_epi32(y[1], x[0], y[0])
}

tile_kernels!(
    vnni_tiles,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    dp_vnni,
    dpw_vnni,
    q8w_vnni,
    q8a_vnni,
    q8p_vnni
);

tile_wrapper!(
    tile_q4_k,
    BlockQ4K,
    BlockQ8K,
    shapes!(vnni_tiles::q4_k, (2 x 4), gen 4)
);

// Paired tile kernels (Q4_1, Q8_0): one 512-bit register holds two weight
// rows against one activation row, so each `vpdpbusd`, conversion, scale
// product and FMA serves two (row, activation) pairs, where the 256-bit
// kernels above spend one instruction per pair. Lanes 0..8 are the first
// row's eight lanes of the one-row kernel and lanes 8..16 the second's; each
// lane runs the same integer sums and the same float operations in the same
// order, so every result keeps the one-row kernel's bits. The activations'
// scales (and Q8_0's offset activations) are prepared once per call, not
// once per row group. `vpdpbusd` on 512 bits bounds these kernels on Zen 4,
// so Q8_0 offsets the activations, whose correction term belongs to the
// weight block and is paid once for all activations of a group. Measured
// per thread with the weights in L2 (`quant_dot tiles`), 8 activations:
// Q4_1 54 -> 123 and Q8_0 61 -> 107 GMAC/s against the 256-bit kernels.

/// Activation rows per group of the paired kernels: each weight block is
/// decoded once per group (8 measured 15% faster than 4 at 8 activations;
/// the accumulators of 2 x 8 pairs still fit the 32 registers).
const GROUP: usize = 8;

/// Lanes `[i; 8]` then `[j; 8]`, as permutation indices.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn halves_idx(i: i32, j: i32) -> __m512i {
    _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set1_epi32(i)),
        _mm256_set1_epi32(j),
        1,
    )
}

/// The two 8-lane halves of `v`, each reduced as the one-row kernels do.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn hsum_halves(v: __m512) -> (f32, f32) {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    (hsum_ps(lo), hsum_ps(hi))
}

/// Covers `nr` weight rows x `nt` activation rows with `pairs::<P, T>`
/// (P <= `max_p` row pairs, T <= GROUP activations) and `one` for an odd
/// last row; `prefetch(r, n)` asks for the `n` rows from `r` (see
/// `prefetch_rows`).
#[inline(always)]
unsafe fn drive_pairs(
    nr: usize,
    nt: usize,
    max_p: usize,
    pairs: impl Fn(usize, usize, usize, usize),
    one: impl Fn(usize, usize),
    prefetch: impl Fn(usize, usize),
) {
    for t0 in (0..nt).step_by(GROUP) {
        let tn = GROUP.min(nt - t0);
        let mut r0 = 0;
        while nr - r0 >= 2 {
            let p = if max_p >= 2 && nr - r0 >= 4 { 2 } else { 1 };
            if t0 == 0 {
                prefetch(r0 + PREFETCH_ROWS, 2 * p);
            }
            pairs(p, tn, r0, t0);
            r0 += 2 * p;
        }
        if r0 < nr {
            for t in t0..t0 + tn {
                one(r0, t);
            }
        }
    }
}

/// Dispatches runtime `t` to the const-generic kernel `$k::<$p, T>`.
macro_rules! dispatch_t {
    ($k:ident, $p:literal, $t:expr, ($($arg:expr),*)) => {
        match $t {
            8 => $k::<$p, 8>($($arg),*),
            7 => $k::<$p, 7>($($arg),*),
            6 => $k::<$p, 6>($($arg),*),
            5 => $k::<$p, 5>($($arg),*),
            4 => $k::<$p, 4>($($arg),*),
            3 => $k::<$p, 3>($($arg),*),
            2 => $k::<$p, 2>($($arg),*),
            _ => $k::<$p, 1>($($arg),*),
        }
    };
}

/// [`drive_pairs`] with the kernel family `$k::<P, T>(nb, weight rows,
/// activation data, the group's scales, out, ld)` over `nr` weight rows
/// (from `$w`) and `nt` activations (from `$x`, with group scales at `$sc`),
/// `$one(r, t)` for an odd last row, and the weights prefetched ahead. `$p`
/// is the most row pairs one call takes (1 or 2): two pairs share each
/// activation load, one pair reads fewer rows side by side, which streams
/// better from memory for wide blocks (see the kernels).
macro_rules! run_pairs {
    ($k:ident, $p:tt, $nb:expr, $nr:expr, $nt:expr, $w:expr, $x:expr, $sc:expr, $o:expr, $one:expr) => {{
        let (nb, nr, w, x, sc, o) = ($nb, $nr, $w, $x, $sc, $o);
        drive_pairs(
            nr,
            $nt,
            $p,
            |p, tn, r0, t0| {
                let args = (
                    w.add(r0 * nb),
                    x.add(t0 * nb),
                    sc.add(t0 / GROUP * nb),
                    o.add(t0 * nr + r0),
                );
                run_pairs!(@dispatch $k, $p, p, tn, (nb, args.0, args.1, args.2, args.3, nr))
            },
            $one,
            |r, n| prefetch_rows(w.wrapping_add(r * nb), n * nb),
        )
    }};
    (@dispatch $k:ident, 1, $pv:expr, $t:expr, $args:tt) => {{
        let _ = $pv;
        dispatch_t!($k, 1, $t, $args)
    }};
    (@dispatch $k:ident, 2, $pv:expr, $t:expr, $args:tt) => {
        if $pv == 2 {
            dispatch_t!($k, 2, $t, $args)
        } else {
            dispatch_t!($k, 1, $t, $args)
        }
    };
}

/// Q4_1 x Q8_1, `P` row pairs x `T` activations. `sc` holds per block the
/// group's activation scales `d` (lanes 0..8) and sums `s` (lanes 8..16).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_1_pairs<const P: usize, const T: usize>(
    nb: usize,
    w: *const BlockQ4_1,
    a: *const BlockQ8_1,
    sc: *const [f32; 2 * GROUP],
    out: *mut f32,
    ld: usize,
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    // From [d0 m0 d1 m1 d2 m2 d3 m3] (four rows' halves): each pair's `d`,
    // and the `m` of row r in lane 4t + r.
    let idx_d = [halves_idx(0, 2), halves_idx(4, 6)];
    let idx_m = _mm512_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7);
    // The `s` of activation 4h + t in lanes 4t..4t + 4 of half h.
    let idx_s = [
        _mm512_setr_epi32(8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11),
        _mm512_setr_epi32(
            12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15,
        ),
    ];
    let mut acc = [[_mm512_setzero_ps(); T]; P];
    // ggml's `summs += m * s` (an FMA per block) of row r, activation
    // 4h + t in lane 4t + r of summs[h].
    let mut summs = [_mm512_setzero_ps(); 2];
    for b in 0..nb {
        let mut dm = [0u32; 4];
        for (r, dm) in dm.iter_mut().enumerate().take(2 * P) {
            *dm = std::ptr::read_unaligned(w.add(r * nb + b) as *const u32);
        }
        let dmv = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(
            dm.as_ptr() as *const __m128i
        )));
        let mut q = [zero; P];
        let mut dw = [_mm512_setzero_ps(); P];
        for p in 0..P {
            let xa = &*w.add(2 * p * nb + b);
            let xb = &*w.add((2 * p + 1) * nb + b);
            let ta = _mm256_broadcastsi128_si256(_mm_loadu_si128(xa.qs.as_ptr() as *const __m128i));
            let tb = _mm256_broadcastsi128_si256(_mm_loadu_si128(xb.qs.as_ptr() as *const __m128i));
            // [a, a >> 4, b, b >> 4] per 128-bit lane, then the low nibbles.
            let v = _mm512_inserti64x4(_mm512_castsi256_si512(ta), tb, 1);
            let v = _mm512_mask_srli_epi16::<4>(v, 0xFF00_FF00, v);
            q[p] = _mm512_and_si512(v, m4);
            dw[p] = _mm512_permutexvar_ps(idx_d[p], dmv);
        }
        let s = &*sc.add(b);
        let sv = _mm512_loadu_ps(s.as_ptr());
        let m = _mm512_permutexvar_ps(idx_m, dmv);
        for h in 0..T.div_ceil(4) {
            summs[h] = _mm512_fmadd_ps(m, _mm512_permutexvar_ps(idx_s[h], sv), summs[h]);
        }
        for t in 0..T {
            let y = &*a.add(t * nb + b);
            let yq = _mm512_broadcast_i64x4(_mm256_loadu_si256(y.qs.as_ptr() as *const __m256i));
            let dy = _mm512_set1_ps(s[t]);
            for p in 0..P {
                let dp = _mm512_dpbusd_epi32(zero, q[p], yq);
                let d = _mm512_mul_ps(dw[p], dy);
                acc[p][t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dp), acc[p][t]);
            }
        }
    }
    let mut sm = [0f32; 32];
    _mm512_storeu_ps(sm.as_mut_ptr(), summs[0]);
    _mm512_storeu_ps(sm.as_mut_ptr().add(16), summs[1]);
    for t in 0..T {
        for p in 0..P {
            let (x0, x1) = hsum_halves(acc[p][t]);
            *out.add(t * ld + 2 * p) = x0 + sm[4 * t + 2 * p];
            *out.add(t * ld + 2 * p + 1) = x1 + sm[4 * t + 2 * p + 1];
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_q4_1_512(nb: usize, w: &[BlockQ4_1], a: &[BlockQ8_1], out: &mut [f32]) {
    let (nr, nt) = (w.len() / nb, a.len() / nb);
    let mut sc = vec![[0f32; 2 * GROUP]; nt.div_ceil(GROUP) * nb];
    for (t, y) in a.chunks_exact(nb).enumerate() {
        let (g, j) = (t / GROUP, t % GROUP);
        for (b, y) in y.iter().enumerate() {
            let (d, s) = h2f_pair(y.d.to_bits(), y.s.to_bits());
            sc[g * nb + b][j] = d;
            sc[g * nb + b][GROUP + j] = s;
        }
    }
    let (w, a, o) = (w.as_ptr(), a.as_ptr(), out.as_mut_ptr());
    run_pairs!(q4_1_pairs, 2, nb, nr, nt, w, a, sc.as_ptr(), o, |r, t| {
        vnni_tiles::q4_1::<1, 1>(nb, w.add(r * nb), a.add(t * nb), o.add(t * nr + r), nr)
    });
}

/// Q8_0 x Q8_0, `P` row pairs x `T` activations. The activations come
/// offset to unsigned bytes (`ys`, `y + 128`, activation-major as `a`) and
/// the weights stay signed: `sum((y + 128) * x) - 128 * sum(x)` equals
/// `sum(x * y)` for any bytes, and the correction belongs to the weight
/// block, so it is computed once per block for all `T` activations. `sc`
/// holds the group's activation scales. Driven one pair at a time: with two
/// pairs (four 34-byte-block rows side by side) a matrix streamed from
/// memory ran at 75 GMAC/s per thread for 8 activations, with one pair at
/// 96 (`cargo bench --bench quant_dot -- tiles`, LONGHAUL_BENCH_ROWS=49152);
/// from L2 both run at ~100.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_0_pairs<const P: usize, const T: usize>(
    nb: usize,
    w: *const BlockQ8_0,
    ys: *const __m256i,
    sc: *const [f32; GROUP],
    out: *mut f32,
    ld: usize,
) {
    let ones = _mm512_set1_epi8(1);
    let zero = _mm512_setzero_si512();
    let idx_d = [halves_idx(0, 1), halves_idx(2, 3)];
    let mut acc = [[_mm512_setzero_ps(); T]; P];
    for b in 0..nb {
        let mut hd = [0u16; 8];
        for (r, h) in hd.iter_mut().enumerate().take(2 * P) {
            *h = (*w.add(r * nb + b)).d.to_bits();
        }
        let dv = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(
            hd.as_ptr() as *const __m128i
        )));
        let mut q = [zero; P];
        let mut corr = [zero; P];
        let mut dw = [_mm512_setzero_ps(); P];
        for p in 0..P {
            let xa = &*w.add(2 * p * nb + b);
            let xb = &*w.add((2 * p + 1) * nb + b);
            q[p] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(xa.qs.as_ptr() as *const __m256i)),
                _mm256_loadu_si256(xb.qs.as_ptr() as *const __m256i),
                1,
            );
            let sum = _mm512_dpbusd_epi32(zero, ones, q[p]);
            corr[p] = _mm512_sub_epi32(zero, _mm512_slli_epi32(sum, 7));
            dw[p] = _mm512_permutexvar_ps(idx_d[p], dv);
        }
        let s = &*sc.add(b);
        for t in 0..T {
            let yq = _mm512_broadcast_i64x4(_mm256_loadu_si256(ys.add(t * nb + b)));
            let dy = _mm512_set1_ps(s[t]);
            for p in 0..P {
                let dp = _mm512_dpbusd_epi32(corr[p], yq, q[p]);
                let d = _mm512_mul_ps(dw[p], dy);
                acc[p][t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dp), acc[p][t]);
            }
        }
    }
    for (p, acc) in acc.iter().enumerate() {
        for (t, acc) in acc.iter().enumerate() {
            let (x0, x1) = hsum_halves(*acc);
            *out.add(t * ld + 2 * p) = x0;
            *out.add(t * ld + 2 * p + 1) = x1;
        }
    }
}

/// The Q8_0 activations of a paired signed-weight kernel (Q8_0, Q5_0):
/// per block the group's scales, and the quants offset to unsigned bytes
/// (`y + 128`, in the order of `a`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn offset_acts(nb: usize, a: &[BlockQ8_0]) -> (Vec<[f32; GROUP]>, Vec<__m256i>) {
    let nt = a.len() / nb;
    let mut sc = vec![[0f32; GROUP]; nt.div_ceil(GROUP) * nb];
    let mut ys = vec![_mm256_setzero_si256(); a.len()];
    for (i, y) in a.iter().enumerate() {
        let (t, b) = (i / nb, i % nb);
        sc[t / GROUP * nb + b][t % GROUP] = h2f(y.d);
        let yq = _mm256_loadu_si256(y.qs.as_ptr() as *const __m256i);
        ys[i] = _mm256_xor_si256(yq, _mm256_set1_epi8(-128));
    }
    (sc, ys)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_q8_0_512(nb: usize, w: &[BlockQ8_0], a: &[BlockQ8_0], out: &mut [f32]) {
    let (nr, nt) = (w.len() / nb, a.len() / nb);
    let (sc, ys) = offset_acts(nb, a);
    let (w, a, o) = (w.as_ptr(), a.as_ptr(), out.as_mut_ptr());
    run_pairs!(
        q8_0_pairs,
        1,
        nb,
        nr,
        nt,
        w,
        ys.as_ptr(),
        sc.as_ptr(),
        o,
        |r, t| {
            vnni_tiles::q8_0::<1, 1>(nb, w.add(r * nb), a.add(t * nb), o.add(t * nr + r), nr)
        }
    );
}

/// Q5_0 x Q8_0, `P` row pairs x `T` activations: [`q8_0_pairs`] with the
/// weights decoded to signed `q - 16` (as `dot_q5_0_avx2` has them): the
/// nibbles, less 16 where the block's fifth bit (`qh`, one bit per byte
/// lane, a mask register) is clear. The lanes are `dot_q5_0_avx2`'s, and
/// the scales and the FMA chain of each half its `d = dx * dy` chain.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_0_pairs<const P: usize, const T: usize>(
    nb: usize,
    w: *const BlockQ5_0,
    ys: *const __m256i,
    sc: *const [f32; GROUP],
    out: *mut f32,
    ld: usize,
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    let ones = _mm512_set1_epi8(1);
    let zero = _mm512_setzero_si512();
    let idx_d = [halves_idx(0, 1), halves_idx(2, 3)];
    let mut acc = [[_mm512_setzero_ps(); T]; P];
    for b in 0..nb {
        let mut hd = [0u16; 8];
        for (r, h) in hd.iter_mut().enumerate().take(2 * P) {
            *h = (*w.add(r * nb + b)).d.to_bits();
        }
        let dv = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(
            hd.as_ptr() as *const __m128i
        )));
        let mut q = [zero; P];
        let mut corr = [zero; P];
        let mut dw = [_mm512_setzero_ps(); P];
        for p in 0..P {
            let xa = &*w.add(2 * p * nb + b);
            let xb = &*w.add((2 * p + 1) * nb + b);
            let ta = _mm256_broadcastsi128_si256(_mm_loadu_si128(xa.qs.as_ptr() as *const __m128i));
            let tb = _mm256_broadcastsi128_si256(_mm_loadu_si128(xb.qs.as_ptr() as *const __m128i));
            // [a, a >> 4, b, b >> 4] per 128-bit lane, then the low nibbles:
            // elements 0..32 of row a, then of row b.
            let v = _mm512_inserti64x4(_mm512_castsi256_si512(ta), tb, 1);
            let v = _mm512_mask_srli_epi16::<4>(v, 0xFF00_FF00, v);
            let nib = _mm512_and_si512(v, m4);
            let high = u32::from_le_bytes(xa.qh) as u64 | (u32::from_le_bytes(xb.qh) as u64) << 32;
            q[p] = _mm512_mask_sub_epi8(nib, !high, nib, sixteen);
            let sum = _mm512_dpbusd_epi32(zero, ones, q[p]);
            corr[p] = _mm512_sub_epi32(zero, _mm512_slli_epi32(sum, 7));
            dw[p] = _mm512_permutexvar_ps(idx_d[p], dv);
        }
        let s = &*sc.add(b);
        for t in 0..T {
            let yq = _mm512_broadcast_i64x4(_mm256_loadu_si256(ys.add(t * nb + b)));
            let dy = _mm512_set1_ps(s[t]);
            for p in 0..P {
                let dp = _mm512_dpbusd_epi32(corr[p], yq, q[p]);
                let d = _mm512_mul_ps(dw[p], dy);
                acc[p][t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dp), acc[p][t]);
            }
        }
    }
    for (p, acc) in acc.iter().enumerate() {
        for (t, acc) in acc.iter().enumerate() {
            let (x0, x1) = hsum_halves(*acc);
            *out.add(t * ld + 2 * p) = x0;
            *out.add(t * ld + 2 * p + 1) = x1;
        }
    }
}

/// Up to two row pairs per call (22-byte blocks, as Q4_1's 20): one pair
/// measured slower at 4 and 8 activations both from L2 and streamed from
/// memory (`quant_dot tile`, LONGHAUL_BENCH_ROWS=98304; from L2, 70
/// against 78 and 89 against 100 Gitem/s, on a loaded machine).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_q5_0_512(nb: usize, w: &[BlockQ5_0], a: &[BlockQ8_0], out: &mut [f32]) {
    let (nr, nt) = (w.len() / nb, a.len() / nb);
    let (sc, ys) = offset_acts(nb, a);
    let (w, a, o) = (w.as_ptr(), a.as_ptr(), out.as_mut_ptr());
    run_pairs!(
        q5_0_pairs,
        2,
        nb,
        nr,
        nt,
        w,
        ys.as_ptr(),
        sc.as_ptr(),
        o,
        |r, t| {
            vnni_tiles::q5_0::<1, 1>(nb, w.add(r * nb), a.add(t * nb), o.add(t * nr + r), nr)
        }
    );
}

pub(crate) fn tile_q4_1(nb: usize, w: &[BlockQ4_1], a: &[BlockQ8_1], out: &mut [f32]) {
    if tile_shape(nb, w.len(), a.len(), out.len()) {
        // SAFETY: only selected when CpuCaps::has_avx512() (see module docs).
        unsafe { tile_q4_1_512(nb, w, a, out) }
    }
}

pub(crate) fn tile_q8_0(nb: usize, w: &[BlockQ8_0], a: &[BlockQ8_0], out: &mut [f32]) {
    if tile_shape(nb, w.len(), a.len(), out.len()) {
        // SAFETY: only selected when CpuCaps::has_avx512() (see module docs).
        unsafe { tile_q8_0_512(nb, w, a, out) }
    }
}

pub(crate) fn tile_q5_0(nb: usize, w: &[BlockQ5_0], a: &[BlockQ8_0], out: &mut [f32]) {
    if tile_shape(nb, w.len(), a.len(), out.len()) {
        // SAFETY: only selected when CpuCaps::has_avx512() (see module docs).
        unsafe { tile_q5_0_512(nb, w, a, out) }
    }
}

pub(crate) use super::ggml_f32::avx512::dot_f32;
