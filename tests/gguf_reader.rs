//! The GGUF file layer against files written by `gguf::Writer` and by hand:
//! round trips, split models, and malformed input (truncation, corruption,
//! out-of-range tensors, mismatched shards) that must give typed errors and
//! never panic.

mod common;

use std::path::{Path, PathBuf};

use common::Rng;
use longhaul::gguf::{self, GgufError, MetaType, MetaValue, Metadata, Model, Writer};
use longhaul::tensor::GgmlType;

/// A fresh, empty directory for one test.
fn tmp_dir(test: &str) -> PathBuf {
    common::tmp_dir("gguf_reader", test)
}

/// One value of every metadata type, nested arrays and empty arrays included.
fn every_metadata_type() -> Metadata {
    use MetaValue as V;
    let mut m = Metadata::new();
    m.set("general.architecture", V::String("qwen3moe".into()));
    m.set("t.u8", V::U8(200));
    m.set("t.i8", V::I8(-100));
    m.set("t.u16", V::U16(65000));
    m.set("t.i16", V::I16(-32000));
    m.set("t.u32", V::U32(4_000_000_000));
    m.set("t.i32", V::I32(-2_000_000_000));
    m.set("t.f32", V::F32(-1.5e-7));
    m.set("t.bool", V::Bool(true));
    m.set("t.string", V::String("héllo ▁world\n".into()));
    m.set("t.empty_string", V::String(String::new()));
    m.set("t.u64", V::U64(u64::MAX));
    m.set("t.i64", V::I64(i64::MIN));
    m.set("t.f64", V::F64(std::f64::consts::PI));
    m.set(
        "t.arr_i32",
        V::Array(MetaType::I32, vec![V::I32(1), V::I32(-2), V::I32(3)]),
    );
    m.set(
        "t.arr_str",
        V::Array(
            MetaType::String,
            vec![V::String("a".into()), V::String("".into())],
        ),
    );
    m.set(
        "t.arr_bool",
        V::Array(MetaType::Bool, vec![V::Bool(false), V::Bool(true)]),
    );
    m.set("t.arr_f64", V::Array(MetaType::F64, vec![V::F64(0.25)]));
    m.set("t.empty_u8", V::Array(MetaType::U8, vec![]));
    m.set("t.empty_str", V::Array(MetaType::String, vec![]));
    m.set("t.empty_arr", V::Array(MetaType::Array, vec![]));
    m.set(
        "t.nested",
        V::Array(
            MetaType::Array,
            vec![
                V::Array(MetaType::U16, vec![V::U16(1), V::U16(2)]),
                V::Array(MetaType::String, vec![]),
                V::Array(
                    MetaType::Array,
                    vec![V::Array(MetaType::F32, vec![V::F32(1.0)])],
                ),
            ],
        ),
    );
    m
}

/// Deterministic, never all-zero tensor bytes.
fn data(seed: u64, n: usize) -> Vec<u8> {
    Rng(seed | 1).bytes(n)
}

/// Tensors of several types; the last one's size is a multiple of 32 so the
/// file ends exactly at the end of its data (every shorter prefix is invalid).
const TENSORS: &[(&str, &[u64], GgmlType)] = &[
    ("token_embd.weight", &[32, 3], GgmlType::Q8_0),
    ("blk.0.ffn_gate_exps.weight", &[256, 2, 2], GgmlType::Q4_K),
    ("blk.0.attn_norm.weight", &[5], GgmlType::F16),
    ("blk.0.ffn_down_exps.weight", &[8, 1, 1, 3], GgmlType::BF16),
    ("output_norm.weight", &[8], GgmlType::F32),
];

fn sample_writer(metadata: Metadata) -> Writer {
    let mut w = Writer::new();
    *w.metadata_mut() = metadata;
    for (i, (name, dims, ty)) in TENSORS.iter().enumerate() {
        let rows: u64 = dims[1..].iter().product();
        let n = ty.row_bytes(dims[0]).unwrap() * rows;
        w.add_tensor(name, dims, *ty, data(i as u64, n as usize))
            .unwrap();
    }
    w
}

