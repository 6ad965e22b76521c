//! How much memory this process can still get, for sizing checks made before
//! a large allocation (the KV cache, the longhaul budget): the kernel's
//! `MemAvailable`, and what is left of the address-space limit
//! (`RLIMIT_AS`, `ulimit -v`) if one is set. Linux only; elsewhere the
//! probes say "unknown" and callers rely on fallible allocation alone.

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    kib_field(&s, "MemAvailable:")
}

/// Bytes of address space left under `RLIMIT_AS` (its soft limit minus this
/// process's `VmSize`), or `None` when there is no limit.
pub fn address_space_left() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let status = std::fs::read_to_string("/proc/self/status").ok();
    let used = status.and_then(|s| kib_field(&s, "VmSize:")).unwrap_or(0);
    // `rlim_t` is u64 on Linux but not on every platform.
    #[allow(clippy::unnecessary_cast)]
    let cur = lim.rlim_cur as u64;
    Some(cur.saturating_sub(used))
}

/// What a new allocation can take: the smaller of [`mem_available`] and
/// [`address_space_left`], `None` when neither is known.
pub fn available_for_allocation() -> Option<u64> {
    match (mem_available(), address_space_left()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The value of a `NAME:   123 kB` line, in bytes.
fn kib_field(s: &str, name: &str) -> Option<u64> {
    let line = s.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `bytes` for a message: decimal MB, GB or TB with one decimal.
pub fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e12 {
        format!("{:.1} TB", b / 1e12)
    } else if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else {
        format!("{:.1} MB", b / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_units() {
        let s = "MemTotal:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(kib_field(s, "MemAvailable:"), Some(2 << 20));
        assert_eq!(kib_field(s, "VmSize:"), None);
        assert_eq!(kib_field("X: 99999999999999999999 kB", "X:"), None);
        assert_eq!(human_bytes(38_400_000_000), "38.4 GB");
        assert_eq!(human_bytes(1_100_000_000_000), "1.1 TB");
        assert_eq!(human_bytes(5_000_000), "5.0 MB");
    }

    #[test]
    fn probes_answer_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(mem_available().is_some_and(|b| b > 0));
            assert!(available_for_allocation().is_some());
        }
    }
}
