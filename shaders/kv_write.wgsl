// Writes f32 keys or values into one part of the KV cache.
//
// `src` holds `[t, n_embd]` f32 rows; `dst` is one part of the cache as u32
// words: f16 pairs packed with pack_half2 (f16.wgsl) when KV_F16 (one word per pair
// of elements; portable WGSL, no shader-f16 needed), f32 bits otherwise.
// Thread i writes word `dst_off + i` from unit `i` of `src` starting at
// float `src_off` (a unit is a pair of floats for f16, one float for f32).
// Constants: KV_F16.

struct Params {
    n: u32,
    src_off: u32,
    dst_off: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wg.x + wg.y * nwg.x) * 256u + lid;
    if i >= p.n {
        return;
    }
#if KV_F16
    let s = p.src_off + 2u * i;
    dst[p.dst_off + i] = pack_half2(vec2<f32>(src[s], src[s + 1u]));
#else
    dst[p.dst_off + i] = bitcast<u32>(src[p.src_off + i]);
#endif
}
