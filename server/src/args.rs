//! `longhaul serve` / `longhaul-server` flags, named as llama-server names
//! them. The model, placement, context, sampling and longhaul flags are
//! defined here once and re-exported by the CLI, so `run`, `chat`, `bench`
//! and `serve` spell them the same.

use std::path::PathBuf;

use clap::Args;
use longhaul::constrain::ConstraintSpec;
use longhaul::engine::{CacheBudget, EngineParams, LonghaulParams};
use longhaul::longhaul::Policy;
use longhaul::placement::{self, Placed};
use longhaul::sample::{SampleParamError, SamplerParams};
use longhaul::spec::{DraftParams, NgramSizes, SpecParams, SpecType};
use longhaul::tensor::GgmlType;

/// The standalone server's command line (`args` with the program name
/// first), its llama.cpp spellings and `LLAMA_ARG_*` variables applied by
/// [`crate::flags`].
pub fn server_args(args: Vec<String>) -> Result<Vec<String>, crate::flags::FlagError> {
    use clap::CommandFactory;
    let Some((program, rest)) = args.split_first() else {
        return Ok(args);
    };
    let rest = crate::flags::rewrite(
        &Cli::command(),
        "serve",
        rest,
        Some(&crate::flags::process_env),
    )?;
    Ok(std::iter::once(program.clone()).chain(rest).collect())
}

/// Everything `longhaul serve` takes.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
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
    #[arg(long = "api-key")]
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
    /// Accepted (-cb): batching is always continuous here.
    #[arg(long = "cont-batching", overrides_with = "no_cont_batching")]
    pub cont_batching: bool,
    /// Accepted (-nocb) for llama.cpp compatibility; batching stays
    /// continuous (a one-slot server, -np 1, runs one request at a time).
    #[arg(long = "no-cont-batching")]
    pub no_cont_batching: bool,
    /// Accepted: /metrics (Prometheus text) is always on here.
    #[arg(long = "metrics")]
    pub metrics: bool,
    /// Server read/write timeout in seconds (-to, llama-server's name and
    /// default): a request body that stalls, or a response the client
    /// stops taking, for this long closes the connection. 0 = none.
    #[arg(long = "timeout", value_name = "SECONDS", default_value_t = 3600.0)]
    pub timeout: f64,
    /// Seconds a client has to send a request's complete line and headers,
    /// counted from when the connection opens or its previous response
    /// ends; a slower one is disconnected. 0 = none.
    #[arg(
        long = "header-timeout",
        value_name = "SECONDS",
        default_value_t = 10.0
    )]
    pub header_timeout: f64,
    /// Seconds a keep-alive connection may sit without a request (and a
    /// new one without its first byte) before it is closed. 0 = none.
    #[arg(long = "idle-timeout", value_name = "SECONDS", default_value_t = 5.0)]
    pub idle_timeout: f64,
    /// Most open connections (default: 256, or half the open-file limit if
    /// that is lower). At the cap a new connection closes the one that has
    /// waited longest without a request in flight; if every connection has
    /// one, the new connection is closed at once.
    #[arg(long = "max-connections", value_name = "N")]
    pub max_connections: Option<usize>,
    /// Serve `GET /slots` (llama-server's default; --no-slots turns it off).
    #[arg(long = "slots", overrides_with = "no_slots")]
    pub slots: bool,
    #[arg(long = "no-slots")]
    pub no_slots: bool,
    /// Directory of the files `POST /slots/{id}?action=save|restore` write
    /// and read (created if missing); without it those actions answer 501.
    #[arg(long = "slot-save-path", value_name = "DIR")]
    pub slot_save_path: Option<PathBuf>,
    /// Save every slot's state into --slot-save-path on a clean shutdown
    /// and restore it at start-up, so the next request sharing a slot's
    /// prefix evaluates only its new tokens.
    #[arg(long = "slot-persist")]
    pub slot_persist: bool,
    /// Directory of the context cache: a slot's conversation is written
    /// here when the slot is taken for another one, and restored for a
    /// later request whose prompt starts with it (created if missing).
    #[arg(long = "context-cache-path", value_name = "DIR")]
    pub context_cache_path: Option<PathBuf>,
    /// Most conversations the context cache keeps; the least recently
    /// used are removed beyond it.
    #[arg(long = "context-cache-slots", value_name = "N", default_value_t = 16)]
    pub context_cache_slots: usize,
}

