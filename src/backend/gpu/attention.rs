//! Attention over the GPU KV cache: the cache itself ([`GpuKv`]), its writes
//! (`shaders/kv_write.wgsl`), flash attention for prompts
//! (`shaders/flash_attn.wgsl`) and split-KV attention for decode
//! (`shaders/flash_attn_decode.wgsl` + `shaders/flash_attn_reduce.wgsl`).
//!
//! The semantics are [`crate::backend::Backend::attention`]'s, as the CPU
//! backend computes them: the cache holds rows of `n_embd_k` (`n_embd_v`)
//! elements per position; query token `i` sits at `pos0 + i` and sees keys
//! `0..=pos0 + i` (minus those `>= window` behind it), head `h` reads kv head
//! `h / (n_head / n_head_kv)`, and a sink joins the softmax's max and
//! denominator without a value. Scores use `head_dim` (`DK`) elements of Q
//! and K, the output `head_dim_v` (`DV`) of V. A K-only cache (MLA) has no
//! value buffers: the kernels bind the key buffer as values too and read
//! the first `DV` elements of each key head row.
//!
//! The cache is split by position into parts that each fit one storage
//! binding. f16 caches are stored as f16 pairs packed in u32 words (core
//! WGSL), so they work without `shader-f16`; with it the prompt kernel stages
//! its tiles as f16. This module knows nothing of models or layers.

use super::{Arg, Ctx, GpuBackend, GpuError, GpuTensor, GpuWeight, KernelKey};
use crate::backend::{check_attention, AttnParams, BackendError, BatchPos, KvShape};
use crate::tensor::GgmlType;

/// Batches of at most this many tokens use the split-KV decode kernels.
const DECODE_MAX_T: usize = 4;
/// The decode path aims for about this many workgroups (chunks x tokens x
/// heads) so that a single token still fills a GPU.
const DECODE_TARGET_WGS: usize = 256;
/// Workgroup memory every WebGPU device offers
/// (`maxComputeWorkgroupStorageSize`); the prompt kernel's tiles fit in it.
const WG_MEMORY: usize = 16384;
/// Threads of a prompt-kernel workgroup (`WG` in `flash_attn.wgsl`).
const PROMPT_WG: usize = 64;
/// Largest Q/K head dimension the kernels are built for (DeepSeek's MLA:
/// 576).
const MAX_HEAD_DIM: usize = 576;
/// Largest V head dimension the kernels are built for (MLA: 512).
const MAX_HEAD_DIM_V: usize = 512;

/// Positions `first..first + count` of one layer's keys and values (no
/// value buffer in a K-only cache).
struct KvPart {
    first: usize,
    count: usize,
    k: wgpu::Buffer,
    v: Option<wgpu::Buffer>,
}

impl KvPart {
    /// The buffer the kernels read values from: the keys of a K-only cache.
    fn values(&self) -> &wgpu::Buffer {
        self.v.as_ref().unwrap_or(&self.k)
    }
}

/// One layer's KV cache on the device: `n_ctx` rows of `n_embd_k` keys and
/// `n_embd_v` values (0: K-only), f16 (packed in pairs) or f32, split by
/// position into parts that fit one storage binding each. Starts zeroed,
/// like the CPU's.
pub struct GpuKv {
    pub n_ctx: usize,
    pub n_embd_k: usize,
    pub n_embd_v: usize,
    pub dtype: GgmlType,
    parts: Vec<KvPart>,
}

impl GpuKv {
    /// How many buffers (position ranges) the cache is split into.
    pub fn n_parts(&self) -> usize {
        self.parts.len()
    }

    /// Bytes of device memory the cache holds.
    pub fn bytes(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| p.k.size() + p.v.as_ref().map_or(0, |v| v.size()))
            .sum()
    }

    fn shape(&self) -> KvShape {
        KvShape {
            n_ctx: self.n_ctx,
            n_embd_k: self.n_embd_k,
            n_embd_v: self.n_embd_v,
        }
    }
}

