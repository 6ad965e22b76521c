//! llama.cpp's flag spellings: the one table of every flag a user of
//! `llama-cli`, `llama-completion`, `llama-server` or `llama-bench` types
//! (from llama.cpp's `common/arg.cpp` and `tools/llama-bench/llama-bench.cpp`),
//! and the rewrite that applies it before clap parses the command line.
//!
//! Each spelling is either another name of one of our long flags (clap takes
//! one-letter shorts only, so `-ngl`, `-cnv`, `-sys` are rewritten to
//! `--n-gpu-layers`, `--conversation`, `--system-prompt`), one of our flags
//! spelled as llama.cpp spells it, or refused with a message naming the flag
//! and saying what longhaul does instead. A multi-letter short flag that is
//! not in the table is refused too, instead of being split by clap into
//! one-letter flags (`-cnv` would read as `-c nv`). The `LLAMA_ARG_*`
//! environment variables of the flags we share are read here as well.
//!
//! This module knows spellings only; what a flag does belongs to the
//! argument structs (`args.rs`, the CLI's commands) that clap fills.

use clap::Command;

/// What a llama.cpp spelling does here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meaning {
    /// Another spelling of our long flag (`-ngl` of `--n-gpu-layers`).
    Alias(&'static str),
    /// Our flag, spelled as llama.cpp spells it, with its meaning.
    Same,
    /// Not taken: the text says what longhaul does instead.
    Refused(&'static str),
}

/// One llama.cpp spelling.
#[derive(Clone, Copy, Debug)]
pub struct Spelling {
    /// As the user types it: `-ngl`, `--n-gpu-layers`, `-no-cnv`.
    pub flag: &'static str,
    pub meaning: Meaning,
    /// llama.cpp's environment variable for the flag (`set_env` in
    /// `common/arg.cpp`), read when the command line does not give it.
    pub env: Option<&'static str>,
}

impl Spelling {
    /// Our long flag this spelling sets, when it is taken.
    pub fn long(&self) -> Option<&'static str> {
        match self.meaning {
            Meaning::Alias(l) => Some(l),
            Meaning::Same => Some(self.flag),
            Meaning::Refused(_) => None,
        }
    }

    const fn env(self, var: &'static str) -> Self {
        Spelling {
            env: Some(var),
            ..self
        }
    }
}

const fn alias(flag: &'static str, long: &'static str) -> Spelling {
    Spelling {
        flag,
        meaning: Meaning::Alias(long),
        env: None,
    }
}

const fn same(flag: &'static str) -> Spelling {
    Spelling {
        flag,
        meaning: Meaning::Same,
        env: None,
    }
}

const fn refused(flag: &'static str, why: &'static str) -> Spelling {
    Spelling {
        flag,
        meaning: Meaning::Refused(why),
        env: None,
    }
}

const STREAMS: &str =
    "longhaul streams experts instead: `--longhaul --longhaul-cache GIB` keeps the routed experts in a cache of that size and reads the rest from the file";
const DOWNLOADS: &str =
    "longhaul does not download models: download the GGUF file and pass `-m FILE`";
const ONE_DEVICE: &str =
    "longhaul runs every repeating layer on one device: `-ngl 0` (CPU) or `-ngl all` with `-dev NAME` (one GPU)";
const FIT: &str =
    "longhaul does not split layers to fit device memory: `--longhaul --longhaul-cache auto` sizes the expert cache to the memory available";
const DRAFT: &str = "not supported yet: the draft model (-md) runs resident on the target's backend, with its threads and KV cache type";
const DRAFT_HUB: &str =
    "longhaul does not download models: download the draft GGUF file and pass `-md FILE`";
const DRAFT_SIZE: &str = "llama.cpp removed this flag; a draft model's drafts are sized by --spec-draft-n-max and --spec-draft-n-min, n-gram drafts by --spec-ngram-simple-size-m and --spec-ngram-map-k-size-m";
const LORA: &str = "LoRA adapters and control vectors are not supported yet";
const TEXT: &str = "longhaul runs text models only (no multimodal projector)";
const SAMPLER: &str = "this sampler is not supported yet; longhaul samples with --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n and --seed";
const ROPE: &str =
    "longhaul takes RoPE and context-extension settings from the model file; overriding them is not supported yet";
const CPU_AFFINITY: &str =
    "thread affinity and priority are not supported yet; longhaul sets only the thread count (-t)";
