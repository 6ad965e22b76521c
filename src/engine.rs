//! The engine: a loaded model with its tokenizer, sequences (KV caches),
//! prompt processing in ubatches, the decode loop and its statistics. The CLI
//! and the server are thin clients of this module.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::constrain::{ConstrainError, Constrainer, Constraint, ConstraintSpec};
use crate::gguf::{self, GgufError};
pub use crate::longhaul::Lookahead;
use crate::longhaul::{CacheStats, LonghaulConfig, Policy, StepClock, StepCost};
use crate::model::{LoadOptions, Logits, Model, ModelError, Progress};
use crate::sample::Sampler;
use crate::spec::{counts_accepted, Drafter, SpecStats};
use crate::state::SeqState;
use crate::statefile::{StateFileError, StateIdentity};
use crate::tensor::GgmlType;
use crate::tokenizer::chat::{ChatMessage, ChatTemplate, ChatTemplateError, TemplateArgs};
use crate::tokenizer::{Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot load {path}: {}", err.cause_in(std::path::Path::new(path)))]
    Load { path: String, err: GgufError },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    #[error(transparent)]
    Constrain(#[from] ConstrainError),
    #[error("the prompt has {n_prompt} tokens but the context holds {n_ctx}; raise -c/--ctx-size")]
    PromptTooLong { n_prompt: usize, n_ctx: usize },
    #[error("the model has no chat template (tokenizer.chat_template); use `longhaul run` with a raw prompt")]
    NoChatTemplate,
    #[error("empty prompt: give at least one token")]
    EmptyPrompt,
    #[error("--longhaul-cache auto needs /proc/meminfo (Linux); give the budget in GiB instead")]
    NoMemInfo,
    #[error(transparent)]
    State(#[from] StateFileError),
    #[error("cannot hash the model's headers for a state file: {0}")]
    Identity(GgufError),
    #[error("the sequence holds {n_past} positions but {n_held} held tokens were given")]
    HeldTokens { n_held: usize, n_past: usize },
    #[error("the draft model (-md) does not share the target's vocabulary: {0}; pick a draft model of the same family")]
    DraftVocab(String),
}

/// Engine settings, named as llama.cpp's.
#[derive(Clone, Debug)]
pub struct EngineParams {
    /// Context size (`-c`); 0 means the model's training context.
    pub n_ctx: usize,
    /// Physical batch size for prompt processing (`-ub`).
    pub n_ubatch: usize,
    /// Checkpoints of a recurrent state kept per sequence
    /// (`--ctx-checkpoints`, llama.cpp's default 32).
    pub n_ctx_checkpoints: usize,
    /// KV cache type (`-ctk`/`-ctv`): F16 (default) or F32.
    pub kv_type: GgmlType,
    /// Stream routed experts (`--longhaul`) with this budget and policy.
    pub longhaul: Option<LonghaulParams>,
    /// Read resident weights into memory instead of mapping the file
    /// (`--no-mmap`, bench's `--load-mode read`).
    pub no_mmap: bool,
    /// Read resident weights into memory with direct I/O (`-lm dio`,
    /// llama.cpp's name; implies `no_mmap`). Under longhaul its
    /// `direct_io` decides instead.
    pub direct_io: bool,
    /// Keep every weight in GGUF's plain rows (`--no-repack`); by default
    /// matrices with a CPU kernel layout take it (see
    /// [`LoadOptions::no_repack`]).
    pub no_repack: bool,
    /// Attention path (`-fa on|off|auto`, llama.cpp's default `auto`).
    pub flash_attn: FlashAttn,
    /// A chat template that replaces the file's (`--chat-template`,
    /// `--chat-template-file`): the Jinja source.
    pub chat_template: Option<String>,
    /// Names the chat template is given under every request's
    /// (`--chat-template-kwargs`, `--reasoning`, `--reasoning-effort`).
    pub template_kwargs: crate::tokenizer::TemplateKwargs,
    /// A draft model loaded beside this engine (`-md`): with `--longhaul-cache
    /// auto`, its weights and KV cache (one sequence of `n_ctx` per
    /// sequence of this engine) are left out of the expert budget.
    pub draft_model: Option<std::path::PathBuf>,
    /// Load the model's NextN/MTP layer for `--spec-type draft-mtp`
    /// ([`crate::draft::MtpDrafter`]); in longhaul mode its routed experts
    /// stream like a trunk layer's, with a share of the budget.
    pub mtp: bool,
}

/// `-fa/--flash-attn`, as llama.cpp spells it. `Auto` (the default) is what
/// llama.cpp picks on the device; `Off` is the exact attention path. On the
/// CPU, `Auto` and `On` follow ggml-cpu's flash-attention arithmetic and
/// `Off` its `mul_mat` + `soft_max` arithmetic for the cache type
/// ([`Model::flash_attn`]); the GPU runs its own kernels for all three.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlashAttn {
    #[default]
    Auto,
    On,
    Off,
}

impl std::str::FromStr for FlashAttn {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" | "-1" => Ok(Self::Auto),
            "on" | "1" | "true" => Ok(Self::On),
            "off" | "0" | "false" => Ok(Self::Off),
            _ => Err(format!(
                "`{s}` is not a --flash-attn value; use on, off or auto"
            )),
        }
    }
}

