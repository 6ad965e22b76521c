//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`), built with the
//! `tokenizers` crate from the GGUF tokens and merges. The pre-tokenizer is
//! the list of regexes llama.cpp's `llm_tokenizer_bpe` uses for the file's
//! `tokenizer.ggml.pre`: each regex splits every piece the previous one
//! produced, keeping both matches and the text between them (a `Sequence` of
//! `Split { behavior: Isolated }`), then bytes map to GPT-2's printable
//! characters and merges run by rank.

use std::collections::{HashMap, HashSet};

use tokenizers::models::bpe::BPE;
use tokenizers::Model;

use super::pretok::{Hand, HandMatches};
use super::vocab::Vocab;
use super::TokenizerError;

/// GPT-2's original split (llama.cpp runs it with a hand-written matcher).
pub(super) const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
pub(super) const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(super) const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(super) const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK3_MAIN: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

/// How llama.cpp treats one family of `tokenizer.ggml.pre` values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreConfig {
    pub regexes: &'static [&'static str],
    /// A whole pre-token that is a vocabulary entry is taken as is.
    pub ignore_merges: bool,
    /// llama.cpp's `add_bos` default for this family (metadata overrides).
    pub add_bos: bool,
    /// llama.cpp clears the default BOS id for this family.
    pub no_default_bos: bool,
}

const fn cfg(regexes: &'static [&'static str]) -> PreConfig {
    PreConfig {
        regexes,
        ignore_merges: false,
        add_bos: false,
        no_default_bos: false,
    }
}

