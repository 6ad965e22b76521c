//! Unit tests on tiny hand-built vocabularies. Real-model parity with
//! llama.cpp's `llama-tokenize` lives in `tests/tokenizer.rs`.

use super::*;
use crate::gguf::{MetaType, MetaValue};

/// `n` seeded texts, each of 1 to `max_runs` runs of one of `symbols`
/// repeated 1 to `max_repeat` times.
pub(super) fn symbol_runs(
    seed: u64,
    symbols: &[&str],
    n: usize,
    max_runs: u64,
    max_repeat: u64,
) -> Vec<String> {
    let mut rng = crate::synth::Rng(seed);
    (0..n)
        .map(|_| {
            let runs = 1 + rng.next_u64() % max_runs;
            (0..runs)
                .map(|_| {
                    let sym = symbols[(rng.next_u64() % symbols.len() as u64) as usize];
                    sym.repeat(1 + (rng.next_u64() % max_repeat) as usize)
                })
                .collect()
        })
        .collect()
}

fn strs(v: &[&str]) -> MetaValue {
    MetaValue::Array(
        MetaType::String,
        v.iter().map(|s| MetaValue::String(s.to_string())).collect(),
    )
}

fn i32s(v: &[i32]) -> MetaValue {
    MetaValue::Array(
        MetaType::I32,
        v.iter().map(|&x| MetaValue::I32(x)).collect(),
    )
}

fn f32s(v: &[f32]) -> MetaValue {
    MetaValue::Array(
        MetaType::F32,
        v.iter().map(|&x| MetaValue::F32(x)).collect(),
    )
}

/// A SentencePiece vocabulary: (text, score, type).
fn spm_md(tokens: &[(&str, f32, i32)]) -> Metadata {
    let mut md = Metadata::new();
    md.set("tokenizer.ggml.model", MetaValue::String("llama".into()));
    let texts: Vec<&str> = tokens.iter().map(|t| t.0).collect();
    md.set("tokenizer.ggml.tokens", strs(&texts));
    md.set(
        "tokenizer.ggml.scores",
        f32s(&tokens.iter().map(|t| t.1).collect::<Vec<_>>()),
    );
    md.set(
        "tokenizer.ggml.token_type",
        i32s(&tokens.iter().map(|t| t.2).collect::<Vec<_>>()),
    );
    md
}

fn spm_tokens() -> Vec<(String, f32, i32)> {
    let mut v: Vec<(String, f32, i32)> = vec![
        ("<unk>".into(), 0.0, 2),
        ("<s>".into(), 0.0, 3),
        ("</s>".into(), 0.0, 3),
        ("<start_of_turn>".into(), 0.0, 3),
        ("<b>".into(), 0.0, 4),
    ];
    for b in 0..=255u8 {
        v.push((format!("<0x{b:02X}>"), 0.0, 6));
    }
    for (t, s) in [
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("▁h", -3.0),
        ("he", -1.5),
        ("ll", -1.0),
        ("llo", -0.5),
        ("hello", -0.1),
        ("▁hello", -0.05),
        ("ab", -1.0),
        ("bc", -1.0),
        ("a", -2.0),
        ("b", -2.0),
        ("c", -2.0),
    ] {
        v.push((t.into(), s, 1));
    }
    v
}

fn spm_tokenizer(extra: impl FnOnce(&mut Metadata)) -> Tokenizer {
    let toks = spm_tokens();
    let refs: Vec<(&str, f32, i32)> = toks.iter().map(|(t, s, k)| (t.as_str(), *s, *k)).collect();
    let mut md = spm_md(&refs);
    extra(&mut md);
    Tokenizer::from_metadata(&md).unwrap()
}

fn ids_of(t: &Tokenizer, texts: &[&str]) -> Vec<u32> {
    texts.iter().map(|s| t.token_id(s).unwrap()).collect()
}

#[test]
fn spm_merges_by_score_with_space_prefix_and_bos() {
    let t = spm_tokenizer(|_| {});
    assert_eq!(t.vocab_type(), VocabType::Spm);
    // llama.cpp defaults for SPM: BOS 1 added, space prefix on.
    assert_eq!(t.bos(), Some(1));
    assert_eq!(t.encode("hello", true, false).unwrap(), {
        let mut v = vec![1];
        v.extend(ids_of(&t, &["▁hello"]));
        v
    });
    assert_eq!(t.encode("", true, false).unwrap(), vec![1]);
    assert!(t.encode("", false, false).unwrap().is_empty());
}

