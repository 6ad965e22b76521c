// Reads of element pairs from a KV cache part (bindings `kc` and `vc` of the
// including kernel): f16 pairs packed in u32 (KV_F16) or f32 pairs.

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
