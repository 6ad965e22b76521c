//! Batched decoding, as llama.cpp's `llama-batched-bench`, on divan: `npl`
//! sequences each evaluate a prompt (`prompt`), then decode together, one
//! token per sequence per forward pass (`decode`, the server's continuous
//! batching without HTTP). Both report tokens per second per `npl`; the
//! `decode` rows divided by its `npl = 1` row are the batching gain.
//! `cargo bench --bench batched` (`LONGHAUL_BENCH_MODEL=path.gguf`, default
//! SmolLM2-135M-Instruct Q4_1 from ~/.cache/longhaul/models;
//! `LONGHAUL_BENCH_TG=64` decode steps, `RAYON_NUM_THREADS=2`).

use std::path::PathBuf;
use std::sync::OnceLock;

use divan::counter::ItemsCount;
use divan::Bencher;
use longhaul::backend::cpu::CpuBackend;
use longhaul::engine::{Engine, EngineParams};
use longhaul::sample::{Sampler, SamplerParams};
use longhaul::state::SeqState;
use longhaul::tensor::GgmlType;
use rayon::prelude::*;

type Kv = SeqState<CpuBackend>;

/// The greedy pick, as the server makes it (every sequence's in parallel).
fn argmax(v: &[f32]) -> u32 {
    Sampler::new(SamplerParams::greedy()).sample(v, &[])
}

fn main() {
    longhaul::alloc::keep_freed_buffers();
    if engine().is_none() {
        return;
    }
    divan::main();
}

/// The model, loaded once; `None` (with the reason printed) when it cannot be.
fn engine() -> Option<&'static Engine<CpuBackend>> {
    static ENGINE: OnceLock<Option<Engine<CpuBackend>>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let path = std::env::var_os("LONGHAUL_BENCH_MODEL")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    let home = std::env::var_os("HOME").unwrap_or_default();
                    PathBuf::from(home)
                        .join(".cache/longhaul/models/smollm2-135m-instruct-q4_1.gguf")
                });
            let params = EngineParams {
                n_ctx: 512,
                n_ubatch: 512,
                kv_type: GgmlType::F16,
                longhaul: None,
                no_mmap: false,
                ..Default::default()
            };
            Engine::load(&path, CpuBackend::new(), params)
                .map_err(|e| {
                    eprintln!(
                        "cannot load {}: {e} (set LONGHAUL_BENCH_MODEL)",
                        path.display()
                    )
                })
                .ok()
        })
        .as_ref()
}

/// Ops fork and join from a pool worker, as `longhaul bench` and the
/// server run them (an outside thread pays a hand-over per op).
fn pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .build()
            .expect("a rayon pool")
    })
}

fn prompt_tokens(e: &Engine<CpuBackend>, npl: usize) -> Vec<Vec<u32>> {
    (0..npl)
        .map(|i| {
            e.tokenize(&format!("Write a long story about a robot number {i}."))
                .unwrap()
        })
        .collect()
}

/// Every sequence's prompt into a fresh cache; the caches and each
/// sequence's first generated token.
fn prefill(e: &Engine<CpuBackend>, prompts: &[Vec<u32>]) -> (Vec<Kv>, Vec<u32>) {
    let mut kvs: Vec<Kv> = prompts.iter().map(|_| e.new_kv().unwrap()).collect();
    let next = kvs
        .iter_mut()
        .zip(prompts)
        .map(|(kv, p)| argmax(&e.eval(kv, p, longhaul::model::Logits::Last).unwrap()))
        .collect();
    (kvs, next)
}

#[divan::bench(args = [1, 2, 4, 8], sample_count = 3, sample_size = 1)]
fn prompt(b: Bencher, npl: usize) {
    let Some(e) = engine() else { return };
    let prompts = prompt_tokens(e, npl);
    let n_pp: usize = prompts.iter().map(Vec::len).sum();
    b.counter(ItemsCount::new(n_pp))
        .bench_local(|| pool().install(|| prefill(e, &prompts)));
}

#[divan::bench(args = [1, 2, 4, 8], sample_count = 3, sample_size = 1)]
fn decode(b: Bencher, npl: usize) {
    let Some(e) = engine() else { return };
    let n_tg: usize = std::env::var("LONGHAUL_BENCH_TG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let prompts = prompt_tokens(e, npl);
    b.counter(ItemsCount::new(npl * n_tg))
        .with_inputs(|| pool().install(|| prefill(e, &prompts)))
        .bench_local_values(|(mut kvs, mut next)| {
            pool().install(|| {
                for _ in 0..n_tg {
                    let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
                    let refs: Vec<&[u32]> = toks.iter().map(|t| &t[..]).collect();
                    let mut kv_refs: Vec<&mut Kv> = kvs.iter_mut().collect();
                    let out = SeqState::eval_multi(&e.model, &mut kv_refs, &refs).unwrap();
                    next = (0..out.len())
                        .into_par_iter()
                        .map(|i| argmax(out.seq(i)))
                        .collect();
                }
            });
            kvs
        });
}
