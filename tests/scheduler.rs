//! Continuous batching: requests served together produce exactly the tokens
//! each produces alone (greedy), stop strings end generation before the
//! match, and dropped streams free their slots.

mod common;

use std::path::Path;
use std::sync::Arc;

use longhaul::backend::cpu::CpuBackend;
use longhaul::engine::{Engine, EngineParams};
use longhaul::sample::{Sampler, SamplerParams};
use longhaul::scheduler::{FinishReason, GenEvent, GenRequest, Scheduler};

fn engine() -> Arc<Engine<CpuBackend>> {
    engine_ubatch(EngineParams::default().n_ubatch)
}

fn engine_ubatch(n_ubatch: usize) -> Arc<Engine<CpuBackend>> {
    engine_at(
        "qwen3moe-f32.gguf",
        n_ubatch,
        EngineParams::default().n_ctx_checkpoints,
    )
}

/// An engine on fixture `name` with a context of 256 and `n_ubatch` tokens
/// of prompt per step.
fn engine_at(name: &str, n_ubatch: usize, checkpoints: usize) -> Arc<Engine<CpuBackend>> {
    let p = common::fixture(name);
    Arc::new(
        Engine::load(
            Path::new(&p),
            CpuBackend::new(),
            EngineParams {
                n_ctx: 256,
                n_ubatch,
                n_ctx_checkpoints: checkpoints,
                ..EngineParams::default()
            },
        )
        .expect("load"),
    )
}

fn greedy() -> SamplerParams {
    SamplerParams {
        temp: 0.0,
        ..SamplerParams::default()
    }
}

fn req(prompt: Vec<u32>, n: usize) -> GenRequest {
    GenRequest {
        prompt,
        n_predict: n,
        sampler: greedy(),
        stop: Vec::new(),
        cache_prompt: true,
        ignore_eos: true,
        probs: None,
        constraint: None,
        special: false,
    }
}

/// `n` greedy tokens of `prompt` alone, the end-of-generation tokens
/// banned as the scheduler bans them for `ignore_eos` requests.
fn alone(e: &Engine<CpuBackend>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut kv = e.new_kv().expect("kv");
    let mut params = greedy();
    params.ban_eog(&e.tokenizer.eog_ids());
    let (out, _) = e
        .generate(&mut kv, prompt, n, &mut Sampler::new(params), |_| true)
        .expect("generate");
    assert_eq!(out.len(), n);
    out
}

fn collect(
    stream: &mut longhaul::scheduler::GenStream,
) -> (Vec<u32>, String, Option<FinishReason>) {
    let (mut ids, mut text, mut fin) = (Vec::new(), String::new(), None);
    while let Some(ev) = stream.next_blocking() {
        match ev {
            GenEvent::Token { id, text: t, .. } => {
                ids.push(id);
                text.push_str(&t);
            }
            GenEvent::Done(s) => {
                fin = Some(s.finish_reason);
                break;
            }
            GenEvent::Error(e) => panic!("error: {e}"),
        }
    }
    (ids, text, fin)
}

#[test]
fn batched_requests_equal_each_request_alone() {
    batched_equal_alone(engine(), false);
}

/// Prompts longer than a ubatch are evaluated a chunk per step (at most one
/// ubatch of prompt tokens per step, next to the decoding slots' tokens):
/// still the tokens of each request alone.
#[test]
fn chunked_prompts_join_running_generations_unchanged() {
    batched_equal_alone(engine_ubatch(4), false);
}

/// Six requests on four slots (two wait, all run interleaved) each give
/// their tokens alone; with `cancel`, a seventh request dropped after its
/// first token changes none of them.
fn batched_equal_alone(e: Arc<Engine<CpuBackend>>, cancel: bool) {
    let n_vocab = e.model.hp.n_vocab as u32;
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| {
            (0..(5 + 3 * i))
                .map(|j| (j * 31 + i * 7 + 1) % n_vocab)
                .collect()
        })
        .collect();
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&e, p, 12)).collect();
    let sched = Scheduler::spawn(e.clone(), 4);
    let mut streams: Vec<_> = prompts
        .iter()
        .map(|p| sched.submit(req(p.clone(), 12)).expect("submit"))
        .collect();
    if cancel {
        let mut victim = sched.submit(req(vec![5, 6, 7, 8, 9], 50)).expect("submit");
        if let Some(GenEvent::Token { .. }) = victim.next_blocking() {
            drop(victim);
        }
    }
    for (s, w) in streams.iter_mut().zip(&want) {
        let (ids, _, fin) = collect(s);
        assert_eq!(&ids, w, "batched vs alone");
        assert_eq!(fin, Some(FinishReason::Length));
    }
    let m = sched.metrics();
    assert!(m.gen_tokens_total > 0 && m.prompt_tokens_total > 0);
    sched.shutdown();
}

