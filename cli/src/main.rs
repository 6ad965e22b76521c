//! `longhaul`: run, chat with, inspect and benchmark GGUF models.

mod advise;
mod advise_svg;
mod args;
mod bench;
mod bench_out;
mod chat;
mod demo;
mod devices;
mod gen_model;
mod inspect;
mod report;
mod trace_args;

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};
use longhaul::backend::Backend;
use longhaul::engine::{Engine, EngineParams, GenStats};
use longhaul::kv::KvCache;
use longhaul::sample::{Sampler, SamplerParams};
use longhaul::tokenizer::StreamDecoder;

use args::{ModelArgs, SampleArgs};

#[derive(Parser)]
#[command(
    name = "longhaul",
    version,
    about = "Run Mixture-of-Experts GGUF models whose experts do not fit in memory"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text from a prompt.
    Run(RunArgs),
    /// Chat interactively through the model's chat template.
    Chat(ChatArgs),
    /// Show a GGUF file's architecture, hyperparameters, tensors and experts.
    Inspect(inspect::InspectArgs),
    /// Write a small synthetic MoE model (if absent) and generate from it.
    Demo(demo::DemoArgs),
    /// Measure prompt processing and generation speed, llama-bench style.
    Bench(bench::BenchArgs),
    /// Write a deterministic synthetic MoE model shaped like a real one.
    GenModel(gen_model::GenModelArgs),
    /// Serve the model over HTTP (OpenAI- and llama.cpp-compatible API).
    Serve(longhaul_server::ServeArgs),
    /// Replay a routing trace (--trace-experts) through LRU, LFU and Belady for every cache size.
    Advise(advise::AdviseArgs),
    /// List GPU adapters and say which one -ngl auto would use.
    Devices(devices::DevicesArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sample: SampleArgs,
    #[command(flatten)]
    trace: trace_args::TraceArgs,
    /// Prompt text.
    #[arg(short = 'p', long = "prompt", default_value = "")]
    prompt: String,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file")]
    file: Option<std::path::PathBuf>,
    /// Tokens to predict (-1 = until end of generation or full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    /// Do not print the prompt before the generated text.
    #[arg(long = "no-display-prompt")]
    no_display_prompt: bool,
}

#[derive(clap::Args)]
struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sample: SampleArgs,
    /// A system message at the start of the conversation (-sys).
    #[arg(long = "system-prompt")]
    pub system_prompt: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 1024)]
    n_predict: usize,
    /// Print each rendered prompt and its token count on stderr before the reply.
    #[arg(long = "verbose-prompt")]
    verbose_prompt: bool,
}

fn print_stats(engine_load: std::time::Duration, s: &GenStats) {
    eprintln!();
    eprintln!(
        "load time        = {:10.2} ms",
        engine_load.as_secs_f64() * 1e3
    );
    eprintln!(
        "prompt eval time = {:10.2} ms / {:5} tokens ({:8.2} ms per token, {:8.2} tokens per second)",
        s.prompt_time.as_secs_f64() * 1e3,
        s.n_prompt,
        s.prompt_time.as_secs_f64() * 1e3 / s.n_prompt.max(1) as f64,
        s.prompt_tps()
    );
    eprintln!(
        "       eval time = {:10.2} ms / {:5} tokens ({:8.2} ms per token, {:8.2} tokens per second)",
        s.gen_time.as_secs_f64() * 1e3,
        s.n_gen,
        s.gen_time.as_secs_f64() * 1e3 / s.n_gen.max(1) as f64,
        s.gen_tps()
    );
}

/// Generates from `prompt`, streaming text to stdout.
fn stream<B: Backend>(
    engine: &Engine<B>,
    prompt: &[u32],
    n_predict: usize,
    sampler: &mut Sampler,
) -> anyhow::Result<(Vec<u32>, GenStats)> {
    let mut kv = engine.new_kv()?;
    stream_kv(engine, &mut kv, prompt, n_predict, sampler)
}