fn elt_bytes(dtype: GgmlType) -> Option<usize> {
    match dtype {
        GgmlType::F16 => Some(2),
        GgmlType::F32 => Some(4),
        _ => None,
    }
}

fn shape(detail: String) -> BackendError {
    BackendError::Shape {
        op: "attention",
        detail,
    }
}

pub(super) fn new_kv(
    b: &GpuBackend,
    n_ctx: usize,
    n_embd_k: usize,
    n_embd_v: usize,
    dtype: GgmlType,
) -> Result<GpuKv, BackendError> {
    let ctx = b.ctx();
    let elt = elt_bytes(dtype).ok_or(BackendError::Unsupported {
        op: "kv cache",
        backend: "gpu",
        dtype,
    })?;
    if n_embd_k == 0 || !n_embd_k.is_multiple_of(2) || !n_embd_v.is_multiple_of(2) {
        return Err(BackendError::Shape {
            op: "kv cache",
            detail: format!(
                "rows of {n_embd_k} keys / {n_embd_v} values (must be even, non-zero keys; \
                 0 values: K-only)"
            ),
        });
    }
    // Positions per part: whole rows within one binding (whose size the
    // allocator rounds up to 16 bytes).
    let row = n_embd_k.max(n_embd_v) * elt;
    let lim = (ctx.caps.max_binding & !15) as usize;
    if row > lim {
        return Err(GpuError::TooLarge {
            what: "one KV cache row".into(),
            bytes: row as u64,
            limit: ctx.caps.max_binding,
        }
        .into());
    }
    let per = lim / row;
    let mut parts = Vec::new();
    let mut first = 0;
    while first < n_ctx {
        let count = per.min(n_ctx - first);
        let k = ctx.storage((count * n_embd_k * elt) as u64, "kv cache k")?;
        let v = if n_embd_v > 0 {
            Some(ctx.storage((count * n_embd_v * elt) as u64, "kv cache v")?)
        } else {
            None
        };
        ctx.record(|enc| {
            enc.clear_buffer(&k, 0, None);
            if let Some(v) = &v {
                enc.clear_buffer(v, 0, None);
            }
        });
        parts.push(KvPart { first, count, k, v });
        first += count;
    }
    Ok(GpuKv {
        n_ctx,
        n_embd_k,
        n_embd_v,
        dtype,
        parts,
    })
}

/// [`crate::backend::Backend::kv_read`]: the keys of every part that holds
/// positions below `n`, then their values.
pub(super) fn kv_read(b: &GpuBackend, kv: &GpuKv, n: usize) -> Result<Vec<u8>, BackendError> {
    let (kb, vb) = crate::backend::kv_bytes_of(kv.shape(), kv.dtype, n)?;
    let ctx = b.ctx();
    let elt = elt_bytes(kv.dtype).unwrap_or(2);
    let mut keys = Vec::with_capacity(kb + vb);
    let mut values = Vec::with_capacity(vb);
    for p in kv.parts.iter().filter(|p| p.first < n) {
        let rows = p.count.min(n - p.first);
        keys.extend(ctx.read(&p.k, 0, (rows * kv.n_embd_k * elt) as u64)?);
        if let Some(v) = &p.v {
            values.extend(ctx.read(v, 0, (rows * kv.n_embd_v * elt) as u64)?);
        }
    }
    keys.extend(values);
    Ok(keys)
}

