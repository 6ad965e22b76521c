//! The MoE router, as llama.cpp's `build_moe_ffn` gates: score every expert
//! (softmax, sigmoid, or the raw logits for gpt-oss's softmax over the
//! chosen), add a selection bias for choosing only, keep the best groups
//! (group-limited top-k), take the top k, then weigh the chosen by their
//! unbiased scores, renormalised and scaled as the model says.

use crate::backend::{Backend, DeviceRoute};
use crate::model::ModelError;

pub use crate::backend::routing::{Routing, Scoring};

/// A MoE layer's router weights.
pub struct Router<W> {
    pub w: W,
    /// Added to the logits (gpt-oss).
    pub bias: Option<W>,
    /// Added to the scores for choosing only (`exp_probs_b`, DeepSeek-V3's
    /// `e_score_correction_bias`); the weights use the unbiased scores.
    pub select_bias: Option<Vec<f32>>,
    pub routing: Routing,
}

impl<W> Router<W> {
    /// The router logits of `x`, on the host.
    pub fn logits<B: Backend<Weight = W>>(
        &self,
        b: &B,
        x: &B::Tensor,
    ) -> Result<Vec<f32>, ModelError> {
        Ok(b.to_host(&self.logits_on(b, x)?)?)
    }

    /// The router logits of `x` `[t, n_expert]`, where `b` computes.
    pub fn logits_on<B: Backend<Weight = W>>(
        &self,
        b: &B,
        x: &B::Tensor,
    ) -> Result<B::Tensor, ModelError> {
        let mut logits = b.matmul(&self.w, x)?;
        if let Some(rb) = &self.bias {
            b.add_bias(&mut logits, rb)?;
        }
        Ok(logits)
    }

    /// Routes `logits` on `b`'s device when it can ([`Backend::route_on_device`]).
    pub fn route_on<B: Backend<Weight = W>>(
        &self,
        b: &B,
        logits: &B::Tensor,
    ) -> Result<Option<DeviceRoute<B::Tensor>>, ModelError> {
        Ok(b.route_on_device(logits, &self.routing, self.select_bias.as_deref())?)
    }

    /// Expert ids `[t, n_used]` and weights for the rows of `logits`.
    pub fn route(&self, logits: &[f32]) -> (Vec<u32>, Vec<f32>) {
        route(logits, &self.routing, self.select_bias.as_deref())
    }
}

/// ggml's soft_max over one row: f32 max, f64 sum, scale by 1/sum.
fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// Top-k indices by descending value (ties: lower index first).
fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Keeps the `n_used` groups whose two best scores sum highest; the
/// experts of the other groups get -inf (DeepSeek-V3's group-limited top-k).
fn keep_best_groups(sel: &mut [f32], n_group: usize, n_used: usize) {
    let per = sel.len() / n_group;
    let score: Vec<f32> = sel
        .chunks(per)
        .map(|g| top_k(g, 2).iter().map(|&i| g[i as usize]).sum())
        .collect();
    let keep = top_k(&score, n_used);
    for (gi, g) in sel.chunks_mut(per).enumerate() {
        if !keep.contains(&(gi as u32)) {
            g.fill(f32::NEG_INFINITY);
        }
    }
}

