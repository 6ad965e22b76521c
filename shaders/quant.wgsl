// GGUF weight blocks dequantised in place.
//
// The weight is bound as `W: array<u32>` (binding 0 of every quantised
// kernel) holding the blocks exactly as stored in the file, so blocks of 18,
// 34, 17 or 210 bytes start at any byte: the `ld*` helpers read 1, 2 or 4
// bytes at any byte offset. The host prepends, per weight type:
//   const BLK: u32        elements per block (1 for F32/F16/BF16)
//   const BLK_BYTES: u32  bytes per block
//   const T_<TYPE>: u32   = 1, selecting one `deq4` below
//   const HAS_GRID: u32   = 1 for the i-quants reading a grid (bind group 1)
//   const IQ_SIGNS: u32   = 1 for those with ksigns-coded signs
// and kernels call `deq4(blk, i)`: the 4 consecutive values `i..i+4` (i a
// multiple of 4) of the block starting at byte `blk`. For the float types a
// "block" is one element and `deq4` returns 4 consecutive elements.
// The formats of most expert and attention weights also define
// `deq16(blk, i)`: the 16 values `i..i+16` (i a multiple of 16) as the four
// columns of a mat4x4, each value computed exactly as `deq4` computes it, but
// with the block's scales decoded once and its bytes read 16 at a time
// (`ld128`). The mat-vec uses it where the host sets MV_WIDE
// (select.rs: matvec_wide).
// Byte layouts and arithmetic follow src/quant/*.rs (byte-exact to ggml).

@group(0) @binding(0) var<storage, read> W: array<u32>;

// One byte at byte offset `b`.
fn ld8(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// Little-endian u16 at any byte offset.
fn ld16(b: u32) -> u32 {
    let i = b >> 2u;
    let s = (b & 3u) * 8u;
    if (s <= 16u) {
        return (W[i] >> s) & 0xffffu;
    }
    return ((W[i] >> 24u) | (W[i + 1u] << 8u)) & 0xffffu;
}

// Little-endian u32 at any byte offset.
fn ld32(b: u32) -> u32 {
    let i = b >> 2u;
    let s = (b & 3u) * 8u;
    if (s == 0u) {
        return W[i];
    }
    return (W[i] >> s) | (W[i + 1u] << (32u - s));
}

// The 16 bytes at byte offset `b` as four little-endian words. With W_VEC4
// (a type whose 16-byte runs all start 16-aligned, see deq16) this is one
// vec4<u32> load through `W4`, the same buffer bound a second time as
// 16-byte words (binding 0 of group 1, read-only aliasing WebGPU allows);
// otherwise four or five word loads and shifts.
#if W_VEC4
@group(1) @binding(0) var<storage, read> W4: array<vec4<u32>>;

fn ld128(b: u32) -> vec4<u32> {
    return W4[b >> 4u];
}
#else
fn ld128(b: u32) -> vec4<u32> {
    let i = b >> 2u;
    let s = (b & 3u) * 8u;
    let a = vec4<u32>(W[i], W[i + 1u], W[i + 2u], W[i + 3u]);
    if (s == 0u) {
        return a;
    }
    // Byte b + 15 lies in word i + 4 when b is not word-aligned.
    let n = vec4<u32>(W[i + 1u], W[i + 2u], W[i + 3u], W[i + 4u]);
    return (a >> vec4<u32>(s)) | (n << vec4<u32>(32u - s));
}
#endif

// IEEE half at byte offset `b` (core WGSL: no shader-f16 needed).
fn f16at(b: u32) -> f32 {
    return half_to_f32(ld16(b));
}

// The 4 bytes of `w`, unsigned.
fn bytes4(w: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
}

// The 4 bytes of `w` as signed 8-bit values.
fn sbytes4(w: u32) -> vec4<f32> {
    let v = bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u));
    return vec4<f32>(v >> vec4<u32>(24u));
}

// Nibble `s / 4` (s = 0: low, 4: high) of each byte of `w`.
fn nibs4(w: u32, s: u32) -> vec4<u32> {
    return (bytes4(w) >> vec4<u32>(s)) & vec4<u32>(0xfu);
}