#[test]
fn stop_strings_cut_the_text_and_cancelled_streams_free_their_slot() {
    let e = engine();
    let prompt: Vec<u32> = (1..10).collect();
    let sched = Scheduler::spawn(e.clone(), 1);
    let (ids, text, _) = collect(&mut sched.submit(req(prompt.clone(), 16)).expect("submit"));
    assert_eq!(ids.len(), 16);
    // Stop on a piece of the text produced above: generation must end before it.
    let chars: Vec<char> = text.chars().collect();
    if chars.len() >= 4 {
        let stop: String = chars[2..4].iter().collect();
        let mut r = req(prompt.clone(), 16);
        r.stop = vec![stop.clone()];
        let (_, cut, fin) = collect(&mut sched.submit(r).expect("submit"));
        assert_eq!(fin, Some(FinishReason::Stop));
        assert!(
            !cut.contains(&stop),
            "{cut:?} contains the stop string {stop:?}"
        );
        assert!(
            text.starts_with(&cut),
            "{cut:?} is not a prefix of {text:?}"
        );
    }
    // One slot: a dropped stream must not block the next request.
    let s = sched.submit(req(prompt.clone(), 200)).expect("submit");
    drop(s);
    let (ids2, _, _) = collect(&mut sched.submit(req(prompt, 4)).expect("submit"));
    assert_eq!(ids2.len(), 4);
    sched.shutdown();
}

#[test]
fn prompts_longer_than_the_context_are_refused_with_the_limit() {
    let sched = Scheduler::spawn(engine(), 1);
    let err = sched
        .submit(req(vec![1; 300], 1))
        .err()
        .expect("too long")
        .to_string();
    assert!(err.contains("300 tokens") && err.contains("256"), "{err}");
}

/// A hybrid (Qwen3-Next) engine: recurrent DeltaNet layers and one
/// attention layer, `n_ubatch` tokens of prompt per step.
fn hybrid_engine(n_ubatch: usize, checkpoints: usize) -> Arc<Engine<CpuBackend>> {
    engine_at("qwen3next-f32.gguf", n_ubatch, checkpoints)
}

/// A hybrid model's slots: each slot's recurrent state is its own, prompts
/// in chunks of 4 join running generations at other positions, and a
/// request dropped mid-generation leaves the others' tokens unchanged.
#[test]
fn hybrid_requests_batched_and_cancelled_equal_each_alone() {
    batched_equal_alone(hybrid_engine(4, 8), true);
}

/// A request that shares only its slot's earlier prompt (not the reply
/// generated after it) goes back to the checkpoint taken 4 tokens before
/// that prompt's end (counted in the metrics) and generates what a fresh
/// run does; with no checkpoints it evaluates its whole prompt again, with
/// the same tokens. One that extends what the slot holds (prompt and reply)
/// goes on from there with neither.
#[test]
fn hybrid_follow_up_resumes_from_a_checkpoint_or_reprefills() {
    for checkpoints in [8, 0] {
        let e = hybrid_engine(512, checkpoints);
        let first: Vec<u32> = (0..20u32).map(|j| (j * 17 + 5) % 300).collect();
        let sched = Scheduler::spawn(e.clone(), 1);
        collect(&mut sched.submit(req(first.clone(), 8)).expect("submit"));
        // Diverges right after the first prompt: the slot holds 27 tokens.
        let mut other = first.clone();
        other.extend_from_slice(&[11, 12, 13]);
        let want = alone(&e, &other, 8);
        let (ids, _, _) = collect(&mut sched.submit(req(other.clone(), 8)).expect("submit"));
        assert_eq!(ids, want, "{checkpoints} checkpoints");
        let m = sched.metrics();
        let counts = |m: &longhaul::scheduler::SchedulerMetrics| {
            (
                m.checkpoints_created,
                m.checkpoints_restored,
                m.prefix_reprefills,
            )
        };
        if checkpoints > 0 {
            assert_eq!(counts(&m), (2, 1, 0), "{m:?}");
            assert_eq!(m.prompt_tokens_total, 20 + (23 - 16), "{m:?}");
        } else {
            assert_eq!(counts(&m), (0, 0, 1), "{m:?}");
            assert_eq!(m.prompt_tokens_total, 20 + 23, "{m:?}");
        }
        // Extends the slot's 23 + 7 tokens: nothing to go back to.
        let mut next = other.clone();
        next.extend_from_slice(&ids[..7]);
        next.push(21);
        let want = alone(&e, &next, 4);
        let (ids, _, _) = collect(&mut sched.submit(req(next, 4)).expect("submit"));
        assert_eq!(ids, want, "{checkpoints} checkpoints");
        let m2 = sched.metrics();
        assert_eq!(m2.prompt_tokens_total - m.prompt_tokens_total, 1, "{m2:?}");
        assert_eq!(counts(&m2).1 + counts(&m2).2, counts(&m).1 + counts(&m).2);
        sched.shutdown();
    }
}

/// An attention-only model rewinds anywhere: no checkpoints, no re-prefill.
#[test]
fn attention_models_take_no_checkpoints() {
    let e = engine();
    let sched = Scheduler::spawn(e, 1);
    let p: Vec<u32> = (1..15).collect();
    collect(&mut sched.submit(req(p.clone(), 4)).expect("submit"));
    collect(&mut sched.submit(req(p, 4)).expect("submit"));
    let m = sched.metrics();
    assert_eq!(
        (
            m.checkpoints_created,
            m.checkpoints_restored,
            m.prefix_reprefills
        ),
        (0, 0, 0)
    );
    sched.shutdown();
}
