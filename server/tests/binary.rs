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

/// Runs openai_resume.py against `url`: its JSON line.
async fn resume_chat(url: &str) -> serde_json::Value {
    let py = python();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_resume.py");
    let url = format!("{url}/v1");
    let out =
        tokio::task::spawn_blocking(move || Command::new(&py).arg(&script).arg(&url).output())
            .await
            .unwrap()
            .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "openai_resume.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Sends SIGTERM and waits for a clean exit.
fn stop(s: &mut BinServer) {
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            assert!(st.success(), "{st}");
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the server did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `--slot-persist`: the official client's chat after a restart answers
/// the same text with its prompt taken from the saved slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_chat_after_a_restart_with_slot_persist() {
    let dir = std::env::temp_dir().join(format!("longhaul-persist-bin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model = smollm2();
    let args = [
        "-m",
        model.to_str().unwrap(),
        "-c",
        "512",
        "-np",
        "1",
        "--slot-save-path",
        dir.to_str().unwrap(),
        "--slot-persist",
    ];
    let c = client();
    let mut s = spawn_bin(&args);
    wait_ready(&c, &s.url).await;
    let before = resume_chat(&s.url).await;
    stop(&mut s);
    let mut s = spawn_bin(&args);
    wait_ready(&c, &s.url).await;
    let after = resume_chat(&s.url).await;
    stop(&mut s);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(after["content"], before["content"], "{before} {after}");
    let n = before["prompt_tokens"].as_u64().unwrap();
    assert!(n > 30, "{before}");
    assert_eq!(before["prompt_n"].as_u64(), Some(n), "{before}");
    assert_eq!(after["prompt_tokens"].as_u64(), Some(n), "{after}");
    // Only the prompt's last token is evaluated again (for its logits).
    assert!(after["prompt_n"].as_u64().unwrap() <= 1, "{after}");
    assert!(after["cached_tokens"].as_u64().unwrap() >= n - 1, "{after}");
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

/// `/completion` on a server started with `extra`: the content, the
/// timings, and `/metrics`.
async fn complete_with(
    extra: &[&str],
    prompts: &[&str],
) -> Vec<(String, serde_json::Value, String)> {
    let model = smollm2();
    let mut args = vec!["-m", model.to_str().unwrap(), "-c", "1024", "-np", "2"];
    args.extend_from_slice(extra);
    let s = spawn_bin(&args);
    let c = client();
    wait_ready(&c, &s.url).await;
    // Both requests at once: the two slots decode in the same batches.
    let reqs = prompts.iter().map(|p| {
        let body = json!({"prompt": p, "n_predict": 48, "temperature": 0, "cache_prompt": false});
        let c = c.clone();
        let url = format!("{}/completion", s.url);
        async move { post(&c, &url, &body).await }
    });
    let outs = futures_util::future::join_all(reqs).await;
    let (_, metrics) = get(&c, &format!("{}/metrics", s.url)).await;
    outs.into_iter()
        .map(|(status, v)| {
            assert_eq!(status, 200, "{v}");
            (
                v["content"].as_str().unwrap_or_default().to_string(),
                v["timings"].clone(),
                metrics.clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_requests_speculate_per_slot_and_equal_plain_greedy() {
    // A code file to repeat with one change (SmolLM2 copies most of it),
    // twice at once: both slots speculate in the same batches.
    let code = include_str!("../../tests/fixtures/prompts/code-edit.txt");
    let prompts = [code, code];
    let plain = complete_with(&[], &prompts).await;
    for extra in [
        &[
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            "3",
        ][..],
        &["-md", smollm2().to_str().unwrap()][..],
    ] {
        let spec = complete_with(extra, &prompts).await;
        let (mut drafted, mut accepted) = (0.0, 0.0);
        for ((want, t0, _), (got, t, _)) in plain.iter().zip(&spec) {
            assert_eq!(got, want, "{extra:?}: the reply differs from plain greedy");
            assert!(t0.get("draft_n").is_none(), "{t0}");
            drafted += t["draft_n"].as_f64().unwrap_or(0.0);
            accepted += t["draft_n_accepted"].as_f64().unwrap_or(0.0);
        }
        let metrics = &spec[0].2;
        assert!(
            drafted > 0.0 && accepted > 0.0,
            "{extra:?}: {:?}",
            spec.iter().map(|s| &s.1).collect::<Vec<_>>()
        );
        assert_eq!(
            metric(metrics, "spec_decode_num_draft_tokens_total"),
            drafted,
            "{extra:?}"
        );
        assert_eq!(
            metric(metrics, "spec_decode_num_accepted_tokens_total"),
            accepted,
            "{extra:?}"
        );
        assert!(metric(metrics, "spec_decode_num_drafts_total") > 0.0);
    }
}
