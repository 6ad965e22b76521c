//! Chat templates: the Jinja template in `tokenizer.chat_template`, rendered
//! with minijinja the way Hugging Face transformers renders it (trim_blocks,
//! lstrip_blocks, loop controls) and with the globals HF templates expect:
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
//! `raise_exception(msg)`, `strftime_now(fmt)`, the `tojson` filter and
//! Python string/dict methods (`.strip()`, `.startswith()`, `.items()`, ...)
//! through minijinja-contrib's pycompat.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{context, Environment, Error, ErrorKind};

use crate::gguf::{GgufError, Metadata};

/// Errors of loading or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("chat template metadata: {0}")]
    Metadata(#[from] GgufError),
    #[error("the chat template does not parse: {0}; pass a template of your own (e.g. --chat-template-file)")]
    Syntax(String),
    #[error("rendering the chat template failed: {0}")]
    Render(String),
}

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant message's tool calls in OpenAI's shape (`{id, type,
    /// function: {name, arguments}}`), given to the template as they are.
    pub tool_calls: Vec<serde_json::Value>,
    /// A `tool` message: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// A `tool` message: the function's name, where the client gave it.
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    /// The message as the template sees it: `role`, `content`, and
    /// `tool_calls`, `tool_call_id`, `name` where set.
    fn to_value(&self) -> minijinja::Value {
        let mut m = serde_json::Map::new();
        m.insert("role".into(), self.role.clone().into());
        m.insert("content".into(), self.content.clone().into());
        if !self.tool_calls.is_empty() {
            m.insert("tool_calls".into(), self.tool_calls.clone().into());
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), id.clone().into());
        }
        if let Some(n) = &self.name {
            m.insert("name".into(), n.clone().into());
        }
        minijinja::Value::from_serialize(serde_json::Value::Object(m))
    }
}

/// A compiled chat template with the BOS/EOS texts it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts the template
    /// sees under those names.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self, ChatTemplateError> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        Ok(Self {
            env,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// The template in `tokenizer.chat_template`, or `None` when the file has
    /// none. BOS/EOS texts come from `tokenizer.ggml.{bos,eos}_token_id`.
    pub fn from_metadata(md: &Metadata) -> Result<Option<Self>, ChatTemplateError> {
        Self::from_metadata_or(md, None)
    }

    /// `source` (`--chat-template`, `--chat-template-file`) when given, else
    /// the file's `tokenizer.chat_template`; BOS/EOS texts from the file.
    pub fn from_metadata_or(
        md: &Metadata,
        source: Option<&str>,
    ) -> Result<Option<Self>, ChatTemplateError> {
        let source = match source {
            Some(s) => s.to_string(),
            None => match md.opt("tokenizer.chat_template", Metadata::get_str)? {
                Some(s) => s.to_string(),
                None => return Ok(None),
            },
        };
        let tokens = md
            .opt("tokenizer.ggml.tokens", Metadata::get_str_array)?
            .unwrap_or_default();
        let text_of = |key: &str| -> Result<String, ChatTemplateError> {
            let id = md.opt(key, Metadata::get_i64)?;
            Ok(id
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| tokens.get(i))
                .map(|s| s.to_string())
                .unwrap_or_default())
        };
        let bos = text_of("tokenizer.ggml.bos_token_id")?;
        let eos = text_of("tokenizer.ggml.eos_token_id")?;
        Self::new(source, bos, eos).map(Some)
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends with
    /// the opening of an assistant turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// [`Self::render`] with `tools` (OpenAI's list of `{type, function}`
    /// objects) given to the template as `tools`; `None` leaves it undefined.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&[serde_json::Value]>,
    ) -> Result<String, ChatTemplateError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatTemplateError::Render(describe(&e)))?;
        let messages: Vec<minijinja::Value> = messages.iter().map(ChatMessage::to_value).collect();
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        // Without tools the name stays undefined, as transformers leaves it.
        let ctx = match tools {
            Some(t) => context! { tools => minijinja::Value::from_serialize(t), ..ctx },
            None => ctx,
        };
        tmpl.render(ctx)
            .map_err(|e| ChatTemplateError::Render(describe(&e)))
    }
}

/// An error with its chain of causes on one line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// `raise_exception(msg)`: templates use it to reject conversations.
fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)`: the current UTC time formatted like C `strftime`
/// (`%Y %m %d %e %H %M %S %y %j %B %b %A %a %p %I %%`).
fn strftime_now(fmt: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime(&fmt, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
];

/// Days since 1970-01-01 -> (year, month 1..=12, day 1..=31).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn strftime(fmt: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (sod / 3600, sod / 60 % 60, sod % 60);
    let yday = days - days_from_year_start(y) + 1;
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hh + 11) % 12 + 1)),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('B') => out.push_str(month),
            Some('b') | Some('h') => out.push_str(&month[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since the epoch of January 1st of `year`.
fn days_from_year_start(year: i64) -> i64 {
    let y = year - 1;
    365 * (year - 1970) + (y / 4 - y / 100 + y / 400) - (1969 / 4 - 1969 / 100 + 1969 / 400)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3's template as published in its tokenizer_config.json.
    pub(crate) const GEMMA3_TEMPLATE: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
"#;

    fn msgs(v: &[(&str, &str)]) -> Vec<ChatMessage> {
        v.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
    }

    #[test]
    fn gemma3_template_renders_turns() {
        let t = ChatTemplate::new(GEMMA3_TEMPLATE, "<bos>", "<eos>").unwrap();
        let m = msgs(&[
            ("system", "Be brief."),
            ("user", " Hi "),
            ("assistant", "Hello!"),
            ("user", "Bye"),
        ]);
        let want = "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
                    <start_of_turn>model\nHello!<end_of_turn>\n\
                    <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n";
        assert_eq!(t.render(&m, true).unwrap(), want);
        let no_prompt = t.render(&m, false).unwrap();
        assert_eq!(
            no_prompt,
            want.strip_suffix("<start_of_turn>model\n").unwrap()
        );
    }

    #[test]
    fn raise_exception_becomes_a_render_error() {
        let t = ChatTemplate::new(GEMMA3_TEMPLATE, "<bos>", "<eos>").unwrap();
        let e = t
            .render(&msgs(&[("user", "a"), ("user", "b")]), true)
            .unwrap_err();
        assert!(matches!(e, ChatTemplateError::Render(_)));
        assert!(e.to_string().contains("must alternate"), "{e}");
    }

    #[test]
    fn python_methods_tojson_and_strftime_are_available() {
        let src = "{% for m in messages %}{% if m.content.startswith('x') %}{{ m.content.strip().upper() }}{% endif %}{% endfor %}|{{ messages[0] | tojson }}|{{ strftime_now('%Y') | length }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let out = t.render(&msgs(&[("user", "x y  ")]), false).unwrap();
        let (head, rest) = out.split_once('|').unwrap();
        let (json, year) = rest.rsplit_once('|').unwrap();
        assert_eq!(head, "X Y");
        assert_eq!(year, "4");
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v, serde_json::json!({"role": "user", "content": "x y  "}));
    }

    #[test]
    fn syntax_errors_are_typed() {
        let e = ChatTemplate::new("{% for %}", "", "").unwrap_err();
        assert!(matches!(e, ChatTemplateError::Syntax(_)));
    }

    #[test]
    fn strftime_formats_known_instants() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(
            strftime("%d %b %Y, %A %j %I%p %%", t),
            "29 Feb 2024, Thursday 060 01PM %"
        );
        assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
    }
}
