//! Speculative decoding on the GPU placement (lavapipe in CI).
//! - A verification batch of up to four tokens (the pending token and
//!   `--spec-draft-n-max`'s default 3 drafts) gives each row the logits of
//!   its own decode step, to the bit: attention runs row by row through the
//!   decode kernels, products of up to MV_TOK rows through the mat-vec that
//!   one row takes, and routing on the device pair by pair.
//! - So a model drafting for itself on the GPU has every draft accepted,
//!   and greedy output with a drafter equals greedy output without one.

mod common;
mod gpu_util;

use std::sync::Arc;

use common::fixture;
use longhaul::draft::ModelDrafter;
use longhaul::engine::{Engine, EngineParams};
use longhaul::model::Logits;
use longhaul::sample::{Sampler, SamplerParams};
use longhaul::spec::{DraftParams, Drafter};
use longhaul::tensor::GgmlType;

const NAMES: [&str; 4] = [
    "qwen3moe-f32.gguf",
    "qwen3moe-q4_k_m.gguf",
    "deepseek3-q8_0.gguf",
    "gpt-oss-q8_0.gguf",
];

fn engine(name: &str, n_ctx: usize) -> Engine<longhaul::backend::gpu::GpuBackend> {
    let params = EngineParams {
        n_ctx,
        kv_type: GgmlType::F16,
        ..Default::default()
    };
    Engine::load(&fixture(name), gpu_util::gpu(), params).expect("gpu load")
}

fn prompt(n_vocab: usize, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + 11) % n_vocab as u32)
        .collect()
}

#[test]
fn gpu_verification_rows_equal_single_steps() {
    // A K/V cache with sliding windows and sinks (gpt-oss), and MLA's
    // K-only cache (deepseek3).
    for name in [
        "qwen3moe-f32.gguf",
        "deepseek3-q8_0.gguf",
        "gpt-oss-q8_0.gguf",
    ] {
        // Past 1024 cells, where the decode kernel splits the cache into
        // chunks by the batch's row count: a batch of 4 done at once
        // would sum in other chunks than its steps.
        let e = engine(name, 1280);
        let nv = e.model.hp.n_vocab;
        let all = prompt(nv, 1212);
        let (p, rest) = all.split_at(1200);
        let mut a = e.new_kv().unwrap();
        let mut b = e.new_kv().unwrap();
        e.eval(&mut a, p, Logits::Last).unwrap();
        e.eval(&mut b, p, Logits::Last).unwrap();
        // Batches of 4, 3 and 2: what a verification of 3, 2, 1 drafts is.
        let mut at = 0;
        for n in [4, 3, 2] {
            let batch = &rest[at..at + n];
            at += n;
            let rows = e.eval(&mut a, batch, Logits::Steps).unwrap();
            for (i, &t) in batch.iter().enumerate() {
                let single = e.eval(&mut b, &[t], Logits::Last).unwrap();
                assert!(
                    rows[i * nv..(i + 1) * nv] == single[..],
                    "{name}: row {i} of a batch of {n} differs from its decode step"
                );
            }
        }
    }
}

#[test]
fn gpu_self_drafting_accepts_every_draft_and_keeps_greedy_output() {
    for name in NAMES {
        let e = Arc::new(engine(name, 128));
        let p = prompt(e.model.hp.n_vocab, 24);
        let mut kv = e.new_kv().unwrap();
        let mut s = Sampler::new(SamplerParams::greedy());
        let (want, _) = e.generate(&mut kv, &p, 24, &mut s, |_| true).unwrap();
        let d = ModelDrafter::new(e.clone(), &e.tokenizer, DraftParams::default()).unwrap();
        let mut drafter = Drafter::Model(Box::new(d));
        let mut kv = e.new_kv().unwrap();
        let mut s = Sampler::new(SamplerParams::greedy());
        let (got, st) = e
            .generate_spec(&mut kv, &p, 24, &mut s, &mut drafter, |_| true)
            .unwrap();
        assert_eq!(got, want, "{name}: greedy with a drafter");
        assert!(st.spec.n_drafted > 0, "{name}: it drafted");
        assert_eq!(
            st.spec.n_accepted, st.spec.n_drafted,
            "{name}: a model drafting for itself"
        );
    }
}
