//! Token sampling from logits, in the order of llama.cpp's default sampler
//! chain: logit bias -> penalties (repeat, frequency, presence) -> top-k ->
//! top-p -> min-p -> temperature -> draw from the softmax. Top-p and min-p
//! therefore see the un-tempered distribution, as in llama.cpp. `temp <= 0`
//! is greedy: the arg-max of the biased and penalised logits, lowest id on
//! ties.
//!
//! On request, [`Sampler::sample_with_probs`] also reports the sampled
//! token's probability and the most likely tokens, as llama-server's
//! `n_probs` does: from the raw logits of the position (a log-softmax over
//! the whole vocabulary), or after the sampling chain (`post_sampling`).
//!
//! Draws use a xoshiro256** generator seeded from `seed` (splitmix64), so the
//! same seed and inputs give the same tokens on every platform. The numbers
//! differ from llama.cpp's `std::mt19937`; only the distribution matches.
//!
//! This module knows nothing about tokenizers or models.

use std::collections::HashMap;

/// Sampling settings; [`Default`] gives llama.cpp's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// Temperature; `<= 0` means greedy.
    pub temp: f32,
    /// Keep the `top_k` most likely tokens; `<= 0` disables.
    pub top_k: i32,
    /// Keep the smallest prefix whose probability reaches `top_p`; `>= 1` disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `<= 0` disables.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens; `1` disables.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at; `0` disables, `-1` means all.
    pub repeat_last_n: i32,
    /// Subtracted from a logit once per occurrence of its token in the
    /// last `repeat_last_n` tokens; `0` disables.
    pub frequency_penalty: f32,
    /// Subtracted from a logit once if its token occurs in the last
    /// `repeat_last_n` tokens; `0` disables.
    pub presence_penalty: f32,
    /// `(token id, bias)` added to the raw logits before every other step
    /// (`-inf` bans the token; a token listed twice gets both). Ids outside
    /// the vocabulary are skipped here and refused by
    /// [`SamplerParams::check_vocab`].
    pub logit_bias: Vec<(u32, f32)>,
    /// PRNG seed; `None` draws one from the clock.
    pub seed: Option<u64>,
}

