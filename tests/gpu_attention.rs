//! GPU attention against the CPU reference: the same `new_kv` + `attention`
//! calls, in the same order, on both backends, over seeded random q/k/v.
//! Ordinary attention, V heads smaller than K heads (`head_dim_v`), and
//! DeepSeek's MLA (K heads of 576, V heads of 512 read from a K-only cache).
//! Tolerance: normalised MSE <= 5e-4, ggml test-backend-ops' bound for
//! attention. Outputs are NaN-poisoned before the kernels run (an unwritten
//! element fails the comparison).
//!
//! Run with `WGPU_BACKEND=vulkan` (lavapipe without a GPU).

mod gpu_util;

use gpu_util::{gpu, nmse, randn, variants};
use longhaul::backend::cpu::CpuBackend;
use longhaul::backend::gpu::GpuBackend;
use longhaul::backend::{AttnParams, Backend, BackendError, BatchPos};
use longhaul::gguf::TensorInfo;
use longhaul::tensor::GgmlType;

/// ggml test-backend-ops' NMSE bound for attention.
const TOL: f64 = 5e-4;

#[derive(Clone, Copy)]
struct Config {
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    /// V head size (`head_dim` for ordinary attention).
    head_dim_v: usize,
    /// A K-only cache: V is the first `head_dim_v` of each K head row.
    k_only: bool,
    window: Option<u32>,
    sinks: bool,
    dtype: GgmlType,
    n_ctx: usize,
    /// Range of q's elements: 4 keeps the softmax far from uniform; large
    /// values make scores that overflow `exp` unless the max is right.
    q_scale: f32,
}

impl Config {
    fn params(&self) -> AttnParams {
        AttnParams {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim_v,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            window: self.window,
            flash_attn: false,
        }
    }
    fn n_embd_k(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
    /// Values a position holds in the cache (0: K-only).
    fn n_embd_v(&self) -> usize {
        if self.k_only {
            0
        } else {
            self.n_head_kv * self.head_dim_v
        }
    }
}

fn sinks_weight<B: Backend>(b: &B, vals: &[f32]) -> B::Weight {
    let bytes: Vec<u8> = bytemuck::cast_slice(vals).to_vec();
    let info = TensorInfo {
        name: "blk.0.attn_sinks.weight".into(),
        dims: vec![vals.len() as u64],
        ty: GgmlType::F32,
        shard: 0,
        offset: 0,
        len: bytes.len() as u64,
    };
    b.weight_from_bytes(&info, bytes).expect("sinks")
}

/// One backend's side of a run: a cache and the optional sinks.
struct Side<B: Backend> {
    b: B,
    kv: B::Kv,
    sinks: Option<B::Weight>,
}

impl<B: Backend> Side<B> {
    fn new(b: B, c: &Config, sinks: Option<&[f32]>) -> Self {
        let kv = b
            .new_kv(c.n_ctx, c.n_embd_k(), c.n_embd_v(), c.dtype)
            .expect("new_kv");
        let sinks = sinks.map(|s| sinks_weight(&b, s));
        Self { b, kv, sinks }
    }