impl ServeArgs {
    /// Where sequence states go, its directories created.
    pub fn state_config(&self) -> anyhow::Result<longhaul::scheduler::StateConfig> {
        let dir = |flag: &str, d: &Option<PathBuf>| -> anyhow::Result<Option<PathBuf>> {
            let Some(d) = d else { return Ok(None) };
            std::fs::create_dir_all(d).map_err(|e| {
                anyhow::anyhow!("{flag} {}: cannot create the directory: {e}", d.display())
            })?;
            Ok(Some(d.clone()))
        };
        if self.slot_persist && self.slot_save_path.is_none() {
            anyhow::bail!("--slot-persist saves slots into --slot-save-path DIR; give that too");
        }
        if self.context_cache_slots == 0 {
            anyhow::bail!(
                "--context-cache-slots 0: give at least 1 (or leave out --context-cache-path)"
            );
        }
        Ok(longhaul::scheduler::StateConfig {
            slot_save_path: dir("--slot-save-path", &self.slot_save_path)?,
            persist: self.slot_persist,
            context_cache: dir("--context-cache-path", &self.context_cache_path)?,
            context_cache_slots: self.context_cache_slots,
        })
    }

    /// The HTTP layer's settings from these flags.
    pub fn http_config(&self) -> anyhow::Result<crate::HttpConfig> {
        let secs = |flag: &str, v: f64| -> anyhow::Result<Option<std::time::Duration>> {
            if !(v.is_finite() && v >= 0.0) {
                anyhow::bail!("{flag} {v}: give a number of seconds >= 0 (0 = no timeout)");
            }
            Ok((v > 0.0).then(|| std::time::Duration::from_secs_f64(v.min(1e9))))
        };
        let max_connections = match self.max_connections {
            Some(0) => anyhow::bail!("--max-connections 0: give at least 1"),
            Some(n) => n,
            None => crate::default_max_connections(),
        };
        Ok(crate::HttpConfig {
            api_key: self.api_key.clone(),
            body_limit: self.body_limit,
            log_requests: !self.quiet,
            io_timeout: secs("--timeout", self.timeout)?,
            header_timeout: secs("--header-timeout", self.header_timeout)?,
            idle_timeout: secs("--idle-timeout", self.idle_timeout)?,
            max_connections,
        })
    }
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
    /// Most checkpoints of a hybrid model's recurrent state kept per
    /// sequence (-ctxcp), which a later prompt sharing the prefix resumes
    /// from; 0: none (such a prompt is evaluated again from the start).
    #[arg(long = "ctx-checkpoints", default_value_t = longhaul::state::DEFAULT_CHECKPOINTS)]
    pub ctx_checkpoints: usize,
    /// KV cache type for K (-ctk): f16 or f32.
    #[arg(long = "cache-type-k", default_value = "f16")]
    pub cache_type_k: String,
    /// KV cache type for V (-ctv): must equal -ctk.
    #[arg(long = "cache-type-v", default_value = "f16")]
    pub cache_type_v: String,
    /// Threads for prompt batches (-tb): accepted for llama.cpp
    /// compatibility; prompts run on the -t threads.
    #[arg(long = "threads-batch", value_name = "N")]
    pub threads_batch: Option<usize>,
    /// Read the weights into memory instead of memory-mapping the file.
    #[arg(long = "no-mmap", overrides_with = "mmap")]
    pub no_mmap: bool,
    /// Memory-map the model file (the default; -mmp).
    #[arg(long = "mmap", overrides_with = "no_mmap")]
    pub mmap: bool,
    /// Lock the weights in memory (mlock) so the system does not page them
    /// out, as llama.cpp's --mlock. A lock the system refuses (RLIMIT_MEMLOCK)
    /// is a warning. Not with --longhaul, which keeps experts out of memory.
    #[arg(long = "mlock")]
    pub mlock: bool,
    /// llama.cpp's load mode (-lm): auto or mmap (the default), none (read
    /// into memory, as --no-mmap), mlock (read and locked), mmap+mlock
    /// (mapped and locked, as --mlock), dio (read into memory with direct
    /// I/O, past the page cache; buffered where the file system refuses it).
    #[arg(long = "load-mode", value_name = "MODE", value_parser = ["auto", "none", "mmap", "mlock", "mmap+mlock", "dio"])]
    pub load_mode: Option<String>,
    /// Keep the weights in the GGUF layout (-nr); by default, as llama.cpp's
    /// --repack, CPU matrices with an interleaved kernel layout (Q4_0,
    /// Q8_0, IQ4_NL and MXFP4, with AVX2) are copied into it at load, and
    /// expert slots take it as they fill.
    #[arg(long = "no-repack", overrides_with = "repack")]
    pub no_repack: bool,
    /// Repack CPU weights into the kernels' layout (the default).
    #[arg(long = "repack", overrides_with = "no_repack")]
    pub repack: bool,
    /// Accepted: longhaul never downloads anything.
    #[arg(long = "offline")]
    pub offline: bool,
    /// Attention path (-fa): on, off (exact attention) or auto (llama.cpp's default).
    #[arg(
        long = "flash-attn",
        value_name = "on|off|auto",
        default_value = "auto"
    )]
    pub flash_attn: longhaul::engine::FlashAttn,
    /// A Jinja chat template replacing the model's.
    #[arg(long = "chat-template", value_name = "JINJA")]
    pub chat_template: Option<String>,
    /// A file holding a Jinja chat template that replaces the model's.
    #[arg(
        long = "chat-template-file",
        value_name = "FILE",
        conflicts_with = "chat_template"
    )]
    pub chat_template_file: Option<std::path::PathBuf>,
    /// Accepted for llama.cpp compatibility: chat templates are always Jinja here.
    #[arg(long = "jinja")]
    pub jinja: bool,
    /// A JSON object of names given to the chat template, under each
    /// request's `chat_template_kwargs` (e.g. '{"enable_thinking": false}').
    #[arg(long = "chat-template-kwargs", value_name = "JSON")]
    pub chat_template_kwargs: Option<String>,
    /// Thinking in the chat template (`enable_thinking`): on, off, or auto
    /// (on where the template has a thinking mode, as in llama.cpp).
    #[arg(long = "reasoning", value_name = "on|off|auto", default_value = "auto")]
    pub reasoning: String,
    /// The `reasoning_effort` given to the chat template (`low`, `high` ...),
    /// or `default` to leave the template's own.
    #[arg(
        long = "reasoning-effort",
        value_name = "LEVEL",
        default_value = "default"
    )]
    pub reasoning_effort: String,
    #[command(flatten)]
    pub placement: PlacementArgs,
    #[command(flatten)]
    pub longhaul: LonghaulArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

