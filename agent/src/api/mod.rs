//! The native surface `/v1/*`: bearer-token auth and thin handlers over the domains.

pub mod computer;
pub mod desktop;
pub mod display;
pub mod episode;
pub mod exec;
pub mod follow;
pub mod fs;
pub mod ports;
pub mod pty;
pub mod record;
pub mod toolset;
pub mod viewer;

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use berth_protocol::routes::native::nested;

use crate::http::error::ApiError;
use crate::http::require_token;
use crate::{Agent, ShutdownKind};
use follow::{Batch, Followable};

pub fn router(agent: Arc<Agent>) -> Router<Arc<Agent>> {
    let bearer = Router::new()
        .route(nested::EXEC, post(exec::exec))
        .route(nested::COMMANDS, get(exec::list))
        .route(nested::COMMAND, get(exec::get).delete(exec::delete))
        .route(nested::COMMAND_OUTPUT, get(exec::output))
        .route(nested::COMMAND_STDIN, post(exec::stdin))
        .route(nested::COMMAND_SIGNAL, post(exec::signal))
        .route(nested::PTYS, post(pty::open).get(pty::list))
        .route(nested::PTY, get(pty::get).delete(pty::kill))
        .route(nested::PTY_ATTACH, get(pty::attach))
        .route(nested::PTY_RESIZE, post(pty::resize))
        .route(
            nested::FILES,
            get(fs::download)
                .put(fs::upload)
                .layer(DefaultBodyLimit::disable()),
        )
        .route(nested::FS, axum::routing::delete(fs::remove))
        .route(nested::FS_LIST, get(fs::list))
        .route(nested::FS_STAT, get(fs::stat))
        .route(nested::FS_MKDIR, post(fs::mkdir))
        .route(nested::FS_MOVE, post(fs::rename))
        .route(nested::FS_WATCH, get(fs::watch))
        .route(nested::SCREENSHOT, get(display::screenshot))
        .route(nested::INPUT, post(display::input))
        .route(nested::DISPLAY, get(display::info).put(display::resize))
        .route(nested::WINDOWS, get(display::windows))
        .route(
            nested::CLIPBOARD,
            get(display::clipboard_get).put(display::clipboard_put),
        )
        .route(nested::COMPUTER, post(computer::computer))
        .route(
            nested::TOOLSET_COMPUTER,
            get(toolset::computer_info).post(toolset::computer_turn),
        )
        .route(
            nested::TOOLSET_BROWSER,
            get(toolset::browser_info).post(toolset::browser_turn),
        )
        .route(nested::RECORDINGS, post(record::start).get(record::list))
        .route(nested::RECORDING, get(record::get).delete(record::delete))
        .route(nested::RECORDING_STOP, post(record::stop))
        .route(nested::RECORDING_FILE, get(record::file))
        .route(nested::VIEWER_TOKENS, post(viewer::mint))
        .route(nested::READY, get(desktop::ready))
        .route(nested::A11Y, get(desktop::a11y))
        .route(nested::DESKTOP_STATE, get(desktop::desktop_state))
        .route(nested::BROWSER, get(desktop::browser_info))
        .route(nested::BROWSER_RESTART, post(desktop::browser_restart))
        .route(nested::BROWSER_CDP, get(desktop::browser_cdp))
        .route(nested::BROWSER_CDP_TARGET, get(desktop::browser_cdp_target))
        .route(nested::EVENTS, get(events))
        .route(nested::EPISODE, axum::routing::delete(episode::clear))
        .route(nested::EPISODE_ACTIONS, get(episode::actions))
        .route(nested::EPISODE_SCREENSHOT, get(episode::screenshot))
        .route(nested::SHUTDOWN, post(shutdown))
        .merge(ports::routes())
        .fallback(not_found)
        .route_layer(middleware::from_fn_with_state(agent.clone(), require_token));
    // Browser-facing routes (API.md's "(V)"): the bearer token or a viewer cookie.
    let browser = Router::new()
        .route(nested::STREAM_MP4, get(record::stream_mp4))
        .route(nested::STREAM, get(record::stream_ws))
        .route(nested::VNC_INDEX, get(desktop::vnc_index))
        .route(nested::VNC_WS, get(desktop::vnc_ws))
        .route(nested::VNC_FILE, get(desktop::vnc_file))
        .route_layer(middleware::from_fn_with_state(
            agent,
            viewer::require_viewer,
        ));
    bearer.merge(browser)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!("no route {} {}", req.method(), req.uri().path()))
}

#[derive(Deserialize)]
pub struct EventsQuery {
    #[serde(default)]
    from_seq: u64,
    #[serde(default)]
    follow: bool,
    limit: Option<usize>,
    timeout_ms: Option<u64>,
    stall_ms: Option<u64>,
}

async fn events(
    State(agent): State<Arc<Agent>>,
    q: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000);
    if !q.follow {
        return Ok(Json(agent.events.page(q.from_seq, limit)).into_response());
    }
    let stall = follow::stall(q.stall_ms);
    let src = Arc::new(EventSource(agent.clone()));
    if let Ok(ws) = ws {
        let from = q.from_seq;
        return Ok(ws
            .on_upgrade(move |s| follow::drive(src, from, follow::WsSink::new(s), stall))
            .into_response());
    }
    if follow::wants_sse(&headers) {
        return Ok(follow::sse(src, q.from_seq, stall));
    }
    let deadline = tokio::time::Instant::now()
        + q.timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(Duration::from_secs(30));
    let mut changes = agent.events.subscribe();
    loop {
        changes.borrow_and_update();
        let page = agent.events.page(q.from_seq, limit);
        if !page.events.is_empty()
            || tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
        {
            return Ok(Json(page).into_response());
        }
    }
}

struct EventSource(Arc<Agent>);

impl Followable for EventSource {
    fn batch(&self, cursor: u64) -> Batch {
        let page = self.0.events.page(cursor, 256);
        let mut messages = Vec::new();
        if let Some(t) = page.truncated_before_seq {
            messages.push((t, json!({"truncated_before_seq": t}).to_string()));
        }
        for e in &page.events {
            messages.push((e.seq, serde_json::to_string(e).unwrap_or_default()));
        }
        Batch {
            messages,
            next: page.next_seq,
            end: None,
        }
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.events.subscribe()
    }
}

async fn shutdown(State(agent): State<Arc<Agent>>) -> Response {
    agent.request_shutdown(ShutdownKind::Full);
    (StatusCode::ACCEPTED, Json(json!({"shutting_down": true}))).into_response()
}
