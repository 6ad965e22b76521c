//! `longhaul gen-model`: deterministic synthetic MoE models shaped like real
//! ones (random weights), for benchmarks and experiments.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use longhaul::synth::{self, SynthSpec};
use longhaul::tensor::GgmlType;

#[derive(Args, Debug)]
pub struct GenModelArgs {
    /// Shape: demo, tiny, micro, qwen3-30b-a3b or gpt-oss-20b.
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
        spec.expert_type =
            GgmlType::from_name(t).ok_or_else(|| anyhow::anyhow!("unknown type `{t}`"))?;
    }
    if let Some(s) = a.seed {
        spec.seed = s;
    }
    spec.router_skew = a.router_skew;
    eprintln!("writing {:?} to {}", spec, a.output.display());
    let t0 = Instant::now();
    let w = synth::build(&spec)?;
    match a.split_max_tensors {
        Some(n) => {
            let paths = w.write_split(&a.output, n.max(1))?;
            eprintln!(
                "wrote {} shards in {:.1} s",
                paths.len(),
                t0.elapsed().as_secs_f64()
            );
        }
        None => {
            let bar = crate::report::bytes_bar("writing");
            w.write_with_progress(&a.output, &|done, total| {
                bar.set_length(total);
                bar.set_position(done);
            })?;
            bar.finish_and_clear();
            let len = std::fs::metadata(&a.output)?.len();
            eprintln!(
                "wrote {:.2} GiB in {:.1} s",
                len as f64 / (1u64 << 30) as f64,
                t0.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}
