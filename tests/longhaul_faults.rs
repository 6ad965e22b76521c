//! I/O faults under longhaul: an injected device error, a truncated shard
//! (real short reads) and a removed file make generation fail with a typed
//! error or carry on; the cache stays consistent and generation succeeds, with
//! the resident output bit for bit, once the file is back.
//!
//! The invariant under test (DESIGN.md, longhaul): a slot is recorded as
//! holding an expert only after that expert's bytes are in it, and a failed
//! or cancelled read, in any wave, leaves the cache as if it had not been
//! planned. Faults come from the reader's test seam
//! (`gguf::Model::set_read_fault`), at every read position of a run and at
//! random positions over random token streams; the slot-level property test
//! compares every slot the cache records as filled with the file's bytes.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use common::argmax;
use longhaul::backend::cpu::CpuBackend;
use longhaul::gguf;
use longhaul::longhaul::{LonghaulConfig, LonghaulError, Policy};
use longhaul::model::{Logits, Model, ModelError};
use longhaul::state::SeqState;
use longhaul::synth::{self, SynthSpec};
use longhaul::tensor::GgmlType;
use proptest::prelude::*;

fn model_file(name: &str) -> PathBuf {
    model_file_seeded(name, SynthSpec::tiny().seed)
}

fn model_file_seeded(name: &str, seed: u64) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("longhaul-faults");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(name);
    let spec = SynthSpec {
        n_layer: 2,
        n_expert: 8,
        n_expert_used: 2,
        seed,
        ..SynthSpec::tiny()
    };
    synth::write(&spec, &path).expect("write model");
    path
}

/// Greedy tokens from a fresh KV cache, or the first error.
fn generate(m: &Model<CpuBackend>, n: usize) -> Result<Vec<u32>, ModelError> {
    let mut kv = SeqState::new(m, 64, GgmlType::F32)?;
    let mut logits = kv.eval(m, &[1, 2, 3, 4, 5, 6, 7, 8], Logits::Last)?;
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(t);
        logits = kv.eval(m, &[t], Logits::Last)?;
    }
    Ok(out)
}

fn longhaul(path: &Path) -> Model<CpuBackend> {
    let file = Arc::new(gguf::Model::open(path).expect("open"));
    let probe = Model::load(CpuBackend::new(), file.clone()).expect("load");
    let (layers, bytes) = probe.expert_slot_cost().expect("cost");
    let cfg = LonghaulConfig {
        budget_bytes: 2 * layers as u64 * bytes,
        policy: Policy::Lru,
        prefetch: true.into(),
        verify: false,
        direct_io: true,
        uring: false,
    };
    Model::load_with(CpuBackend::new(), file, Some(cfg)).expect("longhaul")
}

fn assert_read_error<T>(r: Result<T, ModelError>, path: &Path) {
    match r {
        Err(ModelError::Longhaul(e @ LonghaulError::Read { .. })) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&path.display().to_string()) && msg.contains("retry"),
                "message: {msg}"
            );
        }
        other => panic!(
            "expected a longhaul read error, got {:?}",
            other.map(|_| ()).map_err(|e| e.to_string())
        ),
    }
}

#[test]
fn injected_io_errors_fail_generation_and_recover() {
    let path = model_file("eio.gguf");
    let want = generate(&common::load(&path), 16).expect("resident");
    let m = longhaul(&path);
    assert_eq!(generate(&m, 16).expect("longhaul"), want);
    m.file.set_read_fault(Some(Arc::new(|_, _, _| {
        Some(std::io::Error::from_raw_os_error(libc::EIO))
    })));
    assert_read_error(generate(&m, 16), &path);
    // A fault on one read in three: some loads fail mid-wave.
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    m.file.set_read_fault(Some(Arc::new(move |_, _, _| {
        (n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 3 == 2)
            .then(|| std::io::Error::from_raw_os_error(libc::EIO))
    })));
    assert_read_error(generate(&m, 16), &path);
    m.file.set_read_fault(None);
    assert_eq!(
        generate(&m, 16).expect("after the fault"),
        want,
        "the cache must be consistent after failed loads"
    );
}

