//! `/v1/ready`, the noVNC viewer (`/v1/vnc/…`) and the browser (`/v1/browser…`).

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio_tungstenite::tungstenite;

use berth_protocol::desktop::{A11yTree, BrowserInfo, BrowserTarget};

use crate::Agent;
use crate::desktop::Desktop;
use crate::http::error::ApiError;
use crate::viewers::Grant;

type WsResult = Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>;

/// Largest CDP message relayed (screenshots and DOM snapshots are big).
const CDP_MESSAGE_LIMIT: usize = 256 << 20;

#[derive(Deserialize)]
pub struct ReadyQuery {
    wait: Option<String>,
}

pub async fn ready(
    State(agent): State<Arc<Agent>>,
    q: Result<Query<ReadyQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let wait = match q.wait.as_deref() {
        None | Some("") => Duration::ZERO,
        Some(w) => humantime::parse_duration(w)
            .or_else(|_| w.parse::<u64>().map(Duration::from_secs))
            .map_err(|_| ApiError::bad_request(format!("wait: {w:?} is not a duration (30s, 2m)")))?
            .min(Duration::from_secs(300)),
    };
    let report = agent.readiness.wait(wait).await;
    let status = if report.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Ok((status, Json(report)).into_response())
}

fn desktop(agent: &Agent) -> Result<&Arc<Desktop>, ApiError> {
    agent.desktop.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_desktop",
            "this agent runs without --desktop: there is no viewer or browser",
        )
    })
}

/// `GET /v1/desktop/state`: the desktop-state contract, read now.
pub async fn desktop_state(State(agent): State<Arc<Agent>>) -> Result<Response, ApiError> {
    let d = desktop(&agent)?;
    let state = crate::desktop::state::read(
        d,
        &agent.display,
        &agent.commands,
        &agent.home,
        std::path::Path::new(crate::desktop::state::EXPECTED_FILE),
    )
    .await
    .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "desktop_unavailable", e))?;
    Ok(Json(state).into_response())
}

/// `/v1/vnc/`: noVNC's page, told where its WebSocket is and whether it only watches.
pub async fn vnc_index(
    State(agent): State<Arc<Agent>>,
    Extension(grant): Extension<Grant>,
) -> Result<Response, ApiError> {
    desktop(&agent)?;
    let location = format!(
        "vnc.html?autoconnect=true&reconnect=true&resize=scale&path=v1/vnc/websockify&view_only={}",
        grant.view_only
    );
    let mut resp = (StatusCode::FOUND, "").into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
}

/// noVNC's static files.
pub async fn vnc_file(
    State(agent): State<Arc<Agent>>,
    Path(path): Path<String>,
) -> Result<Response, ApiError> {
    desktop(&agent)?;
    let clean: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if clean
        .iter()
        .any(|p| *p == ".." || *p == "." || p.contains('\\'))
    {
        return Err(ApiError::bad_request("no such path in noVNC"));
    }
    let file = clean
        .iter()
        .fold(agent.novnc_dir.clone(), |acc, p| acc.join(p));
    let data = match tokio::fs::read(&file).await {
        Ok(d) => d,
        Err(_) => {
            return Err(ApiError::not_found(format!(
                "{path}: not in noVNC ({})",
                agent.novnc_dir.display()
            )));
        }
    };
    let mime = mime_guess::from_path(&file).first_or_octet_stream();
    Ok((
        [
            (header::CONTENT_TYPE, mime.essence_str().to_string()),
            (header::CACHE_CONTROL, "no-cache".to_string()),
        ],
        data,
    )
        .into_response())
}

/// `/v1/vnc/websockify`: noVNC's WebSocket to the VNC server.
pub async fn vnc_ws(
    State(agent): State<Arc<Agent>>,
    Extension(grant): Extension<Grant>,
    headers: axum::http::HeaderMap,
    ws: WsResult,
) -> Result<Response, ApiError> {
    let d = desktop(&agent)?.clone();
    // The controller's relay marks a session viewer that must only watch; the holder of the
    // controls sends its token, asked again at every message.
    let view_only =
        grant.view_only || headers.contains_key(berth_protocol::routes::header::VIEW_ONLY);
    let token = super::control::token(&headers).map(str::to_string);
    let control = agent.control.clone();
    let Ok(ws) = ws else {
        return Err(ApiError::bad_request(
            "this route is noVNC's WebSocket; open /v1/vnc/ in a browser",
        ));
    };
    let socket = d.vnc_socket.clone();
    Ok(ws.protocols(["binary"]).on_upgrade(move |ws| async move {
        let may = move || control.allows(token.as_deref());
        crate::desktop::vnc::relay(ws, &socket, view_only, may).await
    }))
}

