//! ggml's f32 dot-product orders on x86: `ggml_vec_dot_f32` and the
//! per-output chain of llamafile's tinyBLAS (what ggml's CPU `mul_mat`
//! runs for f32 operands when the batch has two or more rows), shared by
//! the attention kernels and the F32 weights' one-row kernel.
//!
//! The bodies are plain lane loops; callers compiled with AVX-512 (or AVX2)
//! and FMA enabled get one vector instruction per step.

/// GCC's `_mm512_reduce_add_ps`: halves of 256, then of 128, then
/// `(l0 + l2) + (l1 + l3)`.
#[inline(always)]
pub(crate) fn reduce16(a: &[f32; 16]) -> f32 {
    let mut t = [0f32; 8];
    for i in 0..8 {
        t[i] = a[i + 8] + a[i];
    }
    let mut u = [0f32; 4];
    for i in 0..4 {
        u[i] = t[i + 4] + t[i];
    }
    (u[0] + u[2]) + (u[1] + u[3])
}

/// `ggml_vec_dot_f32` (AVX-512: `GGML_F32_STEP` 64, `GGML_F32_EPR` 16).
#[inline(always)]
pub(crate) fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    // Steps of 64 as four fixed 16-lane FMAs: no bounds checks or dynamic
    // indices, so each becomes one vector FMA.
    for (xc, yc) in x[..np].chunks_exact(64).zip(y[..np].chunks_exact(64)) {
        for (k, a) in acc.iter_mut().enumerate() {
            fma16(a, &xc[16 * k..16 * k + 16], &yc[16 * k..16 * k + 16]);
        }
    }
    let mut sum = 0f32;
    if np > 0 {
        sum = reduce_4x16(&acc);
    }
    for j in np..n {
        sum += x[j] * y[j];
    }
    sum
}

/// One output of llamafile's tinyBLAS (AVX-512, `KN` 16): one 16-lane
/// accumulator of fused products over steps of 16, then
/// `_mm512_reduce_add_ps`. `x.len()` is a multiple of 16 (tinyBLAS refuses
/// other lengths).
#[inline(always)]
pub(crate) fn tinyblas_dot(x: &[f32], y: &[f32]) -> f32 {
    let mut a = [0f32; 16];
    for (xc, yc) in x.chunks_exact(16).zip(y.chunks_exact(16)) {
        fma16(&mut a, xc, yc);
    }
    reduce16(&a)
}

/// `a[l] = x[l] * y[l] + a[l]` (fused) for 16 lanes.
#[inline(always)]
fn fma16(a: &mut [f32; 16], x: &[f32], y: &[f32]) {
    let (x, y) = (&x[..16], &y[..16]);
    for l in 0..16 {
        a[l] = x[l].mul_add(y[l], a[l]);
    }
}

/// `GGML_F32x16_REDUCE` over four accumulators: `(a0 + a2) + (a1 + a3)`,
/// then [`reduce16`].
#[inline(always)]
fn reduce_4x16(acc: &[[f32; 16]; 4]) -> f32 {
    let mut r = [0f32; 16];
    for l in 0..16 {
        r[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    reduce16(&r)
}

/// F32 weight kernels of ggml's AVX-512 build.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    /// `ggml_vec_dot_f32` (one activation row; longhaul uses it at every
    /// batch size, see `ops::TileKernels for f32`).
    pub(crate) fn dot_f32(_n: usize, w: &[f32], a: &[f32]) -> f32 {
        // SAFETY: selected only where CpuCaps::has_avx512() (AVX-512 F, FMA).
        unsafe { dot(w, a) }
    }
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn dot(w: &[f32], a: &[f32]) -> f32 {
        super::vec_dot_f32(w, a)
    }
}
