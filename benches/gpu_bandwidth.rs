//! Achieved memory bandwidth of the GPU mat-vec kernels against the
//! adapter's: `cargo bench --bench gpu_bandwidth [-- --gpu-bw GBPS] [-r N]
//! [--types q4_K,q8_0]`.
//!
//! Each row multiplies one weight by one activation row `N` times in one
//! submission, then reads the last result back; GB/s is the weight bytes
//! times `N` over that time (activations and outputs are under 1% of the
//! bytes at these shapes). The adapter's bandwidth is `--gpu-bw` (decimal
//! GB/s, e.g. 4800 for an H200's HBM3e) or, without it, measured here with
//! buffer copies (a copy reads and writes each byte: 2 x bytes over time).
//! Shapes: a small one for the fixed cost of a mat-vec, Qwen3-30B-A3B's expert matrices (2048 -> 768, 768 -> 2048) and
//! its output projection (2048 -> 151936). The adapter is the default one
//! or `LONGHAUL_DEVICE=NAME`; a software adapter (lavapipe) only shows that
//! the bench runs.

#[path = "../tests/gpu_util/mod.rs"]
mod gpu_util;

use std::time::Instant;

use longhaul::backend::gpu::{GpuBackend, GpuOptions};
use longhaul::backend::Backend;
use longhaul::gguf;
use longhaul::quant::quantize_row;
use longhaul::tensor::GgmlType;

const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_K,
    GgmlType::Q8_0,
    GgmlType::Q6_K,
    GgmlType::Q4_0,
    GgmlType::MXFP4,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::F16,
];

/// (name, row length k, rows n). The first is small enough that its time
/// is the fixed cost of one mat-vec (recording, dispatch, launch).
const SHAPES: [(&str, usize, usize); 4] = [
    ("fixed cost 256x64", 256, 64),
    ("30B-A3B gate/up 2048x768", 2048, 768),
    ("30B-A3B down 768x2048", 768, 2048),
    ("output 2048x151936", 2048, 151_936),
];

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Copy bandwidth in GB/s: `reps` copies of 256 MiB in one submission.
fn copy_bandwidth(g: &GpuBackend, reps: usize) -> Result<f64, String> {
    let ctx = g.ctx();
    let bytes: u64 = (256u64 << 20).min(ctx.caps.max_binding);
    let buf = |label| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    };
    let (a, b) = (buf("bw src"), buf("bw dst"));
    let run = |n: usize| -> Result<f64, String> {
        let t0 = Instant::now();
        for _ in 0..n {
            ctx.record(|enc| enc.copy_buffer_to_buffer(&a, 0, &b, 0, bytes));
        }
        ctx.read(&b, 0, 4).map_err(|e| e.to_string())?;
        Ok(t0.elapsed().as_secs_f64())
    };
    run(1)?;
    let s = run(reps)?;
    Ok(2.0 * bytes as f64 * reps as f64 / s / 1e9)
}

/// A random `k x n` weight of `ty` on the GPU, a random activation row, and
/// the weight's bytes; why not, where the type cannot be made or run.
fn operands(
    g: &GpuBackend,
    ty: GgmlType,
    k: usize,
    n: usize,
) -> Result<
    (
        <GpuBackend as Backend>::Weight,
        <GpuBackend as Backend>::Tensor,
        u64,
    ),
    &'static str,
> {
    let vals = gpu_util::randn(k * n, 7, 1.0);
    // The i-quants below 4 bits have no quantiser here (llama-quantize makes them).
    let bytes = quantize_row(ty, &vals).map_err(|_| "no quantiser here")?;
    let len = bytes.len() as u64;
    let info = gguf::TensorInfo {
        name: "bw".into(),
        dims: vec![k as u64, n as u64],
        ty,
        shard: 0,
        offset: 0,
        len,
    };
    let w = g
        .weight_from_bytes(&info, bytes)
        .map_err(|_| "unsupported")?;
    let x = g
        .from_host(gpu_util::randn(k, 3, 1.0), 1, k)
        .map_err(|_| "unsupported")?;
    Ok((w, x, len))
}

