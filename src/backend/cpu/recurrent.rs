//! The ops of recurrent (linear-attention) layers on host activations:
//! element-wise activations, a broadcast vector multiply, the L2 norm of
//! gated DeltaNet, the short causal convolution with its carried state
//! (ggml's `ssm_conv`) and the gated delta rule (ggml's `gated_delta_net`).
//! Shapes are checked by [`crate::backend::contract`].
//!
//! The delta rule has two forms. Decode and short sequences (fewer than
//! [`CHUNKED_MIN_TOKENS`] tokens) run it token by token ([`head_recurrence`]),
//! in the arithmetic of ggml-cpu's `gated_delta_net`, so their outputs and
//! states are llama.cpp's. Prompts of at least [`CHUNKED_MIN_TOKENS`] tokens
//! run the chunked (WY / UT-transform) form of [`super::delta_chunked`]:
//! the same function of the inputs computed with matrix products over chunks
//! of 64 tokens in another f32 order. The two agree to f32 rounding, not bit
//! for bit: on model-shaped inputs (L2-normalised q and k, decays from
//! `A_log` in `[ln 0.1, ln 16]`) the largest difference of an output or a
//! state element is a few 1e-6 of that tensor's RMS, and the tests there hold
//! it within 1e-4 of the RMS (and the chunked form within a small factor of
//! the recurrent one's distance to an f64 evaluation). Logits of a long
//! prompt are therefore close to, not equal to, llama.cpp's (which runs the
//! token-by-token op for prompts too).

use rayon::prelude::*;

use super::{grain, CpuTensor, CpuWeight};
use crate::backend::{contract, Act, BackendError, BatchPos, DeltaNetParams, KHeadMap};

/// ggml-cpu's `ggml_vec_silu_f32` on one row: whole blocks of 16 through
/// the vector `ggml_v_expf` (an AVX-512 build), the tail through libm.
#[inline(always)]
fn silu_row_portable(row: &mut [f32]) {
    let n16 = row.len() / 16 * 16;
    let (body, tail) = row.split_at_mut(n16);
    for x in body {
        *x /= 1.0 + super::attention::v_expf(0.0 - *x);
    }
    for x in tail {
        *x = Act::Silu.apply(*x);
    }
}

/// [`silu_row_portable`] compiled with FMA, so that `v_expf`'s `mul_add`s
/// are instructions rather than calls to libm's `fmaf` (same results).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_row_fma(row: &mut [f32]) {
    silu_row_portable(row)
}

/// SiLU over one row, as [`silu_row_portable`] computes it.
pub(super) fn silu_row(row: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        unsafe { silu_row_fma(row) };
        return;
    }
    silu_row_portable(row)
}

pub(super) fn act(x: &mut CpuTensor, act: Act) {
    if x.data.is_empty() {
        return;
    }
    match act {
        Act::Silu => x
            .data
            .par_chunks_mut(x.cols)
            .with_min_len(grain::min_items(x.cols * grain::EXP))
            .for_each(silu_row),
        _ => x
            .data
            .par_chunks_mut(x.cols)
            .with_min_len(grain::min_items(x.cols * grain::EXP))
            .for_each(|r| r.iter_mut().for_each(|v| *v = act.apply(*v))),
    }
}

pub(super) fn mul_vec(x: &mut CpuTensor, w: &CpuWeight) -> Result<(), BackendError> {
    let w = w.to_f32()?;
    contract::mul_vec(x.cols, w.len())?;
    if !x.data.is_empty() {
        x.data
            .par_chunks_mut(x.cols)
            .with_min_len(grain::min_items(x.cols * grain::VALUE))
            .for_each(|r| r.iter_mut().zip(&w).for_each(|(a, b)| *a *= b));
    }
    Ok(())
}

pub(super) fn l2_norm(x: &CpuTensor, group: usize, eps: f32) -> Result<CpuTensor, BackendError> {
    contract::l2_norm(x.cols, group)?;
    let mut out = x.clone();
    // ggml_rms_norm(x, eps / n) then ggml_scale(1 / sqrt(n)), in ggml's
    // f32 steps.
    let (eps_n, post) = (eps / group as f32, 1.0 / (group as f32).sqrt());
    out.data
        .par_chunks_mut(group)
        .with_min_len(grain::min_items(group * grain::VALUE))
        .for_each(|g| {
            let sum: f64 = g.iter().map(|&v| (v * v) as f64).sum();
            let mean = (sum / group as f64) as f32;
            let scale = 1.0f32 / (mean + eps_n).sqrt();
            g.iter_mut().for_each(|v| *v = (*v * scale) * post);
        });
    Ok(out)
}

