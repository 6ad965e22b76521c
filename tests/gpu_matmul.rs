//! Quantised matrix kernels of the GPU placement (mat-vec, tiled mat-mul,
//! MUL_MAT_ID, get_rows) against the CPU placement, for every supported
//! weight type, on fresh seeded random inputs (the seed is printed on
//! failure; `LONGHAUL_TEST_SEED=N` replays one), outputs NaN-poisoned before
//! the kernels run.
//!
//! Bound: normalised MSE <= 5e-4, ggml test-backend-ops' bound for MUL_MAT
//! (the GPU issue's bound). The CPU quantises activations to Q8 blocks and the
//! GPU does not, so results are close, not equal. get_rows only dequantises
//! and must agree to float rounding (1e-10).

mod gpu_util;

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_util::{base_seed, gpu, nmse, randn, variants};
use longhaul::backend::cpu::{CpuBackend, CpuWeight};
use longhaul::backend::gpu::{GpuBackend, GpuWeight};
use longhaul::backend::Backend;
use longhaul::tensor::GgmlType;

const BOUND: f64 = 5e-4;
const GET_ROWS_BOUND: f64 = 1e-10;

const TYPES: [GgmlType; 24] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::NVFP4,
];

/// The low-bit formats (i-quants reading a grid, NVFP4): each its own block
/// size and layout, so all of them run on every device variant, and their
/// dequantisation is checked against gguf-py's as well (tests/goldens/quant,
/// tools/quant_goldens.py).
const LOW_BIT: [GgmlType; 8] = [
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::NVFP4,
];

/// One type per block family (float, 32-blocks with odd sizes, K-quants,
/// IQ4, MXFP4) for the device variants.
const FAMILY: [GgmlType; 6] = [
    GgmlType::F16,
    GgmlType::Q5_0,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
];

/// xorshift64 for bytes and ids.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        ((self.next() >> 33) % n as u64) as usize
    }
    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// The f16 scale fields of the types that have no reference quantiser here:
/// `(offset of d, offset of dmin, typical d)`. Random blocks get random
/// quants and scales, `d` of the typical size and `dmin` chosen so values
/// centre on zero (as `random_q4k` in src/synth.rs), so errors in the varying
/// part of an output are not hidden under a common offset.
fn scale_fields(ty: GgmlType) -> (usize, Option<(usize, f32)>, f32) {
    match ty {
        // mean of sc * q is 7.5 * 1.5, of m 7.5
        GgmlType::Q2_K => (80, Some((82, 1.5)), 0.05),
        GgmlType::Q3_K => (108, None, 0.02),
        // mean of sc * q is 31.5 * 15.5, of m 31.5
        GgmlType::Q5_K => (0, Some((2, 15.5)), 0.002),
        GgmlType::IQ4_NL => (0, None, 0.015),
        _ => (0, None, 0.001),
    }
}

/// Random weight bytes of `ty` for `n_rows` rows of `k`: quantised random
/// floats where a quantiser exists, random blocks with sane scales otherwise.
fn weight_bytes(ty: GgmlType, k: usize, n_rows: usize, seed: u64) -> Vec<u8> {
    let floats = randn(k * n_rows, seed, 1.0);
    if let Ok(b) = longhaul::quant::quantize_row(ty, &floats) {
        return b;
    }
    let mut rng = Rng::new(seed ^ 0xB10C);
    let n_blocks = k * n_rows / ty.block_size();
    let mut out: Vec<u8> = (0..n_blocks * ty.type_size())
        .map(|_| rng.next() as u8)
        .collect();
    let (d_at, dmin, scale) = scale_fields(ty);
    for blk in out.chunks_mut(ty.type_size()) {
        let d = scale * rng.uniform(0.5, 1.5);
        let h = half::f16::from_f32(d);
        if ty == GgmlType::IQ1_M {
            // Its f16 scale is the top nibbles of the four u16 scale words at 48.
            let h = h.to_bits();
            for k in 0..4 {
                let at = 49 + 2 * k;
                blk[at] = (blk[at] & 0x0f) | ((((h >> (4 * k)) & 0xf) as u8) << 4);
            }
            continue;
        }
        blk[d_at..d_at + 2].copy_from_slice(&h.to_le_bytes());
        if let Some((at, ratio)) = dmin {
            let m = half::f16::from_f32(d * ratio);
            blk[at..at + 2].copy_from_slice(&m.to_le_bytes());
        }
    }
    out
}

