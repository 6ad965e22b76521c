// RMS norm over groups of `group` values (a whole row, or one head for
// QK-norm): y = x / sqrt(mean(x^2) + eps) * w. One workgroup per group.
// L2: the weight is one constant, `post`, for every column (gated DeltaNet's
// L2 norm: eps / group for eps and 1 / sqrt(group) for post give
// x / sqrt(sum(x^2) + eps) in llama.cpp's steps).

struct Params {
    group: u32,
    n_groups: u32,
    eps: f32,
    post: f32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
#if L2
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
#else
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
#endif

var<workgroup> partial: array<f32, WG>;

fn weight(i: u32) -> f32 {
#if L2
    return p.post;
#else
    return w[i];
#endif
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wg.x + wg.y * nwg.x;
    if (g >= p.n_groups) {
        return;
    }
    let base = g * p.group;
    var s = 0.0;
    for (var i = lid; i < p.group; i += WG) {
        let v = x[base + i];
        s += v * v;
    }
    partial[lid] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(partial[0] / f32(p.group) + p.eps);
    for (var i = lid; i < p.group; i += WG) {
        y[base + i] = (x[base + i] * scale) * weight(i);
    }
}
