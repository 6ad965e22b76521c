//! Sequence states in files (slot save/restore, `--slot-persist`, the
//! context cache; see `longhaul::statefile`):
//!
//! - Restore equals re-prefill: a state saved, restored by a freshly loaded
//!   engine (a restart) and continued gives the logits of the continuation
//!   and the greedy tokens after it of a run that evaluated the whole prompt
//!   itself, bit for bit: attention-only (Qwen3-MoE) and hybrid (Qwen3-Next:
//!   recurrent DeltaNet layers) fixtures, resident and longhaul, F16 and F32
//!   caches, on the CPU and on the GPU (lavapipe).
//! - Refusals: another model, another `-c`, another `-ctk`, another
//!   placement; each message names the field, and the state it was to
//!   replace is left as it was.

mod common;
mod gpu_util;

use std::path::{Path, PathBuf};

use common::{argmax, fixture};
use longhaul::backend::cpu::CpuBackend;
use longhaul::backend::Backend;
use longhaul::engine::{CacheBudget, Engine, EngineError, EngineParams, LonghaulParams};
use longhaul::model::Logits;
use longhaul::statefile::StateFileError;
use longhaul::tensor::GgmlType;

fn params(n_ctx: usize, kv: GgmlType, longhaul: bool) -> EngineParams {
    EngineParams {
        n_ctx,
        kv_type: kv,
        longhaul: longhaul.then(|| LonghaulParams {
            // A few experts per layer: most of every batch misses.
            budget: CacheBudget::Bytes(1 << 20),
            policy: "lru".parse().expect("policy"),
            prefetch: false.into(),
            verify: false,
            direct_io: true,
            uring: false,
        }),
        ..EngineParams::default()
    }
}

fn load<B: Backend>(name: &str, b: B, p: EngineParams) -> Engine<B> {
    Engine::load(&fixture(name), b, p).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("longhaul-state-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d.join(name)
}

fn prompt(n_vocab: usize, n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + 11 + seed * 101) % n_vocab as u32)
        .collect()
}

/// Logits of `extra` after the state holds `prompt`, then 8 greedy tokens.
fn go_on<B: Backend>(
    e: &Engine<B>,
    st: &mut longhaul::state::SeqState<B>,
    extra: &[u32],
) -> (Vec<f32>, Vec<u32>) {
    let logits = e.eval(st, extra, Logits::All).expect("continue");
    let n_vocab = e.model.hp.n_vocab;
    let mut last = logits[logits.len() - n_vocab..].to_vec();
    let mut toks = Vec::new();
    for _ in 0..8 {
        let t = argmax(&last);
        toks.push(t);
        last = e.eval(st, &[t], Logits::Last).expect("decode");
    }
    (logits, toks)
}

