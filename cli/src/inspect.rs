//! `longhaul inspect FILE`: what a GGUF holds, with the routed experts that
//! longhaul would stream.

use std::collections::{BTreeMap, BTreeSet};

use clap::Args;
use longhaul::backend::cpu::CpuBackend;
use longhaul::gguf::{self, MetaValue};
use longhaul::model::arch::lookup;
use longhaul::model::{is_routed, read_hparams, routed_expert_tensor_names, Model};
use longhaul::tensor::GgmlType;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// GGUF file (or first shard).
    pub file: std::path::PathBuf,
}

fn short(v: &MetaValue) -> String {
    match v {
        MetaValue::String(s) if s.len() > 60 => format!(
            "{:?}… ({} bytes)",
            &s[..s.char_indices().nth(57).map(|c| c.0).unwrap_or(s.len())],
            s.len()
        ),
        MetaValue::String(s) => format!("{s:?}"),
        MetaValue::Array(t, items) => format!("[{:?}; {}]", t, items.len()),
        other => format!("{other:?}")
            .split('(')
            .nth(1)
            .map(|s| s.trim_end_matches(')').to_string())
            .unwrap_or_default(),
    }
}

fn gib(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

pub fn inspect(a: InspectArgs) -> anyhow::Result<()> {
    let m = gguf::Model::open(&a.file)?;
    let md = m.metadata();
    let arch = md.architecture().unwrap_or("(none)").to_string();
    println!("file:          {}", a.file.display());
    println!("architecture:  {arch}");
    if let Ok(name) = md.get_str("general.name") {
        println!("name:          {name}");
    }
    println!("shards:        {}", m.shards().len());
    for s in m.shards() {
        println!(
            "  {} (GGUF v{}, {})",
            s.path.display(),
            s.version,
            gib(s.len)
        );
    }
    println!("hyperparameters:");
    for (k, v) in md
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{arch}.")))
    {
        println!("  {:<44} {}", k, short(v));
    }
    if let Ok(t) = md.get_str("tokenizer.ggml.model") {
        let n = md
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len())
            .unwrap_or(0);
        println!(
            "tokenizer:     {t} ({} tokens, pre {})",
            n,
            md.get_str("tokenizer.ggml.pre").unwrap_or("default")
        );
    }
    let mut by_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in m.tensors() {
        let e = by_type.entry(t.ty.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.len;
    }
    println!(
        "tensors:       {} ({})",
        m.tensors().len(),
        gib(m.total_tensor_bytes())
    );
    for (ty, (n, b)) in &by_type {
        println!("  {ty:<8} {n:>6} tensors {:>12}", gib(*b));
    }
    // NextN layers (counted in block_count) are not part of the trunk.
    let n_layer = md.get_u64(&format!("{arch}.block_count")).unwrap_or(0) as usize;
    let n_layer = n_layer.saturating_sub(
        md.get_u64(&format!("{arch}.nextn_predict_layers"))
            .unwrap_or(0) as usize,
    );
    let n_expert = md
        .get_u64(&format!("{arch}.expert_count"))
        .unwrap_or(0)
        .max(1);
    // The layers that hold routed experts, found from the tensor names: a
    // corrupt `block_count` (2^32) must not make this loop over it.
    let layers: BTreeSet<usize> = m
        .tensors()
        .iter()
        .filter(|t| is_routed(&t.name))
        .filter_map(|t| t.name.strip_prefix("blk.")?.split('.').next()?.parse().ok())
        .filter(|&il| il < n_layer)
        .collect();
    let mut total_routed = 0u64;
    let mut lines = Vec::new();
    for il in layers {
        let ts: Vec<_> = routed_expert_tensor_names(il)
            .iter()
            .filter_map(|n| m.tensor(n))
            .collect();
        if ts.is_empty() {
            continue;
        }
        let bytes: u64 = ts.iter().map(|t| t.len).sum();
        total_routed += bytes;
        let names: Vec<String> = ts
            .iter()
            .map(|t| {
                format!(
                    "{} {}",
                    t.name.trim_start_matches(&format!("blk.{il}.")),
                    t.ty
                )
            })
            .collect();
        lines.push(format!(
            "  blk.{il:<3} one expert {:>10}  ({})",
            gib(bytes / n_expert),
            names.join(", ")
        ));
    }
    if total_routed > 0 {
        println!("routed experts: {n_expert} per layer, {} in all ({:.1}% of the weights); resident rest {}", gib(total_routed), 100.0 * total_routed as f64 / m.total_tensor_bytes().max(1) as f64, gib(m.total_tensor_bytes() - total_routed));
        lines.iter().for_each(|l| println!("{l}"));
    } else {
        println!("routed experts: none (dense model)");
    }
    // Hyperparameters a run would refuse (sizes past their limits, a
    // block_count the tensors do not back, NaN floats) fail inspect too,
    // after everything above has been shown.
    if lookup(&arch).is_some() {
        read_hparams(&m)?;
        let shapes = Model::load_shapes(CpuBackend::new(), std::sync::Arc::new(m))?;
        let (dense, moe) = shapes.layer_counts();
        let (k, v) = shapes.hp.kv_widths();
        let rec = shapes.hp.recurrent_bytes();
        let per_pos = longhaul::kv::kv_cache_bytes(&shapes.hp, 1, 1, GgmlType::F16);
        println!(
            "layers:        {} ({dense} dense FFN, {moe} MoE{}), {} attention",
            shapes.hp.n_layer,
            match shapes.hp.n_nextn {
                0 => String::new(),
                n => format!(", {n} NextN layers, loaded only by --spec-type draft-mtp"),
            },
            shapes.attention_kind()
        );
        let n_kv = shapes.hp.n_layer_kv();
        println!(
            "KV cache:      {} values per position per layer ({k} K + {v} V) over {n_kv} attention layers: {per_pos} bytes per position at f16, {} at the trained context of {}",
            k + v,
            gib(per_pos.saturating_mul(shapes.hp.n_ctx_train as u64)),
            shapes.hp.n_ctx_train
        );
        if rec > 0 {
            println!(
                "recurrent:     {} DeltaNet layers, state {} per sequence (f32, any context); each checkpoint (--ctx-checkpoints, default {}) holds another copy",
                shapes.hp.n_layer - n_kv,
                gib(rec),
                longhaul::state::DEFAULT_CHECKPOINTS
            );
        }
    }
    Ok(())
}
