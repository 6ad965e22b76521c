//! Tile kernels (AVX2 instances here; the AVX-512 ones in `simd_x86_512`
//! reuse the macros): several weight rows against several activation rows
//! per call, each pair bit-identical to the one-row kernels of the parent.

use super::*;

// Tile kernels: several weight rows against several activation rows per
// call. Each (row, activation) pair keeps its own accumulators and runs the
// same operations in the same order as the one-row kernel above, so every
// result is bit-identical to it; interleaving independent pairs only hides
// the latency of the per-block FMA chains and shares the weight decoding
// (and the activation loads) between pairs.

/// A micro-kernel of `R` weight rows x `T` activation rows:
/// `micro(nb, w, a, out, ld)` reads rows `w + r * nb` and `a + t * nb` (`nb`
/// blocks each) and writes `out[t * ld + r]`.
pub(in crate::quant) type Micro<W, A> = unsafe fn(usize, *const W, *const A, *mut f32, usize);

/// The micro-kernels of one weight type at one instruction-set level.
pub(in crate::quant) struct Shapes<W, A> {
    /// Rows x activations of the main kernel, `rt`.
    pub r: usize,
    pub t: usize,
    pub rt: Micro<W, A>,
    /// `r` rows x 2 activations, and `r` rows x 1 (activation remainders).
    pub r2: Micro<W, A>,
    pub r1: Micro<W, A>,
    /// 1 row x `t` activations (row remainder).
    pub t1: Micro<W, A>,
    /// 1 x 1.
    pub one: Micro<W, A>,
    /// Rows of `gen`, the kernel for a single activation row (generation).
    pub gen_r: usize,
    pub gen: Micro<W, A>,
}

/// Whether a tile call's lengths are consistent: whole rows of `nb` blocks
/// and `out` the product of the row counts (the tile drivers write nothing
/// otherwise; the callers in `ops` check first).
pub(in crate::quant) fn tile_shape(nb: usize, nw: usize, na: usize, nout: usize) -> bool {
    nb != 0 && nw.is_multiple_of(nb) && na.is_multiple_of(nb) && nout == (nw / nb) * (na / nb)
}

/// `out[t * nr + r] = dot(row r of w, row t of a)` for `nr = w.len() / nb`
/// weight rows and `nt = a.len() / nb` activation rows, covered with the
/// micro-kernels of `s`. Inconsistent lengths write nothing (the callers in
/// `ops` check them first).
///
/// # Safety
/// The CPU must have the target features of the kernels in `s`.
#[inline(always)]
pub(in crate::quant) unsafe fn drive<W, A>(
    nb: usize,
    w: &[W],
    a: &[A],
    out: &mut [f32],
    s: &Shapes<W, A>,
) {
    if !tile_shape(nb, w.len(), a.len(), out.len()) {
        return;
    }
    let (nr, nt) = (w.len() / nb, a.len() / nb);
    let o = out.as_mut_ptr();
    if nt == 1 {
        let mut r0 = 0;
        while r0 < nr {
            let (rr, k) = if nr - r0 >= s.gen_r {
                (s.gen_r, s.gen)
            } else {
                (1, s.one)
            };
            k(nb, w.as_ptr().add(r0 * nb), a.as_ptr(), o.add(r0), nr);
            r0 += rr;
        }
        return;
    }
    let mut t0 = 0;
    while t0 < nt {
        // A full group of `s.t` activations, else two that share the weight
        // decoding (rather than decoding every weight block once per
        // activation), else one.
        let tn = if nt - t0 >= s.t {
            s.t
        } else if nt - t0 >= 2 && s.t > 2 {
            2
        } else {
            1
        };
        let at = |t: usize| a.as_ptr().add(t * nb);
        let mut r0 = 0;
        while r0 < nr {
            let wr = w.as_ptr().add(r0 * nb);
            if t0 == 0 {
                prefetch_rows(w.as_ptr().wrapping_add((r0 + PREFETCH_ROWS) * nb), s.r * nb);
            }
            if nr - r0 >= s.r {
                let k = match tn {
                    1 => s.r1,
                    2 if s.t > 2 => s.r2,
                    _ => s.rt,
                };
                k(nb, wr, at(t0), o.add(t0 * nr + r0), nr);
                r0 += s.r;
                continue;
            }
            if tn == s.t {
                (s.t1)(nb, wr, at(t0), o.add(t0 * nr + r0), nr);
            } else {
                for t in t0..t0 + tn {
                    (s.one)(nb, wr, at(t), o.add(t * nr + r0), nr);
                }
            }
            r0 += 1;
        }
        t0 += tn;
    }
}

