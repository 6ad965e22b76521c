//! Longhaul equals resident, bit for bit: for every MoE architecture fixture
//! and cache sizes from one slot per layer to every expert, the logits of a
//! prompt processed in ubatches of 32 tokens and of greedy decode steps are
//! identical, and so are the tokens. Also on split files from our writer.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use longhaul::backend::cpu::CpuBackend;
use longhaul::gguf::{self, Writer};
use longhaul::longhaul::lookahead::{BLOCK, ORDER, WARMUP};
use longhaul::longhaul::{LonghaulConfig, Lookahead, Policy};
use longhaul::model::{Logits, Model};
use longhaul::state::SeqState;
use longhaul::tensor::GgmlType;

const ARCHS: [&str; 4] = ["llama-moe", "qwen2moe", "qwen3moe", "gpt-oss"];

/// 40 prompt tokens (two ubatches of 32 and 8) then 12 greedy steps; returns
/// every logit row produced and the generated tokens.
fn run(m: &Model<CpuBackend>) -> (Vec<f32>, Vec<u32>) {
    let n_vocab = m.hp.n_vocab as u32;
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % n_vocab).collect();
    let mut kv = SeqState::new(m, 64, GgmlType::F16).expect("kv");
    let mut all = Vec::new();
    for chunk in prompt.chunks(32) {
        all.extend(kv.eval(m, chunk, Logits::All).expect("prompt"));
    }
    let mut tokens = Vec::new();
    let mut last = all[all.len() - n_vocab as usize..].to_vec();
    for _ in 0..12 {
        let t = argmax(&last);
        tokens.push(t);
        last = kv.eval(m, &[t], Logits::Last).expect("decode");
        all.extend_from_slice(&last);
    }
    (all, tokens)
}

fn longhaul_model(
    path: &Path,
    slots: usize,
    cost: (usize, u64),
    policy: Policy,
    prefetch: impl Into<Lookahead>,
    uring: bool,
) -> Model<CpuBackend> {
    let file = Arc::new(gguf::Model::open(path).expect("open"));
    let cfg = LonghaulConfig {
        budget_bytes: slots as u64 * cost.0 as u64 * cost.1,
        policy,
        prefetch: prefetch.into(),
        verify: false,
        direct_io: true,
        uring,
    };
    let m = Model::load_with(CpuBackend::new(), file, Some(cfg)).expect("longhaul load");
    assert_eq!(m.n_slots(), slots);
    m
}

/// Whether io_uring can serve direct reads of `path` here (see
/// `longhaul::longhaul::uring`): the kernel gives a ring and the file
/// system takes `O_DIRECT`.
fn ring_serves(path: &Path) -> bool {
    let file = gguf::Model::open(path).expect("open");
    file.set_direct_io(true);
    let direct = file
        .read_direct_with(0, 0, 1, |_| ())
        .expect("direct read")
        .is_some();
    if !longhaul::longhaul::uring::available() {
        eprintln!("io_uring is not available here: the uring runs read with the I/O threads");
    }
    direct && longhaul::longhaul::uring::available()
}

/// The cache statistics of all of `m`'s layers together.
fn total_stats(m: &Model<CpuBackend>) -> longhaul::longhaul::CacheStats {
    let stats = m.longhaul_stats().expect("stats");
    stats
        .iter()
        .fold(longhaul::longhaul::CacheStats::default(), |mut a, s| {
            a.add(s);
            a
        })
}

