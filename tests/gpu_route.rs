//! Routing on the device (lavapipe in CI): the router kernel chooses the
//! CPU router's experts, ties included; MUL_MAT_ID reading the ids where
//! the router left them equals MUL_MAT_ID over host lists; and a decode
//! step reads back only what it must: resident, the logits alone; longhaul,
//! the chosen ids of each MoE layer and then the logits.

mod common;
mod gpu_util;

use std::sync::Arc;

use common::fixture;
use gpu_util::{base_seed, randn, variants};
use longhaul::backend::gpu::GpuBackend;
use longhaul::backend::Backend;
use longhaul::gguf;
use longhaul::longhaul::{LonghaulConfig, Policy};
use longhaul::model::blocks::router::route;
use longhaul::model::blocks::{Routing, Scoring};
use longhaul::model::{Logits, Model};
use longhaul::state::SeqState;
use longhaul::tensor::GgmlType;

fn routing(
    scoring: Scoring,
    n_expert: usize,
    n_used: usize,
    norm: bool,
    scale: f32,
    groups: (usize, usize),
) -> Routing {
    Routing {
        scoring,
        n_expert,
        n_used,
        norm,
        scale,
        n_group: groups.0,
        n_group_used: groups.1,
    }
}

/// Every router variant the CPU has, at the shapes of the families that
/// use it.
fn cases() -> Vec<(&'static str, Routing, bool)> {
    vec![
        (
            "qwen3moe softmax, norm",
            routing(Scoring::Softmax, 64, 8, true, 0.0, (1, 1)),
            false,
        ),
        (
            "mixtral softmax, no norm",
            routing(Scoring::Softmax, 8, 2, false, 0.0, (1, 1)),
            false,
        ),
        (
            "gpt-oss softmax of the chosen",
            routing(Scoring::SoftmaxWeight, 32, 4, false, 0.0, (1, 1)),
            false,
        ),
        (
            "deepseek3 sigmoid, bias, 8 groups of 4 used, scale",
            routing(Scoring::Sigmoid, 256, 8, true, 2.5, (8, 4)),
            true,
        ),
        (
            "glm4moe sigmoid, bias, scale",
            routing(Scoring::Sigmoid, 128, 8, true, 1.8, (1, 1)),
            true,
        ),
        (
            "deepseek2 softmax, groups",
            routing(Scoring::Softmax, 64, 6, false, 16.0, (8, 3)),
            false,
        ),
    ]
}

/// Logits on a grid of quarters, so that many experts tie exactly (and
/// groups tie on their two best), with a bias on the same grid.
fn tied(n: usize, seed: u64) -> Vec<f32> {
    randn(n, seed, 3.0)
        .into_iter()
        .map(|v| (v * 4.0).round() / 4.0)
        .collect()
}

#[test]
fn device_router_chooses_the_cpu_experts_ties_included() {
    let seed = base_seed();
    for (vname, g) in variants() {
        for (name, r, biased) in cases() {
            for (i, n_tok) in [1usize, 3, 8, 33].into_iter().enumerate() {
                let s = seed.wrapping_add(i as u64 * 7919);
                let logits = tied(n_tok * r.n_expert, s);
                let bias = biased.then(|| {
                    tied(r.n_expert, s ^ 0x55)
                        .iter()
                        .map(|b| b / 4.0)
                        .collect::<Vec<f32>>()
                });
                let (want_ids, want_w) = route(&logits, &r, bias.as_deref());
                let t = g.from_host(logits.clone(), n_tok, r.n_expert).unwrap();
                let dr = g
                    .route_on_device(&t, &r, bias.as_deref())
                    .unwrap()
                    .expect("the GPU routes on the device");
                let what = format!("{vname}: {name}, {n_tok} tokens, seed {seed}");
                assert_eq!(g.route_ids(&dr).unwrap(), want_ids, "{what}");
                let w = g.to_host(&dr.weights).unwrap();
                for (a, b) in w.iter().zip(&want_w) {
                    // The device's exp against the host's, a sum in f32
                    // against f64: a few ulps.
                    assert!(
                        (a - b).abs() <= 1e-6 * b.abs().max(1e-3),
                        "{what}: {w:?} vs {want_w:?}"
                    );
                }
            }
        }
    }
}

