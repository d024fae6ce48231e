//! `/v1/files` (streaming download with Range, streaming atomic upload) and `/v1/fs/…`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::ws::{Message, WebSocketUpgrade};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use berth_protocol::events::EventKind;
use berth_protocol::{MkdirRequest, MoveRequest, UploadResult, WatchMessage};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;
use tower::ServiceExt;

use crate::Agent;
use crate::fs::FsError;
use crate::fs::watch::FsWatch;
use crate::http::error::ApiError;
use crate::http::extract::ApiJson;

type QueryResult<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;

#[derive(Deserialize)]
pub struct PathQuery {
    path: Option<String>,
}

fn required(path: Option<String>) -> Result<String, ApiError> {
    path.ok_or_else(|| ApiError::bad_request("the `path` query parameter is required"))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FsError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(ApiError::from)
}

pub async fn download(State(agent): State<Arc<Agent>>, req: Request) -> Result<Response, ApiError> {
    let Query(q): Query<PathQuery> = Query::try_from_uri(req.uri()).map_err(ApiError::from)?;
    let path = agent.files.resolve(&required(q.path)?)?;
    let p = path.clone();
    let meta = blocking(move || std::fs::metadata(&p).map_err(|e| FsError::from_io(&p, e))).await?;
    if meta.is_dir() {
        return Err(FsError::IsADirectory(path).into());
    }
    // Opening first turns a permission problem into a clear error instead of a bare 500.
    let p = path.clone();
    blocking(move || {
        std::fs::File::open(&p)
            .map(drop)
            .map_err(|e| FsError::from_io(&p, e))
    })
    .await?;
    let resp = tower_http::services::ServeFile::new(&path)
        .oneshot(req)
        .await
        .map_err(|e: Infallible| ApiError::bad_request(e.to_string()))?;
    Ok(resp.map(Body::new))
}

#[derive(Deserialize)]
pub struct UploadQuery {
    path: Option<String>,
    /// Octal permission bits (`644`, `0755`).
    mode: Option<String>,
}

pub async fn upload(State(agent): State<Arc<Agent>>, req: Request) -> Result<Response, ApiError> {
    let Query(q): Query<UploadQuery> = Query::try_from_uri(req.uri()).map_err(ApiError::from)?;
    let path = agent.files.resolve(&required(q.path)?)?;
    let mode = match q.mode.as_deref() {
        None => None,
        Some(m) => Some(
            u32::from_str_radix(m.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "invalid `mode` {m:?}: give octal permission bits such as 644"
                    ))
                })?,
        ),
    };
    let mut body = req.into_body().into_data_stream();
    let bytes = match agent.files.upload(&path, &mut body, mode).await {
        Ok(n) => n,
        Err(e) => {
            // A refused upload (disk full, permission denied) may be mid-body: read the rest
            // (bounded) so the client still sending gets this answer, not a reset.
            crate::http::extract::drain(Body::from_stream(body)).await;
            return Err(e.into());
        }
    };
    let shown = path.to_string_lossy().into_owned();
    agent.events.emit(
        EventKind::FileUploaded,
        json!({"path": shown, "bytes": bytes}),
    );
    Ok((
        StatusCode::CREATED,
        Json(UploadResult { path: shown, bytes }),
    )
        .into_response())
}

pub async fn stat(
    State(agent): State<Arc<Agent>>,
    q: QueryResult<PathQuery>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let path = agent.files.resolve(&required(q.path)?)?;
    let files = agent.files.clone();
    Ok(Json(blocking(move || files.stat(&path)).await?).into_response())
}

#[derive(Deserialize)]
pub struct ListQuery {
    path: Option<String>,
    depth: Option<u32>,
}

pub async fn list(
    State(agent): State<Arc<Agent>>,
    q: QueryResult<ListQuery>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let path = agent.files.resolve(&required(q.path)?)?;
    let depth = q.depth.unwrap_or(1);
    let files = agent.files.clone();
    Ok(Json(blocking(move || files.list(&path, depth)).await?).into_response())
}

pub async fn mkdir(
    State(agent): State<Arc<Agent>>,
    ApiJson(req): ApiJson<MkdirRequest>,
) -> Result<Response, ApiError> {
    let path = agent.files.resolve(&req.path)?;
    if req.mode.is_some_and(|m| m > 0o7777) {
        return Err(ApiError::bad_request("invalid field `mode`: above 0o7777"));
    }
    let files = agent.files.clone();
    let entry = blocking(move || files.mkdir(&path, req.parents.unwrap_or(true), req.mode)).await?;
    Ok((StatusCode::CREATED, Json(entry)).into_response())
}

pub async fn rename(
    State(agent): State<Arc<Agent>>,
    ApiJson(req): ApiJson<MoveRequest>,
) -> Result<Response, ApiError> {
    let from = agent.files.resolve(&req.from)?;
    let to = agent.files.resolve(&req.to)?;
    let files = agent.files.clone();
    let overwrite = req.overwrite.unwrap_or(false);
    Ok(Json(blocking(move || files.rename(&from, &to, overwrite)).await?).into_response())
}

#[derive(Deserialize)]
pub struct RemoveQuery {
    path: Option<String>,
    #[serde(default)]
    recursive: bool,
}

pub async fn remove(
    State(agent): State<Arc<Agent>>,
    q: QueryResult<RemoveQuery>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let path = agent.files.resolve(&required(q.path)?)?;
    if path == std::path::Path::new("/") {
        return Err(ApiError::bad_request("refusing to remove /"));
    }
    let files = agent.files.clone();
    let shown = path.to_string_lossy().into_owned();
    blocking(move || files.remove(&path, q.recursive)).await?;
    Ok(Json(json!({"path": shown, "removed": true})).into_response())
}

#[derive(Deserialize)]
pub struct WatchQuery {
    path: Option<String>,
    #[serde(default)]
    recursive: bool,
    stall_ms: Option<u64>,
}

pub async fn watch(
    State(agent): State<Arc<Agent>>,
    q: QueryResult<WatchQuery>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let path = agent.files.resolve(&required(q.path)?)?;
    let mut watch = FsWatch::start(&path, q.recursive)?;
    let stall = super::follow::stall(q.stall_ms);
    if let Ok(ws) = ws {
        return Ok(ws.on_upgrade(move |socket| async move {
            let (mut tx, mut rx) = socket.split();
            loop {
                tokio::select! {
                    msg = watch.next() => {
                        let Some(msg) = msg else { break };
                        let lagged = matches!(msg, WatchMessage::Lagged { .. });
                        let text = serde_json::to_string(&msg).unwrap_or_default();
                        let sent = tokio::time::timeout(stall, tx.send(Message::Text(text.into()))).await;
                        if !matches!(sent, Ok(Ok(()))) || lagged {
                            break;
                        }
                    }
                    incoming = rx.next() => {
                        if !matches!(incoming, Some(Ok(m)) if !matches!(m, Message::Close(_))) {
                            break;
                        }
                    }
                }
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), tx.send(Message::Close(None))).await;
        }));
    }
    if super::follow::wants_sse(&headers) {
        let stream = futures_util::stream::unfold(watch, |mut w| async move {
            let msg = w.next().await?;
            let text = serde_json::to_string(&msg).unwrap_or_default();
            Some((Ok::<_, Infallible>(SseEvent::default().data(text)), w))
        });
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    Err(ApiError::bad_request(
        "watch is a stream: open it as a WebSocket or with Accept: text/event-stream",
    ))
}
