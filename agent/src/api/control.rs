//! `/v1/control`: the controller's pushes (a person holds the controls, handed back, requests
//! enabled, a request declined), the agent's request for a person, and the guard every input
//! and observation route sits behind while a person holds the controls.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_protocol::EventKind;
use berth_protocol::control::{
    self as wire, AgentControl, ControlGrant, ControlKey, ControlSettings, HumanRequest,
    HumanRequestAnswer,
};
use berth_protocol::routes::header;
use serde_json::json;

use crate::Agent;
use crate::control::{Change, RequestError};
use crate::http::error::ApiError;
use crate::http::extract::ApiJson;

/// The caller's control token (`x-berth-control`), if it sent one.
pub fn token(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get(header::CONTROL).and_then(|v| v.to_str().ok())
}

/// The refusal while a person holds the controls.
pub fn refused(expires_in_ms: u64) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        wire::HUMAN_IN_CONTROL,
        wire::refusal(expires_in_ms),
    )
}

/// The guard of the input and observation routes: only the holder passes while a person
/// holds the controls.
pub async fn guard(State(agent): State<Arc<Agent>>, req: Request, next: Next) -> Response {
    // The controller's own reads for the session view (its key) pass too.
    let controller = agent.control.is_controller(key(req.headers()));
    match agent.control.check(token(req.headers())) {
        Err(_) if controller => next.run(req).await,
        Ok(()) => next.run(req).await,
        Err(ms) => refused(ms).into_response(),
    }
}

/// The controller's key (`x-berth-control-key`), if the caller sent one.
fn key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::CONTROL_KEY)
        .and_then(|v| v.to_str().ok())
}

pub async fn get(State(agent): State<Arc<Agent>>) -> Json<AgentControl> {
    Json(agent.control.view())
}

/// The controller's pushes pass only with its key once it claimed them (403 otherwise).
fn pushed(agent: &Agent, headers: &HeaderMap) -> Result<(), ApiError> {
    agent.control.pusher(key(headers)).map_err(|_| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            wire::NOT_THE_CONTROLLER,
            "the controls are moved by the controller that keeps their lease: take them with \
             POST …/{id}/control on the controller",
        )
    })
}

/// `PUT /v1/control/key`: the controller claims the pushes (once).
pub async fn claim(
    State(agent): State<Arc<Agent>>,
    ApiJson(k): ApiJson<ControlKey>,
) -> Result<Json<AgentControl>, ApiError> {
    if !wire::is_sha256_hex(&k.key_sha256) {
        return Err(ApiError::bad_request(
            "key_sha256 must be a SHA-256 in hex (64 characters)",
        ));
    }
    agent.control.claim(&k.key_sha256).map_err(|_| {
        ApiError::new(
            StatusCode::CONFLICT,
            wire::CONTROL_KEY_SET,
            "another controller's key holds the controls of this agent",
        )
    })?;
    Ok(Json(agent.control.view()))
}

pub async fn put(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
    ApiJson(g): ApiJson<ControlGrant>,
) -> Result<Json<AgentControl>, ApiError> {
    pushed(&agent, &headers)?;
    if !wire::is_sha256_hex(&g.holder_sha256) {
        return Err(ApiError::bad_request(
            "holder_sha256 must be a SHA-256 in hex (64 characters)",
        ));
    }
    if g.ttl_ms > wire::MAX_TTL_SECONDS * 1000 {
        return Err(ApiError::bad_request(format!(
            "ttl_ms must be at most {}",
            wire::MAX_TTL_SECONDS * 1000
        )));
    }
    if agent.control.grant(&g) == Change::Taken {
        agent.log_control("control.taken");
    }
    Ok(Json(agent.control.view()))
}

pub async fn delete(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
) -> Result<Json<AgentControl>, ApiError> {
    pushed(&agent, &headers)?;
    if agent.control.release() == Change::Returned {
        agent.log_control("control.returned");
    }
    Ok(Json(agent.control.view()))
}

pub async fn settings(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
    ApiJson(s): ApiJson<ControlSettings>,
) -> Result<Json<AgentControl>, ApiError> {
    pushed(&agent, &headers)?;
    let bad = s.logins.iter().find(|n| !berth_protocol::login::name_ok(n));
    if let Some(n) = bad {
        return Err(ApiError::bad_request(format!(
            "logins: {n:?} is not a site name"
        )));
    }
    agent.control.set(s.requests_enabled, s.logins);
    Ok(Json(agent.control.view()))
}

