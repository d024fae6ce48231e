//! The HTTP layer the agent's three surfaces stand on — the native `/v1` API, the compat API
//! on :5000 and MCP: the error funnel ([`error`]), body extractors and limits ([`extract`]),
//! ranged file answers ([`file`]) and the bearer check. None of the surfaces imports another.

pub mod error;
pub mod extract;
pub mod file;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::Agent;
use error::ApiError;

/// Constant-time bearer check; the token is never logged.
pub fn token_matches(headers: &HeaderMap, token: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    given.as_bytes().ct_eq(token.as_bytes()).into()
}

/// The bearer check of `/v1` (and `/mcp`): 401 with the native error body otherwise.
pub(crate) async fn require_token(
    State(agent): State<Arc<Agent>>,
    req: Request,
    next: Next,
) -> Response {
    if token_matches(req.headers(), &agent.token) {
        next.run(req).await
    } else {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        )
        .into_response()
    }
}
