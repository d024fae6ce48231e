//! `/v1/pty…`: open, list, resize, kill, and the attach WebSocket (terminal bytes as binary
//! frames both ways, JSON control messages as text frames).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use berth_protocol::{PtyControl, PtyList, PtyRequest, PtySize};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;

use crate::Agent;
use crate::http::error::ApiError;
use crate::http::extract::ApiJson;
use crate::pty::PtySession;

const FRAME_BYTES: usize = 64 << 10;

pub async fn open(
    State(agent): State<Arc<Agent>>,
    ApiJson(req): ApiJson<PtyRequest>,
) -> Result<Response, ApiError> {
    let argv = match &req.cmd {
        Some(c) if c.is_empty() => return Err(ApiError::bad_request("`cmd` must not be empty")),
        Some(c) => c.clone(),
        None => vec![
            agent
                .commands
                .config()
                .account
                .login_shell()
                .to_string_lossy()
                .into_owned(),
            "-l".into(),
        ],
    };
    let prepared =
        agent
            .commands
            .prepare(Some(argv), None, req.cwd.as_deref(), req.env.as_ref(), None)?;
    let session = agent.ptys.open(prepared, &req)?;
    Ok((StatusCode::CREATED, Json(session.info())).into_response())
}

pub async fn list(State(agent): State<Arc<Agent>>) -> Json<PtyList> {
    Json(PtyList {
        ptys: agent.ptys.list(),
    })
}

pub async fn get(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(agent.ptys.require(&id)?.info()).into_response())
}

pub async fn resize(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    ApiJson(size): ApiJson<PtySize>,
) -> Result<Response, ApiError> {
    let s = agent.ptys.require(&id)?;
    s.resize(size.cols, size.rows)?;
    Ok(Json(s.info()).into_response())
}

pub async fn kill(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    agent.ptys.kill(&id)?;
    Ok(Json(json!({"id": id, "killed": true})).into_response())
}

#[derive(Deserialize)]
pub struct AttachQuery {
    stall_ms: Option<u64>,
}

pub async fn attach(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    q: Result<Query<AttachQuery>, axum::extract::rejection::QueryRejection>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let session = agent.ptys.require(&id)?;
    let Ok(ws) = ws else {
        return Err(ApiError::bad_request(
            "attach is a WebSocket: send an Upgrade request",
        ));
    };
    let stall = super::follow::stall(q.stall_ms);
    Ok(ws.on_upgrade(move |socket| run_attach(session, socket, stall)))
}

/// Replays the scrollback, then relays live output and input until the terminal closes or
/// the client leaves.
async fn run_attach(session: Arc<PtySession>, socket: WebSocket, stall: Duration) {
    let _guard = session.attach();
    let (mut tx, mut rx) = socket.split();
    let (closed_tx, mut closed) = tokio::sync::oneshot::channel::<()>();
    let input_session = session.clone();
    tokio::spawn(async move {
        while let Some(Ok(msg)) = rx.next().await {
            match msg {
                Message::Binary(b) if !input_session.write(b.to_vec()).await => break,
                Message::Binary(_) => {}
                Message::Text(t) => match serde_json::from_str::<PtyControl>(&t) {
                    Ok(PtyControl::Resize { resize }) => {
                        let _ = input_session.resize(resize.cols, resize.rows);
                    }
                    _ => {
                        // Text that is not a control message is typed input.
                        if !input_session.write(t.as_bytes().to_vec()).await {
                            break;
                        }
                    }
                },
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = closed_tx.send(());
    });

    let mut changes = session.subscribe();
    // Replay starts at the oldest byte kept; that is not a lag.
    let mut cursor = session.read(0, 0).1;
    loop {
        changes.borrow_and_update();
        let (data, next, skipped) = session.read(cursor, FRAME_BYTES);
        if skipped > 0 {
            let lag = json!({"lagged": true, "skipped": skipped}).to_string();
            if !send(&mut tx, Message::Text(lag.into()), stall).await {
                return;
            }
        }
        let progressed = !data.is_empty();
        if progressed && !send(&mut tx, Message::Binary(data.into()), stall).await {
            return;
        }
        cursor = next;
        if progressed {
            continue;
        }
        if let Some(code) = session.closed() {
            let exit =
                serde_json::to_string(&PtyControl::Exit { exit_code: code }).unwrap_or_default();
            let _ = send(&mut tx, Message::Text(exit.into()), stall).await;
            let _ = send(&mut tx, Message::Close(None), Duration::from_secs(1)).await;
            return;
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            _ = &mut closed => return,
            _ = tokio::time::sleep(Duration::from_secs(15)) => {
                if !send(&mut tx, Message::Ping(Default::default()), stall).await {
                    return;
                }
            }
        }
    }
}

async fn send(
    tx: &mut futures_util::stream::SplitSink<WebSocket, Message>,
    msg: Message,
    stall: Duration,
) -> bool {
    matches!(tokio::time::timeout(stall, tx.send(msg)).await, Ok(Ok(())))
}
