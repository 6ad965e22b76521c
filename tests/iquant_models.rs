//! DRAFT — NEEDS THE LOW-BIT FORMATS: every test here is `#[ignore]`d until
//! longhaul loads and runs IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
//! IQ3_S and NVFP4 (and, for the SmolLM2 re-quants, IQ4_NL, Q4_0 and Q2_K,
//! which llama-quantize picks for the rows it cannot give an i-quant).
//! Remove the `ignore` attributes when the kernels land.
//!
//! Two kinds of reference, both from tools/make-iq-fixtures.sh (stages of
//! tools/make_fixtures.py; see tools/README.md):
//! - `iqmoe-<fmt>.gguf`: a tiny random qwen3moe (hidden 256, expert FFN 256,
//!   2 layers, 4 experts top-2) whose routed experts (`ffn_{gate,up,down}_exps`)
//!   are in `<fmt>`, attention Q4_K/Q6_K, token_embd/output Q8_0, quantised
//!   with an importance matrix. Goldens: llama.cpp at its exact path
//!   (`iqmoe-<fmt>.json`: `-fa off`, F32 cache) and at its defaults
//!   (`iqmoe-<fmt>.default.json`: flash attention auto, F16 cache). Same
//!   schema and tolerance as the q4_k_m files in tests/families.rs: logits
//!   NMSE <= 1e-4 at every prompt position; greedy ids compared up to the
//!   first step whose top1-top2 gap (the golden's `greedy_gaps`) is below
//!   GAP_TOL (after that either branch is legitimate).
//! - SmolLM2-135M-Instruct Q4_1 re-quantised to IQ2_XXS, IQ3_XXS and IQ1_M
//!   (files in $LONGHAUL_MODELS, written by the `smollm2-iq` stage, not
//!   fetched): 64 greedy tokens for three prompts, like tests/smollm2.rs, at
//!   the exact path (`smollm2-<fmt>-greedy.json`) and the defaults
//!   (`smollm2-<fmt>-greedy-default.json`). llama.cpp's goldens never repack
//!   weights (llama_logits.cpp); its `llama-completion` does by default, and
//!   on x86 the repacked Q4_0/IQ4_NL kernels round differently, so the
//!   golden texts equal `llama-completion --no-repack` (recorded in each
//!   default golden's `llama_completion_check`).

mod common;

use common::*;
use longhaul::backend::cpu::CpuBackend;
use longhaul::engine::FlashAttn;
use longhaul::model::{Logits, Model};
use longhaul::state::SeqState;
use longhaul::tensor::GgmlType;
use longhaul::tokenizer::Tokenizer;

/// The expert formats of the iqmoe fixtures (file stems).
const IQ_FORMATS: [&str; 8] = [
    "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "nvfp4",
];

/// The SmolLM2 re-quants.
const SMOL_FORMATS: [&str; 3] = ["iq2_xxs", "iq3_xxs", "iq1_m"];

/// Greedy ids are compared only before the first decision closer than this.
const GAP_TOL: f64 = 1e-2;

#[derive(Clone, Copy)]
struct Settings {
    flash_attn: bool,
    kv: GgmlType,
    n_ctx: usize,
}

const EXACT: Settings = Settings {
    flash_attn: false,
    kv: GgmlType::F32,
    n_ctx: 0,
};

/// llama_logits.cpp's default run: `--fa auto --kv f16`, a 256-cell context.
const DEFAULT: Settings = Settings {
    flash_attn: true,
    kv: GgmlType::F16,
    n_ctx: 256,
};

fn logits_with(m: &Model<CpuBackend>, tokens: &[u32], s: Settings) -> Vec<f32> {
    let mut kv = SeqState::new(m, s.n_ctx.max(tokens.len() + 64), s.kv).expect("kv");
    kv.eval(m, tokens, Logits::All).expect("forward")
}

