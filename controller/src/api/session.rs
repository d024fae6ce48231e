//! The session view's routes (`crate::session`): the keyed mint, the page, its assets and the
//! `api/…` routes it uses. Everything under `…/{id}/session/` takes the API key or the
//! session cookie of that very sandbox; the agent's operations the page needs (a terminal,
//! the file tree, downloads and uploads, the desktop's WebSocket) are relayed with the
//! agent's bearer token, the client's credentials dropped.

use std::collections::HashMap;
use std::path::Path as FsPath;
use std::sync::OnceLock;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_protocol::controller::SessionUrl;
use berth_protocol::ops::{Routes, controller as op};
use berth_protocol::relay::{Relay, RelayError, Upstream};
use berth_protocol::routes::header as wire;
use berth_protocol::workspace::DiffQuery;
use serde::Deserialize;
use serde_json::json;

use super::ApiState;
use crate::control::Caller;
use crate::error::Error;
use crate::http::ApiError;
use crate::session::{self, COOKIE, page_path};
use crate::viewer::{COOKIE as VIEWER_COOKIE, PORT_COOKIE, SESSION_TTL_MS};

type Result<T> = std::result::Result<T, ApiError>;

pub fn routes() -> Routes<ApiState> {
    Routes::new()
        .bind(&op::SANDBOX_SESSION, mint)
        .bind(&op::SESSION_PAGE, index)
        // Every method reaches `path` (the page's `api/…` calls), documented as its GET.
        .bind_with(&op::SESSION_PATH, path, |m| {
            m.fallback(path)
                .layer(axum::extract::DefaultBodyLimit::disable())
        })
}

fn cookie_values<'a>(headers: &'a HeaderMap) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .filter(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v)
}

/// The API key, or the session cookie of this very sandbox.
fn allowed(s: &ApiState, id: &str, headers: &HeaderMap) -> Result<()> {
    if s.key_ok(headers) || cookie_values(headers).any(|v| s.c.sessions.session_cookie_ok(id, v)) {
        return Ok(());
    }
    Err(ApiError(Error::Unauthorized(format!(
        "the session view needs the X-Api-Key header or the cookie its one-time URL sets \
         (POST /sandbox/sandboxes/v1/{id}/session, or `berth sandbox open {id}`)"
    ))))
}

async fn mint(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    if !s.key_ok(&headers) {
        return Err(ApiError(Error::Unauthorized(
            "missing or wrong X-Api-Key header".into(),
        )));
    }
    let (url, expires_at) = s.c.sessions.mint_session_url(&id)?;
    Ok(axum::Json(SessionUrl { url, expires_at }).into_response())
}

