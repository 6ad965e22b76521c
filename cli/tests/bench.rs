//! `longhaul bench`: every output format parsed back and checked against the
//! runs it describes (rows, samples per repetition, tests, longhaul columns),
//! and the flag errors.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn bench(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .arg("bench")
        .args(args)
        .output()
        .expect("spawn longhaul");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn bench_ok(args: &[&str]) -> String {
    let (ok, out, err) = bench(args);
    assert!(ok, "bench {args:?} failed: {err}");
    out
}

/// mmap plus longhaul at one and two slots per layer, three tests, three reps.
fn matrix(model: &str, fmt: &'static str) -> Vec<String> {
    [
        "-m",
        model,
        "-p",
        "8",
        "-n",
        "4",
        "-pg",
        "8,2",
        "-r",
        "3",
        "-t",
        "1",
        "-ngl",
        "0",
        "--load-mode",
        "mmap,longhaul",
        "--longhaul-cache",
        "0.0004,0.0008",
        "-o",
        fmt,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

const TESTS: [&str; 3] = ["pp8", "tg4", "pp8+tg2"];

fn check_json_row(r: &Value, reps: usize) {
    let ts = r["samples_ts"].as_array().expect("samples_ts");
    let ns = r["samples_ns"].as_array().expect("samples_ns");
    assert_eq!(ts.len(), reps, "{r}");
    assert_eq!(ns.len(), reps, "{r}");
    let n_tok = r["n_prompt"].as_u64().unwrap() + r["n_gen"].as_u64().unwrap();
    for (t, n) in ts.iter().zip(ns) {
        let (t, n) = (t.as_f64().unwrap(), n.as_f64().unwrap());
        assert!(t > 0.0 && n > 0.0);
        assert!((t - n_tok as f64 * 1e9 / n).abs() <= 1e-6 * t, "{t} vs {n}");
    }
    let mean = ts.iter().map(|t| t.as_f64().unwrap()).sum::<f64>() / reps as f64;
    assert!((r["avg_ts"].as_f64().unwrap() - mean).abs() <= 1e-9 * mean);
    for k in [
        "model_filename",
        "model_type",
        "model_size",
        "model_n_params",
        "n_threads",
        "n_ubatch",
        "n_gpu_layers",
        "backends",
        "test_time",
        "avg_ns",
        "stddev_ts",
    ] {
        assert!(!r[k].is_null(), "{k} missing in {r}");
    }
    let name = r["test"].as_str().unwrap();
    assert!(TESTS.contains(&name), "{name}");
    let lh = r["load_mode"] == "longhaul";
    for k in [
        "longhaul_hit_rate",
        "longhaul_hits",
        "longhaul_misses",
        "longhaul_bytes_read",
        "longhaul_n_slots",
        "longhaul_read_time_s",
        "longhaul_io_floor_ts",
    ] {
        assert_eq!(!r[k].is_null(), lh, "{k} in {r}");
    }
    if lh {
        // Demand reads and compute (wall less the time blocked) each take
        // at most the wall time, so the floor (tokens over the larger of
        // the two) is never below the rate over all repetitions.
        let wall: f64 = ns.iter().map(|n| n.as_f64().unwrap()).sum();
        let rate = (n_tok as usize * reps) as f64 * 1e9 / wall;
        let floor = r["longhaul_io_floor_ts"].as_f64().unwrap();
        assert!(
            floor >= rate * (1.0 - 1e-9),
            "floor {floor} below the rate {rate}: {r}"
        );
        assert!(
            r["longhaul_read_time_s"].as_f64().unwrap() <= wall / 1e9,
            "{r}"
        );
        let uses = r["longhaul_hits"].as_u64().unwrap() + r["longhaul_misses"].as_u64().unwrap();
        assert!(uses > 0, "{r}");
        assert!(r["longhaul_bytes_read"].as_u64().unwrap() > 0, "{r}");
    }
}

#[test]
fn json_and_jsonl_describe_every_run() {
    let m = fixture("qwen3moe-f32.gguf");
    let rows: Vec<Value> =
        serde_json::from_str(&bench_ok(&args(&matrix(&m, "json")))).expect("JSON array");
    // 3 load configurations x 3 tests.
    assert_eq!(rows.len(), 9);
    rows.iter().for_each(|r| check_json_row(r, 3));
    let configs: BTreeSet<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["load_mode"].to_string(),
                r["longhaul_n_slots"].to_string(),
            )
        })
        .collect();
    let want: BTreeSet<(String, String)> = [
        ("\"mmap\"", "null"),
        ("\"longhaul\"", "1"),
        ("\"longhaul\"", "2"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(configs, want);
    for c in &configs {
        let tests: BTreeSet<&str> = rows
            .iter()
            .filter(|r| {
                (
                    r["load_mode"].to_string(),
                    r["longhaul_n_slots"].to_string(),
                ) == *c
            })
            .map(|r| r["test"].as_str().unwrap())
            .collect();
        assert_eq!(tests, TESTS.into_iter().collect(), "{c:?}");
    }
    let out = bench_ok(&args(&matrix(&m, "jsonl")));
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 9);
    lines.iter().for_each(|r| check_json_row(r, 3));
}

