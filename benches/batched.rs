//! Batched decoding, as llama.cpp's `llama-batched-bench`: `npl` sequences
//! each evaluate a prompt, then decode together, one token per sequence per
//! forward pass (the server's continuous batching without HTTP). Prints the
//! aggregate generation speed per `npl` and its ratio to one sequence:
//! `cargo bench --bench batched` (`LONGHAUL_BENCH_MODEL=path.gguf`, default
//! SmolLM2-135M-Instruct Q4_1 from ~/.cache/longhaul/models;
//! `LONGHAUL_BENCH_NPL=1,2,4,8`, `LONGHAUL_BENCH_TG=64`, `RAYON_NUM_THREADS=2`).

use std::path::PathBuf;
use std::time::Instant;

use longhaul::backend::cpu::CpuBackend;
use longhaul::engine::{Engine, EngineParams};
use longhaul::kv::KvCache;
use longhaul::sample::{Sampler, SamplerParams};
use longhaul::tensor::GgmlType;
use rayon::prelude::*;

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// The greedy pick, as the server makes it (every sequence's in parallel).
fn argmax(v: &[f32]) -> u32 {
    Sampler::new(SamplerParams::greedy()).sample(v, &[])
}

fn main() {
    longhaul::alloc::keep_freed_buffers();
    // Ops fork and join from a pool worker, as `longhaul bench` and the
    // server run them (an outside thread pays a hand-over per op).
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .expect("a rayon pool");
    pool.install(run);
}

fn run() {
    let path = std::env::var_os("LONGHAUL_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/longhaul/models/smollm2-135m-instruct-q4_1.gguf")
        });
    let params = EngineParams {
        n_ctx: 512,
        n_ubatch: 512,
        kv_type: GgmlType::F16,
        longhaul: None,
        no_mmap: false,
        ..Default::default()
    };
    let engine = match Engine::load(&path, CpuBackend::new(), params) {
        Ok(e) => e,
        Err(e) => {
            eprintln!(
                "cannot load {}: {e} (set LONGHAUL_BENCH_MODEL)",
                path.display()
            );
            return;
        }
    };
    let n_tg = env_list("LONGHAUL_BENCH_TG", "64")[0];
    let reps = 3;
    println!("| npl | pp t/s | tg t/s | tg ratio to npl=1 |");
    println!("| ---: | ---: | ---: | ---: |");
    let mut base = None;
    for npl in env_list("LONGHAUL_BENCH_NPL", "1,2,4,8") {
        let (mut best_pp, mut best_tg) = (0f64, 0f64);
        for _ in 0..reps {
            let mut kvs: Vec<KvCache<_>> = (0..npl).map(|_| engine.new_kv().unwrap()).collect();
            let mut next = Vec::new();
            let t0 = Instant::now();
            let mut n_pp = 0;
            for (i, kv) in kvs.iter_mut().enumerate() {
                let prompt = engine
                    .tokenize(&format!("Write a long story about a robot number {i}."))
                    .unwrap();
                n_pp += prompt.len();
                let l = engine
                    .eval(kv, &prompt, longhaul::model::Logits::Last)
                    .unwrap();
                next.push(argmax(&l));
            }
            best_pp = best_pp.max(n_pp as f64 / t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            for _ in 0..n_tg {
                let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
                let refs: Vec<&[u32]> = toks.iter().map(|t| &t[..]).collect();
                let mut kv_refs: Vec<&mut KvCache<_>> = kvs.iter_mut().collect();
                let out = KvCache::eval_multi(&engine.model, &mut kv_refs, &refs).unwrap();
                next = (0..out.len())
                    .into_par_iter()
                    .map(|i| argmax(out.seq(i)))
                    .collect();
            }
            best_tg = best_tg.max((npl * n_tg) as f64 / t0.elapsed().as_secs_f64());
        }
        let b = *base.get_or_insert(best_tg);
        println!(
            "| {npl} | {best_pp:.1} | {best_tg:.1} | {:.2} |",
            best_tg / b
        );
    }
}
