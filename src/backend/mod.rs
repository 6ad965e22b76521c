//! The op vocabulary. Architectures are written once against [`Backend`] and
//! run on either placement; a backend that lacks an op returns
//! [`BackendError::UnsupportedOp`] (the trait's default) and one that lacks
//! a dtype [`BackendError::Unsupported`], never a panic. Each op's shape
//! contract is checked once, by a function of [`contract`] that both
//! backends call before they compute.
//!
//! Shapes follow row-major, token-major activations: a `[n_tokens, n]` tensor
//! holds `n_tokens` rows of `n` floats. Weights use ggml's convention: a 2-D
//! weight `[ne0 = k, ne1 = n]` stores `n` rows of `k` elements (so
//! `matmul(w, x)` computes `y[t, i] = sum_j w[i, j] * x[t, j]`), and stacked
//! expert weights `[k, n, n_expert]` store `n_expert` such matrices back to back.

pub mod contract;
pub mod cpu;
pub mod gpu;
pub mod routing;

pub use routing::DeviceRoute;
pub(crate) mod rope_math;

use crate::quant::QuantError;
use crate::tensor::GgmlType;

/// Errors raised by a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// `backend` (its [`Backend::name`], any case) cannot run `op` on
    /// `dtype`; the message's advice depends on which backend raised it.
    #[error(
        "{backend} backend does not support {op} on {dtype}; {}",
        unsupported_hint(backend, op)
    )]
    Unsupported {
        op: &'static str,
        backend: &'static str,
        dtype: GgmlType,
    },
    /// `backend` does not implement `op` at all (the trait's default).
    #[error(
        "{backend} backend does not implement {op}; {}",
        missing_op_hint(backend)
    )]
    UnsupportedOp {
        op: &'static str,
        backend: &'static str,
    },
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error(transparent)]
    Gpu(#[from] gpu::GpuError),
    #[error("KV cache is full: position {pos} does not fit in a context of {n_ctx}; raise -c/--ctx-size")]
    ContextFull { pos: usize, n_ctx: usize },
    /// A buffer whose allocation failed (a fallible allocation, not an abort).
    #[error("cannot allocate {bytes} bytes for {what}: out of memory")]
    OutOfMemory { what: &'static str, bytes: u64 },
}

fn is_cpu(backend: &str) -> bool {
    backend.eq_ignore_ascii_case("cpu")
}

/// What a user can do about [`BackendError::Unsupported`]: the CPU is the
/// fallback placement, so only the GPU may send the user there.
fn unsupported_hint(backend: &str, op: &str) -> &'static str {
    match (is_cpu(backend), op) {
        (_, "kv cache") => "use --cache-type-k / --cache-type-v f16 or f32",
        (true, _) => "use another quantisation of the model (or re-convert it to a supported type)",
        (false, _) => "use --n-gpu-layers 0 to run on the CPU, or another quantisation",
    }
}

/// What a user can do about [`BackendError::UnsupportedOp`].
fn missing_op_hint(backend: &str) -> &'static str {
    if is_cpu(backend) {
        "this model's architecture cannot run in this build of longhaul"
    } else {
        "use --n-gpu-layers 0 to run on the CPU"
    }
}

/// The activation of [`Backend::mul_act`], with ggml-cpu's formulas (f32,
/// libm `expf` / `logf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// `1 / (1 + exp(-x))` (ggml's `op_sigmoid`).
    Sigmoid,
    /// `x > 20 ? x : log(1 + exp(x))` (ggml's `op_softplus`).
    Softplus,
    /// `x / (1 + exp(-x))`: ggml's `ggml_vec_silu_f32`, which on the CPU
    /// computes whole blocks of 16 of a row with its vector `ggml_v_expf`
    /// and the tail with libm, so a backend applies it row by row (see
    /// [`Backend::act`]); [`Act::apply`] is the libm form.
    Silu,
}

impl Act {
    /// The activation of one value, exactly as ggml-cpu computes it.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Act::Softplus => {
                if x > 20.0 {
                    x
                } else {
                    (1.0 + x.exp()).ln()
                }
            }
            Act::Silu => x / (1.0 + (-x).exp()),
        }
    }
}

/// How rotary embeddings pair dimensions (ggml's rope modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(x[2i], x[2i+1])` (llama).
    Norm,
    /// Halves `(x[i], x[i + n_rot/2])` (GPT-NeoX, Qwen, gpt-oss).
    Neox,
}

/// Rotary embedding parameters, exactly as ggml's `rope_ext` takes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub mode: RopeMode,
    /// Rotated dimensions per head (`n_rot`); the rest pass through.
    pub n_rot: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// Original training context for YaRN (`n_ctx_orig`).
    pub n_ctx_orig: u32,
    /// YaRN extrapolation mix; 0 disables YaRN.
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

/// Gated linear unit variants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Glu {
    /// `silu(gate) * up`.
    SwiGlu,
    /// gpt-oss: `g = min(gate, limit)`, `u = clamp(up, -limit, limit)`,
    /// `g * sigmoid(alpha * g) * (u + 1)`.
    SwiGluOai { alpha: f32, limit: f32 },
}

