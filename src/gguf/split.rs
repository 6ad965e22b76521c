//! Split-model conventions of llama.cpp's `llama-gguf-split`: file names
//! `PREFIX-00001-of-0000N.gguf` (1-based in the name) and the keys `split.no`
//! (u16, 0-based), `split.count` (u16) and `split.tensors.count` (i32, the
//! model's total tensor count). The first shard carries all metadata; the
//! others carry only the `split.*` keys.

use std::path::{Path, PathBuf};

/// 0-based index of this shard (`LLM_KV_SPLIT_NO`, written as u16).
pub const KEY_SPLIT_NO: &str = "split.no";
/// Number of shards (`LLM_KV_SPLIT_COUNT`, written as u16).
pub const KEY_SPLIT_COUNT: &str = "split.count";
/// Total tensors over all shards (`LLM_KV_SPLIT_TENSORS_COUNT`, written as i32).
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// `llama_split_path`: the path of shard `split_no` (0-based) of `count`,
/// `{prefix}-{split_no+1:05}-of-{count:05}.gguf`.
pub fn split_path(prefix: &Path, split_no: usize, count: usize) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!("-{:05}-of-{:05}.gguf", split_no + 1, count));
    PathBuf::from(s)
}

/// `llama_split_prefix`: `path` without its `-{split_no+1:05}-of-{count:05}.gguf`
/// suffix, or `None` when the path does not end that way.
pub fn split_prefix(path: &Path, split_no: usize, count: usize) -> Option<PathBuf> {
    let suffix = format!("-{:05}-of-{:05}.gguf", split_no + 1, count);
    let s = path.to_str()?;
    s.strip_suffix(&suffix).map(PathBuf::from)
}

/// The prefix the writer uses for `path`: any `-NNNNN-of-NNNNN.gguf` or
/// `.gguf` ending removed (`out/model.gguf` -> `out/model`).
pub(crate) fn writer_prefix(path: &Path) -> PathBuf {
    let Some(s) = path.to_str() else {
        return path.to_path_buf();
    };
    let base = s.strip_suffix(".gguf").unwrap_or(s);
    // `-00001-of-00003` is 15 bytes: '-', 5 digits, "-of-", 5 digits.
    let b = base.as_bytes();
    if b.len() >= 15 {
        let tail = &b[b.len() - 15..];
        let digits = |r: std::ops::Range<usize>| tail[r].iter().all(u8::is_ascii_digit);
        if tail[0] == b'-' && digits(1..6) && &tail[6..10] == b"-of-" && digits(10..15) {
            return PathBuf::from(&base[..base.len() - 15]);
        }
    }
    PathBuf::from(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_llama_gguf_split() {
        let p = split_path(Path::new("dir/model"), 0, 3);
        assert_eq!(p, Path::new("dir/model-00001-of-00003.gguf"));
        assert_eq!(split_prefix(&p, 0, 3).unwrap(), Path::new("dir/model"));
        assert_eq!(split_prefix(&p, 1, 3), None);
        assert_eq!(split_prefix(&p, 0, 4), None);
        assert_eq!(split_prefix(Path::new("model.gguf"), 0, 1), None);
    }

    #[test]
    fn writer_prefix_strips_known_endings() {
        for p in ["a/m", "a/m.gguf", "a/m-00001-of-00002.gguf"] {
            assert_eq!(writer_prefix(Path::new(p)), Path::new("a/m"));
        }
    }
}
