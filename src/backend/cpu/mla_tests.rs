//! Attention with V heads smaller than K heads (ggml's `DK != DV`) and the
//! K-only cache of DeepSeek's MLA, through the [`Backend`] calls a model
//! makes, against a plain f64 attention written here. Both CPU paths (flash
//! attention and `mul_mat` + `soft_max`), f16 and f32 caches, a prompt of
//! 64 tokens or more (ggml's tiled flash kernel), short batches and decode
//! steps (one chunk; split KV past 512 cells).
//!
//! Tolerances (normalised MSE against the f64 reference):
//! - [`TOL_F16`] 5e-4, ggml test-backend-ops' bound for FLASH_ATTN_EXT
//!   (`max_nmse_err`), for every path that rounds to f16 (an f16 cache,
//!   or flash attention, which rounds Q, an f32 cache and, in its one-chunk
//!   kernel, the value accumulator to f16);
//! - [`TOL_F32`] 1e-10 for `-fa off` over an f32 cache, where every step
//!   is an f32 operation (unit roundoff 2^-24 ~ 6e-8, so NMSE ~ 1e-14 for a
//!   few hundred terms; 1e-10 leaves four orders of margin and still fails
//!   any rounding to f16, which gives ~1e-7).

use super::{CpuBackend, CpuTensor};
use crate::backend::{AttnParams, Backend, BackendError, BatchPos};
use crate::tensor::GgmlType;

const TOL_F16: f64 = 5e-4;
const TOL_F32: f64 = 1e-10;

/// Seeded uniform floats in `[-amp, amp)` (xorshift; never all zeros).
fn rnd(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
        })
        .collect()
}

fn nmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    if got.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    num / den.max(1e-30)
}

#[derive(Clone, Copy, Debug)]
struct Case {
    n_head: usize,
    n_head_kv: usize,
    dk: usize,
    dv: usize,
    /// A K-only cache (V = the first `dv` of each K head row).
    k_only: bool,
    dtype: GgmlType,
    flash_attn: bool,
    n_ctx: usize,
}

impl Case {
    fn params(&self) -> AttnParams {
        AttnParams {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.dk,
            head_dim_v: self.dv,
            scale: 1.0 / (self.dk as f32).sqrt(),
            window: None,
            flash_attn: self.flash_attn,
        }
    }
    fn n_embd_k(&self) -> usize {
        self.n_head_kv * self.dk
    }
    fn n_embd_v(&self) -> usize {
        if self.k_only {
            0
        } else {
            self.n_head_kv * self.dv
        }
    }
}

/// A value as the cache stores it.
fn stored(x: f32, dtype: GgmlType) -> f64 {
    match dtype {
        GgmlType::F16 => half::f16::from_f32(x).to_f32() as f64,
        _ => x as f64,
    }
}