/// Which key head each value head of a gated delta net reads when there
/// are fewer key heads than value heads (`n_v_heads = r * n_k_heads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KHeadMap {
    /// Value head `j` reads key head `j / r` (Qwen3-Next: llama.cpp repeats
    /// each key head `r` times in place).
    Interleave,
    /// Value head `j` reads key head `j % n_k_heads` (Qwen3.5: ggml's
    /// `gated_delta_net` broadcast, as the converter orders the heads).
    Tile,
}

/// A gated delta net layer's shape (Qwen3-Next / Qwen3.5 linear attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetParams {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    /// Key and value head size `S` (llama.cpp requires them equal).
    pub head_dim: usize,
    pub k_map: KHeadMap,
}

/// Attention over the KV cache for one layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Q and K head size (ggml's `DK`, `n_embd_head_k`).
    pub head_dim: usize,
    /// V head size (ggml's `DV`, `n_embd_head_v`), which is also the head
    /// size of the output. Ordinary attention: `head_dim`. DeepSeek's MLA in
    /// absorbed form: K heads of 576 (`kv_lora_rank` 512 + rope 64), V heads
    /// of 512 read from a K-only cache (see [`Backend::new_kv`]).
    pub head_dim_v: usize,
    pub scale: f32,
    /// Sliding window (`n_swa`): key at `p0` is masked for query `p1` when
    /// `p1 - p0 >= n_swa` (llama.cpp's standard SWA). `None`: full causal.
    pub window: Option<u32>,
    /// The CPU follows ggml-cpu's flash-attention arithmetic (`-fa on`, or
    /// llama.cpp's default `auto`): Q rounded to f16, K and V read as f16
    /// (an f32 cache is rounded as llama.cpp casts it), an online softmax.
    /// `false`: ggml's exact `mul_mat` + `soft_max` path (`-fa off`), with
    /// Q and the softmax weights rounded to f16 over an f16 cache as ggml's
    /// f16 `mul_mat` converts them. The GPU runs its own kernels either way.
    pub flash_attn: bool,
}

/// One sequence's positions in the batch: token `t` sits at `pos0 + t`.
#[derive(Clone, Copy, Debug)]
pub struct BatchPos {
    pub pos0: usize,
    pub n_tokens: usize,
    /// Each of this sequence's rows attends exactly as a one-token batch at
    /// its position would (a decode step), instead of with the kernel ggml
    /// picks for the whole batch: the CPU's kernel choice depends on the
    /// number of tokens (flash attention's one-chunk vs split-KV; tinyBLAS
    /// vs `vec_dot` without it), so without this a speculative verification
    /// batch would not give the logits of the steps it replaces. Other
    /// sequences of the batch keep their batch kernels. The GPU ignores it.
    pub steps: bool,
}

/// The shape of one layer's KV cache, as [`Backend::new_kv`] made it:
/// `n_ctx` positions of `n_embd_k` keys and `n_embd_v` values
/// (`n_embd_v == 0`: a K-only cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub n_ctx: usize,
    pub n_embd_k: usize,
    pub n_embd_v: usize,
}

impl KvShape {
    /// The cache holds keys only; values are views of them.
    pub fn k_only(&self) -> bool {
        self.n_embd_v == 0
    }
}

/// Bytes of positions `0..n` of a cache of `shape` in `dtype`, as
/// [`Backend::kv_read`] lays them out: `(key bytes, value bytes)`, or a
/// [`BackendError::Shape`] when `n` is past the cache's end.
pub fn kv_bytes_of(
    shape: KvShape,
    dtype: GgmlType,
    n: usize,
) -> Result<(usize, usize), BackendError> {
    let elt = match dtype {
        GgmlType::F16 => 2,
        GgmlType::F32 => 4,
        other => {
            return Err(BackendError::Shape {
                op: "kv cache",
                detail: format!("a cache of {other:?}"),
            })
        }
    };
    if n > shape.n_ctx {
        return Err(BackendError::Shape {
            op: "kv cache",
            detail: format!("{n} positions of a cache of {}", shape.n_ctx),
        });
    }
    Ok((n * shape.n_embd_k * elt, n * shape.n_embd_v * elt))
}

