//! `longhaul serve` / `longhaul-server` flags, named as llama-server names
//! them. The model, placement, context, sampling and longhaul flags are
//! defined here once and re-exported by the CLI, so `run`, `chat`, `bench`
//! and `serve` spell them the same.

use clap::Args;
use longhaul::engine::{CacheBudget, EngineParams, LonghaulParams};
use longhaul::longhaul::Policy;
use longhaul::placement::{self, Placed};
use longhaul::sample::SamplerParams;
use longhaul::tensor::GgmlType;

/// llama.cpp's multi-letter short flags (`-np`, `-ngl`, ...) rewritten to
/// their long forms, since clap takes one-letter shorts only.
pub fn normalize_args(args: impl Iterator<Item = String>) -> Vec<String> {
    rewrite_short_flags(
        args,
        &[
            ("-np", "--parallel"),
            ("-ngl", "--n-gpu-layers"),
            ("-dev", "--device"),
            ("-ub", "--ubatch-size"),
            ("-ctk", "--cache-type-k"),
            ("-ctv", "--cache-type-v"),
        ],
    )
}

/// Rewrites each `short` (alone or as `short=value`) of `table` to its long form.
pub fn rewrite_short_flags(
    args: impl Iterator<Item = String>,
    table: &[(&str, &str)],
) -> Vec<String> {
    args.map(|a| {
        for &(short, long) in table {
            if a == short {
                return long.to_string();
            }
            if let Some(rest) = a.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                return format!("{long}={rest}");
            }
        }
        a
    })
    .collect()
}

/// Everything `longhaul serve` takes.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    /// Address to listen on.
    #[arg(long = "host", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 = any free port).
    #[arg(long = "port", default_value_t = 8080)]
    pub port: u16,
    /// Parallel slots (-np): sequences generated together by continuous batching.
    #[arg(long = "parallel", default_value_t = 1)]
    pub parallel: usize,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long = "api-key", env = "LLAMA_API_KEY")]
    pub api_key: Option<String>,
    /// Model name reported by /v1/models (default: the file name).
    #[arg(short = 'a', long = "alias")]
    pub alias: Option<String>,
    /// Largest request body in bytes (larger ones get 413).
    #[arg(long = "body-limit", default_value_t = 16 << 20)]
    pub body_limit: usize,
    /// Seconds in-flight generations may take to finish after SIGINT/SIGTERM
    /// before they are cancelled.
    #[arg(long = "shutdown-timeout", default_value_t = 10.0)]
    pub shutdown_timeout: f64,
    /// Do not log each request on stderr.
    #[arg(long = "quiet")]
    pub quiet: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model path (a GGUF file, or the first shard of a split model).
    #[arg(short = 'm', long = "model")]
    pub model: std::path::PathBuf,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context size; 0 = the model's training context.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: usize,
    /// Logical batch size (accepted for llama.cpp compatibility; prompts are split by --ubatch-size).
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch_size: usize,
    /// Physical batch size for prompt processing (-ub).
    #[arg(long = "ubatch-size", default_value_t = 512)]
    pub ubatch_size: usize,
    /// KV cache type for K (-ctk): f16 or f32.
    #[arg(long = "cache-type-k", default_value = "f16")]
    pub cache_type_k: String,
    /// KV cache type for V (-ctv): must equal -ctk.
    #[arg(long = "cache-type-v", default_value = "f16")]
    pub cache_type_v: String,
    /// Read the weights into memory instead of memory-mapping the file.
    #[arg(long = "no-mmap")]
    pub no_mmap: bool,
    #[command(flatten)]
    pub placement: PlacementArgs,
    #[command(flatten)]
    pub longhaul: LonghaulArgs,
}

/// Where the repeating layers run: all on the CPU or all on one GPU.
#[derive(Args, Debug, Clone)]
pub struct PlacementArgs {
    /// Repeating layers on the GPU (-ngl): auto (a GPU when one is found,
    /// else the CPU), 0 (CPU), all or 99 (GPU); nothing in between.
    #[arg(
        long = "n-gpu-layers",
        value_name = "auto|0|all|N",
        default_value = "auto",
        allow_hyphen_values = true
    )]
    pub n_gpu_layers: String,
    /// GPU adapter by name (-dev; substring, case-insensitive; `none` = the
    /// CPU; also LONGHAUL_DEVICE). `longhaul devices` lists them.
    #[arg(long = "device", value_name = "NAME")]
    pub device: Option<String>,
}

