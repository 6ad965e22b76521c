// Quantised mat-vec for decode: y[t, r] = sum_j w[r, j] x[t, j] for up to
// MV_TOK tokens at once (each weight value is dequantised once and dotted
// with every token's row). A workgroup of WG threads owns MV_ROWS output rows;
// its threads split K in units of 4 values (adjacent threads read adjacent
// bytes), then the MV_ROWS x MV_TOK partial sums are reduced with subgroupAdd
// and one workgroup-memory pass over the subgroups (SUBGROUPS), or a
// workgroup-memory tree. No subgroup size or layout is assumed: each
// subgroup's sum goes to slot `subgroup_id` and `num_subgroups` are added
// (builtins naga provides with subgroups; a browser needs WGSL's
// `subgroup_id` extension for this path, the tree path is plain WGSL).
//
// Host constants: WG (a power of two, a multiple of the largest subgroup),
// MV_ROWS, MV_TOK, MUL_MAT_ID, and quant.wgsl's type constants.

// Params, X, Y, xrow and yrow: product_io.wgsl.

const NV: u32 = MV_ROWS * MV_TOK;

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

    var acc: array<f32, NV>;
    for (var v = 0u; v < NV; v++) {
        acc[v] = 0.0;
    }
    for (var r = 0u; r < MV_ROWS; r++) {
        let row = r0 + r;
        if (row < p.rows) {
            let base = wbase + row * p.row_bytes;
            for (var u = tid; u < nu; u += WG) {
                let kk = u * 4u;
                let w = deq4(base + (kk / BLK) * BLK_BYTES, kk % BLK);
                for (var t = 0u; t < MV_TOK; t++) {
                    if (t < ntok) {
                        acc[r * MV_TOK + t] += dot(w, X[xrow(tok0 + t) * nu + u]);
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
