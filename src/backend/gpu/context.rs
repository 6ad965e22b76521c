//! The device, its queue, the pipeline cache and the one command stream every
//! op records into. Ops record dispatches into a pending encoder; reading a
//! tensor back (or writing expert slots) submits it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::pool::{Pool, Pooled};
use super::GpuError;
use crate::tensor::GgmlType;

/// What the kernels may use on this device (after the user's settings).
#[derive(Clone, Debug)]
pub struct Caps {
    /// `shader-f16` is enabled: kernels may hold f16 values.
    pub f16: bool,
    /// Subgroup operations are enabled.
    pub subgroups: bool,
    /// The adapter's subgroup size range (kernels read the actual size from
    /// the `subgroup_size` builtin; workgroups are sized as a multiple of max).
    pub subgroup_min: u32,
    pub subgroup_max: u32,
    /// Largest storage binding; larger tensors are split into parts.
    pub max_binding: u64,
    pub max_workgroups_per_dim: u32,
    /// Fill every new activation with NaN before kernels write it (tests).
    pub poison: bool,
}

/// A compiled kernel's identity: the pipeline cache key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelKey {
    pub name: &'static str,
    /// The weight type a quantised kernel is specialised for.
    pub ty: Option<GgmlType>,
    /// Kernel-specific variant bits (tile shape, dtype of the KV cache, ...).
    pub variant: u64,
}

impl KernelKey {
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            ty: None,
            variant: 0,
        }
    }
    pub fn ty(mut self, ty: GgmlType) -> Self {
        self.ty = Some(ty);
        self
    }
    pub fn variant(mut self, v: impl Into<u64>) -> Self {
        self.variant = v.into();
        self
    }
}

struct Pending {
    encoder: Option<wgpu::CommandEncoder>,
    /// The compute pass consecutive dispatches are recorded into (one pass
    /// for a run of dispatches, not one each: wgpu still orders each
    /// dispatch after the writes of the ones before it). Ended before any
    /// other command and before the encoder is submitted.
    pass: Option<wgpu::ComputePass<'static>>,
    dispatches: usize,
    /// The parameters of the dispatches recorded so far, at their offsets
    /// in [`Ctx::params`]: written with one `write_buffer` at submission,
    /// not one per dispatch (each write stages a buffer of its own).
    params: Vec<u8>,
}

/// Submit after this many recorded dispatches, so memory held by finished
/// temporaries is returned during long prompts.
const MAX_PENDING: usize = 512;

pub struct Ctx {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub caps: Caps,
    pipelines: Mutex<HashMap<KernelKey, Arc<wgpu::ComputePipeline>>>,
    /// Read-only tables uploaded once per device (the i-quant grids).
    tables: Mutex<HashMap<&'static str, Arc<wgpu::Buffer>>>,
    pending: Mutex<Pending>,
    /// The first device error not caught by an error scope (out of memory,
    /// validation): wgpu's default handler would panic; we report it as a
    /// [`GpuError`] at the next allocation or read-back.
    failed: Arc<Mutex<Option<String>>>,
    /// Read-backs so far ([`Ctx::read`]), each a wait for the device.
    readbacks: std::sync::atomic::AtomicU64,
    /// Submissions so far, and commands recorded (dispatches and copies).
    submits: std::sync::atomic::AtomicU64,
    recorded: std::sync::atomic::AtomicU64,
    /// The uniform parameters of every dispatch of a submission, each at its
    /// own aligned offset (written by the queue before the submission runs;
    /// reused from offset 0 by the next, which runs after it).
    params: wgpu::Buffer,
    params_align: u64,
    /// Activation buffers for reuse (see pool.rs).
    pool: Arc<Mutex<Pool>>,
    /// Pooled buffers created so far, not reused (a test counts them per
    /// step).
    created: std::sync::atomic::AtomicU64,
}