// Entry `q` (0..16) of a 16-entry table of signed bytes packed little-endian
// into four words, without memory lookups (selects and shifts only).
fn table16(q: vec4<u32>, t0: u32, t1: u32, t2: u32, t3: u32) -> vec4<f32> {
    let hi4 = (q & vec4<u32>(4u)) != vec4<u32>(0u);
    let hi8 = q >= vec4<u32>(8u);
    let w = select(select(vec4<u32>(t0), vec4<u32>(t1), hi4), select(vec4<u32>(t2), vec4<u32>(t3), hi4), hi8);
    let v = bitcast<vec4<i32>>(w << (vec4<u32>(24u) - 8u * (q & vec4<u32>(3u))));
    return vec4<f32>(v >> vec4<u32>(24u));
}

// ggml's kvalues_iq4nl: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113.
fn kv_iq4nl(q: vec4<u32>) -> vec4<f32> {
    return table16(q, 0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);
}

// ggml's kvalues_mxfp4 (E2M1 doubled): 0 1 2 3 4 6 8 12 0 -1 -2 -3 -4 -6 -8 -12.
fn kv_mxfp4(q: vec4<u32>) -> vec4<f32> {
    return table16(q, 0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu);
}

// Sub-block `j` (0..8) scale and min of a Q4_K / Q5_K super-block whose
// 12 packed scale bytes start at `s` (ggml's get_scale_min_k4).
fn scale_min_k4(s: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(ld8(s + j) & 63u), f32(ld8(s + j + 4u) & 63u));
    }
    let a = ld8(s + j + 4u);
    let sc = (a & 0xfu) | ((ld8(s + j - 4u) >> 6u) << 4u);
    let m = (a >> 4u) | ((ld8(s + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

#if T_F32
// Rows of F32 are 4-byte aligned.
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let w = b >> 2u;
    return bitcast<vec4<f32>>(vec4<u32>(W[w], W[w + 1u], W[w + 2u], W[w + 3u]));
}
#endif

#if T_F16
fn deq4(b: u32, i: u32) -> vec4<f32> {
    return vec4<f32>(unpack_half2(ld32(b)), unpack_half2(ld32(b + 4u)));
}
#endif

#if T_BF16
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let a = ld32(b);
    let c = ld32(b + 4u);
    return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, c << 16u, c & 0xffff0000u));
}
#endif

#if T_Q8_0
// d: f16, qs: [i8; 32]. x = d * q.
fn deq4(b: u32, i: u32) -> vec4<f32> {
    return f16at(b) * sbytes4(ld32(b + 2u + i));
}

fn deq16(b: u32, i: u32) -> mat4x4<f32> {
    let d = f16at(b);
    let q = ld128(b + 2u + i);
    return mat4x4<f32>(d * sbytes4(q.x), d * sbytes4(q.y), d * sbytes4(q.z), d * sbytes4(q.w));
}
#endif

#if T_Q4_0
// d: f16, qs: [u8; 16]; byte j: weight j low nibble, j + 16 high. x = d * (q - 8).
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let q = nibs4(ld32(b + 2u + (i & 15u)), (i >> 4u) * 4u);
    return f16at(b) * (vec4<f32>(q) - 8.0);
}

fn deq16(b: u32, i: u32) -> mat4x4<f32> {
    let d = f16at(b);
    let q = ld128(b + 2u);
    let s = (i >> 4u) * 4u;
    return mat4x4<f32>(
        d * (vec4<f32>(nibs4(q.x, s)) - 8.0),
        d * (vec4<f32>(nibs4(q.y, s)) - 8.0),
        d * (vec4<f32>(nibs4(q.z, s)) - 8.0),
        d * (vec4<f32>(nibs4(q.w, s)) - 8.0),
    );
}
#endif

#if T_Q4_1
// d: f16, m: f16, qs: [u8; 16] as Q4_0. x = d * q + m.
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let q = nibs4(ld32(b + 4u + (i & 15u)), (i >> 4u) * 4u);
    return f16at(b) * vec4<f32>(q) + f16at(b + 2u);
}
#endif