/// [`crate::backend::Backend::kv_write`]: each part's rows below `n`
/// uploaded and copied in order with the recorded commands.
pub(super) fn kv_write(
    b: &GpuBackend,
    kv: &mut GpuKv,
    n: usize,
    bytes: &[u8],
) -> Result<(), BackendError> {
    let (kb, vb) = crate::backend::kv_bytes_of(kv.shape(), kv.dtype, n)?;
    if bytes.len() != kb + vb {
        return Err(shape(format!(
            "{} bytes for {n} positions of a KV cache ({} expected)",
            bytes.len(),
            kb + vb
        )));
    }
    let ctx = b.ctx();
    let elt = elt_bytes(kv.dtype).unwrap_or(2);
    let (mut ka, mut va) = (0, kb);
    for p in kv.parts.iter().filter(|p| p.first < n) {
        let rows = p.count.min(n - p.first);
        let put = |dst: &wgpu::Buffer, at: &mut usize, width: usize| -> Result<(), BackendError> {
            let len = rows * width * elt;
            // Even widths (checked at creation) keep every length a
            // multiple of 4, as buffer copies need.
            if len > 0 {
                let src = ctx.upload(&bytes[*at..*at + len], "kv restore")?;
                ctx.record(|enc| enc.copy_buffer_to_buffer(&src, 0, dst, 0, len as u64));
            }
            *at += len;
            Ok(())
        };
        put(&p.k, &mut ka, kv.n_embd_k)?;
        if let Some(v) = &p.v {
            put(v, &mut va, kv.n_embd_v)?;
        }
    }
    ctx.flush();
    ctx.check()?;
    Ok(())
}

/// Pipeline key bits shared by the attention kernels.
#[derive(Clone, Copy, Default)]
struct Spec {
    head_dim: usize,
    head_dim_v: usize,
    /// Values read from the key rows (a K-only cache).
    k_only: bool,
    kv_f16: bool,
    tile_f16: bool,
    sinks: bool,
    subgroups: bool,
    /// log2 of the tile rows / tile keys / workgroup size / min subgroup.
    br: u32,
    bc: u32,
    wg: u32,
    sg_min: u32,
}

impl Spec {
    fn bits(&self) -> u64 {
        self.head_dim as u64
            | (self.head_dim_v as u64) << 10
            | (self.k_only as u64) << 20
            | (self.kv_f16 as u64) << 21
            | (self.tile_f16 as u64) << 22
            | (self.sinks as u64) << 23
            | (self.subgroups as u64) << 24
            | (self.br as u64) << 28
            | (self.bc as u64) << 32
            | (self.wg as u64) << 36
            | (self.sg_min as u64) << 40
    }
}

/// Tile shape of the prompt kernel for head dims `dk` (Q, K) and `dv` (V)
/// and the K/V tile element size (the Q tile is f32): `(BR query rows, BC
/// keys)`, the first of a preference list whose Q tile (`BR x dk`), K/V
/// tile (`BC x max(dk, dv)`: V replaces K) and score tile fit
/// [`WG_MEMORY`]. The last entries serve MLA's heads of 576.
fn prompt_tiles(dk: usize, dv: usize, elt: usize) -> Option<(usize, usize)> {
    const PREF: [(usize, usize); 12] = [
        (16, 32),
        (16, 16),
        (8, 32),
        (16, 8),
        (8, 16),
        (8, 8),
        (4, 16),
        (4, 8),
        (4, 4),
        (4, 2),
        (2, 4),
        (2, 2),
    ];
    let dkv = dk.max(dv);
    PREF.into_iter()
        .find(|&(br, bc)| br * dk * 4 + bc * dkv * elt + br * bc * 4 <= WG_MEMORY)
}

/// Workgroup size of the decode kernel: a power of two of at least 64 and
/// of the adapter's largest subgroup.
fn decode_wg(ctx: &Ctx) -> usize {
    super::select::decode_wg(&ctx.caps)
}