/// Rows ahead of the current row group whose weights are requested while
/// the group computes (measured on Zen 4: one group ahead left the Q4_1 and
/// Q8_0 tiles waiting on memory at 8 activations, 16 rows did not).
pub(in crate::quant) const PREFETCH_ROWS: usize = 16;

/// Asks for the `n` blocks at `p` (a later row group) while this group
/// computes: the kernels read several rows
/// side by side, a pattern the hardware prefetchers follow poorly (a Q8_0
/// tile of two activations streamed 5 GB/s from memory without this, where
/// the one-row kernel streams 25). Prefetches never fault, so `p` may point
/// past the weights.
#[inline(always)]
pub(in crate::quant) unsafe fn prefetch_rows<W>(p: *const W, n: usize) {
    let p = p as *const i8;
    for off in (0..n * size_of::<W>()).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off));
    }
}

/// The micro-kernels of the tile kernels, generated once per instruction
/// set: `$dp(acc, u, s)` adds the sums of four adjacent products of unsigned
/// `u` (small enough that `maddubs` cannot saturate) and signed `s` to the
/// i32 lanes of `acc`; `$dpw(acc, x, y)` adds `madd_epi16(x, y)`; `$q8w`
/// prepares a weight block's values ([`Q0Block::values`]), `$q8a` a Q8_0
/// activation block, and `$q8p` gives their
/// products as i32 lanes, each the sum of four adjacent byte products.
/// All are exact integer operations, so the lanes equal the one-row
/// kernels' lanes whatever instructions compute them.
macro_rules! tile_kernels {
    ($m:ident, $feat:literal, $dp:path, $dpw:path, $q8w:path, $q8a:path, $q8p:path) => {
        pub(in crate::quant) mod $m {
            #[allow(unused_imports)]
            use super::*;
            use $crate::quant::simd_x86::{
                bits_32, h2f, h2f_pair, hsum_ps, hsum_ps4, load32, nibbles_32, Q0Block,
            };
            use $crate::quant::{BlockQ4K, BlockQ4_1, BlockQ5_0, BlockQ8K, BlockQ8_0, BlockQ8_1};

            /// Lane `r` (< 4) of both 128-bit halves, broadcast.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn lane(v: __m256, r: usize) -> __m256 {
                match r {
                    0 => _mm256_permute_ps::<0x00>(v),
                    1 => _mm256_permute_ps::<0x55>(v),
                    2 => _mm256_permute_ps::<0xAA>(v),
                    _ => _mm256_permute_ps::<0xFF>(v),
                }
            }

            /// Four halves as four floats.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn halves4(h: [u16; 4]) -> __m128 {
                let bits =
                    h[0] as u64 | (h[1] as u64) << 16 | (h[2] as u64) << 32 | (h[3] as u64) << 48;
                _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64))
            }

            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn lanes4(v: __m128) -> [f32; 4] {
                let mut o = [0f32; 4];
                _mm_storeu_ps(o.as_mut_ptr(), v);
                o
            }

            /// `dot_q4_1_avx2` for `R <= 4` rows x `T` activations.
            #[target_feature(enable = $feat)]
            pub(in super::super) unsafe fn q4_1<const R: usize, const T: usize>(
                nb: usize,
                w: *const BlockQ4_1,
                a: *const BlockQ8_1,
                out: *mut f32,
                ld: usize,
            ) {
                let mut acc = [[_mm256_setzero_ps(); T]; R];
                let mut summs = [_mm_setzero_ps(); T];
                for b in 0..nb {
                    let mut hd = [0u16; 4];
                    let mut hm = [0u16; 4];
                    let mut q = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let x = &*w.add(r * nb + b);
                        hd[r] = x.d.to_bits();
                        hm[r] = x.m.to_bits();
                        q[r] = nibbles_32(&x.qs);
                    }
                    let xd = halves4(hd);
                    let xm = halves4(hm);
                    let xd8 = _mm256_set_m128(xd, xd);
                    for t in 0..T {
                        let y = &*a.add(t * nb + b);
                        let (yd, ys) = h2f_pair(y.d.to_bits(), y.s.to_bits());
                        // ggml's `summs += m * s` (an FMA), four rows at once.
                        summs[t] = _mm_fmadd_ps(xm, _mm_set1_ps(ys), summs[t]);
                        let dv = _mm256_mul_ps(xd8, _mm256_set1_ps(yd));
                        let yq = load32(&y.qs);
                        for r in 0..R {
                            let p = $dp(_mm256_setzero_si256(), q[r], yq);
                            acc[r][t] =
                                _mm256_fmadd_ps(lane(dv, r), _mm256_cvtepi32_ps(p), acc[r][t]);
                        }
                    }
                }
                for t in 0..T {
                    let s = lanes4(summs[t]);
                    for r in 0..R {
                        *out.add(t * ld + r) = hsum_ps(acc[r][t]) + s[r];
                    }
                }
            }

            /// `tinyBLAS_Q0_AVX` for `R <= 4` rows x `T` activations of a
            /// [`Q0Block`] type (for Q8_0 also `dot_q8_0_avx2`): per pair and
            /// block `acc = fma(dw * da, lanes, acc)`, then `hsum`. Each
            /// weight block is decoded once for the `T` activations.
            #[target_feature(enable = $feat)]
            pub(in crate::quant) unsafe fn q0<B: Q0Block, const R: usize, const T: usize>(
                nb: usize,
                w: *const B,
                a: *const BlockQ8_0,
                out: *mut f32,
                ld: usize,
            ) {
                let mut acc = [[_mm256_setzero_ps(); T]; R];
                for b in 0..nb {
                    let mut hd = [0u16; 4];
                    let mut q = [[_mm256_setzero_si256(); 2]; R];
                    for r in 0..R {
                        let x = &*w.add(r * nb + b);
                        hd[r] = x.d_bits();
                        q[r] = $q8w(x.values());
                    }
                    let xd = halves4(hd);
                    let xd8 = _mm256_set_m128(xd, xd);
                    for t in 0..T {
                        let y = &*a.add(t * nb + b);
                        let dv = _mm256_mul_ps(xd8, _mm256_set1_ps(h2f(y.d)));
                        let ya = $q8a(&y.qs);
                        for r in 0..R {
                            let p = $q8p(&q[r], &ya);
                            acc[r][t] =
                                _mm256_fmadd_ps(lane(dv, r), _mm256_cvtepi32_ps(p), acc[r][t]);
                        }
                    }
                }
                for t in 0..T {
                    for r in 0..R {
                        *out.add(t * ld + r) = hsum_ps(acc[r][t]);
                    }
                }
            }

            /// [`q0`] for Q8_0.
            #[target_feature(enable = $feat)]
            pub(in super::super) unsafe fn q8_0<const R: usize, const T: usize>(
                nb: usize,
                w: *const BlockQ8_0,
                a: *const BlockQ8_0,
                out: *mut f32,
                ld: usize,
            ) {
                q0::<BlockQ8_0, R, T>(nb, w, a, out, ld)
            }

            /// `dot_q5_0_avx2` for `R <= 4` rows x `T` activations. The
            /// weights are decoded as unsigned `q + 16` (0..32, where the
            /// one-row kernel takes the signed `q`), so each lane is
            /// `sum((q + 16) * y) - 16 * sum(y)` over its four bytes: the
            /// same integer, with the correction paid once per activation
            /// block for all `R` rows. The scales and the FMA chain are the
            /// one-row kernel's (`d = dx * dy` as `block_scales` has it).
            #[target_feature(enable = $feat)]
            pub(in super::super) unsafe fn q5_0<const R: usize, const T: usize>(
                nb: usize,
                w: *const BlockQ5_0,
                a: *const BlockQ8_0,
                out: *mut f32,
                ld: usize,
            ) {
                let ones = _mm256_set1_epi8(1);
                let m5 = _mm256_set1_epi8(0x10);
                let mut acc = [[_mm256_setzero_ps(); T]; R];
                for b in 0..nb {
                    let mut hd = [0u16; 4];
                    let mut q = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let x = &*w.add(r * nb + b);
                        hd[r] = x.d.to_bits();
                        q[r] =
                            _mm256_or_si256(nibbles_32(&x.qs), _mm256_and_si256(bits_32(x.qh), m5));
                    }
                    let xd = halves4(hd);
                    let xd8 = _mm256_set_m128(xd, xd);
                    for t in 0..T {
                        let y = &*a.add(t * nb + b);
                        let dv = _mm256_mul_ps(xd8, _mm256_set1_ps(h2f(y.d)));
                        let yq = load32(&y.qs);
                        let sum = $dp(_mm256_setzero_si256(), ones, yq);
                        let corr =
                            _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 4));
                        for r in 0..R {
                            let p = $dp(corr, q[r], yq);
                            acc[r][t] =
                                _mm256_fmadd_ps(lane(dv, r), _mm256_cvtepi32_ps(p), acc[r][t]);
                        }
                    }
                }
                for t in 0..T {
                    for r in 0..R {
                        *out.add(t * ld + r) = hsum_ps(acc[r][t]);
                    }
                }
            }

            /// `dot_q4_k_avx2` for `R <= 4` rows x `T` activations.
            #[target_feature(enable = $feat)]
            pub(in super::super) unsafe fn q4_k<const R: usize, const T: usize>(
                nb: usize,
                w: *const BlockQ4K,
                a: *const BlockQ8K,
                out: *mut f32,
                ld: usize,
            ) {
                let m4 = _mm256_set1_epi8(0x0F);
                let mut acc = [[_mm256_setzero_ps(); T]; R];
                let mut acc_m = [[_mm_setzero_ps(); T]; R];
                for b in 0..nb {
                    let mut hd = [0u16; 4];
                    let mut hm = [0u16; 4];
                    let mut sc = [[0u8; 8]; R];
                    let mut mins = [_mm_setzero_si128(); 4];
                    for r in 0..R {
                        let x = &*w.add(r * nb + b);
                        hd[r] = x.d.to_bits();
                        hm[r] = x.dmin.to_bits();
                        let (s, m) = x.scale_mins();
                        sc[r] = s;
                        mins[r] = _mm_cvtepu8_epi16(_mm_loadl_epi64(m.as_ptr() as *const __m128i));
                    }
                    let xd = halves4(hd);
                    let xd8 = _mm256_set_m128(xd, xd);
                    let xdmin = halves4(hm);
                    let mut dv = [_mm256_setzero_ps(); T];
                    for t in 0..T {
                        let y = &*a.add(t * nb + b);
                        // `mins_fma` of each row: four lanes per (row,
                        // activation), `dmin = -(y.d * x.dmin)`.
                        let bs = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
                        let pairs = _mm_hadd_epi16(
                            _mm256_castsi256_si128(bs),
                            _mm256_extracti128_si256(bs, 1),
                        );
                        let dmin = lanes4(_mm_mul_ps(_mm_set1_ps(-y.d), xdmin));
                        for r in 0..R {
                            let p = _mm_cvtepi32_ps(_mm_madd_epi16(mins[r], pairs));
                            acc_m[r][t] = _mm_fmadd_ps(_mm_set1_ps(dmin[r]), p, acc_m[r][t]);
                        }
                        dv[t] = _mm256_mul_ps(xd8, _mm256_set1_ps(y.d));
                    }
                    let mut sumi = [[_mm256_setzero_si256(); T]; R];
                    for c in 0..4 {
                        let mut lo = [_mm256_setzero_si256(); R];
                        let mut hi = [_mm256_setzero_si256(); R];
                        let mut s0 = [_mm256_setzero_si256(); R];
                        let mut s1 = [_mm256_setzero_si256(); R];
                        for r in 0..R {
                            let x = &*w.add(r * nb + b);
                            let q4 =
                                _mm256_loadu_si256(x.qs.as_ptr().add(32 * c) as *const __m256i);
                            lo[r] = _mm256_and_si256(q4, m4);
                            hi[r] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
                            s0[r] = _mm256_set1_epi16(sc[r][2 * c] as i16);
                            s1[r] = _mm256_set1_epi16(sc[r][2 * c + 1] as i16);
                        }
                        for t in 0..T {
                            let y = &*a.add(t * nb + b);
                            let ylo = load32(&y.qs[64 * c..]);
                            let yhi = load32(&y.qs[64 * c + 32..]);
                            for r in 0..R {
                                let plo = _mm256_maddubs_epi16(lo[r], ylo);
                                let phi = _mm256_maddubs_epi16(hi[r], yhi);
                                sumi[r][t] = $dpw($dpw(sumi[r][t], plo, s0[r]), phi, s1[r]);
                            }
                        }
                    }
                    for t in 0..T {
                        for r in 0..R {
                            acc[r][t] = _mm256_fmadd_ps(
                                lane(dv[t], r),
                                _mm256_cvtepi32_ps(sumi[r][t]),
                                acc[r][t],
                            );
                        }
                    }
                }
                for t in 0..T {
                    for r in 0..R {
                        *out.add(t * ld + r) = hsum_ps(acc[r][t]) + hsum_ps4(acc_m[r][t]);
                    }
                }
            }
        }
    };
}
pub(in crate::quant) use tile_kernels;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dp_avx2(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_add_epi32(acc, mul_sum_u8_i8(u, s))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dpw_avx2(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(x, y))
}

