//! The OSWorld-compatible surface at root paths. Status codes, JSON key sets and messages
//! follow `osworld-compat-spec.md`; where the reference server merely crashed (an HTML
//! debugger page, a hang) we answer `{"message", "status": "error"}` with a 4xx/5xx instead.
//! JSON bodies are written the way Flask's `jsonify` writes them (sorted keys, ASCII only).

pub mod a11y;
pub mod display;
pub mod execute;
pub mod files;
pub mod python;
pub mod record;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::multipart::MultipartError;
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use berth_protocol::ops::{Routes, compat as op};
use berth_protocol::serve::FrameworkError;

use crate::{Agent, CompatAuth};

/// Compat JSON bodies may carry scripts and file contents; still bounded.
pub const COMPAT_JSON_LIMIT: usize = 16 << 20;

pub fn routes(agent: Arc<Agent>) -> Routes<Arc<Agent>> {
    let mut r = Routes::new()
        .bind_with(
            &op::EXECUTE,
            execute::execute,
            guarded(&agent, Guard::Input),
        )
        .bind(&op::SETUP_EXECUTE, execute::execute)
        .bind(&op::EXECUTE_VERIFY, execute::execute_with_verification)
        .bind(
            &op::SETUP_EXECUTE_VERIFY,
            execute::execute_with_verification,
        )
        .bind(&op::LAUNCH, execute::launch)
        .bind_with(
            &op::RUN_PYTHON,
            execute::run_python,
            guarded(&agent, Guard::Input),
        )
        .bind_with(
            &op::RUN_BASH,
            execute::run_bash_script,
            guarded(&agent, Guard::Input),
        )
        .bind(&op::FILE, files::file)
        .bind_with(&op::UPLOAD, files::upload, |m| {
            m.layer(DefaultBodyLimit::disable())
        })
        .bind(&op::LIST_DIRECTORY, files::list_directory)
        .bind(&op::DESKTOP_PATH, files::desktop_path)
        .bind(&op::DOWNLOAD_FILE, files::download_file)
        .bind(&op::PLATFORM, platform)
        .bind_with(
            &op::SCREENSHOT,
            display::screenshot,
            guarded(&agent, Guard::Always),
        )
        .bind(&op::SCREEN_SIZE, display::screen_size)
        .bind_with(
            &op::CURSOR_POSITION,
            display::cursor_position,
            guarded(&agent, Guard::Always),
        )
        .bind(&op::WINDOW_SIZE, display::window_size)
        .bind(&op::ACTIVATE_WINDOW, display::activate_window)
        .bind(&op::CLOSE_WINDOW, display::close_window)
        .bind(&op::OPEN_FILE, display::open_file)
        .bind(&op::WALLPAPER, display::wallpaper)
        .bind(&op::CHANGE_WALLPAPER, display::change_wallpaper)
        .bind(&op::START_RECORDING, record::start_recording)
        .bind(&op::END_RECORDING, record::end_recording)
        .bind_with(
            &op::ACCESSIBILITY,
            a11y::accessibility,
            guarded(&agent, Guard::Always),
        )
        .bind_with(
            &op::TERMINAL,
            a11y::terminal,
            guarded(&agent, Guard::Always),
        )
        // Multipart forms (read by axum's extractor) get the compat limit too, not axum's
        // 2 MiB default; `/setup/upload` disables it on its own route, which wins.
        .layer(DefaultBodyLimit::max(COMPAT_JSON_LIMIT));
    if agent.compat_auth == CompatAuth::Token {
        r = r.route_layer(middleware::from_fn_with_state(agent, require_token));
    }
    r
}

/// Which compat routes a person holding the controls closes to the harness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Guard {
    /// Observations (`/screenshot`, `/cursor_position`, `/accessibility`, `/terminal`).
    Always,
    /// Commands that drive the desktop: only when they name `pyautogui` or `xdotool`
    /// (OSWorld's actions are `pyautogui` code run through `/execute` or `/run_python`).
    Input,
}

/// Whether a compat request with `body` drives the desktop.
fn drives_desktop(body: &[u8]) -> bool {
    let has = |w: &[u8]| body.windows(w.len()).any(|x| x == w);
    has(b"pyautogui") || has(b"xdotool")
}

fn guarded(
    agent: &Arc<Agent>,
    guard: Guard,
) -> impl FnOnce(axum::routing::MethodRouter<Arc<Agent>>) -> axum::routing::MethodRouter<Arc<Agent>>
{
    let agent = agent.clone();
    move |m| {
        m.route_layer(middleware::from_fn_with_state(
            agent,
            move |State(agent): State<Arc<Agent>>, req: Request, next: Next| {
                compat_guard(agent, guard, req, next)
            },
        ))
    }
}

/// Refuses a guarded compat request while a person holds the controls (409, the compat
/// error body with the reason).
async fn compat_guard(agent: Arc<Agent>, guard: Guard, req: Request, next: Next) -> Response {
    let token = crate::api::control::token(req.headers()).map(str::to_string);
    let Err(ms) = agent.control.check(token.as_deref()) else {
        return next.run(req).await;
    };
    let req = match guard {
        Guard::Always => None,
        Guard::Input => {
            let (parts, body) = req.into_parts();
            let bytes = match axum::body::to_bytes(body, COMPAT_JSON_LIMIT).await {
                Ok(b) => b,
                Err(e) => {
                    return error(StatusCode::BAD_REQUEST, format!("reading the body: {e}"));
                }
            };
            (!drives_desktop(&bytes))
                .then(|| Request::from_parts(parts, axum::body::Body::from(bytes)))
        }
    };
    match req {
        Some(req) => next.run(req).await,
        None => error(
            StatusCode::CONFLICT,
            format!(
                "{}: {}",
                berth_protocol::control::HUMAN_IN_CONTROL,
                berth_protocol::control::refusal(ms)
            ),
        ),
    }
}

