//! `longhaul bench`: llama-bench's tests (`ppN`: a prompt of N tokens in one
//! go; `tgN`: N single-token decode steps) and its markdown table.

use std::time::Instant;

use clap::Args;
use longhaul::backend::cpu::CpuBackend;
use longhaul::engine::{Engine, EngineParams};
use longhaul::longhaul::CacheStats;
use longhaul::model::Logits;
use longhaul::tensor::GgmlType;

#[derive(Args)]
pub struct BenchArgs {
    #[arg(short = 'm', long = "model")]
    pub model: std::path::PathBuf,
    /// Prompt sizes (comma-separated); 0 disables.
    #[arg(
        short = 'p',
        long = "n-prompt",
        default_value = "512",
        value_delimiter = ','
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths (comma-separated); 0 disables.
    #[arg(
        short = 'n',
        long = "n-gen",
        default_value = "128",
        value_delimiter = ','
    )]
    pub n_gen: Vec<usize>,
    /// Thread counts (comma-separated).
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    pub threads: Vec<usize>,
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    #[arg(long = "ubatch-size", default_value_t = 512)]
    pub ubatch: usize,
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    #[command(flatten)]
    pub longhaul: crate::args::LonghaulArgs,
    /// Output format: md or json.
    #[arg(short = 'o', long = "output", default_value = "md")]
    pub output: String,
}

fn diff(a: &CacheStats, b: &CacheStats) -> CacheStats {
    CacheStats {
        hits: a.hits - b.hits,
        misses: a.misses - b.misses,
        bytes_read: a.bytes_read - b.bytes_read,
        io_time: a.io_time.saturating_sub(b.io_time),
        waves: a.waves - b.waves,
        multi_wave_batches: a.multi_wave_batches - b.multi_wave_batches,
        prefetched: a.prefetched - b.prefetched,
        prefetch_bytes: a.prefetch_bytes - b.prefetch_bytes,
        prefetch_used: a.prefetch_used - b.prefetch_used,
        prefetch_wanted: a.prefetch_wanted - b.prefetch_wanted,
    }
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

pub fn bench(a: BenchArgs) -> anyhow::Result<()> {
    let threads = if a.threads.is_empty() {
        vec![std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)]
    } else {
        a.threads.clone()
    };
    let n_ctx = a
        .n_prompt
        .iter()
        .chain(&a.n_gen)
        .copied()
        .max()
        .unwrap_or(1)
        .max(1);
    let params = EngineParams {
        n_ctx,
        n_ubatch: a.ubatch.max(1),
        kv_type: GgmlType::F16,
        longhaul: a.longhaul.params()?,
    };
    // Longhaul skips warmup: no expert byte is read before the first real run.
    let warmup = !a.no_warmup && params.longhaul.is_none();
    let engine = Engine::load(&a.model, CpuBackend::new(), params)?;
    let file = &engine.model.file;
    let size: u64 = file.total_tensor_bytes();
    let n_params: u64 = file
        .tensors()
        .iter()
        .map(|t| t.dims.iter().product::<u64>())
        .sum();
    let ftype = file
        .metadata()
        .get_u64("general.file_type")
        .ok()
        .map(|f| format!("ftype {f}"))
        .unwrap_or_default();
    let desc = format!(
        "{} {:.1}M {}",
        engine.model.hp.arch,
        n_params as f64 / 1e6,
        ftype
    );
    let n_vocab = engine.model.hp.n_vocab as u32;
    let mut rows = Vec::new();
    let mut last_cache: Option<CacheStats> = None;
    for &t in &threads {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build()?;
        let tests: Vec<(String, usize, bool)> = a
            .n_prompt
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| (format!("pp{n}"), n, true))
            .chain(
                a.n_gen
                    .iter()
                    .filter(|&&n| n > 0)
                    .map(|&n| (format!("tg{n}"), n, false)),
            )
            .collect();
        for (name, n, is_pp) in tests {
            let samples = pool.install(|| -> anyhow::Result<Vec<f64>> {
                // Deterministic pseudo-random tokens, like llama-bench's.
                let toks: Vec<u32> = (0..n as u32)
                    .map(|i| (i.wrapping_mul(2654435761) >> 7) % n_vocab)
                    .collect();
                let run_once = || -> anyhow::Result<f64> {
                    let mut kv = engine.new_kv()?;
                    let t0 = Instant::now();
                    if is_pp {
                        engine.eval(&mut kv, &toks, Logits::Last)?;
                    } else {
                        for &tk in &toks {
                            engine.eval(&mut kv, &[tk], Logits::Last)?;
                        }
                    }
                    Ok(n as f64 / t0.elapsed().as_secs_f64())
                };
                if warmup {
                    run_once()?;
                }
                (0..a.reps.max(1)).map(|_| run_once()).collect()
            })?;
            let cache = engine.longhaul_stats().map(|(total, _)| total);
            let delta = match (cache, last_cache) {
                (Some(c), Some(prev)) => Some(diff(&c, &prev)),
                (c, _) => c,
            };
            last_cache = cache;
            rows.push((t, name, samples, delta));
        }
    }
    let lh = engine.longhaul.is_some();
    if a.output == "json" {
        let arr: Vec<serde_json::Value> = rows
            .iter()
            .map(|(t, name, s, c)| {
                let (m, sd) = mean_sd(s);
                let mut v = serde_json::json!({"model_filename": a.model.display().to_string(), "model_type": desc, "model_size": size, "model_n_params": n_params, "backends": "CPU", "n_threads": t, "test": name, "avg_ts": m, "stddev_ts": sd, "samples_ts": s});
                if let Some(c) = c {
                    v["longhaul_hit_rate"] = serde_json::json!(c.hit_rate());
                    v["longhaul_bytes_read"] = serde_json::json!(c.bytes_read);
                    v["longhaul_prefetch_precision"] = serde_json::json!(c.prefetch_precision());
                    v["longhaul_prefetch_recall"] = serde_json::json!(c.prefetch_recall());
                }
                v
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&arr)?);
        return Ok(());
    }
    let extra_h = if lh { " hit rate | expert GB |" } else { "" };
    let extra_s = if lh { " -------: | --------: |" } else { "" };
    println!("| model                          |       size |     params | backend    | threads |            test |                  t/s |{extra_h}");
    println!("| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |{extra_s}");
    for (t, name, s, c) in rows {
        let (m, sd) = mean_sd(&s);
        let extra = match c {
            Some(c) if lh => format!(
                " {:>7.1}% | {:>9.3} |",
                100.0 * c.hit_rate(),
                c.bytes_read as f64 / 1e9
            ),
            _ => String::new(),
        };
        println!(
            "| {:<30} | {:>6.2} MiB | {:>8.2} M | {:<10} | {:>7} | {:>15} | {:>20} |{extra}",
            desc,
            size as f64 / (1 << 20) as f64,
            n_params as f64 / 1e6,
            "CPU",
            t,
            name,
            format!("{m:.2} ± {sd:.2}")
        );
    }
    Ok(())
}
