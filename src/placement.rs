//! Where the repeating layers run. longhaul puts every repeating layer on one
//! device: the CPU (`-ngl 0`) or one GPU adapter (`-ngl all` / `99`); a split
//! between the two is refused before any weight is read.
//!
//! This module turns llama.cpp's `-ngl/--n-gpu-layers` and `-dev/--device`
//! (or `LONGHAUL_DEVICE`) into a [`Placement`]: it parses the values
//! ([`GpuLayers`], [`DeviceRequest`]), checks a layer count against the
//! model's `{arch}.block_count` read from the GGUF header ([`plan`], pure and
//! unit-tested), then picks and opens the adapter ([`Plan::open`]). It knows
//! the backends only by their constructors and the engine not at all.
//! Clients write their command bodies generic over
//! [`Backend`](crate::backend::Backend) and dispatch once with
//! [`with_backend!`](crate::with_backend).
//!
//! Rules: `auto` (the default) takes the first discrete GPU, else the first
//! integrated one, else runs on the CPU and says so. Software adapters
//! (lavapipe/llvmpipe, WARP) are used only when named with `--device`. An
//! explicit GPU request (`-ngl all`/`99`/N >= n_layer, or `--device NAME`)
//! with no matching adapter is an error, never a silent fall back.

use std::path::Path;
use std::str::FromStr;

use crate::backend::gpu::{AdapterSummary, DeviceChoice, GpuBackend, GpuError, GpuOptions};
use crate::gguf::{self, GgufError};

pub use crate::backend::gpu::{default_adapter, named_adapter};

/// Errors of placement resolution. Each says which flag to use instead.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("-ngl {value}: give auto (the default: the GPU when one is found, else the CPU), 0 (every repeating layer on the CPU), or all / 99 (every repeating layer on the GPU)")]
    BadValue { value: String },
    #[error("-ngl {n}: longhaul places all repeating layers on one device; use -ngl 0 (CPU) or -ngl all / 99 (GPU, this model has {n_layer} layers)")]
    Partial { n: u32, n_layer: usize },
    #[error("-ngl {n}: cannot compare it with the model's layer count ({detail}); use -ngl 0 (CPU) or -ngl all (GPU)")]
    UnknownLayerCount { n: u32, detail: String },
    #[error("-ngl {ngl} asks for the GPU but --device none keeps every layer on the CPU; drop one of the two")]
    DeviceNone { ngl: String },
    #[error("-ngl {ngl} asks for the GPU, but wgpu found no GPU adapter (it saw: {seen}); use -ngl 0 to run on the CPU, or --device NAME to pick a software adapter (see `longhaul devices`)")]
    NoGpu { ngl: String, seen: String },
    #[error("-ngl auto picked a GPU that failed: {gpu}; use -ngl 0 to run on the CPU, or --device NAME for another adapter (see `longhaul devices`)")]
    AutoFailed { gpu: GpuError },
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("cannot load {path}: {}", err.cause_in(std::path::Path::new(path)))]
    Open { path: String, err: GgufError },
}

/// `-ngl/--n-gpu-layers` as given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuLayers {
    /// `auto` or `-1`: the GPU when one is found, else the CPU.
    Auto,
    /// `all`: every repeating layer on the GPU.
    All,
    /// A number of repeating layers: 0 is the CPU, `>= n_layer` the GPU
    /// (llama.cpp's habit is 99), anything between is refused by [`plan`].
    Count(u32),
}

impl FromStr for GpuLayers {
    type Err = PlacementError;

    fn from_str(s: &str) -> Result<Self, PlacementError> {
        let v = s.trim();
        if v.eq_ignore_ascii_case("auto") || v == "-1" {
            return Ok(GpuLayers::Auto);
        }
        if v.eq_ignore_ascii_case("all") {
            return Ok(GpuLayers::All);
        }
        match v.parse::<u64>() {
            Ok(n) => Ok(GpuLayers::Count(n.min(u32::MAX as u64) as u32)),
            Err(_) => Err(PlacementError::BadValue {
                value: s.to_string(),
            }),
        }
    }
}

impl std::fmt::Display for GpuLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuLayers::Auto => f.write_str("auto"),
            GpuLayers::All => f.write_str("all"),
            GpuLayers::Count(n) => write!(f, "{n}"),
        }
    }
}