#[test]
fn truncated_shard_gives_short_read_errors_until_restored() {
    let path = model_file("truncate.gguf");
    let want = generate(&common::load(&path), 16).expect("resident");
    let bytes = std::fs::read(&path).expect("read");
    let m = longhaul(&path);
    // Cut the file in the middle of the expert data (after resident tensors
    // were copied at load, so nothing depends on the mapping).
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open rw");
    f.set_len(bytes.len() as u64 / 2).expect("truncate");
    assert_changed_error(generate(&m, 16), &path);
    // Put the bytes back into the same file.
    use std::os::unix::fs::FileExt;
    f.write_all_at(&bytes, 0).expect("restore");
    assert_eq!(generate(&m, 16).expect("after restore"), want);
}

#[test]
fn removed_file_keeps_working_through_the_open_descriptor() {
    let path = model_file("removed.gguf");
    let want = generate(&common::load(&path), 16).expect("resident");
    let m = longhaul(&path);
    std::fs::remove_file(&path).expect("remove");
    // Unix keeps an unlinked file alive while it is open: reads still succeed.
    assert_eq!(generate(&m, 16).expect("after removal"), want);
}

fn assert_changed_error<T>(r: Result<T, ModelError>, path: &Path) {
    match r {
        Err(e) => {
            let msg = e.to_string();
            assert!(
                matches!(
                    e,
                    ModelError::Gguf(gguf::GgufError::FileChanged { .. })
                        | ModelError::Longhaul(LonghaulError::FileChanged { .. })
                ) && msg.contains(&path.display().to_string())
                    && msg.contains("changed"),
                "expected a file-changed error, got: {msg}"
            );
        }
        Ok(_) => panic!("expected a file-changed error, got output"),
    }
}

const PROMPT: [u32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

/// The logits of every step of a greedy run (prompt, then `n` tokens), as
/// bits, from a fresh KV cache.
fn logit_bits(
    m: &Model<CpuBackend>,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<Vec<u32>>, ModelError> {
    let mut kv = SeqState::new(m, 64, GgmlType::F32)?;
    let mut logits = kv.eval(m, prompt, Logits::Last)?;
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(logits.iter().map(|x| x.to_bits()).collect());
        logits = kv.eval(m, &[t], Logits::Last)?;
    }
    out.push(logits.iter().map(|x| x.to_bits()).collect());
    Ok(out)
}

fn longhaul_slots(
    file: &Arc<gguf::Model>,
    n_slots: usize,
    policy: Policy,
    prefetch: bool,
    uring: bool,
) -> Model<CpuBackend> {
    let probe = Model::load(CpuBackend::new(), file.clone()).expect("load");
    let (layers, bytes) = probe.expert_slot_cost().expect("cost");
    let cfg = LonghaulConfig {
        budget_bytes: n_slots as u64 * layers as u64 * bytes,
        policy,
        prefetch: prefetch.into(),
        verify: false,
        direct_io: true,
        uring,
    };
    let m = Model::load_with(CpuBackend::new(), file.clone(), Some(cfg)).expect("longhaul");
    assert_eq!(m.n_slots(), n_slots);
    m
}

/// Fails the read numbered `at` (counting from 0), once.
fn fail_read(at: usize) -> gguf::ReadFault {
    let n = AtomicUsize::new(0);
    Arc::new(move |_, _, _| {
        (n.fetch_add(1, Ordering::Relaxed) == at)
            .then(|| std::io::Error::from_raw_os_error(libc::EIO))
    })
}

/// A second prompt after a first one warmed the cache: its prompt batch has
/// hits and runs in several waves at small caches.
const WARMUP: [u32; 3] = [9, 200, 41];

/// A read fails at every position of a request in turn (every wave of every
/// multi-wave batch, every read of a wave, demand or prefetch), after another
/// request warmed the cache; the next identical request gives the resident
/// logits bit for bit.
#[test]
fn a_failed_read_at_any_position_leaves_the_retry_exact() {
    every_failed_read(&model_file("every-position.gguf"), &[1, 2, 3, 4, 6]);
}

/// The same with Q8_0 experts, which the slots hold interleaved (`--repack`,
/// converted on the reading threads and at `commit`): a failed read never
/// leaves a slot half converted.
#[test]
fn a_failed_read_of_interleaved_slots_leaves_the_retry_exact() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("longhaul-faults");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("every-position-q8_0.gguf");
    let spec = SynthSpec {
        n_layer: 2,
        n_expert: 8,
        n_expert_used: 2,
        expert_type: GgmlType::Q8_0,
        ..SynthSpec::tiny()
    };
    synth::write(&spec, &path).expect("write model");
    let file = gguf::Model::open(&path).expect("open");
    let t = file.tensor("blk.0.ffn_gate_exps.weight").expect("experts");
    if !longhaul::quant::layout::interleaves(t.ty, t.dims[1] as usize) {
        eprintln!("skipped: no interleaved layout on this CPU");
        return;
    }
    every_failed_read(&path, &[1, 3]);
}