impl Default for SamplerParams {
    fn default() -> Self {
        Self {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

impl SamplerParams {
    /// Greedy decoding (temperature 0), other settings default.
    pub fn greedy() -> Self {
        Self {
            temp: 0.0,
            ..Self::default()
        }
    }

    /// llama.cpp's `ignore_eos` (`--ignore-eos`, and llama-server's request
    /// field): a `-inf` bias appended for each end-of-generation id in
    /// `eog`, so such a token is never sampled and the best other token is
    /// taken where the model would have ended (`common_init_from_params`
    /// and the server's `ignore_eos` handler append the same bans).
    pub fn ban_eog(&mut self, eog: &[u32]) {
        self.logit_bias
            .extend(eog.iter().map(|&id| (id, f32::NEG_INFINITY)));
    }

    /// The one check of sampling settings, shared by the CLI's flags and
    /// the server's request fields (a value is accepted by one iff by the
    /// other). It follows llama.cpp where llama.cpp gives a value a meaning
    /// (its `common/arg.cpp` flags and llama-server's request schema):
    ///
    /// - `temp`: any finite number; `<= 0` is greedy (llama.cpp clamps a
    ///   negative temperature to 0).
    /// - `top_k`: any integer; `<= 0` disables (llama-server clamps to 0).
    /// - `top_p`, `min_p`: any finite number; values outside `[0, 1]` act
    ///   as the nearest end (llama-server clamps them), so `top_p >= 1` and
    ///   `min_p <= 0` disable.
    /// - `repeat_penalty`: finite, `> 0` and with a finite reciprocal, as
    ///   llama.cpp's `--repeat-penalty` requires; `1` disables.
    /// - `repeat_last_n`: `-1` (the whole context, as llama.cpp used to
    ///   spell it), `0` (off) or a count; below `-1` is refused.
    /// - `frequency_penalty`, `presence_penalty`: any finite number, as
    ///   llama.cpp's `--frequency-penalty` / `--presence-penalty` require
    ///   (negative ones favour repeats); `0` disables.
    /// - `logit_bias`: a finite bias or `-inf` (never); NaN and `+inf`
    ///   (which would leave no distribution) are refused. Ids are checked
    ///   against the vocabulary by [`SamplerParams::check_vocab`].
    ///
    /// NaN and infinities are refused everywhere. The seed is checked where
    /// it is converted, by [`SamplerParams::seed_from_i64`].
    pub fn validate(&self) -> Result<(), SampleParamError> {
        if !self.temp.is_finite() {
            return Err(SampleParamError::Temperature(self.temp));
        }
        if !self.top_p.is_finite() {
            return Err(SampleParamError::TopP(self.top_p));
        }
        if !self.min_p.is_finite() {
            return Err(SampleParamError::MinP(self.min_p));
        }
        let rp = self.repeat_penalty;
        if !(rp.is_finite() && rp > 0.0 && (1.0 / rp).is_finite()) {
            return Err(SampleParamError::RepeatPenalty(rp));
        }
        if self.repeat_last_n < -1 {
            return Err(SampleParamError::RepeatLastN(self.repeat_last_n));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(SampleParamError::FrequencyPenalty(self.frequency_penalty));
        }
        if !self.presence_penalty.is_finite() {
            return Err(SampleParamError::PresencePenalty(self.presence_penalty));
        }
        if let Some(&(id, bias)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| b.is_nan() || *b == f32::INFINITY)
        {
            return Err(SampleParamError::LogitBias { id, bias });
        }
        Ok(())
    }

    /// Refuses a `logit_bias` entry whose token id is not below `n_vocab`
    /// (the model's vocabulary size), which [`SamplerParams::validate`]
    /// cannot know, and a list of more than `n_vocab` entries. Every entry
    /// is applied at every sampling step, as llama.cpp applies its list
    /// (repeats add up), so the bound keeps that work within the step's
    /// own pass over the vocabulary; llama-server takes any number.
    pub fn check_vocab(&self, n_vocab: usize) -> Result<(), SampleParamError> {
        let n = self.logit_bias.len();
        if n > n_vocab {
            return Err(SampleParamError::LogitBiasCount { n, n_vocab });
        }
        match self
            .logit_bias
            .iter()
            .find(|(id, _)| *id as usize >= n_vocab)
        {
            Some(&(id, _)) => Err(SampleParamError::LogitBiasToken { id, n_vocab }),
            None => Ok(()),
        }
    }

    /// A seed as the CLI and the API spell it: `-1` draws one from the
    /// clock (`None`), `0..` is used as given; below `-1` is refused.
    pub fn seed_from_i64(seed: i64) -> Result<Option<u64>, SampleParamError> {
        match seed {
            -1 => Ok(None),
            s => u64::try_from(s)
                .map(Some)
                .map_err(|_| SampleParamError::Seed(seed)),
        }
    }
}

/// A sampling setting [`SamplerParams::validate`] refuses: one variant per
/// field, its message naming the field (as the API spells it) and the
/// values accepted.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SampleParamError {
    #[error("temperature {0} is invalid: give a finite number (0 or less = greedy)")]
    Temperature(f32),
    #[error("top_p {0} is invalid: give a finite number (1 = off; outside [0, 1] acts as the nearest end)")]
    TopP(f32),
    #[error("min_p {0} is invalid: give a finite number (0 = off; outside [0, 1] acts as the nearest end)")]
    MinP(f32),
    #[error("repeat_penalty {0} is invalid: give a finite number > 0 (1 = off)")]
    RepeatPenalty(f32),
    #[error("repeat_last_n {0} is invalid: give -1 (the whole context), 0 (off) or a count")]
    RepeatLastN(i32),
    #[error("seed {0} is invalid: give -1 (random) or a number >= 0")]
    Seed(i64),
    #[error("frequency_penalty {0} is invalid: give a finite number (0 = off)")]
    FrequencyPenalty(f32),
    #[error("presence_penalty {0} is invalid: give a finite number (0 = off)")]
    PresencePenalty(f32),
    #[error("logit_bias of token {id}: {bias} is invalid: give a finite number, or -inf (false in JSON) to ban the token")]
    LogitBias { id: u32, bias: f32 },
    #[error("logit_bias: token id {id} is out of range (the vocabulary has {n_vocab} tokens)")]
    LogitBiasToken { id: u32, n_vocab: usize },
    #[error("logit_bias has {n} entries (a text counts one per token); at most {n_vocab}, the vocabulary's size: give each token once")]
    LogitBiasCount { n: usize, n_vocab: usize },
}

impl SampleParamError {
    /// The request field at fault, as the HTTP API names it.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Temperature(_) => "temperature",
            Self::TopP(_) => "top_p",
            Self::MinP(_) => "min_p",
            Self::RepeatPenalty(_) => "repeat_penalty",
            Self::RepeatLastN(_) => "repeat_last_n",
            Self::Seed(_) => "seed",
            Self::FrequencyPenalty(_) => "frequency_penalty",
            Self::PresencePenalty(_) => "presence_penalty",
            Self::LogitBias { .. } | Self::LogitBiasToken { .. } | Self::LogitBiasCount { .. } => {
                "logit_bias"
            }
        }
    }