#if T_Q5_0
// d: f16, qh: u32 (bit i = fifth bit of weight i), qs: [u8; 16] as Q4_0.
// x = d * (q - 16).
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let lo = nibs4(ld32(b + 6u + (i & 15u)), (i >> 4u) * 4u);
    let h = (vec4<u32>(ld32(b + 2u)) >> (vec4<u32>(i) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u);
    return f16at(b) * (vec4<f32>(lo | (h << vec4<u32>(4u))) - 16.0);
}
#endif

#if T_Q5_1
// d: f16, m: f16, qh: u32, qs: [u8; 16]. x = d * q + m.
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let lo = nibs4(ld32(b + 8u + (i & 15u)), (i >> 4u) * 4u);
    let h = (vec4<u32>(ld32(b + 4u)) >> (vec4<u32>(i) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u);
    return f16at(b) * vec4<f32>(lo | (h << vec4<u32>(4u))) + f16at(b + 2u);
}
#endif

#if T_IQ4_NL
// d: f16, qs: [u8; 16] as Q4_0. x = d * kv[q].
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let q = nibs4(ld32(b + 2u + (i & 15u)), (i >> 4u) * 4u);
    return f16at(b) * kv_iq4nl(q);
}

fn deq16(b: u32, i: u32) -> mat4x4<f32> {
    let d = f16at(b);
    let q = ld128(b + 2u);
    let s = (i >> 4u) * 4u;
    return mat4x4<f32>(
        d * kv_iq4nl(nibs4(q.x, s)),
        d * kv_iq4nl(nibs4(q.y, s)),
        d * kv_iq4nl(nibs4(q.z, s)),
        d * kv_iq4nl(nibs4(q.w, s)),
    );
}
#endif

#if T_IQ4_XS
// d: f16, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128]; 8 sub-blocks of
// 32 with 6-bit scales, each nibble-packed as IQ4_NL. x = d * (ls - 32) * kv[q].
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let ib = i >> 5u;
    let j = i & 31u;
    let lo = (ld8(b + 4u + (ib >> 1u)) >> (4u * (ib & 1u))) & 0xfu;
    let hi = (ld16(b + 2u) >> (2u * ib)) & 3u;
    let dl = f16at(b) * (f32(lo | (hi << 4u)) - 32.0);
    let q = nibs4(ld32(b + 8u + 16u * ib + (j & 15u)), (j >> 4u) * 4u);
    return dl * kv_iq4nl(q);
}
#endif

#if T_MXFP4
// e: u8 (E8M0), qs: [u8; 16] as Q4_0. x = kv[q] * 2^(e - 128) (doubled grid).
// The block's scale 2^(e - 128) from its E8M0 byte at `b` (the grid is
// doubled).
fn mxfp4_scale(b: u32) -> f32 {
    let e = ld8(b);
    return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
}

fn deq4(b: u32, i: u32) -> vec4<f32> {
    let q = nibs4(ld32(b + 1u + (i & 15u)), (i >> 4u) * 4u);
    return mxfp4_scale(b) * kv_mxfp4(q);
}

fn deq16(b: u32, i: u32) -> mat4x4<f32> {
    let d = mxfp4_scale(b);
    let q = ld128(b + 1u);
    let s = (i >> 4u) * 4u;
    return mat4x4<f32>(
        d * kv_mxfp4(nibs4(q.x, s)),
        d * kv_mxfp4(nibs4(q.y, s)),
        d * kv_mxfp4(nibs4(q.z, s)),
        d * kv_mxfp4(nibs4(q.w, s)),
    );
}
#endif

#if T_Q2_K
// scales: [u8; 16] at 0 (low nibble scale, high nibble min, per 16 weights),
// qs: [u8; 64] at 16, d at 80, dmin at 82. Half h (128 weights) uses qs
// bytes 32h..32h+32; its four 32-weight runs take bit pairs 0, 2, 4, 6.
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let h = i >> 7u;
    let s = (i >> 5u) & 3u;
    let l = i & 31u;
    let sc = ld8(b + 8u * h + 2u * s + (l >> 4u));
    let q = (bytes4(ld32(b + 16u + 32u * h + l)) >> vec4<u32>(2u * s)) & vec4<u32>(3u);
    return f16at(b + 80u) * f32(sc & 0xfu) * vec4<f32>(q) - f16at(b + 82u) * f32(sc >> 4u);
}
#endif

