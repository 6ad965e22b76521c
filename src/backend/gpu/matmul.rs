//! Quantised mat-vec / mat-mul, MUL_MAT_ID and get_rows over GGUF blocks.
//!
//! Weights stay in their GGUF bytes; `shaders/quant.wgsl` dequantises any
//! supported block in place (4 values at a time, or 16 where the mat-vec
//! takes wider units: `select::matvec_wide`) and each kernel is compiled per
//! weight type. Three shapes of work:
//!
//! - **mat-vec** (`shaders/matvec.wgsl`, decode): up to [`MV_TOK`] tokens; a
//!   workgroup owns [`MV_ROWS`] output rows and its threads split K, so every
//!   weight byte is read once for all tokens.
//! - **tiled mat-mul** (`shaders/matmul.wgsl`, prompts): 64-row x 16- or
//!   64-token output tiles through workgroup memory.
//! - **MUL_MAT_ID** (`shaders/mul_mat_id.wgsl` + either of the above). With
//!   expert ids on the host (a prompt's ubatch, and longhaul's slot ids), the
//!   host groups the (token, expert) pairs by expert, uploads the grouped
//!   pairs and a compact list of work items (expert, first pair, pair count;
//!   `id_plan.rs`), and dispatches one workgroup per (work item, row block):
//!   only experts that have tokens are touched. An expert with at most
//!   [`MV_TOK`] pairs gets one mat-vec work item (decode); an expert with
//!   more gets one item per token tile of the grouped GEMM. Decode batches
//!   routed on the device read their ids where the router left them
//!   (`shaders/mul_mat_id_routed.wgsl`, one mat-vec item per pair).
//!
//! Bind group 1 holds the i-quants' grid (shaders/iq_tables.wgsl, uploaded
//! once per device; quant.wgsl says why it is not a WGSL `const`) or, for
//! the mat-vec of Q4_K / Q5_K, the weight part again as 16-byte words.
//!
//! Weights larger than one storage binding come in parts (rows of a matrix,
//! experts of a stacked tensor, see [`GpuWeight`]); every op dispatches per
//! part. Activations are f32 rows. Nothing here knows about models.

use std::sync::Arc;

use super::id_plan::IdPlan;
use super::{Arg, GpuBackend, GpuError, GpuTensor, GpuWeight, KernelKey};
use crate::backend::{contract, BackendError, DeviceRoute};
use crate::tensor::GgmlType;

const QUANT: &str = include_str!("../../../shaders/quant.wgsl");
const PRODUCT_IO: &str = include_str!("../../../shaders/product_io.wgsl");
const MATVEC: &str = include_str!("../../../shaders/matvec.wgsl");
const MATMUL: &str = include_str!("../../../shaders/matmul.wgsl");
const MUL_MAT_ID: &str = include_str!("../../../shaders/mul_mat_id.wgsl");
const MUL_MAT_ID_ROUTED: &str = include_str!("../../../shaders/mul_mat_id_routed.wgsl");
const GET_ROWS: &str = include_str!("../../../shaders/get_rows.wgsl");
const ACT_ROUND: &str = include_str!("../../../shaders/act_round.wgsl");
const IQ_TABLES: &str = include_str!("../../../shaders/iq_tables.wgsl");

/// Tokens (or pairs of one expert) up to which the mat-vec kernel runs;
/// more go through the tiled kernel.
pub const MV_TOK: usize = 4;
/// Output rows per mat-vec workgroup.
pub const MV_ROWS: u32 = 4;
/// Threads per get_rows workgroup (as in `get_rows.wgsl`).
const GET_ROWS_WG: u64 = 64;

/// An output tile of the tiled kernel: `bm` weight rows x `bn` tokens, each
/// thread computing `tm` x `tn` of them (256 threads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Tile {
    bm: u32,
    pub bn: u32,
    tm: u32,
    tn: u32,
    /// The KernelKey variant bit of this shape.
    variant: u32,
}

/// Hold the tiles in f16 (needs `shader-f16`). Off: rounding dequantised
/// weights and activations to f16 costs too much precision. Measured on the
/// qwen3moe Q8_0 fixture on lavapipe, 64 positions: logits NMSE against the
/// CPU 3e-4..6e-4 with f16 tiles (top-1 differs at 4% of 256 positions)
/// against 1e-13 with f32 tiles, which fit WebGPU's 16 KiB minimum anyway.
const TILE_F16: bool = false;

