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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rayon::prelude::*;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::backend::Backend;
use crate::constrain::Constraint;
use crate::engine::Engine;
use crate::longhaul::CacheStats;
use crate::sample::{ProbsRequest, Sampler, SamplerParams, TokenProbs};
use crate::state::SeqState;
use crate::tokenizer::StreamDecoder;

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
    /// Keep going past end-of-generation tokens.
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
    Error(String),
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
}

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("the prompt has {n_prompt} tokens but the context holds {n_ctx}; shorten it or start the server with a larger -c/--ctx-size")]
    PromptTooLong { n_prompt: usize, n_ctx: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the server is shutting down")]
    ShuttingDown,
}

struct Job {
    req: GenRequest,
    events: UnboundedSender<GenEvent>,
    cancel: Arc<AtomicBool>,
}

struct Shared {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    metrics: Mutex<SchedulerMetrics>,
    n_ctx: usize,
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
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            tx: Mutex::new(Some(tx)),
            metrics: Mutex::default(),
            n_ctx: engine.params.n_ctx,
        });
        let s2 = shared.clone();
        let run = move || Worker::new(engine, n_slots.max(1), s2).run(rx);
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
        let (etx, erx) = unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job {
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
            Some(tx) if tx.send(job).is_ok() => Ok(GenStream { rx: erx, cancel }),
            _ => Err(SchedulerError::ShuttingDown),
        }
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
}

struct Slot<B: Backend> {
    kv: SeqState<B>,
    /// Tokens whose keys and values `kv` holds.
    cached: Vec<u32>,
    active: Option<Active>,
}

struct Worker<B: Backend> {
    engine: Arc<Engine<B>>,
    slots: Vec<Slot<B>>,
    queue: VecDeque<Job>,
    shared: Arc<Shared>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<B: Backend> Worker<B> {
    fn new(engine: Arc<Engine<B>>, n_slots: usize, shared: Arc<Shared>) -> Self {
        Self {
            engine,
            slots: Vec::with_capacity(n_slots),
            queue: VecDeque::new(),
            shared,
        }
        .with_slots(n_slots)
    }

    fn with_slots(mut self, n: usize) -> Self {
        for _ in 0..n {
            match self.engine.new_kv() {
                Ok(kv) => self.slots.push(Slot {
                    kv,
                    cached: Vec::new(),
                    active: None,
                }),
                Err(e) => {
                    eprintln!("cannot allocate a KV cache slot: {e}");
                    break;
                }
            }
        }
        self
    }

    fn run(mut self, rx: mpsc::Receiver<Job>) {
        let mut open = true;
        loop {
            let busy = self.slots.iter().any(|s| s.active.is_some()) || !self.queue.is_empty();
            if !busy {
                if !open {
                    return;
                }
                match rx.recv() {
                    Ok(job) => self.queue.push_back(job),
                    Err(_) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(job) => self.queue.push_back(job),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.admit();
            self.step();
            self.publish();
        }
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
        let now = Instant::now();
        slot.active = Some(Active {
            sampler: Sampler::new(job.req.sampler.clone()),
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
        // (slot, tokens of this step), in slot order.
        let mut batch: Vec<(usize, Vec<u32>)> = Vec::new();
        let (mut n_prompt_toks, mut n_gen_toks) = (0, 0);
        for (i, s) in self.slots.iter().enumerate() {
            let Some(a) = &s.active else {
                continue;
            };
            if a.prefill.is_empty() {
                batch.push((i, vec![a.pending]));
                n_gen_toks += 1;
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
        let res = SeqState::eval_multi(&engine.model, &mut kvs, &tok_refs);
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
            m.gen_tokens_total += n_gen_toks as u64;
            m.gen_seconds_total += dt * n_gen_toks as f64 / n;
        }
        match res {
            Ok(all) => {
                // Slots that sample now: decoding ones, and those whose
                // prompt's last chunk just ran, with their row of `all`.
                let mut ready: Vec<(usize, usize, Active)> = Vec::with_capacity(batch.len());
                for (k, (i, toks)) in batch.into_iter().enumerate() {
                    let s = &mut self.slots[i];
                    let Some(mut a) = s.active.take() else {
                        continue;
                    };
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
                type Sampled = Result<(u32, Option<TokenProbs>, bool), String>;
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
                    }
                }
            }
            Err(e) => {
                for (i, _) in batch {
                    let s = &mut self.slots[i];
                    if let Some(a) = s.active.take() {
                        let _ = a.job.events.send(GenEvent::Error(e.to_string()));
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
    fn sample(a: &mut Active, logits: &[f32]) -> Result<(u32, Option<TokenProbs>, bool), String> {
        let want = a.job.req.probs;
        let Some(c) = a.constraint.as_mut() else {
            let (tok, probs) = a.sampler.sample_with_probs(logits, &a.history, want);
            return Ok((tok, probs, false));
        };
        let mut masked = logits.to_vec();
        c.apply(&mut masked).map_err(|e| e.to_string())?;
        let (tok, probs) = a.sampler.sample_with_probs(&masked, &a.history, want);
        let complete = c.commit(tok).map_err(|e| e.to_string())?;
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
        a.text.push_str(&a.dec.push(&engine.tokenizer, tok));
        // A complete stop string ends the generation before it.
        let from = {
            let longest = req.stop.iter().map(|s| s.len()).max().unwrap_or(0);
            let mut i = a.emitted.saturating_sub(longest);
            while !a.text.is_char_boundary(i) {
                i -= 1;
            }
            i
        };
        let hit = req
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| {
                a.text[from..]
                    .find(s.as_str())
                    .map(|p| (from + p, s.clone()))
            })
            .min_by_key(|(p, _)| *p);
        if let Some((p, word)) = hit {
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
            let hold = req
                .stop
                .iter()
                .flat_map(|s| {
                    (1..s.len()).filter(|&k| s.is_char_boundary(k) && a.text.ends_with(&s[..k]))
                })
                .max()
                .unwrap_or(0);
            a.text.len() - hold
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
        let _ = a.job.events.send(GenEvent::Done(GenSummary {
            finish_reason: reason,
            n_prompt: a.n_prompt,
            n_cached: a.n_cached,
            n_gen: a.n_gen,
            prompt_ms: a.prompt_ms,
            gen_ms: a.t_gen.elapsed().as_secs_f64() * 1e3,
            stopped_word,
        }));
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
    }
}
