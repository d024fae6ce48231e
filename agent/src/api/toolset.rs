//! `/v1/toolsets/{computer,browser}`: Anthropic's computer toolset run in the guest (see
//! `display::computer::toolset`) and its browser toolset over CDP (see `browser::toolset`).
//! `GET` answers the `tools[]` entry and what it drives; `POST` takes a model turn's `content`
//! and answers one `tool_result` per `tool_use` of the toolset.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use berth_protocol::toolset::{
    BROWSER_FAMILY, BrowserToolsetInfo, COMPUTER_FAMILY, ComputerToolsetInfo, ToolsetTurn,
};

use crate::Agent;
use crate::display::computer::toolset;
use crate::http::error::ApiError;
use crate::http::extract::ApiJson;

pub async fn computer_info(
    State(agent): State<Arc<Agent>>,
) -> Result<Json<ComputerToolsetInfo>, ApiError> {
    Ok(Json(toolset::screen(&agent.display).await?.info()))
}

pub async fn computer_turn(
    State(agent): State<Arc<Agent>>,
    ApiJson(turn): ApiJson<ToolsetTurn>,
) -> Result<Json<ToolsetTurn>, ApiError> {
    let called = std::time::Instant::now();
    let calls = toolset::calls(&turn.content, COMPUTER_FAMILY).map_err(ApiError::bad_request)?;
    let mut answer = toolset::run_turn(&agent.display, &calls).await?;
    if let Some(n) = agent.control.take_notice() {
        toolset::prepend_notice(&agent.display, &mut answer, notice_text(n)).await?;
    }
    agent
        .log_toolset_turn(crate::episode::Source::Toolset, &answer, called)
        .await;
    Ok(Json(ToolsetTurn {
        content: answer.content,
    }))
}

/// What the model is told after a person handed the controls back.
pub fn notice_text(n: crate::control::Notice) -> String {
    let held = n
        .returned
        .duration_since(n.taken)
        .unwrap_or_default()
        .as_secs();
    format!(
        "{} for {held} s (from {} to {}) and handed them back; windows, text and the page may \
         have changed. This is the screen now; look at it before acting.",
        berth_protocol::control::SCREEN_CHANGED,
        crate::time::rfc3339(n.taken),
        crate::time::rfc3339(n.returned)
    )
}

fn browser_desktop(agent: &Agent) -> Result<&Arc<crate::desktop::Desktop>, ApiError> {
    agent.desktop.as_ref().ok_or_else(|| {
        ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "no_desktop",
            "the browser toolset needs the agent's desktop (--desktop)",
        )
    })
}

fn browser_down(e: String) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "browser_down",
        e,
    )
}

pub async fn browser_info(
    State(agent): State<Arc<Agent>>,
) -> Result<Json<BrowserToolsetInfo>, ApiError> {
    let d = browser_desktop(&agent)?;
    agent
        .browser_toolset
        .info(d)
        .await
        .map(Json)
        .map_err(browser_down)
}

pub async fn browser_turn(
    State(agent): State<Arc<Agent>>,
    ApiJson(turn): ApiJson<ToolsetTurn>,
) -> Result<Json<ToolsetTurn>, ApiError> {
    let calls = crate::toolset_input::calls(&turn.content, BROWSER_FAMILY)
        .map_err(ApiError::bad_request)?;
    let d = browser_desktop(&agent)?;
    let answer = agent.browser_toolset.run_turn(d, &calls).await;
    Ok(Json(ToolsetTurn {
        content: answer.content,
    }))
}
