//! `longhaul-server`: an HTTP server over the engine with OpenAI's API
//! (`/v1/chat/completions`, `/v1/completions`, `/v1/models`) and
//! llama-server's native endpoints (`/completion`, `/tokenize`,
//! `/detokenize`, `/apply-template`, `/props`, `/health`, `/metrics`).
//!
//! This crate owns HTTP: routing, request parsing and validation, response
//! and server-sent-event shapes, authentication, body limits and shutdown.
//! Generation itself belongs to [`longhaul::scheduler`]: one engine thread
//! that batches every active request; a handler tokenises, submits a
//! [`GenRequest`](longhaul::scheduler::GenRequest) and relays the events.
//! The crate knows nothing about models or backends beyond the engine's
//! public surface ([`EngineInfo`]); only [`run`] resolves the placement
//! (`-ngl`, `--device`) through [`longhaul::placement`] and loads the engine
//! on it, as the CLI does.

pub mod args;
pub mod conn;
pub mod error;
mod fields;
pub mod flags;
mod gen;
mod metrics;
mod native;
mod openai;
mod probs;
mod prompt;
mod request;
mod slots;
mod structured;
mod tools;
mod unsupported;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use longhaul::backend::Backend;
use longhaul::constrain::{ConstrainError, Constraint, ConstraintSpec};
use longhaul::draft::ModelDrafter;
use longhaul::engine::{Engine, EngineError};
use longhaul::sample::SamplerParams;
use longhaul::scheduler::{Scheduler, Speculation};
use longhaul::spec::SpecType;
use longhaul::tokenizer::{ChatMessage, TemplateArgs, Tokenizer};
use serde_json::json;
use tokio::sync::watch;

pub use args::ServeArgs;
pub use conn::default_max_connections;
use error::ApiError;

/// What the HTTP layer needs from a loaded engine, whatever its backend.
pub trait EngineInfo: Send + Sync {
    fn tokenizer(&self) -> &Tokenizer;
    /// Renders a conversation through the model's chat template with a
    /// request's tools and kwargs.
    fn apply_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        args: &TemplateArgs<'_>,
    ) -> Result<String, EngineError>;
    fn template_source(&self) -> Option<&str>;
    fn n_ctx(&self) -> usize;
    /// Whether the model's files are still the ones loaded (see
    /// [`longhaul::gguf::Model::check_files`]); the message says what changed.
    fn check_files(&self) -> Result<(), String>;
    /// Compiles a grammar or schema for the model's tokenizer.
    fn constraint(&self, spec: &ConstraintSpec) -> Result<Constraint, ConstrainError>;
}

impl<B: Backend> EngineInfo for Engine<B> {
    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    fn apply_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        args: &TemplateArgs<'_>,
    ) -> Result<String, EngineError> {
        Engine::apply_template_with(self, messages, add_generation_prompt, args)
    }
    fn template_source(&self) -> Option<&str> {
        self.template.as_ref().map(|t| t.source())
    }
    fn n_ctx(&self) -> usize {
        self.params.n_ctx
    }
    fn check_files(&self) -> Result<(), String> {
        self.model.file.check_files().map_err(|e| e.to_string())
    }
    fn constraint(&self, spec: &ConstraintSpec) -> Result<Constraint, ConstrainError> {
        Engine::constraint(self, spec)
    }
}

/// A loaded model being served.
pub struct Ready {
    pub scheduler: Scheduler,
    pub engine: Arc<dyn EngineInfo>,
    /// The `model` name reported and accepted (`--alias`, else the file name).
    pub model_id: String,
    pub model_path: String,
    pub n_slots: usize,
    /// Sampling settings of requests that do not give their own (the
    /// command line's `--temp`, `--top-k`, ...).
    pub defaults: SamplerParams,
    /// `ignore_eos` of requests that do not give it (`--ignore-eos`).
    pub ignore_eos: bool,
    /// The constraint of requests that do not give their own
    /// (`--grammar`, `--grammar-file`, `--json-schema[-file]`).
    pub default_constraint: Option<ConstraintSpec>,
    /// Unix time the model became ready.
    pub created: u64,
    /// `GET /slots` is served (`--slots`, the default; `--no-slots`).
    pub slots_endpoint: bool,
    /// `--slot-save-path`: where `/slots/{id}?action=save|restore` files go.
    pub slot_save_path: Option<std::path::PathBuf>,
}