    fn step(
        &mut self,
        c: &Config,
        pos: BatchPos,
        q: &[f32],
        k: &[f32],
        v: &[f32],
    ) -> Result<Vec<f32>, BackendError> {
        let t = pos.n_tokens;
        let b = &self.b;
        let q = b.from_host(q.to_vec(), t, c.n_head * c.head_dim)?;
        let k = b.from_host(k.to_vec(), t, c.n_embd_k())?;
        // A K-only cache ignores v (k stands in for it).
        let v = if c.k_only {
            None
        } else {
            Some(b.from_host(v.to_vec(), t, c.n_embd_v())?)
        };
        let out = b.attention(
            &mut self.kv,
            &q,
            &k,
            v.as_ref().unwrap_or(&k),
            self.sinks.as_ref(),
            pos,
            &c.params(),
        )?;
        b.to_host(&out)
    }
}

/// Runs the batches `steps` (tokens per call) through both backends and
/// returns the worst NMSE; every step must stay within [`TOL`].
fn run(gpu: GpuBackend, c: &Config, steps: &[usize], seed: u64, label: &str) -> (f64, GpuSide) {
    // Sinks in [2, 8): comparable to the log of the softmax denominator, so
    // that a lost sink shows.
    let sinks = c.sinks.then(|| {
        randn(c.n_head, seed ^ 0x5157, 3.0)
            .iter()
            .map(|s| s + 5.0)
            .collect::<Vec<_>>()
    });
    let mut cpu = Side::new(CpuBackend::new(), c, sinks.as_deref());
    let mut gpu = Side::new(gpu, c, sinks.as_deref());
    let mut pos0 = 0;
    let mut worst = 0f64;
    for (i, &t) in steps.iter().enumerate() {
        let s = seed.wrapping_mul(1000).wrapping_add(i as u64);
        let q = randn(t * c.n_head * c.head_dim, s, c.q_scale);
        let k = randn(t * c.n_embd_k(), s ^ 0xA5A5, 1.0);
        let v = randn(t * c.n_embd_v(), s ^ 0x5A5A, 1.0);
        let pos = BatchPos {
            pos0,
            n_tokens: t,
            steps: false,
        };
        let want = cpu.step(c, pos, &q, &k, &v).expect("cpu attention");
        let got = gpu.step(c, pos, &q, &k, &v).expect("gpu attention");
        let e = nmse(&got, &want);
        assert!(
            e <= TOL,
            "{label}: step {i} (pos0 {pos0}, t {t}): nmse {e:e} > {TOL:e}"
        );
        worst = worst.max(e);
        pos0 += t;
    }
    eprintln!("{label}: {} positions, max nmse {worst:.3e}", pos0);
    (worst, gpu)
}

type GpuSide = Side<GpuBackend>;

/// Prompt, decode steps (t = 1 and a few tokens), a chunked prompt at
/// pos0 > 0, more decode.
const STEPS: &[usize] = &[37, 1, 1, 1, 3, 20, 1, 4, 1];

fn cfg(n_head: usize, n_head_kv: usize, head_dim: usize) -> Config {
    Config {
        n_head,
        n_head_kv,
        head_dim,
        head_dim_v: head_dim,
        k_only: false,
        window: None,
        sinks: false,
        dtype: GgmlType::F16,
        n_ctx: 128,
        q_scale: 4.0,
    }
}

#[test]
fn gqa_head_dim_64_and_128() {
    let g = gpu();
    run(g.clone(), &cfg(8, 2, 64), STEPS, 1, "gqa 8/2 hd64 f16");
    run(g.clone(), &cfg(8, 2, 128), STEPS, 2, "gqa 8/2 hd128 f16");
    let c = Config {
        dtype: GgmlType::F32,
        ..cfg(8, 2, 128)
    };
    run(g, &c, STEPS, 3, "gqa 8/2 hd128 f32");
}

#[test]
fn mha_odd_head_dim_window_and_sinks() {
    let g = gpu();
    let c = Config {
        window: Some(24),
        sinks: true,
        ..cfg(4, 4, 80)
    };
    run(g.clone(), &c, STEPS, 4, "mha 4/4 hd80 f16 window 24 sinks");
    let c = Config {
        window: Some(5),
        dtype: GgmlType::F32,
        ..cfg(4, 4, 64)
    };
    run(g.clone(), &c, STEPS, 5, "mha 4/4 hd64 f32 window 5");
    let c = Config {
        sinks: true,
        ..cfg(8, 2, 128)
    };
    run(g, &c, STEPS, 6, "gqa 8/2 hd128 f16 sinks");
}

/// Long enough for several decode chunks, and with many heads and 4 tokens
/// so that a chunk spans several blocks of keys.
#[test]
fn decode_over_many_chunks() {
    let c = Config {
        n_ctx: 320,
        window: Some(200),
        sinks: true,
        ..cfg(32, 4, 64)
    };
    run(gpu(), &c, &[300, 4, 1, 2], 7, "gqa 32/4 hd64 f16 long");
}

/// Every device variant, including a 64 KiB binding limit that splits the
/// cache into several buffers by position (activations stay under 64 KiB:
/// at most 32 tokens of 8 x 64).
#[test]
fn all_variants_and_split_cache() {
    let steps = [30, 1, 1, 3, 31, 1, 30, 30, 2, 1];
    let f16 = Config {
        sinks: true,
        n_ctx: 140,
        ..cfg(8, 4, 64)
    };
    let f32 = Config {
        window: Some(40),
        dtype: GgmlType::F32,
        ..f16
    };
    for (name, g) in variants() {
        eprintln!("{name}: {:?}", g.caps());
        for (c, what) in [(f16, "f16 sinks"), (f32, "f32 window 40 sinks")] {
            let (_, side) = run(
                g.clone(),
                &c,
                &steps,
                8,
                &format!("{name}: gqa 8/4 hd64 {what}"),
            );
            if name == "64KiB-bindings" {
                assert!(side.kv.n_parts() > 1, "{name}: cache not split");
                // f16: 512 bytes a position, 128 per part; f32: 64 per part.
                let per = if c.dtype == GgmlType::F16 { 128 } else { 64 };
                assert_eq!(side.kv.n_parts(), c.n_ctx.div_ceil(per));
            } else {
                assert_eq!(side.kv.n_parts(), 1);
            }
        }
    }
}

/// Scores in the hundreds: `exp` overflows unless every kernel subtracts
/// the true running max (its reductions with and without subgroups).
#[test]
fn peaky_softmax() {
    for (name, g) in variants().into_iter().take(3) {
        for dtype in [GgmlType::F16, GgmlType::F32] {
            let c = Config {
                q_scale: 300.0,
                dtype,
                ..cfg(8, 2, 64)
            };
            run(
                g.clone(),
                &c,
                STEPS,
                13,
                &format!("{name}: peaky {}", dtype.name()),
            );
        }
    }
}

/// A cache in 9 parts of 32 positions (f32, 2 KiB a position, 64 KiB
/// bindings): the decode partials of 4 tokens x 8 heads need one chunk per
/// part and no longer fit one binding, so decode falls back to the prompt
/// kernel.
#[test]
fn decode_fallback_when_partials_exceed_a_binding() {
    let mut o = gpu_util::options();
    o.max_binding = Some(64 * 1024);
    let g = GpuBackend::open(&o).expect("open");
    let c = Config {
        dtype: GgmlType::F32,
        sinks: true,
        n_ctx: 260,
        ..cfg(8, 8, 64)
    };
    let (_, side) = run(
        g,
        &c,
        &[32, 32, 32, 32, 32, 32, 32, 30, 4, 1],
        14,
        "64KiB: mha 8/8 hd64 f32 9 parts",
    );
    assert_eq!(side.kv.n_parts(), 9);
}

#[test]
fn context_full_and_bad_inputs() {
    let g = gpu();
    let c = Config {
        n_ctx: 40,
        ..cfg(4, 2, 64)
    };
    let (_, mut side) = run(g.clone(), &c, &[37], 9, "ctx 40");
    let n_embd = c.n_head_kv * c.head_dim;
    let (q, k, v) = (
        randn(4 * c.n_head * c.head_dim, 10, 1.0),
        randn(4 * n_embd, 11, 1.0),
        randn(4 * n_embd, 12, 1.0),
    );
    let pos = BatchPos {
        pos0: 37,
        n_tokens: 4,
        steps: false,
    };
    match side.step(&c, pos, &q, &k, &v) {
        Err(BackendError::ContextFull { pos: 40, n_ctx: 40 }) => {}
        other => panic!("want ContextFull, got {other:?}"),
    }
    // The cache is untouched and still usable up to its end.
    let pos = BatchPos {
        pos0: 37,
        n_tokens: 3,
        steps: false,
    };
    let got = side.step(&c, pos, &q[..3 * 256], &k[..3 * 128], &v[..3 * 128]);
    assert!(got.is_ok_and(|o| o.iter().all(|x| x.is_finite())));

    // Unsupported cache types and mismatched shapes are errors, not panics.
    assert!(matches!(
        g.new_kv(16, 128, 128, GgmlType::Q8_0),
        Err(BackendError::Unsupported { .. })
    ));
    let bad = Config { head_dim: 32, ..c };
    let pos = BatchPos {
        pos0: 0,
        n_tokens: 1,
        steps: false,
    };
    assert!(matches!(
        side.step(&bad, pos, &q[..128], &k[..64], &v[..64]),
        Err(BackendError::Shape { .. })
    ));
}

/// DeepSeek's MLA in absorbed form: MQA (one kv head) with K heads of 576
/// and V heads of 512 read from a K-only cache; f16 and f32 caches, 4 and
/// 16 query heads, a 64-token prompt and decode steps.
#[test]
fn mla_k_only_cache_dk576_dv512() {
    let g = gpu();
    let steps = [64, 1, 1, 3, 20, 1, 4, 1];
    for (i, (n_head, dtype)) in [(16, GgmlType::F16), (4, GgmlType::F32), (4, GgmlType::F16)]
        .into_iter()
        .enumerate()
    {
        let c = Config {
            head_dim_v: 512,
            k_only: true,
            dtype,
            ..cfg(n_head, 1, 576)
        };
        let label = format!("mla {n_head}/1 576/512 {} k-only", dtype.name());
        let (_, side) = run(g.clone(), &c, &steps, 20 + i as u64, &label);
        // Keys only: 576 elements a position, no value buffer.
        let elt = if dtype == GgmlType::F16 { 2 } else { 4 };
        assert_eq!(side.kv.bytes(), (c.n_ctx * 576 * elt) as u64, "{label}");
    }
}

/// K heads of 192, V heads of 128 over an ordinary cache (GQA, sinks, a
/// window), f16 and f32.
#[test]
fn dk192_dv128_ordinary_cache() {
    let g = gpu();
    for (i, dtype) in [GgmlType::F16, GgmlType::F32].into_iter().enumerate() {
        let c = Config {
            head_dim_v: 128,
            dtype,
            sinks: true,
            window: Some(30),
            ..cfg(8, 2, 192)
        };
        let label = format!("gqa 8/2 192/128 {} window 30 sinks", dtype.name());
        run(g.clone(), &c, STEPS, 30 + i as u64, &label);
    }
}

/// The MLA shapes on every device variant: no f16, no subgroups, and
/// 64 KiB bindings, which split the K-only cache by position (f16: 1152
/// bytes a position, 56 per part; f32: 28). Activations stay under 64 KiB:
/// at most 6 tokens of 4 x 576 floats. Peaky scores check the max.
#[test]
fn mla_all_variants_and_split_cache() {
    let steps = [6, 1, 1, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 4, 1, 2];
    let n_pos: usize = steps.iter().sum();
    for (name, g) in variants() {
        for (dtype, q_scale) in [(GgmlType::F16, 4.0), (GgmlType::F32, 40.0)] {
            let c = Config {
                head_dim_v: 512,
                k_only: true,
                dtype,
                q_scale,
                n_ctx: n_pos + 3,
                ..cfg(4, 1, 576)
            };
            let label = format!("{name}: mla 4/1 576/512 {} q_scale {q_scale}", dtype.name());
            let (_, side) = run(g.clone(), &c, &steps, 40, &label);
            if name == "64KiB-bindings" {
                let per = if dtype == GgmlType::F16 { 56 } else { 28 };
                assert_eq!(side.kv.n_parts(), c.n_ctx.div_ceil(per), "{label}");
            } else {
                assert_eq!(side.kv.n_parts(), 1, "{label}");
            }
        }
    }
}

/// Several sequences in one `attention_multi` call (the scheduler's batch),
/// each with its own K-only cache: every row equals the CPU's.
#[test]
fn mla_k_only_attention_multi() {
    let c = Config {
        head_dim_v: 512,
        k_only: true,
        ..cfg(4, 1, 576)
    };
    let p = c.params();
    let cpu = CpuBackend::new();
    let g = gpu();
    // Sequence lengths so far and this batch's tokens of each.
    let batches: [&[(usize, usize)]; 3] =
        [&[(0, 20), (0, 7)], &[(20, 1), (7, 1)], &[(21, 3), (8, 1)]];
    let mut cpu_kv: Vec<_> = (0..2)
        .map(|_| cpu.new_kv(c.n_ctx, c.n_embd_k(), 0, c.dtype).unwrap())
        .collect();
    let mut gpu_kv: Vec<_> = (0..2)
        .map(|_| g.new_kv(c.n_ctx, c.n_embd_k(), 0, c.dtype).unwrap())
        .collect();
    for (i, batch) in batches.iter().enumerate() {
        let seqs: Vec<BatchPos> = batch
            .iter()
            .map(|&(pos0, n_tokens)| BatchPos {
                pos0,
                n_tokens,
                steps: false,
            })
            .collect();
        let t: usize = seqs.iter().map(|s| s.n_tokens).sum();
        let q = randn(t * c.n_head * c.head_dim, 60 + i as u64, c.q_scale);
        let k = randn(t * c.n_embd_k(), 70 + i as u64, 1.0);
        let want = {
            let qt = cpu.from_host(q.clone(), t, c.n_head * c.head_dim).unwrap();
            let kt = cpu.from_host(k.clone(), t, c.n_embd_k()).unwrap();
            let mut kvs: Vec<_> = cpu_kv.iter_mut().collect();
            let o = cpu
                .attention_multi(&mut kvs, &qt, &kt, &kt, None, &seqs, &p)
                .unwrap();
            cpu.to_host(&o).unwrap()
        };
        let got = {
            let qt = g.from_host(q, t, c.n_head * c.head_dim).unwrap();
            let kt = g.from_host(k, t, c.n_embd_k()).unwrap();
            let mut kvs: Vec<_> = gpu_kv.iter_mut().collect();
            let o = g
                .attention_multi(&mut kvs, &qt, &kt, &kt, None, &seqs, &p)
                .unwrap();
            assert_eq!(g.shape(&o), (t, c.n_head * 512));
            g.to_host(&o).unwrap()
        };
        let e = nmse(&got, &want);
        assert!(e <= TOL, "batch {i}: nmse {e:e} > {TOL:e}");
    }
}
