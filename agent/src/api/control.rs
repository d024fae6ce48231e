//! `/v1/control`: the controller's pushes (a person holds the controls, handed back, requests
//! enabled, a request declined), the agent's request for a person, and the guard every input
//! and observation route sits behind while a person holds the controls.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_protocol::EventKind;
use berth_protocol::control::{
    self as wire, AgentControl, ControlGrant, ControlSettings, HumanRequest, HumanRequestAnswer,
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
    match agent.control.check(token(req.headers())) {
        Ok(()) => next.run(req).await,
        Err(ms) => refused(ms).into_response(),
    }
}

pub async fn get(State(agent): State<Arc<Agent>>) -> Json<AgentControl> {
    Json(agent.control.view())
}

pub async fn put(
    State(agent): State<Arc<Agent>>,
    ApiJson(g): ApiJson<ControlGrant>,
) -> Result<Json<AgentControl>, ApiError> {
    let hex = g.holder_sha256.len() == 64 && g.holder_sha256.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex {
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

pub async fn delete(State(agent): State<Arc<Agent>>) -> Json<AgentControl> {
    if agent.control.release() == Change::Returned {
        agent.log_control("control.returned");
    }
    Json(agent.control.view())
}

pub async fn settings(
    State(agent): State<Arc<Agent>>,
    ApiJson(s): ApiJson<ControlSettings>,
) -> Json<AgentControl> {
    agent.control.set_requests(s.requests_enabled);
    Json(agent.control.view())
}

pub async fn decline(State(agent): State<Arc<Agent>>) -> Json<AgentControl> {
    agent.control.decline();
    Json(agent.control.view())
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
