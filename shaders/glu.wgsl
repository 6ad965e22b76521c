// Gated linear units: SwiGLU `silu(g) * u`, or gpt-oss's clamped variant
// `min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, -limit, limit) + 1)`.

struct Params {
    n: u32,
    alpha: f32,
    limit: f32,
}

@group(0) @binding(0) var<storage, read> g: array<f32>;
@group(0) @binding(1) var<storage, read> u: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + lid;
    if (i >= p.n) {
        return;
    }
#if OAI
    let x = min(g[i], p.limit);
    let v = clamp(u[i], -p.limit, p.limit);
    y[i] = (x / (1.0 + exp(-(p.alpha * x)))) * (v + 1.0);
#else
    let x = g[i];
    y[i] = (x / (1.0 + exp(-x))) * u[i];
#endif
}
