//! `--trace-experts` and `longhaul advise`: a trace recorded during a
//! longhaul run predicts that run's hits and misses exactly for its policy
//! and cache size, and the SVG plots are written and well-formed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn longhaul(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .args(args)
        .output()
        .expect("spawn longhaul");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("longhaul-advise-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// The number after `key` in `s`.
fn number_after(s: &str, key: &str) -> u64 {
    let i = s.find(key).unwrap_or_else(|| panic!("no `{key}` in {s}")) + key.len();
    s[i..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after `{key}` in {s}"))
}

fn advise_json(trace: &Path, model: &str, svg_dir: &Path) -> Value {
    let out = longhaul(&[
        "advise",
        trace.to_str().unwrap(),
        "--model",
        model,
        "--svg-dir",
        svg_dir.to_str().unwrap(),
        "-o",
        "json",
    ]);
    serde_json::from_slice(&out.stdout).expect("advise JSON")
}

fn point(report: &Value, policy: &str, n_slots: u64) -> (u64, u64) {
    let p = &report["policies"][policy][(n_slots - 1) as usize];
    assert_eq!(p["n_slots"], n_slots);
    (p["hits"].as_u64().unwrap(), p["misses"].as_u64().unwrap())
}

#[test]
fn a_trace_predicts_its_runs_hits_exactly() {
    let dir = tmp("run");
    for (model, cache, policy) in [
        ("qwen3moe-f32.gguf", "0.0004", "lru"),
        ("qwen3moe-f32.gguf", "0.0008", "lru"),
        ("qwen3moe-f32.gguf", "0.0008", "lfu"),
        ("qwen3moe-f32.gguf", "0.0008", "auto"),
        ("qwen2moe-q8_0.gguf", "0.0003", "lru"),
    ] {
        let m = fixture(model);
        let trace = dir.join(format!("{model}-{cache}-{policy}.jsonl"));
        let out = longhaul(&[
            "run",
            "-m",
            &m,
            "-p",
            "The quick brown fox jumps over the lazy dog, again and again",
            "-n",
            "16",
            "--temp",
            "0",
            "-t",
            "2",
            "--longhaul",
            "--longhaul-cache",
            cache,
            "--longhaul-policy",
            policy,
            "--trace-experts",
            trace.to_str().unwrap(),
            // The replay is of demand reads only; a lookahead adds its own.
            "--longhaul-prefetch",
            "off",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        let n_slots = number_after(&err, "MoE layers x");
        let (hits, misses) = (number_after(&err, "hits"), number_after(&err, "misses"));
        let r = advise_json(&trace, &m, &dir);
        assert_eq!(
            point(&r, policy, n_slots),
            (hits, misses),
            "{model} {cache} {policy}: {err}"
        );
        // Belady is a lower bound on misses at every size.
        for n in 1..=r["n_expert"].as_u64().unwrap() {
            let (_, opt) = point(&r, "belady", n);
            for p in ["lru", "lfu", "auto"] {
                assert!(opt <= point(&r, p, n).1, "{p} at {n} slots");
            }
        }
    }
}

#[test]
fn a_bench_trace_predicts_the_bench_rows() {
    let dir = tmp("bench");
    let m = fixture("qwen3moe-f32.gguf");
    let trace = dir.join("bench.jsonl");
    let out = longhaul(&[
        "bench",
        "-m",
        &m,
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1",
        "--longhaul",
        "--longhaul-cache",
        "0.0004",
        "-o",
        "json",
        "--trace-experts",
        trace.to_str().unwrap(),
    ]);
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let sum = |k: &str| rows.iter().map(|r| r[k].as_u64().unwrap()).sum::<u64>();
    let n_slots = rows[0]["longhaul_n_slots"].as_u64().unwrap();
    let r = advise_json(&trace, &m, &dir);
    assert_eq!(
        point(&r, "lru", n_slots),
        (sum("longhaul_hits"), sum("longhaul_misses"))
    );
}

/// Well-formed XML with an `<svg>` root: every tag closes in order.
fn check_svg(path: &Path) {
    let s = std::fs::read_to_string(path).expect("SVG written");
    let body = s.trim_start();
    let body = match body.strip_prefix("<?xml") {
        Some(rest) => rest
            .split_once("?>")
            .expect("xml declaration ends")
            .1
            .trim_start(),
        None => body,
    };
    assert!(
        body.starts_with("<svg"),
        "{}: root is not <svg",
        path.display()
    );
    let mut stack: Vec<String> = Vec::new();
    let mut rest = body;
    let mut seen_root = false;
    while let Some(i) = rest.find('<') {
        assert!(
            !rest[..i].contains('&') || rest[..i].contains(';'),
            "bare & in text"
        );
        let j = rest[i..].find('>').expect("tag ends") + i;
        let tag = &rest[i + 1..j];
        assert_eq!(
            tag.matches('"').count() % 2,
            0,
            "unbalanced quotes in <{tag}>"
        );
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "mismatched </{name}>"
            );
        } else if !tag.ends_with('/') {
            assert!(!(stack.is_empty() && seen_root), "a second root element");
            stack.push(tag.split_whitespace().next().unwrap_or("").to_string());
            seen_root = true;
        }
        rest = &rest[j + 1..];
        if stack.is_empty() && seen_root {
            assert!(rest.trim().is_empty(), "content after the root");
            break;
        }
    }
    assert!(stack.is_empty(), "unclosed {stack:?}");
    assert!(s.contains("xmlns=\"http://www.w3.org/2000/svg\""));
}

#[test]
fn advise_writes_well_formed_svg_and_a_table() {
    let dir = tmp("svg");
    let m = fixture("qwen3moe-f32.gguf");
    let trace = dir.join("t.jsonl");
    longhaul(&[
        "run",
        "-m",
        &m,
        "-p",
        "hello there",
        "-n",
        "4",
        "--temp",
        "0",
        "-t",
        "1",
        "--trace-experts",
        trace.to_str().unwrap(),
    ]);
    let svg = dir.join("plots");
    let out = longhaul(&[
        "advise",
        trace.to_str().unwrap(),
        "-m",
        &m,
        "--svg-dir",
        svg.to_str().unwrap(),
        "--disk-gbps",
        "3.5",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("| slots | --longhaul-cache | lru hit"),
        "{text}"
    );
    assert!(
        text.contains("smallest budget") && text.contains("|    80% |"),
        "{text}"
    );
    assert!(text.contains("@ 3.5 GB/s"), "{text}");
    // One row per slot count (4 experts).
    assert_eq!(
        text.lines().filter(|l| l.contains(" GiB |")).count(),
        4,
        "{text}"
    );
    check_svg(&svg.join("t-hit-rate.svg"));
    check_svg(&svg.join("t-popularity.svg"));
}

#[test]
fn advise_errors_say_what_to_do() {
    let dir = tmp("err");
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "hello\n").unwrap();
    let m = fixture("qwen3moe-f32.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .args(["advise", bad.to_str().unwrap(), "-m", &m])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("not a longhaul routing trace header") && e.contains("--trace-experts"),
        "{e}"
    );
    // A trace from a model with another expert count.
    let trace = dir.join("e8.jsonl");
    std::fs::write(
        &trace,
        "{\"longhaul_trace\":1,\"n_layer\":2,\"n_expert\":8,\"n_expert_used\":2}\n{\"layer\":0,\"ids\":[[7,1]]}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .args(["advise", trace.to_str().unwrap(), "-m", &m])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        e.contains("8 experts per layer but the model has 4")
            && e.contains("pass the model the trace was recorded with"),
        "{e}"
    );
}
