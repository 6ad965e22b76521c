//! Process-wide allocator tuning, called once by the binaries.
//!
//! Every op allocates its output (and quantised activations) afresh. glibc
//! serves blocks above its mmap threshold (128 KiB at first) with `mmap`
//! and returns them with `munmap`, so each large temporary costs page
//! faults and zeroing on every op: measured on the demo MoE (pp128, 2
//! threads), 2950 t/s with the default thresholds against 3700 t/s when
//! blocks up to 64 MiB stay in the heap.

/// Keeps freed buffers up to 64 MiB in the heap and trims it only above
/// 128 MiB of free space at its top (glibc; elsewhere a no-op).
pub fn keep_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called
    // before other threads allocate.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
    }
}
