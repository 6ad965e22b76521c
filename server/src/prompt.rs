//! `prompt` of the completion endpoints: a string, a list of token ids
//! and strings, or (OpenAI) a one-element list of either; parsed straight
//! from the body and tokenised against the slot's context.

use serde::Deserialize;

use crate::error::ApiError;
use crate::fields::Skip;
use crate::request::refuse_unfitting;
use crate::EngineInfo;

/// One prompt element: text or a token id (llama.cpp accepts lists mixing both).
#[derive(Debug, Clone, PartialEq)]
pub enum PromptPart {
    Token(u32),
    Text(String),
}

/// `prompt`: a string, a list of token ids, or (OpenAI) a one-element list
/// of either.
///
/// It deserializes as an `#[serde(untagged)]` enum of these variants
/// would (the same values accepted, the same messages otherwise), but
/// straight from the parser: an untagged enum first buffers the whole
/// value as serde's `Content`, 32 bytes an element, so an 8M-id prompt
/// held 256 MB more.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptField {
    Text(String),
    Parts(Parts),
    Batch(Vec<Parts>),
}

/// A list of prompt parts with its token ids 4 bytes each, where a
/// `Vec<PromptPart>` takes 24: a body of the limit of ids (8M) held
/// 200 MB more. One list has one representation, so `==` compares lists.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Parts {
    /// The token ids, in order.
    ids: Vec<u32>,
    /// The texts, in order, each with the number of ids before it.
    texts: Vec<(usize, String)>,
}

/// A part of [`Parts`], borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum PartRef<'a> {
    Token(u32),
    Text(&'a str),
}

impl Parts {
    fn push(&mut self, p: PromptPart) {
        match p {
            PromptPart::Token(id) => self.ids.push(id),
            PromptPart::Text(s) => self.texts.push((self.ids.len(), s)),
        }
    }

    fn len(&self) -> usize {
        self.ids.len() + self.texts.len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The parts in order.
    fn iter(&self) -> impl Iterator<Item = PartRef<'_>> {
        let (mut t, mut i) = (0, 0);
        std::iter::from_fn(move || {
            if let Some((before, s)) = self.texts.get(t) {
                if *before == i {
                    t += 1;
                    return Some(PartRef::Text(s));
                }
            }
            let id = *self.ids.get(i)?;
            i += 1;
            Some(PartRef::Token(id))
        })
    }
}

impl FromIterator<PromptPart> for Parts {
    fn from_iter<I: IntoIterator<Item = PromptPart>>(iter: I) -> Self {
        let mut parts = Parts::default();
        for p in iter {
            parts.push(p);
        }
        parts
    }
}

/// A JSON value as a `prompt` part, or `None` for any other shape (after
/// reading all of it, so that only syntax errors stop the parse early, as
/// with the untagged enum, which reads the whole value first).
struct Part(Option<PromptPart>);

/// An element of a `prompt` list: a part, a list of parts (a batch), or
/// neither.
enum Elem {
    Part(PromptPart),
    List(Parts),
    Bad,
}

fn no_variant<E: serde::de::Error>() -> E {
    E::custom("data did not match any variant of untagged enum PromptField")
}

/// Reads the rest of a map or list that has the wrong shape.
fn drain_map<'de, A: serde::de::MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<Skip, Skip>()?.is_some() {}
    Ok(())
}

fn drain_seq<'de, A: serde::de::SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<Skip>()?.is_some() {}
    Ok(())
}

/// The visits every value shape has: a token id (`u32`), a string, or
/// nothing (`Shape::other`) for the rest; lists are left to `visit_seq`.
macro_rules! shapes {
    ($value:ty, $part:expr, $other:expr) => {
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<$value, E> {
            Ok(match u32::try_from(v) {
                Ok(id) => $part(PromptPart::Token(id)),
                Err(_) => $other,
            })
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<$value, E> {
            match u64::try_from(v) {
                Ok(v) => self.visit_u64(v),
                Err(_) => Ok($other),
            }
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<$value, E> {
            Ok($other)
        }
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<$value, E> {
            Ok($other)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<$value, E> {
            Ok($other)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$value, E> {
            Ok($part(PromptPart::Text(v.to_string())))
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<$value, E> {
            Ok($part(PromptPart::Text(v)))
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<$value, A::Error> {
            drain_map(map)?;
            Ok($other)
        }
    };
}

struct PartVisitor;

impl<'de> serde::de::Visitor<'de> for PartVisitor {
    type Value = Part;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a token id or a string")
    }
    shapes!(Part, |p| Part(Some(p)), Part(None));
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Part, A::Error> {
        drain_seq(seq)?;
        Ok(Part(None))
    }
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PartVisitor)
    }
}

struct ElemVisitor;

impl<'de> serde::de::Visitor<'de> for ElemVisitor {
    type Value = Elem;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a token id, a string or a list of them")
    }
    shapes!(Elem, Elem::Part, Elem::Bad);
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Elem, A::Error> {
        let mut parts = Parts::default();
        let mut bad = false;
        while let Some(Part(p)) = seq.next_element::<Part>()? {
            match p {
                Some(p) if !bad => parts.push(p),
                _ => bad = true,
            }
        }
        Ok(if bad { Elem::Bad } else { Elem::List(parts) })
    }
}

impl<'de> Deserialize<'de> for Elem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ElemVisitor)
    }
}

