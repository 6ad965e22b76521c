//! `longhaul bench`: llama-bench's tests and outputs. Tests: `ppN` (a prompt
//! of N tokens in ubatches), `tgN` (N single-token decode steps), `ppN+tgM`
//! (`-pg N,M`: both, timed together), each after `-d` tokens of context
//! (`... @ dD`, filled before the clock starts). Every list flag multiplies the
//! rows, as in llama-bench; `-ngl 0,99` gives a CPU row and a GPU row per
//! test (the placements are resolved, checked and opened before any row is
//! measured). Longhaul rows add the expert cache's hit rate and the expert
//! bytes read while timed.

use std::time::Instant;

use anyhow::Context;
use clap::Args;
use longhaul::backend::Backend;
use longhaul::draft::{ModelDrafter, MtpDrafter};
use longhaul::engine::{CacheBudget, Engine, EngineParams, FlashAttn, LonghaulParams};
use longhaul::longhaul::{steps_floor_tps, steps_total, CacheStats, Policy, StepClock, StepCost};
use longhaul::model::Logits;
use longhaul::placement::{self, GpuLayers, Placed};
use longhaul::sample::{Sampler, SamplerParams};
use longhaul::spec::{Drafter, SpecParams, SpecStats, SpecType};
use longhaul::tensor::GgmlType;

use crate::bench_out;

pub(crate) const DEFAULT_UBATCH: usize = 512;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[arg(short = 'm', long = "model", required_unless_present = "survey")]
    pub model: Option<std::path::PathBuf>,
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
    /// Prompt then generation, timed together (-pg PP,TG; repeat the flag for more).
    #[arg(long = "pg", value_name = "PP,TG")]
    pub pg: Vec<String>,
    /// Context depth: tokens evaluated before each test, untimed (comma-separated).
    #[arg(
        short = 'd',
        long = "n-depth",
        default_value = "0",
        value_delimiter = ','
    )]
    pub n_depth: Vec<usize>,
    /// Thread counts (comma-separated; default: all cores).
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    pub threads: Vec<usize>,
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Physical batch sizes (-ub, comma-separated).
    #[arg(long = "ubatch-size", default_value = "512", value_delimiter = ',')]
    pub ubatch: Vec<usize>,
    /// Repeating layers on the GPU (-ngl, comma-separated; one row per
    /// value): auto (a GPU when one is found, else the CPU), 0 (CPU), all or
    /// 99 (GPU); nothing in between.
    #[arg(
        long = "n-gpu-layers",
        value_name = "auto|0|all|N",
        default_value = "auto",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    pub n_gpu_layers: Vec<String>,
    /// GPU adapter by name (-dev; substring, case-insensitive; `none` = the
    /// CPU; also LONGHAUL_DEVICE). `longhaul devices` lists them.
    #[arg(long = "device", value_name = "NAME")]
    pub device: Option<String>,
    /// How weights are held (comma-separated, -lm): mmap (resident,
    /// memory-mapped; llama-bench's auto), read (read into memory;
    /// llama-bench's none), dio (read into memory with direct I/O) or
    /// longhaul (experts streamed; needs --longhaul-cache). Default: mmap,
    /// or longhaul with --longhaul.
    #[arg(long = "load-mode", value_delimiter = ',')]
    pub load_mode: Vec<String>,
    /// Attention paths (-fa, comma-separated; one row per value): on,
    /// off or auto (llama.cpp's default); also 1, 0, -1.
    #[arg(
        long = "flash-attn",
        value_name = "on|off|auto",
        default_value = "auto",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    pub flash_attn: Vec<FlashAttn>,
    /// llama-bench's -mmp (comma-separated): 1 memory-maps the file
    /// (--load-mode mmap), 0 reads it into memory (--load-mode read).
    #[arg(long = "mmap", value_name = "0|1", value_delimiter = ',')]
    pub mmap: Vec<String>,
    /// llama-bench's --repack: 1 (the default) gives CPU matrices their
    /// interleaved kernel layout where one exists, 0 keeps the GGUF layout.
    #[arg(long = "repack", value_name = "0|1")]
    pub repack: Option<String>,
    /// llama-bench's older -nr: 1 is --repack 0, 0 is --repack 1.
    #[arg(long = "no-repack", value_name = "0|1")]
    pub no_repack: Option<String>,
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// --longhaul-cache and --longhaul-policy take comma-separated lists here.
    #[command(flatten)]
    pub longhaul: crate::args::LonghaulArgs,
    #[command(flatten)]
    pub trace: crate::trace_args::TraceArgs,
    /// Output format: md, json, jsonl or csv.
    #[arg(short = 'o', long = "output", default_value = "md")]
    pub output: String,
    #[command(flatten)]
    pub survey: crate::survey::SurveyArgs,
    #[command(flatten)]
    pub spec: BenchSpecArgs,
    /// Memory bandwidth of the device the rows run on, decimal GB/s (e.g.
    /// 4800 for an H200): generation rows then show the weight bytes they
    /// read per second as a share of it (`GB/s`, `% bw`).
    #[arg(long = "gpu-bw", value_name = "GBPS")]
    pub gpu_bw: Option<f64>,
}

