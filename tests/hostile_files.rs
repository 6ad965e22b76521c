//! Hostile files and sizes: a GGUF whose header claims huge sizes, tensors
//! whose bytes overlap, NaN float settings, and contexts (`-c`, or a trained
//! context of 2^32-1 behind `-c 0`) whose KV cache cannot fit. Each is a
//! typed error naming the value, raised before anything is sized from it;
//! none is an abort, a huge allocation or a long loop. Files are written with
//! the project's own writer from a tiny synthetic model, then made hostile.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use longhaul::backend::cpu::CpuBackend;
use longhaul::engine::{Engine, EngineError, EngineParams};
use longhaul::gguf::{self, GgufError, MetaValue, Writer};
use longhaul::kv;
use longhaul::model::{hparams::limits, Model, ModelError};
use longhaul::state::SeqState;
use longhaul::synth::{self, SynthSpec};
use longhaul::tensor::GgmlType;

const ARCH: &str = "qwen3moe";

fn dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("longhaul-hostile");
    std::fs::create_dir_all(&d).expect("dir");
    d
}

/// The tiny synthetic model with metadata `keys` overridden, written to `name`.
fn with_keys(name: &str, keys: &[(&str, MetaValue)]) -> PathBuf {
    let mut w = synth::build(&SynthSpec::tiny()).expect("build");
    for (k, v) in keys {
        w.set(k, v.clone());
    }
    let path = dir().join(name);
    w.write(&path).expect("write");
    path
}

fn key(k: &str) -> String {
    format!("{ARCH}.{k}")
}

/// Loads the whole model (tokenizer, structure, weights) as the CLI does.
fn load(path: &Path, n_ctx: usize) -> Result<Engine<CpuBackend>, EngineError> {
    let params = EngineParams {
        n_ctx,
        ..EngineParams::default()
    };
    Engine::load(path, CpuBackend::new(), params)
}

/// The model error of a load that must fail.
fn model_err(r: Result<Engine<CpuBackend>, EngineError>) -> ModelError {
    match r {
        Err(EngineError::Model(e)) => e,
        Err(e) => panic!("expected a model error, got: {e}"),
        Ok(_) => panic!("the hostile file loaded"),
    }
}

#[test]
fn huge_block_count_is_refused_before_sizing_layers() {
    for n in [1u64 << 32, 1_000_000_000, limits::N_LAYER + 1] {
        let path = with_keys("layers.gguf", &[(&key("block_count"), MetaValue::U64(n))]);
        let e = model_err(load(&path, 64));
        let msg = e.to_string();
        match e {
            ModelError::HparamTooLarge { key: k, value, .. } => {
                assert_eq!((k, value), (key("block_count"), n));
            }
            e => panic!("{n}: expected HparamTooLarge, got {e}"),
        }
        assert!(msg.contains(&n.to_string()), "{msg}");
    }
    // Within the limit but past the tensors the file holds: the first
    // missing layer is named.
    let path = with_keys("layers.gguf", &[(&key("block_count"), MetaValue::U32(300))]);
    let e = model_err(load(&path, 64));
    let msg = e.to_string();
    match e {
        ModelError::MissingLayer {
            n_layer,
            present,
            missing,
            ..
        } => {
            assert_eq!((n_layer, present), (300, 2));
            assert_eq!(missing, "blk.2.attn_norm.weight");
        }
        e => panic!("expected MissingLayer, got {e}"),
    }
    assert!(
        msg.contains("300") && msg.contains("blk.2.attn_norm.weight"),
        "{msg}"
    );
}

#[test]
fn huge_dims_are_refused() {
    let cases: [(&str, u64); 8] = [
        ("embedding_length", 1 << 40),
        ("attention.head_count", 1 << 32),
        ("attention.head_count_kv", 1 << 31),
        ("attention.key_length", 1 << 30),
        ("expert_count", 1 << 20),
        ("expert_feed_forward_length", 1 << 40),
        ("context_length", 1 << 40),
        ("attention.sliding_window", u64::MAX),
    ];
    for (k, v) in cases {
        let path = with_keys("dims.gguf", &[(&key(k), MetaValue::U64(v))]);
        let e = model_err(load(&path, 64));
        let msg = e.to_string();
        match e {
            ModelError::HparamTooLarge {
                key: got, value, ..
            } => {
                assert_eq!((got, value), (key(k), v));
            }
            e => panic!("{k} = {v}: expected HparamTooLarge, got {e}"),
        }
        assert!(msg.contains(&v.to_string()) && msg.contains(k), "{msg}");
    }
    // More experts used than there are.
    let path = with_keys(
        "dims.gguf",
        &[(&key("expert_used_count"), MetaValue::U32(9))],
    );
    let e = model_err(load(&path, 64));
    assert!(matches!(e, ModelError::BadHparam { .. }), "{e}");
    assert!(e.to_string().contains("9 of 8 experts"), "{e}");
}

