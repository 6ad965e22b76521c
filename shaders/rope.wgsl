// Rotary embedding in place. The (cos, sin) of every (token, pair) comes
// from the host, computed exactly as the CPU placement does (f32 theta
// products and YaRN ramps); large angles would lose precision in WGSL's
// cos/sin, and the table is small (tokens x n_rot/2).

struct Params {
    cols: u32,
    head_dim: u32,
    half_rot: u32,
    neox: u32,
    n_tokens: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = (wg.x + wg.y * nwg.x) * 256u + lid;
    let heads = p.cols / p.head_dim;
    let per_tok = heads * p.half_rot;
    if (idx >= per_tok * p.n_tokens) {
        return;
    }
    let t = idx / per_tok;
    let r = idx % per_tok;
    let h = r / p.half_rot;
    let i = r % p.half_rot;
    var a = 2u * i;
    var b = 2u * i + 1u;
    if (p.neox != 0u) {
        a = i;
        b = i + p.half_rot;
    }
    let base = t * p.cols + h * p.head_dim;
    let c = cs[t * p.half_rot + i];
    let x0 = x[base + a];
    let x1 = x[base + b];
    x[base + a] = fma(x0, c.x, -(x1 * c.y));
    x[base + b] = fma(x0, c.y, x1 * c.x);
}
