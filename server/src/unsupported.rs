//! Request fields that llama-server or OpenAI define, that would change
//! the output, and that this server does not implement: each is a 400
//! naming it instead of being ignored. A field set to its neutral value
//! (the one that changes nothing, e.g. `typical_p: 1`) is accepted, as are
//! fields that never change the output (`user`, `cache_prompt`, `id_slot`,
//! `timings_per_token`, ...). Structured output and tool fields (`grammar`,
//! `json_schema`, `response_format`, `tools`, ...) are not listed here.

use axum::body::Bytes;
use serde_json::Value;

use crate::error::ApiError;

/// The value of a field that leaves the output unchanged. `null` always does.
#[derive(Clone, Copy, Debug)]
enum Neutral {
    /// `false`.
    False,
    /// A number `<= x`.
    AtMost(f64),
    /// A number `>= x`.
    AtLeast(f64),
    /// A number `< x`.
    Below(f64),
    /// Empty: `""`, `[]` or `{}`.
    Empty,
    /// `["text"]` (OpenAI's `modalities`).
    TextOnly,
    /// This string.
    Is(&'static str),
    /// llama.cpp's default sampler order, or any order that differs from it
    /// only by samplers this server refuses to enable.
    DefaultSamplers,
}

/// `(field, neutral value)`, from llama-server's request schema
/// (tools/server/server-schema.cpp, server-common.cpp) and OpenAI's
/// completion and chat-completion requests.
const FIELDS: &[(&str, Neutral)] = &[
    // OpenAI
    ("suffix", Neutral::Empty),
    ("best_of", Neutral::AtMost(1.0)),
    ("n", Neutral::AtMost(1.0)),
    ("echo", Neutral::False),
    ("audio", Neutral::Empty),
    ("modalities", Neutral::TextOnly),
    ("web_search_options", Neutral::Empty),
    // llama-server
    ("n_cmpl", Neutral::AtMost(1.0)),
    ("mirostat", Neutral::AtMost(0.0)),
    ("typical_p", Neutral::AtLeast(1.0)),
    ("dynatemp_range", Neutral::AtMost(0.0)),
    ("dry_multiplier", Neutral::AtMost(0.0)),
    ("xtc_probability", Neutral::AtMost(0.0)),
    ("top_n_sigma", Neutral::AtMost(0.0)),
    ("adaptive_target", Neutral::Below(0.0)),
    ("min_keep", Neutral::AtMost(1.0)),
    ("n_indent", Neutral::AtMost(0.0)),
    ("t_max_predict_ms", Neutral::AtMost(0.0)),
    ("samplers", Neutral::DefaultSamplers),
    ("lora", Neutral::Empty),
    ("continue_final_message", Neutral::False),
    ("return_tokens", Neutral::False),
    ("response_fields", Neutral::Empty),
    ("reasoning_budget_tokens", Neutral::Below(0.0)),
    // Thoughts stay in the content, as llama.cpp's `none` leaves them.
    ("reasoning_format", Neutral::Is("none")),
];

/// llama.cpp's default sampler chain by name (common/common.h), and the
/// ones among them this server never enables.
const DEFAULT_SAMPLERS: &[&str] = &[
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
];
const OFF_SAMPLERS: &[&str] = &["dry", "top_n_sigma", "typ_p", "xtc"];
/// The same chain as llama.cpp's one-letter codes, and the letters of the
/// samplers that are off.
const DEFAULT_SAMPLER_CHARS: &str = "edskypmxt";
const OFF_SAMPLER_CHARS: &str = "dsyx";

impl Neutral {
    fn holds(self, v: &Value) -> bool {
        if v.is_null() {
            return true;
        }
        let num = v.as_f64();
        match self {
            Neutral::False => v == &Value::Bool(false),
            Neutral::AtMost(x) => num.is_some_and(|n| n <= x),
            Neutral::AtLeast(x) => num.is_some_and(|n| n >= x),
            Neutral::Below(x) => num.is_some_and(|n| n < x),
            Neutral::Empty => match v {
                Value::String(s) => s.is_empty(),
                Value::Array(a) => a.is_empty(),
                Value::Object(o) => o.is_empty(),
                _ => false,
            },
            Neutral::TextOnly => v == &serde_json::json!(["text"]),
            Neutral::Is(s) => v.as_str() == Some(s),
            Neutral::DefaultSamplers => match v {
                Value::String(s) => {
                    let on: String = s
                        .chars()
                        .filter(|c| !OFF_SAMPLER_CHARS.contains(*c))
                        .collect();
                    let want: String = DEFAULT_SAMPLER_CHARS
                        .chars()
                        .filter(|c| !OFF_SAMPLER_CHARS.contains(*c))
                        .collect();
                    on == want
                }
                Value::Array(a) => {
                    let on: Option<Vec<&str>> = a
                        .iter()
                        .map(Value::as_str)
                        .filter(|s| !s.is_some_and(|s| OFF_SAMPLERS.contains(&s)))
                        .collect();
                    let want: Vec<&str> = DEFAULT_SAMPLERS
                        .iter()
                        .copied()
                        .filter(|s| !OFF_SAMPLERS.contains(s))
                        .collect();
                    on == Some(want)
                }
                _ => false,
            },
        }
    }

    /// How to make the request acceptable.
    fn hint(self) -> String {
        match self {
            Neutral::False => "false".into(),
            Neutral::AtMost(x) => format!("at most {x}"),
            Neutral::AtLeast(x) => format!("at least {x}"),
            Neutral::Below(x) => format!("below {x}"),
            Neutral::Empty => "empty".into(),
            Neutral::TextOnly => "[\"text\"]".into(),
            Neutral::Is(s) => format!("{s:?}"),
            Neutral::DefaultSamplers => {
                format!("the default order {DEFAULT_SAMPLERS:?} (\"{DEFAULT_SAMPLER_CHARS}\")")
            }
        }
    }
}

/// A 400 naming the first field of `body` (a JSON object) that this server
/// would have to ignore; `Ok` for anything else, including bodies that are
/// not objects (their parse reports those).
pub fn refuse_unimplemented(body: &Bytes) -> Result<(), ApiError> {
    let Ok(Value::Object(map)) =
        crate::fields::pick_fields(body, &FIELDS.iter().map(|f| f.0).collect::<Vec<_>>())
    else {
        return Ok(());
    };
    for &(field, neutral) in FIELDS {
        if let Some(v) = map.get(field) {
            if !neutral.holds(v) {
                return Err(ApiError::invalid_field(
                    field,
                    format!(
                        "`{field}`: {v} is not supported by this server (it would change the output); leave it out or make it {}",
                        neutral.hint()
                    ),
                ));
            }
        }
    }
    Ok(())
}
