//! The shared blocks every architecture file is written over: attention,
//! dense and MoE feed-forward, the router; the [`Loader`] through which an
//! architecture declares the tensors it needs, and the [`Pass`] that carries
//! one forward pass through a layer.

pub mod attention;
pub mod deltanet;
pub mod ffn;
pub mod mla;
pub mod router;

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::sync::Arc;

use super::{Hparams, Model, ModelError};
use crate::backend::{Backend, BatchPos};
use crate::gguf;
pub use attention::{Attention, Gqa, QkNorm};
pub use ffn::{DenseFfn, Experts, Ffn, MoeFfn};
pub use router::{Router, Routing, Scoring};

/// Weights and settings of one repeating layer: a pre-norm attention block
/// and a pre-norm feed-forward block, each added to the residual stream.
pub struct Layer<W> {
    pub attn_norm: W,
    pub attn: Attention<W>,
    pub ffn_norm: W,
    pub ffn: Ffn<W>,
}

/// One forward pass over a batch, as a layer function sees it.
pub struct Pass<'a, 's, B: Backend> {
    pub m: &'s Model<B>,
    /// Each sequence's rows of the batch (see [`crate::backend::BatchPos`]).
    pub seqs: &'a [BatchPos],
    /// Where longhaul's lookahead reads run while the layers compute.
    pub io: &'a crate::longhaul::IoScope<'s>,
    /// Whether this pass reads ahead (`--longhaul-prefetch`).
    pub lookahead: bool,
}

impl<B: Backend> Pass<'_, '_, B> {
    pub fn b(&self) -> &B {
        &self.m.backend
    }

    pub fn hp(&self) -> &Hparams {
        &self.m.hp
    }

    /// RMS norm over whole rows of the residual stream.
    pub fn norm(&self, x: &B::Tensor, w: &B::Weight) -> Result<B::Tensor, ModelError> {
        let hp = self.hp();
        Ok(self.b().rms_norm(x, w, hp.n_embd, hp.eps)?)
    }
}

/// [`Backend::matmul_many`] with its outputs as an array.
pub fn matmuls<B: Backend, const N: usize>(
    b: &B,
    ws: [&B::Weight; N],
    x: &B::Tensor,
) -> Result<[B::Tensor; N], ModelError> {
    outputs("matmul_many", b.matmul_many(&ws, x)?)
}

/// The outputs of a backend op over `N` matrices as an array.
pub(crate) fn outputs<T, const N: usize>(
    op: &'static str,
    out: Vec<T>,
) -> Result<[T; N], ModelError> {
    let n = out.len();
    out.try_into().map_err(|_| {
        ModelError::from(crate::backend::BackendError::Shape {
            op,
            detail: format!("{n} outputs for {N} matrices"),
        })
    })
}

/// Whether `--repack` gives `t` the backend's kernel layout. The embedding
/// is read a row at a time (`get_rows`), so it never is.
pub(crate) fn repackable<B: Backend>(backend: &B, t: &gguf::TensorInfo) -> bool {
    !t.name.contains("token_embd") && backend.repacks(t)
}

/// What the block loader needs to know of [`super::LoadOptions`].
pub(crate) struct LoadHow {
    /// Routed experts get placeholders (their bytes go to slots).
    pub longhaul: bool,
    pub shapes_only: bool,
    /// Give matrices the backend's kernel layout (`--repack`).
    pub repack: bool,
    /// Reported against the bytes to repack out of the mapping, as they
    /// are read (a copying load reports through `Loader::copy` instead).
    pub repack_progress: Option<(super::Progress, u64)>,
}

/// Loads the tensors an architecture declares, checking each one's shape,
/// and remembers which it took: a tensor the architecture does not declare
/// is an error after loading ([`Loader::finish`]), never silently ignored.
pub struct Loader<'a, B: Backend> {
    pub backend: &'a B,
    pub file: &'a Arc<gguf::Model>,
    pub hp: &'a Hparams,
    pub(crate) how: &'a LoadHow,
    /// Read tensors into memory instead of using the mapping (longhaul: no
    /// weight may depend on file pages staying valid; `--no-mmap`), with an
    /// optional progress report against the total bytes to copy.
    pub(crate) copy: Option<(Option<super::Progress>, u64)>,
    copied: Cell<u64>,
    /// Bytes copied out of the mapping to be repacked.
    pub(crate) repacked: Cell<u64>,
    claimed: RefCell<HashSet<String>>,
}

impl<'a, B: Backend> Loader<'a, B> {
    pub(crate) fn new(
        backend: &'a B,
        file: &'a Arc<gguf::Model>,
        hp: &'a Hparams,
        how: &'a LoadHow,
        copy: Option<(Option<super::Progress>, u64)>,
    ) -> Self {
        Loader {
            backend,
            file,
            hp,
            how,
            copy,
            copied: Cell::new(0),
            repacked: Cell::new(0),
            claimed: RefCell::new(HashSet::new()),
        }
    }

