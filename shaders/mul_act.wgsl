// x[i] *= act(g[i / per]): a gate per element (per = 1) or per group of
// `per` columns (one per head), with ggml's formulas: sigmoid
// 1 / (1 + exp(-v)), or (SOFTPLUS) softplus v > 20 ? v : log(1 + exp(v)).

struct Params {
    n: u32,
    per: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + lid;
    if (i >= p.n) {
        return;
    }
    let v = g[i / p.per];
#if SOFTPLUS
    let a = select(log(1.0 + exp(v)), v, v > 20.0);
#else
    let a = 1.0 / (1.0 + exp(-v));
#endif
    x[i] = x[i] * a;
}
