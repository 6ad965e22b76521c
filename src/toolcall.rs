//! Tool calls in the syntax of a chat-template family, as llama.cpp's
//! `common/chat.cpp` handles them: the family is detected from the
//! template's source, a finished reply is split into content and tool
//! calls, and a grammar admits only tool calls (for OpenAI's
//! `tool_choice: "required"` or a named function), each call naming a
//! declared function with arguments that match its JSON schema.
//!
//! Families, in the order the detection tries them:
//! - gpt-oss harmony: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>`;
//! - DeepSeek: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜><｜tool▁calls▁end｜>`
//!   (R1's `function<｜tool▁sep｜>NAME\n```json\n{ARGS}``` ` is read too);
//! - Qwen / Hermes: `<tool_call>\n{"name": NAME, "arguments": {ARGS}}\n</tool_call>`;
//! - Llama 3.x: the whole reply is `{"name": NAME, "parameters": {ARGS}}`.
//!
//! The module knows texts and JSON only: how a request spells its tools
//! belongs to the server.

use serde_json::{json, Value};

use crate::constrain::{json_options, ConstraintSpec};

/// A declared function: its name and the JSON schema of its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub parameters: Value,
}

/// One call found in a reply; `arguments` is JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
    /// The id the model wrote, if its format has one.
    pub id: Option<String>,
}

/// A reply split into its parts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub content: String,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

/// The tool-call syntax of a chat-template family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    GptOss,
    Llama3,
    DeepSeek,
}

const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";

impl ToolFormat {
    /// The family whose markers `template` (a chat template's source) uses.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("<|channel|>") {
            Some(ToolFormat::GptOss)
        } else if template.contains(DS_CALLS_BEGIN) {
            Some(ToolFormat::DeepSeek)
        } else if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if template.contains("<|start_header_id|>")
            && (template.contains("ipython") || template.contains("<|python_tag|>"))
        {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "Hermes 2 Pro",
            ToolFormat::GptOss => "GPT-OSS",
            ToolFormat::Llama3 => "Llama 3.x",
            ToolFormat::DeepSeek => "DeepSeek",
        }
    }

    /// The text that opens a tool call (a streamed reply holds its text
    /// back from there on); `None` where the whole reply is the call.
    pub fn call_marker(self) -> Option<&'static str> {
        match self {
            ToolFormat::Hermes => Some("<tool_call>"),
            ToolFormat::GptOss => Some("<|channel|>"),
            ToolFormat::DeepSeek => Some(DS_CALLS_BEGIN),
            ToolFormat::Llama3 => None,
        }
    }

    /// Whether the reply needs the model's special tokens rendered as text
    /// to be parsed (their markers are special tokens).
    pub fn needs_special_tokens(self) -> bool {
        matches!(self, ToolFormat::GptOss | ToolFormat::DeepSeek)
    }

    /// Splits a finished reply. Text that is not a well-formed call stays
    /// content.
    pub fn parse(self, text: &str) -> Parsed {
        match self {
            ToolFormat::Hermes => parse_hermes(text),
            ToolFormat::GptOss => parse_gpt_oss(text),
            ToolFormat::Llama3 => parse_llama3(text),
            ToolFormat::DeepSeek => parse_deepseek(text),
        }
    }

    /// A grammar that admits only tool calls of `tools` in this syntax:
    /// one call, or with `parallel` one or more.
    pub fn grammar(self, tools: &[Tool], parallel: bool) -> ConstraintSpec {
        let obj = |name_key: &str, args_key: &str| -> String {
            let alts: Vec<Value> = tools
                .iter()
                .map(|t| {
                    json!({
                        "type": "object",
                        "properties": {
                            name_key: {"const": t.name},
                            args_key: t.parameters,
                        },
                        "required": [name_key, args_key],
                        "additionalProperties": false,
                    })
                })
                .collect();
            json!({"anyOf": alts, "x-guidance": json_options()}).to_string()
        };
        let repeat = |call: &str, sep: &str| {
            if parallel {
                format!("{call} ({sep} {call})*")
            } else {
                call.to_string()
            }
        };
        let lark = match self {
            ToolFormat::Hermes => format!(
                "start: {}\ncall: \"<tool_call>\\n\" %json {} \"\\n</tool_call>\"\n",
                repeat("call", "\"\\n\""),
                obj("name", "arguments")
            ),
            ToolFormat::Llama3 => format!(
                "start: {}\ncall: %json {}\n",
                repeat("call", "\"; \""),
                obj("name", "parameters")
            ),
            ToolFormat::DeepSeek => {
                let alts = per_tool(tools, |t, schema| {
                    format!("{} \"<｜tool▁sep｜>\" %json {schema}", lark_str(&t.name))
                });
                format!(
                    "start: <｜tool▁calls▁begin｜> {} <｜tool▁calls▁end｜>\ncall: <｜tool▁call▁begin｜> ({alts}) <｜tool▁call▁end｜>\n",
                    repeat("call", "\"\"")
                )
            }
            ToolFormat::GptOss => {
                let alts = per_tool(tools, |t, schema| {
                    format!(
                        "{} <|constrain|> \"json\" <|message|> %json {schema}",
                        lark_str(&format!("commentary to=functions.{} ", t.name))
                    )
                });
                format!(
                    "start: {}\ncall: <|channel|> ({alts}) <|call|>\n",
                    repeat("call", "<|start|> \"assistant\"")
                )
            }
        };
        ConstraintSpec::Lark(lark)
    }
}

