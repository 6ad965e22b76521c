//! `longhaul advise TRACE --model FILE`: how big an expert cache a workload
//! needs. Replays a routing trace (`--trace-experts`) through LRU, LFU and
//! Belady's optimum for every slot count, prints hit rate and streamed bytes
//! per token against `--longhaul-cache`, the smallest budgets reaching
//! 80/90/95% hits, the I/O floor per token at a disk bandwidth, and writes
//! two SVG plots.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use longhaul::backend::cpu::CpuBackend;
use longhaul::longhaul::advisor::{self, Point, Report, Strategy, Trace};
use longhaul::longhaul::fmt_bytes;
use longhaul::model::Model;
use serde_json::json;

#[derive(Args, Debug)]
pub struct AdviseArgs {
    /// Routing trace written by `--trace-experts` (run or bench).
    pub trace: PathBuf,
    /// The model the trace was recorded on (for expert sizes).
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Disk read bandwidth in GB/s for the I/O floor (decimal GB).
    #[arg(long = "disk-gbps", default_value_t = 2.0)]
    pub disk_gbps: f64,
    /// Where to write the SVG plots (default: next to the trace).
    #[arg(long = "svg-dir")]
    pub svg_dir: Option<PathBuf>,
    /// Output format: md or json.
    #[arg(short = 'o', long = "output", default_value = "md")]
    pub output: String,
}

const TARGETS: [f64; 3] = [0.80, 0.90, 0.95];
const GIB: f64 = (1u64 << 30) as f64;

/// The shortest `--longhaul-cache` value (GiB, decimal) that gives `n` slots.
fn flag_gib(r: &Report, n: usize) -> String {
    let bytes = r.cache_bytes(n);
    let per_slot = r.cache_bytes(1).max(1);
    for dec in 1..=9 {
        let scale = 10f64.powi(dec);
        let g = (bytes as f64 / GIB * scale).ceil() / scale;
        // Exactly n slots, not more clipped to every expert.
        if ((g * GIB) as u64 / per_slot) as usize == n {
            return format!("{g:.*}", dec as usize);
        }
    }
    format!("{:.9}", bytes as f64 / GIB)
}

/// Milliseconds per token spent reading experts at `gbps`.
fn floor_ms(r: &Report, p: &Point, gbps: f64) -> f64 {
    r.bytes_per_token(p) / (gbps * 1e9) * 1e3
}

fn svg_paths(a: &AdviseArgs) -> (PathBuf, PathBuf) {
    let dir = a.svg_dir.clone().unwrap_or_else(|| {
        a.trace
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    });
    let stem = a
        .trace
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "trace".into());
    (
        dir.join(format!("{stem}-hit-rate.svg")),
        dir.join(format!("{stem}-popularity.svg")),
    )
}

pub fn advise(a: AdviseArgs) -> anyhow::Result<()> {
    if !(a.disk_gbps > 0.0 && a.disk_gbps.is_finite()) {
        anyhow::bail!(
            "--disk-gbps {}: give the disk's read bandwidth in GB/s (e.g. 3.5)",
            a.disk_gbps
        );
    }
    if !matches!(a.output.as_str(), "md" | "json") {
        anyhow::bail!("-o {}: use md or json", a.output);
    }
    let trace = Trace::open(&a.trace)?;
    let file = longhaul::gguf::Model::open(&a.model)
        .with_context(|| format!("opening {}", a.model.display()))?;
    let model = Model::load(CpuBackend::new(), Arc::new(file))
        .with_context(|| format!("loading {}", a.model.display()))?;
    let (n_moe_layers, expert_bytes) = model
        .expert_slot_cost()
        .with_context(|| format!("{} has no routed experts to cache", a.model.display()))?;
    if trace.n_layer != model.hp.n_layer {
        anyhow::bail!(
            "the trace was recorded on a model with {} layers but {} has {}; pass the model the trace was recorded with",
            trace.n_layer,
            a.model.display(),
            model.hp.n_layer
        );
    }
    let report = advisor::advise(&trace, model.hp.n_expert, n_moe_layers, expert_bytes)?;
    let title = a
        .trace
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let (plot, heat) = svg_paths(&a);
    if let Some(dir) = plot.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--svg-dir: cannot create {}", dir.display()))?;
    }
    let write = |p: &Path, s: String| {
        std::fs::write(p, s).with_context(|| format!("writing {}", p.display()))
    };
    write(
        &plot,
        crate::advise_svg::hit_rate_plot(
            &report,
            &format!("{title}: expert-cache hit rate by policy"),
        ),
    )?;
    write(
        &heat,
        crate::advise_svg::popularity_heatmap(
            &trace,
            &format!("{title}: expert popularity per layer"),
        ),
    )?;
    if a.output == "json" {
        println!("{}", serde_json::to_string_pretty(&to_json(&a, &report))?);
    } else {
        print_md(&a, &trace, &report);
    }
    eprintln!("wrote {} and {}", plot.display(), heat.display());
    Ok(())
}