fn check(path: &Path, label: &str) {
    let resident = load(path);
    let (want_logits, want_tokens) = run(&resident);
    let cost = resident.expert_slot_cost().expect("cost");
    let n_expert = resident.hp.n_expert;
    let mut sizes: Vec<usize> = vec![1, 2, n_expert / 2, n_expert - 1, n_expert];
    sizes.retain(|&s| s >= 1);
    sizes.dedup();
    // Whether io_uring serves this file: the kernel gives a ring and the
    // file system takes direct reads.
    let ring_reads = ring_serves(path);
    for &slots in &sizes {
        for (policy, prefetch, uring) in [
            (Policy::Lru, false, false),
            (Policy::Lfu, false, false),
            (Policy::Auto, true, false),
            (Policy::Lru, true, false),
            (Policy::Lru, false, true),
        ] {
            let m = longhaul_model(path, slots, cost, policy, prefetch, uring);
            // No warmup: not one expert byte is read before the first real batch.
            let untouched = m
                .longhaul_stats()
                .expect("stats")
                .iter()
                .all(|s| s.bytes_read == 0 && s.waves == 0);
            assert!(untouched, "{label}: experts were read at load time");
            let (logits, tokens) = run(&m);
            assert_eq!(
                tokens, want_tokens,
                "{label}: {slots} slots, {policy:?}, prefetch {prefetch}, uring {uring}: tokens differ"
            );
            let same = logits
                .iter()
                .zip(&want_logits)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same && logits.len() == want_logits.len(),
                "{label}: {slots} slots, {policy:?}, prefetch {prefetch}, uring {uring}: logits are not bit-identical"
            );
            let total = total_stats(&m);
            assert!(
                total.misses > 0 && total.bytes_read > 0,
                "{label}: nothing was streamed"
            );
            // The ring read the decode steps' slices (a prompt's larger
            // waves go through the I/O threads) where it serves the file,
            // and nothing without `uring`. Caches of up to half the experts
            // miss during decode; larger ones may hold all it needs.
            if uring && ring_reads && slots <= n_expert / 2 {
                assert!(
                    total.uring_reads > 0,
                    "{label}: {slots} slots: no slice through io_uring for {} misses",
                    total.misses
                );
            } else if !uring {
                assert_eq!(total.uring_reads, 0, "{label}: uring {uring}");
            }
            // With half the experts in slots, decode steps fit beside the
            // lookahead's reads, which their waves take over in flight: the
            // bits above were computed with experts handed out as those
            // reads landed.
            if prefetch && slots == n_expert / 2 {
                assert!(
                    total.adopted_bytes > 0 && total.prefetch_used > 0,
                    "{label}: {slots} slots: no lookahead read taken over ({} of {} bytes ahead)",
                    total.adopted_bytes,
                    total.prefetch_bytes
                );
            } else if !prefetch {
                assert_eq!(
                    total.prefetch_bytes, 0,
                    "{label}: read ahead without a lookahead"
                );
            }
            if slots < m.hp.n_expert_used {
                assert!(
                    total.multi_wave_batches > 0,
                    "{label}: {slots} slots < top-{} must need waves",
                    m.hp.n_expert_used
                );
            }
            if slots == n_expert {
                // With a slot for every expert nothing is ever evicted: each
                // expert of each layer is read at most once.
                assert!(
                    total.misses as usize <= n_expert * cost.0,
                    "{label}: {} misses with a full cache",
                    total.misses
                );
            }
        }
    }
}

#[test]
fn longhaul_is_bit_identical_to_resident_for_every_cache_size() {
    for a in ARCHS {
        for q in ["f32", "q4_k_m"] {
            let stem = format!("{a}-{q}");
            check(&fixture(&format!("{stem}.gguf")), &stem);
        }
    }
    check(&fixture("gpt-oss-mxfp4.gguf"), "gpt-oss-mxfp4");
}

/// The families of issue 12: MLA (deepseek*), leading dense layers and
/// shared experts (glm4moe, deepseek*, laguna), sigmoid routing with a
/// selection bias and groups (deepseek3), NextN layers skipped (glm4moe).
#[test]
fn longhaul_is_bit_identical_to_resident_for_the_new_families() {
    for a in NEW_FAMILIES {
        for q in ["f32", "q4_k_m"] {
            let stem = format!("{a}-{q}");
            check(&fixture(&format!("{stem}.gguf")), &stem);
        }
    }
}

/// The hybrids of issue 13: recurrent (DeltaNet) layers with their state
/// per sequence resident, routed experts streamed as for any MoE layer.
#[test]
fn longhaul_is_bit_identical_to_resident_for_the_hybrid_families() {
    for a in HYBRID_FAMILIES {
        for q in ["f32", "q4_k_m"] {
            let stem = format!("{a}-{q}");
            check(&fixture(&format!("{stem}.gguf")), &stem);
        }
    }
}

