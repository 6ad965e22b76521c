//! Element-wise and row-wise CPU ops, written to follow ggml's CPU arithmetic
//! (f64 sums in norms, cumulative theta products in rope) so results agree
//! with llama.cpp to float rounding.

use std::sync::Arc;

use rayon::prelude::*;

use super::{grain, CpuTensor, CpuWeight};
use crate::backend::rope_math::{rope_cache, yarn_corr_dims};
use crate::backend::{contract, BackendError, BatchPos, Glu, RopeMode, RopeParams};

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

pub(super) fn get_rows(w: &CpuWeight, ids: &[u32]) -> Result<CpuTensor, BackendError> {
    let n = w.row_len();
    let rb = w.row_bytes();
    let bytes = w.plain_bytes()?;
    let n_rows = w.n_rows();
    let mut out = CpuTensor::zeros(ids.len(), n);
    for (dst, &id) in out.data.chunks_mut(n.max(1)).zip(ids) {
        let id = id as usize;
        if id >= n_rows {
            return Err(shape_err(
                "get_rows",
                format!("row {id} of a tensor with {n_rows} rows"),
            ));
        }
        let src = bytes
            .get(id * rb..(id + 1) * rb)
            .ok_or_else(|| shape_err("get_rows", format!("row {id} past the tensor bytes")))?;
        crate::quant::dequantize_row(w.ty, src, dst)?;
    }
    Ok(out)
}

pub(super) fn rms_norm(
    x: &CpuTensor,
    w: &CpuWeight,
    group: usize,
    eps: f32,
) -> Result<CpuTensor, BackendError> {
    let weight = w.to_f32()?;
    contract::rms_norm(x.cols, group, weight.len())?;
    let mut out = x.clone();
    out.data
        .par_chunks_mut(group)
        .with_min_len(grain::min_items(group * grain::VALUE))
        .for_each(|g| {
            let sum: f64 = g.iter().map(|&v| (v * v) as f64).sum();
            let mean = (sum / group as f64) as f32;
            let scale = 1.0f32 / (mean + eps).sqrt();
            g.iter_mut()
                .zip(&weight)
                .for_each(|(v, w)| *v = (*v * scale) * w);
        });
    Ok(out)
}

pub(super) fn rope(
    x: &mut CpuTensor,
    head_dim: usize,
    pos: BatchPos,
    p: &RopeParams,
) -> Result<(), BackendError> {
    rope_rows(x, head_dim, &[pos], p)
}

/// Rope over the rows of several sequences (`seqs[i]` owns the next
/// `n_tokens` rows, at positions `pos0..`), in one parallel pass.
pub(super) fn rope_rows(
    x: &mut CpuTensor,
    head_dim: usize,
    seqs: &[BatchPos],
    p: &RopeParams,
) -> Result<(), BackendError> {
    let n_tokens: usize = seqs.iter().map(|s| s.n_tokens).sum();
    contract::rope((x.rows, x.cols), head_dim, p.n_rot, n_tokens)?;
    let positions: Vec<usize> = seqs
        .iter()
        .flat_map(|s| s.pos0..s.pos0 + s.n_tokens)
        .collect();
    let table = rope_table(p, positions);
    let half = p.n_rot / 2;
    let cols = x.cols;
    x.data
        .par_chunks_mut(cols)
        .zip(table.cache.par_chunks(half.max(1)))
        .with_min_len(grain::min_items(cols * grain::VALUE))
        .for_each(|(row, cache)| {
            for head in row.chunks_mut(head_dim) {
                for (i, &(c, s)) in cache.iter().enumerate() {
                    let (a, b) = match p.mode {
                        RopeMode::Norm => (2 * i, 2 * i + 1),
                        RopeMode::Neox => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    // GCC contracts ggml's `x0*cos - x1*sin` and
                    // `x0*sin + x1*cos` into FMAs on `x0` (scalar and
                    // vfmaddsub code alike).
                    head[a] = x0.mul_add(c, -(x1 * s));
                    head[b] = x0.mul_add(s, x1 * c);
                }
            }
        });
    Ok(())
}

/// The `(cos, sin)` pairs of every row's position for one set of rope
/// parameters, `n_rot / 2` per row.
struct RopeTable {
    p: RopeParams,
    positions: Vec<usize>,
    cache: Vec<(f32, f32)>,
}

thread_local! {
    /// The last table built on this thread: every layer of a forward pass
    /// rotates q and k at the same positions with the same parameters, so
    /// the angles (a `powf`, `sin` and `cos` per pair) are computed once per
    /// pass instead of twice per layer.
    static ROPE_TABLE: std::cell::RefCell<Option<Arc<RopeTable>>> =
        const { std::cell::RefCell::new(None) };
}

fn rope_table(p: &RopeParams, positions: Vec<usize>) -> Arc<RopeTable> {
    let last = ROPE_TABLE.with(|t| t.borrow().clone());
    if let Some(t) = last.filter(|t| t.p == *p && t.positions == positions) {
        return t;
    }
    let corr = yarn_corr_dims(p.n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow);
    let half = p.n_rot / 2;
    let mut cache = vec![(0.0f32, 0.0f32); half * positions.len()];
    if half > 0 {
        cache
            .par_chunks_mut(half)
            .zip(positions.par_iter())
            .with_min_len(grain::min_items(half * grain::EXP))
            .for_each(|(c, &pos)| rope_cache(p, pos as f32, corr, c));
    }
    let t = Arc::new(RopeTable {
        p: *p,
        positions,
        cache,
    });
    ROPE_TABLE.with(|c| *c.borrow_mut() = Some(t.clone()));
    t
}

pub(super) fn glu(gate: &CpuTensor, up: &CpuTensor, kind: Glu) -> Result<CpuTensor, BackendError> {
    contract::glu((gate.rows, gate.cols), (up.rows, up.cols))?;
    let mut out = gate.clone();
    match kind {
        Glu::SwiGlu => swiglu_rows(&mut out.data, &up.data, gate.cols),
        Glu::SwiGluOai { alpha, limit } => out.data.iter_mut().zip(&up.data).for_each(|(g, u)| {
            let x = g.min(limit);
            let y = u.clamp(-limit, limit);
            *g = (x / (1.0 + (alpha * -x).exp())) * (y + 1.0);
        }),
    }
    Ok(out)
}

/// `ggml_vec_swiglu_f32` (AVX-512 build) on one row: `silu(g) * u` with
/// ggml's vector `ggml_v_expf` for whole blocks of 16 and libm `expf` for
/// the tail.
#[inline(always)]
fn swiglu_row(g: &mut [f32], u: &[f32]) {
    let n16 = g.len() / 16 * 16;
    let (gv, gt) = g.split_at_mut(n16);
    for (g, u) in gv.iter_mut().zip(u) {
        let x = *g;
        *g = (x / (1.0 + super::attention::v_expf(0.0 - x))) * u;
    }
    for (g, u) in gt.iter_mut().zip(&u[n16..]) {
        *g = (*g / (1.0 + (-*g).exp())) * u;
    }
}

/// [`swiglu_row`] with FMA instructions (same results, see attention.rs).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_row_fma(g: &mut [f32], u: &[f32]) {
    swiglu_row(g, u)
}