/// Random weights of `ty` for `n_exp` experts of `n` rows of `k`, as
/// llama-quantize-like bytes: f32 values quantised by the reference.
fn expert_weight(
    g: &GpuBackend,
    ty: GgmlType,
    k: usize,
    n: usize,
    n_exp: usize,
    seed: u64,
) -> <GpuBackend as Backend>::Weight {
    let vals = randn(k * n * n_exp, seed, 1.0);
    let bytes = longhaul::quant::quantize_row(ty, &vals).expect("quantise");
    g.upload_weight("experts", ty, &[k as u64, n as u64, n_exp as u64], &bytes)
        .expect("upload")
}

#[test]
fn routed_mul_mat_id_equals_mul_mat_id_over_host_lists() {
    let seed = base_seed();
    let (k, n, n_exp, n_used) = (256, 48, 8, 3);
    let r = routing(Scoring::Softmax, n_exp, n_used, true, 0.0, (1, 1));
    for (vname, g) in variants() {
        for ty in [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K] {
            let w = expert_weight(&g, ty, k, n, n_exp, seed);
            for n_tok in [1usize, 2, 5] {
                let logits = randn(n_tok * n_exp, seed ^ 3, 2.0);
                let t = g.from_host(logits, n_tok, n_exp).unwrap();
                let dr = g
                    .route_on_device(&t, &r, None)
                    .unwrap()
                    .expect("device route");
                let ids = g.route_ids(&dr).unwrap();
                // The token's row for every pair (gate/up), and a row per
                // pair (down).
                for x_rows in [n_tok, n_tok * n_used] {
                    let x = g
                        .from_host(randn(x_rows * k, seed ^ 9, 1.0), x_rows, k)
                        .unwrap();
                    let want = g
                        .to_host(&g.mul_mat_id(&w, &x, &ids, n_used).unwrap())
                        .unwrap();
                    let got = g
                        .to_host(&g.mul_mat_id_routed(&w, &x, &dr).unwrap())
                        .unwrap();
                    // Host lists run an expert of more than MV_TOK pairs
                    // through the tiled kernel, which sums in another
                    // order; otherwise both are the same mat-vec.
                    let most = (0..n_exp as u32)
                        .map(|e| ids.iter().filter(|&&i| i == e).count())
                        .max()
                        .unwrap_or(0);
                    if most <= longhaul::backend::gpu::MV_TOK {
                        assert_eq!(
                            got,
                            want,
                            "{vname}: {} t={n_tok} x rows {x_rows}, seed {seed}",
                            ty.name()
                        );
                    } else {
                        let e = gpu_util::nmse(&got, &want);
                        assert!(
                            e <= 1e-10,
                            "{vname}: {} t={n_tok} x rows {x_rows}: nmse {e:e}, seed {seed}",
                            ty.name()
                        );
                    }
                }
                // Per-expert bias rows by the route's ids.
                let bias: Vec<f32> = randn(n * n_exp, seed ^ 7, 1.0);
                let bw = g
                    .upload_weight(
                        "bias",
                        GgmlType::F32,
                        &[n as u64, n_exp as u64],
                        bytemuck::cast_slice(&bias),
                    )
                    .unwrap();
                let y = randn(n_tok * n_used * n, seed ^ 11, 1.0);
                let mut a = g.from_host(y.clone(), n_tok * n_used, n).unwrap();
                let mut b = g.from_host(y, n_tok * n_used, n).unwrap();
                g.add_bias_id(&mut a, &bw, &ids).unwrap();
                g.add_bias_id_routed(&mut b, &bw, &dr).unwrap();
                assert_eq!(
                    g.to_host(&b).unwrap(),
                    g.to_host(&a).unwrap(),
                    "{vname}: add_bias_id t={n_tok}"
                );
                let down = g
                    .from_host(
                        randn(n_tok * n_used * 16, seed ^ 5, 1.0),
                        n_tok * n_used,
                        16,
                    )
                    .unwrap();
                let weights = g.to_host(&dr.weights).unwrap();
                let want = g
                    .to_host(&g.weighted_sum(&down, &weights, n_used).unwrap())
                    .unwrap();
                let got = g
                    .to_host(&g.weighted_sum_routed(&down, &dr).unwrap())
                    .unwrap();
                assert_eq!(got, want, "{vname}: weighted sum t={n_tok}");
            }
        }
    }
}