#[test]
fn markdown_and_csv_have_a_row_per_run() {
    let m = fixture("qwen3moe-f32.gguf");
    let out = bench_ok(&args(&matrix(&m, "md")));
    let table: Vec<Vec<String>> = out
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect();
    let head = &table[0];
    let col = |name: &str| {
        head.iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no {name} column in {head:?}"))
    };
    for h in [
        "model",
        "size",
        "params",
        "backend",
        "threads",
        "load_mode",
        "test",
        "t/s",
        "hit rate",
        "floor t/s",
        "expert GB",
    ] {
        col(h);
    }
    let rows = &table[2..];
    assert_eq!(rows.len(), 9);
    for r in rows {
        assert_eq!(r.len(), head.len());
        assert!(TESTS.contains(&r[col("test")].as_str()), "{r:?}");
        let (mean, sd) = r[col("t/s")].split_once(" ± ").expect("mean ± sd");
        assert!(mean.parse::<f64>().unwrap() > 0.0 && sd.parse::<f64>().unwrap() >= 0.0);
        let hit = &r[col("hit rate")];
        if r[col("load_mode")] == "longhaul" {
            let v: f64 = hit.trim_end_matches('%').parse().expect("a percentage");
            assert!((0.0..=100.0).contains(&v));
            assert!(r[col("expert GB")].parse::<f64>().is_ok());
            let floor: f64 = r[col("floor t/s")].parse().expect("a rate");
            assert!(floor > 0.0, "{r:?}");
        } else {
            assert_eq!(hit, "-");
            assert_eq!(r[col("floor t/s")], "-");
        }
    }
    let out = bench_ok(&args(&matrix(&m, "csv")));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 10, "{out}");
    let n = lines[0].split(',').count();
    assert!(lines[0].contains("avg_ts") && lines[0].contains("longhaul_hit_rate"));
    assert!(
        lines[1..]
            .iter()
            .all(|l| l.matches("\",\"").count() + 1 == n),
        "{out}"
    );
}

#[test]
fn depth_and_ubatch_lists_multiply_the_tests() {
    let m = fixture("qwen3moe-q8_0.gguf");
    let out = bench_ok(&[
        "-m", &m, "-p", "8", "-n", "2", "-d", "0,4", "-ub", "4,8", "-r", "2", "-t", "1", "-o",
        "json",
    ]);
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.len(), 2 * 2 * 2);
    let names: BTreeSet<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["pp8", "tg2", "pp8 @ d4", "tg2 @ d4"].into_iter().collect()
    );
    let ubs: BTreeSet<u64> = rows
        .iter()
        .map(|r| r["n_ubatch"].as_u64().unwrap())
        .collect();
    assert_eq!(ubs, [4, 8].into_iter().collect());
    rows.iter().for_each(check_json_row_depth);
}

fn check_json_row_depth(r: &Value) {
    let d = r["n_depth"].as_u64().unwrap();
    assert_eq!(
        r["test"].as_str().unwrap().ends_with(" @ d4"),
        d == 4,
        "{r}"
    );
    assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
}

#[test]
fn flag_errors_say_what_to_do() {
    let m = fixture("qwen3moe-f32.gguf");
    let err = |a: &[&str]| {
        let (ok, _, e) = bench(a);
        assert!(!ok, "{a:?} should fail");
        e
    };
    // A partial offload is refused before anything runs.
    let e = err(&["-m", &m, "-ngl", "0,1"]);
    assert!(e.contains("-ngl 1:") && e.contains("use -ngl 0"), "{e}");
    let e = err(&["-m", &m, "--load-mode", "mapped"]);
    assert!(e.contains("use mmap, read (none), dio or longhaul"), "{e}");
    let e = err(&["-m", &m, "--load-mode", "longhaul"]);
    assert!(e.contains("needs --longhaul-cache"), "{e}");
    let e = err(&["-m", &m, "--longhaul-cache", "1"]);
    assert!(e.contains("add --longhaul or --load-mode longhaul"), "{e}");
    let e = err(&["-m", &m, "--longhaul", "--longhaul-cache", "1,x"]);
    assert!(e.contains("--longhaul-cache x"), "{e}");
    let e = err(&["-m", &m, "-pg", "8"]);
    assert!(e.contains("PP,TG"), "{e}");
    let e = err(&["-m", &m, "-o", "xml"]);
    assert!(e.contains("use md, json, jsonl or csv"), "{e}");
}