pub(super) fn ssm_conv(
    x: &CpuTensor,
    w: &CpuWeight,
    states: &mut [&mut CpuTensor],
    seqs: &[BatchPos],
) -> Result<CpuTensor, BackendError> {
    let shapes: Vec<(usize, usize)> = states.iter().map(|s| (s.rows, s.cols)).collect();
    let d_conv = contract::ssm_conv((x.rows, x.cols), &w.dims, &shapes, seqs)?;
    let taps = w.to_f32()?;
    let c = x.cols;
    let mut out = CpuTensor::zeros(x.rows, c);
    let mut r0 = 0;
    for (state, s) in states.iter_mut().zip(seqs) {
        let n = s.n_tokens;
        // The convolution's input: the carried rows, then this sequence's.
        let mut input = Vec::with_capacity((d_conv - 1 + n) * c);
        input.extend_from_slice(&state.data);
        input.extend_from_slice(&x.data[r0 * c..(r0 + n) * c]);
        out.data[r0 * c..(r0 + n) * c]
            .par_chunks_mut(c)
            .enumerate()
            .for_each(|(t, row)| {
                for (ch, y) in row.iter_mut().enumerate() {
                    let mut sum = 0.0f32;
                    for j in 0..d_conv {
                        sum += input[(t + j) * c + ch] * taps[ch * d_conv + j];
                    }
                    *y = sum;
                }
            });
        state.data.copy_from_slice(&input[n * c..]);
        r0 += n;
    }
    Ok(out)
}

/// `sum a[i] * b[i]` in eight interleaved f32 partial sums.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// One head's slice of every row of a `[rows, cols]` tensor: `s` values
/// from column `off`, rows counted from `r0`.
#[derive(Clone, Copy)]
pub(super) struct Head<'a> {
    data: &'a [f32],
    cols: usize,
    off: usize,
    r0: usize,
    /// The head size.
    pub(super) s: usize,
}

impl<'a> Head<'a> {
    pub(super) fn of(t: &'a CpuTensor, off: usize, r0: usize, s: usize) -> Self {
        Head {
            data: &t.data,
            cols: t.cols,
            off,
            r0,
            s,
        }
    }

    pub(super) fn row(&self, t: usize) -> &'a [f32] {
        let at = (self.r0 + t) * self.cols + self.off;
        &self.data[at..at + self.s]
    }
}

/// The delta rule over `n` tokens of one value head: `m` is its state
/// (`S[i][j]` at `j * s + i`), `gb(t)` the token's log decay and beta,
/// `out` receives `n` rows of `s`.
fn head_recurrence(
    m: &mut [f32],
    n: usize,
    (q, k, v): (Head, Head, Head),
    gb: impl Fn(usize) -> (f32, f32),
    out: &mut [f32],
) {
    let s = v.s;
    let scale = 1.0 / (s as f32).sqrt();
    let mut delta = vec![0.0f32; s];
    for t in 0..n {
        let (qt, kt, vt) = (q.row(t), k.row(t), v.row(t));
        let (g, b) = gb(t);
        let decay = g.exp();
        m.iter_mut().for_each(|x| *x *= decay);
        for (j, d) in delta.iter_mut().enumerate() {
            *d = (vt[j] - dot(&m[j * s..(j + 1) * s], kt)) * b;
        }
        for (j, &d) in delta.iter().enumerate() {
            m[j * s..(j + 1) * s]
                .iter_mut()
                .zip(kt)
                .for_each(|(x, &ki)| *x += ki * d);
        }
        let o = &mut out[t * s..(t + 1) * s];
        for (j, y) in o.iter_mut().enumerate() {
            *y = dot(&m[j * s..(j + 1) * s], qt) * scale;
        }
    }
}

