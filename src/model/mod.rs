//! Architectures, written once against the backend op vocabulary
//! ([`crate::backend::Backend`]). This module knows tensor names and the
//! graph of each family; it never touches a concrete backend.

pub mod arch;
pub mod blocks;
mod forward;
pub mod hparams;
pub mod nextn;
pub(crate) mod stream;

use std::sync::Arc;

use crate::backend::{Backend, BackendError};
use crate::gguf::{self, GgufError};
use crate::longhaul::{CacheStats, LonghaulConfig, LonghaulError};
use crate::state::LayerState;
pub use arch::ArchSpec;
pub use blocks::ffn::is_routed;
pub use blocks::{Attention, DenseFfn, Experts, Ffn, Layer, MoeFfn, Scoring};
pub use hparams::Hparams;

/// Errors raised while building or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unsupported architecture `{arch}`; longhaul supports: {supported}")]
    UnsupportedArch { arch: String, supported: String },
    #[error("hyperparameter `{key}` is invalid: {reason}")]
    BadHparam { key: String, reason: String },
    /// A size hyperparameter above its limit in [`hparams::limits`],
    /// rejected before anything is sized from it.
    #[error("{what} {value} (`{key}`) is above {max}, more than any real model has; the file is corrupt (re-download or re-convert it)")]
    HparamTooLarge {
        key: String,
        value: u64,
        max: u64,
        what: &'static str,
    },
    /// A float hyperparameter that is NaN, infinite or out of its range.
    #[error("hyperparameter `{key}` is {value}, but it must be finite and {want}; the file is corrupt (re-download or re-convert it)")]
    BadFloatHparam {
        key: String,
        value: f32,
        want: &'static str,
    },
    /// `block_count` claims more layers than the file has tensors for.
    #[error("`{key}` is {n_layer} but the file has no tensor `{missing}` (it has tensors for the first {present} layers only); the header is corrupt or the file is incomplete")]
    MissingLayer {
        key: String,
        n_layer: usize,
        present: usize,
        missing: String,
    },
    /// A KV cache that does not fit in memory, found before allocating it
    /// (`available: Some`) or when its allocation failed (`None`).
    #[error("{}", crate::kv::too_large_message(*.n_ctx, *.n_seq, *.from_model, *.bytes, *.available))]
    KvTooLarge {
        /// Positions per sequence (`-c`; with `from_model`, the trained
        /// context that `-c 0` stands for).
        n_ctx: usize,
        /// Sequences (`-np`), each with its own cache.
        n_seq: usize,
        from_model: bool,
        /// Bytes all the caches need.
        bytes: u64,
        /// Memory available for them.
        available: Option<u64>,
    },
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    BadShape {
        name: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Longhaul(#[from] LonghaulError),
    /// A tensor the architecture does not use: running without it would
    /// compute something other than the model.
    #[error("tensor `{name}` is not part of a `{arch}` model as longhaul implements it; the file was converted for another architecture or a newer variant (re-convert it with llama.cpp's convert_hf_to_gguf.py, or report the variant)")]
    UnexpectedTensor { name: String, arch: String },
    #[error(
        "--longhaul needs a MoE model; {arch} has no routed experts (run it without --longhaul)"
    )]
    NoExperts { arch: String },
    /// MTP drafting asked of a file without NextN layers.
    #[error("--spec-type draft-mtp needs a model with NextN/MTP layers, and this {arch} file has none (convert_hf_to_gguf.py keeps them unless given --no-mtp; or draft with -md or an n-gram --spec-type)")]
    NoNextn { arch: String },
    /// MTP drafting asked of an architecture whose NextN layers longhaul
    /// does not run yet.
    #[error("--spec-type draft-mtp is not supported for {arch} yet (longhaul runs the NextN layers of glm4moe, deepseek2 and qwen35moe); draft with -md or an n-gram --spec-type")]
    NextnUnsupported { arch: String },
}

