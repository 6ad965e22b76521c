//! The cache advisor: replays a routing trace (see [`super::trace`]) through
//! the expert cache for every slot count from one to all experts and counts
//! hits and misses under LRU and LFU (the real [`LayerCache`] planner, so the
//! prediction is exactly what a longhaul run at that size would count) and
//! under Belady's offline optimum (keep the experts whose next use comes
//! first). It knows traces, slot counts and bytes per expert; it does not
//! know models, files or backends: the caller passes the expert size.
//!
//! Counting follows [`super::StreamedLayer::plan`]: per (batch, layer), each
//! distinct expert of the batch is one use; a use whose expert is cached when
//! the batch starts is a hit, any other is a miss (one expert read).

use std::io::BufRead;
use std::path::Path;

use rayon::prelude::*;

use super::cache::{LayerCache, Policy};

#[derive(Debug, thiserror::Error)]
pub enum AdvisorError {
    #[error("reading routing trace {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: line 1 is not a longhaul routing trace header ({detail}); record a trace with `longhaul run --trace-experts FILE` or `longhaul bench --trace-experts FILE`")]
    BadHeader { path: String, detail: String },
    #[error("{path}:{line}: not a routing record ({detail}); the trace may be truncated or edited, record it again")]
    BadRecord {
        path: String,
        line: usize,
        detail: String,
    },
    #[error("{path}:{line}: expert id {id} is out of range (the trace header says {n_expert} experts per layer)")]
    IdOutOfRange {
        path: String,
        line: usize,
        id: u64,
        n_expert: usize,
    },
    #[error(
        "{path}: the trace holds no routing records; evaluate at least one token while recording"
    )]
    Empty { path: String },
    #[error("the trace was recorded on a model with {trace} experts per layer but the model has {model}; pass the model the trace was recorded with")]
    ModelMismatch { trace: usize, model: usize },
}

/// The batches one MoE layer saw, in sync-point order.
#[derive(Clone, Debug, Default)]
pub struct LayerTrace {
    pub layer: usize,
    /// Distinct experts of each batch, in order of first use (the order the
    /// planner sees them after deduplication).
    pub batches: Vec<Vec<u32>>,
    /// Tokens routed through the layer.
    pub n_tokens: u64,
    /// Token-level uses of each expert (for popularity plots).
    pub uses: Vec<u64>,
}

/// A parsed routing trace.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub n_layer: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// The traced MoE layers, by ascending layer index.
    pub layers: Vec<LayerTrace>,
}

impl Trace {
    /// Reads a JSONL trace file.
    pub fn open(path: &Path) -> Result<Self, AdvisorError> {
        let name = path.display().to_string();
        let f = std::fs::File::open(path).map_err(|source| AdvisorError::Io {
            path: name.clone(),
            source,
        })?;
        Self::parse(std::io::BufReader::new(f), &name)
    }