/// A copy of the tiny model whose `token_embd.weight` claims `n_vocab`
/// rows (and a zero third dimension, so the tensor holds no bytes and the
/// file stays small: only the claim is huge).
fn with_vocab(n_vocab: u64) -> PathBuf {
    let src_path = dir().join("vocab-src.gguf");
    synth::write(&SynthSpec::tiny(), &src_path).expect("write");
    let src = gguf::Model::open(&src_path).expect("open");
    let mut w = Writer::new();
    for (k, v) in src.metadata().iter() {
        w.set(k, v.clone());
    }
    for t in src.tensors() {
        if t.name == "token_embd.weight" {
            w.add_tensor(&t.name, &[t.dims[0], n_vocab, 0], t.ty, Vec::new())
                .expect("add");
        } else {
            let data = src.tensor_data(t).expect("data").to_vec();
            w.add_tensor(&t.name, &t.dims, t.ty, data).expect("add");
        }
    }
    let path = dir().join("vocab.gguf");
    w.write(&path).expect("write");
    path
}

#[test]
fn huge_vocabulary_is_refused() {
    let n = 1u64 << 40;
    let e = model_err(load(&with_vocab(n), 64));
    let msg = e.to_string();
    match e {
        ModelError::HparamTooLarge { value, what, .. } => {
            assert_eq!((value, what), (n, "vocabulary"));
        }
        e => panic!("expected HparamTooLarge, got {e}"),
    }
    assert!(
        msg.contains(&n.to_string()) && msg.contains("token_embd.weight"),
        "{msg}"
    );
}

/// Offset in `bytes` of the tensor-table entry of `name`, just past the name.
fn table_entry(bytes: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend(name.as_bytes());
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("tensor in the table")
        + needle.len()
}

/// The table entry's `(type field, offset field)` positions.
fn entry_fields(bytes: &[u8], name: &str) -> (usize, usize) {
    let at = table_entry(bytes, name);
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4")) as usize;
    let ty = at + 4 + 8 * n_dims;
    (ty, ty + 4)
}

#[test]
fn overlapping_tensors_are_refused() {
    // A quantised tensor retyped as F32 without moving the data: its bytes
    // now run into the next tensor's, as in a badly patched file. The Q8_0
    // attention matrix still ends inside the file (the case that used to
    // load and compute garbage); the Q4_K experts run past its end too.
    for (name, ty, next) in [
        ("blk.0.attn_q.weight", GgmlType::Q8_0, "blk.0.attn_k.weight"),
        (
            "blk.0.ffn_gate_exps.weight",
            GgmlType::Q4_K,
            "blk.0.ffn_up_exps.weight",
        ),
    ] {
        let path = dir().join("overlap.gguf");
        synth::write(&SynthSpec::tiny(), &path).expect("write");
        let t = gguf::Model::open(&path)
            .expect("the clean file opens")
            .require_tensor(name)
            .expect("tensor")
            .clone();
        assert_eq!(t.ty, ty);
        let mut bytes = std::fs::read(&path).expect("read");
        let (ty, _) = entry_fields(&bytes, name);
        bytes[ty..ty + 4].copy_from_slice(&(GgmlType::F32 as u32).to_le_bytes());
        std::fs::write(&path, &bytes).expect("write");
        let e = gguf::Model::open(&path).expect_err("overlapping tensors open");
        let msg = e.to_string();
        match e.root() {
            GgufError::TensorOverlap {
                name: got,
                offset,
                next: got_next,
                ..
            } => {
                assert_eq!((got.as_str(), *offset), (name, t.offset));
                assert_eq!(got_next, next);
            }
            e => panic!("{name}: expected TensorOverlap, got {e}"),
        }
        assert!(msg.contains(name) && msg.contains("overlap"), "{msg}");
    }
}

#[test]
fn out_of_order_tensors_are_refused() {
    // Two equal-sized tensors whose data offsets are swapped: the second
    // in the table starts before the first.
    let path = dir().join("order.gguf");
    synth::write(&SynthSpec::tiny(), &path).expect("write");
    let (a, b) = ("blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight");
    let mut bytes = std::fs::read(&path).expect("read");
    let (_, oa) = entry_fields(&bytes, a);
    let (_, ob) = entry_fields(&bytes, b);
    let va: [u8; 8] = bytes[oa..oa + 8].try_into().expect("8");
    let vb: [u8; 8] = bytes[ob..ob + 8].try_into().expect("8");
    assert!(u64::from_le_bytes(va) < u64::from_le_bytes(vb), "{a} first");
    bytes[oa..oa + 8].copy_from_slice(&vb);
    bytes[ob..ob + 8].copy_from_slice(&va);
    std::fs::write(&path, &bytes).expect("write");
    let e = gguf::Model::open(&path).expect_err("out-of-order tensors open");
    match e.root() {
        GgufError::TensorOutOfOrder { name, previous, .. } => {
            assert_eq!((name.as_str(), previous.as_str()), (b, a));
        }
        e => panic!("expected TensorOutOfOrder, got {e}"),
    }
}