/// A loaded model on backend `B`.
pub struct Model<B: Backend> {
    pub spec: ArchSpec,
    pub hp: Hparams,
    pub backend: B,
    pub file: Arc<gguf::Model>,
    pub tok_embd: B::Weight,
    pub output_norm: B::Weight,
    pub output: B::Weight,
    pub layers: Vec<Layer<B::Weight>>,
    /// The NextN/MTP head, when loaded for an MTP drafter
    /// ([`LoadOptions::mtp`]).
    pub nextn: Option<nextn::Nextn<B::Weight>>,
    /// Streamed experts, prefetch and routing trace.
    pub(crate) runtime: stream::Runtime<B::Slots>,
    /// CPU attention arithmetic: ggml's flash attention (llama.cpp's `-fa
    /// on`, and `auto` on the CPU) when true, its exact `mul_mat` + softmax
    /// path (`-fa off`) when false. A loaded model starts on the exact path
    /// (what the f32 reference goldens check); the engine sets this from
    /// `-fa`, whose default follows llama.cpp. See [`AttnParams::flash_attn`].
    ///
    /// [`AttnParams::flash_attn`]: crate::backend::AttnParams::flash_attn
    pub flash_attn: bool,
    /// Bytes of mapped tensors copied into memory to take the backend's
    /// kernel layout (`--repack`); 0 when every weight is read in place or
    /// was copied anyway (`--no-mmap`, longhaul).
    pub repacked_bytes: u64,
}

/// Which rows of logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    Last,
    All,
    /// Every row, each computed as the decode step of that token alone
    /// would compute it (speculative verification): see
    /// [`crate::backend::BatchPos::steps`].
    Steps,
}

/// The logits of a multi-sequence batch: one block of rows per sequence
/// (none for a sequence without tokens), in one buffer.
#[derive(Clone, Debug, Default)]
pub struct BatchLogits {
    data: Vec<f32>,
    spans: Vec<std::ops::Range<usize>>,
    /// The final norm's output for every row of the batch, when asked for
    /// (`[tokens, n_embd]`, sequences in batch order); empty otherwise.
    hidden: Vec<f32>,
}

impl BatchLogits {
    /// Sequences in the batch.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Sequence `i`'s logits (rows of `n_vocab`); empty past the end.
    pub fn seq(&self, i: usize) -> &[f32] {
        self.spans.get(i).map_or(&[], |r| &self.data[r.clone()])
    }

    /// Every row's final-norm output when the pass was asked for it (see
    /// [`Model::forward_multi`]), the sequences' rows in batch order.
    pub fn hidden(&self) -> &[f32] {
        &self.hidden
    }

    /// The first sequence's logits, without a copy when it is the only one.
    pub fn into_first(mut self) -> Vec<f32> {
        match self.spans.first().cloned() {
            Some(r) if self.spans.len() == 1 => {
                self.data.truncate(r.end);
                self.data.drain(..r.start);
                self.data
            }
            Some(r) => self.data[r].to_vec(),
            None => Vec::new(),
        }
    }
}

/// Called with `(bytes done, bytes total)` as a load progresses.
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// How to load a model.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Stream routed experts into a slot cache of this budget.
    pub longhaul: Option<LonghaulConfig>,
    /// Read resident tensors into memory instead of mapping the file
    /// (llama.cpp's `--no-mmap`; always so in longhaul mode).
    pub no_mmap: bool,
    /// Read the resident copies with direct I/O (`-lm dio`; see
    /// [`gguf::Model::set_direct_io`]), bypassing the page cache. Under
    /// longhaul, [`LonghaulConfig::direct_io`] decides instead.
    pub direct_io: bool,
    /// Load no weight at all (see [`Model::load_shapes`]).
    pub shapes_only: bool,
    /// Load the first NextN/MTP layer too (llama.cpp loads it only for
    /// `--spec-type draft-mtp`); an error for a file without one.
    pub mtp: bool,
    /// Keep weights in GGUF's plain rows (llama.cpp's `--no-repack`). By
    /// default, where the backend has a kernel layout for a matrix
    /// ([`Backend::repacks`]), resident copies and expert slots take it; a
    /// mapped tensor is then copied into memory (the cost is
    /// [`Model::repacked_bytes`]), except under longhaul, whose point is
    /// not to hold what the mapping holds.
    pub no_repack: bool,
}

