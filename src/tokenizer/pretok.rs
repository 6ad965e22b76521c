//! The pre-tokenizer's matchers. Four regexes are matched by hand, as
//! llama.cpp matches them by hand (`unicode_regex_split_custom_*`): GPT-2's,
//! Llama 3's, Qwen 2's and Qwen 3.5's, which cover SmolLM2, Llama 3, Qwen 2
//! and 3 (MoE included) and Qwen 3.5. Each hand matcher gives the regex's
//! own matches (alternatives in order, each greedy, as a backtracking
//! engine takes them) in one pass, on a piece of any length: fancy-regex
//! gives up on a run of about a million characters that its backtracking
//! stack has to hold (a million spaces, for every family's `\s+(?!\S)`),
//! where llama.cpp's hand matchers do not. The other regexes run on
//! fancy-regex, the `tokenizers` crate's engine, and such a run there is
//! an error.
//!
//! The character classes are the regex engine's own: `\p{L}`, `\p{N}`,
//! `\p{M}` and `\s` (Unicode's White_Space) as `regex-syntax`, which
//! fancy-regex hands its classes to, defines them.

use std::sync::OnceLock;

use super::bpe::{GPT2, LLAMA3, QWEN2, QWEN35};

const LETTER: u8 = 1;
const NUMBER: u8 = 2;
const MARK: u8 = 4;
const SPACE: u8 = 8;

/// The class of every character: a table for ASCII, and the sorted,
/// disjoint ranges of the four classes for the rest (general categories
/// are disjoint, and White_Space characters are separators and controls).
struct Classes {
    ascii: [u8; 128],
    ranges: Vec<(u32, u32, u8)>,
}

fn classes() -> &'static Classes {
    static CLASSES: OnceLock<Classes> = OnceLock::new();
    CLASSES.get_or_init(|| {
        let mut ranges = Vec::new();
        for (class, flag) in [
            (r"\p{L}", LETTER),
            (r"\p{N}", NUMBER),
            (r"\p{M}", MARK),
            (r"\s", SPACE),
        ] {
            ranges.extend(class_ranges(class).into_iter().map(|(a, b)| (a, b, flag)));
        }
        ranges.sort_unstable();
        let mut ascii = [0; 128];
        for (c, f) in ascii.iter_mut().enumerate() {
            *f = lookup(&ranges, c as u32);
        }
        Classes { ascii, ranges }
    })
}

/// The ranges of one Unicode class as `regex-syntax` parses it.
fn class_ranges(class: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    match regex_syntax::parse(class).map(|h| h.into_kind()) {
        Ok(HirKind::Class(Class::Unicode(c))) => c
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        // The four patterns above are fixed classes; a `regex-syntax` that
        // parsed them otherwise would be caught by this module's tests.
        _ => Vec::new(),
    }
}

fn lookup(ranges: &[(u32, u32, u8)], c: u32) -> u8 {
    let i = ranges.partition_point(|&(start, _, _)| start <= c);
    match i.checked_sub(1).map(|i| ranges[i]) {
        Some((_, end, flag)) if c <= end => flag,
        _ => 0,
    }
}

fn class(c: char) -> u8 {
    let t = classes();
    match t.ascii.get(c as usize) {
        Some(&f) => f,
        None => lookup(&t.ranges, c as u32),
    }
}

/// A regex matched by hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hand {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// Case-free contractions, `[^\r\n\p{L}\p{N}]?\p{L}+`, numbers of up to
    /// `digits`, ` ?[^\s\p{L}\p{N}]+[\r\n]*`, `\s*[\r\n]+`, `\s+(?!\S)`,
    /// `\s+`; with `marks`, `\p{M}` joins `\p{L}` in words (Qwen 3.5).
    Words { digits: usize, marks: bool },
}

impl Hand {
    /// The hand matcher for `regex`, where there is one.
    pub fn of(regex: &str) -> Option<Self> {
        match regex {
            GPT2 => Some(Self::Gpt2),
            LLAMA3 => Some(Self::Words {
                digits: 3,
                marks: false,
            }),
            QWEN2 => Some(Self::Words {
                digits: 1,
                marks: false,
            }),
            QWEN35 => Some(Self::Words {
                digits: 1,
                marks: true,
            }),
            _ => None,
        }
    }

    /// The matches in `s`, left to right, as `(start, end)` byte offsets.
    pub fn find_iter(self, s: &str) -> HandMatches<'_> {
        HandMatches {
            hand: self,
            s,
            pos: 0,
        }
    }

    /// The end of the match that starts at byte `i` (character `c`), if
    /// one does.
    fn match_at(self, s: &str, i: usize, c: char) -> Option<usize> {
        match self {
            Self::Gpt2 => gpt2_at(s, i, c),
            Self::Words { digits, marks } => words_at(s, i, c, digits, marks),
        }
    }
}

