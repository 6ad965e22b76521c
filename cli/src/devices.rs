//! `longhaul devices`: the adapters wgpu reports, what the kernels can use on
//! each, and where `-ngl auto` (or `--device NAME`) would put the layers.

use clap::Args;
use longhaul::backend::gpu::{list_adapters, AdapterSummary, GpuOptions};
use longhaul::placement::{self, DeviceRequest};

#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// Also say which adapter this name picks (-dev; as run, chat, bench and
    /// serve take it; default: LONGHAUL_DEVICE).
    #[arg(long = "device", value_name = "NAME")]
    pub device: Option<String>,
}

/// Whole MiB, rounded down (limits such as 2^31 - 1 read as 2047 MiB).
fn mib(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{} MiB", b >> 20)
    } else {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn describe(i: usize, a: &AdapterSummary) -> String {
    let driver = match (a.driver.is_empty(), a.driver_info.is_empty()) {
        (true, true) => "unknown".to_string(),
        (false, true) => a.driver.clone(),
        (true, false) => a.driver_info.clone(),
        (false, false) => format!("{} ({})", a.driver, a.driver_info),
    };
    let subgroups = if a.subgroups {
        format!("yes ({}..{})", a.subgroup_min, a.subgroup_max)
    } else {
        "no".into()
    };
    let soft = if a.is_cpu {
        ", software: used only with --device NAME"
    } else {
        ""
    };
    format!(
        "  #{i}  {}\n      backend {}, type {}{soft}\n      driver {driver}\n      f16 {}, subgroups {subgroups}, max storage binding {}, max buffer {}",
        a.name,
        a.backend,
        a.device_type,
        yes_no(a.f16),
        mib(a.max_binding),
        mib(a.max_buffer),
    )
}

pub fn devices(a: DevicesArgs) -> anyhow::Result<()> {
    let all = list_adapters();
    let apis = std::env::var("WGPU_BACKEND")
        .map(|v| format!("WGPU_BACKEND={v}"))
        .unwrap_or_else(|_| {
            "all native APIs; set WGPU_BACKEND=vulkan|metal|dx12 to restrict".into()
        });
    if all.is_empty() {
        println!("no GPU adapter found ({apis})");
    } else {
        println!("GPU adapters ({apis}):");
        for (i, ad) in all.iter().enumerate() {
            println!("{}", describe(i, ad));
        }
    }
    let label = |i: usize| format!("#{i} {} ({})", all[i].name, all[i].backend);
    let env = GpuOptions::from_env().device;
    let req = DeviceRequest::new(a.device.as_deref(), &env);
    let from = if a.device.is_some() {
        "--device"
    } else {
        "LONGHAUL_DEVICE"
    };
    match req {
        DeviceRequest::Auto => match placement::default_adapter(&all) {
            Some(i) => println!("default placement (-ngl auto): every repeating layer on GPU {}", label(i)),
            None if all.iter().any(|x| x.is_cpu) => println!(
                "default placement (-ngl auto): CPU (no discrete or integrated GPU; a software adapter runs only when named, e.g. --device {})",
                all.iter().find(|x| x.is_cpu).map_or("NAME", |x| short_name(&x.name))
            ),
            None => println!("default placement (-ngl auto): CPU (no GPU adapter found)"),
        },
        DeviceRequest::None => {
            println!("default placement ({from} none): CPU")
        }
        DeviceRequest::Named(name) => match placement::named_adapter(&all, &name) {
            Some(i) => println!(
                "default placement ({from} {name}): every repeating layer on GPU {}",
                label(i)
            ),
            None => anyhow::bail!(
                "{from} {name} matches no adapter; available: {}",
                if all.is_empty() {
                    "none".to_string()
                } else {
                    all.iter().map(|x| x.name.as_str()).collect::<Vec<_>>().join(", ")
                }
            ),
        },
    }
    Ok(())
}

/// The first word of an adapter name (`llvmpipe (LLVM 15.0.6, 256 bits)` -> `llvmpipe`).
fn short_name(name: &str) -> &str {
    name.split_whitespace().next().unwrap_or(name)
}
