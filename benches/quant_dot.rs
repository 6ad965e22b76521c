//! Scalar vs SIMD dot-product throughput of every quant type
//! (`QuantOps::vec_dot_rows`, one thread), on divan: `cargo bench --bench
//! quant_dot` (`-- best` or `-- Q4_K` filters, `--list` lists). `scalar`,
//! `avx2` and `best` (the kernel `ops` picks on this CPU) report GB/s of
//! weights; weights (256 rows x 4096) stay in L2, so this measures the
//! kernels, not memory bandwidth. `tile` runs the tile kernels
//! (`vec_dot_tile`, 64 weight rows x `T` activation rows per call, as the
//! batched products call them) and reports multiply-adds per second
//! (`LONGHAUL_BENCH_ROWS=98304` streams their weights from memory instead).

use divan::counter::{BytesCount, ItemsCount};
use divan::Bencher;
use longhaul::quant::{
    ops, ops_with_caps, quantize_activations, quantize_row, scalar_ops, CpuCaps, QuantOps,
    SUPPORTED_TYPES,
};
use longhaul::tensor::GgmlType;

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

const N: usize = 4096;
const ROWS: usize = 256;

fn main() {
    println!("best kernel per type on this CPU:");
    for ty in SUPPORTED_TYPES {
        if let Ok(o) = ops(ty) {
            println!("  {:8} {}", ty.name(), o.kernel_name());
        }
    }
    divan::main();
}

/// `rows` dot products of `n` columns through `o`, once per iteration.
fn rows_dot(b: Bencher, o: &dyn QuantOps, ty: GgmlType) {
    let w = weights(ty, N, ROWS);
    let x: Vec<f32> = (0..N).map(|i| ((i as f32) * 0.37).cos()).collect();
    let mut act = Vec::new();
    quantize_activations(o.act_type(), &x, &mut act).unwrap();
    let mut out = vec![0.0; ROWS];
    b.counter(BytesCount::new(w.len()))
        .bench_local(|| o.vec_dot_rows(N, &w, &act, &mut out).unwrap());
}

#[divan::bench(args = SUPPORTED_TYPES)]
fn scalar(b: Bencher, ty: GgmlType) {
    rows_dot(b, scalar_ops(ty).unwrap(), ty);
}

/// The AVX2 kernels with AVX-512 masked off (the scalar ones on a CPU
/// without AVX2).
#[divan::bench(args = SUPPORTED_TYPES)]
fn avx2(b: Bencher, ty: GgmlType) {
    let caps = CpuCaps {
        avx512: false,
        ..CpuCaps::detect()
    };
    rows_dot(b, ops_with_caps(ty, caps).unwrap(), ty);
}

#[divan::bench(args = SUPPORTED_TYPES)]
fn best(b: Bencher, ty: GgmlType) {
    rows_dot(b, ops(ty).unwrap(), ty);
}

/// `T` activation rows against every 64-row tile of the weights (`T = 1`
/// is the row kernel); multiply-adds per second.
#[divan::bench(
    args = [GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K],
    consts = [1, 2, 4, 8, 16],
)]
fn tile<const T: usize>(b: Bencher, ty: GgmlType) {
    // Weights in L2 by default: this measures the kernels.
    let rows: usize = std::env::var("LONGHAUL_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let n = if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
        1536
    } else {
        576
    };
    let o = ops(ty).unwrap();
    let w = weights(ty, n, rows);
    let rb = w.len() / rows;
    let mut acts = Vec::new();
    for j in 0..T {
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * (j + 3)) as f32 * 0.37).cos())
            .collect();
        let mut a = Vec::new();
        quantize_activations(o.act_type(), &x, &mut a).unwrap();
        acts.extend_from_slice(&a);
    }
    let mut out = vec![0.0; 64 * T];
    b.counter(ItemsCount::new(n * rows * T)).bench_local(|| {
        for c in w.chunks_exact(64 * rb) {
            if T == 1 {
                o.vec_dot_rows(n, c, &acts, &mut out).unwrap();
            } else {
                o.vec_dot_tile(n, c, &acts, &mut out).unwrap();
            }
        }
    });
}

/// Conversion to the interleaved layout (`quant::layout`), GB/s of
/// weights: what a longhaul slot costs on the reading thread as it fills,
/// and resident `--repack` at load. One expert-sized matrix (768 rows x
/// 2048, as Qwen3-30B-A3B's gate): in place (`MODE` 0, the load's path for
/// bytes read into the tensor), from a source to a destination (1), and
/// from a source through the streaming stores a slot fills with (2;
/// `layout::interleave_streamed`). In cache, 2 pays for its stores past the
/// caches and its prefetches and gains nothing; a slot's destination is
/// cold, which is where the stores save the read of each line before it is
/// written, and its source is in memory, where the prefetches pay
/// ([`interleave_cold`] measures both).
#[divan::bench(args = [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::Q2_K], consts = [0, 1, 2])]
fn interleave<const MODE: usize>(b: Bencher, ty: GgmlType) {
    use longhaul::quant::layout;
    let Some(il) = layout::interleaved(ty) else {
        return;
    };
    let (k, rows) = (2048, 768);
    let src = weights(ty, k, rows);
    let mut dst = src.clone();
    b.counter(BytesCount::new(src.len()))
        .bench_local(|| match MODE {
            0 => il.interleave(k, &mut dst).unwrap(),
            1 => il.interleave_from(k, &src, &mut dst).unwrap(),
            _ => layout::interleave_streamed(il, k, &src, &mut dst).unwrap(),
        });
}

/// [`interleave`]'s streaming conversion (`MODE` 2) as a slot meets it:
/// each call converts the next of a ring of copies of the matrix (1 GiB of
/// them, past any cache) into the next of a ring of destinations as large,
/// so the source comes from memory and the destination is cold. GB/s of
/// weights.
#[divan::bench(args = [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K])]
fn interleave_cold(b: Bencher, ty: GgmlType) {
    use longhaul::quant::layout;
    let Some(il) = layout::interleaved(ty) else {
        return;
    };
    let (k, rows) = (2048, 768);
    let one = weights(ty, k, rows);
    let n = (1 << 30) / one.len();
    let src = one.repeat(n);
    let mut dst = vec![1u8; src.len()];
    // A step coprime with `n`: every slice in turn, never two neighbours.
    let step = (n / 2..n).find(|s| gcd(*s, n) == 1).unwrap_or(1);
    let mut at = 0;
    b.counter(BytesCount::new(one.len())).bench_local(|| {
        at = (at + step) % n;
        let range = at * one.len()..(at + 1) * one.len();
        layout::interleave_streamed(il, k, &src[range.clone()], &mut dst[range]).unwrap()
    });
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