    /// The command-line flag at fault, as llama.cpp names it.
    pub fn flag(&self) -> &'static str {
        match self {
            Self::Temperature(_) => "--temp",
            Self::TopP(_) => "--top-p",
            Self::MinP(_) => "--min-p",
            Self::RepeatPenalty(_) => "--repeat-penalty",
            Self::RepeatLastN(_) => "--repeat-last-n",
            Self::Seed(_) => "--seed",
            Self::FrequencyPenalty(_) => "--frequency-penalty",
            Self::PresencePenalty(_) => "--presence-penalty",
            Self::LogitBias { .. } | Self::LogitBiasToken { .. } | Self::LogitBiasCount { .. } => {
                "--logit-bias"
            }
        }
    }
}

/// xoshiro256** (Blackman & Vigna), seeded through splitmix64.
#[derive(Clone, Debug)]
pub struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A seed from the clock and the address space, for `seed: None`.
fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let local = 0u8;
    nanos ^ ((&local as *const u8 as u64).rotate_left(32)) ^ u64::from(std::process::id())
}

/// Which probabilities to report with each sampled token (llama-server's
/// `n_probs` and `post_sampling_probs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbsRequest {
    /// How many of the most likely tokens to list (0: only the sampled one).
    pub n_top: usize,
    /// After the sampling chain (the distribution the token was drawn
    /// from) instead of the raw logits of the position.
    pub post_sampling: bool,
}

/// The probabilities reported for one sampled token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenProbs {
    /// Natural log of the sampled token's probability.
    pub logprob: f32,
    /// Up to `n_top` `(id, logprob)`, most likely first, lowest id first on
    /// ties. After the sampling chain, tokens it removed are not listed.
    pub top: Vec<(u32, f32)>,
}

/// One candidate: token id and its (possibly adjusted) logit.
/// What the chain leaves before the draw.
enum Chain {
    Greedy(u32, Vec<Cand>),
    Draw(Vec<Cand>),
}

#[derive(Clone, Copy, Debug)]
struct Cand {
    id: u32,
    logit: f32,
}

