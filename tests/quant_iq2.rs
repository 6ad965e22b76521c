//! IQ2_XXS, IQ2_XS and IQ2_S dot products against ggml's own
//! `ggml_vec_dot_iq2_*_q8_K`, called through ctypes on a native x86 build of
//! libggml-cpu.so (goldens tests/goldens/quant/dot_<type>.json: weight
//! bytes, Q8_K activation bytes from ggml's `quantize_row_q8_K`, and ggml's
//! f32 result).
//!
//! ggml's x86 build runs its AVX2 kernel for these types on AVX2 and
//! AVX-512 CPUs alike, so ours must give the same bits. The scalar
//! reference (ggml's `_generic` order: one serial float sum over blocks)
//! may differ by float rounding only: within 1e-5 of `sum |w_i a_i|`.

use longhaul::quant::{ops_with_caps, scalar_ops, CpuCaps};
use longhaul::tensor::GgmlType;
use std::path::PathBuf;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn dot_golden(ty: GgmlType) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/goldens/quant")
        .join(format!("dot_{}.json", ty.name().to_lowercase()));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// `sum |w_i a_i|` of the dequantised weights and Q8_K activations.
fn magnitude(ty: GgmlType, w: &[u8], act: &[u8], n: usize) -> f64 {
    let mut wf = vec![f32::NAN; n];
    scalar_ops(ty).unwrap().dequantize(w, &mut wf).unwrap();
    let af = act.chunks_exact(292).flat_map(|b| {
        let d = f32::from_le_bytes(b[..4].try_into().unwrap());
        b[4..260].iter().map(move |&q| q as i8 as f32 * d)
    });
    wf.iter()
        .zip(af)
        .map(|(w, a)| (*w as f64 * a as f64).abs())
        .sum()
}

const TYPES: [GgmlType; 3] = [GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S];

#[test]
fn iq2_dots_match_ggml() {
    let best = CpuCaps::detect();
    let avx2_only = CpuCaps {
        avx512: false,
        ..best
    };
    for ty in TYPES {
        let slow = scalar_ops(ty).unwrap();
        for case in dot_golden(ty)["cases"].as_array().unwrap() {
            let n = case["n"].as_u64().unwrap() as usize;
            let w = unhex(case["w"].as_str().unwrap());
            let act = unhex(case["act"].as_str().unwrap());
            let want = f32::from_le_bytes(unhex(case["dot"].as_str().unwrap()).try_into().unwrap());
            if best.has_avx2() {
                for caps in [best, avx2_only] {
                    let fast = ops_with_caps(ty, caps).unwrap();
                    assert_eq!(fast.kernel_name(), "avx2", "{ty}");
                    let got = fast.vec_dot(n, &w, &act).unwrap();
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{ty} n={n}: {got} vs ggml {want}"
                    );
                }
            }
            let s = slow.vec_dot(n, &w, &act).unwrap();
            let mag = magnitude(ty, &w, &act, n);
            assert!(
                (s as f64 - want as f64).abs() <= 1e-5 * mag,
                "{ty} scalar n={n}: {s} vs ggml {want} (mag {mag})"
            );
        }
    }
}
