//! The K-quants: 256-weight super-blocks with per-sub-block 4/6/8-bit scales,
//! dotted against Q8_K. One file per type; the 8-lane accumulation in the
//! Q3_K..Q6_K reference dots follows ggml's scalar code so results agree to
//! the last bit with ggml's generic path.

// Index loops mirror ggml's reference code, which keeps them easy to audit.
#![allow(clippy::needless_range_loop)]

mod q2_k;
mod q3_k;
mod q4_k;
mod q5_k;
mod q6_k;

pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_k::BlockQ4K;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;

/// ggml's 8-lane scalar accumulation: `a[i]` (quants as i8) times `q8[i]`,
/// scaled per group of `group` elements by `scales[g]`, summed into 8 i32
/// lanes (`aux32`).
#[inline(always)]
pub(crate) fn accumulate_8_lanes(a: &[i8], q8: &[i8], group: usize, scales: &[i32]) -> [i32; 8] {
    let mut aux32 = [0i32; 8];
    for (g, (ag, qg)) in a
        .chunks_exact(group)
        .zip(q8.chunks_exact(group))
        .enumerate()
    {
        let sc = scales[g];
        for (a8, q8) in ag.chunks_exact(8).zip(qg.chunks_exact(8)) {
            for l in 0..8 {
                let p = (q8[l] as i16).wrapping_mul(a8[l] as i16);
                aux32[l] += sc * p as i32;
            }
        }
    }
    aux32
}
