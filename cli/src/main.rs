//! `longhaul`: run, chat with, inspect and benchmark GGUF models.

mod advise;
mod advise_svg;
mod args;
mod bench;
mod bench_out;
mod chat;
mod demo;
mod devices;
mod errors;
mod gen_model;
mod inspect;
mod report;
mod survey;
mod survey_svg;
mod survey_table;
mod trace_args;

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};
use longhaul::backend::Backend;
use longhaul::constrain::Constraint;
use longhaul::draft::{ModelDrafter, MtpDrafter};
use longhaul::engine::{Engine, EngineParams, GenStats};
use longhaul::sample::{Sampler, SamplerParams};
use longhaul::spec::{Drafter, SpecParams, SpecType};
use longhaul::state::SeqState;
use longhaul::tokenizer::StreamDecoder;

use args::{ModelArgs, SampleArgs};

#[derive(Parser, Debug)]
#[command(
    name = "longhaul",
    version,
    about = "Run Mixture-of-Experts GGUF models whose experts do not fit in memory"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
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

#[derive(clap::Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sample: SampleArgs,
    #[command(flatten)]
    trace: trace_args::TraceArgs,
    #[command(flatten)]
    spec: longhaul_server::args::SpecArgs,
    /// Prompt text.
    #[arg(
        short = 'p',
        long = "prompt",
        default_value = "",
        allow_hyphen_values = true
    )]
    prompt: String,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file")]
    file: Option<std::path::PathBuf>,
    /// Tokens to predict (-1 = until end of generation or full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    /// Do not print the prompt before the generated text.
    #[arg(long = "no-display-prompt", overrides_with = "display_prompt")]
    no_display_prompt: bool,
    /// Print the prompt before the generated text (the default).
    #[arg(long = "display-prompt", overrides_with = "no_display_prompt")]
    display_prompt: bool,
    /// Conversation mode (-cnv), as llama.cpp's: the chat loop `longhaul
    /// chat` runs, with the prompt (-p or -f) as the first user message.
    #[arg(long = "conversation", overrides_with = "no_conversation")]
    conversation: bool,
    /// Plain completion of the prompt (-no-cnv; the default for run).
    #[arg(long = "no-conversation", overrides_with = "conversation")]
    no_conversation: bool,
    /// With -cnv: answer the prompt, then exit (-st).
    #[arg(long = "single-turn")]
    single_turn: bool,
    /// A system message at the start of the conversation (-sys; with -cnv).
    #[arg(long = "system-prompt", allow_hyphen_values = true)]
    system_prompt: Option<String>,
    /// Process escapes in the prompt (-e; the default, as in llama.cpp):
    /// \n \r \t \' \" \\ and \xHH.
    #[arg(long = "escape", overrides_with = "no_escape")]
    escape: bool,
    /// Take the prompt's backslashes literally.
    #[arg(long = "no-escape", overrides_with = "escape")]
    no_escape: bool,
    #[command(flatten)]
    color: ColorArg,
}

/// llama.cpp's `-co/--color`.
#[derive(clap::Args, Debug)]
struct ColorArg {
    /// Accepted for llama.cpp compatibility (-co): longhaul prints the
    /// prompt and the reply without colours.
    #[arg(
        long = "color",
        value_name = "on|off|auto",
        num_args = 0..=1,
        default_missing_value = "auto",
        value_parser = ["on", "off", "auto", "true", "false", "1", "0", "enabled", "disabled"]
    )]
    color: Option<String>,
}

#[derive(clap::Args, Debug)]
struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sample: SampleArgs,
    #[command(flatten)]
    spec: longhaul_server::args::SpecArgs,
    /// A system message at the start of the conversation (-sys).
    #[arg(long = "system-prompt")]
    pub system_prompt: Option<String>,
    #[command(flatten)]
    color: ColorArg,
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

