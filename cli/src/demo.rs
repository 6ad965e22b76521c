//! `longhaul demo`: writes a deterministic synthetic qwen3moe model into the
//! cache directory (once) and generates from it.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use longhaul::backend::Backend;
use longhaul::engine::{CacheBudget, Engine, EngineParams, GenStats, LonghaulParams};
use longhaul::longhaul::Policy;
use longhaul::sample::{Sampler, SamplerParams};
use longhaul::synth::{self, SynthSpec};
use longhaul::tokenizer::StreamDecoder;

#[derive(Args, Debug)]
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
    #[command(flatten)]
    pub placement: crate::args::PlacementArgs,
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
        "demo-qwen3moe-{}-seed{}-v2.gguf", // v2: generator version (random Q4_K blocks)
        spec.expert_type, spec.seed
    ));
    let threads = longhaul::threads::capped(a.threads);
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
            let bar = crate::report::bytes_bar("  writing");
            synth::write_with_progress(&spec, &tmp, &|done, total| {
                bar.set_length(total);
                bar.set_position(done);
            })?;
            bar.finish_and_clear();
            std::fs::rename(&tmp, &path)?;
            eprintln!("  wrote {:.1} MiB in {:.1} s", std::fs::metadata(&path)?.len() as f64 / (1 << 20) as f64, t0.elapsed().as_secs_f64());
        }
        let placed = a.placement.resolve(&path)?;
        eprintln!("  placement: {}", placed.summary);
        longhaul::with_backend!(placed.placement, |backend| demo_on(backend, &a, &path, &spec))
    })
}

/// Generates resident, then streamed, on one backend, and compares.
fn demo_on<B: Backend>(
    backend: B,
    a: &DemoArgs,
    path: &std::path::Path,
    spec: &SynthSpec,
) -> anyhow::Result<()> {
    let gen = |params: EngineParams| -> anyhow::Result<(Engine<B>, Vec<u32>, String, GenStats)> {
        let engine = Engine::load(path, backend.clone(), params)?;
        let tokens = engine.tokenize(&a.prompt)?;
        let mut kv = engine.new_kv()?;
        let mut sampler = Sampler::new(SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        });
        let mut dec = StreamDecoder::new(false);
        let mut text = String::new();
        let (out, stats) = engine.generate(&mut kv, &tokens, a.n_predict, &mut sampler, |t| {
            text.push_str(&dec.push(&engine.tokenizer, t));
            true
        })?;
        text.push_str(&dec.finish());
        Ok((engine, out, text, stats))
    };

    let resident = if backend.name() == "CPU" {
        "read in place from the memory-mapped file"
    } else {
        "uploaded to the GPU"
    };
    eprintln!(
        "\n1) resident: every weight {resident}, greedy, {} tokens",
        a.n_predict
    );
    let (_, out_r, text_r, st_r) = gen(EngineParams::default())?;
    println!("{}{}", a.prompt, text_r.escape_debug());
    eprintln!(
        "   prompt {} tokens at {:.1} t/s, generation {} tokens at {:.1} t/s",
        st_r.n_prompt,
        st_r.prompt_tps(),
        st_r.n_gen,
        st_r.gen_tps()
    );

    // A cache of a quarter of the experts: most routed experts stream from disk.
    let probe = Engine::load(path, backend.clone(), EngineParams::default())?;
    let (n_layers, expert_bytes) = probe.model.expert_slot_cost()?;
    drop(probe);
    let slots = (spec.n_expert / 4).max(1);
    let budget = slots as u64 * n_layers as u64 * expert_bytes;
    eprintln!(
        "\n2) longhaul: routed experts streamed from the file into a cache of {} slots per layer ({} of {} experts, {:.1} MiB of {:.1} MiB)",
        slots,
        slots,
        spec.n_expert,
        budget as f64 / (1 << 20) as f64,
        (spec.n_expert as u64 * n_layers as u64 * expert_bytes) as f64 / (1 << 20) as f64
    );
    let lp = LonghaulParams {
        budget: CacheBudget::Bytes(budget),
        policy: Policy::Auto,
        prefetch: longhaul::engine::Lookahead::Off,
        verify: false,
        direct_io: true,
        uring: false,
    };
    let (eng_l, out_l, text_l, st_l) = gen(EngineParams {
        longhaul: Some(lp),
        ..EngineParams::default()
    })?;
    println!("{}{}", a.prompt, text_l.escape_debug());
    eprintln!(
        "   prompt {} tokens at {:.1} t/s, generation {} tokens at {:.1} t/s",
        st_l.n_prompt,
        st_l.prompt_tps(),
        st_l.n_gen,
        st_l.gen_tps()
    );
    if let Some((t, _)) = eng_l.longhaul_stats() {
        eprintln!(
            "   cache: hit rate {:.1}% ({} hits, {} misses), {:.1} MiB of experts streamed, {:.3} s blocked on reads",
            100.0 * t.hit_rate(),
            t.hits,
            t.misses,
            t.bytes_read as f64 / (1 << 20) as f64,
            t.io_time.as_secs_f64()
        );
    }
    if out_r == out_l {
        eprintln!(
            "\nidentical: longhaul produced the same {} tokens as resident mode.",
            out_r.len()
        );
    } else {
        anyhow::bail!("longhaul output differs from resident output: {out_l:?} vs {out_r:?}");
    }
    eprintln!("(random weights: the text is noise; the point is the pipeline. Try `longhaul inspect {}`.)", path.display());
    Ok(())
}