/// `--device` / `LONGHAUL_DEVICE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceRequest {
    /// Not given: the default adapter rule.
    Auto,
    /// `none` (llama.cpp's spelling): no GPU.
    None,
    /// The first adapter whose name contains this, case-insensitively.
    Named(String),
}

impl DeviceRequest {
    /// `flag` (the `--device` value) when given, else the environment's
    /// choice (`LONGHAUL_DEVICE`, as read into [`GpuOptions::device`]).
    pub fn new(flag: Option<&str>, env: &DeviceChoice) -> Self {
        let name = match (flag, env) {
            (Some(f), _) => f.trim(),
            (None, DeviceChoice::Named(n)) => n.trim(),
            (None, DeviceChoice::Auto) => "",
        };
        if name.is_empty() {
            DeviceRequest::Auto
        } else if name.eq_ignore_ascii_case("none") {
            DeviceRequest::None
        } else {
            DeviceRequest::Named(name.to_string())
        }
    }
}

/// Why a run stays on the CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuReason {
    /// `-ngl 0`.
    Asked,
    /// `--device none`.
    DeviceNone,
    /// `-ngl auto` found no GPU; `seen` lists what wgpu did report.
    NoAdapter { seen: String },
}

impl CpuReason {
    /// The reason as the start-up line gives it.
    pub fn describe(&self) -> String {
        match self {
            CpuReason::Asked => "-ngl 0".into(),
            CpuReason::DeviceNone => "--device none".into(),
            CpuReason::NoAdapter { seen } if seen == "nothing" => "no GPU adapter found".into(),
            CpuReason::NoAdapter { seen } => format!(
                "no GPU adapter found; wgpu saw {seen}, software adapters run only when named with --device NAME"
            ),
        }
    }
}

/// The decision before any device is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    Cpu(CpuReason),
    /// Every repeating layer on `device`. `required`: the user asked for
    /// the GPU, so finding none is an error (else the CPU is used).
    Gpu {
        device: DeviceChoice,
        required: bool,
        /// The `-ngl` value, for messages.
        ngl: GpuLayers,
    },
}

/// Decides the placement of a model with `n_layer` repeating layers (`None`
/// when the file does not say). Pure: no device is touched.
pub fn plan(
    ngl: GpuLayers,
    device: &DeviceRequest,
    n_layer: Option<usize>,
) -> Result<Plan, PlacementError> {
    let explicit = match ngl {
        GpuLayers::Count(0) => return Ok(Plan::Cpu(CpuReason::Asked)),
        GpuLayers::Count(n) => match n_layer {
            Some(nl) if (n as usize) < nl => {
                return Err(PlacementError::Partial { n, n_layer: nl });
            }
            Some(_) => true,
            None => {
                return Err(PlacementError::UnknownLayerCount {
                    n,
                    detail: "the file has no block_count".into(),
                })
            }
        },
        GpuLayers::All => true,
        GpuLayers::Auto => false,
    };
    match device {
        DeviceRequest::None if explicit => Err(PlacementError::DeviceNone {
            ngl: ngl.to_string(),
        }),
        DeviceRequest::None => Ok(Plan::Cpu(CpuReason::DeviceNone)),
        DeviceRequest::Named(name) => Ok(Plan::Gpu {
            device: DeviceChoice::Named(name.clone()),
            required: true,
            ngl,
        }),
        DeviceRequest::Auto => Ok(Plan::Gpu {
            device: DeviceChoice::Auto,
            required: explicit,
            ngl,
        }),
    }
}

/// Where the repeating layers run.
#[derive(Clone)]
pub enum Placement {
    Cpu,
    Gpu(GpuBackend),
}

impl Placement {
    /// `CPU`, or the GPU's graphics API as wgpu names it (`Vulkan`, `Metal`,
    /// `Dx12`): llama-bench's `backend` column.
    pub fn backend_name(&self) -> String {
        match self {
            Placement::Cpu => "CPU".into(),
            Placement::Gpu(g) => g.adapter().backend.clone(),
        }
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self, Placement::Gpu(_))
    }

    /// The GPU adapter, when the layers run on one.
    pub fn adapter(&self) -> Option<&AdapterSummary> {
        match self {
            Placement::Cpu => None,
            Placement::Gpu(g) => Some(g.adapter()),
        }
    }
}