/// The expert budget (`--longhaul-cache GIB|auto`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CacheBudget {
    Bytes(u64),
    /// Half of what MemAvailable leaves after dense weights and the KV cache,
    /// the other half staying free for the OS page cache and workspaces.
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LonghaulParams {
    pub budget: CacheBudget,
    pub policy: Policy,
    /// Lookahead prefetch (`--longhaul-prefetch on|off|auto`).
    pub prefetch: Lookahead,
    /// Checksum expert slices and compare re-reads (`--longhaul-verify`).
    pub verify: bool,
    /// Direct I/O for expert reads (`--longhaul-io dio`).
    pub direct_io: bool,
    /// Expert reads batched through io_uring (`--longhaul-io uring`).
    pub uring: bool,
}

/// What longhaul set up, for the start-up log and for clients.
#[derive(Clone, Debug)]
pub struct LonghaulInfo {
    pub n_moe_layers: usize,
    pub n_expert: usize,
    pub n_slots: usize,
    /// Bytes of one expert across a layer's routed tensors.
    pub expert_bytes: u64,
    /// Bytes of all slots (the budget actually used).
    pub slot_bytes: u64,
    /// Budget asked for (resolved from `auto` where needed).
    pub budget_bytes: u64,
    /// How the budget was chosen.
    pub budget_note: String,
    /// Outside the budget: resident weights and the KV cache (of every
    /// sequence the engine was loaded for).
    pub resident_bytes: u64,
    pub kv_bytes: u64,
}

pub use crate::mem::mem_available;

/// `--longhaul-cache auto`: half of what `avail` leaves after the resident
/// weights, the KV caches and a draft model, the other half staying free
/// for the OS page cache and workspaces.
pub fn auto_budget(avail: u64, resident: u64, kv: u64, draft: u64) -> u64 {
    avail.saturating_sub(resident.saturating_add(kv).saturating_add(draft)) / 2
}

impl Default for EngineParams {
    fn default() -> Self {
        Self {
            n_ctx: 4096,
            n_ubatch: 512,
            n_ctx_checkpoints: crate::state::DEFAULT_CHECKPOINTS,
            kv_type: GgmlType::F16,
            longhaul: None,
            no_mmap: false,
            direct_io: false,
            no_repack: false,
            flash_attn: FlashAttn::Auto,
            chat_template: None,
            template_kwargs: Default::default(),
            draft_model: None,
            mtp: false,
        }
    }
}

