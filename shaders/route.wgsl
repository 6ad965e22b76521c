// MoE routing on the device, the steps of the CPU's router
// (src/model/blocks/router.rs, llama.cpp's build_moe_ffn gating) for one
// token per invocation: score every expert (softmax, sigmoid, or the raw
// logits), add the selection bias for choosing only, keep the best groups,
// take the top n_used (ties: the lower expert id, as the CPU's sort), then
// weigh the chosen by their unbiased scores, renormalised and scaled.
// Writes the ids as u32 and the weights; PROBS and SEL are scratch rows.

struct Params {
    n_tok: u32,
    n_expert: u32,
    n_used: u32,
    // 0 softmax, 1 softmax over the chosen logits (gpt-oss), 2 sigmoid.
    scoring: u32,
    norm: u32,
    // f32 bits; 0 and 1 leave the weights as they are.
    scale: u32,
    n_group: u32,
    n_group_used: u32,
    has_bias: u32,
}

@group(0) @binding(0) var<storage, read> LOGITS: array<f32>;
@group(0) @binding(1) var<storage, read> BIAS: array<f32>;
@group(0) @binding(2) var<storage, read_write> PROBS: array<f32>;
@group(0) @binding(3) var<storage, read_write> SEL: array<f32>;
@group(0) @binding(4) var<storage, read_write> IDS: array<u32>;
@group(0) @binding(5) var<storage, read_write> WEIGHTS: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;

// The CPU masks with -inf; the lowest finite f32 orders the same against
// every real score (WGSL has no infinite constant).
const LOWEST: f32 = -3.40282347e38;
// Most expert groups (the host checks).
const MAX_GROUPS: u32 = 64u;

// Whether expert `e` is among the first `j` chosen of token `t`.
fn taken(t: u32, j: u32, e: u32) -> bool {
    for (var i = 0u; i < j; i++) {
        if (IDS[t * p.n_used + i] == e) {
            return true;
        }
    }
    return false;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    if (t >= p.n_tok) {
        return;
    }
    let n = p.n_expert;
    let row = t * n;
    // Scores.
    if (p.scoring == 0u) {
        var mx = LOGITS[row];
        for (var e = 1u; e < n; e++) {
            mx = max(mx, LOGITS[row + e]);
        }
        var sum = 0.0;
        for (var e = 0u; e < n; e++) {
            let v = exp(LOGITS[row + e] - mx);
            PROBS[row + e] = v;
            sum += v;
        }
        let inv = 1.0 / sum;
        for (var e = 0u; e < n; e++) {
            PROBS[row + e] *= inv;
        }
    } else if (p.scoring == 2u) {
        for (var e = 0u; e < n; e++) {
            PROBS[row + e] = 1.0 / (1.0 + exp(-LOGITS[row + e]));
        }
    } else {
        for (var e = 0u; e < n; e++) {
            PROBS[row + e] = LOGITS[row + e];
        }
    }
    // Selection scores.
    for (var e = 0u; e < n; e++) {
        var s = PROBS[row + e];
        if (p.has_bias != 0u) {
            s += BIAS[e];
        }
        SEL[row + e] = s;
    }
    // Group-limited top-k: the groups whose two best scores sum highest
    // (ties: the lower group), ranked before any is masked.
    if (p.n_group > 1u) {
        let per = n / p.n_group;
        var out: array<bool, MAX_GROUPS>;
        for (var g = 0u; g < p.n_group; g++) {
            let sg = group_score(row, g, per);
            var rank = 0u;
            for (var h = 0u; h < p.n_group; h++) {
                let sh = group_score(row, h, per);
                if (sh > sg || (sh == sg && h < g)) {
                    rank++;
                }
            }
            out[g] = rank >= p.n_group_used;
        }
        for (var g = 0u; g < p.n_group; g++) {
            if (out[g]) {
                for (var i = 0u; i < per; i++) {
                    SEL[row + g * per + i] = LOWEST;
                }
            }
        }
    }
    // Top n_used, in descending order, lower ids first on ties.
    for (var j = 0u; j < p.n_used; j++) {
        var best = 0xffffffffu;
        var bv = LOWEST;
        for (var e = 0u; e < n; e++) {
            let v = SEL[row + e];
            if ((best == 0xffffffffu || v > bv) && !taken(t, j, e)) {
                best = e;
                bv = v;
            }
        }
        IDS[t * p.n_used + j] = best;
    }
    // Weights of the chosen.
    let o = t * p.n_used;
    for (var j = 0u; j < p.n_used; j++) {
        WEIGHTS[o + j] = PROBS[row + IDS[o + j]];
    }
    if (p.scoring == 1u) {
        var mx = WEIGHTS[o];
        for (var j = 1u; j < p.n_used; j++) {
            mx = max(mx, WEIGHTS[o + j]);
        }
        var sum = 0.0;
        for (var j = 0u; j < p.n_used; j++) {
            let v = exp(WEIGHTS[o + j] - mx);
            WEIGHTS[o + j] = v;
            sum += v;
        }
        let inv = 1.0 / sum;
        for (var j = 0u; j < p.n_used; j++) {
            WEIGHTS[o + j] *= inv;
        }
    }
    if (p.norm != 0u) {
        var sum = 0.0;
        for (var j = 0u; j < p.n_used; j++) {
            sum += WEIGHTS[o + j];
        }
        // f16's smallest normal, as the CPU clamps it.
        sum = max(sum, 6.1035156e-5);
        for (var j = 0u; j < p.n_used; j++) {
            WEIGHTS[o + j] /= sum;
        }
    }
    let scale = bitcast<f32>(p.scale);
    if (scale != 0.0 && scale != 1.0) {
        for (var j = 0u; j < p.n_used; j++) {
            WEIGHTS[o + j] *= scale;
        }
    }
}

// The sum of the two best selection scores of group `g` (the CPU's top_k
// of 2: the best, then the best of the rest by lower index on ties).
fn group_score(row: u32, g: u32, per: u32) -> f32 {
    let base = row + g * per;
    var b0 = 0u;
    for (var i = 1u; i < per; i++) {
        if (SEL[base + i] > SEL[base + b0]) {
            b0 = i;
        }
    }
    if (per < 2u) {
        return SEL[base + b0];
    }
    var b1 = 0xffffffffu;
    for (var i = 0u; i < per; i++) {
        if (i != b0 && (b1 == 0xffffffffu || SEL[base + i] > SEL[base + b1])) {
            b1 = i;
        }
    }
    return SEL[base + b0] + SEL[base + b1];
}