/// The browser's DevTools endpoint, an idle on-demand browser started for the caller.
async fn running_browser(d: &Desktop) -> Result<crate::desktop::DevTools, ApiError> {
    d.browser(crate::desktop::BROWSER_WAIT)
        .await
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "browser_down",
                "the browser is not running (see GET /v1/ready)",
            )
        })
}

/// `GET /v1/browser`.
pub async fn browser_info(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let d = desktop(&agent)?;
    let dt = running_browser(d).await?;
    let unavailable = |e: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "browser_down", e);
    let (version, targets) = tokio::join!(
        crate::browser::cdp::version(dt.port),
        crate::browser::cdp::targets(dt.port)
    );
    let version = version.map_err(unavailable)?;
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    let text = |v: &serde_json::Value| v.as_str().map(String::from);
    // Each target is reached through this surface's relay, not the browser's loopback port.
    let targets: Vec<BrowserTarget> = targets
        .map_err(unavailable)?
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|t| BrowserTarget {
            ws_url: format!(
                "ws://{host}/v1/browser/cdp/{}/{}",
                if t["type"] == "browser" {
                    "browser"
                } else {
                    "page"
                },
                t["id"].as_str().unwrap_or_default()
            ),
            id: text(&t["id"]),
            kind: text(&t["type"]),
            title: text(&t["title"]),
            url: text(&t["url"]),
        })
        .collect();
    Ok(Json(BrowserInfo {
        version: text(&version["Browser"]),
        protocol_version: text(&version["Protocol-Version"]),
        user_agent: text(&version["User-Agent"]),
        ws_url: format!("ws://{host}/v1/browser/cdp"),
        targets,
        cdp_listen: agent.cdp_listen.map(|a| a.to_string()),
        pid: d.pid("chromium"),
    })
    .into_response())
}

/// `POST /v1/browser/restart`: a fresh browser; answers once it is up.
pub async fn browser_restart(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let d = desktop(&agent)?.clone();
    let before = d.pid("chromium");
    let mut changed = d.changes();
    d.request_restart("chromium");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let s = d.statuses().get("chromium").cloned();
        if let Some(s) = s
            && s.ok
            && s.pid.is_some()
            && s.pid != before
        {
            return browser_info(State(agent), headers).await;
        }
        if tokio::time::timeout_at(deadline, changed.changed())
            .await
            .is_err()
        {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "browser_down",
                "the browser did not come back within 60 s (see GET /v1/ready)",
            ));
        }
    }
}

/// `/v1/browser/cdp`: the browser target; `/v1/browser/cdp/page/{id}`: one page.
pub async fn browser_cdp(
    State(agent): State<Arc<Agent>>,
    ws: WsResult,
) -> Result<Response, ApiError> {
    cdp(agent, None, ws).await
}

pub async fn browser_cdp_target(
    State(agent): State<Arc<Agent>>,
    Path((kind, id)): Path<(String, String)>,
    ws: WsResult,
) -> Result<Response, ApiError> {
    if !matches!(kind.as_str(), "page" | "browser")
        || id.is_empty()
        || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(ApiError::not_found(format!("no CDP target {kind}/{id}")));
    }
    cdp(agent, Some(format!("/devtools/{kind}/{id}")), ws).await
}