#[test]
fn nan_and_out_of_range_floats_are_refused() {
    let cases: [(&str, f32); 10] = [
        ("attention.layer_norm_rms_epsilon", f32::NAN),
        ("attention.layer_norm_rms_epsilon", -1e-6),
        ("attention.layer_norm_rms_epsilon", 0.0),
        ("attention.layer_norm_rms_epsilon", f32::INFINITY),
        ("rope.freq_base", -10000.0),
        ("rope.freq_base", f32::NAN),
        ("rope.scaling.factor", f32::NAN),
        ("rope.scaling.factor", -4.0),
        ("rope.scaling.yarn_beta_fast", 0.0),
        ("expert_weights_scale", f32::NEG_INFINITY),
    ];
    for (k, v) in cases {
        let path = with_keys("floats.gguf", &[(&key(k), MetaValue::F32(v))]);
        let e = model_err(load(&path, 64));
        let msg = e.to_string();
        match e {
            ModelError::BadFloatHparam {
                key: got, value, ..
            } => {
                assert_eq!(got, key(k));
                assert!(value.to_bits() == v.to_bits(), "{k}: {value} != {v}");
            }
            e => panic!("{k} = {v}: expected BadFloatHparam, got {e}"),
        }
        assert!(msg.contains(k) && msg.contains(&v.to_string()), "{msg}");
    }
}

/// The error of a load whose KV cache cannot fit.
fn kv_too_large(e: ModelError) -> (usize, usize, bool, u64, Option<u64>, String) {
    let msg = e.to_string();
    match e {
        ModelError::KvTooLarge {
            n_ctx,
            n_seq,
            from_model,
            bytes,
            available,
        } => (n_ctx, n_seq, from_model, bytes, available, msg),
        e => panic!("expected KvTooLarge, got {e}"),
    }
}

#[test]
fn trained_context_of_2_32_behind_c_0_is_refused() {
    let n = u32::MAX as u64;
    let path = with_keys(
        "ctx.gguf",
        &[(&key("context_length"), MetaValue::U32(n as u32))],
    );
    let (n_ctx, n_seq, from_model, bytes, available, msg) = kv_too_large(model_err(load(&path, 0)));
    assert_eq!((n_ctx as u64, n_seq, from_model), (n, 1, true));
    // 2 layers x 2 (K, V) x 128 f16 per position: over 2 TB.
    assert_eq!(bytes, 2 * 2 * 128 * 2 * n);
    assert!(available.is_some_and(|a| a < bytes));
    assert!(
        msg.contains("-c 0") && msg.contains("4294967295") && msg.contains("-c/--ctx-size"),
        "{msg}"
    );
    // The claim itself is no error: a context that fits loads.
    load(&path, 64).expect("-c 64 loads");
}

#[test]
fn ctx_99999999_is_refused_before_allocating() {
    let path = with_keys("big-c.gguf", &[]);
    let n = 99_999_999;
    // F32 keys and values: about 205 GB, more than any machine that runs
    // this test has free.
    let params = EngineParams {
        n_ctx: n,
        kv_type: GgmlType::F32,
        ..EngineParams::default()
    };
    let r = Engine::load(&path, CpuBackend::new(), params);
    let (n_ctx, _, from_model, bytes, available, msg) = kv_too_large(model_err(r));
    assert_eq!((n_ctx, from_model), (n, false));
    assert_eq!(bytes, 2 * 2 * 128 * 4 * n as u64);
    assert!(available.is_some_and(|a| a < bytes));
    assert!(
        msg.contains("-c 99999999") && msg.contains("204.8 GB") && msg.contains("lower -c"),
        "{msg}"
    );

    // The check also guards every KV cache made from a loaded model.
    let file = Arc::new(gguf::Model::open(&path).expect("open"));
    let m = Model::load(CpuBackend::new(), file).expect("load");
    match SeqState::new(&m, n, GgmlType::F32) {
        Err(e) => assert_eq!(kv_too_large(e).0, n),
        Ok(_) => panic!("a 204.8 GB KV cache was made"),
    }
}

#[test]
fn parallel_sequences_are_checked_together() {
    // One sequence's cache takes 40% of what is free, five twice of it: the
    // load for five slots (`serve -np 5`) fails before any weight is loaded.
    let path = with_keys(
        "np.gguf",
        &[(&key("context_length"), MetaValue::U32(u32::MAX))],
    );
    let file = gguf::Model::open(&path).expect("open");
    let (_, hp) = longhaul::model::read_hparams(&file).expect("hparams");
    let avail = longhaul::mem::available_for_allocation().expect("Linux");
    let per_pos = kv::kv_bytes(&hp, 1, 1, GgmlType::F16);
    let n_ctx = (avail / 5 * 2 / per_pos) as usize;
    let params = EngineParams {
        n_ctx,
        ..EngineParams::default()
    };
    let e = Engine::load_parallel(&path, CpuBackend::new(), params, 5, None);
    let (got_ctx, n_seq, _, bytes, _, msg) = kv_too_large(model_err(e));
    assert_eq!((got_ctx, n_seq), (n_ctx, 5));
    assert_eq!(bytes, 5 * per_pos * n_ctx as u64);
    assert!(
        msg.contains("-np 5") && msg.contains("-np/--parallel"),
        "{msg}"
    );
}