/// For few tokens per weight (small prompts, most experts of a batch).
const NARROW: Tile = Tile {
    bm: 64,
    bn: 16,
    tm: 4,
    tn: 1,
    variant: 0,
};
/// For many tokens per weight.
const WIDE: Tile = Tile {
    bm: 64,
    bn: 64,
    tm: 4,
    tn: 4,
    variant: 1,
};

/// The tile for groups of `tokens` tokens (on average).
pub(super) fn tile_for(tokens: usize) -> Tile {
    if tokens > 32 {
        WIDE
    } else {
        NARROW
    }
}

/// The `#if` name selecting the type's `deq4` in quant.wgsl.
fn type_flag(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        F32 => "T_F32",
        F16 => "T_F16",
        BF16 => "T_BF16",
        Q8_0 => "T_Q8_0",
        Q4_0 => "T_Q4_0",
        Q4_1 => "T_Q4_1",
        Q5_0 => "T_Q5_0",
        Q5_1 => "T_Q5_1",
        Q2_K => "T_Q2_K",
        Q3_K => "T_Q3_K",
        Q4_K => "T_Q4_K",
        Q5_K => "T_Q5_K",
        Q6_K => "T_Q6_K",
        IQ4_NL => "T_IQ4_NL",
        IQ4_XS => "T_IQ4_XS",
        MXFP4 => "T_MXFP4",
        IQ1_S => "T_IQ1_S",
        IQ1_M => "T_IQ1_M",
        IQ2_XXS => "T_IQ2_XXS",
        IQ2_XS => "T_IQ2_XS",
        IQ2_S => "T_IQ2_S",
        IQ3_XXS => "T_IQ3_XXS",
        IQ3_S => "T_IQ3_S",
        NVFP4 => "T_NVFP4",
        _ => return None,
    })
}

/// The weight types these kernels read.
pub fn supported(ty: GgmlType) -> bool {
    type_flag(ty).is_some()
}

/// The iq_tables.wgsl grid the type's `deq4` reads as `GRID` (see
/// quant.wgsl for why it is a storage buffer).
fn type_grid(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        IQ1_S | IQ1_M => "IQ1S_GRID",
        IQ2_XXS => "IQ2XXS_GRID",
        IQ2_XS => "IQ2XS_GRID",
        IQ2_S => "IQ2S_GRID",
        IQ3_XXS => "IQ3XXS_GRID",
        IQ3_S => "IQ3S_GRID",
        _ => return None,
    })
}

/// The words of the table `name` of iq_tables.wgsl (`const NAME:
/// array<u32, N> = array<u32, N>(0x..u, ...);`), or `None` when the file
/// has no such table of N well-formed words.
fn iq_table(name: &str) -> Option<Vec<u32>> {
    let decl = &IQ_TABLES[IQ_TABLES.find(&format!("const {name}: array<u32, "))?..];
    let n: usize = decl[decl.find(", ")? + 2..decl.find('>')?].parse().ok()?;
    let body = &decl[decl.find(">(")? + 2..decl.find(");")?];
    let words: Vec<u32> = body
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(|w| u32::from_str_radix(w.strip_prefix("0x")?.strip_suffix('u')?, 16).ok())
        .collect::<Option<_>>()?;
    (words.len() == n).then_some(words)
}

/// Bind group 1 of a kernel reading `ty` weights: the type's grid, uploaded
/// once per device, or nothing.
fn grid_buffer(b: &GpuBackend, ty: GgmlType) -> Result<Option<Arc<wgpu::Buffer>>, BackendError> {
    let Some(name) = type_grid(ty) else {
        return Ok(None);
    };
    let buf = b.ctx().table(name, || {
        let words = iq_table(name).ok_or(BackendError::Unsupported {
            op: "i-quant grid (shaders/iq_tables.wgsl)",
            backend: "gpu",
            dtype: ty,
        })?;
        Ok::<_, BackendError>(bytemuck::cast_slice(&words).to_vec())
    })?;
    Ok(Some(buf))
}