async fn cdp(agent: Arc<Agent>, path: Option<String>, ws: WsResult) -> Result<Response, ApiError> {
    let d = desktop(&agent)?;
    let Ok(ws) = ws else {
        return Err(ApiError::bad_request(
            "this route is a CDP WebSocket; GET /v1/browser describes the browser",
        ));
    };
    let dt = running_browser(d).await?;
    if let Some(p) = &path {
        // Chromium answers an unknown target with a bare HTTP error; say what it is.
        let id = p.rsplit('/').next().unwrap_or_default();
        let targets = crate::browser::cdp::targets(dt.port)
            .await
            .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "browser_down", e))?;
        let known = targets
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["id"] == id));
        if !known && !p.starts_with("/devtools/browser/") {
            return Err(ApiError::not_found(format!(
                "no CDP target {id} (GET /v1/browser lists them)"
            )));
        }
    }
    let url = format!(
        "ws://127.0.0.1:{}{}",
        dt.port,
        path.unwrap_or(dt.browser_path)
    );
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(CDP_MESSAGE_LIMIT))
        .max_frame_size(Some(CDP_MESSAGE_LIMIT));
    let upstream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio_tungstenite::connect_async_with_config(&url, Some(config), true),
    )
    .await
    .map_err(|_| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "browser",
            "the browser did not accept the CDP connection within 5 s",
        )
    })?
    .map_err(|e| match e {
        tungstenite::Error::Http(r) if r.status() == StatusCode::NOT_FOUND => {
            ApiError::not_found("no such CDP target")
        }
        e => ApiError::new(StatusCode::BAD_GATEWAY, "browser", format!("CDP: {e}")),
    })?
    .0;
    Ok(ws
        .max_message_size(CDP_MESSAGE_LIMIT)
        .max_frame_size(CDP_MESSAGE_LIMIT)
        .on_upgrade(move |socket| berth_protocol::relay::pump_frames(socket, upstream)))
}

/// `GET /v1/a11y`: the accessibility tree as JSON (what `/accessibility` serialises as XML).
pub async fn a11y(State(agent): State<Arc<Agent>>) -> Result<Response, ApiError> {
    let apps = tokio::time::timeout(Duration::from_secs(20), agent.a11y.tree())
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "a11y_timeout",
                "the accessibility tree took longer than 20 s",
            )
        })?
        .map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "a11y_unavailable",
                e.to_string(),
            )
        })?;
    Ok(Json(A11yTree { applications: apps }).into_response())
}

/// `GET /v1/browser/tabs`: the browser's page targets; the first the browser lists is the one
/// last active (DevTools lists targets by their last activity).
pub async fn browser_tabs(
    State(agent): State<Arc<Agent>>,
) -> Result<Json<berth_protocol::workspace::BrowserTabs>, ApiError> {
    use berth_protocol::workspace::{BrowserTab, BrowserTabs, MAX_TABS};
    let d = desktop(&agent)?;
    let dt = running_browser(d).await?;
    let targets = crate::browser::cdp::targets(dt.port)
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "browser_down", e))?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let tabs = targets
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|t| t["type"] == "page")
        .take(MAX_TABS)
        .enumerate()
        .map(|(i, t)| BrowserTab {
            id: text(&t["id"]),
            title: text(&t["title"]),
            url: text(&t["url"]),
            active: i == 0,
        })
        .collect();
    Ok(Json(BrowserTabs { tabs }))
}

/// `GET /v1/browser/tabs/{id}/screenshot`: the tab's page as a JPEG, over CDP.
pub async fn browser_tab_screenshot(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    use base64::Engine;
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ApiError::not_found(format!("no tab {id:?}")));
    }
    let d = desktop(&agent)?;
    let dt = running_browser(d).await?;
    let down = |e: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "browser_down", e);
    let listed = crate::browser::cdp::targets(dt.port).await.map_err(down)?;
    if !listed.as_array().is_some_and(|a| {
        a.iter()
            .any(|t| t["id"] == id.as_str() && t["type"] == "page")
    }) {
        return Err(ApiError::not_found(format!("no tab {id}")));
    }
    let shot = async {
        let url = format!("ws://127.0.0.1:{}/devtools/page/{id}", dt.port);
        let mut cdp = crate::browser::cdp::Cdp::connect(url).await?;
        let r = cdp
            .call(
                "Page.captureScreenshot",
                serde_json::json!({"format": "jpeg", "quality": 60}),
                None,
            )
            .await;
        cdp.close().await;
        r
    };
    let r = tokio::time::timeout(Duration::from_secs(10), shot)
        .await
        .map_err(|_| down("the tab did not answer within 10 s".into()))?
        .map_err(down)?;
    let jpeg = base64::engine::general_purpose::STANDARD
        .decode(r["data"].as_str().unwrap_or_default())
        .map_err(|e| down(format!("the screenshot: {e}")))?;
    Ok((
        [
            (header::CONTENT_TYPE, "image/jpeg"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        jpeg,
    )
        .into_response())
}