/// Whether repacking `want` bytes out of the mapping fits in `available`
/// bytes (unknown: yes), leaving a tenth of it and 256 MiB for the rest.
fn repack_fits(want: u64, available: Option<u64>) -> bool {
    available.is_none_or(|a| want <= (a - a / 10).saturating_sub(256 << 20))
}

/// The names of the routed-expert tensors of layer `il` (what longhaul streams).
pub fn routed_expert_tensor_names(il: usize) -> Vec<String> {
    blocks::ffn::routed_names(il).collect()
}

/// The architecture and hyperparameters of `file`, every size checked
/// against its limit (see [`Hparams::from_metadata`]) and `block_count`
/// against the layers whose tensors the file holds, before anything is sized
/// from them.
pub fn read_hparams(file: &gguf::Model) -> Result<(ArchSpec, Hparams), ModelError> {
    let md = file.metadata();
    let arch = md.architecture()?.to_string();
    let spec = arch::lookup(&arch).ok_or_else(|| ModelError::UnsupportedArch {
        arch: arch.clone(),
        supported: arch::supported_names(),
    })?;
    let embd = file.require_tensor("token_embd.weight")?;
    let n_vocab = embd.dims.get(1).copied().unwrap_or(0);
    let n_vocab = usize::try_from(n_vocab).map_err(|_| ModelError::HparamTooLarge {
        key: "token_embd.weight rows".into(),
        value: n_vocab,
        max: hparams::limits::N_VOCAB,
        what: "vocabulary",
    })?;
    let hp = Hparams::from_metadata(md, n_vocab, spec.swa)?;
    // Every architecture has an attention norm in each layer.
    if let Some(il) = (0..hp.n_layer).find(|il| file.tensor(&layer_norm_name(*il)).is_none()) {
        return Err(ModelError::MissingLayer {
            key: format!("{arch}.block_count"),
            n_layer: hp.n_layer,
            present: il,
            missing: layer_norm_name(il),
        });
    }
    Ok((spec, hp))
}

fn layer_norm_name(il: usize) -> String {
    format!("blk.{il}.attn_norm.weight")
}

impl<B: Backend> Model<B> {
    /// Builds the model from an opened GGUF file, every weight resident.
    pub fn load(backend: B, file: Arc<gguf::Model>) -> Result<Self, ModelError> {
        Self::load_with(backend, file, None)
    }

    /// Builds the model; with `longhaul`, routed experts are streamed into a
    /// per-layer slot cache instead of being read from the mapping.
    pub fn load_with(
        backend: B,
        file: Arc<gguf::Model>,
        longhaul: Option<LonghaulConfig>,
    ) -> Result<Self, ModelError> {
        Self::load_with_progress(backend, file, longhaul, None)
    }

    /// [`Model::load_with`], reporting `(bytes done, bytes total)` while
    /// resident tensors are copied into memory (longhaul mode).
    pub fn load_with_progress(
        backend: B,
        file: Arc<gguf::Model>,
        longhaul: Option<LonghaulConfig>,
        progress: Option<Progress>,
    ) -> Result<Self, ModelError> {
        Self::load_opts(
            backend,
            file,
            LoadOptions {
                longhaul,
                ..Default::default()
            },
            progress,
        )
    }

    /// The model's structure without its weights (nothing is read or
    /// uploaded): enough to size a longhaul cache or print hyperparameters.
    pub fn load_shapes(backend: B, file: Arc<gguf::Model>) -> Result<Self, ModelError> {
        Self::load_opts(
            backend,
            file,
            LoadOptions {
                shapes_only: true,
                ..Default::default()
            },
            None,
        )
    }

