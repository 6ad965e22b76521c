//! A model file that changes under a running server (the real binary): a
//! truncated file makes requests fail cleanly (never a SIGBUS, never output),
//! `/health` says why, and once the file is put back the next answer equals
//! the reference; a file swapped for another model of the same shape is
//! refused until the server restarts, after which it serves the new model.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::{client, get, post, spawn_bin, wait_ready, BinServer};
use longhaul::synth::{self, SynthSpec};
use serde_json::{json, Value};

fn model(name: &str, seed: u64) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("server-model-file");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(name);
    let spec = SynthSpec {
        seed,
        ..SynthSpec::tiny()
    };
    synth::write(&spec, &path).expect("write model");
    path
}

/// Two slots of experts per layer: the prompt batch runs in waves.
const LONGHAUL: [&str; 4] = ["--longhaul", "--longhaul-cache", "0.0005", "-np"];

fn server(path: &Path, longhaul: bool) -> BinServer {
    let p = path.to_str().expect("utf-8 path");
    let mut args = vec!["-m", p, "-c", "128"];
    if longhaul {
        args.extend(LONGHAUL);
        args.push("1");
    }
    spawn_bin(&args)
}

fn request() -> Value {
    json!({"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "n_predict": 8, "temperature": 0})
}

/// The greedy completion, or the status and error message.
async fn complete(c: &reqwest::Client, url: &str) -> Result<String, (u16, String)> {
    let (status, v) = post(c, &format!("{url}/completion"), &request()).await;
    if status == 200 {
        Ok(v["content"].as_str().expect("content").to_string())
    } else {
        Err((status, common::error_message(status, &v)))
    }
}

async fn reference(c: &reqwest::Client, path: &Path) -> String {
    let s = server(path, false);
    wait_ready(c, &s.url).await;
    complete(c, &s.url).await.expect("reference")
}

fn assert_refused(r: Result<String, (u16, String)>, path: &Path) {
    match r {
        Err((status, msg)) => {
            assert!(status >= 500, "status {status}: {msg}");
            assert!(
                msg.contains("changed") && msg.contains(&path.display().to_string()),
                "{msg}"
            );
        }
        Ok(text) => panic!("a changed file served output: {text:?}"),
    }
}

async fn assert_health_says_changed(c: &reqwest::Client, url: &str) {
    let (status, body) = get(c, &format!("{url}/health")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("changed"), "{body}");
    let (_, metrics) = get(c, &format!("{url}/metrics")).await;
    assert!(
        metrics.contains("longhaul:model_file_changed 1"),
        "{metrics}"
    );
}

/// Truncate, fail, restore, answer: in longhaul mode (experts read with
/// `pread`) and in the default mapped mode (which must not die of SIGBUS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_file_fails_cleanly_and_the_restored_file_answers_exactly() {
    let c = client();
    for longhaul in [true, false] {
        let path = model(&format!("truncate-{longhaul}.gguf"), 11);
        let want = reference(&c, &path).await;
        let bytes = std::fs::read(&path).expect("read");
        let mut s = server(&path, longhaul);
        wait_ready(&c, &s.url).await;
        assert_eq!(complete(&c, &s.url).await.as_ref(), Ok(&want));
        for round in 0..2 {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .expect("open rw");
            f.set_len(bytes.len() as u64 / 2).expect("truncate");
            for _ in 0..2 {
                assert_refused(complete(&c, &s.url).await, &path);
            }
            assert_health_says_changed(&c, &s.url).await;
            assert!(
                s.child.try_wait().expect("wait").is_none(),
                "the server died (longhaul {longhaul}, round {round})"
            );
            f.write_all_at(&bytes, 0).expect("restore");
            drop(f);
            for _ in 0..2 {
                assert_eq!(
                    complete(&c, &s.url).await.as_ref(),
                    Ok(&want),
                    "longhaul {longhaul}, round {round}: the answer after the restore"
                );
            }
            let (status, _) = get(&c, &format!("{}/health", s.url)).await;
            assert_eq!(status, 200);
        }
        s.child.kill().expect("kill");
    }
}

/// Another model of the same shape copied over the file (in place, and by
/// rename): typed errors, never a 200; after a restart the new model serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_file_is_refused_until_restart() {
    let c = client();
    for rename in [false, true] {
        let path = model(&format!("swap-{rename}.gguf"), 21);
        let other = model(&format!("swap-other-{rename}.gguf"), 22);
        let want_other = reference(&c, &other).await;
        let s = server(&path, true);
        wait_ready(&c, &s.url).await;
        let before = complete(&c, &s.url).await.expect("before the swap");
        assert_ne!(before, want_other, "the two models must differ");
        if rename {
            let tmp = path.with_extension("tmp");
            std::fs::copy(&other, &tmp).expect("copy");
            std::fs::rename(&tmp, &path).expect("rename");
        } else {
            std::fs::copy(&other, &path).expect("copy over");
        }
        for _ in 0..3 {
            assert_refused(complete(&c, &s.url).await, &path);
        }
        assert_health_says_changed(&c, &s.url).await;
        drop(s);
        let s = server(&path, true);
        wait_ready(&c, &s.url).await;
        assert_eq!(complete(&c, &s.url).await, Ok(want_other));
    }
}
