//! Deterministic synthetic models: random weights in a real architecture's
//! layout (qwen3moe, gpt-oss, deepseek2, glm4moe or qwen3next), written
//! with the project's own GGUF writer. The deepseek2, glm4moe and qwen3next
//! layouts follow what llama.cpp's converter writes and its loader requires
//! (`convert_hf_to_gguf.py`'s `DeepseekV2Model` / `Glm4MoeModel` /
//! `Qwen3NextModel`, `src/models/deepseek2.cpp` / `glm4-moe.cpp` /
//! `qwen3next.cpp`).
//! Used by `longhaul demo`, `longhaul gen-model`, tests and benchmarks. Same
//! spec and seed, same bytes. An optional router skew makes some experts
//! popular, per layer, as in trained models; it knows nothing of how models
//! are run, only of the tensors' values.

use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;

use crate::gguf::{GgufError, MetaType, MetaValue, Writer};
use crate::model::arch::{GPT_OSS, QWEN3MOE};
use crate::quant::{self, QuantError};
use crate::tensor::GgmlType;

mod presets;
mod qwen3next;

pub use presets::PRESETS;
pub use qwen3next::LinearAttn;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("invalid synthetic model spec: {0}")]
    Spec(String),
}

/// The architecture whose tensor layout and metadata a synthetic model uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthArch {
    /// `qwen3moe`: QK-norm, softmax gating, no biases.
    Qwen3Moe,
    /// `gpt-oss`: attention and expert biases, attention sinks, alternating
    /// sliding-window layers, YaRN rope, top-k-then-softmax gating.
    GptOss,
    /// `deepseek2`: multi-head latent attention ([`Mla`], the split
    /// `attn_k_b` / `attn_v_b` form of llama.cpp's current converter), leading
    /// dense layers, shared experts, softmax gating, YaRN rope.
    Deepseek2,
    /// `glm4moe`: GQA with q/k/v biases, partial rotary, leading dense
    /// layers, a shared expert, sigmoid gating with a selection bias
    /// (`exp_probs_b`), normalised top-k weights.
    Glm4Moe,
    /// `qwen3next`: hybrid layers ([`LinearAttn`]: gated DeltaNet linear
    /// attention, every few layers gated full attention with QK-norm and
    /// partial rotary), softmax gating with renormalised top-k weights, a
    /// sigmoid-gated shared expert in every layer.
    Qwen3Next,
}

impl SynthArch {
    /// GGUF `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen3Moe => QWEN3MOE.name,
            Self::GptOss => GPT_OSS.name,
            Self::Deepseek2 => "deepseek2",
            Self::Glm4Moe => "glm4moe",
            Self::Qwen3Next => "qwen3next",
        }
    }

    /// Whether the layout has leading dense layers and shared experts.
    fn has_dense_lead(self) -> bool {
        matches!(self, Self::Deepseek2 | Self::Glm4Moe)
    }

    /// Whether the layout writes every row as llama-quantize would
    /// ([`fit_type`]), has shared experts and may rotate part of each head.
    fn is_converted_layout(self) -> bool {
        matches!(self, Self::Deepseek2 | Self::Glm4Moe | Self::Qwen3Next)
    }
}

/// Multi-head latent attention (deepseek2). The query/key head of the
/// decompressed (MHA) form is [`SynthSpec::head_dim`] = `qk_nope +
/// qk_rope` (`key_length_mla`), with `qk_rope` = [`SynthSpec::rope_dim`];
/// the file stores the absorbed (MQA) form: one KV head of `kv_lora_rank +
/// qk_rope` (`key_length`) and `kv_lora_rank` (`value_length`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mla {
    /// Rank of the query compression; 0 for a plain `attn_q` (DeepSeek-V2-Lite).
    pub q_lora_rank: usize,
    /// Rank of the joint KV compression (`kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// Value head of the decompressed form (`value_length_mla`).
    pub v_head_dim: usize,
}

/// The types a synthetic model's tensors can have: those with a quantiser,
/// in ggml's order.
pub fn writable_types() -> Vec<GgmlType> {
    GgmlType::ALL
        .into_iter()
        // 256 elements: whole blocks of every type.
        .filter(|&t| quant::quantize_row(t, &[0.0; 256]).is_ok())
        .collect()
}

/// The type a tensor of `ty` with rows of `row` elements is written in:
/// `ty` when the rows are whole blocks of it, otherwise llama-quantize's
/// fallback (`tensor_type_fallback`: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K ->
/// Q8_0, Q2_K/Q3_K -> Q4_0, IQ4_XS -> IQ4_NL), and F16 when that does not
/// fit either.
pub fn fit_type(ty: GgmlType, row: usize) -> GgmlType {
    use GgmlType as T;
    let fits = |t: GgmlType| t.row_bytes(row as u64).is_some();
    if fits(ty) {
        return ty;
    }
    let fallback = match ty {
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        T::Q2_K | T::Q3_K => T::Q4_0,
        T::IQ4_XS => T::IQ4_NL,
        _ => T::F16,
    };
    if fits(fallback) {
        fallback
    } else {
        T::F16
    }
}

