// Flash attention for prompts (any number of query tokens) over one part of
// the KV cache.
//
// A workgroup owns BR query tokens of one head. It walks the keys this part
// holds that any of its queries may see, BC at a time: the K tile is staged
// in workgroup memory, S = scale * Q K^T is computed for the BR x BC pairs,
// then the V tile replaces the K tile and every query folds its visible keys
// into a running max `m`, sum `l` and accumulator (online softmax). Key
// tiles outside the causal / sliding-window range are never visited.
//
// A cache larger than one binding is split into parts by position; the
// host dispatches once per part, in order. The running state of each
// (token, head) crosses parts in `out` (unnormalised accumulator) and `ml`
// (m, l): `first` starts from an empty state, `last` finishes with the sink
// and writes the normalised output.
//
// Layouts: q is [t, n_head * DK] and out [t, n_head * DV] f32; a cache part
// holds rows of n_embd_k (n_embd_v) elements for positions part_first.., as
// f16 pairs packed in u32 (KV_F16) or f32. Head h reads kv head kvh = h /
// group: its key pairs at kvh * DK / 2, its value pairs at kvh * VH (VH =
// DK / 2 when the values are the first DV of each key row: a K-only cache
// bound as both kc and vc).
// Constants: DK, DV (even), VH, BR, BC, KV_F16, TILE_F16 (K/V tiles as f16;
// needs shader-f16 and an f16 cache), SINKS.

const WG: u32 = 64u;
const TPQ: u32 = WG / BR;            // threads per query row
const NPK: u32 = DK / 2u;            // element pairs per Q / K head row
const NPV: u32 = DV / 2u;            // element pairs per V / output head row
const NPM: u32 = max(NPK, NPV);      // pairs per row of the K/V tile
const NPT: u32 = (NPV + TPQ - 1u) / TPQ; // output pairs per thread
const NEG: f32 = -3.0e38;            // "no key yet" (finite: exp(NEG - m) == 0)

#if TILE_F16
alias T2 = vec2<f16>;
#else
alias T2 = vec2<f32>;
#endif

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
    window: u32,
    first: u32,
    last: u32,
    scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<vec2<f32>>;
// Bindings 1 and 2 (kc, vc): kv_read.wgsl.
#if SINKS
@group(0) @binding(3) var<storage, read> sinks: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<vec2<f32>>;
@group(0) @binding(5) var<storage, read_write> ml: array<vec2<f32>>;
@group(0) @binding(6) var<uniform> p: Params;
#else
@group(0) @binding(3) var<storage, read_write> out: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> ml: array<vec2<f32>>;
@group(0) @binding(5) var<uniform> p: Params;
#endif

// Q stays f32: rounding it to f16 moved the logits of the quantised test
// fixtures by NMSE ~1e-4 against the CPU; K and V are f16 in the cache
// already, so their tiles lose nothing in f16.
var<workgroup> qt: array<vec2<f32>, BR * NPK>;
var<workgroup> kvt: array<T2, BC * NPM>;
var<workgroup> st: array<f32, BR * BC>;