/// The same random weight on both placements.
fn weight(g: &GpuBackend, ty: GgmlType, dims: &[u64], seed: u64) -> (GpuWeight, CpuWeight) {
    let rows: u64 = dims[1..].iter().product();
    let bytes = weight_bytes(ty, dims[0] as usize, rows as usize, seed);
    let gw = g
        .upload_weight("w", ty, dims, &bytes)
        .unwrap_or_else(|e| panic!("upload {ty:?}: {e}"));
    (gw, CpuWeight::host(ty, dims.to_vec(), Arc::new(bytes)))
}

/// Worst NMSE seen per (type, op), printed at the end of each test.
#[derive(Default)]
struct Worst(BTreeMap<(String, &'static str), f64>);

impl Worst {
    fn record(&mut self, ty: GgmlType, op: &'static str, e: f64) {
        let v = self.0.entry((format!("{ty:?}"), op)).or_insert(0.0);
        *v = v.max(e);
    }
    fn print(&self, what: &str) {
        for ((ty, op), e) in &self.0 {
            eprintln!("{what}: {ty:>7} {op:<24} max nmse {e:.2e}");
        }
    }
}

/// GPU and CPU `matmul` on `t` random rows; returns the NMSE.
fn check_matmul(
    g: &GpuBackend,
    w: &(GpuWeight, CpuWeight),
    t: usize,
    seed: u64,
    what: &str,
) -> f64 {
    let c = CpuBackend::new();
    let k = w.0.ne[0];
    let x = randn(t * k, seed, 1.0);
    let gx = g.from_host(x.clone(), t, k).unwrap();
    let cx = c.from_host(x, t, k).unwrap();
    let gy = g
        .matmul(&w.0, &gx)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let cy = c.matmul(&w.1, &cx).unwrap();
    assert_eq!(g.shape(&gy), (t, w.0.ne[1]), "{what}: shape");
    let e = nmse(&g.to_host(&gy).unwrap(), &c.to_host(&cy).unwrap());
    assert!(e <= BOUND, "{what}: matmul t={t} nmse {e:e} > {BOUND:e}");
    e
}

/// Expert ids for `n_tok` tokens x `n_used`, distinct per token, drawn from
/// `allowed` with `bias` of them going to `allowed[0]` (so one expert gets
/// many tokens, others few, and experts outside `allowed` none).
fn route(rng: &mut Rng, n_tok: usize, n_used: usize, allowed: &[u32], bias: f32) -> Vec<u32> {
    let mut ids = Vec::with_capacity(n_tok * n_used);
    for _ in 0..n_tok {
        let mut row: Vec<u32> = Vec::with_capacity(n_used);
        while row.len() < n_used {
            let e = if row.is_empty() && rng.uniform(0.0, 1.0) < bias {
                allowed[0]
            } else {
                allowed[rng.below(allowed.len())]
            };
            if !row.contains(&e) {
                row.push(e);
            }
        }
        ids.extend(row);
    }
    ids
}

/// GPU and CPU `mul_mat_id`; returns the NMSE.
fn check_mul_mat_id(
    g: &GpuBackend,
    w: &(GpuWeight, CpuWeight),
    ids: &[u32],
    n_used: usize,
    x_per_tok: usize,
    seed: u64,
    what: &str,
) -> f64 {
    let c = CpuBackend::new();
    let k = w.0.ne[0];
    let rows = ids.len() / n_used * x_per_tok;
    let x = randn(rows * k, seed, 1.0);
    let gx = g.from_host(x.clone(), rows, k).unwrap();
    let cx = c.from_host(x, rows, k).unwrap();
    let gy = g
        .mul_mat_id(&w.0, &gx, ids, n_used)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let cy = c.mul_mat_id(&w.1, &cx, ids, n_used).unwrap();
    assert_eq!(g.shape(&gy), (ids.len(), w.0.ne[1]), "{what}: shape");
    let e = nmse(&g.to_host(&gy).unwrap(), &c.to_host(&cy).unwrap());
    let t = ids.len() / n_used;
    assert!(
        e <= BOUND,
        "{what}: mul_mat_id t={t} n_used={n_used} x_per_tok={x_per_tok} nmse {e:e} > {BOUND:e}"
    );
    e
}

fn check_get_rows(g: &GpuBackend, w: &(GpuWeight, CpuWeight), ids: &[u32], what: &str) -> f64 {
    let c = CpuBackend::new();
    let gy = g
        .get_rows(&w.0, ids)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let cy = c.get_rows(&w.1, ids).unwrap();
    assert_eq!(g.shape(&gy), (ids.len(), w.0.ne[0]), "{what}: shape");
    let e = nmse(&g.to_host(&gy).unwrap(), &c.to_host(&cy).unwrap());
    assert!(
        e <= GET_ROWS_BOUND,
        "{what}: get_rows nmse {e:e} > {GET_ROWS_BOUND:e}"
    );
    e
}

/// mul_mat_id cases on `w` (6 or more experts): decode and prompt sizes
/// (at most `max_t` tokens), shared and per-pair inputs, every expert
/// `e % 3 == 1` never routed to.
fn mul_mat_id_cases(
    g: &GpuBackend,
    w: &(GpuWeight, CpuWeight),
    seed: u64,
    max_t: usize,
    what: &str,
    worst: &mut Worst,
) {
    let ty = w.0.ty;
    let n_exp = w.0.ne[2] as u32;
    let allowed: Vec<u32> = (0..n_exp).filter(|e| e % 3 != 1).collect();
    let mut rng = Rng::new(seed);
    // (tokens, n_used, bias to the first expert, label)
    let cases: [(usize, usize, f32, &str); 4] = [
        (1, 2, 0.0, "mul_mat_id decode t=1"),
        (3, 2, 0.0, "mul_mat_id decode t=3"),
        (23, 2, 0.3, "mul_mat_id prompt narrow"),
        (70, 2, 0.9, "mul_mat_id prompt wide"),
    ];
    for (i, &(t, n_used, bias, label)) in cases.iter().enumerate() {
        let t = t.min(max_t);
        let mut ids = route(&mut rng, t, n_used, &allowed, bias);
        if t > 20 {
            // One expert with just two pairs: a mat-vec item next to GEMM tiles.
            let last = *allowed.last().unwrap();
            for v in ids.iter_mut().filter(|v| **v == last) {
                *v = allowed[1];
            }
            ids[1] = last;
            ids[3] = last;
        }
        for x_per_tok in [1, n_used] {
            let e = check_mul_mat_id(
                g,
                w,
                &ids,
                n_used,
                x_per_tok,
                seed + 31 * i as u64 + x_per_tok as u64,
                &format!("{what} {label}"),
            );
            worst.record(ty, label, e);
        }
    }
}

#[test]
fn matmul_every_type() {
    let seed = base_seed();
    eprintln!("seed {seed}");
    let g = gpu();
    let mut worst = Worst::default();
    for (i, &ty) in TYPES.iter().enumerate() {
        let s = seed.wrapping_add(1000 * i as u64);
        let what = format!("{ty:?} (seed {seed})");
        // n = 99: not a multiple of any tile or row block.
        let w = weight(&g, ty, &[512, 99, 1], s);
        for (t, label) in [
            (1, "matmul t=1 (mat-vec)"),
            (4, "matmul t=4 (mat-vec)"),
            (7, "matmul t=7 (narrow)"),
            (37, "matmul t=37 (wide)"),
        ] {
            worst.record(ty, label, check_matmul(&g, &w, t, s + t as u64, &what));
        }
        let ids = [3, 0, 98, 3, 57];
        worst.record(ty, "get_rows", check_get_rows(&g, &w, &ids, &what));
    }
    worst.print("default device");
}

#[test]
fn mul_mat_id_every_type() {
    let seed = base_seed();
    eprintln!("seed {seed}");
    let g = gpu();
    let mut worst = Worst::default();
    for (i, &ty) in TYPES.iter().enumerate() {
        let s = seed.wrapping_add(2000 * i as u64);
        let what = format!("{ty:?} (seed {seed})");
        // 6 experts of [256, 70]; experts 1 and 4 get no tokens.
        let w = weight(&g, ty, &[256, 70, 6], s);
        mul_mat_id_cases(&g, &w, s, 70, &what, &mut worst);
    }
    worst.print("default device");
}

/// One type per block family and every low-bit format on every device
/// variant; on the 64 KiB one
/// both the matrix and the stacked experts are split into several parts.
#[test]
fn device_variants_and_split_weights() {
    let seed = base_seed();
    eprintln!("seed {seed}");
    let mut worst = Worst::default();
    for (name, g) in variants() {
        let split = name == "64KiB-bindings";
        for (i, &ty) in FAMILY.iter().chain(&LOW_BIT).enumerate() {
            let s = seed.wrapping_add(3000 * i as u64);
            let what = format!("{ty:?} on {name} (seed {seed})");
            // Rows of 1024 keep activations within one 64 KiB binding for
            // t <= 7 while the matrix spans several parts (at least 181
            // rows, more for the low-bit formats' short rows).
            let row = ty.row_bytes(1024).unwrap();
            let n = 181.max(2 * 65536 / row + 17);
            let w = weight(&g, ty, &[1024, n, 1], s);
            if split {
                assert!(w.0.parts.len() > 1, "{what}: matrix not split");
            }
            for t in [1, 7] {
                let e = check_matmul(&g, &w, t, s + t as u64, &what);
                worst.record(ty, "matmul split rows", e);
            }
            let ids = [180, 0, 90, 179, 1];
            worst.record(ty, "get_rows", check_get_rows(&g, &w, &ids, &what));
            // Wide tiles with rows short enough for 37 tokens in 64 KiB.
            let w = weight(&g, ty, &[256, 75, 1], s + 1);
            worst.record(ty, "matmul t=37", check_matmul(&g, &w, 37, s + 2, &what));
            // 12 experts of at least 64 rows, in 2 or more 64 KiB parts.
            let row = ty.row_bytes(256).unwrap();
            let n = 64.max(3 * 65536 / 2 / (12 * row));
            let w = weight(&g, ty, &[256, n, 12], s + 3);
            if split {
                assert!(w.0.parts.len() > 1, "{what}: experts not split");
            }
            // 64 input rows of 256 fit one 64 KiB binding.
            mul_mat_id_cases(&g, &w, s + 4, 32, &what, &mut worst);
        }
    }
    worst.print("all variants");
}

#[test]
fn bad_shapes_are_errors() {
    let g = gpu();
    let (w, _) = weight(&g, GgmlType::Q4_0, &[64, 8, 1], 1);
    let x = g.from_host(randn(3 * 32, 1, 1.0), 3, 32).unwrap();
    assert!(g.matmul(&w, &x).is_err(), "k mismatch");
    assert!(g.get_rows(&w, &[8]).is_err(), "row out of range");
    let (we, _) = weight(&g, GgmlType::Q4_0, &[64, 8, 3], 2);
    let x = g.from_host(randn(2 * 64, 2, 1.0), 2, 64).unwrap();
    assert!(g.matmul(&we, &x).is_err(), "matmul on stacked experts");
    assert!(
        g.mul_mat_id(&we, &x, &[0, 3], 1).is_err(),
        "expert out of range"
    );
    assert!(
        g.mul_mat_id(&we, &x, &[0, 1, 2], 2).is_err(),
        "ids not in groups"
    );
    assert!(
        g.mul_mat_id(&we, &x, &[0, 1, 2, 0, 1, 2], 3).is_ok(),
        "valid call"
    );
    assert!(
        g.mul_mat_id(&we, &x, &[0, 1, 2], 3).is_err(),
        "x rows per token"
    );
    assert!(g.mul_mat_id(&we, &x, &[0, 1], 0).is_err(), "n_used 0");
}

/// More workgroups than one grid dimension allows (65535 on most adapters):
/// the kernels recover their index from a 2-D grid.
#[test]
fn large_dispatches_use_a_2d_grid() {
    let seed = base_seed();
    let g = gpu();
    let lim = g.caps().max_workgroups_per_dim as usize;
    // Mat-vec: one workgroup per 4 rows.
    let n = (lim + 100) * 4;
    let w = weight(&g, GgmlType::Q4_0, &[32, n as u64, 1], seed);
    let what = format!("Q4_0 [32, {n}] (seed {seed})");
    check_matmul(&g, &w, 1, seed + 1, &what);
    // get_rows: 64 threads per workgroup, 8 per row of 32.
    let ids: Vec<u32> = (0..(lim + 100) * 8)
        .map(|i| ((i * 7919) % n) as u32)
        .collect();
    check_get_rows(&g, &w, &ids, &what);
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Every golden block of `ty` (bytes, its values), random and quantised cases.
fn golden_blocks(ty: GgmlType) -> Vec<(Vec<u8>, Vec<f32>)> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/goldens/quant")
        .join(format!("{}.json", ty.name().to_lowercase()));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for case in doc["cases"].as_array().unwrap() {
        let bytes = unhex(case["bytes"].as_str().unwrap());
        let vals: Vec<f32> = unhex(case["dequant"].as_str().unwrap())
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let blocks = bytes.chunks_exact(ty.type_size());
        assert_eq!(blocks.len() * ty.block_size(), vals.len(), "{ty:?} golden");
        for (b, v) in blocks.zip(vals.chunks_exact(ty.block_size())) {
            out.push((b.to_vec(), v.to_vec()));
        }
    }
    out
}

/// get_rows (in-place dequantisation) of golden blocks equals gguf-py's
/// values bit for bit, on rows of 3 blocks (blocks at odd byte offsets), on
/// every device variant; on the 64 KiB one the matrix spans several parts.
#[test]
fn get_rows_matches_ggml_goldens() {
    for (name, g) in variants() {
        for &ty in &LOW_BIT {
            let blocks = golden_blocks(ty);
            let (bs, per_row) = (ty.block_size(), 3);
            // Enough rows for three 64 KiB parts.
            let n_rows = (3 * 65536 / (per_row * ty.type_size())).max(blocks.len());
            let mut bytes = Vec::new();
            let mut want = Vec::new();
            for r in 0..n_rows * per_row {
                // Rows cycle through the golden blocks with a stride prime to their count.
                let (b, v) = &blocks[(r * 7) % blocks.len()];
                bytes.extend_from_slice(b);
                want.extend_from_slice(v);
            }
            let k = (per_row * bs) as u64;
            let w = g
                .upload_weight("golden", ty, &[k, n_rows as u64], &bytes)
                .unwrap_or_else(|e| panic!("{ty:?} on {name}: {e}"));
            let ids: Vec<u32> = if name == "64KiB-bindings" {
                assert!(w.parts.len() > 2, "{ty:?}: matrix not split");
                // The first and last rows of every part (the output must fit 64 KiB).
                let ends = w
                    .parts
                    .iter()
                    .flat_map(|p| [p.first + p.count - 1, p.first]);
                ends.map(|r| r as u32).collect()
            } else {
                (0..n_rows as u32).rev().collect()
            };
            let t0 = std::time::Instant::now();
            let gy = g
                .get_rows(&w, &ids)
                .unwrap_or_else(|e| panic!("{ty:?} on {name}: {e}"));
            let got = g.to_host(&gy).unwrap();
            let dt = t0.elapsed();
            let k = k as usize;
            let mut bad = 0;
            for (o, &id) in ids.iter().enumerate() {
                let (gr, wr) = (&got[o * k..][..k], &want[id as usize * k..][..k]);
                for (j, (a, b)) in gr.iter().zip(wr).enumerate() {
                    if a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()) {
                        if bad < 8 {
                            eprintln!("{ty:?} on {name}: row {id} value {j}: {a} != {b}");
                        }
                        bad += 1;
                    }
                }
            }
            assert_eq!(bad, 0, "{ty:?} on {name}: {bad} values differ");
            eprintln!(
                "{name}: {ty:?} get_rows of {} rows exact ({dt:.2?})",
                ids.len()
            );
        }
    }
}
