//! `/v1/episode`: the computer-use action log (see `crate::episode`).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::Agent;
use crate::episode;
use crate::http::error::ApiError;

#[derive(Deserialize)]
pub struct ActionsQuery {
    #[serde(default)]
    from_seq: u64,
    limit: Option<usize>,
}

pub async fn actions(
    State(agent): State<Arc<Agent>>,
    q: Result<Query<ActionsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000);
    let page = agent.episode.page(q.from_seq, limit);
    Ok(Json(json!({
        "actions": page.actions,
        "next_seq": page.next_seq,
        "dropped": agent.episode.dropped_total(),
    }))
    .into_response())
}

pub async fn screenshot(
    State(agent): State<Arc<Agent>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    if !episode::valid_name(&name) {
        return Err(ApiError::bad_request(format!(
            "{name:?} is not a screenshot name of the log (like 000012.png)"
        )));
    }
    let ep = agent.episode.clone();
    let n = name.clone();
    let bytes = tokio::task::spawn_blocking(move || ep.screenshot(&n))
        .await
        .ok()
        .flatten()
        .ok_or_else(|| ApiError::not_found(format!("no screenshot {name} in the episode")))?;
    Ok((
        [
            (header::CONTENT_TYPE, episode::content_type(&name)),
            (header::CACHE_CONTROL, "no-store"),
        ],
        bytes,
    )
        .into_response())
}

pub async fn clear(State(agent): State<Arc<Agent>>) -> Response {
    let n = agent.episode.clear().await;
    Json(json!({"cleared": n})).into_response()
}
