//! Continuous batching: one engine thread owns the model and serves requests
//! from a channel with `n_slots` sequences (slots). A new request takes a
//! free slot (reusing the slot's KV prefix when asked); every step then
//! evaluates, in one batch ([`SeqState::eval_multi`]), the pending token of
//! every decoding slot and the next prompt chunk of every prefilling slot,
//! so a new prompt joins the running generations instead of pausing them.
//! Every token computes exactly as in a run of its sequence alone. Tokens
//! stream back over a per-request channel; a client that drops its
//! [`GenStream`] cancels its generation and frees the slot.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::backend::Backend;
use crate::constrain::Constraint;
use crate::engine::Engine;
use crate::longhaul::CacheStats;
use crate::model::Logits;
use crate::sample::{ProbsRequest, Sampler, SamplerParams, TokenProbs};
use crate::spec::{Drafter, SpecStats};
use crate::state::SeqState;
use crate::tokenizer::StreamDecoder;

mod spec;
mod state;
mod stops;
pub use spec::Speculation;
use state::ContextCache;
use stops::StopStrings;
pub use stops::{MAX_STOP_BYTES, MAX_STOP_STRINGS};

/// One generation request (the prompt already tokenised).
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    /// Most new tokens (`usize::MAX`: until the context is full).
    pub n_predict: usize,
    pub sampler: SamplerParams,
    /// Stop strings matched on the decoded text; the match is not emitted.
    pub stop: Vec<String>,
    /// Reuse the slot's KV cache for a common prompt prefix.
    pub cache_prompt: bool,
    /// llama.cpp's `ignore_eos`: end-of-generation tokens are banned
    /// ([`SamplerParams::ban_eog`]), so the generation ends only at
    /// `n_predict`, a stop string, a complete grammar or a full context.
    pub ignore_eos: bool,
    /// Report each sampled token's probabilities (`None`: no cost).
    pub probs: Option<ProbsRequest>,
    /// Tokens limited to a grammar's (see [`crate::constrain`]); the
    /// generation stops (`Stop`) when the grammar is complete.
    pub constraint: Option<Constraint>,
    /// Render control tokens in the text (tool-call formats whose markers
    /// are special tokens need them to be parsed).
    pub special: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End of generation or a stop string.
    Stop,
    /// `n_predict` reached or the context is full.
    Length,
}

/// How a generation went, llama.cpp's `timings`.
#[derive(Clone, Debug, PartialEq)]
pub struct GenSummary {
    pub finish_reason: FinishReason,
    pub n_prompt: usize,
    /// Prompt tokens reused from the slot's cache.
    pub n_cached: usize,
    pub n_gen: usize,
    pub prompt_ms: f64,
    pub gen_ms: f64,
    pub stopped_word: Option<String>,
    /// Speculative decoding's counters (zero without a drafter).
    pub spec: SpecStats,
}

#[derive(Clone, Debug, PartialEq)]
pub enum GenEvent {
    /// A sampled token and the text it completes (possibly empty while a
    /// multi-byte character or a possible stop string is pending), with
    /// its probabilities when the request asked for them.
    Token {
        id: u32,
        text: String,
        probs: Option<TokenProbs>,
    },
    Done(GenSummary),
    Error(GenFailure),
}

/// Why a generation stopped part-way.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GenFailure {
    /// The request's own grammar or schema could not go on (a parser limit
    /// reached part-way, such as too many alternatives at one point): the
    /// request's to change, so the server answers 400.
    #[error("{0}")]
    Constraint(String),
    /// The engine failed (a read, the backend): not the request's doing.
    #[error("{0}")]
    Engine(String),
}

/// Counters for `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct SchedulerMetrics {
    pub requests_processing: usize,
    pub requests_deferred: usize,
    pub prompt_tokens_total: u64,
    pub prompt_seconds_total: f64,
    pub gen_tokens_total: u64,
    pub gen_seconds_total: f64,
    pub longhaul: Option<CacheStats>,
    /// Recurrent-state checkpoints made (hybrid models, `--ctx-checkpoints`).
    pub checkpoints_created: u64,
    /// Requests that went back to a checkpoint for their prompt's prefix
    /// (a request that extends what its slot holds needs none).
    pub checkpoints_restored: u64,
    /// Requests of a hybrid model that shared a prefix with their slot but
    /// found no checkpoint at or before it, and so evaluated the whole
    /// prompt again.
    pub prefix_reprefills: u64,
    /// Sequence states written to files (slot saves, the persistent slot,
    /// context-cache spills) and their bytes.
    pub state_saves: u64,
    pub state_bytes_written: u64,
    /// Sequence states read back from files, and their bytes.
    pub state_restores: u64,
    pub state_bytes_read: u64,
    /// Prompt tokens a request did not evaluate because a restored state
    /// held them.
    pub state_tokens_reused: u64,
    /// Speculative decoding: tokens drafted, drafted tokens accepted, and
    /// verification batches (llama-server's `spec_decode_num_*_total`).
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    pub spec_drafts: u64,
}

