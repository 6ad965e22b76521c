//! I/O faults under longhaul: an injected device error, a truncated shard
//! (real short reads) and a removed file make generation fail with a typed
//! error or carry on; the cache stays consistent and generation succeeds, with
//! the resident output, once the file is back.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::argmax;
use longhaul::backend::cpu::CpuBackend;
use longhaul::gguf;
use longhaul::kv::KvCache;
use longhaul::longhaul::{LonghaulConfig, LonghaulError, Policy};
use longhaul::model::{Logits, Model, ModelError};
use longhaul::synth::{self, SynthSpec};
use longhaul::tensor::GgmlType;

fn model_file(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("longhaul-faults");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(name);
    let spec = SynthSpec {
        n_layer: 2,
        n_expert: 8,
        n_expert_used: 2,
        ..SynthSpec::tiny()
    };
    synth::write(&spec, &path).expect("write model");
    path
}

/// Greedy tokens from a fresh KV cache, or the first error.
fn generate(m: &Model<CpuBackend>, n: usize) -> Result<Vec<u32>, ModelError> {
    let mut kv = KvCache::new(m, 64, GgmlType::F32)?;
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
        prefetch: true,
    };
    Model::load_with(CpuBackend::new(), file, Some(cfg)).expect("longhaul")
}

fn assert_read_error(r: Result<Vec<u32>, ModelError>, path: &Path) {
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
            other.map_err(|e| e.to_string())
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
    assert_read_error(generate(&m, 16), &path);
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