/// quant.wgsl's per-type constants.
fn type_consts(ty: GgmlType) -> Vec<(&'static str, u32)> {
    use GgmlType::*;
    let mut c = vec![
        ("BLK", ty.block_size() as u32),
        ("BLK_BYTES", ty.type_size() as u32),
    ];
    if let Some(f) = type_flag(ty) {
        c.push((f, 1));
    }
    if type_grid(ty).is_some() {
        c.push(("HAS_GRID", 1));
    }
    if matches!(ty, IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S) {
        c.push(("IQ_SIGNS", 1));
    }
    c
}

fn shape(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// `v` as a kernel word, or a shape error naming `what`.
fn word(op: &'static str, what: &str, v: u64) -> Result<u32, BackendError> {
    u32::try_from(v).map_err(|_| {
        shape(
            op,
            format!("{what} = {v} does not fit the kernels' 32-bit indices"),
        )
    })
}

/// Checks what every kernel here assumes of a weight.
fn check_weight(op: &'static str, w: &GpuWeight) -> Result<(), BackendError> {
    if !supported(w.ty) {
        return Err(BackendError::Unsupported {
            op,
            backend: "gpu",
            dtype: w.ty,
        });
    }
    if !w.ne[0].is_multiple_of(4) {
        return Err(shape(
            op,
            format!(
                "rows of {} {} values; the GPU kernels need a multiple of 4",
                w.ne[0],
                w.ty.name()
            ),
        ));
    }
    for p in &w.parts {
        // Byte offsets inside a part are u32 in the kernels.
        if p.buf.size() > u32::MAX as u64 {
            return Err(GpuError::TooLarge {
                what: format!("a part of a {} weight", w.ty.name()),
                bytes: p.buf.size(),
                limit: u32::MAX as u64,
            }
            .into());
        }
    }
    Ok(())
}

/// The uniform block of matvec.wgsl / matmul.wgsl (`struct Params`).
#[derive(Default)]
struct Params {
    k: u32,
    n: u32,
    row0: u32,
    rows: u32,
    row_bytes: u32,
    ntok: u32,
    expert_stride: u32,
    item0: u32,
    n_items: u32,
    blocks: u32,
    tok_tiles: u32,
}

impl Params {
    fn words(&self) -> [u32; 11] {
        [
            self.k,
            self.n,
            self.row0,
            self.rows,
            self.row_bytes,
            self.ntok,
            self.expert_stride,
            self.item0,
            self.n_items,
            self.blocks,
            self.tok_tiles,
        ]
    }
}

/// Mat-vec threads per workgroup: a power of two holding whole subgroups of
/// the largest size the adapter may run.
fn matvec_wg(b: &GpuBackend) -> u32 {
    super::select::matvec_wg(b.caps())
}

/// Which rows a mat-vec multiplies: its own, or MUL_MAT_ID's pairs listed
/// by the host or read from a device route.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MvRows {
    Plain,
    Listed,
    Routed,
}

fn matvec_pipeline(
    b: &GpuBackend,
    ty: GgmlType,
    id: bool,
) -> Result<Arc<wgpu::ComputePipeline>, BackendError> {
    matvec_pipeline_for(b, ty, if id { MvRows::Listed } else { MvRows::Plain })
}

fn matvec_pipeline_for(
    b: &GpuBackend,
    ty: GgmlType,
    rows: MvRows,
) -> Result<Arc<wgpu::ComputePipeline>, BackendError> {
    let ctx = b.ctx();
    let id = rows != MvRows::Plain;
    let name = match rows {
        MvRows::Plain => "matvec",
        MvRows::Listed => "matvec_id",
        MvRows::Routed => "matvec_routed",
    };
    let mut consts = type_consts(ty);
    consts.extend([
        ("WG", matvec_wg(b)),
        ("MV_ROWS", MV_ROWS),
        ("MV_TOK", MV_TOK as u32),
        ("MV_WIDE", super::select::matvec_wide(ty) as u32),
        ("W_VEC4", super::select::matvec_vec4(ty) as u32),
        ("MUL_MAT_ID", id as u32),
        ("TILE_F16", TILE_F16 as u32),
    ]);
    let parts: &[&str] = match rows {
        MvRows::Plain => &[QUANT, PRODUCT_IO, MATVEC],
        MvRows::Listed => &[QUANT, PRODUCT_IO, MUL_MAT_ID, MATVEC],
        MvRows::Routed => &[QUANT, PRODUCT_IO, MUL_MAT_ID_ROUTED, MATVEC],
    };
    Ok(ctx.pipeline(&KernelKey::new(name).ty(ty), || ctx.source(parts, &consts))?)
}