#[test]
fn longhaul_reads_split_files_from_our_writer() {
    let src = gguf::Model::open(fixture("qwen3moe-q4_k_m.gguf")).expect("open");
    let mut w = Writer::new();
    for (k, v) in src.metadata().iter() {
        if !k.starts_with("split.") {
            w.set(k, v.clone());
        }
    }
    for t in src.tensors() {
        w.add_tensor(
            &t.name,
            &t.dims,
            t.ty,
            src.tensor_data(t).expect("data").to_vec(),
        )
        .expect("add");
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("longhaul-split");
    std::fs::create_dir_all(&dir).expect("dir");
    let paths = w.write_split(dir.join("qwen3moe"), 7).expect("split");
    assert!(
        paths.len() > 2,
        "expected several shards, got {}",
        paths.len()
    );
    let opened = gguf::Model::open(&paths[0]).expect("open split");
    assert_eq!(opened.shards().len(), paths.len());
    check(&paths[0], "qwen3moe split");
}

/// The synthetic qwen3next layout (`gen-model --preset qwen3next-tiny`,
/// skewed router): hybrid layers with recurrent state, a shared expert in
/// every layer.
#[test]
fn longhaul_is_bit_identical_to_resident_on_synthetic_qwen3next() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("longhaul-synth-qwen3next");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("qwen3next-tiny.gguf");
    let spec = longhaul::synth::SynthSpec {
        router_skew: 1.0,
        ..longhaul::synth::SynthSpec::qwen3next_tiny()
    };
    longhaul::synth::write(&spec, &path).expect("write");
    check(&path, "synthetic qwen3next-tiny");
}

/// Issue 14's low-bit expert formats: the slot bytes are the GGUF bytes of
/// each format, read and computed in place.
#[test]
fn longhaul_is_bit_identical_to_resident_for_the_low_bit_formats() {
    for q in LOW_BIT_STEMS {
        let stem = format!("iqmoe-{q}");
        check(&fixture(&format!("{stem}.gguf")), &stem);
    }
}

/// A file whose layers store their experts in different types: each layer's
/// slots take that layer's expert size, so a budget buys as many slots as
/// the sum of the layers' sizes allows (not the largest layer's size times
/// the layer count).
#[test]
fn mixed_expert_types_size_each_layers_slots() {
    let path = fixture("iqmoe-mix.gguf");
    let file = gguf::Model::open(&path).expect("open");
    let n_expert = 4u64;
    let layer_bytes: Vec<u64> = (0..2)
        .map(|il| {
            ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
                .iter()
                .map(|n| {
                    file.tensor(&format!("blk.{il}.{n}.weight"))
                        .expect("tensor")
                        .len
                        / n_expert
                })
                .sum()
        })
        .collect();
    assert_ne!(
        layer_bytes[0], layer_bytes[1],
        "the fixture's layers must differ"
    );
    let resident = load(&path);
    let cost = resident.expert_slot_cost().expect("cost");
    assert_eq!(cost, (2, (layer_bytes[0] + layer_bytes[1]).div_ceil(2)));
    for slots in [1usize, 2, 4] {
        let budget = slots as u64 * (layer_bytes[0] + layer_bytes[1]);
        let file = Arc::new(gguf::Model::open(&path).expect("open"));
        let cfg = LonghaulConfig {
            budget_bytes: budget,
            policy: Policy::Lru,
            prefetch: false.into(),
            verify: false,
            direct_io: true,
            uring: false,
        };
        let m = Model::load_with(CpuBackend::new(), file, Some(cfg)).expect("load");
        assert_eq!(m.n_slots(), slots, "budget {budget}");
        assert!(m.slot_bytes() <= budget, "{} > {budget}", m.slot_bytes());
    }
}

