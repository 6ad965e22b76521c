//! A server on a free loopback port, in-process or as the real binary, and
//! small HTTP helpers for the tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use longhaul::backend::cpu::CpuBackend;
use longhaul::engine::{CacheBudget, Engine, EngineParams, LonghaulParams};
use longhaul::sample::SamplerParams;
use longhaul::scheduler::{Scheduler, StateConfig};
use longhaul::tensor::GgmlType;
use longhaul_server::{AppState, HttpConfig, Ready};
use serde_json::Value;

/// The tiny random Qwen3-MoE fixture (no chat template).
pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3moe-f32.gguf")
}

/// SmolLM2-135M-Instruct (has a chat template), fetched by tools/fetch-models.sh.
pub fn smollm2() -> PathBuf {
    let dir = std::env::var_os("LONGHAUL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/longhaul/models")
        });
    let p = dir.join("smollm2-135m-instruct-q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-models.sh (CI does) or set LONGHAUL_MODELS",
        p.display()
    );
    p
}

pub struct Opts {
    pub n_slots: usize,
    pub n_ctx: usize,
    pub http: HttpConfig,
    pub longhaul: bool,
    /// Do not load a model: the server stays in its loading state.
    pub loading: bool,
    /// A chat template instead of the model's (`--chat-template`).
    pub chat_template: Option<String>,
    /// `--chat-template-kwargs`.
    pub template_kwargs: longhaul::tokenizer::TemplateKwargs,
    /// Slot files, the persistent slot and the context cache.
    pub states: StateConfig,
    /// `--ignore-eos`: the default of requests' `ignore_eos`.
    pub ignore_eos: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            n_slots: 2,
            n_ctx: 256,
            http: HttpConfig::default(),
            longhaul: false,
            loading: false,
            chat_template: None,
            template_kwargs: Default::default(),
            states: StateConfig::default(),
            ignore_eos: false,
        }
    }
}

/// An in-process server; dropped = shut down.
pub struct TestServer {
    pub url: String,
    pub state: Arc<AppState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn load_ready(path: &Path, o: &Opts) -> Ready {
    let params = EngineParams {
        n_ctx: o.n_ctx,
        n_ubatch: 512,
        kv_type: GgmlType::F16,
        longhaul: o.longhaul.then_some(LonghaulParams {
            budget: CacheBudget::Bytes(1 << 20),
            policy: "lru".parse().expect("policy"),
            prefetch: false.into(),
            verify: false,
            direct_io: true,
            uring: false,
        }),
        no_mmap: false,
        chat_template: o.chat_template.clone(),
        template_kwargs: o.template_kwargs.clone(),
        ..Default::default()
    };
    let engine = Arc::new(
        Engine::load(path, CpuBackend::new(), params)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    );
    Ready {
        // Two threads per engine: the tests share two cores.
        scheduler: Scheduler::spawn_with_state(engine.clone(), o.n_slots, 2, o.states.clone()),
        engine,
        model_id: path.file_name().unwrap().to_string_lossy().into_owned(),
        model_path: path.display().to_string(),
        n_slots: o.n_slots,
        defaults: SamplerParams::default(),
        ignore_eos: o.ignore_eos,
        default_constraint: None,
        created: 0,
        slots_endpoint: true,
        slot_save_path: o.states.slot_save_path.clone(),
    }
}

pub fn start(path: &Path, o: Opts) -> TestServer {
    let state = AppState::new(o.http.clone());
    if !o.loading {
        state.set_ready(load_ready(path, &o));
    }
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let url = format!("http://{}", std_listener.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let st = state.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            longhaul_server::serve(
                listener,
                st,
                async move {
                    let _ = rx.await;
                },
                Duration::from_millis(200),
            )
            .await
            .expect("serve");
        });
    });
    TestServer {
        url,
        state,
        stop: Some(tx),
        thread: Some(thread),
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

/// POSTs JSON; returns the status and the parsed body.
pub async fn post(c: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let r = c.post(url).json(body).send().await.expect("send");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: {e}: {text}"));
    (status, v)
}

/// POSTs `body` as JSON text as it is (repeated keys, sizes a `Value`
/// would not be built for); returns the status and the parsed body.
pub async fn post_raw(c: &reqwest::Client, url: &str, body: String) -> (u16, Value) {
    let r = c
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: {e}: {text}"));
    (status, v)
}

pub async fn get(c: &reqwest::Client, url: &str) -> (u16, String) {
    let r = c.get(url).send().await.expect("send");
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// POSTs and reads a server-sent-event stream to its end: every `data:`
/// payload in order (`[DONE]` included, as a string).
pub async fn post_sse(c: &reqwest::Client, url: &str, body: &Value) -> Vec<Value> {
    let r = c.post(url).json(body).send().await.expect("send");
    assert_eq!(r.status().as_u16(), 200, "{url}");
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    assert!(ct.starts_with("text/event-stream"), "content-type {ct}");
    let text = r.text().await.expect("body");
    parse_sse(&text)
}

pub fn parse_sse(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| {
            if d == "[DONE]" {
                Value::String(d.into())
            } else {
                serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}"))
            }
        })
        .collect()
}

/// Checks OpenAI's error shape and returns the message.
pub fn error_message(status: u16, v: &Value) -> String {
    let e = &v["error"];
    assert!(e.is_object(), "not an error body: {v}");
    assert_eq!(e["code"].as_u64(), Some(status as u64), "{v}");
    assert!(e["type"].is_string(), "{v}");
    e["message"].as_str().expect("message").to_string()
}

/// The real binary on a free port; killed when dropped.
pub struct BinServer {
    pub url: String,
    pub child: Child,
}

impl Drop for BinServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn spawn_bin(args: &[&str]) -> BinServer {
    let mut child = Command::new(env!("CARGO_BIN_EXE_longhaul-server"))
        .args(["--port", "0", "-t", "2"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn longhaul-server");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[server] {line}");
            if let Some(rest) = line.split("listening on ").nth(1) {
                if let Some(t) = tx.take() {
                    let _ = t.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the server did not report its address");
    BinServer { url, child }
}

/// Polls `/health` until 200.
pub async fn wait_ready(c: &reqwest::Client, url: &str) {
    for _ in 0..600 {
        if let Ok(r) = c.get(format!("{url}/health")).send().await {
            if r.status().as_u16() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} did not become ready");
}

/// The Python that has the `openai` package: $LONGHAUL_PYTHON, else the
/// virtual environment tools/test.sh makes, else `python3`.
pub fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("LONGHAUL_PYTHON") {
        return p.into();
    }
    let venv = std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
        .join(".cache/longhaul/pyenv/bin/python3");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// The value of `longhaul:NAME` in a `/metrics` text.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("longhaul:{name} ")))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .unwrap()
}
