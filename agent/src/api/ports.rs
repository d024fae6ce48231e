//! Preview: `ANY /v1/ports/{port}/{*path}` relays to `127.0.0.1:{port}` inside the sandbox,
//! HTTP and WebSocket alike (the shared relay: streamed, headers passed, upgrades tunnelled).
//! The bearer token (and a viewer cookie) stay here; the app sees the rest of the request.
//! `/v1/ports/{port}` answers a redirect to `/v1/ports/{port}/`, so the page's relative links
//! resolve under the prefix.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_protocol::ops::{Routes, native as op};
use berth_protocol::relay::{Relay, RelayError, Upstream};
use berth_protocol::routes::native;

use crate::Agent;
use crate::http::error::ApiError;

/// The preview routes, relative to the native nest (`/v1`).
pub fn routes() -> Routes<Arc<Agent>> {
    Routes::new()
        .bind(&op::PREVIEW, relay)
        .bind(&op::PREVIEW_ROOT, relay)
        .bind(&op::PREVIEW_BARE, relay)
        .layer(DefaultBodyLimit::disable())
}

/// The port of a preview path's `{port}` segment: 1–65535.
pub fn parse_port(s: &str) -> Result<u16, String> {
    match s.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err(format!("port must be 1-65535, not {s:?}")),
    }
}

/// Splits `…/ports/{port}[/rest]` (the path as the router sees it, still percent-encoded)
/// into the port segment and the rest (`None` for the bare form without a slash).
fn split(path: &str) -> Option<(&str, Option<&str>)> {
    let at = path.find("/ports/")? + "/ports/".len();
    let tail = &path[at..];
    Some(match tail.find('/') {
        Some(slash) => (&tail[..slash], Some(&tail[slash..])),
        None => (tail, None),
    })
}

/// The upstream path of a request for `port`'s `rest` (from its `/`), and the path a `Location`
/// it answers under is given back under: the IDE serves itself under its public base URL
/// (`ide_base`), so its requests get that prefix back; any other app sees the bare path.
fn upstream_path(port: u16, rest: &str, ide: Option<(u16, &str)>) -> (String, String) {
    match ide {
        Some((p, base)) if p == port => (
            format!("{}{}", base.trim_end_matches('/'), rest),
            base.to_string(),
        ),
        _ => (rest.to_string(), "/".to_string()),
    }
}

async fn relay(State(agent): State<Arc<Agent>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let Some((segment, rest)) = split(&path) else {
        return ApiError::not_found(format!("no route {path}")).into_response();
    };
    let port = match parse_port(segment) {
        Ok(p) => p,
        Err(e) => return ApiError::bad_request(e).into_response(),
    };
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let Some(rest) = rest else {
        // Relative, so it resolves the same under any prefix (the controller's).
        return Response::builder()
            .status(StatusCode::PERMANENT_REDIRECT)
            .header(header::LOCATION, format!("{port}/{query}"))
            .body(Body::empty())
            .unwrap_or_else(|_| StatusCode::PERMANENT_REDIRECT.into_response());
    };
    let ide = agent
        .ide
        .as_ref()
        .map(|i| (crate::desktop::ide::PORT, i.base_url()));
    let (path, location_from) = upstream_path(port, rest, ide);
    let up = Upstream::new(format!("http://127.0.0.1:{port}"), format!("{path}{query}"))
        .strip(header::AUTHORIZATION)
        .strip_cookie(super::viewer::COOKIE)
        .rewrite_location(location_from, format!("{}/ports/{port}/", native::PREFIX));
    match Relay::shared().forward(req, &up).await {
        Ok(resp) => resp,
        Err(RelayError::Connect(e)) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "port_unreachable",
            format!("nothing answers on 127.0.0.1:{port} inside the sandbox ({e})"),
        )
        .into_response(),
        Err(RelayError::Upstream(e)) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "port_failed",
            format!("127.0.0.1:{port} inside the sandbox failed the request: {e}"),
        )
        .into_response(),
        Err(RelayError::BadRequest(e)) => ApiError::bad_request(e).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_paths_split() {
        assert_eq!(split("/ports/8000/a/b"), Some(("8000", Some("/a/b"))));
        assert_eq!(split("/ports/8000/"), Some(("8000", Some("/"))));
        assert_eq!(split("/ports/8000"), Some(("8000", None)));
        assert_eq!(parse_port("8000"), Ok(8000));
        assert!(parse_port("0").is_err());
        assert!(parse_port("65536").is_err());
        assert!(parse_port("-1").is_err());
        assert!(parse_port("http").is_err());
    }

    #[test]
    fn the_ide_port_gets_its_base_url_back_and_other_ports_do_not() {
        let ide = Some((8888, "/sandbox/sandboxes/v1/sb-1/ports/8888/"));
        assert_eq!(
            upstream_path(8888, "/lab/tree", ide),
            (
                "/sandbox/sandboxes/v1/sb-1/ports/8888/lab/tree".to_string(),
                "/sandbox/sandboxes/v1/sb-1/ports/8888/".to_string()
            )
        );
        assert_eq!(
            upstream_path(8888, "/", ide).0,
            "/sandbox/sandboxes/v1/sb-1/ports/8888/"
        );
        assert_eq!(
            upstream_path(8000, "/a", ide),
            ("/a".to_string(), "/".to_string())
        );
        assert_eq!(
            upstream_path(8888, "/a", None),
            ("/a".to_string(), "/".to_string())
        );
    }
}
