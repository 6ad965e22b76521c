//! Feed-forward blocks: a dense SwiGLU FFN, and a MoE FFN of a router,
//! routed experts (resident or streamed by longhaul) and optional shared
//! experts. The routed-expert tensor names live here and nowhere else.

use super::attention::Want;
use super::router::{Router, Routing};
use super::{matmuls, Loader, Pass};
use crate::backend::{Backend, DeviceRoute, Glu};
use crate::model::ModelError;

/// The routed-expert tensors of a MoE layer (`blk.N.<name>`), in the order
/// of a longhaul slot store: the three matrices, then the per-expert biases.
pub const ROUTED: [&str; 6] = [
    "ffn_gate_exps.weight",
    "ffn_up_exps.weight",
    "ffn_down_exps.weight",
    "ffn_gate_exps.bias",
    "ffn_up_exps.bias",
    "ffn_down_exps.bias",
];

/// The fused gate+up form some converters write: routed too (counted as
/// such), though no architecture loads it yet.
pub const ROUTED_FUSED: &str = "ffn_gate_up_exps.weight";

/// True for routed-expert tensors (`*_exps.*`), which longhaul streams.
pub fn is_routed(name: &str) -> bool {
    name.contains("_exps.")
}

/// The names of the routed-expert tensors of layer `il`.
pub fn routed_names(il: usize) -> impl Iterator<Item = String> {
    ROUTED
        .into_iter()
        .chain([ROUTED_FUSED])
        .map(move |s| format!("blk.{il}.{s}"))
}

/// The routed experts of one MoE layer (stacked `[k, n, n_expert]` tensors)
/// with their optional per-expert biases.
pub struct Experts<W> {
    pub gate: W,
    pub up: W,
    pub down: W,
    pub gate_b: Option<W>,
    pub up_b: Option<W>,
    pub down_b: Option<W>,
}

/// A dense SwiGLU FFN (dense layers, shared experts).
pub struct DenseFfn<W> {
    pub gate: W,
    pub up: W,
    pub down: W,
}

/// A MoE FFN: router, routed experts and optional shared experts, which a
/// sigmoid gate may scale (Qwen2-MoE).
pub struct MoeFfn<W> {
    pub router: Router<W>,
    pub experts: Experts<W>,
    pub glu: Glu,
    pub shared: Option<DenseFfn<W>>,
    pub shared_gate: Option<W>,
}

pub enum Ffn<W> {
    Dense(DenseFfn<W>),
    Moe(MoeFfn<W>),
}

/// The MoE tensors an architecture has.
#[derive(Clone, Copy, Debug)]
pub struct MoeDecl {
    pub routing: Routing,
    pub glu: Glu,
    /// The router's logit bias (`ffn_gate_inp.bias`).
    pub router_bias: Want,
    /// The selection bias (`exp_probs_b.bias`).
    pub select_bias: Want,
    /// Per-expert biases (`ffn_*_exps.bias`).
    pub expert_bias: Want,
    /// Shared experts (`ffn_*_shexp`) of this total width.
    pub shared: Want,
    pub n_ff_shared: usize,
    /// The shared experts' sigmoid gate (`ffn_gate_inp_shexp`).
    pub shared_gate: Want,
}

impl MoeDecl {
    /// Routed SwiGLU experts under `routing`, with no biases and no shared
    /// experts.
    pub fn routed(routing: Routing) -> Self {
        MoeDecl {
            routing,
            glu: Glu::SwiGlu,
            router_bias: Want::No,
            select_bias: Want::No,
            expert_bias: Want::No,
            shared: Want::No,
            n_ff_shared: 0,
            shared_gate: Want::No,
        }
    }
}

impl<W> DenseFfn<W> {
    /// `blk.{il}.ffn_{gate,up,down}{suffix}.weight` of width `ff`.
    pub fn load<B: Backend<Weight = W>>(
        l: &Loader<B>,
        il: usize,
        suffix: &str,
        ff: usize,
    ) -> Result<Self, ModelError> {
        let (e, ff) = (l.hp.n_embd as u64, ff as u64);
        let n = |s: &str| format!("blk.{il}.ffn_{s}{suffix}.weight");
        Ok(DenseFfn {
            gate: l.req(&n("gate"), &[e, ff])?,
            up: l.req(&n("up"), &[e, ff])?,
            down: l.req(&n("down"), &[ff, e])?,
        })
    }

