//! Chat templates: the Jinja template in `tokenizer.chat_template`, rendered
//! with minijinja the way Hugging Face transformers renders it (trim_blocks,
//! lstrip_blocks, loop controls) and with the globals HF templates expect:
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
//! `enable_thinking` (as llama.cpp sets it: [`ChatTemplate::thinks`]), the
//! `chat_template_kwargs` ([`TemplateKwargs`]), `raise_exception(msg)`,
//! `strftime_now(fmt)`, the `tojson` filter (as transformers defines it:
//! `tojson.rs`) and
//! Python string/dict methods (`.strip()`, `.startswith()`, `.items()`, ...)
//! through minijinja-contrib's pycompat.

use std::collections::BTreeMap;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind};

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
    #[error("{0}")]
    Kwargs(String),
}

/// Names given to the template beside the conversation: llama.cpp's
/// `chat_template_kwargs` (`--chat-template-kwargs`, `--reasoning`,
/// `--reasoning-effort` and the request's field of that name). Each replaces
/// the renderer's name it shares (`enable_thinking`, even `messages`), as in
/// llama.cpp (`extra_context` in common/chat.cpp).
pub type TemplateKwargs = serde_json::Map<String, serde_json::Value>;

/// What a render takes beside the messages.
#[derive(Clone, Copy, Debug, Default)]
pub struct TemplateArgs<'a> {
    /// OpenAI's list of `{type, function}` tools, given as `tools`; `None`
    /// leaves the name undefined, as transformers does.
    pub tools: Option<&'a [serde_json::Value]>,
    /// The request's `chat_template_kwargs`, over the template's defaults.
    pub kwargs: Option<&'a TemplateKwargs>,
    /// OpenAI's `reasoning_effort`, as llama-server reads it: `"none"` sets
    /// `enable_thinking` to false and drops a `reasoning_effort` kwarg, any
    /// other level is given to the template as `reasoning_effort`.
    pub reasoning_effort: Option<&'a str>,
}

/// Checks `kwargs` as llama-server does before it renders: `enable_thinking`
/// must not be a string (`"false"` would be true to the template).
pub fn check_kwargs(kwargs: &TemplateKwargs) -> Result<(), ChatTemplateError> {
    match kwargs.get("enable_thinking") {
        Some(serde_json::Value::String(_)) => Err(ChatTemplateError::Kwargs(
            "invalid type for \"enable_thinking\" (expected boolean, got string)".into(),
        )),
        _ => Ok(()),
    }
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
    /// An assistant message's thoughts (`reasoning_content`), which
    /// thinking templates write back into the conversation.
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }

    /// The message as the template sees it: `role`, `content`, and
    /// `reasoning_content` (where not empty, as llama.cpp gives it),
    /// `tool_calls`, `tool_call_id`, `name` where set. For gpt-oss's
    /// template the thoughts are also its `thinking`, and an assistant's
    /// tool call with thoughts has no `content` (the template refuses
    /// both), as llama.cpp gives them (common/parsers/gpt-oss.cpp).
    fn to_value(&self, gpt_oss: bool) -> minijinja::Value {
        let mut m = serde_json::Map::new();
        m.insert("role".into(), self.role.clone().into());
        m.insert("content".into(), self.content.clone().into());
        let reasoning = self.reasoning_content.as_ref().filter(|r| !r.is_empty());
        if let Some(r) = reasoning {
            m.insert("reasoning_content".into(), r.clone().into());
        }
        if !self.tool_calls.is_empty() {
            m.insert("tool_calls".into(), self.tool_calls.clone().into());
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), id.clone().into());
        }
        if let Some(n) = &self.name {
            m.insert("name".into(), n.clone().into());
        }
        if let (true, Some(r)) = (gpt_oss, reasoning) {
            m.insert("thinking".into(), r.clone().into());
            if !self.tool_calls.is_empty() {
                m.remove("content");
            }
        }
        minijinja::Value::from(minijinja::value::Serde(serde_json::Value::Object(m)))
    }
}