/// The shared experts' gate on the device against the CPU's (the trait's
/// host default): the device's exp against the host's, a few ulps.
#[test]
fn gated_row_scales_equal_the_cpu() {
    use longhaul::backend::cpu::CpuBackend;
    let seed = base_seed();
    let g = gpu_util::gpu();
    let c = CpuBackend::new();
    let (rows, cols) = (5, 40);
    let x = randn(rows * cols, seed, 1.0);
    let gate = randn(rows, seed ^ 1, 4.0);
    let mut gx = g.from_host(x.clone(), rows, cols).unwrap();
    let mut cx = c.from_host(x, rows, cols).unwrap();
    g.scale_rows_gated(&mut gx, &g.from_host(gate.clone(), rows, 1).unwrap())
        .unwrap();
    c.scale_rows_gated(&mut cx, &c.from_host(gate, rows, 1).unwrap())
        .unwrap();
    let e = gpu_util::nmse(&g.to_host(&gx).unwrap(), &c.to_host(&cx).unwrap());
    assert!(e <= 1e-12, "nmse {e:e}, seed {seed}");
}

/// Read-backs of one decode step after a prompt, its submissions beyond
/// those its command count needs, and its logits.
fn readbacks_of_a_step(g: &GpuBackend, m: &Model<GpuBackend>) -> (u64, u64, Vec<f32>) {
    let mut kv = SeqState::new(m, 64, GgmlType::F16).expect("kv");
    let prompt: Vec<u32> = (0..12u32)
        .map(|i| (i * 37 + 11) % m.hp.n_vocab as u32)
        .collect();
    kv.eval(m, &prompt, Logits::Last).expect("prompt");
    let c = g.ctx();
    let (r0, s0, d0) = (c.readbacks(), c.submits(), c.recorded());
    let logits = kv.eval(m, &[5], Logits::Last).expect("step");
    let (r1, s1, d1) = (c.readbacks(), c.submits(), c.recorded());
    // A step submits once per MAX_PENDING commands and at its read-back.
    let pieces = (d1 - d0).div_ceil(longhaul::backend::gpu::Ctx::MAX_PENDING as u64);
    (r1 - r0, (s1 - s0).saturating_sub(pieces - 1), logits)
}

/// Every MoE family, hybrid ones too: a resident decode step reads back
/// the logits and nothing else, in one submission.
#[test]
fn every_family_decodes_resident_with_one_read_back() {
    let g = gpu_util::gpu();
    let names = ["llama-moe", "qwen2moe", "qwen3moe", "gpt-oss"]
        .into_iter()
        .chain(common::NEW_FAMILIES)
        .chain(common::HYBRID_FAMILIES)
        .map(|a| format!("{a}-q4_k_m.gguf"))
        .chain(["iqmoe-mix.gguf".to_string()]);
    let mut bad = Vec::new();
    for name in names {
        let file = Arc::new(gguf::Model::open(fixture(&name)).expect("fixture"));
        let m = Model::load(g.clone(), file).expect("gpu load");
        // The whole step in as few submissions as its commands need.
        let (n, s, _) = readbacks_of_a_step(&g, &m);
        if (n, s) != (1, 1) {
            bad.push(format!(
                "{name}: {n} read-backs, {s} submissions counted once per {} commands",
                longhaul::backend::gpu::Ctx::MAX_PENDING
            ));
        }
    }
    assert!(bad.is_empty(), "a resident decode step: {bad:?}");
}

