//! SentencePiece (`tokenizer.ggml.model = "llama"`) tokenization as
//! llama.cpp's `llm_tokenizer_spm` does it: start from UTF-8 characters,
//! repeatedly merge the adjacent pair whose concatenation is a vocabulary
//! token with the highest score (ties: leftmost), then re-segment symbols that
//! are not tokens through the recorded merges, falling back to `<0xXX>` byte
//! tokens. Whitespace escaping (space -> U+2581) and the space prefix are
//! applied by the caller per fragment.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::OnceLock;

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

/// The adjacent character pairs that occur inside some token's text. A
/// merge joins two symbols into a token, so it never joins across a
/// boundary whose two characters are not such a pair.
#[derive(Debug)]
pub(crate) struct Joins(HashSet<(char, char)>);

impl Joins {
    pub fn new(vocab: &Vocab) -> Self {
        let mut pairs = HashSet::new();
        for text in vocab.token_to_id.keys() {
            let mut chars = text.chars();
            let Some(mut prev) = chars.next() else {
                continue;
            };
            for c in chars {
                pairs.insert((prev, c));
                prev = c;
            }
        }
        Self(pairs)
    }

    fn join(&self, a: char, b: char) -> bool {
        self.0.contains(&(a, b))
    }
}

/// Bytes a fragment is tokenized in at a time, where it can be cut.
const CHUNK: usize = 4096;

/// Tokenizes one already escaped fragment, appending ids to `out`: in
/// chunks of about [`CHUNK`] bytes, each cut where no token joins the
/// characters either side ([`Joins`]). The result is the whole fragment's:
/// no merge crosses such a cut, so each side's bigrams, and the order in
/// which they are taken (score, then position), are the same alone as
/// together, and every final symbol is a token or a single character
/// (`resegment`'s merge record is keyed by texts of two characters or
/// more). Symbols and queue take about 60 bytes a byte, so the whole of
/// 14 MB of Gemma 3 prose without the whitespace runs it has tokens for
/// took 0.89 GiB and 16.5 s (0.15 GiB and 3.1 s in chunks, for the whole
/// process). A fragment with no cut point is tokenized whole.
pub(crate) fn tokenize(
    vocab: &Vocab,
    joins: &OnceLock<Joins>,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    if text.len() <= CHUNK {
        return tokenize_whole(vocab, text, out);
    }
    let joins = joins.get_or_init(|| Joins::new(vocab));
    tokenize_in_chunks(vocab, joins, text, CHUNK, out)
}

fn tokenize_in_chunks(
    vocab: &Vocab,
    joins: &Joins,
    text: &str,
    chunk: usize,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let mut start = 0;
    let mut prev = None;
    for (i, c) in text.char_indices() {
        if let Some(p) = prev {
            if i - start >= chunk && !joins.join(p, c) {
                tokenize_whole(vocab, &text[start..i], out)?;
                start = i;
            }
        }
        prev = Some(c);
    }
    tokenize_whole(vocab, &text[start..], out)
}

/// llama.cpp's `llm_tokenizer_spm_session` on the whole of `text`.
fn tokenize_whole(vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::Rng;

    const CHARS: &[char] = &['a', 'b', 'c', '▁', 'é', '.', '一'];

    /// No token holds `.` beside another character, nor `b▁`: the texts'
    /// cut points.
    fn unjoined(a: char, b: char) -> bool {
        a == '.' || b == '.' || (a == 'b' && b == '▁')
    }

    /// The 256 byte tokens, every character of [`CHARS`] but `一` (which
    /// falls back to bytes), and 400 random strings of two to five of them
    /// with integer scores, so that equal scores are common and the
    /// leftmost-first tie break matters.
    fn vocab(rng: &mut Rng) -> Vocab {
        let mut texts: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
        texts.extend(CHARS[..6].iter().map(|c| c.to_string()));
        while texts.len() < 256 + 6 + 400 {
            let len = 2 + (rng.next_u64() % 4) as usize;
            let t: Vec<char> = (0..len)
                .map(|_| CHARS[(rng.next_u64() % CHARS.len() as u64) as usize])
                .collect();
            let t_str: String = t.iter().collect();
            if t.windows(2).all(|w| !unjoined(w[0], w[1])) && !texts.contains(&t_str) {
                texts.push(t_str);
            }
        }
        let scores = (0..texts.len())
            .map(|_| -((rng.next_u64() % 8) as f32))
            .collect();
        Vocab::of_texts(texts, scores)
    }

    /// Chunked tokenization gives the whole fragment's ids, with cuts at
    /// every allowed point (chunk of one byte) or at some (seven bytes).
    #[test]
    fn chunks_cut_where_no_token_joins_give_the_whole_fragments_ids() {
        let mut rng = Rng(0x5e9);
        let v = vocab(&mut rng);
        let joins = Joins::new(&v);
        assert!(!joins.join('b', '▁') && !joins.join('a', '.') && joins.join('a', 'b'));
        let mut texts: Vec<String> = (0..300)
            .map(|_| {
                let len = 1 + rng.next_u64() % 200;
                (0..len)
                    .map(|_| CHARS[(rng.next_u64() % CHARS.len() as u64) as usize])
                    .collect()
            })
            .collect();
        texts.push(texts.concat());
        for text in &texts {
            let mut whole = Vec::new();
            tokenize_whole(&v, text, &mut whole).unwrap();
            for chunk in [1, 7] {
                let mut chunked = Vec::new();
                tokenize_in_chunks(&v, &joins, text, chunk, &mut chunked).unwrap();
                assert_eq!(chunked, whole, "chunk {chunk}, text {text:?}");
            }
        }
    }
}