/// llama.cpp's logging flags. longhaul's informational messages on stderr
/// (the placement, the load bar, timings) are llama.cpp's info level (3).
#[derive(Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Log everything (-v; llama.cpp's verbosity without limit).
    #[arg(long = "verbose", alias = "log-verbose")]
    pub verbose: bool,
    /// Log messages up to this level (-lv): 0 output only, 1 errors,
    /// 2 warnings, 3 information (default), 4 debug.
    #[arg(long = "verbosity", alias = "log-verbosity", value_name = "N")]
    pub verbosity: Option<i32>,
    /// No informational messages on stderr (errors still are).
    #[arg(long = "log-disable")]
    pub log_disable: bool,
}

impl LogArgs {
    /// Whether informational messages (llama.cpp's level 3) are shown.
    pub fn info(&self) -> bool {
        !self.log_disable && (self.verbose || self.verbosity.is_none_or(|v| v >= 3))
    }
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
    /// Keep the KV cache with the layers (-kvo; the default).
    #[arg(long = "kv-offload", overrides_with = "no_kv_offload")]
    pub kv_offload: bool,
    /// KV cache in host memory (-nkvo): the only choice on the CPU; with
    /// the layers on a GPU the cache is on the GPU, so this is refused there.
    #[arg(long = "no-kv-offload", overrides_with = "kv_offload")]
    pub no_kv_offload: bool,
}