/// Speculative rows. llama-bench has none: a `--spec-type` list gives one
/// row per value beside each generation test, and those tests become real
/// greedy decodes (end of generation ignored) after the text of `-f`, in
/// every row of the list, `none` too, so that the rows compare.
#[derive(Args, Debug)]
pub struct BenchSpecArgs {
    /// Speculative decoding, one row per value (comma-separated): none,
    /// ngram-simple, ngram-map-k, draft-simple (needs -md; -md alone means
    /// none,draft-simple), draft-mtp (the model's NextN layer). Prompt tests
    /// (-p) run in the none rows only.
    #[arg(long = "spec-type", value_delimiter = ',')]
    pub spec_type: Vec<String>,
    /// The draft model of draft-simple rows (-md), resident on the rows'
    /// backend, and its sizes.
    #[command(flatten)]
    pub draft: longhaul_server::args::DraftArgs,
    /// The n-gram rows' sizes.
    #[command(flatten)]
    pub ngram: longhaul_server::args::NgramArgs,
    /// The text speculative rows' generations follow, as a raw prompt
    /// (default: a short code file to repeat with one change, in ChatML).
    #[arg(short = 'f', long = "file")]
    pub file: Option<std::path::PathBuf>,
}

/// The default text of speculative rows: repetitive output, where drafts pay.
const SPEC_TEXT: &str = include_str!("../../tests/fixtures/prompts/code-edit.txt");

impl BenchSpecArgs {
    /// The drafters of the rows, in order; empty without `--spec-type` or
    /// `-md` (llama-bench's generation tests).
    fn kinds(&self) -> anyhow::Result<Vec<SpecType>> {
        self.draft.params()?;
        let mut kinds: Vec<SpecType> = Vec::new();
        for k in self.spec_type.iter().map(|k| k.trim()) {
            let kind = k.parse::<SpecType>().map_err(anyhow::Error::msg)?;
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        if kinds.is_empty() && self.draft.draft_model.is_some() {
            kinds = vec![SpecType::None, SpecType::DraftSimple];
        }
        let wants_model = kinds.contains(&SpecType::DraftSimple);
        match (wants_model, &self.draft.draft_model) {
            (true, None) => anyhow::bail!("--spec-type draft-simple needs a draft model: add -md FILE"),
            (false, Some(_)) => anyhow::bail!("-md gives a draft model, which only draft-simple rows use: add draft-simple to --spec-type"),
            _ => {}
        }
        if kinds == [SpecType::None] && self.file.is_none() {
            // `--spec-type none` alone is llama-bench's generation test.
            return Ok(Vec::new());
        }
        if kinds.is_empty() && self.file.is_some() {
            kinds.push(SpecType::None);
        }
        Ok(kinds)
    }

    fn params(&self, kind: SpecType) -> anyhow::Result<SpecParams> {
        let (ngram_simple, ngram_map_k) = self.ngram.sizes();
        Ok(SpecParams {
            kind,
            draft: self.draft.params()?,
            ngram_simple,
            ngram_map_k,
        })
    }

    fn text(&self) -> anyhow::Result<String> {
        match &self.file {
            Some(f) => std::fs::read_to_string(f).with_context(|| format!("-f {}", f.display())),
            None => Ok(SPEC_TEXT.to_string()),
        }
    }
}

/// How the model's weights are held for one group of rows.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum LoadMode {
    Mmap,
    /// Resident weights read into memory (llama.cpp's `--no-mmap`).
    Read,
    /// Read into memory with direct I/O (llama.cpp's `-lm dio`).
    Dio,
    Longhaul {
        gib: String,
        budget: u64,
        policy: Policy,
    },
}

