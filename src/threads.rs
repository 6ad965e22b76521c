//! How many compute threads to run: the one place a `-t/--threads` value
//! meets the machine. The CLI commands and the server all ask here, so a
//! count above what the machine runs at once is capped the same way
//! everywhere (llama.cpp warns about such counts; spawning them would only
//! make threads wait on each other).

/// The threads this machine runs at once (`available_parallelism`, which
/// counts the CPUs this process may use; 1 if unknown).
pub fn available() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The thread count for `requested` (`None` or `0`: every available
/// thread), capped at [`available`]. A capped request prints one warning
/// on stderr naming both counts.
pub fn capped(requested: Option<usize>) -> usize {
    let avail = available();
    let (n, warning) = cap(requested, avail);
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    n
}

/// [`capped`] for a given machine size, without printing: the count and,
/// when the request was capped, the warning.
pub fn cap(requested: Option<usize>, avail: usize) -> (usize, Option<String>) {
    let avail = avail.max(1);
    match requested {
        None | Some(0) => (avail, None),
        Some(n) if n > avail => (
            avail,
            Some(format!(
                "-t {n} is more threads than this machine runs at once ({avail}); using {avail}"
            )),
        ),
        Some(n) => (n, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_at_the_machine_and_says_so() {
        assert_eq!(cap(None, 8), (8, None));
        assert_eq!(cap(Some(0), 8), (8, None));
        assert_eq!(cap(Some(3), 8), (3, None));
        assert_eq!(cap(Some(8), 8), (8, None));
        let (n, w) = cap(Some(1000), 8);
        assert_eq!(n, 8);
        let w = w.expect("a warning");
        assert!(w.contains("1000") && w.contains("using 8"), "{w}");
        // An unknown machine size counts as one thread.
        assert_eq!(cap(Some(4), 0).0, 1);
    }
}
