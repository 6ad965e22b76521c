//! The ops of recurrent layers on the GPU placement against the CPU
//! placement, on seeded random inputs (the seed is in every failure
//! message), outputs NaN-poisoned before the kernels run, on every device
//! variant of `gpu_util::variants`.
//!
//! Bounds: normalised MSE against the CPU (ggml's test-backend-ops metric)
//! of at most 1e-7, ggml's default for an op, unless exact; and why:
//! - `act`, `mul_act` (SiLU): [`ACT_BOUND`]. One `exp` and one division a
//!   value; WGSL's `exp` is not libm's `expf` (nor ggml's vector
//!   `ggml_v_expf`, which the CPU's SiLU uses on blocks of 16), so values
//!   differ by a few ulp: relative errors of ~1e-6 at most, an NMSE near
//!   1e-13. Edge values (see [`EDGES`]) are also checked one by one.
//! - `mul_vec`: exact. One correctly rounded f32 product a value on both.
//! - `l2_norm`: [`NORM_BOUND`]. The CPU sums squares in f64, the GPU in
//!   f32 (a tree of partial sums): a relative error of the scale near
//!   `log2(group)` ulp, the same as the GPU's `rms_norm` against the CPU.
//! - `ssm_conv`: [`CONV_BOUND`]. The same products summed in the same
//!   order; only a fused multiply-add (which WGSL allows) may round
//!   differently, an ulp a tap.
//! - `gated_delta_net`: [`DELTA_BOUND`]. Per token, dot products of `S`
//!   terms summed in another order (the CPU keeps eight partial sums) and a
//!   different `exp`: ~`sqrt(S)` ulp a step. The inputs are a model's (L2
//!   normalised q and k, beta in (0, 1), decays in (0, 1)), under which the
//!   recurrence is a contraction and errors do not grow along the tokens;
//!   the output and the updated state are both checked.
//!
//! On lavapipe the measured NMSEs are near 1e-15 (act, mul_act, l2_norm),
//! 1e-14 (gated_delta_net, S = 32..128) and 0 (ssm_conv); the bounds leave
//! room for GPUs with a less exact `exp` or fused multiply-adds.
//!
//! A GPU call over 5 then 3 tokens must equal one call over 8 bit for bit:
//! the same kernel does the same arithmetic per token, and the state it
//! keeps between calls is the f32 it would have kept in registers.

mod gpu_util;

use std::sync::Arc;

use gpu_util::{base_seed, nmse, randn, variants};
use longhaul::backend::cpu::{CpuBackend, CpuTensor, CpuWeight};
use longhaul::backend::gpu::{GpuBackend, GpuTensor, GpuWeight};
use longhaul::backend::{Act, Backend, BackendError, BatchPos, DeltaNetParams, KHeadMap};
use longhaul::tensor::GgmlType;

const ACT_BOUND: f64 = 1e-7;
const NORM_BOUND: f64 = 1e-7;
const CONV_BOUND: f64 = 1e-7;
const DELTA_BOUND: f64 = 1e-7;

fn cpu() -> CpuBackend {
    CpuBackend::new()
}

fn pair(g: &GpuBackend, data: &[f32], rows: usize, cols: usize) -> (GpuTensor, CpuTensor) {
    (
        g.from_host(data.to_vec(), rows, cols).unwrap(),
        cpu().from_host(data.to_vec(), rows, cols).unwrap(),
    )
}

fn weights(g: &GpuBackend, data: &[f32], dims: &[u64]) -> (GpuWeight, CpuWeight) {
    let bytes: Vec<u8> = bytemuck::cast_slice(data).to_vec();
    (
        g.upload_weight("w", GgmlType::F32, dims, &bytes).unwrap(),
        CpuWeight::host(GgmlType::F32, dims.to_vec(), Arc::new(bytes)),
    )
}

/// Asserts that the NMSE of `gt` against `ct` is at most `bound`.
fn check(what: &str, g: &GpuBackend, gt: &GpuTensor, ct: &CpuTensor, bound: f64) {
    assert_eq!(g.shape(gt), (ct.rows, ct.cols), "{what}: shape");
    let a = g.to_host(gt).unwrap();
    let e = nmse(&a, &ct.data);
    assert!(e <= bound, "{what}: nmse {e:e} > {bound:e}");
}

