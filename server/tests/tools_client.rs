//! The official `openai` Python client against the real binary serving
//! SmolLM2 with llama.cpp's Qwen2.5 template (`--chat-template-file`):
//! `tools` with `tool_choice: "required"` give calls of declared functions
//! whose arguments satisfy their schemas, streamed and not
//! (tests/openai_tools.py holds the checks).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_client_gets_required_tool_calls() {
    let py = python();
    let ok = Command::new(&py)
        .args(["-c", "import openai"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{} cannot import the `openai` package; python3 -m venv ~/.cache/longhaul/pyenv && \
         ~/.cache/longhaul/pyenv/bin/pip install openai (or set LONGHAUL_PYTHON)",
        py.display()
    );
    let model = smollm2();
    let template = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    let s = spawn_bin(&[
        "-m",
        model.to_str().unwrap(),
        "-c",
        "1024",
        "--chat-template-file",
        template.to_str().unwrap(),
    ]);
    let c = client();
    wait_ready(&c, &s.url).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_tools.py");
    let url = format!("{}/v1", s.url);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&py)
            .arg(&script)
            .arg(&url)
            .output()
            .expect("run python")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "openai tools checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
