//! Structured output fields as llama-server reads them: `grammar` (GBNF),
//! `json_schema`, and OpenAI's `response_format` (`text`, `json_object`,
//! `json_schema` with `json_schema.schema`). They become one
//! [`ConstraintSpec`], compiled for the model's tokenizer; a grammar or
//! schema that does not compile is a 400 naming the field.

use longhaul::constrain::{check_schema_units, Constraint, ConstraintSpec};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::fields::{json_units, pick_raw};
use crate::EngineInfo;

/// The schema fields are kept as the body's text: a schema's values and
/// keys are counted before it is built ([`parse_schema`]), so a body of the limit
/// cannot spend a gigabyte on a `Value` the schema limit refuses.
#[derive(Deserialize, Debug, Default, Clone)]
pub struct StructuredFields {
    pub grammar: Option<String>,
    pub json_schema: Option<Box<RawValue>>,
    pub response_format: Option<Box<RawValue>>,
}

/// A schema from the request's text, refused past
/// [`longhaul::constrain::MAX_SCHEMA_UNITS`] before it is built, with the
/// message the compiler would give; `field` names it in a 400.
fn parse_schema(raw: &RawValue, field: &str) -> Result<Value, ApiError> {
    let units = json_units(raw).map_err(ApiError::from_json)?;
    check_schema_units(units).map_err(|e| ApiError::invalid_field(field, e.to_string()))?;
    serde_json::from_str(raw.get()).map_err(ApiError::from_json)
}

/// `response_format`'s fields, each `None` when absent (`null` is given).
struct ResponseFormat<'a> {
    /// `type`; `None` also when it is not a string.
    kind: Option<String>,
    /// `schema` (of type `json_object`).
    schema: Option<&'a RawValue>,
    /// `json_schema.schema` (of type `json_schema`).
    wrapped: Option<&'a RawValue>,
}

impl<'a> ResponseFormat<'a> {
    fn read(rf: &'a RawValue) -> Result<Self, ApiError> {
        let [kind, schema, wrapped] =
            pick_raw(rf, ["type", "schema", "json_schema"]).map_err(ApiError::from_json)?;
        let wrapped = match wrapped {
            Some(w) => {
                let [schema] = pick_raw(w, ["schema"]).map_err(ApiError::from_json)?;
                schema
            }
            None => None,
        };
        Ok(Self {
            kind: kind.and_then(|k| serde_json::from_str(k.get()).ok()),
            schema,
            wrapped,
        })
    }
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
        let mut schema = match &self.json_schema {
            Some(raw) => Some(parse_schema(raw, "json_schema")?),
            None => None,
        };
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
            let rf = ResponseFormat::read(rf)?;
            let field_schema = |raw: Option<&RawValue>| match raw {
                Some(raw) => parse_schema(raw, "response_format"),
                None => Ok(json!({})),
            };
            match rf.kind.as_deref().unwrap_or("") {
                "json_object" => {
                    if rf.schema.is_some() || schema.is_none() {
                        schema = Some(field_schema(rf.schema)?);
                        field = "response_format";
                    }
                }
                "json_schema" => {
                    schema = Some(field_schema(rf.wrapped)?);
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
            || self.json_schema.is_some()
            || self
                .response_format
                .as_deref()
                .and_then(|rf| ResponseFormat::read(rf).ok()?.kind)
                .is_some_and(|kind| kind != "text")
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
