// Column ranges of every group: for each (row, group) `rg` of `n` and each
// `c < len`, dst[rg * dst_w + dst_off + c] = src[rg * src_w + src_off + c]
// (split_cols reads a range of each source group; concat_cols writes each
// input at its offset of the destination groups).

struct Params {
    n: u32,
    len: u32,
    src_w: u32,
    src_off: u32,
    dst_w: u32,
    dst_off: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + lid;
    if (i >= p.n * p.len) {
        return;
    }
    let rg = i / p.len;
    let c = i % p.len;
    dst[rg * p.dst_w + p.dst_off + c] = src[rg * p.src_w + p.src_off + c];
}
