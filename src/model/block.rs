//! The shared transformer block: attention (optional biases, QK-norm, sinks,
//! sliding window) followed by a dense or MoE FFN, as llama.cpp's graphs for
//! llama, qwen2moe, qwen3moe and gpt-oss build it.

use std::sync::Arc;

use super::{
    ArchSpec, BatchLogits, DenseFfn, Experts, Ffn, Gating, Hparams, Layer, Logits, Model,
    ModelError, MoeFfn,
};
use crate::backend::{AttnParams, Backend, BatchPos, Glu, RopeParams};
use crate::gguf;

struct Loader<'a, B: Backend> {
    backend: &'a B,
    file: &'a Arc<gguf::Model>,
    how: &'a super::LoadHow,
    /// Read tensors into memory instead of using the mapping (longhaul: no
    /// weight may depend on file pages staying valid; `--no-mmap`), with an
    /// optional progress report against the total bytes to copy.
    copy: Option<(Option<super::Progress>, u64)>,
    copied: std::cell::Cell<u64>,
}

impl<B: Backend> Loader<'_, B> {
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
        let routed = super::is_routed(&t.name);
        if self.how.shapes_only || (routed && self.how.longhaul) {
            return Ok(self.backend.placeholder_weight(t)?);
        }
        if let Some((progress, total)) = &self.copy {
            let mut bytes = vec![0u8; t.len as usize];
            self.file.read_at(t.shard, t.offset, &mut bytes)?;
            crate::longhaul::release_pages(self.file, t.shard, t.offset, t.len);
            self.copied.set(self.copied.get() + t.len);
            if let Some(p) = progress {
                p(self.copied.get(), *total);
            }
            return Ok(self.backend.weight_from_bytes(t, bytes)?);
        }
        Ok(self.backend.load_weight(self.file, t)?)
    }

    fn opt(&self, name: &str, dims: &[u64]) -> Result<Option<B::Weight>, ModelError> {
        self.file
            .tensor(name)
            .map(|t| self.checked(t, dims))
            .transpose()
    }

    fn req(&self, name: &str, dims: &[u64]) -> Result<B::Weight, ModelError> {
        self.checked(self.file.require_tensor(name)?, dims)
    }
}

