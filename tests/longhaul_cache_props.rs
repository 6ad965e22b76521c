//! Property tests of the longhaul planner over random expert-id streams and
//! cache sizes: needed experts are never evicted, no slot holds two experts,
//! each distinct expert of a batch is computed in exactly one wave, and LRU
//! evicts the least recently used unprotected expert (checked against a
//! brute-force model of recency).

use std::collections::{HashMap, HashSet};

use longhaul::longhaul::{LayerCache, Policy};
use proptest::prelude::*;

fn batches() -> impl Strategy<Value = (usize, usize, Vec<Vec<u32>>)> {
    (2usize..24).prop_flat_map(|n_expert| {
        (
            Just(n_expert),
            1usize..=n_expert,
            prop::collection::vec(prop::collection::vec(0..n_expert as u32, 1..20), 1..30),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn planner_invariants((n_expert, n_slots, stream) in batches(), lfu in any::<bool>()) {
        let policy = if lfu { Policy::Lfu } else { Policy::Lru };
        let mut c = LayerCache::new(n_expert, n_slots, policy);
        // Brute-force recency: expert -> last batch/wave tick it was used.
        let mut last_use: HashMap<u32, u64> = HashMap::new();
        let mut tick = 0u64;
        for ids in &stream {
            let waves = c.plan(ids);
            waves.iter().for_each(|w| c.apply(w));
            let distinct: HashSet<u32> = ids.iter().copied().collect();
            // Each distinct expert in exactly one wave; no wave exceeds the slots.
            let mut seen = HashSet::new();
            for w in &waves {
                prop_assert!(w.experts.len() <= n_slots);
                for &(e, _) in &w.experts {
                    prop_assert!(seen.insert(e), "expert {} in two waves", e);
                }
            }
            prop_assert_eq!(&seen, &distinct);
            for w in &waves {
                tick += 1;
                // Within a wave, distinct experts occupy distinct slots.
                let slots: HashSet<u32> = w.experts.iter().map(|&(_, s)| s).collect();
                prop_assert_eq!(slots.len(), w.experts.len());
                // Loads only go to victims that are not needed by this wave.
                for &(e, s) in &w.loads {
                    prop_assert!(w.experts.contains(&(e, s)));
                }
                if policy == Policy::Lru && !w.loads.is_empty() {
                    // Every evicted expert must be no more recent than every
                    // unprotected expert that stayed.
                    let wave_experts: HashSet<u32> = w.experts.iter().map(|&(e, _)| e).collect();
                    let evicted: Vec<u32> = last_use.keys().copied().filter(|e| c.slot(*e).is_none()).collect();
                    let kept: Vec<u32> = last_use.keys().copied().filter(|e| c.slot(*e).is_some() && !wave_experts.contains(e)).collect();
                    for ev in &evicted {
                        for k in &kept {
                            prop_assert!(last_use[ev] <= last_use[k], "LRU evicted {} (used {}) but kept {} (used {})", ev, last_use[ev], k, last_use[k]);
                        }
                    }
                }
                for &(e, _) in &w.experts {
                    last_use.insert(e, tick);
                }
            }
            // Needed experts of the last wave are resident now; every slot
            // holds at most one expert and the two maps agree.
            if let Some(w) = waves.last() {
                for &(e, s) in &w.experts {
                    prop_assert_eq!(c.slot(e), Some(s));
                }
            }
            let mut holders = HashMap::new();
            for e in 0..n_expert as u32 {
                if let Some(s) = c.slot(e) {
                    prop_assert!(holders.insert(s, e).is_none(), "slot {} holds two experts", s);
                    prop_assert_eq!(c.expert_in(s), Some(e));
                }
            }
            last_use.retain(|e, _| c.slot(*e).is_some());
        }
    }
}