const NOT_YET: &str = "not supported by longhaul yet";
const REASONING_FORMAT: &str = "longhaul leaves a reply's thoughts in its content, as llama.cpp's `--reasoning-format none`; moving them to `reasoning_content` is not supported yet (`--reasoning off` asks the template not to think)";
const INTERACTIVE: &str =
    "longhaul's interactive mode is the chat: `longhaul chat` or `longhaul run -cnv`";
const EMBED: &str = "longhaul generates text; embeddings and reranking are not supported yet";
const WEB_UI: &str =
    "longhaul serves the API only (/v1, /completion, /health, /metrics), no web UI";
const TLS: &str = "longhaul serves plain HTTP; put a TLS-terminating proxy in front of it";
const PRESET: &str =
    "presets download their models, which longhaul does not: download the GGUF file and pass `-m FILE`";
const DEVICES: &str = "use `longhaul devices` to list GPU adapters";

/// Every llama.cpp spelling, taken or refused. Single-letter shorts that
/// our commands define themselves (`-m`, `-t`, `-c`, `-p` ...) are clap's;
/// the ones listed here are those whose llama.cpp meaning the table decides.
/// A spelling a command defines itself (bench's `-r`, `-o`, `--load-mode`)
/// is that command's own and is not rewritten there.
pub const SPELLINGS: &[Spelling] = &[
    // The model and the machine.
    same("--model").env("LLAMA_ARG_MODEL"),
    same("--threads").env("LLAMA_ARG_THREADS"),
    alias("-tb", "--threads-batch"),
    same("--threads-batch"),
    same("--ctx-size").env("LLAMA_ARG_CTX_SIZE"),
    alias("--predict", "--n-predict"),
    same("--n-predict").env("LLAMA_ARG_N_PREDICT"),
    same("--batch-size").env("LLAMA_ARG_BATCH"),
    alias("-ub", "--ubatch-size"),
    same("--ubatch-size").env("LLAMA_ARG_UBATCH"),
    alias("-fa", "--flash-attn"),
    same("--flash-attn").env("LLAMA_ARG_FLASH_ATTN"),
    alias("-ctk", "--cache-type-k"),
    same("--cache-type-k").env("LLAMA_ARG_CACHE_TYPE_K"),
    alias("-ctv", "--cache-type-v"),
    same("--cache-type-v").env("LLAMA_ARG_CACHE_TYPE_V"),
    alias("-ngl", "--n-gpu-layers"),
    alias("--gpu-layers", "--n-gpu-layers"),
    same("--n-gpu-layers").env("LLAMA_ARG_N_GPU_LAYERS"),
    alias("-dev", "--device"),
    same("--device").env("LLAMA_ARG_DEVICE"),
    refused("--list-devices", DEVICES),
    alias("-kvo", "--kv-offload"),
    same("--kv-offload"),
    alias("-nkvo", "--no-kv-offload"),
    same("--no-kv-offload"),
    same("--no-mmap"),
    alias("-mmp", "--mmap"),
    same("--mmap"),
    same("--mlock"),
    alias("-lm", "--load-mode"),
    same("--load-mode").env("LLAMA_ARG_LOAD_MODE"),
    alias("-nr", "--no-repack"),
    same("--no-repack"),
    same("--repack"),
    same("--offline"),
    refused("-ot", STREAMS),
    refused("--override-tensor", STREAMS),
    refused("-cmoe", STREAMS),
    refused("--cpu-moe", STREAMS),
    refused("-ncmoe", STREAMS),
    refused("--n-cpu-moe", STREAMS),
    refused("-ncffn", STREAMS),
    refused("--n-cpu-ffn", STREAMS),
    refused("-sm", ONE_DEVICE),
    refused("--split-mode", ONE_DEVICE),
    refused("-ts", ONE_DEVICE),
    refused("--tensor-split", ONE_DEVICE),
    refused("-mg", ONE_DEVICE),
    refused("--main-gpu", ONE_DEVICE),
    refused("--rpc", ONE_DEVICE),
    refused("-fit", FIT),
    refused("--fit", FIT),
    refused("-fitt", FIT),
    refused("--fit-target", FIT),
    refused("-fitc", FIT),
    refused("--fit-ctx", FIT),
    refused("-fitp", FIT),
    refused("--fit-print", FIT),
    refused("-C", CPU_AFFINITY),
    refused("--cpu-mask", CPU_AFFINITY),
    refused("-Cr", CPU_AFFINITY),
    refused("--cpu-range", CPU_AFFINITY),
    refused("--cpu-strict", CPU_AFFINITY),
    refused("--prio", CPU_AFFINITY),
    refused("--poll", CPU_AFFINITY),
    refused("-Cb", CPU_AFFINITY),
    refused("--cpu-mask-batch", CPU_AFFINITY),
    refused("-Crb", CPU_AFFINITY),
    refused("--cpu-range-batch", CPU_AFFINITY),
    refused("--cpu-strict-batch", CPU_AFFINITY),
    refused("--prio-batch", CPU_AFFINITY),
    refused("--poll-batch", CPU_AFFINITY),
    refused("--numa", CPU_AFFINITY),
    refused("--no-host", NOT_YET),
    refused("--op-offload", NOT_YET),
    refused("--no-op-offload", NOT_YET),
    refused("-nopo", NOT_YET),
    refused("--check-tensors", NOT_YET),
    refused("--override-kv", NOT_YET),
    refused("-lzm", NOT_YET),
    refused("--lazy-mode", NOT_YET),
    // Downloads.
    refused("-hf", DOWNLOADS),
    refused("-hfr", DOWNLOADS),
    refused("--hf-repo", DOWNLOADS),
    refused("-hff", DOWNLOADS),
    refused("--hf-file", DOWNLOADS),
    refused("-hft", DOWNLOADS),
    refused("--hf-token", DOWNLOADS),
    refused("-mu", DOWNLOADS),
    refused("--model-url", DOWNLOADS),
    refused("-dr", DOWNLOADS),
    refused("--docker-repo", DOWNLOADS),
    refused("-cl", DOWNLOADS),
    refused("--cache-list", DOWNLOADS),
    refused("--gpt-oss-20b-default", PRESET),
    refused("--gpt-oss-120b-default", PRESET),
    refused("--fim-qwen-1.5b-default", PRESET),
    refused("--fim-qwen-3b-default", PRESET),
    refused("--fim-qwen-7b-default", PRESET),
    refused("--fim-qwen-7b-spec", PRESET),
    refused("--fim-qwen-14b-spec", PRESET),
    refused("--fim-qwen-30b-default", PRESET),
    refused("--embd-gemma-default", PRESET),
    refused("--vision-gemma-4b-default", PRESET),
    refused("--vision-gemma-12b-default", PRESET),
    refused("--spec-default", PRESET),
    // The prompt and the conversation.
    alias("-sys", "--system-prompt"),
    same("--system-prompt"),
    refused("-sysf", NOT_YET),
    refused("--system-prompt-file", NOT_YET),
    alias("-e", "--escape"),
    same("--escape"),
    same("--no-escape"),
    alias("-cnv", "--conversation"),
    same("--conversation"),
    alias("-no-cnv", "--no-conversation"),
    same("--no-conversation"),
    alias("-st", "--single-turn"),
    same("--single-turn"),
    same("--display-prompt"),
    same("--no-display-prompt"),
    alias("-co", "--color"),
    same("--color"),
    same("--jinja").env("LLAMA_ARG_JINJA"),
    refused(
        "--no-jinja",
        "longhaul applies chat templates with its Jinja engine only",
    ),
    same("--chat-template").env("LLAMA_ARG_CHAT_TEMPLATE"),
    same("--chat-template-file").env("LLAMA_ARG_CHAT_TEMPLATE_FILE"),
    same("--chat-template-kwargs").env("LLAMA_ARG_CHAT_TEMPLATE_KWARGS"),
    refused("-i", INTERACTIVE),
    refused("--interactive", INTERACTIVE),
    refused("-if", INTERACTIVE),
    refused("--interactive-first", INTERACTIVE),
    refused("-mli", NOT_YET),
    refused("--multiline-input", NOT_YET),
    refused("-r", NOT_YET),
    refused("--reverse-prompt", NOT_YET),
    refused("-sp", NOT_YET),
    refused("--special", NOT_YET),
    refused("--in-prefix", NOT_YET),
    refused("--in-prefix-bos", NOT_YET),
    refused("--in-suffix", NOT_YET),
    refused("--keep", NOT_YET),
    refused("-bf", NOT_YET),
    refused("--binary-file", NOT_YET),
    refused("-ptc", NOT_YET),
    refused("--print-token-count", NOT_YET),
    refused("--prompt-cache", NOT_YET),
    refused("--prompt-cache-all", NOT_YET),
    refused("--prompt-cache-ro", NOT_YET),
    same("--verbose-prompt"),
    refused("--simple-io", NOT_YET),
    refused("--perf", NOT_YET),
    refused("--no-perf", NOT_YET),
    refused("--show-timings", NOT_YET),
    refused("--no-show-timings", NOT_YET),
    refused("--reasoning-format", REASONING_FORMAT),
    alias("-rea", "--reasoning"),
    same("--reasoning").env("LLAMA_ARG_REASONING"),
    same("--reasoning-effort").env("LLAMA_ARG_REASONING_EFFORT"),
    refused("--reasoning-budget", NOT_YET),
    // Sampling.
    same("--seed"),
    alias("--temperature", "--temp"),
    same("--temp").env("LLAMA_ARG_TEMPERATURE"),
    same("--top-k").env("LLAMA_ARG_TOP_K"),
    same("--top-p").env("LLAMA_ARG_TOP_P"),
    same("--min-p").env("LLAMA_ARG_MIN_P"),
    same("--repeat-penalty").env("LLAMA_ARG_REPEAT_PENALTY"),
    same("--repeat-last-n"),
    same("--presence-penalty"),
    same("--frequency-penalty"),
    alias("-l", "--logit-bias"),
    same("--logit-bias"),
    same("--ignore-eos"),
    // Structured output.
    same("--grammar"),
    same("--grammar-file"),
    alias("-j", "--json-schema"),
    same("--json-schema"),
    alias("-jf", "--json-schema-file"),
    same("--json-schema-file"),
    refused("--samplers", SAMPLER),
    refused("--sampler-seq", SAMPLER),
    refused("--sampling-seq", SAMPLER),
    refused("--top-nsigma", SAMPLER),
    refused("--top-n-sigma", SAMPLER),
    refused("--xtc-probability", SAMPLER),
    refused("--xtc-threshold", SAMPLER),
    refused("--typical", SAMPLER),
    refused("--typical-p", SAMPLER),
    refused("--dry-multiplier", SAMPLER),
    refused("--dry-base", SAMPLER),
    refused("--dry-allowed-length", SAMPLER),
    refused("--dry-penalty-last-n", SAMPLER),
    refused("--dry-sequence-breaker", SAMPLER),
    refused("--adaptive-target", SAMPLER),
    refused("--adaptive-decay", SAMPLER),
    refused("--dynatemp-range", SAMPLER),
    refused("--dynatemp-exp", SAMPLER),
    refused("--mirostat", SAMPLER),
    refused("--mirostat-lr", SAMPLER),
    refused("--mirostat-ent", SAMPLER),
    refused("-bs", SAMPLER),
    refused("--backend-sampling", SAMPLER),
    // Context handling.
    refused("--swa-full", NOT_YET),
    alias("-ctxcp", "--ctx-checkpoints"),
    alias("--swa-checkpoints", "--ctx-checkpoints"),
    same("--ctx-checkpoints").env("LLAMA_ARG_CTX_CHECKPOINTS"),
    refused("-cram", NOT_YET),
    refused("--cache-ram", NOT_YET),
    refused("-kvu", NOT_YET),
    refused("--kv-unified", NOT_YET),
    refused("--context-shift", NOT_YET),
    refused("-dt", NOT_YET),
    refused("--defrag-thold", NOT_YET),
    refused("-gan", ROPE),
    refused("--grp-attn-n", ROPE),
    refused("-gaw", ROPE),
    refused("--grp-attn-w", ROPE),
    refused("--rope-scaling", ROPE),
    refused("--rope-scale", ROPE),
    refused("--rope-freq-base", ROPE),
    refused("--rope-freq-scale", ROPE),
    refused("--yarn-orig-ctx", ROPE),
    refused("--yarn-ext-factor", ROPE),
    refused("--yarn-attn-factor", ROPE),
    refused("--yarn-beta-slow", ROPE),
    refused("--yarn-beta-fast", ROPE),
    // Adapters, draft models, other modalities.
    refused("--lora", LORA),
    refused("--lora-scaled", LORA),
    refused("--lora-init-without-apply", LORA),
    refused("--control-vector", LORA),
    refused("--control-vector-scaled", LORA),
    refused("--control-vector-layer-range", LORA),
    alias("-md", "--spec-draft-model"),
    alias("--model-draft", "--spec-draft-model"),
    same("--spec-draft-model").env("LLAMA_ARG_SPEC_DRAFT_MODEL"),
    refused("-hfd", DRAFT_HUB),
    refused("-hfrd", DRAFT_HUB),
    refused("--hf-repo-draft", DRAFT_HUB),
    refused("-ngld", DRAFT),
    refused("--gpu-layers-draft", DRAFT),
    refused("--n-gpu-layers-draft", DRAFT),
    refused("-devd", DRAFT),
    refused("--device-draft", DRAFT),
    refused("-td", DRAFT),
    refused("--threads-draft", DRAFT),
    refused("-tbd", DRAFT),
    refused("-ctkd", DRAFT),
    refused("-ctvd", DRAFT),
    refused("-otd", DRAFT),
    refused("-cmoed", DRAFT),
    refused("-ncmoed", DRAFT),
    refused("--draft", DRAFT_SIZE),
    refused("--draft-n", DRAFT_SIZE),
    refused("--draft-max", DRAFT_SIZE),
    refused("--draft-min", DRAFT_SIZE),
    refused("--draft-n-min", DRAFT_SIZE),
    alias("--draft-p-min", "--spec-draft-p-min"),
    same("--spec-draft-n-max").env("LLAMA_ARG_SPEC_DRAFT_N_MAX"),
    same("--spec-draft-n-min").env("LLAMA_ARG_SPEC_DRAFT_N_MIN"),
    same("--spec-draft-p-min").env("LLAMA_ARG_SPEC_DRAFT_P_MIN"),
    refused("--spec-draft-p-split", DRAFT),
    refused("--spec-draft-hf", DRAFT_HUB),
    refused("--spec-draft-threads", DRAFT),
    refused("--spec-draft-threads-batch", DRAFT),
    refused("--threads-batch-draft", DRAFT),
    refused("--spec-draft-ngl", DRAFT),
    refused("--spec-draft-device", DRAFT),
    refused("--spec-draft-type-k", DRAFT),
    refused("--spec-draft-type-v", DRAFT),
    refused("--cache-type-k-draft", DRAFT),
    refused("--cache-type-v-draft", DRAFT),
    refused("--spec-draft-override-tensor", DRAFT),
    refused("--override-tensor-draft", DRAFT),
    refused("--spec-draft-cpu-moe", DRAFT),
    refused("--cpu-moe-draft", DRAFT),
    refused("--spec-draft-n-cpu-moe", DRAFT),
    refused("--spec-draft-ncmoe", DRAFT),
    refused("--n-cpu-moe-draft", DRAFT),
    refused("--draft-p-split", DRAFT),
    same("--spec-type").env("LLAMA_ARG_SPEC_TYPE"),
    same("--spec-ngram-simple-size-n"),
    same("--spec-ngram-simple-size-m"),
    same("--spec-ngram-simple-min-hits"),
    same("--spec-ngram-map-k-size-n"),
    same("--spec-ngram-map-k-size-m"),
    same("--spec-ngram-map-k-min-hits"),
    refused("-mm", TEXT),
    refused("--mmproj", TEXT),
    refused("-mmu", TEXT),
    refused("--mmproj-url", TEXT),
    refused("--mmproj-auto", TEXT),
    refused("--no-mmproj", TEXT),
    refused("--image", TEXT),
    refused("--audio", TEXT),
    refused("--video", TEXT),
    // The server.
    same("--host").env("LLAMA_ARG_HOST"),
    same("--port").env("LLAMA_ARG_PORT"),
    alias("-np", "--parallel"),
    same("--parallel").env("LLAMA_ARG_N_PARALLEL"),
    alias("-to", "--timeout"),
    same("--timeout").env("LLAMA_ARG_TIMEOUT"),
    same("--alias").env("LLAMA_ARG_ALIAS"),
    same("--api-key").env("LLAMA_API_KEY"),
    alias("-cb", "--cont-batching"),
    same("--cont-batching").env("LLAMA_ARG_CONT_BATCHING"),
    alias("-nocb", "--no-cont-batching"),
    same("--no-cont-batching"),
    same("--metrics").env("LLAMA_ARG_ENDPOINT_METRICS"),
    refused("--api-key-file", NOT_YET),
    refused("--ssl-key-file", TLS),
    refused("--ssl-cert-file", TLS),
    refused("--path", WEB_UI),
    refused("--api-prefix", NOT_YET),
    refused("--ui", WEB_UI),
    refused("--webui", WEB_UI),
    refused("--ui-config", WEB_UI),
    refused("--webui-config", WEB_UI),
    refused("--ui-config-file", WEB_UI),
    refused("--webui-config-file", WEB_UI),
    refused("--tools", NOT_YET),
    refused("--mcp-servers-config", NOT_YET),
    refused("-ag", NOT_YET),
    refused("--agent", NOT_YET),
    refused("--embedding", EMBED),
    refused("--embeddings", EMBED),
    refused("--rerank", EMBED),
    refused("--reranking", EMBED),
    refused("--pooling", EMBED),
    refused("--cors-origins", NOT_YET),
    refused("--reuse-port", NOT_YET),
    refused("--threads-http", NOT_YET),
    refused("--sse-ping-interval", NOT_YET),
    refused("--cache-reuse", NOT_YET),
    refused("--props", NOT_YET),
    same("--slots"),
    same("--no-slots"),
    same("--slot-save-path"),
    refused("--models-dir", NOT_YET),
    refused("--models-preset", NOT_YET),
    refused("--models-max", NOT_YET),
    refused("-sps", NOT_YET),
    refused("--slot-prompt-similarity", NOT_YET),
    refused("--sleep-idle-seconds", NOT_YET),
    refused("--spm-infill", NOT_YET),
    refused("--prefill-assistant", NOT_YET),
    // Logging.
    alias("-v", "--verbose"),
    same("--verbose"),
    alias("--log-verbose", "--verbose"),
    alias("-lv", "--verbosity"),
    same("--verbosity").env("LLAMA_ARG_LOG_VERBOSITY"),
    alias("--log-verbosity", "--verbosity"),
    same("--log-disable"),
    refused("--log-file", NOT_YET),
    refused("--log-colors", NOT_YET),
    refused("--log-prefix", NOT_YET),
    refused("--log-timestamps", NOT_YET),
    // llama-bench.
    alias("-pg", "--pg"),
    refused("-oe", NOT_YET),
    refused("--output-err", NOT_YET),
    refused("--delay", NOT_YET),
    refused("--progress", NOT_YET),
    refused("-embd", EMBED),
];