/// An opened placement and the line that tells the user about it.
#[derive(Clone)]
pub struct Placed {
    pub placement: Placement,
    /// `24 repeating layers on GPU NAME (Vulkan)` or `CPU (-ngl 0)`.
    pub summary: String,
}

impl Plan {
    /// Opens the adapter the plan names (`opts` supplies the GPU settings;
    /// its `device` is replaced by the plan's). `n_layer` is only used in
    /// the summary.
    pub fn open(
        &self,
        opts: &GpuOptions,
        n_layer: Option<usize>,
    ) -> Result<Placed, PlacementError> {
        let cpu = |r: &CpuReason| Placed {
            placement: Placement::Cpu,
            summary: format!("CPU ({})", r.describe()),
        };
        let (device, required, ngl) = match self {
            Plan::Cpu(r) => return Ok(cpu(r)),
            Plan::Gpu {
                device,
                required,
                ngl,
            } => (device, *required, *ngl),
        };
        let opts = GpuOptions {
            device: device.clone(),
            ..opts.clone()
        };
        match GpuBackend::open(&opts) {
            Ok(g) => {
                let a = g.adapter();
                let layers = match n_layer {
                    Some(n) => format!("{n} repeating layers"),
                    None => "every repeating layer".into(),
                };
                let summary = format!("{layers} on GPU {} ({})", a.name, a.backend);
                Ok(Placed {
                    placement: Placement::Gpu(g),
                    summary,
                })
            }
            Err(GpuError::NoAdapter { seen }) if !required => {
                Ok(cpu(&CpuReason::NoAdapter { seen }))
            }
            Err(GpuError::NoAdapter { seen }) => Err(PlacementError::NoGpu {
                ngl: ngl.to_string(),
                seen,
            }),
            Err(gpu) if !required => Err(PlacementError::AutoFailed { gpu }),
            Err(e) => Err(e.into()),
        }
    }
}

