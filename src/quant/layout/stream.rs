//! Stores past the caches, for a conversion's destination that nothing
//! reads soon: an expert slot as it fills (a 5 GiB cache is far larger than
//! any CPU cache) or a resident tensor at load. An ordinary store to a line
//! not in cache first reads that line from memory; a non-temporal store
//! does not, so converting a group in a scratch buffer that stays in L1 and
//! streaming it out moves each destination byte once instead of twice.

use std::cell::RefCell;

use super::{check_same_len, group_geometry, Interleaved, GROUP_ROWS};
use crate::quant::QuantError;

thread_local! {
    /// One group's conversion, reused by every call on this thread.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// [`Interleaved::interleave_from`] of `il`, `src` to `dst` one group at a
/// time through a scratch buffer, each group then stored past the caches
/// ([`copy`]). The bytes written are `interleave_from`'s; they are visible
/// to other threads once this returns (and they are handed over through a
/// lock or a channel, as every slot is).
pub fn interleave_streamed(
    il: &dyn Interleaved,
    k: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    let ty = il.ty();
    let nb = group_geometry(ty, k, src.len())?;
    check_same_len(ty, src.len(), dst.len())?;
    let group = nb * ty.type_size() * GROUP_ROWS;
    // Out of the thread-local while converting, so nothing can find it
    // borrowed.
    let mut scratch = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    scratch.resize(group, 0);
    let mut done = Ok(());
    for (s, d) in src.chunks_exact(group).zip(dst.chunks_exact_mut(group)) {
        // SAFETY: prefetches never fault, so the last groups may ask past
        // `src`.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            crate::quant::simd_x86::prefetch_rows(
                s.as_ptr().wrapping_add(PREFETCH_GROUPS * group),
                group,
            )
        };
        done = il.interleave_from(k, s, &mut scratch);
        if done.is_err() {
            break;
        }
        copy(d, &scratch);
    }
    fence();
    SCRATCH.with(|s| *s.borrow_mut() = scratch);
    done
}

/// How many groups ahead of the one it converts [`interleave_streamed`]
/// asks for its source. A conversion reads its group's eight rows a block
/// of each at a time, eight streams a block apart, which the hardware
/// prefetchers follow poorly from memory; and a slot's source, or a
/// resident tensor's at load, is a direct read's buffer that the device
/// just wrote, not in this core's caches. `cargo bench --bench quant_dot
/// -- interleave_cold`, medians of three alternated rounds on the 2-core
/// VM, without and with: Q4_K 160-177 µs against 132-148, Q6_K 199-230
/// against 177-185, Q4_0 206-217 against 187-200. Straight from direct
/// reads of the Qwen3-30B-A3B-shaped file's Q4_K slices the gain was
/// smaller (a throwaway loop, 1200 reads a round converted this way and
/// 1200 converted in place as the control): 1.04-1.09x the control's time
/// with, 1.14-1.16x without. One, three or four groups ahead did no better
/// than two, and a request every other line (for the adjacent-line
/// prefetcher) worse than none. In cache the requests cost without saving
/// anything (`interleave`'s mode 2, Q4_K: 70-73 µs against 83).
const PREFETCH_GROUPS: usize = 2;

/// Copies `src` to `dst` (of the same length) with non-temporal stores for
/// the 16-byte pieces from `dst`'s first 16-byte boundary on, ordinary
/// stores for the bytes either side. Other threads see the streamed bytes
/// only after a [`fence`].
pub(super) fn copy(dst: &mut [u8], src: &[u8]) {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    #[cfg(target_arch = "x86_64")]
    {
        let head = dst.as_ptr().align_offset(16).min(n);
        let body = (n - head) / 16 * 16;
        dst[..head].copy_from_slice(&src[..head]);
        // SAFETY: `dst[head..]` is 16-byte aligned and both slices hold
        // `head + body` bytes; SSE2 is part of x86-64.
        unsafe { stream_sse2(&mut dst[head..head + body], &src[head..head + body]) };
        dst[head + body..].copy_from_slice(&src[head + body..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// # Safety
/// `dst` must be 16-byte aligned, and `dst` and `src` hold the same whole
/// number of 16-byte pieces.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn stream_sse2(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::*;
    for i in (0..dst.len()).step_by(16) {
        let v = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
        _mm_stream_si128(dst.as_mut_ptr().add(i) as *mut __m128i, v);
    }
}

/// Orders this thread's non-temporal stores before its later stores, so
/// that whoever is handed the bytes afterwards sees them.
pub(super) fn fence() {
    // SAFETY: SSE2 is part of x86-64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length to a few pieces, at every offset from a 16-byte
    /// boundary: the head, the streamed pieces and the tail all land, and
    /// nothing past `dst`'s end is touched.
    #[test]
    fn copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        let mut under = [0u8; 160];
        for at in 0..16 {
            for n in 0..=70 {
                under.fill(0xee);
                let base = under.as_ptr().align_offset(16);
                copy(&mut under[base + at..base + at + n], &src[..n]);
                fence();
                assert_eq!(&under[base + at..base + at + n], &src[..n], "{at} {n}");
                assert!(under[..base + at].iter().all(|&b| b == 0xee), "{at} {n}");
                assert!(
                    under[base + at + n..].iter().all(|&b| b == 0xee),
                    "{at} {n}"
                );
            }
        }
    }
}