impl PlacementArgs {
    /// Resolves the placement for the model at `path` (reads its header,
    /// opens the GPU when one is chosen; no weight is read).
    pub fn resolve(&self, path: &std::path::Path) -> anyhow::Result<Placed> {
        let placed = placement::resolve(path, &self.n_gpu_layers, self.device.as_deref())?;
        if self.no_kv_offload && placed.placement.is_gpu() {
            anyhow::bail!(
                "--no-kv-offload: the KV cache stays with the layers on the GPU here; use -ngl 0 to run layers and cache on the CPU"
            );
        }
        Ok(placed)
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
    /// Eviction policy: lru, lfu, or auto (the default): whichever of LRU
    /// and LFU would have missed less on each layer's recent batches, both
    /// replayed beside the cache.
    #[arg(long = "longhaul-policy", default_value = "auto")]
    pub policy: String,
    /// Lookahead prefetch: while layer L computes, read the experts layer
    /// L+1's router picks from layer L's input. on (also the bare flag),
    /// off, or auto (the default): single-token decode steps run with and
    /// without it in turn and the faster is kept, measured again every 256
    /// steps (it pays where reads make decode wait, and costs CPU where
    /// they are cheap).
    #[arg(
        long = "longhaul-prefetch",
        value_name = "on|off|auto",
        num_args = 0..=1,
        default_missing_value = "on",
        default_value = "auto"
    )]
    pub prefetch: longhaul::engine::Lookahead,
    /// Checksum each expert slice when first read and compare every later
    /// read of it: a model file rewritten in place is refused at the first
    /// expert whose bytes differ (costs a CRC-32 per read).
    #[arg(long = "longhaul-verify")]
    pub verify: bool,
    /// How experts are read: dio (direct I/O, llama.cpp's name; the
    /// default, buffered where the file system refuses it), uring (direct
    /// I/O, a decode step's reads of a layer submitted at once through
    /// io_uring; Linux, else as dio) or buffered (through the page cache,
    /// whose pages are dropped after each read).
    #[arg(
        long = "longhaul-io",
        value_name = "dio|uring|buffered",
        default_value = "dio"
    )]
    pub io: String,
}

impl LonghaulArgs {
    /// `--longhaul-io`: whether experts are read with direct I/O.
    pub fn direct_io(&self) -> anyhow::Result<bool> {
        match self.io.as_str() {
            // Empty: a `Default` value, which means the default.
            "dio" | "uring" | "" => Ok(true),
            "buffered" => Ok(false),
            v => anyhow::bail!("--longhaul-io {v}: use dio, uring or buffered"),
        }
    }

    /// `--longhaul-io uring`: whether expert reads go through io_uring.
    pub fn uring(&self) -> anyhow::Result<bool> {
        Ok(self.direct_io()? && self.io == "uring")
    }

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
        let direct_io = self.direct_io()?;
        Ok(Some(LonghaulParams {
            budget,
            policy,
            prefetch: self.prefetch,
            verify: self.verify,
            direct_io,
            uring: self.uring()?,
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
        if self.locks() && self.longhaul.longhaul {
            anyhow::bail!("--mlock locks the whole model in memory, which --longhaul exists to avoid; drop one of them");
        }
        let dio = self.load_mode.as_deref() == Some("dio");
        if dio && self.longhaul.longhaul && !self.longhaul.direct_io()? {
            anyhow::bail!("-lm dio reads the resident weights with direct I/O, but --longhaul-io buffered reads them through the page cache; drop one of them");
        }
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
            n_ctx_checkpoints: self.ctx_checkpoints,
            kv_type: k,
            longhaul: self.longhaul.params()?,
            no_mmap: self.no_mmap
                || matches!(self.load_mode.as_deref(), Some("none" | "mlock" | "dio")),
            direct_io: dio,
            no_repack: self.no_repack,
            flash_attn: self.flash_attn,
            chat_template: match (&self.chat_template, &self.chat_template_file) {
                (Some(t), _) => Some(t.clone()),
                (None, Some(f)) => {
                    Some(std::fs::read_to_string(f).map_err(|e| {
                        anyhow::anyhow!("--chat-template-file {}: {e}", f.display())
                    })?)
                }
                (None, None) => None,
            },
            template_kwargs: self.template_kwargs()?,
            // Set by the command that loads one (-md, draft-mtp).
            draft_model: None,
            mtp: false,
        })
    }