fn every_failed_read(path: &Path, slot_counts: &[usize]) {
    let file = Arc::new(gguf::Model::open(path).expect("open"));
    let resident = Model::load(CpuBackend::new(), file.clone()).expect("resident");
    let want = logit_bits(&resident, &PROMPT, 3).expect("resident run");
    let mut failed_runs = 0;
    for &n_slots in slot_counts {
        // io_uring (`--longhaul-io uring`) checks each slice at submission,
        // where the fault seam fails it.
        for (prefetch, uring) in [(false, false), (true, false), (false, true)] {
            let warm = || {
                let m = longhaul_slots(&file, n_slots, Policy::Lru, prefetch, uring);
                logit_bits(&m, &WARMUP, 2).expect("warm-up");
                m
            };
            // How many reads the request makes after the warm-up.
            let m = warm();
            let count = Arc::new(AtomicUsize::new(0));
            let c = count.clone();
            file.set_read_fault(Some(Arc::new(move |_, _, _| {
                c.fetch_add(1, Ordering::Relaxed);
                None
            })));
            assert_eq!(logit_bits(&m, &PROMPT, 3).expect("clean"), want);
            file.set_read_fault(None);
            let reads = count.load(Ordering::Relaxed);
            assert!(reads > 0);
            for at in 0..reads {
                let m = warm();
                file.set_read_fault(Some(fail_read(at)));
                match logit_bits(&m, &PROMPT, 3) {
                    Err(e) => {
                        failed_runs += 1;
                        assert_read_error(Err::<(), _>(e), path);
                    }
                    // A failed prefetch is not an error: output must be exact.
                    Ok(got) => assert_eq!(
                        got, want,
                        "{n_slots} slots, uring {uring}, read {at} failed quietly"
                    ),
                }
                file.set_read_fault(None);
                for retry in 0..2 {
                    assert_eq!(
                        logit_bits(&m, &PROMPT, 3).expect("retry"),
                        want,
                        "{n_slots} slots, prefetch {prefetch}, uring {uring}, read {at} failed, retry {retry}"
                    );
                }
            }
        }
    }
    assert!(failed_runs > 0, "no injected fault surfaced as an error");
}

/// A small deterministic generator for fault positions.
fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random prompts through a cache of random size (reads through the
    /// I/O threads or io_uring), with reads failing at random, then the
    /// same prompts without faults: every one equals the
    /// resident run bit for bit.
    #[test]
    fn random_faults_over_random_streams_leave_the_cache_exact(
        prompts in prop::collection::vec(prop::collection::vec(0u32..256, 1..12), 2..7),
        n_slots in 1usize..=8,
        lfu in any::<bool>(),
        prefetch in any::<bool>(),
        uring in any::<bool>(),
        fault_seed in 1u64..u64::MAX,
        one_in in 2u64..12,
    ) {
        let file = shared_file("random-streams.gguf");
        let resident = Model::load(CpuBackend::new(), file.clone()).expect("resident");
        let policy = if lfu { Policy::Lfu } else { Policy::Lru };
        let m = longhaul_slots(&file, n_slots, policy, prefetch, uring);
        let faults = Arc::new(std::sync::Mutex::new(fault_seed));
        for p in &prompts {
            let state = faults.clone();
            file.set_read_fault(Some(Arc::new(move |_, _, _| {
                let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                xorshift(&mut s).is_multiple_of(one_in).then(|| std::io::Error::from_raw_os_error(libc::EIO))
            })));
            let _ = logit_bits(&m, p, 2);
            file.set_read_fault(None);
            // The retry the error message suggests.
            let want = logit_bits(&resident, p, 2).expect("resident");
            prop_assert_eq!(logit_bits(&m, p, 2).expect("retry"), want);
        }
        for p in prompts.iter().rev() {
            let want = logit_bits(&resident, p, 2).expect("resident");
            prop_assert_eq!(logit_bits(&m, p, 2).expect("after faults"), want);
        }
    }
}

