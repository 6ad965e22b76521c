//! Rotary-embedding angles shared by both placements: ggml's
//! `rope_yarn_corr_dims` and `ggml_rope_cache_init` in f32, so the CPU and
//! the GPU (which receives the table) rotate by identical angles.

use super::RopeParams;

/// ggml's YaRN correction dims for `n_dims` rotated dims.
pub(crate) fn yarn_corr_dims(
    n_dims: usize,
    n_ctx_orig: u32,
    base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    let corr_dim = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let start = corr_dim(beta_fast).floor();
    let end = corr_dim(beta_slow).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

/// `(cos, sin)` for each rotated pair at one position, as ggml_rope_cache_init.
pub(crate) fn rope_cache(p: &RopeParams, pos: f32, corr: [f32; 2], cache: &mut [(f32, f32)]) {
    let theta_scale = p.freq_base.powf(-2.0 / p.n_rot as f32);
    let mut theta = pos;
    for (i, c) in cache.iter_mut().enumerate() {
        let i0 = 2 * i;
        let theta_interp = p.freq_scale * theta;
        let mut th = theta_interp;
        let mut mscale = p.attn_factor;
        if p.ext_factor != 0.0 {
            let y = ((i0 / 2) as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
            let ramp = 1.0 - y.clamp(0.0, 1.0);
            let mix = ramp * p.ext_factor;
            // As GCC contracts ggml's rope_yarn.
            th = theta_interp.mul_add(1.0 - mix, theta * mix);
            mscale *= (1.0 / p.freq_scale).ln().mul_add(0.1, 1.0);
        }
        *c = (th.cos() * mscale, th.sin() * mscale);
        theta *= theta_scale;
    }
}
