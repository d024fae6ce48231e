//! `/v1/screenshot`, `/v1/input`, `/v1/display`, `/v1/clipboard` and `/v1/windows`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use berth_protocol::{Clipboard, DisplayInfo, DisplaySize, InputRequest, InputResponse};
use serde::Deserialize;

use crate::Agent;
use crate::display::encode::Encoding;
use crate::display::{DisplayError, Shot, ShotRequest};
use crate::http::error::ApiError;
use crate::http::extract::ApiJson;

/// Settle default: the display's rule (`--settle`), giving up after 2 s.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest settle a request may ask for (`settle_ms`, `timeout_ms`): a request waits at
/// most this long for the screen, never a day.
pub const SETTLE_MAX_MS: u64 = 60_000;

/// `settle_ms` (a quiet period in place of the display's rule) and `timeout_ms` (the default
/// where absent) as durations, each at most [`SETTLE_MAX_MS`].
fn settle_args(
    quiet: Option<u64>,
    timeout: Option<u64>,
) -> Result<(Option<Duration>, Duration), ApiError> {
    for (name, v) in [("settle_ms", quiet), ("timeout_ms", timeout)] {
        if v.is_some_and(|ms| ms > SETTLE_MAX_MS) {
            return Err(ApiError::bad_request(format!(
                "invalid `{name}`: at most {SETTLE_MAX_MS} ms"
            )));
        }
    }
    Ok((
        quiet.map(Duration::from_millis),
        timeout.map(Duration::from_millis).unwrap_or(SETTLE_TIMEOUT),
    ))
}

impl From<DisplayError> for ApiError {
    fn from(e: DisplayError) -> Self {
        let msg = e.to_string();
        let (status, code) = match e {
            DisplayError::NoDisplay => (StatusCode::SERVICE_UNAVAILABLE, "no_display"),
            DisplayError::Connect(_) | DisplayError::Connection(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "display_unavailable")
            }
            DisplayError::NoWindowManager => (StatusCode::SERVICE_UNAVAILABLE, "no_window_manager"),
            DisplayError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            DisplayError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            DisplayError::Unsupported(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unsupported"),
            DisplayError::NoRandr(_) => (StatusCode::SERVICE_UNAVAILABLE, "no_randr"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "display_error"),
        };
        ApiError::new(status, code, msg)
    }
}

#[derive(Deserialize, Default)]
pub struct ShotQuery {
    format: Option<String>,
    quality: Option<u8>,
    compression: Option<String>,
    scale: Option<f64>,
    region: Option<String>,
    cursor: Option<bool>,
    settle_ms: Option<u64>,
    timeout_ms: Option<u64>,
}

/// Parses `x,y,w,h`.
pub fn parse_region(s: &str) -> Result<(i32, i32, u32, u32), ApiError> {
    let bad = || ApiError::bad_request(format!("region {s:?}: give x,y,w,h in screen pixels"));
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    if parts.len() != 4 {
        return Err(bad());
    }
    let x = parts[0].parse().map_err(|_| bad())?;
    let y = parts[1].parse().map_err(|_| bad())?;
    let w = parts[2].parse().map_err(|_| bad())?;
    let h = parts[3].parse().map_err(|_| bad())?;
    Ok((x, y, w, h))
}

fn shot_response(shot: &Shot, settled: Option<(Duration, bool)>) -> Response {
    let mut resp = (StatusCode::OK, shot.bytes.as_ref().clone()).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(shot.mime));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    use berth_protocol::routes::header as wire;
    let mut put = |name: &'static str, v: String| {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(HeaderName::from_static(name), v);
        }
    };
    put(wire::SCREEN_WIDTH, shot.screen.0.to_string());
    put(wire::SCREEN_HEIGHT, shot.screen.1.to_string());
    put(wire::SCALE, format!("{}", shot.scale));
    put(
        wire::CACHE,
        if shot.cached { "hit" } else { "miss" }.to_string(),
    );
    if let Some((waited, timed_out)) = settled {
        put(wire::SETTLED_MS, waited.as_millis().to_string());
        put(wire::SETTLE_TIMED_OUT, timed_out.to_string());
    }
    resp
}

pub async fn screenshot(
    State(agent): State<Arc<Agent>>,
    q: Result<Query<ShotQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let req = ShotRequest {
        encoding: Encoding::parse(q.format.as_deref(), q.quality, q.compression.as_deref())
            .map_err(ApiError::bad_request)?,
        scale: q.scale,
        size: None,
        region: q.region.as_deref().map(parse_region).transpose()?,
        cursor: q.cursor.unwrap_or(true),
    };
    let (quiet, timeout) = settle_args(q.settle_ms, q.timeout_ms)?;
    let settled = match (q.settle_ms, q.timeout_ms) {
        (None, None) => None,
        _ => Some(agent.display.settle(Instant::now(), quiet, timeout).await),
    };
    let d = agent.display.clone();
    let shot = crate::display::blocking(move || d.screenshot(&req)).await?;
    Ok(shot_response(&shot, settled))
}

