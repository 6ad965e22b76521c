// MUL_MAT_ID over used experts only, shared by the mat-vec and the tiled
// kernels (prepended to matvec.wgsl / matmul.wgsl when MUL_MAT_ID = 1).
//
// Expert ids live on the host (routing syncs at every MoE layer), so the host
// groups the (token, expert) pairs by expert and uploads:
//   TOKS:  every expert's pairs back to back as (input row of x, output row of y);
//   ITEMS: work items (expert index inside the weight part, first pair in TOKS,
//          pair count, 0), a count of at most one token tile (or MV_TOK pairs).
// A dispatch runs one workgroup per (work item, row block), so experts without
// tokens cost nothing.

@group(0) @binding(3) var<storage, read> TOKS: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> ITEMS: array<vec4<u32>>;

// One workgroup's share of a MUL_MAT_ID: weight bytes of its expert, its pairs.
struct Job {
    wbase: u32,
    tok0: u32,
    ntok: u32,
}

fn id_job(item: u32, expert_stride: u32) -> Job {
    let it = ITEMS[item];
    return Job(it.x * expert_stride, it.y, it.z);
}

// Input row of x for pair `c` (an index into TOKS).
fn xrow(c: u32) -> u32 {
    return TOKS[c].x;
}

// Output row of y for pair `c`.
fn yrow(c: u32) -> u32 {
    return TOKS[c].y;
}
