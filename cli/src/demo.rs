//! `longhaul demo`: writes a deterministic synthetic qwen3moe model into the
//! cache directory (once) and generates from it.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use longhaul::backend::cpu::CpuBackend;
use longhaul::engine::{Engine, EngineParams};
use longhaul::sample::{Sampler, SamplerParams};
use longhaul::synth::{self, SynthSpec};
use longhaul::tokenizer::StreamDecoder;

#[derive(Args)]
pub struct DemoArgs {
    /// Where to keep the synthetic model (default: $LONGHAUL_CACHE or ~/.cache/longhaul).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 32)]
    pub n_predict: usize,
    #[arg(short = 'p', long = "prompt", default_value = "Once upon a time")]
    pub prompt: String,
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
}

pub fn cache_dir(explicit: Option<PathBuf>) -> PathBuf {
    explicit
        .or_else(|| std::env::var_os("LONGHAUL_CACHE").map(PathBuf::from))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/longhaul")))
        .unwrap_or_else(|| PathBuf::from(".longhaul-cache"))
}

pub fn demo(a: DemoArgs) -> anyhow::Result<()> {
    let dir = cache_dir(a.cache_dir.clone());
    std::fs::create_dir_all(&dir)?;
    let spec = SynthSpec::demo();
    let path = dir.join(format!(
        "demo-qwen3moe-{}-seed{}.gguf",
        spec.expert_type, spec.seed
    ));
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    pool.install(|| -> anyhow::Result<()> {
        eprintln!("longhaul demo: a synthetic qwen3moe model with random weights");
        eprintln!(
            "  {} layers, {} routed experts per layer ({} used per token), {} experts, {} attention",
            spec.n_layer, spec.n_expert, spec.n_expert_used, spec.expert_type, spec.dense_type
        );
        if path.exists() {
            eprintln!("  using {}", path.display());
        } else {
            let t0 = Instant::now();
            eprintln!("  writing {} (once) ...", path.display());
            let tmp = path.with_extension("gguf.tmp");
            synth::write(&spec, &tmp)?;
            std::fs::rename(&tmp, &path)?;
            eprintln!("  wrote {:.1} MiB in {:.1} s", std::fs::metadata(&path)?.len() as f64 / (1 << 20) as f64, t0.elapsed().as_secs_f64());
        }
        let engine = Engine::load(&path, CpuBackend::new(), EngineParams::default())?;
        let tokens = engine.tokenize(&a.prompt)?;
        eprintln!(
            "  loaded in {:.0} ms; prompt {:?} is {} tokens; generating {} tokens greedily on {} threads:\n",
            engine.load_time.as_secs_f64() * 1e3,
            a.prompt,
            tokens.len(),
            a.n_predict,
            threads
        );
        let mut kv = engine.new_kv()?;
        let mut sampler = Sampler::new(SamplerParams { temp: 0.0, ..SamplerParams::default() });
        let mut dec = StreamDecoder::new(false);
        let mut text = String::new();
        let (out, stats) = engine.generate(&mut kv, &tokens, a.n_predict, &mut sampler, |t| {
            text.push_str(&dec.push(&engine.tokenizer, t));
            true
        })?;
        text.push_str(&dec.finish());
        println!("{}{}", a.prompt, text.escape_debug());
        eprintln!("\n  token ids: {out:?}");
        eprintln!(
            "  prompt: {} tokens at {:.1} t/s; generation: {} tokens at {:.1} t/s",
            stats.n_prompt,
            stats.prompt_tps(),
            stats.n_gen,
            stats.gen_tps()
        );
        eprintln!("  (random weights: the text is noise; the point is the pipeline. Try `longhaul inspect {}`.)", path.display());
        Ok(())
    })
}
