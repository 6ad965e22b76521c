//! The kernel over Q6_K's interleaved layout (`quant::layout`'s `q6_k`):
//! groups of eight rows, one row per 32-bit lane, against Q8_K activation
//! rows, in the order of ggml's x86 `ggml_vec_dot_q6_K_q8_K` (AVX2), which
//! llama.cpp runs at its defaults for products of fewer than eight rows
//! (ggml does not repack Q6_K on x86). That kernel keeps eight i32 lanes
//! per super-block: lane `l` sums, over the eight 32-value groups `g`,
//! values `32g + 4l..+4` times their 6-bit codes times the scale of their
//! 16 (`sc[2g + l / 4]`), minus `32 · (sc[2l] · bsums[2l] + sc[2l + 1] ·
//! bsums[2l + 1])` for the codes' offset; then
//! `acc_l = fma(d_a · d_w, f32(lane_l), acc_l)` per super-block, and at
//! the end `((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) +
//! (acc_3 + acc_7))`. Here accumulator `l` is a vector whose lane `r` is
//! row `r`'s `acc_l`, and the tree is the same adds on whole vectors. Any
//! way of computing the lanes' integers gives the same bits.
//!
//! A group's super-block (1680 bytes, [`GROUP_BLOCK`]):
//!
//! - at 0, the rows' `ql` in 4-byte chunks, chunk `c` of row `r` at
//!   `(8c + r) · 4`. With `c = 16n + 8u + l`, its low nibbles are values
//!   `4l..+4` of group `4n + u`, its high nibbles those of group
//!   `4n + u + 2`;
//! - at 1024, the rows' `qh` the same way: chunk `8n + l`'s bits `2s..+2`
//!   are the top bits of values `4l..+4` of group `4n + s`;
//! - at 1536, the scales in pairs, pair `p` (`sc[2p]`, `sc[2p + 1]`) of row
//!   `r` at `16p + 2r`;
//! - at 1664, the rows' `d` (`f16`).

use super::super::layout::q6_k::{D, GROUP_BLOCK, QH, SCALES};
use super::super::BlockQ8K;
use std::arch::x86_64::*;

/// `vpternlogd`'s table for `a ? b : c`, bit by bit (`a` the mask).
const SELECT: i32 = 0xCA;

/// One group (`nb` super-blocks of [`GROUP_BLOCK`] bytes at `g`) against
/// `N` activation rows at once (each weight chunk unpacked once for all of
/// them): row `t`'s eight products in `out[t]`, in `vec_dot`'s order.
///
/// The four values of a chunk against the activation's four (`maddubs`,
/// codes `0..64` against `-128..128`: at most 16128 per pair, no
/// saturation) and times the row's scale (`vpdpwssd`) add to the lane
/// exactly; the offset starts each lane as `-32 · sc` times the block sums.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C and AVX-512 F + BW + VL + VNNI; `g`
/// must hold as many group super-blocks as each of `a` holds blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot8<const N: usize>(g: &[u8], a: [&[BlockQ8K]; N], out: &mut [[f32; 8]; N]) {
    let nb = a.first().map_or(0, |a| a.len());
    debug_assert!(g.len() >= nb * GROUP_BLOCK && a.iter().all(|a| a.len() == nb));
    let zero = _mm256_setzero_si256();
    let m4 = _mm256_set1_epi8(0x0F);
    // Within each row's dword of i16 scale pairs: the even scale twice, or
    // the odd one twice (`vpshufb` indexes bytes of a 128-bit lane).
    let dup = |o: i8| {
        let row = |r: i8| [4 * r + o, 4 * r + o + 1];
        let [a, b, c, d] = [row(0), row(1), row(2), row(3)];
        _mm256_broadcastsi128_si256(_mm_setr_epi8(
            a[0], a[1], a[0], a[1], b[0], b[1], b[0], b[1], c[0], c[1], c[0], c[1], d[0], d[1],
            d[0], d[1],
        ))
    };
    let dup = [dup(0), dup(2)];
    let mut acc = [[_mm256_setzero_ps(); 8]; N];
    for (b, p) in g.chunks_exact(GROUP_BLOCK).take(nb).enumerate() {
        let p = p.as_ptr();
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.add(D) as *const __m128i));
        let y: [&BlockQ8K; N] = std::array::from_fn(|t| &a[t][b]);
        // Per pair `j`: the offset's factors (`-32 · sc`, i16 pairs per row)
        // and the scale of each half of group `j`, twice per row.
        let mut off = [zero; 8];
        let mut sc = [[zero; 2]; 8];
        for j in 0..8 {
            let pair = _mm_loadu_si128(p.add(SCALES + 16 * j) as *const __m128i);
            let s16 = _mm256_cvtepi8_epi16(pair);
            off[j] = _mm256_mullo_epi16(s16, _mm256_set1_epi16(-32));
            sc[j] = [
                _mm256_shuffle_epi8(s16, dup[0]),
                _mm256_shuffle_epi8(s16, dup[1]),
            ];
        }
        for l in 0..8 {
            let mut lane: [__m256i; N] = std::array::from_fn(|t| {
                let bs = (y[t].bsums.as_ptr().add(2 * l) as *const i32).read_unaligned();
                _mm256_dpwssd_epi32(zero, off[l], _mm256_set1_epi32(bs))
            });
            for n in 0..2 {
                let at = |c: usize| p.add(32 * c) as *const __m256i;
                let ql0 = _mm256_loadu_si256(at(16 * n + l));
                let ql1 = _mm256_loadu_si256(at(16 * n + 8 + l));
                let qh = _mm256_loadu_si256(at(QH / 32 + 8 * n + l));
                let top = |bits: i8| _mm256_and_si256(qh, _mm256_set1_epi8(bits));
                // Groups 4n .. 4n + 4: a nibble, then its two top bits
                // moved to bits 4..6 with the other bits clear.
                let v = [
                    _mm256_ternarylogic_epi32::<SELECT>(m4, ql0, _mm256_slli_epi16::<4>(top(0x03))),
                    _mm256_ternarylogic_epi32::<SELECT>(m4, ql1, _mm256_slli_epi16::<2>(top(0x0C))),
                    _mm256_ternarylogic_epi32::<SELECT>(m4, _mm256_srli_epi16::<4>(ql0), top(0x30)),
                    _mm256_ternarylogic_epi32::<SELECT>(
                        m4,
                        _mm256_srli_epi16::<4>(ql1),
                        _mm256_srli_epi16::<2>(top(-0x40)),
                    ),
                ];
                for (s, v) in v.into_iter().enumerate() {
                    let gi = 4 * n + s;
                    for t in 0..N {
                        let q8 = y[t].qs.as_ptr().add(32 * gi + 4 * l) as *const i32;
                        let prod = _mm256_maddubs_epi16(v, _mm256_set1_epi32(q8.read_unaligned()));
                        lane[t] = _mm256_dpwssd_epi32(lane[t], prod, sc[gi][l / 4]);
                    }
                }
            }
            for t in 0..N {
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(y[t].d));
                acc[t][l] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lane[t]), acc[t][l]);
            }
        }
    }
    for t in 0..N {
        let a = &acc[t];
        let even = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
        let odd = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
        _mm256_storeu_ps(out[t].as_mut_ptr(), _mm256_add_ps(even, odd));
    }
}