/// One test: `n_prompt` tokens at once, then `n_gen` single-token steps,
/// after `n_depth` tokens of context.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Test {
    pub(crate) n_prompt: usize,
    pub(crate) n_gen: usize,
    pub(crate) n_depth: usize,
}

impl Test {
    pub(crate) fn name(&self) -> String {
        let base = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, g) => format!("tg{g}"),
            (p, g) => format!("pp{p}+tg{g}"),
        };
        if self.n_depth > 0 {
            format!("{base} @ d{}", self.n_depth)
        } else {
            base
        }
    }
}

/// Where a row ran, as llama-bench reports it.
#[derive(Clone, Debug)]
pub(crate) struct RowPlacement {
    /// `CPU`, or the GPU's API (`Vulkan`, `Metal`, `Dx12`).
    pub(crate) backend: String,
    /// The adapter's name (empty on the CPU).
    pub(crate) gpu_info: String,
    /// llama-bench's `n_gpu_layers`: 0 on the CPU; on the GPU the number
    /// given, or 99 (llama-bench's default, every layer) for `all`/`auto`.
    pub(crate) ngl: u32,
}

impl RowPlacement {
    fn new(g: GpuLayers, p: &Placed) -> Self {
        match p.placement.adapter() {
            None => Self {
                backend: "CPU".into(),
                gpu_info: String::new(),
                ngl: 0,
            },
            Some(a) => Self {
                backend: p.placement.backend_name(),
                gpu_info: a.name.clone(),
                ngl: match g {
                    GpuLayers::Count(n) => n,
                    GpuLayers::All | GpuLayers::Auto => 99,
                },
            },
        }
    }
}

pub(crate) struct Row {
    pub(crate) placement: RowPlacement,
    pub(crate) mode: LoadMode,
    pub(crate) flash_attn: FlashAttn,
    /// llama-bench's `repack`: weights in the CPU kernels' layout.
    pub(crate) repack: bool,
    pub(crate) n_slots: Option<usize>,
    pub(crate) n_ubatch: usize,
    pub(crate) n_threads: usize,
    pub(crate) test: Test,
    pub(crate) samples_ns: Vec<u64>,
    /// Longhaul: the timed part's forward passes, every repetition's
    /// (`None` resident).
    pub(crate) steps: Option<Vec<StepCost>>,
    /// `--longhaul-prefetch auto`'s last choice after the row's repetitions.
    pub(crate) lookahead: Option<longhaul::longhaul::LookaheadChoice>,
    /// Speculative rows: the drafter and its counters over every repetition.
    pub(crate) spec: Option<(SpecType, SpecStats)>,
    pub(crate) test_time: String,
}

impl Row {
    /// Generation rows without speculation: the weight bytes a decode
    /// token reads ([`ModelDesc::decode_bytes`]) times tokens per second.
    pub(crate) fn decode_gbs(&self, d: &ModelDesc) -> Option<f64> {
        let plain = !matches!(self.spec, Some((k, _)) if k != SpecType::None);
        (self.test.n_prompt == 0 && self.test.n_gen > 0 && plain).then(|| {
            let (ts, _) = bench_out::mean_sd(&self.samples_ts());
            d.decode_bytes as f64 * ts / 1e9
        })
    }

    /// Longhaul rows: the I/O floor over all repetitions, step by step
    /// (see [`steps_floor_tps`]), in the test's tokens per second.
    pub(crate) fn io_floor_tps(&self) -> Option<f64> {
        let n = (self.test.n_prompt + self.test.n_gen) * self.samples_ns.len();
        self.steps.as_ref().map(|s| steps_floor_tps(s, n))
    }

    /// Longhaul counters over the timed part of every repetition.
    pub(crate) fn cache(&self) -> Option<CacheStats> {
        self.steps.as_deref().map(steps_total)
    }

    pub(crate) fn samples_ts(&self) -> Vec<f64> {
        let n = (self.test.n_prompt + self.test.n_gen) as f64;
        self.samples_ns
            .iter()
            .map(|&ns| n * 1e9 / ns.max(1) as f64)
            .collect()
    }
}

