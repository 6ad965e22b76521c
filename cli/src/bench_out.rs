//! `longhaul bench`'s outputs: llama-bench's JSON/JSONL/CSV fields (its
//! names where it has them, then longhaul's own) and its markdown table.

use longhaul::engine::FlashAttn;
use longhaul::longhaul::Policy;
use longhaul::spec::SpecType;
use serde_json::{json, Value};

use crate::bench::{LoadMode, ModelDesc, Row, DEFAULT_UBATCH};

pub(crate) fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

pub(crate) fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// One row as llama-bench's fields (its names where it has them), then
/// longhaul's own.
pub(crate) fn fields(d: &ModelDesc, r: &Row) -> Vec<(&'static str, Value)> {
    let ts = r.samples_ts();
    let ns: Vec<f64> = r.samples_ns.iter().map(|&n| n as f64).collect();
    let (avg_ns, sd_ns) = mean_sd(&ns);
    let (avg_ts, sd_ts) = mean_sd(&ts);
    let (mode, gib, policy) = match &r.mode {
        LoadMode::Mmap => ("mmap", Value::Null, Value::Null),
        LoadMode::Read => ("read", Value::Null, Value::Null),
        LoadMode::Dio => ("dio", Value::Null, Value::Null),
        LoadMode::Longhaul { gib, policy, .. } => (
            "longhaul",
            json!(gib.parse::<f64>().unwrap_or(0.0)),
            json!(format!("{policy:?}").to_lowercase()),
        ),
    };
    let mut f = vec![
        (
            "build_commit",
            json!(concat!("longhaul-", env!("CARGO_PKG_VERSION"))),
        ),
        ("build_number", json!(0)),
        ("cpu_info", json!(cpu_info())),
        ("gpu_info", json!(r.placement.gpu_info)),
        ("backends", json!(r.placement.backend)),
        ("model_filename", json!(d.filename)),
        ("model_type", json!(d.model_type)),
        ("model_size", json!(d.size)),
        ("model_n_params", json!(d.n_params)),
        ("n_ubatch", json!(r.n_ubatch)),
        ("n_threads", json!(r.n_threads)),
        ("type_k", json!("f16")),
        ("type_v", json!("f16")),
        ("n_gpu_layers", json!(r.placement.ngl)),
        ("flash_attn", json!(fa_number(r.flash_attn))),
        ("repack", json!(r.repack)),
        ("use_mmap", json!(mode == "mmap")),
        ("load_mode", json!(mode)),
        ("n_prompt", json!(r.test.n_prompt)),
        ("n_gen", json!(r.test.n_gen)),
        ("n_depth", json!(r.test.n_depth)),
        ("test_time", json!(r.test_time)),
        ("avg_ns", json!(avg_ns.round() as u64)),
        ("stddev_ns", json!(sd_ns.round() as u64)),
        ("avg_ts", json!(avg_ts)),
        ("stddev_ts", json!(sd_ts)),
        ("samples_ns", json!(r.samples_ns)),
        ("samples_ts", json!(ts)),
        ("test", json!(r.test.name())),
        ("longhaul_cache_gib", gib),
        ("longhaul_policy", policy),
        ("longhaul_n_slots", json!(r.n_slots)),
    ];
    let c = r.cache();
    let opt = |v: Option<Value>| v.unwrap_or(Value::Null);
    f.extend([
        ("longhaul_hits", opt(c.map(|c| json!(c.hits)))),
        ("longhaul_misses", opt(c.map(|c| json!(c.misses)))),
        ("longhaul_hit_rate", opt(c.map(|c| json!(c.hit_rate())))),
        ("longhaul_bytes_read", opt(c.map(|c| json!(c.bytes_read)))),
        (
            "longhaul_io_time_s",
            opt(c.map(|c| json!(c.io_time.as_secs_f64()))),
        ),
        (
            "longhaul_read_time_s",
            opt(c.map(|c| json!(c.read_time.as_secs_f64()))),
        ),
        ("longhaul_overlapped", opt(c.map(|c| json!(c.overlapped)))),
        (
            "longhaul_io_floor_ts",
            opt(r.io_floor_tps().map(|f| json!(f))),
        ),
        (
            "longhaul_prefetch_precision",
            opt(c
                .filter(|c| c.prefetched > 0)
                .map(|c| json!(c.prefetch_precision()))),
        ),
        (
            "longhaul_prefetch_recall",
            opt(c
                .filter(|c| c.prefetched > 0)
                .map(|c| json!(c.prefetch_recall()))),
        ),
        (
            "longhaul_lookahead_auto",
            opt(r.lookahead.map(|l| json!(if l.on { "on" } else { "off" }))),
        ),
        (
            "longhaul_lookahead_ms",
            opt(r.lookahead.map(|l| {
                json!({
                    "with": l.with.as_secs_f64() * 1e3,
                    "without": l.without.as_secs_f64() * 1e3,
                })
            })),
        ),
    ]);
    let sp = r.spec;
    let n_tok = (r.test.n_prompt + r.test.n_gen) * r.samples_ns.len();
    f.extend([
        ("spec_type", opt(sp.map(|(k, _)| json!(k.name())))),
        ("spec_n_batches", opt(sp.map(|(_, s)| json!(s.n_batches)))),
        ("spec_n_drafted", opt(sp.map(|(_, s)| json!(s.n_drafted)))),
        ("spec_n_accepted", opt(sp.map(|(_, s)| json!(s.n_accepted)))),
        (
            "spec_acceptance",
            opt(sp
                .filter(|(_, s)| s.n_drafted > 0)
                .map(|(_, s)| json!(s.acceptance()))),
        ),
        ("decode_weight_bytes", json!(d.decode_bytes)),
        ("decode_weight_gbs", opt(r.decode_gbs(d).map(|g| json!(g)))),
        (
            "longhaul_bytes_per_token",
            opt(c.map(|c| json!(c.bytes_read as f64 / n_tok.max(1) as f64))),
        ),
    ]);
    f
}

