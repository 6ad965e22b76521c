// Quantised tiled mat-mul for prompts: y[t, r] = sum_j w[r, j] x[t, j].
// A workgroup computes a BM (weight rows) x BN (tokens) output tile: per
// step of BK values of K it dequantises the BM x BK weight tile and loads the
// BN x BK activation tile into workgroup memory (f16 with TILE_F16, else f32),
// then every thread accumulates TM x TN outputs in f32. Ragged edges (rows of
// the part, tokens, K) are zero-filled in the tiles and skipped on write.
// With MUL_MAT_ID a workgroup's tokens are one work item's pairs of one expert.
//
// Host constants: BM, BN, TM, TN (WG = BM / TM * BN / TN threads),
// MUL_MAT_ID, and quant.wgsl's type constants.

// Params, X, Y, xrow and yrow: product_io.wgsl.

#if TILE_F16
alias TT = f16;
#else
alias TT = f32;
#endif

const BK: u32 = 32u;
const WG: u32 = (BM / TM) * (BN / TN);
// Threads along the tile's rows; a thread owns rows tx + i * RX, tokens ty + j * RY.
const RX: u32 = BM / TM;
const RY: u32 = BN / TN;

var<workgroup> ws: array<TT, BK * BM>;
var<workgroup> xs: array<TT, BK * BN>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let lin = wg.x + wg.y * nwg.x;
    let rt = lin % p.blocks;
#if MUL_MAT_ID
    let item = lin / p.blocks;
    if (item >= p.n_items) {
        return;
    }
    let job = id_job(p.item0 + item, p.expert_stride);
    let wbase = job.wbase;
    let tok0 = job.tok0;
    let ntok = job.ntok;
    let col0 = 0u;
#else
    let tt = lin / p.blocks;
    if (tt >= p.tok_tiles) {
        return;
    }
    let wbase = 0u;
    let tok0 = tt * BN;
    let ntok = min(BN, p.ntok - tok0);
    let col0 = p.row0;
#endif
    let m0 = rt * BM;
    let nu = p.k / 4u;
    let tx = tid % RX;
    let ty = tid / RX;

    var acc: array<f32, TM * TN>;
    for (var v = 0u; v < TM * TN; v++) {
        acc[v] = 0.0;
    }
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        for (var q = tid; q < BM * (BK / 4u); q += WG) {
            let r = q / (BK / 4u);
            let c = (q % (BK / 4u)) * 4u;
            let kk = k0 + c;
            var v = vec4<f32>(0.0);
            if (m0 + r < p.rows && kk < p.k) {
                v = deq4(wbase + (m0 + r) * p.row_bytes + (kk / BLK) * BLK_BYTES, kk % BLK);
            }
            let o = c * BM + r;
            ws[o] = TT(v.x);
            ws[o + BM] = TT(v.y);
            ws[o + 2u * BM] = TT(v.z);
            ws[o + 3u * BM] = TT(v.w);
        }
        for (var q = tid; q < BN * (BK / 4u); q += WG) {
            let t = q / (BK / 4u);
            let c = (q % (BK / 4u)) * 4u;
            let kk = k0 + c;
            var v = vec4<f32>(0.0);
            if (t < ntok && kk < p.k) {
                v = X[xrow(tok0 + t) * nu + kk / 4u];
            }
            let o = c * BN + t;
            xs[o] = TT(v.x);
            xs[o + BN] = TT(v.y);
            xs[o + 2u * BN] = TT(v.z);
            xs[o + 3u * BN] = TT(v.w);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            var a: array<f32, TM>;
            for (var i = 0u; i < TM; i++) {
                a[i] = f32(ws[kk * BM + tx + i * RX]);
            }
            for (var j = 0u; j < TN; j++) {
                let b = f32(xs[kk * BN + ty + j * RY]);
                for (var i = 0u; i < TM; i++) {
                    acc[i * TN + j] = fma(a[i], b, acc[i * TN + j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var j = 0u; j < TN; j++) {
        let t = ty + j * RY;
        if (t < ntok) {
            let y0 = yrow(tok0 + t) * p.n + col0;
            for (var i = 0u; i < TM; i++) {
                let r = m0 + tx + i * RX;
                if (r < p.rows) {
                    Y[y0 + r] = acc[i * TN + j];
                }
            }
        }
    }
}
