//! CPU and GPU side by side, per kernel family and end to end, on divan:
//! `cargo bench --bench gpu_vs_cpu` (`-- mat_vec` or `-- Gpu` filters).
//! Each bench runs the same `Backend` op on both placements (`Cpu`, `Gpu`)
//! with the same inputs; GPU times include waiting for the result. The GPU
//! rows need an adapter: the default choice (discrete, else integrated),
//! or `LONGHAUL_DEVICE=NAME` for any other (a software adapter such as
//! lavapipe measures nothing about GPUs; its numbers only show that the
//! bench runs). Without an adapter, or for an op a placement lacks, the row
//! stays empty and the reason is printed.
//!
//! `LONGHAUL_BENCH_MODEL=path.gguf` picks the end-to-end model (default:
//! the qwen3moe Q4_K_M test fixture).

#[path = "../tests/gpu_util/mod.rs"]
mod gpu_util;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use divan::Bencher;
use longhaul::backend::cpu::CpuBackend;
use longhaul::backend::gpu::{GpuBackend, GpuOptions};
use longhaul::backend::{AttnParams, Backend, BatchPos, Glu, RopeMode, RopeParams};
use longhaul::gguf;
use longhaul::model::{Logits, Model};
use longhaul::quant::quantize_row;
use longhaul::state::SeqState;
use longhaul::tensor::GgmlType;

fn main() {
    match Gpu::open() {
        Ok(g) => println!("GPU: {} ({})", g.adapter().name, g.adapter().backend),
        Err(e) => println!("GPU: none ({e})"),
    }
    println!("CPU: {} rayon threads", rayon::current_num_threads());
    divan::main();
}

/// Where a bench runs: the CPU, or the GPU when there is one.
trait Placement {
    type B: Backend + 'static;
    fn backend() -> Option<&'static Self::B>;
}

struct Cpu;
struct Gpu;

impl Placement for Cpu {
    type B = CpuBackend;
    fn backend() -> Option<&'static CpuBackend> {
        Some(&CpuBackend)
    }
}

impl Gpu {
    fn open() -> &'static Result<GpuBackend, String> {
        static GPU: OnceLock<Result<GpuBackend, String>> = OnceLock::new();
        GPU.get_or_init(|| GpuBackend::open(&GpuOptions::from_env()).map_err(|e| e.to_string()))
    }
}

impl Placement for Gpu {
    type B = GpuBackend;
    fn backend() -> Option<&'static GpuBackend> {
        Gpu::open().as_ref().ok()
    }
}

/// Seeded inputs in [-1, 1), as the GPU tests draw them.
fn randn(n: usize, seed: u64) -> Vec<f32> {
    gpu_util::randn(n, seed, 1.0)
}

/// Benches `f` once it has succeeded once (the warm-up); an op this
/// placement lacks, or a placement without a device, is reported and skipped.
fn bench<B: Backend, T>(b: Bencher, backend: Option<&B>, mut f: impl FnMut(&B) -> Option<T>) {
    let Some(be) = backend else {
        eprintln!("skipped: no GPU adapter");
        return;
    };
    if f(be).is_none() {
        eprintln!("skipped: unsupported on {}", be.name());
        return;
    }
    b.bench_local(|| f(be));
}

/// Reads a result back so GPU timings include the work (a copy on the CPU).
fn done<B: Backend>(b: &B, t: B::Tensor) -> Option<Vec<f32>> {
    b.to_host(&t).ok()
}

fn weight<B: Backend>(b: &B, ty: GgmlType, dims: &[u64], seed: u64) -> B::Weight {
    let n: u64 = dims.iter().product();
    let bytes = quantize_row(ty, &randn(n as usize, seed)).expect("quantise");
    let info = gguf::TensorInfo {
        name: "bench".into(),
        dims: dims.to_vec(),
        ty,
        shard: 0,
        offset: 0,
        len: bytes.len() as u64,
    };
    b.weight_from_bytes(&info, bytes).expect("weight")
}

fn matmul<P: Placement>(b: Bencher, ty: GgmlType, t: usize) {
    let (k, n) = (2048, 2048);
    let setup = P::backend().and_then(|be| {
        let w = weight(be, ty, &[k as u64, n as u64], 7);
        let x = be.from_host(randn(t * k, 3), t, k).ok()?;
        Some((w, x))
    });
    bench(b, P::backend(), |be| {
        let (w, x) = setup.as_ref()?;
        done(be, be.matmul(w, x).ok()?)
    });
}

const MATMUL_TYPES: [GgmlType; 5] = [
    GgmlType::Q4_K,
    GgmlType::Q8_0,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::MXFP4,
];

/// 2048x2048 weights times one activation row.
#[divan::bench(types = [Cpu, Gpu], args = MATMUL_TYPES, max_time = 1)]
fn mat_vec<P: Placement>(b: Bencher, ty: GgmlType) {
    matmul::<P>(b, ty, 1);
}

/// 2048x2048 weights times 64 activation rows.
#[divan::bench(types = [Cpu, Gpu], args = MATMUL_TYPES, max_time = 1)]
fn mat_mul<P: Placement>(b: Bencher, ty: GgmlType) {
    matmul::<P>(b, ty, 64);
}