/// The alternatives of `f(tool, its schema)` joined with `|`.
fn per_tool(tools: &[Tool], f: impl Fn(&Tool, &str) -> String) -> String {
    tools
        .iter()
        .map(|t| {
            let mut schema = t.parameters.clone();
            if let Value::Object(o) = &mut schema {
                o.entry("x-guidance").or_insert_with(json_options);
            }
            f(t, &schema.to_string())
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// A Lark string literal (JSON syntax).
fn lark_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// `text` parsed as one JSON value followed only by whitespace; the value
/// and the rest after it otherwise.
fn json_prefix(text: &str) -> Option<(Value, &str)> {
    let mut it = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let v = it.next()?.ok()?;
    Some((v, &text[it.byte_offset()..]))
}

/// Arguments as JSON text: an object as written, a string as its content
/// (some models write the arguments as a JSON string).
fn arguments_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// A `{"name": .., <args_key>: ..}` object as a call.
fn call_from_object(v: &Value, args_keys: &[&str]) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = args_keys.iter().find_map(|k| v.get(*k))?;
    Some(ToolCall {
        name,
        arguments: arguments_text(args),
        id: v.get("id").and_then(Value::as_str).map(str::to_string),
    })
}

fn parse_hermes(text: &str) -> Parsed {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut calls = Vec::new();
    let mut content = String::new();
    let mut rest = text;
    while let Some(p) = rest.find(OPEN) {
        let inner = &rest[p + OPEN.len()..];
        let Some(end) = inner.find(CLOSE) else {
            break;
        };
        let body = inner[..end].trim();
        let Some(call) = serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|v| call_from_object(&v, &["arguments", "parameters"]))
        else {
            break;
        };
        content.push_str(&rest[..p]);
        calls.push(call);
        rest = &inner[end + CLOSE.len()..];
    }
    content.push_str(rest);
    Parsed {
        content: content.trim().to_string(),
        reasoning: None,
        tool_calls: calls,
    }
}

fn parse_llama3(text: &str) -> Parsed {
    let mut calls = Vec::new();
    let mut rest = text.trim_start();
    rest = rest.strip_prefix("<|python_tag|>").unwrap_or(rest);
    while rest.starts_with('{') {
        let Some((v, after)) = json_prefix(rest) else {
            break;
        };
        let Some(call) = call_from_object(&v, &["parameters", "arguments"]) else {
            break;
        };
        calls.push(call);
        rest = after.trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    if calls.is_empty() || !rest.is_empty() {
        return Parsed {
            content: text.trim().to_string(),
            ..Default::default()
        };
    }
    Parsed {
        tool_calls: calls,
        ..Default::default()
    }
}

/// `<think>..</think>` before the reply, split off.
fn split_think(text: &str) -> (Option<String>, &str) {
    match text.find("</think>") {
        Some(p) => {
            let r = text[..p].trim();
            let r = r.strip_prefix("<think>").unwrap_or(r).trim();
            (Some(r.to_string()), &text[p + "</think>".len()..])
        }
        None => (None, text),
    }
}

fn parse_deepseek(text: &str) -> Parsed {
    let (reasoning, text) = split_think(text);
    let Some(p) = text.find(DS_CALLS_BEGIN) else {
        return Parsed {
            content: text.trim().to_string(),
            reasoning,
            tool_calls: Vec::new(),
        };
    };
    let mut calls = Vec::new();
    let mut rest = &text[p + DS_CALLS_BEGIN.len()..];
    loop {
        rest = rest.trim_start();
        let Some(r) = rest.strip_prefix(DS_CALL_BEGIN) else {
            break;
        };
        let Some(end) = r.find(DS_CALL_END) else {
            break;
        };
        let Some((head, body)) = r[..end].split_once(DS_SEP) else {
            break;
        };
        // R1: `function<sep>NAME\n```json\nARGS````; V3: `NAME<sep>ARGS`.
        let (name, args) = if head == "function" {
            match body.split_once('\n') {
                Some((n, a)) => (n.trim(), a),
                None => break,
            }
        } else {
            (head.trim(), body)
        };
        let args = args.trim();
        let args = args
            .strip_prefix("```json")
            .map(|a| a.trim_end().trim_end_matches("```"))
            .unwrap_or(args)
            .trim();
        let Ok(v) = serde_json::from_str::<Value>(args) else {
            break;
        };
        calls.push(ToolCall {
            name: name.to_string(),
            arguments: arguments_text(&v),
            id: None,
        });
        rest = &r[end + DS_CALL_END.len()..];
    }
    Parsed {
        content: text[..p].trim().to_string(),
        reasoning,
        tool_calls: calls,
    }
}

fn parse_gpt_oss(text: &str) -> Parsed {
    let mut out = Parsed::default();
    let mut reasoning = String::new();
    // Messages are `HEADER<|message|>BODY`, ended by <|end|>, <|call|> or
    // the next <|start|>; the first one's role header is already in the
    // prompt (`<|start|>assistant`), so it may begin with ` to=...`.
    for msg in text.split("<|start|>") {
        let msg = msg.strip_prefix("assistant").unwrap_or(msg);
        let Some((header, body)) = msg.split_once("<|message|>") else {
            if !msg.trim().is_empty() {
                out.content.push_str(msg);
            }
            continue;
        };
        let body = body.split("<|end|>").next().unwrap_or(body);
        let body = body.split("<|call|>").next().unwrap_or(body);
        if let Some(p) = header.find("to=functions.") {
            let name: String = header[p + "to=functions.".len()..]
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '<')
                .collect();
            let args = serde_json::from_str::<Value>(body.trim())
                .map(|v| arguments_text(&v))
                .unwrap_or_else(|_| body.trim().to_string());
            out.tool_calls.push(ToolCall {
                name,
                arguments: args,
                id: None,
            });
        } else if header.contains("<|channel|>analysis") {
            reasoning.push_str(body);
        } else {
            out.content.push_str(body);
        }
    }
    out.content = out.content.trim().to_string();
    if !reasoning.is_empty() {
        out.reasoning = Some(reasoning);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: args.into(),
            id: None,
        }
    }

    // The texts below are the ones llama.cpp's tests/test-chat.cpp feeds
    // its parsers for each family.

    #[test]
    fn hermes_calls_and_content() {
        let p = ToolFormat::Hermes.parse(
            "<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>",
        );
        assert_eq!(p.tool_calls, vec![call("special_function", "{\"arg1\":1}")]);
        assert_eq!(p.content, "");
        let p = ToolFormat::Hermes.parse("Hello, world!\nWhat's up?\n<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>");
        assert_eq!(p.content, "Hello, world!\nWhat's up?");
        assert_eq!(p.tool_calls.len(), 1);
        let p = ToolFormat::Hermes.parse("<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"special_function_with_opt\", \"arguments\": {\"arg1\": 1, \"arg2\": 2}}\n</tool_call>");
        assert_eq!(
            p.tool_calls,
            vec![
                call("special_function", "{\"arg1\":1}"),
                call("special_function_with_opt", "{\"arg1\":1,\"arg2\":2}")
            ]
        );
        let plain = ToolFormat::Hermes.parse("Hello, world!\nWhat's up?");
        assert_eq!(plain.content, "Hello, world!\nWhat's up?");
        assert!(plain.tool_calls.is_empty());
        // Cut off inside the arguments: no call, the text stays.
        let cut = ToolFormat::Hermes
            .parse("<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg");
        assert!(cut.tool_calls.is_empty());
        assert!(cut.content.starts_with("<tool_call>"));
    }

    #[test]
    fn gpt_oss_channels() {
        let f = ToolFormat::GptOss;
        assert_eq!(
            f.parse("<|channel|>final<|message|>Hello, world!\nWhat's up?")
                .content,
            "Hello, world!\nWhat's up?"
        );
        let p = f.parse("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?");
        assert_eq!(p.content, "Hello, world!\nWhat's up?");
        assert_eq!(p.reasoning.as_deref(), Some("I'm\nthinking"));
        for text in [
            " to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
            "<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}",
            " to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}",
            "<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}",
        ] {
            let p = f.parse(text);
            assert_eq!(p.tool_calls, vec![call("special_function", "{\"arg1\":1}")], "{text}");
            assert_eq!(p.content, "", "{text}");
        }
        let p = f.parse("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}");
        assert_eq!(p.tool_calls, vec![call("special_function", "{\"arg1\":1}")]);
        assert_eq!(p.reasoning.as_deref(), Some("I'm\nthinking"));
    }

    #[test]
    fn deepseek_v3_and_r1() {
        let f = ToolFormat::DeepSeek;
        let p = f.parse("REASONING</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"Tokyo\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
        assert_eq!(p.tool_calls, vec![call("get_time", "{\"city\":\"Tokyo\"}")]);
        assert_eq!(p.reasoning.as_deref(), Some("REASONING"));
        let p = f.parse("REASONING</think>CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
        assert_eq!(p.content, "CONTENT");
        assert_eq!(
            p.tool_calls,
            vec![
                call("get_time", "{\"city\":\"Paris\"}"),
                call("get_weather", "{\"city\":\"Paris\"}")
            ]
        );
        let p = f.parse("I'm\nthinking</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
        assert_eq!(p.tool_calls, vec![call("special_function", "{\"arg1\":1}")]);
    }

    #[test]
    fn llama3_json_calls() {
        let f = ToolFormat::Llama3;
        let p = f.parse("{\"type\": \"function\", \"name\": \"special_function\", \"parameters\": {\"arg1\": 1}}");
        assert_eq!(p.tool_calls, vec![call("special_function", "{\"arg1\":1}")]);
        let p = f.parse("{\"name\": \"special_function\", \"parameters\": {\"arg1\": 1}}");
        assert_eq!(p.tool_calls, vec![call("special_function", "{\"arg1\":1}")]);
        let p = f.parse("Hello, world!\nWhat's up?");
        assert!(p.tool_calls.is_empty());
        assert_eq!(p.content, "Hello, world!\nWhat's up?");
        // JSON that is not a call is content.
        assert!(f.parse("{\"answer\": 42}").tool_calls.is_empty());
    }

    #[test]
    fn detection_from_template_markers() {
        let qwen = include_str!("../tests/fixtures/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
        assert_eq!(ToolFormat::detect(qwen), Some(ToolFormat::Hermes));
        assert_eq!(
            ToolFormat::detect("{{'<|start|>assistant<|channel|>final<|message|>'}}"),
            Some(ToolFormat::GptOss)
        );
        assert_eq!(
            ToolFormat::detect("{{'<｜tool▁calls▁begin｜>'}}"),
            Some(ToolFormat::DeepSeek)
        );
        assert_eq!(
            ToolFormat::detect("{{'<|start_header_id|>ipython<|end_header_id|>'}}"),
            Some(ToolFormat::Llama3)
        );
        assert_eq!(ToolFormat::detect("{{'<|im_start|>'}}"), None);
    }
}