    /// Like [`DenseFfn::load`], `None` when the file has no `up` tensor.
    fn load_opt<B: Backend<Weight = W>>(
        l: &Loader<B>,
        il: usize,
        suffix: &str,
        ff: usize,
    ) -> Result<Option<Self>, ModelError> {
        let up = format!("blk.{il}.ffn_up{suffix}.weight");
        if l.file.tensor(&up).is_none() {
            return Ok(None);
        }
        Self::load(l, il, suffix, ff).map(Some)
    }
}

impl<W> MoeFfn<W> {
    /// Layer `il`'s MoE FFN as `d` declares it.
    pub fn load<B: Backend<Weight = W>>(
        l: &Loader<B>,
        il: usize,
        d: MoeDecl,
    ) -> Result<Self, ModelError> {
        let hp = l.hp;
        let (e, x, ff) = (hp.n_embd as u64, hp.n_expert as u64, hp.n_ff_exp as u64);
        if ff == 0 {
            return Err(ModelError::BadHparam {
                key: format!("{}.expert_feed_forward_length", hp.arch),
                reason: "missing or zero for a MoE model".into(),
            });
        }
        let n = |s: &str| format!("blk.{il}.{s}");
        let shared = match d.shared {
            Want::No => None,
            Want::Opt => DenseFfn::load_opt(l, il, "_shexp", d.n_ff_shared)?,
            Want::Req => Some(DenseFfn::load(l, il, "_shexp", d.n_ff_shared)?),
        };
        let shared_gate = match shared {
            Some(_) => d
                .shared_gate
                .load(l, &n("ffn_gate_inp_shexp.weight"), &[e])?,
            None => None,
        };
        let select_bias = match d.select_bias {
            Want::No => None,
            Want::Opt => l.opt_host(&n("exp_probs_b.bias"), x)?,
            Want::Req => {
                l.file.require_tensor(&n("exp_probs_b.bias"))?;
                l.opt_host(&n("exp_probs_b.bias"), x)?
            }
        };
        let eb = d.expert_bias;
        Ok(MoeFfn {
            router: Router {
                w: l.req(&n("ffn_gate_inp.weight"), &[e, x])?,
                bias: d.router_bias.load(l, &n("ffn_gate_inp.bias"), &[x])?,
                select_bias,
                routing: d.routing,
            },
            experts: Experts {
                gate: l.req(&n(ROUTED[0]), &[e, ff, x])?,
                up: l.req(&n(ROUTED[1]), &[e, ff, x])?,
                down: l.req(&n(ROUTED[2]), &[ff, e, x])?,
                gate_b: eb.load(l, &n(ROUTED[3]), &[ff, x])?,
                up_b: eb.load(l, &n(ROUTED[4]), &[ff, x])?,
                down_b: eb.load(l, &n(ROUTED[5]), &[e, x])?,
            },
            glu: d.glu,
            shared,
            shared_gate,
        })
    }
}

impl<W> Ffn<W> {
    /// A dense FFN for the leading `leading_dense_block_count` layers, the
    /// MoE FFN `d` declares after them.
    pub fn dense_lead_then_moe<B: Backend<Weight = W>>(
        l: &Loader<B>,
        il: usize,
        d: MoeDecl,
    ) -> Result<Self, ModelError> {
        if il < l.hp.n_layer_dense_lead {
            Ok(Ffn::Dense(DenseFfn::load(l, il, "", l.hp.n_ff)?))
        } else {
            Ok(Ffn::Moe(MoeFfn::load(l, il, d)?))
        }
    }
}

