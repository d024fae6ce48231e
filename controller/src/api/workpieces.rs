//! `…/{id}/workpieces…`: thin shells over [`crate::workpiece::Workpieces`].

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_protocol::ops::{Routes, controller as op};
use berth_protocol::workpiece::{CreateWorkpiece, Decision, ProposeEdits};
use serde::Deserialize;

use super::ApiState;
use crate::error::Error;
use crate::http::{ApiError, Json, Query};

type Result<T> = std::result::Result<T, ApiError>;

pub fn keyed() -> Routes<ApiState> {
    Routes::new()
        .bind(&op::WORKPIECE_LIST, list)
        .bind(&op::WORKPIECE_CREATE, create)
        .bind(&op::WORKPIECE_GET, get)
        .bind(&op::WORKPIECE_CONTENT, content)
        .bind(&op::WORKPIECE_VERSION_PAGE, version_page)
        .bind(&op::WORKPIECE_OPEN, open)
        .bind(&op::WORKPIECE_PROPOSE, propose)
        .bind(&op::WORKPIECE_PROPOSALS, proposals)
        .bind(&op::WORKPIECE_PROPOSAL, proposal)
        .bind(&op::WORKPIECE_PROPOSAL_PAGE, proposal_page)
        .bind(&op::WORKPIECE_ACCEPT, accept)
        .bind(&op::WORKPIECE_REJECT, reject)
}

async fn list(State(s): State<ApiState>, Path(id): Path<String>) -> Result<Response> {
    Ok(axum::Json(s.c.workpieces.list(&id).await?).into_response())
}

async fn create(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Json(body): Json<CreateWorkpiece>,
) -> Result<Response> {
    let w = s.c.workpieces.create(&id, body).await?;
    Ok((StatusCode::CREATED, axum::Json(w)).into_response())
}

async fn get(
    State(s): State<ApiState>,
    Path((id, wid)): Path<(String, String)>,
) -> Result<Response> {
    Ok(axum::Json(s.c.workpieces.get(&id, &wid).await?).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContentQuery {
    pub version: Option<u32>,
    #[serde(default)]
    pub page: u32,
    pub sheet: Option<String>,
}

async fn content(
    State(s): State<ApiState>,
    Path((id, wid)): Path<(String, String)>,
    Query(q): Query<ContentQuery>,
) -> Result<Response> {
    let c =
        s.c.workpieces
            .content(&id, &wid, q.version, q.page, q.sheet)
            .await?;
    Ok(axum::Json(c).into_response())
}

/// A rendered page: PNG, cached by the browser (a version's page never changes).
pub fn png(bytes: Vec<u8>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/png"),
            (header::CACHE_CONTROL, "private, max-age=86400, immutable"),
        ],
        bytes,
    )
        .into_response()
}

async fn version_page(
    State(s): State<ApiState>,
    Path((id, wid, version, page)): Path<(String, String, u32, u32)>,
) -> Result<Response> {
    Ok(png(s
        .c
        .workpieces
        .version_page(&id, &wid, version, page)
        .await?))
}

async fn open(
    State(s): State<ApiState>,
    Path((id, wid)): Path<(String, String)>,
) -> Result<Response> {
    Ok(axum::Json(s.c.workpieces.open(&id, &wid).await?).into_response())
}

async fn propose(
    State(s): State<ApiState>,
    Path((id, wid)): Path<(String, String)>,
    Json(body): Json<ProposeEdits>,
) -> Result<Response> {
    let p = s.c.workpieces.propose(&id, &wid, body).await?;
    Ok((StatusCode::CREATED, axum::Json(p)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusQuery {
    status: Option<String>,
}

async fn proposals(
    State(s): State<ApiState>,
    Path((id, wid)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> Result<Response> {
    Ok(axum::Json(s.c.workpieces.proposals(&id, &wid, q.status.as_deref())?).into_response())
}

async fn proposal(
    State(s): State<ApiState>,
    Path((id, wid, pid)): Path<(String, String, String)>,
) -> Result<Response> {
    Ok(axum::Json(s.c.workpieces.proposal(&id, &wid, &pid)?).into_response())
}

async fn proposal_page(
    State(s): State<ApiState>,
    Path((id, wid, pid, page)): Path<(String, String, String, u32)>,
) -> Result<Response> {
    Ok(png(s.c.workpieces.proposal_page(&id, &wid, &pid, page)?))
}

async fn accept(
    State(s): State<ApiState>,
    Path((id, wid, pid)): Path<(String, String, String)>,
) -> Result<Response> {
    Ok(axum::Json(s.c.workpieces.accept(&id, &wid, &pid).await?).into_response())
}

/// An optional JSON body: empty is the default.
pub fn decision(body: &[u8]) -> std::result::Result<Decision, Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Decision::default());
    }
    serde_json::from_slice(body).map_err(|e| Error::BadRequest(format!("body: {e}")))
}

async fn reject(
    State(s): State<ApiState>,
    Path((id, wid, pid)): Path<(String, String, String)>,
    body: Bytes,
) -> Result<Response> {
    let d = decision(&body)?;
    Ok(axum::Json(s.c.workpieces.reject(&id, &wid, &pid, d).await?).into_response())
}
