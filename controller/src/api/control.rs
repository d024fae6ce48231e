//! `…/{id}/control…`: thin shells over [`crate::control::Controls`] for the API key.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use berth_protocol::control::TakeControl;
use berth_protocol::ops::{Routes, controller as op};
use berth_protocol::routes::header;
use serde::Deserialize;

use super::ApiState;
use crate::control::Caller;
use crate::error::Error;
use crate::http::{ApiError, Query};

type Result<T> = std::result::Result<T, ApiError>;

pub fn keyed() -> Routes<ApiState> {
    Routes::new()
        .bind(&op::CONTROL_GET, get)
        .bind(&op::CONTROL_TAKE, take)
        .bind(&op::CONTROL_RETURN, hand_back)
        .bind(&op::CONTROL_DECLINE, decline)
}

/// The control token a keyed caller sent, if any.
pub fn sent_token(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::CONTROL).and_then(|v| v.to_str().ok())
}

/// A take's body: empty, or `{"ttl_seconds"}`.
pub fn take_body(bytes: &[u8]) -> std::result::Result<TakeControl, Error> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(TakeControl::default());
    }
    serde_json::from_slice(bytes).map_err(|e| Error::BadRequest(format!("the body: {e}")))
}

async fn get(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let v =
        s.c.controls
            .view(&id, Caller::Key(sent_token(&headers)))
            .await?;
    Ok(axum::Json(v).into_response())
}

async fn take(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response> {
    let req = take_body(&body)?;
    let v =
        s.c.controls
            .take(&id, Caller::Key(sent_token(&headers)), &req)
            .await?;
    Ok(axum::Json(v).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForceQuery {
    #[serde(default)]
    force: bool,
}

async fn hand_back(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<ForceQuery>,
    headers: HeaderMap,
) -> Result<Response> {
    let v =
        s.c.controls
            .hand_back(&id, Caller::Key(sent_token(&headers)), q.force)
            .await?;
    Ok(axum::Json(v).into_response())
}

async fn decline(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let v =
        s.c.controls
            .decline(&id, Caller::Key(sent_token(&headers)))
            .await?;
    Ok(axum::Json(v).into_response())
}
