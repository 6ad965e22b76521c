//! OpenAI tools on `/v1/chat/completions`, as llama-server handles them:
//! `tools` are rendered into the chat template, the reply is parsed in the
//! tool-call syntax of the template's family ([`ToolFormat`]) into
//! `message.tool_calls` (`finish_reason: "tool_calls"`), streamed as
//! `delta.tool_calls`. `tool_choice: "required"` or a named function is
//! enforced by a grammar that admits only calls of the declared functions
//! with arguments matching their schemas; `"none"` renders no tools and
//! parses nothing.

use longhaul::constrain::ConstraintSpec;
use longhaul::toolcall::{Parsed, Tool, ToolCall, ToolFormat};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::new_id;

/// How a chat request uses its tools.
pub struct ToolPlan {
    pub format: ToolFormat,
    /// The `tools` list given to the template.
    pub tools: Vec<Value>,
    /// The grammar of `required` / a named function.
    pub constraint: Option<ConstraintSpec>,
}

/// The declared functions of `tools` (OpenAI's `[{type: "function",
/// function: {name, description, parameters}}]`).
fn declared(tools: &[Value]) -> Result<Vec<Tool>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("function");
            if kind != "function" {
                return Err(ApiError::invalid_field(
                    "tools",
                    format!("tools[{i}]: type {kind:?} is not supported (only \"function\")"),
                ));
            }
            let f = t.get("function").ok_or_else(|| {
                ApiError::invalid_field("tools", format!("tools[{i}] has no `function`"))
            })?;
            let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid_field("tools", format!("tools[{i}].function has no `name`"))
            })?;
            let parameters = f
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            Ok(Tool {
                name: name.to_string(),
                parameters,
            })
        })
        .collect()
}

/// The plan for a request's `tools`, `tool_choice` and
/// `parallel_tool_calls` with the model's template source; `None` when no
/// tools are in play (none given, or `tool_choice: "none"`).
/// `structured`: the request also asks for a grammar or schema (refused
/// alongside tools, as llama-server refuses a grammar with tools).
pub fn plan(
    tools: Option<&[Value]>,
    tool_choice: Option<&Value>,
    parallel: Option<bool>,
    template: Option<&str>,
    structured: bool,
) -> Result<Option<ToolPlan>, ApiError> {
    let tools = tools.unwrap_or(&[]);
    let choice = match tool_choice {
        None | Some(Value::Null) => "auto".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => match v.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => {
                format!("function:{name}")
            }
            _ => {
                return Err(ApiError::invalid_field(
                    "tool_choice",
                    "tool_choice is \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ))
            }
        },
    };
    if !matches!(choice.as_str(), "auto" | "none" | "required") && !choice.starts_with("function:")
    {
        return Err(ApiError::invalid_field(
            "tool_choice",
            format!("tool_choice {choice:?} is not one of \"auto\", \"none\", \"required\" or a named function"),
        ));
    }
    if tools.is_empty() {
        if choice == "required" || choice.starts_with("function:") {
            return Err(ApiError::invalid_field(
                "tool_choice",
                "tool_choice asks for a tool call but `tools` is empty",
            ));
        }
        return Ok(None);
    }
    if choice == "none" {
        return Ok(None);
    }
    let decl = declared(tools)?;
    if structured {
        return Err(ApiError::invalid_field(
            "grammar",
            "a grammar, json_schema or response_format cannot be combined with tools",
        ));
    }
    let format = template.and_then(ToolFormat::detect).ok_or_else(|| {
        ApiError::invalid_field(
            "tools",
            "the model's chat template has no tool-call syntax this server knows (Qwen/Hermes <tool_call>, gpt-oss, Llama 3.x, DeepSeek); start it with --chat-template-file naming a tool-capable template",
        )
    })?;
    let parallel = parallel.unwrap_or(true);
    let constraint = if choice == "required" {
        Some(format.grammar(&decl, parallel))
    } else if let Some(name) = choice.strip_prefix("function:") {
        let Some(t) = decl.iter().find(|t| t.name == name) else {
            return Err(ApiError::invalid_field(
                "tool_choice",
                format!("tool_choice names {name:?}, which is not among `tools`"),
            ));
        };
        Some(format.grammar(std::slice::from_ref(t), false))
    } else {
        None
    };
    Ok(Some(ToolPlan {
        format,
        tools: tools.to_vec(),
        constraint,
    }))
}

/// OpenAI's `tool_calls` entries for `calls` (`index` for stream deltas).
pub fn tool_calls_json(calls: &[ToolCall], with_index: bool) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "id": c.id.clone().unwrap_or_else(|| new_id("call")),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            });
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