/// A model file of this binary's own, opened once and shared by the cases
/// of a property test (a fault seam is per file: each test has its own).
fn shared_file(name: &'static str) -> Arc<gguf::Model> {
    static FILES: std::sync::Mutex<Vec<(&str, Arc<gguf::Model>)>> =
        std::sync::Mutex::new(Vec::new());
    let mut files = FILES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, f)) = files.iter().find(|(n, _)| *n == name) {
        return f.clone();
    }
    let f = Arc::new(gguf::Model::open(model_file(name)).expect("open"));
    files.push((name, f.clone()));
    f
}

/// The experts of one layer, read through a [`StreamedLayer`] with faults and
/// cancellations at random reads: after every operation, each slot the cache
/// records as holding an expert holds exactly that expert's bytes.
mod slot_bytes {
    use super::*;
    use longhaul::backend::{Backend, SlotStore};
    use longhaul::longhaul::{slot_tensors, StreamedLayer};

    fn expert_bytes(file: &gguf::Model, t: &gguf::TensorInfo, e: u32, n: u64) -> Vec<u8> {
        let mut buf = vec![0u8; n as usize];
        file.read_at(t.shard, t.offset + e as u64 * n, &mut buf)
            .expect("reference read");
        buf
    }

    /// The bytes of each of slot `s`'s `n_tensors` tensors.
    fn slot_bytes(
        l: &mut StreamedLayer<longhaul::backend::cpu::HostSlots>,
        n_tensors: usize,
        s: u32,
    ) -> Vec<Vec<u8>> {
        let which: Vec<(usize, usize)> = (0..n_tensors).map(|t| (t, s as usize)).collect();
        l.slots
            .slots_mut(&which)
            .expect("slots")
            .into_iter()
            .map(|b| b.to_vec())
            .collect()
    }

    fn check(
        l: &mut StreamedLayer<longhaul::backend::cpu::HostSlots>,
        file: &gguf::Model,
        ts: &[&gguf::TensorInfo],
    ) -> Result<(), TestCaseError> {
        let specs = slot_tensors(ts, false).expect("specs");
        for s in 0..l.cache.n_slots() as u32 {
            let Some(e) = l.cache.expert_in(s) else {
                continue;
            };
            prop_assert_eq!(l.cache.slot(e), Some(s));
            for (t, bytes) in slot_bytes(l, ts.len(), s).iter().enumerate() {
                let want = expert_bytes(file, ts[t], e, specs[t].bytes);
                prop_assert!(
                    bytes == &want,
                    "slot {} says expert {} but tensor {} holds other bytes",
                    s,
                    e,
                    t
                );
            }
        }
        Ok(())
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A batch's ids; the read numbered `fail` of it fails, if any. With
        /// `adopt`, planned as the sync point plans (taking over a
        /// lookahead's reads in flight) and read while its experts are
        /// handed out one by one.
        Batch(Vec<u32>, Option<usize>, bool),
        /// A prefetch; the read numbered `cancel` sets the cancel flag.
        Prefetch(Vec<u32>, Option<usize>),
        /// A lookahead's reads, left in flight (`start_prefetch`) until the
        /// next batch's plan settles them; the read numbered `fail` fails.
        StartPrefetch(Vec<u32>, Option<usize>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (
                prop::collection::vec(0u32..8, 1..16),
                prop::option::of(0usize..40),
                any::<bool>()
            )
                .prop_map(|(i, f, a)| Op::Batch(i, f, a)),
            (
                prop::collection::vec(0u32..8, 1..6),
                prop::option::of(0usize..12)
            )
                .prop_map(|(i, c)| Op::Prefetch(i, c)),
            (
                prop::collection::vec(0u32..8, 1..6),
                prop::option::of(0usize..12)
            )
                .prop_map(|(i, f)| Op::StartPrefetch(i, f)),
        ]
    }