async fn require_token(State(agent): State<Arc<Agent>>, req: Request, next: Next) -> Response {
    if crate::http::token_matches(req.headers(), &agent.token) {
        next.run(req).await
    } else {
        error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token")
    }
}

/// A Flask `jsonify` answer.
pub fn flask(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        crate::text::flask_json(value),
    )
        .into_response()
}

/// A handler returning a Python `str`: `text/html; charset=utf-8`.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

/// `{"message": ..., "status": "error"}`, the reference server's error shape.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    flask(
        status,
        &json!({"message": message.into(), "status": "error"}),
    )
}

/// The JSON object of a compat request (`request.json` in the reference server).
pub struct CompatJson(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for CompatJson {
    type Rejection = Response;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Response> {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !crate::http::extract::is_json(ct) {
            return Err(error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Did not attempt to load JSON data because the request Content-Type was not 'application/json'.",
            ));
        }
        let bytes = crate::http::extract::read_body(req, COMPAT_JSON_LIMIT, false)
            .await
            .map_err(|e| error(e.status, e.message))?;
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(m)) => Ok(CompatJson(m)),
            Ok(other) => Err(error(
                StatusCode::BAD_REQUEST,
                format!(
                    "The JSON body must be an object, not {}",
                    python::type_name(&other)
                ),
            )),
            Err(e) => Err(error(
                StatusCode::BAD_REQUEST,
                format!("Failed to decode JSON object: {e}"),
            )),
        }
    }
}

/// Small text fields of a urlencoded or multipart form (`request.form`). Anything else yields
/// no fields, as Flask's empty `request.form` would.
pub struct FormFields(pub HashMap<String, String>);

impl<S: Send + Sync> FromRequest<S> for FormFields {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let mut fields = HashMap::new();
        if ct.starts_with("application/x-www-form-urlencoded") {
            let bytes = crate::http::extract::read_body(req, COMPAT_JSON_LIMIT, false)
                .await
                .map_err(|e| error(e.status, e.message))?;
            for (k, v) in form_urlencoded(&bytes) {
                fields.entry(k).or_insert(v);
            }
        } else if ct.starts_with("multipart/form-data") {
            // A declared length past the limit: drained, then 413, so the client still
            // sending reads the answer. An undeclared one hits the extractor's limit below.
            let declared = req
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|len| len > COMPAT_JSON_LIMIT as u64) {
                crate::http::extract::drain(req.into_body()).await;
                return Err(form_too_large());
            }
            let mut mp = Multipart::from_request(req, state)
                .await
                .map_err(|e| error(e.status(), e.body_text()))?;
            // A body cut short or malformed is the client's fault: a 400 (413 kept), as for
            // `/setup/upload`.
            let failed = |e: MultipartError| match multipart_status(&e) {
                StatusCode::PAYLOAD_TOO_LARGE => form_too_large(),
                s => error(s, e.body_text()),
            };
            while let Some(field) = mp.next_field().await.map_err(failed)? {
                if field.file_name().is_some() {
                    continue; // files are not form fields
                }
                let name = field.name().unwrap_or_default().to_string();
                let value = field.text().await.map_err(failed)?;
                fields.entry(name).or_insert(value);
            }
        } else {
            drop(req.into_body());
        }
        Ok(FormFields(fields))
    }
}

/// The status of a multipart read that failed: 413 for a body over its limit, else 400 (a body
/// that ends early or does not parse, as Werkzeug's form parser answers it), never axum's 500.
pub(crate) fn multipart_status(e: &MultipartError) -> StatusCode {
    match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::BAD_REQUEST,
    }
}

fn form_too_large() -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body exceeds {COMPAT_JSON_LIMIT} bytes"),
    )
}

fn form_urlencoded(bytes: &[u8]) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let s = s.replace('+', " ");
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%'
                && i + 2 < b.len()
                && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
            {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    fn hex(c: u8) -> Option<u8> {
        (c as char).to_digit(16).map(|d| d as u8)
    }
    String::from_utf8_lossy(bytes)
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

async fn platform() -> Response {
    text(StatusCode::OK, "Linux")
}

/// Unknown compat paths: 404 with the reference server's message, as JSON.
pub async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "The requested URL was not found on the server. If you entered the URL manually please check your spelling and try again.",
    )
}

/// Answers requests that axum rejected with an empty body (405 and friends) or with its own
/// `text/plain` rejection text (a path segment that is not UTF-8, …) in the matching surface's
/// error shape, keeping status, headers (`Allow`) and axum's message.
pub async fn fill_empty_errors(req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let native = path
        .strip_prefix(berth_protocol::routes::native::PREFIX)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
    let e = match FrameworkError::take(next.run(req).await).await {
        Ok(e) => e,
        Err(resp) => return resp,
    };
    // Flask's words for a 405 without a rejection text.
    let message = match (&e.text, e.parts.status) {
        (None, StatusCode::METHOD_NOT_ALLOWED) => {
            "The method is not allowed for the requested URL.".to_string()
        }
        _ => e.message(),
    };
    let body = if native {
        serde_json::to_string(&berth_protocol::ErrorBody::new(e.code(), message))
            .unwrap_or_default()
    } else {
        crate::text::flask_json(&json!({"message": message, "status": "error"}))
    };
    e.answer(body)
}
