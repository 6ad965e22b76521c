//! The run-time face of the formats: [`QuantOps`] over every supported type,
//! the kernel table chosen once per process from [`CpuCaps`], and the
//! row-level helpers the backends call.

use super::{
    cast_or_copy, ActBlock, BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockNVFP4, BlockQ2K, BlockQ3K,
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0,
    BlockQ8_1, DotFn, GgmlBlock, PairDotFn, QuantError,
};
use super::{BlockIQ1M, BlockIQ1S, BlockIQ3S, BlockIQ3XXS};
use super::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
use crate::tensor::GgmlType;
use half::{bf16, f16};
use std::sync::{Mutex, OnceLock};

/// Weight types with dequantisation and dot products here.
pub const SUPPORTED_TYPES: [GgmlType; 24] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::NVFP4,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

/// CPU features the kernels may use. [`CpuCaps::detect`] reads the running
/// CPU; tests build fake ones to check kernel selection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCaps {
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    /// AVX-512 F + BW + VL + VNNI.
    pub avx512: bool,
    /// BMI2 with a fast `pdep` (not AMD before Zen 3, which microcodes it).
    pub bmi2: bool,
}

impl CpuCaps {
    /// No SIMD: every type uses its reference kernel.
    pub const NONE: CpuCaps = CpuCaps {
        avx2: false,
        fma: false,
        f16c: false,
        avx512: false,
        bmi2: false,
    };

    /// AVX-512 F + BW + VL + VNNI on top of [`CpuCaps::has_avx2`].
    pub fn has_avx512(self) -> bool {
        self.has_avx2() && self.avx512
    }

    /// AVX2 + FMA + F16C: what every x86 kernel here is compiled for.
    pub fn has_avx2(self) -> bool {
        self.avx2 && self.fma && self.f16c
    }

