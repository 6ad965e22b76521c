//! The numerics of ggml's x86 "tiled" matmul (`ggml-cpu/tiled`), which ggml
//! runs instead of `vec_dot` for the K-quants, IQ4_XS and the 1–3-bit
//! i-quants whenever a MUL_MAT has at least [`MIN_BATCH`] activation rows
//! (for MUL_MAT_ID: rows routed to one expert) and the weights are not
//! repacked. Per (weight row, activation row) and per 256-element block it
//! forms two exact integers, `s1 = sum_e W_e a_e` (weight code times its
//! sub-block scale, times the Q8_K code) and, for the types with mins,
//! `s2 = sum_e M_e a_e` (the sub-block min), then
//! `res = f32(s1) * d0`, `res = fnmadd(dmin, f32(s2), res)` and
//! `acc = fma(res, d_act, acc)`, blocks in order from `acc = 0`.
//!
//! Integer sums are exact whatever order computes them, so this module gets
//! `W` and `M` from the type's own (gguf-py-exact) dequantiser: with the
//! block scale set to 1 (and `dmin` to 0) the dequantised value is the
//! sub-block scale times the code, exactly (at most 24 significant bits),
//! and with `d = 0, dmin = 1` it is minus the sub-block min. `W` carries a
//! factor 8 (the i-quants' scales are multiples of 1/8) and `d0` the
//! matching 1/8: powers of two, so `f32(s1) * d0` keeps ggml's bits.

use super::{
    BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4XS,
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, GgmlBlock,
};
use half::f16;

/// ggml's batch floor: `ggml_tiled_min_batch` (rows >= 8).
pub const MIN_BATCH: usize = 8;

const QK: usize = 256;

/// A block type ggml's tiled path handles.
pub(super) trait TiledBlock: GgmlBlock<Act = BlockQ8K> {
    /// Sub-block mins (`dmin`) present.
    const HAS_MIN: bool;
    /// The block scale `d` (and `dmin`) as f32.
    fn scales(&self) -> (f32, f32);
    /// This block with its `d` and `dmin` replaced.
    fn with_scales(&self, d: f16, dmin: f16) -> Self;
}

macro_rules! plain_d {
    ($($b:ty),*) => {$(
        impl TiledBlock for $b {
            const HAS_MIN: bool = false;
            fn scales(&self) -> (f32, f32) {
                (self.d.to_f32(), 0.0)
            }
            fn with_scales(&self, d: f16, _dmin: f16) -> Self {
                Self { d, ..*self }
            }
        }
    )*};
}
plain_d!(
    BlockQ3K,
    BlockQ6K,
    BlockIQ4XS,
    BlockIQ2XXS,
    BlockIQ2XS,
    BlockIQ2S,
    BlockIQ3XXS,
    BlockIQ3S,
    BlockIQ1S
);

macro_rules! with_min {
    ($($b:ty),*) => {$(
        impl TiledBlock for $b {
            const HAS_MIN: bool = true;
            fn scales(&self) -> (f32, f32) {
                (self.d.to_f32(), self.dmin.to_f32())
            }
            fn with_scales(&self, d: f16, dmin: f16) -> Self {
                Self { d, dmin, ..*self }
            }
        }
    )*};
}
with_min!(BlockQ2K, BlockQ4K, BlockQ5K);

/// IQ1_M keeps its fp16 scale in the top nibbles of its four scale words.
impl TiledBlock for BlockIQ1M {
    const HAS_MIN: bool = false;
    fn scales(&self) -> (f32, f32) {
        (self.d().to_f32(), 0.0)
    }
    fn with_scales(&self, d: f16, _dmin: f16) -> Self {
        let mut b = *self;
        let h = d.to_bits();
        for k in 0..4 {
            b.scales[2 * k + 1] =
                (b.scales[2 * k + 1] & 0x0F) | ((((h >> (4 * k)) & 0xF) as u8) << 4);
        }
        b
    }
}

/// One weight block as ggml's tiled kernels see it.
struct Decoded {
    /// 8 x sub-block scale x code.
    w: [i16; QK],
    /// Sub-block min per element (types with mins).
    m: [i16; QK],
    /// d / 8.
    d0: f32,
    dmin: f32,
}

fn decode<B: TiledBlock>(x: &B, y: &mut [f32; QK], out: &mut Decoded) {
    let (d, dmin) = x.scales();
    B::to_f32(std::slice::from_ref(&x.with_scales(f16::ONE, f16::ZERO)), y);
    for (w, &v) in out.w.iter_mut().zip(y.iter()) {
        *w = (v * 8.0) as i16;
    }
    if B::HAS_MIN {
        B::to_f32(std::slice::from_ref(&x.with_scales(f16::ZERO, f16::ONE)), y);
        for (m, &v) in out.m.iter_mut().zip(y.iter()) {
            *m = -v as i16;
        }
    }
    out.d0 = d / 8.0;
    out.dmin = dmin;
}

#[inline(always)]
fn idot(w: &[i16; QK], a: &[i8; QK]) -> i32 {
    w.iter().zip(a).map(|(&w, &a)| w as i32 * a as i32).sum()
}

/// `out[t * nr + r]` = row `r` of `w` (rows of `nb` blocks) times
/// activation row `t` of `a`, with ggml's tiled-path bits. Selected only
/// where the CPU has AVX2 and FMA (`ops::BatchKernel`).
pub(super) fn tiled<B: TiledBlock>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: only selected where CpuCaps::has_avx2() (AVX2, FMA).
    unsafe {
        tiled_avx2(nb, w, a, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    tiled_body(nb, w, a, out)
}

/// [`tiled_body`] compiled for AVX2 + FMA, so the integer dots vectorise.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tiled_avx2<B: TiledBlock>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
    tiled_body(nb, w, a, out)
}

#[inline(always)]
fn tiled_body<B: TiledBlock>(nb: usize, w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
    if nb == 0 || !w.len().is_multiple_of(nb) || !a.len().is_multiple_of(nb) {
        return;
    }
    let (nr, nt) = (w.len() / nb, a.len() / nb);
    if out.len() != nr * nt {
        return;
    }
    out.fill(0.0);
    let mut y = [0f32; QK];
    let mut dec = Decoded {
        w: [0; QK],
        m: [0; QK],
        d0: 0.0,
        dmin: 0.0,
    };
    for (r, row) in w.chunks_exact(nb).enumerate() {
        for (j, x) in row.iter().enumerate() {
            decode(x, &mut y, &mut dec);
            for t in 0..nt {
                let act = &a[t * nb + j];
                let mut res = idot(&dec.w, &act.qs) as f32 * dec.d0;
                if B::HAS_MIN {
                    res = (-dec.dmin).mul_add(idot(&dec.m, &act.qs) as f32, res);
                }
                let o = &mut out[t * nr + r];
                *o = res.mul_add(act.d, *o);
            }
        }
    }
}
