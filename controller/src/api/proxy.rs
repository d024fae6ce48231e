//! Routes that reach through to a sandbox's agent, over the shared relay
//! (`berth_protocol::relay`: streamed both ways, every end-to-end header passed, WebSocket
//! upgrades tunnelled): the client's credentials — `X-Api-Key`, `Authorization`, the viewer
//! and preview cookies — are dropped and the agent's bearer token is added, never shown.
//!
//! - with the API key: the agent's whole native API (`…/{id}/v1/{*path}`), and the older
//!   screenshot, computer-use and files routes;
//! - with the API key or the viewer cookie: the viewer (noVNC page, its WebSocket and files,
//!   the live stream);
//! - with the API key or that port's preview cookie: a port inside the sandbox
//!   (`…/{id}/ports/{port}/…`, relayed by the agent to `127.0.0.1:{port}`), and the one-time
//!   URL that sets the cookie (`POST …/{id}/ports/{port}/url`).

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use berth_protocol::controller::{PortUrl, PortUrlRequest};
use berth_protocol::ops::{Routes, controller as op};
use berth_protocol::relay::{Relay, RelayError, Upstream};
use berth_protocol::routes::header as wire;
use serde::Deserialize;

use super::ApiState;
use crate::error::Error;
use crate::http::ApiError;
use crate::viewer::{COOKIE, PORT_COOKIE, PORT_TOKEN_PARAM, SESSION_TTL_MS, port_path};
use berth_protocol::routes::controller::sandbox_base;

type Result<T> = std::result::Result<T, ApiError>;
type Params = Path<HashMap<String, String>>;

pub fn viewer_routes() -> Routes<ApiState> {
    Routes::new()
        .bind(&op::VNC_INDEX, vnc_index)
        .bind(&op::VNC_WS, viewer)
        .bind(&op::VNC_FILE, viewer)
        .bind(&op::STREAM_MP4, viewer)
        .bind(&op::STREAM_WS, viewer)
        // Preview checks its own credentials: the API key or the port's cookie, and the
        // bare `…/ports/{port}` (to which no cookie is sent) redirects without any.
        .bind(&op::SANDBOX_PREVIEW, preview)
        // POST mints the one-time URL (in `preview`); other methods reach the app's `/url`.
        .bind_with(&op::SANDBOX_PORT_URL, preview, |m| m.fallback(preview))
        .bind(&op::SANDBOX_PREVIEW_ROOT, preview)
        .bind(&op::SANDBOX_PREVIEW_BARE, preview)
        .layer(axum::extract::DefaultBodyLimit::disable())
}

pub fn keyed_proxies() -> Routes<ApiState> {
    let unbounded = |m: MethodRouter<ApiState>| m.layer(axum::extract::DefaultBodyLimit::disable());
    Routes::new()
        .bind(&op::SANDBOX_SCREENSHOT, screenshot)
        .bind(&op::SANDBOX_COMPUTER, computer)
        .bind_with(&op::SANDBOX_FILES_GET, native, unbounded)
        .bind_with(&op::SANDBOX_FILES_PUT, native, unbounded)
        .bind_with(&op::SANDBOX_AGENT, native, unbounded)
        .bind_with(&op::SANDBOX_MCP, mcp, unbounded)
}