/// A weight block's values for the sign trick: magnitudes and bytes. A
/// byte of -128 has the magnitude 128 as an unsigned byte, and two such
/// products with activations in `[-127, 127]` sum to at most 32512, so
/// `maddubs` never saturates.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8w_sign(x: __m256i) -> [__m256i; 2] {
    [_mm256_sign_epi8(x, x), x]
}

/// A Q8_0 activation block (its values lie in `[-127, 127]`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8a_load(qs: &[i8; 32]) -> __m256i {
    load32(qs)
}

/// The lanes of `dot_q8_0_avx2` (`mul_sum_i8_pairs`) from a prepared
/// weight block: `|x| * sign(y, x)` per byte, four bytes to a lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8p_sign(x: &[__m256i; 2], y: &__m256i) -> __m256i {
    mul_sum_u8_i8(x[0], _mm256_sign_epi8(*y, x[1]))
}

tile_kernels!(
    avx2_tiles,
    "avx2,fma,f16c",
    dp_avx2,
    dpw_avx2,
    q8w_sign,
    q8a_load,
    q8p_sign
);

/// The 32-weight blocks whose values decode to signed bytes, against Q8_0
/// activations: what llamafile's `tinyBLAS_Q0_AVX` multiplies (ggml's CPU
/// backend hands it two or more activation rows of these types).
pub(in crate::quant) trait Q0Block {
    /// The block's f16 scale, as bits.
    fn d_bits(&self) -> u16;
    /// The 32 values as signed bytes (tinyBLAS's `load`).
    ///
    /// # Safety
    /// The CPU must have AVX2; inlined into the tile kernels.
    unsafe fn values(&self) -> __m256i;
}

