//! Shared helpers for integration tests: fixture paths, golden files, metrics.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use longhaul::backend::cpu::CpuBackend;
use longhaul::gguf;
use longhaul::model::{Logits, Model};
use longhaul::state::SeqState;
use longhaul::tensor::GgmlType;

/// This process's resident memory in bytes (`VmRSS`).
pub fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("status");
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kb * 1024
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fixture stems of the families added in issue 12 (olmoe, glm4moe,
/// deepseek2 in three variants, laguna with both gates).
/// The hybrid families of issue 13 (gated DeltaNet + gated attention).
/// The expert formats of the iqmoe fixtures (issue 14): `iqmoe-<stem>.gguf`;
/// "mix" has each layer's experts in other types (layer 0 gate/up IQ2_XXS,
/// down IQ3_S; layer 1 gate/up IQ1_M, down NVFP4).
pub const LOW_BIT_STEMS: [&str; 9] = [
    "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "nvfp4", "mix",
];

pub const HYBRID_FAMILIES: [&str; 2] = ["qwen3next", "qwen35moe"];

pub const NEW_FAMILIES: [&str; 7] = [
    "olmoe",
    "glm4moe",
    "deepseek2",
    "deepseek3",
    "deepseek3-lite",
    "laguna-head",
    "laguna-elem",
];

pub fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures").join(name)
}

pub fn golden(name: &str) -> serde_json::Value {
    let p = root().join("tests/goldens").join(name);
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Directory of the real models fetched by tools/fetch-models.sh.
pub fn models_dir() -> PathBuf {
    std::env::var_os("LONGHAUL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/longhaul/models")
        })
}

/// A real model, or a failure telling how to get it (CI fetches them).
pub fn real_model(name: &str) -> PathBuf {
    let p = models_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-models.sh (CI does) or set LONGHAUL_MODELS",
        p.display()
    );
    p
}

pub fn load(path: &std::path::Path) -> Model<CpuBackend> {
    let file = gguf::Model::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Model::load(CpuBackend::new(), Arc::new(file))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .flat_map(|x| match x.as_array() {
            Some(row) => row
                .iter()
                .map(|y| y.as_f64().expect("float") as f32)
                .collect::<Vec<_>>(),
            None => vec![x.as_f64().expect("float") as f32],
        })
        .collect()
}

/// Normalised mean squared error, as ggml's test-backend-ops defines it:
/// sum((a - b)^2) / sum(b^2) with `b` the reference.
pub fn nmse(a: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(a.len(), reference.len());
    let num: f64 = a
        .iter()
        .zip(reference)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum();
    let den: f64 = reference.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den
}

/// Logits of every prompt position, F32 KV cache (the reference settings).
pub fn prompt_logits(m: &Model<CpuBackend>, tokens: &[u32]) -> Vec<f32> {
    let mut kv = SeqState::new(m, tokens.len() + 64, GgmlType::F32).expect("kv");
    kv.eval(m, tokens, Logits::All).expect("forward")
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding as the reference tool does it: the prompt in one batch,
/// then one token at a time, argmax of raw logits (lowest id on ties), no stop.
pub fn greedy(m: &Model<CpuBackend>, prompt: &[u32], n: usize, kv_type: GgmlType) -> Vec<u32> {
    let mut kv = SeqState::new(m, prompt.len() + n + 1, kv_type).expect("kv");
    let mut logits = kv.eval(m, prompt, Logits::Last).expect("forward");
    let mut out = Vec::new();
    for i in 0..n {
        let t = argmax(&logits);
        out.push(t);
        if i + 1 < n {
            logits = kv.eval(m, &[t], Logits::Last).expect("forward");
        }
    }
    out
}

/// A fresh, empty directory for one test of test binary `binary`.
pub fn tmp_dir(binary: &str, test: &str) -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(binary)
        .join(format!("{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// xorshift64*: deterministic test randomness with no dependency.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}