/// Settings of the HTTP layer.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Requests must carry `Authorization: Bearer KEY` (except `/health`).
    pub api_key: Option<String>,
    /// Larger request bodies are refused with 413.
    pub body_limit: usize,
    /// Print one line per request on stderr.
    pub log_requests: bool,
    /// `-to/--timeout`: a request body that delivers nothing, or a response
    /// write the client does not take, for this long ends the connection.
    pub io_timeout: Option<Duration>,
    /// `--header-timeout`: the time a client has to send a complete request
    /// line and headers, from when the server starts waiting for them.
    pub header_timeout: Option<Duration>,
    /// `--idle-timeout`: a connection with no request in flight and no byte
    /// of a new one is closed after this long.
    pub idle_timeout: Option<Duration>,
    /// `--max-connections`: the cap on open connections (see [`conn`]).
    pub max_connections: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            body_limit: 16 << 20,
            log_requests: false,
            io_timeout: Some(Duration::from_secs(3600)),
            header_timeout: Some(Duration::from_secs(10)),
            idle_timeout: Some(Duration::from_secs(5)),
            max_connections: default_max_connections(),
        }
    }
}

/// Shared state of every handler.
pub struct AppState {
    ready: OnceLock<Ready>,
    config: HttpConfig,
    /// Flips to `true` when in-flight generations must stop (shutdown).
    abort: watch::Receiver<bool>,
    abort_tx: watch::Sender<bool>,
    /// KiB of bodies being prepared: one body of the limit
    /// ([`request::off_runtime`]).
    pub preparing: Arc<tokio::sync::Semaphore>,
    /// KiB of large bodies being read or waiting to prepare
    /// ([`request::Received`]).
    pub body_budget: Arc<tokio::sync::Semaphore>,
    /// Requests waiting for their share of `body_budget`.
    pub bodies_waiting: std::sync::atomic::AtomicUsize,
}

impl AppState {
    /// A server still loading its model (`/health` answers 503).
    pub fn new(config: HttpConfig) -> Arc<Self> {
        let (abort_tx, abort) = watch::channel(false);
        Arc::new(Self {
            ready: OnceLock::new(),
            abort,
            abort_tx,
            preparing: Arc::new(tokio::sync::Semaphore::new(request::prepare_budget_kib(
                config.body_limit,
            ) as usize)),
            body_budget: Arc::new(tokio::sync::Semaphore::new(request::body_budget_kib(
                config.body_limit,
            ))),
            bodies_waiting: Default::default(),
            config,
        })
    }

    /// Marks the model loaded; requests are served from now on.
    pub fn set_ready(&self, ready: Ready) {
        if self.ready.set(ready).is_err() {
            eprintln!("longhaul-server: the model was already set; ignoring the second one");
        }
    }

    fn ready(&self) -> Result<&Ready, ApiError> {
        self.ready
            .get()
            .ok_or_else(|| ApiError::unavailable("Loading model"))
    }

