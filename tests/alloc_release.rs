//! `alloc::release_free_memory` returns freed heap pages to the system. The
//! server calls it after preparing a large body: glibc keeps freed small
//! blocks that sit below a live one, so a request's parsed JSON stayed in
//! the process after the request ended. One test in its own binary, since
//! it reads the process's resident memory.

mod common;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn freed_small_blocks_go_back_to_the_system() {
    use common::rss;
    // The thresholds the binaries run with.
    longhaul::alloc::keep_freed_buffers();
    // 256 MiB in 1 KiB blocks (a JSON tree's size), each written so that
    // its page is resident, then one block allocated after them all and
    // kept: it pins the heap's top, so freeing the rest cannot shrink it.
    const TOTAL: usize = 256 << 20;
    let blocks: Vec<Vec<u8>> = (0..TOTAL / 1024).map(|i| vec![i as u8; 1024]).collect();
    let pin = vec![1u8; 1024];
    let held = rss();
    drop(blocks);
    let freed = rss();
    longhaul::alloc::release_free_memory();
    let released = rss();
    assert_eq!(pin[0], 1);
    // glibc keeps the freed blocks: at most a tenth of them went back.
    assert!(
        freed > held - TOTAL as u64 / 10,
        "free() already returned the blocks ({held} -> {freed} bytes), so this test shows nothing"
    );
    // Trimmed, at least nine tenths of them are gone.
    assert!(
        released < freed - TOTAL as u64 / 10 * 9,
        "resident {freed} bytes before the release, {released} after"
    );
}
