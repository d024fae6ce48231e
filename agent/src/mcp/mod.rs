//! MCP on the agent: `ANY /mcp`, Streamable HTTP (rmcp), behind the `/v1` bearer token.
//!
//! A client that opens with `initialize` (protocol revisions up to 2025-11-25) gets a session:
//! its `Mcp-Session-Id` header names it on every later request, `DELETE /mcp` ends it, and one
//! idle for [`SESSION_IDLE`] ends by itself. At most [`MAX_SESSIONS`] are open at once; one
//! more `initialize` is answered 503 with a JSON-RPC error saying so. A 2026-07-28 client
//! (`server/discover`, each request self-describing) needs no session. Answers carry no
//! absolute URL, so the endpoint works the same behind the controller's per-sandbox relay.

pub mod tools;
pub mod toolset;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use rmcp::handler::server::tool::ToolRouter;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio::sync::Mutex;

use berth_protocol::ops::Routes;

use crate::Agent;
use tools::BerthMcp;

/// MCP sessions open at once.
pub const MAX_SESSIONS: usize = 64;
/// A session with no request for this long is closed.
pub const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// The largest request body (a `write_file` of [`tools::WRITE_MAX`] bytes in base64 fits).
pub const MAX_BODY: usize = 16 << 20;
const SESSION_HEADER: &str = "mcp-session-id";

/// The route, with the same bearer check as `/v1`.
pub fn routes(agent: Arc<Agent>) -> Routes<Arc<Agent>> {
    let mcp = Arc::new(Mcp::new(agent.clone()));
    Routes::new()
        .bind(&berth_protocol::ops::native::MCP, move |req: Request| {
            let mcp = mcp.clone();
            async move { mcp.handle(req).await }
        })
        .route_layer(middleware::from_fn_with_state(
            agent,
            crate::http::require_token,
        ))
}

struct Mcp {
    service: StreamableHttpService<BerthMcp, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
    /// Held while a session opens, so the count and the opening are one step.
    opening: Mutex<()>,
}

impl Mcp {
    fn new(agent: Arc<Agent>) -> Mcp {
        let mut session_config = SessionConfig::default();
        session_config.keep_alive = Some(SESSION_IDLE);
        let mut sessions = LocalSessionManager::default();
        sessions.session_config = session_config;
        let sessions = Arc::new(sessions);
        let browser = match agent.desktop {
            Some(_) => agent.browser_toolset.members(),
            None => Vec::new(),
        };
        let tools = Arc::new(tool_table(&browser));
        let mut asking = tool_table(&browser);
        asking.add_route(toolset::request_route());
        let asking = Arc::new(asking);
        // The bearer token guards this route, so `Host` is not checked (the agent is reached
        // by container addresses and through the controller's relay, not only on loopback).
        // A session-less (2026-07-28) request whose answer is one message gets it as JSON
        // rather than a one-event stream; a session's answers stay SSE.
        let config = StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_json_response(true)
            .with_max_request_body_bytes(MAX_BODY);
        let service = StreamableHttpService::new(
            // A session opened while the sandbox lets the agent ask for a person lists
            // `request_human_control`; others do not have it at all.
            // One whose run enables login sites lists `login` (naming them) too.
            move || {
                let view = agent.control.view();
                let table = match view.requests_enabled {
                    true => asking.clone(),
                    false => tools.clone(),
                };
                let table = match view.logins.is_empty() {
                    true => table,
                    false => {
                        let mut t = (*table).clone();
                        t.add_route(toolset::login_route(&view.logins));
                        Arc::new(t)
                    }
                };
                Ok(BerthMcp::new(agent.clone(), table))
            },
            sessions.clone(),
            config,
        );
        Mcp {
            service,
            sessions,
            opening: Mutex::new(()),
        }
    }

