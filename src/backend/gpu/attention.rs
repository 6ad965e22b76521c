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
//! denominator without a value.
//!
//! The cache is split by position into parts that each fit one storage
//! binding. f16 caches are stored as f16 pairs packed in u32 words (core
//! WGSL), so they work without `shader-f16`; with it the prompt kernel stages
//! its tiles as f16. This module knows nothing of models or layers.

use super::{Arg, Ctx, GpuBackend, GpuError, GpuTensor, GpuWeight, KernelKey};
use crate::backend::{AttnParams, BackendError, BatchPos};
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
/// Largest head dimension the kernels are built for.
const MAX_HEAD_DIM: usize = 256;

/// Positions `first..first + count` of one layer's keys and values.
struct KvPart {
    first: usize,
    count: usize,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
}

/// One layer's KV cache on the device: `n_ctx` rows of `n_embd_k` keys and
/// `n_embd_v` values, f16 (packed in pairs) or f32, split by position into
/// parts that fit one storage binding each. Starts zeroed, like the CPU's.
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
        self.parts.iter().map(|p| p.k.size() + p.v.size()).sum()
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
    if n_embd_k == 0 || n_embd_v == 0 || !n_embd_k.is_multiple_of(2) || !n_embd_v.is_multiple_of(2)
    {
        return Err(BackendError::Shape {
            op: "kv cache",
            detail: format!("rows of {n_embd_k} keys / {n_embd_v} values (must be even, non-zero)"),
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
        let v = ctx.storage((count * n_embd_v * elt) as u64, "kv cache v")?;
        ctx.record(|enc| {
            enc.clear_buffer(&k, 0, None);
            enc.clear_buffer(&v, 0, None);
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

/// Pipeline key bits shared by the attention kernels.
#[derive(Clone, Copy, Default)]
struct Spec {
    head_dim: usize,
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
    fn bits(&self) -> u32 {
        self.head_dim as u32
            | (self.kv_f16 as u32) << 11
            | (self.tile_f16 as u32) << 12
            | (self.sinks as u32) << 13
            | (self.subgroups as u32) << 14
            | self.br << 16
            | self.bc << 20
            | self.wg << 24
            | self.sg_min << 28
    }
}

/// Tile shape of the prompt kernel for `head_dim` and the K/V tile element
/// size (the Q tile is f32): `(BR query rows, BC keys)`, the first of a
/// preference list whose Q tile, K/V tile and score tile fit [`WG_MEMORY`].
fn prompt_tiles(head_dim: usize, elt: usize) -> Option<(usize, usize)> {
    const PREF: [(usize, usize); 9] = [
        (16, 32),
        (16, 16),
        (8, 32),
        (16, 8),
        (8, 16),
        (8, 8),
        (4, 16),
        (4, 8),
        (4, 4),
    ];
    PREF.into_iter()
        .find(|&(br, bc)| br * head_dim * 4 + bc * head_dim * elt + br * bc * 4 <= WG_MEMORY)
}

/// Workgroup size of the decode kernel: a power of two of at least 64 and
/// of the adapter's largest subgroup.
fn decode_wg(ctx: &Ctx) -> usize {
    (ctx.caps.subgroup_max.max(1) as usize)
        .next_power_of_two()
        .clamp(64, 256)
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
    if end > kv.n_ctx {
        return Err(BackendError::ContextFull {
            pos: end - 1,
            n_ctx: kv.n_ctx,
        });
    }
    let hd = p.head_dim;
    if p.n_head == 0
        || p.n_head_kv == 0
        || !p.n_head.is_multiple_of(p.n_head_kv)
        || hd == 0
        || !hd.is_multiple_of(2)
        || hd > MAX_HEAD_DIM
        || q.cols != p.n_head * hd
        || q.rows != t
        || kv.n_embd_k != p.n_head_kv * hd
        || kv.n_embd_v != p.n_head_kv * hd
        || k.cols != kv.n_embd_k
        || v.cols != kv.n_embd_v
        || k.rows != t
        || v.rows != t
    {
        return Err(shape(format!(
            "q [{}, {}], k [{}, {}], v [{}, {}], {} heads / {} kv heads of {hd} \
             (even, at most {MAX_HEAD_DIM}), {t} tokens, cache rows {}/{}",
            q.rows,
            q.cols,
            k.rows,
            k.cols,
            v.rows,
            v.cols,
            p.n_head,
            p.n_head_kv,
            kv.n_embd_k,
            kv.n_embd_v
        )));
    }
    if p.window == Some(0) {
        return Err(shape("a sliding window of 0 positions sees no key".into()));
    }
    let sinks = match sinks {
        Some(w) if w.ty != GgmlType::F32 || w.ne[0] != p.n_head || w.parts.len() != 1 => {
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
    let largest = end.max(t * p.n_head * (hd + 2));
    if u32::try_from(largest).is_err() {
        return Err(shape(format!(
            "{largest} positions or elements do not fit the kernels' u32 indices"
        )));
    }
    if t == 0 {
        return b.tensor(0, q.cols);
    }
    let kv_f16 = kv.dtype == GgmlType::F16;
    write_kv(b.ctx(), kv, k, v, pos)?;

    let out = b.tensor(t, q.cols)?;
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
        n_embd_k: kv.n_embd_k,
        n_embd_v: kv.n_embd_v,
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
    n_embd_k: usize,
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
        for (src, dst, n_embd) in [
            (&k.buf, &part.k, kv.n_embd_k),
            (&v.buf, &part.v, kv.n_embd_v),
        ] {
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
    let (p, t, hd) = (c.p, c.pos.n_tokens, c.p.head_dim);
    let tile_f16 = ctx.caps.f16 && c.kv_f16;
    let (br, bc) = prompt_tiles(hd, if tile_f16 { 2 } else { 4 }).ok_or_else(|| {
        shape(format!(
            "head_dim {hd} needs more workgroup memory than the prompt kernel has"
        ))
    })?;
    let spec = Spec {
        head_dim: hd,
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
                ("HD", hd as u32),
                ("BR", br as u32),
                ("BC", bc as u32),
                ("KV_F16", c.kv_f16 as u32),
                ("TILE_F16", tile_f16 as u32),
                ("SINKS", c.sinks.is_some() as u32),
            ],
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
        let mut args = vec![Arg::Buf(&c.q.buf), Arg::Buf(&part.k), Arg::Buf(&part.v)];
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
    let (p, t, hd) = (c.p, c.pos.n_tokens, c.p.head_dim);
    let wg = decode_wg(ctx);
    let span = c.ranges.iter().map(|&(_, a, z)| z - a).sum::<usize>();
    let rows = t * p.n_head;
    let row_bytes = ((hd + 2) * 4) as u64;
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
    let sg_min = ctx
        .caps
        .subgroup_min
        .max(1)
        .next_power_of_two()
        .min(wg as u32);
    let spec = Spec {
        head_dim: hd,
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
                    ("HD", hd as u32),
                    ("WG", wg as u32),
                    ("SG_MIN", sg_min),
                    ("KV_F16", c.kv_f16 as u32),
                ],
            )
        },
    )?;
    let rspec = Spec {
        head_dim: hd,
        sinks: c.sinks.is_some(),
        ..Default::default()
    };
    let reduce = ctx.pipeline(
        &KernelKey::new("flash_attn_reduce").variant(rspec.bits()),
        || {
            ctx.source(
                &[include_str!("../../../shaders/flash_attn_reduce.wgsl")],
                &[("HD", hd as u32), ("SINKS", c.sinks.is_some() as u32)],
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
                Arg::Buf(&part.v),
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
            for elt in [2, 4] {
                let (br, bc) = prompt_tiles(hd, elt).expect("tiles");
                assert!(br * hd * 4 + bc * hd * elt + br * bc * 4 <= WG_MEMORY);
            }
        }
        assert_eq!(prompt_tiles(64, 2), Some((16, 32)));
        assert_eq!(prompt_tiles(128, 2), Some((16, 16)));
        assert_eq!(prompt_tiles(128, 4), Some((16, 8)));
    }
}
