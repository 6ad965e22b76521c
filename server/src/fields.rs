//! Request fields read straight from the body's JSON, element by element,
//! where a parse into a `Value` tree (32 bytes and more an element, twice
//! that through `#[serde(flatten)]`'s buffer) would let a body of the
//! limit take a gigabyte: 16 MiB of `logit_bias` pairs `[0,0]` took the
//! server from 0.15 to 1.23 GiB, of `json_schema` elements `[]` to 0.99 GiB,
//! of stop strings `"a"` to 0.83 GiB. What is kept is bounded by what the
//! request may use (the vocabulary, the stop limits, the schema limit),
//! and the rest is only counted or checked.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

use longhaul::scheduler::{SchedulerError, MAX_STOP_BYTES, MAX_STOP_STRINGS};
use longhaul::tokenizer::Tokenizer;
use serde::de::{
    self, DeserializeSeed, Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Number, Value};

use crate::error::ApiError;

/// The fields named in `names` of the JSON value `raw`, borrowed from it
/// (a repeated field: its last value, as a `Value` parse keeps), all
/// `None` where it is not an object.
pub fn pick_raw<'j, const N: usize>(
    raw: &'j RawValue,
    names: [&str; N],
) -> Result<[Option<&'j RawValue>; N], serde_json::Error> {
    let mut picked = [None; N];
    pick_into(raw, &names, &mut picked)?;
    Ok(picked)
}

/// [`pick_raw`] for `names.len()` fields, into `picked`.
fn pick_into<'j>(
    raw: &'j RawValue,
    names: &[&str],
    picked: &mut [Option<&'j RawValue>],
) -> Result<(), serde_json::Error> {
    // A raw value's text has no whitespace around it.
    if !raw.get().starts_with('{') {
        return Ok(());
    }
    let mut de = serde_json::Deserializer::from_str(raw.get());
    de.deserialize_map(Picker { names, picked })?;
    de.end()
}

/// The top-level fields of a JSON body named in `names`, as an object
/// (a repeated field: its last value), or `null` for JSON that is not an
/// object. The rest of the body is checked but left unparsed, where the
/// checks that read a few fields used to parse the whole body into a
/// `Value` tree again: an 8M-id prompt took the server to 0.93 GiB.
pub fn pick_fields(body: &[u8], names: &[&str]) -> Result<Value, serde_json::Error> {
    let whole: &RawValue = serde_json::from_slice(body)?;
    if !whole.get().starts_with('{') {
        return Ok(Value::Null);
    }
    let mut raws = vec![None; names.len()];
    pick_into(whole, names, &mut raws)?;
    let mut picked = serde_json::Map::new();
    for (name, raw) in names.iter().zip(raws) {
        if let Some(raw) = raw {
            picked.insert(name.to_string(), serde_json::from_str(raw.get())?);
        }
    }
    Ok(Value::Object(picked))
}

struct Picker<'n, 'p, 'j> {
    names: &'n [&'n str],
    picked: &'p mut [Option<&'j RawValue>],
}

/// A key of a [`Picker`]'s object: the index of its name, if named.
struct NameSeed<'n>(&'n [&'n str]);

impl<'de> DeserializeSeed<'de> for NameSeed<'_> {
    type Value = Option<usize>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameSeed<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, key: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|n| *n == key))
    }
}

impl<'j> Visitor<'j> for Picker<'_, '_, 'j> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'j>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(named) = map.next_key_seed(NameSeed(self.names))? {
            match named {
                Some(i) => self.picked[i] = Some(map.next_value()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// The values and keys of a JSON value, counted as
/// [`longhaul::constrain`] counts a schema's (a repeated key counts each
/// time, so never fewer), without building it. serde_json's nesting limit
/// applies, as to a `Value` parse.
pub fn json_units(raw: &RawValue) -> Result<usize, serde_json::Error> {
    let mut n = 0;
    serde_json::Deserializer::from_str(raw.get()).deserialize_any(Units(&mut n))?;
    Ok(n)
}

struct Units<'n>(&'n mut usize);

/// Any JSON value, read and dropped, with serde_json's nesting limit (as
/// a `Value` parse and serde's `Content` have it; `IgnoredAny` has none).
pub struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Units(&mut 0).deserialize(d).map(|()| Skip)
    }
}