    async fn handle(&self, req: Request) -> Response {
        if req.method() == Method::DELETE {
            return ended(shape(self.service.handle(req).await.map(Body::new)).await);
        }
        if req.method() != Method::POST || req.headers().contains_key(SESSION_HEADER) {
            return shape(self.service.handle(req).await.map(Body::new)).await;
        }
        // A POST outside a session: an `initialize` opens one, so it is counted first.
        let (parts, body) = req.into_parts();
        let read = Request::from_parts(parts.clone(), body);
        let bytes = match crate::http::extract::read_body(read, MAX_BODY, false).await {
            Ok(b) => b,
            Err(e) => return rpc_error(e.status, None, -32600, e.message),
        };
        let initialize = Opening::of(&bytes);
        let req = Request::from_parts(parts, Body::from(bytes));
        let Some(id) = initialize else {
            return shape(self.service.handle(req).await.map(Body::new)).await;
        };
        let _opening = self.opening.lock().await;
        let open = self.sessions.sessions.read().await.len();
        if let Some(refusal) = session_refusal(open, MAX_SESSIONS) {
            return rpc_error(StatusCode::SERVICE_UNAVAILABLE, id, -32000, refusal);
        }
        shape(self.service.handle(req).await.map(Body::new)).await
    }
}

/// Whether a request body is an `initialize` request, and its id.
struct Opening;

impl Opening {
    fn of(body: &[u8]) -> Option<Option<serde_json::Value>> {
        #[derive(serde::Deserialize)]
        struct Head {
            method: Option<String>,
            id: Option<serde_json::Value>,
        }
        let head: Head = serde_json::from_slice(body).ok()?;
        (head.method.as_deref() == Some("initialize")).then_some(head.id)
    }
}

/// Every tool: the agent's own, the computer toolset's members, and the browser toolset's
/// members served (`browser`: none without a desktop).
pub fn tool_table(browser: &[String]) -> ToolRouter<BerthMcp> {
    let mut router = BerthMcp::own_tools();
    for route in toolset::routes()
        .into_iter()
        .chain(toolset::browser_routes(browser))
    {
        router.add_route(route);
    }
    router
}

/// Why one more session cannot open when `open` are, if it cannot.
pub fn session_refusal(open: usize, max: usize) -> Option<String> {
    (open >= max).then(|| {
        format!(
            "{open} MCP sessions are open, the most this agent keeps: end one (DELETE {} with its \
             Mcp-Session-Id) or wait, a session idle for {} min ends by itself",
            berth_protocol::routes::native::MCP,
            SESSION_IDLE.as_secs() / 60
        )
    })
}

/// rmcp answers an ended session's `DELETE` 202; it is done, not accepted for later, and MCP
/// clients (the Python SDK) expect 200 or 204.
fn ended(resp: Response) -> Response {
    match resp.status() {
        StatusCode::ACCEPTED => StatusCode::NO_CONTENT.into_response(),
        _ => resp,
    }
}

/// A JSON-RPC error answer at an HTTP error status (what MCP clients read from a failed POST).
fn rpc_error(
    status: StatusCode,
    id: Option<serde_json::Value>,
    code: i64,
    message: impl Into<String>,
) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id.unwrap_or(serde_json::Value::Null),
        "error": {"code": code, "message": message.into()},
    });
    let mut resp = (status, axum::Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    resp
}

/// rmcp answers transport errors (unknown session, wrong `Accept`, 405) as plain text or with
/// no body; they become JSON-RPC error bodies with the same status and headers, which MCP
/// clients surface (and the agent's fallback would otherwise rewrite in the compat shape).
async fn shape(resp: Response) -> Response {
    let status = resp.status();
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| !ct.starts_with("text/plain"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = match text.is_empty() {
        true => status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_string(),
        false => text,
    };
    let code = match status {
        StatusCode::NOT_FOUND => -32001,
        s if s.is_server_error() => -32603,
        _ => -32600,
    };
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_initialize_request_opens_a_session() {
        let init = br#"{"jsonrpc":"2.0","id":7,"method":"initialize","params":{}}"#;
        assert_eq!(Opening::of(init), Some(Some(json!(7))));
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#;
        assert_eq!(Opening::of(call), None);
        assert_eq!(Opening::of(b"not json"), None);
        assert_eq!(
            Opening::of(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            None
        );
    }

    #[test]
    fn sessions_past_the_cap_are_refused_with_a_reason() {
        assert_eq!(session_refusal(0, 2), None);
        assert_eq!(session_refusal(1, 2), None);
        let why = session_refusal(2, 2).expect("refused");
        assert!(why.contains("2 MCP sessions are open"), "{why}");
        assert!(why.contains("DELETE /mcp"), "{why}");
    }
}