/// Samples token ids from logits.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplerParams,
    rng: Xoshiro256,
    seed: u64,
    cands: Vec<Cand>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Self {
        let seed = params.seed.unwrap_or_else(random_seed);
        Self {
            params,
            rng: Xoshiro256::new(seed),
            seed,
            cands: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// The seed in use (drawn from the clock when none was given).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Picks the next token. `logits` has one entry per vocabulary id;
    /// `history` is the tokens so far (prompt and generated), newest last.
    /// NaN logits count as impossible. Empty `logits` give id 0.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        self.sample_inner(logits, history, false).0
    }

    /// [`Sampler::sample`], and the probabilities `want` asks for. Costs
    /// nothing more than `sample` when `want` is `None`.
    pub fn sample_with_probs(
        &mut self,
        logits: &[f32],
        history: &[u32],
        want: Option<ProbsRequest>,
    ) -> (u32, Option<TokenProbs>) {
        match want {
            None => (self.sample(logits, history), None),
            Some(w) if !w.post_sampling => {
                let id = self.sample(logits, history);
                (id, Some(raw_probs(logits, id, w.n_top)))
            }
            Some(w) => {
                let (id, cands) = self.sample_inner(logits, history, true);
                (id, Some(post_probs(&cands, id, w.n_top)))
            }
        }
    }

    /// The chain. With `keep`, it also returns the candidates that the final
    /// draw chose from, best first, their logits tempered (greedy: the
    /// chosen token alone).
    fn sample_inner(&mut self, logits: &[f32], history: &[u32], keep: bool) -> (u32, Vec<Cand>) {
        match self.chain(logits, history, keep) {
            Chain::Greedy(id, kept) => (id, kept),
            Chain::Draw(cands) => {
                let id = self.draw(&cands);
                let kept = if keep { cands.clone() } else { Vec::new() };
                self.cands = cands;
                (id, kept)
            }
        }
    }

    /// Everything but the draw: the greedy choice (with `keep`, as the one
    /// candidate left), or the tempered candidates to draw from, best first.
    fn chain(&mut self, logits: &[f32], history: &[u32], keep: bool) -> Chain {
        let one = |id: u32| {
            let kept = if keep {
                vec![Cand { id, logit: 0.0 }]
            } else {
                Vec::new()
            };
            Chain::Greedy(id, kept)
        };
        if logits.is_empty() {
            return Chain::Greedy(0, Vec::new());
        }
        let p = &self.params;
        if p.temp <= 0.0 && !self.penalises(history) && p.logit_bias.is_empty() {
            // Greedy without penalties: the candidates' argmax, read straight
            // from the logits (NaN counts as -inf, the lowest id wins a tie).
            let mut best = (0, f32::NEG_INFINITY);
            for (i, &l) in logits.iter().enumerate() {
                let l = if l.is_nan() { f32::NEG_INFINITY } else { l };
                if l > best.1 {
                    best = (i, l);
                }
            }
            return one(best.0 as u32);
        }
        let mut cands = std::mem::take(&mut self.cands);
        cands.clear();
        cands.extend(logits.iter().enumerate().map(|(i, &l)| Cand {
            id: i as u32,
            logit: if l.is_nan() { f32::NEG_INFINITY } else { l },
        }));
        apply_logit_bias(&mut cands, &self.params.logit_bias);
        self.apply_penalties(&mut cands, history);
        if self.params.temp <= 0.0 {
            let id = argmax(&cands);
            self.cands = cands;
            return one(id);
        }
        top_k(&mut cands, self.params.top_k);
        top_p(&mut cands, self.params.top_p);
        min_p(&mut cands, self.params.min_p);
        let inv_t = 1.0 / self.params.temp;
        for c in cands.iter_mut() {
            c.logit *= inv_t;
        }
        Chain::Draw(cands)
    }

    /// The distribution [`Sampler::sample`] draws from for these logits and
    /// history: `(id, probability)` for every token it can pick, best
    /// first; greedy gives its choice with probability 1.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Vec<(u32, f64)> {
        match self.chain(logits, history, false) {
            Chain::Greedy(id, _) => vec![(id, 1.0)],
            Chain::Draw(cands) => {
                // Best first (top-k sorts); a -inf best leaves the argmax.
                let out = if cands[0].logit.is_finite() {
                    cands.iter().map(|c| c.id).zip(probs(&cands)).collect()
                } else {
                    vec![(argmax(&cands), 1.0)]
                };
                self.cands = cands;
                out
            }
        }
    }

    /// Speculative verification of a drafted token (the rule of Leviathan
    /// et al. and Chen et al., 2023): with `p` the distribution
    /// [`Sampler::sample`] would draw from here and `q` the drafter's,
    /// `draft` is accepted with probability `min(1, p(draft) / q(draft))`;
    /// otherwise the token is drawn from the residual `max(0, p - q)`,
    /// normalised. The returned token is then distributed exactly as `p`,
    /// whatever `q` is. `q` lists `(id, probability)`; a deterministic
    /// drafter (every n-gram drafter) passes `[(draft, 1.0)]`. Returns the
    /// token and whether it is the draft. Greedy accepts exactly when the
    /// draft is its choice and draws nothing.
    pub fn verify(
        &mut self,
        logits: &[f32],
        history: &[u32],
        draft: u32,
        q: &[(u32, f64)],
    ) -> (u32, bool) {
        let p = self.distribution(logits, history);
        let prob =
            |d: &[(u32, f64)], id: u32| d.iter().find(|(t, _)| *t == id).map_or(0.0, |(_, w)| *w);
        let (pd, qd) = (prob(&p, draft), prob(q, draft));
        if pd > 0.0 && (pd >= qd || self.rng.next_f64() * qd < pd) {
            return (draft, true);
        }
        let residual: Vec<(u32, f64)> = p
            .iter()
            .map(|&(id, w)| (id, (w - prob(q, id)).max(0.0)))
            .filter(|&(_, w)| w > 0.0)
            .collect();
        if let [(id, _)] = residual[..] {
            return (id, false);
        }
        if residual.is_empty() {
            // p <= q everywhere yet the draft was refused: only rounding
            // gets here; fall back to a draw from p itself.
            return (self.draw_weighted(&p), false);
        }
        (self.draw_weighted(&residual), false)
    }

    /// One draw from `(id, weight)` pairs (weights need not sum to 1).
    fn draw_weighted(&mut self, w: &[(u32, f64)]) -> u32 {
        let total: f64 = w.iter().map(|(_, x)| x).sum();
        let mut u = self.rng.next_f64() * total;
        for &(id, x) in w {
            if u < x {
                return id;
            }
            u -= x;
        }
        // Rounding left `u` past the end: the last candidate with weight.
        w.iter()
            .rev()
            .find(|(_, x)| *x > 0.0)
            .map_or(0, |(id, _)| *id)
    }

    /// Whether the penalties change anything for `history` (llama.cpp's
    /// penalties sampler is off when `repeat_last_n` is 0 or every
    /// penalty is neutral).
    fn penalises(&self, history: &[u32]) -> bool {
        let p = &self.params;
        let neutral =
            p.repeat_penalty == 1.0 && p.frequency_penalty == 0.0 && p.presence_penalty == 0.0;
        !(neutral || p.repeat_last_n == 0 || history.is_empty())
    }

    /// llama.cpp's penalties over the last `repeat_last_n` tokens: for each
    /// token seen `count > 0` times there, the logit is divided by
    /// `repeat_penalty` (multiplied when `<= 0`), then
    /// `count * frequency_penalty + presence_penalty` is subtracted.
    fn apply_penalties(&self, cands: &mut [Cand], history: &[u32]) {
        let p = &self.params;
        if !self.penalises(history) {
            return;
        }
        let n = if p.repeat_last_n < 0 {
            history.len()
        } else {
            (p.repeat_last_n as usize).min(history.len())
        };
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &id in &history[history.len() - n..] {
            *counts.entry(id).or_default() += 1;
        }
        for (id, count) in counts {
            if let Some(c) = cands.get_mut(id as usize) {
                if c.logit <= 0.0 {
                    c.logit *= p.repeat_penalty;
                } else {
                    c.logit /= p.repeat_penalty;
                }
                c.logit -= count as f32 * p.frequency_penalty + p.presence_penalty;
            }
        }
    }
    /// Softmax over the candidates and one draw.
    fn draw(&mut self, cands: &[Cand]) -> u32 {
        let max = cands
            .iter()
            .map(|c| c.logit)
            .fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return argmax(cands);
        }
        let weights: Vec<(u32, f64)> = cands
            .iter()
            .map(|c| (c.id, f64::from(c.logit - max).exp()))
            .collect();
        self.draw_weighted(&weights)
    }
}