    /// Parses a JSONL trace; `name` labels errors.
    pub fn parse(r: impl BufRead, name: &str) -> Result<Self, AdvisorError> {
        let mut lines = r.lines().enumerate();
        let io = |source| AdvisorError::Io {
            path: name.to_string(),
            source,
        };
        let bad_header = |detail: String| AdvisorError::BadHeader {
            path: name.to_string(),
            detail,
        };
        let header = match lines.next() {
            None => return Err(bad_header("the file is empty".into())),
            Some((_, l)) => l.map_err(io)?,
        };
        let h: serde_json::Value =
            serde_json::from_str(&header).map_err(|e| bad_header(e.to_string()))?;
        let field = |k: &str| -> Result<usize, AdvisorError> {
            h.get(k)
                .and_then(serde_json::Value::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| bad_header(format!("no `{k}` count")))
        };
        if h.get("longhaul_trace").and_then(serde_json::Value::as_u64) != Some(1) {
            return Err(bad_header("no `\"longhaul_trace\":1`".into()));
        }
        let mut t = Trace {
            n_layer: field("n_layer")?,
            n_expert: field("n_expert")?,
            n_expert_used: field("n_expert_used")?,
            layers: Vec::new(),
        };
        // Index of each layer in `t.layers`.
        let mut at: Vec<Option<usize>> = vec![None; t.n_layer];
        let mut seen = vec![false; t.n_expert];
        for (i, l) in lines {
            let line = i + 1;
            let l = l.map_err(io)?;
            if l.trim().is_empty() {
                continue;
            }
            let bad = |detail: String| AdvisorError::BadRecord {
                path: name.to_string(),
                line,
                detail,
            };
            let v: serde_json::Value = serde_json::from_str(&l).map_err(|e| bad(e.to_string()))?;
            let layer = v
                .get("layer")
                .and_then(serde_json::Value::as_u64)
                .ok_or_else(|| bad("no `layer`".into()))? as usize;
            if layer >= t.n_layer {
                return Err(bad(format!(
                    "layer {layer} but the header says {} layers",
                    t.n_layer
                )));
            }
            let toks = v
                .get("ids")
                .and_then(serde_json::Value::as_array)
                .ok_or_else(|| bad("no `ids` list".into()))?;
            let idx = *at[layer].get_or_insert_with(|| {
                t.layers.push(LayerTrace {
                    layer,
                    uses: vec![0; t.n_expert],
                    ..Default::default()
                });
                t.layers.len() - 1
            });
            let lt = &mut t.layers[idx];
            let mut distinct = Vec::new();
            for tok in toks {
                let ids = tok
                    .as_array()
                    .ok_or_else(|| bad("a token's ids are not a list".into()))?;
                for id in ids {
                    let id = id
                        .as_u64()
                        .ok_or_else(|| bad("an expert id is not a number".into()))?;
                    if id as usize >= t.n_expert {
                        return Err(AdvisorError::IdOutOfRange {
                            path: name.to_string(),
                            line,
                            id,
                            n_expert: t.n_expert,
                        });
                    }
                    lt.uses[id as usize] += 1;
                    if !seen[id as usize] {
                        seen[id as usize] = true;
                        distinct.push(id as u32);
                    }
                }
            }
            distinct.iter().for_each(|&e| seen[e as usize] = false);
            lt.n_tokens += toks.len() as u64;
            lt.batches.push(distinct);
        }
        if t.layers.is_empty() {
            return Err(AdvisorError::Empty {
                path: name.to_string(),
            });
        }
        t.layers.sort_by_key(|l| l.layer);
        Ok(t)
    }

    /// Tokens in the trace (those routed through its first MoE layer).
    pub fn n_tokens(&self) -> u64 {
        self.layers.first().map(|l| l.n_tokens).unwrap_or(0)
    }
}

/// A replacement strategy the advisor replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// The longhaul planner with `--longhaul-policy lru`.
    Lru,
    /// The longhaul planner with `--longhaul-policy lfu`.
    Lfu,
    /// The longhaul planner with `--longhaul-policy auto` (the default).
    Auto,
    /// Belady's offline optimum: a lower bound on misses for any policy.
    Belady,
}

impl Strategy {
    pub const ALL: [Strategy; 4] = [
        Strategy::Lru,
        Strategy::Lfu,
        Strategy::Auto,
        Strategy::Belady,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Lru => "lru",
            Strategy::Lfu => "lfu",
            Strategy::Auto => "auto",
            Strategy::Belady => "belady",
        }
    }
}

/// Hits and misses of a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub hits: u64,
    pub misses: u64,
}

impl Counts {
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }

    fn add(&mut self, o: Counts) {
        self.hits += o.hits;
        self.misses += o.misses;
    }
}

/// Replays one layer's batches with `n_slots` slots (at least one).
pub fn replay(batches: &[Vec<u32>], n_expert: usize, n_slots: usize, s: Strategy) -> Counts {
    let n_slots = n_slots.max(1);
    match s {
        Strategy::Lru => replay_planner(batches, n_expert, n_slots, Policy::Lru),
        Strategy::Lfu => replay_planner(batches, n_expert, n_slots, Policy::Lfu),
        Strategy::Auto => replay_planner(batches, n_expert, n_slots, Policy::Auto),
        Strategy::Belady => belady(batches, n_expert, n_slots),
    }
}

