//! Errors in OpenAI's envelope: `{"error": {"message", "type", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            code,
        }
    }

    /// 400: a value out of range.
    pub fn invalid_value(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("invalid_value"),
            message,
        )
    }

    /// 400: a malformed body.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            message,
        )
    }

    /// 400: parameters etch does not honour.
    pub fn unsupported(names: &[&str]) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("unsupported_parameter"),
            format!(
                "Unsupported parameter(s): {}. This server honors temperature, top_p, top_k, seed, max_tokens/max_completion_tokens, stop, and tools.",
                names.join(", ")
            ),
        )
    }

    /// 400: the prompt (and the reply asked for) do not fit the context.
    pub fn context_length(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("context_length_exceeded"),
            message,
        )
    }

    /// 400: a session id that is not 1-128 printable ASCII characters.
    pub fn invalid_session_id(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("invalid_session_id"),
            message,
        )
    }

    /// 400: named sessions are off.
    pub fn unsupported_session() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("unsupported_session"),
            "This server hosts a single session; omit session_id.",
        )
    }

    /// 429: every session slot is taken.
    pub fn capacity_exhausted() -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "capacity_error",
            Some("capacity_exhausted"),
            "Session capacity exhausted; reuse an existing session_id or retry later.",
        )
    }

    /// 404: a model this server does not serve.
    pub fn model_not_found(asked: &str, served: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model_not_found"),
            format!("Model '{asked}' not found. This server serves '{served}'."),
        )
    }

    /// 404: no such route or session.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("not_found"),
            message,
        )
    }

    /// 401: a missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            "Missing or invalid API key (send Authorization: Bearer KEY).",
        )
    }

    /// 413: a body above the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("request_too_large"),
            format!("The request body is larger than {limit} bytes."),
        )
    }

    /// 500: generation failed.
    pub fn server(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            None,
            format!("Generation failed: {}", message.into()),
        )
    }

    /// 503: the engine is gone.
    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            None,
            "The model engine has stopped; restart the server.",
        )
    }

    /// The envelope's JSON.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