/// Timings of one generation, llama.cpp-style.
#[derive(Clone, Debug, Default)]
pub struct GenStats {
    pub n_prompt: usize,
    pub prompt_time: Duration,
    pub n_gen: usize,
    pub gen_time: Duration,
    /// Positions the decode added to the sequence: every generated token
    /// but the last (which is not evaluated), with or without speculation.
    pub n_gen_evals: usize,
    /// Speculative decoding's counters (zero without a drafter).
    pub spec: SpecStats,
    /// Longhaul counters of the prompt and of the decode (`None` resident).
    pub prompt_io: Option<CacheStats>,
    pub gen_io: Option<CacheStats>,
    /// Longhaul: the decode's forward passes, for its I/O floor
    /// ([`crate::longhaul::steps_floor_tps`]).
    pub gen_steps: Vec<StepCost>,
}

impl GenStats {
    pub fn prompt_tps(&self) -> f64 {
        self.n_prompt as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }
    pub fn gen_tps(&self) -> f64 {
        self.n_gen as f64 / self.gen_time.as_secs_f64().max(1e-9)
    }
}

/// A loaded model ready to generate.
pub struct Engine<B: Backend> {
    pub model: Model<B>,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub params: EngineParams,
    pub load_time: Duration,
    pub longhaul: Option<LonghaulInfo>,
    /// Built on the first constrained request (see [`Engine::constraint`]).
    constrainer: OnceLock<Result<Constrainer, ConstrainError>>,
    /// [`gguf::Model::content_hash`], on the first state saved or restored.
    content_hash: OnceLock<String>,
}

impl<B: Backend> Engine<B> {
    /// Opens `path` (a GGUF file or the first shard of a split model) on `backend`.
    pub fn load(path: &Path, backend: B, params: EngineParams) -> Result<Self, EngineError> {
        Self::load_with_progress(path, backend, params, None)
    }

    /// [`Engine::load`], reporting `(bytes done, bytes total)` while weights
    /// are read into memory (longhaul mode; resident mode maps the file).
    pub fn load_with_progress(
        path: &Path,
        backend: B,
        params: EngineParams,
        progress: Option<Progress>,
    ) -> Result<Self, EngineError> {
        Self::load_parallel(path, backend, params, 1, progress)
    }

