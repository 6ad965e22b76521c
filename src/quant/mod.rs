//! ggml block formats: bytes -> numbers.
//!
//! This module owns the byte-exact layouts of ggml's tensor types (one file
//! per format family, each block a `#[repr(C)]` [`bytemuck::Pod`] struct with a
//! compile-time size assertion), their CPU reference dequantisers, the
//! reference quantisers ggml ships (`quantize_row_*_ref`), the activation
//! quantisers of ggml's CPU matmul path (`quantize_row_q8_0/q8_1/q8_K`) and
//! the integer dot products `ggml_vec_dot_<w>_<act>`.
//!
//! It knows nothing about devices, files or models: callers hand it byte
//! slices (mmap'd GGUF rows, expert slots) and get numbers back.
//!
//! Two levels of API:
//! - [`GgmlBlock`] / [`ActBlock`]: generic traits with associated constants and
//!   the activation block type, for monomorphised kernels;
//! - [`QuantOps`]: an object-safe trait chosen at run time with [`ops`]; it
//!   checks lengths, casts bytes to blocks and calls the fastest kernel the CPU
//!   supports (picked once per process, see [`CpuCaps`]). [`scalar_ops`] gives
//!   the same trait over the portable reference kernels, and
//!   `LONGHAUL_NO_SIMD=1` makes [`ops`] return those.
//!
//! Alignment: blocks holding `f16` have alignment 2 (Q8_K: 4). GGUF aligns
//! tensor data to 32 bytes, so rows read in place are always aligned; a
//! misaligned slice is copied into an aligned temporary (correct, slower), so
//! [`QuantOps`] never fails for alignment. [`cast_blocks`] is the strict
//! zero-copy cast and reports [`QuantError::Misaligned`].
//!
//! Activation values: like ggml's SIMD kernels, the AVX2 dot products assume
//! Q8 activation quants lie in `[-127, 127]`, which is what every activation
//! quantiser here produces.

/// `GgmlBlock::simd_dot` for x86_64: the AVX-512 VNNI kernel
/// `simd_x86_512::$avx512` when the CPU has it, else the AVX2 kernel
/// `simd_x86::$avx2` (AVX2 + FMA + F16C), else `None`.
macro_rules! x86_kernels {
    (avx2: $avx2:ident $(, avx512: $avx512:ident)?) => {
        fn simd_dot(caps: $crate::quant::CpuCaps) -> Option<$crate::quant::Kernel<Self>> {
            #[cfg(target_arch = "x86_64")]
            {
                $(
                    if caps.has_avx512() {
                        return Some($crate::quant::Kernel {
                            name: "avx512vnni",
                            dot: $crate::quant::simd_x86_512::$avx512,
                        });
                    }
                )?
                if caps.has_avx2() {
                    return Some($crate::quant::Kernel {
                        name: "avx2",
                        dot: $crate::quant::simd_x86::$avx2,
                    });
                }
            }
            let _ = caps;
            None
        }
    };
}

mod common;
mod float;
mod iq1;
mod iq3;
mod iq2;
mod iq4;
#[allow(dead_code)] // until the i-quant formats use every table
mod iq_tables;
mod k_quants;
mod mxfp4;
mod nvfp4;
mod ops;
mod q4_0;
mod q4_1;
mod q5;
mod q8;
#[cfg(target_arch = "x86_64")]
mod simd_x86;
#[cfg(target_arch = "x86_64")]
mod simd_x86_512;

use crate::tensor::GgmlType;
use bytemuck::Pod;
use std::borrow::Cow;

pub use iq1::{BlockIQ1M, BlockIQ1S};
pub use iq3::{BlockIQ3S, BlockIQ3XXS};
pub use iq2::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
pub use iq4::{BlockIQ4NL, BlockIQ4XS};
pub use k_quants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K};
pub use mxfp4::BlockMXFP4;
pub use nvfp4::BlockNVFP4;
pub use ops::{
    dequantize_row, kernel_for, ops, ops_with_caps, quantize_activations, quantize_row, scalar_ops,
    CpuCaps, QuantOps, SUPPORTED_TYPES,
};
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q5::{BlockQ5_0, BlockQ5_1};
pub use q8::{BlockQ8K, BlockQ8_0, BlockQ8_1};