/// A compiled chat template with the BOS/EOS texts it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// `--chat-template-kwargs`, `--reasoning`, `--reasoning-effort`.
    defaults: TemplateKwargs,
    /// See [`ChatTemplate::thinks`].
    thinks: bool,
    /// gpt-oss's template (llama.cpp's test: it writes `<|channel|>`),
    /// which reads a message's thoughts as `thinking`.
    gpt_oss: bool,
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

/// minijinja's budget for one render ("fuel": about one unit per
/// instruction and per 64 bytes of text the template builds), so that a
/// template from a file cannot loop for hours or grow a string until the
/// process is killed for memory: a runaway loop stops after 2-3 s, a
/// doubling string at 2.6 GB of memory (measured). Real templates spend far
/// less: 1,000 messages (600 KB) cost at most 230k units in 62 of the 64 of
/// llama.cpp's `models/templates` that render them, 4.5M in gemma-4-31B-it's
/// and 14.4M in Reka-Edge's (both quadratic in the messages: they reach the
/// bound past about 3,800 and 2,100 messages).
pub const TEMPLATE_FUEL: u64 = 1 << 26;

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
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", super::tojson::tojson);
        env.add_template_owned(NAME, without_generation_tags(&source))
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        let gpt_oss = source.contains("<|channel|>");
        let mut t = Self {
            env,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            defaults: TemplateKwargs::new(),
            thinks: false,
            gpt_oss,
        };
        t.thinks = t.probe_thinking();
        Ok(t)
    }

    /// The template with `defaults` under every request's kwargs
    /// (`--chat-template-kwargs`, `--reasoning on|off`, `--reasoning-effort`).
    pub fn with_defaults(mut self, defaults: TemplateKwargs) -> Result<Self, ChatTemplateError> {
        check_kwargs(&defaults)?;
        self.defaults = defaults;
        Ok(self)
    }

    /// Whether the template has a thinking mode, which llama-server then
    /// turns on: it gives every render `enable_thinking`, true where its
    /// template analysis finds a reasoning format and false elsewhere
    /// (`supports_thinking`, tools/server/server-context.cpp), while
    /// transformers leaves the name undefined unless asked. Here a template
    /// has one when a user's message opens a different assistant turn with
    /// `enable_thinking` true than with false (Qwen3's, DeepSeek-V3.1's and
    /// Laguna's do; Qwen2.5's does not). Where the two agree the value rarely
    /// matters, and such templates get false, as llama.cpp's non-thinking
    /// ones do.
    pub fn thinks(&self) -> bool {
        self.thinks
    }

    fn probe_thinking(&self) -> bool {
        let m = [ChatMessage::new("user", "test")];
        let with = |on: bool| {
            let kw = TemplateKwargs::from_iter([("enable_thinking".into(), on.into())]);
            let args = TemplateArgs {
                kwargs: Some(&kw),
                ..Default::default()
            };
            self.render_with(&m, true, &args).ok()
        };
        match (with(true), with(false)) {
            (Some(on), Some(off)) => on != off,
            _ => false,
        }
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

    /// Renders `messages` with the template's defaults; with
    /// `add_generation_prompt` the text ends with the opening of an
    /// assistant turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with(messages, add_generation_prompt, &TemplateArgs::default())
    }

    /// [`Self::render`] with a request's tools and kwargs. The names the
    /// template sees, each over the ones before it: `messages`,
    /// `add_generation_prompt`, `bos_token`, `eos_token`, `tools` (when
    /// given), `enable_thinking` ([`Self::thinks`], or false for
    /// `reasoning_effort: "none"`), the template's defaults, the request's
    /// kwargs, and `reasoning_effort` (a level other than `"none"`); the
    /// order of llama-server's `oaicompat_chat_params_parse`.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        args: &TemplateArgs<'_>,
    ) -> Result<String, ChatTemplateError> {
        if let Some(kw) = args.kwargs {
            check_kwargs(kw)?;
        }
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatTemplateError::Render(describe(&e)))?;
        let messages: Vec<minijinja::Value> =
            messages.iter().map(|m| m.to_value(self.gpt_oss)).collect();
        let mut names: BTreeMap<String, minijinja::Value> = BTreeMap::new();
        names.insert("messages".into(), messages.into());
        names.insert("add_generation_prompt".into(), add_generation_prompt.into());
        names.insert("bos_token".into(), self.bos_token.as_str().into());
        names.insert("eos_token".into(), self.eos_token.as_str().into());
        // Without tools the name stays undefined, as transformers leaves it.
        if let Some(t) = args.tools {
            names.insert(
                "tools".into(),
                minijinja::Value::from(minijinja::value::Serde(t)),
            );
        }
        let no_effort = args.reasoning_effort == Some("none");
        names.insert("enable_thinking".into(), (self.thinks && !no_effort).into());
        let request = args.kwargs.into_iter().flatten();
        for (k, v) in self.defaults.iter().chain(request) {
            names.insert(
                k.clone(),
                minijinja::Value::from(minijinja::value::Serde(v)),
            );
        }
        match args.reasoning_effort {
            Some("none") => {
                names.remove("reasoning_effort");
            }
            Some(level) if !level.is_empty() => {
                names.insert("reasoning_effort".into(), level.into());
            }
            _ => {}
        }
        let ctx = minijinja::Value::from(names);
        tmpl.render(ctx).map_err(|e| {
            let mut msg = describe(&e);
            if e.kind() == ErrorKind::OutOfFuel {
                msg += &format!(
                    " (the template did more than {TEMPLATE_FUEL} steps or built more \
                     than about 4 GiB of text: it loops without end, is hostile, or grows \
                     faster than the conversation; pass a template of your own, e.g. \
                     --chat-template-file)"
                );
            }
            ChatTemplateError::Render(msg)
        })
    }
}