/// The character at byte `i`, if any.
fn char_at(s: &str, i: usize) -> Option<char> {
    s.get(i..).and_then(|r| r.chars().next())
}

/// The end of the run of characters from byte `i` that `keep` accepts.
fn run_end(s: &str, i: usize, keep: impl Fn(char) -> bool) -> usize {
    s[i..]
        .char_indices()
        .find(|&(_, c)| !keep(c))
        .map_or(s.len(), |(k, _)| i + k)
}

/// The contraction at byte `i` (at an apostrophe), if one is there.
fn contraction(s: &str, i: usize, any_case: bool) -> Option<usize> {
    let rest = &s.as_bytes()[i + 1..];
    ["s", "t", "re", "ve", "m", "ll", "d"]
        .iter()
        .find_map(|suffix| {
            let head = rest.get(..suffix.len())?;
            let hit = if any_case {
                head.eq_ignore_ascii_case(suffix.as_bytes())
            } else {
                head == suffix.as_bytes()
            };
            hit.then_some(i + 1 + suffix.len())
        })
}

/// A whitespace run from byte `i`: its end, where its last character
/// starts, and the end of its last `\r` or `\n`.
struct SpaceRun {
    end: usize,
    last: usize,
    last_newline_end: Option<usize>,
}

fn space_run(s: &str, i: usize) -> SpaceRun {
    let mut run = SpaceRun {
        end: i,
        last: i,
        last_newline_end: None,
    };
    for (k, c) in s[i..].char_indices() {
        if class(c) & SPACE == 0 {
            break;
        }
        run.last = i + k;
        run.end = i + k + c.len_utf8();
        if c == '\r' || c == '\n' {
            run.last_newline_end = Some(run.end);
        }
    }
    run
}

/// `\s+(?!\S)` on the run from `i`: all of it at the end of the piece,
/// else all but its last character, which must then exist beyond the first.
fn spaces_before_text(s: &str, i: usize, run: &SpaceRun) -> Option<usize> {
    if run.end == s.len() {
        Some(run.end)
    } else if run.last > i {
        Some(run.last)
    } else {
        None
    }
}