/// [`stream`] continuing the sequence held by `kv`.
fn stream_kv<B: Backend>(
    engine: &Engine<B>,
    kv: &mut KvCache<B>,
    prompt: &[u32],
    n_predict: usize,
    sampler: &mut Sampler,
) -> anyhow::Result<(Vec<u32>, GenStats)> {
    let mut dec = StreamDecoder::new(false);
    let mut out = std::io::stdout().lock();
    let mut io_err = None;
    let res = engine.generate(kv, prompt, n_predict, sampler, |tok| {
        let text = dec.push(&engine.tokenizer, tok);
        if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
            io_err = Some(e);
            return false;
        }
        true
    })?;
    write!(out, "{}", dec.finish())?;
    out.flush()?;
    if let Some(e) = io_err {
        return Err(e).context("writing to stdout");
    }
    Ok(res)
}

fn run(a: RunArgs) -> anyhow::Result<()> {
    let params = a.model.engine_params()?;
    let sampling = a.sample.params()?;
    let prompt = match &a.file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("reading prompt file {}", f.display()))?,
        None => a.prompt.clone(),
    };
    let placed = a.model.placement.resolve(&a.model.model)?;
    eprintln!("placement: {}", placed.summary);
    a.model.with_threads(|| {
        longhaul::with_backend!(placed.placement, |backend| run_on(
            backend, &a, params, sampling, &prompt
        ))
    })?
}

/// `run` on one backend.
fn run_on<B: Backend>(
    backend: B,
    a: &RunArgs,
    params: EngineParams,
    sampling: SamplerParams,
    prompt: &str,
) -> anyhow::Result<()> {
    let mut engine =
        Engine::load_with_progress(&a.model.model, backend, params, Some(report::load_bar()))?;
    a.trace.attach(&mut engine)?;
    report::longhaul_start(&engine);
    let tokens = engine.tokenize(prompt)?;
    if tokens.is_empty() {
        anyhow::bail!("the prompt is empty; pass one with -p or -f");
    }
    let n_predict = if a.n_predict < 0 {
        usize::MAX
    } else {
        a.n_predict as usize
    };
    if !a.no_display_prompt {
        print!("{prompt}");
    }
    let mut sampler = Sampler::new(sampling);
    let (_, stats) = stream(&engine, &tokens, n_predict, &mut sampler)?;
    println!();
    print_stats(engine.load_time, &stats);
    report::longhaul_summary(&engine);
    Ok(())
}

fn chat(a: ChatArgs) -> anyhow::Result<()> {
    let params = a.model.engine_params()?;
    let sampling = a.sample.params()?;
    let placed = a.model.placement.resolve(&a.model.model)?;
    eprintln!("placement: {}", placed.summary);
    a.model.with_threads(|| {
        longhaul::with_backend!(placed.placement, |backend| chat_on(
            backend, &a, params, sampling
        ))
    })?
}

/// `chat` on one backend.
fn chat_on<B: Backend>(
    backend: B,
    a: &ChatArgs,
    params: EngineParams,
    sampling: SamplerParams,
) -> anyhow::Result<()> {
    let engine =
        Engine::load_with_progress(&a.model.model, backend, params, Some(report::load_bar()))?;
    report::longhaul_start(&engine);
    let opts = chat::ChatOptions {
        system_prompt: a.system_prompt.as_deref(),
        n_predict: a.n_predict,
        verbose_prompt: a.verbose_prompt,
    };
    let mut sampler = Sampler::new(sampling);
    chat::chat_loop(
        &engine,
        &opts,
        &mut sampler,
        &a.model.model.display().to_string(),
    )
}

fn main() {
    longhaul::alloc::keep_freed_buffers();
    let cli = Cli::parse_from(args::normalize_args(std::env::args()));
    let res = match cli.cmd {
        Cmd::Run(a) => run(a),
        Cmd::Chat(a) => chat(a),
        Cmd::Inspect(a) => inspect::inspect(a),
        Cmd::Demo(a) => demo::demo(a),
        Cmd::Bench(a) => bench::bench(a),
        Cmd::GenModel(a) => gen_model::gen_model(a),
        Cmd::Serve(a) => longhaul_server::run(a),
        Cmd::Advise(a) => advise::advise(a),
        Cmd::Devices(a) => devices::devices(a),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
