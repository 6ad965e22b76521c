//! `longhaul bench --survey`: a kernel survey. Every weight format of
//! [`longhaul::quant::SUPPORTED_TYPES`] with a CPU kernel is timed on the
//! routed-expert products of one model's shape (a GGUF's `ffn_*_exps`, a
//! `gen-model` preset, or Qwen3-30B-A3B's by default) through the backend's
//! `mul_mat_id` (the entry point the MoE block uses), at 1 token (the
//! mat-vec of decode) and at batches of tokens, on the CPU and on a GPU
//! when wgpu finds one. The formats are ranked by time per bit of weight
//! data: `time / (weights x bpw x tokens)` with `bpw = type_size * 8 /
//! block_size`. The ranking is written as a markdown table (stdout and
//! `--survey-out DIR/survey.md`) and a bar chart (`DIR/survey.svg`,
//! [`crate::survey_svg`]); `--llamacpp FILE` adds ggml's CPU times for the
//! same shapes (from `tools/survey-llamacpp.sh`) as a ratio column.
//!
//! This file holds the flags, the shapes and the timing loop; the pure
//! parts (ranking, tables, the llama.cpp lines) are in
//! [`crate::survey_table`].

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use longhaul::backend::{Backend, BackendError};
use longhaul::gguf;
use longhaul::quant::{self, SUPPORTED_TYPES};
use longhaul::synth::SynthSpec;
use longhaul::tensor::GgmlType;

use crate::survey_table::{self, Measured, Shape};

/// The survey's flags (on `longhaul bench`).
#[derive(Args, Debug, Default)]
pub struct SurveyArgs {
    /// Kernel survey instead of a model bench: times every weight format's
    /// routed-expert product (shape from -m, --preset, or Qwen3-30B-A3B's)
    /// and ranks the formats by time per bit.
    #[arg(long = "survey")]
    pub survey: bool,
    /// Survey: take the expert shape from this `gen-model` preset.
    #[arg(long = "preset", value_name = "NAME", requires = "survey")]
    pub preset: Option<String>,
    /// Survey: token counts of the products (comma-separated; 1 is the mat-vec).
    #[arg(
        long = "survey-tokens",
        value_name = "N",
        default_value = "1,8,32,512",
        value_delimiter = ','
    )]
    pub tokens: Vec<usize>,
    /// Survey: the token count whose time per bit ranks the formats
    /// (default: the first of --survey-tokens).
    #[arg(long = "survey-rank", value_name = "N")]
    pub rank_by: Option<usize>,
    /// Survey: only these types (comma-separated ggml names, e.g. q4_k,q8_0).
    #[arg(long = "survey-types", value_name = "TYPES", value_delimiter = ',')]
    pub types: Vec<String>,
    /// Survey: experts per weight; call j reads expert j mod N, so N > 1
    /// streams weights that do not stay in the CPU's caches.
    #[arg(long = "survey-experts", value_name = "N", default_value_t = 1)]
    pub experts: usize,
    /// Survey: each repetition repeats the product for at least this many
    /// milliseconds and reports the time of one.
    #[arg(long = "survey-min-ms", value_name = "MS", default_value_t = 20.0)]
    pub min_ms: f64,
    /// Survey: write survey.md and survey.svg into this folder.
    #[arg(long = "survey-out", value_name = "DIR", requires = "survey")]
    pub out: Option<PathBuf>,
    /// Survey: llama.cpp's times for the same shapes (the output of
    /// tools/survey-llamacpp.sh), shown as longhaul/ggml ratios.
    #[arg(long = "llamacpp", value_name = "FILE", requires = "survey")]
    pub llamacpp: Option<PathBuf>,
}

/// Most bytes of weights one survey case may allocate.
const MAX_WEIGHT_BYTES: u64 = 8 << 30;

