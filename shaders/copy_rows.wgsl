// dst[dst_row[i]] = src[src_row[i]] for each i (gather and scatter of rows).

struct Params {
    n: u32,
    cols: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> map: array<vec2<u32>>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + lid;
    if (i >= p.n * p.cols) {
        return;
    }
    let m = map[i / p.cols];
    let c = i % p.cols;
    dst[m.y * p.cols + c] = src[m.x * p.cols + c];
}