/// Bind group 1 of a mat-vec over the weight part `part`: the part again as
/// 16-byte words where the kernel loads them so (W_VEC4), else the i-quant
/// grid, if the type has one.
fn matvec_group1<'a>(
    ty: GgmlType,
    grid: Option<&'a wgpu::Buffer>,
    part: &'a wgpu::Buffer,
) -> Option<Arg<'a>> {
    if super::select::matvec_vec4(ty) {
        Some(Arg::Buf(part))
    } else {
        grid.map(Arg::Buf)
    }
}

fn matmul_pipeline(
    b: &GpuBackend,
    ty: GgmlType,
    tile: Tile,
    id: bool,
) -> Result<Arc<wgpu::ComputePipeline>, BackendError> {
    let ctx = b.ctx();
    let name = if id { "matmul_id" } else { "matmul" };
    let mut consts = type_consts(ty);
    consts.extend([
        ("BM", tile.bm),
        ("BN", tile.bn),
        ("TM", tile.tm),
        ("TN", tile.tn),
        ("MUL_MAT_ID", id as u32),
    ]);
    let parts: &[&str] = if id {
        &[QUANT, PRODUCT_IO, MUL_MAT_ID, MATMUL]
    } else {
        &[QUANT, PRODUCT_IO, MATMUL]
    };
    Ok(
        ctx.pipeline(&KernelKey::new(name).ty(ty).variant(tile.variant), || {
            ctx.source(parts, &consts)
        })?,
    )
}

/// `get_rows(w, ids)`: rows `ids` of the matrix `w`, dequantised, `[ids.len(), ne0]`.
pub(super) fn get_rows(
    b: &GpuBackend,
    w: &GpuWeight,
    ids: &[u32],
) -> Result<GpuTensor, BackendError> {
    const OP: &str = "get_rows";
    check_weight(OP, w)?;
    let [k, n, n_mat] = w.ne;
    if n_mat != 1 {
        return Err(shape(
            OP,
            format!("weight of {n_mat} stacked matrices; get_rows reads one matrix"),
        ));
    }
    let out = b.tensor(ids.len(), k)?;
    if ids.is_empty() || k == 0 {
        return Ok(out);
    }
    // (output row, row within the part), grouped by part.
    let mut per_part: Vec<Vec<[u32; 2]>> = vec![Vec::new(); w.parts.len()];
    for (r, &id) in ids.iter().enumerate() {
        let i = id as usize;
        let p = w
            .parts
            .iter()
            .position(|p| i >= p.first && i < p.first + p.count)
            .filter(|_| i < n)
            .ok_or_else(|| shape(OP, format!("row {id} of a weight with {n} rows")))?;
        per_part[p].push([r as u32, (i - w.parts[p].first) as u32]);
    }
    let pairs: Vec<[u32; 2]> = per_part.concat();
    let ctx = b.ctx();
    let pairs_buf = ctx.upload_temp(bytemuck::cast_slice(&pairs), "get_rows pairs")?;
    let pipe = ctx.pipeline(&KernelKey::new("get_rows").ty(w.ty), || {
        ctx.source(&[QUANT, GET_ROWS], &type_consts(w.ty))
    })?;
    let grid = grid_buffer(b, w.ty)?;
    let g1 = grid.as_deref().map(Arg::Buf);
    let g1 = g1.as_slice();
    let nu = (k / 4) as u64;
    let row_bytes = word(OP, "row bytes", w.row_bytes as u64)?;
    let mut pair0 = 0usize;
    for (part, list) in w.parts.iter().zip(&per_part) {
        if !list.is_empty() {
            let threads = list.len() as u64 * nu;
            let groups = word(OP, "workgroups", threads.div_ceil(GET_ROWS_WG))?;
            word(OP, "threads", threads)?;
            let params = [nu as u32, row_bytes, pair0 as u32, list.len() as u32];
            ctx.dispatch_with(
                &pipe,
                &[
                    Arg::Buf(&part.buf),
                    Arg::Buf(&pairs_buf),
                    Arg::Buf(&out.buf),
                ],
                &params,
                ctx.grid(groups),
                g1,
            );
        }
        pair0 += list.len();
    }
    Ok(out)
}