    /// [`Engine::load_with_progress`] for a client that will hold `n_seq`
    /// sequences at once (the server's `-np` slots): the KV caches of all
    /// of them are checked against memory before any weight is loaded, so
    /// a context that cannot fit fails here with
    /// [`ModelError::KvTooLarge`] instead of when the caches are made.
    pub fn load_parallel(
        path: &Path,
        backend: B,
        mut params: EngineParams,
        n_seq: usize,
        progress: Option<Progress>,
    ) -> Result<Self, EngineError> {
        let t0 = Instant::now();
        let file = gguf::Model::open(path).map_err(|err| EngineError::Load {
            path: path.display().to_string(),
            err,
        })?;
        let tokenizer = Tokenizer::from_metadata(file.metadata())?;
        let template =
            ChatTemplate::from_metadata_or(file.metadata(), params.chat_template.as_deref())?
                .map(|t| t.with_defaults(params.template_kwargs.clone()))
                .transpose()?;
        let file = Arc::new(file);
        // The structure alone (no weight read or uploaded) sizes longhaul.
        let shape_opts = LoadOptions {
            shapes_only: true,
            mtp: params.mtp,
            ..Default::default()
        };
        let shapes = Model::load_opts(backend.clone(), file.clone(), shape_opts, None)?;
        let from_model = params.n_ctx == 0;
        if from_model {
            params.n_ctx = shapes.hp.n_ctx_train;
        }
        let n_seq = n_seq.max(1);
        let kv_bytes =
            crate::kv::check_kv_size(&shapes.hp, params.n_ctx, n_seq, params.kv_type, from_model)?;
        if params.n_ctx > shapes.hp.n_ctx_train {
            eprintln!(
                "warning: -c {} is above the model's trained context ({}); output past {} positions may degrade",
                params.n_ctx, shapes.hp.n_ctx_train, shapes.hp.n_ctx_train
            );
        }
        let (mut model, longhaul) = match params.longhaul {
            Some(lp) => {
                let draft = match (&params.draft_model, lp.budget) {
                    (Some(p), CacheBudget::Auto) => {
                        crate::draft::draft_bytes(p, &backend, params.n_ctx, n_seq, params.kv_type)?
                    }
                    _ => 0,
                };
                let (cfg, mut info) = Self::plan_longhaul(&shapes, kv_bytes, draft, lp)?;
                drop(shapes);
                // Resident tensors copied into memory, experts streamed.
                let opts = LoadOptions {
                    longhaul: Some(cfg),
                    mtp: params.mtp,
                    no_repack: params.no_repack,
                    ..Default::default()
                };
                let model = Model::load_opts(backend, file, opts, progress)?;
                info.n_slots = model.n_slots();
                info.slot_bytes = model.slot_bytes();
                (model, Some(info))
            }
            None => {
                drop(shapes);
                let opts = LoadOptions {
                    no_mmap: params.no_mmap || params.direct_io,
                    direct_io: params.direct_io,
                    mtp: params.mtp,
                    no_repack: params.no_repack,
                    ..Default::default()
                };
                (Model::load_opts(backend, file, opts, progress)?, None)
            }
        };
        params.n_ubatch = params.n_ubatch.max(1);
        // llama.cpp's `-fa auto` resolves to flash attention on the CPU.
        model.flash_attn = params.flash_attn != FlashAttn::Off;
        Ok(Self {
            model,
            tokenizer,
            template,
            params,
            load_time: t0.elapsed(),
            longhaul,
            constrainer: OnceLock::new(),
            content_hash: OnceLock::new(),
        })
    }

    /// `kv_bytes`: the KV caches of every sequence ([`crate::kv::kv_bytes`]);
    /// `draft_bytes`: a draft model's ([`crate::draft::draft_bytes`]).
    fn plan_longhaul(
        model: &Model<B>,
        kv_bytes: u64,
        draft_bytes: u64,
        lp: LonghaulParams,
    ) -> Result<(LonghaulConfig, LonghaulInfo), EngineError> {
        let (n_moe_layers, expert_bytes) = model.expert_slot_cost()?;
        let resident_bytes = model.resident_bytes();
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let (budget_bytes, budget_note) = match lp.budget {
            CacheBudget::Bytes(b) => (b, format!("{:.3} GiB as asked", gib(b))),
            CacheBudget::Auto => {
                let avail = mem_available().ok_or(EngineError::NoMemInfo)?;
                let b = auto_budget(avail, resident_bytes, kv_bytes, draft_bytes);
                let draft = if draft_bytes > 0 {
                    format!(" and the draft model ({:.2} GiB)", gib(draft_bytes))
                } else {
                    String::new()
                };
                (b, format!("auto: {:.2} GiB = half of MemAvailable {:.2} GiB minus resident weights, KV cache{draft}", gib(b), gib(avail)))
            }
        };
        let cfg = LonghaulConfig {
            budget_bytes,
            policy: lp.policy,
            prefetch: lp.prefetch,
            verify: lp.verify,
            direct_io: lp.direct_io,
            uring: lp.uring,
        };
        let info = LonghaulInfo {
            n_moe_layers,
            n_expert: model.hp.n_expert,
            n_slots: 0,
            expert_bytes,
            slot_bytes: 0,
            budget_bytes,
            budget_note,
            resident_bytes,
            kv_bytes,
        };
        Ok((cfg, info))
    }

    /// Longhaul statistics summed over layers, and per layer.
    pub fn longhaul_stats(&self) -> Option<(CacheStats, Vec<CacheStats>)> {
        let per = self.model.longhaul_stats()?;
        let mut total = CacheStats::default();
        per.iter().for_each(|s| total.add(s));
        Some((total, per))
    }

