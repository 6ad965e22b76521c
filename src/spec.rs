//! Speculative decoding: the drafters that propose tokens, named and
//! defaulted as llama.cpp's `--spec-type` (`common/speculative.cpp`,
//! `common/ngram-map.cpp`). A drafter sees the tokens of a sequence and the
//! token just sampled and proposes the tokens it expects next; the engine
//! verifies them in one batch ([`crate::engine::Engine::generate_spec`]) and
//! the sampler accepts or rejects each ([`crate::sample::Sampler::verify`]).
//!
//! This module knows token ids only: nothing of models, caches or sampling;
//! a draft model ([`crate::draft::ModelDrafter`]) comes in through
//! [`DraftSource`]. Every drafter is deterministic (the draft distribution
//! `q` is a point mass on the proposed token), as llama.cpp's are.

use crate::engine::EngineError;
use crate::state::HiddenRows;

/// `--spec-type`: which drafter proposes tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecType {
    #[default]
    None,
    /// llama.cpp's `ngram-simple`: the `size_m` tokens that followed the
    /// latest earlier occurrence of the last `size_n` tokens.
    NgramSimple,
    /// llama.cpp's `ngram-map-k`: the same lookup through a hash map of
    /// n-grams, the draft cut to what was accepted of the key's last draft.
    NgramMapK,
    /// llama.cpp's `draft-simple`: a small draft model (`-md`) proposes its
    /// most likely tokens.
    DraftSimple,
    /// llama.cpp's `draft-mtp`: the target's own NextN/MTP head proposes
    /// its most likely tokens from the target's final-norm rows.
    DraftMtp,
}

impl SpecType {
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::NgramSimple => "ngram-simple",
            Self::NgramMapK => "ngram-map-k",
            Self::DraftSimple => "draft-simple",
            Self::DraftMtp => "draft-mtp",
        }
    }
}

impl std::str::FromStr for SpecType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "ngram-simple" => Ok(Self::NgramSimple),
            "ngram-map-k" => Ok(Self::NgramMapK),
            "draft-simple" => Ok(Self::DraftSimple),
            "draft-mtp" => Ok(Self::DraftMtp),
            "draft-eagle3" | "draft-dflash" | "draft-dspark" | "ngram-map-k4v" | "ngram-mod"
            | "ngram-cache" => Err(format!(
                "--spec-type {s} is not supported yet; longhaul drafts with ngram-simple, ngram-map-k, draft-simple (-md) or draft-mtp"
            )),
            _ => Err(format!(
                "`{s}` is not a --spec-type; use none, ngram-simple, ngram-map-k, draft-simple or draft-mtp"
            )),
        }
    }
}

/// The sizes of an n-gram drafter (`--spec-ngram-simple-size-n` and so on;
/// llama.cpp's `common_params_speculative_ngram_map`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramSizes {
    /// Length of the n-gram looked up (llama.cpp's default 12).
    pub size_n: u16,
    /// Most tokens drafted after a match (default 48).
    pub size_m: u16,
    /// Hits a key needs before it drafts (default 1; llama.cpp reads it in
    /// `ngram-map-k4v` only).
    pub min_hits: u16,
}

impl Default for NgramSizes {
    fn default() -> Self {
        Self {
            size_n: 12,
            size_m: 48,
            min_hits: 1,
        }
    }
}

/// A draft model's sizes (llama.cpp's `common_params_speculative_draft`,
/// with its defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftParams {
    /// Most tokens drafted per step (`--spec-draft-n-max`, default 3).
    pub n_max: usize,
    /// Fewer drafted tokens than this are dropped (`--spec-draft-n-min`, 0).
    pub n_min: usize,
    /// Drafting stops below this probability (`--spec-draft-p-min`, 0.0).
    pub p_min: f32,
}

impl Default for DraftParams {
    fn default() -> Self {
        Self {
            n_max: 3,
            n_min: 0,
            p_min: 0.0,
        }
    }
}

/// Speculative decoding settings of a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpecParams {
    pub kind: SpecType,
    pub ngram_simple: NgramSizes,
    pub ngram_map_k: NgramSizes,
    pub draft: DraftParams,
}

impl SpecParams {
    /// The n-gram drafter these settings name; `None` without speculation
    /// and for `draft-simple`, whose model the caller loads
    /// ([`crate::draft::ModelDrafter`], then [`Drafter::Model`]).
    pub fn drafter(&self) -> Option<Drafter> {
        match self.kind {
            SpecType::None | SpecType::DraftSimple | SpecType::DraftMtp => None,
            SpecType::NgramSimple => Some(Drafter::Simple(self.ngram_simple)),
            SpecType::NgramMapK => Some(Drafter::MapK(NgramMap::new(self.ngram_map_k))),
        }
    }
}