/// The sync point computes the experts a wave already holds while the
/// wave's missing experts are still being read, and each missing one once
/// its reads are in: with every read slowed by 10 ms (the reader's fault
/// seam sleeps and lets the read through), experts are computed with reads
/// of their wave in flight, and the logits are still resident's, bit for
/// bit, through the I/O threads and through io_uring.
#[test]
fn compute_overlaps_slow_expert_reads_and_stays_bit_identical() {
    let path = fixture("qwen3moe-q4_k_m.gguf");
    let resident = load(&path);
    let (want_logits, want_tokens) = run(&resident);
    let cost = resident.expert_slot_cost().expect("cost");
    let slots = resident.hp.n_expert / 2;
    // Through the I/O threads, then through io_uring (whose submitting
    // thread meets the slow seam before each read).
    for uring in [false, true] {
        let file = Arc::new(gguf::Model::open(&path).expect("open"));
        let cfg = LonghaulConfig {
            budget_bytes: slots as u64 * cost.0 as u64 * cost.1,
            policy: Policy::Lru,
            prefetch: false.into(),
            verify: true,
            direct_io: true,
            uring,
        };
        let m = Model::load_with(CpuBackend::new(), file.clone(), Some(cfg)).expect("load");
        file.set_read_fault(Some(Arc::new(|_, _, _| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            None
        })));
        let (logits, tokens) = run(&m);
        file.set_read_fault(None);
        assert_eq!(tokens, want_tokens, "uring {uring}: tokens differ");
        assert!(
            logits.len() == want_logits.len()
                && logits
                    .iter()
                    .zip(&want_logits)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
            "uring {uring}: logits are not bit-identical"
        );
        let total = m.longhaul_stats().expect("stats").iter().fold(
            longhaul::longhaul::CacheStats::default(),
            |mut a, s| {
                a.add(s);
                a
            },
        );
        assert!(total.misses > 0 && total.hits > 0, "{total:?}");
        assert!(
        total.overlapped > 0,
        "uring {uring}: no expert was computed while its wave's reads were in flight: {total:?}"
    );
    }
}

