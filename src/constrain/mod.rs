//! Constrained decoding: the allowed-token mask of a grammar, computed by
//! llguidance (the maintained library llama.cpp itself can use) over a
//! token trie built from our tokenizer's pieces.
//!
//! A [`Constrainer`] is built once per tokenizer (its trie and lexer
//! slices); it compiles a [`ConstraintSpec`] (GBNF as llama.cpp writes it,
//! Lark in llguidance's dialect, or a JSON schema) into a [`Constraint`],
//! the state of one generation. Per token, [`Constraint::apply`] sets the
//! logits of every token the grammar forbids to -inf before the sampler
//! runs, and [`Constraint::commit`] advances the grammar by the chosen
//! token and says whether the grammar is complete (generation stops there).
//!
//! This module knows tokens as byte strings only: it does not know models,
//! samplers or how requests spell their constraints.

pub mod gbnf;

use std::fmt;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::tokenizer::Tokenizer;

pub use gbnf::GbnfError;

/// Why a constraint could not be built or followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstrainError {
    #[error(transparent)]
    Gbnf(#[from] GbnfError),
    #[error("invalid grammar: {0}")]
    Grammar(String),
    #[error("invalid JSON schema: {0}")]
    Schema(String),
    #[error("cannot build the token table for constrained decoding: {0}")]
    Tokens(String),
    /// The grammar refused a sampled token (or failed internally).
    #[error("constrained decoding failed: {0}")]
    Decode(String),
}

/// What a generation is constrained to.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintSpec {
    /// A GBNF grammar (llama.cpp's `--grammar`, the `grammar` field). A text
    /// that starts with `%llguidance` is Lark, as in llama.cpp's llguidance
    /// build.
    Gbnf(String),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A JSON schema (`--json-schema`, `json_schema`, `response_format`).
    JsonSchema(Value),
}

impl ConstraintSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    pub fn json_object() -> Self {
        ConstraintSpec::JsonSchema(serde_json::json!({"type": "object"}))
    }
}

/// Whitespace a JSON schema admits between tokens: llama.cpp's schema
/// grammars allow a space, or one or two newlines and up to 20 blanks of
/// indentation. A bound keeps a sampled completion from spending its
/// tokens on endless whitespace.
const JSON_WHITESPACE: &str = r"(?: |\n{1,2}[ \t]{0,20})";

/// llguidance's JSON options (its `x-guidance` schema key) for schemas
/// compiled here: [`JSON_WHITESPACE`] between tokens, and keywords it does
/// not enforce ignored, as llama.cpp's schema converter ignores them.
pub fn json_options() -> Value {
    serde_json::json!({
        "whitespace_pattern": JSON_WHITESPACE,
        "lenient": true,
    })
}

/// The most units a grammar may have: its rules, groups, brackets,
/// alternatives, literals and repetitions (see [`lark_units`]). Three
/// costs of llguidance's grow with them: it compiles a grammar
/// recursively, a level per rule reference or group (2-3 KiB of stack
/// each, measured on x86-64), so a long chain of rules could otherwise
/// overflow the stack and abort the process; it compares each new literal
/// with every earlier one and expands each alternative, so time grows with
/// their square (100,000 distinct literals took 16 s to compile on two
/// cores, 300,000 alternatives 149 s); and a regular expression's
/// derivatives grow with its optional parts (`/(a*){n}/` written out: 4,000
/// parts took 0.25 s and 124 MB, 16,000 4.6 s and 1 GB, 131,000 ran past
/// 120 s and 16 GB). Grammars of real use count tens to hundreds (llama.cpp's
/// `grammars/*.gbnf` in `tests/fixtures`: 21 to 284).
pub const MAX_GRAMMAR_UNITS: usize = 8_192;

/// The most values and keys a JSON schema may have (see [`JsonSize`]):
/// every object and array is a level of llguidance's recursive schema
/// compiler, as for [`MAX_GRAMMAR_UNITS`].
pub const MAX_SCHEMA_UNITS: usize = 16_384;

/// The most bytes of a grammar's text, or of a JSON schema's regular
/// expressions (`pattern`, `patternProperties`, `x-guidance` options): a
/// regular expression's terms cost time and memory whatever their kind
/// (8 MB of `a*` took 23 s and 3 GB before llguidance refused it), and
/// real grammars are a few KiB (llama.cpp's `c.gbnf`: 1.4 KiB).
pub const MAX_GRAMMAR_BYTES: usize = 256 << 10;

/// The most properties one object of a JSON schema may list. llguidance
/// compiles an object in time that grows with the square of its properties
/// (2,000 took 0.26 s, 8,000 5.1 s), and an object with more than about
/// 500 optional ones fails at its first property anyway (its parser holds
/// 2,000 items per step).
pub const MAX_OBJECT_PROPERTIES: usize = 2_048;

/// The stack of the thread that compiles a constraint: room for
/// [`MAX_SCHEMA_UNITS`] levels at twice the cost measured (reserved, not
/// touched, until a grammar needs it).
const COMPILE_STACK: usize = 128 << 20;

