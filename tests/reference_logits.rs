//! Synthetic MoE models (tiny random HF transformers models converted by
//! llama.cpp's convert_hf_to_gguf.py, see tools/make_fixtures.py) against
//! reference logits: transformers for F32, llama.cpp for every file.
//!
//! Tolerances (issue 2): F32 vs transformers NMSE <= 1e-5; every file vs
//! llama.cpp (F32 KV cache, flash attention off) NMSE <= 1e-4; greedy 32
//! tokens equal llama.cpp's at F32 and F16.

mod common;

use common::*;
use longhaul::tensor::GgmlType;

const ARCHS: [&str; 4] = ["llama-moe", "qwen2moe", "qwen3moe", "gpt-oss"];

/// Checks every prompt; returns the failures instead of stopping at the first.
fn check_logits(stem: &str, golden_file: &str, tol: f64) -> Vec<String> {
    let mut fails = Vec::new();
    let g = golden(golden_file);
    let m = load(&fixture(&format!("{stem}.gguf")));
    for (i, p) in g["prompts"].as_array().expect("prompts").iter().enumerate() {
        let tokens = ids(&p["tokens"]);
        let ours = prompt_logits(&m, &tokens);
        let theirs = floats(&p["logits"]);
        let e = nmse(&ours, &theirs);
        eprintln!("{golden_file} prompt {i}: nmse {e:.3e}");
        if e.is_nan() || e > tol {
            fails.push(format!("{golden_file} prompt {i}: nmse {e:.3e} > {tol:e}"));
        }
    }
    fails
}

fn check_greedy(stem: &str, golden_file: &str) -> Vec<String> {
    let mut fails = Vec::new();
    let g = golden(golden_file);
    let m = load(&fixture(&format!("{stem}.gguf")));
    for (i, p) in g["prompts"].as_array().expect("prompts").iter().enumerate() {
        let want = ids(&p["greedy"]);
        let got = greedy(&m, &ids(&p["tokens"]), want.len(), GgmlType::F32);
        if got != want {
            fails.push(format!("{golden_file} prompt {i}: greedy tokens differ from llama.cpp:\n  ours   {got:?}\n  theirs {want:?}"));
        }
    }
    fails
}

fn assert_none(fails: Vec<String>) {
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

#[test]
fn f32_logits_match_transformers() {
    assert_none(
        ARCHS
            .iter()
            .flat_map(|a| check_logits(&format!("{a}-f32"), &format!("{a}-f32.json"), 1e-5))
            .collect(),
    );
}

#[test]
fn f32_and_f16_match_llamacpp_logits_and_greedy_tokens() {
    let mut fails = Vec::new();
    for a in ARCHS {
        fails.extend(check_logits(
            &format!("{a}-f32"),
            &format!("{a}-f32.llamacpp.json"),
            1e-5,
        ));
        fails.extend(check_greedy(
            &format!("{a}-f32"),
            &format!("{a}-f32.llamacpp.json"),
        ));
        fails.extend(check_logits(
            &format!("{a}-f16"),
            &format!("{a}-f16.json"),
            1e-4,
        ));
        fails.extend(check_greedy(&format!("{a}-f16"), &format!("{a}-f16.json")));
    }
    assert_none(fails);
}

#[test]
fn quantised_files_match_llamacpp_logits() {
    // The goldens run llama.cpp's default repack (tools/make_fixtures.py
    // QUANT_REPACK). Where longhaul has the interleaved kernels (AVX2) its
    // Q4_K, Q4_0 and MXFP4 products sum in ggml's repack order, and the
    // logits agree to NMSE ~1e-14 (measured on these files); 1e-10 leaves
    // margin and still catches the plain order, which is 6e-7 from the
    // repacked goldens on llama-moe and qwen2moe. Elsewhere: 1e-4.
    let interleaved = longhaul::quant::layout::interleaved(GgmlType::Q4_K).is_some();
    let tol = if interleaved { 1e-10 } else { 1e-4 };
    let mut fails = Vec::new();
    for a in ARCHS {
        for q in ["q8_0", "q4_k_m"] {
            fails.extend(check_logits(
                &format!("{a}-{q}"),
                &format!("{a}-{q}.json"),
                tol,
            ));
        }
    }
    fails.extend(check_logits("gpt-oss-mxfp4", "gpt-oss-mxfp4.json", tol));
    assert_none(fails);
}