fn replay_planner(batches: &[Vec<u32>], n_expert: usize, n_slots: usize, p: Policy) -> Counts {
    let mut cache = LayerCache::new(n_expert, n_slots, p);
    let mut c = Counts::default();
    for b in batches {
        let (hits, misses) = cache.replay(b);
        c.hits += hits;
        c.misses += misses;
    }
    c
}

const NEVER: usize = usize::MAX;

/// Belady's optimum at batch granularity (MIN with bypass). A batch's cached
/// experts are hits, the others are read once each. Afterwards the cache may
/// hold any `n_slots` experts of (cache before the batch) and (experts read
/// in it); it keeps those whose next use comes soonest, the farthest-next-use
/// rule applied to a batch. The planner is stricter (the last expert it reads
/// stays in its slot), so this is a lower bound on the misses of any policy,
/// and it is optimal in this model (see the brute-force test).
fn belady(batches: &[Vec<u32>], n_expert: usize, n_slots: usize) -> Counts {
    // next[i][j]: the next batch after i that uses batches[i][j].
    let mut last = vec![NEVER; n_expert];
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); batches.len()];
    for (i, b) in batches.iter().enumerate().rev() {
        next[i] = b
            .iter()
            .map(|&e| std::mem::replace(&mut last[e as usize], i))
            .collect();
    }
    let mut next_use = vec![NEVER; n_expert];
    let mut cached = vec![false; n_expert];
    let mut held: Vec<u32> = Vec::with_capacity(n_slots);
    let mut c = Counts::default();
    let mut cand: Vec<(usize, bool, u32)> = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        cand.clear();
        for (j, &e) in b.iter().enumerate() {
            next_use[e as usize] = next[i][j];
            if cached[e as usize] {
                c.hits += 1;
            } else {
                c.misses += 1;
                cand.push((next[i][j], true, e));
            }
        }
        if cand.is_empty() {
            continue;
        }
        cand.extend(held.iter().map(|&e| (next_use[e as usize], false, e)));
        // Soonest next use first; on ties keep what is already cached.
        cand.sort_by_key(|&(n, miss, e)| (n, miss, e));
        let keep = n_slots.min(cand.len());
        held.iter().for_each(|&e| cached[e as usize] = false);
        held.clear();
        for &(_, _, e) in &cand[..keep] {
            cached[e as usize] = true;
            held.push(e);
        }
    }
    c
}

/// Hits and misses over all traced layers at one slot count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub n_slots: usize,
    pub counts: Counts,
}

/// What the advisor found for one trace and model.
#[derive(Clone, Debug)]
pub struct Report {
    pub n_expert: usize,
    /// MoE layers of the model (what a `--longhaul-cache` budget is divided by).
    pub n_moe_layers: usize,
    /// Bytes of one expert across a layer's routed tensors.
    pub expert_bytes: u64,
    pub n_tokens: u64,
    /// One curve per strategy (in [`Strategy::ALL`] order), one point per
    /// slot count from 1 to `n_expert`.
    pub curves: Vec<(Strategy, Vec<Point>)>,
}

impl Report {
    /// Expert-cache bytes (`--longhaul-cache`) that give `n_slots` slots per layer.
    pub fn cache_bytes(&self, n_slots: usize) -> u64 {
        n_slots as u64 * self.n_moe_layers as u64 * self.expert_bytes
    }

    /// Expert bytes read per token at a point.
    pub fn bytes_per_token(&self, p: &Point) -> f64 {
        p.counts.misses as f64 * self.expert_bytes as f64 / self.n_tokens.max(1) as f64
    }

    /// The smallest slot count reaching `target` hit rate (0..1) under `s`.
    pub fn smallest_reaching(&self, s: Strategy, target: f64) -> Option<Point> {
        self.curve(s)?
            .iter()
            .find(|p| p.counts.hit_rate() + 1e-12 >= target)
            .copied()
    }

    pub fn curve(&self, s: Strategy) -> Option<&[Point]> {
        self.curves
            .iter()
            .find(|(k, _)| *k == s)
            .map(|(_, v)| v.as_slice())
    }
}