/// SwiGLU in place over rows of `cols` (`g` gate, `u` up).
fn swiglu_rows(g: &mut [f32], u: &[f32], cols: usize) {
    #[cfg(target_arch = "x86_64")]
    let fma = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    let fma = false;
    g.par_chunks_mut(cols.max(1))
        .zip(u.par_chunks(cols.max(1)))
        .with_min_len(grain::min_items(cols * grain::EXP))
        .for_each(|(g, u)| {
            #[cfg(target_arch = "x86_64")]
            if fma {
                // SAFETY: the features were detected above.
                unsafe { swiglu_row_fma(g, u) };
                return;
            }
            let _ = fma;
            swiglu_row(g, u)
        });
}

pub(super) fn weighted_sum(
    x: &CpuTensor,
    w: &[f32],
    n_used: usize,
) -> Result<CpuTensor, BackendError> {
    let n_tok = contract::weighted_sum(x.rows, w.len(), n_used)?;
    let mut out = CpuTensor::zeros(n_tok, x.cols);
    for t in 0..n_tok {
        let dst = &mut out.data[t * x.cols..(t + 1) * x.cols];
        for j in 0..n_used {
            let r = t * n_used + j;
            let wj = w[r];
            let src = x.row(r);
            if j == 0 {
                dst.iter_mut().zip(src).for_each(|(d, s)| *d = s * wj);
            } else {
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += s * wj);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_corr_dims_match_hand_computation() {
        // n_dims 64, n_ctx_orig 4096, base 150000, beta 32/1 (gpt-oss).
        let d = yarn_corr_dims(64, 4096, 150000.0, 32.0, 1.0);
        let f = |b: f32| {
            64.0 * (4096.0 / (b * 2.0 * std::f32::consts::PI)).ln() / (2.0 * 150000f32.ln())
        };
        assert_eq!(d, [f(32.0).floor(), f(1.0).ceil().min(63.0)]);
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm_later() {
        let p = RopeParams {
            mode: RopeMode::Neox,
            n_rot: 8,
            freq_base: 10000.0,
            freq_scale: 1.0,
            n_ctx_orig: 4096,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        let data: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut x = CpuTensor {
            data: data.clone(),
            rows: 2,
            cols: 16,
        };
        rope(
            &mut x,
            8,
            BatchPos {
                pos0: 0,
                n_tokens: 2,
                steps: false,
            },
            &p,
        )
        .unwrap();
        assert_eq!(&x.data[..16], &data[..16]);
        let n0: f32 = data[16..24].iter().map(|v| v * v).sum();
        let n1: f32 = x.data[16..24].iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-5);
        assert_ne!(&x.data[16..24], &data[16..24]);
    }
}