fn log2(x: usize) -> u32 {
    x.trailing_zeros()
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    b: &GpuBackend,
    kv: &mut GpuKv,
    q: &GpuTensor,
    k: &GpuTensor,
    v: &GpuTensor,
    sinks: Option<&GpuWeight>,
    pos: BatchPos,
    p: &AttnParams,
) -> Result<GpuTensor, BackendError> {
    let t = pos.n_tokens;
    let end = pos.pos0 + t;
    check_attention(
        p,
        &[kv.shape()],
        &[pos],
        (q.rows, q.cols),
        (k.rows, k.cols),
        (v.rows, v.cols),
        sinks.map(|w| w.ne[0]),
    )?;
    let (hd, dv) = (p.head_dim, p.head_dim_v);
    // What these kernels support beyond the contract.
    if !hd.is_multiple_of(2) || !dv.is_multiple_of(2) || hd > MAX_HEAD_DIM || dv > MAX_HEAD_DIM_V {
        return Err(shape(format!(
            "heads of {hd} (K) / {dv} (V): the GPU kernels take even head sizes of at most \
             {MAX_HEAD_DIM} (K) / {MAX_HEAD_DIM_V} (V)"
        )));
    }
    let sinks = match sinks {
        // (Their count was checked with the contract.)
        Some(w) if w.ty != GgmlType::F32 || w.parts.len() != 1 => {
            return Err(shape(format!(
                "sinks {:?} of {} for {} heads (want one f32 per head)",
                w.ne,
                w.ty.name(),
                p.n_head
            )))
        }
        Some(w) => Some(&w.parts[0].buf),
        None => None,
    };
    // Every index the kernels compute stays below the largest of these.
    let largest = end.max(t * p.n_head * (hd.max(dv) + 2));
    if u32::try_from(largest).is_err() {
        return Err(shape(format!(
            "{largest} positions or elements do not fit the kernels' u32 indices"
        )));
    }
    if t == 0 {
        return b.tensor(0, p.n_head * dv);
    }
    write_kv(b.ctx(), kv, k, v, pos)?;
    if !pos.steps || t == 1 {
        return attend(b, kv, q, sinks, pos, p);
    }
    // Verification rows as the decode steps they stand for: row `i` sees
    // the cache up to its own position through the decode step's kernels,
    // so that it computes what that step would, to the bit.
    let ctx = b.ctx();
    let out = b.tensor(t, p.n_head * dv)?;
    let (q_row, o_row) = ((q.cols * 4) as u64, (p.n_head * dv * 4) as u64);
    for i in 0..t {
        let qi = b.tensor(1, q.cols)?;
        ctx.record(|enc| enc.copy_buffer_to_buffer(&q.buf, i as u64 * q_row, &qi.buf, 0, q_row));
        let step = BatchPos {
            pos0: pos.pos0 + i,
            n_tokens: 1,
            steps: false,
        };
        let oi = attend(b, kv, &qi, sinks, step, p)?;
        ctx.record(|enc| enc.copy_buffer_to_buffer(&oi.buf, 0, &out.buf, i as u64 * o_row, o_row));
    }
    Ok(out)
}

/// Attention of the batch `q` at `pos` over a cache that already holds its
/// keys and values.
fn attend(
    b: &GpuBackend,
    kv: &GpuKv,
    q: &GpuTensor,
    sinks: Option<&wgpu::Buffer>,
    pos: BatchPos,
    p: &AttnParams,
) -> Result<GpuTensor, BackendError> {
    let (t, dv) = (pos.n_tokens, p.head_dim_v);
    let end = pos.pos0 + t;
    let kv_f16 = kv.dtype == GgmlType::F16;
    let out = b.tensor(t, p.n_head * dv)?;
    // Keys the first query may see: nothing before `lo` is read.
    let lo = p
        .window
        .map_or(0, |w| (pos.pos0 + 1).saturating_sub(w as usize));
    let ranges: Vec<(&KvPart, usize, usize)> = kv
        .parts
        .iter()
        .filter_map(|part| {
            let a = part.first.max(lo);
            let z = (part.first + part.count).min(end);
            (a < z).then_some((part, a, z))
        })
        .collect();
    let common = Common {
        ctx: b.ctx(),
        q,
        sinks,
        pos,
        p,
        kv_f16,
        k_only: kv.n_embd_v == 0,
        n_embd_k: kv.n_embd_k,
        // A K-only cache's value rows are its key rows.
        n_embd_v: if kv.n_embd_v == 0 {
            kv.n_embd_k
        } else {
            kv.n_embd_v
        },
        ranges: &ranges,
        out: &out,
    };
    if t <= DECODE_MAX_T && decode(&common)? {
        return Ok(out);
    }
    prompt(&common)?;
    Ok(out)
}