/// The FFN block over the normed input `h` of layer `il`; `resid` is the
/// residual stream `h` was normed from (longhaul's lookahead guesses the
/// next MoE layer's experts from it).
pub fn forward<'s, B: Backend>(
    p: &Pass<'_, 's, B>,
    il: usize,
    f: &'s Ffn<B::Weight>,
    h: &B::Tensor,
    resid: &B::Tensor,
) -> Result<B::Tensor, ModelError> {
    match f {
        Ffn::Dense(d) => dense(p.b(), d, h),
        Ffn::Moe(moe) => moe_ffn(p, il, moe, h, resid),
    }
}

fn dense<B: Backend>(
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
pub(crate) fn expert_outputs<B: Backend>(
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

/// [`expert_outputs`] with the ids of a device route, which stay there.
fn routed_outputs<B: Backend>(
    b: &B,
    ex: &Experts<B::Weight>,
    x: &B::Tensor,
    r: &DeviceRoute<B::Tensor>,
    glu: Glu,
) -> Result<B::Tensor, ModelError> {
    let [mut up, mut gate] = super::outputs(
        "mul_mat_id_routed_many",
        b.mul_mat_id_routed_many(&[&ex.up, &ex.gate], x, r)?,
    )?;
    if let Some(ub) = &ex.up_b {
        b.add_bias_id_routed(&mut up, ub, r)?;
    }
    if let Some(gb) = &ex.gate_b {
        b.add_bias_id_routed(&mut gate, gb, r)?;
    }
    let h = b.glu(&gate, &up, glu)?;
    let mut down = b.mul_mat_id_routed(&ex.down, &h, r)?;
    if let Some(db) = &ex.down_b {
        b.add_bias_id_routed(&mut down, db, r)?;
    }
    Ok(down)
}

/// Most tokens a MoE layer routes on the device (decode steps,
/// verification batches); a prompt's ubatch is routed on the host, which
/// groups its pairs by expert for the tiled kernels.
pub const DEVICE_ROUTE_MAX_TOK: usize = 8;

fn moe_ffn<'s, B: Backend>(
    p: &Pass<'_, 's, B>,
    il: usize,
    f: &'s MoeFfn<B::Weight>,
    x: &B::Tensor,
    resid: &B::Tensor,
) -> Result<B::Tensor, ModelError> {
    let b = p.b();
    let k = f.router.routing.n_used;
    let logits = f.router.logits_on(b, x)?;
    // A routing trace needs every layer's ids on the host.
    let route = if b.shape(x).0 <= DEVICE_ROUTE_MAX_TOK && !p.m.runtime.traced() {
        f.router.route_on(b, &logits)?
    } else {
        None
    };
    let streamed = p.m.runtime.streamed(il);
    let ex = &f.experts;
    let mut out = match (route, streamed) {
        // Resident: nothing leaves the device.
        (Some(r), None) => {
            let down = routed_outputs(b, ex, x, &r, f.glu)?;
            b.weighted_sum_routed(&down, &r)?
        }
        // Longhaul: the chosen ids read back (mapped to slots on the
        // host), the weights stay.
        (Some(r), Some(layer)) => {
            let ids = b.route_ids(&r)?;
            let down = crate::model::stream::expert_outputs(p, il, layer, f, x, resid, &ids)?;
            b.weighted_sum_routed(&down, &r)?
        }
        (None, streamed) => {
            let logits = b.to_host(&logits)?;
            let (ids, weights) = f.router.route(&logits);
            p.m.runtime.record(il, &ids, k);
            let down = match streamed {
                None => expert_outputs(b, ex, x, &ids, k, f.glu)?,
                Some(layer) => {
                    crate::model::stream::expert_outputs(p, il, layer, f, x, resid, &ids)?
                }
            };
            b.weighted_sum(&down, &weights, k)?
        }
    };
    if let Some(sh) = &f.shared {
        let mut s = dense(b, sh, x)?;
        if let Some(g) = &f.shared_gate {
            // llama.cpp computes the gate as silu(x) / x, i.e. sigmoid(x).
            b.scale_rows_gated(&mut s, &b.matmul(g, x)?)?;
        }
        b.add(&mut out, &s)?;
    }
    Ok(out)
}
