//! The `longhaul` binary: flag errors with their messages, and a longhaul run
//! on a fixture that streams experts and reports it.

use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_longhaul"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn run_err(args: &[&str]) -> String {
    let out = bin().args(args).output().expect("spawn");
    assert!(!out.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn longhaul_flag_errors_say_what_to_do() {
    let m = fixture("qwen3moe-q4_k_m.gguf");
    let m = m.to_str().expect("path");
    let e = run_err(&["run", "-m", m, "-p", "hi", "-n", "1", "--longhaul"]);
    assert!(e.contains("--longhaul needs --longhaul-cache"), "{e}");
    for bad in ["0", "-1", "lots"] {
        let e = run_err(&[
            "run",
            "-m",
            m,
            "-p",
            "hi",
            "-n",
            "1",
            "--longhaul",
            "--longhaul-cache",
            bad,
        ]);
        assert!(e.contains("give a positive number of GiB"), "{bad}: {e}");
    }
    let e = run_err(&[
        "run",
        "-m",
        m,
        "-p",
        "hi",
        "-n",
        "1",
        "--longhaul",
        "--longhaul-cache",
        "0.000001",
    ]);
    assert!(
        e.contains("holds no expert per layer") && e.contains("raise --longhaul-cache to at least"),
        "{e}"
    );
    let e = run_err(&[
        "run",
        "-m",
        m,
        "-p",
        "hi",
        "-n",
        "1",
        "--longhaul",
        "--longhaul-cache",
        "1",
        "--longhaul-policy",
        "fifo",
    ]);
    assert!(
        e.contains("unknown cache policy `fifo`; use lru or lfu"),
        "{e}"
    );
}

#[test]
fn partial_gpu_offload_is_refused_before_loading() {
    let m = fixture("qwen3moe-q4_k_m.gguf");
    let e = run_err(&[
        "run",
        "-m",
        m.to_str().expect("path"),
        "-p",
        "hi",
        "-n",
        "1",
        "-ngl",
        "5",
    ]);
    assert!(e.contains("-ngl 0"), "{e}");
}

#[test]
fn unsupported_architecture_names_the_supported_ones() {
    // A file whose architecture is unknown: rewrite the metadata of a fixture.
    let src = longhaul::gguf::Model::open(fixture("qwen3moe-q4_k_m.gguf")).expect("open");
    let mut w = longhaul::gguf::Writer::new();
    for (k, v) in src.metadata().iter() {
        w.set(k, v.clone());
    }
    w.set(
        "general.architecture",
        longhaul::gguf::MetaValue::String("mamba".into()),
    );
    for t in src.tensors() {
        w.add_tensor(
            &t.name,
            &t.dims,
            t.ty,
            src.tensor_data(t).expect("data").to_vec(),
        )
        .expect("add");
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mamba.gguf");
    w.write(&path).expect("write");
    let e = run_err(&[
        "run",
        "-m",
        path.to_str().expect("path"),
        "-p",
        "hi",
        "-n",
        "1",
    ]);
    assert!(
        e.contains("unsupported architecture `mamba`")
            && e.contains("qwen3moe")
            && e.contains("gpt-oss"),
        "{e}"
    );
}

#[test]
fn longhaul_run_streams_experts_and_matches_resident_text() {
    let m = fixture("qwen3moe-f32.gguf");
    let m = m.to_str().expect("path");
    let base = [
        "run",
        "-m",
        m,
        "-p",
        "hello world",
        "-n",
        "16",
        "--temp",
        "0",
        "-t",
        "2",
    ];
    let resident = bin().args(base).output().expect("spawn");
    assert!(
        resident.status.success(),
        "{}",
        String::from_utf8_lossy(&resident.stderr)
    );
    let lh = bin()
        .args(base)
        .args(["--longhaul", "--longhaul-cache", "0.001"])
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&lh.stderr);
    assert!(lh.status.success(), "{err}");
    assert_eq!(
        lh.stdout, resident.stdout,
        "longhaul text differs from resident"
    );
    assert!(
        err.contains("MoE layers x") && err.contains("outside the budget"),
        "{err}"
    );
    assert!(
        err.contains("hit rate") && err.contains("expert bytes read"),
        "{err}"
    );
}