/// `matmul(w, x)`: `w [k, n]`, `x [t, k]` -> `[t, n]`.
/// `x` rounded as ggml's CPU path quantises activations for a dot product
/// with `ty` weights (Q8_0 / Q8_1 / Q8_K blocks, f16 or bf16), or `None`
/// when `ty` multiplies f32 activations. Running the products on these
/// values gives both placements the same quantisation error, which keeps
/// the GPU's top-1 choices with the CPU's (and llama.cpp's) on models whose
/// logits are close.
fn act_rounded(
    b: &GpuBackend,
    ty: GgmlType,
    x: &GpuTensor,
) -> Result<Option<GpuTensor>, BackendError> {
    let act = crate::quant::ops(ty)?.act_type();
    let (mode, blk): (u32, usize) = match act {
        GgmlType::Q8_0 | GgmlType::Q8_1 => (0, 32),
        GgmlType::Q8_K => (1, 256),
        GgmlType::F16 => (2, 256),
        GgmlType::BF16 => (3, 256),
        _ => return Ok(None),
    };
    let elementwise = mode >= 2;
    if !elementwise && !x.cols.is_multiple_of(blk) {
        return Err(shape(
            "matmul",
            format!("rows of {} are not whole {} blocks", x.cols, act.name()),
        ));
    }
    let ctx = b.ctx();
    let pipe = ctx.pipeline(&KernelKey::new("act_round").variant(mode), || {
        ctx.source(
            &[ACT_ROUND],
            &[
                ("BLK", blk as u32),
                ("ELEMENTWISE", elementwise as u32),
                ("QK", (mode == 1) as u32),
                ("BF16", (mode == 3) as u32),
            ],
        )
    })?;
    let n = x.rows * x.cols;
    let y = b.tensor(x.rows, x.cols)?;
    ctx.dispatch(
        &pipe,
        &[Arg::Buf(&x.buf), Arg::Buf(&y.buf)],
        &[word("matmul", "activations", n as u64)?],
        ctx.grid(n.div_ceil(blk) as u32),
    );
    Ok(Some(y))
}

pub(super) fn matmul(
    b: &GpuBackend,
    w: &GpuWeight,
    x: &GpuTensor,
) -> Result<GpuTensor, BackendError> {
    check_matmul(w, x)?;
    if x.rows == 0 || w.ne[1] == 0 {
        return b.tensor(x.rows, w.ne[1]);
    }
    let rounded = act_rounded(b, w.ty, x)?;
    matmul_on(b, w, rounded.as_ref().unwrap_or(x))
}

fn check_matmul(w: &GpuWeight, x: &GpuTensor) -> Result<(), BackendError> {
    let [k, _, n_mat] = w.ne;
    contract::matmul(k, n_mat, x.cols)?;
    check_weight("matmul", w)
}

/// `matmul(w, x)` for every `w` of `ws` with `x` rounded once per
/// activation type the weights take (the attention projections, an FFN's
/// gate and up share one rounding).
pub(super) fn matmul_many(
    b: &GpuBackend,
    ws: &[&GpuWeight],
    x: &GpuTensor,
) -> Result<Vec<GpuTensor>, BackendError> {
    for w in ws {
        check_matmul(w, x)?;
    }
    let mut rounded = RoundedOnce::default();
    ws.iter()
        .map(|w| {
            if x.rows == 0 || w.ne[1] == 0 {
                return b.tensor(x.rows, w.ne[1]);
            }
            let rx = rounded.get(b, w.ty, x)?;
            matmul_on(b, w, rx.as_ref().unwrap_or(x))
        })
        .collect()
}

/// One input's roundings ([`act_rounded`]), each made once per activation
/// type for the products that share the input.
#[derive(Default)]
struct RoundedOnce(Vec<(GgmlType, Option<GpuTensor>)>);