/// A drafter that needs more than token ids: a draft model, or the
/// target's own MTP head.
pub trait DraftSource: Send {
    /// As [`Drafter::draft`].
    fn draft(
        &mut self,
        tokens: &[u32],
        sampled: u32,
        n_max: usize,
        hidden: Option<&mut HiddenRows>,
    ) -> Result<Vec<u32>, EngineError>;

    /// Whether [`DraftSource::draft`] reads the target's final-norm rows
    /// (an MTP head): the target's sequence then keeps them
    /// ([`crate::state::SeqState::keep_hidden`]).
    fn needs_hidden(&self) -> bool {
        false
    }

    /// As [`Drafter::observe`]; nothing for a drafter that reads no rows.
    fn observe(
        &mut self,
        _tokens: &[u32],
        _hidden: Option<&mut HiddenRows>,
    ) -> Result<(), EngineError> {
        Ok(())
    }
}

/// A drafter with its state for one sequence.
pub enum Drafter {
    Simple(NgramSizes),
    MapK(NgramMap),
    Model(Box<dyn DraftSource>),
}

impl std::fmt::Debug for Drafter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Simple(s) => f.debug_tuple("Simple").field(s).finish(),
            Self::MapK(m) => f.debug_tuple("MapK").field(m).finish(),
            Self::Model(_) => f.write_str("Model"),
        }
    }
}

impl Drafter {
    /// A new generation starts after `prompt`.
    pub fn begin(&mut self, prompt: &[u32]) {
        if let Self::MapK(m) = self {
            m.begin(prompt.len());
        }
    }

    /// Tokens expected after `tokens` (every token the sequence holds) and
    /// `sampled` (the token just sampled, not yet in `tokens`), at most
    /// `n_max` of them; empty when the drafter has nothing. `hidden` is the
    /// sequence's final-norm rows where [`Drafter::needs_hidden`]. Only a
    /// model drafter can fail (its forward pass).
    pub fn draft(
        &mut self,
        tokens: &[u32],
        sampled: u32,
        n_max: usize,
        hidden: Option<&mut HiddenRows>,
    ) -> Result<Vec<u32>, EngineError> {
        let mut d = match self {
            Self::Simple(s) => ngram_simple_draft(*s, tokens, sampled),
            Self::MapK(m) => m.draft(tokens, sampled),
            Self::Model(m) => m.draft(tokens, sampled, n_max, hidden)?,
        };
        d.truncate(n_max);
        Ok(d)
    }

    /// Whether the drafter reads the target's final-norm rows (an MTP head).
    pub fn needs_hidden(&self) -> bool {
        matches!(self, Self::Model(m) if m.needs_hidden())
    }

    /// The target evaluated `tokens` (the whole sequence so far) short of a
    /// draft, as between the chunks of a long prompt: an MTP head catches up
    /// on them now and the rows it has read are released, so a sequence
    /// holds about one chunk's rows, not a whole prompt's (llama.cpp's
    /// drafter catches up after each batch the target evaluates).
    pub fn observe(
        &mut self,
        tokens: &[u32],
        hidden: Option<&mut HiddenRows>,
    ) -> Result<(), EngineError> {
        match self {
            Self::Model(m) => m.observe(tokens, hidden),
            _ => Ok(()),
        }
    }

    /// `n` tokens of the last draft were accepted.
    pub fn accept(&mut self, n: usize) {
        if let Self::MapK(m) = self {
            m.accept(n);
        }
    }
}

/// Whether drafted token `i` of `n_drafted`, verified as `ok`, counts as
/// accepted, as llama.cpp's `common_sampler_sample_and_accept_n` counts:
/// a drafted end-of-generation token ends the reply and counts only as the
/// draft's last token.
pub fn counts_accepted(ok: bool, is_eog: bool, i: usize, n_drafted: usize) -> bool {
    ok && !(is_eog && i + 1 < n_drafted)
}