/// The assistant `message` of a parsed reply.
pub fn message(p: &Parsed) -> Value {
    let mut m = json!({"role": "assistant"});
    if p.tool_calls.is_empty() {
        m["content"] = json!(p.content);
    } else {
        m["content"] = if p.content.is_empty() {
            Value::Null
        } else {
            json!(p.content)
        };
        m["tool_calls"] = json!(tool_calls_json(&p.tool_calls, false));
    }
    if let Some(r) = &p.reasoning {
        m["reasoning_content"] = json!(r);
    }
    m
}

/// A streamed reply in tools mode: content is passed on until a tool call
/// may have begun (the format's marker, or a tail that could become it);
/// the rest waits for the end, where it is parsed into tool-call deltas.
pub struct ToolStream {
    format: ToolFormat,
    text: String,
    emitted: usize,
    /// A call's marker was seen: nothing more is passed on as content.
    held: bool,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> Self {
        Self {
            format,
            text: String::new(),
            emitted: 0,
            held: false,
        }
    }

    /// Takes a piece of text; returns the content that can be sent now.
    pub fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        if self.held {
            return String::new();
        }
        let Some(marker) = self.format.call_marker() else {
            // The whole reply may be the call.
            self.held = true;
            return String::new();
        };
        let end = match self.text[self.emitted..].find(marker) {
            Some(p) => {
                self.held = true;
                self.emitted + p
            }
            None => {
                let hold = (1..marker.len())
                    .filter(|&k| marker.is_char_boundary(k) && self.text.ends_with(&marker[..k]))
                    .max()
                    .unwrap_or(0);
                self.text.len() - hold
            }
        };
        let out = self.text[self.emitted..end.max(self.emitted)].to_string();
        self.emitted = end.max(self.emitted);
        out
    }

    /// The end of the reply: the deltas still to send (content left over,
    /// or the tool calls) and whether there were tool calls.
    pub fn finish(&mut self) -> (Vec<Value>, bool) {
        let parsed = self.format.parse(&self.text);
        if parsed.tool_calls.is_empty() {
            let rest = self.text[self.emitted..].to_string();
            self.emitted = self.text.len();
            let v = if rest.is_empty() {
                vec![]
            } else {
                vec![json!({"content": rest})]
            };
            return (v, false);
        }
        let mut out = Vec::new();
        if self.emitted == 0 && !parsed.content.is_empty() {
            out.push(json!({"content": parsed.content}));
        }
        for call in tool_calls_json(&parsed.tool_calls, true) {
            out.push(json!({"tool_calls": [call]}));
        }
        (out, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_passes_content_and_holds_a_call() {
        let mut ts = ToolStream::new(ToolFormat::Hermes);
        let mut sent = String::new();
        for piece in [
            "Let me ",
            "check.\n<tool",
            "_call>\n{\"name\": \"f\", ",
            "\"arguments\": {\"x\": 1}}\n</tool_call>",
        ] {
            sent.push_str(&ts.push(piece));
        }
        // The tail "<tool" was held back until it turned out to be the marker.
        assert_eq!(sent, "Let me check.\n");
        let (deltas, called) = ts.finish();
        assert!(called);
        assert_eq!(deltas.len(), 1);
        let call = &deltas[0]["tool_calls"][0];
        assert_eq!(call["index"], 0);
        assert_eq!(call["function"]["name"], "f");
        assert_eq!(call["function"]["arguments"], "{\"x\":1}");
    }

    #[test]
    fn stream_without_a_call_sends_everything() {
        let mut ts = ToolStream::new(ToolFormat::Hermes);
        let mut sent = ts.push("a < b and <to");
        sent.push_str(&ts.push("day"));
        let (deltas, called) = ts.finish();
        assert!(!called);
        for d in deltas {
            sent.push_str(d["content"].as_str().unwrap());
        }
        assert_eq!(sent, "a < b and <today");
    }

    #[test]
    fn plan_checks_tool_choice() {
        let tools = vec![
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}),
        ];
        let tmpl = Some("{{'<tool_call>'}}");
        let p = plan(
            Some(&tools),
            Some(&json!("required")),
            Some(false),
            tmpl,
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.format, ToolFormat::Hermes);
        assert!(p.constraint.is_some());
        let p = plan(Some(&tools), None, None, tmpl, false)
            .unwrap()
            .unwrap();
        assert!(p.constraint.is_none(), "auto is not enforced");
        assert!(plan(Some(&tools), Some(&json!("none")), None, tmpl, false)
            .unwrap()
            .is_none());
        for bad in [
            json!("sometimes"),
            json!({"type": "function", "function": {"name": "g"}}),
            json!(3),
        ] {
            assert!(
                plan(Some(&tools), Some(&bad), None, tmpl, false).is_err(),
                "{bad}"
            );
        }
        assert!(plan(Some(&tools), None, None, Some("{{'<|im_start|>'}}"), false).is_err());
        assert!(plan(Some(&tools), Some(&json!("required")), None, tmpl, true).is_err());
        assert!(plan(None, Some(&json!("required")), None, tmpl, false).is_err());
    }
}