/// Sequences of at least this many tokens run the chunked form
/// ([`super::delta_chunked`]), shorter ones (decode) the recurrent one.
///
/// Speed alone would put it near one chunk: at `S = 128`, 32 value heads and
/// two threads (Zen 4, AVX-512) the chunked form is about as fast as the
/// recurrent one at 16 tokens, twice as fast at 64 (2.3 against 4.5 ms a
/// layer) and 2.8 times at 512 (13.3 against 37.9 ms). But the recurrent
/// form is llama.cpp's arithmetic bit for bit and the chunked one is not, and
/// quantised models amplify the difference: on the qwen3next / qwen35moe
/// Q8_0 fixtures a change of 2^-22 relative to a third of the delta rule's
/// outputs already flips a Q8_0 rounding of a later activation and moves the
/// logits of the 88-token prompt by NMSE 2e-4 (the chunked form: 3e-3),
/// above the 1e-4 that tests/families.rs holds against llama.cpp. 128 keeps
/// prompts below two chunks on llama.cpp's arithmetic (the fixtures' prompts
/// included) and gives longer ones the chunked form's speed.
pub(super) const CHUNKED_MIN_TOKENS: usize = 128;

/// Which form of the delta rule a sequence runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DeltaForm {
    /// Token by token, ggml-cpu's arithmetic ([`head_recurrence`]).
    Recurrent,
    /// Chunks of 64 tokens ([`super::delta_chunked::head_chunked`]).
    Chunked,
}

impl DeltaForm {
    /// The form a sequence of `n_tokens` runs.
    pub(super) fn for_tokens(n_tokens: usize) -> Self {
        if n_tokens >= CHUNKED_MIN_TOKENS {
            DeltaForm::Chunked
        } else {
            DeltaForm::Recurrent
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn gated_delta_net(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    g: &CpuTensor,
    beta: &CpuTensor,
    states: &mut [&mut CpuTensor],
    seqs: &[BatchPos],
    p: &DeltaNetParams,
) -> Result<CpuTensor, BackendError> {
    gated_delta_net_as(q, k, v, g, beta, states, seqs, p, DeltaForm::for_tokens)
}

/// [`gated_delta_net`] with the form of each sequence chosen by `form` from
/// its token count; parallel over (sequence, value head).
#[allow(clippy::too_many_arguments)]
pub(super) fn gated_delta_net_as(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    g: &CpuTensor,
    beta: &CpuTensor,
    states: &mut [&mut CpuTensor],
    seqs: &[BatchPos],
    p: &DeltaNetParams,
    form: impl Fn(usize) -> DeltaForm + Sync,
) -> Result<CpuTensor, BackendError> {
    let shapes: Vec<(usize, usize)> = states.iter().map(|s| (s.rows, s.cols)).collect();
    let dims = |t: &CpuTensor| (t.rows, t.cols);
    contract::gated_delta_net(
        p,
        dims(q),
        dims(k),
        dims(v),
        dims(g),
        dims(beta),
        &shapes,
        seqs,
    )?;
    let (hk, hv, s) = (p.n_k_heads, p.n_v_heads, p.head_dim);
    let r = hv / hk;
    let kh = |h: usize| match p.k_map {
        KHeadMap::Interleave => h / r,
        KHeadMap::Tile => h % hk,
    };
    // One job per (sequence, value head): its first row, tokens, head and
    // state.
    let mut jobs = Vec::with_capacity(seqs.len() * hv);
    let mut r0 = 0;
    for (state, sq) in states.iter_mut().zip(seqs) {
        for (h, m) in state.data.chunks_mut(s * s).enumerate() {
            jobs.push((r0, sq.n_tokens, h, m));
        }
        r0 += sq.n_tokens;
    }
    let heads: Vec<Vec<f32>> = jobs
        .par_iter_mut()
        .map(|(r0, n, h, m)| {
            let (r0, n, h) = (*r0, *n, *h);
            let mut o = vec![0.0f32; n * s];
            let view = |t, head| Head::of(t, head * s, r0, s);
            let qkv = (view(q, kh(h)), view(k, kh(h)), view(v, h));
            let at = |t: usize| (r0 + t) * hv + h;
            let gb = |t: usize| (g.data[at(t)], beta.data[at(t)]);
            match form(n) {
                DeltaForm::Recurrent => head_recurrence(m, n, qkv, gb, &mut o),
                DeltaForm::Chunked => super::delta_chunked::head_chunked(m, n, qkv, gb, &mut o),
            }
            o
        })
        .collect();
    let mut out = CpuTensor::zeros(q.rows, hv * s);
    for ((r0, n, h, _), o) in jobs.iter().zip(&heads) {
        for t in 0..*n {
            let d = (r0 + t) * hv * s + h * s;
            out.data[d..d + s].copy_from_slice(&o[t * s..(t + 1) * s]);
        }
    }
    Ok(out)
}