/// The routed experts' shapes of a GGUF: `ffn_gate_exps` (or `ffn_up_exps`)
/// and `ffn_down_exps`, per expert (`[ne0, ne1]` of the first layer that
/// has them).
pub(crate) fn shapes_from_gguf(path: &Path) -> anyhow::Result<Vec<Shape>> {
    let model = gguf::Model::open(path).with_context(|| format!("reading {}", path.display()))?;
    let find = |suffix: &str| {
        model
            .tensors()
            .iter()
            .find(|t| t.name.ends_with(suffix) && t.dims.len() >= 2)
            .map(|t| (t.dims[0] as usize, t.dims[1] as usize))
    };
    let mut shapes = Vec::new();
    if let Some((k, n)) = find("ffn_gate_exps.weight").or_else(|| find("ffn_up_exps.weight")) {
        shapes.push(Shape::new("gate/up", k, n));
    }
    if let Some((k, n)) = find("ffn_down_exps.weight") {
        shapes.push(Shape::new("down", k, n));
    }
    if shapes.is_empty() {
        anyhow::bail!(
            "{} has no routed-expert tensors (ffn_gate_exps / ffn_up_exps / ffn_down_exps); give a MoE model, or --preset NAME",
            path.display()
        );
    }
    Ok(shapes)
}

/// The expert shapes of a `gen-model` preset.
pub(crate) fn shapes_from_preset(name: &str) -> anyhow::Result<Vec<Shape>> {
    let s = SynthSpec::preset(name).ok_or_else(|| {
        anyhow::anyhow!(
            "--preset {name}: unknown preset; use one of {}",
            longhaul::synth::PRESETS.join(", ")
        )
    })?;
    Ok(vec![
        Shape::new("gate/up", s.n_embd, s.n_ff_exp),
        Shape::new("down", s.n_ff_exp, s.n_embd),
    ])
}

/// SplitMix64: reproducible random weights and activations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly normal (sum of four uniforms), enough for weights.
    fn normal(&mut self) -> f32 {
        ((0..4).map(|_| self.uniform()).sum::<f32>() - 2.0) * 1.7
    }
}

/// Random blocks of `ty` with sane scales, for types without a quantiser:
/// random bytes, with every scale field set to a small positive value (the
/// layouts of ggml-common.h; as tests/quant_formats.rs fills them).
fn random_blocks(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let ts = ty.type_size();
    let mut bytes: Vec<u8> = (0..n / ty.block_size() * ts)
        .map(|_| rng.next() as u8)
        .collect();
    let name = ty.name().to_ascii_uppercase();
    let f16_at: &[usize] = match name.as_str() {
        "Q4_0" | "Q5_0" | "Q8_0" | "IQ4_NL" | "IQ4_XS" | "IQ1_S" | "IQ2_XXS" | "IQ2_XS"
        | "IQ2_S" | "IQ3_XXS" | "IQ3_S" => &[0],
        "Q4_1" | "Q5_1" | "Q4_K" | "Q5_K" => &[0, 2],
        "Q2_K" => &[80, 82],
        "Q3_K" => &[108],
        "Q6_K" => &[208],
        _ => &[],
    };
    for block in bytes.chunks_exact_mut(ts) {
        let d = half::f16::from_f32(0.001 + 0.05 * rng.uniform());
        for &off in f16_at {
            block[off..off + 2].copy_from_slice(&d.to_le_bytes());
        }
        match name.as_str() {
            // E8M0 exponent near 2^-6.
            "MXFP4" => block[0] = 115 + (rng.next() % 10) as u8,
            // Four UE4M3 sub-block scales in [2^-4, 2^-1).
            "NVFP4" => block[..4]
                .iter_mut()
                .for_each(|b| *b = 0x18 + (rng.next() % 24) as u8),
            // IQ1_M: the f16 super-scale is the top nibbles of scales[0..8].
            "IQ1_M" => {
                let d = d.to_bits();
                for i in 0..4 {
                    let hi = &mut block[48 + 2 * i + 1];
                    *hi = (*hi & 0x0f) | ((((d >> (4 * i)) & 0xf) as u8) << 4);
                }
            }
            _ => {}
        }
    }
    bytes
}

