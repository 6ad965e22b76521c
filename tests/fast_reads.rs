//! Reading tensor bytes fast: direct positional reads and io_uring batches
//! against the file's bytes at any alignment, and the longhaul loader's
//! concurrent reads, converting reads at load and expert slices read into
//! their slots in pieces, against the bytes and their whole conversion.

mod common;

use std::path::{Path, PathBuf};

use common::Rng;
use longhaul::gguf::{self, Model, Writer};
use longhaul::tensor::GgmlType;

/// A fresh, empty directory for one test.
fn tmp_dir(test: &str) -> PathBuf {
    common::tmp_dir("fast_reads", test)
}

/// Direct positional reads (`Model::set_direct_io`, `O_DIRECT` through an
/// aligned bounce buffer) return exactly the file's bytes at unaligned
/// offsets and lengths: inside one 4 KiB block, across blocks, across the
/// 2 MiB bounce chunk, and up to the last byte of the file; a range past the
/// end is an error, as buffered.
#[test]
fn direct_reads_equal_the_file_bytes_at_any_alignment() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/deepseek3-lite-f32.gguf");
    let want = std::fs::read(&path).unwrap();
    let m = Model::open(&path).unwrap();
    m.set_direct_io(true);
    let len = want.len();
    let mut rng = Rng(0xd10);
    let mut ranges = vec![
        (0, 1),
        (1, 4095),
        (4095, 2),
        (4097, (2 << 20) + 3),
        (len - 1, 1),
        (len - 5000, 5000),
        (3, len - 3),
    ];
    for _ in 0..40 {
        let off = rng.below(len);
        ranges.push((off, 1 + rng.below((len - off).min(3 << 20))));
    }
    for (off, n) in ranges {
        let mut buf = vec![0u8; n];
        m.read_at(0, off as u64, &mut buf).unwrap();
        assert!(buf == want[off..off + n], "bytes differ at {off}+{n}");
        // The same bytes handed over in the read's own buffer (what a slot
        // converts from), where direct I/O serves the file.
        if let Some(same) = m
            .read_direct_with(0, off as u64, n, |b| b == &want[off..off + n])
            .unwrap()
        {
            assert!(same, "read_direct_with bytes differ at {off}+{n}");
        }
    }
    let mut past = vec![0u8; 10];
    assert!(m.read_at(0, len as u64 - 5, &mut past).is_err());
    assert!(m.read_direct_with(0, len as u64 - 5, 10, |_| ()).is_err());
    // Direct I/O off: the caller reads with read_at.
    m.set_direct_io(false);
    assert!(m.read_direct_with(0, 0, 10, |_| ()).unwrap().is_none());
}