/// The contract of [`Backend::attention`] and [`Backend::attention_multi`],
/// checked once for both backends before they compute anything (nothing is
/// written to a cache when it fails):
///
/// - `p`: `n_head` a non-zero multiple of `n_head_kv > 0`, non-zero
///   `head_dim` and `head_dim_v`, no window of 0 positions;
/// - `caches[i]` belongs to `seqs[i]` (same count), holds
///   `n_embd_k == n_head_kv * head_dim` keys a position and either
///   `n_embd_v == n_head_kv * head_dim_v` values or none (K-only, which
///   needs `head_dim_v <= head_dim`), and has room for positions
///   `pos0..pos0 + n_tokens` ([`BackendError::ContextFull`] otherwise);
/// - `q` is `[n, n_head * head_dim]`, `k` `[n, n_embd_k]` and, unless every
///   cache is K-only, `v` `[n, n_embd_v]`, `n` the tokens of all sequences;
/// - `n_sinks`, when there are sinks, is `n_head`.
///
/// Shapes are `(rows, cols)`.
pub fn check_attention(
    p: &AttnParams,
    caches: &[KvShape],
    seqs: &[BatchPos],
    q: (usize, usize),
    k: (usize, usize),
    v: (usize, usize),
    n_sinks: Option<usize>,
) -> Result<(), BackendError> {
    let err = |detail: String| BackendError::Shape {
        op: "attention",
        detail,
    };
    let (hd, hdv) = (p.head_dim, p.head_dim_v);
    if p.n_head == 0
        || p.n_head_kv == 0
        || !p.n_head.is_multiple_of(p.n_head_kv)
        || hd == 0
        || hdv == 0
    {
        return Err(err(format!(
            "{} heads / {} kv heads of {hd} (K) / {hdv} (V): want non-zero sizes,              n_head a multiple of n_head_kv",
            p.n_head, p.n_head_kv
        )));
    }
    if p.window == Some(0) {
        return Err(err("a sliding window of 0 positions sees no key".into()));
    }
    if caches.len() != seqs.len() {
        return Err(err(format!(
            "{} caches for {} sequences",
            caches.len(),
            seqs.len()
        )));
    }
    let n: usize = seqs.iter().map(|s| s.n_tokens).sum();
    let (n_embd_k, n_embd_v) = (p.n_head_kv * hd, p.n_head_kv * hdv);
    let mut need_v = false;
    for (c, s) in caches.iter().zip(seqs) {
        let v_ok = if c.k_only() {
            hdv <= hd
        } else {
            need_v = true;
            c.n_embd_v == n_embd_v
        };
        if c.n_embd_k != n_embd_k || !v_ok {
            return Err(err(format!(
                "cache rows of {} keys / {} values for {} kv heads of {hd} (K) / {hdv} (V)                  (a K-only cache needs V heads no larger than K heads)",
                c.n_embd_k, c.n_embd_v, p.n_head_kv
            )));
        }
        let end = s.pos0 + s.n_tokens;
        if end > c.n_ctx {
            return Err(BackendError::ContextFull {
                pos: end - 1,
                n_ctx: c.n_ctx,
            });
        }
    }
    let v_bad = need_v && v != (n, n_embd_v);
    if q != (n, p.n_head * hd) || k != (n, n_embd_k) || v_bad {
        return Err(err(format!(
            "q [{}, {}], k [{}, {}], v [{}, {}] for {n} tokens of {} sequences,              {} heads / {} kv heads of {hd} (K) / {hdv} (V)",
            q.0,
            q.1,
            k.0,
            k.1,
            v.0,
            v.1,
            seqs.len(),
            p.n_head,
            p.n_head_kv
        )));
    }
    if let Some(ns) = n_sinks {
        if ns != p.n_head {
            return Err(err(format!("{ns} sinks for {} heads", p.n_head)));
        }
    }
    Ok(())
}

/// One routed tensor's shape in an expert slot store: the dims and bytes of a
/// single expert's slice (the file's tensor without its expert axis).
#[derive(Clone, Debug, PartialEq)]
pub struct SlotTensor {
    pub ty: GgmlType,
    pub dims: Vec<u64>,
    pub bytes: u64,
    /// The store may hold these slices in its kernels' weight layout
    /// (`--repack`; see [`SlotStore::converter`]).
    pub repack: bool,
}

/// How freshly read expert slices take the layout a store's weights read
/// ([`SlotStore::converter`]).
#[derive(Clone)]
pub struct SlotConverter {
    /// Per slot tensor: bytes of the smallest piece of a slice that converts
    /// alone (whole row groups). A reader may convert a slice in pieces of
    /// whole numbers of them, each as soon as its read is in.
    pub units: std::sync::Arc<[usize]>,
    /// Writes a slice, or such a piece of one ([`SlotConvert`]).
    pub convert: SlotConvert,
}

/// [`SlotConverter::convert`]: `convert(t, dst, src)` writes a slice of
/// slot tensor `t`, or a piece of one, into `dst`: from `src` where the read
/// left the bytes elsewhere, else (`None`) in place.
pub type SlotConvert = std::sync::Arc<
    dyn Fn(usize, &mut [u8], Option<&[u8]>) -> Result<(), BackendError> + Send + Sync,
>;

/// A matrix's conversion into a backend's layout for a loader that converts
/// it piece by piece ([`Backend::repack_pieces`]).
#[derive(Clone)]
pub struct RepackPieces {
    /// Bytes of the smallest piece converted alone (whole row groups); a
    /// piece is a whole number of them.
    pub unit: usize,
    /// Writes `dst` in the layout from `src` where the read left the bytes
    /// elsewhere, else (`None`) in place.
    pub convert: PieceConverter,
}

/// [`RepackPieces::convert`].
pub type PieceConverter =
    std::sync::Arc<dyn Fn(&mut [u8], Option<&[u8]>) -> Result<(), BackendError> + Send + Sync>;

