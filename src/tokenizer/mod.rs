//! Text <-> token ids from the GGUF vocabulary (`tokenizer.ggml.*`), exact
//! to llama.cpp's `llama_tokenize`, plus chat templates ([`chat`]).
//!
//! Encoding runs in llama.cpp's order: (1) special-token partition
//! (`tokenizer_st_partition`: control/unknown tokens are cut out of the text
//! only when `parse_special` is set, user-defined tokens always, longest text
//! first), (2) each remaining raw fragment goes through the model's algorithm
//! (SentencePiece in [`spm`], byte-level BPE in [`bpe`]), (3) BOS/EOS are
//! added when `add_special` is set and the metadata asks for them.
//!
//! This module knows nothing about models, backends or sampling.

mod bpe;
pub mod chat;
mod pretok;
mod spm;
mod stream;
mod tojson;
mod vocab;

pub use bpe::known_pre_types;
pub use chat::{
    check_kwargs, ChatMessage, ChatTemplate, ChatTemplateError, TemplateArgs, TemplateKwargs,
};
pub use stream::StreamDecoder;
pub use vocab::VocabType;

use std::collections::HashMap;

use crate::gguf::{GgufError, Metadata};
use bpe::BpeModel;
use vocab::{attr, Vocab};

/// Errors of tokenizer construction and encoding.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] GgufError),
    #[error("tokenizer.ggml.model = {model:?} is not supported (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece); convert the model with a llama.cpp vocabulary of one of these kinds")]
    UnsupportedModel { model: String },
    #[error("tokenizer.ggml.pre = {pre:?} is not a known pre-tokenizer; known values: {known}. Re-convert the model with llama.cpp's convert_hf_to_gguf.py or report the value")]
    UnknownPreTokenizer { pre: String, known: String },
    #[error("tokenizer.ggml.tokens is empty; the GGUF file carries no vocabulary")]
    EmptyVocab,
    #[error("vocabulary of {n} tokens does not fit 32-bit token ids")]
    VocabTooLarge { n: usize },
    #[error(
        "{key} has {len} entries but the vocabulary has {n_vocab} tokens; the file is corrupt"
    )]
    ShortArray {
        key: &'static str,
        len: usize,
        n_vocab: usize,
    },
    #[error("duplicate token {text:?} in the vocabulary (ids {first} and {second}); the file is corrupt")]
    DuplicateToken {
        text: String,
        first: u32,
        second: u32,
    },
    #[error("{flag} is true but {id_key} is not set; the model metadata is inconsistent")]
    MissingSpecial {
        flag: &'static str,
        id_key: &'static str,
    },
    #[error("the vocabulary has no token for byte 0x{byte:02X} (neither <0x{byte:02X}> nor the byte itself), so this text cannot be encoded")]
    MissingByteToken { byte: u8 },
    #[error("building the BPE tokenizer failed: {0}")]
    Build(String),
    #[error("the pre-tokenizer's regex gave up on the text at byte {at} of a fragment ({reason}); its backtracking stack holds about a million characters, so break up runs that long (of spaces, letters or the like)")]
    PreTokenizer { at: usize, reason: String },
    #[error("BPE encoding failed: {0}")]
    Encode(String),
}

/// The model's algorithm for raw text.
#[derive(Debug)]
enum Model {
    /// The character pairs tokens join, found on the first fragment long
    /// enough to be cut (about 70 ms for Gemma 3's 262k tokens).
    Spm(Box<std::sync::OnceLock<spm::Joins>>),
    Bpe(Box<BpeModel>),
}

/// One piece of input after the special-token partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fragment {
    Text { start: usize, end: usize },
    Token(u32),
}

/// A tokenizer built from GGUF metadata. Cheap to share (`&self` methods).
#[derive(Debug)]
pub struct Tokenizer {
    kind: VocabType,
    vocab: Vocab,
    model: Model,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// `token_to_piece` with specials rendered, per id.
    pieces: Vec<Vec<u8>>,
    /// What one token of the model's algorithm can stand for, for
    /// [`Tokenizer::min_tokens`].
    cover: Cover,
}

/// The most bytes of raw text one token can stand for, and the bytes the
/// model's algorithm drops instead of encoding.
#[derive(Debug)]
struct Cover {
    max: usize,
    dropped: [bool; 256],
}