#if T_Q3_K
// hmask: [u8; 32] at 0, qs: [u8; 64] at 32 (low bit pairs as Q2_K),
// scales: [u8; 12] at 96 (16 six-bit scales biased by 32), d at 108.
// A clear hmask bit subtracts 4. x = d * (sc - 32) * q.
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let h = i >> 7u;
    let s = (i >> 5u) & 3u;
    let l = i & 31u;
    let q2 = (bytes4(ld32(b + 32u + 32u * h + l)) >> vec4<u32>(2u * s)) & vec4<u32>(3u);
    let hm = (bytes4(ld32(b + l)) & vec4<u32>(1u << (4u * h + s))) != vec4<u32>(0u);
    let q = vec4<f32>(q2) - select(vec4<f32>(4.0), vec4<f32>(0.0), hm);
    let g = i >> 4u;
    let lo = (ld8(b + 96u + (g & 7u)) >> (4u * (g >> 3u))) & 0xfu;
    let hi = (ld8(b + 104u + (g & 3u)) >> (2u * (g >> 2u))) & 3u;
    return f16at(b + 108u) * (f32(lo | (hi << 4u)) - 32.0) * q;
}
#endif

#if T_Q4_K
// d at 0, dmin at 2, scales: [u8; 12] at 4, qs: [u8; 128] at 16. Chunk c of
// 64 weights uses qs bytes 32c..32c+32: low nibbles then high nibbles.
// x = d * sc * q - dmin * m.
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let c = i >> 6u;
    let hi = (i >> 5u) & 1u;
    let l = i & 31u;
    let sm = scale_min_k4(b + 4u, 2u * c + hi);
    let q = nibs4(ld32(b + 16u + 32u * c + l), 4u * hi);
    return f16at(b) * sm.x * vec4<f32>(q) - f16at(b + 2u) * sm.y;
}

// The 16 values share one sub-block (one scale and min) and 16 bytes of qs.
fn deq16(b: u32, i: u32) -> mat4x4<f32> {
    let c = i >> 6u;
    let hi = (i >> 5u) & 1u;
    let sm = scale_min_k4(b + 4u, 2u * c + hi);
    let a = f16at(b) * sm.x;
    let m = f16at(b + 2u) * sm.y;
    let q = ld128(b + 16u + 32u * c + (i & 31u));
    let s = 4u * hi;
    return mat4x4<f32>(
        a * vec4<f32>(nibs4(q.x, s)) - m,
        a * vec4<f32>(nibs4(q.y, s)) - m,
        a * vec4<f32>(nibs4(q.z, s)) - m,
        a * vec4<f32>(nibs4(q.w, s)) - m,
    );
}
#endif

#if T_Q5_K
// d at 0, dmin at 2, scales at 4 (as Q4_K), qh: [u8; 32] at 16 (bit k of
// byte l: fifth bit of weight 32k + l), qs: [u8; 128] at 48 (as Q4_K).
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let c = i >> 6u;
    let hi = (i >> 5u) & 1u;
    let l = i & 31u;
    let sm = scale_min_k4(b + 4u, 2u * c + hi);
    let lo = nibs4(ld32(b + 48u + 32u * c + l), 4u * hi);
    let h = (bytes4(ld32(b + 16u + l)) >> vec4<u32>(2u * c + hi)) & vec4<u32>(1u);
    let q = lo | (h << vec4<u32>(4u));
    return f16at(b) * sm.x * vec4<f32>(q) - f16at(b + 2u) * sm.y;
}

fn q5k4(lo: u32, h: u32, s: u32, sh: u32, a: f32, m: f32) -> vec4<f32> {
    let q = nibs4(lo, s) | (((bytes4(h) >> vec4<u32>(sh)) & vec4<u32>(1u)) << vec4<u32>(4u));
    return a * vec4<f32>(q) - m;
}

