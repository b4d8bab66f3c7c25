//! The HTTP API's error: a status and a message, answered as
//! `{"error": message}` (503 with `Retry-After` when the broker's outbox is
//! full). Its own module: the API and its signature check both answer with
//! it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald_core::broker::Full;
use herald_core::metrics;
use serde_json::json;

/// An error answered as `{"error": message}` with an HTTP status.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl From<Full> for ApiError {
    /// The broker's outbox is full: 503, retry (with `Retry-After`).
    fn from(full: Full) -> ApiError {
        ApiError::new(503, full.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        metrics::count(&metrics::API_ERRORS);
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        let mut res = (status, Json(json!({ "error": self.message }))).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            res.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, Full::RETRY_AFTER.into());
        }
        res
    }
}