/// Generates from `prompt` after the sequence `kv` holds, streaming text
/// to stdout; with `drafter`, speculatively.
fn stream_kv<B: Backend>(
    engine: &Engine<B>,
    kv: &mut SeqState<B>,
    prompt: &[u32],
    n_predict: usize,
    sampler: &mut Sampler,
    constraint: Option<&mut Constraint>,
    drafter: Option<&mut Drafter>,
) -> anyhow::Result<(Vec<u32>, GenStats)> {
    let mut dec = StreamDecoder::new(false);
    let mut out = std::io::stdout().lock();
    let mut io_err = None;
    let on_token = |tok| {
        let text = dec.push(&engine.tokenizer, tok);
        if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
            io_err = Some(e);
            return false;
        }
        true
    };
    let res = match drafter {
        Some(d) if constraint.is_none() => {
            engine.generate_spec(kv, prompt, n_predict, sampler, d, on_token)?
        }
        _ => engine.generate_constrained(kv, prompt, n_predict, sampler, constraint, on_token)?,
    };
    if let Some(e) = io_err {
        return Err(errors::stdout_error(e));
    }
    errors::write_stdout(&mut out, &dec.finish())?;
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
    let prompt = if a.no_escape {
        prompt
    } else {
        args::process_escapes(&prompt)?
    };
    let spec = a.spec.params()?;
    if a.conversation {
        return run_conversation(a, prompt);
    }
    if a.system_prompt.is_some() {
        anyhow::bail!(
            "--system-prompt (-sys) starts a conversation; add -cnv (or use `longhaul chat`)"
        );
    }
    if a.single_turn {
        anyhow::bail!("--single-turn (-st) applies to a conversation; add -cnv");
    }
    let placed = a.model.placement.resolve(&a.model.model)?;
    if a.model.log.info() {
        eprintln!("placement: {}", placed.summary);
    }
    a.model.with_threads(|| {
        longhaul::with_backend!(placed.placement, |backend| run_on(
            backend, &a, params, sampling, spec, &prompt
        ))
    })?
}

/// `run` on one backend.
fn run_on<B: Backend + 'static>(
    backend: B,
    a: &RunArgs,
    mut params: EngineParams,
    sampling: SamplerParams,
    spec: SpecParams,
    prompt: &str,
) -> anyhow::Result<()> {
    let info = a.model.log.info();
    let draft_params = params.clone();
    // Its memory stays out of `--longhaul-cache auto`.
    params.draft_model = a.spec.draft_model(&spec);
    params.mtp = spec.kind == SpecType::DraftMtp;
    let mut engine = Engine::load_with_progress(
        &a.model.model,
        backend.clone(),
        params,
        info.then(report::load_bar),
    )?;
    a.model.lock_memory();
    a.trace.attach(&mut engine)?;
    let engine = std::sync::Arc::new(engine);
    let sampling = model_sampling(sampling, &a.sample, &engine)?;
    if info {
        report::model_start(&engine);
        report::longhaul_start(&engine);
    }
    // Encoding takes 125-180 bytes of memory per byte of text: a prompt
    // that cannot fit the context by its length alone fails before it.
    let at_least = engine.tokenizer.min_tokens(prompt, true, true);
    if at_least > engine.params.n_ctx {
        anyhow::bail!(
            "the prompt has at least {at_least} tokens but the context holds {}; raise -c/--ctx-size",
            engine.params.n_ctx
        );
    }
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
        errors::write_stdout(&mut std::io::stdout(), prompt)?;
    }
    // A grammar that does not compile fails before any output.
    let mut constraint = match a.sample.constraint()? {
        Some(spec) => Some(engine.constraint(&spec)?),
        None => None,
    };
    let mut sampler = Sampler::new(sampling);
    let mut drafter = load_drafter(&a.spec, spec, backend, draft_params, &engine, info)?;
    if drafter.is_some() && constraint.is_some() {
        anyhow::bail!(
            "--spec-type with a grammar or JSON schema is not supported yet; drop one of them"
        );
    }
    let mut kv = engine.new_kv()?;
    let (_, stats) = stream_kv(
        &engine,
        &mut kv,
        &tokens,
        n_predict,
        &mut sampler,
        constraint.as_mut(),
        drafter.as_mut(),
    )?;
    errors::write_stdout(&mut std::io::stdout(), "\n")?;
    if info {
        print_stats(engine.load_time, &stats);
        if drafter.is_some() {
            report::speculation(spec.kind, &stats);
        }
        report::longhaul_summary(&engine);
        report::longhaul_phases(&stats);
    }
    Ok(())
}

/// The drafter `spec` names: an n-gram one, the target's MTP head
/// (`draft-mtp`, loaded with the target), or the draft model of `-md`,
/// loaded on `backend` with the target's settings and context size.
fn load_drafter<B: Backend + 'static>(
    args: &longhaul_server::args::SpecArgs,
    spec: SpecParams,
    backend: B,
    mut params: EngineParams,
    engine: &std::sync::Arc<Engine<B>>,
    info: bool,
) -> anyhow::Result<Option<Drafter>> {
    if spec.kind == SpecType::DraftMtp {
        let d = MtpDrafter::new(engine.clone(), engine.params.n_ctx, spec.draft)?;
        if info {
            report::mtp_start(engine, d.bytes());
        }
        return Ok(Some(Drafter::Model(Box::new(d))));
    }
    let (SpecType::DraftSimple, Some(path)) = (spec.kind, &args.draft.draft_model) else {
        return Ok(spec.drafter());
    };
    params.n_ctx = engine.params.n_ctx;
    let d = ModelDrafter::load(path, backend, params, &engine.tokenizer, spec.draft)
        .with_context(|| format!("draft model {}", path.display()))?;
    if info {
        report::draft_model_start(d.engine(), d.bytes());
    }
    Ok(Some(Drafter::Model(Box::new(d))))
}

