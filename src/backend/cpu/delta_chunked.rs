//! The gated delta rule in chunked (WY / UT-transform) form, for prompts:
//! the function [`super::recurrent`]'s token-by-token loop computes (one
//! value head, its state carried in and out), evaluated over chunks of
//! [`CHUNK`] tokens with matrix products instead of a rank-one update of the
//! `S x S` state per token, as llama.cpp's `build_delta_net_chunking` and
//! transformers' `torch_chunk_gated_delta_rule` do. It owns only the
//! arithmetic of one head; which sequences run it is decided by
//! [`super::recurrent::DeltaForm`].
//!
//! Within a chunk of `c` tokens starting from the state `S0` (`S[i][j]`,
//! `i` over keys, `j` over values), with `γ_t = g_0 + .. + g_t` the chunk's
//! cumulative log decay, the recurrence
//! `S_t = e^{g_t} S_{t-1} + k_t u_tᵀ`, `u_t = β_t (v_t - e^{g_t} S_{t-1}ᵀ k_t)`
//! unrolls to
//!
//! ```text
//! u_t + Σ_{s<t} β_t e^{γ_t-γ_s} (k_t·k_s) u_s = β_t (v_t - e^{γ_t} S0ᵀ k_t)
//! o_t = e^{γ_t} S0ᵀ q_t + Σ_{s<=t} e^{γ_t-γ_s} (q_t·k_s) u_s      (q_t / sqrt(S))
//! S_c = e^{γ_last} S0 + Σ_s e^{γ_last-γ_s} k_s u_sᵀ
//! ```
//!
//! The first line is a unit lower-triangular system `(I + A) U = R`, solved
//! by forward substitution straight on its right-hand side (transformers
//! forms the inverse `T = (I + A)^-1` and applies it to `β V` and to
//! `β e^γ K`; the result is the same `U` with fewer products). Every decay
//! factor is the exponential of a difference `γ_t - γ_s <= 0`, never a
//! ratio of two exponentials, so none overflows whatever the decays. A last
//! partial chunk is simply a smaller `c`: nothing is padded, so nothing of a
//! padding reaches the state.
//!
//! Per chunk the cost is four products with the state or the values
//! (`[K; Q] S0`, `Kᵀ U`, the Gram rows `K Kᵀ`, `Q Kᵀ` and their use, about
//! `3 S² c + 2 S c²` multiply-adds): the count of the recurrent form, but
//! as register-blocked matrix products (AVX2 + FMA where the CPU has them)
//! rather than passes over the state per token; see
//! [`super::recurrent::CHUNKED_MIN_TOKENS`] for where it pays.

use super::attention::v_expf;
use super::recurrent::Head;

/// Tokens per chunk (llama.cpp's `CS` and transformers' `chunk_size`).
pub(super) const CHUNK: usize = 64;

/// Rows of a product's register tile.
const MR: usize = 4;
/// Columns of a product's register tile (two AVX2 vectors).
const NR: usize = 16;

/// The delta rule over `n` tokens of one value head, chunk by chunk: the
/// contract of `recurrent::head_recurrence` (`m` the state, `S[i][j]` at
/// `j * s + i`; `gb(t)` token `t`'s log decay and beta; `out` receives `n`
/// rows of `s`, already scaled by `1 / sqrt(s)`).
pub(super) fn head_chunked(
    m: &mut [f32],
    n: usize,
    qkv: (Head, Head, Head),
    gb: impl Fn(usize) -> (f32, f32),
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
        // SAFETY: the features were detected above.
        unsafe { head_chunked_avx512(m, n, qkv, &gb, out) };
        return;
    }
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the features were detected above.
        unsafe { head_chunked_fma(m, n, qkv, &gb, out) };
        return;
    }
    head_chunked_in::<false>(m, n, qkv, &gb, out)
}

