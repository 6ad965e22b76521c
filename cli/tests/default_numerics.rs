//! `longhaul run` with no attention or cache flag prints what
//! `llama-completion` prints with the same arguments, because the defaults
//! (`-fa auto`, which on the CPU is flash attention, over an F16 KV cache)
//! follow llama.cpp's arithmetic. The expected text is llama-completion's
//! (llama.cpp 0c1e57098bba, built with GGML_NATIVE on x86 AVX-512):
//! `llama-completion -m SmolLM2-135M-Instruct.Q4_1.gguf -p "The capital of
//! France is" -no-cnv --temp 0 -n 20 -t 2`. Its first 20 greedy tokens are
//! also those of tests/goldens/smollm2-greedy-default.json.

use std::path::PathBuf;
use std::process::Command;

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

fn run(extra: &[&str]) -> String {
    let m = smollm2();
    let out = Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .args(["run", "-m", m.to_str().expect("path")])
        .args([
            "-p",
            "The capital of France is",
            "-n",
            "20",
            "--temp",
            "0",
            "-t",
            "2",
        ])
        .args(extra)
        .output()
        .expect("spawn longhaul run");
    assert!(
        out.status.success(),
        "longhaul run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// llama-completion's 20 tokens after the prompt.
const LLAMA_COMPLETION: &str =
    " Paris.\n\nThe United States has a population of approximately 311 million people.\n\n";

#[test]
fn default_run_prints_llama_completions_text() {
    let text = run(&["-ngl", "0"]);
    assert!(
        text.contains(LLAMA_COMPLETION),
        "longhaul run printed {text:?}, llama-completion {LLAMA_COMPLETION:?}"
    );
}
