//! The vocabulary as llama.cpp loads it from `tokenizer.ggml.*`: token texts,
//! scores, per-token attributes, special ids (with llama.cpp's defaults per
//! tokenizer model and its text-based auto-detection of EOT/EOM/FIM tokens),
//! the end-of-generation set and the special-token cache used by the
//! partition step. Mirrors `llama_vocab::impl::load` in `src/llama-vocab.cpp`.

use std::collections::{BTreeSet, HashMap};

use super::TokenizerError;
use crate::gguf::{MetaValue, Metadata};

/// Per-token attribute bits (`llama_token_attr`).
pub(crate) mod attr {
    pub const UNDEFINED: u16 = 0;
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

/// `tokenizer.ggml.token_type` values (`llama_token_type`) as attributes.
fn attr_from_type(t: i64) -> u16 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => attr::UNDEFINED,
    }
}

/// Which algorithm turns text fragments into ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabType {
    /// `tokenizer.ggml.model = "llama"`: SentencePiece, score-based merges.
    Spm,
    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE with merge ranks.
    Bpe,
}

/// Special ids; `None` is llama.cpp's `LLAMA_TOKEN_NULL`.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// Token table shared by the SPM and BPE paths.
#[derive(Clone, Debug)]
pub(crate) struct Vocab {
    pub texts: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u16>,
    pub token_to_id: HashMap<String, u32>,
    pub ids: SpecialIds,
    /// End-of-generation ids, sorted.
    pub eog: BTreeSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first.
    pub special_cache: Vec<u32>,
}

#[cfg(test)]
impl Vocab {
    /// Plain tokens with these texts and scores, and no special ids: the
    /// algorithms' unit tests build their vocabularies with this.
    pub(crate) fn of_texts(texts: Vec<String>, scores: Vec<f32>) -> Self {
        Vocab {
            token_to_id: texts
                .iter()
                .enumerate()
                .map(|(i, t)| (t.clone(), i as u32))
                .collect(),
            scores,
            attrs: vec![attr::NORMAL; texts.len()],
            texts,
            ids: SpecialIds::default(),
            eog: BTreeSet::new(),
            special_cache: Vec::new(),
        }
    }
}

impl Vocab {
    pub fn n_tokens(&self) -> usize {
        self.texts.len()
    }