/// Q4_K experts 2048x768, 64 of them, top-8 routing of `T` tokens.
#[divan::bench(types = [Cpu, Gpu], consts = [1, 32], max_time = 1)]
fn mul_mat_id<P: Placement, const T: usize>(b: Bencher) {
    let (k, ff, ne) = (2048usize, 768usize, 64usize);
    let ids: Vec<u32> = (0..T * 8)
        .map(|i| ((i * 13 + i / 8 * 5) % ne) as u32)
        .collect();
    let setup = P::backend().and_then(|be| {
        let w = weight(be, GgmlType::Q4_K, &[k as u64, ff as u64, ne as u64], 8);
        let x = be.from_host(randn(T * k, 4), T, k).ok()?;
        Some((w, x))
    });
    bench(b, P::backend(), |be| {
        let (w, x) = setup.as_ref()?;
        done(be, be.mul_mat_id(w, x, &ids, 8).ok()?)
    });
}

/// 32 query heads over 4 KV heads of 128: one token at position 1024
/// (`decode`) or a 256-token prompt (`prefill`).
fn attention<P: Placement>(b: Bencher, pos0: usize, t: usize) {
    let p = AttnParams {
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        head_dim_v: 128,
        scale: 1.0 / (128f32).sqrt(),
        window: None,
        flash_attn: false,
    };
    let mut setup = P::backend().and_then(|be| {
        let kv = be.new_kv(2048, 512, 512, GgmlType::F16).ok()?;
        let q = be.from_host(randn(t * 4096, 5), t, 4096).ok()?;
        let k = be.from_host(randn(t * 512, 6), t, 512).ok()?;
        Some((kv, q, k))
    });
    let pos = BatchPos {
        pos0,
        n_tokens: t,
        steps: false,
    };
    bench(b, P::backend(), |be| {
        let (kv, q, k) = setup.as_mut()?;
        done(be, be.attention(kv, &*q, &*k, &*k, None, pos, &p).ok()?)
    });
}

#[divan::bench(types = [Cpu, Gpu], max_time = 1)]
fn attention_decode<P: Placement>(b: Bencher) {
    attention::<P>(b, 1024, 1);
}

#[divan::bench(types = [Cpu, Gpu], max_time = 1)]
fn attention_prefill<P: Placement>(b: Bencher) {
    attention::<P>(b, 0, 256);
}

/// One element-wise op over 64 rows of 4096.
#[divan::bench(types = [Cpu, Gpu], args = ["rms_norm", "rope", "swiglu"], max_time = 1)]
fn elementwise<P: Placement>(b: Bencher, op: &str) {
    let (rows, cols) = (64usize, 4096usize);
    let rp = RopeParams {
        mode: RopeMode::Neox,
        n_rot: 128,
        freq_base: 1e6,
        freq_scale: 1.0,
        n_ctx_orig: 32768,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    let pos = BatchPos {
        pos0: 100,
        n_tokens: rows,
        steps: false,
    };
    let setup = P::backend().and_then(|be| {
        let x = be.from_host(randn(rows * cols, 8), rows, cols).ok()?;
        let u = be.from_host(randn(rows * cols, 9), rows, cols).ok()?;
        let w = weight(be, GgmlType::F32, &[cols as u64], 10);
        Some((x, u, w))
    });
    bench(b, P::backend(), |be| {
        let (x, u, w) = setup.as_ref()?;
        match op {
            "rms_norm" => done(be, be.rms_norm(x, w, cols, 1e-6).ok()?),
            "rope" => {
                let mut y = be.from_host(vec![0.5; rows * cols], rows, cols).ok()?;
                be.rope(&mut y, 128, pos, &rp).ok()?;
                done(be, y)
            }
            _ => done(be, be.glu(x, u, Glu::SwiGlu).ok()?),
        }
    });
}

/// The end-to-end model file, opened once.
fn model_file() -> &'static Arc<gguf::Model> {
    static FILE: OnceLock<Arc<gguf::Model>> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::var_os("LONGHAUL_BENCH_MODEL")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/qwen3moe-q4_k_m.gguf")
            });
        Arc::new(gguf::Model::open(&path).expect("open the end-to-end model"))
    })
}

/// A `pp`-token prompt in one batch, or `tg` decode steps after one token.
fn end_to_end<P: Placement>(b: Bencher, pp: usize, tg: usize) {
    let model = P::backend().and_then(|be| Model::load(be.clone(), model_file().clone()).ok());
    bench(b, P::backend(), |_| {
        let m = model.as_ref()?;
        let n_vocab = m.hp.n_vocab as u32;
        let toks: Vec<u32> = (0..pp.max(1) as u32)
            .map(|i| (i * 37 + 11) % n_vocab)
            .collect();
        let mut kv = SeqState::new(m, pp + tg + 2, GgmlType::F16).ok()?;
        kv.eval(m, &toks, Logits::Last).ok()?;
        for i in 0..tg {
            kv.eval(m, &[(i as u32 * 7) % n_vocab], Logits::Last).ok()?;
        }
        Some(())
    });
}

#[divan::bench(types = [Cpu, Gpu], sample_count = 3, sample_size = 1)]
fn pp128<P: Placement>(b: Bencher) {
    end_to_end::<P>(b, 128, 0);
}

#[divan::bench(types = [Cpu, Gpu], sample_count = 3, sample_size = 1)]
fn tg32<P: Placement>(b: Bencher) {
    end_to_end::<P>(b, 0, 32);
}
