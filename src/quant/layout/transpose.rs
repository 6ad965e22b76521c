//! The moves every interleaved layout makes of its rows' bytes: quants in
//! 4-byte chunks, chunk `c` of row `r` to bytes `(8c + r) * 4` of the
//! group's quants ([`chunks`]), and single bytes, byte `i` of row `r` to
//! `8i + r` ([`bytes`]). Each is the transpose of an 8 x n matrix (of
//! `u32`, of bytes), done with SSE2 (every x86-64 CPU has it) and piece by
//! piece elsewhere; a slot converts every expert it reads this way, on the
//! reading thread.

use super::GROUP_ROWS;

/// Writes `rows[r]`'s chunk `c` (bytes `4c..4c + 4`) to
/// `out[(8c + r) * 4..][..4]`, for the chunks every row and `out` hold.
#[inline]
pub(super) fn chunks(rows: [&[u8]; GROUP_ROWS], out: &mut [u8]) {
    pieces::<4>(rows, out)
}

/// Writes `rows[r][i]` to `out[8i + r]`, for the bytes every row and `out`
/// hold.
#[inline]
pub(super) fn bytes(rows: [&[u8]; GROUP_ROWS], out: &mut [u8]) {
    pieces::<1>(rows, out)
}

/// Writes `rows[r]`'s `W`-byte piece `p` to `out[(8p + r) * W..][..W]`, for
/// the pieces every row and `out` hold
/// (`n = min(rows[r].len() / W, out.len() / 8W)`).
#[inline(always)]
fn pieces<const W: usize>(rows: [&[u8]; GROUP_ROWS], out: &mut [u8]) {
    let n = rows
        .iter()
        .map(|r| r.len() / W)
        .fold(out.len() / (W * GROUP_ROWS), usize::min);
    // SAFETY: every row holds `W * n` bytes and `out` `8W * n`. The chunk
    // transposes load 16 bytes at `4c` of each row and store 128 at `32c`
    // for `c + 4 <= n - n % 4`; the byte transposes load 16 or 8 bytes at
    // `i` and store 128 or 64 at `8i` while `i + 16`, or `i + 8`, is at
    // most `n - n % 8`.
    #[cfg(target_arch = "x86_64")]
    let done = unsafe {
        match W {
            4 => chunks_sse2(&rows, out, n - n % 4),
            1 => bytes_sse2(&rows, out, n - n % 8),
            _ => 0,
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for p in done..n {
        for (r, row) in rows.iter().enumerate() {
            out[(GROUP_ROWS * p + r) * W..][..W].copy_from_slice(&row[W * p..W * p + W]);
        }
    }
}

/// The first `n` chunks (a multiple of four), four at a time: two 4 x 4
/// transposes of `u32` (rows 0..4 and 4..8) per four chunks. Returns `n`.
///
/// # Safety
/// Every row must hold `4n` bytes and `out` `32n`.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn chunks_sse2(rows: &[&[u8]; GROUP_ROWS], out: &mut [u8], n: usize) -> usize {
    use std::arch::x86_64::*;
    let dst = out.as_mut_ptr();
    for c in (0..n).step_by(4) {
        for half in 0..2 {
            let load = |r: usize| {
                _mm_loadu_si128(rows[4 * half + r].as_ptr().add(4 * c) as *const __m128i)
            };
            let (a0, a1, a2, a3) = (load(0), load(1), load(2), load(3));
            // (a0[0] a1[0] a0[1] a1[1]), (a0[2] a1[2] a0[3] a1[3]), and the
            // same of rows 2 and 3.
            let (t0, t1) = (_mm_unpacklo_epi32(a0, a1), _mm_unpackhi_epi32(a0, a1));
            let (t2, t3) = (_mm_unpacklo_epi32(a2, a3), _mm_unpackhi_epi32(a2, a3));
            let chunk = [
                _mm_unpacklo_epi64(t0, t2),
                _mm_unpackhi_epi64(t0, t2),
                _mm_unpacklo_epi64(t1, t3),
                _mm_unpackhi_epi64(t1, t3),
            ];
            for (i, v) in chunk.into_iter().enumerate() {
                let at = (GROUP_ROWS * (c + i) + 4 * half) * 4;
                _mm_storeu_si128(dst.add(at) as *mut __m128i, v);
            }
        }
    }
    n
}

/// The first `n` bytes of each row (a multiple of 8), sixteen at a time
/// and the last eight alone: 8 x 16 (8 x 8) byte transposes. Returns `n`.
///
/// # Safety
/// Every row must hold `n` bytes and `out` `8n`.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn bytes_sse2(rows: &[&[u8]; GROUP_ROWS], out: &mut [u8], n: usize) -> usize {
    use std::arch::x86_64::*;
    let dst = out.as_mut_ptr();
    let mut i = 0;
    while i < n {
        let wide = n - i >= 16;
        let a: [__m128i; GROUP_ROWS] = std::array::from_fn(|r| {
            let p = rows[r].as_ptr().add(i) as *const __m128i;
            if wide {
                _mm_loadu_si128(p)
            } else {
                _mm_loadl_epi64(p)
            }
        });
        // Rows 4h..4h + 4: their bytes 0..4, 4..8, 8..12 and 12..16, four
        // rows' bytes per position.
        let quads = |h: usize| {
            let (a0, a1, a2, a3) = (a[4 * h], a[4 * h + 1], a[4 * h + 2], a[4 * h + 3]);
            let (lo01, hi01) = (_mm_unpacklo_epi8(a0, a1), _mm_unpackhi_epi8(a0, a1));
            let (lo23, hi23) = (_mm_unpacklo_epi8(a2, a3), _mm_unpackhi_epi8(a2, a3));
            [
                _mm_unpacklo_epi16(lo01, lo23),
                _mm_unpackhi_epi16(lo01, lo23),
                _mm_unpacklo_epi16(hi01, hi23),
                _mm_unpackhi_epi16(hi01, hi23),
            ]
        };
        let (x, y) = (quads(0), quads(1));
        let width = if wide { 16 } else { 8 };
        for q in 0..width / 4 {
            // Bytes 4q, 4q + 1 of all eight rows, then 4q + 2, 4q + 3.
            let at = dst.add(GROUP_ROWS * (i + 4 * q));
            _mm_storeu_si128(at as *mut __m128i, _mm_unpacklo_epi32(x[q], y[q]));
            _mm_storeu_si128(at.add(16) as *mut __m128i, _mm_unpackhi_epi32(x[q], y[q]));
        }
        i += width;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every chunk count from none to two SIMD steps and a ragged rest,
    /// against the definition, with the rows' lengths unequal (the shortest
    /// decides) and `out` longer than needed (its tail untouched).
    #[test]
    fn chunks_land_where_the_layout_says() {
        for n in 0..=11usize {
            let rows: Vec<Vec<u8>> = (0..GROUP_ROWS)
                .map(|r| {
                    (0..4 * n + 4 * (r % 2))
                        .map(|i| (r * 64 + i) as u8 ^ 0x5a)
                        .collect()
                })
                .collect();
            let refs: [&[u8]; GROUP_ROWS] = std::array::from_fn(|r| rows[r].as_slice());
            let mut out = vec![0xEEu8; 32 * n + 7];
            chunks(refs, &mut out);
            for c in 0..n {
                for (r, row) in rows.iter().enumerate() {
                    let at = (8 * c + r) * 4;
                    assert_eq!(
                        out[at..at + 4],
                        row[4 * c..4 * c + 4],
                        "n {n} chunk {c} row {r}"
                    );
                }
            }
            assert!(
                out[32 * n..].iter().all(|&b| b == 0xEE),
                "n {n}: tail written"
            );
        }
    }

    /// Every byte count from none to two SIMD steps and a ragged rest,
    /// against the definition, as above.
    #[test]
    fn bytes_land_where_the_layout_says() {
        for n in 0..=37usize {
            let rows: Vec<Vec<u8>> = (0..GROUP_ROWS)
                .map(|r| (0..n + r % 3).map(|i| (r * 97 + i * 13) as u8).collect())
                .collect();
            let refs: [&[u8]; GROUP_ROWS] = std::array::from_fn(|r| rows[r].as_slice());
            let mut out = vec![0xEEu8; 8 * n + 5];
            bytes(refs, &mut out);
            for i in 0..n {
                for (r, row) in rows.iter().enumerate() {
                    assert_eq!(out[8 * i + r], row[i], "n {n} byte {i} row {r}");
                }
            }
            assert!(
                out[8 * n..].iter().all(|&b| b == 0xEE),
                "n {n}: tail written"
            );
        }
    }
}
