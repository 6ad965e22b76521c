//! The per-layer expert cache: which expert sits in which slot, the eviction
//! policy, and the plan for one batch (waves of at most `n_slots` distinct
//! experts, each expert in exactly one wave, cached experts first).
//!
//! Residency is the truth about slot bytes: a slot is recorded as holding an
//! expert only after that expert's bytes are in it ([`LayerCache::finish_wave`],
//! [`LayerCache::finish_loads`]), and a slot about to be overwritten is
//! recorded empty before the write starts ([`LayerCache::begin_wave`],
//! [`LayerCache::begin_loads`]). Planning ([`LayerCache::plan`],
//! [`LayerCache::prefetch`]) changes no residency, so a read that fails or is
//! cancelled, in any wave, leaves every slot it did not finish empty and every
//! other slot as it was.

/// Eviction policy (`--longhaul-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Evict the least recently used expert.
    Lru,
    /// Evict the least frequently used expert; counts decay by half every
    /// `LFU_HALF_LIFE` batches so old popularity fades. Ties fall back to LRU.
    Lfu,
    /// Evict as whichever of LRU and LFU would have missed less on this
    /// layer's recent batches: both are replayed beside the cache on the
    /// same demand ([`Replays`]), their misses decaying by half every
    /// `AUTO_HALF_LIFE` batches, and LRU decides until LFU has missed less.
    /// Which wins depends on the routing: a router whose experts are
    /// popular for a while and then not favours LRU, one with a lasting
    /// popularity skew LFU. Replaying costs no read; it is two more plans
    /// of the batch's distinct experts.
    Auto,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lru" => Ok(Policy::Lru),
            "lfu" => Ok(Policy::Lfu),
            "auto" => Ok(Policy::Auto),
            other => Err(format!(
                "unknown cache policy `{other}`; use lru, lfu or auto"
            )),
        }
    }
}

const LFU_HALF_LIFE: f64 = 64.0;
/// Batches over which [`Policy::Auto`]'s replayed misses halve.
const AUTO_HALF_LIFE: f64 = 64.0;

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

/// A wave whose cached experts are no longer in the slots its plan found them
/// in (the plan is stale: residency changed between planning and loading).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleWave {
    pub expert: u32,
    pub slot: u32,
}

/// Residency of one MoE layer's experts in `n_slots` slots.
#[derive(Clone, Debug)]
pub struct LayerCache {
    policy: Policy,
    /// What victims are chosen by: `policy`, or under [`Policy::Auto`] LRU
    /// or LFU as its replays decide.
    evict_by: Policy,
    slot_of: Vec<Option<u32>>,
    expert_in: Vec<Option<u32>>,
    last_use: Vec<u64>,
    freq: Vec<f64>,
    clock: u64,
    /// [`Policy::Auto`]'s replays (`None` otherwise, and in a plan's
    /// scratch copy).
    replays: Option<Box<Replays>>,
}

/// LRU and LFU caches of the same size as the real one, fed the same
/// batches as if every read succeeded and no lookahead ran: the misses each
/// policy would have had on this layer's demand, decayed
/// ([`AUTO_HALF_LIFE`]).
#[derive(Clone, Debug)]
struct Replays {
    lru: LayerCache,
    lfu: LayerCache,
    lru_misses: f64,
    lfu_misses: f64,
}

impl Replays {
    /// Replays one batch's distinct experts through both; returns the
    /// policy that has missed less, LRU on a tie.
    fn replay(&mut self, distinct: &[u32]) -> Policy {
        let decay = 0.5f64.powf(1.0 / AUTO_HALF_LIFE);
        self.lru_misses = self.lru_misses * decay + self.lru.replay(distinct).1 as f64;
        self.lfu_misses = self.lfu_misses * decay + self.lfu.replay(distinct).1 as f64;
        if self.lfu_misses < self.lru_misses {
            Policy::Lfu
        } else {
            Policy::Lru
        }
    }
}