/// What the attention dispatches share.
struct Common<'a> {
    ctx: &'a Ctx,
    q: &'a GpuTensor,
    sinks: Option<&'a wgpu::Buffer>,
    pos: BatchPos,
    p: &'a AttnParams,
    kv_f16: bool,
    /// Values are read from the key rows.
    k_only: bool,
    n_embd_k: usize,
    /// Elements between the value rows of consecutive positions.
    n_embd_v: usize,
    /// Cache parts holding keys the batch may see, with the positions
    /// `[a, z)` of those keys in each.
    ranges: &'a [(&'a KvPart, usize, usize)],
    out: &'a GpuTensor,
}

impl Common<'_> {
    /// The leading uniform fields of both attention kernels (their `Params`
    /// up to `kb`): shapes, the batch's first position, and the cache part
    /// with the key range `[a, z)` this dispatch walks.
    fn part_params(&self, part: &KvPart, a: usize, z: usize) -> [u32; 9] {
        let p = self.p;
        [
            self.pos.n_tokens as u32,
            p.n_head as u32,
            (p.n_head / p.n_head_kv) as u32,
            self.n_embd_k as u32,
            self.n_embd_v as u32,
            self.pos.pos0 as u32,
            part.first as u32,
            a as u32,
            z as u32,
        ]
    }

    /// Shader constants of the head sizes: `DK`, `DV` and `VH`, the value
    /// pairs between consecutive kv heads (`DK / 2` when values are read
    /// from the key rows).
    fn head_consts(&self) -> [(&'static str, u32); 3] {
        let (dk, dv) = (self.p.head_dim as u32, self.p.head_dim_v as u32);
        [
            ("DK", dk),
            ("DV", dv),
            ("VH", if self.k_only { dk / 2 } else { dv / 2 }),
        ]
    }
}

/// Writes `k` and `v` at positions `pos0..pos0 + t` of every part they touch.
fn write_kv(
    ctx: &Ctx,
    kv: &GpuKv,
    k: &GpuTensor,
    v: &GpuTensor,
    pos: BatchPos,
) -> Result<(), BackendError> {
    let f16 = kv.dtype == GgmlType::F16;
    let pipe = ctx.pipeline(&KernelKey::new("kv_write").variant(f16 as u32), || {
        ctx.source(
            &[include_str!("../../../shaders/kv_write.wgsl")],
            &[("KV_F16", f16 as u32)],
        )
    })?;
    let end = pos.pos0 + pos.n_tokens;
    // Elements per u32 word of the cache.
    let per_word = if f16 { 2 } else { 1 };
    for part in &kv.parts {
        let a = part.first.max(pos.pos0);
        let z = (part.first + part.count).min(end);
        if a >= z {
            continue;
        }
        // A K-only cache writes no values.
        let writes = [
            Some((&k.buf, &part.k, kv.n_embd_k)),
            part.v.as_ref().map(|pv| (&v.buf, pv, kv.n_embd_v)),
        ];
        for (src, dst, n_embd) in writes.into_iter().flatten() {
            let n = ((z - a) * n_embd / per_word) as u32;
            let params = [
                n,
                ((a - pos.pos0) * n_embd) as u32,
                ((a - part.first) * n_embd / per_word) as u32,
            ];
            ctx.dispatch(
                &pipe,
                &[Arg::Buf(src), Arg::Buf(dst)],
                &params,
                ctx.grid(n.div_ceil(256)),
            );
        }
    }
    Ok(())
}

