// x[i] *= activation(g[i / per]) (activation.wgsl): a gate per element
// (per = 1) or per group of `per` columns (one per head).

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
    x[i] = x[i] * activation(g[i / p.per]);
}