const DEFAULT: PreConfig = cfg(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]);
const PRE_GPT2: PreConfig = cfg(&[GPT2]);
const PRE_LLAMA3: PreConfig = PreConfig {
    ignore_merges: true,
    add_bos: true,
    ..cfg(&[LLAMA3])
};
const PRE_DBRX: PreConfig = cfg(&[LLAMA3]);
const PRE_CHATGLM4: PreConfig = PreConfig {
    no_default_bos: true,
    ..cfg(&[LLAMA3])
};
const PRE_SMOLLM: PreConfig = cfg(&[r"\p{N}", GPT2]);
const PRE_QWEN2: PreConfig = cfg(&[QWEN2]);
const PRE_QWEN35: PreConfig = cfg(&[QWEN35]);
const PRE_GPT4O: PreConfig = cfg(&[GPT4O]);
const PRE_DEEPSEEK3: PreConfig = cfg(&[r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_MAIN]);
const PRE_DEEPSEEK_CODER: PreConfig = cfg(&[
    "[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}",
]);
const PRE_FALCON: PreConfig = cfg(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"]);
const PRE_BAILINGMOE: PreConfig = cfg(&[
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
]);

/// `tokenizer.ggml.pre` values this build understands, with their family.
const PRE_TYPES: &[(&str, PreConfig)] = &[
    ("default", DEFAULT),
    ("llama3", PRE_LLAMA3),
    ("llama-v3", PRE_LLAMA3),
    ("llama-bpe", PRE_LLAMA3),
    ("falcon3", PRE_LLAMA3),
    ("falcon-h1", PRE_LLAMA3),
    ("pixtral", PRE_LLAMA3),
    ("midm-2.0", PRE_LLAMA3),
    ("lfm2", PRE_LLAMA3),
    ("dbrx", PRE_DBRX),
    ("smaug-bpe", PRE_DBRX),
    ("glm4", PRE_CHATGLM4),
    ("chatglm-bpe", PRE_CHATGLM4),
    ("gpt-2", PRE_GPT2),
    ("phi-2", PRE_GPT2),
    ("mpt", PRE_GPT2),
    ("olmo", PRE_GPT2),
    ("jais", PRE_GPT2),
    ("trillion", PRE_GPT2),
    ("granite-docling", PRE_GPT2),
    ("exaone4", PRE_GPT2),
    ("smollm", PRE_SMOLLM),
    ("starcoder", PRE_SMOLLM),
    ("refact", PRE_SMOLLM),
    ("command-r", PRE_SMOLLM),
    ("codeshell", PRE_SMOLLM),
    ("exaone", PRE_SMOLLM),
    ("minerva-7b", PRE_SMOLLM),
    ("qwen2", PRE_QWEN2),
    ("deepseek-r1-qwen", PRE_QWEN2),
    ("megrez", PRE_QWEN2),
    ("stablelm2", PRE_QWEN2),
    ("hunyuan", PRE_QWEN2),
    ("qwen35", PRE_QWEN35),
    ("gpt-4o", PRE_GPT4O),
    ("llama4", PRE_GPT4O),
    ("minimax-m2", PRE_GPT4O),
    ("deepseek-v3", PRE_DEEPSEEK3),
    ("hunyuan-dense", PRE_DEEPSEEK3),
    ("deepseek-coder", PRE_DEEPSEEK_CODER),
    ("falcon", PRE_FALCON),
    ("bailingmoe", PRE_BAILINGMOE),
    ("bailingmoe2", PRE_BAILINGMOE),
    ("llada-moe", PRE_BAILINGMOE),
];

/// The configuration for `pre`; an empty value means `default`, as in llama.cpp.
pub(crate) fn pre_config(pre: &str) -> Result<PreConfig, TokenizerError> {
    let pre = if pre.is_empty() { "default" } else { pre };
    PRE_TYPES
        .iter()
        .find(|(name, _)| *name == pre)
        .map(|(_, c)| *c)
        .ok_or_else(|| TokenizerError::UnknownPreTokenizer {
            pre: pre.to_string(),
            known: known_pre_types(),
        })
}

/// Comma-separated list of the supported `tokenizer.ggml.pre` values.
pub fn known_pre_types() -> String {
    PRE_TYPES
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// GPT-2's byte -> printable character table (`bytes_to_unicode`).
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if printable {
            b as u32
        } else {
            extra += 1;
            255 + extra
        };
        table[b as usize] = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    table
}

/// The inverse of [`byte_to_char_table`].
pub(crate) fn char_to_byte_map() -> HashMap<char, u8> {
    byte_to_char_table()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// One pre-tokenizer regex: matched by hand where llama.cpp matches it by
/// hand, else by fancy-regex.
enum Splitter {
    Regex(fancy_regex::Regex),
    Hand(Hand),
}

enum Matches<'r, 'h> {
    Regex(fancy_regex::Matches<'r, 'h>),
    Hand(HandMatches<'h>),
}

impl Iterator for Matches<'_, '_> {
    type Item = Result<(usize, usize), fancy_regex::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Self::Regex(m) => m.next().map(|m| m.map(|m| (m.start(), m.end()))),
            Self::Hand(m) => m.next().map(Ok),
        }
    }
}

/// A byte-level BPE model ready to encode raw-text fragments.
///
/// It runs the `tokenizers` crate's own pieces (its regex engine, its BPE
/// model) the way that crate's `Tokenizer` composes them for this pipeline
/// (except that four regexes are matched by hand, as in llama.cpp, and
/// where the regex engine fails, below), a `Sequence` of `Split { behavior: Isolated }` and `ByteLevel` with no
/// normalizer, added tokens or post-processor, but streams each piece
/// through to the model as soon as it is cut. The crate's `Tokenizer` builds
/// the whole text as a `NormalizedString` first (an alignment pair of 16
/// bytes per byte, copied again at every split) and holds every piece until
/// the end: about 125 bytes of memory per byte of text (14 MB of prose on
/// SmolLM2: 1.69 GiB and 5.9 s, now 0.06 GiB and 0.9 s for the whole
/// process). Streaming holds the ids and one piece.
pub(crate) struct BpeModel {
    /// The pre-tokenizer regexes, applied in order: each splits every piece
    /// the previous one cut.
    splits: Vec<Splitter>,
    model: BPE,
    bytes: [char; 256],
    /// Whether byte `b`'s character is a token (SmolLM2 lacks 21).
    known: [bool; 256],
    ignore_merges: bool,
}

impl std::fmt::Debug for BpeModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BpeModel")
    }
}

