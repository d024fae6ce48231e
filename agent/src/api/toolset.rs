//! `/v1/toolsets/computer`: Anthropic's computer toolset run in the guest (see
//! `display::toolset`). `GET` answers the `tools[]` entry and the screen it drives; `POST` takes
//! a model turn's `content` and answers one `tool_result` per `tool_use` of the toolset.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use berth_protocol::toolset::{COMPUTER_FAMILY, ComputerToolsetInfo, ToolsetTurn};

use super::error::ApiError;
use super::extract::ApiJson;
use crate::Agent;
use crate::display::computer::toolset;

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
    let answer = toolset::run_turn(&agent.display, &calls).await?;
    if !answer.ran.is_empty() {
        let body = serde_json::json!({ "actions": answer.ran });
        super::episode::log_computer(
            &agent,
            crate::episode::Source::Toolset,
            &body,
            &answer.trace,
            answer.error.clone(),
            called,
        )
        .await;
    }
    Ok(Json(ToolsetTurn {
        content: answer.content,
    }))
}