/// Shape and types of a synthetic MoE model. Names follow llama.cpp
/// (`n_embd`, `n_head_kv`, `n_ff_exp`, `n_expert_used`).
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub arch: SynthArch,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ctx_train: usize,
    /// Sliding-window size of gpt-oss's even layers (ignored by the others).
    pub n_swa: usize,
    /// Rotated dimensions of each head (`rope.dimension_count`); `None`
    /// rotates the whole head.
    pub rope_dim: Option<usize>,
    /// FFN length of the leading dense layers (`feed_forward_length`;
    /// deepseek2 and glm4moe).
    pub n_ff: usize,
    /// How many layers at the start have a dense FFN instead of experts
    /// (`leading_dense_block_count`; deepseek2 and glm4moe).
    pub n_layer_dense_lead: usize,
    /// Shared experts of each MoE layer, stored as one FFN of
    /// `n_ff_exp * n_expert_shared` (`expert_shared_count`; deepseek2 and glm4moe).
    pub n_expert_shared: usize,
    /// Latent attention; `Some` for deepseek2 only.
    pub mla: Option<Mla>,
    /// Linear attention of the hybrid layers; `Some` for qwen3next only.
    pub linear: Option<LinearAttn>,
    /// Type of the routed expert tensors.
    pub expert_type: GgmlType,
    /// Type of the attention and output matrices.
    pub dense_type: GgmlType,
    pub seed: u64,
    /// Zipf-like exponent of each layer's expert popularity; 0 (the default)
    /// leaves the router uniform. See [`router_row_scales`].
    pub router_skew: f32,
}

impl SynthSpec {
    /// Bytes of one routed expert across a layer's three expert tensors.
    pub fn expert_bytes(&self) -> u64 {
        let row = |n: usize| {
            fit_type(self.expert_type, n)
                .row_bytes(n as u64)
                .unwrap_or(0)
        };
        2 * self.n_ff_exp as u64 * row(self.n_embd) + self.n_embd as u64 * row(self.n_ff_exp)
    }

    /// Rotated dimensions of each head.
    pub fn n_rot(&self) -> usize {
        self.rope_dim.unwrap_or(self.head_dim)
    }

    /// Why this spec cannot be built, if it cannot.
    fn check(&self) -> Result<(), SynthError> {
        let bad = |why: String| Err(SynthError::Spec(why));
        if self.n_embd == 0 || self.n_layer == 0 || self.n_head == 0 || self.head_dim == 0 {
            return bad(format!("zero-sized shape in {self:?}"));
        }
        let Some(q) = self.n_head.checked_mul(self.head_dim) else {
            return bad(format!("{} heads of {}", self.n_head, self.head_dim));
        };
        if self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "{} KV heads do not divide {} heads",
                self.n_head_kv, self.n_head
            ));
        }
        if self.n_expert_used == 0 || self.n_expert_used > self.n_expert {
            return bad(format!(
                "{} experts used of {}",
                self.n_expert_used, self.n_expert
            ));
        }
        if !self.router_skew.is_finite() || self.router_skew < 0.0 {
            return bad(format!(
                "router skew {} must be a finite number >= 0",
                self.router_skew
            ));
        }
        let n_rot = self.n_rot();
        if n_rot == 0 || n_rot > self.head_dim || !n_rot.is_multiple_of(2) {
            return bad(format!(
                "rope dimensions {n_rot} must be even and within the head of {}",
                self.head_dim
            ));
        }
        if (self.arch == SynthArch::Deepseek2) != self.mla.is_some() {
            return bad(format!(
                "{} {} latent attention (mla)",
                self.arch.name(),
                if self.mla.is_some() {
                    "has no"
                } else {
                    "needs"
                }
            ));
        }
        if let Some(m) = self.mla {
            if m.kv_lora_rank == 0 || m.v_head_dim == 0 || n_rot >= self.head_dim {
                return bad(format!(
                    "latent attention needs kv_lora_rank, v_head_dim and qk_nope                      (head_dim {} - rope {n_rot}) above zero",
                    self.head_dim
                ));
            }
            if self.n_head_kv != 1 {
                return bad(format!(
                    "deepseek2 stores its latent attention as one KV head, not {}",
                    self.n_head_kv
                ));
            }
        }
        if (self.arch == SynthArch::Qwen3Next) != self.linear.is_some() {
            return bad(format!(
                "{} {} linear attention",
                self.arch.name(),
                if self.linear.is_some() {
                    "has no"
                } else {
                    "needs"
                }
            ));
        }
        if let Some(la) = &self.linear {
            la.check().or_else(bad)?;
            if self.n_expert_shared == 0 || self.n_layer_dense_lead > 0 {
                return bad(format!(
                    "{} has a shared expert in every layer and no dense layers",
                    self.arch.name()
                ));
            }
        }
        if self.arch.has_dense_lead() {
            if self.n_layer_dense_lead >= self.n_layer {
                return bad(format!(
                    "{} leading dense layers leave no MoE layer of {}",
                    self.n_layer_dense_lead, self.n_layer
                ));
            }
            if self.n_layer_dense_lead > 0 && self.n_ff == 0 {
                return bad("leading dense layers need n_ff > 0".into());
            }
        } else if !self.arch.is_converted_layout()
            && (self.n_layer_dense_lead > 0
                || self.n_expert_shared > 0
                || self.rope_dim.is_some_and(|r| r != self.head_dim))
        {
            return bad(format!(
                "{} has no dense layers, shared experts or partial rotary",
                self.arch.name()
            ));
        }
        // deepseek2, glm4moe and qwen3next write every row as
        // llama-quantize would (`fit_type`), so only rows of n_embd must
        // suit the types.
        let rows = if self.arch.is_converted_layout() {
            [
                ("expert", self.expert_type, [self.n_embd, self.n_embd]),
                ("dense", self.dense_type, [self.n_embd, self.n_embd]),
            ]
        } else {
            [
                ("expert", self.expert_type, [self.n_embd, self.n_ff_exp]),
                ("dense", self.dense_type, [self.n_embd, q]),
            ]
        };
        for (what, ty, lens) in rows {
            if let Some(n) = lens.iter().find(|&&n| ty.row_bytes(n as u64).is_none()) {
                return bad(format!(
                    "{what} type {} needs rows that are a multiple of {} elements, \
                     and this shape has rows of {n}; choose a type with smaller blocks \
                     (q8_0 and mxfp4 use 32)",
                    ty.name(),
                    ty.block_size()
                ));
            }
        }
        Ok(())
    }
}

