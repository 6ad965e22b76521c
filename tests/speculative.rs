//! Speculative decoding (`longhaul::spec`, `Engine::generate_spec`):
//!
//! - A verification batch (`Logits::Steps`: attention row by row as decode
//!   steps compute it) gives the logits of single decode steps: bit for bit
//!   where the matrix kernels are batch-invariant (F32, Q8_0, Q4_1 and the
//!   recurrent DeltaNet layers), at both attention paths and cache types and
//!   past 256 cells, where ggml's one-token attention kernel (split KV)
//!   differs from its batch kernel; within NMSE 5e-4 (test-backend-ops'
//!   MUL_MAT bound between two implementations of one product) for Q4_K_M:
//!   like ggml, the CPU picks another matrix kernel for a product of
//!   several tokens, whose float order differs from the one-token dot's in
//!   the last bit, and a random router can turn that into another expert.
//! - Greedy output with each drafter equals greedy output without
//!   speculation, token for token, with drafts accepted and rejected:
//!   SmolLM2 (a real model), Qwen3-MoE resident and longhaul at 1, n/2 and n
//!   slots per layer, and the Qwen3-Next hybrid, whose recurrent layers go
//!   back through a checkpoint. The sequence left behind is the same too:
//!   the next logits after either run are identical.
//! - A draft model (`-md`, llama.cpp's `draft-simple`) drafts what a fresh
//!   drafter evaluating the whole sequence would, after every rewind; the
//!   same file drafting for itself has every draft accepted; greedy with a
//!   draft model equals greedy resident, longhaul and recurrent; `p_min`,
//!   `n_min` and the vocabulary check behave as llama.cpp's.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{fixture, nmse, real_model};
use longhaul::backend::cpu::CpuBackend;
use longhaul::draft::ModelDrafter;
use longhaul::engine::EngineError;
use longhaul::engine::{CacheBudget, Engine, EngineParams, FlashAttn, GenStats, LonghaulParams};
use longhaul::model::Logits;
use longhaul::sample::{Sampler, SamplerParams};
use longhaul::scheduler::{GenEvent, GenRequest, Scheduler, Speculation, StateConfig};
use longhaul::spec::{DraftParams, DraftSource, Drafter, NgramSizes, SpecParams, SpecType};
use longhaul::tensor::GgmlType;

fn params(n_ctx: usize, budget: Option<u64>) -> EngineParams {
    EngineParams {
        n_ctx,
        kv_type: GgmlType::F16,
        longhaul: budget.map(|b| LonghaulParams {
            budget: CacheBudget::Bytes(b),
            policy: "lru".parse().expect("policy"),
            prefetch: false.into(),
            verify: false,
            direct_io: true,
            uring: false,
        }),
        ..EngineParams::default()
    }
}