/// The values of cookie `name` in the request's `Cookie` headers.
fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .filter(move |(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// API key, or the viewer cookie of this very sandbox.
fn viewer_allowed(s: &ApiState, id: &str, headers: &HeaderMap) -> Result<()> {
    if s.key_ok(headers) || cookies(headers, COOKIE).any(|v| s.c.viewers.viewer_session_ok(id, v)) {
        return Ok(());
    }
    Err(ApiError(Error::Unauthorized(
        "the viewer needs the X-Api-Key header or a viewer cookie from a one-time URL \
         (POST /sandbox/sandboxes/v1/{id}/viewer)"
            .into(),
    )))
}

/// The part of a controller path after `/sandbox/sandboxes/v1/{id}`, still percent-encoded
/// (`/v1/fs/list`, `/vnc/websockify`, `/ports/8000/app.js`), with the query.
fn rest_of(req: &Request) -> String {
    let path = req.uri().path();
    // The fifth `/` starts the rest: /sandbox/sandboxes/v1/{id}/…
    let rest = path
        .match_indices('/')
        .nth(4)
        .map(|(i, _)| &path[i..])
        .unwrap_or("");
    match req.uri().query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    }
}

/// Relays `req` to the sandbox's agent at `agent_path` (path and query, percent-encoded). A
/// `Location` the agent answers under `location.0` is given back under `location.1`.
async fn to_agent(
    s: &ApiState,
    id: &str,
    req: Request,
    agent_path: String,
    location: (String, String),
    limit: Option<Duration>,
) -> Result<Response> {
    let (row, agent) = s.c.ctx.running_agent(id)?;
    let bearer = HeaderValue::from_str(&format!("Bearer {}", row.agent_token)).map_err(|_| {
        ApiError(Error::Internal(
            "the agent token is not a header value".into(),
        ))
    })?;
    let mut up = Upstream::new(agent.base(), agent_path)
        .strip(HeaderName::from_static(wire::API_KEY))
        .strip(header::AUTHORIZATION)
        .strip_cookie(COOKIE)
        .strip_cookie(PORT_COOKIE)
        .header(header::AUTHORIZATION, bearer)
        .rewrite_location(location.0, location.1);
    if let Some(l) = limit {
        up = up.timeout(l);
    }
    Relay::shared().forward(req, &up).await.map_err(|e| {
        ApiError(match e {
            RelayError::BadRequest(m) => Error::BadRequest(m),
            RelayError::Connect(m) => {
                Error::Agent(format!("the sandbox's agent did not answer: {m}"))
            }
            RelayError::Upstream(m) => {
                Error::Agent(format!("the sandbox's agent failed the request: {m}"))
            }
        })
    })
}

/// The native API's paths as the controller serves them: `/v1/x` → `…/{id}/v1/x`.
fn native_location(id: &str) -> (String, String) {
    ("/v1/".into(), format!("{}v1/", sandbox_base(id)))
}

/// `…/{id}/v1/{*path}` → the agent's `/v1/{path}`; also the files route (its path is the
/// agent's `/v1/files`).
async fn native(State(s): State<ApiState>, Path(p): Params, req: Request) -> Result<Response> {
    let id = p.get("id").cloned().unwrap_or_default();
    let rest = rest_of(&req);
    let path = match rest.starts_with("/v1/") {
        true => rest,
        false => format!("/v1{rest}"),
    };
    if controls_push(req.method(), path.split('?').next().unwrap_or_default()) {
        return Err(ApiError(Error::NotFound(format!(
            "{} {path} is the controller's own call to the agent: take, hand back or decline \
             the controls with /sandbox/sandboxes/v1/{id}/control",
            req.method()
        ))));
    }
    let resize = req.method() == Method::PUT
        && path.split('?').next() == Some(berth_protocol::routes::native::DISPLAY);
    let resp = to_agent(&s, &id, req, path, native_location(&id), None).await?;
    if resize && resp.status() == StatusCode::OK {
        // The record follows the desktop's new size before the caller hears it is done.
        s.c.sandboxes.screen_changed(&id).await;
    }
    Ok(resp)
}

/// The agent's control routes only the controller calls (the lease's pushes): never relayed
/// for a caller, so an engine cannot hand itself the controls back.
fn controls_push(method: &Method, path: &str) -> bool {
    use berth_protocol::routes::native as n;
    matches!(
        (method.as_str(), path),
        ("PUT" | "DELETE", n::CONTROL)
            | ("PUT", n::CONTROL_SETTINGS)
            | ("POST", n::CONTROL_DECLINE)
            | ("POST", n::BROWSER_LOGIN)
            | ("POST", n::BROWSER_FORGET)
    )
}

/// How long a relayed MCP answer's body may go without a byte from the agent (an SSE stream,
/// which the agent keeps alive with pings every 15 s, lasts as long as it sends).
pub const MCP_IDLE: Duration = Duration::from_secs(300);
/// How long the agent may take to begin its answer: a session-less tool call is answered as
/// JSON once done, and the agent's longest `exec` runs 20 minutes.
pub const MCP_ANSWER_WAIT: Duration = Duration::from_secs(25 * 60);

/// `ANY …/{id}/mcp` → the agent's MCP server (`/mcp`): POST (a JSON or SSE answer, streamed),
/// GET (the session's SSE stream), DELETE (ends the session); `Mcp-Session-Id` and
/// `Mcp-Protocol-Version` pass both ways like every end-to-end header.
async fn mcp(State(s): State<ApiState>, Path(p): Params, req: Request) -> Result<Response> {
    let id = p.get("id").cloned().unwrap_or_default();
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let path = format!("{}{query}", berth_protocol::routes::native::MCP);
    // The `login` tool is the controller's: a call to it is answered here, with the site's
    // values handed to the agent on the controller's own route; every other message goes on.
    let req = match login_call(req).await? {
        LoginCall::Login { rpc_id, site } => {
            return Ok(login_answer(&s, &id, rpc_id, &site).await);
        }
        LoginCall::Other(req) => req,
    };
    let location = (
        berth_protocol::routes::native::MCP.to_string(),
        format!("{}mcp", sandbox_base(&id)),
    );
    let relayed = tokio::time::timeout(
        MCP_ANSWER_WAIT,
        to_agent(&s, &id, req, path, location, None),
    )
    .await
    .map_err(|_| {
        ApiError(Error::Agent(format!(
            "the sandbox's MCP server sent no answer within {}s",
            MCP_ANSWER_WAIT.as_secs()
        )))
    })??;
    Ok(relayed.map(|body| idle_bounded(body, MCP_IDLE)))
}

/// The most bytes of an MCP message looked into for a `login` call (a longer message is
/// relayed as it is: a login call is a few dozen bytes).
const LOGIN_CALL_MAX: usize = 64 << 10;

enum LoginCall {
    Login {
        rpc_id: serde_json::Value,
        site: String,
    },
    Other(Request),
}

/// Whether `req` is a JSON-RPC `tools/call` of `login` (its id and site), else the request
/// as it came.
async fn login_call(req: Request) -> Result<LoginCall> {
    let small = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n <= LOGIN_CALL_MAX);
    if req.method() != Method::POST || !small {
        return Ok(LoginCall::Other(req));
    }
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, LOGIN_CALL_MAX)
        .await
        .map_err(|e| ApiError(Error::BadRequest(format!("reading the MCP message: {e}"))))?;
    if let Some((rpc_id, site)) = parse_login_call(&bytes) {
        return Ok(LoginCall::Login { rpc_id, site });
    }
    Ok(LoginCall::Other(Request::from_parts(
        parts,
        Body::from(bytes),
    )))
}