    /// Reads wave `w` as the sync point does (`start_wave`, then
    /// `poll_loaded` and `wait_loaded` until nothing is pending,
    /// `finish_wave`), checking that
    /// each expert handed out as ready holds its bytes then, and that every
    /// expert of the wave is handed out once. Whether the wave loaded.
    fn read_handing_out<'s>(
        l: &mut StreamedLayer<longhaul::backend::cpu::HostSlots>,
        file: &'s gguf::Model,
        reference: &[Vec<Vec<u8>>],
        w: &longhaul::longhaul::Wave,
        io: &longhaul::longhaul::IoScope<'s>,
    ) -> Result<bool, TestCaseError> {
        let Ok(mut fill) = l.start_wave(file, w, io) else {
            return Ok(false);
        };
        let mut handed = Vec::new();
        loop {
            if fill.pending() && l.poll_loaded(file, &mut fill).is_err() {
                return Ok(false);
            }
            for e in fill.take_ready() {
                let s = w.slot_of(e);
                prop_assert!(s.is_some(), "expert {} handed out is not the wave's", e);
                let (s, want) = (s.unwrap_or(0), &reference[e as usize]);
                for (bytes, want) in slot_bytes(l, want.len(), s).iter().zip(want) {
                    prop_assert!(
                        bytes == want,
                        "expert {} handed out before its bytes were in slot {}",
                        e,
                        s
                    );
                }
                handed.push(e);
            }
            if !fill.pending() {
                break;
            }
            if l.wait_loaded(file, &mut fill).is_err() {
                return Ok(false);
            }
        }
        if l.finish_wave(file, &mut fill).is_err() {
            return Ok(false);
        }
        handed.sort_unstable();
        let mut want: Vec<u32> = w.experts.iter().map(|x| x.0).collect();
        want.sort_unstable();
        prop_assert_eq!(handed, want, "every expert of the wave handed out once");
        Ok(true)
    }

    fn distinct(ids: Vec<u32>) -> Vec<u32> {
        let mut seen = [false; 8];
        ids.into_iter()
            .filter(|&e| !std::mem::replace(&mut seen[e as usize], true))
            .collect()
    }

    /// A lookahead returns while its reads are still blocked, holds nothing
    /// the layer needs to plan, and once its layer's sync point cancels it,
    /// the reads not yet started are dropped: only experts read in full are
    /// recorded, and each holds its bytes.
    #[test]
    fn a_lookahead_does_not_hold_the_layer_and_its_unstarted_reads_are_dropped() {
        use std::sync::{Condvar, Mutex};
        use std::time::{Duration, Instant};
        let file = shared_file("lookahead.gguf");
        let ts: Vec<&gguf::TensorInfo> = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
            .iter()
            .map(|n| file.tensor(&format!("blk.0.{n}.weight")).expect("tensor"))
            .collect();
        let specs = slot_tensors(&ts, false).expect("specs");
        let slots = CpuBackend::new().new_slots(&specs, 6).expect("slots");
        let mut l = StreamedLayer::new(0, &ts, slots, 6, Policy::Lru).expect("layer");
        // Every read waits at a gate (at most 20 s) and counts itself in.
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let started = Arc::new(AtomicUsize::new(0));
        let (g, n) = (gate.clone(), started.clone());
        file.set_read_fault(Some(Arc::new(move |_, _, _| {
            n.fetch_add(1, Ordering::SeqCst);
            let (open, cv) = &*g;
            let guard = open.lock().unwrap();
            let _ = cv.wait_timeout_while(guard, Duration::from_secs(20), |o| !*o);
            None
        })));
        let file: &gguf::Model = &file;
        let predicted = [5u32, 2, 7, 0, 3, 6];
        let in_flight = longhaul::longhaul::io_scope(|io| {
            let t0 = Instant::now();
            assert!(l.start_prefetch(file, &predicted, io, None));
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "start_prefetch waited for its reads"
            );
            // Wait until the pool has taken every read it can take.
            let mut seen = 0;
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(50));
                let now = started.load(Ordering::SeqCst);
                if now == seen && now > 0 {
                    break;
                }
                seen = now;
            }
            // While the reads are blocked, nothing is recorded in their slots.
            for &e in &predicted {
                assert_eq!(l.cache.slot(e), None, "expert {e} recorded before its read");
            }
            // The sync point settles it: drops what has not started, then
            // waits for the rest (opening the gate from another thread).
            let opener = std::thread::spawn({
                let gate = gate.clone();
                move || {
                    std::thread::sleep(Duration::from_millis(200));
                    *gate.0.lock().unwrap() = true;
                    gate.1.notify_all();
                }
            });
            l.settle_prefetch(file);
            opener.join().unwrap();
            seen
        });
        file.set_read_fault(None);
        // Reads are taken in order, expert by expert (3 tensors each): the
        // experts whose three reads had all started are in, the rest not.
        let full = (in_flight / 3).min(predicted.len());
        assert!(
            full < predicted.len(),
            "the pool took all {in_flight} reads: nothing to drop"
        );
        for (i, &e) in predicted.iter().enumerate() {
            assert_eq!(
                l.cache.slot(e).is_some(),
                i < full,
                "expert {e} ({in_flight} reads started)"
            );
        }
        assert_eq!(l.stats.prefetched, full as u64);
        check(&mut l, file, &ts).expect("recorded slots hold their bytes");
    }

    /// A decode step's lookahead is queued at its sync point behind the
    /// step's demand reads (`start_prefetch` with the wave's
    /// `demand_gate`): none of its reads starts while a demand read is
    /// still running, all of them run once the demand reads are in, and
    /// `poll_loaded` takes in what has landed without waiting.
    #[test]
    fn a_lookahead_reads_after_the_demand_reads_it_is_queued_behind() {
        queued_behind(false);
    }

    /// As above, where the demand reads are a lookahead's that the wave
    /// took over in flight.
    #[test]
    fn a_lookahead_reads_after_the_taken_over_reads_it_is_queued_behind() {
        queued_behind(true);
    }

    fn queued_behind(taken_over: bool) {
        use std::sync::{Condvar, Mutex};
        use std::time::{Duration, Instant};
        let file = shared_file(if taken_over {
            "gate-taken.gguf"
        } else {
            "gate.gguf"
        });
        let layer = |il: usize| -> Vec<&gguf::TensorInfo> {
            ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
                .iter()
                .map(|n| {
                    file.tensor(&format!("blk.{il}.{n}.weight"))
                        .expect("tensor")
                })
                .collect()
        };
        let (ts_a, ts_b) = (layer(0), layer(1));
        let streamed = |ts: &[&gguf::TensorInfo], il| {
            let specs = slot_tensors(ts, false).expect("specs");
            let slots = CpuBackend::new().new_slots(&specs, 6).expect("slots");
            StreamedLayer::new(il, ts, slots, 6, Policy::Lru).expect("layer")
        };
        let (mut a, mut b) = (streamed(&ts_a, 0), streamed(&ts_b, 1));
        let b_ranges: Vec<(u64, u64)> = ts_b.iter().map(|t| (t.offset, t.offset + t.len)).collect();
        // Layer 0's reads wait at a gate (at most 20 s); layer 1's count
        // themselves in, and whether layer 0's gate was still shut.
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (b_started, b_early) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (g, n, early) = (gate.clone(), b_started.clone(), b_early.clone());
        file.set_read_fault(Some(Arc::new(move |_, offset, _| {
            let (open, cv) = &*g;
            if b_ranges.iter().any(|&(s, e)| (s..e).contains(&offset)) {
                n.fetch_add(1, Ordering::SeqCst);
                if !*open.lock().unwrap() {
                    early.fetch_add(1, Ordering::SeqCst);
                }
                return None;
            }
            let guard = open.lock().unwrap();
            let _ = cv.wait_timeout_while(guard, Duration::from_secs(20), |o| !*o);
            None
        })));
        let file: &gguf::Model = &file;
        let predicted = [4u32, 1, 6];
        longhaul::longhaul::io_scope(|io| {
            if taken_over {
                assert!(a.start_prefetch(file, &[2, 5], io, None));
            }
            let waves = a.plan_adopting(file, &[2, 5]);
            assert_eq!(waves.len(), 1);
            assert_eq!(waves[0].loads.is_empty(), taken_over);
            let mut fill = a.start_wave(file, &waves[0], io).expect("wave");
            let after = fill.demand_gate().expect("reads on the I/O threads");
            assert!(b.start_prefetch(file, &predicted, io, Some(after)));
            // The demand reads are blocked: a poll returns at once with
            // nothing, and no lookahead read starts.
            let t0 = Instant::now();
            a.poll_loaded(file, &mut fill).expect("poll");
            assert!(t0.elapsed() < Duration::from_secs(10), "poll_loaded waited");
            assert!(fill.pending() && fill.take_ready().is_empty());
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(
                b_started.load(Ordering::SeqCst),
                0,
                "a lookahead read started before the demand reads were in"
            );
            *gate.0.lock().unwrap() = true;
            gate.1.notify_all();
            // Polled until in (at most 20 s): both experts handed out.
            let mut ready = Vec::new();
            for _ in 0..2000 {
                a.poll_loaded(file, &mut fill).expect("poll");
                ready.extend(fill.take_ready());
                if !fill.pending() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            ready.sort_unstable();
            assert_eq!(ready, [2, 5]);
            a.finish_wave(file, &mut fill).expect("finish");
            // Settling skips the reads not yet started: let them start
            // (at most 20 s), then count them below.
            let t0 = Instant::now();
            while b_started.load(Ordering::SeqCst) < 3 * predicted.len()
                && t0.elapsed() < Duration::from_secs(20)
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            b.settle_prefetch(file);
        });
        file.set_read_fault(None);
        assert_eq!(
            b_early.load(Ordering::SeqCst),
            0,
            "a lookahead read ran early"
        );
        assert_eq!(b_started.load(Ordering::SeqCst), 3 * predicted.len());
        assert_eq!(b.stats.prefetched, predicted.len() as u64);
        for &e in &predicted {
            assert!(b.cache.slot(e).is_some(), "expert {e} not read ahead");
        }
        check(&mut a, file, &ts_a).expect("layer 0's slots hold their bytes");
        check(&mut b, file, &ts_b).expect("layer 1's slots hold their bytes");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn recorded_slots_hold_their_experts_bytes(
            n_slots in 1usize..=8,
            lfu in any::<bool>(),
            ops in prop::collection::vec(op(), 1..24),
        ) {
            let file = shared_file("slot-bytes.gguf");
            let ts: Vec<&gguf::TensorInfo> = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
                .iter()
                .map(|n| file.tensor(&format!("blk.0.{n}.weight")).expect("tensor"))
                .collect();
            let specs = slot_tensors(&ts, false).expect("specs");
            let slots = CpuBackend::new().new_slots(&specs, n_slots).expect("slots");
            let policy = if lfu { Policy::Lfu } else { Policy::Lru };
            let mut l = StreamedLayer::new(0, &ts, slots, n_slots, policy).expect("layer");
            // Per expert, each tensor's bytes, read before any fault is set.
            let specs = slot_tensors(&ts, false).expect("specs");
            let reference: Vec<Vec<Vec<u8>>> = (0..8u32)
                .map(|e| {
                    ts.iter()
                        .zip(&specs)
                        .map(|(t, s)| expert_bytes(&file, t, e, s.bytes))
                        .collect()
                })
                .collect();
            // Reads started by one operation may still be in flight, under
            // the next one's faults, while it runs.
            let file: &gguf::Model = &file;
            longhaul::longhaul::io_scope(|io| -> Result<(), TestCaseError> {
            for op in ops {
                let n = Arc::new(AtomicUsize::new(0));
                match op {
                    Op::Batch(ids, fail, adopt) => {
                        let c = n.clone();
                        file.set_read_fault(Some(Arc::new(move |_, _, _| {
                            (Some(c.fetch_add(1, Ordering::Relaxed)) == fail)
                                .then(|| std::io::Error::from_raw_os_error(libc::EIO))
                        })));
                        let waves = if adopt {
                            l.plan_adopting(file, &ids)
                        } else {
                            l.plan(file, &ids)
                        };
                        for w in waves {
                            let loaded = if adopt {
                                read_handing_out(&mut l, file, &reference, &w, io)?
                            } else {
                                l.load(file, &w).is_ok()
                            };
                            if !loaded {
                                break;
                            }
                            // What the wave computes from is resident.
                            for &(e, s) in &w.experts {
                                prop_assert_eq!(l.cache.expert_in(s), Some(e));
                            }
                        }
                    }
                    Op::Prefetch(ids, cancel_at) => {
                        let cancel = Arc::new(AtomicBool::new(false));
                        let (c, flag) = (n.clone(), cancel.clone());
                        file.set_read_fault(Some(Arc::new(move |_, _, _| {
                            if Some(c.fetch_add(1, Ordering::Relaxed)) == cancel_at {
                                flag.store(true, Ordering::Relaxed);
                            }
                            None
                        })));
                        l.settle_prefetch(file);
                        l.prefetch(file, &distinct(ids), &cancel);
                    }
                    Op::StartPrefetch(ids, fail) => {
                        let c = n.clone();
                        file.set_read_fault(Some(Arc::new(move |_, _, _| {
                            (Some(c.fetch_add(1, Ordering::Relaxed)) == fail)
                                .then(|| std::io::Error::from_raw_os_error(libc::EIO))
                        })));
                        prop_assert!(l.start_prefetch(file, &distinct(ids), io, None));
                    }
                }
                // The reference reads go through the fault hook too.
                file.set_read_fault(None);
                check(&mut l, file, &ts)?;
            }
            Ok(())
            })?;
            // Nothing read by a lookahead is lost or misplaced once settled.
            l.settle_prefetch(file);
            check(&mut l, file, &ts)?;
        }
    }
}

