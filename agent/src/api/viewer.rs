//! Browser-facing access: a one-time URL (`POST /v1/viewer-tokens`) that, when opened, sets an
//! HttpOnly cookie honoured only on the browser-facing routes (live stream, VNC viewer) and
//! redirects to the clean URL. Tokens are single-use and short-lived; everything is bounded.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_protocol::routes::native;
use berth_protocol::{ViewerToken, ViewerTokenRequest};

use crate::Agent;
use crate::http::error::ApiError;
use crate::http::extract::ApiJson;
use crate::viewers::{Grant, SESSION_TTL};

pub const COOKIE: &str = "berth_viewer";
/// How long a viewer URL may wait to be opened, in seconds: by default and at most.
const DEFAULT_TOKEN_TTL: u64 = 60;
const MAX_TOKEN_TTL: u64 = 3600;

/// Paths a viewer URL may open (the browser-facing routes).
pub const VIEWER_PATHS: &[&str] = &[native::VNC_INDEX, native::STREAM_MP4, native::STREAM];

fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// `POST /v1/viewer-tokens`.
pub async fn mint(
    State(agent): State<Arc<Agent>>,
    ApiJson(req): ApiJson<ViewerTokenRequest>,
) -> Result<Response, ApiError> {
    let ttl = req.ttl_seconds.unwrap_or(DEFAULT_TOKEN_TTL);
    if !(1..=MAX_TOKEN_TTL).contains(&ttl) {
        return Err(ApiError::bad_request(format!(
            "ttl_seconds must be 1-{MAX_TOKEN_TTL}, not {ttl}"
        )));
    }
    let path = req.path.unwrap_or_else(|| VIEWER_PATHS[0].to_string());
    let bare = path.split('?').next().unwrap_or_default();
    if !VIEWER_PATHS.contains(&bare) {
        return Err(ApiError::bad_request(format!(
            "path must be one of the browser-facing routes {VIEWER_PATHS:?}, not {path:?}"
        )));
    }
    let token = agent
        .viewers
        .mint(Duration::from_secs(ttl), req.view_only.unwrap_or(false))
        .map_err(|e| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_tokens",
                e.to_string(),
            )
        })?;
    let sep = if path.contains('?') { '&' } else { '?' };
    let body = ViewerToken {
        url: format!("{path}{sep}t={token}"),
        expires_at: crate::time::rfc3339(SystemTime::now() + Duration::from_secs(ttl)),
    };
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

/// Guards the browser-facing routes: the bearer token, a viewer cookie, or a one-time `t`
/// (exchanged for the cookie with a redirect to the same URL without it).
pub async fn require_viewer(
    State(agent): State<Arc<Agent>>,
    mut req: Request,
    next: Next,
) -> Response {
    if crate::http::token_matches(req.headers(), &agent.token) {
        req.extensions_mut().insert(Grant::bearer());
        return next.run(req).await;
    }
    let query = req.uri().query().unwrap_or_default().to_string();
    let (tokens, rest): (Vec<&str>, Vec<&str>) = query
        .split('&')
        .filter(|p| !p.is_empty())
        .partition(|p| p.starts_with("t="));
    if let Some(t) = tokens.first() {
        let token = &t[2..];
        let Some((session, _grant)) = agent.viewers.redeem(token) else {
            return unauthorized(
                "this viewer link was already used or has expired; ask for a new one",
            );
        };
        // The path as the browser sent it (this router is nested under /v1).
        let path = req
            .extensions()
            .get::<axum::extract::OriginalUri>()
            .map(|u| u.path().to_string())
            .unwrap_or_else(|| format!("/v1{}", req.uri().path()));
        let clean = if rest.is_empty() {
            path
        } else {
            format!("{path}?{}", rest.join("&"))
        };
        let cookie = format!(
            "{COOKIE}={session}; Path=/v1; HttpOnly; SameSite=Lax; Max-Age={}",
            SESSION_TTL.as_secs()
        );
        let mut resp = (StatusCode::SEE_OTHER, "").into_response();
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&clean) {
            h.insert(header::LOCATION, v);
        }
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            h.insert(header::SET_COOKIE, v);
        }
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return resp;
    }
    match cookie_value(req.headers()).and_then(|c| agent.viewers.session(&c)) {
        Some(grant) => {
            req.extensions_mut().insert(grant);
            next.run(req).await
        }
        None => unauthorized("missing or wrong bearer token or viewer cookie"),
    }
}

fn unauthorized(msg: &str) -> Response {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", msg).into_response()
}