pub(super) fn load<B: Backend>(
    backend: B,
    file: Arc<gguf::Model>,
    spec: ArchSpec,
    hp: Hparams,
    how: &super::LoadHow,
    copy: Option<(Option<super::Progress>, u64)>,
) -> Result<Model<B>, ModelError> {
    let copying = copy.is_some();
    let l = Loader {
        backend: &backend,
        file: &file,
        how,
        copy,
        copied: Default::default(),
    };
    if copying {
        crate::longhaul::prepare_files(&file);
    }
    let (e, v) = (hp.n_embd as u64, hp.n_vocab as u64);
    let (hd, nh, nkv) = (hp.head_dim as u64, hp.n_head as u64, hp.n_head_kv as u64);
    let tok_embd = l.req("token_embd.weight", &[e, v])?;
    let output_norm = l.req("output_norm.weight", &[e])?;
    let output = match l.opt("output.weight", &[e, v])? {
        Some(w) => w,
        None => l.req("token_embd.weight", &[e, v])?,
    };
    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}");
        let ffn = if hp.n_expert > 0 {
            let (x, ff) = (hp.n_expert as u64, hp.n_ff_exp as u64);
            if ff == 0 {
                return Err(ModelError::BadHparam {
                    key: format!("{}.expert_feed_forward_length", hp.arch),
                    reason: "missing or zero for a MoE model".into(),
                });
            }
            let shared = match l.opt(&n("ffn_up_shexp.weight"), &[e, hp.n_ff_shexp as u64])? {
                Some(up) => Some(DenseFfn {
                    gate: l.req(&n("ffn_gate_shexp.weight"), &[e, hp.n_ff_shexp as u64])?,
                    up,
                    down: l.req(&n("ffn_down_shexp.weight"), &[hp.n_ff_shexp as u64, e])?,
                }),
                None => None,
            };
            Ffn::Moe(MoeFfn {
                router: l.req(&n("ffn_gate_inp.weight"), &[e, x])?,
                router_b: l.opt(&n("ffn_gate_inp.bias"), &[x])?,
                experts: Experts {
                    gate: l.req(&n("ffn_gate_exps.weight"), &[e, ff, x])?,
                    up: l.req(&n("ffn_up_exps.weight"), &[e, ff, x])?,
                    down: l.req(&n("ffn_down_exps.weight"), &[ff, e, x])?,
                    gate_b: l.opt(&n("ffn_gate_exps.bias"), &[ff, x])?,
                    up_b: l.opt(&n("ffn_up_exps.bias"), &[ff, x])?,
                    down_b: l.opt(&n("ffn_down_exps.bias"), &[e, x])?,
                },
                shared_gate: if shared.is_some() {
                    l.opt(&n("ffn_gate_inp_shexp.weight"), &[e])?
                } else {
                    None
                },
                shared,
            })
        } else {
            let ff = hp.n_ff as u64;
            Ffn::Dense(DenseFfn {
                gate: l.req(&n("ffn_gate.weight"), &[e, ff])?,
                up: l.req(&n("ffn_up.weight"), &[e, ff])?,
                down: l.req(&n("ffn_down.weight"), &[ff, e])?,
            })
        };
        layers.push(Layer {
            attn_norm: l.req(&n("attn_norm.weight"), &[e])?,
            wq: l.req(&n("attn_q.weight"), &[e, nh * hd])?,
            wk: l.req(&n("attn_k.weight"), &[e, nkv * hd])?,
            wv: l.req(&n("attn_v.weight"), &[e, nkv * hd])?,
            wo: l.req(&n("attn_output.weight"), &[nh * hd, e])?,
            bq: l.opt(&n("attn_q.bias"), &[nh * hd])?,
            bk: l.opt(&n("attn_k.bias"), &[nkv * hd])?,
            bv: l.opt(&n("attn_v.bias"), &[nkv * hd])?,
            bo: l.opt(&n("attn_output.bias"), &[e])?,
            q_norm: l.opt(&n("attn_q_norm.weight"), &[hd])?,
            k_norm: l.opt(&n("attn_k_norm.weight"), &[hd])?,
            sinks: l.opt(&n("attn_sinks.weight"), &[nh])?,
            ffn_norm: l.req(&n(&format!("{}.weight", spec.ffn_norm)), &[e])?,
            ffn,
            window: hp
                .swa_layers
                .get(il)
                .copied()
                .unwrap_or(false)
                .then_some(hp.n_swa),
        });
    }
    let (ext_factor, attn_factor) = hp.yarn_factors();
    let rope = RopeParams {
        mode: spec.rope,
        n_rot: hp.n_rot,
        freq_base: hp.rope_freq_base,
        freq_scale: hp.rope_freq_scale,
        n_ctx_orig: hp.n_ctx_orig_yarn,
        ext_factor,
        attn_factor,
        beta_fast: hp.yarn_beta_fast,
        beta_slow: hp.yarn_beta_slow,
    };
    let streamed = (0..hp.n_layer).map(|_| None).collect();
    let prefetch_cancel = (0..hp.n_layer).map(|_| Default::default()).collect();
    Ok(Model {
        spec,
        hp,
        backend,
        file,
        tok_embd,
        output_norm,
        output,
        layers,
        rope,
        streamed,
        n_slots: 0,
        prefetch: false,
        prefetch_cancel,
        trace: None,
        flash_attn: false,
    })
}

