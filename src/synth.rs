//! Deterministic synthetic models: random weights in a real architecture's
//! layout, written with the project's own GGUF writer. Used by `longhaul demo`,
//! tests and benchmarks. Same spec and seed, same bytes.

use std::path::Path;

use rayon::prelude::*;

use crate::gguf::{GgufError, MetaType, MetaValue, Writer};
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

/// Shape and types of a synthetic qwen3moe model.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ctx_train: usize,
    /// Type of the routed expert tensors.
    pub expert_type: GgmlType,
    /// Type of the attention and output matrices.
    pub dense_type: GgmlType,
    pub seed: u64,
}

impl SynthSpec {
    /// The demo model: 8 layers of 64 experts (4 used), Q4_K experts, ~120 MB.
    pub fn demo() -> Self {
        Self {
            n_embd: 512,
            n_layer: 8,
            n_head: 8,
            n_head_kv: 2,
            head_dim: 64,
            n_expert: 64,
            n_expert_used: 4,
            n_ff_exp: 256,
            n_ctx_train: 4096,
            expert_type: GgmlType::Q4_K,
            dense_type: GgmlType::Q8_0,
            seed: 0x1006a,
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
        }
    }

    /// A preset by name: `demo`, `tiny`, `qwen3-30b-a3b`.
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "demo" => Some(Self::demo()),
            "tiny" => Some(Self::tiny()),
            "qwen3-30b-a3b" => Some(Self::qwen3_30b_a3b()),
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