/// What every row shares: the model and the machine.
pub(crate) struct ModelDesc {
    pub(crate) filename: String,
    pub(crate) model_type: String,
    pub(crate) size: u64,
    pub(crate) n_params: u64,
    /// Weight bytes one decode token reads: every tensor but the routed
    /// experts and the embedding table (one row is read; all of it where
    /// the output projection is tied to it), plus `n_used / n_expert` of
    /// the routed experts.
    pub(crate) decode_bytes: u64,
}

/// llama.cpp's name for a `general.file_type`.
fn ftype_name(f: u64) -> String {
    let s = match f {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        19 => "IQ2_XXS - 2.0625 bpw",
        20 => "IQ2_XS - 2.3125 bpw",
        21 => "Q2_K - Small",
        22 => "IQ3_XS - 3.3 bpw",
        23 => "IQ3_XXS - 3.0625 bpw",
        24 => "IQ1_S - 1.5625 bpw",
        25 => "IQ4_NL - 4.5 bpw",
        26 => "IQ3_S - 3.4375 bpw",
        27 => "IQ3_S mix - 3.66 bpw",
        28 => "IQ2_S - 2.5 bpw",
        29 => "IQ2_M - 2.7 bpw",
        30 => "IQ4_XS - 4.25 bpw",
        31 => "IQ1_M - 1.75 bpw",
        32 => "BF16",
        36 => "TQ1_0 - 1.69 bpw ternary",
        37 => "TQ2_0 - 2.06 bpw ternary",
        38 => "MXFP4 MoE",
        39 => "NVFP4",
        other => return format!("ftype {other}"),
    };
    s.to_string()
}

/// The load modes (with their caches and policies) from the flags.
impl BenchArgs {
    /// `--repack` / `-nr` as one setting (default on, as llama-bench).
    pub(crate) fn repacks(&self) -> anyhow::Result<bool> {
        let flag = |name: &str, v: &Option<String>| -> anyhow::Result<Option<bool>> {
            match v.as_deref().map(str::trim) {
                None => Ok(None),
                Some("1") => Ok(Some(true)),
                Some("0") => Ok(Some(false)),
                Some(other) => anyhow::bail!(
                    "{name} {other}: give 0 or 1 (one value; run bench again for the other)"
                ),
            }
        };
        let on = flag("--repack", &self.repack)?;
        let off = flag("-nr", &self.no_repack)?;
        match (on, off) {
            (Some(a), Some(b)) if a == b => anyhow::bail!(
                "--repack {} and -nr {} contradict each other; give one of them",
                a as u8,
                b as u8
            ),
            (Some(a), _) => Ok(a),
            (None, Some(b)) => Ok(!b),
            (None, None) => Ok(true),
        }
    }
}

