//! `--trace-experts FILE`, shared by the subcommands that evaluate tokens.

use anyhow::Context;
use clap::Args;
use longhaul::backend::Backend;
use longhaul::engine::Engine;

#[derive(Args, Debug, Clone, Default)]
pub struct TraceArgs {
    /// Record each MoE layer's routed expert ids per batch to FILE (JSONL),
    /// for `longhaul advise FILE --model MODEL`.
    #[arg(long = "trace-experts", value_name = "FILE")]
    pub trace_experts: Option<std::path::PathBuf>,
}

impl TraceArgs {
    /// Starts recording on `engine` when the flag was given.
    pub fn attach<B: Backend>(&self, engine: &mut Engine<B>) -> anyhow::Result<()> {
        if let Some(p) = &self.trace_experts {
            engine
                .model
                .trace_experts(p)
                .with_context(|| format!("--trace-experts: cannot create {}", p.display()))?;
        }
        Ok(())
    }
}
