//! Routes that reach through to a sandbox's agent, adding its bearer token: the viewer (noVNC
//! page, its WebSocket, the live stream — API key or the viewer cookie) and, with the API key,
//! screenshots, computer-use actions and files.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::{ApiError, ApiState};
use crate::error::Error;
use crate::viewer::{COOKIE, SESSION_TTL_MS, base_path};

type Result<T> = std::result::Result<T, ApiError>;
type WsResult =
    std::result::Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>;

/// Headers passed through in each direction.
const REQUEST_HEADERS: [header::HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::RANGE,
    header::ACCEPT,
    header::IF_NONE_MATCH,
];
const RESPONSE_HEADERS: [&str; 12] = [
    "content-type",
    "content-length",
    "content-range",
    "content-disposition",
    "accept-ranges",
    "etag",
    "last-modified",
    "cache-control",
    "x-screen-width",
    "x-screen-height",
    "x-scale",
    "x-settled-ms",
];

pub fn viewer_routes() -> Router<ApiState> {
    Router::new()
        .route("/sandbox/sandboxes/v1/{id}/vnc/", get(vnc_index))
        .route("/sandbox/sandboxes/v1/{id}/vnc/websockify", get(vnc_ws))
        .route("/sandbox/sandboxes/v1/{id}/vnc/{*path}", get(vnc_file))
        .route("/sandbox/sandboxes/v1/{id}/stream.mp4", get(stream_mp4))
        .route("/sandbox/sandboxes/v1/{id}/stream", get(stream_ws))
}

