//! Longhaul with lookahead prefetch and a single I/O thread
//! (`LONGHAUL_IO_THREADS=1`) generates and equals resident output. Found by
//! the `load_path` fuzz target: a prefetch of layer L+1 waited on the I/O
//! thread for that layer's lock while the layer's sync point held the lock
//! and waited for its demand read, queued on the same I/O thread. The I/O
//! pool is process-wide and sized once, so this is its own test binary.

mod common;

use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::argmax;
use longhaul::backend::cpu::CpuBackend;
use longhaul::gguf;
use longhaul::longhaul::{LonghaulConfig, Policy};
use longhaul::model::{Logits, Model};
use longhaul::state::SeqState;
use longhaul::synth::{self, SynthArch, SynthSpec};
use longhaul::tensor::GgmlType;

/// The prompt then `n` greedy tokens.
fn generate(m: &Model<CpuBackend>, n: usize) -> Vec<u32> {
    let mut kv = SeqState::new(m, 64, GgmlType::F16).expect("kv");
    let mut logits = kv.eval(m, &[1, 2, 3], Logits::Last).expect("prompt");
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(t);
        logits = kv.eval(m, &[t], Logits::Last).expect("decode");
    }
    out
}

fn check(path: &Path) {
    let want = generate(&common::load(path), 24);
    let file = Arc::new(gguf::Model::open(path).expect("open"));
    let (layers, bytes) = Model::load_shapes(CpuBackend::new(), file.clone())
        .expect("shapes")
        .expert_slot_cost()
        .expect("cost");
    for slots in [1, 2] {
        let cfg = LonghaulConfig {
            budget_bytes: slots * layers as u64 * bytes,
            policy: Policy::Lru,
            prefetch: true.into(),
            verify: false,
            direct_io: true,
            uring: false,
        };
        let m = Model::load_with(CpuBackend::new(), file.clone(), Some(cfg)).expect("longhaul");
        assert_eq!(generate(&m, 24), want, "{slots} slots");
    }
}

#[test]
fn prefetch_with_one_io_thread_does_not_deadlock() {
    // Before the I/O pool is first used (nothing else runs in this binary).
    std::env::set_var("LONGHAUL_IO_THREADS", "1");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("longhaul-one-io-thread");
    std::fs::create_dir_all(&dir).expect("dir");
    let mut paths = Vec::new();
    for (name, arch) in [("oss", SynthArch::GptOss), ("qwen", SynthArch::Qwen3Moe)] {
        let spec = SynthSpec {
            arch,
            n_layer: 4,
            n_swa: 4,
            ..SynthSpec::micro()
        };
        let p = dir.join(format!("{name}.gguf"));
        synth::write(&spec, &p).expect("write model");
        paths.push(p);
    }
    // A deadlock fails the test instead of hanging it.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for p in &paths {
            check(p);
        }
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(()) => {}
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the check failed (see above)"),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("no answer in 120 s: longhaul deadlocked with one I/O thread")
        }
    }
}