impl Tokenizer {
    /// Builds the tokenizer described by `tokenizer.ggml.*`.
    pub fn from_metadata(md: &Metadata) -> Result<Self, TokenizerError> {
        let model_name = md.get_str("tokenizer.ggml.model")?;
        let kind = match model_name {
            "llama" => VocabType::Spm,
            "gpt2" => VocabType::Bpe,
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    model: other.to_string(),
                })
            }
        };
        let mut vocab = vocab::load_table(md)?;
        let mut ids = vocab::default_ids(kind);
        let (mut add_bos, mut add_space_prefix, pre) = match kind {
            VocabType::Spm => (true, true, None),
            VocabType::Bpe => {
                let pre_name = md.opt("tokenizer.ggml.pre", Metadata::get_str)?;
                let pre = bpe::pre_config(pre_name.unwrap_or(""))?;
                if pre.no_default_bos {
                    ids.bos = None;
                }
                (pre.add_bos, false, Some(pre))
            }
        };
        let mut add_eos = false;
        if let Some(v) = md.opt("tokenizer.ggml.add_space_prefix", Metadata::get_bool)? {
            add_space_prefix = v;
        }
        vocab::finish(&mut vocab, md, ids)?;
        if let Some(v) = md.opt("tokenizer.ggml.add_bos_token", Metadata::get_bool)? {
            add_bos = v;
        }
        if let Some(v) = md.opt("tokenizer.ggml.add_eos_token", Metadata::get_bool)? {
            add_eos = v;
        }
        if add_bos && vocab.ids.bos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                flag: "tokenizer.ggml.add_bos_token",
                id_key: "tokenizer.ggml.bos_token_id",
            });
        }
        if add_eos && vocab.ids.eos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                flag: "tokenizer.ggml.add_eos_token",
                id_key: "tokenizer.ggml.eos_token_id",
            });
        }
        let model = match pre {
            None => Model::Spm(Box::default()),
            Some(pre) => {
                let merges = md.get_str_array("tokenizer.ggml.merges")?;
                Model::Bpe(Box::new(BpeModel::new(&vocab, &merges, &pre)?))
            }
        };
        let pieces = build_pieces(kind, &vocab);
        let cover = cover(kind, &vocab);
        Ok(Self {
            kind,
            vocab,
            model,
            add_bos,
            add_eos,
            add_space_prefix,
            pieces,
            cover,
        })
    }

    /// Which algorithm this vocabulary uses.
    pub fn vocab_type(&self) -> VocabType {
        self.kind
    }

    /// Number of tokens (`n_vocab`).
    pub fn n_vocab(&self) -> usize {
        self.vocab.n_tokens()
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.ids.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.vocab.ids.eos
    }

    /// End of turn (`<|im_end|>`, `<end_of_turn>`, ...), from metadata or detected by text.
    pub fn eot(&self) -> Option<u32> {
        self.vocab.ids.eot
    }

    /// Whether `add_special` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `add_special` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether generating `id` ends the generation (EOS, EOT, EOM and the
    /// other end-of-generation tokens llama.cpp recognises).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        self.vocab.eog.iter().copied().collect()
    }

    /// Whether `id` is a control token (BOS, EOS, `<|im_start|>`, ...).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::CONTROL != 0
    }

    /// The vocabulary text of `id` (`""` when out of range).
    pub fn token_text(&self, id: u32) -> &str {
        self.vocab.texts.get(id as usize).map_or("", |s| s.as_str())
    }

    /// The id whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.text_to_token(text)
    }

    /// Encodes `text` like `llama_tokenize(text, add_special, parse_special)`.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.vocab.ids.bos);
        }
        let mut prev_special = true;
        for f in fragments {
            match f {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text { start, end } => {
                    let raw = &text[start..end];
                    match &self.model {
                        Model::Spm(joins) => {
                            let mut s = String::with_capacity(raw.len() + 4);
                            if self.add_space_prefix && prev_special {
                                s.push(' ');
                            }
                            s.push_str(raw);
                            let s = s.replace(' ', "\u{2581}");
                            spm::tokenize(&self.vocab, joins, &s, &mut out)?;
                        }
                        Model::Bpe(m) => m.tokenize(raw, &mut out)?,
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.vocab.ids.eos);
        }
        Ok(out)
    }

    /// A lower bound on `encode(text, add_special, parse_special).len()`,
    /// found without encoding: the special-token partition as `encode`
    /// makes it, then each raw fragment counted as its length (less the
    /// bytes the algorithm drops) over the most bytes one token can stand
    /// for. A prompt that cannot fit a context is refused with this before
    /// it is encoded (about a second of a core for 14 MB).
    pub fn min_tokens(&self, text: &str, add_special: bool, parse_special: bool) -> usize {
        let specials = if add_special {
            usize::from(self.add_bos && self.vocab.ids.bos.is_some())
                + usize::from(self.add_eos && self.vocab.ids.eos.is_some())
        } else {
            0
        };
        let fragments: usize = self
            .partition(text, parse_special)
            .iter()
            .map(|f| match *f {
                Fragment::Token(_) => 1,
                Fragment::Text { start, end } => {
                    let raw = &text.as_bytes()[start..end];
                    let dropped = raw
                        .iter()
                        .filter(|&&b| self.cover.dropped[b as usize])
                        .count();
                    (raw.len() - dropped).div_ceil(self.cover.max)
                }
            })
            .sum();
        specials + fragments
    }

    /// Splits `text` around special tokens (`tokenizer_st_partition`).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text {
            start: 0,
            end: text.len(),
        });
        for &id in &self.vocab.special_cache {
            let a = self.vocab.attr(id);
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = self.token_text(id);
            if needle.is_empty() || !text.contains(needle) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text { start, end } = f else {
                    next.push(f);
                    continue;
                };
                let mut off = start;
                while let Some(pos) = text[off..end].find(needle) {
                    let m = off + pos;
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > off && is_c_space(text.as_bytes()[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > off {
                        next.push(Fragment::Text {
                            start: off,
                            end: left_end,
                        });
                    }
                    next.push(Fragment::Token(id));
                    off = m + needle.len();
                    if a & attr::RSTRIP != 0 {
                        while off < end && is_c_space(text.as_bytes()[off]) {
                            off += 1;
                        }
                    }
                }
                if off < end {
                    next.push(Fragment::Text { start: off, end });
                }
            }
            frags = next;
        }
        frags
    }

    /// The bytes `id` stands for, with control tokens rendered as their text
    /// (llama.cpp's `token_to_piece(..., special = true)`): byte tokens give
    /// their byte, byte-level BPE tokens their original bytes, SentencePiece
    /// `▁` a space. Unknown ids give nothing.
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        self.pieces.get(id as usize).cloned().unwrap_or_default()
    }

    /// As [`Self::token_to_piece`], but control and unknown tokens render as
    /// nothing unless `special` is set.
    pub fn token_to_piece_with(&self, id: u32, special: bool) -> &[u8] {
        if !special && self.vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return &[];
        }
        self.pieces.get(id as usize).map_or(&[], |p| p.as_slice())
    }

    /// Concatenated pieces of `ids` (specials rendered), invalid UTF-8 replaced.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, true)
    }

    /// Concatenated pieces of `ids`; control tokens only if `special`.
    pub fn decode_with(&self, ids: &[u32], special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_to_piece_with(id, special));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// C `isspace` on one byte.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// What one token can stand for.