/// Where sequence states go on disk (see [`crate::statefile`]).
#[derive(Clone, Debug, Default)]
pub struct StateConfig {
    /// `--slot-save-path`: the directory of [`SlotAction::Save`] and
    /// [`SlotAction::Restore`] files.
    pub slot_save_path: Option<PathBuf>,
    /// `--slot-persist`: each slot is saved into `slot_save_path` on a clean
    /// shutdown and restored from there at start-up.
    pub persist: bool,
    /// `--context-cache-path`: an idle slot's conversation is written here
    /// when its slot is taken for another one, and restored for a later
    /// request whose prompt starts with it.
    pub context_cache: Option<PathBuf>,
    /// `--context-cache-slots`: most conversations kept there (least
    /// recently used removed first).
    pub context_cache_slots: usize,
}

/// llama-server's `/slots/{id}?action=...`.
#[derive(Clone, Debug)]
pub enum SlotAction {
    /// Writes the slot's state to this file (a plain name checked by the
    /// caller, inside `--slot-save-path`).
    Save(PathBuf),
    /// Replaces the slot's state with this file's.
    Restore(PathBuf),
    /// Forgets the slot's state.
    Erase,
}

/// What a [`SlotAction`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum SlotReply {
    Saved {
        n_saved: usize,
        n_written: u64,
        ms: f64,
    },
    Restored {
        n_restored: usize,
        n_read: u64,
        ms: f64,
    },
    Erased {
        n_erased: usize,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("slot {id} does not exist; this server has slots 0..{n} (-np/--parallel)", n = n_slots.saturating_sub(1))]
    NoSlot { id: usize, n_slots: usize },
    /// The file was refused or could not be read or written; the message
    /// says why.
    #[error("{0}")]
    File(String),
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// What a slot is doing, for `GET /slots`.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotInfo {
    pub id: usize,
    pub n_ctx: usize,
    /// Tokens whose state the slot holds.
    pub n_cached: usize,
    /// The request it serves, if any.
    pub task: Option<TaskInfo>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TaskInfo {
    pub id_task: u64,
    /// Still evaluating its prompt (else generating).
    pub prefilling: bool,
    pub n_prompt: usize,
    pub n_decoded: usize,
    /// `usize::MAX`: until the context is full.
    pub n_predict: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("the prompt has {n_prompt} tokens but the context holds {n_ctx}; shorten it or start the server with a larger -c/--ctx-size")]
    PromptTooLong { n_prompt: usize, n_ctx: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error(
        "{n} stop strings of {bytes} bytes in all given; at most {MAX_STOP_STRINGS} strings of \
         {MAX_STOP_BYTES} bytes in all are taken (every step of every slot checks each)"
    )]
    TooManyStops { n: usize, bytes: usize },
}

struct Job {
    id: u64,
    req: GenRequest,
    /// `req.stop` as automata (built by the caller of `submit`, not on
    /// the engine thread).
    stops: StopStrings,
    events: UnboundedSender<GenEvent>,
    cancel: Arc<AtomicBool>,
}

type SlotReplyTx = tokio::sync::oneshot::Sender<Result<SlotReply, SlotError>>;

/// A slot action waiting for its slot to be idle.
struct SlotJob {
    id: usize,
    action: SlotAction,
    reply: SlotReplyTx,
}

enum Msg {
    Gen(Box<Job>),
    Slot(SlotJob),
}

struct Shared {
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    metrics: Mutex<SchedulerMetrics>,
    slots: Mutex<Vec<SlotInfo>>,
    n_ctx: usize,
    n_slots: AtomicU64,
    next_task: AtomicU64,
    /// Set when the engine loop has ended (and saved what it persists).
    stopped: (Mutex<bool>, Condvar),
}

/// A handle to the engine thread (cheap to clone). When the last clone is
/// dropped the scheduler shuts down as [`Scheduler::shutdown`] does.
#[derive(Clone)]
pub struct Scheduler {
    handle: Arc<Handle>,
}

struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        close(&self.shared);
    }
}

/// Stops accepting requests: the engine loop ends once the running ones
/// have finished.
fn close(shared: &Shared) {
    shared.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
}

/// The events of one request. Dropping it cancels the generation.
pub struct GenStream {
    rx: UnboundedReceiver<GenEvent>,
    cancel: Arc<AtomicBool>,
}

impl GenStream {
    /// The next event; `None` once the stream has ended.
    pub async fn next(&mut self) -> Option<GenEvent> {
        self.rx.recv().await
    }

    /// The next event, blocking the calling (non-async) thread.
    pub fn next_blocking(&mut self) -> Option<GenEvent> {
        self.rx.blocking_recv()
    }

    /// Stops the generation; the slot is freed at the next step.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

impl Drop for GenStream {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl Scheduler {
    /// [`Scheduler::spawn_with_threads`] with as many threads as the
    /// current rayon pool has.
    pub fn spawn<B: Backend + 'static>(engine: Arc<Engine<B>>, n_slots: usize) -> Scheduler
    where
        B::Kv: 'static,
    {
        Self::spawn_with_threads(engine, n_slots, rayon::current_num_threads())
    }

    /// Starts the engine loop with `n_slots` parallel sequences on a rayon
    /// pool of its own with `n_threads` threads.
    pub fn spawn_with_threads<B: Backend + 'static>(
        engine: Arc<Engine<B>>,
        n_slots: usize,
        n_threads: usize,
    ) -> Scheduler
    where
        B::Kv: 'static,
    {
        Self::spawn_with_state(engine, n_slots, n_threads, StateConfig::default())
    }

    /// [`Scheduler::spawn_with_threads`] with sequence states saved and
    /// restored as `states` says (slot files, the persistent slot, the
    /// context cache).
    pub fn spawn_with_state<B: Backend + 'static>(
        engine: Arc<Engine<B>>,
        n_slots: usize,
        n_threads: usize,
        states: StateConfig,
    ) -> Scheduler
    where
        B::Kv: 'static,
    {
        Self::spawn_speculative(engine, n_slots, n_threads, states, Speculation::none())
    }

