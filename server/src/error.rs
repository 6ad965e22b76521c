//! Errors as OpenAI's error JSON: `{"error": {"message", "type", "param",
//! "code"}}` with the HTTP status in `code`, as llama-server also answers.

use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use longhaul::scheduler::SchedulerError;
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// `param` in the body: the request field at fault, if one is.
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// 400: a request OpenAI would also refuse.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_field(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::bad_request(message)
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// OpenAI's `type` for this status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body (also sent as an SSE event when a stream fails).
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }

    /// A JSON body that did not parse: syntax errors are 400, well-formed
    /// JSON of the wrong shape (missing fields, wrong types) is 422.
    pub fn from_json(e: serde_json::Error) -> Self {
        use serde_json::error::Category;
        let status = match e.classify() {
            Category::Data => StatusCode::UNPROCESSABLE_ENTITY,
            Category::Syntax | Category::Eof | Category::Io => StatusCode::BAD_REQUEST,
        };
        Self::new(status, format!("invalid request body: {e}"))
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        let status = r.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is larger than the server's limit (--body-limit)".to_string()
        } else {
            format!("cannot read the request body: {}", r.body_text())
        };
        Self::new(status, message)
    }
}

impl From<SchedulerError> for ApiError {
    fn from(e: SchedulerError) -> Self {
        match e {
            SchedulerError::PromptTooLong { .. } => Self {
                param: Some("messages/prompt".into()),
                ..Self::bad_request(e.to_string())
            },
            SchedulerError::EmptyPrompt => Self::bad_request(e.to_string()),
            SchedulerError::ShuttingDown => Self::unavailable(e.to_string()),
            SchedulerError::TooManyStops { .. } => Self {
                param: Some("stop".into()),
                ..Self::bad_request(e.to_string())
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}