/// A command line the table refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// A llama.cpp flag longhaul does not take.
    #[error("{flag}: {why}")]
    Refused { flag: String, why: &'static str },
    /// A llama.cpp flag that another longhaul command takes.
    #[error("{flag} ({long}) is not a `longhaul {command}` flag; see `longhaul {command} --help`")]
    NotHere {
        flag: String,
        long: &'static str,
        command: String,
    },
    /// A multi-letter short flag nobody defines (clap would split it).
    #[error("unknown flag {flag}; see `longhaul {command} --help` for the flags it takes (llama.cpp's multi-letter short flags are spelled as llama.cpp spells them)")]
    Unknown { flag: String, command: String },
    /// A `LLAMA_ARG_*` boolean that is neither true nor false.
    #[error("{var}={value}: give on, off, true, false, 1 or 0")]
    EnvBool { var: &'static str, value: String },
}

/// The entry for `flag`, if the table has one.
pub fn lookup(flag: &str) -> Option<&'static Spelling> {
    SPELLINGS.iter().find(|s| s.flag == flag)
}

/// What `cmd` knows about one of its flags, spelled `flag` (`-m`, `--model`,
/// or one of its aliases).
fn find_arg<'a>(cmd: &'a Command, flag: &str) -> Option<&'a clap::Arg> {
    if let Some(long) = flag.strip_prefix("--") {
        return cmd.get_arguments().find(|a| {
            a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|v| v.contains(&long))
        });
    }
    let mut chars = flag.strip_prefix('-')?.chars();
    let (Some(c), None) = (chars.next(), chars.next()) else {
        return None;
    };
    cmd.get_arguments().find(|a| {
        a.get_short() == Some(c) || a.get_all_short_aliases().is_some_and(|v| v.contains(&c))
    })
}

