//! The sequence state of the hybrid families (Qwen3-Next, Qwen3.5): recurrent
//! DeltaNet layers next to attention layers.
//!
//! - A prompt processed in ubatches of 1, 7 and 32 gives the logits of one
//!   pass over it (a pass of 128 tokens or more runs the chunked delta rule,
//!   shorter ones the token-by-token recurrence).
//! - Rewinding goes back to a checkpoint (or the start) and says where;
//!   evaluating from there gives the logits of a run that never went back,
//!   bit for bit. An attention-only state rewinds anywhere.
//! - A read that fails under longhaul in the middle of a batch (after some
//!   recurrent layers took it in) leaves the state at a position it really
//!   holds: going on from there gives the resident logits bit for bit.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use longhaul::backend::cpu::CpuBackend;
use longhaul::gguf;
use longhaul::longhaul::{LonghaulConfig, Policy};
use longhaul::model::{Logits, Model};
use longhaul::state::SeqState;
use longhaul::tensor::GgmlType;

/// The longest golden prompt of `stem` (88 tokens for the hybrids).
fn long_prompt(stem: &str) -> Vec<u32> {
    let g = golden(&format!("{stem}-f32.json"));
    g["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| ids(&p["tokens"]))
        .max_by_key(|t| t.len())
        .expect("a prompt")
}

/// All logit rows of `prompt` evaluated in chunks of `ubatch`.
fn logits_in(m: &Model<CpuBackend>, prompt: &[u32], ubatch: usize) -> Vec<f32> {
    let mut s = SeqState::new(m, 128, GgmlType::F32).expect("state");
    prompt
        .chunks(ubatch)
        .flat_map(|c| s.eval(m, c, Logits::All).expect("eval"))
        .collect()
}

/// Per-row NMSE of two runs' logits, the worst row.
fn worst_row_nmse(a: &[f32], b: &[f32], n_vocab: usize) -> f64 {
    a.chunks(n_vocab)
        .zip(b.chunks(n_vocab))
        .map(|(x, y)| nmse(x, y))
        .fold(0.0, f64::max)
}

/// The golden prompts are shorter than the 128 tokens from which the CPU
/// runs the chunked delta rule: with them every ubatch size runs the
/// token-by-token form, and the logits are those of one pass bit for bit
/// but for the f32 matmul's row tiling (NMSE <= 1e-12).
#[test]
fn prompts_in_ubatches_of_1_7_and_32_give_the_logits_of_one_pass() {
    for stem in HYBRID_FAMILIES {
        for ty in ["f32", "q8_0"] {
            let m = load(&fixture(&format!("{stem}-{ty}.gguf")));
            let prompt = long_prompt(stem);
            assert!(prompt.len() > 64, "the prompt must span a 64-token chunk");
            let whole = logits_in(&m, &prompt, prompt.len());
            for ub in [1, 7, 32] {
                let part = logits_in(&m, &prompt, ub);
                let e = worst_row_nmse(&part, &whole, m.hp.n_vocab);
                eprintln!("{stem}-{ty} ubatch {ub}: worst row nmse {e:.3e}");
                assert!(e <= 1e-12, "{stem}-{ty} ubatch {ub}: nmse {e:.3e}");
            }
        }
    }
}

/// A 200-token prompt in one pass runs the chunked delta rule (chunks of
/// 64); in ubatches of 1, 7 and 32 the token-by-token one. The two forms
/// differ by f32 rounding, at most 1e-4 of the outputs' RMS per op
/// (backend::cpu::delta_chunked's bound; 4.5e-6 measured): at F32 the
/// logits agree to NMSE <= 1e-8 and in every row's argmax. At F16 every
/// product first rounds its activations to f16 (as ggml does), which turns
/// a one-ulp difference into another rounding now and then: NMSE <= 1e-4,
/// the bound against llama.cpp (1.5e-6 measured). Q8_0 is left
/// out: rounding activations to 8 bits does the same at a coarser grain
/// (3e-3 measured on qwen3next-q8_0), a property of the format, not of
/// either form.
#[test]
fn a_long_prompt_in_one_pass_chunked_equals_it_in_ubatches() {
    for stem in HYBRID_FAMILIES {
        for ty in ["f32", "f16"] {
            let m = load(&fixture(&format!("{stem}-{ty}.gguf")));
            let n_vocab = m.hp.n_vocab as u32;
            let prompt: Vec<u32> = (0..200u32).map(|i| (i * 53 + 17) % n_vocab).collect();
            let mut s = SeqState::new(&m, 256, GgmlType::F32).expect("state");
            let whole = s.eval(&m, &prompt, Logits::All).expect("eval");
            for ub in [1, 7, 32] {
                let mut s = SeqState::new(&m, 256, GgmlType::F32).expect("state");
                let part: Vec<f32> = prompt
                    .chunks(ub)
                    .flat_map(|c| s.eval(&m, c, Logits::All).expect("eval"))
                    .collect();
                let e = worst_row_nmse(&part, &whole, m.hp.n_vocab);
                eprintln!("{stem}-{ty} 200 tokens, ubatch {ub}: worst row nmse {e:.3e}");
                let tol = if ty == "f32" { 1e-8 } else { 1e-4 };
                assert!(e <= tol, "{stem}-{ty} ubatch {ub}: nmse {e:.3e}");
                if ty == "f32" {
                    let rows =
                        |l: &[f32]| -> Vec<u32> { l.chunks(m.hp.n_vocab).map(argmax).collect() };
                    assert_eq!(
                        rows(&part),
                        rows(&whole),
                        "{stem}-{ty} ubatch {ub}: argmax per row"
                    );
                }
            }
        }
    }
}

/// `(logits of tokens[n..] evaluated after tokens[..n], n)` from `s`.
fn tail_logits(m: &Model<CpuBackend>, s: &mut SeqState<CpuBackend>, tokens: &[u32]) -> Vec<f32> {
    let n = s.n_past();
    s.eval(m, &tokens[n..], Logits::Last).expect("eval")
}

#[test]
fn rewinding_goes_back_to_a_checkpoint_and_continues_exactly() {
    let m = load(&fixture("qwen3next-f32.gguf"));
    let b = &m.backend;
    let tokens: Vec<u32> = (0..30u32).map(|i| (i * 41 + 7) % 300).collect();
    // The reference: 0..20, then 20..30, never rewound.
    let mut r = SeqState::new(&m, 64, GgmlType::F32).expect("state");
    r.eval(&m, &tokens[..20], Logits::Last).expect("eval");
    let want = tail_logits(&m, &mut r, &tokens);

    let mut s = SeqState::new(&m, 64, GgmlType::F32).expect("state");
    assert!(s.is_recurrent());
    s.eval(&m, &tokens[..12], Logits::Last).expect("eval");
    assert!(s.checkpoint(b).expect("checkpoint"));
    s.eval(&m, &tokens[12..20], Logits::Last).expect("eval");
    assert!(s.checkpoint(b).expect("checkpoint"));
    s.eval(&m, &tokens[20..27], Logits::Last).expect("eval");
    assert_eq!(s.checkpoint_positions(), vec![12, 20]);
    // 25 is not a checkpoint: back to 20, the latest at or before it.
    assert_eq!(s.rewind(b, 25).expect("rewind"), 20);
    let got = tail_logits(&m, &mut s, &tokens);
    assert!(same_bits(&got, &want), "resumed from 20: logits differ");
    // Back to 15: the checkpoint at 12; the one at 20 describes tokens
    // that are now gone, so it is dropped.
    assert_eq!(s.rewind(b, 15).expect("rewind"), 12);
    assert_eq!(s.checkpoint_positions(), vec![12]);
    s.eval(&m, &tokens[12..20], Logits::Last).expect("eval");
    let got = tail_logits(&m, &mut s, &tokens);
    assert!(same_bits(&got, &want), "resumed from 12: logits differ");
    // Before every checkpoint: back to the start.
    assert_eq!(s.rewind(b, 5).expect("rewind"), 0);
    assert!(s.checkpoint_positions().is_empty());
    s.eval(&m, &tokens[..20], Logits::Last).expect("eval");
    let got = tail_logits(&m, &mut s, &tokens);
    assert!(same_bits(&got, &want), "from the start: logits differ");
    // No checkpoints allowed: every rewind below the end restarts.
    s.set_max_checkpoints(0);
    assert!(!s.checkpoint(b).expect("checkpoint"));
    assert_eq!(s.rewind(b, 29).expect("rewind"), 0);

    // An attention-only state goes back anywhere, and takes no checkpoint.
    let a = load(&fixture("qwen3moe-f32.gguf"));
    let mut s = SeqState::new(&a, 64, GgmlType::F32).expect("state");
    s.eval(&a, &tokens[..27], Logits::Last).expect("eval");
    assert!(!s.is_recurrent() && !s.checkpoint(&a.backend).expect("checkpoint"));
    assert_eq!(s.rewind(&a.backend, 25).expect("rewind"), 25);
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Fails the read numbered `at` (counting from 0), once.
fn fail_read(at: usize) -> gguf::ReadFault {
    let n = AtomicUsize::new(0);
    Arc::new(move |_, _, _| {
        (n.fetch_add(1, Ordering::Relaxed) == at)
            .then(|| std::io::Error::from_raw_os_error(libc::EIO))
    })
}

/// Under longhaul with 2 slots per layer, a read fails at every position of
/// the second batch in turn (the first batch took a checkpoint, or not):
/// the failed eval leaves the state at the checkpoint or the start, and
/// evaluating the rest from there, then decoding, gives the resident
/// logits bit for bit.
#[test]
fn a_failed_read_mid_batch_leaves_the_recurrent_state_usable() {
    let path = fixture("qwen3next-f32.gguf");
    let file = Arc::new(gguf::Model::open(&path).expect("open"));
    let resident = Model::load(CpuBackend::new(), file.clone()).expect("resident");
    let tokens: Vec<u32> = (0..24u32).map(|i| (i * 23 + 3) % 300).collect();
    let run = |m: &Model<CpuBackend>, s: &mut SeqState<CpuBackend>| -> Vec<f32> {
        let mut l = tail_logits(m, s, &tokens);
        let mut all = l.clone();
        for _ in 0..3 {
            l = s.eval(m, &[argmax(&l)], Logits::Last).expect("decode");
            all.extend_from_slice(&l);
        }
        all
    };
    let want = {
        let mut s = SeqState::new(&resident, 64, GgmlType::F32).expect("state");
        s.eval(&resident, &tokens[..10], Logits::Last)
            .expect("eval");
        run(&resident, &mut s)
    };
    let (layers, bytes) = resident.expert_slot_cost().expect("cost");
    let cfg = LonghaulConfig {
        budget_bytes: 2 * layers as u64 * bytes,
        policy: Policy::Lru,
        prefetch: false.into(),
        verify: false,
        direct_io: true,
        uring: false,
    };
    let mut failures = 0;
    for checkpoint in [true, false] {
        let mut at = 0;
        loop {
            let m = Model::load_with(CpuBackend::new(), file.clone(), Some(cfg)).expect("longhaul");
            let mut s = SeqState::new(&m, 64, GgmlType::F32).expect("state");
            s.eval(&m, &tokens[..10], Logits::Last).expect("eval");
            if checkpoint {
                s.checkpoint(&m.backend).expect("checkpoint");
            }
            file.set_read_fault(Some(fail_read(at)));
            let r = s.eval(&m, &tokens[10..], Logits::Last);
            file.set_read_fault(None);
            if r.is_ok() {
                break; // past the batch's last read
            }
            failures += 1;
            let back = if checkpoint { 10 } else { 0 };
            assert_eq!(
                s.n_past(),
                back,
                "read {at} failed, checkpoint {checkpoint}"
            );
            if back == 0 {
                s.eval(&m, &tokens[..10], Logits::Last).expect("eval");
            }
            assert!(
                same_bits(&run(&m, &mut s), &want),
                "read {at} failed, checkpoint {checkpoint}: logits differ from resident"
            );
            at += 1;
        }
    }
    assert!(failures > 2, "only {failures} reads could fail");
}
