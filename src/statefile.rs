//! A sequence's state in a file: what llama-server's slot save/restore
//! (`--slot-save-path`), the persistent slot (`--slot-persist`) and the
//! context cache (`--context-cache-path`) write and read.
//!
//! Layout (integers little-endian):
//!
//! ```text
//! "LHSTATE\0"  u32 version  u32 header_len  header (JSON, header_len bytes)  u32 crc32(version..header)
//! payload: u32 tokens[n_tokens], then each layer's bytes in layer order   u32 crc32(payload)
//! ```
//!
//! The header names the model ([`StateIdentity::model`]: a hash of its
//! GGUF headers, and its size) and every setting that changes the state:
//! context size, KV types, placement, attention path and the kinds and
//! sizes of the layers' states. A file whose identity differs from the
//! running engine's is refused with the field that differs; a file cut
//! short, or whose checksums do not match, is refused too. Nothing is
//! written to a sequence before the whole file has been checked.
//!
//! Writes go to a temporary file in the same directory (a name starting
//! with `.`), are fsynced, renamed over the target and the directory
//! fsynced: a crash leaves the old file or the new one, and a torn
//! temporary file is never read (see [`write`]).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::state::{SavedLayer, SavedState};

/// The format this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"LHSTATE\0";
/// Headers are a few hundred bytes; anything larger is not ours.
const MAX_HEADER: u32 = 1 << 20;

/// What a saved state depends on, compared field by field on restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateIdentity {
    /// [`crate::gguf::Model::content_hash`] in hex.
    pub model: String,
    /// Bytes of every GGUF shard together.
    pub model_bytes: u64,
    /// `-c`.
    pub n_ctx: usize,
    /// `-ctk` / `-ctv`.
    pub type_k: String,
    pub type_v: String,
    /// The backend the state was computed and is held on (`cpu`, `gpu`):
    /// their kernels round differently.
    pub placement: String,
    /// `-fa`.
    pub flash_attn: String,
    /// [`crate::state::SeqState::layout`]: attention and recurrent layers.
    pub layers: String,
}

impl StateIdentity {
    fn fields(&self) -> [(&'static str, Value, &'static str); 8] {
        [
            (
                "model",
                json!(self.model),
                "model (a hash of its GGUF metadata and tensor table)",
            ),
            (
                "model_bytes",
                json!(self.model_bytes),
                "model size in bytes",
            ),
            ("n_ctx", json!(self.n_ctx), "context size (-c/--ctx-size)"),
            (
                "type_k",
                json!(self.type_k),
                "K cache type (-ctk/--cache-type-k)",
            ),
            (
                "type_v",
                json!(self.type_v),
                "V cache type (-ctv/--cache-type-v)",
            ),
            (
                "placement",
                json!(self.placement),
                "placement (-ngl/--device)",
            ),
            (
                "flash_attn",
                json!(self.flash_attn),
                "attention path (-fa/--flash-attn)",
            ),
            ("layers", json!(self.layers), "layer state kinds and sizes"),
        ]
    }

    /// The first field of `header` that differs from `self`.
    fn check(&self, header: &Value) -> Result<(), StateFileError> {
        for (key, ours, what) in self.fields() {
            let theirs = header.get(key).cloned().unwrap_or(Value::Null);
            if theirs != ours {
                return Err(StateFileError::Mismatch {
                    what,
                    file: short(&theirs),
                    ours: short(&ours),
                });
            }
        }
        Ok(())
    }
}

