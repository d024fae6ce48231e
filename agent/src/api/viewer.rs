//! Browser-facing access: a one-time URL (`POST /v1/viewer-tokens`) that, when opened, sets an
//! HttpOnly cookie honoured only on the browser-facing routes (live stream, VNC viewer) and
//! redirects to the clean URL. Tokens are single-use and short-lived; everything is bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_protocol::{ViewerToken, ViewerTokenRequest};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::extract::ApiJson;
use crate::Agent;

pub const COOKIE: &str = "berth_viewer";
/// How long a browser session from one URL lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
const DEFAULT_TOKEN_TTL: u64 = 60;
const MAX_TOKEN_TTL: u64 = 3600;
const MAX_PENDING: usize = 1024;
const MAX_SESSIONS: usize = 1024;

/// Paths a viewer URL may open (the browser-facing routes).
pub const VIEWER_PATHS: &[&str] = &["/v1/vnc/", "/v1/stream.mp4", "/v1/stream"];

#[derive(Debug, Clone, Copy)]
pub struct Grant {
    pub view_only: bool,
    expires: Instant,
}

#[derive(Default)]
struct Inner {
    tokens: HashMap<String, Grant>,
    sessions: HashMap<String, Grant>,
}

#[derive(Default, Clone)]
pub struct Viewers(Arc<Mutex<Inner>>);

fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("OS randomness");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Viewers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn prune(inner: &mut Inner) {
        let now = Instant::now();
        inner.tokens.retain(|_, g| g.expires > now);
        inner.sessions.retain(|_, g| g.expires > now);
    }

    pub fn mint(&self, ttl: Duration, view_only: bool) -> Result<String, ApiError> {
        let mut inner = self.lock();
        Self::prune(&mut inner);
        if inner.tokens.len() >= MAX_PENDING {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_tokens",
                format!("{MAX_PENDING} viewer URLs are waiting to be opened already"),
            ));
        }
        let token = random_hex(24);
        inner.tokens.insert(
            token.clone(),
            Grant {
                view_only,
                expires: Instant::now() + ttl,
            },
        );
        Ok(token)
    }

    /// Uses up a token, opening a session; `None` when unknown, used or expired.
    fn redeem(&self, token: &str) -> Option<(String, Grant)> {
        let mut inner = self.lock();
        Self::prune(&mut inner);
        let grant = inner.tokens.remove(token)?;
        if inner.sessions.len() >= MAX_SESSIONS {
            // The oldest session makes room.
            if let Some(oldest) = inner
                .sessions
                .iter()
                .min_by_key(|(_, g)| g.expires)
                .map(|(k, _)| k.clone())
            {
                inner.sessions.remove(&oldest);
            }
        }
        let session = random_hex(32);
        let grant = Grant {
            view_only: grant.view_only,
            expires: Instant::now() + SESSION_TTL,
        };
        inner.sessions.insert(session.clone(), grant);
        Some((session, grant))
    }

    fn session(&self, id: &str) -> Option<Grant> {
        let inner = self.lock();
        // Compare in constant time: the cookie is a credential.
        inner
            .sessions
            .iter()
            .find(|(k, _)| k.as_bytes().ct_eq(id.as_bytes()).into())
            .map(|(_, g)| *g)
            .filter(|g| g.expires > Instant::now())
    }
}

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
        .mint(Duration::from_secs(ttl), req.view_only.unwrap_or(false))?;
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
    if super::token_matches(req.headers(), &agent.token) {
        req.extensions_mut().insert(Grant {
            view_only: false,
            expires: Instant::now() + SESSION_TTL,
        });
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