// One sub-block, 16 bytes of qs and 16 of qh.
fn deq16(b: u32, i: u32) -> mat4x4<f32> {
    let c = i >> 6u;
    let hi = (i >> 5u) & 1u;
    let l = i & 31u;
    let sm = scale_min_k4(b + 4u, 2u * c + hi);
    let a = f16at(b) * sm.x;
    let m = f16at(b + 2u) * sm.y;
    let lo = ld128(b + 48u + 32u * c + l);
    let h = ld128(b + 16u + l);
    let s = 4u * hi;
    let sh = 2u * c + hi;
    return mat4x4<f32>(
        q5k4(lo.x, h.x, s, sh, a, m),
        q5k4(lo.y, h.y, s, sh, a, m),
        q5k4(lo.z, h.z, s, sh, a, m),
        q5k4(lo.w, h.w, s, sh, a, m),
    );
}
#endif

#if T_Q6_K
// ql: [u8; 128] at 0, qh: [u8; 64] at 128, scales: [i8; 16] at 192, d at 208.
// Half h: run s (32 weights) takes nibble s >> 1 of ql[64h + 32(s & 1) + l]
// and bit pair s of qh[32h + l]. x = d * sc * (q - 32).
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let h = i >> 7u;
    let s = (i >> 5u) & 3u;
    let l = i & 31u;
    let lo = nibs4(ld32(b + 64u * h + 32u * (s & 1u) + l), 4u * (s >> 1u));
    let hb = (bytes4(ld32(b + 128u + 32u * h + l)) >> vec4<u32>(2u * s)) & vec4<u32>(3u);
    let q = vec4<f32>(lo | (hb << vec4<u32>(4u))) - 32.0;
    let sc = f32(bitcast<i32>(ld8(b + 192u + (i >> 4u)) << 24u) >> 24u);
    return f16at(b + 208u) * sc * q;
}

fn q6k4(lo: u32, h: u32, s: u32, sh: u32, a: f32) -> vec4<f32> {
    let q = nibs4(lo, s) | (((bytes4(h) >> vec4<u32>(sh)) & vec4<u32>(3u)) << vec4<u32>(4u));
    return a * (vec4<f32>(q) - 32.0);
}

// One 16-value scale, 16 bytes of ql and 16 of qh.
fn deq16(b: u32, i: u32) -> mat4x4<f32> {
    let h = i >> 7u;
    let s = (i >> 5u) & 3u;
    let l = i & 31u;
    let lo = ld128(b + 64u * h + 32u * (s & 1u) + l);
    let hb = ld128(b + 128u + 32u * h + l);
    let sc = f32(bitcast<i32>(ld8(b + 192u + (i >> 4u)) << 24u) >> 24u);
    let a = f16at(b + 208u) * sc;
    let n = 4u * (s >> 1u);
    return mat4x4<f32>(
        q6k4(lo.x, hb.x, n, 2u * s, a),
        q6k4(lo.y, hb.y, n, 2u * s, a),
        q6k4(lo.z, hb.z, n, 2u * s, a),
        q6k4(lo.w, hb.w, n, 2u * s, a),
    );
}
#endif

// ---- i-quants and NVFP4 ----
//
// A type with a grid reads it as `GRID` (bind group 1, set by the host from
// the tables of iq_tables.wgsl: one u64 entry of 8 values is two words, low
// first; a u32 entry holds 4 values). Each `deq4` reads one grid word, the
// 4 values `i..i+4`.
//
// Why a storage buffer and not the `const` arrays themselves: naga lowers a
// dynamically indexed module-scope `const` array by copying the whole array
// into a function-local variable on every call, and lavapipe (llvmpipe)
// compiles and runs that literally. Measured on lavapipe, get_rows of 1000
// IQ2_XS rows (1024-word grid): 23 s to compile and 57 ms to run (IQ4_XS:
// 45 ms and 1.1 ms); as `var<private>` still 12 s and 3.5 ms; the 4096-word
// IQ1_S grid is worse. A storage binding compiles like any other kernel and
// costs one cached load per 4 weights.

#if HAS_GRID
@group(1) @binding(0) var<storage, read> GRID: array<u32>;
#endif

#if IQ_SIGNS
// ggml's ksigns_iq2xs[k] (k: 7 bits): k with bit 7 set to make the byte's
// parity even, so the table is computed, not read.
fn ksigns(k: u32) -> u32 {
    return k | ((countOneBits(k) & 1u) << 7u);
}