    /// Builds the model as `opts` says, reporting `(bytes done, bytes
    /// total)` while tensors are read into memory.
    pub fn load_opts(
        backend: B,
        file: Arc<gguf::Model>,
        opts: LoadOptions,
        progress: Option<Progress>,
    ) -> Result<Self, ModelError> {
        let LoadOptions {
            longhaul,
            no_mmap,
            direct_io,
            shapes_only,
            mtp,
            no_repack,
        } = opts;
        let (spec, mut hp) = read_hparams(&file)?;
        hp.mtp = mtp;
        let mut how = blocks::LoadHow {
            longhaul: longhaul.is_some(),
            shapes_only,
            repack: !no_repack,
            repack_progress: None,
        };
        let mapped = !shapes_only && longhaul.is_none() && !no_mmap;
        if mapped && how.repack {
            // Repacking copies mapped tensors into memory: never past what
            // the machine has (the mapping alone would still page them in).
            let want: u64 = file
                .tensors()
                .iter()
                .filter(|t| !hp.is_skipped(&t.name) && blocks::repackable(&backend, t))
                .map(|t| t.len)
                .sum();
            if !repack_fits(want, crate::mem::available_for_allocation()) {
                eprintln!(
                    "warning: --repack would copy {} of weights into memory, more than is available; reading them in place (--longhaul streams the experts, --no-repack silences this)",
                    crate::mem::human_bytes(want)
                );
                how.repack = false;
            }
            how.repack_progress = progress.clone().map(|p| (p, want));
        }
        let copy = (!shapes_only && (longhaul.is_some() || no_mmap)).then(|| {
            let total: u64 = file
                .tensors()
                .iter()
                .filter(|t| !(hp.is_skipped(&t.name) || how.longhaul && is_routed(&t.name)))
                .map(|t| t.len)
                .sum();
            (progress, total)
        });
        // Resident copies are read once and dropped from the page cache:
        // under longhaul with direct I/O like the experts' reads, else as
        // `-lm dio` asks.
        file.set_direct_io(longhaul.as_ref().map_or(direct_io, |cfg| cfg.direct_io));
        let mut m = load_layers(backend, file.clone(), spec, hp, &how, copy)?;
        if let Some(cfg) = longhaul {
            stream::attach(&mut m, cfg, !no_repack)?;
        }
        Ok(m)
    }

    /// Bytes of every tensor that stays resident (all but the routed experts).
    /// NextN layers are neither resident nor streamed unless loaded for MTP.
    pub fn resident_bytes(&self) -> u64 {
        self.file
            .tensors()
            .iter()
            .filter(|t| !is_routed(&t.name) && !self.hp.is_skipped(&t.name))
            .map(|t| t.len)
            .sum()
    }

    /// Bytes of every tensor loaded, the routed experts included (what a
    /// resident model holds).
    pub fn loaded_bytes(&self) -> u64 {
        self.file
            .tensors()
            .iter()
            .filter(|t| !self.hp.is_skipped(&t.name))
            .map(|t| t.len)
            .sum()
    }

    /// `(dense-FFN layers, MoE layers)` of the trunk.
    pub fn layer_counts(&self) -> (usize, usize) {
        let moe = self
            .layers
            .iter()
            .filter(|l| matches!(l.ffn, Ffn::Moe(_)))
            .count();
        (self.layers.len() - moe, moe)
    }