/// Whether `arg` starts a flag (not a value such as `-1` or `-0.5`).
fn is_flag(arg: &str) -> bool {
    arg.starts_with('-') && arg.len() > 1 && arg.parse::<f64>().is_err()
}

/// Whether `arg` takes a value (and so whether the next word is that value).
fn takes_value(arg: &clap::Arg) -> bool {
    arg.get_action().takes_values()
}

/// A `-x...` of one letter and glued digits (`-n5`, `-t2`): clap reads it
/// as the short flag and its value, as C getopt would.
fn is_short_with_number(cmd: &Command, word: &str) -> bool {
    let mut chars = word.chars();
    chars.next();
    let Some(c) = chars.next() else { return false };
    let rest = chars.as_str();
    rest.parse::<f64>().is_ok()
        && cmd
            .get_arguments()
            .any(|a| a.get_short() == Some(c) && takes_value(a))
}

/// Where [`rewrite`] reads `LLAMA_ARG_*` variables: the value of one, if set.
pub type Env<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// Rewrites `args` (the words after the command's name) for `cmd`, whose
/// name `command` is used in messages: each llama.cpp spelling becomes our
/// long flag (or is refused), and, when `env` is given, each `LLAMA_ARG_*`
/// variable it returns a value for adds its flag unless the words give it.
/// Words after `--` and values of flags are left alone.
pub fn rewrite(
    cmd: &Command,
    command: &str,
    args: &[String],
    env: Option<&Env<'_>>,
) -> Result<Vec<String>, FlagError> {
    let mut out = Vec::with_capacity(args.len());
    // Our long flags the words give, for the environment.
    let mut given: Vec<String> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let word = &args[i];
        i += 1;
        if word == "--" {
            out.extend(args[i - 1..].iter().cloned());
            break;
        }
        if !is_flag(word) {
            out.push(word.clone());
            continue;
        }
        let (name, value) = match word.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (word.as_str(), None),
        };
        // The command's own spelling wins over the table.
        let own = find_arg(cmd, name);
        let long = match (own, lookup(name)) {
            (Some(_), _) => name.to_string(),
            (None, Some(s)) => {
                let long = match s.meaning {
                    Meaning::Refused(why) => {
                        return Err(FlagError::Refused {
                            flag: name.to_string(),
                            why,
                        })
                    }
                    Meaning::Alias(long) => long,
                    Meaning::Same => s.flag,
                };
                if find_arg(cmd, long).is_none() {
                    return Err(FlagError::NotHere {
                        flag: name.to_string(),
                        long,
                        command: command.to_string(),
                    });
                }
                long.to_string()
            }
            (None, None) => {
                let multi_short = !name.starts_with("--") && name.chars().count() > 2;
                if multi_short && value.is_none() && !is_short_with_number(cmd, name) {
                    return Err(FlagError::Unknown {
                        flag: name.to_string(),
                        command: command.to_string(),
                    });
                }
                // clap reports unknown flags itself.
                out.push(word.clone());
                continue;
            }
        };
        let arg = find_arg(cmd, &long);
        if let Some(a) = arg {
            given.push(a.get_id().to_string());
        }
        match value {
            Some(v) => out.push(format!("{long}={v}")),
            None => out.push(long),
        }
        // A value in the next word is not a flag, whatever it looks like.
        if let Some(a) = arg {
            let optional = a.get_num_args().is_some_and(|n| n.min_values() == 0);
            if value.is_none()
                && takes_value(a)
                && i < args.len()
                && (!optional || !is_flag(&args[i]))
            {
                out.push(args[i].clone());
                i += 1;
            }
        }
    }
    if let Some(env) = env {
        let at = out.iter().position(|w| w == "--").unwrap_or(out.len());
        let mut extra = Vec::new();
        for s in SPELLINGS {
            let (Some(var), Some(long)) = (s.env, s.long()) else {
                continue;
            };
            let Some(value) = env(var) else { continue };
            let Some(a) = find_arg(cmd, long) else {
                continue;
            };
            if given.iter().any(|g| g == a.get_id().as_str()) {
                continue;
            }
            if takes_value(a) {
                extra.push(format!("{long}={value}"));
            } else if truthy(&value) {
                extra.push(long.to_string());
            } else if !falsey(&value) {
                return Err(FlagError::EnvBool { var, value });
            }
        }
        out.splice(at..at, extra);
    }
    Ok(out)
}