    /// Bytes of one routed expert across a layer's three expert tensors.
    pub fn expert_bytes(&self) -> u64 {
        let row = |n: usize| self.expert_type.row_bytes(n as u64).unwrap_or(0);
        2 * self.n_ff_exp as u64 * row(self.n_embd) + self.n_embd as u64 * row(self.n_ff_exp)
    }
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

/// Adds a random tensor, generated and quantised only when the file is
/// written (so models larger than memory can be made).
fn add(
    w: &mut Writer,
    spec: &SynthSpec,
    name: &str,
    dims: &[u64],
    ty: GgmlType,
    amp: f32,
    offset: f32,
) -> Result<(), SynthError> {
    let (seed, name_s, dims_v) = (spec.seed, name.to_string(), dims.to_vec());
    let source = move || -> Result<Vec<u8>, GgufError> {
        let n: u64 = dims_v.iter().product();
        if ty == GgmlType::Q4_K && offset == 0.0 {
            return Ok(random_q4k(seed, &name_s, n as usize / 256, amp));
        }
        let data = random(seed, &name_s, n as usize, amp, offset);
        let row = dims_v[0] as usize;
        let rows: Result<Vec<Vec<u8>>, QuantError> = data
            .par_chunks(row)
            .map(|r| quant::quantize_row(ty, r))
            .collect();
        rows.map(|r| r.concat())
            .map_err(|e| GgufError::InvalidArgument {
                reason: format!("quantising `{name_s}`: {e}"),
            })
    };
    w.add_tensor_lazy(name, dims, ty, std::sync::Arc::new(source))?;
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

/// Builds the synthetic qwen3moe model in memory.
pub fn build(spec: &SynthSpec) -> Result<Writer, SynthError> {
    let s = spec;
    if !s.n_head.is_multiple_of(s.n_head_kv.max(1))
        || s.n_expert_used == 0
        || s.n_expert_used > s.n_expert
    {
        return Err(SynthError::Spec(format!("{s:?}")));
    }
    let mut w = Writer::new();
    let str_ = |v: &str| MetaValue::String(v.to_string());
    let u32_ = |v: usize| MetaValue::U32(v as u32);
    let a = "qwen3moe";
    w.set("general.architecture", str_(a));
    w.set("general.name", str_("longhaul synthetic qwen3moe"));
    w.set("general.alignment", MetaValue::U32(32));
    for (k, v) in [
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
    ] {
        w.set(&format!("{a}.{k}"), u32_(v));
    }
    w.set(&format!("{a}.rope.freq_base"), MetaValue::F32(1_000_000.0));
    w.set(
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        MetaValue::F32(1e-6),
    );

    let mut tokens = byte_tokens();
    let mut types = vec![MetaValue::I32(1); tokens.len()];
    for sp in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(sp.to_string());
        types.push(MetaValue::I32(3));
    }
    let n_vocab = tokens.len();
    w.set("tokenizer.ggml.model", str_("gpt2"));
    w.set("tokenizer.ggml.pre", str_("qwen2"));
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
    w.set(
        "tokenizer.ggml.eos_token_id",
        MetaValue::U32(n_vocab as u32 - 1),
    );
    w.set(
        "tokenizer.ggml.padding_token_id",
        MetaValue::U32(n_vocab as u32 - 3),
    );
    w.set(
        "tokenizer.ggml.bos_token_id",
        MetaValue::U32(n_vocab as u32 - 3),
    );
    w.set("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    w.set("tokenizer.chat_template", str_(CHATML));

    let (e, v) = (s.n_embd as u64, n_vocab as u64);
    let (q, kv) = (
        (s.n_head * s.head_dim) as u64,
        (s.n_head_kv * s.head_dim) as u64,
    );
    let (x, ff) = (s.n_expert as u64, s.n_ff_exp as u64);
    let amp = |k: u64| (3.0 / k as f32).sqrt();
    add(
        &mut w,
        s,
        "token_embd.weight",
        &[e, v],
        GgmlType::F32,
        1.0,
        0.0,
    )?;
    add(
        &mut w,
        s,
        "output_norm.weight",
        &[e],
        GgmlType::F32,
        0.2,
        1.0,
    )?;
    add(
        &mut w,
        s,
        "output.weight",
        &[e, v],
        s.dense_type,
        amp(e),
        0.0,
    )?;
    for il in 0..s.n_layer {
        let n = |t: &str| format!("blk.{il}.{t}");
        add(
            &mut w,
            s,
            &n("attn_norm.weight"),
            &[e],
            GgmlType::F32,
            0.2,
            1.0,
        )?;
        add(
            &mut w,
            s,
            &n("attn_q.weight"),
            &[e, q],
            s.dense_type,
            amp(e),
            0.0,
        )?;
        add(
            &mut w,
            s,
            &n("attn_k.weight"),
            &[e, kv],
            s.dense_type,
            amp(e),
            0.0,
        )?;
        add(
            &mut w,
            s,
            &n("attn_v.weight"),
            &[e, kv],
            s.dense_type,
            amp(e),
            0.0,
        )?;
        add(
            &mut w,
            s,
            &n("attn_output.weight"),
            &[q, e],
            s.dense_type,
            amp(q),
            0.0,
        )?;
        add(
            &mut w,
            s,
            &n("attn_q_norm.weight"),
            &[s.head_dim as u64],
            GgmlType::F32,
            0.2,
            1.0,
        )?;
        add(
            &mut w,
            s,
            &n("attn_k_norm.weight"),
            &[s.head_dim as u64],
            GgmlType::F32,
            0.2,
            1.0,
        )?;
        add(
            &mut w,
            s,
            &n("ffn_norm.weight"),
            &[e],
            GgmlType::F32,
            0.2,
            1.0,
        )?;
        add(
            &mut w,
            s,
            &n("ffn_gate_inp.weight"),
            &[e, x],
            GgmlType::F32,
            amp(e) * 4.0,
            0.0,
        )?;
        add(
            &mut w,
            s,
            &n("ffn_gate_exps.weight"),
            &[e, ff, x],
            s.expert_type,
            amp(e),
            0.0,
        )?;
        add(
            &mut w,
            s,
            &n("ffn_up_exps.weight"),
            &[e, ff, x],
            s.expert_type,
            amp(e),
            0.0,
        )?;
        add(
            &mut w,
            s,
            &n("ffn_down_exps.weight"),
            &[ff, e, x],
            s.expert_type,
            amp(ff),
            0.0,
        )?;
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