/// Scales of layer `layer`'s router rows (one per expert) for a Zipf-like
/// popularity of exponent `skew`: `(rank + 1)^(-skew / 2)`, normalised to a
/// root mean square of one, where `rank` is the expert's place in a
/// per-layer random permutation (from the seed). Router logits are `h . r_e`; a longer row
/// spreads its logit wider and lands in the top-k more often. With
/// independent Gaussian logits, half the exponent on the scales gives a
/// popularity whose log-log slope over the ranks is close to `-skew`
/// (simulated on 64 experts, top-4: slope 0.58, 1.03, 1.93 for scale
/// exponents 0.25, 0.5, 1). A zero-mean logit is positive half the time,
/// so no expert is chosen for much more than half the tokens: the head of
/// the distribution is flatter than Zipf's at large exponents.
///
/// Returns `None` for `skew == 0` (rows untouched, files as before).
pub fn router_row_scales(seed: u64, layer: usize, n_expert: usize, skew: f32) -> Option<Vec<f32>> {
    if skew <= 0.0 || n_expert == 0 {
        return None;
    }
    let mut rank: Vec<usize> = (0..n_expert).collect();
    let mut r = Rng(name_seed(seed, &format!("blk.{layer}.router_rank")));
    for i in (1..n_expert).rev() {
        rank.swap(i, (r.next_u64() % (i as u64 + 1)) as usize);
    }
    let raw: Vec<f64> = rank
        .iter()
        .map(|&k| (k as f64 + 1.0).powf(-skew as f64 / 2.0))
        .collect();
    let rms = (raw.iter().map(|v| v * v).sum::<f64>() / n_expert as f64).sqrt();
    Some(raw.iter().map(|v| (v / rms) as f32).collect())
}