/// An upper bound of a Lark text's units: each rule or terminal definition
/// has a `:`, each group a `(`, each optional part or JSON array a `[`,
/// each embedded JSON object or counted repetition a `{`, each alternative
/// a `|`, each literal two `"`, each regular expression two `/` and each
/// other repetition a `*`, `+` or `?`. Those characters in strings count
/// too, so this overcounts, never under.
fn lark_units(text: &str) -> usize {
    text.bytes()
        .filter(|b| {
            matches!(
                b,
                b':' | b'(' | b'[' | b'{' | b'|' | b'"' | b'/' | b'*' | b'+' | b'?'
            )
        })
        .count()
}

/// Refuses a JSON schema of more than [`MAX_SCHEMA_UNITS`] values and
/// keys; for a caller that counts them before building the schema (the
/// server reads a schema's units from the request's text first).
pub fn check_schema_units(units: usize) -> Result<(), ConstrainError> {
    if units > MAX_SCHEMA_UNITS {
        return Err(ConstrainError::Schema(format!(
            "the schema is too large: {units} values and keys, at most {MAX_SCHEMA_UNITS}; simplify or split it"
        )));
    }
    Ok(())
}

/// What bounds the cost of compiling a JSON schema.
#[derive(Debug, Default)]
struct JsonSize {
    /// Values (objects, arrays, strings, numbers, booleans, nulls) and
    /// keys: every object and array is one, so this also bounds the levels
    /// llguidance's schema compiler recurses through.
    units: usize,
    /// The most properties one object lists.
    max_properties: usize,
    /// Bytes of regular expressions: `pattern` strings, `patternProperties`
    /// keys and the strings of `x-guidance` options.
    regex_bytes: usize,
}

impl JsonSize {
    fn of(schema: &Value) -> Self {
        let mut size = JsonSize::default();
        let mut stack = vec![schema];
        while let Some(v) = stack.pop() {
            size.units += 1;
            let Value::Object(o) = v else {
                if let Value::Array(a) = v {
                    stack.extend(a.iter());
                }
                continue;
            };
            size.units += o.len();
            for (k, v) in o {
                match (k.as_str(), v) {
                    ("pattern", Value::String(rx)) => size.regex_bytes += rx.len(),
                    ("properties", Value::Object(p)) => {
                        size.max_properties = size.max_properties.max(p.len())
                    }
                    ("patternProperties", Value::Object(p)) => {
                        size.regex_bytes += p.keys().map(String::len).sum::<usize>()
                    }
                    ("x-guidance", Value::Object(g)) => {
                        size.regex_bytes += g
                            .values()
                            .filter_map(Value::as_str)
                            .map(str::len)
                            .sum::<usize>()
                    }
                    _ => {}
                }
                stack.push(v);
            }
        }
        size
    }

    /// Refuses a schema past [`MAX_SCHEMA_UNITS`], [`MAX_OBJECT_PROPERTIES`]
    /// or [`MAX_GRAMMAR_BYTES`].
    fn check(&self) -> Result<(), ConstrainError> {
        let too_large = |what: String| {
            Err(ConstrainError::Schema(format!(
                "the schema is too large: {what}; simplify or split it"
            )))
        };
        check_schema_units(self.units)?;
        if self.max_properties > MAX_OBJECT_PROPERTIES {
            return too_large(format!(
                "an object lists {} properties, at most {MAX_OBJECT_PROPERTIES}",
                self.max_properties
            ));
        }
        if self.regex_bytes > MAX_GRAMMAR_BYTES {
            return too_large(format!(
                "{} bytes of regular expressions, at most {MAX_GRAMMAR_BYTES}",
                self.regex_bytes
            ));
        }
        Ok(())
    }
}

/// llguidance's message without what it appends for its developers: the
/// backtrace of a panic it caught (a bound it asserts) or a marker that
/// the parser's state was left out.
fn brief(msg: String) -> String {
    match msg
        .find("\n<backtrace>")
        .or_else(|| msg.find("\n<non-verbose/>"))
    {
        Some(i) => msg[..i].to_string(),
        None => msg,
    }
}

/// Compiles constraints for one tokenizer.
pub struct Constrainer {
    factory: ParserFactory,
    n_vocab: usize,
}

impl fmt::Debug for Constrainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constrainer")
            .field("n_vocab", &self.n_vocab)
            .finish()
    }
}

/// The bytes llguidance sees for each token: the piece a token decodes to;
/// control tokens as `0xFF` + their text (llguidance's marker for special
/// tokens, which text never matches); unknown ids as nothing (never
/// allowed).
fn token_bytes(tok: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tok.n_vocab() as u32)
        .map(|id| {
            if tok.is_control(id) {
                let text = tok.token_text(id).as_bytes();
                let mut b = Vec::with_capacity(text.len() + 1);
                if !text.is_empty() {
                    b.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    b.extend_from_slice(text);
                }
                b
            } else {
                tok.token_to_piece_with(id, false).to_vec()
            }
        })
        .collect()
}

