//! Token probabilities as each API spells them: llama-server's entries
//! (`completion_probabilities`, and the `content` list of OpenAI's chat
//! `logprobs`), and OpenAI's legacy completions object (`tokens`,
//! `token_logprobs`, `top_logprobs`, `text_offset`).

use longhaul::sample::TokenProbs;
use longhaul::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// One sampled token and its probabilities.
pub type Probs = (u32, TokenProbs);

/// A token's text as llama-server reports it: the piece without special
/// tokens' text, cut to its longest valid UTF-8 prefix (`bytes` has all).
fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_to_piece_with(id, false).to_vec();
    let text = match std::str::from_utf8(&bytes) {
        Ok(s) => s.to_string(),
        Err(e) => String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned(),
    };
    (text, bytes)
}

/// A log-probability for JSON: `-inf` (not representable) becomes the
/// lowest finite f32, as llama-server writes it.
fn logprob(lp: f32) -> f32 {
    if lp == f32::NEG_INFINITY {
        f32::MIN
    } else {
        lp
    }
}

/// `{id, token, bytes, logprob}` (or `prob` after the sampling chain).
fn one(tok: &Tokenizer, id: u32, lp: f32, post: bool) -> Map<String, Value> {
    let (text, bytes) = piece(tok, id);
    let mut m = Map::new();
    m.insert("id".into(), json!(id));
    m.insert("token".into(), json!(text));
    m.insert("bytes".into(), json!(bytes));
    if post {
        m.insert("prob".into(), json!(lp.exp()));
    } else {
        m.insert("logprob".into(), json!(logprob(lp)));
    }
    m
}

/// llama-server's entry for a sampled token: its own fields and the most
/// likely tokens under `top_logprobs` (`top_probs` after the chain). This
/// is also OpenAI's chat `logprobs.content[]` entry.
pub fn entry(tok: &Tokenizer, p: &Probs, post: bool) -> Value {
    let (id, probs) = p;
    let mut m = one(tok, *id, probs.logprob, post);
    let top: Vec<Value> = probs
        .top
        .iter()
        .map(|&(t, lp)| Value::Object(one(tok, t, lp, post)))
        .collect();
    m.insert(
        if post { "top_probs" } else { "top_logprobs" }.into(),
        Value::Array(top),
    );
    Value::Object(m)
}

/// The entries of several tokens.
pub fn entries(tok: &Tokenizer, ps: &[Probs], post: bool) -> Value {
    Value::Array(ps.iter().map(|p| entry(tok, p, post)).collect())
}

/// OpenAI's legacy completions `logprobs` object for `ps`, whose first
/// token starts at character `offset` of the completion text; with
/// llama-server's `content` list of entries alongside. Returns the object
/// and the offset after the last token.
pub fn legacy(tok: &Tokenizer, ps: &[Probs], mut offset: usize, post: bool) -> (Value, usize) {
    let (mut tokens, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for (id, probs) in ps {
        let (text, _) = piece(tok, *id);
        offsets.push(offset);
        offset += text.chars().count();
        tokens.push(text);
        lps.push(logprob(probs.logprob));
        let top: Map<String, Value> = probs
            .top
            .iter()
            .map(|&(t, lp)| (piece(tok, t).0, json!(logprob(lp))))
            .collect();
        tops.push(Value::Object(top));
    }
    let v = json!({
        "tokens": tokens,
        "token_logprobs": lps,
        "top_logprobs": tops,
        "text_offset": offsets,
        "content": entries(tok, ps, post),
    });
    (v, offset)
}
