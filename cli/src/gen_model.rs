//! `longhaul gen-model`: deterministic synthetic MoE models shaped like real
//! ones (random weights), for benchmarks and experiments.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use longhaul::synth::{self, SynthSpec};
use longhaul::tensor::GgmlType;

#[derive(Args, Debug)]
pub struct GenModelArgs {
    /// Shape: demo, tiny, micro, qwen3-30b-a3b, gpt-oss-20b, deepseek2-lite,
    /// deepseek2-tiny, glm45-air-scaled, glm4moe-tiny, qwen3next-80b-scaled
    /// or qwen3next-tiny.
    #[arg(long, default_value = "demo")]
    pub preset: String,
    /// Output file.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Type of the routed experts (e.g. q4_K, q8_0, mxfp4).
    #[arg(long = "type")]
    pub ty: Option<String>,
    /// Seed of the random weights (default: the preset's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write split shards with at most this many tensors each.
    #[arg(long = "split-max-tensors")]
    pub split_max_tensors: Option<usize>,
    /// Replace the output file(s) if they exist.
    #[arg(long)]
    pub force: bool,
    /// Zipf-like exponent of each layer's expert popularity: 0 routes
    /// uniformly; 1 sends about 40% of the demo model's selections to its
    /// top 10% of experts (uniform: 9%). Recorded as
    /// `longhaul.synth.router_skew`.
    #[arg(long = "router-skew", default_value_t = 0.0, value_name = "S")]
    pub router_skew: f32,
}

pub fn gen_model(a: GenModelArgs) -> anyhow::Result<()> {
    let mut spec = SynthSpec::preset(&a.preset).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown preset `{}`; use one of {}",
            a.preset,
            synth::PRESETS.join(", ")
        )
    })?;
    if let Some(t) = &a.ty {
        spec.expert_type = expert_type(t)?;
    }
    if let Some(s) = a.seed {
        spec.seed = s;
    }
    spec.router_skew = a.router_skew;
    let w = synth::build(&spec)?;
    let paths = match a.split_max_tensors {
        Some(n) => w.split_paths(&a.output, n.max(1)),
        None => vec![a.output.clone()],
    };
    if !a.force {
        if let Some(p) = paths.iter().find(|p| p.exists()) {
            anyhow::bail!(
                "{} exists; pass --force to replace it, or choose another -o",
                p.display()
            );
        }
    }
    eprintln!(
        "writing {} to {}",
        describe(&a.preset, &spec),
        a.output.display()
    );
    let t0 = Instant::now();
    let paths = match a.split_max_tensors {
        Some(n) => w.write_split(&a.output, n.max(1))?,
        None => {
            let bar = crate::report::bytes_bar("writing");
            w.write_with_progress(&a.output, &|done, total| {
                bar.set_length(total);
                bar.set_position(done);
            })?;
            bar.finish_and_clear();
            paths
        }
    };
    let mut len = 0;
    for p in &paths {
        len += std::fs::metadata(p)
            .with_context(|| format!("reading the size of {}", p.display()))?
            .len();
    }
    let shards = match paths.len() {
        1 => String::new(),
        n => format!(" in {n} shards"),
    };
    eprintln!(
        "wrote {}{shards} in {:.1} s",
        indicatif::HumanBytes(len),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `--type NAME`: a type synthetic experts can have.
fn expert_type(name: &str) -> anyhow::Result<GgmlType> {
    let valid = synth::writable_types();
    let list = || {
        valid
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match GgmlType::from_name(name) {
        Some(t) if valid.contains(&t) => Ok(t),
        Some(t) if longhaul::quant::ops(t).is_ok() => anyhow::bail!(
            "longhaul reads `{name}` but has no quantiser for it: quantise a model with \
             llama-quantize (its i-quants below 4 bits need --imatrix), or use one of {}",
            list()
        ),
        _ => anyhow::bail!("unknown type `{name}`; use one of {}", list()),
    }
}

/// One line about what is written: the preset and what makes it differ.
fn describe(preset: &str, s: &SynthSpec) -> String {
    format!(
        "{preset} ({}, {} layers{}, n_embd {}, {} experts ({} used{}) of {}, dense {}, seed {}{})",
        s.arch.name(),
        s.n_layer,
        match &s.linear {
            Some(la) => format!(
                " ({} linear attention)",
                (0..s.n_layer).filter(|&il| la.is_recurrent(il)).count()
            ),
            None => String::new(),
        },
        s.n_embd,
        s.n_expert,
        s.n_expert_used,
        match (s.n_layer_dense_lead, s.n_expert_shared) {
            (0, 0) => String::new(),
            (d, sh) => format!(", {sh} shared, {d} leading dense layers"),
        },
        s.expert_type.name(),
        s.dense_type.name(),
        s.seed,
        if s.router_skew > 0.0 {
            format!(", router skew {}", s.router_skew)
        } else {
            String::new()
        }
    )
}
