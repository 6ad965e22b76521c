//! The per-layer expert cache: which expert sits in which slot, the eviction
//! policy, and the plan for one batch (waves of at most `n_slots` distinct
//! experts, each expert in exactly one wave, cached experts first).

/// Eviction policy (`--longhaul-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Evict the least recently used expert.
    Lru,
    /// Evict the least frequently used expert; counts decay by half every
    /// `LFU_HALF_LIFE` batches so old popularity fades. Ties fall back to LRU.
    Lfu,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lru" => Ok(Policy::Lru),
            "lfu" => Ok(Policy::Lfu),
            other => Err(format!("unknown cache policy `{other}`; use lru or lfu")),
        }
    }
}

const LFU_HALF_LIFE: f64 = 64.0;

/// One wave of a plan: the experts it computes, their slots, and the experts
/// that must be read into their slot before it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wave {
    /// `(expert, slot)` for every expert of the wave.
    pub experts: Vec<(u32, u32)>,
    /// `(expert, slot)` for the experts to load (a subset of `experts`).
    pub loads: Vec<(u32, u32)>,
}

impl Wave {
    /// The slot of `expert` in this wave.
    pub fn slot_of(&self, expert: u32) -> Option<u32> {
        self.experts
            .iter()
            .find(|(e, _)| *e == expert)
            .map(|(_, s)| *s)
    }
}

/// Residency of one MoE layer's experts in `n_slots` slots.
#[derive(Clone, Debug)]
pub struct LayerCache {
    policy: Policy,
    slot_of: Vec<Option<u32>>,
    expert_in: Vec<Option<u32>>,
    last_use: Vec<u64>,
    freq: Vec<f64>,
    clock: u64,
}

impl LayerCache {
    pub fn new(n_expert: usize, n_slots: usize, policy: Policy) -> Self {
        Self {
            policy,
            slot_of: vec![None; n_expert],
            expert_in: vec![None; n_slots],
            last_use: vec![0; n_slots],
            freq: vec![0.0; n_expert],
            clock: 0,
        }
    }

    pub fn n_slots(&self) -> usize {
        self.expert_in.len()
    }

    pub fn n_expert(&self) -> usize {
        self.slot_of.len()
    }

    /// The slot holding `expert`, if cached.
    pub fn slot(&self, expert: u32) -> Option<u32> {
        self.slot_of.get(expert as usize).copied().flatten()
    }

    /// The expert held by `slot`.
    pub fn expert_in(&self, slot: u32) -> Option<u32> {
        self.expert_in.get(slot as usize).copied().flatten()
    }

    /// Plans a batch whose routed expert ids are `ids` (any order, with
    /// repeats; every id must be `< n_expert`). Updates residency as if the
    /// loads succeed; on a failed load call [`LayerCache::forget`].
    pub fn plan(&mut self, ids: &[u32]) -> Vec<Wave> {
        let mut distinct: Vec<u32> = Vec::new();
        let mut seen = vec![false; self.slot_of.len()];
        for &e in ids {
            if let Some(s) = seen.get_mut(e as usize) {
                if !*s {
                    *s = true;
                    distinct.push(e);
                }
            }
        }
        if self.policy == Policy::Lfu {
            let decay = 0.5f64.powf(1.0 / LFU_HALF_LIFE);
            self.freq.iter_mut().for_each(|f| *f *= decay);
            distinct.iter().for_each(|&e| self.freq[e as usize] += 1.0);
        }
        // Cached experts first: they need no load and stay in the first wave.
        distinct.sort_by_key(|&e| self.slot(e).is_none());
        let n_slots = self.n_slots();
        let mut waves = Vec::new();
        for chunk in distinct.chunks(n_slots.max(1)) {
            // Each wave is its own moment in recency order.
            self.clock += 1;
            let mut protected = vec![false; n_slots];
            for &e in chunk {
                if let Some(s) = self.slot(e) {
                    protected[s as usize] = true;
                }
            }
            let mut wave = Wave::default();
            for &e in chunk {
                let slot = match self.slot(e) {
                    Some(s) => s,
                    None => {
                        let s = self.victim(&protected);
                        if let Some(old) = self.expert_in[s as usize] {
                            self.slot_of[old as usize] = None;
                        }
                        self.expert_in[s as usize] = Some(e);
                        self.slot_of[e as usize] = Some(s);
                        wave.loads.push((e, s));
                        s
                    }
                };
                protected[slot as usize] = true;
                self.last_use[slot as usize] = self.clock;
                wave.experts.push((e, slot));
            }
            waves.push(wave);
        }
        waves
    }