impl Constrainer {
    /// The token trie of `tok` (end-of-generation tokens end a complete
    /// grammar) and llguidance's parser factory over it.
    pub fn new(tok: &Tokenizer) -> Result<Self, ConstrainError> {
        let n_vocab = tok.n_vocab();
        let eog: Vec<u32> = tok
            .eog_ids()
            .into_iter()
            .filter(|&id| (id as usize) < n_vocab)
            .collect();
        let Some(&first) = eog.first() else {
            return Err(ConstrainError::Tokens(
                "the vocabulary has no end-of-generation token".into(),
            ));
        };
        let words = token_bytes(tok);
        let mut info = TokRxInfo::new(n_vocab as u32, first);
        info.tok_bos = tok.bos();
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstrainError::Tokens(e.to_string()))?;
        factory.quiet();
        // Errors say what failed, without the parser's state and the
        // grammar (a request's whole grammar echoed back in its error).
        factory.limits_mut().verbose_errors = false;
        Ok(Self { factory, n_vocab })
    }

    /// The llguidance grammar of `spec`, refused when it is larger than
    /// [`MAX_GRAMMAR_BYTES`] or [`MAX_GRAMMAR_UNITS`] (a schema: see
    /// [`JsonSize::check`]).
    fn grammar(spec: &ConstraintSpec) -> Result<TopLevelGrammar, ConstrainError> {
        let bytes = |what: &str, text: &str| {
            if text.len() > MAX_GRAMMAR_BYTES {
                return Err(ConstrainError::Grammar(format!(
                    "the grammar is too large: {what} {} bytes, at most {MAX_GRAMMAR_BYTES}; \
                     simplify or split it",
                    text.len()
                )));
            }
            Ok(())
        };
        let lark = |text: String| {
            bytes("its Lark form has", &text)?;
            let units = lark_units(&text);
            if units > MAX_GRAMMAR_UNITS {
                return Err(ConstrainError::Grammar(format!(
                    "the grammar is too large: {units} rules, groups, alternatives, \
                     literals and repetitions (counting its Lark form's ':', '(', '[', '{{', \
                     '|', '\"', '/', '*', '+' and '?'), at most {MAX_GRAMMAR_UNITS}; simplify \
                     or split it"
                )));
            }
            Ok(TopLevelGrammar::from_lark(text))
        };
        Ok(match spec {
            ConstraintSpec::Gbnf(text) if text.trim_start().starts_with("%llguidance") => {
                lark(text.clone())?
            }
            ConstraintSpec::Gbnf(text) => {
                bytes("it has", text)?;
                lark(gbnf::to_lark(text)?)?
            }
            ConstraintSpec::Lark(text) => lark(text.clone())?,
            ConstraintSpec::JsonSchema(schema) => {
                JsonSize::of(schema).check()?;
                let mut schema = schema.clone();
                match &mut schema {
                    Value::Object(o) => {
                        o.entry("x-guidance").or_insert_with(json_options);
                    }
                    Value::Bool(_) => {}
                    other => {
                        return Err(ConstrainError::Schema(format!(
                            "a schema is an object or a boolean, not {other}"
                        )))
                    }
                }
                TopLevelGrammar::from_json_schema(schema)
            }
        })
    }

    /// Compiles `spec` into the state of one generation, on a thread of
    /// its own with a [`COMPILE_STACK`] stack.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Constraint, ConstrainError> {
        let grammar = Self::grammar(spec)?;
        let matcher = std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("grammar".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(s, || {
                    self.factory
                        .create_parser(grammar)
                        .map(|p| Matcher::new(Ok(p)))
                })
                .map_err(|e| {
                    ConstrainError::Grammar(format!("cannot start the grammar compiler: {e}"))
                })?
                .join()
                .map_err(|_| ConstrainError::Grammar("the grammar compiler failed".into()))
        })?
        .map_err(|e| {
            let msg = brief(e.to_string());
            match spec {
                ConstraintSpec::JsonSchema(_) => ConstrainError::Schema(msg),
                _ => ConstrainError::Grammar(msg),
            }
        })?;
        if let Some(e) = matcher.get_error() {
            return Err(ConstrainError::Grammar(brief(e)));
        }
        Ok(Constraint {
            matcher,
            n_vocab: self.n_vocab,
        })
    }
}

/// The grammar state of one generation.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    n_vocab: usize,
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// Sets the logit of every token the grammar does not allow next to
    /// -inf (ids past the vocabulary included).
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), ConstrainError> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstrainError::Decode(brief(e.to_string())))?;
        for (id, l) in logits.iter_mut().enumerate() {
            if id >= self.n_vocab || !mask.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances the grammar by `tok`; true when the grammar is complete
    /// (nothing more can follow), so that generation ends here.
    pub fn commit(&mut self, tok: u32) -> Result<bool, ConstrainError> {
        self.matcher
            .consume_token(tok)
            .map_err(|e| ConstrainError::Decode(brief(e.to_string())))?;
        Ok(self.matcher.is_stopped())
    }

    /// Whether the text so far is a complete match (end of generation is
    /// allowed now).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}