/// The interleaved weight layout (`--repack`, `quant::layout`) in resident
/// tensors and in longhaul slots (converted on the reading threads, for
/// demand reads and the lookahead's alike):
/// - Q8_0, which ggml does not repack on x86, keeps the bits of the GGUF
///   layout;
/// - Q4_0 and Q4_K (synthetic models, one type throughout) and MXFP4
///   (gpt-oss's experts) take ggml's repack order, as llama.cpp
///   does at its defaults: the prompt's logits stay near the GGUF layout's
///   (the same products, summed per block in integers before one FMA rather
///   than in eight FMA lanes; MXFP4's power-of-two scales leave these tiny
///   sums exact in both orders), and longhaul's slots give the bits of the
///   repacked resident model. The bound, NMSE <= 1e-3: random routers turn
///   last-bit differences into other experts, and llama.cpp's own logits
///   with `--repack` on and off differ by NMSE 2.4e-4 on the demo model at
///   Q4_0 (tools/llama_logits.cpp --repack on|off, 40 prompt tokens).
#[test]
fn repacked_weights_and_slots_are_bit_identical_to_the_gguf_layout() {
    use longhaul::model::LoadOptions;
    use longhaul::quant::layout;
    if layout::interleaved(GgmlType::Q8_0).is_none() {
        eprintln!("skipped: this CPU has no interleaved kernels (AVX2)");
        return;
    }
    let open = |p: &Path| Arc::new(gguf::Model::open(p).expect("open"));
    let mut synth = Vec::new();
    for (name, ty) in [
        ("synthetic-q4_0", GgmlType::Q4_0),
        ("synthetic-q4_k", GgmlType::Q4_K),
    ] {
        let path = std::env::temp_dir().join(format!(
            "longhaul-repack-{name}-{}.gguf",
            std::process::id()
        ));
        let spec = longhaul::synth::SynthSpec {
            expert_type: ty,
            dense_type: ty,
            ..longhaul::synth::SynthSpec::tiny()
        };
        longhaul::synth::write(&spec, &path).expect("synthetic model");
        synth.push((name, path));
    }
    let mut cases: Vec<(&str, std::path::PathBuf)> = [
        "llama-moe-q8_0",
        "qwen3moe-q8_0",
        "deepseek2-q8_0",
        "gpt-oss-mxfp4",
    ]
    .iter()
    .map(|&stem| (stem, fixture(&format!("{stem}.gguf"))))
    .collect();
    cases.extend(synth.iter().cloned());
    for (stem, path) in cases {
        let file = open(&path);
        // The fixture's experts and attention take the layout, or this
        // test would compare the plain layout with itself.
        for name in ["blk.1.ffn_gate_exps.weight", "blk.0.attn_output.weight"] {
            let t = file.tensor(name).expect(name);
            assert!(
                layout::interleaves(t.ty, t.dims[1] as usize),
                "{stem}: {name} {:?} {}",
                t.dims,
                t.ty
            );
        }
        let opts = |no_repack, longhaul| LoadOptions {
            no_repack,
            longhaul,
            ..Default::default()
        };
        let plain = Model::load_opts(CpuBackend::new(), file.clone(), opts(true, None), None)
            .expect("load");
        assert_eq!(plain.repacked_bytes, 0);
        let (plain_logits, plain_tokens) = run(&plain);
        let repacked = Model::load_opts(CpuBackend::new(), file.clone(), opts(false, None), None)
            .expect("load");
        assert!(repacked.repacked_bytes > 0, "{stem}: nothing was repacked");
        let (want_logits, want_tokens) = run(&repacked);
        if stem.ends_with("q8_0") {
            assert_eq!(
                want_tokens, plain_tokens,
                "{stem}: repacked resident tokens"
            );
            assert_bits_eq(
                &want_logits,
                &plain_logits,
                &format!("{stem} repacked resident"),
            );
        } else {
            // The prompt's logits (greedy steps may part ways at a near tie).
            let prompt = 40 * repacked.hp.n_vocab;
            let (mut num, mut den) = (0f64, 0f64);
            for (a, b) in want_logits[..prompt].iter().zip(&plain_logits[..prompt]) {
                num += (*a as f64 - *b as f64).powi(2);
                den += (*b as f64).powi(2);
            }
            let nmse = num / den;
            eprintln!("{stem}: repacked vs GGUF layout NMSE {nmse:.3e}");
            assert!(
                nmse > 0.0 || stem.ends_with("mxfp4"),
                "{stem}: ggml's repack order changed nothing"
            );
            assert!(
                nmse <= 1e-3,
                "{stem}: repacked vs GGUF layout NMSE {nmse:.3e}"
            );
        }
        let (n_layers, expert_bytes) = plain.expert_slot_cost().expect("cost");
        for (slots, prefetch) in [(1, false), (plain.hp.n_expert / 2, true)] {
            let cfg = LonghaulConfig {
                budget_bytes: slots as u64 * n_layers as u64 * expert_bytes,
                policy: Policy::Lru,
                prefetch: prefetch.into(),
                verify: false,
                direct_io: true,
                uring: false,
            };
            let m = Model::load_opts(
                CpuBackend::new(),
                file.clone(),
                opts(false, Some(cfg)),
                None,
            )
            .expect("longhaul");
            let (logits, tokens) = run(&m);
            let label = format!("{stem} repacked slots={slots} prefetch={prefetch}");
            assert_eq!(tokens, want_tokens, "{label}: tokens");
            assert_bits_eq(&logits, &want_logits, &label);
        }
    }
    for (_, path) in synth {
        let _ = std::fs::remove_file(path);
    }
}

fn assert_bits_eq(got: &[f32], want: &[f32], label: &str) {
    assert_eq!(got.len(), want.len(), "{label}: logit count");
    if let Some(i) = got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        panic!("{label}: logit {i} is {} not {}", got[i], want[i]);
    }
}

/// With the lookahead on, a batch that runs in waves (a prompt's) starts no
/// lookahead: its later waves would queue behind the guesses, and the next
/// layer's batch, as large, could not take them over. A decode step's batch,
/// in one wave, does.
#[test]
fn only_batches_of_one_wave_start_a_lookahead() {
    let path = fixture("qwen3moe-q4_k_m.gguf");
    let resident = load(&path);
    let cost = resident.expert_slot_cost().expect("cost");
    let slots = resident.hp.n_expert / 2;
    let m = longhaul_model(&path, slots, cost, Policy::Lru, true, false);
    let n_vocab = m.hp.n_vocab as u32;
    let prompt: Vec<u32> = (0..32u32).map(|i| (i * 37 + 11) % n_vocab).collect();
    let mut kv = SeqState::new(&m, 64, GgmlType::F16).expect("kv");
    let last = kv.eval(&m, &prompt, Logits::Last).expect("prompt");
    let after_prompt = total_stats(&m);
    assert_eq!(
        after_prompt.multi_wave_batches, cost.0 as u64,
        "every MoE layer's prompt batch runs in waves"
    );
    assert_eq!(
        after_prompt.prefetch_bytes, 0,
        "a prompt in waves read ahead"
    );
    let mut t = argmax(&last);
    for _ in 0..4 {
        t = argmax(&kv.eval(&m, &[t], Logits::Last).expect("decode"));
    }
    assert!(
        total_stats(&m).prefetch_bytes > 0,
        "decode steps read nothing ahead"
    );
}