/// llama-bench's `flash_attn` value: llama.h's `llama_flash_attn_type`
/// (-1 auto, 0 disabled, 1 enabled), in JSON and in its `fa` column.
fn fa_number(fa: FlashAttn) -> i32 {
    match fa {
        FlashAttn::Auto => -1,
        FlashAttn::Off => 0,
        FlashAttn::On => 1,
    }
}

/// An object with its fields in order (serde_json's map sorts keys).
pub(crate) fn to_json(fields: &[(&str, Value)], pretty: bool) -> String {
    let (open, sep, close) = if pretty {
        ("  {\n    ", ",\n    ", "\n  }")
    } else {
        ("{", ", ", "}")
    };
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("\"{k}\": {v}"))
        .collect();
    format!("{open}{}{close}", body.join(sep))
}

pub(crate) fn print_csv(d: &ModelDesc, rows: &[Row]) {
    let mut header = false;
    for r in rows {
        let f: Vec<(&str, Value)> = fields(d, r)
            .into_iter()
            .filter(|(_, v)| !v.is_array())
            .collect();
        if !header {
            let names: Vec<&str> = f.iter().map(|(k, _)| *k).collect();
            println!("{}", names.join(","));
            header = true;
        }
        let vals: Vec<String> = f
            .iter()
            .map(|(_, v)| {
                let s = match v {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    Value::Bool(b) => u8::from(*b).to_string(),
                    other => other.to_string(),
                };
                format!("\"{}\"", s.replace('"', "\"\""))
            })
            .collect();
        println!("{}", vals.join(","));
    }
}

/// A markdown column: header, right-aligned, and the cell of a row.
type Column<'a> = (&'static str, bool, Box<dyn Fn(&Row) -> String + 'a>);

