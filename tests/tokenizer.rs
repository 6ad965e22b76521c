//! Tokenizer parity with llama.cpp on real models: SmolLM2-135M-Instruct
//! (byte-level BPE, pre `smollm`) and Gemma 3 270M (SentencePiece). Goldens in
//! tests/goldens/tokenize/ come from `llama-tokenize` (tools/tokenize_goldens.sh).
//! The models come from tools/fetch-models.sh; a missing model fails the test.

use std::path::PathBuf;

use longhaul::gguf::{Metadata, Model};
use longhaul::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer, VocabType};

const SMOLLM2: &str = "smollm2-135m-instruct-q4_1";
const GEMMA3: &str = "gemma-3-270m-q4_k_m";

fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LONGHAUL_MODELS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/longhaul/models")
}

fn metadata(model: &str) -> Metadata {
    let path = models_dir().join(format!("{model}.gguf"));
    assert!(
        path.exists(),
        "{} is missing: run tools/fetch-models.sh (or set LONGHAUL_MODELS to the folder that holds it)",
        path.display()
    );
    match Model::open(&path) {
        Ok(m) => m.metadata().clone(),
        Err(e) => panic!("opening {}: {e}", path.display()),
    }
}

fn tokenizer(model: &str) -> (Tokenizer, Metadata) {
    let md = metadata(model);
    let t = Tokenizer::from_metadata(&md).unwrap_or_else(|e| panic!("{model}: {e}"));
    (t, md)
}

struct Case {
    name: String,
    text: String,
    parse_special: bool,
    add_special: bool,
    ids: Vec<u32>,
}

fn goldens(model: &str) -> Vec<Case> {
    golden_file(&format!("{model}.json"))
}

/// `name` in tests/goldens/tokenize/.
fn golden_file(name: &str) -> Vec<Case> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/goldens/tokenize")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; regenerate with tools/tokenize_goldens.sh",
            path.display()
        )
    });
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            text: match c["text"].as_str() {
                Some(text) => text.to_string(),
                None => repeats(&c["parts"])
                    .map(|(part, n)| part.as_str().unwrap().repeat(n))
                    .collect(),
            },
            parse_special: c["parse_special"].as_bool().unwrap(),
            add_special: c["add_special"].as_bool().unwrap(),
            ids: match c["ids"].as_array() {
                Some(ids) => ids.iter().map(|x| x.as_u64().unwrap() as u32).collect(),
                None => repeats(&c["ids_rle"])
                    .flat_map(|(id, n)| std::iter::repeat_n(id.as_u64().unwrap() as u32, n))
                    .collect(),
            },
        })
        .collect()
}

/// The `[value, repeats]` pairs of a long case's `parts` or `ids_rle`.
fn repeats(v: &serde_json::Value) -> impl Iterator<Item = (&serde_json::Value, usize)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| (&p[0], p[1].as_u64().unwrap() as usize))
}

/// Every golden case must match exactly; all mismatches are reported.
fn check_goldens(model: &str) {
    check_cases(model, &goldens(model), 8);
}

