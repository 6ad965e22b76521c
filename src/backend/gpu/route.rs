//! MoE routing on the device (`shaders/route.wgsl`): the router's logits
//! become expert ids and weights without leaving the GPU, for the ops that
//! take a route ([`super::matmul::mul_mat_id_routed`], [`weighted_sum`]).

use super::ops::simple;
use super::{Arg, GpuBackend, GpuTensor, GpuWeight};
use crate::backend::routing::{Routing, Scoring};
use crate::backend::{BackendError, DeviceRoute};

const ROUTE: &str = include_str!("../../../shaders/route.wgsl");

/// Most expert groups route.wgsl ranks (its `MAX_GROUPS`).
const MAX_GROUPS: usize = 64;

fn shape(detail: String) -> BackendError {
    BackendError::Shape {
        op: "route_on_device",
        detail,
    }
}

/// Routes `logits [t, n_expert]` as the CPU's router does; `None` for a
/// routing the kernel does not take (more than [`MAX_GROUPS`] groups, or
/// groups that do not divide the experts), which the host then routes.
pub(super) fn route(
    b: &GpuBackend,
    logits: &GpuTensor,
    r: &Routing,
    select_bias: Option<&[f32]>,
) -> Result<Option<DeviceRoute<GpuTensor>>, BackendError> {
    let (n_tok, n) = (logits.rows, logits.cols);
    if n != r.n_expert || r.n_used == 0 || r.n_used > n {
        return Err(shape(format!(
            "logits of {n} experts for a router of {} choosing {}",
            r.n_expert, r.n_used
        )));
    }
    if let Some(bias) = select_bias.filter(|s| s.len() != n) {
        return Err(shape(format!(
            "selection bias of {} for {n} experts",
            bias.len()
        )));
    }
    let grouped = r.n_group > 1;
    if grouped && (r.n_group > MAX_GROUPS || n % r.n_group != 0 || r.n_group_used == 0) {
        return Ok(None);
    }
    let ctx = b.ctx();
    let probs = b.tensor(n_tok, n)?;
    let sel = b.tensor(n_tok, n)?;
    let ids = b.tensor(n_tok, r.n_used)?;
    let weights = b.tensor(n_tok, r.n_used)?;
    let bias = ctx.upload_temp(
        bytemuck::cast_slice(select_bias.unwrap_or(&[0.0])),
        "selection bias",
    )?;
    let scoring = match r.scoring {
        Scoring::Softmax => 0,
        Scoring::SoftmaxWeight => 1,
        Scoring::Sigmoid => 2,
    };
    let pipe = simple(b, "route", ROUTE, &[], 0)?;
    let params = [
        n_tok as u32,
        n as u32,
        r.n_used as u32,
        scoring,
        u32::from(r.norm),
        r.scale.to_bits(),
        if grouped { r.n_group as u32 } else { 1 },
        r.n_group_used as u32,
        u32::from(select_bias.is_some()),
    ];
    ctx.dispatch(
        &pipe,
        &[
            Arg::Buf(&logits.buf),
            Arg::Buf(&bias),
            Arg::Buf(&probs.buf),
            Arg::Buf(&sel.buf),
            Arg::Buf(&ids.buf),
            Arg::Buf(&weights.buf),
        ],
        &params,
        ctx.grid(n_tok.div_ceil(64) as u32),
    );
    Ok(Some(DeviceRoute {
        ids,
        weights,
        n_tok,
        n_used: r.n_used,
    }))
}

/// The route's expert ids on the host: one read-back of `t * n_used` ids.
pub(super) fn ids(b: &GpuBackend, r: &DeviceRoute<GpuTensor>) -> Result<Vec<u32>, BackendError> {
    let n = r.n_tok * r.n_used;
    let bytes = b.ctx().read(&r.ids.buf, 0, (n * 4) as u64)?;
    Ok(bytemuck::pod_collect_to_vec(&bytes))
}

/// The weighted sum of the expert outputs with the route's weights.
pub(super) fn weighted_sum(
    b: &GpuBackend,
    x: &GpuTensor,
    r: &DeviceRoute<GpuTensor>,
) -> Result<GpuTensor, BackendError> {
    let n_tok = crate::backend::contract::weighted_sum(x.rows, r.n_tok * r.n_used, r.n_used)?;
    super::ops::weighted_sum_rows(b, x, &r.weights.buf, n_tok, r.n_used)
}

/// [`super::ops::add_bias`]'s per-expert rows with the route's ids: row `r`
/// of `x` (pair `r`) gets bias row `ids[r]`.
pub(super) fn add_bias(
    b: &GpuBackend,
    x: &mut GpuTensor,
    w: &GpuWeight,
    r: &DeviceRoute<GpuTensor>,
) -> Result<(), BackendError> {
    const OP: &str = "add_bias_id_routed";
    let pairs = r.n_tok * r.n_used;
    if x.rows != pairs || x.cols != w.ne[0] {
        return Err(BackendError::Shape {
            op: OP,
            detail: format!(
                "x [{}, {}] for {pairs} pairs and a bias of {:?}",
                x.rows, x.cols, w.ne
            ),
        });
    }
    let bias = super::ops::bias_buffer(OP, w)?;
    super::ops::add_bias_rows(b, x, bias, &r.ids.buf)
}