/// A JSON-RPC message's id and `arguments.site` when it calls the `login` tool (pure).
pub fn parse_login_call(bytes: &[u8]) -> Option<(serde_json::Value, String)> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    if v["method"] != "tools/call" || v["params"]["name"] != berth_protocol::login::TOOL {
        return None;
    }
    let site = v["params"]["arguments"]["site"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Some((
        v.get("id").cloned().unwrap_or(serde_json::Value::Null),
        site,
    ))
}

/// The `login` tool's JSON-RPC answer: the outcome's phrase, the answer as structured
/// content; a refusal is a tool error with the REST error body.
async fn login_answer(s: &ApiState, id: &str, rpc_id: serde_json::Value, site: &str) -> Response {
    let c = s.c.clone();
    let (sandbox, name) = (id.to_string(), site.to_string());
    let done = tokio::spawn(async move { crate::login::login(&c.ctx, &sandbox, &name).await })
        .await
        .unwrap_or_else(|e| Err(Error::Internal(format!("the login's task: {e}"))));
    let result = match done {
        Ok(a) => serde_json::json!({
            "content": [{"type": "text", "text": a.message}],
            "structuredContent": a,
            "isError": !a.signed_in,
        }),
        Err(e) => {
            let body = berth_protocol::ErrorBody::new(e.code(), e.to_string());
            serde_json::json!({
                "content": [{"type": "text", "text": e.to_string()}],
                "structuredContent": body,
                "isError": true,
            })
        }
    };
    let msg = serde_json::json!({"jsonrpc": "2.0", "id": rpc_id, "result": result});
    (
        [(header::CONTENT_TYPE, "application/json")],
        msg.to_string(),
    )
        .into_response()
}