/// - SentencePiece: a token is a vocabulary text found in the fragment
///   (spaces written as the 3-byte `▁`, so never shorter than the raw
///   text) or one byte (byte fallback; a missing byte is an error), so the
///   longest text in bytes bounds it, and no byte is dropped.
/// - Byte-level BPE: every raw byte becomes one character of GPT-2's
///   byte table and each token is a vocabulary text made of them, so the
///   longest text in characters bounds it. The `tokenizers` crate drops a
///   character that is not in the vocabulary (no unknown token is set):
///   SmolLM2's lacks 21 of them (bytes that begin no assigned character,
///   and six controls).
fn cover(kind: VocabType, vocab: &Vocab) -> Cover {
    let longest = |len: fn(&String) -> usize| vocab.texts.iter().map(len).max().unwrap_or(0).max(1);
    let mut dropped = [false; 256];
    let max = match kind {
        VocabType::Spm => longest(String::len),
        VocabType::Bpe => {
            for (d, c) in dropped.iter_mut().zip(bpe::byte_to_char_table()) {
                *d = vocab.text_to_token(c.encode_utf8(&mut [0; 4])).is_none();
            }
            longest(|t| t.chars().count())
        }
    };
    Cover { max, dropped }
}

/// Precomputes `token_to_piece(id, special = true)` for every id.
fn build_pieces(kind: VocabType, v: &Vocab) -> Vec<Vec<u8>> {
    let unbyte: HashMap<char, u8> = bpe::char_to_byte_map();
    (0..v.n_tokens())
        .map(|i| {
            let a = v.attrs[i];
            let text = &v.texts[i];
            if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
                text.as_bytes().to_vec()
            } else if a & attr::NORMAL != 0 {
                match kind {
                    VocabType::Spm => text.replace('\u{2581}', " ").into_bytes(),
                    VocabType::Bpe => {
                        let mut out = Vec::with_capacity(text.len());
                        for c in text.chars() {
                            match unbyte.get(&c) {
                                Some(&b) => out.push(b),
                                None => {
                                    let mut buf = [0u8; 4];
                                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                                }
                            }
                        }
                        out
                    }
                }
            } else if a & attr::BYTE != 0 {
                parse_byte_token(text).map(|b| vec![b]).unwrap_or_default()
            } else {
                Vec::new()
            }
        })
        .collect()
}

/// `<0xXX>` -> the byte.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests;