/// A weight of `n_exp` experts of `[k, n]` of `ty`: quantised from random
/// values when the type has a quantiser, else random blocks. `None` (with
/// the reason) when the rows are not whole blocks.
fn weight_bytes(ty: GgmlType, shape: &Shape, n_exp: usize, seed: u64) -> Result<Vec<u8>, String> {
    if ty.row_bytes(shape.k as u64).is_none() {
        return Err(format!(
            "rows of {} are not whole blocks of {}",
            shape.k,
            ty.block_size()
        ));
    }
    let mut rng = Rng(seed ^ ty as u64);
    let per_expert = shape.k * shape.n;
    let mut out = Vec::new();
    for _ in 0..n_exp {
        let x: Vec<f32> = (0..per_expert).map(|_| rng.normal()).collect();
        match quant::quantize_row(ty, &x) {
            Ok(b) => out.extend(b),
            Err(quant::QuantError::Unsupported { .. }) => {
                out.extend(random_blocks(ty, per_expert, &mut rng))
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let mut check = vec![0f32; shape.k];
    let rb = ty.row_bytes(shape.k as u64).unwrap_or(0) as usize;
    quant::dequantize_row(ty, &out[..rb], &mut check).map_err(|e| e.to_string())?;
    if check.iter().any(|v| !v.is_finite()) {
        eprintln!("survey: {ty}: random blocks dequantise to non-finite values (scale layout unknown to the survey); timing them anyway");
    }
    Ok(out)
}

/// Where the cases run.
pub(crate) struct Placement<'a, B: Backend> {
    pub(crate) backend: &'a B,
    /// `CPU` or the adapter's name and API.
    pub(crate) name: String,
    /// CPU thread count; `None` on the GPU.
    pub(crate) threads: Option<usize>,
}

/// One product (upload, warm-up, timed repetitions) for every token count;
/// the per-call nanoseconds of each repetition, or why the case was skipped.
struct Case<'a> {
    ty: GgmlType,
    shape: &'a Shape,
    bytes: &'a [u8],
    n_exp: usize,
    /// Give the weight the backend's kernel layout (`--repack`, default 1).
    repack: bool,
}

impl Case<'_> {
    /// Whether the CPU product runs on the interleaved layout.
    fn interleaved(&self) -> bool {
        self.repack && quant::layout::interleaves(self.ty, self.shape.n)
    }
}

fn run_case<B: Backend>(
    p: &Placement<B>,
    c: &Case,
    tokens: &[usize],
    reps: usize,
    min_ns: f64,
) -> Result<Vec<Vec<f64>>, BackendError> {
    let be = p.backend;
    let (k, n) = (c.shape.k, c.shape.n);
    let info = gguf::TensorInfo {
        name: "survey.ffn_exps.weight".into(),
        dims: vec![k as u64, n as u64, c.n_exp as u64],
        ty: c.ty,
        shard: 0,
        offset: 0,
        len: c.bytes.len() as u64,
    };
    let w = if c.repack {
        be.repacked_weight(&info, c.bytes.to_vec())?
    } else {
        be.weight_from_bytes(&info, c.bytes.to_vec())?
    };
    let mut rng = Rng(0x5eed ^ k as u64);
    let mut out = Vec::new();
    for &t in tokens {
        let x = be.from_host((0..t * k).map(|_| rng.normal()).collect(), t, k)?;
        let ids: Vec<Vec<u32>> = (0..c.n_exp).map(|e| vec![e as u32; t]).collect();
        let mut call = 0usize;
        let mut once = || -> Result<(), BackendError> {
            let y = be.mul_mat_id(&w, &x, &ids[call % c.n_exp], 1)?;
            call += 1;
            be.take_host(y).map(drop)
        };
        once()?; // warm-up (pipelines, first touch)
        let t0 = Instant::now();
        once()?;
        let first = t0.elapsed().as_nanos().max(1) as f64;
        let iters = (min_ns / first).ceil().clamp(1.0, 100_000.0) as usize;
        let mut samples = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t0 = Instant::now();
            for _ in 0..iters {
                once()?;
            }
            samples.push(t0.elapsed().as_nanos() as f64 / iters as f64);
        }
        out.push(samples);
    }
    Ok(out)
}