    fn checked(&self, t: &gguf::TensorInfo, dims: &[u64]) -> Result<B::Weight, ModelError> {
        // ggml shapes are equal up to trailing ones ([n] == [n, 1]).
        let trim = |d: &[u64]| d.iter().rposition(|&x| x != 1).map_or(0, |i| i + 1);
        if t.dims[..trim(&t.dims)] != dims[..trim(dims)] {
            return Err(ModelError::BadShape {
                name: t.name.clone(),
                found: t.dims.clone(),
                expected: dims.to_vec(),
            });
        }
        self.claimed.borrow_mut().insert(t.name.clone());
        let routed = ffn::is_routed(&t.name);
        if self.how.shapes_only || (routed && self.how.longhaul) {
            return Ok(self.backend.placeholder_weight(t)?);
        }
        let repack = self.how.repack && repackable(self.backend, t);
        if self.copy.is_none() && !repack {
            return Ok(self.backend.load_weight(self.file, t)?);
        }
        let mut bytes = vec![0u8; t.len as usize];
        // A layout the backend converts piece by piece is written as the
        // pieces are read.
        let pieces = repack.then(|| self.backend.repack_pieces(t)).flatten();
        match &pieces {
            Some(p) => crate::longhaul::read_parallel_converting(
                self.file, t.shard, t.offset, &mut bytes, p,
            )?,
            None => crate::longhaul::read_parallel(self.file, t.shard, t.offset, &mut bytes)?,
        }
        crate::longhaul::release_pages(self.file, t.shard, t.offset, t.len);
        match &self.copy {
            Some((progress, total)) => {
                self.copied.set(self.copied.get() + t.len);
                if let Some(p) = progress {
                    p(self.copied.get(), *total);
                }
            }
            // Copied out of the mapping only to take the kernel layout.
            None => {
                self.repacked.set(self.repacked.get() + t.len);
                if let Some((p, total)) = &self.how.repack_progress {
                    p(self.repacked.get(), *total);
                }
            }
        }
        if pieces.is_some() {
            return Ok(self.backend.converted_weight(t, bytes)?);
        }
        if repack {
            return Ok(self.backend.repacked_weight(t, bytes)?);
        }
        Ok(self.backend.weight_from_bytes(t, bytes)?)
    }

    /// Layer `il`'s norm weight `blk.{il}.{name}.weight` over the embedding.
    pub fn layer_norm(&self, il: usize, name: &str) -> Result<B::Weight, ModelError> {
        self.req(&format!("blk.{il}.{name}.weight"), &[self.hp.n_embd as u64])
    }

    /// An optional tensor: loaded when the file has it.
    pub fn opt(&self, name: &str, dims: &[u64]) -> Result<Option<B::Weight>, ModelError> {
        self.file
            .tensor(name)
            .map(|t| self.checked(t, dims))
            .transpose()
    }

    /// A required tensor: a file without it is an error naming it.
    pub fn req(&self, name: &str, dims: &[u64]) -> Result<B::Weight, ModelError> {
        self.checked(self.file.require_tensor(name)?, dims)
    }

    /// A small vector read to the host as f32 (a router's selection bias,
    /// which only steers the host-side top-k); `None` when absent, and in a
    /// shapes-only load.
    pub fn opt_host(&self, name: &str, n: u64) -> Result<Option<Vec<f32>>, ModelError> {
        let Some(t) = self.file.tensor(name) else {
            return Ok(None);
        };
        if t.dims.iter().product::<u64>() != n {
            return Err(ModelError::BadShape {
                name: t.name.clone(),
                found: t.dims.clone(),
                expected: vec![n],
            });
        }
        self.claimed.borrow_mut().insert(t.name.clone());
        if self.how.shapes_only {
            return Ok(None);
        }
        let mut bytes = vec![0u8; t.len as usize];
        self.file.read_at(t.shard, t.offset, &mut bytes)?;
        let mut out = vec![0f32; n as usize];
        crate::quant::dequantize_row(t.ty, &bytes, &mut out)
            .map_err(crate::backend::BackendError::from)?;
        Ok(Some(out))
    }

    /// Marks every tensor of layer `il` as deliberately not loaded (the
    /// NextN/MTP layers some files carry after the repeating ones).
    pub fn skip_layer(&self, il: usize) {
        let prefix = format!("blk.{il}.");
        let mut c = self.claimed.borrow_mut();
        for t in self.file.tensors() {
            if t.name.starts_with(&prefix) {
                c.insert(t.name.clone());
            }
        }
    }

    /// Fails on the first tensor of the file that no declaration took: an
    /// architecture never runs a file whose tensors it would not all use.
    pub fn finish(&self) -> Result<(), ModelError> {
        let c = self.claimed.borrow();
        match self.file.tensors().iter().find(|t| !c.contains(&t.name)) {
            Some(t) => Err(ModelError::UnexpectedTensor {
                name: t.name.clone(),
                arch: self.hp.arch.clone(),
            }),
            None => Ok(()),
        }
    }
}