/// `body`, failing (which ends the answer) once it has delivered nothing for `idle`.
fn idle_bounded(body: Body, idle: Duration) -> Body {
    use futures_util::StreamExt;
    let frames =
        futures_util::stream::unfold(Some(body.into_data_stream()), move |rest| async move {
            let mut rest = rest?;
            match tokio::time::timeout(idle, rest.next()).await {
                Ok(Some(chunk)) => Some((chunk, Some(rest))),
                Ok(None) => None,
                Err(_) => Some((
                    Err(axum::Error::new(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the sandbox's MCP stream sent nothing for {idle:?}"),
                    ))),
                    None,
                )),
            }
        });
    Body::from_stream(frames)
}

async fn screenshot(State(s): State<ApiState>, Path(p): Params, req: Request) -> Result<Response> {
    let id = p.get("id").cloned().unwrap_or_default();
    let path = format!("/v1{}", rest_of(&req));
    let limit = Some(Duration::from_secs(60));
    to_agent(&s, &id, req, path, native_location(&id), limit).await
}

async fn computer(State(s): State<ApiState>, Path(p): Params, req: Request) -> Result<Response> {
    let id = p.get("id").cloned().unwrap_or_default();
    let path = format!("/v1{}", rest_of(&req));
    let limit = Some(Duration::from_secs(300));
    to_agent(&s, &id, req, path, native_location(&id), limit).await
}

/// The viewer's routes but its index: `…/{id}/{vnc/…,stream…}` → the agent's `/v1/…`.
async fn viewer(State(s): State<ApiState>, Path(p): Params, req: Request) -> Result<Response> {
    let id = p.get("id").cloned().unwrap_or_default();
    viewer_allowed(&s, &id, req.headers())?;
    let path = format!("/v1{}", rest_of(&req));
    to_agent(&s, &id, req, path, native_location(&id), None).await
}

fn vnc_page(id: &str) -> String {
    format!(
        "vnc.html?autoconnect=true&reconnect=true&resize=scale&path={}vnc/websockify",
        sandbox_base(id).trim_start_matches('/')
    )
}

#[derive(Deserialize)]
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
            let session = s.c.viewers.open_viewer_url(&id, &t)?;
            resp = resp.header(
                header::SET_COOKIE,
                format!(
                    "{COOKIE}={session}; Path={}; HttpOnly; SameSite=Lax; Max-Age={}",
                    sandbox_base(&id),
                    SESSION_TTL_MS / 1000
                ),
            );
        }
        None => viewer_allowed(&s, &id, &headers)?,
    }
    resp.body(Body::empty())
        .map_err(|e| ApiError(Error::Internal(e.to_string())))
}

/// The port of a preview path: 1–65535, else 400.
fn parse_port(s: &str) -> Result<u16> {
    match s.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err(ApiError(Error::BadRequest(format!(
            "port must be 1-65535, not {s:?}"
        )))),
    }
}

/// Preview: `ANY …/{id}/ports/{port}/{*path}` → the agent's `/v1/ports/{port}/{path}`, which
/// relays to `127.0.0.1:{port}` inside the sandbox. `POST …/ports/{port}/url` is the
/// one-time URL (so the app's own `/url` takes every method but POST here).
async fn preview(State(s): State<ApiState>, Path(p): Params, req: Request) -> Result<Response> {
    let id = p.get("id").cloned().unwrap_or_default();
    let port = parse_port(p.get("port").map(String::as_str).unwrap_or(""))?;
    let rest = rest_of(&req);
    // After `/ports/{port}`: `/…` or nothing (the bare form).
    let path = rest.split('?').next().unwrap_or("");
    let tail = path
        .match_indices('/')
        .nth(2)
        .map(|(i, _)| path[i..].to_string())
        .unwrap_or_default();
    if tail.is_empty() {
        // The bare `…/ports/{port}`: relative links resolve only under the slash, and the
        // port's cookie is only sent there.
        let q = req
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        return Response::builder()
            .status(StatusCode::PERMANENT_REDIRECT)
            .header(header::LOCATION, format!("{port}/{q}"))
            .body(Body::empty())
            .map_err(|e| ApiError(Error::Internal(e.to_string())));
    }
    if req.method() == Method::POST && tail == "/url" {
        return mint_port_url(&s, &id, port, req).await;
    }
    if tail == "/"
        && let Some(token) = preview_token(req.uri().query())
    {
        let session = s.c.viewers.open_port_url(&id, port, &token)?;
        return Response::builder()
            .status(StatusCode::SEE_OTHER)
            .header(header::LOCATION, port_path(&id, port))
            .header(header::CACHE_CONTROL, "no-store")
            .header(
                header::SET_COOKIE,
                format!(
                    "{PORT_COOKIE}={session}; Path={}; HttpOnly; SameSite=Lax; Max-Age={}",
                    port_path(&id, port),
                    SESSION_TTL_MS / 1000
                ),
            )
            .body(Body::empty())
            .map_err(|e| ApiError(Error::Internal(e.to_string())));
    }
    let headers = req.headers();
    if !s.key_ok(headers)
        && !cookies(headers, PORT_COOKIE).any(|v| s.c.viewers.port_session_ok(&id, port, v))
    {
        return Err(ApiError(Error::Unauthorized(format!(
            "a preview needs the X-Api-Key header or the cookie a preview URL sets \
             (POST /sandbox/sandboxes/v1/{id}/ports/{port}/url)"
        ))));
    }
    let agent_path = format!("/v1{rest}");
    let location = (format!("/v1/ports/{port}/"), port_path(&id, port));
    to_agent(&s, &id, req, agent_path, location, None).await
}