/// The sampler settings for the loaded model: `--logit-bias` ids checked
/// against its vocabulary, and its end-of-generation tokens banned under
/// `--ignore-eos`.
fn model_sampling<B: Backend>(
    mut sampling: SamplerParams,
    a: &SampleArgs,
    engine: &Engine<B>,
) -> anyhow::Result<SamplerParams> {
    sampling
        .check_vocab(engine.tokenizer.n_vocab())
        .map_err(|e| anyhow::anyhow!("{}: {e}", e.flag()))?;
    if a.ignore_eos {
        sampling.ban_eog(&engine.tokenizer.eog_ids());
    }
    Ok(sampling)
}

/// `run -cnv`: the chat loop, as llama.cpp's conversation mode; the
/// prompt, when given, is the first user message.
fn run_conversation(a: RunArgs, prompt: String) -> anyhow::Result<()> {
    if a.trace.trace_experts.is_some() {
        anyhow::bail!("--trace-experts records `run` without -cnv; drop one of them");
    }
    let chat_args = ChatArgs {
        model: a.model,
        sample: a.sample,
        spec: a.spec,
        system_prompt: a.system_prompt,
        color: a.color,
        n_predict: usize::try_from(a.n_predict).unwrap_or(usize::MAX),
        verbose_prompt: false,
    };
    let first = Some(prompt).filter(|p| !p.is_empty());
    if a.single_turn && first.is_none() {
        anyhow::bail!("--single-turn (-st) answers the prompt; give one with -p or -f");
    }
    chat(chat_args, first, a.single_turn)
}

/// The chat loop; `first`, when given, is the first user message (read
/// before stdin), and `single_turn` ends the loop after its reply.
fn chat(a: ChatArgs, first: Option<String>, single_turn: bool) -> anyhow::Result<()> {
    let params = a.model.engine_params()?;
    let sampling = a.sample.params()?;
    let spec = a.spec.params()?;
    let placed = a.model.placement.resolve(&a.model.model)?;
    if a.model.log.info() {
        eprintln!("placement: {}", placed.summary);
    }
    a.model.with_threads(|| {
        longhaul::with_backend!(placed.placement, |backend| chat_on(
            backend,
            &a,
            params,
            sampling,
            spec,
            first.clone(),
            single_turn
        ))
    })?
}

/// `chat` on one backend.
fn chat_on<B: Backend + 'static>(
    backend: B,
    a: &ChatArgs,
    mut params: EngineParams,
    sampling: SamplerParams,
    spec: SpecParams,
    mut first: Option<String>,
    single_turn: bool,
) -> anyhow::Result<()> {
    let info = a.model.log.info();
    let draft_params = params.clone();
    // Its memory stays out of `--longhaul-cache auto`.
    params.draft_model = a.spec.draft_model(&spec);
    params.mtp = spec.kind == SpecType::DraftMtp;
    let engine = std::sync::Arc::new(Engine::load_with_progress(
        &a.model.model,
        backend.clone(),
        params,
        info.then(report::load_bar),
    )?);
    a.model.lock_memory();
    let sampling = model_sampling(sampling, &a.sample, &engine)?;
    if info {
        report::model_start(&engine);
        report::longhaul_start(&engine);
    }
    // Each reply follows the grammar from its start.
    let constraint = match a.sample.constraint()? {
        Some(spec) => Some(engine.constraint(&spec)?),
        None => None,
    };
    let mut drafter = load_drafter(&a.spec, spec, backend, draft_params, &engine, info)?;
    if drafter.is_some() && constraint.is_some() {
        anyhow::bail!(
            "--spec-type with a grammar or JSON schema is not supported yet; drop one of them"
        );
    }
    let opts = chat::ChatOptions {
        system_prompt: a.system_prompt.as_deref(),
        n_predict: a.n_predict,
        verbose_prompt: a.verbose_prompt,
        first: first.take(),
        single_turn,
        constraint: constraint.as_ref(),
    };
    let mut sampler = Sampler::new(sampling);
    chat::chat_loop(
        &engine,
        &opts,
        &mut sampler,
        drafter.as_mut(),
        &a.model.model.display().to_string(),
    )
}