/// llama.cpp's logit bias: each `(id, bias)` adds `bias` to that token's
/// logit (candidates are still in id order here).
fn apply_logit_bias(cands: &mut [Cand], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(c) = cands.get_mut(id as usize) {
            c.logit += b;
        }
    }
}

/// Probabilities from the raw logits: a log-softmax over the vocabulary
/// (NaN as `-inf`), computed in f64, as llama-server's `n_probs` reports
/// them. `id` is the sampled token.
fn raw_probs(logits: &[f32], id: u32, n_top: usize) -> TokenProbs {
    let clean = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { l };
    let max = logits
        .iter()
        .map(|&l| clean(l))
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .map(|&l| (f64::from(clean(l)) - f64::from(max)).exp())
        .sum();
    let lse = f64::from(max) + sum.ln();
    let logprob = |l: f32| (f64::from(clean(l)) - lse) as f32;
    let n_top = n_top.min(logits.len());
    let mut top: Vec<Cand> = Vec::new();
    if n_top > 0 {
        top = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Cand {
                id: i as u32,
                logit: clean(l),
            })
            .collect();
        if n_top < top.len() {
            top.select_nth_unstable_by(n_top - 1, by_logit_desc);
            top.truncate(n_top);
        }
        top.sort_unstable_by(by_logit_desc);
    }
    TokenProbs {
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&l| logprob(l)),
        top: top.iter().map(|c| (c.id, logprob(c.logit))).collect(),
    }
}