/// io_uring's batched direct reads (`longhaul::longhaul::uring::Batch`,
/// `--longhaul-io uring`) hand over exactly the file's bytes for 140
/// slices in one batch (8 in flight, so the queue refills), at unaligned
/// offsets and lengths up to the file's last byte; a slice past the end and
/// one the fault seam fails are errors that leave the other slices' bytes
/// right; chained batches (reads one after another in each chain) give the
/// same bytes; with direct I/O off every slice is handed back to be read
/// the usual way.
#[cfg(target_os = "linux")]
#[test]
fn uring_batches_equal_the_file_bytes_at_any_alignment() {
    use longhaul::longhaul::uring::{self, Batch, Landed, Slice};
    // Polls a batch of at most 8 reads in flight until every slice landed.
    let read_all = |m: &Model, slices: &[Slice], landed: &mut dyn FnMut(usize, Landed)| {
        let mut batch = Batch::new(slices.to_vec(), 8).expect("a ring");
        while !batch.done() {
            batch.poll(m, true, &mut *landed);
        }
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/deepseek3-lite-f32.gguf");
    let want = std::fs::read(&path).unwrap();
    let m = Model::open(&path).unwrap();
    m.set_direct_io(true);
    let direct = m.read_direct_with(0, 0, 1, |_| ()).unwrap().is_some();
    if !uring::available() || !direct {
        eprintln!(
            "skipped: io_uring available {}, direct I/O {direct}",
            uring::available()
        );
        return;
    }
    let len = want.len();
    let mut rng = Rng(0x0071);
    let mut slices = vec![
        (0, 1),
        (1, 4095),
        (4095, 2),
        (4097, (2 << 20) + 3),
        (len - 1, 1),
        (3, len - 3),
    ];
    while slices.len() < 140 {
        let off = rng.below(len);
        slices.push((off, 1 + rng.below((len - off).min(1 << 20))));
    }
    let past = slices.len();
    slices.push((len - 5, 10));
    let faulty = slices.len();
    slices.push((12_345, 678));
    let slices: Vec<Slice> = slices
        .iter()
        .map(|&(offset, len)| Slice {
            shard: 0,
            offset: offset as u64,
            len,
        })
        .collect();
    m.set_read_fault(Some(std::sync::Arc::new(|_, off, n| {
        (off == 12_345 && n == 678).then(|| std::io::Error::from_raw_os_error(libc::EIO))
    })));
    let mut seen = vec![0usize; slices.len()];
    let mut read = 0;
    read_all(&m, &slices, &mut |i, landed| {
        seen[i] += 1;
        let Slice { offset, len, .. } = slices[i];
        let (off, n) = (offset as usize, len);
        match landed {
            Landed::Bytes(b) => {
                read += 1;
                assert!(i != past && i != faulty, "slice {i} should have failed");
                assert!(
                    b.bytes() == &want[off..off + n],
                    "bytes differ at {off}+{n}"
                );
            }
            Landed::Failed(e) => {
                assert!(i == past || i == faulty, "slice {i} failed: {e}");
            }
            Landed::Elsewhere => panic!("slice {i} not read"),
        }
    });
    m.set_read_fault(None);
    assert!(
        seen.iter().all(|&n| n == 1),
        "each slice lands once: {seen:?}"
    );
    assert_eq!(read, slices.len() - 2);
    // Chained (the sync point's batches): 40 slices as 3 chains of reads
    // one after another, all submitted at once, polled without waiting
    // until they are in.
    let chained: Vec<Slice> = slices[..40].to_vec();
    let mut batch = uring::Batch::chained(chained.clone(), 3).expect("a ring");
    let mut seen = vec![0usize; chained.len()];
    while !batch.done() {
        batch.poll(&m, false, |i, landed| {
            seen[i] += 1;
            let (off, n) = (chained[i].offset as usize, chained[i].len);
            match landed {
                Landed::Bytes(b) => assert!(
                    b.bytes() == &want[off..off + n],
                    "chained: bytes differ at {off}+{n}"
                ),
                _ => panic!("chained slice {i} not read"),
            }
        });
    }
    assert!(
        seen.iter().all(|&n| n == 1),
        "each chained slice lands once: {seen:?}"
    );
    assert!(
        uring::Batch::chained(slices.clone(), 3).is_none(),
        "more slices than a ring holds"
    );
    // Direct I/O off: handed back.
    m.set_direct_io(false);
    read_all(&m, &slices[..5], &mut |i, landed| {
        assert!(
            matches!(landed, Landed::Elsewhere),
            "slice {i} was not handed back"
        );
    });
}

/// `len` random bytes of Q8_0 blocks with finite f16 scales: a plausible
/// Q8_0 matrix.
fn q8_0_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut bytes = Rng(seed).bytes(len);
    for b in bytes.chunks_exact_mut(34) {
        b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
    }
    bytes
}

/// `longhaul::read_parallel_converting` (a resident matrix that takes the
/// CPU kernels' layout, converted piece by piece as its reads complete)
/// gives the bytes the whole-tensor conversion gives, buffered and direct,
/// for a Q8_0 matrix of two pieces (8 MiB of whole 8-row groups, then the
/// rest).
#[test]
fn piecewise_conversion_at_load_equals_the_whole_tensor_conversion() {
    use longhaul::backend::{cpu::CpuBackend, Backend};
    let (k, rows) = (4096usize, 2056usize);
    let ty = GgmlType::Q8_0;
    let Some(il) = longhaul::quant::layout::for_matrix(ty, rows) else {
        return; // no interleaved kernels on this CPU
    };
    let dir = tmp_dir("piecewise");
    let path = dir.join("q8.gguf");
    let bytes = q8_0_bytes(0x51ece, ty.row_bytes(k as u64).unwrap() as usize * rows);
    let mut w = Writer::new();
    w.add_tensor("m", &[k as u64, rows as u64], ty, bytes.clone())
        .unwrap();
    w.write(&path).unwrap();
    let m = Model::open(&path).unwrap();
    let t = m.tensor("m").unwrap().clone();
    let mut want = bytes.clone();
    il.interleave(k, &mut want).unwrap();
    let pieces = CpuBackend::new().repack_pieces(&t).expect("a Q8_0 layout");
    assert!(t.len as usize > 8 << 20 && (t.len as usize).is_multiple_of(pieces.unit));
    for direct in [false, true] {
        m.set_direct_io(direct);
        let mut got = vec![0u8; t.len as usize];
        longhaul::longhaul::read_parallel_converting(&m, t.shard, t.offset, &mut got, &pieces)
            .unwrap();
        assert!(got == want, "direct {direct}: converted bytes differ");
    }
    // A length that is not whole groups is an error, not a partial layout.
    let mut short = vec![0u8; pieces.unit + 1];
    assert!(longhaul::longhaul::read_parallel_converting(
        &m, t.shard, t.offset, &mut short, &pieces
    )
    .is_err());
}