/// ggml's soft_max over one row: f32 max, f64 sum, scale by 1/sum.
fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// Top-k indices by descending value (ties: lower index first).
fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Routes tokens: expert ids `[t, n_used]` and their weights, following
/// llama.cpp's `build_moe_ffn` gating.
pub(crate) fn route(
    logits: &[f32],
    n_expert: usize,
    n_used: usize,
    gating: Gating,
    norm: bool,
    scale: f32,
) -> (Vec<u32>, Vec<f32>) {
    let mut ids = Vec::with_capacity(logits.len() / n_expert * n_used);
    let mut weights = Vec::with_capacity(ids.capacity());
    for row in logits.chunks(n_expert) {
        let mut probs = row.to_vec();
        if gating == Gating::Softmax {
            softmax(&mut probs);
        }
        let sel = top_k(&probs, n_used);
        let mut w: Vec<f32> = sel.iter().map(|&e| probs[e as usize]).collect();
        if gating == Gating::SoftmaxWeight {
            softmax(&mut w);
        }
        if norm {
            let sum: f32 = w.iter().sum::<f32>().max(6.103_515_6e-5);
            w.iter_mut().for_each(|v| *v /= sum);
        }
        if scale != 0.0 && scale != 1.0 {
            w.iter_mut().for_each(|v| *v *= scale);
        }
        ids.extend(sel);
        weights.extend(w);
    }
    (ids, weights)
}

/// [`Backend::matmul_many`] with its outputs as an array.
fn matmuls<B: Backend, const N: usize>(
    b: &B,
    ws: [&B::Weight; N],
    x: &B::Tensor,
) -> Result<[B::Tensor; N], ModelError> {
    let out = b.matmul_many(&ws, x)?;
    let n = out.len();
    out.try_into().map_err(|_| {
        ModelError::from(crate::backend::BackendError::Shape {
            op: "matmul_many",
            detail: format!("{n} outputs for {N} matrices"),
        })
    })
}

fn dense_ffn<B: Backend>(
    b: &B,
    f: &DenseFfn<B::Weight>,
    x: &B::Tensor,
) -> Result<B::Tensor, ModelError> {
    let [g, u] = matmuls(b, [&f.gate, &f.up], x)?;
    let h = b.glu(&g, &u, Glu::SwiGlu)?;
    Ok(b.matmul(&f.down, &h)?)
}

/// The routed experts' outputs `[t * n_used, n_embd]` (before weighting):
/// row `t * n_used + j` is expert `ids[t, j]` applied to token `t`.
pub(super) fn expert_outputs<B: Backend>(
    b: &B,
    ex: &Experts<B::Weight>,
    x: &B::Tensor,
    ids: &[u32],
    k: usize,
    glu: Glu,
) -> Result<B::Tensor, ModelError> {
    let mut up = b.mul_mat_id(&ex.up, x, ids, k)?;
    if let Some(ub) = &ex.up_b {
        b.add_bias_id(&mut up, ub, ids)?;
    }
    let mut gate = b.mul_mat_id(&ex.gate, x, ids, k)?;
    if let Some(gb) = &ex.gate_b {
        b.add_bias_id(&mut gate, gb, ids)?;
    }
    let h = b.glu(&gate, &up, glu)?;
    let mut down = b.mul_mat_id(&ex.down, &h, ids, k)?;
    if let Some(db) = &ex.down_b {
        b.add_bias_id(&mut down, db, ids)?;
    }
    Ok(down)
}

fn moe_ffn<'s, B: Backend>(
    m: &'s Model<B>,
    il: usize,
    f: &MoeFfn<B::Weight>,
    x: &B::Tensor,
    scope: &rayon::Scope<'s>,
) -> Result<B::Tensor, ModelError> {
    let b = &m.backend;
    let hp = &m.hp;
    let mut logits = b.matmul(&f.router, x)?;
    if let Some(rb) = &f.router_b {
        b.add_bias(&mut logits, rb)?;
    }
    let logits = b.to_host(&logits)?;
    let (ids, weights) = route(
        &logits,
        hp.n_expert,
        hp.n_expert_used,
        m.spec.gating,
        m.spec.norm_topk,
        hp.expert_weights_scale,
    );
    let k = hp.n_expert_used;
    if let Some(t) = &m.trace {
        // A trace is a diagnostic: a failed write must not stop generation.
        let _ = t.record(il, &ids, k);
    }
    let down = match m.streamed.get(il).and_then(Option::as_ref) {
        None => expert_outputs(b, &f.experts, x, &ids, k, m.spec.glu)?,
        Some(layer) => super::stream::expert_outputs(m, il, layer, &f.experts, x, &ids, k, scope)?,
    };
    let mut out = b.weighted_sum(&down, &weights, k)?;
    if let Some(sh) = &f.shared {
        let mut s = dense_ffn(b, sh, x)?;
        if let Some(g) = &f.shared_gate {
            // llama.cpp computes the gate as silu(x) / x, i.e. sigmoid(x).
            let gl = b.to_host(&b.matmul(g, x)?)?;
            let gates: Vec<f32> = gl.iter().map(|&v| (v / (1.0 + (-v).exp())) / v).collect();
            b.scale_rows(&mut s, &gates)?;
        }
        b.add(&mut out, &s)?;
    }
    Ok(out)
}

