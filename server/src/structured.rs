//! Structured output fields as llama-server reads them: `grammar` (GBNF),
//! `json_schema`, and OpenAI's `response_format` (`text`, `json_object`,
//! `json_schema` with `json_schema.schema`). They become one
//! [`ConstraintSpec`], compiled for the model's tokenizer; a grammar or
//! schema that does not compile is a 400 naming the field.

use longhaul::constrain::{Constraint, ConstraintSpec};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::EngineInfo;

#[derive(Deserialize, Debug, Default, Clone)]
pub struct StructuredFields {
    pub grammar: Option<String>,
    pub json_schema: Option<Value>,
    pub response_format: Option<Value>,
}

/// A constraint and the request field it came from (for the 400).
#[derive(Debug, Clone)]
pub struct Requested {
    pub spec: ConstraintSpec,
    pub field: &'static str,
}

impl StructuredFields {
    /// The request's constraint, following llama-server: `json_schema`
    /// and `grammar` together are refused on the OpenAI endpoints
    /// (`openai`), while the native `/completion` takes the grammar;
    /// `response_format` of type
    /// `json_object` (its `schema`, else any object) or `json_schema`
    /// (`json_schema.schema`) sets the schema; an empty schema means any
    /// object. `None` when the request asks for none.
    pub fn requested(&self, openai: bool) -> Result<Option<Requested>, ApiError> {
        let grammar = self.grammar.as_deref().filter(|g| !g.is_empty());
        let mut schema = self.json_schema.clone().filter(|s| !s.is_null());
        let mut field = "json_schema";
        if schema.is_some() && grammar.is_some() {
            if openai {
                return Err(ApiError::invalid_field(
                    "grammar",
                    "give either `json_schema` or `grammar`, not both",
                ));
            }
            schema = None;
        }
        if let Some(rf) = &self.response_format {
            let kind = rf.get("type").and_then(Value::as_str).unwrap_or("");
            match kind {
                "json_object" => {
                    if rf.get("schema").is_some() || schema.is_none() {
                        schema = Some(rf.get("schema").cloned().unwrap_or_else(|| json!({})));
                        field = "response_format";
                    }
                }
                "json_schema" => {
                    let s = rf
                        .get("json_schema")
                        .and_then(|w| w.get("schema"))
                        .cloned()
                        .unwrap_or_else(|| json!({}));
                    schema = Some(s);
                    field = "response_format";
                }
                "" | "text" => {}
                other => {
                    return Err(ApiError::invalid_field(
                        "response_format",
                        format!("response_format type must be one of \"text\", \"json_object\" or \"json_schema\", not {other:?}"),
                    ))
                }
            }
        }
        if let Some(mut s) = schema {
            if s.as_object().is_some_and(|o| o.is_empty()) {
                s = json!({"type": "object"});
            }
            return Ok(Some(Requested {
                spec: ConstraintSpec::JsonSchema(s),
                field,
            }));
        }
        Ok(grammar.map(|g| Requested {
            spec: ConstraintSpec::Gbnf(g.to_string()),
            field: "grammar",
        }))
    }

    /// Whether the request names a constraint of its own.
    pub fn any(&self) -> bool {
        self.grammar.as_deref().is_some_and(|g| !g.is_empty())
            || self.json_schema.as_ref().is_some_and(|s| !s.is_null())
            || self
                .response_format
                .as_ref()
                .and_then(|r| r.get("type"))
                .and_then(Value::as_str)
                .is_some_and(|t| t != "text")
    }
}

/// Compiles the request's constraint, else the server's default one
/// (`--grammar`, `--json-schema`, ...); `openai` as in
/// [`StructuredFields::requested`].
pub fn constraint(
    engine: &dyn EngineInfo,
    fields: &StructuredFields,
    default: Option<&ConstraintSpec>,
    openai: bool,
) -> Result<Option<Constraint>, ApiError> {
    let req = match fields.requested(openai)? {
        Some(r) => r,
        None => match default {
            Some(spec) => Requested {
                spec: spec.clone(),
                field: "grammar",
            },
            None => return Ok(None),
        },
    };
    compile(engine, &req).map(Some)
}

/// Compiles one constraint; a refusal is a 400 naming its field.
pub fn compile(engine: &dyn EngineInfo, req: &Requested) -> Result<Constraint, ApiError> {
    engine
        .constraint(&req.spec)
        .map_err(|e| ApiError::invalid_field(req.field, e.to_string()))
}