/// A synthetic MoE of 3 layers and 32 experts, `n_used` per token, written
/// to `base.gguf` in a directory of its own: the directory, the file and
/// the spec.
fn three_layers_of_32_experts(
    name: &str,
    n_used: usize,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    longhaul::synth::SynthSpec,
) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("dir");
    let spec = longhaul::synth::SynthSpec {
        n_layer: 3,
        n_expert: 32,
        n_expert_used: n_used,
        ..longhaul::synth::SynthSpec::tiny()
    };
    let base = dir.join("base.gguf");
    longhaul::synth::write(&spec, &base).expect("write");
    (dir, base, spec)
}

/// The lookahead guesses the next MoE layer's experts from the residual
/// stream under that layer's own FFN norm. Where nothing between changes the
/// stream (every attention output and expert down projection zero, no
/// shared expert), that is the next router's very input, so every guess is
/// used, whatever the norms. Here each layer's norm weighs the features
/// otherwise (3 or 0.1, in runs of 1, 2 and 3 features): guessing under
/// the guessing layer's norm gets some wrong.
#[test]
fn the_lookahead_guesses_from_the_stream_under_the_next_layers_norm() {
    let (dir, base, spec) = three_layers_of_32_experts("longhaul-lookahead-norm", 4);
    let src = gguf::Model::open(&base).expect("open");
    let mut w = Writer::new();
    for (k, v) in src.metadata().iter() {
        w.set(k, v.clone());
    }
    for t in src.tensors() {
        let mut data = src.tensor_data(t).expect("data").to_vec();
        let layer = |name: &str| -> Option<usize> {
            name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
        };
        if t.name.ends_with(".attn_output.weight") || t.name.ends_with(".ffn_down_exps.weight") {
            // Zero blocks of every type are zeros.
            data.fill(0);
        } else if t.name.ends_with(".ffn_norm.weight") {
            assert_eq!(t.ty, GgmlType::F32, "{}", t.name);
            let run = layer(&t.name).expect("layer") + 1;
            for (i, v) in data.chunks_exact_mut(4).enumerate() {
                let x: f32 = if (i / run) % 2 == 0 { 3.0 } else { 0.1 };
                v.copy_from_slice(&x.to_le_bytes());
            }
        }
        w.add_tensor(&t.name, &t.dims, t.ty, data).expect("add");
    }
    let path = dir.join("still-stream.gguf");
    w.write(&path).expect("write");
    let resident = load(&path);
    let cost = resident.expert_slot_cost().expect("cost");
    let m = longhaul_model(&path, spec.n_expert / 2, cost, Policy::Lru, true, false);
    run(&m);
    let total = total_stats(&m);
    assert!(total.prefetch_used > 0, "no guess was read and used");
    assert_eq!(
        total.prefetch_bytes,
        total.prefetch_used * spec.expert_bytes(),
        "bytes the lookahead read, against those of the {} guesses used",
        total.prefetch_used
    );
}

/// A decode step's lookahead guesses all but the last of the token's picks
/// for each MoE layer after the first (`lookahead_rank`): with 8 of 32
/// experts used, 7 per layer (the rule before it, the best three quarters,
/// guessed 6).
#[test]
fn a_decode_steps_lookahead_guesses_all_but_the_last_pick() {
    let (_, path, spec) = three_layers_of_32_experts("longhaul-lookahead-rank", 8);
    let cost = load(&path).expert_slot_cost().expect("cost");
    let m = longhaul_model(&path, spec.n_expert / 2, cost, Policy::Lru, true, false);
    let n_vocab = m.hp.n_vocab as u32;
    let mut kv = SeqState::new(&m, 64, GgmlType::F16).expect("kv");
    let mut last = kv.eval(&m, &[1, 7, 3, 5], Logits::Last).expect("prompt");
    let before = total_stats(&m).guessed;
    let steps = 5;
    for _ in 0..steps {
        let t = argmax(&last) % n_vocab;
        last = kv.eval(&m, &[t], Logits::Last).expect("decode");
    }
    let guessed = total_stats(&m).guessed - before;
    assert_eq!(guessed, steps * (spec.n_layer as u64 - 1) * 7);
}