/// Fails when a `(tensor, slot)` pair appears twice in `which` (a slot store
/// hands out one writable buffer per slot).
pub(crate) fn distinct_slots(which: &[(usize, usize)]) -> Result<(), BackendError> {
    let mut sorted = which.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(BackendError::Shape {
            op: "slots_mut",
            detail: "a slot was requested twice".into(),
        });
    }
    Ok(())
}

/// Memory for the expert slots of one MoE layer: for each routed tensor,
/// `n_slots` slices of one expert each. The longhaul loader writes expert
/// bytes into slots through this trait; the backend reads them as a stacked
/// weight `[.., n_slots]` (see [`Backend::slot_weight`]).
pub trait SlotStore: Send {
    /// Writable slices for the `(tensor, slot)` pairs in `which` (all distinct),
    /// in the same order. A weight handed out by `slot_weight` must be dropped
    /// before slots are written again.
    fn slots_mut(&mut self, which: &[(usize, usize)]) -> Result<Vec<&mut [u8]>, BackendError>;
    /// Makes the bytes written through `slots_mut` visible to the weights
    /// `slot_weight` hands out (a GPU store copies its staging buffer into the
    /// slots here). Called after every fill, successful or not.
    fn commit(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
    /// Lends out the buffers of the `(tensor, slot)` pairs in `which` (all
    /// distinct), in order, each one expert's slice long, so that they can
    /// be filled on other threads while weights over the other slots are in
    /// use; [`SlotStore::attach`] puts them back. `None`: this store cannot
    /// lend its slots (fill them through `slots_mut` instead).
    fn detach(&mut self, _which: &[(usize, usize)]) -> Option<Result<Vec<Vec<u8>>, BackendError>> {
        None
    }
    /// Puts buffers lent by [`SlotStore::detach`] back into their slots; the
    /// weights `slot_weight` hands out from then on read them (weights
    /// handed out earlier keep what they had).
    fn attach(
        &mut self,
        which: &[(usize, usize)],
        _bufs: Vec<Vec<u8>>,
    ) -> Result<(), BackendError> {
        Err(BackendError::Shape {
            op: "attach",
            detail: format!(
                "{} slots given back to a store that lends none",
                which.len()
            ),
        })
    }
    /// Bytes held by the store.
    fn bytes(&self) -> u64;
    /// How expert bytes lent by [`SlotStore::detach`] become this store's
    /// layout: the reading thread runs it on each slice after its read,
    /// before [`SlotStore::attach`] (slices written through
    /// [`SlotStore::slots_mut`] are converted by [`SlotStore::commit`]).
    /// `None`: slots hold the GGUF bytes as read.
    fn converter(&self) -> Option<SlotConverter> {
        None
    }
}

/// The ops an architecture may use. `Tensor` is an activation living on the
/// backend; `Weight` a read-only weight (2-D matrix, 1-D vector or stacked 3-D
/// experts); `Kv` one layer's KV cache.
pub trait Backend: Send + Sync + Clone {
    type Tensor: Send;
    type Weight: Send + Sync;
    type Kv: Send;
    type Slots: SlotStore;

    fn name(&self) -> &'static str;

    /// A weight over a GGUF tensor (read in place or uploaded, per backend).
    fn load_weight(
        &self,
        model: &std::sync::Arc<crate::gguf::Model>,
        t: &crate::gguf::TensorInfo,
    ) -> Result<Self::Weight, BackendError>;

    /// A weight that is never read: routed experts in longhaul mode (their
    /// bytes go to slots) and the shapes-only probe of a model. A GPU backend
    /// uploads nothing.
    fn placeholder_weight(&self, t: &crate::gguf::TensorInfo)
        -> Result<Self::Weight, BackendError>;

    /// A weight over bytes already read from the file (resident copies).
    fn weight_from_bytes(
        &self,
        t: &crate::gguf::TensorInfo,
        bytes: Vec<u8>,
    ) -> Result<Self::Weight, BackendError>;

    /// Whether [`Backend::repacked_weight`] gives `t` a layout of its own
    /// (`--repack`): the loader then copies the tensor out of the mapping.
    fn repacks(&self, _t: &crate::gguf::TensorInfo) -> bool {
        false
    }

    /// A weight over bytes read from the file, rewritten into the backend's
    /// kernel layout where [`Backend::repacks`] says it has one.
    fn repacked_weight(
        &self,
        t: &crate::gguf::TensorInfo,
        bytes: Vec<u8>,
    ) -> Result<Self::Weight, BackendError> {
        self.weight_from_bytes(t, bytes)
    }

    /// For a loader that rewrites `t` piece by piece as its reads complete
    /// (on the reading threads, while later pieces are still being read):
    /// the layout's conversion, in pieces of whole multiples of its `unit`
    /// bytes. The loader then makes the weight with
    /// [`Backend::converted_weight`]. `None`: [`Backend::repacked_weight`]
    /// converts whole tensors (a backend overrides both or neither).
    fn repack_pieces(&self, _t: &crate::gguf::TensorInfo) -> Option<RepackPieces> {
        None
    }

