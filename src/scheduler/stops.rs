//! Stop strings matched as a generation's text grows: one Knuth-Morris-Pratt
//! automaton per string, fed only the bytes each token adds. A step costs
//! the new bytes times the number of strings. The check it replaces
//! searched a window as long as the longest string for every string, and
//! found the tail to hold back by comparing every prefix of every string:
//! one stop string of 2 MB took 12 ms of every engine step, for every
//! slot, and repetitive text made that quadratic in the string's length.

/// Most stop strings one request may give (llama-server takes any number;
/// OpenAI takes 4). Every engine step feeds each of them.
pub const MAX_STOP_STRINGS: usize = 1024;

/// Most bytes of stop strings, all together, in one request. Each byte
/// costs 9 bytes of automaton while the request waits and runs; a stop
/// string longer than the text a context holds never matches.
pub const MAX_STOP_BYTES: usize = 1 << 20;

/// The stop strings of one request and how far each has matched.
#[derive(Debug, Default)]
pub(super) struct StopStrings {
    stops: Vec<Automaton>,
}

#[derive(Debug)]
struct Automaton {
    pat: String,
    /// `fail[j]`: the longest proper prefix of `pat[..=j]` that is also
    /// its suffix.
    fail: Vec<usize>,
    /// The longest prefix of `pat` that the text so far ends with.
    matched: usize,
}

impl Automaton {
    fn new(stop: &str) -> Self {
        let pat = stop.as_bytes();
        let mut fail = vec![0; pat.len()];
        let mut k = 0;
        for j in 1..pat.len() {
            while k > 0 && pat[j] != pat[k] {
                k = fail[k - 1];
            }
            if pat[j] == pat[k] {
                k += 1;
            }
            fail[j] = k;
        }
        Self {
            pat: stop.to_string(),
            fail,
            matched: 0,
        }
    }

    /// Feeds `new`; the offset in `new` just past the first complete match.
    fn feed(&mut self, new: &[u8]) -> Option<usize> {
        let pat = self.pat.as_bytes();
        let mut q = self.matched;
        for (i, &b) in new.iter().enumerate() {
            while q > 0 && pat[q] != b {
                q = self.fail[q - 1];
            }
            if pat[q] == b {
                q += 1;
            }
            if q == pat.len() {
                self.matched = self.fail[q - 1];
                return Some(i + 1);
            }
        }
        self.matched = q;
        None
    }
}

impl StopStrings {
    /// The automata of `stops`, in their order (empty strings never
    /// match).
    pub(super) fn new(stops: &[String]) -> Self {
        let stops = stops
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| Automaton::new(s))
            .collect();
        Self { stops }
    }

    /// Feeds the bytes `new` that the text gained at byte `at` (its length
    /// before them). Returns the stop string that now occurs first, as
    /// `(its start in the text, the string)`: of the strings completed by
    /// these bytes, the one that starts earliest, the earlier in the list
    /// on a tie. Every earlier occurrence of every string ended in bytes
    /// fed before, so this is also the first occurrence in the whole text.
    pub(super) fn feed(&mut self, new: &[u8], at: usize) -> Option<(usize, &str)> {
        let mut first: Option<(usize, &str)> = None;
        for a in &mut self.stops {
            if let Some(end) = a.feed(new) {
                let start = at + end - a.pat.len();
                if first.is_none_or(|(s, _)| start < s) {
                    first = Some((start, &a.pat));
                }
            }
        }
        first
    }

    /// How many bytes at the end of the text may still begin a stop
    /// string: the longest proper prefix of any string that the text ends
    /// with (held back from the client until it is decided).
    pub(super) fn pending(&self) -> usize {
        self.stops.iter().map(|a| a.matched).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check this module replaced, on the whole text: the first
    /// occurrence of any string (earliest start, then list order) and the
    /// longest proper prefix of a string that the text ends with.
    fn naive<'a>(text: &str, stops: &'a [String]) -> (Option<(usize, &'a str)>, usize) {
        let hit = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()).map(|p| (p, s.as_str())))
            .min_by_key(|&(p, _)| p);
        let hold = stops
            .iter()
            .flat_map(|s| {
                (1..s.len()).filter(|&k| s.is_char_boundary(k) && text.ends_with(&s[..k]))
            })
            .max()
            .unwrap_or(0);
        (hit, hold)
    }

    /// xorshift64*: a fixed stream of pseudo-random numbers.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
        }
        fn text(&mut self, alphabet: &[&str], max: usize) -> String {
            let n = self.below(max + 1);
            (0..n)
                .map(|_| alphabet[self.below(alphabet.len())])
                .collect()
        }
    }

    /// Random texts fed in random pieces (small alphabets, with multi-byte
    /// characters, so strings overlap and repeat): after every piece, the
    /// first occurrence and the held tail equal the naive check's on the
    /// whole text so far, until a string occurs.
    #[test]
    fn streaming_matches_equal_the_naive_check() {
        let alphabet = ["a", "b", "ab", "é", "\u{1F600}"];
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut hits = 0;
        for _ in 0..3000 {
            let n_stops = rng.below(4);
            let stops: Vec<String> = (0..n_stops).map(|_| rng.text(&alphabet, 5)).collect();
            let mut m = StopStrings::new(&stops);
            let mut text = String::new();
            for _ in 0..12 {
                let piece = rng.text(&alphabet, 3);
                let at = text.len();
                text.push_str(&piece);
                let got = m.feed(piece.as_bytes(), at);
                let (want, hold) = naive(&text, &stops);
                assert_eq!(got, want, "{stops:?} on {text:?}");
                if got.is_some() {
                    hits += 1;
                    break;
                }
                assert_eq!(m.pending(), hold, "{stops:?} on {text:?}");
            }
        }
        // The cases exercise both outcomes.
        assert!(hits > 500, "{hits} hits");
    }

    #[test]
    fn a_long_repetitive_string_costs_only_the_new_bytes() {
        // The naive check compared every prefix of the string with the
        // text's tail: 10^5 bytes of "z" against such a tail is 5 * 10^9
        // byte comparisons per token. Here: the prefix matched so far.
        let stop = "z".repeat(100_000) + "q";
        let mut m = StopStrings::new(std::slice::from_ref(&stop));
        let mut at = 0;
        for _ in 0..50_000 {
            assert_eq!(m.feed(b"zz", at), None);
            at += 2;
        }
        assert_eq!(m.pending(), 100_000);
        assert_eq!(m.feed(b"q", at), Some((at - 100_000, stop.as_str())));
    }
}