/// The types to survey: those of SUPPORTED_TYPES with a CPU kernel, or the
/// ones `--survey-types` names.
pub(crate) fn survey_types(names: &[String]) -> anyhow::Result<Vec<GgmlType>> {
    let with_kernel: Vec<GgmlType> = SUPPORTED_TYPES
        .iter()
        .copied()
        .filter(|&t| quant::ops(t).is_ok())
        .collect();
    if names.is_empty() {
        return Ok(with_kernel);
    }
    names
        .iter()
        .map(|s| {
            GgmlType::from_name(s.trim())
                .filter(|t| with_kernel.contains(t))
                .ok_or_else(|| {
                    let list: Vec<&str> = with_kernel.iter().map(|t| t.name()).collect();
                    anyhow::anyhow!(
                        "--survey-types {s}: not a type with a CPU kernel here; use some of {}",
                        list.join(", ")
                    )
                })
        })
        .collect()
}

/// Shared settings of every case.
pub(crate) struct Plan {
    pub(crate) shapes: Vec<Shape>,
    pub(crate) types: Vec<GgmlType>,
    pub(crate) tokens: Vec<usize>,
    pub(crate) reps: usize,
    pub(crate) n_exp: usize,
    pub(crate) min_ns: f64,
    /// CPU weights in the interleaved layout where one exists (`--repack`).
    pub(crate) repack: bool,
}

/// Times every (shape, type) on the placements; weight bytes are made once
/// per (shape, type) and shared by the placements.
pub(crate) fn measure(
    plan: &Plan,
    cpu: &[Placement<longhaul::backend::cpu::CpuBackend>],
    gpu: Option<&Placement<longhaul::backend::gpu::GpuBackend>>,
) -> anyhow::Result<Vec<Measured>> {
    let mut out = Vec::new();
    for (si, shape) in plan.shapes.iter().enumerate() {
        for &ty in &plan.types {
            let need = ty
                .row_bytes(shape.k as u64)
                .map(|rb| rb * shape.n as u64 * plan.n_exp as u64);
            if need.is_some_and(|b| b > MAX_WEIGHT_BYTES) {
                anyhow::bail!(
                    "--survey-experts {}: {ty} experts of {}x{} need {} MiB, over the survey's {} MiB; give fewer experts",
                    plan.n_exp, shape.k, shape.n,
                    need.unwrap_or(0) >> 20,
                    MAX_WEIGHT_BYTES >> 20
                );
            }
            let bytes = match weight_bytes(ty, shape, plan.n_exp, 0x5u64 << 32 | si as u64) {
                Ok(b) => b,
                Err(why) => {
                    eprintln!("survey: {} {ty}: skipped ({why})", shape.label);
                    continue;
                }
            };
            let case = Case {
                ty,
                shape,
                bytes: &bytes,
                n_exp: plan.n_exp,
                repack: plan.repack,
            };
            let min_ns = plan.min_ns;
            for p in cpu {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(p.threads.unwrap_or(1).max(1))
                    .build()?;
                let r = pool.install(|| run_case(p, &case, &plan.tokens, plan.reps, min_ns));
                push(&mut out, p, si, &case, &plan.tokens, r);
            }
            if let Some(p) = gpu {
                let r = run_case(p, &case, &plan.tokens, plan.reps, min_ns);
                push(&mut out, p, si, &case, &plan.tokens, r);
            }
        }
    }
    Ok(out)
}