    /// A weight over bytes [`Backend::repack_pieces`]'s conversion wrote.
    fn converted_weight(
        &self,
        t: &crate::gguf::TensorInfo,
        bytes: Vec<u8>,
    ) -> Result<Self::Weight, BackendError> {
        self.repacked_weight(t, bytes)
    }

    /// Slot memory for `n_slots` experts of each of `tensors`.
    fn new_slots(
        &self,
        tensors: &[SlotTensor],
        n_slots: usize,
    ) -> Result<Self::Slots, BackendError>;
    /// Tensor `t` of a slot store as a stacked weight `[dims.., n_slots]`.
    fn slot_weight(&self, slots: &Self::Slots, t: usize) -> Result<Self::Weight, BackendError>;

    /// Gathers rows `rows` of `x`.
    fn gather_rows(&self, x: &Self::Tensor, rows: &[usize]) -> Result<Self::Tensor, BackendError>;
    /// Writes row `i` of `src` into row `rows[i]` of `dst`.
    fn scatter_rows(
        &self,
        dst: &mut Self::Tensor,
        src: &Self::Tensor,
        rows: &[usize],
    ) -> Result<(), BackendError>;
    /// A zero tensor `[rows, cols]`.
    fn zeros(&self, rows: usize, cols: usize) -> Result<Self::Tensor, BackendError>;