#[test]
fn read_load_mode_gives_its_own_rows() {
    let m = fixture("qwen3moe-q8_0.gguf");
    let out = bench_ok(&[
        "-m",
        &m,
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "2",
        "-t",
        "1",
        "-ngl",
        "0",
        "--load-mode",
        "mmap,read,dio",
        "-o",
        "jsonl",
    ]);
    let rows: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("jsonl row"))
        .collect();
    assert_eq!(rows.len(), 6, "3 load modes x 2 tests: {out}");
    let modes: Vec<(&str, bool)> = rows
        .iter()
        .map(|r| {
            (
                r["load_mode"].as_str().unwrap(),
                r["use_mmap"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        modes,
        [
            ("mmap", true),
            ("mmap", true),
            ("read", false),
            ("read", false),
            ("dio", false),
            ("dio", false)
        ]
    );
    for r in &rows {
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
    }
}

/// `--spec-type` gives a row per drafter beside each generation test (a
/// prompt test once, as `none`), with the drafter's counters; the model
/// drafting for itself has every draft accepted (greedy verification of
/// its own greedy tokens), and the expert bytes per token are the bytes
/// read over the tokens generated.
#[test]
fn speculative_rows_count_drafts_per_drafter() {
    let m = fixture("qwen3moe-q8_0.gguf");
    let reps = 2;
    let out = bench_ok(&[
        "-m",
        &m,
        "-p",
        "8",
        "-n",
        "6",
        "-r",
        "2",
        "-t",
        "1",
        "-ngl",
        "0",
        "--load-mode",
        "longhaul",
        "--longhaul-cache",
        "0.0004",
        "--spec-type",
        "none,ngram-map-k,draft-simple",
        "-md",
        &m,
        "-o",
        "json",
    ]);
    let rows: Vec<Value> = serde_json::from_str(&out).expect("json");
    let got: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["test"].as_str().unwrap().to_string(),
                r["spec_type"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("pp8", "none"),
        ("tg6", "none"),
        ("tg6", "ngram-map-k"),
        ("tg6", "draft-simple"),
    ]
    .iter()
    .map(|(t, s)| (t.to_string(), s.to_string()))
    .collect();
    assert_eq!(got, want);
    for r in &rows {
        let n_tok = r["n_prompt"].as_u64().unwrap() + r["n_gen"].as_u64().unwrap();
        let bytes = r["longhaul_bytes_read"].as_u64().unwrap() as f64;
        let per_tok = r["longhaul_bytes_per_token"].as_f64().unwrap();
        assert!(
            (per_tok - bytes / (n_tok as f64 * reps as f64)).abs() <= 1e-9 * per_tok.max(1.0),
            "{r}"
        );
        let (drafted, accepted, batches) = (
            r["spec_n_drafted"].as_u64().unwrap(),
            r["spec_n_accepted"].as_u64().unwrap(),
            r["spec_n_batches"].as_u64().unwrap(),
        );
        assert!(accepted <= drafted && drafted <= 48 * batches, "{r}");
        match r["spec_type"].as_str().unwrap() {
            "none" => assert_eq!((drafted, batches), (0, 0), "{r}"),
            "draft-simple" => {
                // Six tokens past the first each repetition, at most three
                // drafted per batch (--spec-draft-n-max's default).
                assert!(drafted > 0 && drafted <= 6 * reps as u64, "{r}");
                assert_eq!(accepted, drafted, "a model drafting for itself: {r}");
                assert!(drafted <= 3 * batches, "{r}");
                assert_eq!(r["spec_acceptance"].as_f64(), Some(1.0), "{r}");
            }
            _ => {}
        }
    }
}

/// The n-gram sizes (`--spec-ngram-*`, as `run` and `serve` take them) reach
/// the rows: on a text that repeats one word, `size-n 1` finds matches the
/// default 12 would not in a random model's reply, and `size-m 2` bounds
/// every draft.
#[test]
fn speculative_rows_take_the_ngram_sizes() {
    let m = fixture("qwen3moe-q8_0.gguf");
    let dir = std::env::temp_dir().join(format!("lh-bench-ngram-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let text = dir.join("repeat.txt");
    std::fs::write(&text, "the ".repeat(40)).expect("text");
    let out = bench_ok(&[
        "-m",
        &m,
        "-p",
        "0",
        "-n",
        "12",
        "-r",
        "1",
        "-t",
        "1",
        "-ngl",
        "0",
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "1",
        "--spec-ngram-simple-size-m",
        "2",
        "-f",
        text.to_str().unwrap(),
        "-o",
        "json",
    ]);
    std::fs::remove_dir_all(&dir).ok();
    let rows: Vec<Value> = serde_json::from_str(&out).expect("json");
    let r = &rows[0];
    assert_eq!(r["spec_type"], "ngram-simple", "{r}");
    let (drafted, batches) = (
        r["spec_n_drafted"].as_u64().unwrap(),
        r["spec_n_batches"].as_u64().unwrap(),
    );
    assert!(drafted > 0 && drafted <= 2 * batches, "{r}");
}

#[test]
fn speculative_flag_errors_say_what_to_do() {
    let m = fixture("qwen3moe-f32.gguf");
    let err = |a: &[&str]| {
        let (ok, _, e) = bench(a);
        assert!(!ok, "{a:?} should fail");
        e
    };
    let e = err(&["-m", &m, "--spec-type", "none,draft-simple"]);
    assert!(e.contains("add -md FILE"), "{e}");
    let e = err(&["-m", &m, "--spec-type", "ngram-simple", "-md", &m]);
    assert!(e.contains("add draft-simple to --spec-type"), "{e}");
    let e = err(&["-m", &m, "--spec-type", "ngram-mod"]);
    assert!(e.contains("not supported yet"), "{e}");
    let e = err(&["-m", &m, "--spec-type", "ngram-simple", "-pg", "8,2"]);
    assert!(e.contains("give -p and -n instead"), "{e}");
}

/// Generation rows carry the weight bytes a decode token reads (every
/// tensor but the embedding table, and `expert_used_count / expert_count`
/// of the routed experts, summed here from the file itself) times their
/// tokens per second; `--gpu-bw` shows that as a share of the bandwidth.
#[test]
fn generation_rows_report_the_weight_bandwidth_they_reach() {
    let m = fixture("qwen3moe-q8_0.gguf");
    let file = longhaul::gguf::Model::open(&m).expect("fixture");
    let md = file.metadata();
    let arch = md.get_str("general.architecture").unwrap().to_string();
    let n_exp = md.get_u64(&format!("{arch}.expert_count")).unwrap();
    let n_used = md.get_u64(&format!("{arch}.expert_used_count")).unwrap();
    let tied = file.tensor("output.weight").is_none();
    let (mut dense, mut routed) = (0u64, 0u64);
    for t in file.tensors() {
        if t.name.contains("_exps.") {
            routed += t.len;
        } else if t.name != "token_embd.weight" || tied {
            dense += t.len;
        }
    }
    let want = dense + routed * n_used / n_exp;
    assert!(want > 0 && want < file.total_tensor_bytes());
    let out = bench_ok(&[
        "-m", &m, "-p", "8", "-n", "4", "-r", "2", "-t", "1", "-ngl", "0", "-o", "json",
    ]);
    let rows: Vec<Value> = serde_json::from_str(&out).expect("json");
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(r["decode_weight_bytes"].as_u64(), Some(want), "{r}");
        match r["test"].as_str().unwrap() {
            "tg4" => {
                let gbs = r["decode_weight_gbs"].as_f64().expect("a generation row");
                let ts = r["avg_ts"].as_f64().unwrap();
                assert!((gbs - want as f64 * ts / 1e9).abs() <= 1e-9 * gbs, "{r}");
            }
            _ => assert!(r["decode_weight_gbs"].is_null(), "{r}"),
        }
    }
    let md_out = bench_ok(&[
        "-m", &m, "-p", "0", "-n", "4", "-r", "1", "-t", "1", "-ngl", "0", "--gpu-bw", "100",
    ]);
    let header = md_out.lines().next().unwrap();
    assert!(
        header.contains("| GB/s |") && header.contains("% bw"),
        "{md_out}"
    );
    let (ok, _, e) = bench(&["-m", &m, "--gpu-bw", "0"]);
    assert!(!ok && e.contains("memory bandwidth in GB/s"), "{e}");
}