fn gpt2_at(s: &str, i: usize, c: char) -> Option<usize> {
    if c == '\'' {
        if let Some(end) = contraction(s, i, false) {
            return Some(end);
        }
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the optional space is
    // taken where the class follows it, else the class must start at `i`.
    let start = if c == ' ' { i + 1 } else { i };
    if let Some(d) = char_at(s, start) {
        let f = class(d);
        for want in [LETTER, NUMBER] {
            if f & want != 0 {
                return Some(run_end(s, start, |x| class(x) & want != 0));
            }
        }
        let other = |x| class(x) & (SPACE | LETTER | NUMBER) == 0;
        if other(d) {
            return Some(run_end(s, start, other));
        }
    }
    if class(c) & SPACE != 0 {
        return spaces_before_text(s, i, &space_run(s, i));
    }
    None
}

fn words_at(s: &str, i: usize, c: char, digits: usize, marks: bool) -> Option<usize> {
    if c == '\'' {
        if let Some(end) = contraction(s, i, true) {
            return Some(end);
        }
    }
    let word_mask = if marks { LETTER | MARK } else { LETTER };
    let word = |x| class(x) & word_mask != 0;
    let f = class(c);
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    if word(c) {
        return Some(run_end(s, i, word));
    }
    let next = i + c.len_utf8();
    if c != '\r' && c != '\n' && f & NUMBER == 0 && char_at(s, next).is_some_and(word) {
        return Some(run_end(s, next, word));
    }
    // `\p{N}{1,digits}`
    if f & NUMBER != 0 {
        let mut end = i;
        for (k, x) in s[i..].char_indices().take(digits) {
            if class(x) & NUMBER == 0 {
                break;
            }
            end = i + k + x.len_utf8();
        }
        return Some(end);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*` (without `\p{M}` too where marks are word)
    let other = |x| class(x) & (SPACE | NUMBER | word_mask) == 0;
    let start = if c == ' ' { next } else { i };
    if char_at(s, start).is_some_and(other) {
        let end = run_end(s, start, other);
        return Some(run_end(s, end, |x| x == '\r' || x == '\n'));
    }
    if f & SPACE != 0 {
        let run = space_run(s, i);
        // `\s*[\r\n]+`, then `\s+(?!\S)`, then `\s+`.
        return run
            .last_newline_end
            .or_else(|| spaces_before_text(s, i, &run))
            .or(Some(run.end));
    }
    None
}

/// The matches of a hand matcher, as `fancy_regex::Regex::find_iter` gives
/// them: from where the last one ended, the next position one starts at.
pub(crate) struct HandMatches<'h> {
    hand: Hand,
    s: &'h str,
    pos: usize,
}

impl Iterator for HandMatches<'_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        while let Some(c) = char_at(self.s, self.pos) {
            let start = self.pos;
            match self.hand.match_at(self.s, start, c) {
                Some(end) => {
                    self.pos = end;
                    return Some((start, end));
                }
                None => self.pos += c.len_utf8(),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::symbol_runs;

    /// The matches fancy-regex gives for `regex` on `s`.
    fn regex_matches(regex: &fancy_regex::Regex, s: &str) -> Vec<(usize, usize)> {
        regex
            .find_iter(s)
            .map(|m| m.map(|m| (m.start(), m.end())).unwrap())
            .collect()
    }

    /// Symbols that reach every branch: each contraction letter in both
    /// cases, letters of several scripts, marks alone and after letters
    /// and spaces, digits of three scripts, every kind of whitespace,
    /// punctuation and symbols, an unassigned code point and a control.
    const SYMBOLS: &[&str] = &[
        "a", "Z", "s", "S", "t", "T", "r", "R", "e", "E", "v", "V", "m", "M", "l", "L", "d", "D",
        "'", "1", "9", "²", "٣", "Ⅻ", " ", "\t", "\n", "\r", "\u{b}", "\u{85}", "\u{a0}",
        "\u{2028}", "\u{3000}", ".", "!", "$", "/", "(", "\u{301}", "\u{93f}", "é", "ß", "一",
        "あ", "가", "😀", "\u{4}", "\u{378}", "\u{e000}",
    ];

    /// Every hand matcher gives fancy-regex's matches on 3,000 texts of
    /// runs of one to five symbols (a run of one symbol tests what follows
    /// a space or a word; longer runs test the loops and the digit cap).
    #[test]
    fn hand_matchers_give_the_regex_matches() {
        let texts = symbol_runs(0x5b117, SYMBOLS, 3000, 24, 5);
        for re in [GPT2, LLAMA3, QWEN2, QWEN35] {
            let hand = Hand::of(re).unwrap();
            let regex = fancy_regex::Regex::new(re).unwrap();
            for text in &texts {
                let want = regex_matches(&regex, text);
                let got: Vec<_> = hand.find_iter(text).collect();
                assert_eq!(got, want, "{hand:?} on {text:?}");
            }
        }
    }

    /// A whitespace run fancy-regex cannot hold is matched as the regex
    /// defines it: all but its last space before text, all of it at the
    /// end; the same text a little shorter agrees with fancy-regex.
    #[test]
    fn hand_matchers_take_runs_the_regex_engine_cannot_hold() {
        for re in [GPT2, LLAMA3, QWEN2, QWEN35] {
            let hand = Hand::of(re).unwrap();
            let regex = fancy_regex::Regex::new(re).unwrap();
            let short = format!("a{}b c", " ".repeat(999_990));
            assert_eq!(
                hand.find_iter(&short).collect::<Vec<_>>(),
                regex_matches(&regex, &short),
                "{hand:?}"
            );
            let n = 1_000_010;
            let long = format!("a{}b c{}", " ".repeat(n), "\t".repeat(n));
            assert!(regex.find_iter(&long).any(|m| m.is_err()), "{hand:?}");
            let want = vec![
                (0, 1),
                (1, n),
                (n, n + 2),
                (n + 2, n + 4),
                (n + 4, 2 * n + 4),
            ];
            assert_eq!(hand.find_iter(&long).collect::<Vec<_>>(), want, "{hand:?}");
        }
    }

    /// Only these four regexes have hand matchers.
    #[test]
    fn hand_matchers_are_for_their_regexes_only() {
        assert_eq!(Hand::of(GPT2), Some(Hand::Gpt2));
        assert_eq!(Hand::of(r"\p{N}"), None);
        assert_eq!(Hand::of(&format!("{LLAMA3}|x")), None);
    }

    /// The class table holds what the regex engine's classes hold: the
    /// categories are disjoint, and sampled characters classify as the
    /// engine's own `\p{..}` and `\s` match them.
    #[test]
    fn classes_are_the_regex_engines() {
        let t = classes();
        for w in t.ranges.windows(2) {
            assert!(w[0].1 < w[1].0, "overlapping ranges {w:?}");
        }
        assert!(t.ranges.len() > 1000, "{} ranges", t.ranges.len());
        let engine: Vec<(u8, fancy_regex::Regex)> = [
            (LETTER, r"^\p{L}$"),
            (NUMBER, r"^\p{N}$"),
            (MARK, r"^\p{M}$"),
            (SPACE, r"^\s$"),
        ]
        .into_iter()
        .map(|(f, re)| (f, fancy_regex::Regex::new(re).unwrap()))
        .collect();
        for cp in (0..0x3_0000).step_by(7).chain(0..0x3000) {
            let Some(c) = char::from_u32(cp) else {
                continue;
            };
            let want = engine
                .iter()
                .filter(|(_, re)| re.is_match(c.encode_utf8(&mut [0; 4])).unwrap())
                .fold(0, |acc, (f, _)| acc | f);
            assert_eq!(class(c), want, "U+{cp:04X}");
        }
    }
}