/// Elements per super-block of the K-quants (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// Errors of the quant layer. Every message names the type and what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The type has no implementation of `what` here.
    #[error(
        "{what} is not supported for {ty}; longhaul supports {}",
        supported_list()
    )]
    Unsupported { ty: GgmlType, what: &'static str },
    /// A length does not match the type's block geometry.
    #[error("{what}: {ty} expected {expected} {unit}, got {got}")]
    BadLength {
        ty: GgmlType,
        what: &'static str,
        unit: &'static str,
        expected: usize,
        got: usize,
    },
    /// A byte slice is not aligned for the block type (strict casts only).
    #[error("{what}: {ty} data is not aligned to {align} bytes; copy it into an aligned buffer")]
    Misaligned {
        ty: GgmlType,
        what: &'static str,
        align: usize,
    },
}

fn supported_list() -> String {
    SUPPORTED_TYPES
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// An activation block type: what a weight row is dotted against (ggml's
/// `vec_dot_type`): `f32`, `f16`, `bf16`, Q8_0, Q8_1 or Q8_K.
pub trait ActBlock: Pod + Send + Sync + 'static {
    /// The ggml type id of this block.
    const TYPE: GgmlType;
    /// Elements per block.
    const BLOCK: usize;
    /// ggml's CPU `from_float` for this type: `x.len() == out.len() * BLOCK`.
    fn quantize_act(x: &[f32], out: &mut [Self]);
}

/// A kernel of one weight type: `dot(n, w, a)` over `n` elements, where
/// `w.len() == n / BLOCK` and `a.len() == n / Act::BLOCK` (equal except for
/// NVFP4, whose 64-element blocks span two Q8_0 blocks).
pub type DotFn<B> = fn(usize, &[B], &[<B as GgmlBlock>::Act]) -> f32;

/// A dot-product kernel and a name for logs and benches ("avx2", "scalar").
pub struct Kernel<B: GgmlBlock> {
    pub name: &'static str,
    pub dot: DotFn<B>,
}

/// A weight block type: geometry, reference dequantiser and dot product.
///
/// Implementations are byte-exact to ggml; the `vec_dot` here is the portable
/// reference (the same integer arithmetic and accumulation order as ggml's
/// scalar `ggml_vec_dot_*`). Faster kernels come from [`GgmlBlock::simd_dot`].
pub trait GgmlBlock: Pod + Send + Sync + 'static {
    /// The ggml type id.
    const TYPE: GgmlType;
    /// Elements per block.
    const BLOCK: usize;
    /// True when [`GgmlBlock::from_f32`] is implemented.
    const HAS_FROM_F32: bool = false;
    /// The activation block this type is dotted against (ggml's `vec_dot_type`).
    type Act: ActBlock;
    /// Dequantises `blocks` into `out` (`out.len() == blocks.len() * BLOCK`).
    fn to_f32(blocks: &[Self], out: &mut [f32]);
    /// Reference dot product of `n` elements (`n == w.len() * BLOCK`).
    fn vec_dot(n: usize, w: &[Self], a: &[Self::Act]) -> f32;
    /// ggml's reference quantiser (`quantize_row_*_ref`).
    fn from_f32(_x: &[f32], _out: &mut [Self]) -> Result<(), QuantError> {
        Err(QuantError::Unsupported {
            ty: Self::TYPE,
            what: "quantisation",
        })
    }
    /// The fastest kernel available with `caps`, if faster than the reference.
    fn simd_dot(_caps: CpuCaps) -> Option<Kernel<Self>> {
        None
    }
}

/// Casts bytes to blocks without copying. Errors on a length that is not a
/// whole number of blocks and on misalignment.
pub fn cast_blocks<'a, T: Pod>(
    ty: GgmlType,
    what: &'static str,
    bytes: &'a [u8],
) -> Result<&'a [T], QuantError> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return Err(QuantError::BadLength {
            ty,
            what,
            unit: "bytes (a multiple of the block size)",
            expected: bytes.len() / size * size,
            got: bytes.len(),
        });
    }
    bytemuck::try_cast_slice(bytes).map_err(|_| QuantError::Misaligned {
        ty,
        what,
        align: std::mem::align_of::<T>(),
    })
}

/// Like [`cast_blocks`] but copies a misaligned slice into an aligned buffer.
pub(crate) fn cast_or_copy<'a, T: Pod>(
    ty: GgmlType,
    what: &'static str,
    bytes: &'a [u8],
) -> Result<Cow<'a, [T]>, QuantError> {
    match cast_blocks::<T>(ty, what, bytes) {
        Ok(b) => Ok(Cow::Borrowed(b)),
        Err(QuantError::Misaligned { .. }) => {
            let mut v = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
            bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
            Ok(Cow::Owned(v))
        }
        Err(e) => Err(e),
    }
}