    /// Stops accepting generations and ends the in-flight ones: they finish
    /// normally within `grace`, after which they are cancelled and their
    /// clients get a 503 error (an error event on a stream).
    pub async fn drain(&self, grace: Duration) {
        let Some(r) = self.ready.get() else { return };
        r.scheduler.shutdown();
        let t0 = Instant::now();
        while t0.elapsed() < grace {
            let m = r.scheduler.metrics();
            if m.requests_processing + m.requests_deferred == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.abort_tx.send(true);
        // The engine loop ends once the cancelled requests are dropped,
        // after saving the persistent slots (--slot-persist).
        let s = r.scheduler.clone();
        let _ = tokio::task::spawn_blocking(move || s.wait_stopped(Duration::from_secs(120))).await;
    }
}

/// The application: every route, authentication and the body limit.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.body_limit;
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/v1/models", get(openai::models))
        .route("/models", get(openai::models))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/completion", post(native::completion))
        .route("/completions", post(native::completion))
        .route("/tokenize", post(native::tokenize))
        .route("/detokenize", post(native::detokenize))
        .route("/apply-template", post(native::apply_template))
        .route("/props", get(native::props))
        .route("/metrics", get(metrics::metrics))
        .route("/slots", get(slots::list))
        .route("/slots/{id}", post(slots::action))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Serves `router(state)` on `listener` until `shutdown` resolves, then
/// drains in-flight generations (see [`AppState::drain`]) and returns once
/// every connection is closed. Connections get the header, idle and
/// read/write timeouts and the connection cap of the state's
/// [`HttpConfig`] (see [`conn`]), before any request is routed or
/// authenticated.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let st = state.clone();
    conn::serve_with(listener, app, &state.config, async move {
        shutdown.await;
        st.drain(grace).await;
    })
    .await
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Authentication (`--api-key`) and the request log.
async fn guard(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let t0 = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let public = matches!(path.as_str(), "/health" | "/v1/health");
    if let (Some(key), false) = (&state.config.api_key, public) {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if given != Some(key.as_str()) {
            let mut resp = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid or missing API key: send `Authorization: Bearer <key>`",
            )
            .into_response();
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            return resp;
        }
    }
    let resp = next.run(req).await;
    if state.config.log_requests {
        eprintln!(
            "{method} {path} {} {:.1} ms",
            resp.status().as_u16(),
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    resp
}

/// `/health`: 200 `{"status": "ok"}` once loaded, 503 while loading, and
/// 503 with the reason once a model file changed under the server.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.ready.get() {
        Some(r) => match r.engine.check_files() {
            Ok(()) => Json(json!({"status": "ok"})).into_response(),
            Err(msg) => ApiError::unavailable(msg).into_response(),
        },
        None => ApiError::unavailable("Loading model").into_response(),
    }
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no endpoint {} {}", req.method(), req.uri().path()),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A fresh response id such as `chatcmpl-3f9a...`.
fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // splitmix64 of time and counter: unique per process, unpredictable enough for ids.
    let mut z = t ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    format!("{prefix}-{z:016x}{n:x}")
}