fn positions(lens: &[usize]) -> Vec<BatchPos> {
    lens.iter()
        .map(|&n| BatchPos {
            pos0: 0,
            n_tokens: n,
            steps: false,
        })
        .collect()
}

/// Values that test the activations' edges: softplus's threshold, large
/// magnitudes where `exp` would overflow or underflow, zero. Each must come
/// out within 1e-5 of the CPU's value, relatively: Vulkan bounds `exp`'s
/// error by 3 + 2|x| ulp, about 1e-5 at |x| = 60.
const EDGES: [f32; 10] = [
    20.0, 20.000002, 19.999998, 30.0, -30.0, -60.0, -100.0, 100.0, 0.0, -0.0,
];

#[test]
fn activations_match_cpu() {
    let c = cpu();
    let seed = base_seed();
    for (name, g) in variants() {
        // Rows of 70: SiLU's four CPU blocks of 16 and a libm tail of 6.
        let (rows, cols) = (37, 70);
        let mut x = randn(rows * cols, seed, 12.0);
        x[..EDGES.len()].copy_from_slice(&EDGES);
        for act in [Act::Sigmoid, Act::Softplus, Act::Silu] {
            let what = format!("{name} act {act:?} (seed {seed})");
            let (mut gx, mut cx) = pair(&g, &x, rows, cols);
            g.act(&mut gx, act).unwrap();
            c.act(&mut cx, act).unwrap();
            check(&what, &g, &gx, &cx, ACT_BOUND);
            let got = g.to_host(&gx).unwrap();
            for (i, e) in EDGES.iter().enumerate() {
                let (a, b) = (got[i], cx.data[i]);
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1e-30),
                    "{what}: {act:?}({e}) = {a} on the GPU, {b} on the CPU"
                );
            }
        }
        // An empty tensor is a no-op.
        let mut e = g.zeros(0, 8).unwrap();
        g.act(&mut e, Act::Silu).unwrap();

        // SiLU gates per element and per head (6 heads of 12).
        let (rows, n_head, head_dim) = (21, 6, 12);
        let cols = n_head * head_dim;
        let x = randn(rows * cols, seed ^ 1, 3.0);
        for g_cols in [cols, n_head] {
            let mut gate = randn(rows * g_cols, seed ^ 2, 12.0);
            gate[..EDGES.len()].copy_from_slice(&EDGES);
            let (mut gx, mut cx) = pair(&g, &x, rows, cols);
            let (gg, cg) = pair(&g, &gate, rows, g_cols);
            g.mul_act(&mut gx, &gg, Act::Silu).unwrap();
            c.mul_act(&mut cx, &cg, Act::Silu).unwrap();
            let what = format!("{name} mul_act Silu/{g_cols} (seed {seed})");
            check(&what, &g, &gx, &cx, ACT_BOUND);
        }
    }
}

#[test]
fn mul_vec_and_l2_norm_match_cpu() {
    let c = cpu();
    let seed = base_seed();
    for (name, g) in variants() {
        let (rows, cols) = (29, 256);
        let x = randn(rows * cols, seed, 3.0);
        let what = |op: &str| format!("{name} {op} (seed {seed})");

        let (mut gx, mut cx) = pair(&g, &x, rows, cols);
        let (gw, cw) = weights(&g, &randn(cols, seed ^ 3, 2.0), &[cols as u64]);
        g.mul_vec(&mut gx, &gw).unwrap();
        c.mul_vec(&mut cx, &cw).unwrap();
        assert_eq!(g.to_host(&gx).unwrap(), cx.data, "{}", what("mul_vec"));

        // Per head of 32 and 128 (gated DeltaNet's q and k), one row-long
        // group, and an eps that matters (tiny rows).
        let mut small = x.clone();
        small[..32].iter_mut().for_each(|v| *v *= 1e-4);
        for (group, eps) in [(32, 1e-6), (128, 1e-6), (cols, 1e-6), (32, 1e-2)] {
            let (gx, cx) = pair(&g, &small, rows, cols);
            let go = g.l2_norm(&gx, group, eps).unwrap();
            let co = c.l2_norm(&cx, group, eps).unwrap();
            check(
                &what(&format!("l2_norm/{group}/{eps}")),
                &g,
                &go,
                &co,
                NORM_BOUND,
            );
        }
    }
}

