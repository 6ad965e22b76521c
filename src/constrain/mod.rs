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

/// The most rules, groups and brackets a grammar, or objects and arrays a
/// JSON schema, may have. llguidance compiles a grammar recursively, a
/// level per rule reference, group or schema node (2-3 KiB of stack each,
/// measured on x86-64), so a long chain of rules in a request could
/// otherwise overflow the stack and abort the process. Grammars of real
/// use count tens to hundreds (llama.cpp's `grammars/*.gbnf`: 5 to 81).
pub const MAX_GRAMMAR_UNITS: usize = 16_384;

/// The stack of the thread that compiles a constraint: room for
/// [`MAX_GRAMMAR_UNITS`] levels at twice the cost measured (reserved, not
/// touched, until a grammar needs it).
const COMPILE_STACK: usize = 128 << 20;

/// An upper bound of the levels llguidance may recurse through for a Lark
/// text: each rule or terminal definition has a `:`, each group a `(`, each
/// optional part or JSON array a `[` and each embedded JSON object a `{`.
/// Those characters in strings and regular expressions count too, so this
/// overcounts, never under.
fn lark_units(text: &str) -> usize {
    text.bytes()
        .filter(|b| matches!(b, b':' | b'(' | b'[' | b'{'))
        .count()
}

/// The objects and arrays of a JSON schema: a bound of the levels
/// llguidance's schema compiler recurses through.
fn json_units(schema: &Value) -> usize {
    let mut n = 0;
    let mut stack = vec![schema];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                n += 1;
                stack.extend(o.values());
            }
            Value::Array(a) => {
                n += 1;
                stack.extend(a.iter());
            }
            _ => {}
        }
    }
    n
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
        Ok(Self { factory, n_vocab })
    }

    /// The llguidance grammar of `spec`, refused when it is larger than
    /// [`MAX_GRAMMAR_UNITS`].
    fn grammar(spec: &ConstraintSpec) -> Result<TopLevelGrammar, ConstrainError> {
        let lark = |text: String| {
            let units = lark_units(&text);
            if units > MAX_GRAMMAR_UNITS {
                return Err(ConstrainError::Grammar(format!(
                    "the grammar is too large: {units} rules, groups and brackets \
                     (counting its Lark form's ':', '(', '[' and '{{'), at most \
                     {MAX_GRAMMAR_UNITS}; simplify or split it"
                )));
            }
            Ok(TopLevelGrammar::from_lark(text))
        };
        Ok(match spec {
            ConstraintSpec::Gbnf(text) if text.trim_start().starts_with("%llguidance") => {
                lark(text.clone())?
            }
            ConstraintSpec::Gbnf(text) => lark(gbnf::to_lark(text)?)?,
            ConstraintSpec::Lark(text) => lark(text.clone())?,
            ConstraintSpec::JsonSchema(schema) => {
                let units = json_units(schema);
                if units > MAX_GRAMMAR_UNITS {
                    return Err(ConstrainError::Schema(format!(
                        "the schema is too large: {units} objects and arrays, at most \
                         {MAX_GRAMMAR_UNITS}; simplify or split it"
                    )));
                }
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
            let msg = e.to_string();
            match spec {
                ConstraintSpec::JsonSchema(_) => ConstrainError::Schema(msg),
                _ => ConstrainError::Grammar(msg),
            }
        })?;
        if let Some(e) = matcher.get_error() {
            return Err(ConstrainError::Grammar(e));
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
            .map_err(|e| ConstrainError::Decode(e.to_string()))?;
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
            .map_err(|e| ConstrainError::Decode(e.to_string()))?;
        Ok(self.matcher.is_stopped())
    }

    /// Whether the text so far is a complete match (end of generation is
    /// allowed now).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}