    /// Wraps host floats `[rows, cols]`.
    #[allow(clippy::wrong_self_convention)]
    fn from_host(
        &self,
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<Self::Tensor, BackendError>;
    /// Copies a tensor back to the host (row-major).
    fn to_host(&self, t: &Self::Tensor) -> Result<Vec<f32>, BackendError>;
    /// [`Backend::to_host`] of a tensor no longer needed (a host tensor
    /// gives up its buffer instead of copying it).
    fn take_host(&self, t: Self::Tensor) -> Result<Vec<f32>, BackendError> {
        self.to_host(&t)
    }
    /// `(rows, cols)`.
    fn shape(&self, t: &Self::Tensor) -> (usize, usize);

    /// [`BackendError::UnsupportedOp`] for `op` on this backend: what the
    /// trait's defaults of ops a backend may lack return.
    fn unsupported_op(&self, op: &'static str) -> BackendError {
        BackendError::UnsupportedOp {
            op,
            backend: self.name(),
        }
    }

    /// `t [rows, cols]` viewed as `[rows2, cols2]` (same element count,
    /// row-major; no copy where the backend can avoid one). Contract:
    /// [`contract::reshape`].
    fn reshape(
        &self,
        t: Self::Tensor,
        rows: usize,
        cols: usize,
    ) -> Result<Self::Tensor, BackendError> {
        let _ = (t, rows, cols);
        Err(self.unsupported_op("reshape"))
    }
    /// Columns `start..start + len` of every group of `group` columns:
    /// `[t, G * group]` -> `[t, G * len]` (MLA's split of a head into its
    /// rotated and plain parts; `group == cols` takes a column range).
    /// Contract: [`contract::split_cols`].
    fn split_cols(
        &self,
        x: &Self::Tensor,
        group: usize,
        start: usize,
        len: usize,
    ) -> Result<Self::Tensor, BackendError> {
        let _ = (x, group, start, len);
        Err(self.unsupported_op("split_cols"))
    }
    /// Per group, `a`'s `ga` columns then `b`'s `gb` columns:
    /// `a [t, G * ga]`, `b [t, G * gb]` -> `[t, G * (ga + gb)]` (ggml_concat
    /// along dim 0 of `[ga, G, t]` and `[gb, G, t]`). Contract:
    /// [`contract::concat_cols`].
    fn concat_cols(
        &self,
        a: &Self::Tensor,
        ga: usize,
        b: &Self::Tensor,
        gb: usize,
    ) -> Result<Self::Tensor, BackendError> {
        let _ = (a, ga, b, gb);
        Err(self.unsupported_op("concat_cols"))
    }
    /// `x[r, c] *= act(g[r, c / (x.cols / g.cols)])`: a gate per element
    /// (`g.cols == x.cols`) or per group of columns (per head): ggml's
    /// `ggml_mul(x, ggml_sigmoid(g))` / `ggml_mul(x, ggml_softplus(g))` with
    /// `g` broadcast over the group (Qwen3-Next's and Laguna's attention
    /// output gates). Contract: [`contract::mul_act`].
    fn mul_act(
        &self,
        x: &mut Self::Tensor,
        g: &Self::Tensor,
        act: Act,
    ) -> Result<(), BackendError> {
        let _ = (x, g, act);
        Err(self.unsupported_op("mul_act"))
    }

    /// `x = act(x)` element-wise, in place, each row of `x` one ggml row
    /// (what [`Act::Silu`]'s blocks of 16 are counted in; reshape first to
    /// apply it per head). ggml's `ggml_sigmoid` / `ggml_softplus` /
    /// `ggml_silu`.
    fn act(&self, x: &mut Self::Tensor, act: Act) -> Result<(), BackendError> {
        let _ = (x, act);
        Err(self.unsupported_op("act"))
    }
    /// `x[r, c] *= w[c]`: a vector weight `w [cols]` broadcast over rows
    /// (ggml_mul by a 1-D tensor). Contract: [`contract::mul_vec`].
    fn mul_vec(&self, x: &mut Self::Tensor, w: &Self::Weight) -> Result<(), BackendError> {
        let _ = (x, w);
        Err(self.unsupported_op("mul_vec"))
    }
    /// L2 norm over groups of `group` columns as llama.cpp's
    /// `build_gdn_l2_norm` computes it: `rms_norm(x, eps / group)` (sum of
    /// squares in f64) then `* (1 / sqrt(group))`, i.e.
    /// `x / sqrt(sum(x^2) + eps)`. Contract: [`contract::l2_norm`].
    fn l2_norm(
        &self,
        x: &Self::Tensor,
        group: usize,
        eps: f32,
    ) -> Result<Self::Tensor, BackendError> {
        let _ = (x, group, eps);
        Err(self.unsupported_op("l2_norm"))
    }
    /// A short causal convolution per channel with a carried state, ggml's
    /// `ssm_conv` over `concat(state, x)`: for sequence `i` (rows
    /// `seqs[i]` of `x [n, C]`, state `states[i]` `[d_conv - 1, C]` holding
    /// the inputs before them, zeros at the start), output row `t` is
    /// `sum_{j < d_conv} w[j, c] * in[t + j, c]` (summed in order, f32) with
    /// `in` the state rows then the sequence's rows; afterwards the state
    /// holds the last `d_conv - 1` rows of `in`. `w` is the file's
    /// `ssm_conv1d` `[d_conv, C]` (ggml dims: `C` rows of `d_conv` taps).
    /// No activation. Contract: [`contract::ssm_conv`].
    fn ssm_conv(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        states: &mut [&mut Self::Tensor],
        seqs: &[BatchPos],
    ) -> Result<Self::Tensor, BackendError> {
        let _ = (x, w, states, seqs);
        Err(self.unsupported_op("ssm_conv"))
    }
    /// The gated delta rule, ggml's `gated_delta_net` (one token at a time,
    /// the state carried between sequences' calls). Per sequence `i`, value
    /// head `h` (key head `kh` by `p.k_map`) and token `t`, with the state
    /// `S` of `states[i]` row `h` (`S_v x S_v`, zeros at the start):
    ///
    /// ```text
    /// S     = exp(g[t, h]) * S
    /// d[j]  = (v[t, h, j] - sum_i S[i][j] k[t, kh, i]) * beta[t, h]
    /// S[i][j] += k[t, kh, i] * d[j]
    /// o[t, h, j] = (sum_i S[i][j] q[t, kh, i]) / sqrt(S_v)
    /// ```
    ///
    /// `q`, `k` are `[n, n_k_heads * S_v]`, `v` `[n, n_v_heads * S_v]`, `g`
    /// (the log decay) and `beta` `[n, n_v_heads]`, each state
    /// `[n_v_heads, S_v * S_v]` (row `h` stores `S` transposed, `S[i][j]` at
    /// `j * S_v + i`, as ggml does). Result `[n, n_v_heads * S_v]`.
    /// Contract: [`contract::gated_delta_net`].
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_net(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        g: &Self::Tensor,
        beta: &Self::Tensor,
        states: &mut [&mut Self::Tensor],
        seqs: &[BatchPos],
        p: &DeltaNetParams,
    ) -> Result<Self::Tensor, BackendError> {
        let _ = (q, k, v, g, beta, states, seqs, p);
        Err(self.unsupported_op("gated_delta_net"))
    }

    /// `get_rows(w, ids)`: rows `ids` of matrix `w` dequantised, `[ids.len(), ne0]`.
    fn get_rows(&self, w: &Self::Weight, ids: &[u32]) -> Result<Self::Tensor, BackendError>;
    /// `matmul(w, x)`: `w [k, n]`, `x [t, k]` -> `[t, n]`.
    fn matmul(&self, w: &Self::Weight, x: &Self::Tensor) -> Result<Self::Tensor, BackendError>;
    /// `matmul(w, x)` for every `w` of `ws` (one input, several matrices:
    /// the attention projections, an FFN's gate and up). Backends may share
    /// the input's preparation and run the products as one pass.
    fn matmul_many(
        &self,
        ws: &[&Self::Weight],
        x: &Self::Tensor,
    ) -> Result<Vec<Self::Tensor>, BackendError> {
        ws.iter().map(|w| self.matmul(w, x)).collect()
    }
    /// `mul_mat_id(w, x, ids)`, ggml's MUL_MAT_ID: `w [k, n, n_expert]`,
    /// `x [t * x_per_tok, k]` where row `t * x_per_tok + (j % x_per_tok)` is the
    /// input of pair `(t, j)`, `ids [t, n_used]` expert (or slot) ids.
    /// Result `[t * n_used, n]`: row `t * n_used + j` is `w[ids[t, j]] . x`.
    /// Only experts that have tokens are touched. Contract:
    /// [`contract::mul_mat_id`].
    fn mul_mat_id(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        ids: &[u32],
        n_used: usize,
    ) -> Result<Self::Tensor, BackendError>;

    /// `x + b` for a bias vector `b [n]` broadcast over rows.
    fn add_bias(&self, x: &mut Self::Tensor, b: &Self::Weight) -> Result<(), BackendError>;
    /// `add_id`: row `t * n_used + j` of `x [t * n_used, n]` gets row `ids[t, j]`
    /// of the stacked bias `b [n, n_expert]`.
    fn add_bias_id(
        &self,
        x: &mut Self::Tensor,
        b: &Self::Weight,
        ids: &[u32],
    ) -> Result<(), BackendError>;
    /// `a += b`, same shapes.
    fn add(&self, a: &mut Self::Tensor, b: &Self::Tensor) -> Result<(), BackendError>;
    /// Multiplies each row `r` by `s[r]`.
    fn scale_rows(&self, x: &mut Self::Tensor, s: &[f32]) -> Result<(), BackendError>;

    /// RMS norm over groups of `group` columns (a whole row when `group ==
    /// cols`; per head for QK-norm), then times the weight `w [group]`.
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        group: usize,
        eps: f32,
    ) -> Result<Self::Tensor, BackendError>;
    /// Rotary embedding in place on `x [t, n_heads * head_dim]`.
    fn rope(
        &self,
        x: &mut Self::Tensor,
        head_dim: usize,
        pos: BatchPos,
        p: &RopeParams,
    ) -> Result<(), BackendError>;
    /// [`Backend::rope`] over the rows of several sequences: `seqs[i]` owns
    /// the next `seqs[i].n_tokens` rows of `x`, at positions `pos0..`.
    fn rope_multi(
        &self,
        x: &mut Self::Tensor,
        head_dim: usize,
        seqs: &[BatchPos],
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        if let [pos] = seqs {
            return self.rope(x, head_dim, *pos, p);
        }
        let mut r0 = 0;
        for pos in seqs {
            let rows: Vec<usize> = (r0..r0 + pos.n_tokens).collect();
            let mut part = self.gather_rows(x, &rows)?;
            self.rope(&mut part, head_dim, *pos, p)?;
            self.scatter_rows(x, &part, &rows)?;
            r0 += pos.n_tokens;
        }
        Ok(())
    }
    /// `glu(gate, up)` element-wise.
    fn glu(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        kind: Glu,
    ) -> Result<Self::Tensor, BackendError>;
    /// Sums groups of `n_used` consecutive rows weighted by `w [t * n_used]`:
    /// `[t * n_used, n]` -> `[t, n]`, summing in order `j = 0..n_used`.
    fn weighted_sum(
        &self,
        x: &Self::Tensor,
        w: &[f32],
        n_used: usize,
    ) -> Result<Self::Tensor, BackendError>;

