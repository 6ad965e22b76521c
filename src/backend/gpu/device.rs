//! Adapters: listing, choosing one, and opening a device with the adapter's
//! real limits and the optional features the kernels use.

use super::GpuError;

/// What `longhaul devices` prints about one adapter.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub f16: bool,
    pub subgroups: bool,
    pub subgroup_min: u32,
    pub subgroup_max: u32,
    pub max_binding: u64,
    pub max_buffer: u64,
    /// A software rasteriser (lavapipe, llvmpipe, WARP): used only when asked for.
    pub is_cpu: bool,
}

fn summarize(a: &wgpu::Adapter) -> AdapterSummary {
    let i = a.get_info();
    let l = a.limits();
    let f = a.features();
    AdapterSummary {
        name: i.name.clone(),
        backend: format!("{:?}", i.backend),
        device_type: format!("{:?}", i.device_type),
        driver: i.driver.clone(),
        driver_info: i.driver_info.clone(),
        f16: f.contains(wgpu::Features::SHADER_F16),
        subgroups: f.contains(wgpu::Features::SUBGROUP),
        subgroup_min: i.subgroup_min_size,
        subgroup_max: i.subgroup_max_size,
        max_binding: l.max_storage_buffer_binding_size,
        max_buffer: l.max_buffer_size,
        is_cpu: matches!(i.device_type, wgpu::DeviceType::Cpu),
    }
}

fn instance() -> wgpu::Instance {
    // WGPU_BACKEND=vulkan (etc.) restricts the search, so a missing driver
    // fails loudly instead of falling back to another API.
    let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY);
    #[cfg(all(unix, not(target_vendor = "apple"), not(target_os = "android")))]
    if backends.contains(wgpu::Backends::VULKAN) {
        if let Some(inst) = compute_only_vulkan() {
            return inst;
        }
    }
    wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    })
}

/// The window-system surface extensions wgpu enables on Linux and the BSDs
/// when the driver offers them.
#[cfg(all(unix, not(target_vendor = "apple"), not(target_os = "android")))]
const WINDOW_SYSTEM_EXTENSIONS: [&std::ffi::CStr; 3] = [
    c"VK_KHR_xlib_surface",
    c"VK_KHR_xcb_surface",
    c"VK_KHR_wayland_surface",
];

/// A Vulkan instance without window-system surface extensions: longhaul
/// only computes, it never presents to a window. Mesa's implicit
/// device-selection layer (`VK_LAYER_MESA_device_select`) connects to the
/// Wayland display while listing physical devices whenever the instance
/// enabled `VK_KHR_wayland_surface`, and on a machine without a display
/// session libwayland then prints `error: XDG_RUNTIME_DIR is invalid or not
/// set in the environment.` for each listing, though nothing failed. Without
/// the extension the layer skips that probe; driver errors still reach
/// wgpu's log as before. `None` when the Vulkan loader is missing (the caller
/// then builds the instance as wgpu does by default, which finds no adapter).
#[cfg(all(unix, not(target_vendor = "apple"), not(target_os = "android")))]
fn compute_only_vulkan() -> Option<wgpu::Instance> {
    use wgpu::hal;
    let desc = hal::InstanceDescriptor {
        name: "longhaul",
        flags: wgpu::InstanceFlags::default(),
        memory_budget_thresholds: Default::default(),
        backend_options: Default::default(),
        telemetry: None,
        display: None,
    };
    let drop_window_system = Box::new(|args: hal::vulkan::CreateInstanceCallbackArgs| {
        args.extensions
            .retain(|e| !WINDOW_SYSTEM_EXTENSIONS.contains(e));
    });
    // SAFETY: the callback only removes surface extensions. wgpu-hal checks
    // its list of enabled extensions before it creates a surface of each
    // kind (an error, not undefined behaviour, when absent), and longhaul
    // creates no surface.
    let raw = unsafe { hal::vulkan::Instance::init_with_callback(&desc, Some(drop_window_system)) }
        .ok()?;
    // SAFETY: `raw` is a valid Vulkan instance just created; wgpu takes
    // ownership of it.
    Some(unsafe { wgpu::Instance::from_hal::<hal::api::Vulkan>(raw) })
}

/// Every adapter the enabled backends report, in the order wgpu lists them.
pub fn list_adapters() -> Vec<AdapterSummary> {
    adapters().iter().map(summarize).collect()
}

fn adapters() -> Vec<wgpu::Adapter> {
    let inst = instance();
    pollster::block_on(inst.enumerate_adapters(wgpu::Backends::all()))
}

/// How to choose an adapter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The first discrete GPU, else the first integrated one; software
    /// adapters are never picked automatically.
    #[default]
    Auto,
    /// The first adapter whose name contains this (case-insensitive).
    Named(String),
}

/// The adapter `-ngl auto` takes (index into `adapters`): the first discrete
/// GPU, else the first integrated one; never a software adapter.
pub fn default_adapter(adapters: &[AdapterSummary]) -> Option<usize> {
    let rank = |a: &AdapterSummary| match a.device_type.as_str() {
        "DiscreteGpu" => Some(0u8),
        "IntegratedGpu" => Some(1),
        _ => None,
    };
    let mut best: Option<(u8, usize)> = None;
    for (i, a) in adapters.iter().enumerate() {
        if let Some(r) = rank(a) {
            if best.is_none_or(|(b, _)| r < b) {
                best = Some((r, i));
            }
        }
    }
    best.map(|(_, i)| i)
}

/// The adapter `--device name` designates (index): the first whose name
/// contains `name`, case-insensitively.
pub fn named_adapter(adapters: &[AdapterSummary], name: &str) -> Option<usize> {
    let want = name.to_lowercase();
    adapters
        .iter()
        .position(|a| a.name.to_lowercase().contains(&want))
}

/// The adapter `choice` designates; `Ok(None)` when `Auto` finds no GPU.
pub(super) fn choose(choice: &DeviceChoice) -> Result<Option<wgpu::Adapter>, GpuError> {
    let all = adapters();
    let sums: Vec<AdapterSummary> = all.iter().map(summarize).collect();
    let pick = match choice {
        DeviceChoice::Auto => match default_adapter(&sums) {
            Some(i) => i,
            None => return Ok(None),
        },
        DeviceChoice::Named(name) => {
            named_adapter(&sums, name).ok_or_else(|| GpuError::NoSuchDevice {
                name: name.clone(),
                available: if sums.is_empty() {
                    "none".into()
                } else {
                    sums.iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            })?
        }
    };
    Ok(all.into_iter().nth(pick))
}

/// Opens `adapter` with its own limits (not wgpu's defaults) and the
/// optional features the kernels can use.
pub(super) fn open(
    adapter: &wgpu::Adapter,
    want_f16: bool,
    want_subgroups: bool,
) -> Result<(wgpu::Device, wgpu::Queue, AdapterSummary), GpuError> {
    let s = summarize(adapter);
    let mut features = wgpu::Features::empty();
    if want_f16 && s.f16 {
        features |= wgpu::Features::SHADER_F16;
    }
    if want_subgroups && s.subgroups {
        features |= wgpu::Features::SUBGROUP;
    }
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("longhaul"),
        required_features: features,
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .map_err(|e| GpuError::Device {
        name: s.name.clone(),
        detail: e.to_string(),
    })?;
    Ok((device, queue, s))
}
