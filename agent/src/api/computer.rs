//! `POST /v1/computer`: computer-use actions as engines emit them, in Anthropic's dialect
//! (`action`), OpenAI's (`type`) or as a batch of either (`actions`); see
//! `display::computer`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::Agent;
use crate::display::DisplayError;
use crate::display::computer::{self, Answer};
use crate::http::error::ApiError;
use crate::http::extract::ApiJson;

pub async fn computer(State(agent): State<Arc<Agent>>, ApiJson(body): ApiJson<Value>) -> Response {
    let called = std::time::Instant::now();
    let raw = body.clone();
    let answer = match computer::parse(body) {
        Ok(body) => computer::run_body(&agent.display, body).await,
        Err(e) => Answer::error(e.dialect, DisplayError::Invalid(e.message)),
    };
    let error = answer.error.as_ref().map(|e| e.to_string());
    agent
        .log_computer(
            crate::episode::Source::Computer,
            &raw,
            &answer.trace,
            error,
            called,
        )
        .await;
    let status = answer
        .error
        .map(|e| ApiError::from(e).status)
        .unwrap_or(StatusCode::OK);
    (status, Json(answer.body)).into_response()
}
