// ggml's ssm_conv for one sequence: a causal convolution of `d_conv` taps
// per channel over `in`, the state's d_conv - 1 rows followed by the
// sequence's rows x[r0..r0 + n]. Output row t, channel c:
// y[r0 + t, c] = sum_{j < d_conv} w[c, j] * in[t + j, c], summed in order
// in f32; afterwards the state holds the last d_conv - 1 rows of `in`.
// One thread per channel of this part of the weight (channels c0..c0 +
// count, `w` holding their rows of d_conv taps), looping over the tokens:
// only that thread reads and then rewrites its channel of the state.

struct Params {
    r0: u32,
    n: u32,
    cols: u32,
    d_conv: u32,
    c0: u32,
    count: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

// Row r of `in`, channel c.
fn input(r: u32, c: u32) -> f32 {
    let d1 = p.d_conv - 1u;
    if (r < d1) {
        return state[r * p.cols + c];
    }
    return x[(p.r0 + r - d1) * p.cols + c];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * nwg.x) * 256u + lid;
    if (i >= p.count) {
        return;
    }
    let c = p.c0 + i;
    for (var t = 0u; t < p.n; t++) {
        var sum = 0.0;
        for (var j = 0u; j < p.d_conv; j++) {
            sum += input(t + j, c) * w[i * p.d_conv + j];
        }
        y[(p.r0 + t) * p.cols + c] = sum;
    }
    // Rows n.. of `in`: in ascending order each state row is read (row
    // n + r, n >= 1) before it is overwritten.
    for (var r = 0u; r + 1u < p.d_conv; r++) {
        state[r * p.cols + c] = input(p.n + r, c);
    }
}
