// Parameters and activation bindings shared by the quantised product
// kernels (matvec.wgsl, matmul.wgsl, with or without MUL_MAT_ID): the
// weight part is binding 0 (quant.wgsl), X binding 1, Y binding 2; with
// MUL_MAT_ID the pair and work-item lists are bindings 3 and 4
// (mul_mat_id.wgsl), which also defines xrow / yrow.

struct Params {
    k: u32,
    n: u32,
    row0: u32,
    rows: u32,
    row_bytes: u32,
    ntok: u32,
    expert_stride: u32,
    item0: u32,
    n_items: u32,
    blocks: u32,
    tok_tiles: u32,
}

@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
#if MUL_MAT_ID
@group(0) @binding(5) var<uniform> p: Params;
#else
@group(0) @binding(3) var<uniform> p: Params;

fn xrow(c: u32) -> u32 {
    return c;
}

fn yrow(c: u32) -> u32 {
    return c;
}
#endif