    /// The chat template's default kwargs, in llama.cpp's order:
    /// `--chat-template-kwargs`, then `--reasoning on|off` (`enable_thinking`),
    /// then `--reasoning-effort`.
    fn template_kwargs(&self) -> anyhow::Result<longhaul::tokenizer::TemplateKwargs> {
        let mut kw = match &self.chat_template_kwargs {
            None => Default::default(),
            Some(s) => match serde_json::from_str::<serde_json::Value>(s) {
                Ok(serde_json::Value::Object(m)) => m,
                Ok(_) => anyhow::bail!(
                    "--chat-template-kwargs must be a JSON object, e.g. '{{\"enable_thinking\": false}}' (got {s})"
                ),
                Err(e) => anyhow::bail!("--chat-template-kwargs is not valid JSON: {e} (got {s})"),
            },
        };
        // llama.cpp's is_truthy / is_falsey / is_autoy (common/arg.cpp).
        match self.reasoning.as_str() {
            v if crate::flags::truthy(v) => {
                kw.insert("enable_thinking".into(), true.into());
            }
            v if crate::flags::falsey(v) => {
                kw.insert("enable_thinking".into(), false.into());
            }
            "auto" | "-1" => {}
            v => anyhow::bail!("unknown value for --reasoning: '{v}' (use on, off or auto)"),
        }
        match self.reasoning_effort.as_str() {
            "default" => {
                kw.remove("reasoning_effort");
            }
            level => {
                kw.insert("reasoning_effort".into(), level.into());
            }
        }
        longhaul::tokenizer::check_kwargs(&kw)
            .map_err(|e| anyhow::anyhow!("--chat-template-kwargs: {e}"))?;
        Ok(kw)
    }

    /// The thread count: `-t` (default every available thread), capped at
    /// the machine with a warning ([`longhaul::threads::capped`]).
    pub fn n_threads(&self) -> usize {
        longhaul::threads::capped(self.threads)
    }

    /// Whether the weights are locked in memory (--mlock, -lm mlock or
    /// mmap+mlock).
    fn locks(&self) -> bool {
        self.mlock || matches!(self.load_mode.as_deref(), Some("mlock" | "mmap+mlock"))
    }

    /// `--mlock`: locks every page mapped now (the model's mapping or
    /// its copy, the KV cache) in memory, as llama.cpp's mlock does; call it
    /// after the engine loads. A lock the system refuses is a warning that
    /// says how to raise the limit, as llama.cpp's is.
    pub fn lock_memory(&self) {
        if !self.locks() {
            return;
        }
        // SAFETY: mlockall takes flags only and touches no Rust memory.
        if unsafe { libc::mlockall(libc::MCL_CURRENT) } != 0 {
            let e = std::io::Error::last_os_error();
            eprintln!(
                "warning: --mlock: cannot lock the model in memory: {e}; raise the limit with `ulimit -l unlimited` (RLIMIT_MEMLOCK) or run without --mlock"
            );
        }
    }

    /// Runs `f` on a rayon pool with [`Self::n_threads`] threads.
    pub fn with_threads<T: Send>(&self, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.n_threads())
            .build()?;
        Ok(pool.install(f))
    }
}