fn load_modes(a: &BenchArgs) -> anyhow::Result<Vec<LoadMode>> {
    let mut names: Vec<String> = a.load_mode.iter().map(|s| s.trim().to_string()).collect();
    for v in &a.mmap {
        names.push(
            match v.trim() {
                "1" => "mmap",
                "0" => "read",
                other => anyhow::bail!(
                    "-mmp {other}: give 0 (read into memory) or 1 (memory-map), comma-separated"
                ),
            }
            .into(),
        );
    }
    if names.is_empty() {
        names.push(
            if a.longhaul.longhaul {
                "longhaul"
            } else {
                "mmap"
            }
            .into(),
        );
    }
    let wants_longhaul = names.iter().any(|n| n == "longhaul");
    if a.longhaul.longhaul && !wants_longhaul {
        anyhow::bail!("--longhaul conflicts with --load-mode {}; add longhaul to the --load-mode list or drop --longhaul", names.join(","));
    }
    if !wants_longhaul && a.longhaul.cache.is_some() {
        anyhow::bail!("--longhaul-cache only applies to longhaul rows; add --longhaul or --load-mode longhaul");
    }
    let policies: Vec<Policy> = a
        .longhaul
        .policy
        .split(',')
        .map(|p| p.trim().parse::<Policy>().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<_>>()?;
    let mut modes = Vec::new();
    for n in &names {
        match n.as_str() {
            // llama-bench's names too: auto is mmap here, none is read.
            "mmap" | "auto" => modes.push(LoadMode::Mmap),
            "longhaul" => {
                let Some(list) = a.longhaul.cache.as_deref() else {
                    anyhow::bail!("--load-mode longhaul needs --longhaul-cache GIB[,GIB...] (expert cache budgets, e.g. 0.5,1,2)");
                };
                for gib in list.split(',').map(str::trim) {
                    let budget = match gib.parse::<f64>() {
                        Ok(g) if g > 0.0 && g.is_finite() => (g * (1u64 << 30) as f64) as u64,
                        _ => anyhow::bail!("--longhaul-cache {gib}: give positive numbers of GiB, comma-separated (e.g. 0.5,1,2); `auto` is for run and chat"),
                    };
                    for &policy in &policies {
                        modes.push(LoadMode::Longhaul {
                            gib: gib.to_string(),
                            budget,
                            policy,
                        });
                    }
                }
            }
            "read" | "none" => modes.push(LoadMode::Read),
            "dio" => modes.push(LoadMode::Dio),
            other => anyhow::bail!(
                "--load-mode {other}: use mmap, read (none), dio or longhaul (comma-separated for several)"
            ),
        }
    }
    Ok(modes)
}

/// The tests in llama-bench's order: per depth, prompts, generations, pairs.
fn tests(a: &BenchArgs) -> anyhow::Result<Vec<Test>> {
    let mut pg = Vec::new();
    for s in &a.pg {
        let parsed = s
            .split_once(',')
            .and_then(|(p, g)| Some((p.trim().parse().ok()?, g.trim().parse().ok()?)));
        match parsed {
            Some((p, g)) if p > 0 || g > 0 => pg.push((p, g)),
            _ => anyhow::bail!(
                "-pg {s}: give prompt and generation sizes as PP,TG (e.g. -pg 512,128)"
            ),
        }
    }
    let mut out = Vec::new();
    for &n_depth in &a.n_depth {
        let t = |n_prompt, n_gen| Test {
            n_prompt,
            n_gen,
            n_depth,
        };
        out.extend(a.n_prompt.iter().filter(|&&n| n > 0).map(|&n| t(n, 0)));
        out.extend(a.n_gen.iter().filter(|&&n| n > 0).map(|&n| t(0, n)));
        out.extend(pg.iter().map(|&(p, g)| t(p, g)));
    }
    if out.is_empty() {
        anyhow::bail!("no test to run: give a positive -p, -n or -pg");
    }
    Ok(out)
}

/// Deterministic pseudo-random tokens, like llama-bench's.
fn tokens(n: usize, salt: u32, n_vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_add(salt).wrapping_mul(2654435761) >> 7) % n_vocab.max(1))
        .collect()
}

fn stats<B: Backend>(engine: &Engine<B>) -> Option<CacheStats> {
    engine.longhaul_stats().map(|(total, _)| total)
}

/// One repetition: fills the depth, then times the test. Returns the
/// nanoseconds and, in longhaul mode, the cost of each forward pass of the
/// timed part (the prompt's one, then one per generated token).
fn run_once<B: Backend>(
    engine: &Engine<B>,
    t: &Test,
    n_vocab: u32,
) -> anyhow::Result<(u64, Option<Vec<StepCost>>)> {
    let mut kv = engine.new_kv()?;
    if t.n_depth > 0 {
        engine.eval(&mut kv, &tokens(t.n_depth, 7, n_vocab), Logits::Last)?;
    }
    let prompt = tokens(t.n_prompt, 0, n_vocab);
    let gen = tokens(t.n_gen, 1 << 20, n_vocab);
    let t0 = Instant::now();
    let mut clock = StepClock::start(stats(engine));
    if !prompt.is_empty() {
        engine.eval(&mut kv, &prompt, Logits::Last)?;
        clock.step(stats(engine));
    }
    for &tk in &gen {
        engine.eval(&mut kv, &[tk], Logits::Last)?;
        clock.step(stats(engine));
    }
    let ns = t0.elapsed().as_nanos() as u64;
    Ok((ns, clock.steps()))
}