impl<'de> DeserializeSeed<'de> for Units<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Units<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        *self.0 += 1;
        while map.next_key::<IgnoredAny>()?.is_some() {
            *self.0 += 1;
            map.next_value_seed(Units(&mut *self.0))?;
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        *self.0 += 1;
        while seq.next_element_seed(Units(&mut *self.0))?.is_some() {}
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        *self.0 += 1;
        Ok(())
    }
}

/// `stop`: one string or a list of them. Empty strings are dropped (they
/// would stop at once); past [`MAX_STOP_STRINGS`] strings or
/// [`MAX_STOP_BYTES`] bytes the rest are only counted, for the scheduler's
/// message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StopField {
    kept: Vec<String>,
    n: usize,
    bytes: usize,
}

impl StopField {
    fn add(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        self.n += 1;
        self.bytes = self.bytes.saturating_add(s.len());
        if self.n <= MAX_STOP_STRINGS && self.bytes <= MAX_STOP_BYTES {
            self.kept.push(s.to_string());
        }
    }

    /// The stop strings, or the scheduler's 400 when there are too many.
    pub fn into_vec(self) -> Result<Vec<String>, ApiError> {
        if self.n > MAX_STOP_STRINGS || self.bytes > MAX_STOP_BYTES {
            return Err(SchedulerError::TooManyStops {
                n: self.n,
                bytes: self.bytes,
            }
            .into());
        }
        Ok(self.kept)
    }
}

impl<'de> Deserialize<'de> for StopField {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StopVisitor)
    }
}

struct StopVisitor;

impl<'de> Visitor<'de> for StopVisitor {
    type Value = StopField;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string or a list of strings")
    }
    fn visit_str<E>(self, s: &str) -> Result<StopField, E> {
        let mut stop = StopField::default();
        stop.add(s);
        Ok(stop)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StopField, A::Error> {
        let mut stop = StopField::default();
        while let Some(s) = seq.next_element::<JsonStr>()? {
            stop.add(&s.0);
        }
        Ok(stop)
    }
}

/// A JSON string, borrowed from the body where it has no escapes.
struct JsonStr<'de>(std::borrow::Cow<'de, str>);

impl<'de> Deserialize<'de> for JsonStr<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JsonStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(JsonStr(s.into()))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(JsonStr(s.to_string().into()))
            }
        }
        d.deserialize_str(V)
    }
}

/// At most this much of a JSON value is quoted in a message.
const SHOWN: usize = 80;

/// `raw`'s text for a message, cut after [`SHOWN`] bytes.
fn shown(raw: &RawValue) -> String {
    let t = raw.get();
    if t.len() <= SHOWN {
        return t.to_string();
    }
    let mut end = SHOWN;
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &t[..end])
}

/// `logit_bias` in the forms llama-server reads: an object `{"15043": 1.0}`
/// (OpenAI's; a key that is not a number is text, each of its tokens
/// biased; a repeated key replaces the earlier, as a `Value` parse keeps
/// the last) or a list of `[id or text, bias]` pairs (repeats add up); a
/// bias is a number, or `false` to ban the token (`-inf`). Where
/// llama-server skips an entry it cannot read, this is a 400 naming the
/// field, and so are more entries than the vocabulary has tokens, found
/// as soon as they are read.
pub fn logit_bias(raw: &RawValue, tok: &Tokenizer) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut sink = BiasSink {
        tok,
        n_vocab: tok.n_vocab(),
        out: Vec::new(),
        seen: HashMap::new(),
        err: None,
    };
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let read = match raw.get().as_bytes().first() {
        Some(b'{') => de.deserialize_map(&mut sink),
        Some(b'[') => de.deserialize_seq(&mut sink),
        _ => {
            return Err(bias_error(format!(
                "{} is neither an object {{\"token id\": bias}} nor a list of [token, bias] pairs",
                shown(raw)
            )))
        }
    };
    match (read, sink.err) {
        (_, Some(e)) => Err(e),
        (Err(e), None) => Err(bias_error(e.to_string())),
        (Ok(()), None) => Ok(sink.out),
    }
}

fn bias_error(msg: String) -> ApiError {
    ApiError::invalid_field("logit_bias", format!("logit_bias: {msg}"))
}

