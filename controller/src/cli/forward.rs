//! `berth sandbox port-forward`: a local HTTP listener whose requests (WebSocket upgrades too)
//! go to a port inside the sandbox through the controller's preview route
//! (`/sandbox/sandboxes/v1/{id}/ports/{port}/{path}`), streamed both ways.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use axum::body::Body;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use clap::Args;

use berth_protocol::controller::ControllerClient;
use berth_protocol::routes::{controller as route, fill};

use super::Remote;
use super::through::Through;

#[derive(Args, Debug)]
#[command(after_help = "\
Each request on the local port is sent as HTTP to the sandbox's port through the controller \
(WebSocket upgrades included), so the browser or tool on this machine sees the server at the \
root of http://127.0.0.1:LOCAL/ while the controller checks the API key. Plain TCP protocols \
other than HTTP are not carried. Ctrl-C stops.")]
pub struct ForwardArgs {
    /// The sandbox's id.
    pub id: String,
    /// `LOCAL:REMOTE` (listen on 127.0.0.1:LOCAL, reach 127.0.0.1:REMOTE in the sandbox),
    /// `PORT` for the same number on both sides, or `:REMOTE` for any free local port.
    #[arg(value_parser = parse_ports)]
    pub ports: (u16, u16),
    /// The local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: std::net::IpAddr,
    #[command(flatten)]
    pub remote: Remote,
}

fn parse_ports(s: &str) -> Result<(u16, u16), String> {
    let port = |p: &str, what: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("{what} port {p:?} is not a number from 0 to 65535"))
    };
    let (local, remote) = match s.split_once(':') {
        Some(("", r)) => (0, port(r, "remote")?),
        Some((l, r)) => (port(l, "local")?, port(r, "remote")?),
        None => {
            let p = port(s, "the")?;
            (p, p)
        }
    };
    if remote == 0 {
        return Err("the remote port must not be 0".into());
    }
    Ok((local, remote))
}

struct Relay {
    through: Through,
    id: String,
    port: u16,
}

/// Request headers not passed on: the hop's own, and the ones the controller sets.
const HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "x-api-key",
    "authorization",
];

fn passed(name: &HeaderName) -> bool {
    !HOP.contains(&name.as_str())
}

pub async fn run(a: ForwardArgs) -> anyhow::Result<i32> {
    let (local, remote) = a.ports;
    let through = Through::new(&a.remote, &a.id);
    // Check the sandbox first, so a typo fails now and not at the first request.
    ControllerClient::new(a.remote.url(), a.remote.key())
        .get(&a.id)
        .await
        .with_context(|| format!("sandbox {}", a.id))?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(a.address, local))
        .await
        .with_context(|| format!("listening on {}:{local}", a.address))?;
    let addr = listener.local_addr()?;
    let url = format!("http://{addr}/");
    if a.remote.json {
        println!(
            "{}",
            serde_json::json!({"url": url, "local_port": addr.port(), "remote_port": remote})
        );
    } else {
        println!("forwarding {url} -> sandbox {} port {remote}", a.id);
        println!("Ctrl-C stops.");
    }
    let state = Arc::new(Relay {
        through,
        id: a.id.clone(),
        port: remote,
    });
    let app = axum::Router::new().fallback(handle).with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| anyhow!("serving {url}: {e}"))?;
    Ok(0)
}