// kpair / vpair: kv_read.wgsl.

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let gi = wg.x + wg.y * nwg.x;
    let n_tiles_q = (p.t + BR - 1u) / BR;
    if gi >= n_tiles_q * p.n_head {
        return;
    }
    let h = gi % p.n_head;
    let r0 = (gi / p.n_head) * BR;
    let kvh = h / p.group;
    let kofs = kvh * NPK;
    let vofs = kvh * VH;

    // Keys any query of this tile may see, within this part.
    let q_first = p.pos0 + r0;
    let q_last = p.pos0 + min(r0 + BR, p.t) - 1u;
    var lo = 0u;
    if p.window > 0u && q_first + 1u > p.window {
        lo = q_first + 1u - p.window;
    }
    let klo = max(lo, p.ka);
    let khi = min(q_last + 1u, p.kb);
    var n_kt = 0u;
    if khi > klo {
        n_kt = (khi - klo + BC - 1u) / BC;
    }

    // Q tile.
    for (var k = 0u; k < (BR * NPK + WG - 1u) / WG; k++) {
        let e = lid + k * WG;
        if e < BR * NPK {
            let i = e / NPK;
            var v = vec2<f32>(0.0);
            if r0 + i < p.t {
                v = q[((r0 + i) * p.n_head + h) * NPK + e % NPK];
            }
            qt[e] = v;
        }
    }

    // This thread's query row and its pairs lane, lane + TPQ, ...
    let i = lid / TPQ;
    let lane = lid % TPQ;
    let row = r0 + i;
    let row_ok = row < p.t;
    let qpos = p.pos0 + row;
    var my_lo = 0u;
    if p.window > 0u && qpos + 1u > p.window {
        my_lo = qpos + 1u - p.window;
    }
    let si = row * p.n_head + h;
    var m = NEG;
    var l = 0.0;
    var acc: array<vec2<f32>, NPT>;
    if p.first == 0u && row_ok {
        let s = ml[si];
        m = s.x;
        l = s.y;
        for (var k = 0u; k < NPT; k++) {
            let w = lane + k * TPQ;
            if w < NPV {
                acc[k] = out[si * NPV + w];
            }
        }
    }

    for (var kt = 0u; kt < n_kt; kt++) {
        let k0 = klo + kt * BC;
        // K tile.
        for (var k = 0u; k < (BC * NPK + WG - 1u) / WG; k++) {
            let e = lid + k * WG;
            if e < BC * NPK {
                let kp = k0 + e / NPK;
                var v = vec2<f32>(0.0);
                if kp < khi {
                    v = kpair((kp - p.part_first) * (p.n_embd_k / 2u) + kofs + e % NPK);
                }
                kvt[e] = T2(v);
            }
        }
        workgroupBarrier();
        // S = scale * Q K^T.
        for (var k = 0u; k < (BR * BC + WG - 1u) / WG; k++) {
            let e = lid + k * WG;
            if e < BR * BC {
                let qi = (e / BC) * NPK;
                let kj = (e % BC) * NPK;
                var d = 0.0;
                for (var w = 0u; w < NPK; w++) {
                    d += dot(qt[qi + w], vec2<f32>(kvt[kj + w]));
                }
                st[e] = d * p.scale;
            }
        }
        workgroupBarrier();
        // V tile in the same memory.
        for (var k = 0u; k < (BC * NPV + WG - 1u) / WG; k++) {
            let e = lid + k * WG;
            if e < BC * NPV {
                let kp = k0 + e / NPV;
                var v = vec2<f32>(0.0);
                if kp < khi {
                    v = vpair((kp - p.part_first) * (p.n_embd_v / 2u) + vofs + e % NPV);
                }
                kvt[e] = T2(v);
            }
        }
        workgroupBarrier();
        // Online softmax over this row's visible keys of the tile.
        if row_ok {
            let a = max(my_lo, k0) - k0;
            let b = min(min(qpos + 1u, khi), k0 + BC);
            if b > k0 + a {
                let bj = b - k0;
                var mt = NEG;
                for (var j = a; j < bj; j++) {
                    mt = max(mt, st[i * BC + j]);
                }
                let mn = max(m, mt);
                let corr = exp(m - mn);
                for (var k = 0u; k < NPT; k++) {
                    acc[k] *= corr;
                }
                var ls = 0.0;
                for (var j = a; j < bj; j++) {
                    let pj = exp(st[i * BC + j] - mn);
                    ls += pj;
                    for (var k = 0u; k < NPT; k++) {
                        let w = lane + k * TPQ;
                        if w < NPV {
                            acc[k] += pj * vec2<f32>(kvt[j * NPV + w]);
                        }
                    }
                }
                l = l * corr + ls;
                m = mn;
            }
        }
        workgroupBarrier();
    }

    if !row_ok {
        return;
    }
    if p.last == 0u {
        if lane == 0u {
            ml[si] = vec2<f32>(m, l);
        }
        for (var k = 0u; k < NPT; k++) {
            let w = lane + k * TPQ;
            if w < NPV {
                out[si * NPV + w] = acc[k];
            }
        }
        return;
    }
    var c = 1.0;
    var den = l;
#if SINKS
    let s = sinks[h];
    let mf = max(m, s);
    c = exp(m - mf);
    den = l * c + exp(s - mf);
#endif
    let f = c / den;
    for (var k = 0u; k < NPT; k++) {
        let w = lane + k * TPQ;
        if w < NPV {
            out[si * NPV + w] = acc[k] * f;
        }
    }
}