/// [`head_chunked_in`] compiled with AVX2 and FMA (fused multiply-adds).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_chunked_fma(
    m: &mut [f32],
    n: usize,
    qkv: (Head, Head, Head),
    gb: &dyn Fn(usize) -> (f32, f32),
    out: &mut [f32],
) {
    head_chunked_in::<true>(m, n, qkv, gb, out)
}

/// [`head_chunked_in`] compiled with AVX-512F: the same operations lane
/// for lane as [`head_chunked_fma`] (so the same results), a tile row in
/// one vector; measured 12-15% faster than AVX2 on Zen 4.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn head_chunked_avx512(
    m: &mut [f32],
    n: usize,
    qkv: (Head, Head, Head),
    gb: &dyn Fn(usize) -> (f32, f32),
    out: &mut [f32],
) {
    head_chunked_in::<true>(m, n, qkv, gb, out)
}

/// One head's working memory, sized for a whole chunk.
struct Scratch {
    /// The state `S[i][j]` at `i * s + j` (the transpose of ggml's layout).
    st: Vec<f32>,
    /// Rows `0..c`: the chunk's keys; rows `c..2c`: its queries / sqrt(s).
    kq: Vec<f32>,
    /// `[K; Q] S0`, `[2c, s]`.
    w: Vec<f32>,
    /// The keys transposed, `k_u[i]` at `i * cp + u` (`cp` = `c` rounded up
    /// to [`NR`], the padding zero).
    kt: Vec<f32>,
    /// Rows `0..c`: `-A` (`-β_t e^{γ_t-γ_u} k_t·k_u`, `u < t`); rows
    /// `c..2c`: `P` (`e^{γ_t-γ_u} q_t·k_u`, `u <= t`, zero above); stride
    /// `cp`.
    gram: Vec<f32>,
    /// The chunk's new values `U`, `[c, s]`.
    u: Vec<f32>,
    /// `e^{γ_last-γ_u} k_u[i]` at `i * c + u`.
    kd: Vec<f32>,
    /// `γ`, summed in f64 so that its differences keep the decays' f32
    /// precision however long the chunk and strong the decay.
    gamma: Vec<f64>,
    beta: Vec<f32>,
    decay: Vec<f32>,
}

impl Scratch {
    fn new(s: usize) -> Self {
        let cp = CHUNK.next_multiple_of(NR);
        Scratch {
            st: vec![0.0; s * s],
            kq: vec![0.0; 2 * CHUNK * s],
            w: vec![0.0; 2 * CHUNK * s],
            kt: vec![0.0; s * cp],
            gram: vec![0.0; 2 * CHUNK * cp],
            u: vec![0.0; CHUNK * s],
            kd: vec![0.0; s * CHUNK],
            gamma: vec![0.0; CHUNK],
            beta: vec![0.0; CHUNK],
            decay: vec![0.0; CHUNK],
        }
    }
}

/// [`head_chunked`]; `F`: use fused multiply-adds.
#[inline(always)]
fn head_chunked_in<const F: bool>(
    m: &mut [f32],
    n: usize,
    (q, k, v): (Head, Head, Head),
    gb: &dyn Fn(usize) -> (f32, f32),
    out: &mut [f32],
) {
    let s = v.s;
    let scale = 1.0 / (s as f32).sqrt();
    let mut x = Scratch::new(s);
    for i in 0..s {
        for j in 0..s {
            x.st[i * s + j] = m[j * s + i];
        }
    }
    let mut t0 = 0;
    while t0 < n {
        let c = (n - t0).min(CHUNK);
        let cp = c.next_multiple_of(NR);
        chunk::<F>(&mut x, s, c, cp, t0, (q, k, v), gb, scale, out);
        t0 += c;
    }
    for i in 0..s {
        for j in 0..s {
            m[j * s + i] = x.st[i * s + j];
        }
    }
}