pub(crate) fn print_md(a: &crate::bench::BenchArgs, d: &ModelDesc, rows: &[Row]) {
    let any_lh = rows
        .iter()
        .any(|r| matches!(r.mode, LoadMode::Longhaul { .. }));
    let mixed_modes = rows.iter().any(|r| r.mode != rows[0].mode);
    let any_gpu = rows.iter().any(|r| r.placement.backend != "CPU");
    let any_cpu = rows.iter().any(|r| r.placement.backend == "CPU");
    let policies_differ = rows
        .iter()
        .any(|r| matches!(r.mode, LoadMode::Longhaul { policy, .. } if policy != Policy::Auto));
    // llama-bench's rule: a parameter gets a column when it is not the default.
    let mut cols: Vec<Column> = vec![
        ("model", false, Box::new(|_: &Row| d.model_type.clone())),
        (
            "size",
            true,
            Box::new(|_: &Row| format!("{:.2} MiB", d.size as f64 / (1u64 << 20) as f64)),
        ),
        (
            "params",
            true,
            Box::new(|_: &Row| format!("{:.2} M", d.n_params as f64 / 1e6)),
        ),
        (
            "backend",
            false,
            Box::new(|r: &Row| r.placement.backend.clone()),
        ),
    ];
    // llama-bench shows `ngl` unless everything ran on the CPU, and
    // `threads` when something ran on the CPU or the count was chosen.
    if any_gpu {
        cols.push(("ngl", true, Box::new(|r: &Row| r.placement.ngl.to_string())));
    }
    if any_cpu || !a.threads.is_empty() {
        cols.push(("threads", true, Box::new(|r: &Row| r.n_threads.to_string())));
    }
    if a.ubatch != [DEFAULT_UBATCH] {
        cols.push(("n_ubatch", true, Box::new(|r: &Row| r.n_ubatch.to_string())));
    }
    // llama-bench shows `fa` for a list or a value other than auto.
    if a.flash_attn != [FlashAttn::Auto] {
        cols.push((
            "fa",
            true,
            Box::new(|r: &Row| fa_number(r.flash_attn).to_string()),
        ));
    }
    // llama-bench shows `repack` when it is not its default 1.
    if a.repacks().is_ok_and(|on| !on) {
        cols.push(("repack", true, Box::new(|_: &Row| "0".into())));
    }
    if mixed_modes || !a.load_mode.is_empty() || !a.mmap.is_empty() {
        cols.push((
            "load_mode",
            false,
            Box::new(|r: &Row| match r.mode {
                LoadMode::Mmap => "mmap".into(),
                LoadMode::Read => "read".into(),
                LoadMode::Dio => "dio".into(),
                LoadMode::Longhaul { .. } => "longhaul".into(),
            }),
        ));
    }
    if any_lh {
        cols.push((
            "lh_cache/slots",
            true,
            Box::new(|r: &Row| match (&r.mode, r.n_slots) {
                (LoadMode::Longhaul { gib, .. }, Some(n)) => format!("{gib} GiB/{n}"),
                _ => "-".into(),
            }),
        ));
    }
    if policies_differ {
        cols.push((
            "policy",
            false,
            Box::new(|r: &Row| match &r.mode {
                LoadMode::Longhaul { policy, .. } => format!("{policy:?}").to_lowercase(),
                LoadMode::Mmap | LoadMode::Read | LoadMode::Dio => "-".into(),
            }),
        ));
    }
    let any_spec = rows.iter().any(|r| r.spec.is_some());
    if any_spec {
        cols.push((
            "spec",
            false,
            Box::new(|r: &Row| match r.spec {
                Some((k, _)) => k.name().to_string(),
                None => "-".into(),
            }),
        ));
    }
    cols.push(("test", true, Box::new(|r: &Row| r.test.name())));
    cols.push((
        "t/s",
        true,
        Box::new(|r: &Row| {
            let (m, sd) = mean_sd(&r.samples_ts());
            format!("{m:.2} ± {sd:.2}")
        }),
    ));
    if any_lh {
        cols.push((
            "hit rate",
            true,
            Box::new(|r: &Row| match r.cache() {
                Some(c) => format!("{:.1}%", 100.0 * c.hit_rate()),
                None => "-".into(),
            }),
        ));
        cols.push((
            "floor t/s",
            true,
            Box::new(|r: &Row| match r.io_floor_tps() {
                Some(f) => format!("{f:.2}"),
                None => "-".into(),
            }),
        ));
        cols.push((
            "expert GB",
            true,
            Box::new(|r: &Row| match r.cache() {
                Some(c) => format!("{:.3}", c.bytes_read as f64 / 1e9),
                None => "-".into(),
            }),
        ));
    }
    if any_spec {
        cols.push((
            "accepted",
            true,
            Box::new(|r: &Row| match r.spec {
                Some((_, s)) if s.n_drafted > 0 => format!(
                    "{}/{} {:.1}%",
                    s.n_accepted,
                    s.n_drafted,
                    100.0 * s.acceptance()
                ),
                Some((k, _)) if k != SpecType::None => "0/0".into(),
                _ => "-".into(),
            }),
        ));
        if any_lh {
            cols.push((
                "expert MiB/tok",
                true,
                Box::new(|r: &Row| {
                    let n = (r.test.n_prompt + r.test.n_gen) * r.samples_ns.len();
                    match r.cache() {
                        Some(c) => format!(
                            "{:.2}",
                            c.bytes_read as f64 / (1u64 << 20) as f64 / n.max(1) as f64
                        ),
                        None => "-".into(),
                    }
                }),
            ));
        }
    }
    if let Some(bw) = a.gpu_bw {
        cols.push((
            "GB/s",
            true,
            Box::new(move |r: &Row| match r.decode_gbs(d) {
                Some(g) => format!("{g:.1}"),
                None => "-".into(),
            }),
        ));
        cols.push((
            "% bw",
            true,
            Box::new(move |r: &Row| match r.decode_gbs(d) {
                Some(g) => format!("{:.1}%", 100.0 * g / bw),
                None => "-".into(),
            }),
        ));
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| cols.iter().map(|(_, _, f)| f(r)).collect())
        .collect();
    let widths: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(i, (h, _, _))| {
            let w = match *h {
                "model" => 30,
                "test" => 15,
                "t/s" => 20,
                "size" | "params" => 10,
                _ => 0,
            };
            cells
                .iter()
                .map(|c| c[i].chars().count())
                .chain([h.len(), w])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |vals: Vec<String>| {
        let parts: Vec<String> = vals
            .into_iter()
            .zip(cols.iter().zip(&widths))
            .map(|(v, ((_, right, _), &w))| {
                let pad = w.saturating_sub(v.chars().count());
                if *right {
                    format!(" {}{v} ", " ".repeat(pad))
                } else {
                    format!(" {v}{} ", " ".repeat(pad))
                }
            })
            .collect();
        format!("|{}|", parts.join("|"))
    };
    println!(
        "{}",
        line(cols.iter().map(|(h, _, _)| h.to_string()).collect())
    );
    let rule: Vec<String> = cols
        .iter()
        .zip(&widths)
        .map(|((_, right, _), &w)| {
            if *right {
                format!("{}:", "-".repeat(w.saturating_sub(1)))
            } else {
                "-".repeat(w)
            }
        })
        .collect();
    println!("{}", line(rule));
    for c in cells {
        println!("{}", line(c));
    }
    println!();
    println!("build: longhaul {}", env!("CARGO_PKG_VERSION"));
}