    /// Routes `logits [t, n_expert]` on the device: the experts and weights
    /// [`crate::model::blocks::router::route`] gives (the same steps; the
    /// same choice up to the last bit of the scores' `exp`), kept there.
    /// `None`, the default: this backend routes on the host.
    fn route_on_device(
        &self,
        _logits: &Self::Tensor,
        _r: &routing::Routing,
        _select_bias: Option<&[f32]>,
    ) -> Result<Option<DeviceRoute<Self::Tensor>>, BackendError> {
        Ok(None)
    }
    /// A device route's expert ids on the host (a read-back).
    fn route_ids(&self, _r: &DeviceRoute<Self::Tensor>) -> Result<Vec<u32>, BackendError> {
        Err(self.unsupported_op("route_ids"))
    }
    /// [`Backend::mul_mat_id`] with the ids of a device route.
    fn mul_mat_id_routed(
        &self,
        _w: &Self::Weight,
        _x: &Self::Tensor,
        _r: &DeviceRoute<Self::Tensor>,
    ) -> Result<Self::Tensor, BackendError> {
        Err(self.unsupported_op("mul_mat_id_routed"))
    }
    /// [`Backend::mul_mat_id_routed`] for every `w` of `ws` (one input:
    /// an expert FFN's up and gate); backends may share its preparation.
    fn mul_mat_id_routed_many(
        &self,
        ws: &[&Self::Weight],
        x: &Self::Tensor,
        r: &DeviceRoute<Self::Tensor>,
    ) -> Result<Vec<Self::Tensor>, BackendError> {
        ws.iter().map(|w| self.mul_mat_id_routed(w, x, r)).collect()
    }
    /// [`Backend::add_bias_id`] with the ids of a device route (by
    /// default read back).
    fn add_bias_id_routed(
        &self,
        x: &mut Self::Tensor,
        b: &Self::Weight,
        r: &DeviceRoute<Self::Tensor>,
    ) -> Result<(), BackendError> {
        let ids = self.route_ids(r)?;
        self.add_bias_id(x, b, &ids)
    }
    /// Scales row `t` of `x` by the sigmoid of `g [t, 1]` computed as
    /// llama.cpp computes the shared experts' gate, `silu(g) / g` (by
    /// default on the host).
    fn scale_rows_gated(&self, x: &mut Self::Tensor, g: &Self::Tensor) -> Result<(), BackendError> {
        let gl = self.to_host(g)?;
        let gates: Vec<f32> = gl.iter().map(|&v| (v / (1.0 + (-v).exp())) / v).collect();
        self.scale_rows(x, &gates)
    }
    /// [`Backend::weighted_sum`] with the weights of a device route.
    fn weighted_sum_routed(
        &self,
        _x: &Self::Tensor,
        _r: &DeviceRoute<Self::Tensor>,
    ) -> Result<Self::Tensor, BackendError> {
        Err(self.unsupported_op("weighted_sum_routed"))
    }