pub async fn input(
    State(agent): State<Arc<Agent>>,
    ApiJson(req): ApiJson<InputRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let raw = serde_json::to_value(&req).unwrap_or_default();
    let mut shot_taken = None;
    let mut settled = None;
    let result = input_run(&agent, req, started, &mut shot_taken, &mut settled).await;
    let cursor = result.as_ref().ok().map(|r| (r.cursor[0], r.cursor[1]));
    agent.episode.log(
        crate::episode::Action {
            source: crate::episode::Source::Input,
            dialect: Some("native"),
            action: raw,
            started,
            duration: started.elapsed(),
            settled,
            error: result.as_ref().err().map(|e| e.message.clone()),
            cursor,
            screenshot: shot_taken,
            batch: None,
            media: Vec::new(),
        }
        .with_media(&agent.recorder),
    );
    Ok(Json(result?).into_response())
}

/// `/v1/input`'s work; the screenshot and settle are also handed out for the episode log.
async fn input_run(
    agent: &Arc<Agent>,
    req: InputRequest,
    started: Instant,
    shot_taken: &mut Option<(Shot, Instant)>,
    settled: &mut Option<(Duration, bool)>,
) -> Result<InputResponse, ApiError> {
    // Checked before any action runs.
    let settle = match &req.screenshot_after {
        Some(after) => Some(settle_args(after.settle_ms, after.timeout_ms)?),
        None => None,
    };
    let d = agent.display.clone();
    let actions = req.actions;
    let cursor = crate::display::blocking(move || d.run_input(&actions)).await?;
    let mut resp = InputResponse {
        cursor: [cursor.0, cursor.1],
        screenshot_b64: None,
        settled_ms: None,
        settle_timed_out: None,
    };
    if let (Some(after), Some((quiet, timeout))) = (req.screenshot_after, settle) {
        let enc = Encoding::parse(after.format.as_deref(), after.quality, None)
            .map_err(ApiError::bad_request)?;
        let (waited, timed_out) = agent.display.settle(started, quiet, timeout).await;
        *settled = Some((waited, timed_out));
        let req = ShotRequest {
            encoding: enc,
            scale: after.scale,
            ..Default::default()
        };
        let d = agent.display.clone();
        let shot_at = Instant::now();
        let shot = crate::display::blocking(move || d.screenshot(&req)).await?;
        resp.screenshot_b64 =
            Some(base64::engine::general_purpose::STANDARD.encode(shot.bytes.as_ref()));
        resp.settled_ms = Some(waited.as_millis() as u64);
        resp.settle_timed_out = Some(timed_out);
        *shot_taken = Some((shot, shot_at));
    }
    Ok(resp)
}

pub async fn info(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    display_info(&agent, &headers, None).await
}

/// `PUT /v1/display`: resizes the live screen (RandR) and answers the display as the server
/// then reports it. 400 for a size the screen cannot take, 503 `no_display` / `no_randr`.
pub async fn resize(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
    ApiJson(size): ApiJson<DisplaySize>,
) -> Result<Response, ApiError> {
    let d = agent.display.clone();
    // The size as the server reported it at the end of this resize (a later one may already
    // have begun).
    let now = crate::display::blocking(move || d.resize(size.width, size.height)).await?;
    display_info(&agent, &headers, Some(now)).await
}

async fn display_info(
    agent: &Arc<Agent>,
    headers: &HeaderMap,
    size: Option<(u32, u32)>,
) -> Result<Response, ApiError> {
    let d = agent.display.clone();
    let (size, depth, extensions) = crate::display::blocking(move || {
        let size = match size {
            Some(s) => s,
            None => d.screen_size()?,
        };
        Ok((size, d.depth()?, d.extensions()?))
    })
    .await?;
    let listen = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_string();
    Ok(Json(DisplayInfo {
        display: agent.display.name().map(str::to_string),
        width: size.0,
        height: size.1,
        depth,
        user: agent.account_name.clone(),
        home: agent.home.to_string_lossy().into_owned(),
        extensions,
        listen,
    })
    .into_response())
}

pub async fn windows(State(agent): State<Arc<Agent>>) -> Result<Response, ApiError> {
    let d = agent.display.clone();
    let list = crate::display::blocking(move || d.windows()).await?;
    Ok(Json(serde_json::json!({ "windows": list })).into_response())
}

pub async fn clipboard_get(State(agent): State<Arc<Agent>>) -> Result<Response, ApiError> {
    let d = agent.display.clone();
    let text = crate::display::blocking(move || d.clipboard_get()).await?;
    Ok(Json(Clipboard { text }).into_response())
}

pub async fn clipboard_put(
    State(agent): State<Arc<Agent>>,
    ApiJson(body): ApiJson<Clipboard>,
) -> Result<Response, ApiError> {
    let text = body
        .text
        .ok_or_else(|| ApiError::bad_request("invalid field `text`: a string is required"))?;
    let d = agent.display.clone();
    crate::display::blocking(move || d.clipboard_set(text)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_parse_and_bad_ones_are_named() {
        assert_eq!(parse_region("0,0,10,20").unwrap(), (0, 0, 10, 20));
        assert_eq!(parse_region(" 5, 6 ,7,8").unwrap(), (5, 6, 7, 8));
        assert!(parse_region("1,2,3").is_err());
        assert!(parse_region("a,b,c,d").is_err());
        assert!(parse_region("1,2,-3,4").is_err());
    }
}
