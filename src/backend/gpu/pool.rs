//! Activation buffers, and the small lists and tables a step uploads
//! ([`super::Ctx::upload_temp`]), reused across ops and decode steps, so
//! that a step of a warm model creates none of them: no allocation, and none
//! of the zero-fill wgpu records before a new buffer's first use.
//!
//! A buffer whose last [`Pooled`] handle is dropped is *retired*: commands
//! recorded but not yet submitted may still read or write it. Retired
//! buffers become *free* once everything recorded before has been
//! submitted ([`Pool::release`], called at each submission and when
//! nothing is pending). The queue then orders any later use after every
//! earlier one, for recorded commands and `queue.write_buffer` alike, so
//! reuse needs no fence; and a reused buffer NaN-filled for tests holds NaN,
//! not an earlier tensor's values, when the next kernel runs.
//!
//! Free buffers are kept by exact size (activations of one model recur at
//! the same sizes every step), up to [`POOL_MAX_BYTES`]; past that, retired
//! buffers are dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Most bytes of free buffers kept for reuse.
pub const POOL_MAX_BYTES: u64 = 256 << 20;

#[derive(Default)]
pub(super) struct Pool {
    retired: Vec<wgpu::Buffer>,
    free: HashMap<u64, Vec<wgpu::Buffer>>,
    free_bytes: u64,
}

impl Pool {
    /// Retired buffers become free (call only when everything recorded
    /// before now has been submitted).
    pub(super) fn release(&mut self) {
        for buf in std::mem::take(&mut self.retired) {
            let size = buf.size();
            if self.free_bytes + size <= POOL_MAX_BYTES {
                self.free_bytes += size;
                self.free.entry(size).or_default().push(buf);
            }
        }
    }

    /// A free buffer of exactly `size` bytes, if one is kept.
    pub(super) fn take(&mut self, size: u64) -> Option<wgpu::Buffer> {
        let buf = self.free.get_mut(&size)?.pop()?;
        self.free_bytes -= size;
        Some(buf)
    }
}

/// A storage buffer that goes back to its device's pool when dropped
/// (a tensor's clones share one through an `Arc`); it derefs to the
/// buffer. A buffer from elsewhere (an upload) is wrapped with no pool.
#[derive(Debug)]
pub struct Pooled {
    buf: wgpu::Buffer,
    pool: Weak<Mutex<Pool>>,
}

impl Pooled {
    pub(super) fn new(buf: wgpu::Buffer, pool: &Arc<Mutex<Pool>>) -> Arc<Self> {
        Arc::new(Pooled {
            buf,
            pool: Arc::downgrade(pool),
        })
    }

    /// `buf`, not returned to any pool.
    pub fn unpooled(buf: wgpu::Buffer) -> Arc<Self> {
        Arc::new(Pooled {
            buf,
            pool: Weak::new(),
        })
    }
}

impl std::ops::Deref for Pooled {
    type Target = wgpu::Buffer;
    fn deref(&self) -> &wgpu::Buffer {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            let mut p = pool.lock().unwrap_or_else(|e| e.into_inner());
            // A handle to the same buffer; this one goes with `self`.
            p.retired.push(self.buf.clone());
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("retired", &self.retired.len())
            .field("free_bytes", &self.free_bytes)
            .finish()
    }
}