    /// A new, empty sequence.
    pub fn new_kv(&self) -> Result<SeqState<B>, EngineError> {
        let mut s = SeqState::new(&self.model, self.params.n_ctx, self.params.kv_type)?;
        s.set_max_checkpoints(self.params.n_ctx_checkpoints);
        Ok(s)
    }

    /// What a saved state of `st` depends on ([`crate::statefile`]): the
    /// model's identity and the settings that change the state.
    pub fn state_identity(&self, st: &SeqState<B>) -> Result<StateIdentity, EngineError> {
        let model = match self.content_hash.get() {
            Some(h) => h.clone(),
            None => {
                let h = self
                    .model
                    .file
                    .content_hash()
                    .map_err(EngineError::Identity)?;
                self.content_hash
                    .get_or_init(|| format!("{h:016x}"))
                    .clone()
            }
        };
        let kv = self.params.kv_type.name().to_string();
        Ok(StateIdentity {
            model,
            model_bytes: self.model.file.shards().iter().map(|s| s.len).sum(),
            n_ctx: st.n_ctx(),
            type_k: kv.clone(),
            type_v: kv,
            placement: self.model.backend.name().to_lowercase(),
            flash_attn: format!("{:?}", self.params.flash_attn).to_lowercase(),
            layers: st.layout(&self.model.backend),
        })
    }

    /// Saves the positions `st` holds to a state file at `path` (written
    /// atomically); `tokens` are the tokens of those positions. Returns the
    /// file's size.
    pub fn save_state(
        &self,
        st: &SeqState<B>,
        tokens: &[u32],
        path: &Path,
    ) -> Result<u64, EngineError> {
        let ident = self.state_identity(st)?;
        let saved = st.save(&self.model.backend)?;
        let n = saved.n_past.min(tokens.len());
        if n != saved.n_past {
            return Err(EngineError::Model(ModelError::Backend(
                crate::backend::BackendError::Shape {
                    op: "save a sequence state",
                    detail: format!("{} tokens for {} positions", tokens.len(), saved.n_past),
                },
            )));
        }
        Ok(crate::statefile::write(path, &ident, &tokens[..n], &saved)?)
    }

    /// Restores the state file at `path` into `st` and returns its tokens
    /// and size. A refused file leaves `st` as it was; a restore that fails
    /// while writing leaves it empty ([`SeqState::restore`]).
    pub fn restore_state(
        &self,
        st: &mut SeqState<B>,
        path: &Path,
    ) -> Result<(Vec<u32>, u64), EngineError> {
        let ident = self.state_identity(st)?;
        let (tokens, saved, bytes) = crate::statefile::read(path, &ident)?;
        st.restore(&self.model.backend, &saved)?;
        Ok((tokens, bytes))
    }

    /// The tokens of the state file at `path` if it was saved for this
    /// engine's model and settings (its header checked, not its payload).
    pub fn state_tokens(&self, st: &SeqState<B>, path: &Path) -> Result<Vec<u32>, EngineError> {
        let ident = self.state_identity(st)?;
        Ok(crate::statefile::read_tokens(path, &ident)?)
    }

