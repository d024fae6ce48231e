//! The native surface `/v1/*`: bearer-token auth and thin handlers over the domains.

pub mod desktop;
pub mod display;
pub mod error;
pub mod exec;
pub mod extract;
pub mod follow;
pub mod fs;
pub mod pty;
pub mod record;
pub mod viewer;

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio::sync::watch;

use crate::{Agent, ShutdownKind};
use error::ApiError;
use follow::{Batch, Followable};

pub fn router(agent: Arc<Agent>) -> Router<Arc<Agent>> {
    let bearer = Router::new()
        .route("/exec", post(exec::exec))
        .route("/commands", get(exec::list))
        .route("/commands/{id}", get(exec::get).delete(exec::delete))
        .route("/commands/{id}/output", get(exec::output))
        .route("/commands/{id}/stdin", post(exec::stdin))
        .route("/commands/{id}/signal", post(exec::signal))
        .route("/pty", post(pty::open).get(pty::list))
        .route("/pty/{id}", get(pty::get).delete(pty::kill))
        .route("/pty/{id}/attach", get(pty::attach))
        .route("/pty/{id}/resize", post(pty::resize))
        .route(
            "/files",
            get(fs::download)
                .put(fs::upload)
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/fs", axum::routing::delete(fs::remove))
        .route("/fs/list", get(fs::list))
        .route("/fs/stat", get(fs::stat))
        .route("/fs/mkdir", post(fs::mkdir))
        .route("/fs/move", post(fs::rename))
        .route("/fs/watch", get(fs::watch))
        .route("/screenshot", get(display::screenshot))
        .route("/input", post(display::input))
        .route("/display", get(display::info))
        .route("/windows", get(display::windows))
        .route(
            "/clipboard",
            get(display::clipboard_get).put(display::clipboard_put),
        )
        .route("/computer", post(display::computer))
        .route("/recordings", post(record::start).get(record::list))
        .route("/recordings/{id}", get(record::get).delete(record::delete))
        .route("/recordings/{id}/stop", post(record::stop))
        .route("/recordings/{id}/file", get(record::file))
        .route("/viewer-tokens", post(viewer::mint))
        .route("/ready", get(desktop::ready))
        .route("/a11y", get(desktop::a11y))
        .route("/browser", get(desktop::browser_info))
        .route("/browser/restart", post(desktop::browser_restart))
        .route("/browser/cdp", get(desktop::browser_cdp))
        .route("/browser/cdp/{kind}/{id}", get(desktop::browser_cdp_target))
        .route("/events", get(events))
        .route("/shutdown", post(shutdown))
        .fallback(not_found)
        .route_layer(middleware::from_fn_with_state(agent.clone(), require_token));
    // Browser-facing routes (API.md's "(V)"): the bearer token or a viewer cookie.
    let browser = Router::new()
        .route("/stream.mp4", get(record::stream_mp4))
        .route("/stream", get(record::stream_ws))
        .route("/vnc/", get(desktop::vnc_index))
        .route("/vnc/websockify", get(desktop::vnc_ws))
        .route("/vnc/{*path}", get(desktop::vnc_file))
        .route_layer(middleware::from_fn_with_state(
            agent,
            viewer::require_viewer,
        ));
    bearer.merge(browser)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!("no route {} {}", req.method(), req.uri().path()))
}

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

async fn require_token(State(agent): State<Arc<Agent>>, req: Request, next: Next) -> Response {
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
