//! SmolLM2-135M-Instruct Q4_1 re-quantised by llama-quantize with an
//! importance matrix to IQ2_XXS, IQ3_XXS and IQ1_M (issue 14): its
//! 1536-wide `ffn_down` rows take the i-quant (3 layers fall back to Q2_K),
//! its 576-wide rows IQ4_NL or Q4_0, embeddings Q8_0. 64 greedy tokens for
//! three prompts equal llama.cpp's at the exact path (`-fa off`, F32 cache;
//! smollm2-<fmt>-greedy.json, plus the last prompt row within NMSE 1e-4) and
//! at its defaults (smollm2-<fmt>-greedy-default.json). Goldens from
//! tools/llama_logits.cpp at llama.cpp's default repack, as longhaul runs:
//! the 576-wide IQ4_NL / Q4_0 rows (and, on AVX-512, the Q2_K fallbacks) take
//! ggml's interleaved kernels' sums; `llama-completion` at its defaults
//! prints the default goldens' texts (their `llama_completion_check`). The
//! goldens come from an AVX-512 build, so on an AVX2-only CPU the Q2_K layers
//! of the IQ2_XXS and IQ1_M files sum in ggml's AVX2 order and may differ.
//!
//! Ignored in CI: the three files are made by `tools/make-iq-fixtures.sh
//! smollm2-iq` with a llama.cpp build (tools/build-llamacpp.sh), since
//! longhaul has no i-quant quantiser and no model hub is reachable. Run
//! them with `cargo test --test iquant_models -- --ignored`.

mod common;

use common::*;
use longhaul::engine::FlashAttn;
use longhaul::tensor::GgmlType;
use longhaul::tokenizer::Tokenizer;

/// The SmolLM2 re-quants.
const SMOL_FORMATS: [&str; 3] = ["iq2_xxs", "iq3_xxs", "iq1_m"];

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
#[ignore = "needs the files of tools/make-iq-fixtures.sh smollm2-iq (llama-quantize)"]
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
#[ignore = "needs the files of tools/make-iq-fixtures.sh smollm2-iq (llama-quantize)"]
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
