//! llama-server's slot endpoints over HTTP (`GET /slots`, `POST
//! /slots/{id}?action=save|restore|erase`), `--slot-persist` across a
//! restart and the context cache: a restored conversation answers what the
//! re-prefilled one answers, with only the new tokens evaluated, and no
//! file name leaves `--slot-save-path`.

mod common;

use std::path::PathBuf;

use common::*;
use longhaul::scheduler::StateConfig;
use serde_json::{json, Value};

const PROMPT: &str = "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14159 and 2.71828";
const OTHER: &str = "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)";

/// A fresh directory of its own under the system's temporary directory.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("longhaul-slots-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn body(prompt: &str) -> Value {
    json!({"prompt": prompt, "n_predict": 8, "temperature": 0, "ignore_eos": true, "cache_prompt": true})
}

async fn complete(c: &reqwest::Client, s: &TestServer, prompt: &str) -> Value {
    let (st, v) = post(c, &format!("{}/completion", s.url), &body(prompt)).await;
    assert_eq!(st, 200, "{v}");
    v
}

async fn act(
    c: &reqwest::Client,
    s: &TestServer,
    id: &str,
    action: &str,
    file: Value,
) -> (u16, Value) {
    post(
        c,
        &format!("{}/slots/{id}?action={action}", s.url),
        &json!({ "filename": file }),
    )
    .await
}