/// Routes tokens: expert ids `[t, n_used]` and their weights.
pub fn route(logits: &[f32], r: &Routing, select_bias: Option<&[f32]>) -> (Vec<u32>, Vec<f32>) {
    let n = r.n_expert;
    let mut ids = Vec::with_capacity(logits.len() / n * r.n_used);
    let mut weights = Vec::with_capacity(ids.capacity());
    for row in logits.chunks(n) {
        let mut probs = row.to_vec();
        match r.scoring {
            Scoring::Softmax => softmax(&mut probs),
            Scoring::Sigmoid => probs
                .iter_mut()
                .for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
            Scoring::SoftmaxWeight => {}
        }
        let mut sel = probs.clone();
        if let Some(bias) = select_bias {
            sel.iter_mut().zip(bias).for_each(|(s, b)| *s += b);
        }
        if r.n_group > 1 {
            keep_best_groups(&mut sel, r.n_group, r.n_group_used);
        }
        let chosen = top_k(&sel, r.n_used);
        let mut w: Vec<f32> = chosen.iter().map(|&e| probs[e as usize]).collect();
        if r.scoring == Scoring::SoftmaxWeight {
            softmax(&mut w);
        }
        if r.norm {
            // ggml's sum_rows adds in f64; the sum is clamped to f16's
            // smallest normal so that it never divides by zero.
            let sum = w.iter().map(|&v| v as f64).sum::<f64>() as f32;
            let sum = sum.max(6.103_515_6e-5);
            w.iter_mut().for_each(|v| *v /= sum);
        }
        if r.scale != 0.0 && r.scale != 1.0 {
            w.iter_mut().for_each(|v| *v *= r.scale);
        }
        ids.extend(chosen);
        weights.extend(w);
    }
    (ids, weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routing(scoring: Scoring, n_expert: usize, n_used: usize, norm: bool) -> Routing {
        Routing {
            scoring,
            n_expert,
            n_used,
            norm,
            scale: 0.0,
            n_group: 1,
            n_group_used: 1,
        }
    }

    #[test]
    fn softmax_routing_normalises_top_k() {
        let logits = [0.1f32, 2.0, -1.0, 1.5];
        let (ids, w) = route(&logits, &routing(Scoring::Softmax, 4, 2, true), None);
        assert_eq!(ids, vec![1, 3]);
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let e = [2.0f32.exp(), 1.5f32.exp()];
        assert!((w[0] - e[0] / (e[0] + e[1])).abs() < 1e-6);
    }

    #[test]
    fn softmax_weight_routing_softmaxes_chosen_logits() {
        let logits = [3.0f32, 0.0, 1.0, 2.0];
        let (ids, w) = route(&logits, &routing(Scoring::SoftmaxWeight, 4, 2, false), None);
        assert_eq!(ids, vec![0, 3]);
        let d = 1.0 + (-1.0f32).exp();
        assert!((w[0] - 1.0 / d).abs() < 1e-6);
    }

    #[test]
    fn unnormalised_routing_keeps_probabilities_and_ties_prefer_lower_ids() {
        let logits = [1.0f32, 1.0, 1.0, 1.0];
        let (ids, w) = route(&logits, &routing(Scoring::Softmax, 4, 2, false), None);
        assert_eq!(ids, vec![0, 1]);
        assert!((w[0] - 0.25).abs() < 1e-6);
    }

    #[test]
    fn selection_bias_chooses_but_does_not_weigh() {
        // Sigmoid scores; the bias lifts expert 0 into the top 2, but its
        // weight is its own unbiased score.
        let logits = [-1.0f32, 2.0, 1.0, 0.5];
        let bias = [3.0f32, 0.0, 0.0, 0.0];
        let mut r = routing(Scoring::Sigmoid, 4, 2, false);
        r.scale = 2.5;
        let (ids, w) = route(&logits, &r, Some(&bias));
        assert_eq!(ids, vec![0, 1]);
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        assert_eq!(w, vec![sig(-1.0) * 2.5, sig(2.0) * 2.5]);
    }

    #[test]
    fn group_limited_top_k_masks_groups_by_their_two_best() {
        // Groups of 2: {0,1} scores 0.9+0.0, {2,3} 0.5+0.5, {4,5} 0.8+0.3.
        // The best two groups are {2,3} (1.0) and {4,5} (1.1): expert 0, the
        // single best, is out.
        let logits = [0.9f32, 0.0, 0.5, 0.5, 0.8, 0.3];
        let mut r = routing(Scoring::SoftmaxWeight, 6, 2, false);
        r.n_group = 3;
        r.n_group_used = 2;
        let (ids, _) = route(&logits, &r, None);
        assert_eq!(ids, vec![4, 2]);
    }
}