/// Headers every answer of the page's own files carries.
fn hardened(mut resp: Response, host: Option<&str>) -> Response {
    let h = resp.headers_mut();
    let csp = HeaderValue::from_str(&session::csp(host))
        .unwrap_or_else(|_| HeaderValue::from_static("default-src 'self'"));
    h.insert(header::CONTENT_SECURITY_POLICY, csp);
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

fn host_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

#[derive(Deserialize)]
struct TokenQuery {
    t: Option<String>,
}

async fn index(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    axum::extract::Query(q): axum::extract::Query<TokenQuery>,
) -> Result<Response> {
    if let Some(t) = q.t {
        let session = s.c.sessions.open_session_url(&id, &t)?;
        return Response::builder()
            .status(StatusCode::SEE_OTHER)
            .header(header::LOCATION, page_path(&id))
            .header(header::CACHE_CONTROL, "no-store")
            .header(
                header::SET_COOKIE,
                format!(
                    "{COOKIE}={session}; Path={}; HttpOnly; SameSite=Lax; Max-Age={}",
                    page_path(&id),
                    SESSION_TTL_MS / 1000
                ),
            )
            .body(Body::empty())
            .map_err(|e| ApiError(Error::Internal(e.to_string())));
    }
    allowed(&s, &id, &headers)?;
    s.c.ctx.visible_row(&id)?;
    let resp = (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        session::INDEX_HTML,
    )
        .into_response();
    Ok(hardened(resp, host_of(&headers).as_deref()))
}

/// What a path below `session/` names.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    Asset(&'static str, &'static str),
    XtermJs,
    XtermCss,
    Novnc(&'a str),
    Info,
    Events,
    Artifacts,
    Artifact(&'a str),
    Episode,
    /// An agent operation the page uses, by its path below the agent's `/v1/`.
    Agent(&'a str),
    /// The editor pane's workpiece routes.
    Workpiece(Wp<'a>),
    /// The controls: `GET`, `POST` (take or renew), `DELETE` (hand back).
    Control,
    ControlDecline,
    Workspace,
    Browser,
    BrowserShot,
    Diff,
    DiffFile,
    Runs,
    RunOutput(&'a str),
    Unknown,
}

/// The editor pane's calls, below `api/workpieces`.
#[derive(Debug, PartialEq, Eq)]
enum Wp<'a> {
    List,
    Get(&'a str),
    Content(&'a str),
    Proposals(&'a str),
    VersionPage(&'a str, u32, u32),
    ProposalPage(&'a str, &'a str, u32),
    ProposalContent(&'a str, &'a str),
    Accept(&'a str, &'a str),
    Reject(&'a str, &'a str),
    Open(&'a str),
}

/// The workpiece call of `rest` (below `api/workpieces`) for `method`, if it is one.
fn workpiece_target<'a>(method: &Method, rest: &'a str) -> Option<Wp<'a>> {
    let read = method == Method::GET || method == Method::HEAD;
    let post = method == Method::POST;
    let segs: Vec<&str> = rest.split('/').collect();
    let id = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    let n = |s: &str| s.parse::<u32>().ok();
    Some(match segs.as_slice() {
        [""] if read => Wp::List,
        [w] if read && id(w) => Wp::Get(w),
        [w, "content"] if read && id(w) => Wp::Content(w),
        [w, "proposals"] if read && id(w) => Wp::Proposals(w),
        [w, "versions", v, "pages", p] if read && id(w) => Wp::VersionPage(w, n(v)?, n(p)?),
        [w, "proposals", pid, "pages", p] if read && id(w) && id(pid) => {
            Wp::ProposalPage(w, pid, n(p)?)
        }
        [w, "proposals", pid, "content"] if read && id(w) && id(pid) => Wp::ProposalContent(w, pid),
        [w, "proposals", pid, "accept"] if post && id(w) && id(pid) => Wp::Accept(w, pid),
        [w, "proposals", pid, "reject"] if post && id(w) && id(pid) => Wp::Reject(w, pid),
        [w, "open"] if post && id(w) => Wp::Open(w),
        _ => return None,
    })
}

/// The target of `rel` (decoded, below `session/`) for `method`: a pure decision.
fn target<'a>(method: &Method, rel: &'a str) -> Target<'a> {
    let read = method == Method::GET || method == Method::HEAD;
    match rel {
        "assets/app.js" if read => Target::Asset(session::APP_JS, "text/javascript; charset=utf-8"),
        "assets/style.css" if read => Target::Asset(session::STYLE_CSS, "text/css; charset=utf-8"),
        "vendor/xterm.js" if read => Target::XtermJs,
        "vendor/xterm.css" if read => Target::XtermCss,
        "api/info" if read => Target::Info,
        "api/events" if read => Target::Events,
        "api/artifacts" if read => Target::Artifacts,
        "api/episode" if read => Target::Episode,
        "api/control" if read || matches!(method.as_str(), "POST" | "DELETE") => Target::Control,
        "api/control/decline" if method == Method::POST => Target::ControlDecline,
        "api/workspace" if read => Target::Workspace,
        "api/browser" if read => Target::Browser,
        "api/browser/screenshot" if read => Target::BrowserShot,
        "api/diff" if read => Target::Diff,
        "api/diff/file" if read => Target::DiffFile,
        "api/runs" if read => Target::Runs,
        _ => {
            if let Some(r) = rel
                .strip_prefix("api/runs/")
                .and_then(|r| r.strip_suffix("/output"))
                .filter(|r| read && !r.is_empty() && !r.contains('/'))
            {
                return Target::RunOutput(r);
            }
            if let Some(f) = rel.strip_prefix("vendor/novnc/").filter(|_| read) {
                return Target::Novnc(f);
            }
            if let Some(a) = rel
                .strip_prefix("api/artifacts/")
                .filter(|a| read && !a.is_empty() && !a.contains('/'))
            {
                return Target::Artifact(a);
            }
            if let Some(p) = rel.strip_prefix("api/agent/")
                && agent_allowed(method, p)
            {
                return Target::Agent(p);
            }
            if let Some(w) = rel
                .strip_prefix("api/workpieces")
                .map(|r| r.strip_prefix('/').unwrap_or(r))
                .and_then(|r| workpiece_target(method, r))
            {
                return Target::Workpiece(w);
            }
            Target::Unknown
        }
    }
}

/// The agent operations the page may reach: open / list / kill / attach / resize a terminal,
/// list a directory, download and upload a file, the desktop's VNC WebSocket.
fn agent_allowed(method: &Method, p: &str) -> bool {
    let segs: Vec<&str> = p.split('/').collect();
    let id_ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    match (method.as_str(), segs.as_slice()) {
        ("GET" | "POST", ["pty"]) => true,
        ("GET" | "DELETE", ["pty", id]) => id_ok(id),
        ("GET", ["pty", id, "attach"]) => id_ok(id),
        ("POST", ["pty", id, "resize"]) => id_ok(id),
        ("GET", ["fs", "list"]) => true,
        ("GET" | "HEAD" | "PUT", ["files"]) => true,
        ("GET", ["vnc", "websockify"]) => true,
        ("GET" | "PUT", ["clipboard"]) => true,
        _ => false,
    }
}

/// xterm.js as one script, built once from the package's modules.
fn xterm_js(dir: &FsPath) -> std::io::Result<&'static str> {
    static BUNDLE: OnceLock<String> = OnceLock::new();
    if let Some(b) = BUNDLE.get() {
        return Ok(b);
    }
    let built = session::xterm_bundle(dir)?;
    Ok(BUNDLE.get_or_init(|| built))
}

async fn file_response(path: &FsPath, what: &str) -> Result<Response> {
    let bytes = match tokio::fs::read(path).await {
        Ok(b) => b,
        Err(e) => {
            return Err(ApiError(Error::NotFound(format!(
                "{what}: {} ({e}); install the Debian package or set [session] in the config",
                path.display()
            ))));
        }
    };
    let ct = mime_guess::from_path(path)
        .first_raw()
        .map(|m| match m {
            "application/javascript" => "text/javascript",
            m => m,
        })
        .unwrap_or("application/octet-stream");
    Ok((
        [
            (header::CONTENT_TYPE, ct.to_string()),
            (header::CACHE_CONTROL, "max-age=3600".to_string()),
        ],
        bytes,
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FromSeq {
    #[serde(default)]
    from_seq: u64,
    limit: Option<usize>,
}

async fn path(
    State(s): State<ApiState>,
    Path(p): Path<HashMap<String, String>>,
    req: Request,
) -> Result<Response> {
    let id = p.get("id").cloned().unwrap_or_default();
    let rel = p.get("path").cloned().unwrap_or_default();
    allowed(&s, &id, req.headers())?;
    let host = host_of(req.headers());
    let cfg = &s.c.ctx.config.session;
    match target(req.method(), &rel) {
        Target::Asset(body, ct) => Ok(hardened(
            (
                [
                    (header::CONTENT_TYPE, ct),
                    (header::CACHE_CONTROL, "no-cache"),
                ],
                body,
            )
                .into_response(),
            host.as_deref(),
        )),
        Target::XtermJs => match xterm_js(&cfg.xterm_dir) {
            Ok(js) => Ok((
                [
                    (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
                    (header::CACHE_CONTROL, "max-age=3600"),
                ],
                js,
            )
                .into_response()),
            Err(e) => Err(ApiError(Error::NotFound(format!(
                "xterm.js: {} ({e}); install Debian's node-xterm or set [session] xterm_dir",
                cfg.xterm_dir.display()
            )))),
        },
        Target::XtermCss => file_response(&cfg.xterm_css, "xterm.css").await,
        Target::Novnc(f) => match session::contained(&cfg.novnc_dir, f) {
            Some(path) => file_response(&path, "noVNC").await,
            None => Err(ApiError(Error::NotFound(format!("no noVNC file {f:?}")))),
        },
        Target::Info => info(&s, &id, caller(&s, &id, req.headers())).await,
        Target::Events => {
            let q: FromSeq = serde_urlencoded::from_str(req.uri().query().unwrap_or(""))
                .map_err(|e| ApiError(Error::BadRequest(format!("query: {e}"))))?;
            let page =
                s.c.timeline
                    .timeline(&id, q.from_seq, q.limit.unwrap_or(500))
                    .await?;
            Ok(axum::Json(page).into_response())
        }
        Target::Artifacts => artifacts(&s, &id).await,
        Target::Artifact(a) => artifact(&s, &id, a, req).await,
        Target::Episode => episode(&s, &id).await,
        Target::Agent(_) => agent_call(&s, &id, req).await,
        Target::Workpiece(w) => workpiece(&s, &id, w, req).await,
        Target::Control | Target::ControlDecline => control(&s, &id, req).await,
        t @ (Target::Workspace
        | Target::Browser
        | Target::BrowserShot
        | Target::Diff
        | Target::DiffFile
        | Target::Runs
        | Target::RunOutput(_)) => pane(&s, &id, t, req).await,
        Target::Unknown => Err(ApiError(Error::NotFound(format!(
            "the session view has no {rel:?}"
        )))),
    }
}

/// An agent operation the page uses, relayed below the agent's `/v1/`.
async fn agent_call(s: &ApiState, id: &str, req: Request) -> Result<Response> {
    let raw = req.uri().path();
    let agent_rest = raw
        .split_once("/session/api/agent/")
        .map(|(_, r)| r.to_string())
        .unwrap_or_default();
    let q = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let extra = control_headers(s, id, req.headers(), &agent_rest);
    to_agent(s, id, req, format!("/v1/{agent_rest}{q}"), extra).await
}

/// The browser, diff, agents and workspace panes' calls.
async fn pane(s: &ApiState, id: &str, t: Target<'_>, req: Request) -> Result<Response> {
    let id = id.to_string();
    let json = |v: serde_json::Value| Ok(axum::Json(v).into_response());
    match t {
        Target::Workspace => {
            let row = s.c.ctx.visible_row(&id)?;
            let wire = s.c.sandboxes.to_wire(&row);
            Ok(axum::Json(s.c.panes.workspace(&id, &wire).await?).into_response())
        }
        Target::Browser => json(s.c.panes.browser(&id).await?),
        Target::BrowserShot => {
            let q: TabQuery = query(&req)?;
            let jpeg = s.c.panes.browser_screenshot(&id, &q.tab).await?;
            Ok((
                [
                    (header::CONTENT_TYPE, "image/jpeg"),
                    (header::CACHE_CONTROL, "no-store"),
                ],
                jpeg,
            )
                .into_response())
        }
        Target::Diff => Ok(axum::Json(s.c.panes.diff(&id).await?).into_response()),
        Target::DiffFile => {
            let q: DiffQuery = query(&req)?;
            Ok(axum::Json(s.c.panes.diff_file(&id, &q).await?).into_response())
        }
        Target::Runs => Ok(axum::Json(s.c.panes.runs(&id).await?).into_response()),
        Target::RunOutput(r) => Ok(s.c.panes.run_output(&id, r, req.headers()).await?),
        _ => Err(ApiError(Error::NotFound("not a pane".into()))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TabQuery {
    tab: String,
}

fn query<T: serde::de::DeserializeOwned>(req: &Request) -> Result<T> {
    serde_urlencoded::from_str(req.uri().query().unwrap_or(""))
        .map_err(|e| ApiError(Error::BadRequest(format!("query: {e}"))))
}

/// Who the page's caller is for the controls: its session cookie, else the API key (with the
/// control token it sent).
fn caller<'a>(s: &ApiState, id: &str, headers: &'a HeaderMap) -> Caller<'a> {
    match cookie_values(headers).find(|v| s.c.sessions.session_cookie_ok(id, v)) {
        Some(cookie) => Caller::Session(cookie),
        None => Caller::Key(super::control::sent_token(headers)),
    }
}

/// The control bar's calls.
async fn control(s: &ApiState, id: &str, req: Request) -> Result<Response> {
    let headers = req.headers().clone();
    let who = caller(s, id, &headers);
    let c = &s.c.controls;
    let v = match (
        req.method().as_str(),
        req.uri().path().ends_with("/decline"),
    ) {
        ("POST", true) => c.decline(id, who).await?,
        ("POST", false) => {
            let body = axum::body::to_bytes(req.into_body(), 64 << 10)
                .await
                .map_err(|e| ApiError(Error::BadRequest(format!("reading the body: {e}"))))?;
            c.take(id, who, &super::control::take_body(&body)?).await?
        }
        ("DELETE", _) => c.hand_back(id, who, false).await?,
        _ => c.view(id, who).await?,
    };
    Ok(axum::Json(v).into_response())
}

/// The editor pane's calls: the same domain calls as the keyed routes.
async fn workpiece(s: &ApiState, id: &str, w: Wp<'_>, req: Request) -> Result<Response> {
    let wp = &s.c.workpieces;
    let json = |v: serde_json::Value| axum::Json(v).into_response();
    let to = |e: serde_json::Error| ApiError(Error::Internal(e.to_string()));
    Ok(match w {
        Wp::List => json(serde_json::to_value(wp.list(id).await?).map_err(to)?),
        Wp::Get(w) => json(serde_json::to_value(wp.get(id, w).await?).map_err(to)?),
        Wp::Content(w) => {
            let q: super::workpieces::ContentQuery =
                serde_urlencoded::from_str(req.uri().query().unwrap_or(""))
                    .map_err(|e| ApiError(Error::BadRequest(format!("query: {e}"))))?;
            json(wp.content(id, w, q.version, q.page, q.sheet).await?)
        }
        Wp::Proposals(w) => json(serde_json::to_value(wp.proposals(id, w, None)?).map_err(to)?),
        Wp::VersionPage(w, v, p) => super::workpieces::png(wp.version_page(id, w, v, p).await?),
        Wp::ProposalPage(w, pid, p) => super::workpieces::png(wp.proposal_page(id, w, pid, p)?),
        Wp::ProposalContent(w, pid) => json(wp.proposal_content(id, w, pid)?),
        Wp::Accept(w, pid) => json(serde_json::to_value(wp.accept(id, w, pid).await?).map_err(to)?),
        Wp::Reject(w, pid) => {
            let body = axum::body::to_bytes(req.into_body(), 64 << 10)
                .await
                .map_err(|e| ApiError(Error::BadRequest(format!("reading the body: {e}"))))?;
            let d = super::workpieces::decision(&body)?;
            json(serde_json::to_value(wp.reject(id, w, pid, d).await?).map_err(to)?)
        }
        Wp::Open(w) => json(wp.open(id, w).await?),
    })
}

/// What the page needs to draw itself: the sandbox, whether its agent can be reached, and
/// which Debian-packaged viewers are present.
async fn info(s: &ApiState, id: &str, who: Caller<'_>) -> Result<Response> {
    let row = s.c.ctx.visible_row(id)?;
    let wire = s.c.sandboxes.to_wire(&row);
    let cfg = &s.c.ctx.config.session;
    let desktop =
        s.c.ctx
            .catalog
            .profile(&row.profile)
            .is_some_and(|p| p.desktop);
    let running = row.status == crate::lifecycle::SandboxStatus::Running;
    let control = s.c.controls.view(id, who).await?;
    Ok(axum::Json(json!({
        "sandbox": wire,
        "control": control,
        "running": running,
        "gone": !row.live(),
        "desktop": desktop,
        "vendor": {
            "novnc": cfg.novnc_dir.join("core/rfb.js").is_file(),
            "xterm": cfg.xterm_dir.join("lib/public/Terminal.js").is_file(),
        },
    }))
    .into_response())
}

async fn artifacts(s: &ApiState, id: &str) -> Result<Response> {
    s.c.ctx.visible_row(id)?;
    let list: Vec<_> =
        s.c.artifacts
            .artifacts(Some(id), None)?
            .iter()
            .map(|a| a.to_wire())
            .collect();
    Ok(axum::Json(json!({ "artifacts": list })).into_response())
}

/// An artifact's bytes (`Range` honoured), only when it came from this sandbox.
async fn artifact(s: &ApiState, id: &str, artifact: &str, req: Request) -> Result<Response> {
    s.c.ctx.visible_row(id)?;
    let row = s.c.artifacts.artifact(artifact)?;
    if row.sandbox_id != id {
        return Err(ApiError(Error::NotFound(format!(
            "sandbox {id} has no artifact {artifact}"
        ))));
    }
    Ok(s.c
        .artifacts
        .artifact_response(artifact, req.headers())
        .await?)
}

async fn episode(s: &ApiState, id: &str) -> Result<Response> {
    let actions = s.c.episodes.episode_actions(id).await?;
    Ok(axum::Json(json!({ "actions": actions })).into_response())
}

/// What the page's desktop and clipboard calls carry to the agent: the holder's control token
/// when this page holds the controls; otherwise its VNC connection is marked view-only.
fn control_headers(
    s: &ApiState,
    id: &str,
    headers: &HeaderMap,
    agent_rest: &str,
) -> Vec<(HeaderName, HeaderValue)> {
    let token = caller(s, id, headers).token();
    let row = s.c.ctx.store.control(id).unwrap_or_default();
    let holds = crate::control::view_of(&row, token.as_deref(), crate::util::now_ms()).you;
    match (holds, token.and_then(|t| HeaderValue::from_str(&t).ok())) {
        (true, Some(v)) => vec![(HeaderName::from_static(wire::CONTROL), v)],
        _ if agent_rest.starts_with("vnc/") => vec![(
            HeaderName::from_static(wire::VIEW_ONLY),
            HeaderValue::from_static("1"),
        )],
        _ => Vec::new(),
    }
}

/// Relays `req` to the sandbox's agent at `agent_path` with its bearer token (and `extra`).
async fn to_agent(
    s: &ApiState,
    id: &str,
    req: Request,
    agent_path: String,
    extra: Vec<(HeaderName, HeaderValue)>,
) -> Result<Response> {
    let (row, agent) = s.c.ctx.running_agent(id)?;
    let bearer = HeaderValue::from_str(&format!("Bearer {}", row.agent_token)).map_err(|_| {
        ApiError(Error::Internal(
            "the agent token is not a header value".into(),
        ))
    })?;
    let up = Upstream::new(agent.base(), agent_path)
        .strip(HeaderName::from_static(wire::API_KEY))
        .strip(header::AUTHORIZATION)
        .strip_cookie(COOKIE)
        .strip_cookie(VIEWER_COOKIE)
        .strip_cookie(PORT_COOKIE)
        .strip(HeaderName::from_static(wire::CONTROL))
        .strip(HeaderName::from_static(wire::VIEW_ONLY))
        .header(header::AUTHORIZATION, bearer);
    let up = extra.into_iter().fold(up, |up, (k, v)| up.header(k, v));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_reaches_only_the_agent_operations_it_uses() {
        let (get, post, put, del) = (Method::GET, Method::POST, Method::PUT, Method::DELETE);
        assert!(agent_allowed(&post, "pty"));
        assert!(agent_allowed(&get, "pty/pty_1/attach"));
        assert!(agent_allowed(&post, "pty/pty_1/resize"));
        assert!(agent_allowed(&del, "pty/pty_1"));
        assert!(agent_allowed(&get, "fs/list"));
        assert!(agent_allowed(&put, "files"));
        assert!(agent_allowed(&get, "vnc/websockify"));
        assert!(!agent_allowed(&post, "exec"));
        assert!(!agent_allowed(&post, "computer"));
        assert!(!agent_allowed(&del, "fs"));
        assert!(!agent_allowed(&get, "pty/../exec"));
        assert!(!agent_allowed(&post, "files"));
        assert!(!agent_allowed(&get, "viewer-tokens"));
    }

    #[test]
    fn the_editor_pane_reaches_only_its_workpiece_calls() {
        let (get, post) = (Method::GET, Method::POST);
        assert_eq!(workpiece_target(&get, ""), Some(Wp::List));
        assert_eq!(workpiece_target(&get, "wp_1"), Some(Wp::Get("wp_1")));
        assert_eq!(
            workpiece_target(&get, "wp_1/versions/2/pages/3"),
            Some(Wp::VersionPage("wp_1", 2, 3))
        );
        assert_eq!(
            workpiece_target(&post, "wp_1/proposals/wpp_2/accept"),
            Some(Wp::Accept("wp_1", "wpp_2"))
        );
        // A GET never accepts; a POST never reads; odd ids and pages are nothing.
        assert_eq!(workpiece_target(&get, "wp_1/proposals/wpp_2/accept"), None);
        assert_eq!(
            workpiece_target(&get, "wp_1/proposals/wpp_2/content"),
            Some(Wp::ProposalContent("wp_1", "wpp_2"))
        );
        assert_eq!(workpiece_target(&post, "wp_1"), None);
        assert_eq!(workpiece_target(&get, "wp_1/versions/x/pages/1"), None);
        assert_eq!(workpiece_target(&get, "../x"), None);
        assert_eq!(workpiece_target(&post, "wp_1/proposals"), None);
        assert!(matches!(
            target(&post, "api/workpieces/wp_1/open"),
            Target::Workpiece(Wp::Open("wp_1"))
        ));
        assert!(matches!(
            target(&get, "api/workpieces"),
            Target::Workpiece(Wp::List)
        ));
    }

    #[test]
    fn session_paths_name_their_targets() {
        let get = Method::GET;
        assert_eq!(
            target(&get, "vendor/novnc/core/rfb.js"),
            Target::Novnc("core/rfb.js")
        );
        assert_eq!(
            target(&get, "api/artifacts/art_1"),
            Target::Artifact("art_1")
        );
        assert_eq!(target(&get, "api/artifacts/a/b"), Target::Unknown);
        assert_eq!(target(&get, "api/agent/fs/list"), Target::Agent("fs/list"));
        assert_eq!(target(&Method::POST, "api/info"), Target::Unknown);
        assert_eq!(target(&get, "nope"), Target::Unknown);
        assert!(matches!(target(&get, "assets/app.js"), Target::Asset(..)));
    }
}