    /// The running CPU's features, or [`CpuCaps::NONE`] when the environment
    /// sets `LONGHAUL_NO_SIMD=1`; `LONGHAUL_NO_AVX512=1` stops at AVX2.
    pub fn detect() -> CpuCaps {
        if std::env::var("LONGHAUL_NO_SIMD").is_ok_and(|v| v == "1") {
            return CpuCaps::NONE;
        }
        #[cfg(target_arch = "x86_64")]
        {
            CpuCaps {
                avx2: is_x86_feature_detected!("avx2"),
                fma: is_x86_feature_detected!("fma"),
                f16c: is_x86_feature_detected!("f16c"),
                avx512: is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
                    && !std::env::var("LONGHAUL_NO_AVX512").is_ok_and(|v| v == "1"),
                bmi2: is_x86_feature_detected!("bmi2") && fast_pdep(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        CpuCaps::NONE
    }
}

/// Whether `pdep` runs in hardware: every BMI2 CPU except AMD's before Zen 3
/// (family 0x19), where it is microcoded and costs hundreds of cycles.
#[cfg(target_arch = "x86_64")]
fn fast_pdep() -> bool {
    let (v, f) = (std::arch::x86_64::__cpuid(0), std::arch::x86_64::__cpuid(1));
    let amd = (v.ebx, v.edx, v.ecx) == (0x6874_7541, 0x6974_6E65, 0x444D_4163); // "AuthenticAMD"
    let base = (f.eax >> 8) & 0xF;
    let family = if base == 0xF {
        base + ((f.eax >> 20) & 0xFF)
    } else {
        base
    };
    !amd || family >= 0x19
}

/// Object-safe operations on one weight type, chosen at run time by [`ops`].
///
/// Byte slices are GGUF row bytes; lengths are checked (never a panic) and
/// misaligned slices are copied (see the module docs).
pub trait QuantOps: Send + Sync {
    /// The weight type.
    fn ty(&self) -> GgmlType;
    /// The activation type rows are dotted against (ggml's `vec_dot_type`).
    fn act_type(&self) -> GgmlType;
    /// Name of the dot kernel in use ("scalar", "avx2", ...).
    fn kernel_name(&self) -> &'static str;
    /// Dequantises `src` (exactly `row_bytes(dst.len())` bytes) into `dst`.
    fn dequantize(&self, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError>;
    /// ggml's reference quantiser; `dst` must be `row_bytes(src.len())` bytes.
    /// [`QuantError::Unsupported`] for types without one.
    fn quantize(&self, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError>;
    /// Dot product of one weight row of `n` elements with an activation row
    /// already in [`QuantOps::act_type`] (see [`quantize_activations`]).
    fn vec_dot(&self, n: usize, w_row: &[u8], act_row: &[u8]) -> Result<f32, QuantError>;
    /// `out[r] = vec_dot(n, row r of w_rows, act_row)` for consecutive rows;
    /// `w_rows` holds exactly `out.len()` rows.
    fn vec_dot_rows(
        &self,
        n: usize,
        w_rows: &[u8],
        act_row: &[u8],
        out: &mut [f32],
    ) -> Result<(), QuantError>;
    /// `out[t * n_rows + r] = vec_dot(n, row r of w_rows, row t of acts)`:
    /// every weight row against every activation row (whole rows of `n`
    /// elements, `out.len() == n_rows * n_acts`). The bits of ggml's CPU
    /// `mul_mat`: with one activation row, [`QuantOps::vec_dot`]'s per pair;
    /// with two or more, llamafile's tinyBLAS's where ggml's x86 build runs
    /// it (Q4_0, Q5_0, Q8_0, IQ4_NL weights: one 8-lane FMA chain per
    /// output; of these only IQ4_NL's differs from its `vec_dot`), else
    /// `vec_dot`'s. Faster where a tile kernel computes several pairs side
    /// by side.
    fn vec_dot_tile(
        &self,
        n: usize,
        w_rows: &[u8],
        acts: &[u8],
        out: &mut [f32],
    ) -> Result<(), QuantError>;
    /// [`QuantOps::vec_dot_tile`] for part of a product whose whole batch
    /// has `batch` activation rows (MUL_MAT: the tokens; MUL_MAT_ID: the
    /// rows routed to this expert). ggml's x86 CPU backend picks its kernel
    /// by that count: from [`GGML_TILED_MIN_BATCH`] rows on, the K-quants,
    /// IQ4_XS and the 1-3-bit i-quants go through its tiled path, whose
    /// per-block float steps differ from `vec_dot`'s; these are its bits.
    fn vec_dot_tile_batch(
        &self,
        n: usize,
        w_rows: &[u8],
        acts: &[u8],
        out: &mut [f32],
        batch: usize,
    ) -> Result<(), QuantError> {
        let _ = batch;
        self.vec_dot_tile(n, w_rows, acts, out)
    }
    /// Whether [`QuantOps::vec_dot_tile_batch`] runs ggml's tiled path at
    /// this batch: its kernels decode each weight block once per call, so
    /// callers hand them more activation rows at a time.
    fn has_batch_kernel(&self, batch: usize) -> bool {
        let _ = batch;
        false
    }
}

/// ggml's tiled-path batch floor (`ggml_tiled_min_batch`).
pub const GGML_TILED_MIN_BATCH: usize = super::ggml_tiled::MIN_BATCH;

/// A tile kernel: `tile(nb, w, a, out)` sets `out[t * nr + r]` to the dot
/// product of weight row `r` and activation row `t` (rows of `nb` blocks,
/// `nr = w.len() / nb`), bit-identical to the type's dot kernel at the same
/// [`CpuCaps`] or, for the tinyBLAS types, to tinyBLAS (see
/// [`QuantOps::vec_dot_tile`]).
pub(super) type TileFn<B> = fn(usize, &[B], &[<B as GgmlBlock>::Act], &mut [f32]);

/// Block types with (or without) a tile kernel; selected with the same caps
/// as [`GgmlBlock::simd_dot`], and only where it gives the bits
/// [`QuantOps::vec_dot_tile`] promises.
trait TileKernels: GgmlBlock {
    fn tile_kernel(_caps: CpuCaps) -> Option<TileFn<Self>> {
        None
    }
}

/// Block types ggml multiplies with its "tiled" path at
/// [`ggml_tiled::MIN_BATCH`] or more activation rows, and the kernel giving
/// those bits (see [`QuantOps::vec_dot_tile_batch`]).
trait BatchKernel: GgmlBlock {
    fn batch_kernel(_caps: CpuCaps) -> Option<TileFn<Self>> {
        None
    }
}

macro_rules! ggml_tiled_types {
    ($($b:ty),* $(,)?) => {
        $(impl BatchKernel for $b {
            fn batch_kernel(caps: CpuCaps) -> Option<TileFn<Self>> {
                // ggml's x86 builds with AVX2 and FMA (its AVX-512 VNNI
                // kernel gives the same bits, as ours do); elsewhere it has
                // no tiled path.
                #[cfg(target_arch = "x86_64")]
                {
                    if caps.has_avx512() {
                        return Some(super::ggml_tiled::tiled_avx512::<$b>);
                    }
                    if caps.has_avx2() {
                        return Some(super::ggml_tiled::tiled_avx2::<$b>);
                    }
                }
                let _ = caps;
                None
            }
        })*
    };
}

ggml_tiled_types!(
    BlockQ2K,
    BlockQ3K,
    BlockQ4K,
    BlockQ5K,
    BlockQ6K,
    BlockIQ4XS,
    BlockIQ2XXS,
    BlockIQ2XS,
    BlockIQ2S,
    BlockIQ3XXS,
    BlockIQ3S,
    BlockIQ1S,
    BlockIQ1M,
);
impl BatchKernel for f32 {}
impl BatchKernel for f16 {}
impl BatchKernel for bf16 {}
impl BatchKernel for BlockQ4_0 {}
impl BatchKernel for BlockQ4_1 {}
impl BatchKernel for BlockQ5_0 {}
impl BatchKernel for BlockQ5_1 {}
impl BatchKernel for BlockQ8_0 {}
impl BatchKernel for BlockIQ4NL {}
impl BatchKernel for BlockMXFP4 {}
impl BatchKernel for BlockNVFP4 {}

/// `TileKernels` with the AVX-512 (VNNI, 32 registers) and the AVX2 tile
/// kernels of the type.
macro_rules! x86_tiles {
    ($($b:ty => $k:ident),* $(,)?) => {
        $(impl TileKernels for $b {
            fn tile_kernel(caps: CpuCaps) -> Option<TileFn<Self>> {
                #[cfg(target_arch = "x86_64")]
                {
                    if caps.has_avx512() {
                        return Some(super::simd_x86_512::$k);
                    }
                    if caps.has_avx2() {
                        return Some(super::simd_x86::$k);
                    }
                }
                let _ = caps;
                None
            }
        })*
    };
}

x86_tiles!(
    BlockQ4_1 => tile_q4_1,
    BlockQ5_0 => tile_q5_0,
    BlockQ8_0 => tile_q8_0,
    BlockQ4K => tile_q4_k,
);

/// `TileKernels` with an AVX2 tile kernel at both x86 levels: the types
/// whose one-row kernel is the AVX2 one on AVX-512 CPUs too.
macro_rules! avx2_tiles {
    ($($b:ty => $k:ident),* $(,)?) => {
        $(impl TileKernels for $b {
            fn tile_kernel(caps: CpuCaps) -> Option<TileFn<Self>> {
                #[cfg(target_arch = "x86_64")]
                {
                    if caps.has_avx2() {
                        return Some(super::simd_x86::$k);
                    }
                }
                let _ = caps;
                None
            }
        })*
    };
}

avx2_tiles!(
    BlockQ4_0 => tile_q4_0,
    BlockIQ2XXS => tile_iq2_xxs,
    BlockIQ2XS => tile_iq2_xs,
    BlockIQ2S => tile_iq2_s,
    BlockIQ3XXS => tile_iq3_xxs,
    BlockIQ3S => tile_iq3_s,
    BlockIQ1S => tile_iq1_s,
    BlockIQ1M => tile_iq1_m,
    BlockNVFP4 => tile_nvfp4,
);

/// F32 keeps `ggml_vec_dot_f32` at every batch size (ggml's tinyBLAS, at
/// 2+ rows, reassociates): a prompt's logits then do not depend on how it
/// is split into ubatches, which the recurrent-state tests rely on.
impl TileKernels for f32 {}
impl TileKernels for f16 {}
impl TileKernels for bf16 {}
impl TileKernels for BlockQ5_1 {}
impl TileKernels for BlockQ2K {}
impl TileKernels for BlockQ3K {}
impl TileKernels for BlockQ5K {}
impl TileKernels for BlockQ6K {}
/// ggml's CPU backend multiplies IQ4_NL by two or more activation rows with
/// llamafile's tinyBLAS, whose per-output sums are one FMA chain, not the
/// two chains of `ggml_vec_dot_iq4_nl_q8_0`: the tile kernel gives
/// tinyBLAS's bits, not the row kernel's.
impl TileKernels for BlockIQ4NL {
    fn tile_kernel(caps: CpuCaps) -> Option<TileFn<Self>> {
        #[cfg(target_arch = "x86_64")]
        if caps.has_avx2() {
            return Some(super::simd_x86::tile_iq4_nl);
        }
        let _ = caps;
        None
    }
}
impl TileKernels for BlockIQ4XS {}
impl TileKernels for BlockMXFP4 {}

/// [`QuantOps`] for block type `B` with a fixed dot kernel.
struct BlockOps<B: GgmlBlock> {
    dot: DotFn<B>,
    /// Two rows against one activation row, with `dot`'s bits per row.
    pair: Option<PairDotFn<B>>,
    tile: Option<TileFn<B>>,
    /// ggml's tiled-path kernel, for batches of `ggml_tiled::MIN_BATCH`+ rows.
    batch: Option<TileFn<B>>,
    name: &'static str,
}

impl<B: TileKernels + BatchKernel> BlockOps<B> {
    fn new(caps: CpuCaps) -> Self {
        match B::simd_dot(caps) {
            Some(k) => BlockOps {
                dot: k.dot,
                pair: B::simd_pair(caps),
                tile: B::tile_kernel(caps),
                batch: B::batch_kernel(caps),
                name: k.name,
            },
            None => BlockOps {
                dot: B::vec_dot,
                pair: None,
                tile: None,
                batch: None,
                name: "scalar",
            },
        }
    }

    /// Blocks in a row of `n` elements, or BadLength.
    fn blocks_in(n: usize, what: &'static str) -> Result<usize, QuantError> {
        if !n.is_multiple_of(B::BLOCK) || !n.is_multiple_of(<B::Act as ActBlock>::BLOCK) {
            return Err(QuantError::BadLength {
                ty: B::TYPE,
                what,
                unit: "elements (a multiple of the block size)",
                expected: n / B::BLOCK * B::BLOCK,
                got: n,
            });
        }
        Ok(n / B::BLOCK)
    }

    fn check_len(
        what: &'static str,
        unit: &'static str,
        ty: GgmlType,
        expected: usize,
        got: usize,
    ) -> Result<(), QuantError> {
        if expected != got {
            return Err(QuantError::BadLength {
                ty,
                what,
                unit,
                expected,
                got,
            });
        }
        Ok(())
    }

    fn act_blocks<'a>(
        n: usize,
        act_row: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [B::Act]>, QuantError> {
        Self::act_rows(n, 1, act_row)
    }

    /// `n_acts` activation rows of `n` elements.
    fn act_rows(
        n: usize,
        n_acts: usize,
        acts: &[u8],
    ) -> Result<std::borrow::Cow<'_, [B::Act]>, QuantError> {
        let nb = n / <B::Act as ActBlock>::BLOCK;
        let at = <B::Act as ActBlock>::TYPE;
        Self::check_len(
            "vec_dot activation rows",
            "bytes",
            at,
            n_acts * nb * size_of::<B::Act>(),
            acts.len(),
        )?;
        cast_or_copy::<B::Act>(at, "vec_dot activation rows", acts)
    }
}

impl<B: TileKernels + BatchKernel> QuantOps for BlockOps<B> {
    fn ty(&self) -> GgmlType {
        B::TYPE
    }

    fn act_type(&self) -> GgmlType {
        <B::Act as ActBlock>::TYPE
    }

    fn kernel_name(&self) -> &'static str {
        self.name
    }

    fn dequantize(&self, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
        let nb = Self::blocks_in(dst.len(), "dequantize")?;
        Self::check_len(
            "dequantize source",
            "bytes",
            B::TYPE,
            nb * size_of::<B>(),
            src.len(),
        )?;
        let blocks = cast_or_copy::<B>(B::TYPE, "dequantize", src)?;
        B::to_f32(&blocks, dst);
        Ok(())
    }

    fn quantize(&self, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
        if !B::HAS_FROM_F32 {
            return Err(QuantError::Unsupported {
                ty: B::TYPE,
                what: "quantisation",
            });
        }
        let nb = Self::blocks_in(src.len(), "quantize")?;
        Self::check_len(
            "quantize destination",
            "bytes",
            B::TYPE,
            nb * size_of::<B>(),
            dst.len(),
        )?;
        match bytemuck::try_cast_slice_mut::<u8, B>(dst) {
            Ok(blocks) => B::from_f32(src, blocks),
            Err(_) => {
                let mut tmp = vec![<B as bytemuck::Zeroable>::zeroed(); nb];
                B::from_f32(src, &mut tmp)?;
                dst.copy_from_slice(bytemuck::cast_slice(&tmp));
                Ok(())
            }
        }
    }

    fn vec_dot(&self, n: usize, w_row: &[u8], act_row: &[u8]) -> Result<f32, QuantError> {
        let nb = Self::blocks_in(n, "vec_dot")?;
        Self::check_len(
            "vec_dot weight row",
            "bytes",
            B::TYPE,
            nb * size_of::<B>(),
            w_row.len(),
        )?;
        let a = Self::act_blocks(n, act_row)?;
        let w = cast_or_copy::<B>(B::TYPE, "vec_dot weight row", w_row)?;
        Ok((self.dot)(n, &w, &a))
    }

    fn vec_dot_rows(
        &self,
        n: usize,
        w_rows: &[u8],
        act_row: &[u8],
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        let nb = Self::blocks_in(n, "vec_dot_rows")?;
        Self::check_len(
            "vec_dot_rows weight rows",
            "bytes",
            B::TYPE,
            out.len() * nb * size_of::<B>(),
            w_rows.len(),
        )?;
        let a = Self::act_blocks(n, act_row)?;
        let w = cast_or_copy::<B>(B::TYPE, "vec_dot_rows weight rows", w_rows)?;
        if nb == 0 {
            out.fill(0.0);
            return Ok(());
        }
        // One activation row streams the weights from memory: the one-row
        // kernel measured faster there than the tile kernels' interleaved
        // rows (SmolLM2 tg32, 2 threads).
        self.dot_rows(n, nb, &w, &a, out);
        Ok(())
    }

    fn vec_dot_tile(
        &self,
        n: usize,
        w_rows: &[u8],
        acts: &[u8],
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        // Several activation rows only (see `vec_dot_rows`).
        self.products(n, w_rows, acts, out, |n_acts| {
            self.tile.filter(|_| n_acts > 1)
        })
    }

    fn has_batch_kernel(&self, batch: usize) -> bool {
        self.batch.is_some() && batch >= GGML_TILED_MIN_BATCH
    }

    fn vec_dot_tile_batch(
        &self,
        n: usize,
        w_rows: &[u8],
        acts: &[u8],
        out: &mut [f32],
        batch: usize,
    ) -> Result<(), QuantError> {
        // ggml picks its kernel once for the whole batch: a chunk of one row
        // of a larger batch still takes the batch's kernel.
        self.products(n, w_rows, acts, out, |_| match (self.batch, self.tile) {
            (Some(k), _) if self.has_batch_kernel(batch) => Some(k),
            (_, Some(k)) if batch >= 2 => Some(k),
            _ => None,
        })
    }
}

impl<B: TileKernels + BatchKernel> BlockOps<B> {
    /// Every weight row of `w_rows` times every activation row of `acts`
    /// (lengths checked), with the kernel `pick(n_acts)` chooses, or the
    /// one-row dot per pair where it chooses none.
    fn products(
        &self,
        n: usize,
        w_rows: &[u8],
        acts: &[u8],
        out: &mut [f32],
        pick: impl FnOnce(usize) -> Option<TileFn<B>>,
    ) -> Result<(), QuantError> {
        let nb = Self::blocks_in(n, "vec_dot_tile")?;
        let wrb = nb * size_of::<B>();
        let n_rows = w_rows.len().checked_div(wrb).unwrap_or(0);
        Self::check_len(
            "vec_dot_tile weight rows",
            "bytes",
            B::TYPE,
            n_rows * wrb,
            w_rows.len(),
        )?;
        if n_rows == 0 {
            return Self::check_len("vec_dot_tile outputs", "values", B::TYPE, 0, out.len());
        }
        let n_acts = out.len() / n_rows;
        Self::check_len(
            "vec_dot_tile outputs",
            "values (weight rows x activation rows)",
            B::TYPE,
            n_rows * n_acts,
            out.len(),
        )?;
        let a = Self::act_rows(n, n_acts, acts)?;
        let w = cast_or_copy::<B>(B::TYPE, "vec_dot_tile weight rows", w_rows)?;
        if nb == 0 {
            out.fill(0.0);
            return Ok(());
        }
        if let Some(kernel) = pick(n_acts) {
            kernel(nb, &w, &a, out);
            return Ok(());
        }
        let nab = n / <B::Act as ActBlock>::BLOCK;
        for (o, act) in out.chunks_exact_mut(n_rows).zip(a.chunks_exact(nab)) {
            self.dot_rows(n, nb, &w, act, o);
        }
        Ok(())
    }

    /// `out[r] = dot(row r of w, act)` for the rows of `nb` blocks in `w`:
    /// two rows at a time where the type has a row-pair kernel.
    fn dot_rows(&self, n: usize, nb: usize, w: &[B], act: &[B::Act], out: &mut [f32]) {
        let mut done = 0;
        if let Some(pair) = self.pair {
            for (o, rows) in out.chunks_exact_mut(2).zip(w.chunks_exact(2 * nb)) {
                let (w0, w1) = rows.split_at(nb);
                o.copy_from_slice(&pair(n, w0, w1, act));
                done += 2;
            }
        }
        for (o, row) in out[done..].iter_mut().zip(w[done * nb..].chunks_exact(nb)) {
            *o = (self.dot)(n, row, act);
        }
    }
}

/// One [`BlockOps`] per supported type, all built from the same caps.
struct Table {
    f32: BlockOps<f32>,
    f16: BlockOps<f16>,
    bf16: BlockOps<bf16>,
    q4_0: BlockOps<BlockQ4_0>,
    q4_1: BlockOps<BlockQ4_1>,
    q5_0: BlockOps<BlockQ5_0>,
    q5_1: BlockOps<BlockQ5_1>,
    q8_0: BlockOps<BlockQ8_0>,
    q2_k: BlockOps<BlockQ2K>,
    q3_k: BlockOps<BlockQ3K>,
    q4_k: BlockOps<BlockQ4K>,
    q5_k: BlockOps<BlockQ5K>,
    q6_k: BlockOps<BlockQ6K>,
    iq4_nl: BlockOps<BlockIQ4NL>,
    iq4_xs: BlockOps<BlockIQ4XS>,
    mxfp4: BlockOps<BlockMXFP4>,
    iq2_xxs: BlockOps<BlockIQ2XXS>,
    iq2_xs: BlockOps<BlockIQ2XS>,
    iq2_s: BlockOps<BlockIQ2S>,
    nvfp4: BlockOps<BlockNVFP4>,
    iq3_xxs: BlockOps<BlockIQ3XXS>,
    iq3_s: BlockOps<BlockIQ3S>,
    iq1_s: BlockOps<BlockIQ1S>,
    iq1_m: BlockOps<BlockIQ1M>,
    /// The caps the kernels were chosen with.
    caps: CpuCaps,
}

impl Table {
    fn new(caps: CpuCaps) -> Self {
        Table {
            caps,
            f32: BlockOps::new(caps),
            f16: BlockOps::new(caps),
            bf16: BlockOps::new(caps),
            q4_0: BlockOps::new(caps),
            q4_1: BlockOps::new(caps),
            q5_0: BlockOps::new(caps),
            q5_1: BlockOps::new(caps),
            q8_0: BlockOps::new(caps),
            q2_k: BlockOps::new(caps),
            q3_k: BlockOps::new(caps),
            q4_k: BlockOps::new(caps),
            q5_k: BlockOps::new(caps),
            q6_k: BlockOps::new(caps),
            iq4_nl: BlockOps::new(caps),
            iq4_xs: BlockOps::new(caps),
            mxfp4: BlockOps::new(caps),
            iq2_xxs: BlockOps::new(caps),
            iq2_xs: BlockOps::new(caps),
            iq2_s: BlockOps::new(caps),
            nvfp4: BlockOps::new(caps),
            iq3_xxs: BlockOps::new(caps),
            iq3_s: BlockOps::new(caps),
            iq1_s: BlockOps::new(caps),
            iq1_m: BlockOps::new(caps),
        }
    }

    fn get(&self, ty: GgmlType) -> Result<&dyn QuantOps, QuantError> {
        use GgmlType as T;
        Ok(match ty {
            T::F32 => &self.f32,
            T::F16 => &self.f16,
            T::BF16 => &self.bf16,
            T::Q4_0 => &self.q4_0,
            T::Q4_1 => &self.q4_1,
            T::Q5_0 => &self.q5_0,
            T::Q5_1 => &self.q5_1,
            T::Q8_0 => &self.q8_0,
            T::Q2_K => &self.q2_k,
            T::Q3_K => &self.q3_k,
            T::Q4_K => &self.q4_k,
            T::Q5_K => &self.q5_k,
            T::Q6_K => &self.q6_k,
            T::IQ4_NL => &self.iq4_nl,
            T::IQ4_XS => &self.iq4_xs,
            T::MXFP4 => &self.mxfp4,
            T::IQ2_XXS => &self.iq2_xxs,
            T::IQ2_XS => &self.iq2_xs,
            T::IQ2_S => &self.iq2_s,
            T::NVFP4 => &self.nvfp4,
            T::IQ3_XXS => &self.iq3_xxs,
            T::IQ3_S => &self.iq3_s,
            T::IQ1_S => &self.iq1_s,
            T::IQ1_M => &self.iq1_m,
            _ => {
                return Err(QuantError::Unsupported {
                    ty,
                    what: "dequantisation and dot products",
                })
            }
        })
    }
}

static FAST: OnceLock<Table> = OnceLock::new();
static SCALAR: OnceLock<Table> = OnceLock::new();

/// The operations of `ty` with the fastest kernels this CPU supports
/// (chosen once per process; `LONGHAUL_NO_SIMD=1` forces the reference ones).
pub fn ops(ty: GgmlType) -> Result<&'static dyn QuantOps, QuantError> {
    fast_table().get(ty)
}

fn fast_table() -> &'static Table {
    FAST.get_or_init(|| Table::new(CpuCaps::detect()))
}

/// The operations of `ty` with the portable reference kernels only.
pub fn scalar_ops(ty: GgmlType) -> Result<&'static dyn QuantOps, QuantError> {
    SCALAR.get_or_init(|| Table::new(CpuCaps::NONE)).get(ty)
}

