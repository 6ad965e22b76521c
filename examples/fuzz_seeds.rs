//! Writes the seed corpora of the fuzz targets in `fuzz/` (they are not
//! committed): tiny synthetic models of every architecture family and
//! several quant types, a split model, and their headers alone.
//!
//! ```sh
//! cargo run --release --example fuzz_seeds -- fuzz/corpus
//! ```
//!
//! writes `fuzz/corpus/load_path/*` (whole models, 40-150 KB each; a split
//! model is `b"SPLT" ++ u32 LE length of shard 1 ++ shard 1 ++ shard 2`, the
//! input format of the `load_path` target) and `fuzz/corpus/gguf_header/*`
//! (each model's header and tensor table without the data, and one small
//! complete file with a value of every metadata type). Every model seed is
//! checked to load and generate, so the fuzzer starts from valid files.
//! `fuzz/corpus/grammar/*` holds llama.cpp's grammars (the copies in
//! `tests/fixtures/grammars`), a Lark grammar and JSON schemas, each behind
//! the byte that picks its kind for the `grammar` target (0 GBNF, 1 Lark,
//! 2 JSON schema).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use longhaul::backend::cpu::CpuBackend;
use longhaul::gguf::{self, MetaType, MetaValue, Metadata, Writer};
use longhaul::model::{Logits, Model};
use longhaul::state::SeqState;
use longhaul::synth::{self, SynthArch, SynthSpec};
use longhaul::tensor::GgmlType;

type Error = Box<dyn std::error::Error>;

/// The synthetic models, by seed name.
fn specs() -> Vec<(&'static str, SynthSpec)> {
    let micro = SynthSpec::micro;
    let oss = |n_layer, expert_type, dense_type| SynthSpec {
        arch: SynthArch::GptOss,
        n_layer,
        n_swa: 4,
        expert_type,
        dense_type,
        ..micro()
    };
    let qwen = |n_layer, expert_type, dense_type| SynthSpec {
        n_layer,
        expert_type,
        dense_type,
        ..micro()
    };
    use GgmlType as T;
    vec![
        ("qwen3moe-q8_0", micro()),
        ("qwen3moe-2l-f16", qwen(2, T::F16, T::F16)),
        ("qwen3moe-q4_0-q4_1", qwen(1, T::Q4_0, T::Q4_1)),
        ("qwen3moe-q5_0-q5_1", qwen(1, T::Q5_0, T::Q5_1)),
        ("qwen3moe-q4_1-f32", qwen(1, T::Q4_1, T::F32)),
        ("gpt-oss-2l-mxfp4", oss(2, T::MXFP4, T::Q8_0)),
        ("gpt-oss-bf16", oss(1, T::BF16, T::BF16)),
    ]
}

/// Renames `w`'s architecture from `from` to `to` (keys `from.*` become
/// `to.*`) and drops the q/k norms: the qwen3moe layout read as llama
/// (Mixtral-style MoE) or qwen2moe, which take the same tensors but those.
fn rename_arch(w: &mut Writer, from: &str, to: &str) {
    w.retain_tensors(|n| !n.ends_with("attn_q_norm.weight") && !n.ends_with("attn_k_norm.weight"));
    let mut md = Metadata::new();
    for (k, v) in w.metadata_mut().iter() {
        let key = match k.strip_prefix(from).and_then(|r| r.strip_prefix('.')) {
            Some(rest) => format!("{to}.{rest}"),
            None => k.to_string(),
        };
        md.set(key, v.clone());
    }
    md.set("general.architecture", MetaValue::String(to.into()));
    *w.metadata_mut() = md;
}

/// Small random values (xorshift), amplitude 0.3, for the tensors added here.
fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.6
        })
        .collect()
}

/// Adds a random tensor of `ty` (rows of `dims[0]`).
fn add_random(w: &mut Writer, name: &str, dims: &[u64], ty: GgmlType) -> Result<(), Error> {
    let n = dims.iter().product::<u64>() as usize;
    let v = noise(name.len() as u64 * 0x9E37_79B9 + n as u64, n);
    let bytes = match ty {
        GgmlType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        _ => longhaul::quant::quantize_row(ty, &v)?,
    };
    w.add_tensor(name, dims, ty, bytes)?;
    Ok(())
}

/// Makes the micro qwen3moe layout (renamed qwen2moe) a real qwen2moe:
/// a shared expert behind its sigmoid gate and q/k/v biases in every layer.
fn add_qwen2moe_parts(w: &mut Writer, spec: &SynthSpec) -> Result<(), Error> {
    let (e, ff) = (spec.n_embd as u64, 32u64);
    let q = (spec.n_head * spec.head_dim) as u64;
    let kv = (spec.n_head_kv * spec.head_dim) as u64;
    w.set(
        "qwen2moe.expert_shared_feed_forward_length",
        MetaValue::U32(ff as u32),
    );
    for il in 0..spec.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}");
        add_random(w, &n("ffn_gate_shexp.weight"), &[e, ff], GgmlType::Q8_0)?;
        add_random(w, &n("ffn_up_shexp.weight"), &[e, ff], GgmlType::Q8_0)?;
        add_random(w, &n("ffn_down_shexp.weight"), &[ff, e], GgmlType::Q8_0)?;
        add_random(w, &n("ffn_gate_inp_shexp.weight"), &[e], GgmlType::F32)?;
        add_random(w, &n("attn_q.bias"), &[q], GgmlType::F32)?;
        add_random(w, &n("attn_k.bias"), &[kv], GgmlType::F32)?;
        add_random(w, &n("attn_v.bias"), &[kv], GgmlType::F32)?;
    }
    Ok(())
}