// +-1 for bits `h * 4 .. h * 4 + 4` of the sign byte `s` (a set bit negates).
fn signs4(s: u32, h: u32) -> vec4<f32> {
    let bit = (vec4<u32>(s >> (4u * h)) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u);
    return select(vec4<f32>(1.0), vec4<f32>(-1.0), bit != vec4<u32>(0u));
}
#endif

#if T_IQ2_XXS
// d: f16, qs: [u16; 32] at 2. Sub-block ib of 32 weights: 8 bytes at
// 2 + 8 ib, four grid indices (bytes 0..4) then a word of four 7-bit sign
// indices and a 4-bit scale (top). x = d * (0.5 + s) / 4 * grid * sign.
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let ib = i >> 5u;
    let l = (i >> 3u) & 3u;
    let h = (i >> 2u) & 1u;
    let q = b + 2u + 8u * ib;
    let aux = ld32(q + 4u);
    let db = f16at(b) * (0.5 + f32(aux >> 28u)) * 0.25;
    let g = vec4<f32>(bytes4(GRID[2u * ld8(q + l) + h]));
    return db * g * signs4(ksigns((aux >> (7u * l)) & 127u), h);
}
#endif

#if T_IQ2_XS
// d: f16, qs: [u16; 32] at 2 (9-bit grid index, 7-bit sign index), scales:
// [u8; 8] at 66 (two 4-bit scales per sub-block of 32, one per 16 weights).
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let ib = i >> 5u;
    let l = (i >> 3u) & 3u;
    let h = (i >> 2u) & 1u;
    let q = ld16(b + 2u + 8u * ib + 2u * l);
    let s = (ld8(b + 66u + ib) >> (4u * (l >> 1u))) & 0xfu;
    let db = f16at(b) * (0.5 + f32(s)) * 0.25;
    let g = vec4<f32>(bytes4(GRID[2u * (q & 511u) + h]));
    return db * g * signs4(ksigns(q >> 9u), h);
}
#endif

#if T_IQ2_S
// d: f16, qs: [u8; 32] at 2 (grid index low bits), signs: [u8; 32] at 34,
// qh: [u8; 8] at 66 (two high index bits per 8 weights), scales: [u8; 8]
// at 74 (as IQ2_XS).
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let ib = i >> 5u;
    let l = (i >> 3u) & 3u;
    let h = (i >> 2u) & 1u;
    let idx = ld8(b + 2u + 4u * ib + l) | (((ld8(b + 66u + ib) >> (2u * l)) & 3u) << 8u);
    let s = (ld8(b + 74u + ib) >> (4u * (l >> 1u))) & 0xfu;
    let db = f16at(b) * (0.5 + f32(s)) * 0.25;
    let g = vec4<f32>(bytes4(GRID[2u * idx + h]));
    return db * g * signs4(ld8(b + 34u + 4u * ib + l), h);
}
#endif

#if T_IQ3_XXS
// d: f16, qs: [u8; 64] at 2 (one u32-grid index per 4 weights), then per
// sub-block of 32 a word at 66 + 4 ib: four 7-bit sign indices and a 4-bit
// scale (top). x = d * (0.5 + s) / 2 * grid * sign.
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let ib = i >> 5u;
    let l = (i >> 3u) & 3u;
    let h = (i >> 2u) & 1u;
    let aux = ld32(b + 66u + 4u * ib);
    let db = f16at(b) * (0.5 + f32(aux >> 28u)) * 0.5;
    let g = vec4<f32>(bytes4(GRID[ld8(b + 2u + (i >> 2u))]));
    return db * g * signs4(ksigns((aux >> (7u * l)) & 127u), h);
}
#endif

