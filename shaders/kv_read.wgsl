// A KV cache part for the attention kernels, bound at 1 (keys) and 2
// (values), and reads of its element pairs: f16 pairs packed in u32
// (KV_F16) or f32 pairs.

#if KV_F16
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
#else
@group(0) @binding(1) var<storage, read> kc: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read> vc: array<vec2<f32>>;
#endif

fn kpair(i: u32) -> vec2<f32> {
#if KV_F16
    return unpack_half2(kc[i]);
#else
    return kc[i];
#endif
}

fn vpair(i: u32) -> vec2<f32> {
#if KV_F16
    return unpack_half2(vc[i]);
#else
    return vc[i];
#endif
}
