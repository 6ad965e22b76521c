//! What the `longhaul` binary says when something is wrong: each cause once,
//! what to do instead, no driver noise, a quiet end when stdout closes, and
//! `gen-model`'s care with the files it writes.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_longhaul"));
    c.env_remove("LONGHAUL_DEVICE");
    c
}

fn longhaul(args: &[&str]) -> Output {
    bin()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn longhaul")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit code 1 and the error line of stderr (the one starting `error: `).
fn error_line(args: &[&str]) -> String {
    let o = longhaul(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?}: one error line expected in: {err}"
    );
    lines[0].to_string()
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn smollm2() -> PathBuf {
    let dir = std::env::var_os("LONGHAUL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/longhaul/models")
        });
    let p = dir.join("smollm2-135m-instruct-q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-models.sh (CI does) or set LONGHAUL_MODELS",
        p.display()
    );
    p
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("longhaul-messages-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// How many times `part` occurs in `text`.
fn count(text: &str, part: &str) -> usize {
    text.matches(part).count()
}

#[test]
fn each_error_says_its_cause_once() {
    let dir = tmp("once");
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"garbage, not a model").expect("write");
    let missing = dir.join("missing.gguf");

    let e = error_line(&["inspect", s(&bad)]);
    assert_eq!(count(&e, "not a GGUF file"), 1, "{e}");
    assert_eq!(count(&e, s(&bad)), 1, "{e}");
    let e = error_line(&["inspect", s(&missing)]);
    assert_eq!(count(&e, "No such file or directory"), 1, "{e}");

    for m in [&bad, &missing] {
        let e = error_line(&["run", "-m", s(m), "-p", "hi", "-ngl", "0"]);
        assert!(
            e.starts_with(&format!("error: cannot load {}: ", s(m))),
            "{e}"
        );
        assert_eq!(count(&e, s(m)), 1, "{e}");
    }

    let out = dir.join("no-such-folder").join("m.gguf");
    let e = error_line(&["gen-model", "--preset", "tiny", "-o", s(&out)]);
    assert!(
        e.contains("the folder") && e.contains("does not exist") && !e.contains("os error"),
        "{e}"
    );
    assert_eq!(
        count(&e, "no-such-folder"),
        2,
        "the path and its folder: {e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_directory_as_the_model_says_so() {
    let dir = tmp("dir");
    let e = error_line(&["run", "-m", s(&dir), "-p", "hi", "-ngl", "0"]);
    assert!(
        e.contains("is a directory") && e.contains("pass the .gguf file"),
        "{e}"
    );
    assert!(!e.contains("No such device"), "{e}");
    assert_eq!(count(&e, s(&dir)), 1, "{e}");
    let e = error_line(&["inspect", s(&dir)]);
    assert!(e.contains("is a directory"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_closed_stdout_ends_run_quietly() {
    let m = smollm2();
    let mut child = bin()
        .args(["run", "-m", s(&m), "-p", "1, 2, 3, 4, 5,", "-n", "400"])
        .args(["--temp", "0", "-t", "2", "-ngl", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Read the start of the output, then close the pipe as `head -c` does.
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 8];
    stdout.read_exact(&mut first).expect("first bytes");
    drop(stdout);
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("stderr");
    let status = child.wait().expect("wait");
    assert_eq!(&first, b"1, 2, 3,");
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("error") && !err.contains("panicked"), "{err}");
}

#[test]
fn a_context_above_the_trained_one_is_warned_about() {
    // SmolLM2-135M's GGUF says llama.context_length = 8192.
    let m = smollm2();
    let o = longhaul(&[
        "run",
        "-m",
        s(&m),
        "-p",
        "hi",
        "-n",
        "1",
        "-c",
        "9000",
        "-t",
        "2",
        "-ngl",
        "0",
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning: -c 9000 is above the model's trained context (8192)"),
        "{err}"
    );
    let o = longhaul(&[
        "run",
        "-m",
        s(&m),
        "-p",
        "hi",
        "-n",
        "1",
        "-c",
        "8192",
        "-t",
        "2",
        "-ngl",
        "0",
    ]);
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
}

/// Mesa's device-selection layer printed this through libwayland for each
/// adapter listing on a machine without a display session.
const DRIVER_LINE: &str = "XDG_RUNTIME_DIR";

#[test]
fn default_placement_prints_no_driver_lines() {
    let m = fixture("qwen3moe-q4_k_m.gguf");
    let o = bin()
        .args(["run", "-m", s(&m), "-p", "hi", "-n", "2"])
        .env_remove("XDG_RUNTIME_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("spawn");
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("placement: "), "{err}");
    assert!(!err.contains(DRIVER_LINE), "{err}");

    let dir = tmp("demo");
    let o = bin()
        .args(["demo", "--cache-dir", s(&dir), "-n", "2", "-t", "2"])
        .env_remove("XDG_RUNTIME_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("spawn");
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains(DRIVER_LINE), "{err}");
    // `devices` lists the adapters the same way.
    let o = bin()
        .arg("devices")
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .expect("spawn");
    assert!(!stderr(&o).contains(DRIVER_LINE), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gen_model_refuses_to_overwrite_without_force() {
    let dir = tmp("force");
    let p = dir.join("m.gguf");
    std::fs::write(&p, b"keep me").expect("write");
    let e = error_line(&["gen-model", "--preset", "tiny", "-o", s(&p)]);
    assert!(e.contains("exists") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(&p).expect("read"), b"keep me");

    let o = longhaul(&["gen-model", "--preset", "tiny", "-o", s(&p), "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    longhaul::gguf::Model::open(&p).expect("a complete GGUF file replaced it");
    assert!(!longhaul::gguf::partial_path(&p).exists());

    // Split output: any existing shard is refused.
    let first = dir.join("split.gguf");
    let o = longhaul(&[
        "gen-model",
        "--preset",
        "tiny",
        "-o",
        s(&first),
        "--split-max-tensors",
        "10",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = error_line(&[
        "gen-model",
        "--preset",
        "tiny",
        "-o",
        s(&first),
        "--split-max-tensors",
        "10",
    ]);
    assert!(
        e.contains("split-00001-of-") && e.contains("--force"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gen_model_reports_in_the_right_unit_without_debug_output() {
    let dir = tmp("units");
    let p = dir.join("m.gguf");
    let o = longhaul(&["gen-model", "--preset", "tiny", "-o", s(&p)]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("SynthSpec") && !err.contains(" {"), "{err}");
    // indicatif's binary units, as the file's length says.
    let len = std::fs::metadata(&p).expect("written").len();
    let want = format!("wrote {:.2} MiB", len as f64 / (1u64 << 20) as f64);
    assert!(err.contains(&want), "`{want}` not in: {err}");
    assert!(!err.contains("GiB"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gen_model_lists_the_valid_types() {
    let dir = tmp("types");
    let e = error_line(&[
        "gen-model",
        "--preset",
        "tiny",
        "--type",
        "q9",
        "-o",
        s(&dir.join("m.gguf")),
    ]);
    assert!(e.contains("unknown type `q9`"), "{e}");
    // ggml's names of types longhaul can quantise.
    for t in ["q4_0", "q8_0", "q4_K", "q6_K", "mxfp4", "f16"] {
        assert!(e.contains(t), "`{t}` not listed: {e}");
    }
    // A type ggml knows but longhaul cannot write is refused the same way.
    let e = error_line(&[
        "gen-model",
        "--preset",
        "tiny",
        "--type",
        "tq1_0",
        "-o",
        s(&dir.join("m.gguf")),
    ]);
    assert!(e.contains("unknown type `tq1_0`; use one of"), "{e}");
    // A type longhaul reads but cannot quantise says so.
    let e = error_line(&[
        "gen-model",
        "--preset",
        "tiny",
        "--type",
        "iq2_xxs",
        "-o",
        s(&dir.join("m.gguf")),
    ]);
    assert!(
        e.contains("reads `iq2_xxs` but has no quantiser") && e.contains("llama-quantize"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