/// The operations of `ty` with the kernels a CPU with `caps` would get (for
/// tests and benches comparing kernel levels; the caps must be true of this
/// CPU when the returned operations are *called*, or [`CpuCaps::NONE`]).
pub fn ops_with_caps(ty: GgmlType, caps: CpuCaps) -> Result<&'static dyn QuantOps, QuantError> {
    // One leaked table per distinct caps value: a handful at most.
    static TABLES: Mutex<Vec<(CpuCaps, &'static Table)>> = Mutex::new(Vec::new());
    let mut tables = TABLES.lock().unwrap_or_else(|e| e.into_inner());
    let table = match tables.iter().find(|(c, _)| *c == caps) {
        Some((_, t)) => *t,
        None => {
            let t: &'static Table = Box::leak(Box::new(Table::new(caps)));
            tables.push((caps, t));
            t
        }
    };
    table.get(ty)
}

/// Name of the dot kernel a CPU with `caps` gets for `ty`; a pure function
/// for tests and `longhaul bench`.
pub fn kernel_for(ty: GgmlType, caps: CpuCaps) -> Result<&'static str, QuantError> {
    ops_with_caps(ty, caps).map(|o| o.kernel_name())
}

fn quantize_act_into<A: ActBlock>(x: &[f32], out: &mut Vec<u8>) -> Result<(), QuantError> {
    if !x.len().is_multiple_of(A::BLOCK) {
        return Err(QuantError::BadLength {
            ty: A::TYPE,
            what: "quantize_activations",
            unit: "elements (a multiple of the block size)",
            expected: x.len() / A::BLOCK * A::BLOCK,
            got: x.len(),
        });
    }
    let nb = x.len() / A::BLOCK;
    out.clear();
    out.resize(nb * size_of::<A>(), 0);
    // Allocations are at least 8-aligned in practice, so this writes in
    // place; a stricter block alignment falls back to a temporary.
    match bytemuck::try_cast_slice_mut::<u8, A>(out) {
        Ok(blocks) => quantize_act_fast(x, blocks),
        Err(_) => {
            let mut blocks = vec![<A as bytemuck::Zeroable>::zeroed(); nb];
            quantize_act_fast(x, &mut blocks);
            out.copy_from_slice(bytemuck::cast_slice(&blocks));
        }
    }
    Ok(())
}

