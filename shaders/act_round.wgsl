// Rounds activations the way ggml's CPU path quantises them before a
// quantised dot product, and writes the rounded values back as f32:
// Q8_0 / Q8_1 blocks of 32 (d = amax/127 stored as f16, q = round-even(x*127/amax)),
// Q8_K blocks of 256 (scale -127/max of the signed extreme, q <= 127, f32 d),
// F16 and BF16 (round to nearest even). The product kernels then see the same
// values the CPU's integer kernels multiply, so both placements carry the
// same quantisation error. One workgroup per block (BLK threads), or per 256
// values for F16 / BF16. MODE: 0 Q8_0/Q8_1, 1 Q8_K, 2 F16, 3 BF16.

struct Params {
    n: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> red_abs: array<f32, BLK>;
var<workgroup> red_idx: array<u32, BLK>;

// f32 -> f16 -> f32, round to nearest even (f16.wgsl).
fn round_f16(v: f32) -> f32 {
    return half_to_f32(f32_to_half(v));
}

fn round_bf16(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    let r = (b + 0x7FFFu + ((b >> 16u) & 1u)) & 0xFFFF0000u;
    return bitcast<f32>(r);
}

@compute @workgroup_size(BLK)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let blk = wg.x + wg.y * nwg.x;
    let i = blk * BLK + lid;
#if ELEMENTWISE
    if (i < p.n) {
#if BF16
        y[i] = round_bf16(x[i]);
#else
        y[i] = round_f16(x[i]);
#endif
    }
#else
    // Rows are whole blocks, so a block is either entirely in range or not.
    let inside = blk * BLK < p.n;
    var v = 0.0;
    if (inside) {
        v = x[i];
    }
    // Largest |v|, the first such element on ties (as the CPU's scan keeps).
    red_abs[lid] = abs(v);
    red_idx[lid] = lid;
    workgroupBarrier();
    for (var s = BLK / 2u; s > 0u; s /= 2u) {
        if (lid < s) {
            let oa = red_abs[lid + s];
            let oi = red_idx[lid + s];
            if (oa > red_abs[lid] || (oa == red_abs[lid] && oi < red_idx[lid])) {
                red_abs[lid] = oa;
                red_idx[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    let amax = red_abs[0];
    let at = red_idx[0];
    workgroupBarrier();
    if (!inside) {
        return;
    }
#if QK
    if (amax == 0.0) {
        y[i] = 0.0;
        return;
    }
    let mx = x[blk * BLK + at];
    let iscale = -127.0 / mx;
    let q = min(round(iscale * v), 127.0);
    y[i] = (1.0 / iscale) * q;
#else
    let d = amax / 127.0;
    var id = 0.0;
    if (amax != 0.0) {
        id = 127.0 / amax;
    }
    let q = round(v * id);
    y[i] = round_f16(d) * q;
#endif
#endif
}