fn to_json(a: &AdviseArgs, r: &Report) -> serde_json::Value {
    let mut policies = serde_json::Map::new();
    let mut targets = serde_json::Map::new();
    for (s, points) in &r.curves {
        let pts: Vec<_> = points
            .iter()
            .map(|p| {
                json!({
                    "n_slots": p.n_slots,
                    "cache_bytes": r.cache_bytes(p.n_slots),
                    "longhaul_cache_gib": flag_gib(r, p.n_slots),
                    "hits": p.counts.hits,
                    "misses": p.counts.misses,
                    "hit_rate": p.counts.hit_rate(),
                    "bytes_per_token": r.bytes_per_token(p),
                    "io_floor_ms_per_token": floor_ms(r, p, a.disk_gbps),
                })
            })
            .collect();
        policies.insert(s.name().into(), json!(pts));
        let t: Vec<_> = TARGETS
            .iter()
            .map(|&t| {
                let p = r.smallest_reaching(*s, t);
                json!({
                    "hit_rate": t,
                    "n_slots": p.map(|p| p.n_slots),
                    "longhaul_cache_gib": p.map(|p| flag_gib(r, p.n_slots)),
                })
            })
            .collect();
        targets.insert(s.name().into(), json!(t));
    }
    json!({
        "trace": a.trace.display().to_string(),
        "model": a.model.display().to_string(),
        "n_tokens": r.n_tokens,
        "n_expert": r.n_expert,
        "n_moe_layers": r.n_moe_layers,
        "expert_bytes": r.expert_bytes,
        "disk_gbps": a.disk_gbps,
        "policies": policies,
        "targets": targets,
    })
}

fn print_md(a: &AdviseArgs, t: &Trace, r: &Report) {
    println!(
        "trace {}: {} tokens through {} MoE layers, {} experts per layer, {} used per token",
        a.trace.display(),
        r.n_tokens,
        t.layers.len(),
        r.n_expert,
        t.n_expert_used
    );
    println!(
        "model {}: {} MoE layers, one expert {}; one slot per layer costs {} of --longhaul-cache",
        a.model.display(),
        r.n_moe_layers,
        fmt_bytes(r.expert_bytes),
        fmt_bytes(r.cache_bytes(1))
    );
    println!();
    let names: Vec<&str> = r.curves.iter().map(|(s, _)| s.name()).collect();
    let mut head = String::from("| slots | --longhaul-cache |");
    let mut rule = String::from("| ----: | ---------------: |");
    for n in &names {
        head.push_str(&format!(" {n} hit | {n} MB/tok |"));
        rule.push_str(&format!(
            " {}: | {}: |",
            "-".repeat(n.len() + 3),
            "-".repeat(n.len() + 6)
        ));
    }
    head.push_str(&format!(" auto floor ms/tok @ {} GB/s |", a.disk_gbps));
    rule.push_str(" ---------------------------: |");
    println!("{head}\n{rule}");
    for n in 1..=r.n_expert {
        let mut line = format!("| {n:>5} | {:>12} GiB |", flag_gib(r, n));
        for (s, points) in &r.curves {
            let Some(p) = points.get(n - 1) else { continue };
            let w = s.name().len();
            line.push_str(&format!(
                " {:>w$} | {:>w2$.3} |",
                format!("{:.1}%", 100.0 * p.counts.hit_rate()),
                r.bytes_per_token(p) / 1e6,
                w = w + 4,
                w2 = w + 7
            ));
        }
        if let Some(p) = r.curve(Strategy::Auto).and_then(|c| c.get(n - 1)) {
            line.push_str(&format!(" {:>27.3} |", floor_ms(r, p, a.disk_gbps)));
        }
        println!("{line}");
    }
    println!();
    println!(
        "smallest budget per target hit rate (slots, --longhaul-cache GiB, I/O floor at {} GB/s):",
        a.disk_gbps
    );
    println!();
    let mut head = String::from("| target |");
    let mut rule = String::from("| -----: |");
    for n in &names {
        head.push_str(&format!(" {n} |"));
        rule.push_str(" --- |");
    }
    println!("{head}\n{rule}");
    for target in TARGETS {
        let mut line = format!("| {:>5.0}% |", target * 100.0);
        for (s, _) in &r.curves {
            match r.smallest_reaching(*s, target) {
                Some(p) => {
                    let ms = floor_ms(r, &p, a.disk_gbps);
                    let tps = if ms > 0.0 {
                        format!("{:.1} t/s", 1e3 / ms)
                    } else {
                        "no reads".into()
                    };
                    line.push_str(&format!(
                        " {} slots, {} GiB, {ms:.2} ms/tok (≤ {tps}) |",
                        p.n_slots,
                        flag_gib(r, p.n_slots)
                    ));
                }
                None => line.push_str(" not reached |"),
            }
        }
        println!("{line}");
    }
    println!();
    println!("The I/O floor is the time to read the missed experts at --disk-gbps, per token; decode cannot beat it. Belady is an offline bound: no policy misses less.");
}