async fn cached(c: &reqwest::Client, s: &TestServer) -> u64 {
    let (st, text) = get(c, &format!("{}/slots", s.url)).await;
    assert_eq!(st, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v[0]["id"], 0, "{v}");
    assert_eq!(v[0]["is_processing"], false, "{v}");
    v[0]["n_cached"].as_u64().expect("n_cached")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_erase_restore_then_only_new_tokens_are_evaluated() {
    let dir = scratch("actions");
    let s = start(
        &fixture(),
        Opts {
            n_slots: 1,
            states: StateConfig {
                slot_save_path: Some(dir.clone()),
                ..StateConfig::default()
            },
            ..Opts::default()
        },
    );
    let c = client();
    let fresh = complete(&c, &s, PROMPT).await;
    let n_prompt = fresh["timings"]["prompt_n"].as_u64().unwrap();
    assert!(n_prompt > 10, "{fresh}");
    let held = cached(&c, &s).await;
    // The prompt and the reply, less the last sampled token (not evaluated).
    assert_eq!(held, n_prompt + 7);

    let (st, v) = act(&c, &s, "0", "save", json!("a.state")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["id_slot"], 0);
    assert_eq!(v["filename"], "a.state");
    assert_eq!(v["n_saved"].as_u64(), Some(held), "{v}");
    let size = std::fs::metadata(dir.join("a.state"))
        .expect("saved file")
        .len();
    assert_eq!(v["n_written"].as_u64(), Some(size), "{v}");
    assert!(v["timings"]["save_ms"].as_f64().is_some(), "{v}");

    let (st, v) = act(&c, &s, "0", "erase", Value::Null).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["n_erased"].as_u64(), Some(held), "{v}");
    assert_eq!(cached(&c, &s).await, 0);

    // A damaged file is refused and leaves the (empty) slot as it was.
    let mut bad = std::fs::read(dir.join("a.state")).unwrap();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x10;
    std::fs::write(dir.join("bad.state"), &bad).unwrap();
    let (st, v) = act(&c, &s, "0", "restore", json!("bad.state")).await;
    assert_eq!(st, 400, "{v}");
    assert!(error_message(400, &v).contains("corrupted"), "{v}");
    let (st, v) = act(&c, &s, "0", "restore", json!("missing.state")).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(cached(&c, &s).await, 0);

    let (st, v) = act(&c, &s, "0", "restore", json!("a.state")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["n_restored"].as_u64(), Some(held), "{v}");
    assert_eq!(v["n_read"].as_u64(), Some(size), "{v}");
    assert_eq!(cached(&c, &s).await, held);

    // The same prompt again: nothing of it is evaluated but its last token
    // (the logits to sample from), and the answer is the fresh one.
    let again = complete(&c, &s, PROMPT).await;
    assert_eq!(again["content"], fresh["content"], "restored vs fresh");
    assert!(
        again["timings"]["prompt_n"].as_u64().unwrap() <= 1,
        "{again}"
    );

    // A conversation that continues the restored one sees what a fresh
    // prefill of the whole text sees.
    let longer = format!("{PROMPT}{}", fresh["content"].as_str().unwrap());
    let cont = complete(&c, &s, &longer).await;
    let (st, _) = act(&c, &s, "0", "erase", Value::Null).await;
    assert_eq!(st, 200);
    let refill = complete(&c, &s, &longer).await;
    assert_eq!(
        cont["content"], refill["content"],
        "continued vs re-prefilled"
    );
    assert!(refill["timings"]["prompt_n"].as_u64().unwrap() > n_prompt);

    let (_, text) = get(&c, &format!("{}/metrics", s.url)).await;
    assert_eq!(metric(&text, "state_saves_total"), 1.0, "{text}");
    assert_eq!(metric(&text, "state_restores_total"), 1.0, "{text}");
    assert_eq!(metric(&text, "state_bytes_written_total"), size as f64);
    assert_eq!(metric(&text, "state_bytes_read_total"), size as f64);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_names_stay_inside_the_save_path() {
    let dir = scratch("names");
    let outside = scratch("names-outside");
    let s = start(
        &fixture(),
        Opts {
            n_slots: 1,
            states: StateConfig {
                slot_save_path: Some(dir.clone()),
                ..StateConfig::default()
            },
            ..Opts::default()
        },
    );
    let c = client();
    complete(&c, &s, PROMPT).await;
    let target = outside.join("victim");
    std::fs::write(&target, b"keep me").unwrap();
    std::os::unix::fs::symlink(&target, dir.join("link")).unwrap();
    let escape = format!("../{}/x", outside.file_name().unwrap().to_string_lossy());
    let target_s = target.display().to_string();
    for name in [
        json!(escape),
        json!(target_s),
        json!("a/../../b"),
        json!(".."),
        json!(".hidden"),
        json!(""),
        json!("a\u{0}b"),
        json!("link"),
        json!(5),
        Value::Null,
    ] {
        for action in ["save", "restore"] {
            let (st, v) = act(&c, &s, "0", action, name.clone()).await;
            assert_eq!(st, 400, "{action} {name}: {v}");
            error_message(400, &v);
        }
    }
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    let left: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    let here: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        here,
        vec![std::ffi::OsString::from("link")],
        "nothing written in the save path"
    );

    let (st, v) = act(&c, &s, "3", "erase", Value::Null).await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = act(&c, &s, "zero", "erase", Value::Null).await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = act(&c, &s, "0", "rename", json!("a")).await;
    assert_eq!(st, 400, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&outside);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_save_path_save_and_restore_are_501() {
    let s = start(
        &fixture(),
        Opts {
            n_slots: 1,
            ..Opts::default()
        },
    );
    let c = client();
    complete(&c, &s, PROMPT).await;
    for action in ["save", "restore"] {
        let (st, v) = act(&c, &s, "0", action, json!("a.state")).await;
        assert_eq!(st, 501, "{v}");
        assert!(error_message(501, &v).contains("--slot-save-path"), "{v}");
    }
    assert!(cached(&c, &s).await > 0);
    let (st, v) = act(&c, &s, "0", "erase", Value::Null).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(cached(&c, &s).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_slot_survives_a_restart() {
    let dir = scratch("persist");
    let opts = || Opts {
        n_slots: 1,
        states: StateConfig {
            slot_save_path: Some(dir.clone()),
            persist: true,
            ..StateConfig::default()
        },
        ..Opts::default()
    };
    let c = client();
    let (fresh, held) = {
        let s = start(&fixture(), opts());
        let v = complete(&c, &s, PROMPT).await;
        (v, cached(&c, &s).await)
    }; // dropped: shut down, the slot written out
    assert!(dir.join("longhaul-slot-0.state").exists());
    let s = start(&fixture(), opts());
    assert_eq!(cached(&c, &s).await, held, "restored at start-up");
    let again = complete(&c, &s, PROMPT).await;
    assert_eq!(again["content"], fresh["content"]);
    assert!(
        again["timings"]["prompt_n"].as_u64().unwrap() <= 1,
        "{again}"
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One slot, two conversations in turn: the first is written to the
/// context cache when the second takes its slot, and comes back from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_cache_brings_back_an_earlier_conversation() {
    let dir = scratch("ctx");
    let s = start(
        &fixture(),
        Opts {
            n_slots: 1,
            states: StateConfig {
                context_cache: Some(dir.clone()),
                context_cache_slots: 4,
                ..StateConfig::default()
            },
            longhaul: true,
            ..Opts::default()
        },
    );
    let c = client();
    let first = complete(&c, &s, PROMPT).await;
    let n_first = first["timings"]["prompt_n"].as_u64().unwrap();
    let other = complete(&c, &s, OTHER).await;
    assert!(other["timings"]["cache_n"].as_u64().unwrap() < 4, "{other}");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let back = complete(&c, &s, PROMPT).await;
    assert_eq!(back["content"], first["content"]);
    assert!(back["timings"]["prompt_n"].as_u64().unwrap() <= 1, "{back}");
    let (_, text) = get(&c, &format!("{}/metrics", s.url)).await;
    assert!(
        metric(&text, "state_prompt_tokens_reused_total") >= (n_first - 1) as f64,
        "{text}"
    );
    assert!(metric(&text, "state_restores_total") >= 1.0, "{text}");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
