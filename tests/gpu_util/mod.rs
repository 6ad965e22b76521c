//! Shared helpers of the GPU tests: open an adapter (failing, never skipping,
//! when there is none), device variants, seeded inputs and the error metric.
#![allow(dead_code)]

use longhaul::backend::gpu::{list_adapters, DeviceChoice, GpuBackend, GpuOptions};

/// The adapter the tests run on: `LONGHAUL_DEVICE` if set, else the first
/// adapter wgpu lists (lavapipe in CI, with `WGPU_BACKEND=vulkan`).
pub fn options() -> GpuOptions {
    let mut o = GpuOptions::from_env();
    o.poison = true;
    if o.device == DeviceChoice::Auto {
        let all = list_adapters();
        let first = all.first().unwrap_or_else(|| {
            panic!(
                "no GPU adapter: the GPU tests need one (CI installs mesa-vulkan-drivers and sets WGPU_BACKEND=vulkan)"
            )
        });
        o.device = DeviceChoice::Named(first.name.clone());
    }
    o
}

/// The default device: f16 and subgroups when present, NaN-poisoned outputs.
pub fn gpu() -> GpuBackend {
    GpuBackend::open(&options()).expect("open GPU adapter")
}

/// Every variant the kernels must get right: default, no f16, no subgroups,
/// and a small binding limit that forces tensor splitting.
pub fn variants() -> Vec<(&'static str, GpuBackend)> {
    let base = options();
    let mut out = vec![("default", GpuBackend::open(&base).expect("open"))];
    let mut o = base.clone();
    o.no_f16 = true;
    out.push(("no-f16", GpuBackend::open(&o).expect("open")));
    let mut o = base.clone();
    o.no_subgroups = true;
    out.push(("no-subgroups", GpuBackend::open(&o).expect("open")));
    let mut o = base;
    o.max_binding = Some(64 * 1024);
    out.push(("64KiB-bindings", GpuBackend::open(&o).expect("open")));
    out
}

/// This run's base seed: fresh each run unless `LONGHAUL_TEST_SEED` is set
/// (tests print it in their failure messages, so a run can be replayed).
pub fn base_seed() -> u64 {
    std::env::var("LONGHAUL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// Normalised mean squared error `sum (a-b)^2 / sum b^2` (b: the reference).
/// NaN anywhere in `a` (a poisoned, unwritten output) gives infinity.
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length");
    if a.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den.max(1e-30)
}

/// Seeded uniform floats in `[-scale, scale)` (xorshift; never all zeros).
pub fn randn(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}