fn check_cases(model: &str, cases: &[Case], at_least: usize) {
    let (t, _) = tokenizer(model);
    assert!(cases.len() >= at_least, "too few golden cases for {model}");
    let mut failures = Vec::new();
    for c in cases {
        let got = t.encode(&c.text, c.add_special, c.parse_special).unwrap();
        if got != c.ids {
            let at = got
                .iter()
                .zip(&c.ids)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(c.ids.len()));
            let show = |ids: &[u32]| {
                ids.iter()
                    .skip(at.saturating_sub(2))
                    .take(6)
                    .map(|&i| format!("{i}:{:?}", t.token_text(i)))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            failures.push(format!(
                "{model}/{}: first difference at {at}: got [{}] want [{}] (len {} vs {})",
                c.name,
                show(&got),
                show(&c.ids),
                got.len(),
                c.ids.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn smollm2_matches_llama_tokenize() {
    check_goldens(SMOLLM2);
}

/// 303 seeded random texts (tools/tokenize_fuzz_texts.py): scripts,
/// whitespace and digit runs, control bytes, specials' texts, two texts
/// past SentencePiece's 4 KiB chunks; ids from `llama-tokenize`.
#[test]
fn smollm2_matches_llama_tokenize_on_random_texts() {
    check_cases(SMOLLM2, &golden_file(&format!("fuzz-{SMOLLM2}.json")), 300);
}

#[test]
fn gemma3_matches_llama_tokenize_on_random_texts() {
    check_cases(GEMMA3, &golden_file(&format!("fuzz-{GEMMA3}.json")), 300);
}

/// Whitespace runs of a million characters, past what fancy-regex can
/// hold (tests/goldens/tokenize/runs.json): SmolLM2's GPT-2 regex is
/// matched by hand, as llama.cpp matches it.
#[test]
fn smollm2_matches_llama_tokenize_on_runs_of_a_million() {
    check_cases(SMOLLM2, &golden_file(&format!("runs-{SMOLLM2}.json")), 4);
}

#[test]
fn gemma3_matches_llama_tokenize_on_runs_of_a_million() {
    check_cases(GEMMA3, &golden_file(&format!("runs-{GEMMA3}.json")), 4);
}

#[test]
fn gemma3_matches_llama_tokenize() {
    check_goldens(GEMMA3);
}

/// Decoding the ids of plain text gives the text back, also when streamed
/// one token at a time. SmolLM2 has no token for 21 bytes and drops them
/// (as llama.cpp does), so its `vocab_missing_bytes` text cannot come back.
fn check_round_trip(model: &str) {
    let (t, _) = tokenizer(model);
    for c in goldens(model) {
        let dropped = model == SMOLLM2 && c.name.starts_with("vocab_missing_bytes");
        if c.name.starts_with("chat_markers") || c.add_special || dropped {
            continue;
        }
        assert_eq!(t.decode(&c.ids), c.text, "{model}/{}", c.name);
        let mut sd = StreamDecoder::new(false);
        let mut out = String::new();
        for &id in &c.ids {
            let piece = sd.push(&t, id);
            assert!(!piece.contains('\u{FFFD}'), "{model}/{}", c.name);
            out.push_str(&piece);
        }
        out.push_str(&sd.finish());
        assert_eq!(out, c.text, "{model}/{} streamed", c.name);
    }
}

#[test]
fn smollm2_decode_round_trips() {
    check_round_trip(SMOLLM2);
}

#[test]
fn gemma3_decode_round_trips() {
    check_round_trip(GEMMA3);
}

#[test]
fn smollm2_special_ids() {
    let (t, _) = tokenizer(SMOLLM2);
    assert_eq!(t.vocab_type(), VocabType::Bpe);
    assert_eq!(t.n_vocab(), 49152);
    assert_eq!(t.bos(), Some(1));
    assert_eq!(t.eos(), Some(2));
    assert!(!t.add_bos());
    assert_eq!(t.token_text(2), "<|im_end|>");
    assert!(t.is_eog(2), "<|im_end|> ends generation");
    assert!(t.is_eog(0), "<|endoftext|> ends generation");
    assert!(!t.is_eog(1));
    assert_eq!(t.token_to_piece(t.token_id("Ġworld").unwrap()), b" world");
}

#[test]
fn gemma3_special_ids() {
    let (t, _) = tokenizer(GEMMA3);
    assert_eq!(t.vocab_type(), VocabType::Spm);
    assert_eq!(t.n_vocab(), 262144);
    assert_eq!(t.bos(), Some(2));
    assert_eq!(t.eos(), Some(1));
    assert!(t.add_bos());
    let eot = t.token_id("<end_of_turn>").unwrap();
    assert_eq!(t.eot(), Some(eot));
    assert!(t.is_eog(eot) && t.is_eog(1));
    let nl = t.token_id("<0x0A>").unwrap();
    assert_eq!(t.token_to_piece(nl), b"\n");
    assert_eq!(t.token_to_piece(t.token_id("▁hello").unwrap()), b" hello");
}

#[test]
fn smollm2_chat_template_is_chatml() {
    let md = metadata(SMOLLM2);
    let tmpl = ChatTemplate::from_metadata(&md)
        .unwrap()
        .expect("SmolLM2 ships a chat template");
    let user = [ChatMessage::new("user", "Hello")];
    let default_system =
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";
    assert_eq!(
        tmpl.render(&user, true).unwrap(),
        format!("{default_system}<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    );
    let convo = [
        ChatMessage::new("system", "Be terse."),
        ChatMessage::new("user", "2+2?"),
        ChatMessage::new("assistant", "4"),
    ];
    assert_eq!(
        tmpl.render(&convo, false).unwrap(),
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
         <|im_start|>assistant\n4<|im_end|>\n"
    );
    // The rendered prompt tokenizes into the ChatML control tokens.
    let (t, _) = tokenizer(SMOLLM2);
    let ids = t
        .encode(&tmpl.render(&user, true).unwrap(), true, true)
        .unwrap();
    assert_eq!(ids[0], t.token_id("<|im_start|>").unwrap());
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2);
}

#[test]
fn gemma3_file_has_no_chat_template() {
    // This GGUF carries no `tokenizer.chat_template`; callers fall back to
    // a built-in template (see the Gemma template test in tokenizer::chat).
    let md = metadata(GEMMA3);
    assert!(ChatTemplate::from_metadata(&md).unwrap().is_none());
}

/// `min_tokens` never exceeds the encoding's length (it refuses prompts
/// that cannot fit a context before they are encoded, so one over would
/// refuse a prompt that fits): on every golden case, and on 2,000 texts
/// made of pieces that tokenize unlike each other (whitespace runs,
/// digits, multi-byte text, special tokens, long repeats) for each
/// combination of `add_special` and `parse_special`.
fn check_min_tokens(model: &str) {
    let (t, _) = tokenizer(model);
    for c in goldens(model) {
        let at_least = t.min_tokens(&c.text, c.add_special, c.parse_special);
        assert!(
            at_least <= c.ids.len(),
            "{model}/{}: {at_least} > {}",
            c.name,
            c.ids.len()
        );
    }
    let pieces = [
        "a",
        "hello",
        " world",
        " ",
        "  ",
        "\t",
        "\n",
        "\n\n",
        " \n ",
        "123456",
        "3.14",
        "🙂",
        "日本語",
        "ü",
        "<|im_start|>",
        "<|im_end|>",
        "<start_of_turn>",
        "<bos>",
        "<|endoftext|>",
        "'s",
        "don't",
        "http://x.y/z?q=1",
        "====",
        "\u{2581}",
        "\u{4}\u{6}",
    ];
    let long = [
        " ".repeat(300),
        "-".repeat(200),
        "0".repeat(90),
        "ab".repeat(150),
    ];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    for i in 0..2000 {
        let mut text = String::new();
        for _ in 0..1 + next(40) {
            match next(10) {
                0 => text.push_str(&long[next(long.len())]),
                _ => text.push_str(pieces[next(pieces.len())]),
            }
        }
        for (add, parse) in [(false, false), (false, true), (true, false), (true, true)] {
            let n = t.encode(&text, add, parse).expect("encode").len();
            let at_least = t.min_tokens(&text, add, parse);
            assert!(
                at_least <= n,
                "{model} text {i} {text:?} ({add}, {parse}): {at_least} > {n}"
            );
        }
    }
    // The vocabulary's longest texts, each alone: those that encode to
    // their one token meet the bound exactly (a bound one byte larger
    // per token fails here).
    let mut by_len: Vec<(usize, u32, String)> = (0..t.n_vocab() as u32)
        .filter(|&id| !t.is_control(id))
        .map(|id| {
            let s = t.decode(&[id]);
            (s.len(), id, s)
        })
        .collect();
    by_len.sort_unstable_by(|a, b| b.cmp(a));
    let mut exact = 0;
    for (_, id, text) in by_len.iter().take(50) {
        let ids = t.encode(text, false, false).expect("encode");
        assert!(
            t.min_tokens(text, false, false) <= ids.len(),
            "{model} {text:?}"
        );
        exact += usize::from(ids == [*id]);
    }
    assert!(exact > 0, "{model}: no long token encodes to itself");
    // Not vacuous: 1 MiB of prose is far more than a few thousand tokens.
    let prose = "The quick brown fox jumps over the lazy dog. ".repeat(1 << 20 >> 5);
    assert!(t.min_tokens(&prose, true, true) > 4096, "{model}");
}

#[test]
fn smollm2_min_tokens_bounds_the_encoding_from_below() {
    check_min_tokens(SMOLLM2);
}

#[test]
fn gemma3_min_tokens_bounds_the_encoding_from_below() {
    check_min_tokens(GEMMA3);
}
