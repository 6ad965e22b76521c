//! Memory under longhaul: a synthetic model whose routed experts are 8x the
//! cache budget. While generating, resident memory stays under resident
//! weights + budget + a stated overhead, and the file's expert pages do not
//! pile up in the page cache (mincore over a mapping of the file).

mod common;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use common::rss;
use longhaul::backend::cpu::CpuBackend;
use longhaul::gguf;
use longhaul::longhaul::{LonghaulConfig, Policy};
use longhaul::model::{is_routed, Logits, Model};
use longhaul::state::SeqState;
use longhaul::synth::{self, SynthSpec};
use longhaul::tensor::GgmlType;

/// Workspaces, KV cache (f16, 256 positions), tokenizer-free test code and
/// allocator slack: what may come on top of weights and slots.
const OVERHEAD: u64 = 24 << 20;

/// Bytes of `ranges` (offset, len) of `path` that sit in the page cache.
fn cached_bytes(path: &Path, ranges: &[(u64, u64)]) -> u64 {
    let f = std::fs::File::open(path).expect("open");
    let len = f.metadata().expect("meta").len() as usize;
    let page = 4096usize;
    // SAFETY: a read-only shared mapping of a file nobody writes during the test.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `vec` has one byte per page of the mapping.
    let rc = unsafe { libc::mincore(map, len, vec.as_mut_ptr()) };
    assert_eq!(rc, 0);
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(map, len) };
    ranges
        .iter()
        .map(|&(o, l)| {
            let (a, b) = (o as usize / page, (o + l) as usize / page);
            vec[a..b.min(vec.len())]
                .iter()
                .filter(|&&v| v & 1 == 1)
                .count() as u64
                * page as u64
        })
        .sum()
}

#[test]
fn memory_stays_within_budget_and_page_cache_does_not_fill() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("longhaul-memory");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("mem.gguf");
    let spec = SynthSpec {
        n_embd: 512,
        n_layer: 4,
        n_expert: 64,
        n_expert_used: 4,
        n_ff_exp: 256,
        ..SynthSpec::tiny()
    };
    synth::write(&spec, &path).expect("write");
    // Start with none of the file in the page cache.
    {
        let f = std::fs::File::open(&path).expect("open");
        f.sync_all().expect("sync");
        // SAFETY: advisory call on an open descriptor.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    let file = Arc::new(gguf::Model::open(&path).expect("open"));
    let routed: Vec<(u64, u64)> = file
        .tensors()
        .iter()
        .filter(|t| is_routed(&t.name))
        .map(|t| (t.offset, t.len))
        .collect();
    let routed_bytes: u64 = routed.iter().map(|r| r.1).sum();
    let resident_bytes = file.total_tensor_bytes() - routed_bytes;
    let probe = Model::load(CpuBackend::new(), file.clone()).expect("load");
    let (layers, expert_bytes) = probe.expert_slot_cost().expect("cost");
    drop(probe);
    let budget = 8 * layers as u64 * expert_bytes;
    assert!(
        routed_bytes >= 4 * budget,
        "routed {routed_bytes} vs budget {budget}"
    );

    // Pages the OS still holds from writing the file are not ours to count.
    let baseline = cached_bytes(&path, &routed);
    let before = rss();
    let m = Model::load_with(
        CpuBackend::new(),
        file,
        Some(LonghaulConfig {
            budget_bytes: budget,
            policy: Policy::Lru,
            prefetch: true.into(),
            verify: false,
            direct_io: true,
            uring: false,
        }),
    )
    .expect("longhaul");
    let mut kv = SeqState::new(&m, 256, GgmlType::F16).expect("kv");
    let prompt: Vec<u32> = (0..48).map(|i| (i * 7 + 3) % m.hp.n_vocab as u32).collect();
    let mut logits = kv.eval(&m, &prompt, Logits::Last).expect("prompt");
    let mut peak = rss();
    let mut max_cached = 0;
    for step in 0..96 {
        let t = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .unwrap_or(0);
        logits = kv.eval(&m, &[t], Logits::Last).expect("decode");
        peak = peak.max(rss());
        if step % 16 == 0 {
            max_cached = max_cached.max(cached_bytes(&path, &routed).saturating_sub(baseline));
        }
    }
    let stats = m.longhaul_stats().expect("stats");
    let read: u64 = stats.iter().map(|s| s.bytes_read).sum();
    let growth = peak.saturating_sub(before);
    eprintln!(
        "routed {:.1} MiB, budget {:.1} MiB, resident {:.1} MiB, read {:.1} MiB, rss growth {:.1} MiB, max cached expert pages {:.1} MiB (beyond {:.1} MiB cached before loading)",
        routed_bytes as f64 / 1048576.0,
        budget as f64 / 1048576.0,
        resident_bytes as f64 / 1048576.0,
        read as f64 / 1048576.0,
        growth as f64 / 1048576.0,
        max_cached as f64 / 1048576.0,
        baseline as f64 / 1048576.0
    );
    assert!(
        read > routed_bytes,
        "the run must stream more than the whole expert set to be a test (read {read})"
    );
    assert!(
        growth <= resident_bytes + budget + OVERHEAD,
        "rss grew by {growth}, bound {}",
        resident_bytes + budget + OVERHEAD
    );
    assert!(
        max_cached <= budget,
        "{max_cached} bytes of expert pages stayed in the page cache (budget {budget})"
    );
}
