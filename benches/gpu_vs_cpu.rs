//! CPU and GPU side by side, per kernel family and end to end:
//! `cargo bench --bench gpu_vs_cpu`. Each row runs the same `Backend` op on
//! both placements with the same inputs and prints the median time of each
//! and their ratio; GPU times include waiting for the result. The GPU
//! column needs an adapter: the default choice (discrete, else integrated),
//! or `LONGHAUL_DEVICE=NAME` for any other (a software adapter such as
//! lavapipe measures nothing about GPUs; its numbers only show that the
//! bench runs). Without an adapter the GPU column says so.
//!
//! `LONGHAUL_BENCH_MODEL=path.gguf` picks the end-to-end model (default:
//! the qwen3moe Q4_K_M test fixture).

#[path = "../tests/gpu_util/mod.rs"]
mod gpu_util;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul::backend::gpu::{GpuBackend, GpuOptions};
use longhaul::backend::{AttnParams, Backend, BatchPos, Glu, RopeMode, RopeParams};
use longhaul::gguf;
use longhaul::kv::KvCache;
use longhaul::model::{Logits, Model};
use longhaul::quant::quantize_row;
use longhaul::tensor::GgmlType;

/// Seeded inputs in [-1, 1), as the GPU tests draw them.
fn randn(n: usize, seed: u64) -> Vec<f32> {
    gpu_util::randn(n, seed, 1.0)
}

/// Median of `reps` timings of `f` after one warmup call; `None` when the
/// op is not supported on this placement.
fn time<T>(reps: usize, mut f: impl FnMut() -> Option<T>) -> Option<Duration> {
    f()?;
    let mut v: Vec<Duration> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed()
        })
        .collect();
    v.sort();
    Some(v[v.len() / 2])
}

fn row(family: &str, case: &str, cpu: Option<Duration>, gpu: Option<Option<Duration>>) {
    let us = |d: Option<Duration>| match d {
        Some(d) => format!("{:.1}", d.as_secs_f64() * 1e6),
        None => "unsupported".into(),
    };
    let ratio = match (cpu, gpu.flatten()) {
        (Some(c), Some(g)) => format!("{:.2}x", c.as_secs_f64() / g.as_secs_f64()),
        _ => "-".into(),
    };
    let g = gpu.map_or("no adapter".to_string(), us);
    println!(
        "| {family:<12} | {case:<30} | {:>12} | {g:>12} | {ratio:>8} |",
        us(cpu)
    );
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

fn matmul<B: Backend>(b: &B, ty: GgmlType, k: usize, n: usize, t: usize) -> Option<Duration> {
    let w = weight(b, ty, &[k as u64, n as u64], 7);
    let x = b.from_host(randn(t * k, 3), t, k).ok()?;
    time(5, || done(b, b.matmul(&w, &x).ok()?))
}

fn mul_mat_id<B: Backend>(b: &B, k: usize, ff: usize, ne: usize, t: usize) -> Option<Duration> {
    let w = weight(b, GgmlType::Q4_K, &[k as u64, ff as u64, ne as u64], 8);
    let ids: Vec<u32> = (0..t * 8)
        .map(|i| ((i * 13 + i / 8 * 5) % ne) as u32)
        .collect();
    let x = b.from_host(randn(t * k, 4), t, k).ok()?;
    time(5, || done(b, b.mul_mat_id(&w, &x, &ids, 8).ok()?))
}

fn attention<B: Backend>(b: &B, pos0: usize, t: usize) -> Option<Duration> {
    let p = AttnParams {
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        scale: 1.0 / (128f32).sqrt(),
        window: None,
        flash_attn: false,
    };
    let mut kv = b.new_kv(2048, 512, 512, GgmlType::F16).ok()?;
    let q = b.from_host(randn(t * 4096, 5), t, 4096).ok()?;
    let k = b.from_host(randn(t * 512, 6), t, 512).ok()?;
    let pos = BatchPos { pos0, n_tokens: t };
    time(5, || {
        done(b, b.attention(&mut kv, &q, &k, &k, None, pos, &p).ok()?)
    })
}

fn elementwise<B: Backend>(b: &B, op: &str) -> Option<Duration> {
    let (rows, cols) = (64usize, 4096usize);
    let x = b.from_host(randn(rows * cols, 8), rows, cols).ok()?;
    let u = b.from_host(randn(rows * cols, 9), rows, cols).ok()?;
    let w = weight(b, GgmlType::F32, &[cols as u64], 10);
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
    };
    time(9, || match op {
        "rms_norm" => done(b, b.rms_norm(&x, &w, cols, 1e-6).ok()?),
        "rope" => {
            let mut y = b.from_host(vec![0.5; rows * cols], rows, cols).ok()?;
            b.rope(&mut y, 128, pos, &rp).ok()?;
            done(b, y)
        }
        _ => done(b, b.glu(&x, &u, Glu::SwiGlu).ok()?),
    })
}