/// Replaces the byte-level BPE vocabulary with a SentencePiece one of the
/// same size (259: `<unk>`, `<s>`, `</s>` and the 256 byte pieces
/// `<0x00>`..`<0xFF>`), as llama models carry.
fn use_spm_tokenizer(w: &mut Writer) {
    let md = w.metadata_mut();
    for k in ["tokenizer.ggml.pre", "tokenizer.ggml.merges"] {
        md.remove(k);
    }
    let s = |v: &str| MetaValue::String(v.into());
    let mut tokens = vec![s("<unk>"), s("<s>"), s("</s>")];
    tokens.extend((0..256).map(|b| MetaValue::String(format!("<0x{b:02X}>"))));
    let n = tokens.len();
    let mut types = vec![MetaValue::I32(2), MetaValue::I32(3), MetaValue::I32(3)];
    types.extend((3..n).map(|_| MetaValue::I32(6)));
    let scores = (0..n).map(|i| MetaValue::F32(-(i as f32))).collect();
    md.set("tokenizer.ggml.model", s("llama"));
    md.set(
        "tokenizer.ggml.tokens",
        MetaValue::Array(MetaType::String, tokens),
    );
    md.set(
        "tokenizer.ggml.scores",
        MetaValue::Array(MetaType::F32, scores),
    );
    md.set(
        "tokenizer.ggml.token_type",
        MetaValue::Array(MetaType::I32, types),
    );
    md.set("tokenizer.ggml.unknown_token_id", MetaValue::U32(0));
    md.set("tokenizer.ggml.bos_token_id", MetaValue::U32(1));
    md.set("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
    md.set("tokenizer.ggml.padding_token_id", MetaValue::U32(0));
    md.set("tokenizer.ggml.add_bos_token", MetaValue::Bool(true));
    md.set(
        "tokenizer.chat_template",
        s("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] | trim }} [/INST]{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"),
    );
}

/// A small complete file with one value of every metadata type (arrays of
/// each type and nested arrays too) and two tiny tensors: for the header target.
fn every_kind() -> Result<Writer, Error> {
    let mut w = Writer::new();
    let s = |v: &str| MetaValue::String(v.into());
    let values = [
        ("u8", MetaValue::U8(7)),
        ("i8", MetaValue::I8(-7)),
        ("u16", MetaValue::U16(700)),
        ("i16", MetaValue::I16(-700)),
        ("u32", MetaValue::U32(70_000)),
        ("i32", MetaValue::I32(-70_000)),
        ("f32", MetaValue::F32(0.5)),
        ("bool", MetaValue::Bool(true)),
        ("string", s("text")),
        ("u64", MetaValue::U64(1 << 40)),
        ("i64", MetaValue::I64(-(1 << 40))),
        ("f64", MetaValue::F64(-0.25)),
        (
            "array.u8",
            MetaValue::Array(MetaType::U8, vec![MetaValue::U8(1), MetaValue::U8(2)]),
        ),
        (
            "array.f32",
            MetaValue::Array(MetaType::F32, vec![MetaValue::F32(1.0)]),
        ),
        (
            "array.string",
            MetaValue::Array(MetaType::String, vec![s("a"), s("bc")]),
        ),
        (
            "array.array",
            MetaValue::Array(
                MetaType::Array,
                vec![MetaValue::Array(MetaType::I32, vec![MetaValue::I32(3)])],
            ),
        ),
        ("array.empty", MetaValue::Array(MetaType::U64, Vec::new())),
    ];
    w.set("general.architecture", s("llama"));
    w.set("general.alignment", MetaValue::U32(64));
    for (k, v) in values {
        w.set(&format!("kind.{k}"), v);
    }
    w.add_tensor("a", &[4, 2], GgmlType::F32, vec![0x3f; 32])?;
    w.add_tensor("b.q8", &[32], GgmlType::Q8_0, vec![0x11; 34])?;
    Ok(w)
}

/// Loads `path` resident and runs two tokens: the seed must be valid.
fn check(path: &Path) -> Result<(), Error> {
    let file = Arc::new(gguf::Model::open(path)?);
    let m = Model::load(CpuBackend::new(), file)?;
    let mut kv = SeqState::new(&m, 32, GgmlType::F16)?;
    let logits = kv.eval(&m, &[1, 2], Logits::Last)?;
    if logits.len() != m.hp.n_vocab {
        return Err(format!("{} logits for {} tokens", logits.len(), m.hp.n_vocab).into());
    }
    Ok(())
}

/// The file's header and tensor table: everything before the data section.
fn header_of(bytes: &[u8]) -> Result<&[u8], Error> {
    let h = gguf::parse_header(bytes)?;
    Ok(&bytes[..h.data_offset as usize])
}

fn put(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), Error> {
    std::fs::write(dir.join(name), bytes)?;
    println!("{:>8} bytes  {}", bytes.len(), dir.join(name).display());
    Ok(())
}

fn main() -> Result<(), Error> {
    let out = PathBuf::from(std::env::args().nth(1).unwrap_or("fuzz/corpus".into()));
    let (load, header) = (out.join("load_path"), out.join("gguf_header"));
    std::fs::create_dir_all(&load)?;
    std::fs::create_dir_all(&header)?;
    let tmp = out.join(".seeds-tmp");
    std::fs::create_dir_all(&tmp)?;

    let mut models: Vec<(String, Writer)> = Vec::new();
    for (name, spec) in specs() {
        models.push((name.to_string(), synth::build(&spec)?));
    }
    // llama (Mixtral-style MoE) with a SentencePiece vocabulary, and
    // qwen2moe with its shared expert and biases, from the qwen3moe layout.
    let mut w = synth::build(&SynthSpec::micro())?;
    rename_arch(&mut w, "qwen3moe", "llama");
    use_spm_tokenizer(&mut w);
    models.push(("llama-moe-spm-q8_0".into(), w));
    let mut w = synth::build(&SynthSpec::micro())?;
    rename_arch(&mut w, "qwen3moe", "qwen2moe");
    add_qwen2moe_parts(&mut w, &SynthSpec::micro())?;
    models.push(("qwen2moe-shexp-q8_0".into(), w));
    for (name, w) in &models {
        let path = tmp.join(format!("{name}.gguf"));
        w.write(&path)?;
        check(&path).map_err(|e| format!("seed {name}: {e}"))?;
        let bytes = std::fs::read(&path)?;
        put(&load, &format!("{name}.gguf"), &bytes)?;
        put(&header, &format!("{name}.hdr"), header_of(&bytes)?)?;
    }

    // A split model: two layers in two shards (the first holds every key).
    let w = synth::build(&SynthSpec {
        n_layer: 2,
        ..SynthSpec::micro()
    })?;
    let n_tensors = gguf::parse_header(&{
        let p = tmp.join("whole.gguf");
        w.write(&p)?;
        std::fs::read(&p)?
    })?
    .tensors
    .len();
    let shards = w.write_split(tmp.join("split.gguf"), n_tensors.div_ceil(2))?;
    if shards.len() != 2 {
        return Err(format!("{} shards, not 2", shards.len()).into());
    }
    check(&shards[0]).map_err(|e| format!("split seed: {e}"))?;
    let (a, b) = (std::fs::read(&shards[0])?, std::fs::read(&shards[1])?);
    let mut packed = b"SPLT".to_vec();
    packed.extend((a.len() as u32).to_le_bytes());
    packed.extend(&a);
    packed.extend(&b);
    put(&load, "qwen3moe-split-2.bin", &packed)?;
    put(&header, "split-1-of-2.hdr", header_of(&a)?)?;
    put(&header, "split-2-of-2.hdr", header_of(&b)?)?;

    let p = tmp.join("kinds.gguf");
    every_kind()?.write(&p)?;
    put(&header, "every-kind.gguf", &std::fs::read(&p)?)?;

    let grammar = out.join("grammar");
    std::fs::create_dir_all(&grammar)?;
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/grammars");
    let mut gbnf: Vec<_> = std::fs::read_dir(&fixtures)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    gbnf.sort();
    let mut grammars: Vec<(String, u8, String)> = Vec::new();
    for path in gbnf
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "gbnf"))
    {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        grammars.push((name, 0, std::fs::read_to_string(path)?));
    }
    grammars.push((
        "list.lark".into(),
        1,
        "start: item (\",\" item)*\nitem: /[a-z]+/ | NUMBER\nNUMBER: /[0-9]+/\n".into(),
    ));
    grammars.push((
        "object.json".into(),
        2,
        r#"{"type":"object","properties":{"name":{"type":"string","maxLength":8},"n":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"enum":["a","b"]}}},"required":["name"]}"#.into(),
    ));
    grammars.push((
        "refs.json".into(),
        2,
        r##"{"$defs":{"node":{"anyOf":[{"type":"null"},{"type":"object","properties":{"next":{"$ref":"#/$defs/node"}}}]}},"$ref":"#/$defs/node"}"##.into(),
    ));
    for (name, kind, text) in grammars {
        let mut bytes = vec![kind];
        bytes.extend(text.as_bytes());
        put(&grammar, &name, &bytes)?;
    }
    std::fs::remove_dir_all(&tmp)?;
    Ok(())
}
