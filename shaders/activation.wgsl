// The activations of ggml's unary ops on one value (a part that kernels
// include before their own source): sigmoid 1 / (1 + exp(-v)), (SOFTPLUS)
// softplus v > 20 ? v : log(1 + exp(v)), (SILU) silu v / (1 + exp(-v)).
// exp's argument is capped (at 88, and at softplus's threshold 20) so no
// infinity is ever computed, which WGSL lets an implementation assume; the
// cap changes only results below 1e-38 * max(1, |v|) in magnitude.

fn activation(v: f32) -> f32 {
#if SOFTPLUS
    return select(log(1.0 + exp(min(v, 20.0))), v, v > 20.0);
#else
    let e = exp(min(-v, 88.0));
#if SILU
    return v / (1.0 + e);
#else
    return 1.0 / (1.0 + e);
#endif
#endif
}