    /// A KV cache for `n_ctx` positions of `n_embd_k` keys and `n_embd_v`
    /// values (`n_head_kv * head_dim` and `n_head_kv * head_dim_v`).
    ///
    /// `n_embd_v == 0` makes a K-only cache, llama.cpp's for DeepSeek's MLA
    /// (`llm_graph_input_attn_k`): it stores only the keys, and the value
    /// row of kv head `h` at a position is the first `head_dim_v` elements
    /// of that position's key row of head `h` (MLA has one kv head: V is
    /// the first 512 of the 576 K values). [`Backend::attention`] then
    /// ignores its `v` argument.
    fn new_kv(
        &self,
        n_ctx: usize,
        n_embd_k: usize,
        n_embd_v: usize,
        dtype: GgmlType,
    ) -> Result<Self::Kv, BackendError>;
    /// The shape of `kv` and its element type (F16 or F32).
    fn kv_shape(&self, kv: &Self::Kv) -> (KvShape, GgmlType);
    /// Positions `0..n` of `kv` as the cache stores them: every key row,
    /// then every value row (none for a K-only cache), each element
    /// little-endian in the cache's type. [`Backend::kv_write`] takes the
    /// same bytes back, so a state saved and restored is bit for bit the
    /// one that was saved.
    fn kv_read(&self, kv: &Self::Kv, n: usize) -> Result<Vec<u8>, BackendError>;
    /// Writes bytes laid out as [`Backend::kv_read`] gives them into
    /// positions `0..n` of `kv`; a length that does not match is a
    /// [`BackendError::Shape`] and writes nothing.
    fn kv_write(&self, kv: &mut Self::Kv, n: usize, bytes: &[u8]) -> Result<(), BackendError>;
    /// Writes `k [t, n_embd_k]` and `v [t, n_embd_v]` at `pos` and attends
    /// `q [t, n_head * head_dim]` causally over positions `0..pos0 + t`, with
    /// optional per-head sinks `[n_head]`. Result `[t, n_head * head_dim_v]`.
    /// A K-only cache writes only `k`; `v` is ignored (any tensor; pass
    /// `k`). The shapes are [`check_attention`]'s contract.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        kv: &mut Self::Kv,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        sinks: Option<&Self::Weight>,
        pos: BatchPos,
        p: &AttnParams,
    ) -> Result<Self::Tensor, BackendError>;

    /// [`Backend::attention`] for several sequences whose rows follow each
    /// other in `q`, `k` and `v` (`seqs[i]` owns the next `n_tokens` rows and
    /// the cache `kvs[i]`); each row equals its sequence's attention alone.
    #[allow(clippy::too_many_arguments)]
    fn attention_multi(
        &self,
        kvs: &mut [&mut Self::Kv],
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        sinks: Option<&Self::Weight>,
        seqs: &[BatchPos],
        p: &AttnParams,
    ) -> Result<Self::Tensor, BackendError> {
        if let ([kv], [pos]) = (&mut *kvs, seqs) {
            return self.attention(kv, q, k, v, sinks, *pos, p);
        }
        if kvs.len() != seqs.len() {
            return Err(BackendError::Shape {
                op: "attention",
                detail: format!("{} caches for {} sequences", kvs.len(), seqs.len()),
            });
        }
        let rows = self.shape(q).0;
        let mut out = self.zeros(rows, p.n_head * p.head_dim_v)?;
        // A K-only cache ignores `v`, which need not have a row per token.
        let split_v = self.shape(v).0 == rows;
        let mut r0 = 0;
        for (kv, pos) in kvs.iter_mut().zip(seqs) {
            let r: Vec<usize> = (r0..r0 + pos.n_tokens).collect();
            let (qs, ks) = (self.gather_rows(q, &r)?, self.gather_rows(k, &r)?);
            let vs = if split_v {
                Some(self.gather_rows(v, &r)?)
            } else {
                None
            };
            let a = self.attention(kv, &qs, &ks, vs.as_ref().unwrap_or(v), sinks, *pos, p)?;
            self.scatter_rows(&mut out, &a, &r)?;
            r0 += pos.n_tokens;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