/// A convolution's inputs: `x [n, cols]`, taps `[d_conv, cols]` and one
/// carried state per sequence (not zeros: a state from earlier tokens).
struct Conv {
    x: Vec<f32>,
    taps: Vec<f32>,
    states: Vec<Vec<f32>>,
    cols: usize,
    d_conv: usize,
}

impl Conv {
    fn new(lens: &[usize], cols: usize, d_conv: usize, seed: u64) -> Self {
        let n: usize = lens.iter().sum();
        Conv {
            x: randn(n * cols, seed, 2.0),
            taps: randn(d_conv * cols, seed ^ 5, 1.0),
            states: (0..lens.len())
                .map(|i| randn((d_conv - 1) * cols, seed ^ (100 + i as u64), 2.0))
                .collect(),
            cols,
            d_conv,
        }
    }

    fn dims(&self) -> [u64; 2] {
        [self.d_conv as u64, self.cols as u64]
    }
}

/// Runs `ssm_conv` on both backends and checks the output and every state.
fn conv_matches(what: &str, g: &GpuBackend, p: &Conv, lens: &[usize]) {
    let c = cpu();
    let n: usize = lens.iter().sum();
    let seqs = positions(lens);
    let (gx, cx) = pair(g, &p.x, n, p.cols);
    let (gw, cw) = weights(g, &p.taps, &p.dims());
    let d1 = p.d_conv - 1;
    let (mut gs, mut cs): (Vec<GpuTensor>, Vec<CpuTensor>) =
        p.states.iter().map(|s| pair(g, s, d1, p.cols)).unzip();
    let go = g
        .ssm_conv(&gx, &gw, &mut gs.iter_mut().collect::<Vec<_>>(), &seqs)
        .unwrap();
    let co = c
        .ssm_conv(&cx, &cw, &mut cs.iter_mut().collect::<Vec<_>>(), &seqs)
        .unwrap();
    check(&format!("{what} output"), g, &go, &co, CONV_BOUND);
    for (i, (a, b)) in gs.iter().zip(&cs).enumerate() {
        // The state is a copy of inputs: exact.
        assert_eq!(g.to_host(a).unwrap(), b.data, "{what} state {i}");
    }
}

#[test]
fn ssm_conv_matches_cpu() {
    let seed = base_seed();
    for (name, g) in variants() {
        // Sequences of 1, 7 and 20 tokens (and an empty one), kernels of
        // 4 taps (Qwen3-Next, Mamba) and of 2.
        for (lens, d_conv) in [(&[1, 7, 20][..], 4), (&[7, 0, 1][..], 2)] {
            let p = Conv::new(lens, 96, d_conv, seed);
            let what = format!("{name} ssm_conv {lens:?} d_conv {d_conv} (seed {seed})");
            conv_matches(&what, &g, &p, lens);
        }
    }
}

/// A kernel larger than one binding is split by channels; each part's
/// channels are convolved by their own dispatch.
#[test]
fn ssm_conv_with_a_split_kernel_matches_cpu() {
    let seed = base_seed();
    let mut o = gpu_util::options();
    o.max_binding = Some(64 * 1024);
    let g = GpuBackend::open(&o).unwrap();
    // 4160 channels of 4 f32 taps: 66560 bytes, two parts.
    let (cols, lens) = (4160, [1, 2]);
    let p = Conv::new(&lens, cols, 4, seed);
    let (gw, _) = weights(&g, &p.taps, &p.dims());
    assert_eq!(gw.parts.len(), 2, "the kernel should be split");
    conv_matches(&format!("split ssm_conv (seed {seed})"), &g, &p, &lens);
}

/// A delta net layer's inputs as the model makes them: q and k L2
/// normalised per head, v in [-1, 1), log decays in [-1.5, 0), beta a
/// sigmoid; states carried from earlier tokens.
struct Delta {
    p: DeltaNetParams,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    states: Vec<Vec<f32>>,
}

fn l2_heads(mut x: Vec<f32>, s: usize) -> Vec<f32> {
    for h in x.chunks_mut(s) {
        let n = h.iter().map(|v| v * v).sum::<f32>().sqrt();
        h.iter_mut().for_each(|v| *v /= n);
    }
    x
}

