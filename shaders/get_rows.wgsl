// get_rows: rows of a 2-D weight dequantised to f32 (embedding lookups).
// One thread per 4 output values; the host lists, per weight part, the
// (output row, row within the part) pairs that part serves.

struct Params {
    nu: u32,
    row_bytes: u32,
    pair0: u32,
    n_pairs: u32,
}

@group(0) @binding(1) var<storage, read> PAIRS: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let g = (wg.x + wg.y * nwg.x) * WG + tid;
    let pair = g / p.nu;
    if (pair >= p.n_pairs) {
        return;
    }
    let u = g % p.nu;
    let pr = PAIRS[p.pair0 + pair];
    let kk = u * 4u;
    Y[pr.x * p.nu + u] = deq4(pr.y * p.row_bytes + (kk / BLK) * BLK_BYTES, kk % BLK);
}