/// The whole `prompt` value: `Some` of a field, or `None` for another shape.
struct FieldVisitor;

impl<'de> serde::de::Visitor<'de> for FieldVisitor {
    type Value = Option<PromptField>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string or a list")
    }
    shapes!(
        Option<PromptField>,
        |p| match p {
            PromptPart::Text(s) => Some(PromptField::Text(s)),
            PromptPart::Token(_) => None,
        },
        None
    );
    /// A list of parts, or a list of lists of parts; not a mix.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<Option<PromptField>, A::Error> {
        let (mut parts, mut batch, mut bad) = (Parts::default(), Vec::new(), false);
        while let Some(e) = seq.next_element::<Elem>()? {
            match e {
                Elem::Part(p) if batch.is_empty() && !bad => parts.push(p),
                Elem::List(l) if parts.is_empty() && !bad => batch.push(l),
                _ => bad = true,
            }
        }
        Ok(match (bad, batch.is_empty()) {
            (true, _) => None,
            (false, true) => Some(PromptField::Parts(parts)),
            (false, false) => Some(PromptField::Batch(batch)),
        })
    }
}

impl<'de> Deserialize<'de> for PromptField {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FieldVisitor)?.ok_or_else(no_variant)
    }
}

impl PromptField {
    /// Tokenises the prompt: text as llama.cpp does (BOS per the model,
    /// special tokens parsed), token ids as given after a range check. A
    /// prompt that cannot fit `n_ctx` is refused before it is encoded
    /// where [`Tokenizer::min_tokens`] shows it ([`refuse_unfitting`]).
    pub fn tokenize(self, engine: &dyn EngineInfo, n_ctx: usize) -> Result<Vec<u32>, ApiError> {
        let parts = match self {
            PromptField::Text(s) => Parts::from_iter([PromptPart::Text(s)]),
            PromptField::Parts(p) => p,
            PromptField::Batch(mut b) => {
                if b.len() != 1 {
                    return Err(ApiError::invalid_field(
                        "prompt",
                        format!(
                            "{} prompts given; this server takes one prompt per request",
                            b.len()
                        ),
                    ));
                }
                b.pop().unwrap_or_default()
            }
        };
        // A list of strings is a batch of prompts in OpenAI's API.
        let all_text = parts.ids.is_empty();
        if all_text && parts.len() > 1 {
            return Err(ApiError::invalid_field(
                "prompt",
                format!(
                    "{} prompts given; this server takes one prompt per request",
                    parts.len()
                ),
            ));
        }
        let tok = engine.tokenizer();
        let at_least = parts
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                PartRef::Token(_) => 1,
                PartRef::Text(s) => tok.min_tokens(s, i == 0, true),
            })
            .sum();
        refuse_unfitting(at_least, n_ctx)?;
        let n_vocab = tok.n_vocab();
        let mut out = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            match p {
                PartRef::Token(id) => {
                    if id as usize >= n_vocab {
                        return Err(ApiError::invalid_field(
                            "prompt",
                            format!("token id {id} is out of range (the vocabulary has {n_vocab} tokens)"),
                        ));
                    }
                    out.push(id);
                }
                PartRef::Text(s) => {
                    let ids = tok
                        .encode(s, i == 0, true)
                        .map_err(|e| ApiError::invalid_field("prompt", e.to_string()))?;
                    out.extend(ids);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derived untagged enums `PromptField` replaces: the reference
    /// (named as they were, since the messages name the enum).
    mod untagged {
        use serde::Deserialize;

        #[derive(Deserialize, Debug)]
        #[serde(untagged)]
        pub enum PromptPart {
            Token(u32),
            Text(String),
        }

        #[derive(Deserialize, Debug)]
        #[serde(untagged)]
        pub enum PromptField {
            Text(String),
            Parts(Vec<PromptPart>),
            Batch(Vec<Vec<PromptPart>>),
        }
    }

    fn from_untagged(f: untagged::PromptField) -> PromptField {
        let part = |p| match p {
            untagged::PromptPart::Token(t) => PromptPart::Token(t),
            untagged::PromptPart::Text(s) => PromptPart::Text(s),
        };
        let parts = |v: Vec<untagged::PromptPart>| v.into_iter().map(part).collect();
        match f {
            untagged::PromptField::Text(s) => PromptField::Text(s),
            untagged::PromptField::Parts(v) => PromptField::Parts(parts(v)),
            untagged::PromptField::Batch(b) => {
                PromptField::Batch(b.into_iter().map(parts).collect())
            }
        }
    }

    #[derive(Deserialize)]
    struct Body<T> {
        #[allow(dead_code)]
        prompt: T,
    }

    /// A random JSON value of the shapes a prompt meets: ids at and past
    /// the `u32` edge, negatives, floats, strings, literals, maps, lists
    /// of lists, and now and then a syntax error.
    fn random_prompt(rng: &mut u64, depth: u32) -> String {
        *rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let r = (*rng >> 33) as u32;
        match r % if depth < 3 { 14 } else { 10 } {
            0 => "4294967295".into(),
            1 => "4294967296".into(),
            2 => "-1".into(),
            3 => "1.0".into(),
            4 => format!("{}", r % 50_000),
            5 => "\"a\\n\"".into(),
            6 => ["true", "null", "{}", "{\"a\": [1]}"][(r / 16 % 4) as usize].into(),
            7 => ["[1,", "[1 2]", "\"x", "[1,]"][(r / 16 % 4) as usize].into(),
            8 | 9 => "\"text\"".into(),
            _ => {
                let n = r / 16 % 4;
                let items: Vec<String> = (0..n).map(|_| random_prompt(rng, depth + 1)).collect();
                format!("[{}]", items.join(", "))
            }
        }
    }

    /// `Parts` gives back the parts in the order they were pushed, ids and
    /// texts interleaved in every way (texts first, last, in runs).
    #[test]
    fn parts_keep_their_order() {
        let mut rng = 11u64;
        for n in 0..400 {
            let list: Vec<PromptPart> = (0..n % 9)
                .map(|k| {
                    rng = rng
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    if (rng >> 40).is_multiple_of(3) {
                        PromptPart::Text(format!("t{k}"))
                    } else {
                        PromptPart::Token((rng >> 33) as u32 % 100)
                    }
                })
                .collect();
            let parts: Parts = list.iter().cloned().collect();
            let back: Vec<PromptPart> = parts
                .iter()
                .map(|p| match p {
                    PartRef::Token(id) => PromptPart::Token(id),
                    PartRef::Text(s) => PromptPart::Text(s.to_string()),
                })
                .collect();
            assert_eq!(back, list);
            assert_eq!(parts.len(), list.len());
        }
    }

    /// `PromptField` accepts what the untagged enums accept, as the same
    /// values, and refuses the rest with the same message (category and
    /// position included).
    #[test]
    fn prompt_field_parses_as_the_untagged_enums_did() {
        let mut cases: Vec<String> = [
            "\"hi\"",
            "[]",
            "[1, 2]",
            "[1, \"a\"]",
            "[[1, 2]]",
            "[[]]",
            "[[], [1]]",
            "[[1], 2]",
            "[1, [2]]",
            "[\"a\", \"b\"]",
            "[[\"a\"], [3]]",
            "1",
            "true",
            "null",
            "{}",
            "[{}]",
            "[[{}]]",
            "[[1, [2]]]",
            "[null]",
            "[4294967296]",
            "[[1,], 2]",
            "[1, {\"a\" 1}]",
            "[\"a\\q\"]",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        cases.push(format!("{}1{}", "[".repeat(200), "]".repeat(200)));
        cases.push(format!("[1, {}{}]", "[".repeat(200), "]".repeat(200)));
        let mut rng = 7u64;
        cases.extend((0..3000).map(|_| random_prompt(&mut rng, 0)));
        let (mut ok, mut refused) = (0, 0);
        for case in &cases {
            let body = format!("{{\"prompt\": {case}, \"n_predict\": 1}}");
            let ours = serde_json::from_str::<Body<PromptField>>(&body);
            let theirs = serde_json::from_str::<Body<untagged::PromptField>>(&body);
            match (ours, theirs) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a.prompt, from_untagged(b.prompt), "{body}");
                    ok += 1;
                }
                (Err(a), Err(b)) => {
                    assert_eq!(a.to_string(), b.to_string(), "{body}");
                    assert_eq!(a.classify(), b.classify(), "{body}");
                    refused += 1;
                }
                (a, b) => panic!(
                    "{body}: ours {:?}, untagged {:?}",
                    a.map(|b| b.prompt),
                    b.map(|b| b.prompt)
                ),
            }
        }
        assert!(
            ok > 500 && refused > 500,
            "{ok} accepted, {refused} refused"
        );
    }
}