pub fn keyed_proxies() -> Router<ApiState> {
    Router::new()
        .route("/sandbox/sandboxes/v1/{id}/screenshot", get(screenshot))
        .route("/sandbox/sandboxes/v1/{id}/computer", post(computer))
        .route(
            "/sandbox/sandboxes/v1/{id}/files",
            get(files)
                .put(files)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
}

/// API key, or the viewer cookie of this very sandbox.
fn viewer_allowed(s: &ApiState, id: &str, headers: &HeaderMap) -> Result<()> {
    if s.key_ok(headers) {
        return Ok(());
    }
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .filter(|(k, _)| *k == COOKIE)
        .any(|(_, v)| s.c.viewer_session_ok(id, v));
    match cookie {
        true => Ok(()),
        false => Err(ApiError(Error::Unauthorized(
            "the viewer needs the X-Api-Key header or a viewer cookie from a one-time URL \
             (POST /sandbox/sandboxes/v1/{id}/viewer)"
                .into(),
        ))),
    }
}

fn vnc_page(id: &str) -> String {
    format!(
        "vnc.html?autoconnect=true&reconnect=true&resize=scale&path={}vnc/websockify",
        base_path(id).trim_start_matches('/')
    )
}

#[derive(serde::Deserialize)]
struct TokenQuery {
    t: Option<String>,
}

async fn vnc_index(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    axum::extract::Query(q): axum::extract::Query<TokenQuery>,
) -> Result<Response> {
    let mut resp = Response::builder()
        .status(StatusCode::SEE_OTHER)
        .header(header::LOCATION, vnc_page(&id))
        .header(header::CACHE_CONTROL, "no-store");
    match q.t {
        Some(t) => {
            let session = s.c.open_viewer_url(&id, &t)?;
            resp = resp.header(
                header::SET_COOKIE,
                format!(
                    "{COOKIE}={session}; Path={}; HttpOnly; SameSite=Lax; Max-Age={}",
                    base_path(&id),
                    SESSION_TTL_MS / 1000
                ),
            );
        }
        None => viewer_allowed(&s, &id, &headers)?,
    }
    resp.body(Body::empty())
        .map_err(|e| ApiError(Error::Internal(e.to_string())))
}

async fn vnc_file(
    State(s): State<ApiState>,
    Path((id, path)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response> {
    viewer_allowed(&s, &id, &headers)?;
    // The path arrives decoded: a `..` segment would climb out of `/v1/vnc/` on the agent (with
    // the agent's token), and a `?` or `#` would end the path. Dot segments are refused, as the
    // agent refuses them; the rest is encoded again.
    let segments: Vec<&str> = path.split('/').collect();
    if segments
        .iter()
        .any(|p| *p == ".." || *p == "." || p.contains('\\'))
    {
        return Err(Error::BadRequest("no such path in noVNC".into()).into());
    }
    let path = segments
        .iter()
        .map(|p| encode_segment(p))
        .collect::<Vec<_>>()
        .join("/");
    forward(
        &s,
        &id,
        Method::GET,
        &with_query(&format!("/v1/vnc/{path}"), q),
        &headers,
        Body::empty(),
        None,
    )
    .await
}

/// Percent-encodes a path segment's bytes but RFC 3986's unreserved characters.
fn encode_segment(seg: &str) -> String {
    let mut out = String::with_capacity(seg.len());
    for b in seg.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

async fn vnc_ws(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ws: WsResult,
) -> Result<Response> {
    viewer_allowed(&s, &id, &headers)?;
    relay_ws(&s, &id, "/v1/vnc/websockify", ws).await
}

async fn stream_ws(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ws: WsResult,
) -> Result<Response> {
    viewer_allowed(&s, &id, &headers)?;
    relay_ws(&s, &id, "/v1/stream", ws).await
}

async fn stream_mp4(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response> {
    viewer_allowed(&s, &id, &headers)?;
    forward(
        &s,
        &id,
        Method::GET,
        &with_query("/v1/stream.mp4", q),
        &headers,
        Body::empty(),
        None,
    )
    .await
}

async fn screenshot(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response> {
    let limit = Some(Duration::from_secs(60));
    forward(
        &s,
        &id,
        Method::GET,
        &with_query("/v1/screenshot", q),
        &headers,
        Body::empty(),
        limit,
    )
    .await
}

async fn computer(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    let limit = Some(Duration::from_secs(300));
    forward(&s, &id, Method::POST, "/v1/computer", &headers, body, limit).await
}

async fn files(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    method: Method,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    forward(
        &s,
        &id,
        method,
        &with_query("/v1/files", q),
        &headers,
        body,
        None,
    )
    .await
}

fn with_query(path: &str, q: Option<String>) -> String {
    match q {
        Some(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path.to_string(),
    }
}

/// One request to the agent, streamed both ways. `limit`: a deadline for the agent's answer
/// (streams and file transfers have none beyond the connect timeout).
async fn forward(
    s: &ApiState,
    id: &str,
    method: Method,
    path: &str,
    headers: &HeaderMap,
    body: Body,
    limit: Option<Duration>,
) -> Result<Response> {
    let (_, agent) = s.c.running_agent(id)?;
    let method = reqwest::Method::from_bytes(method.as_str().as_bytes())
        .map_err(|e| ApiError(Error::BadRequest(e.to_string())))?;
    let mut rb = agent.request(method, path);
    for h in REQUEST_HEADERS {
        if let Some(v) = headers.get(&h) {
            rb = rb.header(h.as_str(), v.as_bytes());
        }
    }
    rb = rb.body(reqwest::Body::wrap_stream(body.into_data_stream()));
    if let Some(l) = limit {
        rb = rb.timeout(l);
    }
    let resp = rb.send().await.map_err(|e| {
        ApiError(Error::Agent(format!(
            "the sandbox's agent did not answer: {e}"
        )))
    })?;
    let mut out = Response::builder().status(resp.status().as_u16());
    for name in RESPONSE_HEADERS {
        if let Some(v) = resp.headers().get(name)
            && let Ok(v) = HeaderValue::from_bytes(v.as_bytes())
        {
            out = out.header(name, v);
        }
    }
    out.body(Body::from_stream(resp.bytes_stream()))
        .map_err(|e| ApiError(Error::Internal(e.to_string())))
}

/// A WebSocket relayed to the agent's, frames passed through as they come.
async fn relay_ws(s: &ApiState, id: &str, path: &str, ws: WsResult) -> Result<Response> {
    let Ok(ws) = ws else {
        return Err(ApiError(Error::BadRequest(format!(
            "{path} is a WebSocket: connect with an Upgrade request"
        ))));
    };
    let (row, _) = s.c.running_agent(id)?;
    let base = row.agent_url.clone().unwrap_or_default();
    let url = format!("{}{path}", base.replacen("http://", "ws://", 1));
    let mut req = url
        .into_client_request()
        .map_err(|e| ApiError(Error::Internal(format!("agent URL: {e}"))))?;
    if let Ok(v) = HeaderValue::from_str(&format!("Bearer {}", row.agent_token)) {
        req.headers_mut().insert(header::AUTHORIZATION, v);
    }
    let upstream = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async(req),
    )
    .await
    .map_err(|_| {
        ApiError(Error::Agent(
            "the agent did not accept the WebSocket within 10 s".into(),
        ))
    })?
    .map_err(|e| {
        ApiError(Error::Agent(format!(
            "the agent refused the WebSocket: {e}"
        )))
    })?
    .0;
    Ok(ws.on_upgrade(move |socket| pump(socket, upstream)))
}

async fn pump(
    client: WebSocket,
    upstream: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
) {
    let (mut c_tx, mut c_rx) = client.split();
    let (mut u_tx, mut u_rx) = upstream.split();
    let up = async {
        while let Some(Ok(m)) = c_rx.next().await {
            let m = match m {
                Message::Text(t) => tungstenite::Message::text(t.as_str()),
                Message::Binary(b) => tungstenite::Message::binary(b),
                Message::Close(_) => break,
                _ => continue,
            };
            if u_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = u_tx.close().await;
    };
    let down = async {
        while let Some(Ok(m)) = u_rx.next().await {
            let m = match m {
                tungstenite::Message::Text(t) => Message::text(t.as_str()),
                tungstenite::Message::Binary(b) => Message::binary(b),
                tungstenite::Message::Close(_) => break,
                _ => continue,
            };
            if c_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = c_tx.send(Message::Close(None)).await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}