/// `source` with each `{% generation %}` and `{% endgeneration %}` tag (the
/// block transformers uses to mark assistant tokens, in Laguna's templates
/// among others) made a statement that renders nothing, as transformers
/// renders the block's body unchanged and llama.cpp's parser takes both
/// tags as no-ops; minijinja knows neither. The tag keeps its delimiters,
/// so its whitespace control (`{%-`, `-%}`) and trim_blocks/lstrip_blocks
/// act as before: `{%- generation -%}` becomes `{%- if false %}{% endif -%}`.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        let after = &rest[open + 2..];
        let body = after.strip_prefix(['-', '+']).unwrap_or(after);
        let word_at = body.len() - body.trim_start().len();
        let word = &body[word_at..];
        let name_len = ["endgeneration", "generation"]
            .into_iter()
            .find(|n| {
                word.strip_prefix(n).is_some_and(|tail| {
                    let tail = tail.trim_start();
                    let tail = tail.strip_prefix(['-', '+']).unwrap_or(tail);
                    tail.starts_with("%}")
                })
            })
            .map(str::len);
        // Up to the tag's name, which is replaced, or past the `{%`.
        let keep = open + 2 + (after.len() - body.len()) + word_at;
        out.push_str(&rest[..keep]);
        match name_len {
            Some(n) => {
                out.push_str("if false %}{% endif");
                rest = &rest[keep + n..];
            }
            None => rest = &rest[keep..],
        }
    }
    out.push_str(rest);
    out
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