/// A `pp`-token prompt in one batch, or `tg` decode steps after one token.
fn end_to_end<B: Backend>(
    b: &B,
    file: &Arc<gguf::Model>,
    pp: usize,
    tg: usize,
) -> Option<Duration> {
    let m = Model::load(b.clone(), file.clone()).ok()?;
    let n_vocab = m.hp.n_vocab as u32;
    let toks: Vec<u32> = (0..pp.max(1) as u32)
        .map(|i| (i * 37 + 11) % n_vocab)
        .collect();
    time(3, || {
        let mut kv = KvCache::new(&m, pp + tg + 2, GgmlType::F16).ok()?;
        kv.eval(&m, &toks, Logits::Last).ok()?;
        for i in 0..tg {
            kv.eval(&m, &[(i as u32 * 7) % n_vocab], Logits::Last)
                .ok()?;
        }
        Some(())
    })
}

fn main() {
    let cpu = longhaul::backend::cpu::CpuBackend::new();
    let gpu = match GpuBackend::open(&GpuOptions::from_env()) {
        Ok(g) => {
            println!("GPU: {} ({})", g.adapter().name, g.adapter().backend);
            Some(g)
        }
        Err(e) => {
            println!("GPU: none ({e})");
            None
        }
    };
    println!("CPU: {} rayon threads\n", rayon::current_num_threads());
    println!(
        "| {:<12} | {:<30} | {:>12} | {:>12} | {:>8} |",
        "family", "case", "CPU us", "GPU us", "CPU/GPU"
    );
    println!(
        "|{:-<14}|{:-<32}|{:-<14}|{:-<14}|{:-<10}|",
        "", "", "", "", ""
    );
    let g = gpu.as_ref();

    let (k, n) = (2048, 2048);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q8_0,
        GgmlType::Q6_K,
        GgmlType::F16,
        GgmlType::MXFP4,
    ] {
        for t in [1, 64] {
            let family = if t == 1 { "mat-vec" } else { "mat-mul" };
            let case = format!("{} {k}x{n} t={t}", ty.name());
            row(
                family,
                &case,
                matmul(&cpu, ty, k, n, t),
                g.map(|g| matmul(g, ty, k, n, t)),
            );
        }
    }
    for t in [1, 32] {
        let case = format!("Q4_K 2048x768x64 top8 t={t}");
        row(
            "mul_mat_id",
            &case,
            mul_mat_id(&cpu, 2048, 768, 64, t),
            g.map(|g| mul_mat_id(g, 2048, 768, 64, t)),
        );
    }
    for (pos0, t) in [(1024, 1), (0, 256)] {
        let case = format!("h32/kv4/d128 pos={pos0} t={t}");
        row(
            "attention",
            &case,
            attention(&cpu, pos0, t),
            g.map(|g| attention(g, pos0, t)),
        );
    }
    for op in ["rms_norm", "rope", "swiglu"] {
        let case = format!("{op} 64x4096");
        row(
            "element-wise",
            &case,
            elementwise(&cpu, op),
            g.map(|g| elementwise(g, op)),
        );
    }

    let model = std::env::var_os("LONGHAUL_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3moe-q4_k_m.gguf")
        });
    let file = Arc::new(gguf::Model::open(&model).expect("open the end-to-end model"));
    let name = model
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    for (label, pp, tg) in [("pp128", 128, 0), ("tg32", 0, 32)] {
        let case = format!("{name} {label}");
        row(
            "end-to-end",
            &case,
            end_to_end(&cpu, &file, pp, tg),
            g.map(|g| end_to_end(g, &file, pp, tg)),
        );
    }
}