impl BpeModel {
    /// Builds the model from the vocabulary and `tokenizer.ggml.merges`.
    /// Merges are `"left right"` (split at the first space after position
    /// 0); a duplicate pair keeps its first rank, and a merge whose parts or
    /// result are not tokens is dropped (the `tokenizers` crate requires
    /// all three to exist).
    pub fn new(vocab: &Vocab, merges: &[&str], pre: &PreConfig) -> Result<Self, TokenizerError> {
        let mut seen = HashSet::with_capacity(merges.len());
        let mut pairs = Vec::with_capacity(merges.len());
        for m in merges {
            let bytes = m.as_bytes();
            let Some(pos) = bytes.iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (a, b) = (&m[..pos], &m[pos + 1..]);
            let ok = vocab.token_to_id.contains_key(a)
                && vocab.token_to_id.contains_key(b)
                && vocab.token_to_id.contains_key(&format!("{a}{b}"));
            if ok && seen.insert((a, b)) {
                pairs.push((a.to_string(), b.to_string()));
            }
        }
        let model = BPE::builder()
            .vocab_and_merges(
                vocab
                    .token_to_id
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect::<tokenizers::models::bpe::Vocab>(),
                pairs,
            )
            .ignore_merges(pre.ignore_merges)
            .build()
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        let splits = pre
            .regexes
            .iter()
            .map(|re| match Hand::of(re) {
                Some(hand) => Ok(Splitter::Hand(hand)),
                None => fancy_regex::Regex::new(re)
                    .map(Splitter::Regex)
                    .map_err(|e| TokenizerError::Build(format!("pre-tokenizer regex {re:?}: {e}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bytes = byte_to_char_table();
        let known = bytes.map(|c| {
            vocab
                .token_to_id
                .contains_key(c.encode_utf8(&mut [0; 4]) as &str)
        });
        Ok(Self {
            splits,
            model,
            bytes,
            known,
            ignore_merges: pre.ignore_merges,
        })
    }

    /// Appends the ids of one raw-text fragment.
    pub fn tokenize(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut mapped = String::new();
        self.split(0, text, 0, &mut mapped, out)
    }

    /// Cuts `piece` with regex `level` as the crate's `Split` with
    /// `Isolated` does (every match and every gap between matches is a
    /// piece; empty ones are dropped) and passes each piece on to the next
    /// regex, or to the model after the last. `at` is where `piece` starts
    /// in the fragment.
    ///
    /// fancy-regex fails on a run of about a million characters that its
    /// backtracking stack has to hold (a million spaces for every family's
    /// `\s+(?!\S)`, a million letters for `gpt-4o`'s cased words). The
    /// crate's `SysRegex` then ends its matches silently and the rest of
    /// the piece went to the model whole, merged across words (a million
    /// spaces then `world` gave `world`, not ` world`); here that is an
    /// error instead. The hand matchers (`pretok.rs`) take any run, as
    /// llama.cpp's do.
    fn split(
        &self,
        level: usize,
        piece: &str,
        at: usize,
        mapped: &mut String,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        if piece.is_empty() {
            return Ok(());
        }
        let Some(splitter) = self.splits.get(level) else {
            return self.encode_piece(piece, mapped, out);
        };
        let mut prev = 0;
        let matches = match splitter {
            Splitter::Regex(re) => Matches::Regex(re.find_iter(piece)),
            Splitter::Hand(hand) => Matches::Hand(hand.find_iter(piece)),
        };
        for m in matches {
            let (start, end) = m.map_err(|e| TokenizerError::PreTokenizer {
                at: at + prev,
                reason: e.to_string(),
            })?;
            self.split(level + 1, &piece[prev..start], at + prev, mapped, out)?;
            self.split(level + 1, &piece[start..end], at + start, mapped, out)?;
            prev = end;
        }
        self.split(level + 1, &piece[prev..], at + prev, mapped, out)
    }

    /// `ByteLevel` (each byte to GPT-2's printable character), then the
    /// BPE model on the piece, as the crate's `Tokenizer` calls it, except
    /// for a byte whose character is not a token. llama.cpp keeps it as a
    /// symbol that no merge takes and drops it at the end, so it parts its
    /// neighbours; the crate drops it before merging and lets them merge
    /// (on SmolLM2, `" \x04%"` gave `Ġ%` where llama.cpp gives `Ġ`, `%`).
    /// Here the runs of known bytes either side go to the model apart,
    /// after llama.cpp's whole-piece lookup where the family ignores
    /// merges.
    fn encode_piece(
        &self,
        piece: &str,
        mapped: &mut String,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let bytes = piece.as_bytes();
        let unknown = |b: &u8| !self.known[*b as usize];
        if self.ignore_merges && bytes.iter().any(unknown) {
            mapped.clear();
            mapped.extend(bytes.iter().map(|&b| self.bytes[b as usize]));
            if let Some(id) = self.model.token_to_id(mapped) {
                out.push(id);
                return Ok(());
            }
        }
        for run in bytes.split(unknown).filter(|run| !run.is_empty()) {
            mapped.clear();
            mapped.extend(run.iter().map(|&b| self.bytes[b as usize]));
            let tokens = self
                .model
                .tokenize(mapped)
                .map_err(|e| TokenizerError::Encode(e.to_string()))?;
            out.extend(tokens.iter().map(|t| t.id));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::symbol_runs;

    #[test]
    fn every_pre_regex_compiles() {
        for (name, c) in PRE_TYPES {
            for re in c.regexes {
                assert!(
                    fancy_regex::Regex::new(re).is_ok(),
                    "regex of pre type {name} does not compile: {re}"
                );
            }
        }
    }

    /// Symbols that reach every class the regexes name: cased letters and
    /// the contraction letters, digits, whitespace kinds, punctuation and
    /// symbols, a combining mark, CJK, kana, Hangul, a 4-byte emoji and a
    /// control byte.
    const SYMBOLS: &[&str] = &[
        "a", "B", "s", "t", "d", "'", "1", "2", "3", " ", "\t", "\n", "\r", ".", "!", "$", "/",
        "-", "\u{301}", "é", "一", "あ", "가", "😀", "\u{4}",
    ];

    /// A vocabulary of the 256 byte characters, every symbol, and every
    /// run of two and three symbols, with the merges that build them, so
    /// that where a piece ends shows in the ids.
    fn model_for(pre: &PreConfig) -> BpeModel {
        let table = byte_to_char_table();
        let units: Vec<String> = SYMBOLS
            .iter()
            .map(|s| s.bytes().map(|b| table[b as usize]).collect())
            .collect();
        let mut texts: Vec<String> = table.iter().map(|c| c.to_string()).collect();
        let mut merges: Vec<String> = Vec::new();
        let mut add = |texts: &mut Vec<String>, a: &str, b: &str| {
            let joined = format!("{a}{b}");
            if !texts.contains(&joined) {
                texts.push(joined);
            }
            merges.push(format!("{a} {b}"));
        };
        for u in &units {
            let chars: Vec<char> = u.chars().collect();
            for i in 1..chars.len() {
                let left: String = chars[..i].iter().collect();
                add(&mut texts, &left, &chars[i].to_string());
            }
        }
        for u in &units {
            for v in &units {
                add(&mut texts, u, v);
            }
        }
        for u in &units {
            for v in &units {
                for w in &units {
                    add(&mut texts, &format!("{u}{v}"), w);
                }
            }
        }
        let refs: Vec<&str> = merges.iter().map(|m| m.as_str()).collect();
        BpeModel::new(&vocab_of(texts), &refs, pre).unwrap()
    }

    fn vocab_of(texts: Vec<String>) -> Vocab {
        let n = texts.len();
        Vocab::of_texts(texts, vec![0.0; n])
    }

    /// A byte whose character is not a token parts its neighbours, as in
    /// llama.cpp (a symbol no merge takes, dropped at the end), where the
    /// crate's `Tokenizer` dropped it first and merged across it; a whole
    /// pre-token that is a token still comes first where merges are
    /// ignored.
    #[test]
    fn a_byte_without_a_token_parts_its_neighbours() {
        let table = byte_to_char_table();
        let mut texts: Vec<String> = table
            .iter()
            .filter(|&&c| c != table[4])
            .map(|c| c.to_string())
            .collect();
        texts.extend(["Ġ%", "ab", "\u{104}b"].map(String::from));
        let vocab = vocab_of(texts);
        let id = |t: &str| vocab.token_to_id[t];
        let gpt2 = BpeModel::new(&vocab, &["Ġ %", "a b"], &PRE_GPT2).unwrap();
        let mut ids = Vec::new();
        gpt2.tokenize(" \u{4}% ab a\u{4}b", &mut ids).unwrap();
        assert_eq!(
            ids,
            [
                id("Ġ"),
                id("%"),
                id("Ġ"),
                id("ab"),
                id("Ġ"),
                id("a"),
                id("b")
            ]
        );
        let before = crate_pipeline(&gpt2, &PRE_GPT2);
        let merged = before.encode_fast(" \u{4}% ab", false).unwrap();
        assert_eq!(merged.get_ids(), [id("Ġ%"), id("Ġ"), id("ab")]);
        let llama3 = BpeModel::new(&vocab, &["Ġ %", "a b"], &PRE_LLAMA3).unwrap();
        let mut ids = Vec::new();
        llama3.tokenize("a\u{4}b", &mut ids).unwrap();
        assert_eq!(ids, [id("a"), id("\u{104}b")]);
    }

    /// The `tokenizers` crate's own `Tokenizer` around the same model,
    /// composed as this file did before it streamed: the reference.
    fn crate_pipeline(m: &BpeModel, pre: &PreConfig) -> tokenizers::Tokenizer {
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::pre_tokenizers::sequence::Sequence;
        use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
        use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};
        let mut splits: Vec<PreTokenizerWrapper> = pre
            .regexes
            .iter()
            .map(|re| {
                Split::new(
                    SplitPattern::Regex(re.to_string()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .unwrap()
                .into()
            })
            .collect();
        splits.push(ByteLevel::new(false, false, false).into());
        let mut tk = tokenizers::Tokenizer::new(m.model.clone());
        tk.with_pre_tokenizer(Some(Sequence::new(splits)));
        tk
    }

    /// Streaming gives the crate's ids for every pre-tokenizer family, on
    /// texts of runs of one to four symbols (whitespace runs with and
    /// without a following letter, digit runs past three, contractions,
    /// marks after letters), and on one long text.
    #[test]
    fn streaming_gives_the_crate_pipelines_ids_for_every_pre_family() {
        let mut texts = symbol_runs(0x70c3, SYMBOLS, 200, 40, 4);
        texts.push(texts.concat());
        let mut families: Vec<&[&str]> = Vec::new();
        for (_, c) in PRE_TYPES {
            if families.contains(&c.regexes) {
                continue;
            }
            families.push(c.regexes);
            let m = model_for(c);
            let reference = crate_pipeline(&m, c);
            for text in &texts {
                let mut ids = Vec::new();
                m.tokenize(text, &mut ids).unwrap();
                let want = reference.encode_fast(text.as_str(), false).unwrap();
                assert_eq!(ids, want.get_ids(), "pre {:?}, text {text:?}", c.regexes);
            }
        }
        assert_eq!(families.len(), 11, "distinct regex lists in PRE_TYPES");
    }

    /// Where fancy-regex matches, a run it cannot hold is an error naming
    /// where it starts, not a silent end of the matches (the crate's
    /// `SysRegex` left the rest to the model whole); a run just short of
    /// it is split as the crate's `Tokenizer` splits it.
    #[test]
    fn a_run_too_long_for_the_regex_engine_is_an_error_not_a_silent_merge() {
        assert!(Hand::of(GPT4O).is_none());
        let m = model_for(&PRE_GPT4O);
        let reference = crate_pipeline(&m, &PRE_GPT4O);
        let short = format!("a{}b c", " ".repeat(999_990));
        let mut ids = Vec::new();
        m.tokenize(&short, &mut ids).unwrap();
        assert_eq!(
            ids,
            reference
                .encode_fast(short.as_str(), false)
                .unwrap()
                .get_ids()
        );
        let long = format!("a{}b c", " ".repeat(1_000_010));
        let e = m.tokenize(&long, &mut Vec::new()).unwrap_err();
        assert!(
            matches!(e, TokenizerError::PreTokenizer { at: 1, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("break up runs"), "{e}");
    }

    /// Where the regex is matched by hand, as llama.cpp matches it, the
    /// same run is pieces of the text as the regex defines them: `a`, all
    /// but the last space, then ` b` and ` c` as the crate encodes them.
    #[test]
    fn a_hand_matched_regex_takes_the_run_the_regex_engine_cannot_hold() {
        let m = model_for(&PRE_GPT2);
        let reference = crate_pipeline(&m, &PRE_GPT2);
        let n = 1_000_010;
        let long = format!("a{}b c", " ".repeat(n));
        let mut ids = Vec::new();
        m.tokenize(&long, &mut ids).unwrap();
        let mut want = reference
            .encode_fast("a", false)
            .unwrap()
            .get_ids()
            .to_vec();
        m.encode_piece(&" ".repeat(n - 1), &mut String::new(), &mut want)
            .unwrap();
        want.extend(reference.encode_fast(" b c", false).unwrap().get_ids());
        assert_eq!(ids, want);
    }

    #[test]
    fn byte_table_is_a_bijection() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(char_to_byte_map().len(), 256);
    }

    #[test]
    fn unknown_pre_lists_known_ones() {
        let e = pre_config("no-such-pre").unwrap_err().to_string();
        assert!(e.contains("no-such-pre") && e.contains("smollm") && e.contains("llama-bpe"));
        assert!(pre_config("").is_ok());
    }
}
