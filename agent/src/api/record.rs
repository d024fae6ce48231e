//! `/v1/recordings` and the live streams `/v1/stream.mp4` and `/v1/stream`.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_protocol::{RecordingInfo, RecordingList, RecordingRequest};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;

use crate::Agent;
use crate::http::error::ApiError;
use crate::http::extract::ApiJson;
use crate::record::{RecordError, StreamRequest};

impl From<RecordError> for ApiError {
    fn from(e: RecordError) -> Self {
        match e {
            RecordError::Display(d) => d.into(),
            RecordError::Invalid(m) => ApiError::bad_request(m),
            RecordError::NotFound(_) => ApiError::not_found(e.to_string()),
            RecordError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
            RecordError::Busy(m) => ApiError::new(StatusCode::TOO_MANY_REQUESTS, "busy", m),
            RecordError::Failed(m) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "recording_failed", m)
            }
            RecordError::DiskFull(m) => {
                ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "disk_full", m)
            }
            RecordError::Io(m) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "io_error", m),
        }
    }
}

/// `POST /v1/recordings`: 201 once the first frame is in the file.
pub async fn start(
    State(agent): State<Arc<Agent>>,
    ApiJson(req): ApiJson<RecordingRequest>,
) -> Result<Response, ApiError> {
    let rec = agent.recorder.start(req, false).await?;
    Ok((StatusCode::CREATED, Json(rec.info())).into_response())
}

pub async fn list(State(agent): State<Arc<Agent>>) -> Json<RecordingList> {
    Json(RecordingList {
        recordings: agent.recorder.list(),
    })
}

pub async fn get(
    State(agent): State<Arc<Agent>>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<RecordingInfo>, ApiError> {
    Ok(Json(agent.recorder.get(&id)?))
}

pub async fn stop(
    State(agent): State<Arc<Agent>>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<RecordingInfo>, ApiError> {
    Ok(Json(agent.recorder.stop(&id).await?))
}

pub async fn delete(
    State(agent): State<Arc<Agent>>,
    UrlPath(id): UrlPath<String>,
) -> Result<Response, ApiError> {
    agent.recorder.delete(&id).await?;
    Ok(Json(json!({"deleted": id})).into_response())
}

/// `GET /v1/recordings/{id}/file`: the MP4 (its complete fragments while still recording),
/// with single-range requests honoured.
pub async fn file(
    State(agent): State<Arc<Agent>>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (path, len) = agent.recorder.file(&id)?;
    crate::http::file::serve_prefix(&path, len, &headers, &format!("{id}.mp4")).await
}

#[derive(Deserialize, Default)]
pub struct StreamQuery {
    fps: Option<u32>,
    scale: Option<f64>,
    bitrate_kbps: Option<u32>,
    cursor: Option<bool>,
}

impl From<StreamQuery> for StreamRequest {
    fn from(q: StreamQuery) -> Self {
        StreamRequest {
            fps: q.fps,
            scale: q.scale,
            bitrate_kbps: q.bitrate_kbps,
            cursor: q.cursor,
        }
    }
}

/// `GET /v1/stream.mp4`: fragmented MP4 over one long HTTP response.
pub async fn stream_mp4(
    State(agent): State<Arc<Agent>>,
    q: Result<Query<StreamQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let (rx, guard) = agent.recorder.stream(q.into()).await?;
    let body = tokio_stream_from(rx).map(move |b| {
        let _held = &guard;
        Ok::<Bytes, std::io::Error>(b)
    });
    let mut resp = Response::new(Body::from_stream(body));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("video/mp4"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> impl futures_util::Stream<Item = Bytes> + Send {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// `GET /v1/stream`: the same over a WebSocket, one binary message per segment.
pub async fn stream_ws(
    State(agent): State<Arc<Agent>>,
    q: Result<Query<StreamQuery>, axum::extract::rejection::QueryRejection>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let Ok(ws) = ws else {
        return Err(ApiError::bad_request(
            "this route is a WebSocket; use GET /v1/stream.mp4 for plain HTTP",
        ));
    };
    let (rx, guard) = agent.recorder.stream(q.into()).await?;
    Ok(ws.on_upgrade(move |socket| pump(socket, rx, guard)))
}

async fn pump(
    socket: WebSocket,
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    guard: crate::record::StreamGuard,
) {
    let (mut tx, mut incoming) = socket.split();
    let mut segments = tokio_stream_from(rx);
    loop {
        tokio::select! {
            seg = segments.next() => {
                let Some(seg) = seg else { break };
                let send = tx.send(Message::Binary(seg));
                // A viewer that cannot take a segment in 10 s is gone.
                match tokio::time::timeout(std::time::Duration::from_secs(10), send).await {
                    Ok(Ok(())) => {}
                    _ => break,
                }
            }
            msg = incoming.next() => match msg {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                _ => {}
            },
        }
    }
    drop(guard);
    let _ = tx.close().await;
}