/// Where [`logit_bias`] reads its entries to.
struct BiasSink<'t> {
    tok: &'t Tokenizer,
    n_vocab: usize,
    out: Vec<(u32, f32)>,
    /// The object form's keys so far and where their tokens are in `out`.
    seen: HashMap<String, Range<usize>>,
    /// Why reading stopped, when an entry was refused.
    err: Option<ApiError>,
}

/// A `logit_bias` key: a token id (a JSON number, or an object key that
/// reads as an integer) or a text.
enum BiasKey<'a> {
    Id(Number),
    Text(&'a str),
}

impl BiasSink<'_> {
    /// Stops the read with `e`.
    fn refuse<E: de::Error>(&mut self, e: ApiError) -> E {
        self.err = Some(e);
        E::custom("logit_bias refused")
    }

    fn bias_of(key: &dyn fmt::Display, raw: &RawValue) -> Result<f32, ApiError> {
        match raw.get() {
            "false" => Ok(f32::NEG_INFINITY),
            t => match serde_json::from_str::<Number>(t) {
                Ok(n) => Ok(n.as_f64().unwrap_or(f64::NAN) as f32),
                Err(_) => Err(bias_error(format!(
                    "the bias of {key} is {}; give a number, or false to ban the token",
                    shown(raw)
                ))),
            },
        }
    }

    /// Appends `key`'s tokens with `bias`; where they are in `out`.
    fn push(&mut self, key: BiasKey, bias: f32) -> Result<Range<usize>, ApiError> {
        let start = self.out.len();
        match key {
            BiasKey::Id(n) => match n.as_u64().filter(|&id| id < self.n_vocab as u64) {
                Some(id) => self.out.push((id as u32, bias)),
                None => {
                    return Err(bias_error(format!(
                        "token id {n} is out of range (the vocabulary has {} tokens)",
                        self.n_vocab
                    )))
                }
            },
            BiasKey::Text(text) => {
                let ids = self
                    .tok
                    .encode(text, false, false)
                    .map_err(|e| bias_error(e.to_string()))?;
                self.out.extend(ids.into_iter().map(|id| (id, bias)));
            }
        }
        if self.out.len() > self.n_vocab {
            return Err(bias_error(format!(
                "more than {0} entries given (a text counts one per token); at most {0}, the vocabulary's size: give each token once",
                self.n_vocab
            )));
        }
        Ok(start..self.out.len())
    }

    fn object_entry(&mut self, key: &str, raw: &RawValue) -> Result<(), ApiError> {
        let bias = Self::bias_of(&format_args!("\"{key}\""), raw)?;
        if let Some(at) = self.seen.get(key) {
            for e in &mut self.out[at.clone()] {
                e.1 = bias;
            }
            return Ok(());
        }
        let parsed = match key.trim().parse::<i64>() {
            Ok(id) => BiasKey::Id(id.into()),
            Err(_) => BiasKey::Text(key),
        };
        let at = self.push(parsed, bias)?;
        self.seen.insert(key.to_string(), at);
        Ok(())
    }

    fn pair(&mut self, raw: &RawValue) -> Result<(), ApiError> {
        let Ok((key, b)) = serde_json::from_str::<(&RawValue, &RawValue)>(raw.get()) else {
            return Err(bias_error(format!(
                "{} is not a [token, bias] pair",
                shown(raw)
            )));
        };
        let bias = Self::bias_of(&shown(key), b)?;
        let text;
        let parsed = if let Ok(n) = serde_json::from_str::<Number>(key.get()) {
            BiasKey::Id(n)
        } else if let Ok(t) = serde_json::from_str::<std::borrow::Cow<str>>(key.get()) {
            text = t;
            BiasKey::Text(&text)
        } else {
            return Err(bias_error(format!(
                "{} is not a token: give a token id or a text",
                shown(key)
            )));
        };
        self.push(parsed, bias).map(drop)
    }
}