/// One repetition of a speculative row: the depth, then the text (both
/// untimed, the draft model's sequence too), then `t.n_gen` tokens decoded
/// greedily past the first (end of generation ignored, as `--ignore-eos`
/// does), drafting with `sp`. Returns the decode's nanoseconds, its
/// forward passes' longhaul costs and the drafter's counters.
fn run_spec<B: Backend + 'static>(
    engine: &std::sync::Arc<Engine<B>>,
    t: &Test,
    n_vocab: u32,
    text: &[u32],
    sp: &SpecParams,
    draft: Option<&std::sync::Arc<Engine<B>>>,
) -> anyhow::Result<(u64, Option<Vec<StepCost>>, SpecStats)> {
    let mut kv = engine.new_kv()?;
    let held = tokens(t.n_depth, 7, n_vocab);
    if !held.is_empty() {
        engine.eval(&mut kv, &held, Logits::Last)?;
    }
    let mut drafter = match (sp.kind, draft) {
        (SpecType::DraftSimple, Some(e)) => {
            let mut d = ModelDrafter::new(e.clone(), &engine.tokenizer, sp.draft)?;
            d.prime(&[&held[..], text].concat())?;
            Some(Drafter::Model(Box::new(d)))
        }
        // The head catches up on the prompt in the first draft (timed).
        (SpecType::DraftMtp, _) => Some(Drafter::Model(Box::new(MtpDrafter::new(
            engine.clone(),
            engine.params.n_ctx,
            sp.draft,
        )?))),
        _ => sp.drafter(),
    };
    let mut greedy = SamplerParams::greedy();
    greedy.ban_eog(&engine.tokenizer.eog_ids());
    let mut sampler = Sampler::new(greedy);
    let n_predict = t.n_gen + 1;
    let (_, st) = match drafter.as_mut() {
        Some(d) => {
            engine
                .generate_spec_after(&mut kv, &held, text, n_predict, &mut sampler, d, |_| true)?
        }
        None => engine.generate(&mut kv, text, n_predict, &mut sampler, |_| true)?,
    };
    if st.n_gen != n_predict {
        anyhow::bail!(
            "a speculative row generated {} of {n_predict} tokens; the context ran out (a shorter -f text or -n)",
            st.n_gen
        );
    }
    Ok((
        st.gen_time.as_nanos() as u64,
        st.gen_io.map(|_| st.gen_steps),
        st.spec,
    ))
}

/// What the runs of every placement add to.
struct Out {
    rows: Vec<Row>,
    desc: Option<ModelDesc>,
    /// `--trace-experts` is attached to the first engine only: routing does
    /// not depend on the load mode or the placement.
    traced: bool,
}

/// The shared settings of every row.
struct Settings<'a> {
    a: &'a BenchArgs,
    model: &'a std::path::Path,
    modes: &'a [LoadMode],
    tests: &'a [Test],
    threads: &'a [usize],
    n_ctx: usize,
    /// The drafters of speculative rows (empty: llama-bench's tests).
    spec: &'a [SpecType],
    /// The text speculative generations follow.
    spec_text: &'a str,
}

pub fn bench(a: BenchArgs) -> anyhow::Result<()> {
    if a.survey.survey {
        return crate::survey::survey(&a);
    }
    let Some(model) = a.model.clone() else {
        anyhow::bail!("give a model (-m FILE), or --survey for the kernel survey");
    };
    let format = a.output.as_str();
    if !matches!(format, "md" | "json" | "jsonl" | "csv") {
        anyhow::bail!("-o {format}: use md, json, jsonl or csv");
    }
    if a.reps == 0 {
        anyhow::bail!("-r 0: give at least one repetition");
    }
    if let Some(bw) = a.gpu_bw.filter(|b| !(*b > 0.0 && b.is_finite())) {
        anyhow::bail!("--gpu-bw {bw}: give the device's memory bandwidth in GB/s (e.g. 4800)");
    }
    a.repacks()?;
    let modes = load_modes(&a)?;
    let tests = tests(&a)?;
    let spec = a.spec.kinds()?;
    let spec_text = if spec.is_empty() {
        String::new()
    } else {
        if !a.pg.is_empty() {
            anyhow::bail!("-pg with --spec-type: speculative rows time generation alone; give -p and -n instead");
        }
        a.spec.text()?
    };
    let ngl: Vec<&str> = a.n_gpu_layers.iter().map(String::as_str).collect();
    let placements = placement::resolve_all(&model, &ngl, a.device.as_deref())?;
    let threads = if a.threads.is_empty() {
        vec![longhaul::threads::available()]
    } else {
        a.threads
            .iter()
            .map(|&t| longhaul::threads::capped(Some(t)))
            .collect()
    };
    // A speculative generation follows the text: at most a token per byte
    // and BOS, then its tokens and the one sampled after them.
    let text_room = if spec.is_empty() {
        0
    } else {
        spec_text.len() + 4
    };
    let n_ctx = tests
        .iter()
        .map(|t| {
            t.n_depth + (t.n_prompt + t.n_gen).max(text_room * usize::from(t.n_gen > 0) + t.n_gen)
        })
        .max()
        .unwrap_or(1)
        .max(1);
    let settings = Settings {
        a: &a,
        model: &model,
        modes: &modes,
        tests: &tests,
        threads: &threads,
        n_ctx,
        spec: &spec,
        spec_text: &spec_text,
    };
    let mut out = Out {
        rows: Vec::new(),
        desc: None,
        traced: false,
    };
    for (g, placed) in &placements {
        eprintln!("placement (-ngl {g}): {}", placed.summary);
        let rp = RowPlacement::new(*g, placed);
        longhaul::with_backend!(&placed.placement, |backend| bench_on(
            backend, &settings, &rp, &mut out
        ))?;
    }
    let Out { rows, desc, .. } = out;
    let Some(desc) = desc else { return Ok(()) };
    match format {
        "json" => {
            let objs: Vec<String> = rows
                .iter()
                .map(|r| bench_out::to_json(&bench_out::fields(&desc, r), true))
                .collect();
            println!("[\n{}\n]", objs.join(",\n"));
        }
        "csv" => bench_out::print_csv(&desc, &rows),
        "md" => bench_out::print_md(&a, &desc, &rows),
        _ => {}
    }
    Ok(())
}