/// The bind group entries of `args`: binding `i` is `args[i]`.
fn bind_entries<'a>(args: &[Arg<'a>]) -> Vec<wgpu::BindGroupEntry<'a>> {
    args.iter()
        .enumerate()
        .map(|(i, a)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: match *a {
                Arg::Buf(b) => b.as_entire_binding(),
                Arg::Range(b, off, size) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: b,
                    offset: off,
                    size: wgpu::BufferSize::new(size),
                }),
            },
        })
        .collect()
}

/// Binding `i` of a dispatch: a whole buffer or a byte range of one.
#[derive(Clone, Copy)]
pub enum Arg<'a> {
    Buf(&'a wgpu::Buffer),
    Range(&'a wgpu::Buffer, u64, u64),
}

impl Ctx {
    pub fn new(device: wgpu::Device, queue: wgpu::Queue, caps: Caps) -> Self {
        let failed: Arc<Mutex<Option<String>>> = Arc::default();
        let sink = failed.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut f = sink.lock().unwrap_or_else(|p| p.into_inner());
            if f.is_none() {
                *f = Some(e.to_string());
            }
        }));
        let params_align = (device.limits().min_uniform_buffer_offset_alignment as u64).max(16);
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dispatch params"),
            // Room for a submission's dispatches with up to 256 bytes of
            // parameters each (the largest take under 128).
            size: params_align.max(256) * MAX_PENDING as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Self {
            device,
            queue,
            readbacks: Default::default(),
            submits: Default::default(),
            recorded: Default::default(),
            params,
            params_align,
            pool: Arc::default(),
            created: Default::default(),
            caps,
            pipelines: Mutex::new(HashMap::new()),
            tables: Mutex::new(HashMap::new()),
            pending: Mutex::new(Pending {
                encoder: None,
                pass: None,
                dispatches: 0,
                params: Vec::new(),
            }),
            failed,
        }
    }

    /// The device error recorded since the last check, if any.
    pub fn check(&self) -> Result<(), GpuError> {
        match self.failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
            None => Ok(()),
            Some(e) => Err(GpuError::Failed(e)),
        }
    }

    /// Shader source for this device: `enable f16;` when available, the
    /// constants as `const NAME: u32 = V;`, the exact half-float helpers of
    /// `shaders/f16.wgsl`, then `parts` with `#if NAME` /
    /// `#else` / `#endif` lines resolved (defined names: `F16`, `SUBGROUPS`,
    /// and every constant whose value is non-zero).
    pub fn source(&self, parts: &[&str], consts: &[(&str, u32)]) -> String {
        let mut out = String::new();
        if self.caps.f16 {
            out.push_str("enable f16;\n");
        }
        for (k, v) in consts {
            out.push_str(&format!("const {k}: u32 = {v}u;\n"));
        }
        let defined = |name: &str| {
            super::select::defined(&self.caps, name)
                || consts.iter().any(|(k, v)| *k == name && *v != 0)
        };
        out.push_str(include_str!("../../../shaders/f16.wgsl"));
        for p in parts {
            out.push_str(&preprocess(p, &defined));
            out.push('\n');
        }
        out
    }

    /// The pipeline for `key`, compiled from `source()` on first use
    /// (entry point `main`, layout derived from the shader).
    pub fn pipeline(
        &self,
        key: &KernelKey,
        source: impl FnOnce() -> String,
    ) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        if let Some(p) = self
            .pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
        {
            return Ok(p.clone());
        }
        let src = source();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(key.name),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
        let pipe = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(key.name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Shader {
                kernel: format!("{key:?}"),
                detail: e.to_string(),
            });
        }
        let pipe = Arc::new(pipe);
        self.pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), pipe.clone());
        Ok(pipe)
    }

    /// Records one dispatch: `args` at bindings `0..n`, then `params` (u32
    /// words; floats as bits) as a uniform at binding `n` when non-empty.
    pub fn dispatch(
        &self,
        pipe: &wgpu::ComputePipeline,
        args: &[Arg<'_>],
        params: &[u32],
        groups: [u32; 3],
    ) {
        self.dispatch_with(pipe, args, params, groups, &[]);
    }

    /// [`Ctx::dispatch`] with `group1` bound as bind group 1 (bindings 0..).
    pub fn dispatch_with(
        &self,
        pipe: &wgpu::ComputePipeline,
        args: &[Arg<'_>],
        params: &[u32],
        groups: [u32; 3],
        group1: &[Arg<'_>],
    ) {
        if groups.contains(&0) {
            return;
        }
        // Everything under one lock: the parameters' offset belongs to the
        // submission the dispatch is recorded into.
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut entries = bind_entries(args);
        if !params.is_empty() {
            let mut words = params.to_vec();
            words.resize(params.len().div_ceil(4) * 4, 0);
            let size = (words.len() * 4) as u64;
            let mut offset = (p.params.len() as u64).next_multiple_of(self.params_align);
            if offset + size > self.params.size() {
                // Submitting writes the parameters so far and starts over.
                self.submit_locked(&mut p);
                offset = 0;
            }
            p.params.resize(offset as usize, 0);
            p.params.extend_from_slice(bytemuck::cast_slice(&words));
            entries.push(wgpu::BindGroupEntry {
                binding: args.len() as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &self.params,
                    offset,
                    size: wgpu::BufferSize::new(size),
                }),
            });
        }
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.get_bind_group_layout(0),
            entries: &entries,
        });
        let bg1 = (!group1.is_empty()).then(|| {
            self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipe.get_bind_group_layout(1),
                entries: &bind_entries(group1),
            })
        });
        let pass = match p.pass.take() {
            Some(pass) => pass,
            None => self
                .encoder_locked(&mut p)
                .begin_compute_pass(&wgpu::ComputePassDescriptor::default())
                .forget_lifetime(),
        };
        let pass = p.pass.insert(pass);
        pass.set_pipeline(pipe);
        pass.set_bind_group(0, &bg, &[]);
        if let Some(bg1) = &bg1 {
            pass.set_bind_group(1, bg1, &[]);
        }
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        self.counted_locked(&mut p);
    }

    /// Records commands into the pending encoder (submitted in order with
    /// every dispatch recorded before and after).
    pub fn record(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        self.record_locked(&mut p, f);
    }

    fn record_locked(&self, p: &mut Pending, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        // The encoder is locked while a pass is open: end it first.
        p.pass = None;
        f(self.encoder_locked(p));
        self.counted_locked(p);
    }

    /// The pending encoder, made on first use.
    fn encoder_locked<'p>(&self, p: &'p mut Pending) -> &'p mut wgpu::CommandEncoder {
        p.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default())
        })
    }

    /// Counts a recorded command; submits after [`MAX_PENDING`].
    fn counted_locked(&self, p: &mut Pending) {
        p.dispatches += 1;
        self.recorded
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if p.dispatches >= MAX_PENDING {
            self.submit_locked(p);
        }
    }

    /// Submits the pending encoder after writing the dispatches' parameters;
    /// the parameter buffer starts over.
    fn submit_locked(&self, p: &mut Pending) {
        p.dispatches = 0;
        p.pass = None;
        if !p.params.is_empty() {
            // Lands before the submission's commands, after every earlier
            // submission's (queue order), so offset 0 can be reused.
            self.queue.write_buffer(&self.params, 0, &p.params);
            p.params.clear();
        }
        if let Some(enc) = p.encoder.take() {
            self.submits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.queue.submit([enc.finish()]);
        }
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release();
    }

    /// How many submissions this device has made.
    pub fn submits(&self) -> u64 {
        self.submits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many commands (dispatches and copies) this device has recorded.
    pub fn recorded(&self) -> u64 {
        self.recorded.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Most commands one submission holds: longer runs are submitted in
    /// pieces, so that memory held by finished temporaries comes back.
    pub const MAX_PENDING: usize = MAX_PENDING;

    /// Submits everything recorded so far.
    pub fn flush(&self) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        self.submit_locked(&mut p);
    }

    /// Blocks until the device has finished all submitted work.
    pub fn wait(&self) -> Result<(), GpuError> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| GpuError::Lost(e.to_string()))
    }

    /// Splits `n` workgroups into a grid within the per-dimension limit; a
    /// kernel recovers its index as `wg.x + wg.y * num_workgroups.x`.
    pub fn grid(&self, n: u32) -> [u32; 3] {
        let lim = self.caps.max_workgroups_per_dim.max(1);
        if n <= lim {
            [n, 1, 1]
        } else {
            let y = n.div_ceil(lim);
            [n.div_ceil(y), y, 1]
        }
    }

    /// The read-only table `name`, uploaded from `data()` on first use.
    pub fn table<E: From<GpuError>>(
        &self,
        name: &'static str,
        data: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<Arc<wgpu::Buffer>, E> {
        let mut t = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = t.get(name) {
            return Ok(b.clone());
        }
        let buf = Arc::new(self.upload(&data()?, name)?);
        t.insert(name, buf.clone());
        Ok(buf)
    }

    /// A storage buffer of at least `bytes` (rounded up to 16, within one
    /// binding), mapped when `mapped`; its size is `buf.size()`.
    fn buffer(&self, bytes: u64, label: &str, mapped: bool) -> Result<wgpu::Buffer, GpuError> {
        let size = bytes.max(16).next_multiple_of(16);
        if size > self.caps.max_binding {
            return Err(GpuError::TooLarge {
                what: label.to_string(),
                bytes: size,
                limit: self.caps.max_binding,
            });
        }
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: mapped,
        });
        self.check()?;
        Ok(buf)
    }

    /// A storage buffer of at least `bytes` (rounded up to 16), NaN-poisoned
    /// when the caps ask for it.
    pub fn storage(&self, bytes: u64, label: &str) -> Result<wgpu::Buffer, GpuError> {
        let buf = self.buffer(bytes, label, self.caps.poison)?;
        if self.caps.poison {
            let nan = f32::NAN.to_le_bytes();
            let mut view = buf.slice(..).get_mapped_range_mut().map_err(map_err)?;
            let bytes: Vec<u8> = (0..buf.size() as usize).map(|i| nan[i % 4]).collect();
            view.copy_from_slice(&bytes);
            drop(view);
            buf.unmap();
        }
        Ok(buf)
    }

    /// A pooled buffer of `size` bytes: a free one from the pool, passed to
    /// `reused` to be written through the queue, else `new()`.
    fn pooled(
        &self,
        size: u64,
        reused: impl FnOnce(&wgpu::Buffer),
        new: impl FnOnce() -> Result<wgpu::Buffer, GpuError>,
    ) -> Result<Arc<Pooled>, GpuError> {
        let free = {
            let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            if p.encoder.is_none() {
                // Everything recorded has been submitted.
                pool.release();
            }
            pool.take(size)
        };
        let buf = match free {
            Some(buf) => {
                reused(&buf);
                buf
            }
            None => {
                self.created
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                new()?
            }
        };
        Ok(Pooled::new(buf, &self.pool))
    }

    /// An activation buffer of at least `bytes` (rounded up to 16): a free
    /// one of that size from the pool, else a new one; NaN-filled when the
    /// caps ask for it either way.
    pub fn activation(&self, bytes: u64, label: &str) -> Result<Arc<Pooled>, GpuError> {
        let size = bytes.max(16).next_multiple_of(16);
        let poison = |buf: &wgpu::Buffer| {
            if self.caps.poison {
                // Lands after every earlier submission (see pool.rs).
                let nan = f32::NAN.to_le_bytes();
                let bytes: Vec<u8> = (0..size as usize).map(|i| nan[i % 4]).collect();
                self.queue.write_buffer(buf, 0, &bytes);
            }
        };
        self.pooled(size, poison, || self.storage(size, label))
    }

    /// A pooled storage buffer holding `data` (a step's small lists and
    /// tables): reused like an activation and written through the queue,
    /// after every earlier submission (see pool.rs) and before the commands
    /// recorded next.
    pub fn upload_temp(&self, data: &[u8], label: &str) -> Result<Arc<Pooled>, GpuError> {
        let size = (data.len() as u64).max(16).next_multiple_of(16);
        let write = |buf: &wgpu::Buffer| {
            let mut words = data.to_vec();
            words.resize(data.len().next_multiple_of(4), 0);
            if !words.is_empty() {
                self.queue.write_buffer(buf, 0, &words);
            }
        };
        self.pooled(size, write, || self.upload(data, label))
    }

    /// How many pooled buffers (activations and [`Ctx::upload_temp`]'s)
    /// this device has created rather than reused.
    pub fn buffers_created(&self) -> u64 {
        self.created.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A storage buffer holding `data` (padded to a multiple of 16 bytes).
    pub fn upload(&self, data: &[u8], label: &str) -> Result<wgpu::Buffer, GpuError> {
        let buf = self.buffer(data.len() as u64, label, true)?;
        {
            let mut view = buf.slice(..).get_mapped_range_mut().map_err(map_err)?;
            view.slice(..data.len()).copy_from_slice(data);
        }
        buf.unmap();
        Ok(buf)
    }

    /// How many read-backs this device has made: each one submits the
    /// work recorded so far and waits for it (a test counts them per step).
    pub fn readbacks(&self) -> u64 {
        self.readbacks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Reads `len` bytes at `offset` of `buf` back to the host, after every
    /// recorded command has run.
    pub fn read(&self, buf: &wgpu::Buffer, offset: u64, len: u64) -> Result<Vec<u8>, GpuError> {
        self.readbacks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let size = len.next_multiple_of(4).max(4);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.record(|enc| enc.copy_buffer_to_buffer(buf, offset, &staging, 0, size));
        self.flush();
        let (tx, rx) = std::sync::mpsc::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        self.check()?;
        rx.recv()
            .map_err(|e| GpuError::Lost(e.to_string()))?
            .map_err(|e| GpuError::Lost(e.to_string()))?;
        let view = staging.slice(..).get_mapped_range().map_err(map_err)?;
        Ok(view[..len as usize].to_vec())
    }
}

fn map_err(e: impl std::fmt::Display) -> GpuError {
    GpuError::Lost(e.to_string())
}

/// Resolves `#if NAME` / `#else` / `#endif` lines (nestable).
pub fn preprocess(src: &str, defined: &dyn Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(src.len());
    // Each level: (this branch active, some branch of this #if was taken).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |s: &Vec<(bool, bool)>| s.iter().all(|(a, _)| *a);
    for line in src.lines() {
        let t = line.trim_start();
        if let Some(name) = t.strip_prefix("#if ") {
            let on = defined(name.trim());
            stack.push((on, on));
        } else if t.starts_with("#else") {
            if let Some(top) = stack.last_mut() {
                top.0 = !top.1;
                top.1 = true;
            }
        } else if t.starts_with("#endif") {
            stack.pop();
        } else if active(&stack) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::preprocess;

    #[test]
    fn preprocess_picks_branches() {
        let src = "a\n#if X\nb\n#if Y\nc\n#else\nd\n#endif\n#else\ne\n#endif\nf\n";
        let on = |n: &str| n == "X";
        assert_eq!(preprocess(src, &on), "a\nb\nd\nf\n");
        let off = |_: &str| false;
        assert_eq!(preprocess(src, &off), "a\ne\nf\n");
    }
}