fn push<B: Backend>(
    out: &mut Vec<Measured>,
    p: &Placement<B>,
    shape: usize,
    c: &Case,
    tokens: &[usize],
    r: Result<Vec<Vec<f64>>, BackendError>,
) {
    match r {
        Ok(per_tok) => {
            let kernel = match p.threads {
                // "+r8": the interleaved 8-row layout (quant::layout).
                Some(_) if c.interleaved() => {
                    format!(
                        "{}+r8",
                        quant::ops(c.ty).map(|o| o.kernel_name()).unwrap_or("-")
                    )
                }
                Some(_) => quant::ops(c.ty)
                    .map(|o| o.kernel_name())
                    .unwrap_or("-")
                    .to_string(),
                None => "wgsl".to_string(),
            };
            eprintln!(
                "survey: {} {} {}: {}",
                p.name,
                c.shape.label,
                c.ty,
                tokens
                    .iter()
                    .zip(&per_tok)
                    .map(|(t, s)| format!("t{t} {:.1} us", crate::bench_out::mean_sd(s).0 / 1e3))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for (&n_tok, ns) in tokens.iter().zip(per_tok) {
                out.push(Measured {
                    placement: p.name.clone(),
                    threads: p.threads,
                    shape,
                    ty: c.ty,
                    kernel: kernel.clone(),
                    n_tok,
                    ns,
                });
            }
        }
        Err(e) => eprintln!(
            "survey: {} {} {}: skipped ({e})",
            p.name, c.shape.label, c.ty
        ),
    }
}

/// `longhaul bench --survey`.
pub(crate) fn survey(a: &crate::bench::BenchArgs) -> anyhow::Result<()> {
    let s = &a.survey;
    if a.reps == 0 {
        anyhow::bail!("-r 0: give at least one repetition");
    }
    if s.tokens.is_empty() || s.tokens.contains(&0) {
        anyhow::bail!("--survey-tokens: give positive token counts, e.g. 1,8,32,512");
    }
    if s.experts == 0 {
        anyhow::bail!("--survey-experts 0: give at least one expert");
    }
    if !(s.min_ms.is_finite() && s.min_ms >= 0.0) {
        anyhow::bail!("--survey-min-ms {}: give a non-negative number", s.min_ms);
    }
    if a.output != "md" {
        anyhow::bail!("-o {}: the survey writes markdown (md)", a.output);
    }
    let rank_by = s.rank_by.unwrap_or(s.tokens[0]);
    if !s.tokens.contains(&rank_by) {
        anyhow::bail!(
            "--survey-rank {rank_by}: rank by one of the --survey-tokens ({})",
            s.tokens
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    let (source, shapes) = match (&a.model, &s.preset) {
        (Some(_), Some(_)) => anyhow::bail!("give -m MODEL or --preset NAME, not both"),
        (Some(m), None) => (m.display().to_string(), shapes_from_gguf(m)?),
        (None, Some(p)) => (format!("preset {p}"), shapes_from_preset(p)?),
        (None, None) => (
            "preset qwen3-30b-a3b (default)".to_string(),
            shapes_from_preset("qwen3-30b-a3b")?,
        ),
    };
    let ggml = match &s.llamacpp {
        Some(f) => Some(survey_table::parse_ggml(
            &std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?,
        )?),
        None => None,
    };
    let threads: Vec<usize> = if a.threads.is_empty() {
        vec![longhaul::threads::available()]
    } else {
        a.threads
            .iter()
            .map(|&t| longhaul::threads::capped(Some(t)))
            .collect()
    };
    let cpu_backend = longhaul::backend::cpu::CpuBackend::new();
    let cpu: Vec<Placement<_>> = threads
        .iter()
        .map(|&t| Placement {
            backend: &cpu_backend,
            name: "CPU".into(),
            threads: Some(t),
        })
        .collect();
    let gpu_backend = open_gpu(a);
    let gpu = gpu_backend.as_ref().map(|g| Placement {
        backend: g,
        name: format!("{} ({})", g.adapter().name, g.adapter().backend),
        threads: None,
    });
    let plan = Plan {
        shapes,
        types: survey_types(&s.types)?,
        tokens: s.tokens.clone(),
        reps: a.reps,
        n_exp: s.experts,
        min_ns: s.min_ms * 1e6,
        repack: a.repacks()?,
    };
    eprintln!(
        "survey: {source}: {}; {} types, tokens {:?}, {} repetitions",
        plan.shapes
            .iter()
            .map(|s| format!("{} {}x{}", s.label, s.k, s.n))
            .collect::<Vec<_>>()
            .join(", "),
        plan.types.len(),
        plan.tokens,
        plan.reps
    );
    let measured = measure(&plan, &cpu, gpu.as_ref())?;
    let groups = survey_table::rank(&measured, &plan.shapes, &plan.tokens, rank_by);
    let header = survey_table::Header {
        source,
        cpu: crate::bench_out::cpu_info(),
        reps: plan.reps,
        n_exp: plan.n_exp,
        rank_by,
    };
    let md = survey_table::markdown(&header, &groups, &plan.tokens, ggml.as_ref());
    print!("{md}");
    if let Some(dir) = &s.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let md_path = dir.join("survey.md");
        std::fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
        let svg_path = dir.join("survey.svg");
        crate::survey_svg::write(&svg_path, &groups, &plan.tokens)
            .with_context(|| format!("writing {}", svg_path.display()))?;
        eprintln!(
            "survey: wrote {} and {}",
            md_path.display(),
            svg_path.display()
        );
    }
    Ok(())
}

/// The GPU to survey: `--device NAME` (or LONGHAUL_DEVICE), else the default
/// adapter (discrete, else integrated; never a software one); none with
/// `--device none` or `-ngl 0`, or when wgpu finds none (said, not an error).
fn open_gpu(a: &crate::bench::BenchArgs) -> Option<longhaul::backend::gpu::GpuBackend> {
    use longhaul::backend::gpu::{DeviceChoice, GpuBackend, GpuOptions};
    let cpu_only = a.n_gpu_layers.iter().all(|v| v.trim() == "0");
    if cpu_only
        || a.device
            .as_deref()
            .is_some_and(|d| d.eq_ignore_ascii_case("none"))
    {
        eprintln!("survey: CPU only (-ngl 0 / --device none)");
        return None;
    }
    let mut opts = GpuOptions::from_env();
    if let Some(d) = &a.device {
        opts.device = DeviceChoice::Named(d.clone());
    }
    match GpuBackend::open(&opts) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("survey: CPU rows only: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every surveyed type's weights (quantised, or random blocks with the
    /// scale fields set) dequantise to finite values of a weight's size:
    /// a type added without its scale layout here fails this test.
    #[test]
    fn survey_weights_dequantise_to_sane_values() {
        let shape = Shape::new("gate/up", 768, 4);
        for ty in survey_types(&[]).unwrap() {
            let bytes = weight_bytes(ty, &shape, 2, 7).unwrap();
            let rb = ty.row_bytes(768).unwrap() as usize;
            assert_eq!(bytes.len(), rb * 4 * 2, "{ty}");
            let mut v = vec![f32::NAN; 768 * 8];
            quant::dequantize_row(ty, &bytes, &mut v).unwrap();
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(
                v.iter().all(|x| x.is_finite()) && max < 1e3,
                "{ty}: max |w| {max}"
            );
            assert!(max > 0.0, "{ty}: all zero");
        }
    }

    #[test]
    fn presets_give_both_expert_shapes() {
        let s = shapes_from_preset("qwen3-30b-a3b").unwrap();
        assert_eq!(
            s,
            [
                Shape::new("gate/up", 2048, 768),
                Shape::new("down", 768, 2048)
            ]
        );
        let e = shapes_from_preset("nope").unwrap_err().to_string();
        assert!(e.contains("qwen3-30b-a3b"), "{e}");
    }
}
