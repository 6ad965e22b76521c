//! Incremental detokenization for streaming output: a token may end in the
//! middle of a UTF-8 character (byte tokens, byte-level BPE), so bytes are
//! held back until the character is complete.

use super::Tokenizer;

/// Turns a stream of ids into text, holding back incomplete UTF-8.
///
/// ```ignore
/// let mut sd = StreamDecoder::new(false);
/// for id in ids { print!("{}", sd.push(&tok, id)); }
/// print!("{}", sd.finish());
/// ```
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    special: bool,
}

impl StreamDecoder {
    /// `special`: render control tokens as their text.
    pub fn new(special: bool) -> Self {
        Self {
            pending: Vec::new(),
            special,
        }
    }

    /// Adds one token; returns the text that is complete so far. Invalid
    /// byte sequences become U+FFFD.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending
            .extend_from_slice(tok.token_to_piece_with(id, self.special));
        self.push_bytes_inner()
    }

    /// Adds raw bytes (for callers that already have pieces).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        self.push_bytes_inner()
    }

    fn push_bytes_inner(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Safe: `valid_up_to` bytes are valid UTF-8.
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete character at the end: wait for more bytes.
                        None => {
                            rest = &rest[valid..];
                            break;
                        }
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &rest[valid + n..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Whether bytes are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Flushes what is held back (lossily) and resets the decoder.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_character_is_held_back() {
        let mut sd = StreamDecoder::new(false);
        let euro = "€".as_bytes();
        assert_eq!(sd.push_bytes(&euro[..1]), "");
        assert!(sd.has_pending());
        assert_eq!(sd.push_bytes(&euro[1..2]), "");
        assert_eq!(sd.push_bytes(&[euro[2], b'x']), "€x");
        assert!(!sd.has_pending());
    }

    #[test]
    fn invalid_bytes_become_replacement() {
        let mut sd = StreamDecoder::new(false);
        assert_eq!(sd.push_bytes(&[b'a', 0xFF, b'b']), "a\u{FFFD}b");
        assert_eq!(sd.push_bytes(&[0xE2, 0x82]), "");
        assert_eq!(sd.finish(), "\u{FFFD}");
        assert_eq!(sd.finish(), "");
    }
}