fn bad_gateway(message: String) -> Response {
    let body = serde_json::json!({"error": {"code": "bad_gateway", "message": message}});
    (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
}

async fn handle(State(r): State<Arc<Relay>>, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let path_q = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let root = fill(route::SANDBOX_PORT_ROOT, &[&r.id, &r.port.to_string()]);
    let target = format!("{}{path_q}", root.trim_end_matches('/'));
    let is_ws = parts
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if is_ws {
        return match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
            Ok(ws) => websocket(&r, &target, &parts.headers, ws).await,
            Err(e) => e.into_response(),
        };
    }
    let Ok(method) = reqwest::Method::from_bytes(parts.method.as_str().as_bytes()) else {
        return bad_gateway(format!("method {} cannot be forwarded", parts.method));
    };
    let mut rb = r.through.request(method, &target);
    for (name, value) in &parts.headers {
        if passed(name) {
            rb = rb.header(name.as_str(), value.as_bytes());
        }
    }
    rb = rb.body(reqwest::Body::wrap_stream(body.into_data_stream()));
    let resp = match rb.send().await {
        Ok(resp) => resp,
        Err(e) => return bad_gateway(format!("the controller did not answer: {e}")),
    };
    let mut out = Response::builder().status(resp.status().as_u16());
    for (name, value) in resp.headers() {
        if matches!(
            name.as_str(),
            "connection" | "keep-alive" | "transfer-encoding" | "upgrade" | "trailer"
        ) {
            continue;
        }
        let value = match name == header::LOCATION {
            true => local_location(value.as_bytes(), &r.through.url(""), &root),
            false => value.as_bytes().to_vec(),
        };
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            out = out.header(name.as_str(), v);
        }
    }
    out.body(Body::from_stream(resp.bytes_stream()))
        .unwrap_or_else(|e| bad_gateway(e.to_string()))
}

/// The controller answers a redirect of the server inside with a `Location` under the preview
/// route (`/sandbox/sandboxes/v1/{id}/ports/{port}/x`, possibly with the controller's URL in
/// front); here the server is at the root, so that becomes `/x`. Other locations pass as they
/// are.
fn local_location(value: &[u8], base: &str, root: &str) -> Vec<u8> {
    let Ok(loc) = std::str::from_utf8(value) else {
        return value.to_vec();
    };
    let path = loc.strip_prefix(base).unwrap_or(loc);
    match path.strip_prefix(root.trim_end_matches('/')) {
        Some("") => b"/".to_vec(),
        Some(rest) if rest.starts_with(['/', '?']) => {
            let rest = if rest.starts_with('?') {
                format!("/{rest}")
            } else {
                rest.to_string()
            };
            rest.into_bytes()
        }
        _ => value.to_vec(),
    }
}

async fn websocket(r: &Relay, target: &str, headers: &HeaderMap, ws: WebSocketUpgrade) -> Response {
    let mut pass: Vec<(&str, &str)> = Vec::new();
    for name in ["sec-websocket-protocol", "origin", "cookie", "user-agent"] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
            pass.push((name, v));
        }
    }
    let (upstream, resp) = match r.through.websocket(target, &pass).await {
        Ok(pair) => pair,
        Err(e) => return bad_gateway(format!("the sandbox refused the WebSocket: {e:#}")),
    };
    let ws = match resp
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
    {
        Some(p) => ws.protocols([p.to_string()]),
        None => ws,
    };
    ws.on_upgrade(move |socket| berth_protocol::relay::pump_frames(socket, upstream))
}

#[cfg(test)]
mod tests {
    use super::parse_ports;

    #[test]
    fn redirects_under_the_preview_route_come_back_to_the_root() {
        let root = "/sandbox/sandboxes/v1/sb_1/ports/8000/";
        let base = "http://ctl:8780";
        let loc =
            |l: &str| String::from_utf8(super::local_location(l.as_bytes(), base, root)).unwrap();
        assert_eq!(loc("/sandbox/sandboxes/v1/sb_1/ports/8000/sub/"), "/sub/");
        assert_eq!(
            loc("http://ctl:8780/sandbox/sandboxes/v1/sb_1/ports/8000/a?b"),
            "/a?b"
        );
        assert_eq!(loc("/sandbox/sandboxes/v1/sb_1/ports/8000"), "/");
        assert_eq!(loc("/sandbox/sandboxes/v1/sb_1/ports/8000?x=1"), "/?x=1");
        assert_eq!(
            loc("/sandbox/sandboxes/v1/sb_1/ports/80000/"),
            "/sandbox/sandboxes/v1/sb_1/ports/80000/"
        );
        assert_eq!(loc("https://elsewhere/x"), "https://elsewhere/x");
    }

    #[test]
    fn port_pairs_parse_like_kubectl() {
        assert_eq!(parse_ports("8000:80"), Ok((8000, 80)));
        assert_eq!(parse_ports("8000"), Ok((8000, 8000)));
        assert_eq!(parse_ports(":80"), Ok((0, 80)));
        assert!(parse_ports("80:0").is_err());
        assert!(parse_ports("x:80").is_err());
        assert!(parse_ports("70000").is_err());
    }
}