/// Sampling flags. Negative numbers are values here (`--top-k -1`,
/// `--repeat-last-n -1`, `--temp -1`), so that every value reaches the
/// validator the server also uses ([`SamplerParams::validate`]).
#[derive(Args, Debug, Clone)]
pub struct SampleArgs {
    /// Temperature; 0 or less = greedy.
    #[arg(
        long = "temp",
        alias = "temperature",
        default_value_t = 0.8,
        allow_negative_numbers = true
    )]
    pub temp: f32,
    /// Top-k sampling; 0 or less = off.
    #[arg(long = "top-k", default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: i32,
    /// Top-p sampling; 1 = off.
    #[arg(long = "top-p", default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Min-p sampling; 0 = off.
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Repetition penalty (> 0); 1 = off.
    #[arg(
        long = "repeat-penalty",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub repeat_penalty: f32,
    /// Recent tokens the penalty looks at; 0 = off, -1 = the whole context.
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i32,
    /// Presence penalty (llama.cpp's "repeat alpha presence penalty"):
    /// subtracted once from each token seen in the last --repeat-last-n; 0 = off.
    #[arg(
        long = "presence-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    /// Frequency penalty: subtracted per occurrence of a token in the last
    /// --repeat-last-n; 0 = off.
    #[arg(
        long = "frequency-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
    /// Adds BIAS to a token's logit, as llama.cpp spells it: `15043+1`
    /// favours token 15043, `15043-1` disfavours it, `15043-inf` bans it.
    /// Repeatable.
    #[arg(long = "logit-bias", value_name = "TOKEN_ID(+/-)BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// RNG seed (-1 or absent = random).
    #[arg(short = 's', long = "seed", allow_negative_numbers = true)]
    pub seed: Option<i64>,
    /// Never end at an end-of-generation token, as llama.cpp's
    /// `--ignore-eos`: they are banned (a `-inf` logit bias each), so the
    /// best other token is taken. With `serve`, the default of requests'
    /// `ignore_eos`.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// GBNF grammar the output must match (llama.cpp's grammar format).
    #[arg(long = "grammar", value_name = "GBNF", conflicts_with_all = ["grammar_file", "json_schema", "json_schema_file"])]
    pub grammar: Option<String>,
    /// File with the GBNF grammar.
    #[arg(long = "grammar-file", value_name = "FILE", conflicts_with_all = ["json_schema", "json_schema_file"])]
    pub grammar_file: Option<PathBuf>,
    /// JSON schema the output must match, e.g. `{}` for any JSON object.
    #[arg(
        long = "json-schema",
        value_name = "SCHEMA",
        conflicts_with = "json_schema_file"
    )]
    pub json_schema: Option<String>,
    /// File with the JSON schema.
    #[arg(long = "json-schema-file", value_name = "FILE")]
    pub json_schema_file: Option<PathBuf>,
}

/// Speculative decoding, with llama.cpp's `--spec-*` flags and defaults
/// (`common/arg.cpp`): the n-gram drafters look for the last `size-n`
/// tokens earlier in the sequence and draft up to `size-m` tokens that
/// followed them; a draft model (`-md`) proposes up to `--spec-draft-n-max`
/// tokens of its own; the target verifies them in one batch.
#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: none, ngram-simple, ngram-map-k or draft-simple
    /// (with -md; -md alone implies it).
    #[arg(long = "spec-type", default_value = "none", value_parser = parse_spec_type)]
    pub spec_type: SpecType,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub ngram: NgramArgs,
}

/// The n-gram drafters' sizes (`--spec-ngram-*`, llama.cpp's names and
/// defaults), as `run`, `chat`, `serve` and `bench` take them.
#[derive(clap::Args, Debug, Clone)]
pub struct NgramArgs {
    /// ngram-simple: length of the n-gram looked up.
    #[arg(long = "spec-ngram-simple-size-n", default_value_t = 12, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub simple_size_n: u16,
    /// ngram-simple: most tokens drafted after a match.
    #[arg(long = "spec-ngram-simple-size-m", default_value_t = 48, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub simple_size_m: u16,
    /// ngram-simple: minimum hits (accepted for llama.cpp; its ngram-simple does not read it).
    #[arg(long = "spec-ngram-simple-min-hits", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub simple_min_hits: u16,
    /// ngram-map-k: length of the n-gram looked up.
    #[arg(long = "spec-ngram-map-k-size-n", default_value_t = 12, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub map_k_size_n: u16,
    /// ngram-map-k: most tokens drafted after a match.
    #[arg(long = "spec-ngram-map-k-size-m", default_value_t = 48, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub map_k_size_m: u16,
    /// ngram-map-k: minimum hits (accepted for llama.cpp; its key-only map does not read it).
    #[arg(long = "spec-ngram-map-k-min-hits", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub map_k_min_hits: u16,
}

impl NgramArgs {
    /// The sizes of ngram-simple and of ngram-map-k.
    pub fn sizes(&self) -> (NgramSizes, NgramSizes) {
        (
            NgramSizes {
                size_n: self.simple_size_n,
                size_m: self.simple_size_m,
                min_hits: self.simple_min_hits,
            },
            NgramSizes {
                size_n: self.map_k_size_n,
                size_m: self.map_k_size_m,
                min_hits: self.map_k_min_hits,
            },
        )
    }
}

fn parse_spec_type(s: &str) -> Result<SpecType, String> {
    // llama.cpp takes a comma-separated list; longhaul runs one drafter.
    let kinds: Vec<&str> = s
        .split(',')
        .map(str::trim)
        .filter(|k| *k != "none")
        .collect();
    match kinds[..] {
        [] => Ok(SpecType::None),
        [k] => k.parse(),
        _ => Err(format!(
            "--spec-type {s}: longhaul runs one drafter at a time; pick one of them"
        )),
    }
}