/// Every row of one placement: load modes, then ubatch sizes, thread
/// counts and tests, as llama-bench nests them.
fn bench_on<B: Backend + 'static>(
    backend: B,
    p: &Settings,
    rp: &RowPlacement,
    out: &mut Out,
) -> anyhow::Result<()> {
    let a = p.a;
    let draft = match &a.spec.draft.draft_model {
        Some(path) if p.spec.contains(&SpecType::DraftSimple) => {
            let params = EngineParams {
                n_ctx: p.n_ctx,
                n_ubatch: DEFAULT_UBATCH,
                kv_type: GgmlType::F16,
                ..Default::default()
            };
            let e = ModelDrafter::load_model(path, backend.clone(), params)
                .with_context(|| format!("draft model {}", path.display()))?;
            let bytes = longhaul::draft::held_bytes(&e.model, p.n_ctx, 1, GgmlType::F16);
            crate::report::draft_model_start(&e, bytes);
            Some(std::sync::Arc::new(e))
        }
        _ => None,
    };
    for mode in p.modes {
        for &fa in &a.flash_attn {
            bench_mode(backend.clone(), p, rp, mode, fa, draft.as_ref(), out)?;
        }
    }
    Ok(())
}

/// The rows of one load mode and attention path (one engine).
fn bench_mode<B: Backend + 'static>(
    backend: B,
    p: &Settings,
    rp: &RowPlacement,
    mode: &LoadMode,
    flash_attn: FlashAttn,
    draft: Option<&std::sync::Arc<Engine<B>>>,
    out: &mut Out,
) -> anyhow::Result<()> {
    let a = p.a;
    {
        let longhaul = match mode {
            LoadMode::Mmap | LoadMode::Read | LoadMode::Dio => None,
            LoadMode::Longhaul { budget, policy, .. } => Some(LonghaulParams {
                budget: CacheBudget::Bytes(*budget),
                policy: *policy,
                prefetch: a.longhaul.prefetch,
                verify: a.longhaul.verify,
                direct_io: a.longhaul.direct_io()?,
                uring: a.longhaul.uring()?,
            }),
        };
        // Longhaul skips warmup: no expert byte is read before the first real run.
        let warmup = !a.no_warmup && longhaul.is_none();
        let params = EngineParams {
            n_ctx: p.n_ctx,
            n_ubatch: DEFAULT_UBATCH,
            kv_type: GgmlType::F16,
            longhaul,
            no_mmap: *mode == LoadMode::Read,
            direct_io: *mode == LoadMode::Dio,
            no_repack: !a.repacks()?,
            flash_attn,
            mtp: p.spec.contains(&SpecType::DraftMtp),
            ..Default::default()
        };
        let mut engine = Engine::load(p.model, backend, params)
            .with_context(|| format!("loading {}", p.model.display()))?;
        if !out.traced {
            a.trace.attach(&mut engine)?;
            out.traced = true;
        }
        // Shared with an MTP drafter during a row.
        let mut engine = std::sync::Arc::new(engine);
        if out.desc.is_none() {
            out.desc = Some(describe(p.model, &engine));
        }
        let n_vocab = engine.model.hp.n_vocab as u32;
        let n_slots = engine.longhaul.as_ref().map(|i| i.n_slots);
        let spec_text = if p.spec.is_empty() {
            Vec::new()
        } else {
            engine.tokenize(p.spec_text)?
        };
        if let Some(d) = draft {
            longhaul::draft::check_vocab(&engine.tokenizer, &d.tokenizer)?;
        }
        for &ub in &a.ubatch {
            std::sync::Arc::get_mut(&mut engine)
                .context("the engine is still shared with a drafter")?
                .params
                .n_ubatch = ub.max(1);
            for &t in p.threads {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(t.max(1))
                    .build()?;
                for test in p.tests {
                    // llama-bench's test, or one speculative row per drafter
                    // (a prompt test once, in a `none` row).
                    let kinds: Vec<Option<SpecType>> = match (p.spec, test.n_gen) {
                        ([], _) => vec![None],
                        (_, 0) => vec![Some(SpecType::None)],
                        (kinds, _) => kinds.iter().copied().map(Some).collect(),
                    };
                    for kind in kinds {
                        let sp = match kind {
                            Some(k) if test.n_gen > 0 => Some(p.a.spec.params(k)?),
                            _ => None,
                        };
                        let once = || match &sp {
                            Some(sp) => run_spec(&engine, test, n_vocab, &spec_text, sp, draft),
                            None => run_once(&engine, test, n_vocab)
                                .map(|(ns, c)| (ns, c, SpecStats::default())),
                        };
                        let row = pool.install(|| -> anyhow::Result<Row> {
                            if warmup {
                                once()?;
                            }
                            let test_time = longhaul::clock::utc_rfc3339_now();
                            let mut samples_ns = Vec::new();
                            let mut steps: Option<Vec<StepCost>> = None;
                            let mut spec = SpecStats::default();
                            for _ in 0..a.reps {
                                let (ns, c, sp) = once()?;
                                samples_ns.push(ns);
                                if let Some(c) = c {
                                    steps.get_or_insert_with(Vec::new).extend(c);
                                }
                                spec.add(&sp);
                            }
                            Ok(Row {
                                placement: rp.clone(),
                                mode: mode.clone(),
                                flash_attn,
                                repack: a.repacks()?,
                                n_slots,
                                n_ubatch: ub,
                                n_threads: t,
                                test: *test,
                                samples_ns,
                                steps,
                                lookahead: engine.model.lookahead_choice(),
                                spec: kind.map(|k| (k, spec)),
                                test_time,
                            })
                        })?;
                        if let (Some(d), "jsonl") = (&out.desc, a.output.as_str()) {
                            // Like llama-bench: each row as soon as it is measured.
                            println!("{}", bench_out::to_json(&bench_out::fields(d, &row), false));
                        }
                        out.rows.push(row);
                    }
                }
            }
        }
    }
    Ok(())
}