/// A rewrite in place that keeps the size and misses the fingerprint's
/// samples is taken for a restore by the file check; `--longhaul-verify`
/// still refuses the first re-read of an expert whose bytes changed.
#[test]
fn verify_refuses_an_expert_whose_bytes_changed_between_reads() {
    let path = model_file("verify.gguf");
    let file = Arc::new(gguf::Model::open(&path).expect("open"));
    let probe = Model::load(CpuBackend::new(), file.clone()).expect("load");
    let (layers, bytes) = probe.expert_slot_cost().expect("cost");
    let load = |verify| {
        let cfg = LonghaulConfig {
            budget_bytes: layers as u64 * bytes,
            policy: Policy::Lru,
            prefetch: false.into(),
            verify,
            direct_io: true,
            uring: false,
        };
        Model::load_with(CpuBackend::new(), file.clone(), Some(cfg)).expect("longhaul")
    };
    let (plain, verified) = (load(false), load(true));
    // One slot per layer: every expert is read again and again.
    let want = logit_bits(&plain, &PROMPT, 3).expect("plain");
    assert_eq!(logit_bits(&verified, &PROMPT, 3).expect("verified"), want);
    // Flip a byte in the middle of every expert's slice of layer 0's up
    // tensor, where the fingerprint does not look.
    let t = file
        .tensor("blk.0.ffn_up_exps.weight")
        .expect("tensor")
        .clone();
    let n_expert = *t.dims.last().expect("dims");
    let slice = t.len / n_expert;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("rw");
    use std::os::unix::fs::FileExt;
    for e in 0..n_expert {
        let mut placed = false;
        for step in 0..8 {
            let at = t.offset + e * slice + slice / 2 + step * 97;
            let mut b = [0u8; 1];
            f.read_exact_at(&mut b, at).expect("read");
            f.write_all_at(&[b[0] ^ 0x5a], at).expect("write");
            if file.check_files().is_ok() {
                placed = true;
                break;
            }
            f.write_all_at(&b, at).expect("undo");
        }
        assert!(placed, "no unsampled byte found in expert {e}");
    }
    match logit_bits(&verified, &PROMPT, 3) {
        Err(ModelError::Longhaul(e @ LonghaulError::FileChanged { .. })) => {
            let msg = e.to_string();
            assert!(
                msg.contains("checksum") && msg.contains(&path.display().to_string()),
                "{msg}"
            );
        }
        other => panic!(
            "expected a checksum error, got {:?}",
            other.map(|_| ()).map_err(|e| e.to_string())
        ),
    }
    // Without verification the same rewrite goes unseen (the gap the flag closes).
    assert_ne!(logit_bits(&plain, &PROMPT, 3).expect("plain after"), want);
}
