// MUL_MAT_ID with the expert ids where the device router left them
// (route.wgsl), for decode-sized batches: one work item per (token, expert)
// pair, in pair order, through matvec.wgsl (prepended to it in place of
// mul_mat_id.wgsl when MUL_MAT_ID = 1). Nothing is grouped by expert: a
// pair's workgroup dequantises its expert's rows for that pair alone.
//   IDS:  the route's ids, [t, n_used] u32 (global expert ids);
//   PART: (first expert of this weight part, experts in it, n_used,
//          x_per_tok); a pair whose expert is in another part computes
//          nothing here.

@group(0) @binding(3) var<storage, read> IDS: array<u32>;
@group(0) @binding(4) var<storage, read> PART: array<vec4<u32>>;

struct Job {
    wbase: u32,
    tok0: u32,
    ntok: u32,
}

fn id_job(item: u32, expert_stride: u32) -> Job {
    let part = PART[0];
    let e = IDS[item];
    if (e < part.x || e >= part.x + part.y) {
        return Job(0u, item, 0u);
    }
    return Job((e - part.x) * expert_stride, item, 1u);
}

// Input row of x for pair `c`: its token's row, or its own of the token's
// x_per_tok rows.
fn xrow(c: u32) -> u32 {
    let part = PART[0];
    return (c / part.z) * part.w + (c % part.z) % part.w;
}

// Output row of y for pair `c`: pair order.
fn yrow(c: u32) -> u32 {
    return c;
}