/// A small file: three keys and the sample tensors.
fn small_file(dir: &Path) -> (PathBuf, Vec<u8>) {
    let mut m = Metadata::new();
    m.set("general.architecture", MetaValue::String("llama".into()));
    m.set("llama.block_count", MetaValue::U32(1));
    m.set(
        "tokenizer.ggml.tokens",
        MetaValue::Array(
            MetaType::String,
            vec![
                MetaValue::String("a".into()),
                MetaValue::String("bc".into()),
            ],
        ),
    );
    let p = dir.join("small.gguf");
    sample_writer(m).write(&p).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    (p, bytes)
}

/// Position of the tensor-table entry of `name`: (n_dims field, type field, offset field).
fn entry(bytes: &[u8], name: &str) -> (usize, usize, usize) {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend(name.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("tensor entry")
        + needle.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * n_dims;
    (at, ty, ty + 4)
}

fn open_err(path: &Path) -> GgufError {
    match Model::open(path) {
        Ok(_) => panic!("{} opened but should not", path.display()),
        Err(e) => e,
    }
}

fn assert_same_tensors(a: &Model, b: &Model) {
    assert_eq!(a.tensors().len(), b.tensors().len());
    for (x, y) in a.tensors().iter().zip(b.tensors()) {
        assert_eq!(
            (&x.name, &x.dims, x.ty, x.len),
            (&y.name, &y.dims, y.ty, y.len)
        );
        assert_eq!(
            a.tensor_data(x).unwrap(),
            b.tensor_data(y).unwrap(),
            "{}",
            x.name
        );
    }
}

#[test]
fn every_metadata_type_round_trips() {
    let dir = tmp_dir("round_trip");
    let p = dir.join("m.gguf");
    sample_writer(every_metadata_type()).write(&p).unwrap();
    let m = Model::open(&p).unwrap();
    assert_eq!(m.metadata(), &every_metadata_type());
    assert_eq!(m.shards().len(), 1);
    assert_eq!(m.shards()[0].version, 3);
    assert_eq!(m.shards()[0].len, std::fs::metadata(&p).unwrap().len());
    assert_eq!(m.tensors().len(), TENSORS.len());
    let mut total = 0;
    for (i, (name, dims, ty)) in TENSORS.iter().enumerate() {
        let t = m.require_tensor(name).unwrap();
        assert_eq!((t.dims.as_slice(), t.ty, t.shard), (*dims, *ty, 0));
        assert_eq!(t.offset % 32, 0);
        assert_eq!(t.row_len(), dims[0]);
        assert_eq!(t.n_rows() * t.row_len(), t.n_elements());
        let bytes = m.tensor_data(t).unwrap();
        assert_eq!(bytes, data(i as u64, t.len as usize));
        total += t.len;
    }
    assert_eq!(m.total_tensor_bytes(), total);
    assert!(m.file(0).is_some() && m.file(1).is_none());
}

#[test]
fn metadata_only_file_round_trips() {
    let dir = tmp_dir("metadata_only");
    let p = dir.join("m.gguf");
    let mut w = Writer::new();
    w.set("general.name", MetaValue::String("x".into()));
    w.write(&p).unwrap();
    let m = Model::open(&p).unwrap();
    assert!(m.tensors().is_empty());
    assert_eq!(m.metadata().get_str("general.name").unwrap(), "x");
    assert_eq!(m.total_tensor_bytes(), 0);
}

/// A GGUF file written byte by byte from the spec, not by `Writer`.
fn hand_file(version: u32, alignment: u32) -> Vec<u8> {
    let s = |b: &mut Vec<u8>, x: &str| {
        b.extend((x.len() as u64).to_le_bytes());
        b.extend(x.as_bytes());
    };
    let mut b = b"GGUF".to_vec();
    b.extend(version.to_le_bytes());
    b.extend(1u64.to_le_bytes()); // n_tensors
    b.extend(2u64.to_le_bytes()); // n_kv
    s(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    s(&mut b, "llama");
    s(&mut b, "general.alignment");
    b.extend(4u32.to_le_bytes());
    b.extend(alignment.to_le_bytes());
    s(&mut b, "w");
    b.extend(2u32.to_le_bytes()); // n_dims
    b.extend(2u64.to_le_bytes());
    b.extend(3u64.to_le_bytes());
    b.extend(0u32.to_le_bytes()); // f32
    b.extend(0u64.to_le_bytes()); // offset
    while !b.len().is_multiple_of(alignment.max(1) as usize) {
        b.push(0);
    }
    for i in 0..6 {
        b.extend((i as f32).to_le_bytes());
    }
    b
}

#[test]
fn hand_written_v2_file_reads() {
    let dir = tmp_dir("v2");
    let p = dir.join("v2.gguf");
    let bytes = hand_file(2, 16);
    std::fs::write(&p, &bytes).unwrap();
    let m = Model::open(&p).unwrap();
    assert_eq!(m.shards()[0].version, 2);
    assert_eq!(m.shards()[0].alignment, 16);
    assert_eq!(m.metadata().architecture().unwrap(), "llama");
    let t = m.require_tensor("w").unwrap();
    assert_eq!(
        (t.dims.as_slice(), t.ty, t.len),
        (&[2u64, 3][..], GgmlType::F32, 24)
    );
    assert_eq!(t.offset % 16, 0);
    let floats: Vec<f32> = m
        .tensor_data(t)
        .unwrap()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(floats, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    // v3 is the same layout.
    assert_eq!(gguf::parse_header(&hand_file(3, 16)).unwrap().version, 3);
}

#[test]
fn bad_versions_alignment_and_magic_have_clear_errors() {
    let e = gguf::parse_header(&hand_file(1, 32)).unwrap_err();
    assert!(
        matches!(e, GgufError::UnsupportedVersion { version: 1 }),
        "{e}"
    );
    assert!(e.to_string().contains("versions 2 and 3"), "{e}");

    let mut be = hand_file(3, 32);
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    let e = gguf::parse_header(&be).unwrap_err();
    assert!(e.to_string().contains("big-endian"), "{e}");

    for a in [0, 24] {
        let e = gguf::parse_header(&hand_file(3, a)).unwrap_err();
        assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
        assert!(e.to_string().contains("power of two"), "{e}");
    }

    let mut bad = hand_file(3, 32);
    bad[0] = b'X';
    let e = gguf::parse_header(&bad).unwrap_err();
    assert!(matches!(e, GgufError::BadMagic { .. }), "{e}");
}

#[test]
fn every_truncation_is_an_error() {
    let dir = tmp_dir("truncation");
    let (p, bytes) = small_file(&dir);
    assert!(gguf::parse_header(&bytes).is_ok());
    for len in 0..bytes.len() {
        match gguf::parse_header(&bytes[..len]) {
            Ok(_) => panic!("prefix of {len} of {} bytes parsed", bytes.len()),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
    // Through the file path too (empty file, mid-header, mid-data).
    let t = dir.join("t.gguf");
    for len in [0, 3, 20, 100, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&t, &bytes[..len]).unwrap();
        let e = open_err(&t);
        assert!(e.to_string().contains("t.gguf"), "{e}");
    }
    let e = gguf::parse_header(&bytes[..30]).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
    drop(p);
}

/// Checks a parse result: an error, or a header whose tensors are all inside the file.
fn check_parse(bytes: &[u8]) {
    if let Ok(h) = gguf::parse_header(bytes) {
        for t in &h.tensors {
            assert!(t.offset.checked_add(t.len).unwrap() <= bytes.len() as u64);
            assert!(t.offset >= h.data_offset);
        }
    }
}

#[test]
fn random_header_corruptions_never_panic() {
    let dir = tmp_dir("corruption");
    let (_, bytes) = small_file(&dir);
    let header_len = gguf::parse_header(&bytes).unwrap().data_offset as usize;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut oks = 0;
    for _ in 0..5000 {
        let mut b = bytes.clone();
        let i = rng.below(header_len);
        b[i] ^= 1 + rng.below(255) as u8;
        check_parse(&b);
        oks += gguf::parse_header(&b).is_ok() as usize;
    }
    // Some corruptions (string bytes, values) leave a valid file.
    assert!(oks > 0);
    // Whole 8-byte fields overwritten with random or extreme values (counts, lengths, dims, offsets).
    for _ in 0..3000 {
        let mut b = bytes.clone();
        let i = rng.below(header_len - 8);
        let v = match rng.below(4) {
            0 => u64::MAX,
            1 => 1u64 << rng.below(64),
            2 => rng.next() % 1000,
            _ => rng.next(),
        };
        b[i..i + 8].copy_from_slice(&v.to_le_bytes());
        check_parse(&b);
    }
    // A few corrupted files through Model::open.
    let p = dir.join("c.gguf");
    for _ in 0..50 {
        let mut b = bytes.clone();
        let i = rng.below(header_len);
        b[i] = rng.next() as u8;
        std::fs::write(&p, &b).unwrap();
        if let Ok(m) = Model::open(&p) {
            for t in m.tensors() {
                assert_eq!(m.tensor_data(t).unwrap().len() as u64, t.len);
            }
        }
    }
}

#[test]
fn tensor_outside_the_file_is_reported() {
    let dir = tmp_dir("out_of_bounds");
    let (p, bytes) = small_file(&dir);
    // Cut the last tensor short.
    std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
    let e = open_err(&p);
    match e.root() {
        GgufError::TensorOutOfBounds {
            name,
            offset,
            len,
            file_len,
        } => {
            assert_eq!(name, "output_norm.weight");
            assert_eq!(
                (offset + len, *file_len),
                (bytes.len() as u64, bytes.len() as u64 - 1)
            );
        }
        other => panic!("{other}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("output_norm.weight") && msg.contains("truncated"),
        "{msg}"
    );
    assert!(msg.contains("small.gguf"), "{msg}");

    // An offset far past the end.
    let mut b = bytes.clone();
    let (_, _, off) = entry(&b, "token_embd.weight");
    b[off..off + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = gguf::parse_header(&b).unwrap_err();
    assert!(
        matches!(e, GgufError::TensorOutOfBounds { ref name, .. } if name == "token_embd.weight"),
        "{e}"
    );

    // An offset that wraps around u64.
    let (_, _, off) = entry(&b, "token_embd.weight");
    b[off..off + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    let e = gguf::parse_header(&b).unwrap_err();
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");

    // A misaligned offset.
    let mut b = bytes.clone();
    let (_, _, off) = entry(&b, "output_norm.weight");
    b[off] += 4;
    let e = gguf::parse_header(&b).unwrap_err();
    assert!(matches!(e, GgufError::Misaligned { .. }), "{e}");
}

#[test]
fn dimension_overflow_is_reported() {
    let dir = tmp_dir("dim_overflow");
    let (_, mut b) = small_file(&dir);
    let (at, _, _) = entry(&b, "token_embd.weight");
    b[at + 4..at + 12].copy_from_slice(&(1u64 << 35).to_le_bytes());
    b[at + 12..at + 20].copy_from_slice(&(1u64 << 35).to_le_bytes());
    let e = gguf::parse_header(&b).unwrap_err();
    assert!(
        matches!(e, GgufError::DimOverflow { ref name } if name == "token_embd.weight"),
        "{e}"
    );
    assert!(e.to_string().contains("token_embd.weight"), "{e}");

    // More than four dimensions.
    let (_, mut b) = small_file(&dir);
    let (at, _, _) = entry(&b, "output_norm.weight");
    b[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
    let e = gguf::parse_header(&b).unwrap_err();
    assert!(matches!(e, GgufError::TooManyDims { n_dims: 5, .. }), "{e}");

    // A row that is not a whole number of blocks.
    let (_, mut b) = small_file(&dir);
    let (at, _, _) = entry(&b, "token_embd.weight");
    b[at + 4..at + 12].copy_from_slice(&33u64.to_le_bytes());
    let e = gguf::parse_header(&b).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::BadBlockMultiple {
                row_len: 33,
                block_size: 32,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn unknown_type_id_is_reported_with_supported_types() {
    let dir = tmp_dir("unknown_type");
    let (p, mut b) = small_file(&dir);
    let (_, ty, _) = entry(&b, "blk.0.attn_norm.weight");
    b[ty..ty + 4].copy_from_slice(&4u32.to_le_bytes()); // removed Q4_2
    std::fs::write(&p, &b).unwrap();
    let e = open_err(&p);
    assert!(
        matches!(e.root(), GgufError::UnknownType { name, id: 4 } if name == "blk.0.attn_norm.weight"),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("supported") && msg.contains("q4_K") && msg.contains("mxfp4"),
        "{msg}"
    );
}

#[test]
fn missing_keys_and_tensors_name_what_is_missing() {
    let dir = tmp_dir("missing");
    let (p, _) = small_file(&dir);
    let m = Model::open(&p).unwrap();
    let e = m.metadata().get_u32("llama.expert_count").unwrap_err();
    assert!(matches!(e, GgufError::MissingKey { ref key } if key == "llama.expert_count"));
    assert!(e.to_string().contains("llama.expert_count"));
    let e = m.metadata().get_str("llama.block_count").unwrap_err();
    assert!(matches!(e, GgufError::WrongType { .. }), "{e}");
    assert_eq!(m.metadata().get_u32("llama.block_count").unwrap(), 1);
    assert!(m.tensor("blk.9.ffn_up.weight").is_none());
    let e = m.require_tensor("blk.9.ffn_up.weight").unwrap_err();
    assert!(matches!(e, GgufError::MissingTensor { .. }));
    assert!(e.to_string().contains("blk.9.ffn_up.weight"), "{e}");
}

#[test]
fn read_at_equals_tensor_data_and_checks_range() {
    let dir = tmp_dir("read_at");
    let (p, bytes) = small_file(&dir);
    let m = Model::open(&p).unwrap();
    for t in m.tensors() {
        let mut buf = vec![0xa5u8; t.len as usize];
        m.read_at(t.shard, t.offset, &mut buf).unwrap();
        assert_eq!(buf, m.tensor_data(t).unwrap(), "{}", t.name);
    }
    let len = bytes.len() as u64;
    let mut buf = [0u8; 8];
    m.read_at(0, len - 8, &mut buf).unwrap();
    let e = m.read_at(0, len - 7, &mut buf).unwrap_err();
    assert!(matches!(e, GgufError::ReadOutOfRange { .. }), "{e}");
    assert!(m.read_at(0, u64::MAX - 2, &mut buf).is_err());
    assert!(m.read_at(1, 0, &mut buf).is_err());
    let mut fake = m.tensors()[0].clone();
    fake.offset = len;
    assert!(m.tensor_data(&fake).is_err());
    fake.shard = 7;
    assert!(m.tensor_data(&fake).is_err());
}

/// Writes the sample model split 2 tensors per shard (3 shards) under `dir`.
fn write_split(dir: &Path, name: &str, w: &Writer, per_shard: usize) -> Vec<PathBuf> {
    w.write_split(dir.join(format!("{name}.gguf")), per_shard)
        .unwrap()
}

#[test]
fn split_round_trip_matches_single_file() {
    let dir = tmp_dir("split");
    let w = sample_writer(every_metadata_type());
    let single = dir.join("single.gguf");
    w.write(&single).unwrap();
    let paths = write_split(&dir, "model", &w, 2);
    let names: Vec<_> = paths
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "model-00001-of-00003.gguf",
            "model-00002-of-00003.gguf",
            "model-00003-of-00003.gguf"
        ]
    );

    let a = Model::open(&single).unwrap();
    let b = Model::open(&paths[0]).unwrap();
    assert_same_tensors(&a, &b);
    assert_eq!(b.shards().len(), 3);
    let shards: Vec<usize> = b.tensors().iter().map(|t| t.shard).collect();
    assert_eq!(shards, [0, 0, 1, 1, 2]);
    for (s, p) in b.shards().iter().zip(&paths) {
        assert_eq!(&s.path, p);
    }
    let md = b.metadata();
    assert_eq!(md.get("split.no"), Some(&MetaValue::U16(0)));
    assert_eq!(md.get("split.count"), Some(&MetaValue::U16(3)));
    assert_eq!(md.get("split.tensors.count"), Some(&MetaValue::I32(5)));
    for (k, v) in every_metadata_type().iter() {
        assert_eq!(md.get(k), Some(v), "{k}");
    }
    // Other shards carry only the split keys, as llama-gguf-split writes them.
    let h = gguf::parse_header(&std::fs::read(&paths[1]).unwrap()).unwrap();
    let keys: Vec<&str> = h.metadata.iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["split.no", "split.count", "split.tensors.count"]);
    assert_eq!(h.metadata.get("split.no"), Some(&MetaValue::U16(1)));

    for t in b.tensors() {
        let mut buf = vec![0u8; t.len as usize];
        b.read_at(t.shard, t.offset, &mut buf).unwrap();
        assert_eq!(buf, b.tensor_data(t).unwrap());
        assert!(b.file(t.shard).is_some());
    }
    assert_eq!(a.total_tensor_bytes(), b.total_tensor_bytes());

    // One shard: still named -00001-of-00001 and readable.
    let one = write_split(&dir, "one", &w, 100);
    assert!(one[0].ends_with("one-00001-of-00001.gguf"));
    assert_same_tensors(&a, &Model::open(&one[0]).unwrap());
    assert!(w.write_split(dir.join("zero"), 0).is_err());
}

#[test]
fn missing_shard_is_reported() {
    let dir = tmp_dir("missing_shard");
    let paths = write_split(&dir, "m", &sample_writer(Metadata::new()), 2);
    std::fs::remove_file(&paths[1]).unwrap();
    let e = open_err(&paths[0]);
    match &e {
        GgufError::ShardMissing { path, index, count } => {
            assert_eq!((path, *index, *count), (&paths[1], 1, 3));
        }
        other => panic!("{other}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("shard 2 of 3") && msg.contains("m-00002-of-00003.gguf"),
        "{msg}"
    );
}

#[test]
fn shards_from_another_model_are_rejected() {
    let dir = tmp_dir("other_model");
    let w = sample_writer(Metadata::new());
    let a = write_split(&dir, "a", &w, 2); // 3 shards
    let b = write_split(&dir, "b", &w, 3); // 2 shards
    let restore = |i: usize| std::fs::copy(dir.join(format!("keep{i}")), &a[i]).unwrap();
    for (i, p) in a.iter().enumerate() {
        std::fs::copy(p, dir.join(format!("keep{i}"))).unwrap();
    }

    // Different split.count.
    std::fs::copy(&b[1], &a[1]).unwrap();
    let e = open_err(&a[0]);
    assert!(
        matches!(e, GgufError::ShardMismatch { ref path, .. } if path == &a[1]),
        "{e}"
    );
    assert!(e.to_string().contains("split.count"), "{e}");
    restore(1);

    // Mismatching split.no: shard 3 renamed as shard 2.
    std::fs::copy(&a[2], &a[1]).unwrap();
    let e = open_err(&a[0]);
    assert!(matches!(e, GgufError::ShardMismatch { .. }), "{e}");
    assert!(e.to_string().contains("split.no"), "{e}");
    restore(1);

    // Same split layout, different model: tensors repeat across shards.
    let mut other = Writer::new();
    for (i, (name, dims, ty)) in TENSORS.iter().enumerate().take(2) {
        let n = ty.row_bytes(dims[0]).unwrap() * dims[1..].iter().product::<u64>();
        other
            .add_tensor(&format!("x.{i}"), &[4], GgmlType::F32, vec![1; 16])
            .unwrap();
        other
            .add_tensor(name, dims, *ty, data(9, n as usize))
            .unwrap();
    }
    other
        .add_tensor("x.z", &[4], GgmlType::F32, vec![1; 16])
        .unwrap();
    let o = write_split(&dir, "o", &other, 2);
    std::fs::copy(&o[1], &a[1]).unwrap(); // holds token_embd.weight again
    let e = open_err(&a[0]);
    assert!(matches!(e, GgufError::DuplicateTensor { .. }), "{e}");
    restore(1);

    // Different total tensor count.
    let mut six = sample_writer(Metadata::new());
    six.add_tensor("extra", &[4], GgmlType::F32, vec![0; 16])
        .unwrap();
    let s = write_split(&dir, "s", &six, 2);
    std::fs::copy(&s[2], &a[2]).unwrap();
    let e = open_err(&a[0]);
    assert!(matches!(e, GgufError::ShardMismatch { .. }), "{e}");
    assert!(e.to_string().contains("split.tensors.count"), "{e}");
    restore(2);

    // Opening a later shard points to the first one.
    let e = open_err(&a[1]);
    assert!(matches!(e, GgufError::ShardMismatch { .. }), "{e}");
    assert!(e.to_string().contains("00001-of-00003"), "{e}");

    // A renamed first shard cannot find its siblings.
    let renamed = dir.join("renamed.gguf");
    std::fs::copy(&a[0], &renamed).unwrap();
    let e = open_err(&renamed);
    assert!(e.to_string().contains("file name"), "{e}");

    assert!(Model::open(&a[0]).is_ok());
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let dir = tmp_dir("no_file");
    let p = dir.join("nope.gguf");
    let e = open_err(&p);
    assert!(matches!(e, GgufError::Io { .. }));
    assert!(e.to_string().contains("nope.gguf"), "{e}");
}