/// Flash attention for any batch, one dispatch per cache part; the softmax
/// state crosses parts in `out` and a `(m, l)` buffer.
fn prompt(c: &Common) -> Result<(), BackendError> {
    let ctx = c.ctx;
    let (p, t, hd, dv) = (c.p, c.pos.n_tokens, c.p.head_dim, c.p.head_dim_v);
    let tile_f16 = super::select::prompt_tile_f16(&ctx.caps, c.kv_f16);
    let (br, bc) = prompt_tiles(hd, dv, if tile_f16 { 2 } else { 4 }).ok_or_else(|| {
        shape(format!(
            "heads of {hd} (K) / {dv} (V) need more workgroup memory than the prompt kernel has"
        ))
    })?;
    let spec = Spec {
        head_dim: hd,
        head_dim_v: dv,
        k_only: c.k_only,
        kv_f16: c.kv_f16,
        tile_f16,
        sinks: c.sinks.is_some(),
        br: log2(br),
        bc: log2(bc),
        wg: log2(PROMPT_WG),
        ..Default::default()
    };
    let pipe = ctx.pipeline(&KernelKey::new("flash_attn").variant(spec.bits()), || {
        ctx.source(
            &[
                include_str!("../../../shaders/kv_read.wgsl"),
                include_str!("../../../shaders/flash_attn.wgsl"),
            ],
            &[
                &c.head_consts()[..],
                &[
                    ("BR", br as u32),
                    ("BC", bc as u32),
                    ("KV_F16", c.kv_f16 as u32),
                    ("TILE_F16", tile_f16 as u32),
                    ("SINKS", c.sinks.is_some() as u32),
                ],
            ]
            .concat(),
        )
    })?;
    let ml = ctx.storage(
        if c.ranges.len() > 1 {
            (t * p.n_head * 8) as u64
        } else {
            16
        },
        "attention state",
    )?;
    let groups = ctx.grid((t.div_ceil(br) * p.n_head) as u32);
    let n = c.ranges.len();
    for (i, &(part, a, z)) in c.ranges.iter().enumerate() {
        let params = [
            &c.part_params(part, a, z)[..],
            &[
                p.window.unwrap_or(0),
                (i == 0) as u32,
                (i + 1 == n) as u32,
                p.scale.to_bits(),
            ],
        ]
        .concat();
        let mut args = vec![
            Arg::Buf(&c.q.buf),
            Arg::Buf(&part.k),
            Arg::Buf(part.values()),
        ];
        if let Some(s) = c.sinks {
            args.push(Arg::Buf(s));
        }
        args.push(Arg::Buf(&c.out.buf));
        args.push(Arg::Buf(&ml));
        ctx.dispatch(&pipe, &args, &params, groups);
    }
    Ok(())
}