/// Tokens `t0..t0 + c` of one head: their outputs into `out`, the state
/// `x.st` advanced past them.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn chunk<const F: bool>(
    x: &mut Scratch,
    s: usize,
    c: usize,
    cp: usize,
    t0: usize,
    (q, k, v): (Head, Head, Head),
    gb: &dyn Fn(usize) -> (f32, f32),
    scale: f32,
    out: &mut [f32],
) {
    let mut cum = 0.0f64;
    for t in 0..c {
        x.kq[t * s..(t + 1) * s].copy_from_slice(k.row(t0 + t));
        x.kq[(c + t) * s..(c + t + 1) * s]
            .iter_mut()
            .zip(q.row(t0 + t))
            .for_each(|(d, &qi)| *d = qi * scale);
        let (g, b) = gb(t0 + t);
        cum += g as f64;
        x.gamma[t] = cum;
        x.beta[t] = b;
    }
    let (gamma, beta) = (&x.gamma[..c], &x.beta[..c]);

    // W = [K; Q] S0.
    let w = &mut x.w[..2 * c * s];
    w.fill(0.0);
    gemm::<F>(w, s, &x.kq, s, &x.st, s, (2 * c, s, s));

    // The Gram rows K Kᵀ and Q Kᵀ, each row only as far as the diagonal
    // (rounded up to a tile).
    for i in 0..s {
        let row = &mut x.kt[i * cp..(i + 1) * cp];
        for (u, d) in row[..c].iter_mut().enumerate() {
            *d = x.kq[u * s + i];
        }
        row[c..].fill(0.0);
    }
    let gram = &mut x.gram[..2 * c * cp];
    gram.fill(0.0);
    for part in [0, c] {
        let mut tb = 0;
        while tb < c {
            let rows = (c - tb).min(MR);
            let cols = (tb + rows).next_multiple_of(NR).min(cp);
            gemm::<F>(
                &mut gram[(part + tb) * cp..],
                cp,
                &x.kq[(part + tb) * s..],
                s,
                &x.kt,
                cp,
                (rows, cols, s),
            );
            tb += rows;
        }
    }

    // Decay masks: -A strictly below the diagonal, P on and below it.
    let decay = &mut x.decay[..c];
    for t in 0..c {
        for (d, &gu) in decay[..=t].iter_mut().zip(gamma) {
            *d = v_expf((gamma[t] - gu) as f32);
        }
        let a = &mut gram[t * cp..(t + 1) * cp];
        let nb = -beta[t];
        a[..t]
            .iter_mut()
            .zip(&decay[..t])
            .for_each(|(a, &d)| *a *= nb * d);
        a[t..].fill(0.0);
        let p = &mut gram[(c + t) * cp..(c + t + 1) * cp];
        p[..=t]
            .iter_mut()
            .zip(&decay[..=t])
            .for_each(|(p, &d)| *p *= d);
        p[t + 1..].fill(0.0);
    }

    // R = β (V - e^γ K S0), then (I + A) U = R by forward substitution.
    let u = &mut x.u[..c * s];
    for t in 0..c {
        let (b, e) = (beta[t], v_expf(gamma[t] as f32));
        u[t * s..(t + 1) * s]
            .iter_mut()
            .zip(v.row(t0 + t))
            .zip(&w[t * s..(t + 1) * s])
            .for_each(|((d, &vj), &wj)| *d = b * (vj - e * wj));
    }
    for t in 1..c {
        let (done, rest) = u.split_at_mut(t * s);
        gemm::<F>(&mut rest[..s], s, &gram[t * cp..], cp, done, s, (1, s, t));
    }

    // O = e^γ Q S0 + P U.
    let o = &mut out[t0 * s..(t0 + c) * s];
    for t in 0..c {
        let e = v_expf(gamma[t] as f32);
        o[t * s..(t + 1) * s]
            .iter_mut()
            .zip(&w[(c + t) * s..(c + t + 1) * s])
            .for_each(|(d, &wj)| *d = e * wj);
    }
    let mut tb = 0;
    while tb < c {
        let rows = (c - tb).min(MR);
        gemm::<F>(
            &mut o[tb * s..],
            s,
            &gram[(c + tb) * cp..],
            cp,
            u,
            s,
            (rows, s, tb + rows),
        );
        tb += rows;
    }

    // S = e^{γ_last} S0 + (e^{γ_last-γ} K)ᵀ U.
    let gl = gamma[c - 1];
    let el = v_expf(gl as f32);
    x.st.iter_mut().for_each(|d| *d *= el);
    for (uu, &gu) in gamma.iter().enumerate() {
        let f = v_expf((gl - gu) as f32);
        let krow = &x.kq[uu * s..(uu + 1) * s];
        for (i, &ki) in krow.iter().enumerate() {
            x.kd[i * c + uu] = f * ki;
        }
    }
    gemm::<F>(&mut x.st, s, &x.kd, c, u, s, (s, s, c));
}