/// [`ActBlock::quantize_act`], compiled for AVX2 where the CPU has it: the
/// same scalar code (no FMA contraction, the same roundings), vectorised by
/// the compiler instead of running SSE2 scalar instructions.
fn quantize_act_fast<A: ActBlock>(x: &[f32], out: &mut [A]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn avx2<A: ActBlock>(x: &[f32], out: &mut [A]) {
            A::quantize_act(x, out)
        }
        if fast_table().caps.has_avx2() {
            // SAFETY: the caps were detected on this CPU.
            return unsafe { avx2(x, out) };
        }
    }
    A::quantize_act(x, out)
}

/// Converts an f32 activation row to `act_ty` bytes as ggml's CPU path does
/// (F32: raw bytes; F16 / BF16: converted; Q8_0 / Q8_1 / Q8_K:
/// `quantize_row_q8_*`). `out` is cleared first.
pub fn quantize_activations(
    act_ty: GgmlType,
    x: &[f32],
    out: &mut Vec<u8>,
) -> Result<(), QuantError> {
    match act_ty {
        GgmlType::F32 => quantize_act_into::<f32>(x, out),
        GgmlType::F16 => quantize_act_into::<f16>(x, out),
        GgmlType::BF16 => quantize_act_into::<bf16>(x, out),
        GgmlType::Q8_0 => quantize_act_into::<BlockQ8_0>(x, out),
        GgmlType::Q8_1 => quantize_act_into::<BlockQ8_1>(x, out),
        GgmlType::Q8_K => quantize_act_into::<BlockQ8K>(x, out),
        ty => Err(QuantError::Unsupported {
            ty,
            what: "activation quantisation (activation types are f32, f16, bf16, q8_0, q8_1, q8_K)",
        }),
    }
}