/// A draft model and its sizes (`-md`, `--spec-draft-*`), as `run`, `chat`,
/// `serve` and `bench` take them.
#[derive(clap::Args, Debug, Clone)]
pub struct DraftArgs {
    /// Draft model for speculative decoding (-md): a small GGUF model with
    /// the target's vocabulary, kept resident on the target's backend.
    #[arg(long = "spec-draft-model", value_name = "FNAME")]
    pub draft_model: Option<PathBuf>,
    /// Draft model: most tokens drafted per step.
    #[arg(long = "spec-draft-n-max", default_value_t = 3, value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub draft_n_max: u16,
    /// Draft model: drafts shorter than this are dropped.
    #[arg(long = "spec-draft-n-min", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub draft_n_min: u16,
    /// Draft model: stop drafting when the best token's probability (over the
    /// draft's top 10) is below this.
    #[arg(long = "spec-draft-p-min", default_value_t = 0.0)]
    pub draft_p_min: f32,
}

impl DraftArgs {
    /// The draft sizes, checked.
    pub fn params(&self) -> anyhow::Result<DraftParams> {
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            anyhow::bail!(
                "--spec-draft-p-min {} is not a probability; give a value in [0, 1]",
                self.draft_p_min
            );
        }
        Ok(DraftParams {
            n_max: self.draft_n_max.into(),
            n_min: self.draft_n_min.into(),
            p_min: self.draft_p_min,
        })
    }
}

impl SpecArgs {
    /// The draft model `spec` (these flags' [`SpecArgs::params`]) loads
    /// beside the target, if any.
    pub fn draft_model(&self, spec: &SpecParams) -> Option<PathBuf> {
        (spec.kind == SpecType::DraftSimple)
            .then(|| self.draft.draft_model.clone())
            .flatten()
    }

    /// The settings, checked: `draft-simple` needs `-md`, a draft model needs
    /// `draft-simple` (or no `--spec-type`, which then means it).
    pub fn params(&self) -> anyhow::Result<SpecParams> {
        let kind = match (self.spec_type, &self.draft.draft_model) {
            (SpecType::None, Some(_)) => SpecType::DraftSimple,
            (SpecType::DraftSimple, None) => {
                anyhow::bail!("--spec-type draft-simple needs a draft model: add -md FILE")
            }
            (SpecType::NgramSimple | SpecType::NgramMapK, Some(_)) => anyhow::bail!(
                "-md gives a draft model, which --spec-type {} does not use; longhaul runs one drafter at a time",
                self.spec_type.name()
            ),
            (k, _) => k,
        };
        let draft = self.draft.params()?;
        let (ngram_simple, ngram_map_k) = self.ngram.sizes();
        Ok(SpecParams {
            kind,
            ngram_simple,
            ngram_map_k,
            draft,
        })
    }
}

impl SampleArgs {
    /// The sampler settings, checked as the server checks a request's: a
    /// refused value names its flag and what is accepted.
    pub fn params(&self) -> anyhow::Result<SamplerParams> {
        let flag_err = |e: SampleParamError| anyhow::anyhow!("{}: {e}", e.flag());
        let p = SamplerParams {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: self.logit_bias.clone(),
            seed: match self.seed {
                None => None,
                Some(s) => SamplerParams::seed_from_i64(s).map_err(flag_err)?,
            },
        };
        p.validate().map_err(flag_err)?;
        Ok(p)
    }

    /// The constraint `--grammar`, `--grammar-file`, `--json-schema` or
    /// `--json-schema-file` asks for (an empty schema means any object, as
    /// in llama.cpp). Unreadable files and schemas that are not JSON name
    /// their flag.
    pub fn constraint(&self) -> anyhow::Result<Option<ConstraintSpec>> {
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))
        };
        let schema = |flag: &str, text: &str| -> anyhow::Result<ConstraintSpec> {
            let mut v: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| anyhow::anyhow!("{flag}: the schema is not valid JSON: {e}"))?;
            if v.as_object().is_some_and(|o| o.is_empty()) {
                v = serde_json::json!({"type": "object"});
            }
            Ok(ConstraintSpec::JsonSchema(v))
        };
        Ok(if let Some(g) = &self.grammar {
            Some(ConstraintSpec::Gbnf(g.clone()))
        } else if let Some(f) = &self.grammar_file {
            Some(ConstraintSpec::Gbnf(read("--grammar-file", f)?))
        } else if let Some(s) = &self.json_schema {
            Some(schema("--json-schema", s)?)
        } else if let Some(f) = &self.json_schema_file {
            Some(schema(
                "--json-schema-file",
                &read("--json-schema-file", f)?,
            )?)
        } else {
            None
        })
    }
}