/// The number of repeating layers (`{arch}.block_count`), or why it is unknown.
pub fn n_layer(md: &gguf::Metadata) -> Result<usize, String> {
    let arch = md.architecture().map_err(|e| e.to_string())?;
    let key = format!("{arch}.block_count");
    match md.get_u64(&key) {
        Ok(n) if n > 0 => usize::try_from(n).map_err(|_| format!("{key} = {n}")),
        Ok(n) => Err(format!("{key} = {n}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Resolves `-ngl` and `--device` for the model at `path`: parses the
/// value, reads the layer count from the GGUF header (no weight is read),
/// decides and opens the device. GPU settings other than the adapter come
/// from the environment ([`GpuOptions::from_env`]).
pub fn resolve(path: &Path, ngl: &str, device: Option<&str>) -> Result<Placed, PlacementError> {
    let mut all = resolve_all(path, &[ngl], device)?;
    match all.pop() {
        Some((_, placed)) => Ok(placed),
        None => Err(PlacementError::BadValue { value: ngl.into() }),
    }
}

/// [`resolve`] for a list of `-ngl` values (llama-bench's `-ngl 0,99`), in
/// order. Every value is parsed and checked before any device is opened;
/// a device is opened once per distinct plan.
pub fn resolve_all(
    path: &Path,
    ngl: &[&str],
    device: Option<&str>,
) -> Result<Vec<(GpuLayers, Placed)>, PlacementError> {
    let values: Vec<GpuLayers> = ngl.iter().map(|v| v.parse()).collect::<Result<_, _>>()?;
    let n_layer = model_layers(path)?;
    let known = n_layer.as_ref().ok().copied();
    let opts = GpuOptions::from_env();
    let req = DeviceRequest::new(device, &opts.device);
    let plans: Vec<Plan> = values
        .iter()
        .map(|&g| {
            plan(g, &req, known).map_err(|e| match (e, &n_layer) {
                (PlacementError::UnknownLayerCount { n, .. }, Err(detail)) => {
                    PlacementError::UnknownLayerCount {
                        n,
                        detail: detail.clone(),
                    }
                }
                (e, _) => e,
            })
        })
        .collect::<Result<_, _>>()?;
    let mut opened: Vec<(&Plan, Placed)> = Vec::new();
    let mut out = Vec::with_capacity(plans.len());
    for (g, p) in values.into_iter().zip(&plans) {
        let placed = match opened.iter().find(|(q, _)| *q == p) {
            Some((_, placed)) => placed.clone(),
            None => {
                let placed = p.open(&opts, known)?;
                opened.push((p, placed.clone()));
                placed
            }
        };
        out.push((g, placed));
    }
    Ok(out)
}

/// Opens the GGUF header at `path` and reads its layer count; the outer
/// error is the file's, the inner one says why the count is unknown.
pub fn model_layers(path: &Path) -> Result<Result<usize, String>, PlacementError> {
    let file = gguf::Model::open(path).map_err(|err| PlacementError::Open {
        path: path.display().to_string(),
        err,
    })?;
    Ok(n_layer(file.metadata()))
}

/// Runs `$body` with `$b` bound to the backend of a [`Placement`] (a value
/// or a reference): `CpuBackend::new()` or a clone of the `GpuBackend`.
/// The body is compiled once per backend, so it is generic code without
/// trait objects; both arms must have the same type.
///
/// ```ignore
/// longhaul::with_backend!(placed.placement, |backend| {
///     let engine = Engine::load(&path, backend, params)?;
///     generate(&engine)
/// })
/// ```
#[macro_export]
macro_rules! with_backend {
    ($placement:expr, |$b:ident| $body:expr) => {
        match $placement {
            $crate::placement::Placement::Cpu => {
                let $b = $crate::backend::cpu::CpuBackend::new();
                $body
            }
            $crate::placement::Placement::Gpu(gpu) => {
                let $b = $crate::backend::gpu::GpuBackend::clone(&gpu);
                $body
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngl(s: &str) -> GpuLayers {
        s.parse().expect(s)
    }

    #[test]
    fn parses_llama_cpp_spellings() {
        assert_eq!(ngl("auto"), GpuLayers::Auto);
        assert_eq!(ngl("AUTO"), GpuLayers::Auto);
        assert_eq!(ngl("-1"), GpuLayers::Auto);
        assert_eq!(ngl("all"), GpuLayers::All);
        assert_eq!(ngl(" 0 "), GpuLayers::Count(0));
        assert_eq!(ngl("99"), GpuLayers::Count(99));
        assert_eq!(ngl("99999999999999"), GpuLayers::Count(u32::MAX));
        for bad in ["abc", "", "-2", "1.5", "9x", "allx"] {
            let e = bad.parse::<GpuLayers>().unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("-ngl {bad}:"))
                    && e.contains("auto")
                    && e.contains("all / 99"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn zero_is_the_cpu_whatever_the_device() {
        for d in [
            DeviceRequest::Auto,
            DeviceRequest::None,
            DeviceRequest::Named("llvmpipe".into()),
        ] {
            assert_eq!(
                plan(GpuLayers::Count(0), &d, Some(24)).unwrap(),
                Plan::Cpu(CpuReason::Asked)
            );
        }
    }

    #[test]
    fn partial_offload_is_refused_naming_both_choices() {
        for n in [1, 5, 23] {
            let e = plan(GpuLayers::Count(n), &DeviceRequest::Auto, Some(24))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("-ngl {n}:"))
                    && e.contains("-ngl 0 (CPU)")
                    && e.contains("-ngl all / 99")
                    && e.contains("24 layers"),
                "{e}"
            );
        }
        let e = plan(GpuLayers::Count(5), &DeviceRequest::Auto, None).unwrap_err();
        assert!(
            matches!(e, PlacementError::UnknownLayerCount { n: 5, .. }),
            "{e}"
        );
    }

    #[test]
    fn all_layers_or_more_ask_for_the_gpu() {
        let want = |ngl| Plan::Gpu {
            device: DeviceChoice::Auto,
            required: true,
            ngl,
        };
        for g in [GpuLayers::Count(24), GpuLayers::Count(99), GpuLayers::All] {
            assert_eq!(plan(g, &DeviceRequest::Auto, Some(24)).unwrap(), want(g));
        }
        // `all` needs no layer count.
        assert_eq!(
            plan(GpuLayers::All, &DeviceRequest::Auto, None).unwrap(),
            want(GpuLayers::All)
        );
    }

    #[test]
    fn auto_falls_back_only_without_an_explicit_request() {
        assert_eq!(
            plan(GpuLayers::Auto, &DeviceRequest::Auto, Some(2)).unwrap(),
            Plan::Gpu {
                device: DeviceChoice::Auto,
                required: false,
                ngl: GpuLayers::Auto
            }
        );
        // A named device is an explicit request, with or without -ngl.
        for g in [GpuLayers::Auto, GpuLayers::All, GpuLayers::Count(99)] {
            assert_eq!(
                plan(g, &DeviceRequest::Named("pipe".into()), Some(2)).unwrap(),
                Plan::Gpu {
                    device: DeviceChoice::Named("pipe".into()),
                    required: true,
                    ngl: g
                }
            );
        }
        assert_eq!(
            plan(GpuLayers::Auto, &DeviceRequest::None, Some(2)).unwrap(),
            Plan::Cpu(CpuReason::DeviceNone)
        );
        let e = plan(GpuLayers::All, &DeviceRequest::None, Some(2)).unwrap_err();
        assert!(e.to_string().contains("--device none"), "{e}");
    }

    #[test]
    fn device_flag_overrides_the_environment() {
        let env = DeviceChoice::Named("llvmpipe".into());
        assert_eq!(
            DeviceRequest::new(None, &env),
            DeviceRequest::Named("llvmpipe".into())
        );
        assert_eq!(
            DeviceRequest::new(Some("NVIDIA"), &env),
            DeviceRequest::Named("NVIDIA".into())
        );
        assert_eq!(DeviceRequest::new(Some("None"), &env), DeviceRequest::None);
        assert_eq!(
            DeviceRequest::new(None, &DeviceChoice::Named("none".into())),
            DeviceRequest::None
        );
        assert_eq!(
            DeviceRequest::new(Some(""), &DeviceChoice::Auto),
            DeviceRequest::Auto
        );
    }

    fn adapter(name: &str, ty: &str) -> AdapterSummary {
        AdapterSummary {
            name: name.into(),
            backend: "Vulkan".into(),
            device_type: ty.into(),
            driver: String::new(),
            driver_info: String::new(),
            f16: true,
            subgroups: true,
            subgroup_min: 8,
            subgroup_max: 8,
            max_binding: 128 << 20,
            max_buffer: 1 << 31,
            is_cpu: ty == "Cpu",
        }
    }

    #[test]
    fn default_adapter_prefers_discrete_and_skips_software() {
        let cpu = adapter("llvmpipe (LLVM 15.0.6, 256 bits)", "Cpu");
        let igpu = adapter("Intel Iris", "IntegratedGpu");
        let dgpu = adapter("NVIDIA H200", "DiscreteGpu");
        let virt = adapter("virtio", "VirtualGpu");
        assert_eq!(default_adapter(std::slice::from_ref(&cpu)), None);
        assert_eq!(default_adapter(&[cpu.clone(), virt]), None);
        assert_eq!(default_adapter(&[cpu.clone(), igpu.clone()]), Some(1));
        assert_eq!(
            default_adapter(&[igpu.clone(), cpu.clone(), dgpu.clone(), dgpu.clone()]),
            Some(2)
        );
        assert_eq!(default_adapter(&[]), None);
        assert_eq!(
            named_adapter(&[igpu.clone(), cpu.clone()], "LLVMPIPE"),
            Some(1)
        );
        assert_eq!(named_adapter(&[igpu, cpu], "radeon"), None);
    }

    #[test]
    fn layer_count_comes_from_the_architecture_key() {
        use crate::gguf::MetaValue;
        let mut md = gguf::Metadata::new();
        assert!(n_layer(&md).is_err());
        md.set("general.architecture", MetaValue::String("qwen3moe".into()));
        assert!(n_layer(&md).unwrap_err().contains("qwen3moe.block_count"));
        md.set("qwen3moe.block_count", MetaValue::U32(48));
        assert_eq!(n_layer(&md), Ok(48));
        md.set("qwen3moe.block_count", MetaValue::U32(0));
        assert!(n_layer(&md).is_err());
    }
}