/// Dequantises one row of `ty` (`dst.len()` elements).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    ops(ty)?.dequantize(src, dst)
}

/// Quantises `src` to `ty` with ggml's reference quantiser.
pub fn quantize_row(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let o = ops(ty)?;
    if !src.len().is_multiple_of(ty.block_size()) {
        return Err(QuantError::BadLength {
            ty,
            what: "quantize_row",
            unit: "elements (a multiple of the block size)",
            expected: src.len() / ty.block_size() * ty.block_size(),
            got: src.len(),
        });
    }
    let mut out = vec![0u8; src.len() / ty.block_size() * ty.type_size()];
    o.quantize(src, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn act_types_follow_ggml_vec_dot_type() {
        use GgmlType as T;
        let expect = [
            (T::F32, T::F32),
            (T::F16, T::F16),
            (T::BF16, T::BF16),
            (T::Q4_0, T::Q8_0),
            (T::Q4_1, T::Q8_1),
            (T::Q5_0, T::Q8_0),
            (T::Q5_1, T::Q8_1),
            (T::Q8_0, T::Q8_0),
            (T::Q2_K, T::Q8_K),
            (T::Q3_K, T::Q8_K),
            (T::Q4_K, T::Q8_K),
            (T::Q5_K, T::Q8_K),
            (T::Q6_K, T::Q8_K),
            (T::IQ4_NL, T::Q8_0),
            (T::IQ4_XS, T::Q8_K),
            (T::MXFP4, T::Q8_0),
            (T::IQ2_XXS, T::Q8_K),
            (T::IQ2_XS, T::Q8_K),
            (T::IQ2_S, T::Q8_K),
            (T::NVFP4, T::Q8_0),
            (T::IQ3_XXS, T::Q8_K),
            (T::IQ3_S, T::Q8_K),
            (T::IQ1_S, T::Q8_K),
            (T::IQ1_M, T::Q8_K),
        ];
        for (w, a) in expect {
            let o = ops(w).unwrap();
            assert_eq!((o.ty(), o.act_type()), (w, a));
            assert_eq!(scalar_ops(w).unwrap().kernel_name(), "scalar");
        }
    }

    fn expect_simd_x86() -> bool {
        cfg!(target_arch = "x86_64")
    }

    #[test]
    fn kernel_selection_is_a_pure_function_of_caps() {
        assert_eq!(kernel_for(GgmlType::Q4_K, CpuCaps::NONE).unwrap(), "scalar");
        let avx2 = CpuCaps {
            avx2: true,
            fma: true,
            f16c: true,
            avx512: false,
            bmi2: false,
        };
        let avx512 = CpuCaps {
            avx512: true,
            ..avx2
        };
        assert_eq!(
            kernel_for(GgmlType::Q6_K, avx512).unwrap() == "avx512vnni",
            expect_simd_x86()
        );
        assert_eq!(
            kernel_for(GgmlType::Q5_K, avx512).unwrap() == "avx2",
            expect_simd_x86()
        );
        // ggml has only AVX2 paths for the i-quants; longhaul's AVX-512
        // kernels give their bits (quant_formats' ggml goldens).
        for ty in [
            GgmlType::IQ2_XXS,
            GgmlType::IQ2_XS,
            GgmlType::IQ2_S,
            GgmlType::IQ3_XXS,
            GgmlType::IQ3_S,
            GgmlType::IQ1_S,
            GgmlType::IQ1_M,
        ] {
            assert_eq!(
                kernel_for(ty, avx512).unwrap() == "avx512vnni",
                expect_simd_x86()
            );
            assert_eq!(kernel_for(ty, avx2).unwrap() == "avx2", expect_simd_x86());
        }
        // IQ1_S / IQ1_M take their `pdep` kernels only where `pdep` is fast.
        let bmi2 = CpuCaps { bmi2: true, ..avx2 };
        for ty in [GgmlType::IQ1_S, GgmlType::IQ1_M] {
            assert_eq!(
                kernel_for(ty, bmi2).unwrap() == "avx2+bmi2",
                expect_simd_x86()
            );
        }
        let expect_simd = cfg!(target_arch = "x86_64");
        assert_eq!(
            kernel_for(GgmlType::Q4_K, avx2).unwrap() == "avx2",
            expect_simd
        );
        // Every x86 kernel needs F16C as well.
        let no_f16c = CpuCaps {
            f16c: false,
            ..avx2
        };
        assert_eq!(kernel_for(GgmlType::Q4_K, no_f16c).unwrap(), "scalar");
        assert!(kernel_for(GgmlType::TQ1_0, avx2).is_err());
    }

    /// Deterministic pseudo-random bytes (xorshift).
    fn bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// The weight types ggml's x86 CPU backend hands to llamafile's
    /// tinyBLAS (`tinyBLAS_Q0_AVX`) for two or more activation rows.
    const TINYBLAS: [GgmlType; 4] = [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
    ];

    /// The integer quants of one 32-weight block of a [`TINYBLAS`] type
    /// (or a Q8_0 activation block) and its f16 scale.
    fn q0_block(ty: GgmlType, b: &[u8]) -> (f32, [i32; 32]) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        let mut q = [0i32; 32];
        for j in 0..16 {
            let (lo, hi) = match ty {
                GgmlType::Q8_0 => (b[2 + j] as i8 as i32, b[18 + j] as i8 as i32),
                GgmlType::Q5_0 => {
                    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                    let x = b[6 + j];
                    let l = (x & 0xF) as u32 | ((qh >> j) & 1) << 4;
                    let h = (x >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
                    (l as i32 - 16, h as i32 - 16)
                }
                GgmlType::Q4_0 => ((b[2 + j] & 0xF) as i32 - 8, (b[2 + j] >> 4) as i32 - 8),
                _ => {
                    let k = &super::super::common::KVALUES_IQ4NL;
                    (
                        k[(b[2 + j] & 0xF) as usize] as i32,
                        k[(b[2 + j] >> 4) as usize] as i32,
                    )
                }
            };
            q[j] = lo;
            q[j + 16] = hi;
        }
        (d, q)
    }

    /// One output of `tinyBLAS_Q0_AVX` (sgemm.cpp, AVX2 + FMA): per block
    /// `C = fma(dw * da, lanes, C)` with lane `l` the sum of products
    /// `4l..4l + 4`, then `hsum` = `(l0+l4 + l2+l6) + (l1+l5 + l3+l7)`.
    fn tinyblas_q0(ty: GgmlType, w: &[u8], a: &[u8]) -> f32 {
        let mut acc = [0f32; 8];
        for (bw, ba) in w.chunks_exact(ty.type_size()).zip(a.chunks_exact(34)) {
            let (dw, qw) = q0_block(ty, bw);
            let (da, qa) = q0_block(GgmlType::Q8_0, ba);
            let d = dw * da;
            for (l, acc) in acc.iter_mut().enumerate() {
                let p: i32 = (4 * l..4 * l + 4).map(|i| qw[i] * qa[i]).sum();
                *acc = d.mul_add(p as f32, *acc);
            }
        }
        let r: Vec<f32> = (0..4).map(|i| acc[i + 4] + acc[i]).collect();
        (r[0] + r[2]) + (r[1] + r[3])
    }

    /// The tile kernels give the row kernel's bits, except where ggml's CPU
    /// backend itself switches to tinyBLAS (two or more activation rows of
    /// a [`TINYBLAS`] type): there they give tinyBLAS's bits.
    #[test]
    fn tile_kernels_give_the_bits_of_the_row_kernel() {
        let avx2 = CpuCaps {
            avx512: false,
            ..CpuCaps::detect()
        };
        let levels = [CpuCaps::NONE, avx2, CpuCaps::detect()];
        for ty in SUPPORTED_TYPES {
            for caps in levels {
                let o = ops_with_caps(ty, caps).unwrap();
                let n = if ty.block_size() >= 64 { 512 } else { 96 };
                for (n_rows, n_acts) in [
                    (1, 1),
                    (3, 1),
                    (4, 1),
                    (9, 1),
                    (5, 2),
                    (5, 3),
                    (6, 5),
                    (8, 4),
                    (13, 7),
                    (8, 8),
                    (5, 9),
                    (12, 16),
                ] {
                    // Weights: quantised noise with a few outliers, or (types
                    // without a quantiser) random bytes.
                    let x: Vec<f32> = bytes(7 + n_rows as u64, n * n_rows)
                        .iter()
                        .enumerate()
                        .map(|(i, &b)| {
                            (b as f32 - 127.5) / 40.0 * if i % 37 == 0 { 9.0 } else { 1.0 }
                        })
                        .collect();
                    // Q8_0 with odd row counts: raw bytes, -128 included.
                    let raw = ty == GgmlType::Q8_0 && n_rows % 2 == 1;
                    let q = if raw {
                        Err(QuantError::Unsupported { ty, what: "" })
                    } else {
                        quantize_row(ty, &x)
                    };
                    let w = q.unwrap_or_else(|_| {
                        let mut w = bytes(3, ty.row_bytes((n * n_rows) as u64).unwrap() as usize);
                        // Keep f16 scales finite: small positive halves
                        // wherever the block stores them first.
                        for b in w.chunks_exact_mut(ty.type_size()) {
                            b[0] = 0x00;
                            b[1] = 0x1c;
                        }
                        w
                    });
                    let mut acts = Vec::new();
                    for t in 0..n_acts {
                        let a: Vec<f32> = bytes(11 + t as u64, n)
                            .iter()
                            .map(|&b| (b as f32 - 127.5) / 60.0)
                            .collect();
                        let mut q = Vec::new();
                        quantize_activations(o.act_type(), &a, &mut q).unwrap();
                        acts.extend_from_slice(&q);
                    }
                    let (rb, ab) = (w.len() / n_rows, acts.len() / n_acts);
                    let mut tile = vec![f32::NAN; n_rows * n_acts];
                    o.vec_dot_tile(n, &w, &acts, &mut tile).unwrap();
                    for t in 0..n_acts {
                        let act = &acts[t * ab..(t + 1) * ab];
                        let mut rows = vec![f32::NAN; n_rows];
                        o.vec_dot_rows(n, &w, act, &mut rows).unwrap();
                        for r in 0..n_rows {
                            let wr = &w[r * rb..(r + 1) * rb];
                            let one = o.vec_dot(n, wr, act).unwrap();
                            let what =
                                format!("{ty} {} {n_rows}x{n_acts} r{r} t{t}", o.kernel_name());
                            // ggml's CPU backend runs tinyBLAS there.
                            let want = if TINYBLAS.contains(&ty) && n_acts > 1 && caps.has_avx2() {
                                tinyblas_q0(ty, wr, act)
                            } else {
                                one
                            };
                            assert_eq!(
                                tile[t * n_rows + r].to_bits(),
                                want.to_bits(),
                                "tile {what}"
                            );
                            assert_eq!(rows[r].to_bits(), one.to_bits(), "rows {what}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn compiled_activation_quantisers_give_the_reference_bytes() {
        fn check<A: ActBlock + PartialEq + std::fmt::Debug>(x: &[f32]) {
            let nb = x.len() / A::BLOCK;
            let mut want = vec![<A as bytemuck::Zeroable>::zeroed(); nb];
            let mut got = want.clone();
            A::quantize_act(x, &mut want);
            quantize_act_fast(x, &mut got);
            assert_eq!(got, want, "{}", A::TYPE);
        }
        // Noise with outliers, an all-zero block, ties at .5 and subnormals.
        let mut x: Vec<f32> = bytes(5, 1024)
            .iter()
            .enumerate()
            .map(|(i, &b)| (b as f32 - 127.5) / 50.0 * if i % 29 == 0 { 40.0 } else { 1.0 })
            .collect();
        x[256..512].fill(0.0);
        x[512] = 127.0;
        x[513] = 0.5;
        x[514] = -1.5;
        x[600] = 1e-40;
        check::<BlockQ8_0>(&x);
        check::<BlockQ8_1>(&x);
        check::<BlockQ8K>(&x);
        check::<f16>(&x);
        check::<bf16>(&x);
    }

    /// The types with tile kernels have them wherever AVX2 is (so the
    /// bit-identity test above runs them, not the row-kernel fallback).
    #[test]
    fn tile_kernels_are_selected_with_avx2() {
        let avx2 = CpuCaps {
            avx512: false,
            ..CpuCaps::detect()
        };
        for caps in [CpuCaps::NONE, avx2, CpuCaps::detect()] {
            let want = cfg!(target_arch = "x86_64") && caps.has_avx2();
            assert_eq!(BlockQ4_1::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockQ5_0::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockQ8_0::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockQ4K::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockIQ4NL::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockIQ2XXS::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockIQ2XS::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockIQ2S::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockIQ3XXS::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockIQ3S::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockIQ1S::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockIQ1M::tile_kernel(caps).is_some(), want);
            assert_eq!(BlockNVFP4::tile_kernel(caps).is_some(), want);
        }
    }

    #[test]
    fn tile_checks_lengths() {
        let o = ops(GgmlType::Q8_0).unwrap();
        let w = quantize_row(GgmlType::Q8_0, &[0.5; 64]).unwrap();
        let mut a = Vec::new();
        quantize_activations(GgmlType::Q8_0, &[0.25; 32], &mut a).unwrap();
        let mut out = [0f32; 2];
        o.vec_dot_tile(32, &w, &a, &mut out).unwrap();
        assert_eq!(out[0].to_bits(), out[1].to_bits());
        assert!(o.vec_dot_tile(32, &w, &a, &mut [0f32; 3]).is_err());
        assert!(o.vec_dot_tile(32, &w, &a[1..], &mut out).is_err());
        assert!(o.vec_dot_tile(32, &w[1..], &a, &mut out).is_err());
        assert!(o.vec_dot_tile(32, &[], &[], &mut []).is_ok());
    }

    #[test]
    fn unsupported_names_the_supported_types() {
        let err = ops(GgmlType::TQ1_0).err().unwrap();
        let msg = err.to_string();
        assert!(
            msg.contains("tq1_0") && msg.contains("q4_K") && msg.contains("mxfp4"),
            "{msg}"
        );
        let e = quantize_row(GgmlType::Q3_K, &[0.0; 256]).unwrap_err();
        assert!(matches!(
            e,
            QuantError::Unsupported {
                ty: GgmlType::Q3_K,
                ..
            }
        ));
    }
}