/// The one-time token of a preview URL's query (`?berth_preview=…`).
fn preview_token(query: Option<&str>) -> Option<String> {
    serde_urlencoded::from_str::<HashMap<String, String>>(query?)
        .ok()?
        .remove(PORT_TOKEN_PARAM)
}

async fn mint_port_url(s: &ApiState, id: &str, port: u16, req: Request) -> Result<Response> {
    if !s.key_ok(req.headers()) {
        return Err(ApiError(Error::Unauthorized(
            "missing or wrong X-Api-Key header".into(),
        )));
    }
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, crate::http::JSON_LIMIT)
        .await
        .map_err(|e| ApiError(Error::BadRequest(format!("reading the body: {e}"))))?;
    let body = match bytes.is_empty() {
        true => PortUrlRequest::default(),
        false => {
            let req = Request::from_parts(parts, Body::from(bytes));
            crate::http::Json::<PortUrlRequest>::from_request(req, &())
                .await?
                .0
        }
    };
    let (url, expires_at) = s.c.viewers.mint_port_url(id, port, body.ttl_seconds)?;
    Ok((StatusCode::CREATED, axum::Json(PortUrl { url, expires_at })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_keeps_the_control_pushes_to_the_controller() {
        assert!(controls_push(&Method::PUT, "/v1/control"));
        assert!(controls_push(&Method::DELETE, "/v1/control"));
        assert!(controls_push(&Method::PUT, "/v1/control/settings"));
        assert!(controls_push(&Method::POST, "/v1/control/decline"));
        assert!(!controls_push(&Method::GET, "/v1/control"));
        assert!(!controls_push(&Method::POST, "/v1/control/request"));
    }

    #[tokio::test]
    async fn an_idle_bounded_body_passes_its_chunks_and_fails_once_silent() {
        let (tx, rx) =
            tokio::sync::mpsc::channel::<std::result::Result<bytes::Bytes, std::io::Error>>(4);
        let body = idle_bounded(
            Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            })),
            Duration::from_millis(200),
        );
        let mut frames = body.into_data_stream();
        use futures_util::StreamExt;
        tx.send(Ok(bytes::Bytes::from_static(b"event: ping\n\n")))
            .await
            .unwrap();
        assert_eq!(
            frames.next().await.unwrap().unwrap(),
            bytes::Bytes::from_static(b"event: ping\n\n")
        );
        let started = std::time::Instant::now();
        let silent = frames.next().await.unwrap();
        assert!(silent.is_err(), "{silent:?}");
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(frames.next().await.is_none(), "nothing after the failure");
        drop(tx);
    }

    #[tokio::test]
    async fn an_idle_bounded_body_ends_when_its_source_ends() {
        let body = idle_bounded(Body::from("done"), Duration::from_secs(5));
        let bytes = axum::body::to_bytes(body, 1024).await.unwrap();
        assert_eq!(&bytes[..], b"done");
    }
}