impl Delta {
    fn new(p: DeltaNetParams, lens: &[usize], seed: u64) -> Self {
        let n: usize = lens.iter().sum();
        let (hk, hv, s) = (p.n_k_heads, p.n_v_heads, p.head_dim);
        Delta {
            p,
            q: l2_heads(randn(n * hk * s, seed, 1.0), s),
            k: l2_heads(randn(n * hk * s, seed ^ 1, 1.0), s),
            v: randn(n * hv * s, seed ^ 2, 1.0),
            g: randn(n * hv, seed ^ 3, 0.75)
                .iter()
                .map(|u| u - 0.75)
                .collect(),
            beta: randn(n * hv, seed ^ 4, 4.0)
                .iter()
                .map(|u| 1.0 / (1.0 + (-u).exp()))
                .collect(),
            states: (0..lens.len())
                .map(|i| randn(hv * s * s, seed ^ (200 + i as u64), 0.5))
                .collect(),
        }
    }

    /// `[q, k, v, g, beta]`.
    fn inputs(&self) -> [Vec<f32>; 5] {
        [&self.q, &self.k, &self.v, &self.g, &self.beta].map(|x| x.clone())
    }
}

/// One `gated_delta_net` call on backend `b` over inputs `[q, k, v, g,
/// beta]` of `lens` tokens a sequence, states updated in place.
fn delta_call<B: Backend>(
    b: &B,
    p: &DeltaNetParams,
    inputs: &[Vec<f32>; 5],
    states: &mut [B::Tensor],
    lens: &[usize],
) -> B::Tensor {
    let n: usize = lens.iter().sum();
    let (hk, hv, s) = (p.n_k_heads, p.n_v_heads, p.head_dim);
    let widths = [hk * s, hk * s, hv * s, hv, hv];
    let t: Vec<B::Tensor> = inputs
        .iter()
        .zip(widths)
        .map(|(d, w)| b.from_host(d.clone(), n, w).unwrap())
        .collect();
    let mut refs: Vec<&mut B::Tensor> = states.iter_mut().collect();
    b.gated_delta_net(
        &t[0],
        &t[1],
        &t[2],
        &t[3],
        &t[4],
        &mut refs,
        &positions(lens),
        p,
    )
    .unwrap()
}

fn delta_states<B: Backend>(b: &B, d: &Delta) -> Vec<B::Tensor> {
    let (hv, s) = (d.p.n_v_heads, d.p.head_dim);
    d.states
        .iter()
        .map(|st| b.from_host(st.clone(), hv, s * s).unwrap())
        .collect()
}

#[test]
fn gated_delta_net_matches_cpu() {
    let c = cpu();
    let seed = base_seed();
    let lens = [1, 7, 20];
    for (name, g) in variants() {
        // (head size, key heads, value heads): two value heads a key head,
        // so the maps differ, at every size; three and one at 32.
        for (s, hk, hv) in [(32, 2, 4), (32, 2, 6), (32, 3, 3), (64, 2, 4), (128, 2, 4)] {
            for k_map in [KHeadMap::Interleave, KHeadMap::Tile] {
                let p = DeltaNetParams {
                    n_k_heads: hk,
                    n_v_heads: hv,
                    head_dim: s,
                    k_map,
                };
                if (hv * s * s * 4) as u64 > g.caps().max_binding {
                    // A state of 4 heads of 128 x 128 does not fit the
                    // 64 KiB variant's bindings (nor would it be split).
                    continue;
                }
                let d = Delta::new(p, &lens, seed ^ s as u64);
                let inputs = d.inputs();
                let mut gs = delta_states(&g, &d);
                let mut cs = delta_states(&c, &d);
                let go = delta_call(&g, &p, &inputs, &mut gs, &lens);
                let co = delta_call(&c, &p, &inputs, &mut cs, &lens);
                let what =
                    format!("{name} gated_delta_net S {s} {hk}/{hv} heads {k_map:?} (seed {seed})");
                check(&format!("{what} output"), &g, &go, &co, DELTA_BOUND);
                for (i, (a, b)) in gs.iter().zip(&cs).enumerate() {
                    check(&format!("{what} state {i}"), &g, a, b, DELTA_BOUND);
                }
            }
        }
    }
}

