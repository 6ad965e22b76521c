//! The real `longhaul-server` binary: driven by the official `openai`
//! Python client, and shut down by SIGTERM with a stream in flight.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_python_client() {
    let py = python();
    let ok = Command::new(&py)
        .args(["-c", "import openai"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{} cannot import the `openai` package; create the environment as .ci/run does: \
         python3 -m venv ~/.cache/longhaul/pyenv && ~/.cache/longhaul/pyenv/bin/pip install openai \
         (or point LONGHAUL_PYTHON at a Python that has it)",
        py.display()
    );
    let model = smollm2();
    let s = spawn_bin(&[
        "-m",
        model.to_str().unwrap(),
        "-c",
        "512",
        "-np",
        "2",
        "--api-key",
        "test-key",
    ]);
    let c = client();
    wait_ready(&c, &s.url).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
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
        "openai client checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_streams_cleanly_and_exits() {
    let fx = fixture();
    let mut s = spawn_bin(&[
        "-m",
        fx.to_str().unwrap(),
        "-c",
        "4096",
        "--shutdown-timeout",
        "0.3",
    ]);
    let c = client();
    wait_ready(&c, &s.url).await;
    // A stream that would run to the end of the context.
    let mut r = c
        .post(format!("{}/v1/completions", s.url))
        .json(&json!({"prompt": "Hello", "max_tokens": 4000, "temperature": 0, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut text = String::new();
    text.push_str(&String::from_utf8_lossy(&r.chunk().await.unwrap().unwrap()));
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    while let Some(b) = tokio::time::timeout(Duration::from_secs(20), r.chunk())
        .await
        .expect("the stream did not end after SIGTERM")
        .expect("the stream broke instead of ending")
    {
        text.push_str(&String::from_utf8_lossy(&b));
    }
    let events = parse_sse(&text);
    assert_eq!(events.last().unwrap(), "[DONE]", "{text}");
    // Cancelled after the grace period: an error event in OpenAI's shape.
    let err = &events[events.len() - 2];
    assert_eq!(err["error"]["code"], 503, "{err}");
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the server did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}
