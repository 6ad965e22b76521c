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

#[test]
fn gpu_mtp_drafts_as_llama_server_does_and_keeps_greedy() {
    // The GLM-4.5 fixture whose NextN head agrees with its trunk in part
    // (tools/mtp_agree_fixture.py): on the GPU the head drafts, the target
    // accepts and rejects as llama-server did on the CPU (its goldens'
    // counts at the defaults), and greedy output equals greedy without it.
    let g = common::golden("mtp-glm4moe-mtp-agree-f32.json");
    let params = EngineParams {
        n_ctx: 512,
        kv_type: GgmlType::F16,
        mtp: true,
        ..Default::default()
    };
    let path = fixture("glm4moe-mtp-agree-f32.gguf");
    let e = Arc::new(Engine::load(&path, gpu_util::gpu(), params).expect("gpu load"));
    let mut accepted = 0;
    for r in g["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"] == "default")
    {
        let prompt = common::ids(&r["prompt_tokens"]);
        let n = g["n_predict"].as_u64().unwrap() as usize;
        let d = longhaul::draft::MtpDrafter::new(e.clone(), 512, DraftParams::default())
            .expect("drafter");
        let mut d = Drafter::Model(Box::new(d));
        let mut kv = e.new_kv().expect("kv");
        let mut s = Sampler::new(SamplerParams::greedy());
        let (out, st) = e
            .generate_spec(&mut kv, &prompt, n, &mut s, &mut d, |_| true)
            .expect("spec");
        let mut kv = e.new_kv().expect("kv");
        let mut s = Sampler::new(SamplerParams::greedy());
        let (plain, _) = e
            .generate(&mut kv, &prompt, n, &mut s, |_| true)
            .expect("plain");
        let label = r["prompt"].as_str().unwrap();
        assert_eq!(out, plain, "{label}: greedy with and without drafts");
        assert_eq!(
            out,
            common::ids(&r["tokens"]),
            "{label}: llama.cpp's tokens"
        );
        assert_eq!(
            st.spec.n_drafted as u64,
            r["draft_n"].as_u64().unwrap(),
            "{label}"
        );
        assert_eq!(
            st.spec.n_accepted as u64,
            r["draft_n_accepted"].as_u64().unwrap(),
            "{label}"
        );
        accepted += st.spec.n_accepted;
    }
    assert!(accepted > 0);
}