/// The repeating layers over `x`.
/// The repeating layers over `x`, whose rows are the tokens of `seqs` in
/// order (sequence `i` owns `seqs[i].n_tokens` consecutive rows and its own
/// KV caches `kvs[i]`). Every op runs over all rows at once; rope and
/// attention take each row's sequence into account, so each row is computed
/// exactly as it would be alone.
fn layers<'s, B: Backend>(
    m: &'s Model<B>,
    kvs: &mut [&mut [B::Kv]],
    mut x: B::Tensor,
    seqs: &[BatchPos],
    scope: &rayon::Scope<'s>,
) -> Result<B::Tensor, ModelError> {
    let b = &m.backend;
    let hp = &m.hp;
    for (il, layer) in m.layers.iter().enumerate() {
        let h = b.rms_norm(&x, &layer.attn_norm, hp.n_embd, hp.eps)?;
        let [mut q, mut k, mut v] = matmuls(b, [&layer.wq, &layer.wk, &layer.wv], &h)?;
        for (t, bias) in [
            (&mut q, &layer.bq),
            (&mut k, &layer.bk),
            (&mut v, &layer.bv),
        ] {
            if let Some(bias) = bias {
                b.add_bias(t, bias)?;
            }
        }
        if let Some(qn) = &layer.q_norm {
            q = b.rms_norm(&q, qn, hp.head_dim, hp.eps)?;
        }
        if let Some(kn) = &layer.k_norm {
            k = b.rms_norm(&k, kn, hp.head_dim, hp.eps)?;
        }
        let p = AttnParams {
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            head_dim_v: hp.head_dim,
            scale: 1.0 / (hp.head_dim as f32).sqrt(),
            window: layer.window,
            flash_attn: m.flash_attn,
        };
        b.rope_multi(&mut q, hp.head_dim, seqs, &m.rope)?;
        b.rope_multi(&mut k, hp.head_dim, seqs, &m.rope)?;
        let mut layer_kvs: Vec<&mut B::Kv> = kvs.iter_mut().map(|kv| &mut kv[il]).collect();
        let attn = b.attention_multi(&mut layer_kvs, &q, &k, &v, layer.sinks.as_ref(), seqs, &p)?;
        let mut o = b.matmul(&layer.wo, &attn)?;
        if let Some(bo) = &layer.bo {
            b.add_bias(&mut o, bo)?;
        }
        b.add(&mut x, &o)?;
        let h = b.rms_norm(&x, &layer.ffn_norm, hp.n_embd, hp.eps)?;
        let f = match &layer.ffn {
            Ffn::Dense(d) => dense_ffn(b, d, &h)?,
            Ffn::Moe(moe) => moe_ffn(m, il, moe, &h, scope)?,
        };
        b.add(&mut x, &f)?;
    }
    Ok(x)
}

pub(super) fn forward<B: Backend>(
    m: &Model<B>,
    kv: &mut [B::Kv],
    tokens: &[u32],
    pos0: usize,
    want: Logits,
) -> Result<Vec<f32>, ModelError> {
    Ok(forward_multi(m, &mut [kv], &[(tokens, pos0)], want)?.into_first())
}