    /// [`Scheduler::spawn_with_state`] with every slot speculating as
    /// `spec` says: a decoding slot without a grammar or token
    /// probabilities evaluates its pending token and its draft in the
    /// step's batch, beside the other slots' tokens, and goes back past
    /// what the sampler rejects.
    pub fn spawn_speculative<B: Backend + 'static>(
        engine: Arc<Engine<B>>,
        n_slots: usize,
        n_threads: usize,
        states: StateConfig,
        spec: Speculation<B>,
    ) -> Scheduler
    where
        B::Kv: 'static,
    {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            tx: Mutex::new(Some(tx)),
            metrics: Mutex::default(),
            slots: Mutex::default(),
            n_ctx: engine.params.n_ctx,
            n_slots: AtomicU64::new(n_slots.max(1) as u64),
            next_task: AtomicU64::new(0),
            stopped: (Mutex::new(false), Condvar::new()),
        });
        let s2 = shared.clone();
        // The scheduler is handed out once its slots exist (and hold what
        // --slot-persist restored), so `/slots` never shows fewer.
        let (up_tx, up_rx) = mpsc::sync_channel::<()>(1);
        let run = move || {
            let shared = s2.clone();
            let mut w = Worker::new(engine, n_slots.max(1), s2, states, spec);
            w.publish();
            let _ = up_tx.send(());
            w.run(rx);
            let (done, cv) = &shared.stopped;
            *done.lock().unwrap_or_else(|p| p.into_inner()) = true;
            cv.notify_all();
        };
        // The loop runs on a worker of the pool its ops use, so their
        // parallel loops fork and join in place instead of handing every op
        // to the pool from an outside thread (a context switch per op). The
        // pool is its own: the loop blocks its worker while idle, and in a
        // shared pool a worker waiting in a join may steal another
        // scheduler's loop and never return from it (seen as a hang with
        // several schedulers on two threads).
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n_threads.max(1))
            .thread_name(|i| format!("longhaul-engine-{i}"))
            .build();
        match pool {
            Ok(pool) => pool.spawn(run),
            Err(e) => {
                eprintln!(
                    "longhaul: no thread pool for the engine ({e}); using rayon's global pool"
                );
                rayon::spawn(run)
            }
        }
        let _ = up_rx.recv();
        Scheduler {
            handle: Arc::new(Handle { shared }),
        }
    }

    /// Queues a request; its events arrive on the returned stream.
    pub fn submit(&self, req: GenRequest) -> Result<GenStream, SchedulerError> {
        if req.prompt.is_empty() {
            return Err(SchedulerError::EmptyPrompt);
        }
        if req.prompt.len() >= self.handle.shared.n_ctx {
            return Err(SchedulerError::PromptTooLong {
                n_prompt: req.prompt.len(),
                n_ctx: self.handle.shared.n_ctx,
            });
        }
        let stop_bytes = req.stop.iter().map(String::len).sum();
        if req.stop.len() > MAX_STOP_STRINGS || stop_bytes > MAX_STOP_BYTES {
            return Err(SchedulerError::TooManyStops {
                n: req.stop.len(),
                bytes: stop_bytes,
            });
        }
        let (etx, erx) = unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job {
            id: self.handle.shared.next_task.fetch_add(1, Ordering::Relaxed),
            stops: StopStrings::new(&req.stop),
            req,
            events: etx,
            cancel: cancel.clone(),
        };
        let tx = self
            .handle
            .shared
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match tx.as_ref() {
            Some(tx) if tx.send(Msg::Gen(Box::new(job))).is_ok() => {
                Ok(GenStream { rx: erx, cancel })
            }
            _ => Err(SchedulerError::ShuttingDown),
        }
    }

    /// Runs `action` on slot `id` once the slot is idle (a slot serving a
    /// request finishes it first) and returns what it did.
    pub async fn slot_action(&self, id: usize, action: SlotAction) -> Result<SlotReply, SlotError> {
        let n_slots = self.handle.shared.n_slots.load(Ordering::Relaxed) as usize;
        if id >= n_slots {
            return Err(SlotError::NoSlot { id, n_slots });
        }
        let (reply, rx) = tokio::sync::oneshot::channel();
        {
            let tx = self
                .handle
                .shared
                .tx
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match tx.as_ref() {
                Some(tx) if tx.send(Msg::Slot(SlotJob { id, action, reply })).is_ok() => {}
                _ => return Err(SlotError::ShuttingDown),
            }
        }
        rx.await.unwrap_or(Err(SlotError::ShuttingDown))
    }

    /// Every slot's state as of the last step.
    pub fn slots(&self) -> Vec<SlotInfo> {
        self.handle
            .shared
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits up to `timeout` for the engine loop to end after
    /// [`Scheduler::shutdown`] (the persistent slot is saved by then);
    /// returns whether it did.
    pub fn wait_stopped(&self, timeout: Duration) -> bool {
        let (done, cv) = &self.handle.shared.stopped;
        let g = done.lock().unwrap_or_else(|p| p.into_inner());
        let (g, _) = cv
            .wait_timeout_while(g, timeout, |d| !*d)
            .unwrap_or_else(|p| p.into_inner());
        *g
    }

    pub fn metrics(&self) -> SchedulerMetrics {
        self.handle
            .shared
            .metrics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Context size of every slot.
    pub fn n_ctx(&self) -> usize {
        self.handle.shared.n_ctx
    }

    /// Stops accepting requests; running ones finish, then the thread exits.
    pub fn shutdown(&self) {
        close(&self.handle.shared);
    }
}

/// A request being generated on a slot.
struct Active {
    job: Job,
    sampler: Sampler,
    /// The request's grammar state, advanced by each sampled token.
    constraint: Option<Constraint>,
    history: Vec<u32>,
    /// Prompt tokens not evaluated yet; empty once the request decodes.
    prefill: Vec<u32>,
    /// Sampled, not yet evaluated.
    pending: u32,
    n_prompt: usize,
    n_cached: usize,
    /// Where a recurrent state takes a checkpoint during this prompt
    /// (llama.cpp's: 4 tokens before its end), so that a request sharing
    /// the prompt can start there.
    checkpoint_at: Option<usize>,
    n_gen: usize,
    dec: StreamDecoder,
    text: String,
    emitted: usize,
    prompt_ms: f64,
    /// When the prompt's first chunk was evaluated, then when decoding began.
    t_prompt: Instant,
    t_gen: Instant,
    /// The summary of a finished request, sent once the slot shows idle in
    /// `/slots` (a client that asks right after its answer sees it free).
    done: Option<GenSummary>,
    spec: SpecStats,
}

struct Slot<B: Backend> {
    kv: SeqState<B>,
    /// Tokens whose keys and values `kv` holds.
    cached: Vec<u32>,
    /// How many of `cached` came from a state file and no request has
    /// reused yet (counted as prefill avoided by the next one).
    restored: usize,
    active: Option<Active>,
    /// This slot's drafter (`None` without speculation).
    drafter: Option<Drafter>,
}

struct Worker<B: Backend> {
    engine: Arc<Engine<B>>,
    slots: Vec<Slot<B>>,
    queue: VecDeque<Job>,
    slot_jobs: VecDeque<SlotJob>,
    shared: Arc<Shared>,
    states: StateConfig,
    cache: Option<ContextCache>,
    spec: Speculation<B>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<B: Backend + 'static> Worker<B> {
    fn new(
        engine: Arc<Engine<B>>,
        n_slots: usize,
        shared: Arc<Shared>,
        states: StateConfig,
        spec: Speculation<B>,
    ) -> Self {
        let mut w = Self {
            engine,
            slots: Vec::with_capacity(n_slots),
            queue: VecDeque::new(),
            slot_jobs: VecDeque::new(),
            shared,
            states,
            cache: None,
            spec,
        }
        .with_slots(n_slots);
        w.shared
            .n_slots
            .store(w.slots.len() as u64, Ordering::Relaxed);
        w.restore_persisted();
        w.open_cache();
        w.publish();
        w
    }

    fn with_slots(mut self, n: usize) -> Self {
        for _ in 0..n {
            match self.engine.new_kv() {
                Ok(mut kv) => {
                    let drafter = self.new_drafter();
                    if drafter.as_ref().is_some_and(Drafter::needs_hidden) {
                        kv.keep_hidden(self.engine.model.hp.n_embd);
                    }
                    self.slots.push(Slot {
                        kv,
                        cached: Vec::new(),
                        restored: 0,
                        active: None,
                        drafter,
                    })
                }
                Err(e) => {
                    eprintln!("cannot allocate a KV cache slot: {e}");
                    break;
                }
            }
        }
        self
    }

    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        let mut open = true;
        loop {
            let busy = self.slots.iter().any(|s| s.active.is_some()) || !self.queue.is_empty();
            if !busy {
                if !open {
                    self.persist();
                    return;
                }
                match rx.recv() {
                    Ok(msg) => self.take(msg),
                    Err(_) => {
                        self.persist();
                        return;
                    }
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(msg) => self.take(msg),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.run_slot_jobs();
            self.admit();
            self.step();
            self.publish();
        }
    }

    fn take(&mut self, msg: Msg) {
        match msg {
            Msg::Gen(job) => self.queue.push_back(*job),
            Msg::Slot(job) => self.slot_jobs.push_back(job),
        }
    }

    fn metrics(&self) -> std::sync::MutexGuard<'_, SchedulerMetrics> {
        self.shared
            .metrics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Starts queued requests on free slots (the one with the longest
    /// reusable prefix first).
    fn admit(&mut self) {
        while let Some(job) = self.queue.pop_front() {
            if job.cancel.load(Ordering::Relaxed) || job.events.is_closed() {
                continue;
            }
            let free = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.active.is_none())
                .max_by_key(|(_, s)| {
                    if job.req.cache_prompt {
                        common_prefix(&s.cached, &job.req.prompt)
                    } else {
                        0
                    }
                })
                .map(|(i, _)| i);
            let Some(i) = free else {
                self.queue.push_front(job);
                return;
            };
            if job.req.cache_prompt {
                self.use_cache(i, &job.req.prompt);
            }
            self.start(i, job);
        }
    }

    /// Puts `job` on slot `i`: keeps the slot's reusable prefix and queues
    /// the rest of the prompt for the next steps.
    fn start(&mut self, i: usize, job: Job) {
        let slot = &mut self.slots[i];
        let prompt = &job.req.prompt;
        let reuse = if job.req.cache_prompt {
            common_prefix(&slot.cached, prompt)
        } else {
            0
        };
        // At least one prompt token is evaluated, for its logits.
        let want = reuse.min(prompt.len() - 1);
        let held = slot.kv.n_past();
        // A recurrent state goes back only to a checkpoint (or the start).
        let reuse = match slot.kv.rewind(&self.engine.model.backend, want) {
            Ok(n) => n,
            Err(_) => {
                let _ = slot.kv.reset(&self.engine.model.backend);
                0
            }
        };
        slot.cached.truncate(reuse);
        let from_file = std::mem::take(&mut slot.restored).min(reuse);
        if from_file > 0 {
            self.shared
                .metrics
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .state_tokens_reused += from_file as u64;
        }
        if slot.kv.is_recurrent() && want > 0 && want < held {
            let mut m = self
                .shared
                .metrics
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if reuse > 0 {
                m.checkpoints_restored += 1;
            } else {
                m.prefix_reprefills += 1;
            }
        }
        let checkpoint_at = (slot.kv.is_recurrent() && prompt.len() > 4)
            .then(|| prompt.len() - 4)
            .filter(|&p| p > reuse);
        if let Some(d) = slot.drafter.as_mut() {
            d.begin(prompt);
        }
        let mut params = job.req.sampler.clone();
        if job.req.ignore_eos {
            params.ban_eog(&self.engine.tokenizer.eog_ids());
        }
        let now = Instant::now();
        slot.active = Some(Active {
            sampler: Sampler::new(params),
            constraint: job.req.constraint.clone(),
            history: prompt.clone(),
            prefill: prompt[reuse..].to_vec(),
            pending: 0,
            n_prompt: prompt.len(),
            n_cached: reuse,
            checkpoint_at,
            n_gen: 0,
            dec: StreamDecoder::new(job.req.special),
            text: String::new(),
            emitted: 0,
            prompt_ms: 0.0,
            t_prompt: now,
            t_gen: now,
            done: None,
            spec: SpecStats::default(),
            job,
        });
    }

    /// One forward pass over every active slot: the pending token of each
    /// decoding slot, and the next prompt chunk of prefilling slots (chunks
    /// of `n_ubatch` as [`Engine::eval`] cuts them, so a prompt evaluates
    /// exactly as it would alone, and at most `n_ubatch` prompt tokens per
    /// step; a chunk that does not fit waits for the next step).
    fn step(&mut self) {
        let engine = self.engine.clone();
        // Drop cancelled requests first.
        for s in &mut self.slots {
            if s.active
                .as_ref()
                .is_some_and(|a| a.job.cancel.load(Ordering::Relaxed) || a.job.events.is_closed())
            {
                s.active = None;
            }
        }
        let n_ubatch = engine.params.n_ubatch.max(1);
        // (slot, tokens of this step), in slot order, and the logits each
        // returns: a speculating slot's pending token and draft are
        // verified row by row.
        let mut batch: Vec<(usize, Vec<u32>)> = Vec::new();
        let mut wants: Vec<Logits> = Vec::new();
        let (mut n_prompt_toks, mut n_gen_toks, mut n_gen_slots) = (0, 0, 0);
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Some(a) = &s.active else {
                continue;
            };
            if a.prefill.is_empty() {
                let draft = Self::draft(&engine, s);
                let want = if draft.is_empty() {
                    Logits::Last
                } else {
                    Logits::Steps
                };
                let Some(a) = &s.active else { continue };
                // The step's time is shared by rows; a speculating slot's
                // generated tokens are counted once verified.
                n_gen_toks += 1 + draft.len();
                n_gen_slots += 1;
                batch.push((i, [&[a.pending][..], &draft].concat()));
                wants.push(want);
                continue;
            }
            let mut n = a.prefill.len().min(n_ubatch);
            // End the chunk at the checkpoint position, if it falls inside.
            if let Some(cp) = a.checkpoint_at {
                let at = s.kv.n_past();
                if cp > at && cp < at + n {
                    n = cp - at;
                }
            }
            if n_prompt_toks + n <= n_ubatch {
                n_prompt_toks += n;
                batch.push((i, a.prefill[..n].to_vec()));
                wants.push(Logits::Last);
            }
        }
        if batch.is_empty() {
            return;
        }
        let tok_refs: Vec<&[u32]> = batch.iter().map(|(_, t)| &t[..]).collect();
        let mut kvs: Vec<&mut SeqState<B>> = Vec::with_capacity(batch.len());
        let mut next = batch.iter().map(|(i, _)| *i).peekable();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if next.peek() == Some(&i) {
                next.next();
                kvs.push(&mut s.kv);
            }
        }
        let t0 = Instant::now();
        let res = SeqState::eval_multi_with(&engine.model, &mut kvs, &tok_refs, &wants);
        drop(kvs);
        {
            // The step's time is shared by its prompt and generated tokens
            // in proportion to their counts.
            let dt = t0.elapsed().as_secs_f64();
            let n = (n_prompt_toks + n_gen_toks).max(1) as f64;
            let mut m = self
                .shared
                .metrics
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            m.prompt_tokens_total += n_prompt_toks as u64;
            m.prompt_seconds_total += dt * n_prompt_toks as f64 / n;
            m.gen_tokens_total += n_gen_slots as u64;
            m.gen_seconds_total += dt * n_gen_toks as f64 / n;
        }
        match res {
            Ok(all) => {
                // Slots that sample now: decoding ones, and those whose
                // prompt's last chunk just ran, with their row of `all`.
                let mut ready: Vec<(usize, usize, Active)> = Vec::with_capacity(batch.len());
                let mut finished = Vec::new();
                for (k, (i, toks)) in batch.into_iter().enumerate() {
                    let s = &mut self.slots[i];
                    let Some(mut a) = s.active.take() else {
                        continue;
                    };
                    if wants[k] == Logits::Steps {
                        let before = a.spec;
                        let res = Self::verify(&engine, s, &mut a, &toks, all.seq(k));
                        {
                            let mut m = self
                                .shared
                                .metrics
                                .lock()
                                .unwrap_or_else(|p| p.into_inner());
                            m.spec_drafts += (a.spec.n_batches - before.n_batches) as u64;
                            m.spec_draft_tokens += (a.spec.n_drafted - before.n_drafted) as u64;
                            m.spec_accepted_tokens +=
                                (a.spec.n_accepted - before.n_accepted) as u64;
                            if let Ok((_, n)) = res {
                                // One of them was counted with the step.
                                m.gen_tokens_total += n.saturating_sub(1) as u64;
                            }
                        }
                        match res {
                            Ok((false, _)) => s.active = Some(a),
                            Ok((true, _)) => finished.push(a),
                            Err(e) => {
                                let _ = a.job.events.send(GenEvent::Error(GenFailure::Engine(e)));
                                let _ = s.kv.reset(&engine.model.backend);
                                s.cached.clear();
                            }
                        }
                        continue;
                    }
                    if a.prefill.is_empty() {
                        s.cached.push(a.pending);
                    } else {
                        a.prefill.drain(..toks.len());
                        s.cached.extend_from_slice(&toks);
                        if a.checkpoint_at == Some(s.kv.n_past())
                            && s.kv.checkpoint(&engine.model.backend).unwrap_or(false)
                        {
                            self.shared
                                .metrics
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .checkpoints_created += 1;
                        }
                        if !a.prefill.is_empty() {
                            Self::follow_prompt(s);
                            s.active = Some(a);
                            continue;
                        }
                        a.prompt_ms = a.t_prompt.elapsed().as_secs_f64() * 1e3;
                        a.t_gen = Instant::now();
                    }
                    ready.push((i, k, a));
                }
                // Each sampler reads a whole row of logits (greedy: an argmax
                // over the vocabulary): the slots sample in parallel.
                type Sampled = Result<(u32, Option<TokenProbs>, bool), GenFailure>;
                let toks: Vec<Sampled> = ready
                    .par_iter_mut()
                    .map(|(_, k, a)| Self::sample(a, all.seq(*k)))
                    .collect();
                for ((i, _, mut a), tok) in ready.into_iter().zip(toks) {
                    let s = &mut self.slots[i];
                    let (tok, probs, complete) = match tok {
                        Ok(t) => t,
                        Err(e) => {
                            let _ = a.job.events.send(GenEvent::Error(e));
                            continue;
                        }
                    };
                    let (n_past, n_ctx) = (s.kv.n_past(), s.kv.n_ctx());
                    if !Self::accept(&engine, &mut a, tok, probs, complete, n_past, n_ctx) {
                        s.active = Some(a);
                    } else {
                        finished.push(a);
                    }
                }
                if !finished.is_empty() {
                    self.publish();
                }
                for a in finished {
                    if let Some(d) = a.done {
                        let _ = a.job.events.send(GenEvent::Done(d));
                    }
                }
            }
            Err(e) => {
                for (i, _) in batch {
                    let s = &mut self.slots[i];
                    if let Some(a) = s.active.take() {
                        let e = GenFailure::Engine(e.to_string());
                        let _ = a.job.events.send(GenEvent::Error(e));
                    }
                    // Some layers may have written these positions: start
                    // over (a recurrent state may have gone back already).
                    let _ = s.kv.reset(&engine.model.backend);
                    s.cached.clear();
                }
            }
        }
    }

    /// Samples the next token of `a` from its row of logits, within its
    /// constraint if it has one; the flag is true when that token
    /// completes the constraint's grammar.
    fn sample(
        a: &mut Active,
        logits: &[f32],
    ) -> Result<(u32, Option<TokenProbs>, bool), GenFailure> {
        let want = a.job.req.probs;
        let Some(c) = a.constraint.as_mut() else {
            let (tok, probs) = a.sampler.sample_with_probs(logits, &a.history, want);
            return Ok((tok, probs, false));
        };
        let mut masked = logits.to_vec();
        let failed = |e: crate::constrain::ConstrainError| GenFailure::Constraint(e.to_string());
        c.apply(&mut masked).map_err(failed)?;
        let (tok, probs) = a.sampler.sample_with_probs(&masked, &a.history, want);
        let complete = c.commit(tok).map_err(failed)?;
        Ok((tok, probs, complete))
    }

    /// Takes the sampled `tok`, emits it, and returns true when the request
    /// is finished (its `Done` already sent). `complete`: `tok` completes
    /// the request's grammar, which ends the generation (`Stop`).
    fn accept(
        engine: &Engine<B>,
        a: &mut Active,
        tok: u32,
        probs: Option<TokenProbs>,
        complete: bool,
        n_past: usize,
        n_ctx: usize,
    ) -> bool {
        a.history.push(tok);
        a.n_gen += 1;
        a.pending = tok;
        let req = &a.job.req;
        if engine.tokenizer.is_eog(tok) && !req.ignore_eos {
            let text = a.text[a.emitted..].to_string() + &a.dec.finish();
            let _ = a.job.events.send(GenEvent::Token {
                id: tok,
                text,
                probs,
            });
            return Self::finish(a, FinishReason::Stop, None);
        }
        let at = a.text.len();
        a.text.push_str(&a.dec.push(&engine.tokenizer, tok));
        // A complete stop string ends the generation before it.
        let hit = a.job.stops.feed(&a.text.as_bytes()[at..], at);
        if let Some((p, word)) = hit.map(|(p, w)| (p, w.to_string())) {
            let text = a.text[a.emitted..p.max(a.emitted)].to_string();
            a.emitted = p.max(a.emitted);
            let _ = a.job.events.send(GenEvent::Token {
                id: tok,
                text,
                probs,
            });
            return Self::finish(a, FinishReason::Stop, Some(word));
        }
        let done = complete || a.n_gen >= req.n_predict || n_past + 1 >= n_ctx;
        // Hold back a tail that may still become a stop string.
        let mut keep = if done {
            a.text.len()
        } else {
            a.text.len() - a.job.stops.pending()
        };
        while !a.text.is_char_boundary(keep) {
            keep -= 1;
        }
        let text = a.text[a.emitted..keep.max(a.emitted)].to_string();
        a.emitted = keep.max(a.emitted);
        let _ = a.job.events.send(GenEvent::Token {
            id: tok,
            text,
            probs,
        });
        if complete {
            return Self::finish(a, FinishReason::Stop, None);
        }
        if done {
            return Self::finish(a, FinishReason::Length, None);
        }
        false
    }

    fn finish(a: &mut Active, reason: FinishReason, stopped_word: Option<String>) -> bool {
        a.done = Some(GenSummary {
            finish_reason: reason,
            n_prompt: a.n_prompt,
            n_cached: a.n_cached,
            n_gen: a.n_gen,
            prompt_ms: a.prompt_ms,
            gen_ms: a.t_gen.elapsed().as_secs_f64() * 1e3,
            stopped_word,
            spec: a.spec,
        });
        true
    }

    fn publish(&mut self) {
        let mut m = self
            .shared
            .metrics
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        m.requests_processing = self.slots.iter().filter(|s| s.active.is_some()).count();
        m.requests_deferred = self.queue.len();
        m.longhaul = self.engine.longhaul_stats().map(|(t, _)| t);
        drop(m);
        let info = self
            .slots
            .iter()
            .enumerate()
            .map(|(id, s)| SlotInfo {
                id,
                n_ctx: s.kv.n_ctx(),
                n_cached: s.kv.n_past(),
                task: s.active.as_ref().map(|a| TaskInfo {
                    id_task: a.job.id,
                    prefilling: !a.prefill.is_empty(),
                    n_prompt: a.n_prompt,
                    n_decoded: a.n_gen,
                    n_predict: a.job.req.n_predict,
                }),
            })
            .collect();
        *self.shared.slots.lock().unwrap_or_else(|p| p.into_inner()) = info;
    }
}
