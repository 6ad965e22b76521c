//! Causal grouped-query attention over the host KV cache with an online
//! softmax (one pass over keys, running max and sum), optional per-head sinks
//! (an extra logit in the denominator, gpt-oss) and sliding windows.

use half::f16;
use rayon::prelude::*;

use super::{CpuKv, CpuTensor, KvStore};
use crate::backend::{AttnParams, BackendError, BatchPos};

/// Reads `dst.len()` values starting at element `at` of a cache store.
#[inline]
fn load(store: &KvStore, at: usize, dst: &mut [f32]) {
    let n = dst.len();
    match store {
        KvStore::F32(v) => dst.copy_from_slice(&v[at..at + n]),
        KvStore::F16(v) => dst
            .iter_mut()
            .zip(&v[at..at + n])
            .for_each(|(d, s)| *d = f16::to_f32(*s)),
    }
}

pub(super) fn attend(
    kv: &CpuKv,
    q: &CpuTensor,
    sinks: Option<&[f32]>,
    pos: BatchPos,
    p: &AttnParams,
) -> Result<CpuTensor, BackendError> {
    let hd = p.head_dim;
    if p.n_head == 0
        || p.n_head_kv == 0
        || p.n_head % p.n_head_kv != 0
        || q.cols != p.n_head * hd
        || q.rows != pos.n_tokens
        || kv.n_embd_k != p.n_head_kv * hd
        || kv.n_embd_v != p.n_head_kv * hd
    {
        return Err(BackendError::Shape {
            op: "attention",
            detail: format!(
                "q [{}, {}], {} heads / {} kv heads of {hd}, cache rows {}/{}",
                q.rows, q.cols, p.n_head, p.n_head_kv, kv.n_embd_k, kv.n_embd_v
            ),
        });
    }
    if let Some(s) = sinks {
        if s.len() != p.n_head {
            return Err(BackendError::Shape {
                op: "attention",
                detail: format!("{} sinks for {} heads", s.len(), p.n_head),
            });
        }
    }
    let group = p.n_head / p.n_head_kv;
    let mut out = CpuTensor::zeros(q.rows, q.cols);
    out.data.par_chunks_mut(hd).enumerate().for_each_init(
        || (vec![0f32; hd], vec![0f32; hd]),
        |(kbuf, acc), (i, dst)| {
            let (t, h) = (i / p.n_head, i % p.n_head);
            let qp = pos.pos0 + t;
            let lo = match p.window {
                Some(w) => (qp + 1).saturating_sub(w as usize),
                None => 0,
            };
            let kvh = h / group;
            let qrow = &q.data[t * q.cols + h * hd..t * q.cols + (h + 1) * hd];
            let mut m = f32::NEG_INFINITY;
            let mut l = 0f32;
            acc.iter_mut().for_each(|a| *a = 0.0);
            for j in lo..=qp {
                load(&kv.k, j * kv.n_embd_k + kvh * hd, kbuf);
                let s = qrow
                    .iter()
                    .zip(kbuf.iter())
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    * p.scale;
                if s > m {
                    let c = if m == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (m - s).exp()
                    };
                    acc.iter_mut().for_each(|a| *a *= c);
                    l *= c;
                    m = s;
                }
                let w = (s - m).exp();
                l += w;
                load(&kv.v, j * kv.n_embd_v + kvh * hd, kbuf);
                acc.iter_mut()
                    .zip(kbuf.iter())
                    .for_each(|(a, v)| *a += w * v);
            }
            if let Some(s) = sinks {
                let sink = s[h];
                let m2 = m.max(sink);
                let c = if m == f32::NEG_INFINITY {
                    0.0
                } else {
                    (m - m2).exp()
                };
                acc.iter_mut().for_each(|a| *a *= c);
                l = l * c + (sink - m2).exp();
            }
            let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
            dst.iter_mut()
                .zip(acc.iter())
                .for_each(|(d, a)| *d = a * inv);
        },
    );
    Ok(out)
}