fn describe<B: Backend>(path: &std::path::Path, engine: &Engine<B>) -> ModelDesc {
    let file = &engine.model.file;
    let n_params: u64 = file
        .tensors()
        .iter()
        .map(|t| t.dims.iter().product::<u64>())
        .sum();
    let ftype = file
        .metadata()
        .get_u64("general.file_type")
        .ok()
        .map(ftype_name)
        .unwrap_or_default();
    let label = if n_params >= 1_000_000_000 {
        format!("{:.1}B", n_params as f64 / 1e9)
    } else {
        format!("{:.0}M", n_params as f64 / 1e6)
    };
    let hp = &engine.model.hp;
    let tied = file.tensor("output.weight").is_none();
    let (mut dense, mut routed) = (0u64, 0u64);
    for t in file.tensors().iter().filter(|t| !hp.is_skipped(&t.name)) {
        if longhaul::model::blocks::ffn::is_routed(&t.name) {
            routed += t.len;
        } else if t.name != "token_embd.weight" || tied {
            dense += t.len;
        }
    }
    let decode_bytes = match hp.n_expert {
        0 => dense + routed,
        n => dense + routed * hp.n_expert_used as u64 / n as u64,
    };
    ModelDesc {
        filename: path.display().to_string(),
        model_type: format!("{} {label} {ftype}", engine.model.hp.arch),
        size: file.total_tensor_bytes(),
        n_params,
        decode_bytes,
    }
}
