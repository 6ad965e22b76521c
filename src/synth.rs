//! Deterministic synthetic models: random weights in a real architecture's
//! layout (qwen3moe or gpt-oss), written with the project's own GGUF writer.
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
}

impl SynthArch {
    /// GGUF `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen3Moe => QWEN3MOE.name,
            Self::GptOss => GPT_OSS.name,
        }
    }
}

/// Names of the presets [`SynthSpec::preset`] knows, for help and errors.
pub const PRESETS: [&str; 5] = ["demo", "tiny", "micro", "qwen3-30b-a3b", "gpt-oss-20b"];

/// The types a synthetic model's tensors can have: those with a quantiser,
/// in ggml's order.
pub fn writable_types() -> Vec<GgmlType> {
    GgmlType::ALL
        .into_iter()
        .filter(|&t| quant::ops(t).is_ok())
        .collect()
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
    /// Sliding-window size of gpt-oss's even layers (ignored by qwen3moe).
    pub n_swa: usize,
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
    /// The demo model: 8 layers of 64 experts (4 used), Q4_K experts, ~120 MB.
    pub fn demo() -> Self {
        Self {
            arch: SynthArch::Qwen3Moe,
            n_embd: 512,
            n_layer: 8,
            n_head: 8,
            n_head_kv: 2,
            head_dim: 64,
            n_expert: 64,
            n_expert_used: 4,
            n_ff_exp: 256,
            n_ctx_train: 4096,
            n_swa: 0,
            expert_type: GgmlType::Q4_K,
            dense_type: GgmlType::Q8_0,
            seed: 0x1006a,
            router_skew: 0.0,
        }
    }

    /// Shaped like Qwen3-30B-A3B (48 layers, 128 experts, top-8, n_embd 2048,
    /// n_ff_exp 768, Q4_K): about 17 GB, for longhaul benchmarks.
    pub fn qwen3_30b_a3b() -> Self {
        Self {
            n_embd: 2048,
            n_layer: 48,
            n_head: 32,
            n_head_kv: 4,
            head_dim: 128,
            n_expert: 128,
            n_expert_used: 8,
            n_ff_exp: 768,
            n_ctx_train: 40960,
            expert_type: GgmlType::Q4_K,
            dense_type: GgmlType::Q4_K,
            seed: 30,
            ..Self::demo()
        }
    }

    /// Shaped like gpt-oss-20b (24 layers, 32 experts, top-4, n_embd and
    /// n_ff_exp 2880, 64 query and 8 KV heads of 64, a 128-token sliding
    /// window on even layers, MXFP4 experts, Q8_0 elsewhere): about 11 GB.
    /// The vocabulary is the synthetic byte-level one, not o200k.
    pub fn gpt_oss_20b() -> Self {
        Self {
            arch: SynthArch::GptOss,
            n_embd: 2880,
            n_layer: 24,
            n_head: 64,
            n_head_kv: 8,
            head_dim: 64,
            n_expert: 32,
            n_expert_used: 4,
            n_ff_exp: 2880,
            n_ctx_train: 131072,
            n_swa: 128,
            expert_type: GgmlType::MXFP4,
            dense_type: GgmlType::Q8_0,
            seed: 20,
            router_skew: 0.0,
        }
    }

    /// A preset by name: one of [`PRESETS`].
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "demo" => Some(Self::demo()),
            "tiny" => Some(Self::tiny()),
            "micro" => Some(Self::micro()),
            "qwen3-30b-a3b" => Some(Self::qwen3_30b_a3b()),
            "gpt-oss-20b" => Some(Self::gpt_oss_20b()),
            _ => None,
        }
    }

    /// A small model for tests (a few MB).
    pub fn tiny() -> Self {
        Self {
            n_embd: 256,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 256,
            seed: 7,
            ..Self::demo()
        }
    }

    /// The smallest useful model (about 60 KB, most of it the F32 embedding
    /// of the 259-token vocabulary): one layer of 4 experts (2 used),
    /// n_embd 32, Q8_0 everywhere. Seeds for fuzzing and tests of the load
    /// path; its rows of 32 suit every type with 32-element blocks.
    pub fn micro() -> Self {
        Self {
            n_embd: 32,
            n_layer: 1,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 16,
            n_expert: 4,
            n_expert_used: 2,
            n_ff_exp: 32,
            n_ctx_train: 64,
            expert_type: GgmlType::Q8_0,
            seed: 11,
            ..Self::demo()
        }
    }

    /// Bytes of one routed expert across a layer's three expert tensors.
    pub fn expert_bytes(&self) -> u64 {
        let row = |n: usize| self.expert_type.row_bytes(n as u64).unwrap_or(0);
        2 * self.n_ff_exp as u64 * row(self.n_embd) + self.n_embd as u64 * row(self.n_ff_exp)
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
        let rows = [
            ("expert", self.expert_type, [self.n_embd, self.n_ff_exp]),
            ("dense", self.dense_type, [self.n_embd, q]),
        ];
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

/// SplitMix64: tiny, fast and good enough for random weights.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
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

/// Random values of amplitude `amp`, generated in parallel by row blocks so
/// the result does not depend on the thread count.
fn random(seed: u64, name: &str, n: usize, amp: f32, offset: f32) -> Vec<f32> {
    const BLOCK: usize = 1 << 14;
    let base = name_seed(seed, name);
    let mut v = vec![0f32; n];
    v.par_chunks_mut(BLOCK).enumerate().for_each(|(i, c)| {
        let mut r = Rng(base ^ (i as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        c.iter_mut().for_each(|x| *x = offset + amp * r.uniform());
    });
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

/// How a random tensor is filled: `offset + amp * U(-1, 1)`, each row of
/// `dims[0]` values then multiplied by `row_scale[row]` when given.
#[derive(Clone)]
struct Fill {
    amp: f32,
    offset: f32,
    row_scale: Option<Arc<[f32]>>,
}

impl Fill {
    fn uniform(amp: f32) -> Self {
        Self {
            amp,
            offset: 0.0,
            row_scale: None,
        }
    }

    /// A norm weight: 1 +- 0.2.
    fn norm() -> Self {
        Self {
            amp: 0.2,
            offset: 1.0,
            row_scale: None,
        }
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
    let (name_s, dims_v) = (name.to_string(), dims.to_vec());
    let source = move || -> Result<Vec<u8>, GgufError> {
        let n: u64 = dims_v.iter().product();
        let Fill {
            amp,
            offset,
            row_scale,
        } = &fill;
        if ty == GgmlType::Q4_K && *offset == 0.0 && row_scale.is_none() {
            return Ok(random_q4k(seed, &name_s, n as usize / 256, *amp));
        }
        let mut data = random(seed, &name_s, n as usize, *amp, *offset);
        let row = dims_v[0] as usize;
        if let Some(scale) = row_scale {
            data.par_chunks_mut(row)
                .zip(scale.par_iter())
                .for_each(|(r, &s)| r.iter_mut().for_each(|v| *v *= s));
        }
        let rows: Result<Vec<Vec<u8>>, QuantError> = data
            .par_chunks(row)
            .map(|r| quant::quantize_row(ty, r))
            .collect();
        rows.map(|r| r.concat())
            .map_err(|e| GgufError::InvalidArgument {
                reason: format!("quantising `{name_s}`: {e}"),
            })
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

/// A minimal harmony template (gpt-oss): no system preamble or channels.
const HARMONY: &str = "{% for message in messages %}{{'<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>'}}{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}";

/// The synthetic tokenizer: GPT-2's 256 byte tokens, no merges, and the
/// architecture's special tokens.
fn set_tokenizer(w: &mut Writer, arch: SynthArch) -> usize {
    let str_ = |v: &str| MetaValue::String(v.to_string());
    // (specials, pre-tokenizer, [bos, padding, eos], template); the ids
    // count from the first special.
    let (specials, pre, [bos, pad, eos], template): (&[&str], _, [u32; 3], _) = match arch {
        SynthArch::Qwen3Moe => (
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
        SynthArch::Qwen3Moe => vec![
            f32_("rope.freq_base", 1_000_000.0),
            f32_("attention.layer_norm_rms_epsilon", 1e-6),
        ],
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