impl RoundedOnce {
    /// `x` rounded for `ty`'s kernels (`None`: they take it as it is).
    fn get(
        &mut self,
        b: &GpuBackend,
        ty: GgmlType,
        x: &GpuTensor,
    ) -> Result<Option<GpuTensor>, BackendError> {
        let act = crate::quant::ops(ty)?.act_type();
        if let Some((_, r)) = self.0.iter().find(|(a, _)| *a == act) {
            return Ok(r.clone());
        }
        let r = act_rounded(b, ty, x)?;
        self.0.push((act, r.clone()));
        Ok(r)
    }
}

/// The product of a checked `w` and `x` as `w`'s kernels take it (rounded
/// already where they need it).
fn matmul_on(b: &GpuBackend, w: &GpuWeight, x: &GpuTensor) -> Result<GpuTensor, BackendError> {
    const OP: &str = "matmul";
    let [k, n, _] = w.ne;
    let t = x.rows;
    let out = b.tensor(t, n)?;
    let ctx = b.ctx();
    let grid = grid_buffer(b, w.ty)?;
    let g1 = grid.as_deref().map(Arg::Buf);
    let g1 = g1.as_slice();
    let base = Params {
        k: word(OP, "row length", k as u64)?,
        n: word(OP, "rows", n as u64)?,
        row_bytes: word(OP, "row bytes", w.row_bytes as u64)?,
        ntok: word(OP, "tokens", t as u64)?,
        ..Params::default()
    };
    if t <= MV_TOK {
        let pipe = matvec_pipeline(b, w.ty, false)?;
        for part in &w.parts {
            let blocks = (part.count as u32).div_ceil(MV_ROWS);
            let p = Params {
                row0: part.first as u32,
                rows: part.count as u32,
                blocks,
                ..base
            };
            let mv1 = matvec_group1(w.ty, grid.as_deref(), &part.buf);
            ctx.dispatch_with(
                &pipe,
                &[Arg::Buf(&part.buf), Arg::Buf(&x.buf), Arg::Buf(&out.buf)],
                &p.words(),
                ctx.grid(blocks),
                mv1.as_slice(),
            );
        }
    } else {
        let tile = tile_for(t);
        let pipe = matmul_pipeline(b, w.ty, tile, false)?;
        let tok_tiles = (t as u32).div_ceil(tile.bn);
        for part in &w.parts {
            let blocks = (part.count as u32).div_ceil(tile.bm);
            let p = Params {
                row0: part.first as u32,
                rows: part.count as u32,
                blocks,
                tok_tiles,
                ..base
            };
            let groups = word(OP, "workgroups", blocks as u64 * tok_tiles as u64)?;
            ctx.dispatch_with(
                &pipe,
                &[Arg::Buf(&part.buf), Arg::Buf(&x.buf), Arg::Buf(&out.buf)],
                &p.words(),
                ctx.grid(groups),
                g1,
            );
        }
    }
    Ok(out)
}