fn main() {
    longhaul::alloc::keep_freed_buffers();
    let argv = match args::normalize_args(
        &<Cli as clap::CommandFactory>::command(),
        std::env::args().collect(),
        &longhaul_server::flags::process_env,
    ) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let cli = Cli::parse_from(argv);
    let res = match cli.cmd {
        Cmd::Run(a) => run(a),
        Cmd::Chat(a) => chat(a, None, false),
        Cmd::Inspect(a) => inspect::inspect(a),
        Cmd::Demo(a) => demo::demo(a),
        Cmd::Bench(a) => bench::bench(a),
        Cmd::GenModel(a) => gen_model::gen_model(a),
        Cmd::Serve(a) => longhaul_server::run(a),
        Cmd::Advise(a) => advise::advise(a),
        Cmd::Devices(a) => devices::devices(a),
    };
    if let Err(e) = res {
        if e.downcast_ref::<errors::StdoutClosed>().is_some() {
            return;
        }
        eprintln!("error: {}", longhaul::errors::message(e.as_ref()));
        std::process::exit(1);
    }
}

/// The spelling table walked: each taken spelling parses to what its long
/// form parses to (and its `LLAMA_ARG_*` variable too), on every command
/// that takes the long form; each refused one is refused with its reason.
#[cfg(test)]
mod spelling_table {
    use super::Cli;
    use clap::{CommandFactory, Parser};
    use longhaul_server::flags::{FlagError, Meaning, SPELLINGS};

    const COMMANDS: [&str; 4] = ["run", "chat", "serve", "bench"];

