// x[r, c] *= s[r]; with GATE, by llama.cpp's shared-expert gate of the
// logit s[r], silu(s) / s.

struct Params {
    rows: u32,
    cols: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> s: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + lid;
    if (i < p.rows * p.cols) {
#if GATE
        let g = s[i / p.cols];
        x[i] = x[i] * ((g / (1.0 + exp(-g))) / g);
#else
        x[i] = x[i] * s[i / p.cols];
#endif
    }
}