    /// What attention the layers run: `"MLA"` (a latent cache), `"GQA"`,
    /// or `"DeltaNet+GQA"` for a hybrid of recurrent and attention layers.
    pub fn attention_kind(&self) -> &'static str {
        if self
            .layers
            .iter()
            .any(|l| matches!(l.attn, Attention::DeltaNet(_)))
        {
            return "DeltaNet+GQA";
        }
        match self.layers.first().map(|l| &l.attn) {
            Some(Attention::Mla(_)) => "MLA",
            _ => "GQA",
        }
    }

    /// Longhaul cache statistics per layer (`None` in resident mode; dense
    /// layers report zeros).
    pub fn longhaul_stats(&self) -> Option<Vec<CacheStats>> {
        self.runtime.stats()
    }

    /// The policy each streamed layer's expert cache evicts by now (empty
    /// when resident): `--longhaul-policy lru` or `lfu` as asked, or what
    /// `auto`'s replays chose.
    pub fn longhaul_evicting_by(&self) -> Vec<crate::longhaul::Policy> {
        self.runtime.evicting_by()
    }

    /// What `--longhaul-prefetch auto` measured last (`None` under another
    /// setting, or before its first measurement ends).
    pub fn lookahead_choice(&self) -> Option<crate::longhaul::LookaheadChoice> {
        self.runtime.lookahead_choice()
    }

    /// Slots per MoE layer in longhaul mode (0 when resident).
    pub fn n_slots(&self) -> usize {
        self.runtime.n_slots()
    }

    /// `(MoE layers, bytes of one expert across a layer's routed tensors)`:
    /// a longhaul budget of `n * layers * bytes` gives `n` slots per layer.
    /// Where layers store their experts in different types, each layer's
    /// slots take that layer's size and `bytes` is their mean, rounded up.
    pub fn expert_slot_cost(&self) -> Result<(usize, u64), ModelError> {
        stream::slot_cost(self)
    }

    /// Records every MoE layer's routing decisions to `path` from now on.
    pub fn trace_experts(&mut self, path: &std::path::Path) -> std::io::Result<()> {
        self.runtime
            .set_trace(crate::longhaul::trace::TraceWriter::create(
                path,
                self.hp.n_layer,
                self.hp.n_expert,
                self.hp.n_expert_used,
            )?);
        Ok(())
    }

    /// Bytes of the expert slots (the longhaul budget actually used).
    pub fn slot_bytes(&self) -> u64 {
        self.runtime.slot_bytes()
    }

    /// A fresh sequence state for `n_ctx` positions, one entry per layer: a
    /// KV cache for each attention layer, zeros for each recurrent one. Its
    /// size is checked against memory first ([`crate::kv::check_kv_size`]),
    /// and a backend that cannot allocate it gives [`ModelError::KvTooLarge`].
    pub fn new_state(
        &self,
        n_ctx: usize,
        dtype: crate::tensor::GgmlType,
    ) -> Result<Vec<LayerState<B>>, ModelError> {
        let bytes = crate::kv::check_kv_size(&self.hp, n_ctx, 1, dtype, false)?;
        let oom = |e| match e {
            BackendError::OutOfMemory { .. } => ModelError::KvTooLarge {
                n_ctx,
                n_seq: 1,
                from_model: false,
                bytes,
                available: None,
            },
            e => e.into(),
        };
        self.layers
            .iter()
            .map(|l| match &l.attn {
                Attention::DeltaNet(d) => {
                    let (conv, ssm) = d.state_shapes();
                    Ok(LayerState::Recurrent {
                        conv: self.backend.zeros(conv.0, conv.1).map_err(oom)?,
                        ssm: self.backend.zeros(ssm.0, ssm.1).map_err(oom)?,
                    })
                }
                a => {
                    let (k, v) = a.kv_widths();
                    Ok(LayerState::Kv(
                        self.backend.new_kv(n_ctx, k, v, dtype).map_err(oom)?,
                    ))
                }
            })
            .collect()
    }

    /// Runs `tokens` at positions `pos0..` through the model, updating `kv`,
    /// and returns logits `[rows, n_vocab]` (the last row or all rows).
    pub fn forward(
        &self,
        kv: &mut [LayerState<B>],
        tokens: &[u32],
        pos0: usize,
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        self.file.check_files()?;
        forward::forward(self, kv, tokens, pos0, want)
    }

    /// A fresh KV cache of `n_ctx` positions for the NextN head (an MTP
    /// drafter's own state).
    pub fn new_nextn_state(
        &self,
        n_ctx: usize,
        dtype: crate::tensor::GgmlType,
    ) -> Result<LayerState<B>, ModelError> {
        let n = self.nextn.as_ref().ok_or_else(|| ModelError::NoNextn {
            arch: self.hp.arch.clone(),
        })?;
        let (k, v) = n.layer.attn.kv_widths();
        Ok(LayerState::Kv(self.backend.new_kv(n_ctx, k, v, dtype)?))
    }

    /// Runs the NextN head over `tokens` at `pos0..` with the trunk's rows
    /// `h` (see [`nextn`]), updating `kv`.
    pub fn forward_nextn(
        &self,
        kv: &mut LayerState<B>,
        tokens: &[u32],
        h: &[f32],
        pos0: usize,
    ) -> Result<nextn::NextnOut, ModelError> {
        self.file.check_files()?;
        nextn::forward(self, kv, tokens, h, pos0)
    }

    /// Runs several sequences in one batch (`seqs[i] = (tokens, pos0)` with
    /// states `kvs[i]`, logits `wants[i]`); each sequence's logits equal a
    /// run of it alone. With `hidden`, the result also holds every row's
    /// final-norm output ([`BatchLogits::hidden`], what an MTP head reads).
    pub fn forward_multi(
        &self,
        kvs: &mut [&mut [LayerState<B>]],
        seqs: &[(&[u32], usize)],
        want: &[Logits],
        hidden: bool,
    ) -> Result<BatchLogits, ModelError> {
        self.file.check_files()?;
        forward::forward_multi(self, kvs, seqs, want, hidden)
    }
}