impl Q0Block for BlockQ8_0 {
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        _mm256_loadu_si256(self.qs.as_ptr() as *const __m256i)
    }
}

impl Q0Block for BlockQ4_0 {
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        _mm256_sub_epi8(nibbles_32(&self.qs), _mm256_set1_epi8(8))
    }
}

impl Q0Block for BlockIQ4NL {
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        let lut = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
        _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(lut), nibbles_32(&self.qs))
    }
}

/// The AVX2 [`avx2_tiles::q0`] of each [`Q0Block`] type but Q8_0 (whose
/// kernel the tile macro names at both levels), for `shapes!`.
pub(in crate::quant) mod q0_tiles {
    use super::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::quant) unsafe fn q4_0<const R: usize, const T: usize>(
        nb: usize,
        w: *const BlockQ4_0,
        a: *const BlockQ8_0,
        out: *mut f32,
        ld: usize,
    ) {
        avx2_tiles::q0::<BlockQ4_0, R, T>(nb, w, a, out, ld)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::quant) unsafe fn iq4_nl<const R: usize, const T: usize>(
        nb: usize,
        w: *const BlockIQ4NL,
        a: *const BlockQ8_0,
        out: *mut f32,
        ld: usize,
    ) {
        avx2_tiles::q0::<BlockIQ4NL, R, T>(nb, w, a, out, ld)
    }
}