/// SplitMix64: tiny, fast and good enough for random weights (and for the
/// crate's tests' random blocks).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn name_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Values `start..start + len` of a tensor's random stream of amplitude
/// `amp`: blocks of 2^14 values, each from its own generator, made in
/// parallel, so the values depend neither on the thread count nor on how
/// the tensor is cut into ranges.
fn random_at(seed: u64, name: &str, start: usize, len: usize, amp: f32, offset: f32) -> Vec<f32> {
    const BLOCK: usize = 1 << 14;
    let base = name_seed(seed, name);
    let fill = |block: usize, skip: usize, c: &mut [f32]| {
        let mut r = Rng(base ^ (block as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        (0..skip).for_each(|_| {
            r.next_u64();
        });
        c.iter_mut().for_each(|x| *x = offset + amp * r.uniform());
    };
    let mut v = vec![0f32; len];
    let (first_block, skip) = (start / BLOCK, start % BLOCK);
    let head = if skip == 0 {
        0
    } else {
        (BLOCK - skip).min(len)
    };
    let (a, b) = v.split_at_mut(head);
    if head > 0 {
        fill(first_block, skip, a);
    }
    let rest_first = first_block + usize::from(head > 0);
    b.par_chunks_mut(BLOCK)
        .enumerate()
        .for_each(|(i, c)| fill(rest_first + i, 0, c));
    v
}

/// Random Q4_K blocks straight from the generator, about a hundred times
/// faster than quantising random floats: random scale/min bytes (6-bit
/// values averaging 31.5), random nibbles, `dmin = 7.5 d` so values centre on
/// zero, and `d` chosen for a spread like uniform floats of amplitude `amp`.
fn random_q4k(seed: u64, name: &str, n_blocks: usize, amp: f32) -> Vec<u8> {
    const PER_CHUNK: usize = 64;
    let base = name_seed(seed, name) ^ 0x51;
    let mut out = vec![0u8; n_blocks * 144];
    out.par_chunks_mut(144 * PER_CHUNK)
        .enumerate()
        .for_each(|(i, c)| {
            let mut r = Rng(base ^ (i as u64).wrapping_mul(0xA24B_AED4_963E_E407));
            for b in c.chunks_mut(144) {
                let d = amp / 3f32.sqrt() / (31.5 * 4.6) * (1.0 + 0.25 * r.uniform());
                b[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
                b[2..4].copy_from_slice(&half::f16::from_f32(7.5 * d).to_le_bytes());
                for w in b[4..].chunks_mut(8) {
                    let v = r.next_u64().to_le_bytes();
                    w.copy_from_slice(&v[..w.len()]);
                }
            }
        });
    out
}

/// How a random tensor is filled: `offset + amp * U(-1, 1)`, passed
/// through `map` when given, each row of `dims[0]` values then multiplied
/// by `row_scale[row]` when given.
#[derive(Clone)]
struct Fill {
    amp: f32,
    offset: f32,
    map: Option<fn(f32) -> f32>,
    row_scale: Option<Arc<[f32]>>,
}

impl Fill {
    fn uniform(amp: f32) -> Self {
        Self::around(0.0, amp)
    }

    /// `offset + amp * U(-1, 1)`.
    fn around(offset: f32, amp: f32) -> Self {
        Self {
            amp,
            offset,
            map: None,
            row_scale: None,
        }
    }

    /// A norm weight: 1 +- 0.2.
    fn norm() -> Self {
        Self::around(1.0, 0.2)
    }
}

/// Adds a random tensor, generated and quantised only when the file is
/// written (so models larger than memory can be made).
fn add(
    w: &mut Writer,
    seed: u64,
    name: &str,
    dims: &[u64],
    ty: GgmlType,
    fill: Fill,
) -> Result<(), SynthError> {
    let ty = fit_type(ty, dims[0] as usize);
    let (name_s, dims_v) = (name.to_string(), dims.to_vec());
    let source = move || -> Result<Vec<u8>, GgufError> {
        let n: u64 = dims_v.iter().product();
        let Fill {
            amp,
            offset,
            map,
            row_scale,
        } = &fill;
        if ty == GgmlType::Q4_K && *offset == 0.0 && map.is_none() && row_scale.is_none() {
            return Ok(random_q4k(seed, &name_s, n as usize / 256, *amp));
        }
        // Made and quantised a slab of rows at a time: a stacked expert
        // tensor's floats can be gigabytes.
        const SLAB: usize = 1 << 24;
        let row = dims_v[0] as usize;
        let n_rows = n as usize / row;
        let slab_rows = (SLAB / row).max(1);
        let mut out = Vec::with_capacity(n_rows * ty.row_bytes(row as u64).unwrap_or(0) as usize);
        for first in (0..n_rows).step_by(slab_rows) {
            let k = slab_rows.min(n_rows - first);
            let mut data = random_at(seed, &name_s, first * row, k * row, *amp, *offset);
            if let Some(f) = map {
                data.iter_mut().for_each(|v| *v = f(*v));
            }
            if let Some(scale) = row_scale {
                let scale = scale.get(first..).unwrap_or(&[]);
                data.par_chunks_mut(row)
                    .zip(scale.par_iter())
                    .for_each(|(r, &s)| r.iter_mut().for_each(|v| *v *= s));
            }
            let rows: Result<Vec<Vec<u8>>, QuantError> = data
                .par_chunks(row)
                .map(|r| quant::quantize_row(ty, r))
                .collect();
            let rows = rows.map_err(|e| GgufError::InvalidArgument {
                reason: format!("quantising `{name_s}`: {e}"),
            })?;
            rows.iter().for_each(|r| out.extend_from_slice(r));
        }
        Ok(out)
    };
    w.add_tensor_lazy(name, dims, ty, Arc::new(source))?;
    Ok(())
}

/// GPT-2's byte-to-unicode table: the 256 byte tokens of a byte-level BPE vocabulary.
fn byte_tokens() -> Vec<String> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut pairs: Vec<(u32, u32)> = printable.into_iter().zip(chars).collect();
    pairs.sort();
    pairs
        .into_iter()
        .map(|(_, c)| char::from_u32(c).unwrap_or('?').to_string())
        .collect()
}

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A minimal DeepSeek-V2 chat template.
const DEEPSEEK2_CHAT: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}{% else %}{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";

/// A minimal GLM-4.5 chat template (no thinking or tools).
const GLM45_CHAT: &str = "[gMASK]<sop>{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}";

/// A minimal harmony template (gpt-oss): no system preamble or channels.
const HARMONY: &str = "{% for message in messages %}{{'<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>'}}{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}";

/// The synthetic tokenizer: GPT-2's 256 byte tokens, no merges, and the
/// architecture's special tokens.
fn set_tokenizer(w: &mut Writer, arch: SynthArch) -> usize {
    let str_ = |v: &str| MetaValue::String(v.to_string());
    // (specials, pre-tokenizer, [bos, padding, eos], template); the ids
    // count from the first special.
    let (specials, pre, [bos, pad, eos], template): (&[&str], _, [u32; 3], _) = match arch {
        SynthArch::Qwen3Moe | SynthArch::Qwen3Next => (
            &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            "qwen2",
            [0, 0, 2],
            CHATML,
        ),
        // gpt-oss's specials in o200k_harmony's order.
        SynthArch::GptOss => (
            &[
                "<|startoftext|>",
                "<|endoftext|>",
                "<|return|>",
                "<|constrain|>",
                "<|channel|>",
                "<|start|>",
                "<|end|>",
                "<|message|>",
                "<|call|>",
            ],
            "gpt-4o",
            [0, 1, 2],
            HARMONY,
        ),
        // DeepSeek-V2's own pre-tokenizer is `deepseek-llm`; `deepseek-v3`
        // is its successor, known to llama.cpp and to longhaul.
        SynthArch::Deepseek2 => (
            &["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
            "deepseek-v3",
            [0, 1, 1],
            DEEPSEEK2_CHAT,
        ),
        // GLM-4.5's specials in its order; bos `[gMASK]` as llama.cpp's converter sets it.
        SynthArch::Glm4Moe => (
            &[
                "<|endoftext|>",
                "[MASK]",
                "[gMASK]",
                "[sMASK]",
                "<sop>",
                "<eop>",
                "<|system|>",
                "<|user|>",
                "<|assistant|>",
                "<|observation|>",
            ],
            "glm4",
            [2, 0, 0],
            GLM45_CHAT,
        ),
    };
    let mut tokens = byte_tokens();
    let first = tokens.len() as u32;
    let mut types = vec![MetaValue::I32(1); tokens.len()];
    for sp in specials {
        tokens.push(sp.to_string());
        types.push(MetaValue::I32(3));
    }
    let n_vocab = tokens.len();
    w.set("tokenizer.ggml.model", str_("gpt2"));
    w.set("tokenizer.ggml.pre", str_(pre));
    w.set(
        "tokenizer.ggml.tokens",
        MetaValue::Array(
            MetaType::String,
            tokens.into_iter().map(MetaValue::String).collect(),
        ),
    );
    w.set(
        "tokenizer.ggml.token_type",
        MetaValue::Array(MetaType::I32, types),
    );
    w.set(
        "tokenizer.ggml.merges",
        MetaValue::Array(MetaType::String, Vec::new()),
    );
    w.set("tokenizer.ggml.eos_token_id", MetaValue::U32(first + eos));
    w.set(
        "tokenizer.ggml.padding_token_id",
        MetaValue::U32(first + pad),
    );
    w.set("tokenizer.ggml.bos_token_id", MetaValue::U32(first + bos));
    w.set("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    w.set("tokenizer.chat_template", str_(template));
    n_vocab
}

/// Sets the `{arch}.*` hyperparameter keys.
fn set_hparams(w: &mut Writer, s: &SynthSpec) {
    if s.arch.has_dense_lead() {
        return set_hparams_dense_lead(w, s);
    }
    if let Some(la) = &s.linear {
        return qwen3next::set_hparams(w, s, la);
    }
    let a = s.arch.name();
    let u32_ = |v: usize| MetaValue::U32(v as u32);
    let mut keys = vec![
        ("context_length", s.n_ctx_train),
        ("embedding_length", s.n_embd),
        ("block_count", s.n_layer),
        ("feed_forward_length", s.n_ff_exp),
        ("attention.head_count", s.n_head),
        ("attention.head_count_kv", s.n_head_kv),
        ("attention.key_length", s.head_dim),
        ("attention.value_length", s.head_dim),
        ("rope.dimension_count", s.head_dim),
        ("expert_count", s.n_expert),
        ("expert_used_count", s.n_expert_used),
        ("expert_feed_forward_length", s.n_ff_exp),
    ];
    if s.arch == SynthArch::GptOss {
        keys.push(("attention.sliding_window", s.n_swa));
        keys.push(("rope.scaling.original_context_length", 4096));
    }
    for (k, v) in keys {
        w.set(&format!("{a}.{k}"), u32_(v));
    }
    let f32_ = |k: &str, v: f32| (format!("{a}.{k}"), MetaValue::F32(v));
    let floats = match s.arch {
        // qwen3moe (deepseek2, glm4moe and qwen3next returned above).
        SynthArch::Qwen3Moe | SynthArch::Deepseek2 | SynthArch::Glm4Moe | SynthArch::Qwen3Next => {
            vec![
                f32_("rope.freq_base", 1_000_000.0),
                f32_("attention.layer_norm_rms_epsilon", 1e-6),
            ]
        }
        // gpt-oss-20b's YaRN settings.
        SynthArch::GptOss => vec![
            f32_("rope.freq_base", 150_000.0),
            f32_("attention.layer_norm_rms_epsilon", 1e-5),
            f32_("rope.scaling.factor", 32.0),
            f32_("rope.scaling.yarn_beta_fast", 32.0),
            f32_("rope.scaling.yarn_beta_slow", 1.0),
        ],
    };
    for (k, v) in floats {
        w.set(&k, v);
    }
    if s.arch == SynthArch::GptOss {
        w.set(
            &format!("{a}.rope.scaling.type"),
            MetaValue::String("yarn".into()),
        );
    }
}

/// The `{arch}.*` keys of deepseek2 and glm4moe, as llama.cpp's converter
/// writes them for DeepSeek-V2-Lite and GLM-4.5-Air.
fn set_hparams_dense_lead(w: &mut Writer, s: &SynthSpec) {
    let a = s.arch.name();
    let mut u = vec![
        ("context_length", s.n_ctx_train),
        ("embedding_length", s.n_embd),
        ("block_count", s.n_layer),
        ("feed_forward_length", s.n_ff),
        ("attention.head_count", s.n_head),
        ("attention.head_count_kv", s.n_head_kv),
        ("rope.dimension_count", s.n_rot()),
        ("expert_count", s.n_expert),
        ("expert_used_count", s.n_expert_used),
        ("expert_group_count", 1),
        ("expert_group_used_count", 1),
        ("expert_feed_forward_length", s.n_ff_exp),
        ("expert_shared_count", s.n_expert_shared),
        ("leading_dense_block_count", s.n_layer_dense_lead),
    ];
    // llama.cpp's `llama_expert_gating_func_type`: 1 softmax, 2 sigmoid.
    let (gating, norm_topk, freq_base, eps) = match s.arch {
        SynthArch::Deepseek2 => (1, false, 10_000.0, 1e-6),
        _ => (2, true, 1_000_000.0, 1e-5),
    };
    u.push(("expert_gating_func", gating));
    match s.mla {
        Some(m) => {
            let rope = s.n_rot();
            u.extend([
                ("attention.kv_lora_rank", m.kv_lora_rank),
                ("attention.key_length", m.kv_lora_rank + rope),
                ("attention.value_length", m.kv_lora_rank),
                ("attention.key_length_mla", s.head_dim),
                ("attention.value_length_mla", m.v_head_dim),
                ("rope.scaling.original_context_length", 4096),
            ]);
            // The converter writes the query rank only when there is one;
            // llama.cpp then requires it unless the layer count says "lite"
            // (26 or 27 layers), so smaller variants say 0 explicitly.
            if m.q_lora_rank > 0 || !matches!(s.n_layer, 26 | 27) {
                u.push(("attention.q_lora_rank", m.q_lora_rank));
            }
        }
        None => u.extend([
            ("attention.key_length", s.head_dim),
            ("attention.value_length", s.head_dim),
        ]),
    }
    for (k, v) in u {
        w.set(&format!("{a}.{k}"), MetaValue::U32(v as u32));
    }
    let mut f = vec![
        ("rope.freq_base", freq_base),
        ("attention.layer_norm_rms_epsilon", eps),
        ("expert_weights_scale", 1.0),
    ];
    if s.arch == SynthArch::Deepseek2 {
        // DeepSeek-V2-Lite's YaRN: factor 40, beta 32/1, mscale_all_dim
        // 0.707 written as 0.1 * 0.707 (llama.cpp's convention for deepseek2).
        f.extend([
            ("rope.scaling.factor", 40.0),
            ("rope.scaling.yarn_beta_fast", 32.0),
            ("rope.scaling.yarn_beta_slow", 1.0),
            ("rope.scaling.yarn_log_multiplier", 0.1 * 0.707),
        ]);
        w.set(
            &format!("{a}.rope.scaling.type"),
            MetaValue::String("yarn".into()),
        );
    }
    for (k, v) in f {
        w.set(&format!("{a}.{k}"), MetaValue::F32(v));
    }
    if norm_topk {
        w.set(&format!("{a}.expert_weights_norm"), MetaValue::Bool(true));
    }
}

/// Adds a tensor of a layer: name within the layer, shape, type, fill.
type AddTensor<'a> = dyn FnMut(&str, &[u64], GgmlType, Fill) -> Result<(), SynthError> + 'a;

/// Adds one layer's tensors of the deepseek2 and glm4moe layouts: attention
/// (latent or GQA with biases), then a dense FFN for the leading layers, or
/// the router, the routed experts and the shared experts.
fn add_layer_dense_lead(w: &mut Writer, s: &SynthSpec, il: usize) -> Result<(), SynthError> {
    let (e, hd, nh) = (s.n_embd as u64, s.head_dim as u64, s.n_head as u64);
    let (x, ff, rot) = (s.n_expert as u64, s.n_ff_exp as u64, s.n_rot() as u64);
    let amp = |k: u64| (3.0 / k as f32).sqrt();
    let (f32_, dense, experts) = (GgmlType::F32, s.dense_type, s.expert_type);
    let mut t = |name: &str, dims: &[u64], ty: GgmlType, fill: Fill| {
        add(w, s.seed, &format!("blk.{il}.{name}"), dims, ty, fill)
    };
    t("attn_norm.weight", &[e], f32_, Fill::norm())?;
    let out_rows = match s.mla {
        Some(m) => {
            let (kvr, vh) = (m.kv_lora_rank as u64, m.v_head_dim as u64);
            let nope = hd - rot;
            if m.q_lora_rank > 0 {
                let qr = m.q_lora_rank as u64;
                t("attn_q_a.weight", &[e, qr], dense, Fill::uniform(amp(e)))?;
                t("attn_q_a_norm.weight", &[qr], f32_, Fill::norm())?;
                t(
                    "attn_q_b.weight",
                    &[qr, nh * hd],
                    dense,
                    Fill::uniform(amp(qr)),
                )?;
            } else {
                t("attn_q.weight", &[e, nh * hd], dense, Fill::uniform(amp(e)))?;
            }
            t(
                "attn_kv_a_mqa.weight",
                &[e, kvr + rot],
                dense,
                Fill::uniform(amp(e)),
            )?;
            t("attn_kv_a_norm.weight", &[kvr], f32_, Fill::norm())?;
            t(
                "attn_k_b.weight",
                &[nope, kvr, nh],
                dense,
                Fill::uniform(amp(nope)),
            )?;
            t(
                "attn_v_b.weight",
                &[kvr, vh, nh],
                dense,
                Fill::uniform(amp(kvr)),
            )?;
            nh * vh
        }
        None => {
            let kv = (s.n_head_kv * s.head_dim) as u64;
            for (m, out) in [("q", nh * hd), ("k", kv), ("v", kv)] {
                let wname = format!("attn_{m}.weight");
                t(&wname, &[e, out], dense, Fill::uniform(amp(e)))?;
                let bname = format!("attn_{m}.bias");
                t(&bname, &[out], f32_, Fill::uniform(0.1))?;
            }
            nh * hd
        }
    };
    t(
        "attn_output.weight",
        &[out_rows, e],
        dense,
        Fill::uniform(amp(out_rows)),
    )?;
    let post_norm = match s.arch {
        SynthArch::Glm4Moe => "post_attention_norm.weight",
        _ => "ffn_norm.weight",
    };
    t(post_norm, &[e], f32_, Fill::norm())?;
    let ffn = |t: &mut AddTensor, suffix: &str, n: u64| {
        t(
            &format!("ffn_gate{suffix}.weight"),
            &[e, n],
            dense,
            Fill::uniform(amp(e)),
        )?;
        t(
            &format!("ffn_down{suffix}.weight"),
            &[n, e],
            dense,
            Fill::uniform(amp(n)),
        )?;
        t(
            &format!("ffn_up{suffix}.weight"),
            &[e, n],
            dense,
            Fill::uniform(amp(e)),
        )
    };
    if il < s.n_layer_dense_lead {
        return ffn(&mut t, "", s.n_ff as u64);
    }
    // Softmax routers as qwen3moe's; sigmoid ones with logits of about unit
    // spread (wider ones saturate at 1 and tie), and a selection bias small
    // next to the sigmoid's slope.
    let sigmoid = s.arch == SynthArch::Glm4Moe;
    let router = Fill {
        row_scale: router_row_scales(s.seed, il, s.n_expert, s.router_skew).map(Arc::from),
        ..Fill::uniform(amp(e) * if sigmoid { 1.0 } else { 4.0 })
    };
    t("ffn_gate_inp.weight", &[e, x], f32_, router)?;
    if sigmoid {
        t("exp_probs_b.bias", &[x], f32_, Fill::uniform(0.02))?;
    }
    for (m, dims, k) in [
        ("gate", [e, ff, x], e),
        ("down", [ff, e, x], ff),
        ("up", [e, ff, x], e),
    ] {
        let name = format!("ffn_{m}_exps.weight");
        t(&name, &dims, experts, Fill::uniform(amp(k)))?;
    }
    if s.n_expert_shared > 0 {
        ffn(&mut t, "_shexp", ff * s.n_expert_shared as u64)?;
    }
    Ok(())
}

/// Builds the synthetic model in memory (tensors are made when written).
pub fn build(spec: &SynthSpec) -> Result<Writer, SynthError> {
    let s = spec;
    s.check()?;
    let mut w = Writer::new();
    let a = s.arch.name();
    w.set("general.architecture", MetaValue::String(a.into()));
    w.set(
        "general.name",
        MetaValue::String(format!("longhaul synthetic {a}")),
    );
    w.set("general.alignment", MetaValue::U32(32));
    set_hparams(&mut w, s);
    let n_vocab = set_tokenizer(&mut w, s.arch);
    if s.mla.is_some() {
        w.set(&format!("{a}.vocab_size"), MetaValue::U32(n_vocab as u32));
    }
    if s.router_skew > 0.0 {
        w.set("longhaul.synth.router_skew", MetaValue::F32(s.router_skew));
    }

    let oss = s.arch == SynthArch::GptOss;
    let (e, v) = (s.n_embd as u64, n_vocab as u64);
    let (q, kv) = (
        (s.n_head * s.head_dim) as u64,
        (s.n_head_kv * s.head_dim) as u64,
    );
    let (x, ff) = (s.n_expert as u64, s.n_ff_exp as u64);
    let amp = |k: u64| (3.0 / k as f32).sqrt();
    let (f32_, dense, experts) = (GgmlType::F32, s.dense_type, s.expert_type);
    // gpt-oss's biases are small next to the products they are added to.
    let bias = Fill::uniform(0.1);
    let mut t = |name: &str, dims: &[u64], ty: GgmlType, fill: Fill| {
        add(&mut w, s.seed, name, dims, ty, fill)
    };
    t("token_embd.weight", &[e, v], f32_, Fill::uniform(1.0))?;
    t("output_norm.weight", &[e], f32_, Fill::norm())?;
    t("output.weight", &[e, v], dense, Fill::uniform(amp(e)))?;
    if s.arch.has_dense_lead() {
        for il in 0..s.n_layer {
            add_layer_dense_lead(&mut w, s, il)?;
        }
        return Ok(w);
    }
    if let Some(la) = &s.linear {
        for il in 0..s.n_layer {
            qwen3next::add_layer(&mut w, s, la, il)?;
        }
        return Ok(w);
    }
    for il in 0..s.n_layer {
        let n = |k: &str| format!("blk.{il}.{k}");
        t(&n("attn_norm.weight"), &[e], f32_, Fill::norm())?;
        for (m, out) in [("q", q), ("k", kv), ("v", kv)] {
            t(
                &n(&format!("attn_{m}.weight")),
                &[e, out],
                dense,
                Fill::uniform(amp(e)),
            )?;
            if oss {
                t(&n(&format!("attn_{m}.bias")), &[out], f32_, bias.clone())?;
            }
        }
        t(
            &n("attn_output.weight"),
            &[q, e],
            dense,
            Fill::uniform(amp(q)),
        )?;
        if oss {
            t(&n("attn_output.bias"), &[e], f32_, bias.clone())?;
            t(
                &n("attn_sinks.weight"),
                &[s.n_head as u64],
                f32_,
                Fill::uniform(1.0),
            )?;
            t(&n("post_attention_norm.weight"), &[e], f32_, Fill::norm())?;
        } else {
            let hd = s.head_dim as u64;
            t(&n("attn_q_norm.weight"), &[hd], f32_, Fill::norm())?;
            t(&n("attn_k_norm.weight"), &[hd], f32_, Fill::norm())?;
            t(&n("ffn_norm.weight"), &[e], f32_, Fill::norm())?;
        }
        let router = Fill {
            row_scale: router_row_scales(s.seed, il, s.n_expert, s.router_skew).map(Arc::from),
            ..Fill::uniform(amp(e) * 4.0)
        };
        t(&n("ffn_gate_inp.weight"), &[e, x], f32_, router)?;
        if oss {
            t(&n("ffn_gate_inp.bias"), &[x], f32_, bias.clone())?;
        }
        for (m, dims, k) in [
            ("gate", [e, ff, x], e),
            ("up", [e, ff, x], e),
            ("down", [ff, e, x], ff),
        ] {
            t(
                &n(&format!("ffn_{m}_exps.weight")),
                &dims,
                experts,
                Fill::uniform(amp(k)),
            )?;
            if oss {
                let b = [dims[1], x];
                t(&n(&format!("ffn_{m}_exps.bias")), &b, f32_, bias.clone())?;
            }
        }
    }
    Ok(w)
}

/// Writes the synthetic model to `path`.
pub fn write(spec: &SynthSpec, path: &Path) -> Result<(), SynthError> {
    build(spec)?.write(path)?;
    Ok(())
}

/// [`write`], reporting `(bytes written, total)` after each tensor.
pub fn write_with_progress(
    spec: &SynthSpec,
    path: &Path,
    progress: &dyn Fn(u64, u64),
) -> Result<(), SynthError> {
    build(spec)?.write_with_progress(path, progress)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole stream of `offset + amp * U(-1, 1)` (amp 2, offset 0.5),
    /// one generator per block of 2^14 values, in order.
    fn whole(seed: u64, name: &str, n: usize) -> Vec<f32> {
        const BLOCK: usize = 1 << 14;
        let base = name_seed(seed, name);
        let mut v = Vec::with_capacity(n);
        for b in 0..n.div_ceil(BLOCK) {
            let mut r = Rng(base ^ (b as u64).wrapping_mul(0xA24B_AED4_963E_E407));
            for _ in 0..BLOCK.min(n - b * BLOCK) {
                v.push(0.5 + 2.0 * r.uniform());
            }
        }
        v
    }

    #[test]
    fn random_ranges_are_slices_of_the_whole_stream() {
        let n = 5 * (1 << 14) + 123;
        let all = whole(3, "t", n);
        for (start, len) in [
            (0, n),
            (0, 1),
            (1, 1 << 14),
            (15_488, 40_000),
            ((1 << 14) - 1, 2),
            (n - 7, 7),
        ] {
            assert!(
                random_at(3, "t", start, len, 2.0, 0.5) == all[start..start + len],
                "start {start} len {len}"
            );
        }
    }

    #[test]
    fn fit_type_falls_back_as_llama_quantize() {
        use GgmlType as T;
        assert_eq!(fit_type(T::Q4_K, 2048), T::Q4_K);
        assert_eq!(fit_type(T::Q4_K, 1408), T::Q5_0);
        assert_eq!(fit_type(T::Q6_K, 128), T::Q8_0);
        assert_eq!(fit_type(T::Q8_0, 48), T::F16);
        assert_eq!(fit_type(T::F32, 7), T::F32);
    }
}