/// Saves after the prompt on one engine, restores on a fresh one from
/// `make` and checks the continuation against the first engine's own.
fn restore_equals_reprefill<B: Backend>(label: &str, make: &dyn Fn() -> Engine<B>) {
    let path = tmp(&format!("{}.state", label.replace([' ', '/'], "-")));
    let e1 = make();
    let n_vocab = e1.model.hp.n_vocab;
    let p = prompt(n_vocab, 40, 0);
    let extra = prompt(n_vocab, 5, 1);
    let mut whole = e1.new_kv().expect("state");
    e1.eval(&mut whole, &p, Logits::Last).expect("prompt");
    let reference = go_on(&e1, &mut whole, &extra);

    let mut s = e1.new_kv().expect("state");
    e1.eval(&mut s, &p, Logits::Last).expect("prompt");
    let written = e1.save_state(&s, &p, &path).expect("save");
    assert_eq!(written, std::fs::metadata(&path).expect("file").len());
    drop((s, whole, e1));

    let e2 = make();
    let mut t = e2.new_kv().expect("state");
    let (toks, read) = e2.restore_state(&mut t, &path).expect("restore");
    assert_eq!(
        (toks, read, t.n_past()),
        (p.clone(), written, p.len()),
        "{label}"
    );
    let got = go_on(&e2, &mut t, &extra);
    let same_bits = got.0.len() == reference.0.len()
        && got
            .0
            .iter()
            .zip(&reference.0)
            .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same_bits, "{label}: the logits after the restore differ");
    assert_eq!(
        got.1, reference.1,
        "{label}: greedy tokens after the restore"
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_restored_state_continues_as_the_whole_prompt_would_on_the_cpu() {
    for name in [
        "qwen3moe-f32.gguf",
        "qwen3next-q8_0.gguf",
        "qwen35moe-q4_k_m.gguf",
    ] {
        for kv in [GgmlType::F16, GgmlType::F32] {
            for longhaul in [false, true] {
                let label = format!("cpu {name} {} longhaul {longhaul}", kv.name());
                restore_equals_reprefill(&label, &|| {
                    load(name, CpuBackend::new(), params(96, kv, longhaul))
                });
            }
        }
    }
}

#[test]
fn a_restored_state_continues_as_the_whole_prompt_would_on_the_gpu() {
    for name in ["qwen3moe-f32.gguf", "qwen3next-f32.gguf"] {
        for longhaul in [false, true] {
            let label = format!("gpu {name} longhaul {longhaul}");
            restore_equals_reprefill(&label, &|| {
                load(name, gpu_util::gpu(), params(96, GgmlType::F16, longhaul))
            });
        }
    }
}

fn refused(e: EngineError) -> String {
    match e {
        EngineError::State(StateFileError::Mismatch { .. }) => e.to_string(),
        other => panic!("expected a mismatch, got: {other}"),
    }
}

#[test]
fn a_state_of_another_model_or_settings_is_refused_and_changes_nothing() {
    let path = tmp("refusals.state");
    let e = load(
        "qwen3moe-f32.gguf",
        CpuBackend::new(),
        params(96, GgmlType::F16, false),
    );
    let p = prompt(e.model.hp.n_vocab, 20, 0);
    let mut s = e.new_kv().expect("state");
    e.eval(&mut s, &p, Logits::Last).expect("prompt");
    e.save_state(&s, &p, &path).expect("save");

    // A state the refused restores must leave alone.
    let check_untouched = |eng: &Engine<CpuBackend>, msg: &str| {
        let mut t = eng.new_kv().expect("state");
        let q = prompt(eng.model.hp.n_vocab, 7, 3);
        eng.eval(&mut t, &q, Logits::Last).expect("prompt");
        let err = eng
            .restore_state(&mut t, &path)
            .expect_err("a mismatch must be refused");
        let text = refused(err);
        assert!(text.contains(msg), "{text}");
        assert_eq!(t.n_past(), 7, "a refused restore changed the state");
    };
    let other_ctx = load(
        "qwen3moe-f32.gguf",
        CpuBackend::new(),
        params(128, GgmlType::F16, false),
    );
    check_untouched(
        &other_ctx,
        "context size (-c/--ctx-size) (96; this server runs 128)",
    );
    let other_kv = load(
        "qwen3moe-f32.gguf",
        CpuBackend::new(),
        params(96, GgmlType::F32, false),
    );
    check_untouched(
        &other_kv,
        "K cache type (-ctk/--cache-type-k) (f16; this server runs f32)",
    );
    let other_model = load(
        "qwen2moe-f32.gguf",
        CpuBackend::new(),
        params(96, GgmlType::F16, false),
    );
    check_untouched(
        &other_model,
        "different model (a hash of its GGUF metadata and tensor table)",
    );
    let quantised = load(
        "qwen3moe-q8_0.gguf",
        CpuBackend::new(),
        params(96, GgmlType::F16, false),
    );
    check_untouched(&quantised, "different model");

    // Saved on the GPU, offered to the CPU.
    let g = load(
        "qwen3moe-f32.gguf",
        gpu_util::gpu(),
        params(96, GgmlType::F16, false),
    );
    let mut gs = g.new_kv().expect("state");
    g.eval(&mut gs, &p, Logits::Last).expect("prompt");
    g.save_state(&gs, &p, &path).expect("save");
    check_untouched(&e, "placement (-ngl/--device) (gpu; this server runs cpu)");
    let _ = std::fs::remove_file(&path);
    assert!(!Path::new(&path).exists());
}