#if T_IQ3_S
// d: f16, qs: [u8; 64] at 2 (grid index low bits, one per 4 weights), qh:
// [u8; 8] at 66 (ninth index bit per 4 weights), signs: [u8; 32] at 74,
// scales: [u8; 4] at 106 (4 bits per sub-block of 32). x = d * (1 + 2 s) *
// grid * sign.
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let ib = i >> 5u;
    let l = (i >> 3u) & 3u;
    let h = (i >> 2u) & 1u;
    let idx = ld8(b + 2u + (i >> 2u)) | (((ld8(b + 66u + ib) >> ((i >> 2u) & 7u)) & 1u) << 8u);
    let s = (ld8(b + 106u + (ib >> 1u)) >> (4u * (ib & 1u))) & 0xfu;
    let db = f16at(b) * f32(1u + 2u * s);
    let g = vec4<f32>(bytes4(GRID[idx]));
    return db * g * signs4(ld8(b + 74u + 4u * ib + l), h);
}
#endif

#if T_IQ1_S
// d: f16, qs: [u8; 32] at 2 (grid index low bits), qh: [u16; 8] at 34 (per
// sub-block of 32: four 3-bit high index bits, a 3-bit scale, the sign of
// the delta). Grid values are -1, 0, 1. x = d * (2 s + 1) * (grid +- 1/8).
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let ib = i >> 5u;
    let l = (i >> 3u) & 3u;
    let h = (i >> 2u) & 1u;
    let qh = ld16(b + 34u + 2u * ib);
    let dl = f16at(b) * f32(2u * ((qh >> 12u) & 7u) + 1u);
    let delta = select(0.125, -0.125, (qh & 0x8000u) != 0u);
    let idx = ld8(b + 2u + 4u * ib + l) | (((qh >> (3u * l)) & 7u) << 8u);
    return dl * (sbytes4(GRID[2u * idx + h]) + delta);
}
#endif

#if T_IQ1_M
// qs: [u8; 32] at 0 (grid index low bits), qh: [u8; 16] at 32 (per 8
// weights a nibble: 3 high index bits, the sign of the delta), scales:
// [u16; 4] at 48 (3-bit scales per 16 weights; their top nibbles hold the
// block's f16 scale). x = d * (2 s + 1) * (grid +- 1/8).
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let ib = i >> 5u;
    let l = (i >> 3u) & 3u;
    let h = (i >> 2u) & 1u;
    let s0 = ld32(b + 48u);
    let s1 = ld32(b + 52u);
    let d = half_to_f32(((s0 >> 12u) & 0xfu) | ((s0 >> 24u) & 0xf0u) | ((s1 >> 4u) & 0xf00u) | ((s1 >> 16u) & 0xf000u));
    let sc = ld16(b + 48u + 2u * (ib >> 1u));
    let dl = d * f32(2u * ((sc >> (6u * (ib & 1u) + 3u * (l >> 1u))) & 7u) + 1u);
    let qh = ld8(b + 32u + 2u * ib + (l >> 1u)) >> (4u * (l & 1u));
    let delta = select(0.125, -0.125, (qh & 8u) != 0u);
    let idx = ld8(b + 4u * ib + l) | ((qh & 7u) << 8u);
    return dl * (sbytes4(GRID[2u * idx + h]) + delta);
}
#endif

#if T_NVFP4
// d: [u8; 4] (UE4M3, one per 16 weights), qs: [u8; 32] at 4; sub-block s
// packs weights j and j + 8 into the low and high nibbles of byte 8 s + j.
// x = kv[q] * ue4m3(d) (doubled grid, halved scale).
fn deq4(b: u32, i: u32) -> vec4<f32> {
    let s = i >> 4u;
    let j = i & 15u;
    let e = ld8(b + s);
    // ggml_ue4m3_to_fp32: bit 7 ignored; 0 and 0x7f (NaN) read as zero;
    // exponent field 0 is subnormal (m * 2^-9), else (1 + m/8) * 2^(e-7);
    // then halved. Every value is exact in f32.
    let ex = (e >> 3u) & 0xfu;
    let m = e & 7u;
    var d = bitcast<f32>(((ex + 119u) << 23u) | (m << 20u));
    if (ex == 0u) {
        d = f32(m) * (1.0 / 1024.0);
    }
    if (e == 0x7fu) {
        d = 0.0;
    }
    let q = nibs4(ld32(b + 4u + 8u * s + (j & 7u)), 4u * (j >> 3u));
    return d * kv_mxfp4(q);
}
#endif