/// `c + a * b`, fused when `F`.
#[inline(always)]
fn madd<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F {
        a.mul_add(b, c)
    } else {
        c + a * b
    }
}

/// `C += A B` for `C [m, n]`, `A [m, k]`, `B [k, n]`, row-major with row
/// strides `ldc`, `lda`, `ldb`: tiles of [`MR`] x [`NR`] held in registers
/// over the whole `k`.
#[inline(always)]
fn gemm<const F: bool>(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    (m, n, k): (usize, usize, usize),
) {
    let mut r = 0;
    while r < m {
        let rows = (m - r).min(MR);
        let (c, a) = (&mut c[r * ldc..], &a[r * lda..]);
        match rows {
            4 => tile_rows::<F, 4>(c, ldc, a, lda, b, ldb, (n, k)),
            3 => tile_rows::<F, 3>(c, ldc, a, lda, b, ldb, (n, k)),
            2 => tile_rows::<F, 2>(c, ldc, a, lda, b, ldb, (n, k)),
            _ => tile_rows::<F, 1>(c, ldc, a, lda, b, ldb, (n, k)),
        }
        r += rows;
    }
}

/// `R` rows of [`gemm`].
#[inline(always)]
fn tile_rows<const F: bool, const R: usize>(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    (n, k): (usize, usize),
) {
    let arow: [&[f32]; R] = std::array::from_fn(|i| &a[i * lda..i * lda + k]);
    let mut j = 0;
    while j + NR <= n {
        let mut acc = [[0.0f32; NR]; R];
        for p in 0..k {
            // A range of exactly NR values: the conversion cannot fail (it
            // is there so that the loop below indexes without checks).
            let bv: &[f32; NR] = b[p * ldb + j..p * ldb + j + NR].try_into().unwrap();
            for i in 0..R {
                let x = arow[i][p];
                for l in 0..NR {
                    acc[i][l] = madd::<F>(x, bv[l], acc[i][l]);
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            let row = &mut c[i * ldc + j..i * ldc + j + NR];
            row.iter_mut().zip(acc).for_each(|(d, &a)| *d += a);
        }
        j += NR;
    }
    for jj in j..n {
        for (i, ar) in arow.iter().enumerate() {
            let mut sum = 0.0f32;
            for (p, &x) in ar.iter().enumerate() {
                sum = madd::<F>(x, b[p * ldb + jj], sum);
            }
            c[i * ldc + jj] += sum;
        }
    }
}

#[cfg(test)]
mod tests {
    //! The chunked form against the recurrent one and against an f64
    //! evaluation of the delta rule, on inputs shaped as the models feed
    //! them.
    //!
    //! Tolerance: the two f32 forms differ only in the order of their f32
    //! operations (sums of `S` products, chunk-wise decays `e^{γ_t-γ_s}`
    //! instead of products of per-token ones), so each is within a few
    //! hundred units of f32 rounding (2^-24 ≈ 6e-8) of the exact values.
    //! Measured on these inputs (S 32 and 128, up to 329 tokens over two
    //! calls): the recurrent form's largest error against f64 is 0.4-1.8e-6
    //! of the tensor's RMS, the chunked form's 0.4-4e-6 (its decays are
    //! exponentials of f64-summed `γ` differences; summed in f32 they cost
    //! up to 1.6e-5), and the two differ by at most 4.5e-6 of the RMS.
    //! [`TOL`] = 1e-4 of the RMS leaves a margin of 20x over that and is far
    //! below what a wrong decay, a dropped token or a padded row does
    //! (errors of order one RMS). The chunked form is also held to the
    //! recurrent form's own accuracy: its error against f64 at most
    //! [`ACCURACY_RATIO`] times the recurrent one's (observed: up to 2.5x),
    //! or below an f32 floor.
    use super::super::recurrent::{gated_delta_net, gated_delta_net_as, DeltaForm, Head};
    use super::super::CpuTensor;
    use super::CHUNK;
    use crate::backend::{BatchPos, DeltaNetParams, KHeadMap};

    /// Largest difference from the reference, as a fraction of the
    /// reference's RMS.
    const TOL: f64 = 1e-4;
    /// The chunked form's error against f64 over the recurrent form's.
    const ACCURACY_RATIO: f64 = 4.0;
    /// Errors below this fraction of the RMS count as f32 rounding whatever
    /// the ratio (a few units of 2^-24 times `sqrt(S)`).
    const FLOOR: f64 = 2e-6;

    /// xorshift64*, seeded.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn uniform(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }

        /// A standard normal draw (Box-Muller).
        fn normal(&mut self) -> f32 {
            let (a, b) = (self.uniform().max(1e-300), self.uniform());
            ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
        }

        fn normals(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.normal()).collect()
        }
    }

    fn tensor(data: Vec<f32>, rows: usize, cols: usize) -> CpuTensor {
        assert_eq!(data.len(), rows * cols);
        CpuTensor { data, rows, cols }
    }

    /// One call's inputs: `q`, `k`, `v`, `g`, `beta`.
    struct Batch {
        q: CpuTensor,
        k: CpuTensor,
        v: CpuTensor,
        g: CpuTensor,
        beta: CpuTensor,
    }

    /// A layer's per-head constants: `-exp(A_log)`, `dt_bias`.
    struct Layer {
        a: Vec<f32>,
        dt_bias: Vec<f32>,
    }

    impl Layer {
        /// `A_log` uniform in `[ln 0.1, ln 16]` (so `exp(A_log)` spans the
        /// trained models' range), `dt_bias` normal.
        fn random(rng: &mut Rng, hv: usize) -> Self {
            let (lo, hi) = (0.1f64.ln(), 16f64.ln());
            Layer {
                a: (0..hv)
                    .map(|_| -(lo + (hi - lo) * rng.uniform()).exp() as f32)
                    .collect(),
                dt_bias: rng.normals(hv),
            }
        }
    }

    /// `n` tokens as the model feeds them: q and k L2-normalised per head,
    /// `g = -softplus(alpha + dt_bias) * exp(A_log)`, `beta = sigmoid(..)`.
    fn batch(rng: &mut Rng, layer: &Layer, n: usize, p: &DeltaNetParams) -> Batch {
        let (hk, hv, s) = (p.n_k_heads, p.n_v_heads, p.head_dim);
        let mut normed = |heads: usize| {
            let mut x = rng.normals(n * heads * s);
            for h in x.chunks_mut(s) {
                let norm = h.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
                h.iter_mut().for_each(|v| *v /= norm);
            }
            tensor(x, n, heads * s)
        };
        let (q, k) = (normed(hk), normed(hk));
        let v = tensor(rng.normals(n * hv * s), n, hv * s);
        let softplus = |x: f32| if x > 20.0 { x } else { x.exp().ln_1p() };
        let g = (0..n * hv)
            .map(|i| softplus(rng.normal() + layer.dt_bias[i % hv]) * layer.a[i % hv])
            .collect();
        let beta = (0..n * hv)
            .map(|_| 1.0 / (1.0 + (-rng.normal()).exp()))
            .collect();
        Batch {
            q,
            k,
            v,
            g: tensor(g, n, hv),
            beta: tensor(beta, n, hv),
        }
    }

    fn params(s: usize, k_map: KHeadMap) -> DeltaNetParams {
        DeltaNetParams {
            n_k_heads: 2,
            n_v_heads: 4,
            head_dim: s,
            k_map,
        }
    }

    /// One sequence's call in the given form; `state` carried.
    fn run(b: &Batch, state: &mut CpuTensor, p: &DeltaNetParams, form: DeltaForm) -> CpuTensor {
        let seqs = [BatchPos {
            pos0: 0,
            n_tokens: b.q.rows,
            steps: false,
        }];
        gated_delta_net_as(
            &b.q,
            &b.k,
            &b.v,
            &b.g,
            &b.beta,
            &mut [state],
            &seqs,
            p,
            |_| form,
        )
        .expect("gated_delta_net")
    }

    /// The delta rule as `Backend::gated_delta_net` defines it, in f64.
    fn reference(b: &Batch, state: &mut [f64], p: &DeltaNetParams) -> Vec<f64> {
        let (hk, hv, s) = (p.n_k_heads, p.n_v_heads, p.head_dim);
        let n = b.q.rows;
        let mut out = vec![0.0f64; n * hv * s];
        for h in 0..hv {
            let kh = match p.k_map {
                KHeadMap::Interleave => h / (hv / hk),
                KHeadMap::Tile => h % hk,
            };
            let m = &mut state[h * s * s..(h + 1) * s * s];
            for t in 0..n {
                let at =
                    |x: &CpuTensor, head: usize, i: usize| x.data[t * x.cols + head * s + i] as f64;
                let decay = (b.g.data[t * hv + h] as f64).exp();
                let beta = b.beta.data[t * hv + h] as f64;
                m.iter_mut().for_each(|x| *x *= decay);
                for j in 0..s {
                    let sk: f64 = (0..s).map(|i| m[j * s + i] * at(&b.k, kh, i)).sum();
                    let d = (at(&b.v, h, j) - sk) * beta;
                    for i in 0..s {
                        m[j * s + i] += at(&b.k, kh, i) * d;
                    }
                    let o: f64 = (0..s).map(|i| m[j * s + i] * at(&b.q, kh, i)).sum();
                    out[t * hv * s + h * s + j] = o / (s as f64).sqrt();
                }
            }
        }
        out
    }

    /// `max |a - r|` and that over the RMS of `r`.
    fn error(a: &[f32], r: &[f64]) -> (f64, f64) {
        assert_eq!(a.len(), r.len());
        let max = a
            .iter()
            .zip(r)
            .map(|(&x, &y)| (x as f64 - y).abs())
            .fold(0.0, f64::max);
        let rms = (r.iter().map(|y| y * y).sum::<f64>() / r.len() as f64).sqrt();
        (max, max / rms)
    }

    fn widen(x: &[f32]) -> Vec<f64> {
        x.iter().map(|&v| v as f64).collect()
    }

    /// Chunked and recurrent forms over `prefix` tokens (which make the
    /// carried-in state, through the recurrent form), then two consecutive
    /// calls of `n` and `n2` tokens, against each other and against f64.
    fn compare(seed: u64, s: usize, k_map: KHeadMap, n: usize, n2: usize) {
        let p = params(s, k_map);
        let mut rng = Rng(seed);
        let layer = Layer::random(&mut rng, p.n_v_heads);
        let prefix = batch(&mut rng, &layer, 100, &p);
        let mut carried = CpuTensor::zeros(p.n_v_heads, s * s);
        run(&prefix, &mut carried, &p, DeltaForm::Recurrent);
        assert!(carried.data.iter().any(|&x| x != 0.0));
        let calls = [
            batch(&mut rng, &layer, n, &p),
            batch(&mut rng, &layer, n2, &p),
        ];

        let (mut rec, mut chu) = (carried.clone(), carried.clone());
        let mut exact = widen(&carried.data);
        let case = format!("S {s}, {k_map:?}, {n} then {n2} tokens");
        for (call, b) in calls.iter().enumerate() {
            let want = reference(b, &mut exact, &p);
            let o_rec = run(b, &mut rec, &p, DeltaForm::Recurrent);
            let o_chu = run(b, &mut chu, &p, DeltaForm::Chunked);
            let o_diff = error(&o_chu.data, &widen(&o_rec.data));
            let s_diff = error(&chu.data, &widen(&rec.data));
            let (o_rec64, o_chu64) = (error(&o_rec.data, &want), error(&o_chu.data, &want));
            let (s_rec64, s_chu64) = (error(&rec.data, &exact), error(&chu.data, &exact));
            eprintln!(
                "{case}, call {call}: chunked vs recurrent out {:.2e} ({:.2e} rms), state {:.2e} ({:.2e} rms); \
                 vs f64 out rec {:.2e} chu {:.2e}, state rec {:.2e} chu {:.2e} (rms)",
                o_diff.0, o_diff.1, s_diff.0, s_diff.1, o_rec64.1, o_chu64.1, s_rec64.1, s_chu64.1
            );
            assert!(
                o_diff.1 <= TOL,
                "{case}, call {call}: outputs differ by {o_diff:?}"
            );
            assert!(
                s_diff.1 <= TOL,
                "{case}, call {call}: states differ by {s_diff:?}"
            );
            for (what, rec64, chu64) in [
                ("outputs", o_rec64.1, o_chu64.1),
                ("state", s_rec64.1, s_chu64.1),
            ] {
                assert!(
                    chu64 <= FLOOR.max(ACCURACY_RATIO * rec64),
                    "{case}, call {call}: chunked {what} {chu64:.2e} from f64, recurrent {rec64:.2e}"
                );
            }
        }
    }

    #[test]
    fn chunked_matches_recurrent_at_s32() {
        for k_map in [KHeadMap::Interleave, KHeadMap::Tile] {
            for (i, n) in [1, 63, 64, 65, 200].into_iter().enumerate() {
                compare(0x5eed_0032 + i as u64, 32, k_map, n, 70);
            }
        }
    }

    #[test]
    fn chunked_matches_recurrent_at_s128() {
        for k_map in [KHeadMap::Interleave, KHeadMap::Tile] {
            for (i, n) in [1, 63, 64, 65, 200].into_iter().enumerate() {
                compare(0x5eed_0128 + i as u64, 128, k_map, n, 2 * CHUNK + 1);
            }
        }
    }

    /// Every output row of a head is written (the buffer starts as NaN),
    /// the partial last chunk included.
    #[test]
    fn every_output_of_a_head_is_written() {
        let p = params(32, KHeadMap::Interleave);
        let mut rng = Rng(0x0bad_f00d);
        let layer = Layer::random(&mut rng, p.n_v_heads);
        let n = 2 * CHUNK + 7;
        let b = batch(&mut rng, &layer, n, &p);
        let mut m = vec![0.0f32; 32 * 32];
        let mut out = vec![f32::NAN; n * 32];
        fn view(t: &CpuTensor) -> Head<'_> {
            Head::of(t, 0, 0, 32)
        }
        super::head_chunked(
            &mut m,
            n,
            (view(&b.q), view(&b.k), view(&b.v)),
            |t| (b.g.data[t * 4], b.beta.data[t * 4]),
            &mut out,
        );
        assert!(out.iter().all(|x| x.is_finite()));
        assert!(m.iter().all(|x| x.is_finite()) && m.iter().any(|&x| x != 0.0));
    }

    /// The instruction-set variants: AVX2 and AVX-512 bit for bit (the same
    /// operations per lane), the unfused fallback within [`TOL`].
    #[test]
    fn instruction_set_variants_agree() {
        let p = params(128, KHeadMap::Interleave);
        let mut rng = Rng(0x5e7_1a5e);
        let layer = Layer::random(&mut rng, p.n_v_heads);
        let n = CHUNK + 9;
        let b = batch(&mut rng, &layer, n, &p);
        fn view(t: &CpuTensor) -> Head<'_> {
            Head::of(t, 0, 0, 128)
        }
        let qkv = (view(&b.q), view(&b.k), view(&b.v));
        let gb = |t: usize| (b.g.data[t * 4], b.beta.data[t * 4]);
        let start: Vec<f32> = rng.normals(128 * 128).iter().map(|x| x * 0.05).collect();
        let run = |f: &dyn Fn(&mut [f32], &mut [f32])| {
            let (mut m, mut o) = (start.clone(), vec![f32::NAN; n * 128]);
            f(&mut m, &mut o);
            (m, o)
        };
        let plain = run(&|m, o| super::head_chunked_in::<false>(m, n, qkv, &gb, o));
        let chosen = run(&|m, o| super::head_chunked(m, n, qkv, gb, o));
        for (a, r) in [(&plain.0, &chosen.0), (&plain.1, &chosen.1)] {
            let e = error(a, &widen(r));
            assert!(e.1 <= TOL, "unfused vs chosen: {e:?}");
        }
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
            // SAFETY: the features were detected above (AVX-512F implies AVX2).
            let avx2 = run(&|m, o| unsafe { super::head_chunked_fma(m, n, qkv, &gb, o) });
            let avx512 = run(&|m, o| unsafe { super::head_chunked_avx512(m, n, qkv, &gb, o) });
            assert!(avx2.0 == avx512.0 && avx2.1 == avx512.1);
        }
    }

    /// A batch of a prompt (chunked), a short prompt and a decode token
    /// (recurrent): the dispatch gives each sequence exactly its form's
    /// results, states included.
    #[test]
    fn dispatch_runs_long_sequences_chunked_and_short_ones_recurrent() {
        let p = params(128, KHeadMap::Tile);
        let mut rng = Rng(0xd15_7a7c);
        let layer = Layer::random(&mut rng, p.n_v_heads);
        let lens = [200usize, 5, 1];
        let parts: Vec<Batch> = lens
            .iter()
            .map(|&n| batch(&mut rng, &layer, n, &p))
            .collect();
        let cat = |f: fn(&Batch) -> &CpuTensor| {
            let cols = f(&parts[0]).cols;
            let data = parts.iter().flat_map(|b| f(b).data.clone()).collect();
            tensor(data, lens.iter().sum(), cols)
        };
        let all = Batch {
            q: cat(|b| &b.q),
            k: cat(|b| &b.k),
            v: cat(|b| &b.v),
            g: cat(|b| &b.g),
            beta: cat(|b| &b.beta),
        };
        let start: Vec<CpuTensor> = (0..lens.len())
            .map(|_| {
                tensor(
                    rng.normals(p.n_v_heads * 128 * 128)
                        .iter()
                        .map(|x| x * 0.05)
                        .collect(),
                    p.n_v_heads,
                    128 * 128,
                )
            })
            .collect();
        let mut states = start.clone();
        let seqs: Vec<BatchPos> = lens
            .iter()
            .map(|&n| BatchPos {
                pos0: 10,
                n_tokens: n,
                steps: false,
            })
            .collect();
        let mut refs: Vec<&mut CpuTensor> = states.iter_mut().collect();
        let out = gated_delta_net(
            &all.q, &all.k, &all.v, &all.g, &all.beta, &mut refs, &seqs, &p,
        )
        .expect("gated_delta_net");
        let mut r0 = 0;
        for (i, (b, &n)) in parts.iter().zip(&lens).enumerate() {
            let form = DeltaForm::for_tokens(n);
            assert_eq!(
                form == DeltaForm::Chunked,
                n >= super::super::recurrent::CHUNKED_MIN_TOKENS
            );
            let mut alone = start[i].clone();
            let o = run(b, &mut alone, &p, form);
            let cols = p.n_v_heads * 128;
            assert_eq!(
                &out.data[r0 * cols..(r0 + n) * cols],
                &o.data[..],
                "sequence {i} ({form:?})"
            );
            assert_eq!(states[i], alone, "sequence {i}'s state ({form:?})");
            r0 += n;
        }
    }
}
