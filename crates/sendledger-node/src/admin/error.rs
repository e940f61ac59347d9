//! The admin API's one error type: a status and a message, answered as JSON
//! `{"error": "..."}`. Server errors are logged with the request's method and path (as
//! warnings: the caller is told, and the cause is in the message).

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use sendledger_core::error::Chain;
use serde_json::json;

use super::json_response;

/// An error answer: its status and what the caller should know (and do).
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = json_response(self.status, &json!({ "error": self.message }));
        if self.status.is_server_error() {
            // For the log line, which knows the request (see `super::log_failures`).
            response.extensions_mut().insert(Failed(self.message));
        }
        response
    }
}

impl From<sendledger_actors::Error> for ApiError {
    fn from(e: sendledger_actors::Error) -> ApiError {
        use sendledger_actors::Error as E;
        let status = match &e {
            E::NoSuchTask(_) => StatusCode::NOT_FOUND,
            E::Invalid(
                inner @ (sendledger_core::Error::NotInReview { .. }
                | sendledger_core::Error::NotRetryable { .. }),
            ) => return ApiError::new(StatusCode::CONFLICT, inner.to_string()),
            E::Invalid(_) => StatusCode::BAD_REQUEST,
            E::ShuttingDown | E::Stopped => StatusCode::SERVICE_UNAVAILABLE,
            // Kafka mode: another instance owns the task's partition and answers for it.
            E::NotOwned { .. } => StatusCode::MISDIRECTED_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, Chain(&e).to_string())
    }
}

impl From<sendledger_store::Error> for ApiError {
    fn from(e: sendledger_store::Error) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, Chain(&e).to_string())
    }
}

/// Why a request failed on the server's side, carried by its answer to the log.
#[derive(Debug, Clone)]
pub struct Failed(pub String);

/// What a route handler returns.
pub type ApiResult = Result<Response, ApiError>;
