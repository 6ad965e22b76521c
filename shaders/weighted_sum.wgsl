// Sums groups of n_used rows weighted per row: y[t] = sum_j w[t*n+j] * x[t*n+j],
// in order j = 0..n_used (as the CPU placement).

struct Params {
    n_tok: u32,
    cols: u32,
    n_used: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + lid;
    if (i >= p.n_tok * p.cols) {
        return;
    }
    let t = i / p.cols;
    let c = i % p.cols;
    var acc = 0.0;
    for (var j = 0u; j < p.n_used; j++) {
        let r = t * p.n_used + j;
        acc += x[r * p.cols + c] * w[r];
    }
    y[i] = acc;
}
