//! Sampler behaviour: greedy, determinism under a seed, and the tokens that
//! top-k / top-p / min-p / the repetition penalty must exclude or favour.
//! Statistical checks use fixed seeds; their tolerances are ~5 standard
//! errors of a binomial frequency over the number of draws.

use longhaul::sample::{Sampler, SamplerParams};

/// Logits whose softmax is `probs`.
fn logits_of(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

fn params(temp: f32, top_k: i32, top_p: f32, min_p: f32, seed: u64) -> SamplerParams {
    SamplerParams {
        temp,
        top_k,
        top_p,
        min_p,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        seed: Some(seed),
        ..SamplerParams::default()
    }
}

/// Frequencies of each id over `n` draws.
fn frequencies(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<f64> {
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits, &[]) as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

/// 5 binomial standard errors of a frequency `p` over `n` draws.
fn tol(p: f64, n: usize) -> f64 {
    5.0 * (p * (1.0 - p) / n as f64).sqrt() + 1e-9
}

#[test]
fn defaults_are_llama_cpp_defaults() {
    let p = SamplerParams::default();
    assert_eq!(
        (
            p.temp,
            p.top_k,
            p.top_p,
            p.min_p,
            p.repeat_penalty,
            p.repeat_last_n
        ),
        (0.8, 40, 0.95, 0.05, 1.0, 64)
    );
    assert_eq!(p.seed, None);
}

#[test]
fn greedy_picks_argmax_lowest_index_on_ties() {
    let mut s = Sampler::new(SamplerParams::greedy());
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 1.9], &[]), 1);
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 2.0], &[]), 1);
    assert_eq!(s.sample(&[f32::NAN, 0.5, f32::NEG_INFINITY], &[]), 1);
    let mut neg = Sampler::new(SamplerParams {
        temp: -1.0,
        ..SamplerParams::default()
    });
    assert_eq!(neg.sample(&[-5.0, -4.0, -4.5], &[]), 1);
    assert_eq!(neg.sample(&[], &[]), 0);
}

#[test]
fn top_k_one_equals_greedy() {
    let mut rng = longhaul::sample::Xoshiro256::new(7);
    let mut k1 = Sampler::new(params(1.5, 1, 1.0, 0.0, 123));
    let mut greedy = Sampler::new(SamplerParams::greedy());
    for _ in 0..200 {
        let logits: Vec<f32> = (0..257)
            .map(|_| (rng.next_f64() * 10.0 - 5.0) as f32)
            .collect();
        assert_eq!(k1.sample(&logits, &[]), greedy.sample(&logits, &[]));
    }
}

#[test]
fn same_seed_same_sequence_different_seeds_differ() {
    let logits = logits_of(&[0.2; 5]);
    let run = |seed| {
        let mut s = Sampler::new(params(1.0, 0, 1.0, 0.0, seed));
        (0..500)
            .map(|_| s.sample(&logits, &[]))
            .collect::<Vec<u32>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    let s = Sampler::new(params(1.0, 0, 1.0, 0.0, 9));
    assert_eq!(s.seed(), 9);
}

#[test]
fn unfiltered_draws_follow_the_softmax() {
    let probs = [0.5, 0.3, 0.15, 0.05];
    let n = 40_000;
    let mut s = Sampler::new(params(1.0, 0, 1.0, 0.0, 1));
    let f = frequencies(&mut s, &logits_of(&probs), n);
    for (i, (&got, &want)) in f.iter().zip(&probs).enumerate() {
        let want = f64::from(want);
        assert!((got - want).abs() < tol(want, n), "id {i}: {got} vs {want}");
    }
}

#[test]
fn top_p_excludes_the_tail_and_renormalises() {
    // Cumulative 0.5, 0.8: top_p 0.75 keeps ids 0 and 1 only.
    let n = 40_000;
    let mut s = Sampler::new(params(1.0, 0, 0.75, 0.0, 2));
    let f = frequencies(&mut s, &logits_of(&[0.5, 0.3, 0.15, 0.05]), n);
    assert_eq!((f[2], f[3]), (0.0, 0.0), "{f:?}");
    for (got, want) in [(f[0], 0.625), (f[1], 0.375)] {
        assert!((got - want).abs() < tol(want, n), "{f:?}");
    }
}

#[test]
fn min_p_excludes_tokens_below_the_fraction_of_the_best() {
    // min_p 0.2: threshold 0.1 keeps ids 0, 1, 2 (renormalised over 0.95).
    let n = 40_000;
    let mut s = Sampler::new(params(1.0, 0, 1.0, 0.2, 3));
    let f = frequencies(&mut s, &logits_of(&[0.5, 0.3, 0.15, 0.05]), n);
    assert_eq!(f[3], 0.0, "{f:?}");
    for (i, want) in [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95]
        .into_iter()
        .enumerate()
    {
        assert!((f[i] - want).abs() < tol(want, n), "{f:?}");
    }
}

#[test]
fn top_k_keeps_k_best_and_temperature_sharpens() {
    let n = 40_000;
    let logits = logits_of(&[0.1, 0.4, 0.2, 0.3]);
    let mut s = Sampler::new(params(1.0, 2, 1.0, 0.0, 4));
    let f = frequencies(&mut s, &logits, n);
    assert_eq!((f[0], f[2]), (0.0, 0.0), "{f:?}");
    assert!((f[1] - 4.0 / 7.0).abs() < tol(4.0 / 7.0, n), "{f:?}");
    // temp 0.5 squares the probabilities: 0.16 : 0.09 over the two kept.
    let mut s = Sampler::new(params(0.5, 2, 1.0, 0.0, 5));
    let f = frequencies(&mut s, &logits, n);
    let want = 0.16 / 0.25;
    assert!((f[1] - want).abs() < tol(want, n), "{f:?}");
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative() {
    let greedy_pen = |last_n| {
        Sampler::new(SamplerParams {
            repeat_penalty: 2.0,
            repeat_last_n: last_n,
            ..SamplerParams::greedy()
        })
    };
    // Positive: 3.0 / 2 = 1.5 < 2.0, so id 0 loses to id 1 when repeated.
    let mut s = greedy_pen(64);
    assert_eq!(s.sample(&[3.0, 2.0, 0.0], &[]), 0);
    assert_eq!(s.sample(&[3.0, 2.0, 0.0], &[0]), 1);
    // Negative: -1.0 * 2 = -2.0 < -1.5, so id 0 loses to id 1 when repeated.
    assert_eq!(s.sample(&[-1.0, -1.5, -9.0], &[0]), 1);
    // Only the last `repeat_last_n` tokens count.
    let mut s = greedy_pen(1);
    assert_eq!(s.sample(&[3.0, 2.0, 0.0], &[0, 2]), 0);
    let mut s = greedy_pen(0);
    assert_eq!(s.sample(&[3.0, 2.0, 0.0], &[0]), 0);
    let mut s = greedy_pen(-1);
    assert_eq!(s.sample(&[3.0, 2.0, 0.0], &[0, 2, 2, 2]), 1);
    // Out-of-range history ids are ignored.
    assert_eq!(s.sample(&[3.0, 2.0, 0.0], &[99]), 0);
}