/// llama.cpp's `common_ngram_simple_draft`: the pattern is the last
/// `size_n - 1` tokens and `sampled`; its latest earlier occurrence (not at
/// position 0) is followed by the draft, `size_m` tokens at most and none
/// when fewer than `size_n` follow.
pub fn ngram_simple_draft(s: NgramSizes, tokens: &[u32], sampled: u32) -> Vec<u32> {
    let cur = tokens.len();
    let n = usize::from(s.size_n).max(1);
    let m = usize::from(s.size_m);
    if cur <= n + m + 1 {
        return Vec::new();
    }
    let mut pattern: Vec<u32> = tokens[cur - n + 1..].to_vec();
    pattern.push(sampled);
    // Backwards from the latest start that leaves the pattern before the
    // current position; position 0 means no match, as in llama.cpp.
    let Some(pos) = (1..cur - n)
        .rev()
        .find(|&j| tokens[j..j + n] == pattern[..])
    else {
        return Vec::new();
    };
    let copy = m.min(cur - (pos + n));
    if copy < n {
        return Vec::new();
    }
    tokens[pos + n..pos + n + copy].to_vec()
}

/// Entries of the n-gram hash map (llama.cpp's `COMMON_NGRAM_HASH_MAP_SIZE`).
const HASH_MAP_SIZE: usize = 1 << 18;
/// llama.cpp's LCG factor for n-gram hashes.
const LCG_FACTOR: u32 = 2_654_435_761;

fn ngram_hash(tokens: &[u32]) -> u32 {
    tokens
        .iter()
        .fold(0u32, |h, &t| h.wrapping_mul(LCG_FACTOR).wrapping_add(t))
}

/// One key n-gram seen in the history: where it first matched, and how many
/// of its last draft were accepted (llama.cpp's `values[0].n_accepted`).
#[derive(Clone, Debug)]
struct MapKey {
    idx: usize,
    n_accepted: usize,
}

/// llama.cpp's `common_ngram_map` in key-only mode (`ngram-map-k`): a hash
/// map from an n-gram's hash to its first indexed position (collisions keep
/// the first), a linear search where the map misses, and per key the number
/// of tokens accepted from its last draft, which caps the next one.
#[derive(Clone, Debug)]
pub struct NgramMap {
    sizes: NgramSizes,
    keys: Vec<MapKey>,
    key_map: Vec<u32>,
    key_map_last: usize,
    size_last_begin: usize,
    last_key: Option<usize>,
}

impl NgramMap {
    pub fn new(sizes: NgramSizes) -> Self {
        Self {
            sizes,
            keys: Vec::new(),
            key_map: vec![0; HASH_MAP_SIZE],
            key_map_last: 0,
            size_last_begin: 0,
            last_key: None,
        }
    }

    /// A generation starts after `n_prompt` tokens. The history only grows
    /// within a sequence here, so a shorter one starts the map again (where
    /// llama.cpp prunes the entries past the new start).
    fn begin(&mut self, n_prompt: usize) {
        if n_prompt < self.size_last_begin {
            *self = Self::new(self.sizes);
        }
        self.size_last_begin = n_prompt;
    }

    fn draft(&mut self, inp: &[u32], sampled: u32) -> Vec<u32> {
        self.last_key = None;
        let cur = inp.len();
        let n = usize::from(self.sizes.size_n).max(1);
        let m = usize::from(self.sizes.size_m);
        if cur < 2 * n + m || cur >= u32::MAX as usize {
            return Vec::new();
        }
        let mut key: Vec<u32> = inp[cur - n + 1..].to_vec();
        key.push(sampled);
        let matches = |j: usize| inp[j..j + n] == key[..];
        let last = cur - n - m - 1;
        let mut pos = 0;
        let slot = ngram_hash(&key) as usize % HASH_MAP_SIZE;
        let idx = self.key_map[slot] as usize;
        if idx != 0 && idx < last && matches(idx) {
            pos = idx;
        }
        let begin = self.size_last_begin;
        if pos == 0 && begin > n + m + 1 {
            let lo = self.key_map_last;
            pos = (lo + 1..begin - n - m)
                .rev()
                .find(|&j| matches(j))
                .unwrap_or(0);
        }
        if pos == 0 {
            let lo = begin.max(self.key_map_last);
            pos = (lo + 1..last + 1).rev().find(|&j| matches(j)).unwrap_or(0);
        }
        // Index the n-grams that became searchable, in the same order.
        if begin > n + m + 1 {
            for j in (self.key_map_last + 1..begin - n - m).rev() {
                self.index(inp, j, n);
            }
        }
        for j in (begin.max(self.key_map_last) + 1..last + 1).rev() {
            self.index(inp, j, n);
        }
        self.key_map_last = self.key_map_last.max(last);
        if pos == 0 {
            return Vec::new();
        }
        let k = match self
            .keys
            .iter()
            .position(|k| inp[k.idx..k.idx + n] == key[..])
        {
            Some(k) => k,
            None => {
                self.keys.push(MapKey {
                    idx: pos,
                    n_accepted: m,
                });
                self.keys.len() - 1
            }
        };
        self.last_key = Some(k);
        let len = m.min(self.keys[k].n_accepted);
        inp[pos + n..pos + n + len].to_vec()
    }

