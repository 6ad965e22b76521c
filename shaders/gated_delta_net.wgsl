// The gated delta rule (ggml's gated_delta_net) over `n` tokens of one
// sequence (rows r0.., the whole sequence or a chunk of it), token by token.
// One workgroup per value head h, reading key head kh (h / r, or
// h % n_k_heads when `tile`), and S invocations: invocation j owns column j
// of the head's S x S state, S[i][j] for every i, stored at j * S + i
// (ggml's transposed layout), and keeps it in registers across the tokens.
// Per token, with k, q the key head's rows (shared through workgroup
// memory):
//
//   S[i][j] *= exp(g[t, h])
//   d        = (v[t, h, j] - sum_i S[i][j] k[i]) * beta[t, h]
//   S[i][j] += k[i] * d
//   o[t, h, j] = (sum_i S[i][j] q[i]) * scale      (scale = 1 / sqrt(S))
//
// Every sum runs over i in order, in f32. S is a compile-time constant.

struct Params {
    r0: u32,
    n: u32,
    n_k_heads: u32,
    n_v_heads: u32,
    tile: u32,
    scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;
@group(0) @binding(4) var<storage, read> beta: array<f32>;
@group(0) @binding(5) var<storage, read_write> state: array<f32>;
@group(0) @binding(6) var<storage, read_write> o: array<f32>;
@group(0) @binding(7) var<uniform> p: Params;

var<workgroup> ks: array<f32, S>;
var<workgroup> qs: array<f32, S>;

@compute @workgroup_size(S)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) j: u32) {
    let h = wg.x + wg.y * nwg.x;
    if (h >= p.n_v_heads) {
        return;
    }
    var kh = h / (p.n_v_heads / p.n_k_heads);
    if (p.tile != 0u) {
        kh = h % p.n_k_heads;
    }
    let at = h * S * S + j * S;
    var col: array<f32, S>;
    for (var i = 0u; i < S; i++) {
        col[i] = state[at + i];
    }
    for (var t = 0u; t < p.n; t++) {
        let row = p.r0 + t;
        let kq = (row * p.n_k_heads + kh) * S + j;
        ks[j] = k[kq];
        qs[j] = q[kq];
        workgroupBarrier();
        let decay = exp(g[row * p.n_v_heads + h]);
        var sk = 0.0;
        for (var i = 0u; i < S; i++) {
            col[i] *= decay;
            sk += col[i] * ks[i];
        }
        let vo = (row * p.n_v_heads + h) * S + j;
        let d = (v[vo] - sk) * beta[row * p.n_v_heads + h];
        var sq = 0.0;
        for (var i = 0u; i < S; i++) {
            col[i] += ks[i] * d;
            sq += col[i] * qs[i];
        }
        o[vo] = sq * p.scale;
        // Everyone has read this token's k and q before they are replaced.
        workgroupBarrier();
    }
    for (var i = 0u; i < S; i++) {
        state[at + i] = col[i];
    }
}
