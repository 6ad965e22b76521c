//! What a MoE router computes, as an op's parameters: the model's router
//! (`crate::model::blocks::router`) runs it on the host, a backend that
//! routes on its device ([`crate::backend::Backend::route_on_device`]) runs
//! the same steps there.

/// How the router's logits become expert scores (llama.cpp's
/// `llama_expert_gating_func_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    /// softmax over all experts, then top-k of the probabilities.
    Softmax,
    /// top-k of the raw logits, then softmax over the chosen ones (gpt-oss).
    SoftmaxWeight,
    /// sigmoid of each logit (DeepSeek-V3, GLM-4.5, Laguna).
    Sigmoid,
}

/// A router's choices, all from metadata or the architecture.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    pub scoring: Scoring,
    pub n_expert: usize,
    pub n_used: usize,
    /// Renormalise the chosen experts' weights to sum to one.
    pub norm: bool,
    /// Multiplies the weights (`expert_weights_scale`; 0 and 1: none).
    pub scale: f32,
    /// Expert groups (`expert_group_count`; 1: no grouping) and how many of
    /// them a token may choose from (`expert_group_used_count`).
    pub n_group: usize,
    pub n_group_used: usize,
}

/// A route kept on the device: expert ids `[t, n_used]` (u32 values in a
/// tensor's storage) and their weights `[t, n_used]`.
pub struct DeviceRoute<T> {
    pub ids: T,
    pub weights: T,
    pub n_tok: usize,
    pub n_used: usize,
}
