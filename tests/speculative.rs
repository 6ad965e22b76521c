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

mod common;

use std::path::Path;

use common::{fixture, nmse, real_model};
use longhaul::backend::cpu::CpuBackend;
use longhaul::engine::{CacheBudget, Engine, EngineParams, FlashAttn, GenStats, LonghaulParams};
use longhaul::model::Logits;
use longhaul::sample::{Sampler, SamplerParams};
use longhaul::spec::{NgramSizes, SpecParams, SpecType};
use longhaul::tensor::GgmlType;

fn params(n_ctx: usize, budget: Option<u64>) -> EngineParams {
    EngineParams {
        n_ctx,
        kv_type: GgmlType::F16,
        longhaul: budget.map(|b| LonghaulParams {
            budget: CacheBudget::Bytes(b),
            policy: "lru".parse().expect("policy"),
            prefetch: false,
            verify: false,
            direct_io: true,
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
    }
}

/// Greedy tokens, stats, and the logits of one more token after them.
fn greedy(
    e: &Engine<CpuBackend>,
    prompt: &[u32],
    n: usize,
    sp: Option<SpecParams>,
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
    let (out, stats) = match sp.and_then(|s| s.drafter()) {
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
const CODE_EDIT: &str = r#"<|im_start|>user
Here is a Python file:

```python
import math

def area_of_circle(radius):
    return math.pi * radius * radius

def perimeter_of_circle(radius):
    return 2 * math.pi * radius

def area_of_square(side):
    return side * side

def perimeter_of_square(side):
    return 4 * side

def main():
    for r in [1, 2, 3]:
        print(area_of_circle(r), perimeter_of_circle(r))
    for s in [1, 2, 3]:
        print(area_of_square(s), perimeter_of_square(s))
```

Repeat the whole file exactly, but rename area_of_square to square_area.<|im_end|>
<|im_start|>assistant
"#;

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