impl LayerCache {
    pub fn new(n_expert: usize, n_slots: usize, policy: Policy) -> Self {
        let replays = (policy == Policy::Auto).then(|| {
            Box::new(Replays {
                lru: LayerCache::new(n_expert, n_slots, Policy::Lru),
                lfu: LayerCache::new(n_expert, n_slots, Policy::Lfu),
                lru_misses: 0.0,
                lfu_misses: 0.0,
            })
        });
        Self {
            policy,
            evict_by: if policy == Policy::Lfu {
                Policy::Lfu
            } else {
                Policy::Lru
            },
            slot_of: vec![None; n_expert],
            expert_in: vec![None; n_slots],
            last_use: vec![0; n_slots],
            freq: vec![0.0; n_expert],
            clock: 0,
            replays,
        }
    }

    /// The policy victims are chosen by now: LRU or LFU (see
    /// [`Policy::Auto`]).
    pub fn evicting_by(&self) -> Policy {
        self.evict_by
    }

    /// A copy to plan in: residency and counts without the replays.
    fn scratch(&self) -> LayerCache {
        LayerCache {
            policy: self.policy,
            evict_by: self.evict_by,
            slot_of: self.slot_of.clone(),
            expert_in: self.expert_in.clone(),
            last_use: self.last_use.clone(),
            freq: self.freq.clone(),
            clock: self.clock,
            replays: None,
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
    /// repeats; ids `>= n_expert` are ignored). Later waves are planned as if
    /// the earlier ones had landed, but residency does not change here: run
    /// each wave between [`LayerCache::begin_wave`] and
    /// [`LayerCache::finish_wave`] (or [`LayerCache::apply`] it, for a replay
    /// that assumes every read succeeds). LFU counts the batch's demand now.
    pub fn plan(&mut self, ids: &[u32]) -> Vec<Wave> {
        let (mut distinct, _) = self.distinct(ids);
        self.count_use(&distinct);
        // Cached experts first: they need no load and stay in the first wave.
        distinct.sort_by_key(|&e| self.slot(e).is_none());
        // Scratch residency in which each planned wave lands before the next
        // is planned.
        let mut landed = self.scratch();
        let mut waves = Vec::new();
        for chunk in distinct.chunks(self.n_slots().max(1)) {
            let wave = landed.plan_wave(chunk, &[]);
            landed.apply(&wave);
            waves.push(wave);
        }
        waves
    }

    /// Plans a batch in one wave while the `(expert, slot)` reads `landing`
    /// (a lookahead's, their slots recorded empty) are still in flight: the
    /// batch's experts among them count as in their slots (the wave lists
    /// them, without loading them), and no load takes a landing slot.
    /// `None`, planning nothing, when the batch's distinct experts and the
    /// landing ones it does not use are more than the slots.
    pub fn plan_landing(&mut self, ids: &[u32], landing: &[(u32, u32)]) -> Option<Wave> {
        let (mut distinct, seen) = self.distinct(ids);
        let unused = landing
            .iter()
            .filter(|(e, _)| !seen.get(*e as usize).copied().unwrap_or(false))
            .count();
        if distinct.len() + unused > self.n_slots() {
            return None;
        }
        self.count_use(&distinct);
        let mut landed = self.scratch();
        landed.finish_loads(landing);
        distinct.sort_by_key(|&e| landed.slot(e).is_none());
        Some(landed.plan_wave(&distinct, landing))
    }

    /// A batch's distinct experts in first-use order (ids `>= n_expert`
    /// ignored), and per expert whether the batch uses it.
    fn distinct(&self, ids: &[u32]) -> (Vec<u32>, Vec<bool>) {
        let mut seen = vec![false; self.slot_of.len()];
        let mut distinct = Vec::new();
        for &e in ids {
            if let Some(s) = seen.get_mut(e as usize) {
                if !std::mem::replace(s, true) {
                    distinct.push(e);
                }
            }
        }
        (distinct, seen)
    }

    /// LFU's count of a batch's distinct experts, and under
    /// [`Policy::Auto`] their replay.
    fn count_use(&mut self, distinct: &[u32]) {
        if self.policy != Policy::Lru {
            let decay = 0.5f64.powf(1.0 / LFU_HALF_LIFE);
            self.freq.iter_mut().for_each(|f| *f *= decay);
            distinct.iter().for_each(|&e| self.freq[e as usize] += 1.0);
        }
        if let Some(r) = &mut self.replays {
            self.evict_by = r.replay(distinct);
        }
    }

    /// Slots for one wave's experts (at most `n_slots`): cached ones keep
    /// theirs, the others take victims that the wave does not use and that
    /// no read in `busy` is writing.
    fn plan_wave(&self, chunk: &[u32], busy: &[(u32, u32)]) -> Wave {
        let mut protected = vec![false; self.n_slots()];
        for &(_, s) in busy {
            if let Some(p) = protected.get_mut(s as usize) {
                *p = true;
            }
        }
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
                    wave.loads.push((e, s));
                    s
                }
            };
            protected[slot as usize] = true;
            wave.experts.push((e, slot));
        }
        wave
    }

    /// Starts a wave: checks that its cached experts are still where the
    /// plan found them, then records its load slots empty (their bytes are
    /// about to be overwritten).
    pub fn begin_wave(&mut self, wave: &Wave) -> Result<(), StaleWave> {
        self.begin_wave_landing(wave, &[])
    }

    /// [`LayerCache::begin_wave`] for a wave of [`LayerCache::plan_landing`]:
    /// its experts among `landing` are not yet recorded in their slots.
    pub fn begin_wave_landing(
        &mut self,
        wave: &Wave,
        landing: &[(u32, u32)],
    ) -> Result<(), StaleWave> {
        let mut loading = vec![false; self.n_slots()];
        for &(_, s) in wave.loads.iter().chain(landing) {
            if let Some(l) = loading.get_mut(s as usize) {
                *l = true;
            }
        }
        for &(e, s) in &wave.experts {
            let cached = loading.get(s as usize) == Some(&false);
            if cached && self.expert_in(s) != Some(e) {
                return Err(StaleWave { expert: e, slot: s });
            }
        }
        self.begin_loads(&wave.loads);
        Ok(())
    }

    /// Records every expert of `wave` as held by its slot and used now. Call
    /// only once the wave's loads are in their slots.
    pub fn finish_wave(&mut self, wave: &Wave) {
        // Each wave is its own moment in recency order.
        self.clock += 1;
        for &(e, s) in &wave.experts {
            self.put(e, s);
        }
    }

    /// [`LayerCache::begin_wave`] then [`LayerCache::finish_wave`]: the wave
    /// as if its reads succeeded (for replays of a trace).
    pub fn apply(&mut self, wave: &Wave) {
        self.begin_loads(&wave.loads);
        self.finish_wave(wave);
    }

    /// Plans a batch and [`LayerCache::apply`]s every wave: a replay of it.
    /// Returns its hits and misses.
    pub fn replay(&mut self, ids: &[u32]) -> (u64, u64) {
        let (mut hits, mut misses) = (0, 0);
        for w in self.plan(ids) {
            self.apply(&w);
            misses += w.loads.len() as u64;
            hits += (w.experts.len() - w.loads.len()) as u64;
        }
        (hits, misses)
    }

    /// Picks slots for a speculative read of `experts` (the next batch's
    /// likely choice): experts not yet cached get a victim slot, in order, at
    /// most one per slot. Returns the `(expert, slot)` loads, to be run
    /// between [`LayerCache::begin_loads`] and [`LayerCache::finish_loads`].
    /// They count as recently used, so a correct guess is a hit; a wrong one
    /// is evicted after the experts the next batch really uses.
    pub fn prefetch(&self, experts: &[u32]) -> Vec<(u32, u32)> {
        let mut landed = self.scratch();
        let n_slots = self.n_slots();
        let mut protected = vec![false; n_slots];
        let mut loads = Vec::new();
        for &e in experts {
            if e as usize >= self.slot_of.len() || loads.len() == n_slots {
                break;
            }
            if let Some(s) = landed.slot(e) {
                protected[s as usize] = true;
                continue;
            }
            let s = landed.victim(&protected);
            if protected[s as usize] {
                break;
            }
            landed.put(e, s);
            protected[s as usize] = true;
            loads.push((e, s));
        }
        loads
    }

    /// Records the slots of `loads` empty: their bytes are about to be
    /// overwritten, and nothing may use what they held.
    pub fn begin_loads(&mut self, loads: &[(u32, u32)]) {
        for &(_, s) in loads {
            self.evict(s);
        }
    }

    /// Records each `(expert, slot)` of `loads` as held and used now. Call
    /// only once their bytes are in their slots.
    pub fn finish_loads(&mut self, loads: &[(u32, u32)]) {
        for &(e, s) in loads {
            self.put(e, s);
        }
    }

    /// `slot` holds `expert` from now on, used at the current clock.
    fn put(&mut self, expert: u32, slot: u32) {
        if self.expert_in(slot) != Some(expert) {
            self.evict(slot);
            if let Some(old) = self.slot(expert) {
                self.evict(old);
            }
        }
        if let (Some(held), Some(at)) = (
            self.expert_in.get_mut(slot as usize),
            self.slot_of.get_mut(expert as usize),
        ) {
            *held = Some(expert);
            *at = Some(slot);
            self.last_use[slot as usize] = self.clock;
        }
    }

    /// Marks `slot` empty.
    fn evict(&mut self, slot: u32) {
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
                Some(e) => match self.evict_by {
                    Policy::Lfu => (self.freq[e as usize], self.last_use[s]),
                    Policy::Lru | Policy::Auto => (0.0, self.last_use[s]),
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

    /// Plans `ids` and applies every wave as if its reads succeeded.
    fn run(c: &mut LayerCache, ids: &[u32]) -> Vec<Wave> {
        let waves = c.plan(ids);
        waves.iter().for_each(|w| c.apply(w));
        waves
    }

    #[test]
    fn lru_evicts_the_least_recently_used_unprotected_expert() {
        let mut c = LayerCache::new(8, 2, Policy::Lru);
        assert_eq!(run(&mut c, &[1]).concat_loads(), vec![1]);
        assert_eq!(run(&mut c, &[2]).concat_loads(), vec![2]);
        run(&mut c, &[1]); // 1 is now more recent than 2
        assert_eq!(run(&mut c, &[3]).concat_loads(), vec![3]);
        assert_eq!(c.slot(2), None);
        assert!(c.slot(1).is_some() && c.slot(3).is_some());
    }

    #[test]
    fn more_experts_than_slots_run_in_waves_with_cached_experts_first() {
        let mut c = LayerCache::new(8, 2, Policy::Lru);
        run(&mut c, &[5]);
        let waves = run(&mut c, &[0, 1, 5, 2, 0]);
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

    #[test]
    fn planning_changes_no_residency_and_a_failed_wave_leaves_its_slots_empty() {
        let mut c = LayerCache::new(8, 2, Policy::Lru);
        run(&mut c, &[5, 6]);
        let waves = c.plan(&[5, 1, 2, 3]);
        assert_eq!(waves.len(), 2);
        // Nothing moved yet.
        assert_eq!((c.slot(5).is_some(), c.slot(6).is_some()), (true, true));
        assert_eq!(c.slot(1), None);
        // Wave 0 lands (5 cached, 1 read over 6's slot).
        c.begin_wave(&waves[0]).expect("fresh plan");
        assert_eq!(c.slot(6), None, "a slot being overwritten is empty");
        c.finish_wave(&waves[0]);
        assert!(c.slot(5).is_some() && c.slot(1).is_some());
        // Wave 1 starts (2 and 3 over 5 and 1) and its read fails: no finish.
        c.begin_wave(&waves[1]).expect("wave 0 landed");
        for e in [1, 2, 3, 5, 6] {
            assert_eq!(c.slot(e), None, "expert {e}");
        }
        assert_eq!((c.expert_in(0), c.expert_in(1)), (None, None));
        // The retry plans from what is really there: everything is a load.
        let retry = c.plan(&[5, 1, 2, 3]);
        assert_eq!(retry.iter().map(|w| w.loads.len()).sum::<usize>(), 4);
    }

    #[test]
    fn a_wave_whose_cached_expert_moved_is_stale() {
        let mut c = LayerCache::new(8, 2, Policy::Lru);
        run(&mut c, &[4]);
        let waves = c.plan(&[4]);
        assert!(waves[0].loads.is_empty());
        let s = c.slot(4).expect("cached");
        c.begin_loads(&[(7, s)]);
        assert_eq!(
            c.begin_wave(&waves[0]),
            Err(StaleWave { expert: 4, slot: s })
        );
    }

    #[test]
    fn prefetch_reserves_nothing_until_its_reads_finish() {
        let mut c = LayerCache::new(8, 2, Policy::Lru);
        run(&mut c, &[0]);
        run(&mut c, &[1]);
        let loads = c.prefetch(&[2, 1]);
        assert_eq!(loads.len(), 1, "{loads:?}");
        assert!(c.slot(0).is_some() && c.slot(1).is_some() && c.slot(2).is_none());
        c.begin_loads(&loads);
        // A cancelled read stops here: the victim (0's slot) is empty, 1 stays.
        assert_eq!(c.slot(0), None);
        assert!(c.slot(1).is_some() && c.slot(2).is_none());
        c.finish_loads(&loads);
        assert_eq!(c.slot(2), Some(loads[0].1));
    }

    #[test]
    fn a_plan_around_reads_in_flight_uses_them_and_never_takes_their_slots() {
        let mut c = LayerCache::new(8, 4, Policy::Lru);
        run(&mut c, &[0, 1]);
        run(&mut c, &[2]);
        // A lookahead reads 3 and 4 into the two slots it evicts (0's and
        // 1's, the least recent): recorded empty while in flight.
        let landing = c.prefetch(&[3, 4]);
        assert_eq!(landing.iter().map(|l| l.0).collect::<Vec<_>>(), vec![3, 4]);
        c.begin_loads(&landing);
        let busy: Vec<u32> = landing.iter().map(|l| l.1).collect();
        // The batch uses 3 (in flight), 2 (cached) and 5 (to load): 5 must
        // take the one slot neither cached nor landing, though the landing
        // slots are recorded empty and an empty slot is the first victim.
        let wave = c.plan_landing(&[3, 2, 5, 3], &landing).expect("fits");
        assert_eq!(wave.slot_of(3), Some(landing[0].1));
        assert_eq!(wave.slot_of(2), c.slot(2));
        assert_eq!(wave.loads.len(), 1);
        let (e, s) = wave.loads[0];
        assert_eq!(e, 5);
        assert!(!busy.contains(&s) && Some(s) != c.slot(2), "slot {s}");
        // 3 is not recorded until it lands; starting the wave accepts that.
        assert_eq!(c.slot(3), None);
        assert!(c.begin_wave(&wave).is_err(), "3 is not in its slot yet");
        c.begin_wave_landing(&wave, &landing)
            .expect("landing accepted");
        // Three distinct experts and 4 (landing, unused) need 4 slots of 4;
        // a fifth does not fit beside the reads: plan as usual instead.
        assert!(c.plan_landing(&[3, 2, 5, 6], &landing).is_none());
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