/// Longhaul with LRU slots under `budget_bytes`, no lookahead, direct reads.
fn longhaul_lru(budget_bytes: u64) -> LonghaulConfig {
    LonghaulConfig {
        budget_bytes,
        policy: Policy::Lru,
        prefetch: false.into(),
        verify: false,
        direct_io: true,
        uring: false,
    }
}

#[test]
fn a_decode_step_reads_back_the_logits_and_longhaul_the_ids_of_each_moe_layer() {
    let g = gpu_util::gpu();
    // Shared experts and their gate (qwen2moe), expert biases (gpt-oss),
    // group-limited sigmoid routing after a dense layer (deepseek3).
    for name in [
        "qwen3moe-q8_0.gguf",
        "deepseek3-q8_0.gguf",
        "llama-moe-q4_k_m.gguf",
        "qwen2moe-q8_0.gguf",
        "gpt-oss-q8_0.gguf",
    ] {
        let file = Arc::new(gguf::Model::open(fixture(name)).expect("fixture"));
        let resident = Model::load(g.clone(), file.clone()).expect("gpu load");
        let (n, _, want) = readbacks_of_a_step(&g, &resident);
        assert_eq!(n, 1, "{name} resident: only the logits");
        let (layers, per_slot) = resident.expert_slot_cost().expect("cost");
        let n_moe = resident.hp.n_layer - resident.hp.n_layer_dense_lead;
        assert_eq!(layers, n_moe, "{name}");
        for slots in [1, resident.hp.n_expert] {
            let cfg = longhaul_lru((slots * layers) as u64 * per_slot);
            let m = Model::load_with(g.clone(), file.clone(), Some(cfg)).expect("longhaul load");
            let (n, _, got) = readbacks_of_a_step(&g, &m);
            assert_eq!(
                n,
                n_moe as u64 + 1,
                "{name} longhaul, {slots} slots: one per MoE layer, then the logits"
            );
            assert_eq!(
                got, want,
                "{name} longhaul, {slots} slots: the resident logits"
            );
        }
    }
}

/// Activation buffers and a step's uploaded lists and tables come back to
/// the device's pool and are reused: once a decode step has run, the next
/// one creates none (no allocation, no zero-fill; what remains is the
/// step's input and its read-back), resident and longhaul; and a second
/// sequence, run on the
/// buffers the first left in the pool, gives the first one's logits. Every
/// test device NaN-poisons a reused buffer as it does a new one, so a kernel
/// reading what it did not write fails the GPU tests.
#[test]
fn a_warm_decode_step_creates_no_pooled_buffers() {
    let g = gpu_util::gpu();
    for name in [
        "qwen3moe-q4_k_m.gguf",
        "qwen35moe-q4_k_m.gguf",
        "deepseek3-q8_0.gguf",
    ] {
        let file = Arc::new(gguf::Model::open(fixture(name)).expect("fixture"));
        let resident = Model::load(g.clone(), file.clone()).expect("gpu load");
        let (layers, per_slot) = resident.expert_slot_cost().expect("cost");
        let longhaul = Model::load_with(
            g.clone(),
            file.clone(),
            Some(longhaul_lru(layers as u64 * per_slot)),
        )
        .expect("longhaul load");
        for (mode, m) in [("resident", &resident), ("longhaul, 1 slot", &longhaul)] {
            let prompt: Vec<u32> = (0..12u32)
                .map(|i| (i * 37 + 11) % m.hp.n_vocab as u32)
                .collect();
            let run = || {
                let mut kv = SeqState::new(m, 64, GgmlType::F16).expect("kv");
                kv.eval(m, &prompt, Logits::Last).expect("prompt");
                kv.eval(m, &[5], Logits::Last).expect("step 1");
                let before = g.ctx().buffers_created();
                let logits = kv.eval(m, &[9], Logits::Last).expect("step 2");
                (g.ctx().buffers_created() - before, logits)
            };
            let (created, first) = run();
            assert_eq!(created, 0, "{name} {mode}: buffers created by a warm step");
            let (_, again) = run();
            assert_eq!(first, again, "{name} {mode}: logits on reused buffers");
        }
    }
}