    /// Reserves slots for a speculative read of `experts` (the next batch's
    /// likely choice): experts not yet cached get a victim slot, in order, at
    /// most one per slot. Returns the `(expert, slot)` loads. They count as
    /// recently used, so a correct guess is a hit; a wrong one is evicted
    /// after the experts the next batch really uses.
    pub fn prefetch(&mut self, experts: &[u32]) -> Vec<(u32, u32)> {
        let n_slots = self.n_slots();
        let mut protected = vec![false; n_slots];
        let mut loads = Vec::new();
        for &e in experts {
            if e as usize >= self.slot_of.len() || loads.len() == n_slots {
                break;
            }
            if let Some(s) = self.slot(e) {
                protected[s as usize] = true;
                continue;
            }
            let s = self.victim(&protected);
            if protected[s as usize] {
                break;
            }
            if let Some(old) = self.expert_in[s as usize] {
                self.slot_of[old as usize] = None;
            }
            self.expert_in[s as usize] = Some(e);
            self.slot_of[e as usize] = Some(s);
            self.last_use[s as usize] = self.clock;
            protected[s as usize] = true;
            loads.push((e, s));
        }
        loads
    }

    /// Marks `slot` empty (its load failed).
    pub fn forget(&mut self, slot: u32) {
        if let Some(e) = self.expert_in.get_mut(slot as usize).and_then(Option::take) {
            self.slot_of[e as usize] = None;
        }
    }

    /// An unprotected slot to (re)use: a free one first, else by policy
    /// (slot 0, protected, when every slot is protected).
    fn victim(&self, protected: &[bool]) -> u32 {
        let mut best: Option<(usize, (f64, u64))> = None;
        for (s, _) in protected.iter().enumerate().filter(|(_, p)| !**p) {
            let key = match self.expert_in[s] {
                None => return s as u32,
                Some(e) => match self.policy {
                    Policy::Lru => (0.0, self.last_use[s]),
                    Policy::Lfu => (self.freq[e as usize], self.last_use[s]),
                },
            };
            if best.is_none_or(|(_, k)| key.0 < k.0 || (key.0 == k.0 && key.1 < k.1)) {
                best = Some((s, key));
            }
        }
        // A wave never holds more experts than slots, so an unprotected slot exists.
        best.map(|(s, _)| s as u32).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_the_least_recently_used_unprotected_expert() {
        let mut c = LayerCache::new(8, 2, Policy::Lru);
        assert_eq!(c.plan(&[1]).concat_loads(), vec![1]);
        assert_eq!(c.plan(&[2]).concat_loads(), vec![2]);
        c.plan(&[1]); // 1 is now more recent than 2
        assert_eq!(c.plan(&[3]).concat_loads(), vec![3]);
        assert_eq!(c.slot(2), None);
        assert!(c.slot(1).is_some() && c.slot(3).is_some());
    }

    #[test]
    fn more_experts_than_slots_run_in_waves_with_cached_experts_first() {
        let mut c = LayerCache::new(8, 2, Policy::Lru);
        c.plan(&[5]);
        let waves = c.plan(&[0, 1, 5, 2, 0]);
        assert_eq!(waves.len(), 2);
        assert_eq!(waves[0].experts[0].0, 5);
        assert!(waves[0].loads.len() == 1);
        let all: Vec<u32> = waves
            .iter()
            .flat_map(|w| w.experts.iter().map(|e| e.0))
            .collect();
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2, 5]);
    }

    trait Loads {
        fn concat_loads(&self) -> Vec<u32>;
    }
    impl Loads for Vec<Wave> {
        fn concat_loads(&self) -> Vec<u32> {
            self.iter()
                .flat_map(|w| w.loads.iter().map(|l| l.0))
                .collect()
        }
    }
}