/// Plain causal attention in f64 for the rows of `q` at `pos0..`, over the
/// cached keys `k` and values `v` (rows of `n_embd_k` / `n_embd_v`; for a
/// K-only cache `v` is `k` with `v_stride = n_embd_k`, `v_head = dk`).
#[allow(clippy::too_many_arguments)]
fn reference(
    c: &Case,
    q: &[f32],
    k: &[f64],
    v: &[f64],
    v_stride: usize,
    v_head: usize,
    pos0: usize,
    n_tokens: usize,
) -> Vec<f64> {
    let (dk, dv) = (c.dk, c.dv);
    let group = c.n_head / c.n_head_kv;
    let scale = 1.0 / (dk as f64).sqrt();
    let mut out = vec![0f64; n_tokens * c.n_head * dv];
    for t in 0..n_tokens {
        let qp = pos0 + t;
        for h in 0..c.n_head {
            let kvh = h / group;
            let qh = &q[(t * c.n_head + h) * dk..][..dk];
            let s: Vec<f64> = (0..=qp)
                .map(|j| {
                    let kr = &k[j * c.n_embd_k() + kvh * dk..][..dk];
                    qh.iter().zip(kr).map(|(a, b)| *a as f64 * b).sum::<f64>() * scale
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            let o = &mut out[(t * c.n_head + h) * dv..][..dv];
            for (j, ej) in e.iter().enumerate() {
                let vr = &v[j * v_stride + kvh * v_head..][..dv];
                for (od, vd) in o.iter_mut().zip(vr) {
                    *od += ej / sum * vd;
                }
            }
        }
    }
    out
}

/// Runs the batches `steps` through `CpuBackend::attention` and checks each
/// against [`reference`]; returns every step's output.
fn run(c: &Case, steps: &[usize], seed: u64) -> Vec<Vec<f32>> {
    let b = CpuBackend::new();
    let p = c.params();
    let mut kv = b
        .new_kv(c.n_ctx, c.n_embd_k(), c.n_embd_v(), c.dtype)
        .expect("new_kv");
    // Everything cached so far, as the cache holds it.
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    let tol = if c.dtype == GgmlType::F32 && !c.flash_attn {
        TOL_F32
    } else {
        TOL_F16
    };
    let mut outs = Vec::new();
    let mut pos0 = 0;
    let mut worst = 0f64;
    for (i, &t) in steps.iter().enumerate() {
        let s = seed * 1000 + i as u64;
        let q = rnd(t * c.n_head * c.dk, s, 3.0);
        let k = rnd(t * c.n_embd_k(), s ^ 0xA5A5, 1.0);
        let v = rnd(t * c.n_embd_v(), s ^ 0x5A5A, 1.0);
        ks.extend(k.iter().map(|&x| stored(x, c.dtype)));
        vs.extend(v.iter().map(|&x| stored(x, c.dtype)));
        let qt = b.from_host(q.clone(), t, c.n_head * c.dk).unwrap();
        let kt = b.from_host(k, t, c.n_embd_k()).unwrap();
        // A K-only cache ignores v: hand it a tensor of another shape.
        let vt = if c.k_only {
            CpuTensor::zeros(1, 3)
        } else {
            b.from_host(v, t, c.n_embd_v()).unwrap()
        };
        let pos = BatchPos {
            pos0,
            n_tokens: t,
            steps: false,
        };
        let out = b
            .attention(&mut kv, &qt, &kt, &vt, None, pos, &p)
            .expect("attention");
        assert_eq!(b.shape(&out), (t, c.n_head * c.dv));
        let got = b.to_host(&out).unwrap();
        let want = if c.k_only {
            reference(c, &q, &ks, &ks, c.n_embd_k(), c.dk, pos0, t)
        } else {
            reference(c, &q, &ks, &vs, c.n_embd_v(), c.dv, pos0, t)
        };
        let e = nmse(&got, &want);
        assert!(
            e <= tol,
            "{c:?}: step {i} (pos0 {pos0}, t {t}): nmse {e:e} > {tol:e}"
        );
        worst = worst.max(e);
        outs.push(got);
        pos0 += t;
    }
    eprintln!("{c:?}: {pos0} positions, max nmse {worst:.3e}");
    outs
}

/// A 70-token prompt (tiled flash kernel), decode steps and a short batch
/// (one-chunk kernel), over a 256-cell cache.
const STEPS: &[usize] = &[70, 1, 1, 5, 1];

/// DeepSeek MLA in absorbed form: MQA with K heads of 576 and V heads of
/// 512 read from a K-only cache, 4 to 16 query heads, both paths, f16 and
/// f32 caches.
#[test]
fn mla_k_only_cache_matches_f64_reference() {
    for (i, n_head) in [4, 9, 16].into_iter().enumerate() {
        for dtype in [GgmlType::F16, GgmlType::F32] {
            for flash_attn in [true, false] {
                let c = Case {
                    n_head,
                    n_head_kv: 1,
                    dk: 576,
                    dv: 512,
                    k_only: true,
                    dtype,
                    flash_attn,
                    n_ctx: 256,
                };
                run(&c, STEPS, 1 + i as u64);
            }
        }
    }
}

/// One token over 512 cells or more: flash attention's split-KV kernel,
/// on the K-only cache.
#[test]
fn mla_k_only_cache_split_kv_decode() {
    for dtype in [GgmlType::F16, GgmlType::F32] {
        for flash_attn in [true, false] {
            let c = Case {
                n_head: 8,
                n_head_kv: 1,
                dk: 576,
                dv: 512,
                k_only: true,
                dtype,
                flash_attn,
                n_ctx: 1024,
            };
            run(&c, &[300, 1, 2, 1], 7);
        }
    }
}

/// K heads of 192 and V heads of 128 (DeepSeek's MLA without absorption)
/// over an ordinary cache, GQA.
#[test]
fn dk_192_dv_128_matches_f64_reference() {
    for dtype in [GgmlType::F16, GgmlType::F32] {
        for flash_attn in [true, false] {
            let c = Case {
                n_head: 8,
                n_head_kv: 2,
                dk: 192,
                dv: 128,
                k_only: false,
                dtype,
                flash_attn,
                n_ctx: 256,
            };
            run(&c, STEPS, 3);
        }
    }
}

/// A K-only cache is exactly an ordinary cache whose values are the first
/// `dv` of each key head row: the same bits on every path.
#[test]
fn k_only_cache_equals_explicit_values_bit_for_bit() {
    let b = CpuBackend::new();
    for dtype in [GgmlType::F16, GgmlType::F32] {
        for flash_attn in [true, false] {
            let c = Case {
                n_head: 4,
                n_head_kv: 2,
                dk: 96,
                dv: 64,
                k_only: true,
                dtype,
                flash_attn,
                n_ctx: 1024,
            };
            let p = c.params();
            let n_embd_k = c.n_embd_k();
            let n_embd_v = c.n_head_kv * c.dv;
            let mut k_only = b.new_kv(c.n_ctx, n_embd_k, 0, dtype).unwrap();
            let mut full = b.new_kv(c.n_ctx, n_embd_k, n_embd_v, dtype).unwrap();
            let mut pos0 = 0;
            for (i, t) in [70, 1, 5, 300, 1].into_iter().enumerate() {
                let q = rnd(t * c.n_head * c.dk, 50 + i as u64, 3.0);
                let k = rnd(t * n_embd_k, 60 + i as u64, 1.0);
                let v: Vec<f32> = k
                    .chunks_exact(c.dk)
                    .flat_map(|head| head[..c.dv].to_vec())
                    .collect();
                let qt = b.from_host(q, t, c.n_head * c.dk).unwrap();
                let kt = b.from_host(k, t, n_embd_k).unwrap();
                let vt = b.from_host(v, t, n_embd_v).unwrap();
                let pos = BatchPos {
                    pos0,
                    n_tokens: t,
                    steps: false,
                };
                let a = b
                    .attention(&mut k_only, &qt, &kt, &kt, None, pos, &p)
                    .unwrap();
                let e = b
                    .attention(&mut full, &qt, &kt, &vt, None, pos, &p)
                    .unwrap();
                let same = a
                    .data
                    .iter()
                    .zip(&e.data)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{c:?}: step {i} differs");
                pos0 += t;
            }
        }
    }
}

/// The shared contract: a full context, V heads larger than a K-only
/// cache's K heads, and mismatched shapes are typed errors.
#[test]
fn k_only_contract_errors() {
    let b = CpuBackend::new();
    let c = Case {
        n_head: 4,
        n_head_kv: 1,
        dk: 64,
        dv: 32,
        k_only: true,
        dtype: GgmlType::F16,
        flash_attn: true,
        n_ctx: 8,
    };
    let mut kv = b.new_kv(c.n_ctx, c.n_embd_k(), 0, c.dtype).unwrap();
    let q = b.from_host(rnd(9 * 256, 1, 1.0), 9, 256).unwrap();
    let k = b.from_host(rnd(9 * 64, 2, 1.0), 9, 64).unwrap();
    let pos = BatchPos {
        pos0: 0,
        n_tokens: 9,
        steps: false,
    };
    match b.attention(&mut kv, &q, &k, &k, None, pos, &c.params()) {
        Err(BackendError::ContextFull { pos: 8, n_ctx: 8 }) => {}
        other => panic!("want ContextFull, got {:?}", other.map(|t| t.rows)),
    }
    let q1 = b.from_host(rnd(256, 3, 1.0), 1, 256).unwrap();
    let k1 = b.from_host(rnd(64, 4, 1.0), 1, 64).unwrap();
    let pos = BatchPos {
        pos0: 0,
        n_tokens: 1,
        steps: false,
    };
    let wide = AttnParams {
        head_dim_v: 80,
        ..c.params()
    };
    assert!(matches!(
        b.attention(&mut kv, &q1, &k1, &k1, None, pos, &wide),
        Err(BackendError::Shape { .. })
    ));
    // An ordinary cache needs v of its shape.
    let mut full = b.new_kv(8, 64, 32, c.dtype).unwrap();
    assert!(matches!(
        b.attention(&mut full, &q1, &k1, &k1, None, pos, &c.params()),
        Err(BackendError::Shape { .. })
    ));
    assert!(b
        .attention(&mut kv, &q1, &k1, &k1, None, pos, &c.params())
        .is_ok());
}

/// ggml's kernels treat every output dim alike (its loops over `DV` never
/// mix dims), so attention with V heads of `dv < dk` equals, bit for bit,
/// the first `dv` dims of each head of attention with `DV = DK` whose
/// value rows are padded with other values: the `DK == DV` arithmetic that
/// `attend_matches_ggml_order_bit_for_bit` and
/// `flash_attention_matches_ggml_kernels_bit_for_bit` pin to ggml. Every
/// kernel: tiled (70 tokens), one chunk (1 and 5), split KV (one token
/// over 512 cells), on both paths and cache types.
#[test]
fn dv_below_dk_is_the_leading_dims_of_dk_eq_dv() {
    let b = CpuBackend::new();
    let (n_head, n_head_kv, dk, dv) = (4, 1, 576, 512);
    for dtype in [GgmlType::F16, GgmlType::F32] {
        for flash_attn in [true, false] {
            let p = AttnParams {
                n_head,
                n_head_kv,
                head_dim: dk,
                head_dim_v: dv,
                scale: 1.0 / (dk as f32).sqrt(),
                window: None,
                flash_attn,
            };
            let square = AttnParams {
                head_dim_v: dk,
                ..p
            };
            let mut narrow = b.new_kv(1024, n_head_kv * dk, 0, dtype).unwrap();
            let mut wide = b
                .new_kv(1024, n_head_kv * dk, n_head_kv * dk, dtype)
                .unwrap();
            let mut pos0 = 0;
            for (i, t) in [70, 1, 5, 200, 1].into_iter().enumerate() {
                let q = rnd(t * n_head * dk, 70 + i as u64, 3.0);
                let k = rnd(t * n_head_kv * dk, 80 + i as u64, 1.0);
                // V rows: the K-only cache's values, then other values.
                let pad = rnd(t * n_head_kv * dk, 90 + i as u64, 1.0);
                let v: Vec<f32> = k
                    .chunks_exact(dk)
                    .zip(pad.chunks_exact(dk))
                    .flat_map(|(kh, ph)| [&kh[..dv], &ph[dv..]].concat())
                    .collect();
                let qt = b.from_host(q, t, n_head * dk).unwrap();
                let kt = b.from_host(k, t, n_head_kv * dk).unwrap();
                let vt = b.from_host(v, t, n_head_kv * dk).unwrap();
                let pos = BatchPos {
                    pos0,
                    n_tokens: t,
                    steps: false,
                };
                let a = b
                    .attention(&mut narrow, &qt, &kt, &kt, None, pos, &p)
                    .unwrap();
                let w = b
                    .attention(&mut wide, &qt, &kt, &vt, None, pos, &square)
                    .unwrap();
                for (r, (ah, wh)) in a
                    .data
                    .chunks_exact(dv)
                    .zip(w.data.chunks_exact(dk))
                    .enumerate()
                {
                    let same = ah.iter().zip(wh).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{} fa {flash_attn}: step {i}, head row {r} differs",
                        dtype.name()
                    );
                }
                pos0 += t;
            }
        }
    }
}