    fn index(&mut self, inp: &[u32], j: usize, n: usize) {
        let slot = ngram_hash(&inp[j..j + n]) as usize % HASH_MAP_SIZE;
        if self.key_map[slot] == 0 {
            self.key_map[slot] = j as u32;
        }
    }

    fn accept(&mut self, n: usize) {
        if let Some(k) = self.last_key.and_then(|k| self.keys.get_mut(k)) {
            k.n_accepted = n;
        }
    }
}

/// Counters of speculative decoding over one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verification batches run (each one forward pass).
    pub n_batches: usize,
    /// Tokens proposed by the drafter.
    pub n_drafted: usize,
    /// Proposed tokens the target accepted.
    pub n_accepted: usize,
}

impl SpecStats {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &SpecStats) {
        self.n_batches += o.n_batches;
        self.n_drafted += o.n_drafted;
        self.n_accepted += o.n_accepted;
    }

    pub fn acceptance(&self) -> f64 {
        self.n_accepted as f64 / self.n_drafted.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(n: u16, m: u16) -> NgramSizes {
        NgramSizes {
            size_n: n,
            size_m: m,
            min_hits: 1,
        }
    }

    #[test]
    fn spec_types_take_llama_cpp_names() {
        assert_eq!("ngram-simple".parse(), Ok(SpecType::NgramSimple));
        assert_eq!("ngram-map-k".parse(), Ok(SpecType::NgramMapK));
        assert_eq!("none".parse(), Ok(SpecType::None));
        assert_eq!("draft-mtp".parse(), Ok(SpecType::DraftMtp));
        let e = "draft-eagle3".parse::<SpecType>().unwrap_err();
        assert!(e.contains("not supported yet"), "{e}");
        assert!("ngram".parse::<SpecType>().is_err());
    }

    #[test]
    fn ngram_simple_copies_what_followed_the_latest_match() {
        // History: 1 2 3 | 7 8 9 10 | 5 | 1 2 3 | 4 ... then "1 2" + sampled 3.
        let tokens = [0, 1, 2, 3, 7, 8, 9, 10, 5, 1, 2, 3, 4, 6, 6, 1, 2];
        let d = ngram_simple_draft(sizes(3, 4), &tokens, 3);
        // The latest earlier "1 2 3" starts at 9 (searching backwards from
        // 17 - 3 - 1 = 13); 4 tokens follow it.
        assert_eq!(d, vec![4, 6, 6, 1]);
        // Too short a history: nothing (cur <= n + m + 1).
        assert!(ngram_simple_draft(sizes(3, 4), &tokens[..8], 3).is_empty());
        // No earlier occurrence: nothing.
        assert!(ngram_simple_draft(sizes(3, 4), &tokens, 99).is_empty());
        // A match at position 0 does not count, as in llama.cpp.
        let t0 = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2];
        assert!(ngram_simple_draft(sizes(3, 4), &t0, 3).is_empty());
        // Fewer than size_n tokens after the match: nothing.
        // (Here "1 2 1" matches at 10 and one token follows it.)
        let short = [0, 9, 9, 9, 9, 9, 9, 9, 9, 9, 1, 2, 1, 2];
        assert!(ngram_simple_draft(sizes(3, 4), &short, 1).is_empty());
    }

    #[test]
    fn ngram_map_k_drafts_from_the_map_and_caps_by_the_last_acceptance() {
        let mut tokens: Vec<u32> = (100..140).collect();
        tokens.extend([1, 2, 3, 4, 5, 6, 7, 8, 9]);
        tokens.extend(200..220u32);
        tokens.extend([1, 2]);
        let mut d = SpecParams {
            kind: SpecType::NgramMapK,
            ngram_map_k: sizes(3, 4),
            ..Default::default()
        }
        .drafter()
        .unwrap();
        d.begin(&tokens[..10]);
        let mut draft = |s: u32, n: usize| d.draft(&tokens, s, n, None).expect("n-gram drafts");
        assert_eq!(draft(3, 16), vec![4, 5, 6, 7]);
        // Two of those accepted: the same key drafts two next time.
        d.accept(2);
        let mut draft = |s: u32, n: usize| d.draft(&tokens, s, n, None).expect("n-gram drafts");
        assert_eq!(draft(3, 16), vec![4, 5]);
        // n_max caps it too.
        assert_eq!(draft(3, 1), vec![4]);
        assert!(draft(77, 16).is_empty());
    }
}
