//! Fuzzes the whole load path on mutated tiny models: the input is written to
//! a file (or two shards of a split model), opened with `gguf::Model::open`,
//! loaded (hyperparameters, tensor table checks) for inspection, resident and
//! in longhaul mode, given a tokenizer and chat template from its metadata,
//! and run for a few tokens in both modes.
//!
//! Any `Ok` or typed error is fine. A panic, an abort, a huge allocation or
//! a hang is a finding, and so is longhaul output that differs from resident
//! output when both succeed (the design says they are equal bit for bit).
//!
//! Input: a GGUF file, or a split model as
//! `b"SPLT" ++ u32 LE length of shard 1 ++ shard 1 ++ shard 2`. The last
//! byte of the input (tensor data or padding in a valid file) picks the
//! longhaul settings: slots per layer (1 or 2), policy, prefetch, KV type,
//! expert checksums (`--longhaul-verify`). With one I/O thread
//! (`LONGHAUL_IO_THREADS=1`) and a one-thread compute pool.
//! `LONGHAUL_FUZZ_VERBOSE=1` prints how far each input got.
//! Seeds come from `cargo run --example fuzz_seeds`; run it with
//! `tools/fuzz.sh load_path SECONDS`.

#![no_main]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use longhaul::backend::cpu::CpuBackend;
use longhaul::gguf;
use longhaul::state::SeqState;
use longhaul::longhaul::{LonghaulConfig, Policy};
use longhaul::model::{Logits, Model};
use longhaul::tensor::GgmlType;
use longhaul::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

/// Positions of each KV cache: enough for the prompt and the decode steps.
const N_CTX: usize = 32;
/// Greedy decode steps after the prompt (of at most `N_PROMPT` tokens).
const N_DECODE: usize = 1;
const N_PROMPT: usize = 2;
const SPLIT_MAGIC: &[u8; 4] = b"SPLT";

/// Whether to print each stage's result (`LONGHAUL_FUZZ_VERBOSE=1`).
fn verbose() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var_os("LONGHAUL_FUZZ_VERBOSE").is_some_and(|v| v != "0"))
}

/// The value of a stage, printed in verbose mode; `None` for an error.
fn stage<T, E: std::fmt::Display>(what: &str, r: Result<T, E>) -> Option<T> {
    match r {
        Ok(v) => {
            if verbose() {
                eprintln!("{what}: ok {:?}", START.with(|s| s.get().elapsed()));
            }
            Some(v)
        }
        Err(e) => {
            if verbose() {
                eprintln!("{what}: {e}");
            }
            None
        }
    }
}

thread_local! {
    static START: std::cell::Cell<std::time::Instant> = std::cell::Cell::new(std::time::Instant::now());
}

/// A directory of this process for the model files (tools/fuzz.sh points
/// TMPDIR at tmpfs).
fn work_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("longhaul-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create the fuzz work directory");
        d
    })
}

/// Writes the input as model file(s) and returns the path to open.
fn write_model(data: &[u8]) -> PathBuf {
    let dir = work_dir();
    let split = data.strip_prefix(SPLIT_MAGIC).and_then(|rest| {
        let (len, rest) = rest.split_first_chunk::<4>()?;
        let n = (u32::from_le_bytes(*len) as usize).min(rest.len());
        Some(rest.split_at(n))
    });
    match split {
        Some((first, second)) => {
            let p = dir.join("m-00001-of-00002.gguf");
            std::fs::write(&p, first).expect("write shard 1");
            std::fs::write(dir.join("m-00002-of-00002.gguf"), second).expect("write shard 2");
            p
        }
        None => {
            let p = dir.join("model.gguf");
            std::fs::write(&p, data).expect("write the model");
            p
        }
    }
}

/// Longhaul settings and KV type chosen by one byte of the input.
struct Knobs {
    slots: u64,
    policy: Policy,
    prefetch: bool,
    verify: bool,
    kv: GgmlType,
}

impl Knobs {
    fn from_byte(k: u8) -> Self {
        Self {
            slots: 1 + (k & 1) as u64,
            policy: if k & 2 == 0 { Policy::Lru } else { Policy::Lfu },
            prefetch: k & 4 != 0,
            verify: k & 16 != 0,
            kv: if k & 8 == 0 {
                GgmlType::F16
            } else {
                GgmlType::F32
            },
        }
    }
}