/// An expert slice larger than one direct read (`gguf::DIRECT_WHOLE`: the
/// experts of DeepSeek-V3, GLM-4.5 and gpt-oss are) is read into its slot
/// in pieces of whole row groups, each converted into the CPU kernels'
/// layout as it lands: every slot holds the whole slice's conversion,
/// buffered and direct, and under `--longhaul-verify` the checksum of an
/// expert read again in pieces matches its first.
#[test]
fn expert_slices_larger_than_one_direct_read_convert_in_pieces() {
    use longhaul::backend::{cpu::CpuBackend, Backend};
    use longhaul::longhaul::{io_scope, slot_tensors, Policy, StreamedLayer};
    // Q8_0 rows of 4352 bytes: 1032 of them are 4.49 MB, two pieces.
    let (k, rows, n_expert) = (4096usize, 1032usize, 3usize);
    let ty = GgmlType::Q8_0;
    let Some(il) = longhaul::quant::layout::for_matrix(ty, rows) else {
        return; // no interleaved kernels on this CPU
    };
    let dir = tmp_dir("slot-pieces");
    let path = dir.join("experts.gguf");
    let slice = ty.row_bytes(k as u64).unwrap() as usize * rows;
    let bytes = q8_0_bytes(0x5107, slice * n_expert);
    let mut w = Writer::new();
    // A small tensor first, so that the experts start off a block boundary.
    w.add_tensor("pad", &[40], GgmlType::F32, vec![0u8; 160])
        .unwrap();
    w.add_tensor(
        "blk.0.ffn_up_exps.weight",
        &[k as u64, rows as u64, n_expert as u64],
        ty,
        bytes.clone(),
    )
    .unwrap();
    w.write(&path).unwrap();
    let m = Model::open(&path).unwrap();
    let ts = vec![m.tensor("blk.0.ffn_up_exps.weight").unwrap()];
    assert!(ts[0].offset % gguf::DIRECT_ALIGN as u64 != 0);
    let specs = slot_tensors(&ts, true).unwrap();
    assert!(specs[0].bytes as usize == slice && slice > gguf::DIRECT_WHOLE);
    let want: Vec<Vec<u8>> = bytes
        .chunks_exact(slice)
        .map(|e| {
            let mut e = e.to_vec();
            il.interleave(k, &mut e).unwrap();
            e
        })
        .collect();
    let b = CpuBackend::new();
    // Every read the slots make, by length.
    let reads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    m.set_read_fault(Some(std::sync::Arc::new({
        let reads = reads.clone();
        move |_, _, len| {
            reads.lock().unwrap().push(len);
            None
        }
    })));
    for direct in [false, true] {
        m.set_direct_io(direct);
        let slots = b.new_slots(&specs, 2).unwrap();
        let mut l = StreamedLayer::new(0, &ts, slots, 2, Policy::Lru)
            .unwrap()
            .verify_reads();
        // Expert 0 is evicted by 2 and read again: verified against its
        // first read's checksum.
        for ids in [&[0u32, 1][..], &[2], &[0]] {
            io_scope(|io| {
                for wave in l.plan(&m, ids) {
                    let mut fill = l.start_wave(&m, &wave, io).unwrap();
                    while fill.pending() {
                        l.wait_loaded(&m, &mut fill).unwrap();
                    }
                    l.finish_wave(&m, &mut fill).unwrap();
                }
            });
            let weight = b.slot_weight(&l.slots, 0).unwrap();
            for &e in ids {
                let s = l.cache.slot(e).expect("expert in a slot") as usize;
                let got = weight.matrix(s, slice).expect("a whole slot");
                assert!(
                    got == want[e as usize],
                    "direct {direct}: expert {e} in slot {s}"
                );
            }
        }
        // Four expert reads (on several threads), each in two pieces: as
        // many whole row groups as one direct read holds, then the rest.
        let group = slice / rows * 8;
        let first = gguf::DIRECT_WHOLE / group * group;
        let mut lens = std::mem::take(&mut *reads.lock().unwrap());
        lens.sort_unstable();
        assert_eq!(
            lens,
            [[slice - first; 4], [first; 4]].concat(),
            "direct {direct}"
        );
    }
}

/// `longhaul::read_parallel` (resident copies at load: 8 MiB pieces read
/// concurrently on the I/O pool) returns the tensor's bytes, buffered and
/// direct, for a tensor of several pieces and a ragged last one.
#[test]
fn parallel_reads_of_a_large_tensor_equal_its_bytes() {
    let dir = tmp_dir("parallel");
    let path = dir.join("big.gguf");
    let n = (5 << 20) + 777; // f32 values: 20 MiB + a ragged tail
    let mut rng = Rng(0x9a7);
    let bytes = rng.bytes(n * 4);
    let mut w = Writer::new();
    w.add_tensor("big", &[n as u64], GgmlType::F32, bytes.clone())
        .unwrap();
    w.write(&path).unwrap();
    let m = Model::open(&path).unwrap();
    let t = m.tensor("big").unwrap().clone();
    for direct in [false, true] {
        m.set_direct_io(direct);
        let mut got = vec![0u8; t.len as usize];
        longhaul::longhaul::read_parallel(&m, t.shard, t.offset, &mut got).unwrap();
        assert!(got == bytes, "direct {direct}: bytes differ");
    }
}
