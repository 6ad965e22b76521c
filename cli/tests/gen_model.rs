//! `longhaul gen-model`: the same seed writes the same bytes, `--router-skew 0`
//! writes today's files, a skewed router concentrates a traced run's routing
//! on a few experts per layer, and the gpt-oss layout loads and runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use longhaul::gguf;
use longhaul::synth::{self, SynthSpec};
use longhaul::tensor::GgmlType;

fn longhaul(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .args(args)
        .output()
        .expect("spawn longhaul")
}

fn ok(args: &[&str]) -> Output {
    let out = longhaul(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("longhaul-gen-model-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Writes the tiny preset with extra `gen-model` flags and returns its bytes.
fn tiny(dir: &Path, name: &str, flags: &[&str]) -> Vec<u8> {
    let path = dir.join(name);
    let mut args = vec!["gen-model", "--preset", "tiny", "-o", s(&path)];
    args.extend_from_slice(flags);
    ok(&args);
    std::fs::read(&path).expect("read model")
}

fn router_skew_key(path: &Path) -> Option<f32> {
    let m = gguf::Model::open(path).expect("open model");
    m.metadata()
        .opt("longhaul.synth.router_skew", gguf::Metadata::get_f32)
        .expect("router skew key type")
}

/// 400 printable ASCII bytes from a fixed LCG: with the byte-level synthetic
/// vocabulary, a prompt of many distinct tokens, so that the input itself
/// favours few experts.
fn varied_prompt() -> String {
    let mut x = 5u64;
    (0..400)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            char::from(33 + ((x >> 33) % 94) as u8)
        })
        .collect()
}

/// Share of each MoE layer's selections that went to its most chosen
/// `n_expert / 10` experts (rounded, at least one), from a
/// `--trace-experts` file.
fn top_tenth_shares(trace: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(trace).expect("read trace");
    let mut lines = text.lines();
    let head: serde_json::Value =
        serde_json::from_str(lines.next().expect("trace header")).expect("header JSON");
    let n_expert = head["n_expert"].as_u64().expect("n_expert") as usize;
    let n_layer = head["n_layer"].as_u64().expect("n_layer") as usize;
    let mut counts = vec![vec![0u64; n_expert]; n_layer];
    for line in lines {
        let rec: serde_json::Value = serde_json::from_str(line).expect("record JSON");
        let layer = rec["layer"].as_u64().expect("layer") as usize;
        for row in rec["ids"].as_array().expect("ids") {
            for id in row.as_array().expect("row") {
                counts[layer][id.as_u64().expect("id") as usize] += 1;
            }
        }
    }
    let top = ((n_expert + 5) / 10).max(1);
    counts
        .into_iter()
        .map(|mut c| {
            let total: u64 = c.iter().sum();
            c.sort_unstable_by(|a, b| b.cmp(a));
            c[..top].iter().sum::<u64>() as f64 / total.max(1) as f64
        })
        .collect()
}

#[test]
fn router_skew_zero_writes_the_default_bytes() {
    let dir = tmp("zero");
    let plain = tiny(&dir, "plain.gguf", &[]);
    let zero = tiny(&dir, "zero.gguf", &["--router-skew", "0"]);
    assert!(plain == zero, "--router-skew 0 changed the file");
    assert_eq!(router_skew_key(&dir.join("zero.gguf")), None);
    let e = longhaul(&[
        "gen-model",
        "--preset",
        "tiny",
        "-o",
        s(&dir.join("bad.gguf")),
        "--router-skew=-1",
    ]);
    assert!(!e.status.success());
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("router skew -1 must be"),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn same_seed_same_bytes() {
    let dir = tmp("seed");
    let flags = ["--seed", "9", "--router-skew", "1.5", "--type", "q8_0"];
    let a = tiny(&dir, "a.gguf", &flags);
    let b = tiny(&dir, "b.gguf", &flags);
    assert!(a == b, "the same seed wrote different files");
    assert_eq!(router_skew_key(&dir.join("a.gguf")), Some(1.5));
    let other = tiny(&dir, "c.gguf", &["--seed", "10", "--router-skew", "1.5"]);
    assert!(a != other, "another seed wrote the same file");
    // The skewed router is the only tensor that differs from the unskewed
    // model's (besides the metadata key).
    let plain = dir.join("plain.gguf");
    tiny(&dir, "plain.gguf", &["--seed", "9", "--type", "q8_0"]);
    let (m_a, m_p) = (
        gguf::Model::open(dir.join("a.gguf")).expect("open"),
        gguf::Model::open(&plain).expect("open"),
    );
    for t in m_p.tensors() {
        let ta = m_a.tensor(&t.name).expect("same tensors");
        let same = m_a.tensor_data(ta).expect("data") == m_p.tensor_data(t).expect("data");
        assert_eq!(same, !t.name.ends_with("ffn_gate_inp.weight"), "{}", t.name);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// On the tiny preset's shape with the demo's 64 experts (top-4; with 8
/// experts a tenth is less than one expert), a 400-token varied prompt routes
/// 1600 selections per layer. Uniform routing would give the top 6 experts
/// 6/64 = 0.094 of them; sorting finite counts inflates that. Measured over
/// seeds 1 to 15 (2 layers each): skew 0 gives 0.149 to 0.226 per layer,
/// skew 1 gives 0.358 to 0.470, at least 0.14 above skew 0's same layer.
/// The bounds below leave a margin of about 0.05 on each side.
#[test]
fn router_skew_concentrates_routing() {
    let dir = tmp("skew");
    let prompt = varied_prompt();
    let shares: Vec<Vec<f64>> = [0.0f32, 1.0]
        .iter()
        .map(|&skew| {
            let spec = SynthSpec {
                n_expert: 64,
                n_expert_used: 4,
                router_skew: skew,
                ..SynthSpec::tiny()
            };
            let model = dir.join(format!("skew{skew}.gguf"));
            synth::write(&spec, &model).expect("write model");
            let trace = dir.join(format!("skew{skew}.jsonl"));
            ok(&[
                "run",
                "-m",
                s(&model),
                "-p",
                &prompt,
                "-n",
                "1",
                "--temp",
                "0",
                "--trace-experts",
                s(&trace),
            ]);
            top_tenth_shares(&trace)
        })
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    let (flat, skewed) = (&shares[0], &shares[1]);
    assert_eq!(flat.len(), 2);
    for (il, (&f, &k)) in flat.iter().zip(skewed).enumerate() {
        assert!(f < 0.27, "layer {il}: skew 0 top-tenth share {f:.3}");
        assert!(k > 0.30, "layer {il}: skew 1 top-tenth share {k:.3}");
        assert!(k - f > 0.1, "layer {il}: skew 1 {k:.3} vs skew 0 {f:.3}");
    }
}

#[test]
fn gpt_oss_layout_loads_and_runs() {
    // The full preset's shapes are valid (no data is made until written).
    synth::build(&SynthSpec::gpt_oss_20b()).expect("gpt-oss-20b preset");
    synth::build(&SynthSpec::qwen3_30b_a3b()).expect("qwen3-30b-a3b preset");
    let dir = tmp("oss");
    let e = longhaul(&[
        "gen-model",
        "--preset",
        "gpt-oss-20b",
        "--type",
        "q4_K",
        "-o",
        s(&dir.join("never.gguf")),
    ]);
    let err = String::from_utf8_lossy(&e.stderr);
    assert!(
        !e.status.success() && err.contains("q8_0 and mxfp4"),
        "{err}"
    );
    // gpt-oss-20b's layout at the tiny preset's size.
    let spec = SynthSpec {
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_expert: 8,
        n_expert_used: 2,
        n_ff_exp: 256,
        n_swa: 4,
        router_skew: 1.0,
        ..SynthSpec::gpt_oss_20b()
    };
    assert_eq!(spec.expert_type, GgmlType::MXFP4);
    let model = dir.join("oss.gguf");
    synth::write(&spec, &model).expect("write gpt-oss");
    let info = ok(&["inspect", s(&model)]);
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.contains("gpt-oss") && info.contains("mxfp4"), "{info}");
    let trace = dir.join("oss.jsonl");
    let out = ok(&[
        "run",
        "-m",
        s(&model),
        "-p",
        "a window longer than four tokens",
        "-n",
        "4",
        "--temp",
        "0",
        "--trace-experts",
        s(&trace),
    ]);
    assert!(!out.stdout.is_empty());
    assert_eq!(top_tenth_shares(&trace).len(), 2);
    std::fs::remove_dir_all(&dir).ok();
}