impl<'de> Visitor<'de> for &mut BiasSink<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object {\"token id\": bias} or a list of [token, bias] pairs")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<JsonStr>()? {
            let raw: &RawValue = map.next_value()?;
            if let Err(e) = self.object_entry(&key.0, raw) {
                return Err(self.refuse(e));
            }
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(raw) = seq.next_element::<&RawValue>()? {
            if let Err(e) = self.pair(raw) {
                return Err(self.refuse(e));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pick_fields` gives what a whole `Value` parse gives for the named
    /// fields: nested values, the last of a repeated field, nothing for a
    /// field not named, `null` for JSON that is not an object, and the
    /// same syntax errors.
    #[test]
    fn picked_fields_are_those_of_the_whole_value() {
        let body = br#" {"a": [1, {"b": null}], "skip": [[1,2],"x"], "c": 1, "c": {"d": 2}, "e\u0041": true} "#;
        let whole: Value = serde_json::from_slice(body).unwrap();
        let picked = pick_fields(body, &["a", "c", "eA", "absent"]).unwrap();
        let want: serde_json::Map<String, Value> = ["a", "c", "eA"]
            .into_iter()
            .map(|k| (k.to_string(), whole[k].clone()))
            .collect();
        assert_eq!(picked, Value::Object(want));
        assert_eq!(picked["c"], serde_json::json!({"d": 2}));
        assert_eq!(pick_fields(b" [1, 2] ", &["a"]).unwrap(), Value::Null);
        assert_eq!(pick_fields(b"3", &["a"]).unwrap(), Value::Null);
        for bad in [
            &b"{\"a\": 1,}"[..],
            b"{\"a\": [1}",
            b"",
            b"{} x",
            b"{\"a\": \"\xff\"}",
            b"{\"a\": 1, \"z\": [1}",
        ] {
            assert!(serde_json::from_slice::<Value>(bad).is_err());
            assert!(
                pick_fields(bad, &["a"]).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// The count is `JsonSize`'s: one per value and one per key.
    #[test]
    fn json_units_count_values_and_keys() {
        let units = |s: &str| json_units(&serde_json::from_str::<Box<RawValue>>(s).unwrap());
        assert_eq!(units("1").unwrap(), 1);
        assert_eq!(units("[]").unwrap(), 1);
        assert_eq!(units("[1, \"a\", null, true]").unwrap(), 5);
        // 1 object + 2 keys + 1 number + (1 array + 2 elements).
        assert_eq!(units(r#"{"a": 1, "b": [{}, 2.5]}"#).unwrap(), 7);
        // Deeper than serde_json's limit of 128 is refused, as by `Value`.
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(serde_json::from_str::<Value>(&deep).is_err());
        assert!(units(&deep).is_err());
    }

    /// `stop` reads as the untagged enum of a string or a list of strings
    /// did, empty strings dropped; past the scheduler's limits only the
    /// count is kept, and the 400 carries the scheduler's numbers.
    #[test]
    fn stop_strings_are_bounded_while_read() {
        let read = |s: &str| serde_json::from_str::<StopField>(s).map(StopField::into_vec);
        assert_eq!(read(r#""a""#).unwrap().unwrap(), ["a"]);
        assert_eq!(read(r#"["a", "", "b\n"]"#).unwrap().unwrap(), ["a", "b\n"]);
        assert!(read(r#""""#).unwrap().unwrap().is_empty());
        assert!(read("5").is_err());
        assert!(read("[5]").is_err());
        let many = serde_json::to_string(&vec!["ab"; MAX_STOP_STRINGS + 5]).unwrap();
        let stop: StopField = serde_json::from_str(&many).unwrap();
        assert_eq!(stop.kept.len(), MAX_STOP_STRINGS);
        let e = stop.into_vec().unwrap_err();
        let want = ApiError::from(SchedulerError::TooManyStops {
            n: MAX_STOP_STRINGS + 5,
            bytes: 2 * (MAX_STOP_STRINGS + 5),
        });
        assert_eq!((e.message, e.param), (want.message, want.param));
        let fits = serde_json::to_string(&vec!["ab"; MAX_STOP_STRINGS]).unwrap();
        assert_eq!(read(&fits).unwrap().unwrap().len(), MAX_STOP_STRINGS);
        let long = serde_json::to_string(&"x".repeat(MAX_STOP_BYTES + 1)).unwrap();
        let stop: StopField = serde_json::from_str(&long).unwrap();
        assert!(stop.kept.is_empty());
        assert!(stop.into_vec().is_err());
    }
}
