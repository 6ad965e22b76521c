// Combines the per-chunk partials of flash_attn_decode.wgsl into the output:
// M = max(m_c, sink), L = sum l_c e^(m_c - M) + e^(sink - M),
// out = sum acc_c e^(m_c - M) / L. One workgroup per (token, head).
// Constants: DV (the V head size: partials of DV + 2, output [t, n_head * DV]),
// SINKS.

struct Params {
    t: u32,
    n_head: u32,
    n_chunks: u32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
#if SINKS
@group(0) @binding(1) var<storage, read> sinks: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
#else
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
#endif

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let gi = wg.x + wg.y * nwg.x;
    let rows = p.t * p.n_head;
    if gi >= rows {
        return;
    }
    let stride = rows * (DV + 2u);
    var mx = -3.0e38;
    for (var c = 0u; c < p.n_chunks; c++) {
        mx = max(mx, part[c * stride + gi * (DV + 2u)]);
    }
#if SINKS
    let s = sinks[gi % p.n_head];
    mx = max(mx, s);
#endif
    var den = 0.0;
    for (var c = 0u; c < p.n_chunks; c++) {
        let b = c * stride + gi * (DV + 2u);
        den += part[b + 1u] * exp(part[b] - mx);
    }
#if SINKS
    den += exp(s - mx);
#endif
    let inv = 1.0 / den;
    for (var d = lid; d < DV; d += 64u) {
        var a = 0.0;
        for (var c = 0u; c < p.n_chunks; c++) {
            let b = c * stride + gi * (DV + 2u);
            a += part[b + 2u + d] * exp(part[b] - mx);
        }
        out[gi * DV + d] = a * inv;
    }
}
