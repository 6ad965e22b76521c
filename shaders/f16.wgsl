// IEEE half <-> f32 conversions written out with integer ops, because
// pack2x16float / unpack2x16float leave rounding and f16 subnormals to the
// driver (Vulkan may flush them), while GGUF scales and the f16 KV cache
// need exactly the CPU's values: round to nearest even, subnormals kept.

// f16 bits (low 16) -> f32, exact for every finite value, inf and NaN.
fn half_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1Fu;
    let m = h & 0x3FFu;
    if (e == 0u) {
        // Zero or subnormal: m * 2^-24.
        let v = f32(m) * 5.9604644775390625e-08;
        return bitcast<f32>(bitcast<u32>(v) | sign);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7F800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// f32 -> f16 bits, round to nearest even; overflow gives inf.
fn f32_to_half(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) {
        // inf or NaN
        return sign | 0x7C00u | select(0u, 0x200u, a > 0x7F800000u);
    }
    if (a >= 0x477FF000u) {
        // rounds past 65504
        return sign | 0x7C00u;
    }
    if (a < 0x38800000u) {
        // f16 subnormal or zero: nearest multiple of 2^-24 (ties to even).
        let q = u32(round(bitcast<f32>(a) * 16777216.0));
        return sign | q;
    }
    let r = a + 0x0FFFu + ((a >> 13u) & 1u);
    return sign | ((r - 0x38000000u) >> 13u);
}

fn unpack_half2(w: u32) -> vec2<f32> {
    return vec2<f32>(half_to_f32(w & 0xFFFFu), half_to_f32(w >> 16u));
}

fn pack_half2(v: vec2<f32>) -> u32 {
    return f32_to_half(v.x) | (f32_to_half(v.y) << 16u);
}