impl PlacementArgs {
    /// Resolves the placement for the model at `path` (reads its header,
    /// opens the GPU when one is chosen; no weight is read).
    pub fn resolve(&self, path: &std::path::Path) -> anyhow::Result<Placed> {
        Ok(placement::resolve(
            path,
            &self.n_gpu_layers,
            self.device.as_deref(),
        )?)
    }
}

/// Streaming of routed experts.
#[derive(Args, Debug, Clone, Default)]
pub struct LonghaulArgs {
    /// Stream routed experts from the file into a fixed-budget cache.
    #[arg(long = "longhaul")]
    pub longhaul: bool,
    /// Expert cache budget in GiB (counts only expert slots), or `auto`.
    #[arg(
        long = "longhaul-cache",
        value_name = "GIB|auto",
        allow_hyphen_values = true
    )]
    pub cache: Option<String>,
    /// Eviction policy: lru (default) or lfu.
    #[arg(long = "longhaul-policy", default_value = "lru")]
    pub policy: String,
    /// Lookahead prefetch: while layer L computes, read the experts layer
    /// L+1's router picks from layer L's input.
    #[arg(long = "longhaul-prefetch")]
    pub prefetch: bool,
    /// Checksum each expert slice when first read and compare every later
    /// read of it: a model file rewritten in place is refused at the first
    /// expert whose bytes differ (costs a CRC-32 per read).
    #[arg(long = "longhaul-verify")]
    pub verify: bool,
}

impl LonghaulArgs {
    pub fn params(&self) -> anyhow::Result<Option<LonghaulParams>> {
        if !self.longhaul {
            if self.cache.is_some() {
                anyhow::bail!("--longhaul-cache only applies with --longhaul");
            }
            return Ok(None);
        }
        let budget = match self.cache.as_deref() {
            None => anyhow::bail!("--longhaul needs --longhaul-cache GIB (the expert cache budget, e.g. 8) or --longhaul-cache auto"),
            Some("auto") => CacheBudget::Auto,
            Some(v) => match v.parse::<f64>() {
                Ok(g) if g > 0.0 && g.is_finite() => CacheBudget::Bytes((g * (1u64 << 30) as f64) as u64),
                _ => anyhow::bail!("--longhaul-cache {v}: give a positive number of GiB (e.g. 4 or 0.5) or auto"),
            },
        };
        let policy: Policy = self.policy.parse().map_err(anyhow::Error::msg)?;
        Ok(Some(LonghaulParams {
            budget,
            policy,
            prefetch: self.prefetch,
            verify: self.verify,
        }))
    }
}

impl ModelArgs {
    pub fn engine_params(&self) -> anyhow::Result<EngineParams> {
        let kv = |s: &str| -> anyhow::Result<GgmlType> {
            match GgmlType::from_name(s) {
                Some(t @ (GgmlType::F16 | GgmlType::F32)) => Ok(t),
                _ => anyhow::bail!("cache type `{s}` is not supported; use f16 (default) or f32"),
            }
        };
        let k = kv(&self.cache_type_k)?;
        if kv(&self.cache_type_v)? != k {
            anyhow::bail!(
                "-ctk and -ctv must be the same type (got {} and {})",
                self.cache_type_k,
                self.cache_type_v
            );
        }
        Ok(EngineParams {
            n_ctx: self.ctx_size,
            n_ubatch: self.ubatch_size.max(1),
            kv_type: k,
            longhaul: self.longhaul.params()?,
            no_mmap: self.no_mmap,
        })
    }

    /// Runs `f` on a rayon pool with the requested thread count.
    pub fn with_threads<T: Send>(&self, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        let n = self.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build()?;
        Ok(pool.install(f))
    }
}

#[derive(Args, Debug, Clone)]
pub struct SampleArgs {
    /// Temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: i32,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: i32,
    /// RNG seed (-1 or absent = random).
    #[arg(short = 's', long = "seed", allow_negative_numbers = true)]
    pub seed: Option<i64>,
}

impl SampleArgs {
    pub fn params(&self) -> SamplerParams {
        SamplerParams {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed.filter(|&s| s >= 0).map(|s| s as u64),
        }
    }
}

/// The standalone binary's command line.
#[derive(clap::Parser, Debug)]
#[command(
    name = "longhaul-server",
    version,
    about = "Serve a GGUF model over HTTP (OpenAI- and llama.cpp-compatible API)"
)]
pub struct Cli {
    #[command(flatten)]
    pub serve: ServeArgs,
}