#[test]
fn spm_ties_merge_leftmost_first() {
    // "abc": "ab" and "bc" score equally; the left pair wins.
    let t = spm_tokenizer(|md| {
        md.set("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false));
    });
    assert_eq!(
        t.encode("abc", false, false).unwrap(),
        ids_of(&t, &["ab", "c"])
    );
}

#[test]
fn spm_byte_fallback_and_pieces() {
    let t = spm_tokenizer(|md| {
        md.set("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false));
    });
    let ids = t.encode("€h", false, false).unwrap();
    assert_eq!(ids, ids_of(&t, &["<0xE2>", "<0x82>", "<0xAC>", "h"]));
    assert_eq!(t.token_to_piece(ids[0]), vec![0xE2]);
    assert_eq!(t.decode(&ids), "€h");
    let sp = t.token_id("▁hello").unwrap();
    assert_eq!(t.token_to_piece(sp), b" hello");
}

#[test]
fn spm_special_tokens_only_with_parse_special_but_user_defined_always() {
    let t = spm_tokenizer(|md| {
        md.set("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false));
    });
    let sot = t.token_id("<start_of_turn>").unwrap();
    let parsed = t.encode("<start_of_turn>hello", false, true).unwrap();
    assert_eq!(parsed, vec![sot, t.token_id("hello").unwrap()]);
    let raw = t.encode("<start_of_turn>", false, false).unwrap();
    assert!(!raw.contains(&sot) && raw.len() > 1);
    // "<b>" is user-defined: cut out even without parse_special.
    let b = t.token_id("<b>").unwrap();
    assert_eq!(
        t.encode("ab<b>c", false, false).unwrap(),
        vec![t.token_id("ab").unwrap(), b, t.token_id("c").unwrap()]
    );
    // Control tokens render only when asked.
    assert_eq!(t.token_to_piece(sot), b"<start_of_turn>");
    assert_eq!(t.token_to_piece_with(sot, false), b"");
    assert_eq!(t.decode_with(&[sot, b], false), "<b>");
}

#[test]
fn spm_space_prefix_follows_special_tokens() {
    let t = spm_tokenizer(|_| {});
    let sot = t.token_id("<start_of_turn>").unwrap();
    assert_eq!(
        t.encode("<start_of_turn>hello", false, true).unwrap(),
        vec![sot, t.token_id("▁hello").unwrap()]
    );
}

/// A byte-level BPE vocabulary: the 256 byte characters, `extra` tokens and
/// the given merges.
fn bpe_md(pre: &str, extra: &[(&str, i32)], merges: &[&str]) -> Metadata {
    let table = bpe::byte_to_char_table();
    let mut texts: Vec<String> = extra.iter().map(|(t, _)| t.to_string()).collect();
    let mut types: Vec<i32> = extra.iter().map(|(_, k)| *k).collect();
    for c in table {
        texts.push(c.to_string());
        types.push(1);
    }
    for m in merges {
        let joined = m.replacen(' ', "", 1);
        if !texts.contains(&joined) {
            texts.push(joined);
            types.push(1);
        }
    }
    let mut md = Metadata::new();
    md.set("tokenizer.ggml.model", MetaValue::String("gpt2".into()));
    md.set("tokenizer.ggml.pre", MetaValue::String(pre.into()));
    let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
    md.set("tokenizer.ggml.tokens", strs(&refs));
    md.set("tokenizer.ggml.token_type", i32s(&types));
    md.set("tokenizer.ggml.merges", strs(merges));
    md
}

const MERGES: &[&str] = &[
    "h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d",
];

#[test]
fn bpe_merges_by_rank_over_pretokens() {
    let md = bpe_md("gpt-2", &[("<|im_start|>", 3), ("<|im_end|>", 3)], MERGES);
    let t = Tokenizer::from_metadata(&md).unwrap();
    assert_eq!(t.vocab_type(), VocabType::Bpe);
    let ids = t.encode("hello world", false, false).unwrap();
    assert_eq!(ids, ids_of(&t, &["hello", "Ġworld"]));
    assert_eq!(t.decode(&ids), "hello world");
    assert_eq!(t.token_to_piece(t.token_id("Ġworld").unwrap()), b" world");
    // No BOS by default for gpt2-style vocabularies.
    assert_eq!(
        t.encode("hello", true, false).unwrap(),
        ids_of(&t, &["hello"])
    );
}

#[test]
fn bpe_specials_and_eog_detection() {
    let md = bpe_md("gpt-2", &[("<|im_start|>", 3), ("<|im_end|>", 1)], MERGES);
    let t = Tokenizer::from_metadata(&md).unwrap();
    let start = t.token_id("<|im_start|>").unwrap();
    let end = t.token_id("<|im_end|>").unwrap();
    // "<|im_end|>" is detected as EOT/EOG by its text and becomes control.
    assert_eq!(t.eot(), Some(end));
    assert!(t.is_eog(end));
    assert!(t.is_control(end));
    assert!(!t.is_eog(start));
    let ids = t
        .encode("<|im_start|>hello<|im_end|>", false, true)
        .unwrap();
    assert_eq!(ids, vec![start, t.token_id("hello").unwrap(), end]);
    let plain = t.encode("<|im_start|>", false, false).unwrap();
    assert_eq!(t.decode(&plain), "<|im_start|>");
    assert!(!plain.contains(&start));
}

#[test]
fn bpe_multibyte_text_round_trips() {
    let md = bpe_md("smollm", &[], MERGES);
    let t = Tokenizer::from_metadata(&md).unwrap();
    let text = "héllo 12345 — 你好 👋🏽\n\t end";
    let ids = t.encode(text, false, false).unwrap();
    assert_eq!(t.decode(&ids), text);
    // smollm splits every digit on its own.
    let digits = t.encode("12345", false, false).unwrap();
    assert_eq!(digits.len(), 5);
    let mut sd = StreamDecoder::new(false);
    let streamed: String = ids.iter().map(|&id| sd.push(&t, id)).collect();
    assert_eq!(streamed + &sd.finish(), text);
}

#[test]
fn llama3_pre_adds_bos_and_ignores_merges() {
    let mut md = bpe_md("llama-bpe", &[("<|begin_of_text|>", 3)], MERGES);
    md.set("tokenizer.ggml.bos_token_id", MetaValue::U32(0));
    let t = Tokenizer::from_metadata(&md).unwrap();
    assert!(t.add_bos());
    assert_eq!(t.encode("hello", true, false).unwrap()[0], 0);
}

#[test]
fn add_eos_and_metadata_overrides() {
    let mut md = bpe_md("gpt-2", &[("<s>", 3), ("</s>", 3)], MERGES);
    md.set("tokenizer.ggml.bos_token_id", MetaValue::U32(0));
    md.set("tokenizer.ggml.eos_token_id", MetaValue::U32(1));
    md.set("tokenizer.ggml.add_bos_token", MetaValue::Bool(true));
    md.set("tokenizer.ggml.add_eos_token", MetaValue::Bool(true));
    let t = Tokenizer::from_metadata(&md).unwrap();
    let ids = t.encode("hello", true, false).unwrap();
    assert_eq!(ids.first(), Some(&0));
    assert_eq!(ids.last(), Some(&1));
    assert!(t.is_eog(1));
}

#[test]
fn phi3_specials_strip_following_whitespace() {
    let mut md = bpe_md("gpt-2", &[("<|user|>", 3)], MERGES);
    md.set("general.name", MetaValue::String("Phi-3 mini".into()));
    let t = Tokenizer::from_metadata(&md).unwrap();
    let ids = t.encode("<|user|>  \nhello", false, true).unwrap();
    assert_eq!(ids, vec![0, t.token_id("hello").unwrap()]);
}

#[test]
fn errors_are_typed_and_actionable() {
    let mut md = bpe_md("not-a-pre", &[], MERGES);
    let e = Tokenizer::from_metadata(&md).unwrap_err();
    assert!(matches!(e, TokenizerError::UnknownPreTokenizer { .. }));
    assert!(e.to_string().contains("qwen2"), "{e}");

    md.set("tokenizer.ggml.model", MetaValue::String("bert".into()));
    let e = Tokenizer::from_metadata(&md).unwrap_err();
    assert!(matches!(e, TokenizerError::UnsupportedModel { .. }));

    let e = Tokenizer::from_metadata(&Metadata::new()).unwrap_err();
    assert!(matches!(e, TokenizerError::Metadata(_)));

    let mut md = bpe_md("gpt-2", &[("<s>", 3)], MERGES);
    md.set("tokenizer.ggml.add_eos_token", MetaValue::Bool(true));
    md.set("tokenizer.ggml.eos_token_id", MetaValue::U32(999_999));
    // An out-of-range id keeps the default (11 for gpt2), which exists here.
    assert_eq!(Tokenizer::from_metadata(&md).unwrap().eos(), Some(11));

    let mut md = spm_md(&[("a", 0.0, 1), ("a", 0.0, 1)]);
    md.set("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    let e = Tokenizer::from_metadata(&md).unwrap_err();
    assert!(matches!(e, TokenizerError::DuplicateToken { .. }));

    // SPM text whose bytes have no token.
    let mut md = spm_md(&[
        ("<unk>", 0.0, 2),
        ("<s>", 0.0, 3),
        ("</s>", 0.0, 3),
        ("a", 0.0, 1),
    ]);
    md.set("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false));
    let t = Tokenizer::from_metadata(&md).unwrap();
    let e = t.encode("ä", false, false).unwrap_err();
    assert!(matches!(e, TokenizerError::MissingByteToken { byte: 0xC3 }));
}

#[test]
fn out_of_range_ids_do_not_panic() {
    let t = spm_tokenizer(|_| {});
    assert!(t.token_to_piece(u32::MAX).is_empty());
    assert_eq!(t.token_text(u32::MAX), "");
    assert_eq!(t.decode(&[u32::MAX]), "");
    assert!(!t.is_eog(u32::MAX));
}

#[test]
fn tokenizer_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<ChatTemplate>();
}