fn greedy_with(m: &Model<CpuBackend>, prompt: &[u32], n: usize, s: Settings) -> Vec<u32> {
    let mut kv = SeqState::new(m, s.n_ctx.max(prompt.len() + n + 1), s.kv).expect("kv");
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

/// How many leading greedy steps are decided by more than GAP_TOL.
fn robust_prefix(gaps: &serde_json::Value) -> usize {
    let gaps = floats(gaps);
    gaps.iter()
        .position(|&g| (g as f64) < GAP_TOL)
        .unwrap_or(gaps.len())
}

fn check_iqmoe(fmt: &str, golden_file: &str, s: Settings) -> Vec<String> {
    let mut fails = Vec::new();
    let g = golden(golden_file);
    assert_eq!(
        g["settings"]["type_kv"],
        if s.kv == GgmlType::F16 { "f16" } else { "f32" }
    );
    let mut m = load(&fixture(&format!("iqmoe-{fmt}.gguf")));
    m.flash_attn = s.flash_attn;
    for (i, p) in g["prompts"].as_array().expect("prompts").iter().enumerate() {
        let tokens = ids(&p["tokens"]);
        let e = nmse(&logits_with(&m, &tokens, s), &floats(&p["logits"]));
        eprintln!("{golden_file} prompt {i}: nmse {e:.3e}");
        if e.is_nan() || e > 1e-4 {
            fails.push(format!("{golden_file} prompt {i}: nmse {e:.3e} > 1e-4"));
        }
        let want = ids(&p["greedy"]);
        let n = robust_prefix(&p["greedy_gaps"]);
        let got = greedy_with(&m, &tokens, want.len(), s);
        if got[..n] != want[..n] {
            fails.push(format!(
                "{golden_file} prompt {i}: greedy differs within the first {n} (robust) steps:\n  ours   {got:?}\n  theirs {want:?}"
            ));
        }
    }
    fails
}

#[test]
#[ignore = "needs the IQ1_S/IQ1_M/IQ2_XXS/IQ2_XS/IQ2_S/IQ3_XXS/IQ3_S/NVFP4 kernels"]
fn iqmoe_every_format_matches_llamacpp_at_the_exact_path() {
    let fails: Vec<_> = IQ_FORMATS
        .iter()
        .flat_map(|f| check_iqmoe(f, &format!("iqmoe-{f}.json"), EXACT))
        .collect();
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

#[test]
#[ignore = "needs the IQ1_S/IQ1_M/IQ2_XXS/IQ2_XS/IQ2_S/IQ3_XXS/IQ3_S/NVFP4 kernels"]
fn iqmoe_every_format_matches_llamacpp_at_its_default_settings() {
    let fails: Vec<_> = IQ_FORMATS
        .iter()
        .flat_map(|f| check_iqmoe(f, &format!("iqmoe-{f}.default.json"), DEFAULT))
        .collect();
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// A SmolLM2 re-quant written by tools/make-iq-fixtures.sh, checked against
/// the size its goldens record (a different llama.cpp would quantise
/// differently).
fn smol_model(fmt: &str, g: &serde_json::Value) -> std::path::PathBuf {
    let name = format!("smollm2-135m-instruct-{fmt}.gguf");
    let p = models_dir().join(&name);
    assert!(
        p.exists(),
        "{} is missing: run tools/make-iq-fixtures.sh smollm2-iq (after tools/fetch-models.sh)",
        p.display()
    );
    assert_eq!(g["model"], name.as_str());
    let size = std::fs::metadata(&p).expect("stat").len();
    assert_eq!(
        Some(size),
        g["model_bytes"].as_u64(),
        "{name} is not the file the goldens were made from (model_sha256 {})",
        g["model_sha256"]
    );
    p
}

fn check_smol_greedy(
    fmt: &str,
    golden_file: &str,
    fa: FlashAttn,
    kv_type: GgmlType,
) -> Vec<String> {
    let g = golden(golden_file);
    assert_eq!(
        g["settings"]["type_kv"],
        if kv_type == GgmlType::F16 {
            "f16"
        } else {
            "f32"
        }
    );
    let mut m = load(&smol_model(fmt, &g));
    m.flash_attn = fa != FlashAttn::Off;
    let tok = Tokenizer::from_metadata(m.file.metadata()).expect("tokenizer");
    let mut fails = Vec::new();
    for p in g["prompts"].as_array().expect("prompts") {
        let text = p["text"].as_str().expect("text");
        let tokens = ids(&p["tokens"]);
        assert_eq!(
            tok.encode(text, true, false).expect("encode"),
            tokens,
            "{text:?}"
        );
        let want = ids(&p["greedy"]);
        assert_eq!(want.len(), 64);
        let got = greedy(&m, &tokens, want.len(), kv_type);
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            fails.push(format!(
                "{golden_file} {text:?}: first difference at token {at} (golden gap there {})\n  ours   {got:?}\n  theirs {want:?}",
                p["greedy_gaps"][at]
            ));
        }
        let all = prompt_logits(&m, &tokens);
        let last = &all[all.len() - m.hp.n_vocab..];
        if kv_type == GgmlType::F32 {
            let e = nmse(last, &floats(&p["last_logits"]));
            if e.is_nan() || e > 1e-4 {
                fails.push(format!(
                    "{golden_file} {text:?}: last-row nmse {e:.3e} > 1e-4"
                ));
            }
        }
    }
    fails
}

#[test]
#[ignore = "needs the IQ2_XXS/IQ3_XXS/IQ1_M (+ IQ4_NL, Q2_K) kernels and tools/make-iq-fixtures.sh smollm2-iq"]
fn smollm2_requants_greedy_64_equal_llamacpp_at_the_exact_path() {
    let fails: Vec<_> = SMOL_FORMATS
        .iter()
        .flat_map(|f| {
            check_smol_greedy(
                f,
                &format!("smollm2-{f}-greedy.json"),
                FlashAttn::Off,
                GgmlType::F32,
            )
        })
        .collect();
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

#[test]
#[ignore = "needs the IQ2_XXS/IQ3_XXS/IQ1_M (+ IQ4_NL, Q2_K) kernels and tools/make-iq-fixtures.sh smollm2-iq"]
fn smollm2_requants_greedy_64_equal_llamacpp_defaults() {
    let d = longhaul::engine::EngineParams::default();
    let fails: Vec<_> = SMOL_FORMATS
        .iter()
        .flat_map(|f| {
            check_smol_greedy(
                f,
                &format!("smollm2-{f}-greedy-default.json"),
                d.flash_attn,
                d.kv_type,
            )
        })
        .collect();
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}