/// `strftime_now(fmt)`: the current local time formatted like C `strftime`
/// (see [`crate::clock::strftime_local_now`]).
fn strftime_now(fmt: String) -> Result<String, Error> {
    crate::clock::strftime_local_now(&fmt)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))
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
    fn generation_tags_render_their_body_with_their_whitespace_control() {
        let cases = [
            ("{%- generation -%}", "{%- if false %}{% endif -%}"),
            ("a{% endgeneration %}b", "a{% if false %}{% endif %}b"),
            ("{%+  generation\n-%}", "{%+  if false %}{% endif\n-%}"),
            // Not the tag: left as written.
            ("{% set generation = 1 %}", "{% set generation = 1 %}"),
            ("{% generations %}", "{% generations %}"),
            ("{{ '{%' }}", "{{ '{%' }}"),
        ];
        for (src, want) in cases {
            assert_eq!(without_generation_tags(src), want, "{src}");
        }
        let src = "{% for m in messages %}<{{ m.role }}>\n{%- generation -%}\n  {{ m.content }}\n{%- endgeneration %}\n</{{ m.role }}>\n{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let out = t
            .render(&msgs(&[("user", "a"), ("assistant", "b")]), false)
            .unwrap();
        assert_eq!(out, "<user>a</user>\n<assistant>b</assistant>\n");
    }

    /// transformers' renders (`tools/template_goldens.py`): every template
    /// of `tests/fixtures/templates` over four conversations (the last with
    /// an assistant's `reasoning_content`), each with
    /// `enable_thinking` true and false (and a `reasoning_effort` where the
    /// template reads one).
    struct Golden {
        file: String,
        template: String,
        messages: Vec<ChatMessage>,
        add_generation_prompt: bool,
        kwargs: TemplateKwargs,
        text: String,
    }

    fn goldens() -> Vec<Golden> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        let goldens: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("goldens.json")).unwrap())
                .unwrap();
        goldens
            .as_array()
            .unwrap()
            .iter()
            .map(|g| Golden {
                file: g["template"].as_str().unwrap().to_string(),
                template: std::fs::read_to_string(dir.join(g["template"].as_str().unwrap()))
                    .unwrap(),
                messages: g["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        let mut c = ChatMessage::new(
                            m["role"].as_str().unwrap(),
                            m["content"].as_str().unwrap(),
                        );
                        c.reasoning_content = m["reasoning_content"].as_str().map(String::from);
                        c
                    })
                    .collect(),
                add_generation_prompt: g["add_generation_prompt"].as_bool().unwrap(),
                kwargs: g["kwargs"].as_object().unwrap().clone(),
                text: undated(g["text"].as_str().unwrap().to_string()),
            })
            .collect()
    }

    fn name(g: &Golden) -> &str {
        &g.file
    }

    /// gpt-oss's template writes today's date (`strftime_now`), and the
    /// goldens hold the day they were made: both are compared without it.
    fn undated(mut text: String) -> String {
        const AT: &str = "Current date: ";
        if let Some(p) = text.find(AT) {
            let day = p + AT.len()..p + AT.len() + "YYYY-MM-DD".len();
            if text.get(day.clone()).is_some() {
                text.replace_range(day, "YYYY-MM-DD");
            }
        }
        text
    }

    /// Every template in tests/fixtures/templates renders each golden byte
    /// for byte (but for the date): Qwen2.5's, Qwen3's, DeepSeek-V3.1's,
    /// gpt-oss's and three of Laguna's, whose assistant turns sit in
    /// `{% generation %}` blocks.
    #[test]
    fn fixture_templates_render_as_transformers_does() {
        let goldens = goldens();
        assert_eq!(goldens.len(), 60);
        for g in &goldens {
            let t = ChatTemplate::new(g.template.as_str(), "", "").unwrap();
            let args = TemplateArgs {
                kwargs: Some(&g.kwargs),
                ..Default::default()
            };
            let out = t.render_with(&g.messages, g.add_generation_prompt, &args);
            assert_eq!(
                undated(out.unwrap_or_else(|e| panic!("{}: {e}", name(g)))),
                g.text,
                "{}, {} messages, {:?}",
                name(g),
                g.messages.len(),
                g.kwargs
            );
        }
    }

    fn kwargs(v: serde_json::Value) -> TemplateKwargs {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn thinking_is_on_by_default_where_the_template_has_a_thinking_mode() {
        // llama-server turns thinking on where its template analysis finds a
        // reasoning format: Qwen3's, DeepSeek-V3.1's (common/parsers/deepseek.cpp)
        // and Laguna's; Qwen2.5's has none, and gpt-oss's reads
        // `reasoning_effort`, never `enable_thinking`.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        for (file, thinks) in [
            ("Qwen-Qwen2.5-7B-Instruct.jinja", false),
            ("Qwen-Qwen3-0.6B.jinja", true),
            ("deepseek-ai-DeepSeek-V3.1.jinja", true),
            ("poolside-Laguna-XS.2.jinja", true),
            ("poolside-Laguna-XS-2.1.jinja", true),
            ("poolside-Laguna-S-2.1.jinja", true),
            ("openai-gpt-oss-120b.jinja", false),
        ] {
            let src = std::fs::read_to_string(dir.join(file)).unwrap();
            assert_eq!(
                ChatTemplate::new(src, "", "").unwrap().thinks(),
                thinks,
                "{file}"
            );
        }
        // So a render without kwargs is transformers' with `enable_thinking`
        // set to that, and `reasoning_effort: "none"` is the one with false.
        let mut defaults = 0;
        for g in goldens() {
            let t = ChatTemplate::new(g.template.as_str(), "", "").unwrap();
            let m = &g.messages;
            let add = g.add_generation_prompt;
            if g.kwargs == kwargs(serde_json::json!({ "enable_thinking": t.thinks() })) {
                assert_eq!(undated(t.render(m, add).unwrap()), g.text, "{}", name(&g));
                defaults += 1;
            }
            if g.kwargs == kwargs(serde_json::json!({ "enable_thinking": false })) {
                let none = TemplateArgs {
                    reasoning_effort: Some("none"),
                    ..Default::default()
                };
                assert_eq!(
                    undated(t.render_with(m, add, &none).unwrap()),
                    g.text,
                    "{}",
                    name(&g)
                );
            }
        }
        assert_eq!(defaults, 28);
    }

    #[test]
    fn request_kwargs_replace_the_defaults_and_reasoning_effort_is_a_name() {
        let goldens = goldens();
        let find = |file: &str, kw: serde_json::Value, n: usize| {
            goldens
                .iter()
                .find(|g| g.file == file && g.kwargs == kwargs(kw.clone()) && g.messages.len() == n)
                .unwrap()
        };
        // Qwen3: `--reasoning off` (a default of false) under a request's true.
        let on = find(
            "Qwen-Qwen3-0.6B.jinja",
            serde_json::json!({"enable_thinking": true}),
            1,
        );
        let off = find(
            "Qwen-Qwen3-0.6B.jinja",
            serde_json::json!({"enable_thinking": false}),
            1,
        );
        assert_ne!(on.text, off.text);
        let t = ChatTemplate::new(on.template.as_str(), "", "")
            .unwrap()
            .with_defaults(kwargs(serde_json::json!({"enable_thinking": false})))
            .unwrap();
        assert_eq!(undated(t.render(&on.messages, true).unwrap()), off.text);
        let request = kwargs(serde_json::json!({"enable_thinking": true}));
        let args = TemplateArgs {
            kwargs: Some(&request),
            ..Default::default()
        };
        assert_eq!(
            undated(t.render_with(&on.messages, true, &args).unwrap()),
            on.text
        );
        // gpt-oss: `reasoning_effort: "high"` reaches the template, and
        // "none" drops a default level.
        let high = find(
            "openai-gpt-oss-120b.jinja",
            serde_json::json!({"enable_thinking": false, "reasoning_effort": "high"}),
            4,
        );
        let plain = find(
            "openai-gpt-oss-120b.jinja",
            serde_json::json!({"enable_thinking": false}),
            4,
        );
        assert!(high.template.contains("reasoning_effort") && high.text.contains("high"));
        let t = ChatTemplate::new(high.template.as_str(), "", "").unwrap();
        let effort = |level| TemplateArgs {
            reasoning_effort: Some(level),
            ..Default::default()
        };
        assert_eq!(
            undated(
                t.render_with(&high.messages, true, &effort("high"))
                    .unwrap()
            ),
            high.text
        );
        let t = t
            .with_defaults(kwargs(serde_json::json!({"reasoning_effort": "high"})))
            .unwrap();
        assert_eq!(undated(t.render(&high.messages, true).unwrap()), high.text);
        assert_eq!(
            undated(
                t.render_with(&high.messages, true, &effort("none"))
                    .unwrap()
            ),
            plain.text
        );
    }

    #[test]
    fn gpt_oss_reads_a_tool_call_s_thoughts_without_its_content() {
        // llama.cpp (common/parsers/gpt-oss.cpp) gives gpt-oss's template the
        // thoughts as `thinking` and drops the content of a tool-call message
        // that has them: the template refuses content and thinking together.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        let src = std::fs::read_to_string(dir.join("openai-gpt-oss-120b.jinja")).unwrap();
        let t = ChatTemplate::new(src, "", "").unwrap();
        let mut call = ChatMessage::new("assistant", "I will look it up.");
        call.tool_calls = vec![serde_json::json!({
            "type": "function",
            "function": {"name": "weather", "arguments": {"city": "Paris"}},
        })];
        call.reasoning_content = Some("The user wants the weather.".into());
        let mut answer = ChatMessage::new("tool", "sunny");
        answer.tool_call_id = Some("0".into());
        let m = [ChatMessage::new("user", "Weather in Paris?"), call, answer];
        let out = t.render(&m, true).unwrap();
        assert!(
            out.contains("<|channel|>analysis<|message|>The user wants the weather.<|end|>")
                && !out.contains("I will look it up."),
            "{out}"
        );
    }

    #[test]
    fn enable_thinking_as_a_string_is_refused() {
        // llama-server: "false" would be true to the template.
        let t = ChatTemplate::new("{{ enable_thinking }}", "", "").unwrap();
        let bad = kwargs(serde_json::json!({"enable_thinking": "false"}));
        let args = TemplateArgs {
            kwargs: Some(&bad),
            ..Default::default()
        };
        let e = t
            .render_with(&msgs(&[("user", "a")]), true, &args)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid type for \"enable_thinking\" (expected boolean, got string)"
        );
        assert!(t.with_defaults(bad).is_err());
    }

    #[test]
    fn a_runaway_template_is_an_error_not_a_hang() {
        // 10^10 iterations: hours without a budget.
        let src =
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let e = t.render(&msgs(&[("user", "a")]), true).unwrap_err();
        assert!(matches!(e, ChatTemplateError::Render(_)));
        assert!(
            e.to_string().contains("fuel") && e.to_string().contains("--chat-template-file"),
            "{e}"
        );
    }

    #[test]
    fn a_long_conversation_renders_within_the_budget() {
        let qwen = include_str!("../../tests/fixtures/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
        let t = ChatTemplate::new(qwen, "", "<|im_end|>").unwrap();
        let turns: Vec<(&str, String)> = (0..20_000)
            .map(|i| {
                (
                    ["user", "assistant"][i % 2],
                    format!("message {i} ").repeat(20),
                )
            })
            .collect();
        let m: Vec<ChatMessage> = turns
            .iter()
            .map(|(r, c)| ChatMessage::new(*r, c.as_str()))
            .collect();
        let out = t.render(&m, true).unwrap();
        assert!(out.len() > 20_000 * 200 && out.ends_with("<|im_start|>assistant\n"));
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
        // Python's `json.dumps(message, ensure_ascii=False)` (transformers'
        // `tojson`; llama.cpp's is the same): keys in the message's order,
        // `, ` and `: ` separators.
        assert_eq!(json, r#"{"role": "user", "content": "x y  "}"#);
    }

    #[test]
    fn syntax_errors_are_typed() {
        let e = ChatTemplate::new("{% for %}", "", "").unwrap_err();
        assert!(matches!(e, ChatTemplateError::Syntax(_)));
    }
}