/// Replays `trace` under every strategy and slot count. `n_expert` and the
/// expert size come from the model the trace was recorded on.
pub fn advise(
    trace: &Trace,
    n_expert: usize,
    n_moe_layers: usize,
    expert_bytes: u64,
) -> Result<Report, AdvisorError> {
    if trace.n_expert != n_expert {
        return Err(AdvisorError::ModelMismatch {
            trace: trace.n_expert,
            model: n_expert,
        });
    }
    let jobs: Vec<(Strategy, usize)> = Strategy::ALL
        .iter()
        .flat_map(|&s| (1..=n_expert.max(1)).map(move |n| (s, n)))
        .collect();
    let points: Vec<Point> = jobs
        .par_iter()
        .map(|&(s, n)| {
            let mut counts = Counts::default();
            for l in &trace.layers {
                counts.add(replay(&l.batches, n_expert, n, s));
            }
            Point { n_slots: n, counts }
        })
        .collect();
    let curves = Strategy::ALL
        .iter()
        .zip(points.chunks(n_expert.max(1)))
        .map(|(&s, p)| (s, p.to_vec()))
        .collect();
    Ok(Report {
        n_expert,
        n_moe_layers,
        expert_bytes,
        n_tokens: trace.n_tokens(),
        curves,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(v: &[&[u32]]) -> Vec<Vec<u32>> {
        v.iter().map(|x| x.to_vec()).collect()
    }

    /// A hand-made trace counted by hand (comments give the cache after each batch).
    #[test]
    fn hand_made_trace_matches_hand_counts() {
        let t = b(&[&[0], &[0], &[0], &[1], &[2], &[1], &[2], &[0]]);
        // LRU, 2 slots: {0} h h {0,1} {1,2} h h {2,0}: 4 hits, 4 misses.
        assert_eq!(
            replay(&t, 4, 2, Strategy::Lru),
            Counts { hits: 4, misses: 4 }
        );
        // LFU, 2 slots: 0 is used three times and never leaves;
        // 1 and 2 evict each other: {0} h h {0,1} {0,2} {0,1} {0,2} h.
        assert_eq!(
            replay(&t, 4, 2, Strategy::Lfu),
            Counts { hits: 3, misses: 5 }
        );
        // Belady, 2 slots: at batch 4, 0 is next used last, so it goes.
        assert_eq!(
            replay(&t, 4, 2, Strategy::Belady),
            Counts { hits: 4, misses: 4 }
        );
        // One slot: every change of expert is a miss for LRU and LFU; Belady
        // reads 2 at batch 4 without keeping it, so 1 is still there at batch 5.
        for s in [Strategy::Lru, Strategy::Lfu] {
            assert_eq!(replay(&t, 4, 1, s), Counts { hits: 2, misses: 6 }, "{s:?}");
        }
        assert_eq!(
            replay(&t, 4, 1, Strategy::Belady),
            Counts { hits: 3, misses: 5 }
        );
        // Enough slots: only first uses miss.
        for s in Strategy::ALL {
            assert_eq!(replay(&t, 4, 4, s), Counts { hits: 5, misses: 3 }, "{s:?}");
        }
        // Belady beats LRU where LRU throws out what comes back next:
        // 0 1 2 0 1 2 with 2 slots: LRU misses every time, Belady keeps 0 and 1
        // (2 is read, used and not kept), then misses 2 once more.
        let cyc = b(&[&[0], &[1], &[2], &[0], &[1], &[2]]);
        assert_eq!(replay(&cyc, 3, 2, Strategy::Lru).misses, 6);
        assert_eq!(replay(&cyc, 3, 2, Strategy::Belady).misses, 4);
    }

    /// A plain LRU over one-expert batches (so recency has no ties), written
    /// independently of the planner: recency is the batch index of the last use.
    fn naive_lru(batches: &[Vec<u32>], n_slots: usize) -> Counts {
        let mut cache: Vec<(u32, usize)> = Vec::new();
        let mut c = Counts::default();
        for (t, b) in batches.iter().enumerate() {
            for &e in b {
                if let Some(x) = cache.iter_mut().find(|x| x.0 == e) {
                    c.hits += 1;
                    x.1 = t;
                    continue;
                }
                c.misses += 1;
                if cache.len() == n_slots {
                    let (i, _) = cache
                        .iter()
                        .enumerate()
                        .filter(|(_, x)| x.1 < t)
                        .min_by_key(|(_, x)| x.1)
                        .expect("a batch never holds more experts than slots");
                    cache.remove(i);
                }
                cache.push((e, t));
            }
        }
        c
    }

    /// The fewest misses over every sequence of cache states where each state
    /// keeps at most `n_slots` of the previous state and the batch's experts
    /// (dynamic programming over all subsets).
    fn brute_force_optimum(batches: &[Vec<u32>], n_expert: usize, n_slots: usize) -> u64 {
        use std::collections::HashMap;
        let mut best: HashMap<u32, u64> = HashMap::from([(0, 0)]);
        for b in batches {
            let d: u32 = b.iter().map(|&e| 1u32 << e).sum();
            let mut nb: HashMap<u32, u64> = HashMap::new();
            for (&s, &cost) in &best {
                let miss = d & !s;
                let cost = cost + miss.count_ones() as u64;
                for u in 0..(1u32 << n_expert) {
                    // u: cached experts kept; l: experts read in the batch kept.
                    if u & !s != 0 {
                        continue;
                    }
                    for l in 0..(1u32 << n_expert) {
                        if l & !miss != 0 {
                            continue;
                        }
                        if (u | l).count_ones() as usize > n_slots {
                            continue;
                        }
                        let e = nb.entry(u | l).or_insert(u64::MAX);
                        *e = (*e).min(cost);
                    }
                }
            }
            best = nb;
        }
        best.values().copied().min().unwrap_or(0)
    }

    /// A small deterministic generator (xorshift) for random traces.
    fn traces(seed: u64, n: usize, n_expert: u32, max_batch: usize) -> Vec<Vec<Vec<u32>>> {
        let mut x = seed | 1;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        (0..n)
            .map(|_| {
                let len = 1 + rnd(12) as usize;
                (0..len)
                    .map(|_| {
                        let k = 1 + rnd(max_batch as u64) as usize;
                        let mut v: Vec<u32> = Vec::new();
                        while v.len() < k.min(n_expert as usize) {
                            // Skewed popularity: low ids are likelier.
                            let e = (rnd(n_expert as u64) * rnd(n_expert as u64 + 1)
                                / n_expert as u64) as u32;
                            if !v.contains(&e) {
                                v.push(e);
                            }
                        }
                        v
                    })
                    .collect()
            })
            .collect()
    }

    /// Batches of two distinct experts of 64: in phases of 60 batches,
    /// each from six experts of its own (`moving`), or all from one skewed
    /// popularity, expert `e` about `1 / (e + 1)` as likely (`lasting`).
    fn popularity(moving: bool) -> Vec<Vec<u32>> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let weights: Vec<f64> = (0..64).map(|e| 1.0 / (e as f64 + 1.0)).collect();
        let total: f64 = weights.iter().sum();
        (0..2400)
            .map(|b| {
                let mut v: Vec<u32> = Vec::new();
                while v.len() < 2 {
                    let e = if moving {
                        ((b / 60) * 6 + rnd(6) as usize) as u32 % 64
                    } else {
                        let mut u = rnd(1 << 30) as f64 / (1u64 << 30) as f64 * total;
                        let mut e = 0;
                        while e < 63 && u >= weights[e] {
                            u -= weights[e];
                            e += 1;
                        }
                        e as u32
                    };
                    if !v.contains(&e) {
                        v.push(e);
                    }
                }
                v
            })
            .collect()
    }

    /// `auto` evicts as the policy its replays favour. Where popularity
    /// moves, LFU's slowly fading counts keep the last phase's experts and
    /// miss the new ones; where it lasts, LRU lets popular experts go for
    /// rare ones. In both, `auto` misses within 5% of the better policy and
    /// less than the worse.
    #[test]
    fn auto_misses_about_as_little_as_the_better_of_lru_and_lfu() {
        for moving in [true, false] {
            let t = popularity(moving);
            let [lru, lfu, auto] =
                [Strategy::Lru, Strategy::Lfu, Strategy::Auto].map(|s| replay(&t, 64, 8, s).misses);
            let (better, worse) = if moving { (lru, lfu) } else { (lfu, lru) };
            assert!(better < worse, "moving {moving}: lru {lru}, lfu {lfu}");
            assert!(
                auto as f64 <= better as f64 * 1.05 && auto < worse,
                "moving {moving}: lru {lru}, lfu {lfu}, auto {auto}"
            );
        }
    }

    #[test]
    fn lru_replay_equals_a_naive_lru() {
        for t in traces(7, 300, 8, 1) {
            for n in 1..=8 {
                assert_eq!(
                    replay(&t, 8, n, Strategy::Lru),
                    naive_lru(&t, n),
                    "{t:?} {n}"
                );
            }
        }
    }

    #[test]
    fn belady_equals_the_brute_force_optimum() {
        for t in traces(11, 200, 5, 4) {
            for n in 1..=5 {
                assert_eq!(
                    replay(&t, 5, n, Strategy::Belady).misses,
                    brute_force_optimum(&t, 5, n),
                    "{t:?} {n}"
                );
            }
        }
    }

    #[test]
    fn belady_is_never_below_lru_lfu_or_auto() {
        for t in traces(23, 400, 16, 10) {
            for n in 1..=16 {
                let opt = replay(&t, 16, n, Strategy::Belady);
                for s in [Strategy::Lru, Strategy::Lfu, Strategy::Auto] {
                    let c = replay(&t, 16, n, s);
                    assert!(opt.hits >= c.hits, "{s:?} {n}: {c:?} beat {opt:?} on {t:?}");
                    assert_eq!(opt.hits + opt.misses, c.hits + c.misses);
                }
            }
        }
    }

    #[test]
    fn bad_traces_give_actionable_errors() {
        let parse = |s: &str| Trace::parse(std::io::Cursor::new(s), "t.jsonl");
        let e = parse("").unwrap_err().to_string();
        assert!(e.contains("not a longhaul routing trace header"), "{e}");
        let e = parse("{\"x\":1}\n").unwrap_err().to_string();
        assert!(e.contains("--trace-experts"), "{e}");
        let hdr = r#"{"longhaul_trace":1,"n_layer":2,"n_expert":4,"n_expert_used":2}"#;
        let e = parse(hdr).unwrap_err().to_string();
        assert!(e.contains("no routing records"), "{e}");
        let e = parse(&format!("{hdr}\n{{\"layer\":0,\"ids\":[[0,9]]}}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.jsonl:2: expert id 9 is out of range"), "{e}");
        let e = parse(&format!("{hdr}\n{{\"layer\":5,\"ids\":[[0,1]]}}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("layer 5"), "{e}");
        let e = parse(&format!("{hdr}\n{{\"layer\":0,\"ids\":[[0,1]\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.jsonl:2"), "{e}");
        let t = parse(&format!(
            "{hdr}\n{{\"layer\":1,\"ids\":[[0,1],[1,2]]}}\n{{\"layer\":0,\"ids\":[[3,2]]}}\n"
        ))
        .unwrap();
        assert_eq!(t.layers[0].layer, 0);
        assert_eq!(t.layers[1].batches, vec![vec![0, 1, 2]]);
        assert_eq!(t.layers[1].uses, vec![1, 2, 1, 0]);
        assert_eq!(t.layers[1].n_tokens, 2);
        let e = advise(&t, 8, 2, 100).unwrap_err().to_string();
        assert!(e.contains("4 experts per layer but the model has 8"), "{e}");
        let r = advise(&t, 4, 2, 100).unwrap();
        assert_eq!(r.curves.len(), 4);
        assert!(r.curves.iter().all(|(_, c)| c.len() == 4));
        assert_eq!(r.cache_bytes(3), 600);
    }
}