/// Probabilities after the chain: the softmax of the candidates the token
/// was drawn from (`cands`, best first), dropping those of probability 0.
fn post_probs(cands: &[Cand], id: u32, n_top: usize) -> TokenProbs {
    let p = probs(cands);
    let logprob = cands
        .iter()
        .zip(&p)
        .find(|(c, _)| c.id == id)
        .map_or(f32::NEG_INFINITY, |(_, q)| q.ln() as f32);
    let top = cands
        .iter()
        .zip(&p)
        .take(n_top)
        .take_while(|(_, q)| **q > 0.0)
        .map(|(c, q)| (c.id, q.ln() as f32))
        .collect();
    TokenProbs { logprob, top }
}

/// Highest logit, lowest id on ties.
fn argmax(cands: &[Cand]) -> u32 {
    let mut best = cands[0];
    for c in &cands[1..] {
        if c.logit > best.logit || (c.logit == best.logit && c.id < best.id) {
            best = *c;
        }
    }
    best.id
}

/// Descending logit, ascending id on ties.
fn by_logit_desc(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Keeps the `k` best candidates, sorted best first; `k <= 0` sorts only.
fn top_k(cands: &mut Vec<Cand>, k: i32) {
    let k = if k <= 0 {
        cands.len()
    } else {
        (k as usize).min(cands.len())
    };
    if k < cands.len() {
        cands.select_nth_unstable_by(k - 1, by_logit_desc);
        cands.truncate(k);
    }
    cands.sort_unstable_by(by_logit_desc);
}

/// Softmax probabilities of sorted candidates.
fn probs(cands: &[Cand]) -> Vec<f64> {
    let max = cands.first().map_or(0.0, |c| c.logit);
    let w: Vec<f64> = cands
        .iter()
        .map(|c| f64::from(c.logit - max).exp())
        .collect();
    let total: f64 = w.iter().sum();
    w.into_iter().map(|x| x / total).collect()
}

/// Keeps the shortest best-first prefix whose probability reaches `p`.
fn top_p(cands: &mut Vec<Cand>, p: f32) {
    if p >= 1.0 || cands.len() <= 1 || !cands[0].logit.is_finite() {
        return;
    }
    let mut cum = 0.0;
    for (i, q) in probs(cands).into_iter().enumerate() {
        cum += q;
        if cum >= f64::from(p) {
            cands.truncate(i + 1);
            return;
        }
    }
}

/// Drops candidates whose probability is below `p` times the best one.
fn min_p(cands: &mut Vec<Cand>, p: f32) {
    if p <= 0.0 || cands.len() <= 1 || !cands[0].logit.is_finite() {
        return;
    }
    let threshold = cands[0].logit + p.ln();
    let keep = cands.iter().take_while(|c| c.logit >= threshold).count();
    cands.truncate(keep.max(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xoshiro_is_deterministic_and_uniformish() {
        let mut a = Xoshiro256::new(42);
        let mut b = Xoshiro256::new(42);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let mean = (0..100_000).map(|_| a.next_f64()).sum::<f64>() / 100_000.0;
        // Standard error of the mean of U(0,1) over 1e5 draws is ~0.0009.
        assert!((mean - 0.5).abs() < 0.005, "{mean}");
    }

    #[test]
    fn validate_accepts_the_defaults_and_refuses_by_field() {
        assert_eq!(SamplerParams::default().validate(), Ok(()));
        assert_eq!(SamplerParams::greedy().validate(), Ok(()));
        let bad = SamplerParams {
            repeat_penalty: f32::MIN_POSITIVE / 4.0,
            ..SamplerParams::default()
        };
        let e = bad.validate().expect_err("1/penalty is infinite");
        assert_eq!(
            (e.field(), e.flag()),
            ("repeat_penalty", "--repeat-penalty")
        );
        assert_eq!(SamplerParams::seed_from_i64(-1), Ok(None));
        assert_eq!(SamplerParams::seed_from_i64(3), Ok(Some(3)));
        assert_eq!(
            SamplerParams::seed_from_i64(-2),
            Err(SampleParamError::Seed(-2))
        );
    }

    #[test]
    fn top_p_keeps_shortest_prefix() {
        let mut c: Vec<Cand> = [0.5f32, 0.3, 0.15, 0.05]
            .iter()
            .enumerate()
            .map(|(i, p)| Cand {
                id: i as u32,
                logit: p.ln(),
            })
            .collect();
        top_p(&mut c, 0.75);
        assert_eq!(c.iter().map(|c| c.id).collect::<Vec<_>>(), vec![0, 1]);
    }

    /// Settings that let every candidate through at temperature 1, so the
    /// post-sampling probabilities are the softmax of the adjusted logits.
    fn open_chain() -> SamplerParams {
        SamplerParams {
            temp: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(1),
            ..SamplerParams::default()
        }
    }

    #[test]
    fn penalties_follow_llama_cpp_formula() {
        // llama.cpp's penalties sampler (src/llama-sampler.cpp): for a token
        // seen `count` times in the last `repeat_last_n` tokens, logit /=
        // repeat (logit *= repeat when <= 0), then logit -= count * freq +
        // presence. By hand, window = last 4 of [4, 0, 1, 0, 3, 0] =
        // [1, 0, 3, 0]: counts 0:2, 1:1, 3:1; token 4 is outside it.
        //   id 0:  2.0 / 2 - (2 * 0.5 + 0.25) = -0.25
        //   id 1: -1.0 * 2 - (1 * 0.5 + 0.25) = -2.75
        //   id 2:  0.5 (absent)
        //   id 3:  3.0 / 2 - (1 * 0.5 + 0.25) =  0.75
        //   id 4:  1.0 (outside the window)
        let s = Sampler::new(SamplerParams {
            repeat_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            repeat_last_n: 4,
            ..SamplerParams::default()
        });
        let mut c: Vec<Cand> = [2.0f32, -1.0, 0.5, 3.0, 1.0]
            .iter()
            .enumerate()
            .map(|(i, &l)| Cand {
                id: i as u32,
                logit: l,
            })
            .collect();
        s.apply_penalties(&mut c, &[4, 0, 1, 0, 3, 0]);
        let got: Vec<f32> = c.iter().map(|c| c.logit).collect();
        assert_eq!(got, [-0.25, -2.75, 0.5, 0.75, 1.0]);
        // repeat_last_n 0 turns all three off, as in llama.cpp.
        let off = Sampler::new(SamplerParams {
            repeat_last_n: 0,
            ..s.params().clone()
        });
        assert!(!off.penalises(&[0, 1]));
    }

    #[test]
    fn presence_penalty_moves_greedy_off_a_repeated_token() {
        // logits 3.0 (seen once) and 2.5: presence 1.0 makes 3.0 - 1.0 =
        // 2.0 < 2.5, so greedy picks id 1; frequency 0.25 per occurrence
        // needs 3 occurrences (3.0 - 0.75 = 2.25 < 2.5).
        let logits = [3.0f32, 2.5];
        let greedy = |p: SamplerParams, hist: &[u32]| Sampler::new(p).sample(&logits, hist);
        let base = SamplerParams::greedy();
        assert_eq!(greedy(base.clone(), &[0]), 0);
        let presence = SamplerParams {
            presence_penalty: 1.0,
            ..base.clone()
        };
        assert_eq!(greedy(presence, &[0]), 1);
        let freq = SamplerParams {
            frequency_penalty: 0.25,
            ..base
        };
        assert_eq!(greedy(freq.clone(), &[0, 0]), 0);
        assert_eq!(greedy(freq, &[0, 0, 0]), 1);
    }

    #[test]
    fn logit_bias_adds_before_penalties_and_bans_with_neg_inf() {
        // llama.cpp's chain puts logit_bias first (common/sampling.cpp):
        // logits [1, 0], bias +1 on id 0, then repeat penalty 2 on id 0:
        // (1 + 1) / 2 = 1.0, so log p0 - log p1 = 1.0 (penalty first would
        // give 1 / 2 + 1 = 1.5).
        let mut s = Sampler::new(SamplerParams {
            logit_bias: vec![(0, 1.0)],
            repeat_penalty: 2.0,
            ..open_chain()
        });
        let want = ProbsRequest {
            n_top: 2,
            post_sampling: true,
        };
        let (_, probs) = s.sample_with_probs(&[1.0, 0.0], &[0], Some(want));
        let top = probs.expect("asked").top;
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 1]);
        assert!((top[0].1 - top[1].1 - 1.0).abs() < 1e-6, "{top:?}");
        // Biases add up per entry; -inf bans the greedy token.
        let logits = [2.0f32, -1.0, 0.5, 3.0];
        let pick = |bias: Vec<(u32, f32)>| {
            Sampler::new(SamplerParams {
                logit_bias: bias,
                ..SamplerParams::greedy()
            })
            .sample(&logits, &[])
        };
        assert_eq!(pick(vec![]), 3);
        assert_eq!(pick(vec![(3, f32::NEG_INFINITY)]), 0);
        // 0.5 + 1.5 + 0.5 = 2.5 beats 2.0 once 3 is pushed to -7.
        assert_eq!(pick(vec![(3, -10.0), (2, 1.5), (2, 0.5)]), 2);
        // An id outside the vocabulary is skipped by the sampler ...
        assert_eq!(pick(vec![(99, 5.0)]), 3);
        // ... and refused by the check the CLI and the server run.
        let p = SamplerParams {
            logit_bias: vec![(99, 5.0)],
            ..SamplerParams::default()
        };
        let e = p.check_vocab(4).expect_err("out of range");
        assert_eq!((e.field(), e.flag()), ("logit_bias", "--logit-bias"));
        assert_eq!(p.check_vocab(100), Ok(()));
    }

    #[test]
    fn logit_bias_lists_at_most_one_entry_per_vocabulary_token() {
        // Repeats are allowed (they add up, as in llama.cpp) up to the
        // vocabulary's size in all; one more is refused, naming the field.
        let with = |n: usize| SamplerParams {
            logit_bias: vec![(1, 0.5); n],
            ..SamplerParams::default()
        };
        assert_eq!(with(4).check_vocab(4), Ok(()));
        let e = with(5).check_vocab(4).expect_err("past the vocabulary");
        assert_eq!(e, SampleParamError::LogitBiasCount { n: 5, n_vocab: 4 });
        assert_eq!((e.field(), e.flag()), ("logit_bias", "--logit-bias"));
    }

    #[test]
    fn validate_refuses_non_finite_penalties_and_bias() {
        let with = |f: fn(&mut SamplerParams)| {
            let mut p = SamplerParams::default();
            f(&mut p);
            p.validate().map_err(|e| e.field())
        };
        assert_eq!(with(|p| p.presence_penalty = -1.5), Ok(()));
        assert_eq!(
            with(|p| p.presence_penalty = f32::NAN),
            Err("presence_penalty")
        );
        assert_eq!(
            with(|p| p.frequency_penalty = f32::INFINITY),
            Err("frequency_penalty")
        );
        assert_eq!(
            with(|p| p.logit_bias = vec![(1, f32::NEG_INFINITY)]),
            Ok(())
        );
        assert_eq!(
            with(|p| p.logit_bias = vec![(1, f32::INFINITY)]),
            Err("logit_bias")
        );
    }

    #[test]
    fn raw_probs_are_the_log_softmax_of_the_logits() {
        // log p_i = l_i - ln(sum_j e^l_j), by hand for [1, 3, 2, NaN].
        let logits = [1.0f32, 3.0, 2.0, f32::NAN];
        let lse = (1f64.exp() + 3f64.exp() + 2f64.exp()).ln();
        let mut s = Sampler::new(SamplerParams {
            logit_bias: vec![(0, 100.0)],
            ..SamplerParams::greedy()
        });
        let want = ProbsRequest {
            n_top: 3,
            post_sampling: false,
        };
        let (id, probs) = s.sample_with_probs(&logits, &[], Some(want));
        let p = probs.expect("asked");
        // The bias chose id 0; its probability is still the raw one.
        assert_eq!(id, 0);
        assert!((f64::from(p.logprob) - (1.0 - lse)).abs() < 1e-6);
        let ids: Vec<u32> = p.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 2, 0]);
        for (&(i, lp), l) in p.top.iter().zip([3.0, 2.0, 1.0]) {
            assert!((f64::from(lp) - (l - lse)).abs() < 1e-6, "{i}: {lp}");
        }
        // Greedy after the chain: the chosen token alone, probability 1.
        let mut g = Sampler::new(SamplerParams::greedy());
        let post = ProbsRequest {
            n_top: 3,
            post_sampling: true,
        };
        let (id, probs) = g.sample_with_probs(&logits, &[], Some(post));
        assert_eq!(id, 1);
        assert_eq!(
            probs,
            Some(TokenProbs {
                logprob: 0.0,
                top: vec![(1, 0.0)]
            })
        );
    }
}