/// A prompt of 300 tokens (several dispatches of the delta rule) at the
/// real models' head size: the recurrence carries the two backends'
/// rounding differences along, and the bounds still hold at the end.
#[test]
fn recurrent_ops_over_a_long_prompt_match_cpu() {
    let (c, g) = (cpu(), gpu_util::gpu());
    let seed = base_seed();
    let lens = [300, 2];
    let what = format!("300 tokens (seed {seed})");
    conv_matches(
        &format!("ssm_conv over {what}"),
        &g,
        &Conv::new(&lens, 256, 4, seed),
        &lens,
    );
    let p = DeltaNetParams {
        n_k_heads: 2,
        n_v_heads: 4,
        head_dim: 128,
        k_map: KHeadMap::Tile,
    };
    let d = Delta::new(p, &lens, seed);
    let (mut gs, mut cs) = (delta_states(&g, &d), delta_states(&c, &d));
    let go = delta_call(&g, &p, &d.inputs(), &mut gs, &lens);
    let co = delta_call(&c, &p, &d.inputs(), &mut cs, &lens);
    let what = format!("gated_delta_net over {what}");
    check(&format!("{what} output"), &g, &go, &co, DELTA_BOUND);
    for (i, (a, b)) in gs.iter().zip(&cs).enumerate() {
        check(&format!("{what} state {i}"), &g, a, b, DELTA_BOUND);
    }
}

/// The state a call leaves behind is the state the next call starts from:
/// two sequences over 5 + 3 and 1 + 6 tokens in two calls equal one call
/// over 8 and 7 tokens (bit for bit on the GPU; within the bounds against
/// the CPU), for both stateful ops.
#[test]
fn recurrent_states_carry_across_calls() {
    let c = cpu();
    let seed = base_seed();
    let g = gpu_util::gpu();
    let (first, second) = ([5usize, 1], [3usize, 6]);
    let whole = [8usize, 7];
    // Row ranges of each call in the one-call inputs.
    let split = |x: &[f32], w: usize| -> (Vec<f32>, Vec<f32>) {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut r0 = 0;
        for (&n1, &n2) in first.iter().zip(&second) {
            a.extend_from_slice(&x[r0 * w..(r0 + n1) * w]);
            b.extend_from_slice(&x[(r0 + n1) * w..(r0 + n1 + n2) * w]);
            r0 += n1 + n2;
        }
        (a, b)
    };
    let join = |a: &[f32], b: &[f32], w: usize| -> Vec<f32> {
        let mut out = Vec::new();
        let (mut ra, mut rb) = (0, 0);
        for (&n1, &n2) in first.iter().zip(&second) {
            out.extend_from_slice(&a[ra * w..(ra + n1) * w]);
            out.extend_from_slice(&b[rb * w..(rb + n2) * w]);
            ra += n1;
            rb += n2;
        }
        out
    };

    // ssm_conv.
    let p = Conv::new(&whole, 96, 4, seed);
    let (cols, d1) = (p.cols, p.d_conv - 1);
    let (gw, cw) = weights(&g, &p.taps, &p.dims());
    let states = || -> (Vec<GpuTensor>, Vec<CpuTensor>) {
        p.states.iter().map(|s| pair(&g, s, d1, cols)).unzip()
    };
    let (mut g1, mut c1) = states();
    let (mut g2, _) = states();
    let run_g = |x: &[f32], lens: &[usize], st: &mut Vec<GpuTensor>| {
        let n = lens.iter().sum();
        let x = g.from_host(x.to_vec(), n, cols).unwrap();
        let y = g
            .ssm_conv(
                &x,
                &gw,
                &mut st.iter_mut().collect::<Vec<_>>(),
                &positions(lens),
            )
            .unwrap();
        g.to_host(&y).unwrap()
    };
    let (xa, xb) = split(&p.x, cols);
    let ya = run_g(&xa, &first, &mut g2);
    let yb = run_g(&xb, &second, &mut g2);
    let y1 = run_g(&p.x, &whole, &mut g1);
    let what = format!("ssm_conv in two calls (seed {seed})");
    assert_eq!(join(&ya, &yb, cols), y1, "{what}: output");
    for (a, b) in g1.iter().zip(&g2) {
        assert_eq!(
            g.to_host(a).unwrap(),
            g.to_host(b).unwrap(),
            "{what}: state"
        );
    }
    let cx = c.from_host(p.x.clone(), 15, cols).unwrap();
    let co = c
        .ssm_conv(
            &cx,
            &cw,
            &mut c1.iter_mut().collect::<Vec<_>>(),
            &positions(&whole),
        )
        .unwrap();
    assert!(nmse(&y1, &co.data) <= CONV_BOUND, "{what}: vs the CPU");
    for (a, b) in g2.iter().zip(&c1) {
        assert_eq!(g.to_host(a).unwrap(), b.data, "{what}: state vs the CPU");
    }

    // gated_delta_net, both head maps.
    for k_map in [KHeadMap::Interleave, KHeadMap::Tile] {
        let p = DeltaNetParams {
            n_k_heads: 2,
            n_v_heads: 4,
            head_dim: 32,
            k_map,
        };
        let d = Delta::new(p, &whole, seed);
        let widths = [64, 64, 128, 4, 4];
        let all = d.inputs();
        let parts: Vec<(Vec<f32>, Vec<f32>)> =
            all.iter().zip(widths).map(|(x, w)| split(x, w)).collect();
        let part = |second: bool| -> [Vec<f32>; 5] {
            std::array::from_fn(|i| {
                if second {
                    parts[i].1.clone()
                } else {
                    parts[i].0.clone()
                }
            })
        };
        let run_g = |inputs: &[Vec<f32>; 5], st: &mut [GpuTensor], lens: &[usize]| {
            g.to_host(&delta_call(&g, &p, inputs, st, lens)).unwrap()
        };
        let mut g2 = delta_states(&g, &d);
        let oa = run_g(&part(false), &mut g2, &first);
        let ob = run_g(&part(true), &mut g2, &second);
        let mut g1 = delta_states(&g, &d);
        let o1 = run_g(&all, &mut g1, &whole);
        let what = format!("gated_delta_net {k_map:?} in two calls (seed {seed})");
        assert_eq!(join(&oa, &ob, 128), o1, "{what}: output");
        for (a, b) in g1.iter().zip(&g2) {
            assert_eq!(
                g.to_host(a).unwrap(),
                g.to_host(b).unwrap(),
                "{what}: state"
            );
        }
        let mut cs = delta_states(&c, &d);
        let co = delta_call(&c, &p, &all, &mut cs, &whole);
        check(
            &format!("{what}: vs the CPU"),
            &g,
            &g.from_host(o1, 15, 128).unwrap(),
            &co,
            DELTA_BOUND,
        );
        for (a, b) in g2.iter().zip(&cs) {
            check(&format!("{what}: state vs the CPU"), &g, a, b, DELTA_BOUND);
        }
    }
}

