//! Blocks the tiled kernels read from the interleaved layouts that keep
//! the plain kernels' bits (`layout::q6_k`, `layout::iq4_xs`): each row's
//! block comes into the same [`Tile`] as from its GGUF bytes.

use super::{Blocks, Tile, TiledBlock};
use crate::quant::{BlockIQ4XS, BlockQ6K};
use half::f16;

/// Q6_K rows in their interleaved layout (`layout::q6_k`: groups of eight
/// rows, super-block by super-block), decoded where they lie: each row's
/// codes come from its 4-byte chunks, as `BlockQ6K::quants` takes them
/// from the plain bytes, so the tiles and the bits are the plain rows'.
pub(crate) struct Q6KGroups<'a> {
    /// Whole groups of `nb` super-blocks.
    pub(crate) bytes: &'a [u8],
}

impl Blocks<BlockQ6K> for Q6KGroups<'_> {
    fn len(&self) -> usize {
        self.bytes.len() / std::mem::size_of::<BlockQ6K>()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_at(&self, nb: usize, r: usize, j: usize, t: &mut Tile) {
        use crate::quant::layout::{q6_k::GROUP_BLOCK, GROUP_ROWS};
        let at = ((r / GROUP_ROWS) * nb + j) * GROUP_BLOCK;
        decode_q6k_row(&self.bytes[at..at + GROUP_BLOCK], r % GROUP_ROWS, t)
    }
}

/// Row `rr`'s block from one interleaved Q6_K group super-block `p` (see
/// [`Q6KGroups`]). No closures: they would not inherit the features.
///
/// # Safety
/// The CPU has AVX2; `p` is one group super-block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode_q6k_row(p: &[u8], rr: usize, t: &mut Tile) {
    use crate::quant::layout::q6_k::{D, GROUP_BLOCK, QH, SCALES};
    use std::arch::x86_64::*;
    assert!(p.len() == GROUP_BLOCK && rr < 8);
    // Eight chunks of the row 32 bytes apart: 32 bytes of its `ql` or `qh`
    // in their plain order.
    let base = p.as_ptr().add(4 * rr) as *const i32;
    let stride = _mm256_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56);
    let (m4, m3, off) = (
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi8(3),
        _mm256_set1_epi8(32),
    );
    let q = t.q.as_mut_ptr() as *mut __m256i;
    for n in 0..2 {
        let qh = _mm256_i32gather_epi32::<4>(base.add(8 * (QH / 32 + 8 * n)), stride);
        // Top bits of groups 4n .. 4n + 4, at bits 4..6 of each byte.
        let top = [
            _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3)),
            _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_slli_epi16::<2>(m3))),
            _mm256_and_si256(qh, _mm256_slli_epi16::<4>(m3)),
            _mm256_srli_epi16::<2>(_mm256_and_si256(qh, _mm256_slli_epi16::<6>(m3))),
        ];
        for u in 0..2 {
            let ql = _mm256_i32gather_epi32::<4>(base.add(8 * (16 * n + 8 * u)), stride);
            let lo = _mm256_or_si256(_mm256_and_si256(ql, m4), top[u]);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql), m4), top[u + 2]);
            _mm256_storeu_si256(q.add(4 * n + u), _mm256_sub_epi8(lo, off));
            _mm256_storeu_si256(q.add(4 * n + u + 2), _mm256_sub_epi8(hi, off));
        }
    }
    for (g, sc) in t.sc.iter_mut().enumerate() {
        *sc = p[SCALES + 16 * (g / 2) + 2 * rr + g % 2] as i8 as i16;
    }
    t.d0 = f16::from_le_bytes([p[D + 2 * rr], p[D + 2 * rr + 1]]).to_f32();
}

/// IQ4_XS rows in their interleaved layout (`layout::iq4_xs`), each block
/// gathered back into its plain bytes (the row's 4-byte `qs` chunks lie 32
/// bytes apart) and decoded as those are.
pub(crate) struct IQ4XSGroups<'a> {
    /// Whole groups of `nb` super-blocks.
    pub(crate) bytes: &'a [u8],
}

impl Blocks<BlockIQ4XS> for IQ4XSGroups<'_> {
    fn len(&self) -> usize {
        self.bytes.len() / std::mem::size_of::<BlockIQ4XS>()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode_at(&self, nb: usize, r: usize, j: usize, t: &mut Tile) {
        use crate::quant::layout::{iq4_xs::GROUP_BLOCK, GROUP_ROWS};
        let at = ((r / GROUP_ROWS) * nb + j) * GROUP_BLOCK;
        iq4xs_row(&self.bytes[at..at + GROUP_BLOCK], r % GROUP_ROWS).decode_simd(t)
    }
}

/// Row `rr`'s plain block from one interleaved IQ4_XS group super-block.
///
/// # Safety
/// The CPU has AVX2; `p` is one group super-block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn iq4xs_row(p: &[u8], rr: usize) -> BlockIQ4XS {
    use crate::quant::layout::iq4_xs::{D, GROUP_BLOCK, SCALES_H, SCALES_L};
    use std::arch::x86_64::*;
    assert!(p.len() == GROUP_BLOCK && rr < 8);
    let base = p.as_ptr().add(4 * rr) as *const i32;
    let stride = _mm256_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56);
    let mut qs = [0u8; 128];
    for i in 0..4 {
        let v = _mm256_i32gather_epi32::<4>(base.add(64 * i), stride);
        _mm256_storeu_si256(qs.as_mut_ptr().add(32 * i) as *mut __m256i, v);
    }
    let two = |at: usize| [p[at + 2 * rr], p[at + 2 * rr + 1]];
    BlockIQ4XS {
        d: f16::from_le_bytes(two(D)),
        scales_h: u16::from_le_bytes(two(SCALES_H)),
        scales_l: std::array::from_fn(|i| p[SCALES_L + 4 * rr + i]),
        qs,
    }
}
