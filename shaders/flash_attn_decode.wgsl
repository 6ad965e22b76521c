// Split-KV attention for a few query tokens (decode): one workgroup per
// (KV chunk, query token, head) writes a partial softmax state for its chunk
// of keys; flash_attn_reduce.wgsl combines the chunks and the sink.
//
// The chunk [ka + c * chunk_len, ...) of this cache part is walked WG keys
// at a time: thread j scores key j against q (staged in workgroup memory),
// the workgroup reduces the block's max and sum (subgroup operations when
// SUBGROUPS, a tree in workgroup memory otherwise) and updates the running
// (m, l); then R groups of threads, each owning the pairs of the head row
// lane, lane + TPR, ..., accumulate every R-th key of the block.
//
// Partial of chunk g = chunk_base + c, token tok, head h at
// ((g * t + tok) * n_head + h) * (DV + 2): m, l, acc[DV] (unnormalised;
// m = NEG, l = 0 when the query sees no key of the chunk).
// Scores take DK elements of q and of each key row (kv head kvh's pairs at
// kvh * DK / 2), values DV (pairs at kvh * VH; VH = DK / 2 when the values
// are the first DV of each key row: a K-only cache bound as kc and vc).
// Constants: DK, DV (even), VH, WG (a power of two, a multiple of the
// subgroup size), SG_MIN (smallest subgroup size), KV_F16.

const NPK: u32 = DK / 2u;
const NPV: u32 = DV / 2u;
const R: u32 = max(1u, WG / NPV);           // key groups in the V pass
const TPR: u32 = WG / R;                    // threads per key group
const NPT: u32 = (NPV + TPR - 1u) / TPR;    // pairs per thread
const NEG: f32 = -3.0e38;

struct Params {
    t: u32,
    n_head: u32,
    group: u32,
    n_embd_k: u32,
    n_embd_v: u32,
    pos0: u32,
    part_first: u32,
    ka: u32,
    kb: u32,
    chunk_len: u32,
    chunk_base: u32,
    n_chunks: u32,
    window: u32,
    scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<vec2<f32>>;
// Bindings 1 and 2 (kc, vc): kv_read.wgsl.
@group(0) @binding(3) var<storage, read_write> part: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> qs: array<vec2<f32>, NPK>;
var<workgroup> ss: array<f32, WG>;
var<workgroup> red: array<f32, WG>;
var<workgroup> accs: array<vec2<f32>, R * NPV>;

// kpair / vpair: kv_read.wgsl.

#if SUBGROUPS
// Subgroups are assumed to hold consecutive invocations (lid / size).
fn wg_max(x: f32, lid: u32, sg_size: u32, sg_lane: u32) -> f32 {
    let s = subgroupMax(x);
    if sg_lane == 0u {
        red[lid / sg_size] = s;
    }
    workgroupBarrier();
    let n = WG / sg_size;
    var r = red[0];
    for (var i = 1u; i < WG / SG_MIN; i++) {
        if i < n {
            r = max(r, red[i]);
        }
    }
    workgroupBarrier();
    return r;
}

fn wg_sum(x: f32, lid: u32, sg_size: u32, sg_lane: u32) -> f32 {
    let s = subgroupAdd(x);
    if sg_lane == 0u {
        red[lid / sg_size] = s;
    }
    workgroupBarrier();
    let n = WG / sg_size;
    var r = red[0];
    for (var i = 1u; i < WG / SG_MIN; i++) {
        if i < n {
            r += red[i];
        }
    }
    workgroupBarrier();
    return r;
}
#else
fn wg_max(x: f32, lid: u32, sg_size: u32, sg_lane: u32) -> f32 {
    red[lid] = x;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn wg_sum(x: f32, lid: u32, sg_size: u32, sg_lane: u32) -> f32 {
    red[lid] = x;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
#endif

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
#if SUBGROUPS
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
#endif
) {
#if SUBGROUPS
#else
    let sg_size = 1u;
    let sg_lane = 0u;
#endif
    let gi = wg.x + wg.y * nwg.x;
    if gi >= p.n_chunks * p.t * p.n_head {
        return;
    }
    let h = gi % p.n_head;
    let tok = (gi / p.n_head) % p.t;
    let c = gi / (p.n_head * p.t);
    let kofs = (h / p.group) * NPK;
    let vofs = (h / p.group) * VH;
    let qpos = p.pos0 + tok;
    var qlo = 0u;
    if p.window > 0u && qpos + 1u > p.window {
        qlo = qpos + 1u - p.window;
    }
    let ca = p.ka + c * p.chunk_len;
    let klo = max(ca, qlo);
    let khi = min(min(ca + p.chunk_len, p.kb), qpos + 1u);
    var n_blk = 0u;
    if khi > klo {
        n_blk = (khi - klo + WG - 1u) / WG;
    }

    for (var k = 0u; k < (NPK + WG - 1u) / WG; k++) {
        let w = lid + k * WG;
        if w < NPK {
            qs[w] = q[(tok * p.n_head + h) * NPK + w];
        }
    }
    workgroupBarrier();

    let r = lid / TPR;
    let lane = lid % TPR;
    var m = NEG;
    var l = 0.0;
    var acc: array<vec2<f32>, NPT>;
    for (var b = 0u; b < n_blk; b++) {
        let k0 = klo + b * WG;
        let kp = k0 + lid;
        var s = NEG;
        if kp < khi {
            let base = (kp - p.part_first) * (p.n_embd_k / 2u) + kofs;
            var d = 0.0;
            for (var w = 0u; w < NPK; w++) {
                d += dot(qs[w], kpair(base + w));
            }
            s = d * p.scale;
        }
        let mn = max(m, wg_max(s, lid, sg_size, sg_lane));
        let corr = exp(m - mn);
        var e = 0.0;
        if kp < khi {
            e = exp(s - mn);
        }
        ss[lid] = e;
        l = l * corr + wg_sum(e, lid, sg_size, sg_lane);
        m = mn;
        if r < R {
            for (var k = 0u; k < NPT; k++) {
                acc[k] *= corr;
            }
            for (var j = r; j < WG; j += R) {
                let kj = k0 + j;
                if kj < khi {
                    let pj = ss[j];
                    let base = (kj - p.part_first) * (p.n_embd_v / 2u) + vofs;
                    for (var k = 0u; k < NPT; k++) {
                        let w = lane + k * TPR;
                        if w < NPV {
                            acc[k] += pj * vpair(base + w);
                        }
                    }
                }
            }
        }
        workgroupBarrier();
    }

    // Combine the R key groups.
    if R > 1u {
        if r < R {
            for (var k = 0u; k < NPT; k++) {
                let w = lane + k * TPR;
                if w < NPV {
                    accs[r * NPV + w] = acc[k];
                }
            }
        }
        workgroupBarrier();
        if r == 0u {
            for (var k = 0u; k < NPT; k++) {
                let w = lane + k * TPR;
                if w < NPV {
                    var a = acc[k];
                    for (var g = 1u; g < R; g++) {
                        a += accs[g * NPV + w];
                    }
                    acc[k] = a;
                }
            }
        }
    }

    let base = (((p.chunk_base + c) * p.t + tok) * p.n_head + h) * (DV + 2u);
    if lid == 0u {
        part[base] = m;
        part[base + 1u] = l;
    }
    if r == 0u {
        for (var k = 0u; k < NPT; k++) {
            let w = lane + k * TPR;
            if w < NPV {
                part[base + 2u + 2u * w] = acc[k].x;
                part[base + 2u + 2u * w + 1u] = acc[k].y;
            }
        }
    }
}
