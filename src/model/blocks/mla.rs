//! Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) in the absorbed
//! form llama.cpp runs for prompts and decode alike: the keys are the
//! normed kv latent with its decoupled rope part, one KV head shared by all
//! query heads (MQA), and the values are the latent itself, so the cache
//! holds `kv_lora_rank + qk_rope_head_dim` values per position. The query's
//! no-rope part is absorbed through `attn_k_b` before attention and the
//! output decompressed through `attn_v_b` after it.

use super::{Loader, Pass};
use crate::backend::{AttnParams, Backend, RopeParams};
use crate::model::ModelError;

/// The query projection: direct (DeepSeek-V2-Lite) or through a LoRA with
/// a norm between its halves.
pub enum MlaQuery<W> {
    Direct(W),
    Lora { a: W, norm: W, b: W },
}

/// MLA weights and settings of one layer.
pub struct Mla<W> {
    pub q: MlaQuery<W>,
    /// `[n_embd, kv_lora + rope]`: the kv latent and the shared rope key.
    pub wkv_a_mqa: W,
    pub kv_a_norm: W,
    /// `[nope, kv_lora, n_head]`: absorbs each head's no-rope query.
    pub wk_b: W,
    /// `[kv_lora, v_head, n_head]`: decompresses each head's output.
    pub wv_b: W,
    pub wo: W,
    pub n_head: usize,
    /// Per-head query/key sizes of the no-rope and rope parts.
    pub nope: usize,
    pub rope_dim: usize,
    pub kv_lora: usize,
    pub v_head: usize,
    pub rope: RopeParams,
    /// llama.cpp's `kq_scale`: YaRN's mscale squared over sqrt(nope + rope).
    pub scale: f32,
}

impl<W> Mla<W> {
    /// `(K, V)` values per position of its cache: V lives inside K.
    pub fn kv_widths(&self) -> (usize, usize) {
        (self.kv_lora + self.rope_dim, 0)
    }

    /// Layer `il`'s MLA with rope `rope`.
    pub fn load<B: Backend<Weight = W>>(
        l: &Loader<B>,
        il: usize,
        rope: RopeParams,
    ) -> Result<Self, ModelError> {
        let hp = l.hp;
        let n = |s: &str| format!("blk.{il}.{s}");
        let bad = |key: &str, reason: String| ModelError::BadHparam {
            key: format!("{}.{key}", hp.arch),
            reason,
        };
        if l.file.tensor(&n("attn_kv_b.weight")).is_some() {
            return Err(bad(
                "attention.key_length_mla",
                "the file has the unsplit attn_kv_b of older conversions; re-convert it with a current convert_hf_to_gguf.py (which writes attn_k_b and attn_v_b)".into(),
            ));
        }
        let (dk, dv, rope_dim, kv_lora) =
            (hp.head_dim_k_mla, hp.head_dim_v_mla, hp.n_rot, hp.n_lora_kv);
        if dk <= rope_dim || dv == 0 || kv_lora == 0 {
            return Err(bad(
                "attention.key_length_mla",
                format!("MLA needs key_length_mla ({dk}) above rope.dimension_count ({rope_dim}), value_length_mla ({dv}) and kv_lora_rank ({kv_lora}) above 0"),
            ));
        }
        if hp.head_dim != kv_lora + rope_dim || hp.head_dim_v != kv_lora || hp.n_head_kv != 1 {
            return Err(bad(
                "attention.key_length",
                format!(
                    "the absorbed form needs key_length = kv_lora_rank + rope ({}), value_length = kv_lora_rank ({kv_lora}) and one KV head; the file has {}, {} and {}",
                    kv_lora + rope_dim,
                    hp.head_dim,
                    hp.head_dim_v,
                    hp.n_head_kv
                ),
            ));
        }
        let (e, nh) = (hp.n_embd as u64, hp.n_head as u64);
        let (dk64, nope) = (dk as u64, (dk - rope_dim) as u64);
        let q = if hp.n_lora_q > 0 {
            let r = hp.n_lora_q as u64;
            MlaQuery::Lora {
                a: l.req(&n("attn_q_a.weight"), &[e, r])?,
                norm: l.req(&n("attn_q_a_norm.weight"), &[r])?,
                b: l.req(&n("attn_q_b.weight"), &[r, nh * dk64])?,
            }
        } else {
            MlaQuery::Direct(l.req(&n("attn_q.weight"), &[e, nh * dk64])?)
        };
        let kvl = kv_lora as u64;
        let mscale = {
            // llama.cpp pre-scales kq_scale for YaRN: undo the attention
            // factor's correction, then apply mscale_all_dim's.
            let ln = (1.0f32 / rope.freq_scale).ln();
            let org = rope.attn_factor * (1.0 + 0.1 * ln);
            org * (1.0 + 0.1 * hp.yarn_log_mul * ln)
        };
        Ok(Mla {
            q,
            wkv_a_mqa: l.req(&n("attn_kv_a_mqa.weight"), &[e, kvl + rope_dim as u64])?,
            kv_a_norm: l.req(&n("attn_kv_a_norm.weight"), &[kvl])?,
            wk_b: l.req(&n("attn_k_b.weight"), &[nope, kvl, nh])?,
            wv_b: l.req(&n("attn_v_b.weight"), &[kvl, dv as u64, nh])?,
            wo: l.req(&n("attn_output.weight"), &[nh * dv as u64, e])?,
            n_head: hp.n_head,
            nope: dk - rope_dim,
            rope_dim,
            kv_lora,
            v_head: dv,
            rope,
            scale: mscale * mscale / (dk as f32).sqrt(),
        })
    }
}