fn load(path: &Path, p: EngineParams) -> Engine<CpuBackend> {
    Engine::load(path, CpuBackend::new(), p).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// 48 tokens: a 16-token phrase three times, so n-gram drafters find matches
/// from the start.
fn repetitive(n_vocab: usize) -> Vec<u32> {
    let phrase: Vec<u32> = (0..16u32).map(|i| (i * 37 + 11) % n_vocab as u32).collect();
    phrase.iter().cycle().take(48).copied().collect()
}

fn spec(kind: SpecType, n: u16, m: u16) -> SpecParams {
    let sizes = NgramSizes {
        size_n: n,
        size_m: m,
        min_hits: 1,
    };
    SpecParams {
        kind,
        ngram_simple: sizes,
        ngram_map_k: sizes,
        draft: DraftParams::default(),
    }
}

/// Greedy tokens, stats, and the logits of one more token after them.
fn greedy(
    e: &Engine<CpuBackend>,
    prompt: &[u32],
    n: usize,
    sp: Option<SpecParams>,
) -> (Vec<u32>, GenStats, Vec<f32>) {
    greedy_with(e, prompt, n, sp.and_then(|s| s.drafter()))
}

/// [`greedy`] with a drafter given.
fn greedy_with(
    e: &Engine<CpuBackend>,
    prompt: &[u32],
    n: usize,
    drafter: Option<Drafter>,
) -> (Vec<u32>, GenStats, Vec<f32>) {
    let mut kv = e.new_kv().expect("kv");
    // End-of-generation tokens are banned so that every run is n long.
    let mut sp_greedy = SamplerParams::greedy();
    sp_greedy.logit_bias = e
        .tokenizer
        .eog_ids()
        .into_iter()
        .map(|id| (id, f32::NEG_INFINITY))
        .collect();
    let mut sampler = Sampler::new(sp_greedy);
    let (out, stats) = match drafter {
        Some(mut d) => e.generate_spec(&mut kv, prompt, n, &mut sampler, &mut d, |_| true),
        None => e.generate(&mut kv, prompt, n, &mut sampler, |_| true),
    }
    .expect("generate");
    assert_eq!(kv.n_past(), prompt.len() + out.len() - 1, "positions held");
    let last = *out.last().expect("tokens");
    let next = e.eval(&mut kv, &[last], Logits::Last).expect("next");
    (out, stats, next)
}

/// Speculative greedy equals plain greedy for both drafters; returns the
/// total (drafted, accepted) so callers can check both paths ran.
fn check_equal(
    e: &Engine<CpuBackend>,
    label: &str,
    prompt: &[u32],
    n: usize,
    size_n: u16,
) -> (usize, usize) {
    let (want, plain, want_next) = greedy(e, prompt, n, None);
    assert_eq!(plain.spec.n_drafted, 0);
    check_steps(&format!("{label} plain"), &plain);
    if plain.gen_io.is_some() {
        assert_eq!(
            plain.gen_steps.len(),
            plain.n_gen_evals,
            "{label}: one step a token"
        );
    }
    let mut total = (0, 0);
    for kind in [SpecType::NgramSimple, SpecType::NgramMapK] {
        let (got, stats, next) = greedy(e, prompt, n, Some(spec(kind, size_n, 8)));
        assert_eq!(got.len(), n, "{label} {kind:?}");
        assert_eq!(
            got, want,
            "{label} {kind:?}: tokens differ from plain greedy"
        );
        assert_eq!(
            next, want_next,
            "{label} {kind:?}: the sequence left behind differs"
        );
        assert_eq!(stats.n_gen_evals, plain.n_gen_evals, "{label} {kind:?}");
        check_steps(&format!("{label} {kind:?}"), &stats);
        if stats.gen_io.is_some() {
            // One step a forward pass, a verification batch or one token
            // where nothing was drafted: each adds one position, and a
            // batch one more for each draft token it accepted.
            assert_eq!(
                stats.gen_steps.len() + stats.spec.n_accepted,
                stats.n_gen_evals,
                "{label} {kind:?}: {} batches",
                stats.spec.n_batches
            );
        }
        assert!(stats.spec.n_accepted <= stats.spec.n_drafted);
        eprintln!(
            "{label} {kind:?}: {} tokens, {} batches, drafted {}, accepted {}",
            got.len(),
            stats.spec.n_batches,
            stats.spec.n_drafted,
            stats.spec.n_accepted
        );
        total.0 += stats.spec.n_drafted;
        total.1 += stats.spec.n_accepted;
    }
    total
}

/// Longhaul: the decode's forward passes (the steps of its I/O floor) add
/// up to its counters, within its time; resident, there are none.
fn check_steps(label: &str, s: &GenStats) {
    let Some(io) = s.gen_io else {
        assert!(s.gen_steps.is_empty(), "{label}: steps resident");
        return;
    };
    for st in &s.gen_steps {
        assert!(st.wall > std::time::Duration::ZERO, "{label}: {st:?}");
    }
    let sum = longhaul::longhaul::steps_total(&s.gen_steps);
    assert_eq!(sum, io, "{label}: the steps' counters");
    assert!(sum.misses + sum.hits > 0, "{label}: no expert used");
    let walls: std::time::Duration = s.gen_steps.iter().map(|st| st.wall).sum();
    assert!(
        walls <= s.gen_time,
        "{label}: steps {walls:?} in {:?}",
        s.gen_time
    );
}

#[test]
fn a_verification_batch_gives_the_logits_of_single_steps() {
    for (name, exact) in [
        ("qwen3moe-f32.gguf", true),
        ("qwen3next-q8_0.gguf", true),
        ("qwen3moe-q4_k_m.gguf", false),
    ] {
        let e = load(&fixture(name), params(128, None));
        let nv = e.model.hp.n_vocab;
        let all = repetitive(nv);
        let (p, extra) = all.split_at(40);
        let mut a = e.new_kv().unwrap();
        e.eval(&mut a, p, Logits::Last).unwrap();
        let batch = e.eval(&mut a, extra, Logits::Steps).unwrap();
        let mut b = e.new_kv().unwrap();
        e.eval(&mut b, p, Logits::Last).unwrap();
        for (i, &t) in extra.iter().enumerate() {
            let single = e.eval(&mut b, &[t], Logits::Last).unwrap();
            let row = &batch[i * nv..(i + 1) * nv];
            if exact {
                assert!(
                    row == &single[..],
                    "{name}: row {i} differs from its single step"
                );
            } else {
                let err = nmse(row, &single);
                eprintln!("{name}: row {i} NMSE {err:e}");
                assert!(err <= 5e-4, "{name}: row {i} NMSE {err:e}");
            }
        }
    }
}

/// A code-editing request in SmolLM2's chat format: 187 prompt tokens, so
/// that decode runs past 256 cells, where ggml's attention kernel for one
/// token (split KV) differs from the one for a batch (one chunk).
const CODE_EDIT: &str = include_str!("fixtures/prompts/code-edit.txt");

#[test]
fn verification_rows_equal_single_steps_past_256_cells_on_smollm2() {
    for fa in [FlashAttn::Auto, FlashAttn::Off] {
        for kv in [GgmlType::F16, GgmlType::F32] {
            let mut p = params(512, None);
            p.flash_attn = fa;
            p.kv_type = kv;
            let e = load(&real_model("smollm2-135m-instruct-q4_1.gguf"), p);
            let nv = e.model.hp.n_vocab;
            let mut toks = e.tokenize(CODE_EDIT).expect("tokenize");
            let mut st = e.new_kv().unwrap();
            let mut sampler = Sampler::new(SamplerParams::greedy());
            let (more, _) = e
                .generate(&mut st, &toks, 120, &mut sampler, |_| true)
                .unwrap();
            toks.extend(more);
            for n_past in [40, 250, 256, 272] {
                let extra = &toks[n_past..n_past + 7];
                let mut a = e.new_kv().unwrap();
                e.eval(&mut a, &toks[..n_past], Logits::Last).unwrap();
                let batch = e.eval(&mut a, extra, Logits::Steps).unwrap();
                let mut b = e.new_kv().unwrap();
                e.eval(&mut b, &toks[..n_past], Logits::Last).unwrap();
                for (i, &t) in extra.iter().enumerate() {
                    let single = e.eval(&mut b, &[t], Logits::Last).unwrap();
                    assert!(
                        batch[i * nv..(i + 1) * nv] == single[..],
                        "{fa:?} {kv:?} n_past {n_past}: row {i} differs from its step"
                    );
                }
            }
        }
    }
}

#[test]
fn greedy_with_each_drafter_equals_greedy_past_256_cells_on_smollm2() {
    let e = load(
        &real_model("smollm2-135m-instruct-q4_1.gguf"),
        params(4096, None),
    );
    let prompt = e.tokenize(CODE_EDIT).expect("tokenize");
    let (drafted, accepted) = check_equal(&e, "smollm2 code edit", &prompt, 160, 3);
    assert!(
        accepted > drafted / 4,
        "drafted {drafted}, accepted {accepted}"
    );
}

#[test]
fn greedy_with_each_drafter_equals_greedy_on_smollm2() {
    let e = load(
        &real_model("smollm2-135m-instruct-q4_1.gguf"),
        params(512, None),
    );
    let text = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n\
                Repeat the code above exactly, then stop.\n\n";
    let prompt = e.tokenize(text).expect("tokenize");
    let (drafted, accepted) = check_equal(&e, "smollm2", &prompt, 48, 2);
    assert!(accepted > 0, "no draft was accepted");
    assert!(accepted < drafted, "no draft was rejected");
}

#[test]
fn greedy_with_each_drafter_equals_greedy_on_qwen3moe_resident_and_longhaul() {
    let path = fixture("qwen3moe-q4_k_m.gguf");
    let resident = load(&path, params(256, None));
    let prompt = repetitive(resident.model.hp.n_vocab);
    let (d, a) = check_equal(&resident, "qwen3moe resident", &prompt, 40, 1);
    assert!(a > 0 && a < d, "drafted {d}, accepted {a}");
    let (n_layers, expert_bytes) = resident.model.expert_slot_cost().expect("cost");
    let n_expert = resident.model.hp.n_expert;
    for slots in [1, n_expert / 2, n_expert] {
        let budget = (slots * n_layers) as u64 * expert_bytes;
        let e = load(&path, params(256, Some(budget)));
        assert_eq!(e.model.n_slots(), slots);
        check_equal(
            &e,
            &format!("qwen3moe longhaul {slots} slots"),
            &prompt,
            40,
            1,
        );
    }
}

#[test]
fn greedy_with_each_drafter_equals_greedy_on_a_recurrent_hybrid() {
    let path = fixture("qwen3next-q8_0.gguf");
    let e = load(&path, params(256, None));
    let prompt = repetitive(e.model.hp.n_vocab);
    let (d, a) = check_equal(&e, "qwen3next resident", &prompt, 40, 1);
    assert!(
        a < d,
        "no draft was rejected, so no checkpoint was gone back to"
    );
    // A prompt of five token ids, after which this model accepts a draft:
    // the accepted tokens are evaluated again after the checkpoint.
    let five: Vec<u32> = (0..24u32).map(|i| (i * 37 + 11) % 5).collect();
    let (d, a) = check_equal(&e, "qwen3next resident, five ids", &five, 120, 1);
    assert!(a > 0 && a < d, "drafted {d}, accepted {a}");
    let (n_layers, expert_bytes) = e.model.expert_slot_cost().expect("cost");
    let e = load(&path, params(256, Some(2 * n_layers as u64 * expert_bytes)));
    check_equal(&e, "qwen3next longhaul 2 slots", &prompt, 40, 1);
    // Without checkpoints a recurrent state cannot go back: no drafts.
    let mut p = params(256, None);
    p.n_ctx_checkpoints = 0;
    let e = load(&path, p);
    let (want, _, _) = greedy(&e, &prompt, 24, None);
    let (got, stats, _) = greedy(&e, &prompt, 24, Some(spec(SpecType::NgramSimple, 1, 8)));
    assert_eq!(got, want);
    assert_eq!(stats.spec.n_drafted, 0);
}

/// A draft model on the CPU for `target`, with the target's context.
fn draft_model(target: &Engine<CpuBackend>, name: &str, dp: DraftParams) -> Drafter {
    let d = ModelDrafter::load(
        &fixture(name),
        CpuBackend::new(),
        params(target.params.n_ctx, None),
        &target.tokenizer,
        dp,
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    Drafter::Model(Box::new(d))
}

/// Greedy with the draft model `draft` equals plain greedy, the sequence
/// left behind included; returns (drafted, accepted).
fn check_equal_draft(
    e: &Engine<CpuBackend>,
    label: &str,
    prompt: &[u32],
    n: usize,
    draft: Drafter,
) -> (usize, usize) {
    let (want, plain, want_next) = greedy(e, prompt, n, None);
    let (got, stats, next) = greedy_with(e, prompt, n, Some(draft));
    assert_eq!(got, want, "{label}: tokens differ from plain greedy");
    assert_eq!(next, want_next, "{label}: the sequence left behind differs");
    assert_eq!(stats.n_gen_evals, plain.n_gen_evals, "{label}");
    eprintln!(
        "{label}: {} tokens, {} batches, drafted {}, accepted {}",
        got.len(),
        stats.spec.n_batches,
        stats.spec.n_drafted,
        stats.spec.n_accepted
    );
    (stats.spec.n_drafted, stats.spec.n_accepted)
}

/// A draft model whose every draft is checked against a fresh drafter's
/// (one that evaluates the whole sequence from the start): following the
/// sequence by common prefix and rewinds must not change what it drafts.
struct Checked {
    inc: ModelDrafter<CpuBackend>,
    path: std::path::PathBuf,
    params: EngineParams,
    /// (drafts checked, drafts after the sequence went back).
    counts: std::sync::Arc<std::sync::Mutex<(usize, usize)>>,
    last: Vec<u32>,
}

impl DraftSource for Checked {
    fn draft(
        &mut self,
        tokens: &[u32],
        sampled: u32,
        n_max: usize,
        _hidden: Option<&mut longhaul::state::HiddenRows>,
    ) -> Result<Vec<u32>, EngineError> {
        // The sequence went back past part of what the drafter had seen.
        let went_back =
            tokens.len() < self.last.len() || tokens[..self.last.len()] != self.last[..];
        let got = self.inc.draft(tokens, sampled, n_max, None)?;
        let tok = &self.inc.engine().tokenizer;
        let mut fresh = ModelDrafter::load(
            &self.path,
            CpuBackend::new(),
            self.params.clone(),
            tok,
            DraftParams::default(),
        )?;
        let want = fresh.draft(tokens, sampled, n_max, None)?;
        let mut c = self.counts.lock().expect("counts");
        assert_eq!(got, want, "draft {} after {} tokens", c.0, tokens.len());
        c.0 += 1;
        c.1 += usize::from(went_back);
        self.last = tokens
            .iter()
            .copied()
            .chain([sampled])
            .chain(got.iter().copied())
            .collect();
        Ok(got)
    }
}

#[test]
fn a_draft_model_drafts_what_a_fresh_one_would_after_every_rewind() {
    let e = load(&fixture("qwen3moe-q4_k_m.gguf"), params(256, None));
    let prompt = repetitive(e.model.hp.n_vocab);
    // F32 weights and cache, exact attention: the same logits whether the
    // sequence is evaluated at once or step by step, up to the last bits.
    let mut p = params(256, None);
    p.kv_type = GgmlType::F32;
    p.flash_attn = FlashAttn::Off;
    let path = fixture("qwen3moe-f32.gguf");
    let inc = ModelDrafter::load(
        &path,
        CpuBackend::new(),
        p.clone(),
        &e.tokenizer,
        DraftParams::default(),
    )
    .expect("draft model");
    let counts = std::sync::Arc::new(std::sync::Mutex::new((0, 0)));
    let checked = Checked {
        inc,
        path,
        params: p,
        counts: counts.clone(),
        last: Vec::new(),
    };
    let (got, stats, _) = greedy_with(&e, &prompt, 40, Some(Drafter::Model(Box::new(checked))));
    assert_eq!(got.len(), 40);
    let (n_checked, n_went_back) = *counts.lock().expect("counts");
    eprintln!(
        "checked {n_checked} drafts ({n_went_back} after going back): {} batches, drafted {}, accepted {}",
        stats.spec.n_batches, stats.spec.n_drafted, stats.spec.n_accepted
    );
    assert_eq!(n_checked, stats.spec.n_batches);
    assert!(
        n_went_back > 3,
        "the sequence went back {n_went_back} times"
    );
}

#[test]
fn a_draft_model_equal_to_the_target_has_every_draft_accepted() {
    // The same file drafts for itself: its one-token steps give the logits
    // of the target's verification rows (bit for bit, as the first test
    // shows), so every greedy draft is accepted, which holds only if the
    // drafter's positions follow the target's. (Going back past rejected
    // drafts is the next test's: breaking the drafter's rewind fails it.)
    let e = load(&fixture("qwen3moe-q8_0.gguf"), params(256, None));
    let prompt = repetitive(e.model.hp.n_vocab);
    for n_max in [1, 3, 5] {
        let dp = DraftParams {
            n_max,
            ..DraftParams::default()
        };
        let d = draft_model(&e, "qwen3moe-q8_0.gguf", dp);
        let (drafted, accepted) =
            check_equal_draft(&e, &format!("self-draft n_max {n_max}"), &prompt, 40, d);
        assert_eq!(accepted, drafted, "n_max {n_max}");
        // Each batch drafts n_max (or what is left of the 40 tokens).
        assert!(drafted >= 39 * n_max / (n_max + 1) - 1, "drafted {drafted}");
    }
}

#[test]
fn greedy_with_a_draft_model_equals_greedy_resident_longhaul_and_recurrent() {
    // Another quantisation of the same model drafts: most drafts hold,
    // some do not.
    let path = fixture("qwen3moe-q4_k_m.gguf");
    let resident = load(&path, params(256, None));
    let prompt = repetitive(resident.model.hp.n_vocab);
    let d = draft_model(&resident, "qwen3moe-f16.gguf", DraftParams::default());
    let (drafted, accepted) = check_equal_draft(&resident, "qwen3moe resident", &prompt, 40, d);
    assert!(
        accepted > 0 && drafted > 0,
        "drafted {drafted}, accepted {accepted}"
    );
    let (n_layers, expert_bytes) = resident.model.expert_slot_cost().expect("cost");
    for slots in [1, resident.model.hp.n_expert / 2] {
        let e = load(
            &path,
            params(256, Some((slots * n_layers) as u64 * expert_bytes)),
        );
        let d = draft_model(&e, "qwen3moe-f16.gguf", DraftParams::default());
        let label = format!("qwen3moe longhaul {slots} slots");
        check_equal_draft(&e, &label, &prompt, 40, d);
    }
    // A recurrent target with a recurrent drafter: both go back through
    // their checkpoints.
    let e = load(&fixture("qwen3next-q8_0.gguf"), params(256, None));
    let prompt = repetitive(e.model.hp.n_vocab);
    let d = draft_model(&e, "qwen3next-q4_k_m.gguf", DraftParams::default());
    let (drafted, accepted) = check_equal_draft(&e, "qwen3next", &prompt, 40, d);
    assert!(accepted > 0, "drafted {drafted}, accepted {accepted}");
}

#[test]
fn draft_model_sizes_and_vocabulary_follow_llama_cpp() {
    let e = load(&fixture("qwen3moe-q8_0.gguf"), params(256, None));
    let prompt = repetitive(e.model.hp.n_vocab);
    // p_min 1.0: no top-10 softmax reaches it, so nothing is drafted.
    let strict = DraftParams {
        p_min: 1.0,
        ..DraftParams::default()
    };
    let d = draft_model(&e, "qwen3moe-q8_0.gguf", strict);
    assert_eq!(check_equal_draft(&e, "p_min 1", &prompt, 12, d), (0, 0));
    // n_min above n_max: every draft is dropped.
    let short = DraftParams {
        n_max: 2,
        n_min: 3,
        p_min: 0.0,
    };
    let d = draft_model(&e, "qwen3moe-q8_0.gguf", short);
    assert_eq!(check_equal_draft(&e, "n_min 3", &prompt, 12, d), (0, 0));
    // SmolLM2's vocabulary is not the fixture's: refused, with a reason.
    let err = ModelDrafter::load(
        &real_model("smollm2-135m-instruct-q4_1.gguf"),
        CpuBackend::new(),
        params(256, None),
        &e.tokenizer,
        DraftParams::default(),
    )
    .err()
    .expect("a draft model of another vocabulary is refused");
    let msg = err.to_string();
    assert!(
        msg.contains("does not share the target's vocabulary"),
        "{msg}"
    );
}

/// Chi-square statistic of `counts` against probabilities `p` over `n`
/// draws, and its critical value at significance 1e-3 for `p.len() - 1`
/// degrees of freedom (Wilson-Hilferty's approximation, z = 3.090).
fn chi_square(counts: &[usize], p: &[f64], n: usize) -> (f64, f64) {
    let stat = counts
        .iter()
        .zip(p)
        .map(|(&c, &q)| {
            let e = q * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum();
    let df = (p.len() - 1) as f64;
    let a = 2.0 / (9.0 * df);
    (stat, df * (1.0 - a + 3.090 * a.sqrt()).powi(3))
}

/// Logits of 12 tokens and the distribution llama.cpp's default chain
/// (temp 0.8, top-k 40, top-p 0.95, min-p 0.05) draws from for them.
fn target() -> (Vec<f32>, Vec<(u32, f64)>) {
    let logits = vec![
        2.0, 1.4, 0.3, 1.9, -1.0, 0.9, 2.2, -3.0, 0.1, 1.0, -0.5, 0.6,
    ];
    let mut s = Sampler::new(SamplerParams::default());
    let p = s.distribution(&logits, &[]);
    (logits, p)
}

/// Tallies `n` tokens from `draw` per token id of `p` (a token outside p's
/// support fails the test).
fn tally(p: &[(u32, f64)], n: usize, mut draw: impl FnMut() -> u32) -> Vec<usize> {
    let mut counts = vec![0; p.len()];
    for _ in 0..n {
        let t = draw();
        let i = p.iter().position(|(id, _)| *id == t);
        counts[i.unwrap_or_else(|| panic!("token {t} is outside the support"))] += 1;
    }
    counts
}

#[test]
fn rejection_sampling_keeps_the_target_distribution() {
    let (logits, p) = target();
    let probs: Vec<f64> = p.iter().map(|(_, w)| *w).collect();
    assert!(
        p.len() >= 5 && p.len() < 12,
        "the chain cut some tokens: {p:?}"
    );
    let n = 40_000;
    let mut s = Sampler::new(SamplerParams {
        seed: Some(7),
        ..SamplerParams::default()
    });
    // Deterministic drafters: a likely token, an unlikely one, and one the
    // chain removed (probability 0, always rejected).
    let cut = (0..12u32)
        .find(|t| p.iter().all(|(id, _)| id != t))
        .unwrap();
    for draft in [p[0].0, p[p.len() - 1].0, cut] {
        let counts = tally(&p, n, || s.verify(&logits, &[], draft, &[(draft, 1.0)]).0);
        let (stat, crit) = chi_square(&counts, &probs, n);
        assert!(
            stat < crit,
            "draft {draft}: chi-square {stat:.1} >= {crit:.1}"
        );
    }
    // A drafter that samples from its own (bad) distribution q: uniform over
    // four tokens, one of them outside p's support.
    let q: Vec<(u32, f64)> = [p[1].0, p[2].0, p[p.len() - 1].0, cut]
        .iter()
        .map(|&t| (t, 0.25))
        .collect();
    let mut rng = longhaul::sample::Xoshiro256::new(99);
    let counts = tally(&p, n, || {
        let d = q[(rng.next_u64() % 4) as usize].0;
        s.verify(&logits, &[], d, &q).0
    });
    let (stat, crit) = chi_square(&counts, &probs, n);
    assert!(
        stat < crit,
        "drafts from q: chi-square {stat:.1} >= {crit:.1}"
    );
}

#[test]
fn a_broken_acceptance_rule_fails_the_same_test() {
    // The check above has the power to see a wrong rule: (a) accepting
    // every draft the target can produce, (b) drawing from p instead of
    // the residual after a rejection. Both are written out here with the
    // same draws.
    let (logits, p) = target();
    let probs: Vec<f64> = p.iter().map(|(_, w)| *w).collect();
    let n = 40_000;
    let draft = p[1].0;
    let pd = p[1].1;
    let mut rng = longhaul::sample::Xoshiro256::new(5);
    let from_p = |rng: &mut longhaul::sample::Xoshiro256| {
        let mut u = rng.next_f64();
        for &(id, w) in &p {
            if u < w {
                return id;
            }
            u -= w;
        }
        p[p.len() - 1].0
    };
    let always = tally(&p, n, || draft);
    let no_residual = tally(&p, n, || {
        if rng.next_f64() < pd {
            draft
        } else {
            from_p(&mut rng)
        }
    });
    for (name, counts) in [("always accept", always), ("no residual", no_residual)] {
        let (stat, crit) = chi_square(&counts, &probs, n);
        assert!(
            stat > crit,
            "{name}: chi-square {stat:.1} <= {crit:.1} did not see it"
        );
    }
    // And the sampler's own rule on the same draft passes it.
    let mut s = Sampler::new(SamplerParams {
        seed: Some(5),
        ..SamplerParams::default()
    });
    let counts = tally(&p, n, || s.verify(&logits, &[], draft, &[(draft, 1.0)]).0);
    let (stat, crit) = chi_square(&counts, &probs, n);
    assert!(stat < crit, "chi-square {stat:.1} >= {crit:.1}");
}

#[test]
fn greedy_verification_accepts_exactly_the_argmax() {
    let (logits, _) = target();
    let mut s = Sampler::new(SamplerParams::greedy());
    assert_eq!(s.verify(&logits, &[], 6, &[(6, 1.0)]), (6, true));
    assert_eq!(s.verify(&logits, &[], 0, &[(0, 1.0)]), (6, false));
}

/// Requests served by slots that speculate, three on two slots with prompts
/// evaluated four tokens a step beside the speculating slots: each gives
/// exactly its plain greedy tokens, drafts are accepted and rejected, and
/// the counters (`/metrics`' `spec_decode_*`, each request's `draft_n`)
/// agree.
fn slots_speculate(name: &str, spec: Speculation<CpuBackend>, n_ids: u32, n: usize) {
    let mut p = params(256, None);
    p.n_ubatch = 4;
    let e = Arc::new(load(&fixture(name), p));
    assert!(30 + n < 256, "the context holds each request");
    // Prompts of `n_ids` distinct tokens at most.
    let n_ids = n_ids.min(e.model.hp.n_vocab as u32);
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|i| {
            let phrase: Vec<u32> = (0..6 + i).map(|j| (j * 37 + 11 * i + 5) % n_ids).collect();
            phrase.iter().cycle().take(30).copied().collect()
        })
        .collect();
    let want: Vec<Vec<u32>> = prompts.iter().map(|pr| greedy(&e, pr, n, None).0).collect();
    let sched = Scheduler::spawn_speculative(e.clone(), 2, 2, StateConfig::default(), spec);
    let mut streams: Vec<_> = prompts
        .iter()
        .map(|pr| {
            let eog = e
                .tokenizer
                .eog_ids()
                .into_iter()
                .map(|id| (id, f32::NEG_INFINITY));
            let mut sp = SamplerParams::greedy();
            sp.logit_bias = eog.collect();
            let r = GenRequest {
                prompt: pr.clone(),
                n_predict: n,
                sampler: sp,
                stop: Vec::new(),
                cache_prompt: true,
                ignore_eos: false,
                probs: None,
                constraint: None,
                special: false,
            };
            sched.submit(r).expect("submit")
        })
        .collect();
    let mut drafted = 0;
    let mut accepted = 0;
    for (k, (s, w)) in streams.iter_mut().zip(&want).enumerate() {
        let mut ids = Vec::new();
        while let Some(ev) = s.next_blocking() {
            match ev {
                GenEvent::Token { id, .. } => ids.push(id),
                GenEvent::Done(d) => {
                    assert_eq!(d.n_gen, n);
                    drafted += d.spec.n_drafted;
                    accepted += d.spec.n_accepted;
                    break;
                }
                GenEvent::Error(e) => panic!("request {k}: {e}"),
            }
        }
        assert_eq!(
            &ids, w,
            "{name} request {k}: speculating slot vs plain greedy alone"
        );
    }
    let m = sched.metrics();
    eprintln!(
        "{name}: drafted {drafted}, accepted {accepted}, {} verification batches",
        m.spec_drafts
    );
    assert_eq!(m.spec_draft_tokens, drafted as u64);
    assert_eq!(m.spec_accepted_tokens, accepted as u64);
    assert!(
        accepted > 0 && accepted < drafted,
        "{name}: drafted {drafted}, accepted {accepted}"
    );
    // As without speculation: every generated token but each request's
    // first, which its prompt's step gives.
    assert_eq!(m.gen_tokens_total, (3 * (n - 1)) as u64);
    sched.shutdown();
}

#[test]
fn slots_speculate_with_n_grams_and_a_draft_model_and_equal_plain_greedy() {
    let ngram = |m: u16| Speculation {
        params: spec(SpecType::NgramSimple, 1, m),
        draft: None,
    };
    slots_speculate("qwen3moe-f32.gguf", ngram(8), u32::MAX, 24);
    // Recurrent layers go back through a checkpoint in the slot (prompts
    // of five ids, after which this model's output repeats).
    slots_speculate("qwen3next-q8_0.gguf", ngram(8), 5, 120);
    let draft = ModelDrafter::load_model(
        &fixture("qwen3moe-q4_k_m.gguf"),
        CpuBackend::new(),
        params(256, None),
    )
    .expect("draft model");
    let mut sp = spec(SpecType::DraftSimple, 1, 1);
    sp.draft.n_max = 4;
    slots_speculate(
        "qwen3moe-f32.gguf",
        Speculation {
            params: sp,
            draft: Some(Arc::new(draft)),
        },
        u32::MAX,
        24,
    );
}

/// `--longhaul-cache auto` leaves the draft model out: the budget's note
/// names it, and what the file says a draft will hold is what a loaded one
/// holds (weights, and one sequence's cache per target sequence).
#[test]
fn the_auto_expert_budget_leaves_out_the_draft_model() {
    let (target, draft) = (fixture("qwen3moe-q8_0.gguf"), fixture("qwen3moe-f32.gguf"));
    let mut p = params(256, None);
    p.longhaul = Some(LonghaulParams {
        budget: CacheBudget::Auto,
        policy: "lru".parse().expect("policy"),
        prefetch: false.into(),
        verify: false,
        direct_io: true,
        uring: false,
    });
    let plain = load(&target, p.clone());
    p.draft_model = Some(draft.clone());
    let with = load(&target, p);
    let note = |e: &Engine<CpuBackend>| e.longhaul.as_ref().expect("longhaul").budget_note.clone();
    assert!(
        note(&with).contains("and the draft model ("),
        "{}",
        note(&with)
    );
    assert!(!note(&plain).contains("draft"), "{}", note(&plain));
    let d = ModelDrafter::load(
        &draft,
        CpuBackend::new(),
        params(256, None),
        &with.tokenizer,
        DraftParams::default(),
    )
    .expect("draft");
    let b = |n_seq| {
        longhaul::draft::draft_bytes(&draft, &CpuBackend::new(), 256, n_seq, GgmlType::F16)
            .expect("draft bytes")
    };
    assert_eq!(b(1), d.bytes());
    let kv = longhaul::kv::kv_cache_bytes(&d.engine().model.hp, 256, 1, GgmlType::F16);
    assert!(kv > 0);
    assert_eq!(
        b(3),
        d.bytes() + 2 * kv,
        "three target sequences, three draft sequences"
    );
    // Half of what is left after resident weights, KV caches and the draft.
    assert_eq!(longhaul::engine::auto_budget(100, 10, 20, 30), 20);
    assert_eq!(longhaul::engine::auto_budget(50, 10, 20, 30), 0);
}