/// `mul_mat_id(w, x, ids, n_used)`, ggml's MUL_MAT_ID (see the module docs
/// for how work is laid out).
pub(super) fn mul_mat_id(
    b: &GpuBackend,
    w: &GpuWeight,
    x: &GpuTensor,
    ids: &[u32],
    n_used: usize,
) -> Result<GpuTensor, BackendError> {
    const OP: &str = "mul_mat_id";
    let [k, n, n_exp] = w.ne;
    let contract::MulMatId { n_tok, x_per_tok } =
        contract::mul_mat_id(k, n_exp, (x.rows, x.cols), ids, n_used)?;
    check_weight(OP, w)?;
    let out = b.tensor(ids.len(), n)?;
    if n_tok == 0 || n == 0 {
        return Ok(out);
    }

    let rounded = act_rounded(b, w.ty, x)?;
    let x = rounded.as_ref().unwrap_or(x);
    let parts: Vec<(usize, usize)> = w.parts.iter().map(|p| (p.first, p.count)).collect();
    let IdPlan {
        toks,
        items,
        parts: plan,
        tile,
    } = IdPlan::new(ids, n_used, x_per_tok, n_exp, &parts)?;

    let ctx = b.ctx();
    let toks_buf = ctx.upload_temp(bytemuck::cast_slice(&toks), "mul_mat_id pairs")?;
    let items_buf = ctx.upload_temp(bytemuck::cast_slice(&items), "mul_mat_id items")?;
    let grid = grid_buffer(b, w.ty)?;
    let g1 = grid.as_deref().map(Arg::Buf);
    let g1 = g1.as_slice();
    let base = Params {
        k: word(OP, "row length", k as u64)?,
        n: word(OP, "rows", n as u64)?,
        rows: word(OP, "rows", n as u64)?,
        row_bytes: word(OP, "row bytes", w.row_bytes as u64)?,
        expert_stride: word(OP, "expert stride", w.expert_stride)?,
        ..Params::default()
    };
    let any_mv = plan.iter().any(|p| !p.mv.is_empty());
    let any_mm = plan.iter().any(|p| !p.mm.is_empty());
    let mv_pipe = any_mv.then(|| matvec_pipeline(b, w.ty, true)).transpose()?;
    let mm_pipe = any_mm
        .then(|| matmul_pipeline(b, w.ty, tile, true))
        .transpose()?;
    for (part, pp) in w.parts.iter().zip(&plan) {
        let args = [
            Arg::Buf(&part.buf),
            Arg::Buf(&x.buf),
            Arg::Buf(&out.buf),
            Arg::Buf(&toks_buf),
            Arg::Buf(&items_buf),
        ];
        if let (Some(pipe), false) = (&mv_pipe, pp.mv.is_empty()) {
            let blocks = (n as u32).div_ceil(MV_ROWS);
            let p = Params {
                item0: pp.mv.start as u32,
                n_items: pp.mv.len() as u32,
                blocks,
                ..base
            };
            let groups = word(OP, "workgroups", pp.mv.len() as u64 * blocks as u64)?;
            let mv1 = matvec_group1(w.ty, grid.as_deref(), &part.buf);
            ctx.dispatch_with(pipe, &args, &p.words(), ctx.grid(groups), mv1.as_slice());
        }
        if let (Some(pipe), false) = (&mm_pipe, pp.mm.is_empty()) {
            let blocks = (n as u32).div_ceil(tile.bm);
            let p = Params {
                item0: pp.mm.start as u32,
                n_items: pp.mm.len() as u32,
                blocks,
                ..base
            };
            let groups = word(OP, "workgroups", pp.mm.len() as u64 * blocks as u64)?;
            ctx.dispatch_with(pipe, &args, &p.words(), ctx.grid(groups), g1);
        }
    }
    Ok(out)
}

/// [`mul_mat_id`] with the ids of a device route: one mat-vec work item
/// per pair, per weight part, no list built on the host.
pub(super) fn mul_mat_id_routed(
    b: &GpuBackend,
    w: &GpuWeight,
    x: &GpuTensor,
    r: &DeviceRoute<GpuTensor>,
) -> Result<GpuTensor, BackendError> {
    Ok(mul_mat_id_routed_many(b, &[w], x, r)?.remove(0))
}

/// [`mul_mat_id_routed`] for every `w` of `ws` (an expert FFN's up and
/// gate) with `x` rounded once per activation type they take.
pub(super) fn mul_mat_id_routed_many(
    b: &GpuBackend,
    ws: &[&GpuWeight],
    x: &GpuTensor,
    r: &DeviceRoute<GpuTensor>,
) -> Result<Vec<GpuTensor>, BackendError> {
    let mut rounded = RoundedOnce::default();
    ws.iter()
        .map(|w| {
            // Shapes are checked before anything is rounded.
            let ready = r.n_tok * r.n_used > 0 && w.ne[1] > 0 && x.cols == w.ne[0];
            let rx = if ready {
                rounded.get(b, w.ty, x)?
            } else {
                None
            };
            mul_mat_id_routed_on(b, w, x, rx.as_ref(), r)
        })
        .collect()
}