/// The prompt, then `N_DECODE` greedy steps: every logit row and the tokens.
fn generate(
    what: &str,
    m: &Model<CpuBackend>,
    prompt: &[u32],
    kv_type: GgmlType,
) -> Option<(Vec<u32>, Vec<u32>)> {
    let mut kv = stage(what, SeqState::new(m, N_CTX, kv_type))?;
    let mut logits = stage(what, kv.eval(m, prompt, Logits::Last))?;
    let mut bits: Vec<u32> = logits.iter().map(|x| x.to_bits()).collect();
    let mut tokens = Vec::new();
    for _ in 0..N_DECODE {
        // Greedy, NaN-tolerant: the first maximum under total order.
        let t = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
            .map_or(0, |(i, _)| i as u32);
        tokens.push(t);
        logits = stage(what, kv.eval(m, &[t], Logits::Last))?;
        bits.extend(logits.iter().map(|x| x.to_bits()));
    }
    Some((bits, tokens))
}

/// [`text_side`], remembered for the last few distinct `tokenizer.*`
/// metadata: building a byte-level BPE tokenizer (its pre-tokenizer
/// regexes) takes most of an execution, and most inputs differ from their
/// parent elsewhere. Every distinct tokenizer metadata still runs once; a
/// cached result is what that run returned (the functions are pure).
fn text_side_cached(md: &gguf::Metadata) -> Option<Vec<u32>> {
    const KEEP: usize = 32;
    static CACHE: Mutex<Vec<(u64, Option<Vec<u32>>)>> = Mutex::new(Vec::new());
    let mut h = DefaultHasher::new();
    for (k, v) in md.iter().filter(|(k, _)| k.starts_with("tokenizer.")) {
        k.hash(&mut h);
        format!("{v:?}").hash(&mut h);
    }
    let key = h.finish();
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = cache.iter().position(|(k, _)| *k == key) {
        let hit = cache.remove(i);
        let ids = hit.1.clone();
        cache.push(hit);
        return ids;
    }
    drop(cache);
    let ids = text_side(md);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() == KEEP {
        cache.remove(0);
    }
    cache.push((key, ids.clone()));
    ids
}

/// The tokenizer and chat template from the metadata, exercised on a short
/// conversation; returns the prompt ids to run.
fn text_side(md: &gguf::Metadata) -> Option<Vec<u32>> {
    let tok = stage("tokenizer", Tokenizer::from_metadata(md));
    if let Some(Some(t)) = stage("chat template", ChatTemplate::from_metadata(md)) {
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ];
        if let (Some(text), Some(tok)) = (stage("render", t.render(&msgs, true)), &tok) {
            if let Some(ids) = stage("encode chat", tok.encode(&text, true, true)) {
                let _ = tok.decode(&ids);
            }
        }
    }
    let tok = tok?;
    let ids = stage("encode", tok.encode("Hi!", true, false))?;
    let _ = tok.decode_with(&ids, true);
    (!ids.is_empty()).then(|| ids.into_iter().take(N_PROMPT).collect())
}

fuzz_target!(|data: &[u8]| {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    let pool = POOL.get_or_init(|| {
        // One core per fuzzing process (the machine is shared): compute in
        // a one-thread pool, which runs parallel loops inline, and read
        // experts with one I/O thread.
        std::env::set_var("LONGHAUL_IO_THREADS", "1");
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a rayon pool of one thread")
    });
    pool.install(|| run(data));
});

fn run(data: &[u8]) {
    START.with(|s| s.set(std::time::Instant::now()));
    let knobs = Knobs::from_byte(data.last().copied().unwrap_or(0));
    let path = write_model(data);
    let Some(file) = stage("open", gguf::Model::open(&path)) else {
        return;
    };
    let file = Arc::new(file);
    let prompt = text_side_cached(file.metadata()).unwrap_or_else(|| vec![0, 1]);

    // Shapes only (what `inspect` and longhaul sizing use).
    let cost = stage(
        "shapes",
        Model::load_shapes(CpuBackend::new(), file.clone()),
    )
    .and_then(|m| stage("slot cost", m.expert_slot_cost()));

    let resident = stage(
        "resident load",
        Model::load(CpuBackend::new(), file.clone()),
    )
    .and_then(|m| generate("resident decode", &m, &prompt, knobs.kv));

    let Some((layers, bytes)) = cost else {
        return;
    };
    let cfg = LonghaulConfig {
        budget_bytes: knobs
            .slots
            .saturating_mul(layers as u64)
            .saturating_mul(bytes),
        policy: knobs.policy,
        prefetch: knobs.prefetch.into(),
        verify: knobs.verify,
        direct_io: true,
        uring: false,
    };
    let streamed = stage(
        "longhaul load",
        Model::load_with(CpuBackend::new(), file, Some(cfg)),
    )
    .and_then(|m| generate("longhaul decode", &m, &prompt, knobs.kv));
    if let (Some(r), Some(s)) = (&resident, &streamed) {
        assert_eq!(r.1, s.1, "longhaul tokens differ from resident tokens");
        assert!(r.0 == s.0, "longhaul logits differ from resident logits");
    }
}
