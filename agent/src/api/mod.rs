//! The native surface `/v1/*`: bearer-token auth and thin handlers over the domains.

pub mod computer;
pub mod control;
pub mod desktop;
pub mod display;
pub mod episode;
pub mod exec;
pub mod follow;
pub mod fs;
pub mod git;
pub mod ports;
pub mod pty;
pub mod record;
pub mod toolset;
pub mod viewer;
pub mod workpiece;

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use berth_protocol::ops::{Routes, native as op};

use crate::http::error::ApiError;
use crate::http::require_token;
use crate::{Agent, ShutdownKind};
use follow::{Batch, Followable};

/// The native routes, relative to their nest (`/v1`).
pub fn routes(agent: Arc<Agent>) -> Routes<Arc<Agent>> {
    let bearer = guarded_routes(Routes::new(), &agent)
        .bind(&op::EXEC, exec::exec)
        .bind(&op::COMMANDS_LIST, exec::list)
        .bind(&op::COMMAND_GET, exec::get)
        .bind(&op::COMMAND_DELETE, exec::delete)
        .bind(&op::COMMAND_OUTPUT, exec::output)
        .bind(&op::COMMAND_STDIN, exec::stdin)
        .bind(&op::COMMAND_SIGNAL, exec::signal)
        .bind(&op::PTY_OPEN, pty::open)
        .bind(&op::PTY_LIST, pty::list)
        .bind(&op::PTY_GET, pty::get)
        .bind(&op::PTY_KILL, pty::kill)
        .bind(&op::PTY_ATTACH, pty::attach)
        .bind(&op::PTY_RESIZE, pty::resize)
        .bind_with(&op::FILES_DOWNLOAD, fs::download, unlimited)
        .bind_with(&op::FILES_UPLOAD, fs::upload, unlimited)
        .bind(&op::FS_REMOVE, fs::remove)
        .bind(&op::FS_LIST, fs::list)
        .bind(&op::FS_STAT, fs::stat)
        .bind(&op::FS_MKDIR, fs::mkdir)
        .bind(&op::FS_MOVE, fs::rename)
        .bind(&op::FS_WATCH, fs::watch)
        .bind(&op::DISPLAY, display::info)
        .bind(&op::TOOLSET_COMPUTER_INFO, toolset::computer_info)
        .bind(&op::TOOLSET_BROWSER_INFO, toolset::browser_info)
        .bind(&op::RECORDING_START, record::start)
        .bind(&op::RECORDINGS_LIST, record::list)
        .bind(&op::RECORDING_GET, record::get)
        .bind(&op::RECORDING_DELETE, record::delete)
        .bind(&op::RECORDING_STOP, record::stop)
        .bind(&op::RECORDING_FILE, record::file)
        .bind(&op::VIEWER_TOKEN, viewer::mint)
        .bind(&op::READY, desktop::ready)
        .bind(&op::DESKTOP_STATE, desktop::desktop_state)
        .bind(&op::WORKPIECE, workpiece::engine)
        .bind(&op::WORKPIECE_FILE_GET, workpiece::read)
        .bind_with(&op::WORKPIECE_FILE_PUT, workpiece::write, unlimited)
        .bind(&op::BROWSER, desktop::browser_info)
        .bind(&op::BROWSER_RESTART, desktop::browser_restart)
        .merge(panes_and_control())
        .bind(&op::EVENTS, events)
        .bind(&op::EPISODE_CLEAR, episode::clear)
        .bind(&op::EPISODE_ACTIONS, episode::actions)
        .bind(&op::EPISODE_SCREENSHOT, episode::screenshot)
        .bind(&op::SHUTDOWN, shutdown)
        .merge(ports::routes())
        .fallback(not_found)
        .route_layer(middleware::from_fn_with_state(agent.clone(), require_token));
    // Browser-facing routes (API.md's "(V)"): the bearer token or a viewer cookie.
    let browser = Routes::new()
        .bind(&op::STREAM_MP4, record::stream_mp4)
        .bind(&op::STREAM_WS, record::stream_ws)
        .bind(&op::VNC_INDEX, desktop::vnc_index)
        .bind(&op::VNC_WS, desktop::vnc_ws)
        .bind(&op::VNC_FILE, desktop::vnc_file)
        .route_layer(middleware::from_fn_with_state(
            agent,
            viewer::require_viewer,
        ));
    bearer.merge(browser)
}

/// The input and observation routes, refused to all but the holder while a person holds the
/// controls.
fn guarded_routes(r: Routes<Arc<Agent>>, agent: &Arc<Agent>) -> Routes<Arc<Agent>> {
    r.bind_with(&op::SCREENSHOT, display::screenshot, guarded(agent))
        .bind_with(&op::INPUT, display::input, guarded(agent))
        .bind_with(&op::DISPLAY_RESIZE, display::resize, guarded(agent))
        .bind_with(&op::WINDOWS, display::windows, guarded(agent))
        .bind_with(&op::CLIPBOARD_GET, display::clipboard_get, guarded(agent))
        .bind_with(&op::CLIPBOARD_PUT, display::clipboard_put, guarded(agent))
        .bind_with(&op::COMPUTER, computer::computer, guarded(agent))
        .bind_with(
            &op::TOOLSET_COMPUTER_TURN,
            toolset::computer_turn,
            guarded(agent),
        )
        .bind_with(
            &op::TOOLSET_BROWSER_TURN,
            toolset::browser_turn,
            guarded(agent),
        )
        .bind_with(&op::A11Y, desktop::a11y, guarded(agent))
        .bind_with(
            &op::BROWSER_TAB_SCREENSHOT,
            desktop::browser_tab_screenshot,
            guarded(agent),
        )
        .bind_with(&op::BROWSER_CDP, desktop::browser_cdp, guarded(agent))
        .bind_with(
            &op::BROWSER_CDP_TARGET,
            desktop::browser_cdp_target,
            guarded(agent),
        )
}

/// The session view's panes (tabs, repositories) and the controls' routes.
fn panes_and_control() -> Routes<Arc<Agent>> {
    Routes::new()
        .bind(&op::BROWSER_TABS, desktop::browser_tabs)
        .bind(&op::GIT_REPOS, git::repos)
        .bind(&op::GIT_DIFF, git::diff)
        .bind(&op::CONTROL_GET, control::get)
        .bind(&op::CONTROL_PUT, control::put)
        .bind(&op::CONTROL_DELETE, control::delete)
        .bind(&op::CONTROL_SETTINGS, control::settings)
        .bind(&op::CONTROL_REQUEST, control::request)
        .bind(&op::CONTROL_DECLINE, control::decline)
        .bind(&op::CONTROL_KEY_PUT, control::claim)
        .bind(&op::BROWSER_LOGIN, control::browser_login)
        .bind(&op::BROWSER_FORGET, control::browser_forget)
}

/// An input or observation route: refused to all but the holder while a person holds the
/// controls (`control::guard`).
fn guarded(
    agent: &Arc<Agent>,
) -> impl FnOnce(MethodRouter<Arc<Agent>>) -> MethodRouter<Arc<Agent>> {
    let agent = agent.clone();
    move |m| m.route_layer(middleware::from_fn_with_state(agent, control::guard))
}

/// Files stream: no body limit.
fn unlimited(m: MethodRouter<Arc<Agent>>) -> MethodRouter<Arc<Agent>> {
    m.layer(DefaultBodyLimit::disable())
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