/// Split-KV attention for a few tokens: partials per (chunk, token, head),
/// then one reduce. Returns `false` (nothing recorded) when the partials
/// would not fit one binding; the caller then runs [`prompt`].
fn decode(c: &Common) -> Result<bool, BackendError> {
    let ctx = c.ctx;
    let (p, t, hd, dv) = (c.p, c.pos.n_tokens, c.p.head_dim, c.p.head_dim_v);
    let wg = decode_wg(ctx);
    let span = c.ranges.iter().map(|&(_, a, z)| z - a).sum::<usize>();
    let rows = t * p.n_head;
    let row_bytes = ((dv + 2) * 4) as u64;
    let count = |chunk_len: usize| -> usize {
        c.ranges
            .iter()
            .map(|&(_, a, z)| (z - a).div_ceil(chunk_len))
            .sum()
    };
    // Chunks of whole blocks of `wg` keys, as many as fill the GPU; fewer
    // (longer) when the partials would not fit one binding.
    let want = DECODE_TARGET_WGS.div_ceil(rows).max(1);
    let mut chunk_len = span.div_ceil(want).next_multiple_of(wg).max(wg);
    loop {
        let bytes = (count(chunk_len) * rows) as u64 * row_bytes;
        if bytes <= ctx.caps.max_binding {
            break;
        }
        if chunk_len >= span {
            return Ok(false);
        }
        chunk_len *= 2;
    }
    let n_chunks = count(chunk_len);
    let sg_min = super::select::decode_sg_min(&ctx.caps, wg);
    let spec = Spec {
        head_dim: hd,
        head_dim_v: dv,
        k_only: c.k_only,
        kv_f16: c.kv_f16,
        subgroups: ctx.caps.subgroups,
        wg: log2(wg),
        sg_min: sg_min.trailing_zeros(),
        ..Default::default()
    };
    let pipe = ctx.pipeline(
        &KernelKey::new("flash_attn_decode").variant(spec.bits()),
        || {
            ctx.source(
                &[
                    include_str!("../../../shaders/kv_read.wgsl"),
                    include_str!("../../../shaders/flash_attn_decode.wgsl"),
                ],
                &[
                    &c.head_consts()[..],
                    &[
                        ("WG", wg as u32),
                        ("SG_MIN", sg_min),
                        ("KV_F16", c.kv_f16 as u32),
                    ],
                ]
                .concat(),
            )
        },
    )?;
    let rspec = Spec {
        head_dim_v: dv,
        sinks: c.sinks.is_some(),
        ..Default::default()
    };
    let reduce = ctx.pipeline(
        &KernelKey::new("flash_attn_reduce").variant(rspec.bits()),
        || {
            ctx.source(
                &[include_str!("../../../shaders/flash_attn_reduce.wgsl")],
                &[("DV", dv as u32), ("SINKS", c.sinks.is_some() as u32)],
            )
        },
    )?;
    let partials = ctx.storage((n_chunks * rows) as u64 * row_bytes, "attention partials")?;
    let mut base = 0;
    for &(part, a, z) in c.ranges {
        let n = (z - a).div_ceil(chunk_len);
        let params = [
            &c.part_params(part, a, z)[..],
            &[
                chunk_len as u32,
                base as u32,
                n as u32,
                p.window.unwrap_or(0),
                p.scale.to_bits(),
            ],
        ]
        .concat();
        ctx.dispatch(
            &pipe,
            &[
                Arg::Buf(&c.q.buf),
                Arg::Buf(&part.k),
                Arg::Buf(part.values()),
                Arg::Buf(&partials),
            ],
            &params,
            ctx.grid((n * rows) as u32),
        );
        base += n;
    }
    let mut args = vec![Arg::Buf(&partials)];
    if let Some(s) = c.sinks {
        args.push(Arg::Buf(s));
    }
    args.push(Arg::Buf(&c.out.buf));
    ctx.dispatch(
        &reduce,
        &args,
        &[t as u32, p.n_head as u32, n_chunks as u32],
        ctx.grid(rows as u32),
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_tiles_fit_workgroup_memory() {
        for hd in (2..=MAX_HEAD_DIM).step_by(2) {
            for dv in [
                hd.min(MAX_HEAD_DIM_V),
                hd * 2 / 3 / 2 * 2,
                2,
                MAX_HEAD_DIM_V,
            ] {
                for elt in [2, 4] {
                    let (br, bc) = prompt_tiles(hd, dv.max(2), elt).expect("tiles");
                    let dkv = hd.max(dv);
                    assert!(br * hd * 4 + bc * dkv * elt + br * bc * 4 <= WG_MEMORY);
                }
            }
        }
        assert_eq!(prompt_tiles(64, 64, 2), Some((16, 32)));
        assert_eq!(prompt_tiles(128, 128, 2), Some((16, 16)));
        assert_eq!(prompt_tiles(128, 128, 4), Some((16, 8)));
        // MLA: K heads of 576, V of 512.
        assert_eq!(prompt_tiles(576, 512, 2), Some((4, 4)));
        assert_eq!(prompt_tiles(576, 512, 4), Some((4, 2)));
    }
}