pub async fn decline(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
) -> Result<Json<AgentControl>, ApiError> {
    pushed(&agent, &headers)?;
    agent.control.decline();
    Ok(Json(agent.control.view()))
}

/// `POST /v1/control/request`: waits for a person (bounded) and says how it ended.
pub async fn request(
    State(agent): State<Arc<Agent>>,
    ApiJson(r): ApiJson<HumanRequest>,
) -> Result<Json<HumanRequestAnswer>, ApiError> {
    ask(&agent, &r).await.map(Json)
}

/// The request for a person, shared by the route and the MCP tool.
pub async fn ask(agent: &Agent, r: &HumanRequest) -> Result<HumanRequestAnswer, ApiError> {
    let (reason, wait) = r.checked().map_err(ApiError::bad_request)?;
    let id = crate::exec::new_id().replacen("cmd_", "req_", 1);
    agent
        .control
        .open_request(id.clone(), reason.clone())
        .map_err(|e| match e {
            RequestError::Disabled => ApiError::new(
                StatusCode::FORBIDDEN,
                wire::REQUESTS_DISABLED,
                "this sandbox does not let the agent ask for a person (create it with \
                 \"human_control\": true)",
            ),
            RequestError::Pending => ApiError::new(
                StatusCode::CONFLICT,
                wire::REQUEST_PENDING,
                "a request for a person is already waiting",
            ),
        })?;
    agent.events.emit(
        EventKind::ControlRequested,
        json!({"id": id, "reason": reason, "timeout_seconds": wait}),
    );
    let started = Instant::now();
    let answer = agent.control.await_request(Duration::from_secs(wait)).await;
    agent.events.emit(
        EventKind::ControlRequestEnded,
        json!({
            "id": answer.id,
            "outcome": answer.outcome,
            "waited_ms": started.elapsed().as_millis() as u64,
        }),
    );
    Ok(answer)
}

/// The controller's own calls (its key, or the agent's): 403 for anyone else.
fn controller_only(agent: &Agent, headers: &HeaderMap) -> Result<(), ApiError> {
    match agent.control.is_controller(key(headers)) {
        true => Ok(()),
        false => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            berth_protocol::login::LOGIN_CONTROLLER_ONLY,
            "the login tool runs through the controller (POST …/{id}/login there, or its \
             `login` MCP tool)",
        )),
    }
}

/// `POST /v1/browser/login`: the desktop's browser signed in with the values the controller
/// hands over; the answer is a fixed phrase. Nothing of the request is logged or kept.
pub async fn browser_login(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
    ApiJson(l): ApiJson<berth_protocol::login::BrowserLogin>,
) -> Result<Json<berth_protocol::login::BrowserLoginResult>, ApiError> {
    controller_only(&agent, &headers)?;
    let within = l.checked().map_err(ApiError::bad_request)?;
    let outcome = match &agent.desktop {
        Some(d) => crate::browser::login::login(d, &l, within).await,
        None => berth_protocol::login::LoginOutcome::BrowserDown,
    };
    Ok(Json(berth_protocol::login::BrowserLoginResult {
        outcome,
        message: outcome.phrase().to_string(),
    }))
}

/// `POST /v1/browser/forget`: the cookies and storage of the hosts cleared.
pub async fn browser_forget(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
    ApiJson(f): ApiJson<berth_protocol::login::BrowserForget>,
) -> Result<Json<berth_protocol::login::BrowserForgotten>, ApiError> {
    controller_only(&agent, &headers)?;
    if f.hosts.len() > 100 || f.hosts.iter().any(|h| h.is_empty() || h.len() > 253) {
        return Err(ApiError::bad_request("hosts: 1-100 host names"));
    }
    let d = agent.desktop.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "browser_down",
            "no desktop here",
        )
    })?;
    let cookies = crate::browser::login::forget(d, &f.hosts)
        .await
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "browser_down",
                "the browser is not running",
            )
        })?;
    Ok(Json(berth_protocol::login::BrowserForgotten { cookies }))
}