/// `w [k, n, n_head]` applied per head: `x [t, n_head * k]` -> `[t, n_head * n]`
/// (ggml's batched `mul_mat` over heads, as `mul_mat_id` with head ids).
fn per_head<B: Backend>(
    b: &B,
    w: &B::Weight,
    x: B::Tensor,
    n_head: usize,
    k: usize,
) -> Result<B::Tensor, ModelError> {
    let (t, _) = b.shape(&x);
    let x = b.reshape(x, t * n_head, k)?;
    let heads: Vec<u32> = (0..t).flat_map(|_| 0..n_head as u32).collect();
    let y = b.mul_mat_id(w, &x, &heads, n_head)?;
    let (_, n) = b.shape(&y);
    Ok(b.reshape(y, t, n_head * n)?)
}

pub fn forward<B: Backend>(
    p: &Pass<B>,
    a: &Mla<B::Weight>,
    kvs: &mut [&mut B::Kv],
    h: &B::Tensor,
) -> Result<B::Tensor, ModelError> {
    let b = p.b();
    let eps = p.hp().eps;
    let (nh, nope, rd, kvl) = (a.n_head, a.nope, a.rope_dim, a.kv_lora);
    let q = match &a.q {
        MlaQuery::Direct(w) => b.matmul(w, h)?,
        MlaQuery::Lora { a: wa, norm, b: wb } => {
            let qa = b.matmul(wa, h)?;
            let (_, r) = b.shape(&qa);
            b.matmul(wb, &b.rms_norm(&qa, norm, r, eps)?)?
        }
    };
    let kv = b.matmul(&a.wkv_a_mqa, h)?;
    let mut k_pe = b.split_cols(&kv, kvl + rd, kvl, rd)?;
    b.rope_multi(&mut k_pe, rd, p.seqs, &a.rope)?;
    let kv_c = b.rms_norm(
        &b.split_cols(&kv, kvl + rd, 0, kvl)?,
        &a.kv_a_norm,
        kvl,
        eps,
    )?;
    let q_nope = b.split_cols(&q, nope + rd, 0, nope)?;
    let mut q_pe = b.split_cols(&q, nope + rd, nope, rd)?;
    b.rope_multi(&mut q_pe, rd, p.seqs, &a.rope)?;
    let q_abs = per_head(b, &a.wk_b, q_nope, nh, nope)?;
    let q = b.concat_cols(&q_abs, kvl, &q_pe, rd)?;
    let k = b.concat_cols(&kv_c, kvl, &k_pe, rd)?;
    let params = AttnParams {
        n_head: nh,
        n_head_kv: 1,
        head_dim: kvl + rd,
        head_dim_v: kvl,
        scale: a.scale,
        window: None,
        flash_attn: p.m.flash_attn,
    };
    let attn = b.attention_multi(kvs, &q, &k, &kv_c, None, p.seqs, &params)?;
    let o = per_head(b, &a.wv_b, attn, nh, kvl)?;
    Ok(b.matmul(&a.wo, &o)?)
}