#[test]
fn recurrent_bad_shapes_are_errors_not_panics() {
    let g = gpu_util::gpu();
    let shape_err = |r: Result<(), BackendError>, op: &str, why: &str| {
        assert!(
            matches!(&r, Err(BackendError::Shape { op: o, .. }) if *o == op),
            "{op} ({why}): {r:?}"
        )
    };
    let t = |rows: usize, cols: usize| g.from_host(vec![0.5; rows * cols], rows, cols).unwrap();
    let w = |dims: &[u64]| {
        let n: u64 = dims.iter().product();
        let bytes: Vec<u8> = bytemuck::cast_slice(&vec![0.5f32; n as usize]).to_vec();
        g.upload_weight("w", GgmlType::F32, dims, &bytes).unwrap()
    };

    // mul_vec: a vector of another length; a weight the GPU cannot read as
    // one f32 vector.
    let mut x = t(3, 8);
    shape_err(g.mul_vec(&mut x, &w(&[7])), "mul_vec", "length");
    let f16 = g
        .upload_weight("h", GgmlType::F16, &[8, 2], &[0u8; 32])
        .unwrap();
    let mut x = t(3, 16);
    shape_err(g.mul_vec(&mut x, &f16), "mul_vec", "f16 matrix");

    // l2_norm: a group of 0, or one that does not divide the row.
    shape_err(
        g.l2_norm(&t(2, 12), 0, 1e-6).map(drop),
        "l2_norm",
        "group 0",
    );
    shape_err(
        g.l2_norm(&t(2, 12), 5, 1e-6).map(drop),
        "l2_norm",
        "group 5",
    );

    // ssm_conv.
    let seqs = positions(&[2, 1]);
    let conv = |x: &GpuTensor, k: &GpuWeight, states: &mut [GpuTensor], seqs: &[BatchPos]| {
        g.ssm_conv(x, k, &mut states.iter_mut().collect::<Vec<_>>(), seqs)
            .map(drop)
    };
    let (x, k) = (t(3, 8), w(&[4, 8]));
    let st = || vec![t(3, 8), t(3, 8)];
    assert!(conv(&x, &k, &mut st(), &seqs).is_ok());
    shape_err(
        conv(&x, &w(&[4, 6]), &mut st(), &seqs),
        "ssm_conv",
        "channels",
    );
    shape_err(
        conv(&x, &w(&[1, 8]), &mut st(), &seqs),
        "ssm_conv",
        "one tap",
    );
    shape_err(
        conv(&x, &k, &mut [t(2, 8), t(3, 8)], &seqs),
        "ssm_conv",
        "state rows",
    );
    shape_err(
        conv(&x, &k, &mut [t(3, 8)], &seqs),
        "ssm_conv",
        "one state for two sequences",
    );
    shape_err(
        conv(&x, &k, &mut st(), &positions(&[2, 2])),
        "ssm_conv",
        "token count",
    );
    // A refused call leaves the states alone.
    let mut kept = st();
    let _ = conv(&t(4, 8), &k, &mut kept, &seqs);
    assert_eq!(g.to_host(&kept[0]).unwrap(), vec![0.5; 24]);
    // Taps the GPU does not read: a typed error too.
    let h = g
        .upload_weight("h", GgmlType::F16, &[4, 8], &[0u8; 64])
        .unwrap();
    let e = conv(&x, &h, &mut st(), &seqs).unwrap_err();
    assert!(matches!(e, BackendError::Unsupported { .. }), "{e:?}");

    // gated_delta_net: 2 key heads, 4 value heads of 8.
    let p = DeltaNetParams {
        n_k_heads: 2,
        n_v_heads: 4,
        head_dim: 8,
        k_map: KHeadMap::Tile,
    };
    let seqs = positions(&[2, 1]);
    let delta = |p: &DeltaNetParams,
                 qk: (usize, usize),
                 v: (usize, usize),
                 gb: (usize, usize),
                 states: &mut [GpuTensor],
                 seqs: &[BatchPos]| {
        let (q, k, v, gt, b) = (
            t(qk.0, qk.1),
            t(qk.0, qk.1),
            t(v.0, v.1),
            t(gb.0, gb.1),
            t(gb.0, gb.1),
        );
        g.gated_delta_net(
            &q,
            &k,
            &v,
            &gt,
            &b,
            &mut states.iter_mut().collect::<Vec<_>>(),
            seqs,
            p,
        )
        .map(drop)
    };
    let st = || vec![t(4, 64), t(4, 64)];
    assert!(delta(&p, (3, 16), (3, 32), (3, 4), &mut st(), &seqs).is_ok());
    let op = "gated_delta_net";
    let bad = DeltaNetParams { n_v_heads: 3, ..p };
    shape_err(
        delta(&bad, (3, 16), (3, 24), (3, 3), &mut st(), &seqs),
        op,
        "3 value heads for 2 key heads",
    );
    let bad = DeltaNetParams { head_dim: 0, ..p };
    shape_err(
        delta(&bad, (3, 0), (3, 0), (3, 4), &mut st(), &seqs),
        op,
        "head size 0",
    );
    shape_err(
        delta(&p, (3, 16), (3, 16), (3, 4), &mut st(), &seqs),
        op,
        "v columns",
    );
    shape_err(
        delta(&p, (3, 16), (3, 32), (3, 2), &mut st(), &seqs),
        op,
        "g columns",
    );
    shape_err(
        delta(&p, (3, 16), (2, 32), (3, 4), &mut st(), &seqs),
        op,
        "v rows",
    );
    shape_err(
        delta(
            &p,
            (3, 16),
            (3, 32),
            (3, 4),
            &mut [t(4, 64), t(4, 32)],
            &seqs,
        ),
        op,
        "state size",
    );
    shape_err(
        delta(&p, (3, 16), (3, 32), (3, 4), &mut [t(4, 64)], &seqs),
        op,
        "state count",
    );
    shape_err(
        delta(&p, (3, 16), (3, 32), (3, 4), &mut st(), &positions(&[1, 1])),
        op,
        "token count",
    );
    // Heads larger than the kernel's workgroup: the GPU's own shape error.
    let big = DeltaNetParams {
        n_k_heads: 1,
        n_v_heads: 1,
        head_dim: 512,
        k_map: KHeadMap::Tile,
    };
    let r = delta(
        &big,
        (1, 512),
        (1, 512),
        (1, 1),
        &mut [t(1, 512 * 512)],
        &positions(&[1]),
    );
    shape_err(r, op, "heads of 512");
}
