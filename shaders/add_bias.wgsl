// Bias rows added to activation rows: row r of x gets bias row ids[r]
// (ggml's add_id, per-expert biases) or, without IDS, the single bias row.

struct Params {
    rows: u32,
    cols: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
#if IDS
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;
#else
@group(0) @binding(2) var<uniform> p: Params;
#endif

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + lid;
    if (i >= p.rows * p.cols) {
        return;
    }
    let c = i % p.cols;
#if IDS
    let br = ids[i / p.cols];
#else
    let br = 0u;
#endif
    x[i] = x[i] + b[br * p.cols + c];
}