/// Loads the model named by `args` on the placement its `-ngl`/`--device`
/// choose and serves it until SIGINT/SIGTERM. `/health` answers 503 while
/// the model loads. Flag errors, a refused placement and a GPU that cannot
/// be opened fail before the server listens.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let params = args.model.engine_params()?;
    let defaults = args.sample.params()?;
    let default_constraint = args.sample.constraint()?;
    let ignore_eos = args.sample.ignore_eos;
    let http = args.http_config()?;
    let states = args.state_config()?;
    let spec = args.spec.params()?;
    let draft_path = args.spec.draft_model(&spec);
    let slots_endpoint = !args.no_slots;
    let n_threads = args.model.n_threads();
    let placed = args.model.placement.resolve(&args.model.model)?;
    eprintln!("longhaul-server: placement: {}", placed.summary);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let addr: SocketAddr = format!("{}:{}", args.host, args.port)
            .parse()
            .or_else(|_| {
                use std::net::ToSocketAddrs;
                (args.host.as_str(), args.port)
                    .to_socket_addrs()?
                    .next()
                    .ok_or_else(|| std::io::Error::other("no address"))
            })
            .map_err(|e| anyhow::anyhow!("--host {} --port {}: {e}", args.host, args.port))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        let state = AppState::new(http);
        eprintln!(
            "longhaul-server: listening on http://{} (loading {})",
            listener.local_addr()?,
            args.model.model.display()
        );
        let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<String>();
        let st = state.clone();
        let model_path = args.model.model.clone();
        let alias = args.alias.clone();
        let n_slots = args.parallel.max(1);
        let model_args = args.model.clone();
        let slot_save_path = states.slot_save_path.clone();
        tokio::task::spawn_blocking(move || {
            let t0 = Instant::now();
            // The only code that names the backend type: load and start the
            // engine loop, once per backend.
            let loaded: Result<(Scheduler, Arc<dyn EngineInfo>), EngineError> =
                longhaul::with_backend!(placed.placement, |backend| {
                    // Every slot's KV cache is checked against memory in the load.
                    let draft_params = params.clone();
                    // Copy for the CPU, a shared device handle for the GPU.
                    #[allow(clippy::clone_on_copy)]
                    let draft_backend = backend.clone();
                    // A draft model's weights and slots stay out of an auto expert budget.
                    let mut params = params;
                    params.draft_model = draft_path.clone();
                    params.mtp = spec.kind == SpecType::DraftMtp;
                    Engine::load_parallel(&model_path, backend, params, n_slots, None).and_then(|engine| {
                        let engine = Arc::new(engine);
                        let draft = match (spec.kind, &draft_path) {
                            (SpecType::DraftSimple, Some(path)) => {
                                let mut p = draft_params;
                                p.n_ctx = engine.params.n_ctx;
                                let d = ModelDrafter::load_model(path, draft_backend, p)?;
                                longhaul::draft::check_vocab(&engine.tokenizer, &d.tokenizer)?;
                                eprintln!(
                                    "longhaul-server: draft model {} ({} layers, resident, one sequence per slot)",
                                    path.display(),
                                    d.model.hp.n_layer
                                );
                                Some(Arc::new(d))
                            }
                            _ => None,
                        };
                        let spec = Speculation { params: spec, draft };
                        let scheduler = Scheduler::spawn_speculative(
                            engine.clone(),
                            n_slots,
                            n_threads,
                            states,
                            spec,
                        );
                        Ok((scheduler, engine as Arc<dyn EngineInfo>))
                    })
                });
            // A default grammar that does not compile fails the start.
            let loaded = loaded.map_err(|e| e.to_string()).and_then(|(s, engine)| {
                match default_constraint.as_ref().map(|c| engine.constraint(c)) {
                    Some(Err(e)) => Err(e.to_string()),
                    _ => Ok((s, engine)),
                }
            });
            match loaded {
                Ok((scheduler, engine)) => {
                    model_args.lock_memory();
                    if let Err(e) = defaults.check_vocab(engine.tokenizer().n_vocab()) {
                        let _ = fail_tx.send(format!("{}: {e}", e.flag()));
                        return;
                    }
                    let model_id = alias.unwrap_or_else(|| {
                        model_path
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_else(|| model_path.display().to_string())
                    });
                    eprintln!(
                        "longhaul-server: {model_id} ready in {:.2} s ({} slots, n_ctx {}, {} threads)",
                        t0.elapsed().as_secs_f64(),
                        n_slots,
                        engine.n_ctx(),
                        n_threads
                    );
                    st.set_ready(Ready {
                        scheduler,
                        engine,
                        model_id,
                        model_path: model_path.display().to_string(),
                        n_slots,
                        defaults,
                        ignore_eos,
                        default_constraint,
                        created: unix_now(),
                        slots_endpoint,
                        slot_save_path,
                    });
                }
                Err(e) => {
                    let _ = fail_tx.send(e);
                }
            }
        });
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let failed = Arc::new(std::sync::Mutex::new(None::<String>));
        let failed2 = failed.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown_signal() => eprintln!("longhaul-server: shutting down"),
                Ok(msg) = fail_rx => {
                    *failed2.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg);
                }
            }
            let _ = stop_tx.send(());
        });
        let grace = Duration::from_secs_f64(args.shutdown_timeout.max(0.0));
        serve(
            listener,
            state,
            async move {
                let _ = stop_rx.await;
            },
            grace,
        )
        .await?;
        if let Some(msg) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
            anyhow::bail!("{msg}");
        }
        Ok(())
    })
}