/// `--logit-bias TOKEN_ID(+/-)BIAS` as llama.cpp's `common/arg.cpp` reads
/// it: a token id, a sign, then a number (`inf` included) that the sign
/// applies to.
pub fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let bad = || {
        format!(
            "invalid value '{s}': give TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 15043-inf)"
        )
    };
    let at = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (id, rest) = s.split_at(at);
    let id: u32 = id.parse().map_err(|_| bad())?;
    let sign = match rest.as_bytes().first() {
        Some(b'+') => 1.0,
        Some(b'-') => -1.0,
        _ => return Err(bad()),
    };
    let bias: f32 = rest[1..].trim().parse().map_err(|_| bad())?;
    Ok((id, sign * bias))
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use longhaul::engine::Lookahead;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        l: LonghaulArgs,
        #[arg(short = 'm')]
        m: Option<String>,
    }

    fn prefetch(args: &[&str]) -> Lookahead {
        T::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .expect("parse")
            .l
            .prefetch
    }

    #[test]
    fn longhaul_prefetch_defaults_to_auto_and_its_bare_flag_means_on() {
        assert_eq!(prefetch(&[]), Lookahead::Auto);
        assert_eq!(prefetch(&["--longhaul-prefetch"]), Lookahead::On);
        // The bare flag before another option: that option is not its value.
        assert_eq!(prefetch(&["--longhaul-prefetch", "-m", "x"]), Lookahead::On);
        assert_eq!(prefetch(&["--longhaul-prefetch", "off"]), Lookahead::Off);
        assert_eq!(prefetch(&["--longhaul-prefetch=auto"]), Lookahead::Auto);
        assert!(T::try_parse_from(["t", "--longhaul-prefetch", "maybe"]).is_err());
    }

    fn template_kwargs(args: &[&str]) -> anyhow::Result<serde_json::Value> {
        #[derive(Parser)]
        struct M {
            #[command(flatten)]
            m: ModelArgs,
        }
        let argv = ["t", "-m", "x.gguf"]
            .into_iter()
            .chain(args.iter().copied());
        let p = M::try_parse_from(argv)?;
        Ok(p.m.engine_params()?.template_kwargs.into())
    }

    #[test]
    fn chat_template_kwargs_reasoning_and_effort_make_the_template_defaults() {
        use serde_json::json;
        assert_eq!(template_kwargs(&[]).unwrap(), json!({}));
        // llama.cpp's order: the kwargs, then --reasoning, then --reasoning-effort.
        let all = [
            "--chat-template-kwargs",
            r#"{"enable_thinking": true, "x": [1]}"#,
            "--reasoning",
            "off",
            "--reasoning-effort",
            "low",
        ];
        assert_eq!(
            template_kwargs(&all).unwrap(),
            json!({"enable_thinking": false, "x": [1], "reasoning_effort": "low"})
        );
        assert_eq!(
            template_kwargs(&["--reasoning", "1"]).unwrap(),
            json!({"enable_thinking": true})
        );
        assert_eq!(
            template_kwargs(&[
                "--chat-template-kwargs",
                r#"{"reasoning_effort": "low"}"#,
                "--reasoning-effort",
                "default"
            ])
            .unwrap(),
            json!({})
        );
        for (bad, says) in [
            (
                vec!["--chat-template-kwargs", "[1]"],
                "must be a JSON object",
            ),
            (vec!["--chat-template-kwargs", "{"], "not valid JSON"),
            (
                vec!["--chat-template-kwargs", r#"{"enable_thinking": "no"}"#],
                "expected boolean",
            ),
            (
                vec!["--reasoning", "maybe"],
                "unknown value for --reasoning",
            ),
        ] {
            let e = template_kwargs(&bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
