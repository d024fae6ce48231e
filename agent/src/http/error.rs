//! The native API's one error funnel: every domain error becomes a status and
//! `{"error": {"code", "message"}}` here, and nowhere else.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use berth_protocol::ErrorBody;

use crate::account::AccountError;
use crate::exec::ExecError;
use crate::fs::FsError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, code = self.code, message = %self.message, "request failed");
        }
        (self.status, Json(ErrorBody::new(self.code, self.message))).into_response()
    }
}

impl From<ExecError> for ApiError {
    fn from(e: ExecError) -> Self {
        let msg = e.to_string();
        match e {
            ExecError::Invalid(_) => ApiError::bad_request(msg),
            ExecError::NotFound(_) => ApiError::not_found(msg),
            ExecError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "conflict", msg),
            ExecError::Spawn(_) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "spawn_failed", msg)
            }
            ExecError::Account(AccountError::Unknown(_)) => {
                ApiError::new(StatusCode::BAD_REQUEST, "unknown_user", msg)
            }
            ExecError::Account(_) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "user_not_permitted", msg)
            }
            ExecError::Limit(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "pids_limit", msg)
            }
            ExecError::Internal(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", msg)
            }
        }
    }
}

impl From<FsError> for ApiError {
    fn from(e: FsError) -> Self {
        let msg = e.to_string();
        let (status, code) = match e {
            FsError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            FsError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            FsError::NotADirectory(_) => (StatusCode::BAD_REQUEST, "not_a_directory"),
            FsError::IsADirectory(_) => (StatusCode::BAD_REQUEST, "is_a_directory"),
            FsError::PermissionDenied(_) => (StatusCode::FORBIDDEN, "permission_denied"),
            FsError::DiskFull(_) => (StatusCode::INSUFFICIENT_STORAGE, "disk_full"),
            FsError::Exists(_) => (StatusCode::CONFLICT, "exists"),
            FsError::NotEmpty(_) => (StatusCode::CONFLICT, "not_empty"),
            FsError::TooLarge(..) => (StatusCode::UNPROCESSABLE_ENTITY, "too_large"),
            FsError::Body(..) => (StatusCode::BAD_REQUEST, "body_interrupted"),
            FsError::Io(..) => (StatusCode::INTERNAL_SERVER_ERROR, "io_error"),
        };
        ApiError::new(status, code, msg)
    }
}

impl From<std::io::Error> for ApiError {
    fn from(e: std::io::Error) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "io_error", e.to_string())
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(r: axum::extract::rejection::QueryRejection) -> Self {
        ApiError::bad_request(r.body_text())
    }
}