/// A value for a message, cut to a readable length.
fn short(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        Value::Null => "nothing".into(),
        v => v.to_string(),
    };
    if s.chars().count() > 80 {
        s.chars().take(77).collect::<String>() + "..."
    } else {
        s
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a longhaul state file (it does not start with the state file magic)")]
    NotAStateFile,
    #[error("the file is in state format {found}, newer than this build reads ({supported}); restore it with the longhaul that saved it, or save the conversation again")]
    NewerVersion { found: u32, supported: u32 },
    #[error("the file is corrupted ({0}); save the conversation again")]
    Corrupt(String),
    #[error("the file is truncated: {len} bytes of {want}; save the conversation again")]
    Truncated { len: u64, want: u64 },
    #[error("the file was saved with a different {what} ({file}; this server runs {ours}); restore it on a server started with the same model and settings")]
    Mismatch {
        what: &'static str,
        file: String,
        ours: String,
    },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> StateFileError + '_ {
    move |source| StateFileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A layer's bytes as they go in the file.
fn layer_bytes(l: &SavedLayer) -> Vec<&[u8]> {
    match l {
        SavedLayer::Kv(b) => vec![b],
        SavedLayer::Recurrent { conv, ssm } => {
            vec![bytemuck::cast_slice(conv), bytemuck::cast_slice(ssm)]
        }
    }
}

fn layer_desc(l: &SavedLayer) -> Value {
    match l {
        SavedLayer::Kv(b) => json!({"kv": b.len()}),
        SavedLayer::Recurrent { conv, ssm } => json!({"conv": conv.len(), "ssm": ssm.len()}),
    }
}

/// The whole file in memory, pieces in write order.
fn encode(ident: &StateIdentity, tokens: &[u32], st: &SavedState) -> Vec<Vec<u8>> {
    let mut header = serde_json::Map::new();
    for (key, v, _) in ident.fields() {
        header.insert(key.into(), v);
    }
    header.insert("n_tokens".into(), json!(tokens.len()));
    header.insert("n_past".into(), json!(st.n_past));
    header.insert(
        "layer_bytes".into(),
        Value::Array(st.layers.iter().map(layer_desc).collect()),
    );
    let header = Value::Object(header).to_string().into_bytes();
    let mut head = Vec::with_capacity(16 + header.len() + 4);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    head.extend_from_slice(&(header.len() as u32).to_le_bytes());
    head.extend_from_slice(&header);
    let crc = crc32fast::hash(&head[8..]);
    head.extend_from_slice(&crc.to_le_bytes());

    let mut pieces = vec![head];
    let mut crc = crc32fast::Hasher::new();
    let toks: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    crc.update(&toks);
    pieces.push(toks);
    for l in &st.layers {
        for b in layer_bytes(l) {
            crc.update(b);
            pieces.push(b.to_vec());
        }
    }
    pieces.push(crc.finalize().to_le_bytes().to_vec());
    pieces
}

/// A crash-test seam for [`write_with`]: called before each piece of the
/// file is written (and before the fsync) with its index; `true` stops the
/// write there as a crash would: the temporary file is left behind and
/// nothing is renamed.
pub type WriteFault<'a> = &'a mut dyn FnMut(usize) -> bool;

/// Writes a state file for `tokens` (the positions `st` holds) at `path`,
/// atomically, and returns its size in bytes.
pub fn write(
    path: &Path,
    ident: &StateIdentity,
    tokens: &[u32],
    st: &SavedState,
) -> Result<u64, StateFileError> {
    write_with(path, ident, tokens, st, &mut |_| false)
}

/// [`write`] with a [`WriteFault`] seam.
pub fn write_with(
    path: &Path,
    ident: &StateIdentity,
    tokens: &[u32],
    st: &SavedState,
    fault: WriteFault,
) -> Result<u64, StateFileError> {
    let err = io(path);
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| err(std::io::Error::other("no file name")))?;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{n}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let pieces = encode(ident, tokens, st);
    let total: u64 = pieces.iter().map(|p| p.len() as u64).sum();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(&err)?;
    let crash = || err(std::io::Error::other("stopped by the crash-test seam"));
    for (i, p) in pieces.iter().enumerate() {
        if fault(i) {
            return Err(crash());
        }
        if let Err(e) = f.write_all(p) {
            let _ = std::fs::remove_file(&tmp);
            return Err(err(e));
        }
    }
    if fault(pieces.len()) {
        return Err(crash());
    }
    if let Err(e) = f.sync_all() {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    drop(f);
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(total)
}

/// A checked header: the tokens' and layers' sizes it announces.
struct Header {
    /// Bytes before the payload.
    len: usize,
    n_tokens: usize,
    n_past: usize,
    layers: Vec<Value>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads and checks the header at the start of `f` against `ident`.
fn read_header(f: &File, path: &Path, ident: &StateIdentity) -> Result<Header, StateFileError> {
    use std::os::unix::fs::FileExt;
    let err = io(path);
    let len = f.metadata().map_err(&err)?.len();
    let mut fixed = [0u8; 16];
    if len < 16 {
        return Err(
            if len >= 8 && read_some(f, &mut fixed[..8]).is_ok() && &fixed[..8] != MAGIC {
                StateFileError::NotAStateFile
            } else {
                StateFileError::Truncated { len, want: 16 }
            },
        );
    }
    f.read_exact_at(&mut fixed, 0).map_err(&err)?;
    if &fixed[..8] != MAGIC {
        return Err(StateFileError::NotAStateFile);
    }
    let version = u32_at(&fixed, 8);
    if version > FORMAT_VERSION {
        return Err(StateFileError::NewerVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if version == 0 {
        return Err(StateFileError::Corrupt("format version 0".into()));
    }
    let hlen = u32_at(&fixed, 12);
    if hlen > MAX_HEADER {
        return Err(StateFileError::Corrupt(format!("a header of {hlen} bytes")));
    }
    let want = 16 + hlen as u64 + 4;
    if len < want {
        return Err(StateFileError::Truncated { len, want });
    }
    let mut head = vec![0u8; hlen as usize + 4];
    f.read_exact_at(&mut head, 16).map_err(&err)?;
    let (json_bytes, crc) = head.split_at(hlen as usize);
    let mut h = crc32fast::Hasher::new();
    h.update(&fixed[8..]);
    h.update(json_bytes);
    if h.finalize() != u32_at(crc, 0) {
        return Err(StateFileError::Corrupt(
            "its header does not match its checksum".into(),
        ));
    }
    let header: Value = serde_json::from_slice(json_bytes)
        .map_err(|e| StateFileError::Corrupt(format!("its header: {e}")))?;
    ident.check(&header)?;
    let num = |k: &str| {
        header
            .get(k)
            .and_then(Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| StateFileError::Corrupt(format!("its header has no {k}")))
    };
    let (n_tokens, n_past) = (num("n_tokens")?, num("n_past")?);
    if n_tokens != n_past || n_past > ident.n_ctx {
        return Err(StateFileError::Corrupt(format!(
            "{n_tokens} tokens for {n_past} positions of a context of {}",
            ident.n_ctx
        )));
    }
    let layers = header
        .get("layer_bytes")
        .and_then(Value::as_array)
        .cloned()
        .ok_or_else(|| StateFileError::Corrupt("its header has no layer sizes".into()))?;
    Ok(Header {
        len: want as usize,
        n_tokens,
        n_past,
        layers,
    })
}

fn read_some(f: &File, buf: &mut [u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.read_exact_at(buf, 0)
}

/// Opens `path` for reading without following a symlink.
fn open(path: &Path) -> Result<File, StateFileError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io(path))
}

fn tokens_of(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32_at(c, 0)).collect()
}

/// The tokens of the state file at `path`, after checking its header
/// against `ident` (the payload's checksum is checked by [`read`]).
pub fn read_tokens(path: &Path, ident: &StateIdentity) -> Result<Vec<u32>, StateFileError> {
    use std::os::unix::fs::FileExt;
    let f = open(path)?;
    let h = read_header(&f, path, ident)?;
    let len = f.metadata().map_err(io(path))?.len();
    let want = h.len as u64 + 4 * h.n_tokens as u64;
    if len < want {
        return Err(StateFileError::Truncated { len, want });
    }
    let mut b = vec![0u8; 4 * h.n_tokens];
    f.read_exact_at(&mut b, h.len as u64).map_err(io(path))?;
    Ok(tokens_of(&b))
}

/// Reads the state file at `path`, checked against `ident`: its tokens and
/// the state to give [`crate::state::SeqState::restore`], and the file's
/// size.
pub fn read(
    path: &Path,
    ident: &StateIdentity,
) -> Result<(Vec<u32>, SavedState, u64), StateFileError> {
    use std::io::Read;
    let mut f = open(path)?;
    let h = read_header(&f, path, ident)?;
    let corrupt = |what: &str| StateFileError::Corrupt(format!("its header has a bad {what}"));
    // Bytes of each layer's one or two parts, from the header, in file
    // order (a recurrent layer's sizes count f32s).
    let mut sizes: Vec<(bool, usize, usize)> = Vec::with_capacity(h.layers.len());
    for l in &h.layers {
        let get = |k: &str| {
            l.get(k)
                .and_then(Value::as_u64)
                .and_then(|v| usize::try_from(v).ok())
        };
        let f32s = |n: Option<usize>| n.and_then(|n| n.checked_mul(4));
        match (get("kv"), get("conv"), get("ssm")) {
            (Some(b), None, None) => sizes.push((true, b, 0)),
            (None, c @ Some(_), s @ Some(_)) => match (f32s(c), f32s(s)) {
                (Some(c), Some(s)) => sizes.push((false, c, s)),
                _ => return Err(corrupt("layer size")),
            },
            _ => return Err(corrupt("layer size")),
        }
    }
    let payload = sizes
        .iter()
        .try_fold(4u64 * h.n_tokens as u64, |acc, &(_, a, b)| {
            acc.checked_add(a as u64)?.checked_add(b as u64)
        })
        .ok_or_else(|| corrupt("layer size"))?;
    let len = f.metadata().map_err(io(path))?.len();
    let want = h.len as u64 + payload + 4;
    if len != want {
        return Err(if len < want {
            StateFileError::Truncated { len, want }
        } else {
            StateFileError::Corrupt(format!("{} bytes past its end", len - want))
        });
    }
    let mut body = Vec::new();
    body.try_reserve_exact((payload + 4) as usize)
        .map_err(|_| StateFileError::Corrupt(format!("a payload of {payload} bytes")))?;
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(h.len as u64)).map_err(io(path))?;
    (&mut f)
        .take(payload + 4)
        .read_to_end(&mut body)
        .map_err(io(path))?;
    if body.len() as u64 != payload + 4 {
        return Err(StateFileError::Truncated {
            len: h.len as u64 + body.len() as u64,
            want,
        });
    }
    let (data, crc) = body.split_at(payload as usize);
    if crc32fast::hash(data) != u32_at(crc, 0) {
        return Err(StateFileError::Corrupt(
            "its data does not match its checksum".into(),
        ));
    }
    let (toks, mut rest) = data.split_at(4 * h.n_tokens);
    let mut layers = Vec::with_capacity(sizes.len());
    for (kv, a, b) in sizes {
        if kv {
            let (x, r) = rest.split_at(a);
            layers.push(SavedLayer::Kv(x.to_vec()));
            rest = r;
        } else {
            let (c, r) = rest.split_at(a);
            let (s, r) = r.split_at(b);
            layers.push(SavedLayer::Recurrent {
                conv: bytemuck::pod_collect_to_vec(c),
                ssm: bytemuck::pod_collect_to_vec(s),
            });
            rest = r;
        }
    }
    Ok((
        tokens_of(toks),
        SavedState {
            n_past: h.n_past,
            layers,
        },
        len,
    ))
}

/// Whether `name` is a plain file name inside a directory: not empty, no
/// path separator, no NUL, not `.`/`..` and not hidden (temporary files
/// start with `.`), no leading or trailing whitespace, at most 255 bytes.
/// llama-server refuses the same names.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name.trim() == name
        && !name.contains(['/', '\\', '\0'])
        && !name.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident() -> StateIdentity {
        StateIdentity {
            model: "00ff".into(),
            model_bytes: 1234,
            n_ctx: 64,
            type_k: "f16".into(),
            type_v: "f16".into(),
            placement: "cpu".into(),
            flash_attn: "auto".into(),
            layers: "kv 4/4 f16,recurrent 2x3 1x4".into(),
        }
    }

    fn state() -> (Vec<u32>, SavedState) {
        let toks = vec![5, 6, 7];
        let st = SavedState {
            n_past: 3,
            layers: vec![
                SavedLayer::Kv((0..48).collect()),
                SavedLayer::Recurrent {
                    conv: vec![1.5; 6],
                    ssm: vec![-2.0, 0.0, 3.25, f32::MIN_POSITIVE],
                },
            ],
        };
        (toks, st)
    }

    #[test]
    fn a_state_file_reads_back_what_was_written_and_refuses_changes() {
        let dir = tempdir();
        let p = dir.join("a.bin");
        let (toks, st) = state();
        let n = write(&p, &ident(), &toks, &st).unwrap();
        assert_eq!(n, std::fs::metadata(&p).unwrap().len());
        let (t2, s2, n2) = read(&p, &ident()).unwrap();
        assert_eq!((t2, s2, n2), (toks.clone(), st.clone(), n));
        assert_eq!(read_tokens(&p, &ident()).unwrap(), toks);

        let mut other = ident();
        other.n_ctx = 128;
        let e = read(&p, &other).unwrap_err().to_string();
        assert!(
            e.contains("context size (-c/--ctx-size) (64; this server runs 128)"),
            "{e}"
        );
        let mut other = ident();
        other.type_k = "f32".into();
        let e = read(&p, &other).unwrap_err().to_string();
        assert!(
            e.contains("(-ctk/--cache-type-k) (f16; this server runs f32)"),
            "{e}"
        );
        let mut other = ident();
        other.model = "abcd".into();
        assert!(read(&p, &other)
            .unwrap_err()
            .to_string()
            .contains("different model (a hash"));

        // Every truncation and every flipped byte is refused.
        let bytes = std::fs::read(&p).unwrap();
        for cut in 0..bytes.len() {
            std::fs::write(&p, &bytes[..cut]).unwrap();
            assert!(read(&p, &ident()).is_err(), "truncated at {cut} loaded");
        }
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            std::fs::write(&p, &b).unwrap();
            assert!(read(&p, &ident()).is_err(), "byte {at} flipped loaded");
        }
        // A newer version says so (its header checksum is never reached).
        let mut b = bytes.clone();
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        std::fs::write(&p, &b).unwrap();
        let e = read(&p, &ident()).unwrap_err();
        assert!(
            matches!(
                e,
                StateFileError::NewerVersion {
                    found: 2,
                    supported: 1
                }
            ),
            "{e}"
        );
        std::fs::write(&p, b"GGUF and more bytes than that").unwrap();
        assert!(matches!(
            read(&p, &ident()),
            Err(StateFileError::NotAStateFile)
        ));
    }

    #[test]
    fn layer_sizes_that_overflow_are_refused() {
        let dir = tempdir();
        let p = dir.join("sizes.bin");
        let (toks, st) = state();
        write(&p, &ident(), &toks, &st).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        let hlen = u32_at(&bytes, 12) as usize;
        let header = std::str::from_utf8(&bytes[16..16 + hlen]).unwrap();
        assert!(header.contains("\"conv\":6"), "{header}");
        // 4 * (2^62 + 1) f32s wraps to 4 bytes: the file must not be read
        // as if the layer held one value.
        for conv in [(1u64 << 62) + 1, u64::MAX] {
            let header = header.replace("\"conv\":6", &format!("\"conv\":{conv}"));
            let mut b = bytes[..8].to_vec();
            b.extend_from_slice(&bytes[8..12]);
            b.extend_from_slice(&(header.len() as u32).to_le_bytes());
            b.extend_from_slice(header.as_bytes());
            let crc = crc32fast::hash(&b[8..]);
            b.extend_from_slice(&crc.to_le_bytes());
            b.extend_from_slice(&bytes[16 + hlen + 4..]);
            std::fs::write(&p, &b).unwrap();
            let e = read(&p, &ident()).unwrap_err();
            assert!(
                matches!(
                    e,
                    StateFileError::Corrupt(_) | StateFileError::Truncated { .. }
                ),
                "{e}"
            );
        }
    }

    #[test]
    fn a_write_that_stops_anywhere_leaves_the_old_file_or_the_new_one() {
        let dir = tempdir();
        let p = dir.join("s.bin");
        let (toks, st) = state();
        write(&p, &ident(), &[1, 2, 3], &st).unwrap();
        let n_pieces = encode(&ident(), &toks, &st).len();
        for stop in 0..=n_pieces {
            let mut fault = |i: usize| i == stop;
            let r = write_with(&p, &ident(), &toks, &st, &mut fault);
            assert!(r.is_err());
            // The target still holds the old state, whole.
            let (t, s, _) = read(&p, &ident()).unwrap();
            assert_eq!((t, s), (vec![1, 2, 3], st.clone()), "stop at piece {stop}");
        }
        // The crashed writes left temporary files that nothing reads as
        // states (hidden names), each refused if read anyway unless whole.
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .collect();
        assert_eq!(leftovers.len(), n_pieces + 1);
        for l in &leftovers {
            let whole = std::fs::metadata(l).unwrap().len()
                == encode(&ident(), &toks, &st)
                    .iter()
                    .map(|p| p.len() as u64)
                    .sum::<u64>();
            assert_eq!(read(l, &ident()).is_ok(), whole, "{}", l.display());
        }
        write(&p, &ident(), &toks, &st).unwrap();
        assert_eq!(read(&p, &ident()).unwrap().0, toks);
    }

    #[test]
    fn only_plain_names_are_valid() {
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "/etc/passwd",
            "a/../../b",
            "a\\b",
            "a\0b",
            ".hidden",
            " x",
            "x ",
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        for good in ["slot1.bin", "a..b", "conv-2026.state"] {
            assert!(valid_name(good), "{good:?}");
        }
    }

    #[test]
    fn a_symlink_is_not_followed() {
        let dir = tempdir();
        let (toks, st) = state();
        let real = dir.join("real.bin");
        write(&real, &ident(), &toks, &st).unwrap();
        let link = dir.join("link.bin");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(
            read(&link, &ident()),
            Err(StateFileError::Io { .. })
        ));
    }

    fn tempdir() -> PathBuf {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("longhaul-statefile-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