    /// Tokenises a raw prompt as llama.cpp does (BOS per the model's metadata,
    /// special tokens parsed).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        Ok(self.tokenizer.encode(text, true, true)?)
    }

    /// Renders a conversation through the model's chat template.
    pub fn apply_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        self.apply_template_with(messages, add_generation_prompt, &TemplateArgs::default())
    }

    /// [`Engine::apply_template`] with a request's tools and kwargs.
    pub fn apply_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        args: &TemplateArgs<'_>,
    ) -> Result<String, EngineError> {
        let t = self.template.as_ref().ok_or(EngineError::NoChatTemplate)?;
        Ok(t.render_with(messages, add_generation_prompt, args)?)
    }

    /// Compiles `spec` for this model's tokenizer (the token table is built
    /// on the first call).
    pub fn constraint(&self, spec: &ConstraintSpec) -> Result<Constraint, ConstrainError> {
        self.constrainer
            .get_or_init(|| Constrainer::new(&self.tokenizer))
            .as_ref()
            .map_err(|e| e.clone())?
            .compile(spec)
    }

    /// Evaluates `tokens` after what `kv` holds, in ubatches; returns the
    /// logits of the last token (or of every token with `Logits::All`).
    pub fn eval(
        &self,
        kv: &mut SeqState<B>,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, EngineError> {
        fits(kv, tokens.len())?;
        let mut out = Vec::new();
        for chunk in tokens.chunks(self.params.n_ubatch) {
            let logits = kv.eval(&self.model, chunk, want)?;
            match want {
                Logits::All | Logits::Steps => out.extend(logits),
                Logits::Last => out = logits,
            }
        }
        Ok(out)
    }

    /// Processes `prompt` and samples up to `n_predict` tokens, calling
    /// `on_token` with each one (return `false` to stop). Stops at
    /// end-of-generation tokens and at the end of the context.
    pub fn generate(
        &self,
        kv: &mut SeqState<B>,
        prompt: &[u32],
        n_predict: usize,
        sampler: &mut Sampler,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, GenStats), EngineError> {
        self.generate_constrained(kv, prompt, n_predict, sampler, None, on_token)
    }

    /// [`Engine::generate`] with the tokens limited to what `constraint`
    /// allows; generation also stops when its grammar is complete.
    pub fn generate_constrained(
        &self,
        kv: &mut SeqState<B>,
        prompt: &[u32],
        n_predict: usize,
        sampler: &mut Sampler,
        constraint: Option<&mut Constraint>,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, GenStats), EngineError> {
        self.generate_with(kv, prompt, n_predict, sampler, constraint, None, on_token)
    }

    /// [`Engine::generate`] with speculative decoding: after each sampled
    /// token `drafter` proposes the tokens it expects next, the model
    /// evaluates the sampled token and the draft in one batch (one sync
    /// point per MoE layer for all of them), [`Sampler::verify`] accepts the
    /// longest prefix it agrees with, and the sequence goes back past the
    /// rest. The tokens are distributed exactly as without speculation, and
    /// greedy gives the same tokens wherever a batch's logits equal those
    /// of single steps. A recurrent model goes back through a checkpoint
    /// made before each batch and re-evaluates the accepted tokens; with
    /// checkpoints off (`--ctx-checkpoints 0`) it decodes without drafts.
    pub fn generate_spec(
        &self,
        kv: &mut SeqState<B>,
        prompt: &[u32],
        n_predict: usize,
        sampler: &mut Sampler,
        drafter: &mut Drafter,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, GenStats), EngineError> {
        self.generate_spec_after(kv, &[], prompt, n_predict, sampler, drafter, on_token)
    }

    /// [`Engine::generate_spec`] on a sequence that already holds `held`
    /// (a conversation's earlier turns): the drafter sees them before
    /// `prompt`; the sampler's penalties, as without speculation, see the
    /// prompt and the reply only.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_spec_after(
        &self,
        kv: &mut SeqState<B>,
        held: &[u32],
        prompt: &[u32],
        n_predict: usize,
        sampler: &mut Sampler,
        drafter: &mut Drafter,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, GenStats), EngineError> {
        if held.len() != kv.n_past() {
            return Err(EngineError::HeldTokens {
                n_held: held.len(),
                n_past: kv.n_past(),
            });
        }
        let d = Some((held, drafter));
        self.generate_with(kv, prompt, n_predict, sampler, None, d, on_token)
    }

    /// The decode loop. A constrained generation does not speculate.
    #[allow(clippy::too_many_arguments)]
    fn generate_with(
        &self,
        kv: &mut SeqState<B>,
        prompt: &[u32],
        n_predict: usize,
        sampler: &mut Sampler,
        mut constraint: Option<&mut Constraint>,
        drafter: Option<(&[u32], &mut Drafter)>,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, GenStats), EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let (held, mut drafter) = match drafter {
            Some((held, d)) if constraint.is_none() => (held, Some(d)),
            _ => (&[][..], None),
        };
        if drafter.as_ref().is_some_and(|d| d.needs_hidden()) {
            kv.keep_hidden(self.model.hp.n_embd);
        }
        let mut stats = GenStats {
            n_prompt: prompt.len(),
            ..Default::default()
        };
        let io = || self.longhaul_stats().map(|(total, _)| total);
        let io0 = io();
        let t0 = Instant::now();
        let mut logits = match drafter.as_deref_mut() {
            Some(d) if d.needs_hidden() => self.eval_observed(kv, held, prompt, d)?,
            _ => self.eval(kv, prompt, Logits::Last)?,
        };
        stats.prompt_time = t0.elapsed();
        let io1 = io();
        let n_decode0 = kv.n_past();
        // `held` then the prompt and the reply: what the drafter sees; the
        // sampler sees `history[n_held..]`.
        let n_held = held.len();
        let mut history: Vec<u32> = [held, prompt].concat();
        if let Some(d) = drafter.as_deref_mut() {
            d.begin(&history);
        }
        let n_vocab = self.model.hp.n_vocab;
        let mut out = Vec::new();
        let t1 = Instant::now();
        let mut clock = StepClock::start(io1);
        // Each emitted token goes to the caller; `false` ends the generation.
        // `n_past` is what the sequence would hold without speculation.
        let n_ctx = kv.n_ctx();
        let mut emit = |tok: u32,
                        complete: bool,
                        n_past: usize,
                        out: &mut Vec<u32>,
                        history: &mut Vec<u32>| {
            out.push(tok);
            history.push(tok);
            // A token that completes the grammar is shown, then ends it.
            !(self.tokenizer.is_eog(tok)
                || !on_token(tok)
                || complete
                || out.len() == n_predict
                || n_past >= n_ctx)
        };
        if n_predict > 0 {
            'gen: loop {
                // Sample the next token from `logits` (it is not evaluated yet).
                let mut complete = false;
                let tok = match constraint.as_deref_mut() {
                    Some(c) => {
                        c.apply(&mut logits)?;
                        let tok = sampler.sample(&logits, &history[n_held..]);
                        complete = c.commit(tok)?;
                        tok
                    }
                    None => sampler.sample(&logits, &history[n_held..]),
                };
                if !emit(tok, complete, kv.n_past(), &mut out, &mut history) {
                    break;
                }
                let mut pending = tok;
                loop {
                    // Room for a draft: the context keeps one position free
                    // (llama-server's `n_ctx - n_tokens - 2`), and the draft
                    // and the token after it stay within n_predict.
                    let room = kv
                        .n_ctx()
                        .saturating_sub(kv.n_past() + 2)
                        .min(n_predict - out.len() - 1);
                    let mut draft = match drafter.as_deref_mut() {
                        Some(d) if room > 0 => d.draft(
                            &history[..history.len() - 1],
                            pending,
                            room,
                            kv.hidden_mut(),
                        )?,
                        _ => Vec::new(),
                    };
                    if !draft.is_empty() && !self.can_rewind(kv)? {
                        draft.clear();
                    }
                    if draft.is_empty() {
                        logits = self.eval(kv, &[pending], Logits::Last)?;
                        clock.step(io());
                        continue 'gen;
                    }
                    let n0 = kv.n_past();
                    let mut batch = Vec::with_capacity(draft.len() + 1);
                    batch.push(pending);
                    batch.extend_from_slice(&draft);
                    let rows = self.eval(kv, &batch, Logits::Steps)?;
                    stats.spec.n_batches += 1;
                    stats.spec.n_drafted += draft.len();
                    let row = |i: usize| &rows[i * n_vocab..(i + 1) * n_vocab];
                    let (mut n_emitted, mut n_accepted, mut go_on) = (0, 0, true);
                    for (i, &d) in draft.iter().enumerate() {
                        let (t, ok) = sampler.verify(row(i), &history[n_held..], d, &[(d, 1.0)]);
                        n_emitted += 1;
                        let eog = self.tokenizer.is_eog(t);
                        n_accepted += usize::from(counts_accepted(ok, eog, i, draft.len()));
                        go_on = emit(t, false, n0 + 1 + i, &mut out, &mut history);
                        pending = t;
                        if !go_on || !ok {
                            break;
                        }
                    }
                    if go_on && n_accepted == draft.len() {
                        let t = sampler.sample(row(draft.len()), &history[n_held..]);
                        n_emitted += 1;
                        go_on = emit(t, false, n0 + 1 + draft.len(), &mut out, &mut history);
                        pending = t;
                    }
                    stats.spec.n_accepted += n_accepted;
                    if let Some(d) = drafter.as_deref_mut() {
                        d.accept(n_accepted);
                    }
                    // Keep the batch's first token and every emitted token
                    // but the last (the next pending one, or the end).
                    let keep = n0 + n_emitted;
                    let held = kv.rewind(&self.model.backend, keep)?;
                    if held < keep {
                        // A recurrent state went back to its checkpoint at n0.
                        let again = &batch[held.saturating_sub(n0)..keep - n0];
                        kv.eval(&self.model, again, Logits::Last)?;
                    }
                    clock.step(io());
                    if !go_on {
                        break 'gen;
                    }
                }
            }
        }
        stats.n_gen = out.len();
        stats.n_gen_evals = kv.n_past().saturating_sub(n_decode0);
        stats.gen_time = t1.elapsed();
        if let (Some(a), Some(b), Some(c)) = (io0, io1, io()) {
            stats.prompt_io = Some(b.since(&a));
            stats.gen_io = Some(c.since(&b));
        }
        stats.gen_steps = clock.steps().unwrap_or_default();
        Ok((out, stats))
    }

    /// [`Engine::eval`] of `prompt` after `held`, the drafter catching up
    /// after each chunk but the last ([`Drafter::observe`]; it drafts after
    /// the last), so that the sequence keeps about one chunk's final-norm
    /// rows for it, not the whole prompt's.
    fn eval_observed(
        &self,
        kv: &mut SeqState<B>,
        held: &[u32],
        prompt: &[u32],
        drafter: &mut Drafter,
    ) -> Result<Vec<f32>, EngineError> {
        fits(kv, prompt.len())?;
        let mut seen = held.to_vec();
        let mut logits = Vec::new();
        let mut chunks = prompt.chunks(self.params.n_ubatch.max(1)).peekable();
        while let Some(chunk) = chunks.next() {
            logits = self.eval(kv, chunk, Logits::Last)?;
            seen.extend_from_slice(chunk);
            if chunks.peek().is_some() {
                drafter.observe(&seen, kv.hidden_mut())?;
            }
        }
        Ok(logits)
    }

    /// Whether `kv` can go back after a verification batch: always for
    /// attention; a recurrent state checkpoints its current position (a
    /// state without checkpoints cannot).
    fn can_rewind(&self, kv: &mut SeqState<B>) -> Result<bool, EngineError> {
        if !kv.is_recurrent() {
            return Ok(true);
        }
        Ok(kv.checkpoint(&self.model.backend)?)
    }
}

/// `n` more tokens fit in `kv`'s context, or the error that says they do not.
fn fits<B: Backend>(kv: &SeqState<B>, n: usize) -> Result<(), EngineError> {
    if kv.n_past() + n > kv.n_ctx() {
        return Err(EngineError::PromptTooLong {
            n_prompt: kv.n_past() + n,
            n_ctx: kv.n_ctx(),
        });
    }
    Ok(())
}
