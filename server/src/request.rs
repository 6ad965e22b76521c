//! Request bodies: field types shared by the endpoints, and the checks that
//! turn them into a [`GenRequest`]. Every check answers a 400 that names the
//! field; nothing here panics on input.

use axum::body::Bytes;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use longhaul::sample::{SampleParamError, SamplerParams};
use longhaul::tokenizer::ChatMessage;

use crate::error::ApiError;
use crate::EngineInfo;

/// Parses a JSON body (400 for bad syntax, 422 for the wrong shape).
pub fn parse_json<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(ApiError::from_json)
}

/// `stop`: one string or a list of them.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        let v = match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        };
        v.into_iter().filter(|s| !s.is_empty()).collect()
    }
}

/// One prompt element: text or a token id (llama.cpp accepts lists mixing both).
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum PromptPart {
    Token(u32),
    Text(String),
}

/// `prompt`: a string, a list of token ids, or (OpenAI) a one-element list
/// of either.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Parts(Vec<PromptPart>),
    Batch(Vec<Vec<PromptPart>>),
}

impl PromptField {
    /// Tokenises the prompt: text as llama.cpp does (BOS per the model,
    /// special tokens parsed), token ids as given after a range check.
    pub fn tokenize(self, engine: &dyn EngineInfo) -> Result<Vec<u32>, ApiError> {
        let parts = match self {
            PromptField::Text(s) => vec![PromptPart::Text(s)],
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
        let n_text = parts
            .iter()
            .filter(|p| matches!(p, PromptPart::Text(_)))
            .count();
        let all_text = n_text == parts.len();
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
        let n_vocab = tok.n_vocab();
        let mut out = Vec::new();
        for (i, p) in parts.into_iter().enumerate() {
            match p {
                PromptPart::Token(id) => {
                    if id as usize >= n_vocab {
                        return Err(ApiError::invalid_field(
                            "prompt",
                            format!("token id {id} is out of range (the vocabulary has {n_vocab} tokens)"),
                        ));
                    }
                    out.push(id);
                }
                PromptPart::Text(s) => {
                    let ids = tok
                        .encode(&s, i == 0, true)
                        .map_err(|e| ApiError::invalid_field("prompt", e.to_string()))?;
                    out.extend(ids);
                }
            }
        }
        Ok(out)
    }
}

/// A chat message's `content`: a string or a list of parts.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum ContentField {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug, Clone)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
pub struct MessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<ContentField>,
    /// An assistant message's tool calls (OpenAI's shape).
    #[serde(default)]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` message: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// Tool calls as a chat template reads them: each `function.arguments`
/// JSON string (OpenAI's spelling) parsed into its object, as llama.cpp
/// does for templates that write `arguments | tojson`.
fn template_tool_calls(calls: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    calls
        .into_iter()
        .map(|mut c| {
            if let Some(args) = c.pointer_mut("/function/arguments") {
                if let Some(parsed) = args
                    .as_str()
                    .and_then(|a| serde_json::from_str::<serde_json::Value>(a).ok())
                {
                    *args = parsed;
                }
            }
            c
        })
        .collect()
}

/// Checks the messages and converts them for the chat template.
pub fn chat_messages(msgs: Vec<MessageIn>) -> Result<Vec<ChatMessage>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::invalid_field(
            "messages",
            "`messages` is empty; give at least one message",
        ));
    }
    msgs.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match m.content {
                None => String::new(),
                Some(ContentField::Text(s)) => s,
                Some(ContentField::Parts(parts)) => {
                    let mut s = String::new();
                    for p in parts {
                        match (p.kind.as_str(), p.text) {
                            ("text", Some(t)) => s.push_str(&t),
                            (kind, _) => {
                                return Err(ApiError::invalid_field(
                                    "messages",
                                    format!("messages[{i}]: content parts of type `{kind}` are not supported (text only)"),
                                ))
                            }
                        }
                    }
                    s
                }
            };
            let mut msg = ChatMessage::new(m.role, content);
            msg.tool_calls = template_tool_calls(m.tool_calls.unwrap_or_default());
            msg.tool_call_id = m.tool_call_id;
            msg.name = m.name;
            Ok(msg)
        })
        .collect()
}

/// Tokenises a rendered chat prompt: the template spells out BOS itself.
pub fn tokenize_rendered(engine: &dyn EngineInfo, text: &str) -> Result<Vec<u32>, ApiError> {
    engine
        .tokenizer()
        .encode(text, false, true)
        .map_err(|e| ApiError::invalid_field("messages", e.to_string()))
}

/// Renders `messages` through the model's template (400 if it has none or
/// the template refuses them, e.g. a `raise_exception` on a bad role order).
pub fn render_chat(
    engine: &dyn EngineInfo,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<String, ApiError> {
    engine
        .apply_template(messages, add_generation_prompt)
        .map_err(|e| ApiError::invalid_field("messages", e.to_string()))
}

/// Sampling fields common to every generation endpoint (`None` = the
/// server's default from the command line).
#[derive(Default, Debug, Clone, serde::Deserialize)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_k: Option<i32>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i32>,
    pub seed: Option<i64>,
}

impl Sampling {
    /// The request's settings over `defaults`, checked by the validator
    /// the CLI also uses ([`SamplerParams::validate`]): a refused value is
    /// a 400 naming its field.
    pub fn params(&self, defaults: &SamplerParams) -> Result<SamplerParams, ApiError> {
        let invalid = |e: SampleParamError| ApiError::invalid_field(e.field(), e.to_string());
        let mut p = defaults.clone();
        if let Some(v) = self.temperature {
            p.temp = v;
        }
        if let Some(v) = self.top_k {
            p.top_k = v;
        }
        if let Some(v) = self.top_p {
            p.top_p = v;
        }
        if let Some(v) = self.min_p {
            p.min_p = v;
        }
        if let Some(v) = self.repeat_penalty {
            p.repeat_penalty = v;
        }
        if let Some(v) = self.repeat_last_n {
            p.repeat_last_n = v;
        }
        if let Some(s) = self.seed {
            p.seed = SamplerParams::seed_from_i64(s).map_err(invalid)?;
        }
        p.validate().map_err(invalid)?;
        Ok(p)
    }
}

/// A token budget field: `None` and `-1` mean "until the context is full".
pub fn n_predict(field: &str, v: Option<i64>) -> Result<usize, ApiError> {
    match v {
        None | Some(-1) => Ok(usize::MAX),
        Some(n) if n >= 0 => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        Some(n) => Err(ApiError::invalid_field(
            field,
            format!("{field} {n} is invalid: give a count >= 0 (-1 = no limit)"),
        )),
    }
}
