//! `/accessibility` and `/terminal` from the in-process AT-SPI reader, each with a server-side
//! deadline: OSWorld's harness calls both without a client timeout (`/terminal` is its
//! connectivity probe), so neither may ever hang.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::{error, flask};
use crate::Agent;

const TREE_DEADLINE: Duration = Duration::from_secs(20);
const TERMINAL_DEADLINE: Duration = Duration::from_secs(5);

pub async fn accessibility(State(agent): State<Arc<Agent>>) -> Response {
    match tokio::time::timeout(TREE_DEADLINE, agent.a11y.tree()).await {
        Ok(Ok(apps)) => flask(
            StatusCode::OK,
            &json!({"AT": crate::a11y::xml::to_xml(&apps)}),
        ),
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the accessibility tree took longer than {} s",
                TREE_DEADLINE.as_secs()
            ),
        ),
    }
}

/// The focused terminal's text, read from the terminal applications' active frames only: with
/// none active it answers after one round trip to each application, walking no tree.
pub async fn terminal(State(agent): State<Arc<Agent>>) -> Response {
    let output = match tokio::time::timeout(TERMINAL_DEADLINE, agent.a11y.terminal_frames()).await {
        Ok(Ok(frames)) => crate::a11y::focused_terminal(&frames),
        _ => None,
    };
    flask(
        StatusCode::OK,
        &json!({"output": output, "status": "success"}),
    )
}