/// [`mul_mat_id_routed`] with `x` already rounded for `w` (`rx`) where its
/// kernels need that.
fn mul_mat_id_routed_on(
    b: &GpuBackend,
    w: &GpuWeight,
    x: &GpuTensor,
    rx: Option<&GpuTensor>,
    r: &DeviceRoute<GpuTensor>,
) -> Result<GpuTensor, BackendError> {
    const OP: &str = "mul_mat_id_routed";
    let [k, n, _n_exp] = w.ne;
    let pairs = r.n_tok * r.n_used;
    let x_per_tok = match x.rows {
        rows if rows == r.n_tok => 1,
        rows if rows == pairs => r.n_used,
        rows => {
            return Err(shape(
                OP,
                format!(
                    "x has {rows} rows for {} tokens of {} experts",
                    r.n_tok, r.n_used
                ),
            ))
        }
    };
    if x.cols != k {
        return Err(shape(
            OP,
            format!("x has {} columns, the weight rows {k}", x.cols),
        ));
    }
    check_weight(OP, w)?;
    let out = b.tensor(pairs, n)?;
    if pairs == 0 || n == 0 {
        return Ok(out);
    }
    let x = rx.unwrap_or(x);
    let ctx = b.ctx();
    let grid = grid_buffer(b, w.ty)?;
    let pipe = matvec_pipeline_for(b, w.ty, MvRows::Routed)?;
    let blocks = (n as u32).div_ceil(MV_ROWS);
    let p = Params {
        k: word(OP, "row length", k as u64)?,
        n: word(OP, "rows", n as u64)?,
        rows: word(OP, "rows", n as u64)?,
        row_bytes: word(OP, "row bytes", w.row_bytes as u64)?,
        expert_stride: word(OP, "expert stride", w.expert_stride)?,
        n_items: word(OP, "pairs", pairs as u64)?,
        blocks,
        ..Params::default()
    };
    let groups = word(OP, "workgroups", pairs as u64 * blocks as u64)?;
    for part in &w.parts {
        let info = [
            word(OP, "first expert", part.first as u64)?,
            word(OP, "experts", part.count as u64)?,
            r.n_used as u32,
            x_per_tok as u32,
        ];
        let info = ctx.upload_temp(bytemuck::cast_slice(&info), "mul_mat_id_routed part")?;
        let args = [
            Arg::Buf(&part.buf),
            Arg::Buf(&x.buf),
            Arg::Buf(&out.buf),
            Arg::Buf(&r.ids.buf),
            Arg::Buf(&info),
        ];
        let mv1 = matvec_group1(w.ty, grid.as_deref(), &part.buf);
        ctx.dispatch_with(&pipe, &args, &p.words(), ctx.grid(groups), mv1.as_slice());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_shapes_follow_token_counts() {
        assert_eq!(tile_for(5), NARROW);
        assert_eq!(tile_for(32), NARROW);
        assert_eq!(tile_for(33), WIDE);
        for t in [NARROW, WIDE] {
            assert_eq!((t.bm / t.tm) * (t.bn / t.tn), 256, "{t:?}: threads");
            // f32 tiles of BK = 32 within WebGPU's 16 KiB of workgroup memory.
            assert!((t.bm + t.bn) * 32 * 4 <= 16384, "{t:?}: workgroup memory");
        }
    }

    #[test]
    fn every_grid_parses_from_iq_tables() {
        use GgmlType::*;
        for (ty, words) in [
            (IQ1_S, 4096),
            (IQ1_M, 4096),
            (IQ2_XXS, 512),
            (IQ2_XS, 1024),
            (IQ2_S, 2048),
            (IQ3_XXS, 256),
            (IQ3_S, 512),
        ] {
            assert!(supported(ty), "{ty:?}");
            let t = iq_table(type_grid(ty).unwrap()).unwrap();
            assert_eq!(t.len(), words, "{ty:?}");
        }
        // iq2xxs_grid[0] and [1]: 0x0808080808080808, 0x080808080808082b.
        assert_eq!(
            iq_table("IQ2XXS_GRID").unwrap()[..4],
            [0x08080808, 0x08080808, 0x0808082b, 0x08080808]
        );
        assert_eq!(iq_table("NO_SUCH_GRID"), None);
    }

    /// quant.wgsl computes ggml's ksigns_iq2xs instead of reading it: the
    /// 7 index bits plus an even-parity bit 7.
    #[test]
    fn ksigns_is_the_parity_completion() {
        let t = iq_table("KSIGNS_IQ2XS").unwrap();
        for k in 0..128u32 {
            let byte = (t[k as usize / 4] >> (8 * (k % 4))) & 0xff;
            assert_eq!(byte, k | ((k.count_ones() & 1) << 7), "ksigns[{k}]");
        }
    }
}