macro_rules! shapes {
    ($m:ident :: $k:ident, ($r:literal x $t:literal), gen $g:literal) => {
        Shapes {
            r: $r,
            t: $t,
            rt: $m::$k::<$r, $t>,
            r2: $m::$k::<$r, 2>,
            r1: $m::$k::<$r, 1>,
            t1: $m::$k::<1, $t>,
            one: $m::$k::<1, 1>,
            gen_r: $g,
            gen: $m::$k::<$g, 1>,
        }
    };
}
pub(in crate::quant) use shapes;

macro_rules! tile_wrapper {
    ($name:ident, $w:ty, $a:ty, $shapes:expr) => {
        pub(crate) fn $name(nb: usize, w: &[$w], a: &[$a], out: &mut [f32]) {
            // SAFETY: only selected when the CPU has the kernels' features
            // (see module docs); `drive` checks the lengths.
            unsafe { drive(nb, w, a, out, &$shapes) }
        }
    };
}
pub(in crate::quant) use tile_wrapper;

tile_wrapper!(
    tile_q4_1,
    BlockQ4_1,
    BlockQ8_1,
    shapes!(avx2_tiles::q4_1, (4 x 2), gen 4)
);
tile_wrapper!(
    tile_q8_0,
    BlockQ8_0,
    BlockQ8_0,
    shapes!(avx2_tiles::q8_0, (4 x 2), gen 4)
);
tile_wrapper!(
    tile_q5_0,
    BlockQ5_0,
    BlockQ8_0,
    shapes!(avx2_tiles::q5_0, (2 x 4), gen 4)
);
tile_wrapper!(
    tile_q4_k,
    BlockQ4K,
    BlockQ8K,
    shapes!(avx2_tiles::q4_k, (2 x 2), gen 4)
);
tile_wrapper!(
    tile_q4_0,
    BlockQ4_0,
    BlockQ8_0,
    shapes!(q0_tiles::q4_0, (4 x 2), gen 4)
);
tile_wrapper!(
    tile_iq4_nl,
    BlockIQ4NL,
    BlockQ8_0,
    shapes!(q0_tiles::iq4_nl, (4 x 2), gen 4)
);
