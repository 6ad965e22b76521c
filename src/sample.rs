//! Token sampling from logits, in the order of llama.cpp's default sampler
//! chain: repetition penalty -> top-k -> top-p -> min-p -> temperature ->
//! draw from the softmax. Top-p and min-p therefore see the un-tempered
//! distribution, as in llama.cpp. `temp <= 0` is greedy: the arg-max of the
//! penalised logits, lowest id on ties.
//!
//! Draws use a xoshiro256** generator seeded from `seed` (splitmix64), so the
//! same seed and inputs give the same tokens on every platform. The numbers
//! differ from llama.cpp's `std::mt19937`; only the distribution matches.
//!
//! This module knows nothing about tokenizers or models.

use std::collections::HashSet;

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
    /// How many recent tokens the penalty looks at; `0` disables, `-1` means all.
    pub repeat_last_n: i32,
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
        Ok(())
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

/// One candidate: token id and its (possibly adjusted) logit.
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
        if logits.is_empty() {
            return 0;
        }
        if self.params.temp <= 0.0 && !self.penalises(history) {
            // Greedy without penalties: the candidates' argmax, read straight
            // from the logits (NaN counts as -inf, the lowest id wins a tie).
            let mut best = (0, f32::NEG_INFINITY);
            for (i, &l) in logits.iter().enumerate() {
                let l = if l.is_nan() { f32::NEG_INFINITY } else { l };
                if l > best.1 {
                    best = (i, l);
                }
            }
            return best.0 as u32;
        }
        let mut cands = std::mem::take(&mut self.cands);
        cands.clear();
        cands.extend(logits.iter().enumerate().map(|(i, &l)| Cand {
            id: i as u32,
            logit: if l.is_nan() { f32::NEG_INFINITY } else { l },
        }));
        self.apply_penalty(&mut cands, history);
        let id = if self.params.temp <= 0.0 {
            argmax(&cands)
        } else {
            top_k(&mut cands, self.params.top_k);
            top_p(&mut cands, self.params.top_p);
            min_p(&mut cands, self.params.min_p);
            let inv_t = 1.0 / self.params.temp;
            for c in cands.iter_mut() {
                c.logit *= inv_t;
            }
            self.draw(&cands)
        };
        self.cands = cands;
        id
    }

    /// Whether the repetition penalty changes anything for `history`.
    fn penalises(&self, history: &[u32]) -> bool {
        let p = &self.params;
        !(p.repeat_penalty == 1.0 || p.repeat_last_n == 0 || history.is_empty())
    }

    /// llama.cpp's repetition penalty over the last `repeat_last_n` tokens.
    fn apply_penalty(&self, cands: &mut [Cand], history: &[u32]) {
        let p = &self.params;
        if !self.penalises(history) {
            return;
        }
        let n = if p.repeat_last_n < 0 {
            history.len()
        } else {
            (p.repeat_last_n as usize).min(history.len())
        };
        let recent: HashSet<u32> = history[history.len() - n..].iter().copied().collect();
        for id in recent {
            if let Some(c) = cands.get_mut(id as usize) {
                if c.logit <= 0.0 {
                    c.logit *= p.repeat_penalty;
                } else {
                    c.logit /= p.repeat_penalty;
                }
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
        let weights: Vec<f64> = cands
            .iter()
            .map(|c| f64::from(c.logit - max).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut u = self.rng.next_f64() * total;
        for (c, w) in cands.iter().zip(&weights) {
            if u < *w {
                return c.id;
            }
            u -= w;
        }
        // Rounding left `u` past the end: the last candidate with weight.
        cands
            .iter()
            .zip(&weights)
            .rev()
            .find(|(_, w)| **w > 0.0)
            .map_or(cands[0].id, |(c, _)| c.id)
    }
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
}