/// Builds every layer of a `spec` model through its architecture file, then
/// refuses a file with tensors the architecture did not declare.
fn load_layers<B: Backend>(
    backend: B,
    file: Arc<gguf::Model>,
    spec: ArchSpec,
    hp: Hparams,
    how: &blocks::LoadHow,
    copy: Option<(Option<Progress>, u64)>,
) -> Result<Model<B>, ModelError> {
    if copy.is_some() {
        crate::longhaul::prepare_files(&file);
    }
    let (tok_embd, output_norm, output, layers, nextn, repacked_bytes) = {
        let l = blocks::Loader::new(&backend, &file, &hp, how, copy);
        let (e, v) = (hp.n_embd as u64, hp.n_vocab as u64);
        let tok_embd = l.req("token_embd.weight", &[e, v])?;
        let output_norm = l.req("output_norm.weight", &[e])?;
        let output = match l.opt("output.weight", &[e, v])? {
            Some(w) => w,
            None => l.req("token_embd.weight", &[e, v])?,
        };
        let layers = (0..hp.n_layer)
            .map(|il| arch::load_layer(&spec, &l, il))
            .collect::<Result<Vec<_>, _>>()?;
        let nextn = hp.mtp.then(|| nextn::Nextn::load(&spec, &l)).transpose()?;
        for il in hp.n_layer + hp.n_nextn_loaded()..hp.n_layer + hp.n_nextn {
            l.skip_layer(il);
        }
        l.finish()?;
        let repacked = l.repacked.get();
        (tok_embd, output_norm, output, layers, nextn, repacked)
    };
    let runtime = stream::Runtime::resident(hp.n_layer + hp.n_nextn_loaded());
    Ok(Model {
        spec,
        hp,
        backend,
        file,
        tok_embd,
        output_norm,
        output,
        layers,
        nextn,
        runtime,
        flash_attn: false,
        repacked_bytes,
    })
}

#[cfg(test)]
mod repack_tests {
    use super::repack_fits;

    #[test]
    fn repacking_stays_within_the_memory_available() {
        const GIB: u64 = 1 << 30;
        assert!(repack_fits(GIB, Some(4 * GIB)));
        assert!(repack_fits(3 * GIB, Some(4 * GIB)));
        // A tenth and 256 MiB stay free: 4 GiB holds at most 3.35 GiB.
        assert!(!repack_fits(3 * GIB + GIB / 2, Some(4 * GIB)));
        assert!(!repack_fits(4 * GIB, Some(4 * GIB)));
        assert!(!repack_fits(1, Some(100 << 20)));
        assert!(repack_fits(0, Some(0)));
        // Unknown (not Linux): as llama.cpp, repack.
        assert!(repack_fits(64 * GIB, None));
    }
}
