// Quantised mat-vec for decode: y[t, r] = sum_j w[r, j] x[t, j] for up to
// MV_TOK tokens at once (each weight value is dequantised once and dotted
// with every token's row). A workgroup of WG threads owns MV_ROWS output rows;
// its threads split K in units of 4 values (16 with MV_WIDE, below; adjacent
// threads read adjacent bytes), then the MV_ROWS x MV_TOK partial sums are
// reduced with subgroupAdd and one workgroup-memory pass over the subgroups
// (SUBGROUPS), or a workgroup-memory tree. No subgroup size or layout is assumed: each
// subgroup's sum goes to slot `subgroup_id` and `num_subgroups` are added
// (builtins naga provides with subgroups; a browser needs WGSL's
// `subgroup_id` extension for this path, the tree path is plain WGSL).
//
// With MV_WIDE the unit is 16 values (`deq16`: the block's scales decoded
// once per 16 values, the weight bytes read 16 at a time) for the formats
// that define it; K is then a multiple of 16 (their blocks are 32 or 256).
//
// Host constants: WG (a power of two, a multiple of the largest subgroup),
// MV_ROWS, MV_TOK, MV_WIDE, MUL_MAT_ID, and quant.wgsl's type constants.

// Params, X, Y, xrow and yrow: product_io.wgsl.

const NV: u32 = MV_ROWS * MV_TOK;

#if MV_WIDE
const UNIT: u32 = 16u;

fn wload(b: u32, i: u32) -> mat4x4<f32> {
    return deq16(b, i);
}

// The unit's dot product with X's 4 vec4s from `x0` on.
fn wdot(w: mat4x4<f32>, x0: u32) -> f32 {
    return dot(w[0], X[x0]) + dot(w[1], X[x0 + 1u]) + dot(w[2], X[x0 + 2u]) + dot(w[3], X[x0 + 3u]);
}
#else
const UNIT: u32 = 4u;

fn wload(b: u32, i: u32) -> vec4<f32> {
    return deq4(b, i);
}

fn wdot(w: vec4<f32>, x0: u32) -> f32 {
    return dot(w, X[x0]);
}
#endif

var<workgroup> red: array<f32, WG * NV>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) n_sg: u32,
#endif
) {
    let lin = wg.x + wg.y * nwg.x;
#if MUL_MAT_ID
    let item = lin / p.blocks;
    if (item >= p.n_items) {
        return;
    }
    let job = id_job(p.item0 + item, p.expert_stride);
    let rb = lin % p.blocks;
    let wbase = job.wbase;
    let tok0 = job.tok0;
    let ntok = job.ntok;
    let col0 = 0u;
#else
    let rb = lin;
    if (rb >= p.blocks) {
        return;
    }
    let wbase = 0u;
    let tok0 = 0u;
    let ntok = p.ntok;
    let col0 = p.row0;
#endif
    let r0 = rb * MV_ROWS;
    let nu = p.k / 4u;
    let nw = p.k / UNIT;

    var acc: array<f32, NV>;
    for (var v = 0u; v < NV; v++) {
        acc[v] = 0.0;
    }
    for (var r = 0u; r < MV_ROWS; r++) {
        let row = r0 + r;
        if (row < p.rows) {
            let base = wbase + row * p.row_bytes;
            for (var u = tid; u < nw; u += WG) {
                let kk = u * UNIT;
                let w = wload(base + (kk / BLK) * BLK_BYTES, kk % BLK);
                for (var t = 0u; t < MV_TOK; t++) {
                    if (t < ntok) {
                        acc[r * MV_TOK + t] += wdot(w, xrow(tok0 + t) * nu + kk / 4u);
                    }
                }
            }
        }
    }

    var s = 0.0;
#if SUBGROUPS
    for (var v = 0u; v < NV; v++) {
        let sg = subgroupAdd(acc[v]);
        if (sg_lane == 0u) {
            red[sg_id * NV + v] = sg;
        }
    }
    workgroupBarrier();
    if (tid < NV) {
        for (var g = 0u; g < n_sg; g++) {
            s += red[g * NV + tid];
        }
    }
#else
    for (var v = 0u; v < NV; v++) {
        red[v * WG + tid] = acc[v];
    }
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st >>= 1u) {
        if (tid < st) {
            for (var v = 0u; v < NV; v++) {
                red[v * WG + tid] += red[v * WG + tid + st];
            }
        }
        workgroupBarrier();
    }
    if (tid < NV) {
        s = red[tid * WG];
    }
#endif
    if (tid < NV) {
        let r = tid / MV_TOK;
        let t = tid % MV_TOK;
        let row = r0 + r;
        if (row < p.rows && t < ntok) {
            Y[yrow(tok0 + t) * p.n + col0 + row] = s;
        }
    }
}
