//! Scalar vs SIMD dot-product throughput of every quant type
//! (`QuantOps::vec_dot_rows`, one thread). Plain timing loop, no harness:
//! `cargo bench --bench quant_dot`. Weights (256 rows x 4096) stay in L2, so
//! this measures the kernels, not memory bandwidth.

use longhaul::quant::{
    ops, ops_with_caps, quantize_activations, quantize_row, scalar_ops, CpuCaps, QuantOps,
    SUPPORTED_TYPES,
};
use longhaul::tensor::GgmlType;
use std::time::Instant;

fn weights(ty: GgmlType, n: usize, rows: usize) -> Vec<u8> {
    let x: Vec<f32> = (0..n * rows)
        .map(|i| ((i as f32) * 0.618).sin() * 0.5)
        .collect();
    match quantize_row(ty, &x) {
        Ok(w) => w,
        // Types without a quantiser: deterministic bytes with small f16 scales.
        Err(_) => {
            let len = ty.row_bytes((n * rows) as u64).unwrap() as usize;
            let mut w: Vec<u8> = (0..len)
                .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
                .collect();
            for b in w.chunks_exact_mut(ty.type_size()) {
                let off = match ty {
                    GgmlType::Q2_K => 80,
                    GgmlType::Q3_K => 108,
                    _ => 0,
                };
                b[off..off + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                if matches!(
                    ty,
                    GgmlType::Q2_K
                        | GgmlType::Q4_K
                        | GgmlType::Q5_K
                        | GgmlType::Q4_1
                        | GgmlType::Q5_1
                ) {
                    b[off + 2..off + 4].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                }
            }
            w
        }
    }
}

fn time(o: &dyn QuantOps, n: usize, w: &[u8], act: &[u8], out: &mut [f32]) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let mut iters = 0;
        while t.elapsed().as_secs_f64() < 0.05 {
            o.vec_dot_rows(n, w, act, out).unwrap();
            iters += 1;
        }
        best = best.min(t.elapsed().as_secs_f64() / iters as f64);
    }
    best
}

fn main() {
    if std::env::args().any(|a| a == "tiles") {
        return tiles();
    }
    let (n, rows) = (4096, 256);
    let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).cos()).collect();
    let best = CpuCaps::detect();
    let avx2 = CpuCaps {
        avx512: false,
        ..best
    };
    println!("GB/s of weights, n={n}, rows={rows}, one thread; speedups vs scalar");
    println!(
        "{:8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "type", "scalar", "avx2", "x", "best", "x"
    );
    for ty in SUPPORTED_TYPES {
        let slow = scalar_ops(ty).unwrap();
        let w = weights(ty, n, rows);
        let mut act = Vec::new();
        quantize_activations(slow.act_type(), &x, &mut act).unwrap();
        let mut out = vec![0.0; rows];
        let gbs = |t: f64| w.len() as f64 / t / 1e9;
        let ts = time(slow, n, &w, &act, &mut out);
        let t2 = time(ops_with_caps(ty, avx2).unwrap(), n, &w, &act, &mut out);
        let fast = ops(ty).unwrap();
        let tb = time(fast, n, &w, &act, &mut out);
        println!(
            "{:8} {:>8.2} {:>8.2} {:>7.1}x {:>8.2} {:>7.1}x  {}",
            ty.name(),
            gbs(ts),
            gbs(t2),
            ts / t2,
            gbs(tb),
            ts / tb,
            fast.kernel_name()
        );
    }
}

/// Tile kernels (`vec_dot_tile`): 64 weight rows x `t` activation rows per
/// call, as the batched products call them; multiply-adds per second.
fn tiles() {
    // Weights in L2: this measures the kernels (LONGHAUL_BENCH_ROWS=98304
    // streams them from memory instead).
    let rows = std::env::var("LONGHAUL_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let n = 576;
    println!("\ntile kernels, n={n}, {rows} rows, GMAC/s one thread");
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let o = ops(ty).unwrap();
        let n = if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
            1536
        } else {
            n
        };
        let w = weights(ty, n, rows);
        let rb = w.len() / rows;
        let mut line = format!("{:8}", ty.name());
        for t in [1usize, 2, 4, 8, 16] {
            let mut acts = Vec::new();
            for j in 0..t {
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i * (j + 3)) as f32 * 0.37).cos())
                    .collect();
                let mut a = Vec::new();
                quantize_activations(o.act_type(), &x, &mut a).unwrap();
                acts.extend_from_slice(&a);
            }
            let mut out = vec![0.0; 64 * t];
            let mut best = f64::MAX;
            for _ in 0..5 {
                let tm = Instant::now();
                let mut iters = 0;
                while tm.elapsed().as_secs_f64() < 0.05 {
                    for c in w.chunks_exact(64 * rb) {
                        if t == 1 {
                            o.vec_dot_rows(n, c, &acts, &mut out).unwrap();
                        } else {
                            o.vec_dot_tile(n, c, &acts, &mut out).unwrap();
                        }
                    }
                    iters += 1;
                }
                best = best.min(tm.elapsed().as_secs_f64() / iters as f64);
            }
            line += &format!(" t={t}:{:>7.2}", (n * rows * t) as f64 / best / 1e9);
        }
        println!("{line}");
    }
}
