//! Token probabilities as each API spells them: llama-server's entries
//! (`completion_probabilities`, and the `content` list of OpenAI's chat
//! `logprobs`), and OpenAI's legacy completions object (`tokens`,
//! `token_logprobs`, `top_logprobs`, `text_offset`).
//!
//! A request may list every token of the vocabulary for every token it
//! generates, so the lists are written straight to the response by their
//! [`Serialize`] impls (about 95 bytes an alternative) instead of being
//! built as a tree of `serde_json::Value`s first (about 1.7 KB each: 200
//! tokens of 49,152 alternatives took 16 GB that way). [`Spliced`] puts
//! such a list into a response built as a `Value`.

use longhaul::sample::TokenProbs;
use longhaul::tokenizer::Tokenizer;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

/// One sampled token and its probabilities.
pub type Probs = (u32, TokenProbs);

/// A token's text as llama-server reports it: the piece without special
/// tokens' text, cut to its longest valid UTF-8 prefix (`bytes` has all).
fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_to_piece_with(id, false).to_vec();
    let text = match std::str::from_utf8(&bytes) {
        Ok(s) => s.to_string(),
        Err(e) => String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned(),
    };
    (text, bytes)
}

/// A log-probability for JSON: `-inf` (not representable) becomes the
/// lowest finite f32, as llama-server writes it. Written as the f64 of
/// the f32, as llama-server's JSON library does.
fn logprob(lp: f32) -> f64 {
    if lp == f32::NEG_INFINITY {
        f32::MIN as f64
    } else {
        lp as f64
    }
}

/// `{id, token, bytes, logprob}` (or `prob` after the sampling chain), and
/// when `top` is given, the most likely tokens under `top_logprobs`
/// (`top_probs` after the chain).
struct Entry<'a> {
    tok: &'a Tokenizer,
    id: u32,
    lp: f32,
    post: bool,
    top: Option<&'a [(u32, f32)]>,
}

impl Serialize for Entry<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (text, bytes) = piece(self.tok, self.id);
        let mut m = s.serialize_map(Some(4 + usize::from(self.top.is_some())))?;
        m.serialize_entry("id", &self.id)?;
        m.serialize_entry("token", &text)?;
        m.serialize_entry("bytes", &bytes)?;
        if self.post {
            m.serialize_entry("prob", &(self.lp.exp() as f64))?;
        } else {
            m.serialize_entry("logprob", &logprob(self.lp))?;
        }
        if let Some(top) = self.top {
            let key = if self.post {
                "top_probs"
            } else {
                "top_logprobs"
            };
            m.serialize_entry(key, &TopEntries { entry: self, top })?;
        }
        m.end()
    }
}

/// The alternatives of an [`Entry`], each an entry of its own.
struct TopEntries<'a> {
    entry: &'a Entry<'a>,
    top: &'a [(u32, f32)],
}

impl Serialize for TopEntries<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.top.len()))?;
        for &(id, lp) in self.top {
            seq.serialize_element(&Entry {
                id,
                lp,
                top: None,
                ..*self.entry
            })?;
        }
        seq.end()
    }
}

/// llama-server's entries of several sampled tokens (also OpenAI's chat
/// `logprobs.content` list).
pub struct Entries<'a> {
    tok: &'a Tokenizer,
    ps: &'a [Probs],
    post: bool,
}

pub fn entries<'a>(tok: &'a Tokenizer, ps: &'a [Probs], post: bool) -> Entries<'a> {
    Entries { tok, ps, post }
}

impl Serialize for Entries<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.ps.len()))?;
        for (id, probs) in self.ps {
            seq.serialize_element(&Entry {
                tok: self.tok,
                id: *id,
                lp: probs.logprob,
                post: self.post,
                top: Some(&probs.top),
            })?;
        }
        seq.end()
    }
}

/// OpenAI's legacy completions `logprobs` object for sampled tokens whose
/// first starts at character `offset` of the completion text; with
/// llama-server's `content` list of entries alongside.
pub struct Legacy<'a> {
    tok: &'a Tokenizer,
    ps: &'a [Probs],
    /// The sampled tokens' texts and where each starts.
    tokens: Vec<String>,
    offsets: Vec<usize>,
    post: bool,
}

/// The [`Legacy`] object of `ps` and the offset after its last token.
pub fn legacy<'a>(
    tok: &'a Tokenizer,
    ps: &'a [Probs],
    mut offset: usize,
    post: bool,
) -> (Legacy<'a>, usize) {
    let tokens: Vec<String> = ps.iter().map(|(id, _)| piece(tok, *id).0).collect();
    let offsets = tokens
        .iter()
        .map(|t| {
            let at = offset;
            offset += t.chars().count();
            at
        })
        .collect();
    let l = Legacy {
        tok,
        ps,
        tokens,
        offsets,
        post,
    };
    (l, offset)
}

impl Serialize for Legacy<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let lps: Vec<f64> = self.ps.iter().map(|p| logprob(p.1.logprob)).collect();
        let mut m = s.serialize_map(Some(5))?;
        m.serialize_entry("tokens", &self.tokens)?;
        m.serialize_entry("token_logprobs", &lps)?;
        m.serialize_entry("top_logprobs", &LegacyTops(self))?;
        m.serialize_entry("text_offset", &self.offsets)?;
        m.serialize_entry("content", &entries(self.tok, self.ps, self.post))?;
        m.end()
    }
}

/// Each token's alternatives as an object of text to log-probability.
/// Alternatives with the same text are one key: it keeps the first one's
/// place and the last one's value (a map's insert).
struct LegacyTops<'a>(&'a Legacy<'a>);

impl Serialize for LegacyTops<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.ps.len()))?;
        for (_, probs) in self.0.ps {
            // One token's map at a time.
            let top: Map<String, Value> = probs
                .top
                .iter()
                .map(|&(t, lp)| (piece(self.0.tok, t).0, Value::from(logprob(lp))))
                .collect();
            seq.serialize_element(&top)?;
        }
        seq.end()
    }
}

/// `value` written with `with` in place of the value at `pointer` (a JSON
/// pointer, as [`Value::pointer`] takes; the place must exist, usually a
/// `null` left for it).
pub struct Spliced<'a, T> {
    pub value: &'a Value,
    pub pointer: &'a str,
    pub with: &'a T,
}

impl<T: Serialize> Serialize for Spliced<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Some(rest) = self.pointer.strip_prefix('/') else {
            return self.with.serialize(s);
        };
        let (head, tail) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let inner = |value| Spliced {
            value,
            pointer: tail,
            with: self.with,
        };
        match self.value {
            Value::Object(o) => {
                let mut m = s.serialize_map(Some(o.len()))?;
                for (k, v) in o {
                    if k == head {
                        m.serialize_entry(k, &inner(v))?;
                    } else {
                        m.serialize_entry(k, v)?;
                    }
                }
                m.end()
            }
            Value::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for (i, v) in a.iter().enumerate() {
                    if head.parse() == Ok(i) {
                        seq.serialize_element(&inner(v))?;
                    } else {
                        seq.serialize_element(v)?;
                    }
                }
                seq.end()
            }
            v => v.serialize(s),
        }
    }
}