/// Seconds per mat-vec of `ty` at `k x n`, over `reps` in one submission
/// after a warm-up, and the weight's bytes; why not, where the type cannot
/// be made or run.
fn matvec_seconds(
    g: &GpuBackend,
    ty: GgmlType,
    k: usize,
    n: usize,
    reps: usize,
) -> Result<(f64, u64), &'static str> {
    let (w, x, len) = operands(g, ty, k, n)?;
    let once = |r: usize| -> Option<f64> {
        let t0 = Instant::now();
        let mut last = None;
        for _ in 0..r {
            last = Some(g.matmul(&w, &x).ok()?);
        }
        g.to_host(&last?).ok()?;
        Some(t0.elapsed().as_secs_f64())
    };
    // Warm up for 300 ms: pipelines compiled, buffers pooled, clocks up.
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < 0.3 {
        once(reps.max(1)).ok_or("unsupported")?;
    }
    Ok((once(reps).ok_or("unsupported")? / reps as f64, len))
}

/// Host time to record one small mat-vec (Q8_0, 256 x 64): `n` calls below
/// one submission's limit, timed before anything is submitted or awaited.
fn record_seconds(g: &GpuBackend, n: usize) -> Result<f64, &'static str> {
    let (w, x, _) = operands(g, GgmlType::Q8_0, 256, 64)?;
    let mut outs = Vec::with_capacity(n);
    let mut time = || -> Result<f64, &'static str> {
        g.to_host(&g.matmul(&w, &x).map_err(|_| "unsupported")?)
            .map_err(|_| "read-back")?;
        outs.clear();
        let t0 = Instant::now();
        for _ in 0..n {
            outs.push(g.matmul(&w, &x).map_err(|_| "unsupported")?);
        }
        Ok(t0.elapsed().as_secs_f64() / n as f64)
    };
    time()?;
    time()
}

fn main() {
    let reps: usize = arg("-r").and_then(|s| s.parse().ok()).unwrap_or(50);
    let g = match GpuBackend::open(&GpuOptions::from_env()) {
        Ok(g) => g,
        Err(e) => {
            println!("no GPU adapter ({e}): nothing to measure");
            return;
        }
    };
    let a = g.adapter();
    println!("GPU: {} ({}), {reps} mat-vecs per row", a.name, a.backend);
    let (bw, source) = match arg("--gpu-bw").and_then(|s| s.parse::<f64>().ok()) {
        Some(b) => (b, "--gpu-bw"),
        None => match copy_bandwidth(&g, 20) {
            Ok(b) => (b, "measured by buffer copies"),
            Err(e) => {
                println!("copy bandwidth: {e}");
                return;
            }
        },
    };
    println!("adapter bandwidth: {bw:.1} GB/s ({source})");
    match record_seconds(&g, 400) {
        Ok(s) => println!("host time to record one mat-vec: {:.1} us\n", s * 1e6),
        Err(why) => println!("host time to record one mat-vec: - ({why})\n"),
    }
    println!("| type | shape | weight MiB | us/mat-vec | GB/s | % of bandwidth |");
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    // --types q4_K,q8_0: only these (ggml names).
    let only = arg("--types");
    let wanted = |ty: GgmlType| {
        only.as_deref()
            .is_none_or(|l| l.split(',').any(|n| n.eq_ignore_ascii_case(ty.name())))
    };
    for ty in TYPES.into_iter().filter(|&t| wanted(t)) {
        for (name, k, n) in SHAPES {
            match matvec_seconds(&g, ty, k, n, reps) {
                Ok((s, bytes)) => {
                    let gbs = bytes as f64 / s / 1e9;
                    println!(
                        "| {} | {name} | {:.2} | {:.1} | {gbs:.1} | {:.1}% |",
                        ty.name(),
                        bytes as f64 / (1u64 << 20) as f64,
                        s * 1e6,
                        100.0 * gbs / bw
                    );
                }
                Err(why) => println!("| {} | {name} | - | - | - | {why} |", ty.name()),
            }
        }
    }
}