/// llama.cpp's `is_truthy`.
pub(crate) fn truthy(v: &str) -> bool {
    matches!(v, "on" | "enabled" | "true" | "1")
}

/// llama.cpp's `is_falsey`.
pub(crate) fn falsey(v: &str) -> bool {
    matches!(v, "off" | "disabled" | "false" | "0")
}

/// The process environment, as [`rewrite`] reads it.
pub fn process_env(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_spelling_is_listed_once_and_aliases_name_long_flags() {
        for (i, s) in SPELLINGS.iter().enumerate() {
            assert!(s.flag.starts_with('-'), "{}", s.flag);
            assert!(
                SPELLINGS[..i].iter().all(|t| t.flag != s.flag),
                "{} is listed twice",
                s.flag
            );
            if let Meaning::Alias(long) = s.meaning {
                assert!(long.starts_with("--"), "{} -> {long}", s.flag);
            }
            if s.env.is_some() {
                assert!(s.long().is_some(), "{} is refused but has an env", s.flag);
            }
        }
    }

    #[test]
    fn the_issue_spellings_are_in_the_table() {
        // From llama.cpp's common/arg.cpp and llama-bench.
        for (flag, long) in [
            ("-cnv", "--conversation"),
            ("-no-cnv", "--no-conversation"),
            ("-sys", "--system-prompt"),
            ("-cb", "--cont-batching"),
            ("-fa", "--flash-attn"),
            ("-ngl", "--n-gpu-layers"),
            ("-nkvo", "--no-kv-offload"),
            ("-lv", "--verbosity"),
            ("-tb", "--threads-batch"),
        ] {
            assert_eq!(lookup(flag).and_then(|s| s.long()), Some(long), "{flag}");
        }
        for flag in ["-ot", "--cpu-moe", "--n-cpu-moe"] {
            let Some(Meaning::Refused(why)) = lookup(flag).map(|s| s.meaning) else {
                panic!("{flag} should be refused");
            };
            assert!(
                why.contains("--longhaul --longhaul-cache GIB"),
                "{flag}: {why}"
            );
        }
        let Some(Meaning::Refused(why)) = lookup("-hf").map(|s| s.meaning) else {
            panic!("-hf should be refused");
        };
        assert!(
            why.contains("does not download") && why.contains("-m FILE"),
            "{why}"
        );
    }

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn demo_cmd() -> Command {
        Command::new("demo")
            .arg(clap::Arg::new("ctx").short('c').long("ctx-size"))
            .arg(clap::Arg::new("prompt").short('p').long("prompt"))
            .arg(
                clap::Arg::new("conv")
                    .long("conversation")
                    .action(clap::ArgAction::SetTrue),
            )
            .arg(clap::Arg::new("ngl").long("n-gpu-layers"))
    }

    #[test]
    fn rewrites_spellings_leaves_values_and_refuses_unknown_shorts() {
        let cmd = demo_cmd();
        let r = |v: &[&str]| rewrite(&cmd, "demo", &words(v), None);
        assert_eq!(
            r(&["-cnv", "-ngl=99", "-c", "64"]),
            Ok(words(&["--conversation", "--n-gpu-layers=99", "-c", "64"]))
        );
        // A value that looks like a flag stays the value.
        assert_eq!(
            r(&["-p", "-cnv", "-ngl", "-1"]),
            Ok(words(&["-p", "-cnv", "--n-gpu-layers", "-1"]))
        );
        assert_eq!(r(&["-c64"]), Ok(words(&["-c64"])));
        assert!(matches!(r(&["-xyz"]), Err(FlagError::Unknown { .. })));
        assert!(matches!(r(&["-sys", "x"]), Err(FlagError::NotHere { .. })));
        let e = r(&["-ot", "exps=CPU"]).expect_err("refused");
        assert!(
            e.to_string().starts_with("-ot: longhaul streams experts"),
            "{e}"
        );
        assert_eq!(r(&["--", "-cnv"]), Ok(words(&["--", "-cnv"])));
    }

    #[test]
    fn environment_fills_absent_flags_only() {
        let cmd = demo_cmd();
        let env = |v: &str| match v {
            "LLAMA_ARG_CTX_SIZE" => Some("128".to_string()),
            "LLAMA_ARG_N_GPU_LAYERS" => Some("0".to_string()),
            _ => None,
        };
        let got = rewrite(&cmd, "demo", &words(&["-c", "64", "--", "x"]), Some(&env));
        assert_eq!(got, Ok(words(&["-c", "64", "--n-gpu-layers=0", "--", "x"])));
    }
}