/// Runs several sequences in one batch: `seqs[i] = (tokens, pos0)` with KV
/// caches `kvs[i]`. Returns each sequence's logits (last row or all rows).
pub(super) fn forward_multi<B: Backend>(
    m: &Model<B>,
    kvs: &mut [&mut [B::Kv]],
    seqs: &[(&[u32], usize)],
    want: Logits,
) -> Result<BatchLogits, ModelError> {
    let b = &m.backend;
    let hp = &m.hp;
    if kvs.len() != seqs.len() || kvs.iter().any(|kv| kv.len() != m.layers.len()) {
        return Err(ModelError::BadHparam {
            key: "kv".into(),
            reason: format!(
                "{} cache sets for {} sequences of {} layers",
                kvs.len(),
                seqs.len(),
                m.layers.len()
            ),
        });
    }
    let mut tokens = Vec::new();
    let mut spans = Vec::new();
    for &(t, pos0) in seqs.iter().filter(|(t, _)| !t.is_empty()) {
        if let Some(&id) = t.iter().find(|&&id| id as usize >= hp.n_vocab) {
            return Err(ModelError::BadToken {
                id,
                n_vocab: hp.n_vocab,
            });
        }
        tokens.extend_from_slice(t);
        spans.push(BatchPos {
            pos0,
            n_tokens: t.len(),
        });
    }
    if tokens.is_empty() {
        return Ok(BatchLogits {
            data: Vec::new(),
            spans: vec![0..0; seqs.len()],
        });
    }
    // Sequences without tokens take no part in the batch.
    let mut active: Vec<&mut [B::Kv]> = kvs
        .iter_mut()
        .zip(seqs)
        .filter(|(_, (t, _))| !t.is_empty())
        .map(|(kv, _)| &mut **kv)
        .collect();
    let x = b.get_rows(&m.tok_embd, &tokens)?;
    // Longhaul's lookahead reads run on the I/O pool while layers compute.
    let x = crate::longhaul::io_scope(|scope| layers(m, &mut active, x, &spans, scope))?;
    let rows: Vec<usize> = match want {
        Logits::All => (0..tokens.len()).collect(),
        Logits::Last => spans
            .iter()
            .scan(0, |end, s| {
                *end += s.n_tokens;
                Some(*end - 1)
            })
            .collect(),
    };
    let x = if rows.len() == tokens.len() {
        x
    } else {
        b.gather_rows(&x, &rows)?
    };
    let x = b.rms_norm(&x, &m.output_norm, hp.n_embd, hp.eps)?;
    let logits = b.take_host(b.matmul(&m.output, &x)?)?;
    // Each sequence's rows of the one buffer.
    let mut spans = Vec::with_capacity(seqs.len());
    let mut at = 0;
    for (t, _) in seqs {
        let n = match (t.is_empty(), want) {
            (true, _) => 0,
            (false, Logits::Last) => 1,
            (false, Logits::All) => t.len(),
        };
        spans.push(at * hp.n_vocab..(at + n) * hp.n_vocab);
        at += n;
    }
    Ok(BatchLogits {
        data: logits,
        spans,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_routing_normalises_top_k() {
        let logits = [0.1f32, 2.0, -1.0, 1.5];
        let (ids, w) = route(&logits, 4, 2, Gating::Softmax, true, 0.0);
        assert_eq!(ids, vec![1, 3]);
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let e = [2.0f32.exp(), 1.5f32.exp()];
        assert!((w[0] - e[0] / (e[0] + e[1])).abs() < 1e-6);
    }

    #[test]
    fn softmax_weight_routing_softmaxes_chosen_logits() {
        let logits = [3.0f32, 0.0, 1.0, 2.0];
        let (ids, w) = route(&logits, 4, 2, Gating::SoftmaxWeight, false, 0.0);
        assert_eq!(ids, vec![0, 3]);
        let d = 1.0 + (-1.0f32).exp();
        assert!((w[0] - 1.0 / d).abs() < 1e-6);
    }

    #[test]
    fn unnormalised_routing_keeps_probabilities_and_ties_prefer_lower_ids() {
        let logits = [1.0f32, 1.0, 1.0, 1.0];
        let (ids, w) = route(&logits, 4, 2, Gating::Softmax, false, 0.0);
        assert_eq!(ids, vec![0, 1]);
        assert!((w[0] - 0.25).abs() < 1e-6);
    }
}