    /// A value for each long flag that takes one, other than its default.
    fn sample(long: &str) -> &'static str {
        match long {
            "--model" => "other.gguf",
            "--ctx-size" => "128",
            "--n-predict" => "7",
            "--batch-size" => "64",
            "--ubatch-size" => "32",
            "--flash-attn" => "on",
            "--cache-type-k" | "--cache-type-v" => "f32",
            "--n-gpu-layers" => "0",
            "--device" => "none",
            "--system-prompt" => "be terse",
            "--color" => "on",
            "--chat-template" => "{{ messages }}",
            "--chat-template-file" => "t.jinja",
            "--temp" => "-1",
            "--top-p" => "2",
            "--min-p" => "0.5",
            "--repeat-penalty" => "1.1",
            "--repeat-last-n" => "-1",
            "--presence-penalty" | "--frequency-penalty" => "0.5",
            "--logit-bias" => "15+1.5",
            "--grammar" => "root ::= \"a\"",
            "--grammar-file" => "g.gbnf",
            "--json-schema" => "{}",
            "--json-schema-file" => "s.json",
            "--spec-type" => "ngram-simple",
            "--spec-draft-n-max" => "5",
            "--spec-draft-p-min" => "0.5",
            "--host" => "0.0.0.0",
            "--port" => "9090",
            "--alias" => "m",
            "--api-key" => "k",
            "--pg" => "1,2",
            "--mmap" => "0",
            "--load-mode" => "none",
            "--no-repack" => "1",
            _ => "3",
        }
    }

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// `longhaul CMD -m m.gguf ARGS` (without `-m` when ARGS or `env`
    /// give the model), rewritten (with `env`) and parsed.
    fn parse(
        cmd: &str,
        args: &[&str],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<String, String> {
        let mut line = words(&["longhaul", cmd]);
        let model_given =
            env("LLAMA_ARG_MODEL").is_some() || args.iter().any(|a| ["-m", "--model"].contains(a));
        if !model_given {
            line.extend(words(&["-m", "m.gguf"]));
        }
        line.extend(words(args));
        let line =
            crate::args::normalize_args(&Cli::command(), line, env).map_err(|e| e.to_string())?;
        Cli::try_parse_from(line)
            .map(|c| format!("{:?}", c.cmd))
            .map_err(|e| e.to_string())
    }

    /// The long flag's definition on `cmd`, if it has one.
    fn defines(cmd: &str, long: &str) -> Option<bool> {
        let c = Cli::command();
        let sub = c.find_subcommand(cmd)?;
        let name = long.strip_prefix("--")?;
        let takes_value = sub
            .get_arguments()
            .find(|a| a.get_long() == Some(name))
            .map(|a| a.get_action().takes_values());
        takes_value
    }

    #[test]
    fn taken_spellings_parse_as_their_long_flags() {
        for s in SPELLINGS {
            let Some(long) = s.long() else { continue };
            let mut on = 0;
            for cmd in COMMANDS {
                let Some(takes_value) = defines(cmd, long) else {
                    continue;
                };
                on += 1;
                let value = sample(long);
                let with = |flag: &str| {
                    if takes_value {
                        vec![flag.to_string(), value.to_string()]
                    } else {
                        vec![flag.to_string()]
                    }
                };
                let ours = with(long);
                let ours: Vec<&str> = ours.iter().map(String::as_str).collect();
                let theirs = with(s.flag);
                let theirs: Vec<&str> = theirs.iter().map(String::as_str).collect();
                let want =
                    parse(cmd, &ours, &no_env).unwrap_or_else(|e| panic!("{cmd} {long}: {e}"));
                if long != "--model" {
                    let base = parse(cmd, &[], &no_env).expect("base line parses");
                    assert_ne!(want, base, "{cmd} {long} {value} changes nothing");
                }
                assert_eq!(
                    parse(cmd, &theirs, &no_env),
                    Ok(want.clone()),
                    "{cmd}: {} should parse as {long}",
                    s.flag
                );
                if let Some(var) = s.env {
                    // Environment variables are llama-cli's and llama-server's.
                    if cmd == "bench" {
                        continue;
                    }
                    let env_value = if takes_value { value } else { "1" };
                    let env = |v: &str| (v == var).then(|| env_value.to_string());
                    assert_eq!(parse(cmd, &[], &env), Ok(want), "{cmd}: {var}={env_value}");
                }
            }
            assert!(on > 0, "{} ({long}) is taken by no command", s.flag);
        }
    }

    #[test]
    fn refused_spellings_name_the_flag_and_what_to_do() {
        for s in SPELLINGS {
            let Meaning::Refused(why) = s.meaning else {
                continue;
            };
            for cmd in COMMANDS {
                let line = words(&["longhaul", cmd, "-m", "m.gguf", s.flag, "x"]);
                let sub_defines = Cli::command().find_subcommand(cmd).is_some_and(|c| {
                    c.get_arguments().any(|a| {
                        Some(s.flag) == a.get_long().map(|l| format!("--{l}")).as_deref()
                            || a.get_short().is_some_and(|c| s.flag == format!("-{c}"))
                    })
                });
                let got = crate::args::normalize_args(&Cli::command(), line, &no_env);
                if sub_defines {
                    // The command's own flag (bench's -r) wins.
                    assert!(got.is_ok(), "{cmd} {}", s.flag);
                    continue;
                }
                let e = got.expect_err(s.flag);
                assert!(
                    matches!(e, FlagError::Refused { .. }),
                    "{cmd} {}: {e}",
                    s.flag
                );
                let msg = e.to_string();
                assert!(msg.contains(s.flag) && msg.contains(why), "{msg}");
            }
        }
    }

    #[test]
    fn the_issue_misparses_parse_as_llama_cpp_users_expect() {
        let run = |args: &[&str]| parse("run", args, &no_env);
        assert_eq!(run(&["-cnv"]), run(&["--conversation"]));
        assert!(run(&["-cnv"]).unwrap().contains("conversation: true"));
        assert!(run(&["-no-cnv"]).unwrap().contains("no_conversation: true"));
        let chat = parse("chat", &["-sys", "be terse"], &no_env).unwrap();
        assert!(chat.contains("system_prompt: Some(\"be terse\")"), "{chat}");
        assert!(parse("serve", &["-cb"], &no_env)
            .unwrap()
            .contains("cont_batching: true"));
        let bench = parse("bench", &["-fa", "1"], &no_env).unwrap();
        assert!(bench.contains("flash_attn: [On]"), "{bench}");
        let bench = parse("bench", &["-fa", "0,1,-1"], &no_env).unwrap();
        assert!(bench.contains("flash_attn: [Off, On, Auto]"), "{bench}");
        assert!(run(&["--temp", "-1"]).unwrap().contains("temp: -1.0"));
        for cmd in COMMANDS {
            let e = parse(cmd, &["-ot", "exps=CPU"], &no_env).unwrap_err();
            assert!(e.contains("--longhaul --longhaul-cache GIB"), "{e}");
        }
        let e = run(&["-hf", "user/repo", "-p", "hi"]).unwrap_err();
        assert!(e.contains("-hf") && e.contains("does not download"), "{e}");
        // A multi-letter short nobody defines is not split into others.
        let e = run(&["-xyz"]).unwrap_err();
        assert!(e.contains("unknown flag -xyz"), "{e}");
        // A prompt that looks like a flag stays the prompt.
        assert!(run(&["-p", "-cnv"]).unwrap().contains("prompt: \"-cnv\""));
    }
}