/// `--longhaul-prefetch auto` wired into the passes: a prompt is not
/// measured; single-token steps run the warm-up with the lookahead, then
/// guess ahead exactly in the measurement's `on` blocks (every step of them:
/// what is read of the guesses depends on timing, the guesses do not); the
/// measurement ends with a choice (after its first half where one arm was
/// clearly faster), which the steps after it run; and the tokens stay the
/// resident model's.
#[test]
fn auto_lookahead_reads_ahead_only_in_its_on_blocks() {
    let path = fixture("qwen3moe-q4_k_m.gguf");
    let resident = load(&path);
    let cost = resident.expert_slot_cost().expect("cost");
    let m = longhaul_model(
        &path,
        resident.hp.n_expert / 2,
        cost,
        Policy::Lru,
        Lookahead::Auto,
        false,
    );
    let n_vocab = m.hp.n_vocab as u32;
    let prompt: Vec<u32> = (0..32u32).map(|i| (i * 37 + 11) % n_vocab).collect();
    let steps = (WARMUP + BLOCK * ORDER.len() as u32) as usize;
    let greedy = |m: &Model<CpuBackend>, mut each: Box<dyn FnMut(usize) + '_>| {
        let mut kv = SeqState::new(m, 32 + steps + 1, GgmlType::F16).expect("kv");
        let mut t = argmax(&kv.eval(m, &prompt, Logits::Last).expect("prompt"));
        let mut tokens = vec![t];
        for i in 0..steps {
            t = argmax(&kv.eval(m, &[t], Logits::Last).expect("decode"));
            tokens.push(t);
            each(i);
        }
        tokens
    };
    let want = greedy(&resident, Box::new(|_| {}));
    let mut ahead = Vec::new();
    let mut choices = Vec::new();
    let mut before = 0;
    let got = greedy(
        &m,
        Box::new(|_| {
            let now = total_stats(&m).guessed;
            ahead.push(now - before);
            before = now;
            choices.push(m.lookahead_choice());
        }),
    );
    assert_eq!(got, want, "auto's tokens differ from resident");
    let order: Vec<bool> = std::iter::repeat_n(true, WARMUP as usize)
        .chain(
            ORDER
                .iter()
                .flat_map(|&on| std::iter::repeat_n(on, BLOCK as usize)),
        )
        .collect();
    // The order's arms until a choice is made (after its first half where
    // one arm was clearly faster, else after all of it), then the choice.
    let decided = choices.iter().position(Option::is_some).expect("a choice");
    let half = (WARMUP + BLOCK * ORDER.len() as u32 / 2) as usize - 1;
    assert!(
        decided == half || decided == steps - 1,
        "decided after step {decided}"
    );
    let chosen = choices[decided].expect("a choice").on;
    let expected: Vec<bool> = (0..steps)
        .map(|i| if i > decided { chosen } else { order[i] })
        .collect();
    // Every MoE layer but the first is guessed for, all but the last of the
    // one token's picks where it has more than two (`lookahead_rank`).
    let k = m.hp.n_expert_used;
    let per_step = (cost.0 - 1) as u64 * if k <= 2 { k } else { k - 1 } as u64;
    assert!(per_step > 0);
    for (i, (&guessed, &on)) in ahead.iter().zip(&expected).enumerate() {
        let want = if on { per_step } else { 0 };
        assert_eq!(guessed, want, "step {i} (lookahead {on}): experts guessed");
    }
    let c = m.lookahead_choice().expect("a measurement ended");
    assert_eq!(c.rounds, 1);
    assert!(c.with > std::time::Duration::ZERO && c.without > std::time::Duration::ZERO);
}
