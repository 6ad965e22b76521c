//! Hostile request bodies must not take many times their size in memory
//! while they are prepared: the fields that can hold millions of elements
//! (`logit_bias`, `json_schema`, `response_format`, `stop`, `prompt`, and
//! fields the server does not read) are read element by element, and
//! what is kept is bounded by what the request may use. Before, a 16 MiB
//! body of `logit_bias` pairs took the server from 0.15 to 1.23 GiB, and
//! 64 such bodies of 1 MiB side by side to 1.78 GiB.
//!
//! This test binary counts the bytes its allocator holds (the in-process
//! server's and the client's), so it has this one test.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use serde_json::json;

/// The system allocator, counting the bytes it holds and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call goes to `System` with the caller's arguments; the
// counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, new) };
        if !q.is_null() {
            // Counted as a new block beside the old, as a moving realloc
            // holds both for a moment.
            grew(new);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The body size of each case: the ratio is what is checked, and the
/// debug build parses 4 MiB in well under a second.
const SIZE: usize = 4 << 20;

/// `head` + `item`, `item`, ... + `tail`, about [`SIZE`] bytes.
fn repeated(head: &str, item: &str, tail: &str) -> String {
    let n = (SIZE - head.len() - tail.len()) / (item.len() + 1);
    let mut s = String::with_capacity(SIZE + item.len());
    s.push_str(head);
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str(item);
    }
    s.push_str(tail);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_take_a_few_times_their_size_to_prepare() {
    let s = start(&fixture(), Opts::default());
    let c = client();
    // One request first, so that the model's buffers and the connection
    // pool are not counted in the cases.
    let (st, v) = post(
        &c,
        &format!("{}/completion", s.url),
        &json!({"prompt": "hi", "n_predict": 1}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let some_keys = (0..4096)
        .map(|i| format!("\"{}\":0.5", i % 64))
        .collect::<Vec<_>>()
        .join(",");
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        (
            "/completion",
            repeated(
                r#"{"prompt":"hi","n_predict":1,"logit_bias":["#,
                "[0,0]",
                "]}",
            ),
            400,
            Some("logit_bias"),
        ),
        (
            "/v1/completions",
            repeated(
                r#"{"prompt":"hi","max_tokens":1,"logit_bias":["#,
                "[1,0]",
                "]}",
            ),
            400,
            Some("logit_bias"),
        ),
        (
            // Object keys repeat: each replaces the last, so this is 64
            // entries and is served.
            "/completion",
            repeated(
                r#"{"prompt":"hi","n_predict":1,"logit_bias":{"#,
                &some_keys,
                "}}",
            ),
            200,
            None,
        ),
        (
            "/completion",
            repeated(
                r#"{"prompt":"hi","n_predict":1,"json_schema":["#,
                "[]",
                "]}",
            ),
            400,
            Some("json_schema"),
        ),
        (
            "/v1/completions",
            repeated(
                r#"{"prompt":"hi","max_tokens":1,"response_format":{"type":"json_schema","json_schema":{"schema":{"enum":["#,
                "[]",
                "]}}}}",
            ),
            400,
            Some("response_format"),
        ),
        (
            "/completion",
            repeated(r#"{"prompt":"hi","n_predict":1,"stop":["#, r#""""#, "]}"),
            200,
            None,
        ),
        (
            "/completion",
            repeated(r#"{"prompt":"hi","n_predict":1,"stop":["#, r#""a""#, "]}"),
            400,
            Some("stop"),
        ),
        (
            // A field the server does not read.
            "/completion",
            repeated(r#"{"prompt":"hi","n_predict":1,"unread":["#, "[]", "]}"),
            200,
            None,
        ),
        (
            "/completion",
            repeated(r#"{"n_predict":1,"prompt":["#, "0", "]}"),
            400,
            Some("messages/prompt"),
        ),
    ];
    for (path, body, want, param) in cases {
        let url = format!("{}{path}", s.url);
        let len = body.len();
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let (st, v) = post_raw(&c, &url, body).await;
        let peak = PEAK.load(Ordering::Relaxed) - base;
        let head = &format!(
            "{path} {}",
            &v.to_string().chars().take(160).collect::<String>()
        );
        eprintln!("{head}: {len} bytes of body, {peak} bytes at the peak");
        assert_eq!(st, want, "{head}");
        assert_eq!(v["error"]["param"].as_str(), param, "{head}");
        // The body itself is counted: the client's copy and the server's,
        // which hyper collects in growing buffers.
        assert!(
            peak <= 6 * len,
            "{head}: {peak} bytes at the peak for {len} bytes of body"
        );
    }
}