    pub fn text_to_token(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    pub fn attr(&self, id: u32) -> u16 {
        self.attrs
            .get(id as usize)
            .copied()
            .unwrap_or(attr::UNDEFINED)
    }
}

/// Reads an optional token id; negative values count as absent.
fn opt_id(md: &Metadata, key: &str) -> Result<Option<i64>, TokenizerError> {
    Ok(md.opt(key, Metadata::get_i64)?.filter(|v| *v >= 0))
}

/// Loads the token table and attributes (tokens, scores, token_type).
pub(crate) fn load_table(md: &Metadata) -> Result<Vocab, TokenizerError> {
    let texts_raw = md.get_str_array("tokenizer.ggml.tokens")?;
    let n = texts_raw.len();
    if n == 0 {
        return Err(TokenizerError::EmptyVocab);
    }
    if u32::try_from(n).is_err() {
        return Err(TokenizerError::VocabTooLarge { n });
    }
    let scores = match md.get("tokenizer.ggml.scores") {
        None => vec![0.0; n],
        Some(_) => {
            let s = md.get_f32_array("tokenizer.ggml.scores")?;
            if s.len() < n {
                return Err(TokenizerError::ShortArray {
                    key: "tokenizer.ggml.scores",
                    len: s.len(),
                    n_vocab: n,
                });
            }
            s
        }
    };
    let attrs = match md.get("tokenizer.ggml.token_type") {
        None => vec![attr::NORMAL; n],
        Some(_) => {
            let t = md.get_i64_array("tokenizer.ggml.token_type")?;
            if t.len() < n {
                return Err(TokenizerError::ShortArray {
                    key: "tokenizer.ggml.token_type",
                    len: t.len(),
                    n_vocab: n,
                });
            }
            t[..n].iter().map(|&v| attr_from_type(v)).collect()
        }
    };
    let mut texts = Vec::with_capacity(n);
    let mut token_to_id = HashMap::with_capacity(n);
    for (i, t) in texts_raw.iter().enumerate() {
        let word = if t.is_empty() {
            format!("[EMPTY_{i}]")
        } else {
            t.to_string()
        };
        if let Some(first) = token_to_id.insert(word.clone(), i as u32) {
            return Err(TokenizerError::DuplicateToken {
                text: word,
                first,
                second: i as u32,
            });
        }
        texts.push(word);
    }
    Ok(Vocab {
        texts,
        scores: scores[..n].to_vec(),
        attrs,
        token_to_id,
        ids: SpecialIds::default(),
        eog: BTreeSet::new(),
        special_cache: Vec::new(),
    })
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// Token texts llama.cpp treats as end-of-generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Defaults of llama.cpp per tokenizer model, before metadata overrides.
pub(crate) fn default_ids(kind: VocabType) -> SpecialIds {
    match kind {
        VocabType::Spm => SpecialIds {
            bos: Some(1),
            eos: Some(2),
            unk: Some(0),
            ..SpecialIds::default()
        },
        VocabType::Bpe => SpecialIds {
            bos: Some(11),
            eos: Some(11),
            ..SpecialIds::default()
        },
    }
}

/// Selects one id slot of [`SpecialIds`].
type IdField = fn(&mut SpecialIds) -> &mut Option<u32>;

/// Finishes the vocabulary: special ids from metadata (over `ids`, the
/// defaults), auto-detected EOT/EOM/FIM ids, unused and EOG marking, the
/// model-name attribute fixes and the special-token cache.
pub(crate) fn finish(
    v: &mut Vocab,
    md: &Metadata,
    mut ids: SpecialIds,
) -> Result<(), TokenizerError> {
    let n = v.n_tokens() as i64;
    let keys: [(&str, IdField); 17] = [
        ("tokenizer.ggml.bos_token_id", |i| &mut i.bos),
        ("tokenizer.ggml.eos_token_id", |i| &mut i.eos),
        ("tokenizer.ggml.eot_token_id", |i| &mut i.eot),
        ("tokenizer.ggml.eom_token_id", |i| &mut i.eom),
        ("tokenizer.ggml.unknown_token_id", |i| &mut i.unk),
        ("tokenizer.ggml.seperator_token_id", |i| &mut i.sep),
        ("tokenizer.ggml.padding_token_id", |i| &mut i.pad),
        ("tokenizer.ggml.mask_token_id", |i| &mut i.mask),
        ("tokenizer.ggml.fim_pre_token_id", |i| &mut i.fim_pre),
        ("tokenizer.ggml.fim_suf_token_id", |i| &mut i.fim_suf),
        ("tokenizer.ggml.fim_mid_token_id", |i| &mut i.fim_mid),
        ("tokenizer.ggml.fim_pad_token_id", |i| &mut i.fim_pad),
        ("tokenizer.ggml.fim_rep_token_id", |i| &mut i.fim_rep),
        ("tokenizer.ggml.fim_sep_token_id", |i| &mut i.fim_sep),
        // deprecated spellings of the FIM ids
        ("tokenizer.ggml.prefix_token_id", |i| &mut i.fim_pre),
        ("tokenizer.ggml.suffix_token_id", |i| &mut i.fim_suf),
        ("tokenizer.ggml.middle_token_id", |i| &mut i.fim_mid),
    ];
    for (key, field) in keys {
        let slot = field(&mut ids);
        if slot.is_some_and(|id| id as i64 >= n) {
            *slot = None; // default out of range: disabled, as llama.cpp does
        }
        // An id from the file that is out of range keeps the default.
        if let Some(id) = opt_id(md, key)?.filter(|&id| id < n) {
            *slot = Some(id as u32);
        }
    }

    // Auto-detect special tokens by text, in the priority of each list.
    let detect = |slot: &mut Option<u32>, texts: &[&str], attrs: &mut [u16]| {
        if slot.is_some() {
            return;
        }
        if let Some(id) = texts.iter().find_map(|t| v.token_to_id.get(*t).copied()) {
            *slot = Some(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    };
    let attrs = &mut v.attrs;
    detect(&mut ids.eot, EOT_TEXTS, attrs);
    detect(&mut ids.eom, EOM_TEXTS, attrs);
    detect(&mut ids.fim_pre, FIM_PRE_TEXTS, attrs);
    detect(&mut ids.fim_suf, FIM_SUF_TEXTS, attrs);
    detect(&mut ids.fim_mid, FIM_MID_TEXTS, attrs);
    detect(&mut ids.fim_pad, FIM_PAD_TEXTS, attrs);
    detect(&mut ids.fim_rep, FIM_REP_TEXTS, attrs);
    detect(&mut ids.fim_sep, FIM_SEP_TEXTS, attrs);

    // Control tokens whose text says "unused" are unused.
    for (i, a) in v.attrs.iter_mut().enumerate() {
        if *a & attr::CONTROL != 0 && v.texts[i].contains("unused") {
            *a |= attr::UNUSED;
        }
    }

    let mut eog = BTreeSet::new();
    eog.extend(ids.fim_pad);
    eog.extend(ids.fim_rep);
    eog.extend(ids.fim_sep);
    for t in EOG_TEXTS {
        if let Some(&id) = v.token_to_id.get(*t) {
            eog.insert(id);
            v.attrs[id as usize] |= attr::CONTROL;
        }
    }
    // gpt-oss (harmony) markers are always rendered.
    for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&id) = v.token_to_id.get(t) {
            v.attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    eog.extend(ids.eos);
    eog.extend(ids.eot);
    eog.extend(ids.eom);
    // harmony / solar-open: "<|end|>" ends a message, not the generation.
    let in_eog =
        |eog: &BTreeSet<u32>, t: &str| v.token_to_id.get(t).is_some_and(|id| eog.contains(id));
    let call = in_eog(&eog, "<|call|>") || in_eog(&eog, "<|calls|>");
    let harmony = in_eog(&eog, "<|return|>") && call;
    let solar = call && in_eog(&eog, "<|flush|>");
    if (harmony || solar) && in_eog(&eog, "<|end|>") {
        let id = v.token_to_id["<|end|>"];
        eog.remove(&id);
        v.attrs[id as usize] = attr::USER_DEFINED;
    }
    // gemma4 / paddleocr: "</s>" is not an end of generation there.
    if in_eog(&eog, "<|tool_response>") && in_eog(&eog, "</s>") {
        let id = v.token_to_id["</s>"];
        eog.remove(&id);
        v.attrs[id as usize] = attr::NORMAL;
    }

    let mut cache: Vec<u32> = (0..v.n_tokens() as u32)
        .filter(|&id| {
            v.attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
        })
        .collect();
    cache.sort_by(|&a, &b| {
        let (la, lb) = (v.texts[a as usize].len(), v.texts[b as usize].len());
        lb.cmp(&la).then(a.cmp(&b))
    });

    // Phi-3: special tokens eat the whitespace that follows them.
    let name = match md.get("general.name") {
        Some(MetaValue::String(s)) => s.to_lowercase(),
        _ => String::new(),
    };
    if name.contains("phi-3") || name.contains("phi3") {
        for &id in &cache {
            v.attrs[id as usize] |= attr::RSTRIP;
        }
        let mut set = |t: &str, on: bool| {
            if let Some(&id) = v.token_to_id.get(t) {
                if on {
                    v.attrs[id as usize] |= attr::RSTRIP;
                } else {
                    v.attrs[id as usize] &= !attr::RSTRIP;
                }
            }
        };
        set("</s>", true);
        for t in ["<unk>", "<s>", "<|endoftext|>"] {
            set(t, false);
        }
    }

    v.ids = ids;
    v.eog = eog;
    v.special_cache = cache;
    Ok(())
}
