//! SentencePiece (`tokenizer.ggml.model = "llama"`) tokenization as
//! llama.cpp's `llm_tokenizer_spm` does it: start from UTF-8 characters,
//! repeatedly merge the adjacent pair whose concatenation is a vocabulary
//! token with the highest score (ties: leftmost), then re-segment symbols that
//! are not tokens through the recorded merges, falling back to `<0xXX>` byte
//! tokens. Whitespace escaping (space -> U+2581) and the space prefix are
//! applied by the caller per fragment.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::vocab::Vocab;
use super::TokenizerError;

#[derive(Clone, Copy, Debug)]
struct Symbol {
    prev: isize,
    next: isize,
    start: usize,
    len: usize,
}

#[derive(Clone, Copy, Debug)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order of llama.cpp's comparator: higher score first, then
    /// the lower left index. Scores compare with `<` so that 0.0 == -0.0.
    fn cmp(&self, other: &Self) -> Ordering {
        if self.score < other.score {
            Ordering::Less
        } else if self.score > other.score {
            Ordering::Greater
        } else {
            other.left.cmp(&self.left)
        }
    }
}

/// Byte-fallback id for `b`: `<0xXX>`, else the one-byte text itself.
pub(crate) fn byte_to_token(vocab: &Vocab, b: u8) -> Result<u32, TokenizerError> {
    let hex = format!("<0x{b:02X}>");
    if let Some(id) = vocab.text_to_token(&hex) {
        return Ok(id);
    }
    if b < 0x80 {
        if let Some(id) = vocab.text_to_token(std::str::from_utf8(&[b]).unwrap_or("")) {
            return Ok(id);
        }
    }
    Err(TokenizerError::MissingByteToken { byte: b })
}

struct Session<'a> {
    vocab: &'a Vocab,
    text: &'a str,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
    rev_merge: HashMap<&'a str, (usize, usize)>,
}

impl<'a> Session<'a> {
    fn try_add_bigram(&mut self, left: isize, right: isize) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
        let piece = &self.text[l.start..l.start + l.len + r.len];
        let Some(id) = self.vocab.text_to_token(piece) else {
            return;
        };
        self.queue.push(Bigram {
            left: left as usize,
            right: right as usize,
            score: self.vocab.scores[id as usize],
            size: piece.len(),
        });
        self.rev_merge
            .insert(piece, (left as usize, right as usize));
    }

    fn resegment(&self, sym: Symbol, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let piece = &self.text[sym.start..sym.start + sym.len];
        if let Some(id) = self.vocab.text_to_token(piece) {
            out.push(id);
            return Ok(());
        }
        match self.rev_merge.get(piece) {
            Some(&(l, r)) => {
                self.resegment(self.symbols[l], out)?;
                self.resegment(self.symbols[r], out)
            }
            None => {
                for &b in piece.as_bytes() {
                    out.push(byte_to_token(self.vocab, b)?);
                }
                Ok(())
            }
        }
    }
}

/// Tokenizes one already escaped fragment, appending ids to `out`.
pub(crate) fn tokenize(
    vocab: &Vocab,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    if text.is_empty() {
        return Ok(());
    }
    let mut s = Session {
        vocab,
        text,
        symbols: Vec::with_capacity(text.len()),
        queue: BinaryHeap::new(),
        rev_merge: HashMap::new(),
    };
    let n_chars = text.chars().count();
    for (index, (start, c)) in text.char_indices().enumerate() {
        s.symbols.push(Symbol {
            prev: index as isize - 1,
            next: if index + 1 == n_chars {
                -1
            } else {
                index as isize + 1
            },
            start,
            len: c.len_utf8(),
        });
    }
    for i in 1..s.symbols.len() {
        s.try_add_bigram(i as isize - 1, i as isize);
    }
    while let Some(bigram) = s.queue.pop() {
        let (l, r) = (s.symbols[bigram.left], s.symbols[bigram.right]);
        // One side was merged away since this bigram was queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
            continue;
        }
        s.symbols[bigram.left].len += r.len;
        s.symbols[bigram.right].len = 0;
        s.symbols[bigram.left].next = r.next;
        if r.next >= 0 {
            s.symbols[r.next as usize].prev = bigram.left as isize;
        }
        let left = s.symbols[bigram.left];
        s.try_add_bigram(left.prev, bigram.left as isize);
        s.try_add_bigram(bigram.left as isize, left.next);
    }
    let mut i = 0isize;
    while i != -1 {
        let sym = s.symbols[i as usize];
        s.resegment(sym, out)?;
        i = sym.next;
    }
    Ok(())
}
