//! `POST /v1/computer`: computer-use tool actions as engines emit them.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use berth_protocol::{ComputerRequest, ComputerResponse};

use super::error::ApiError;
use super::extract::ApiJson;
use crate::Agent;

pub async fn computer(
    State(agent): State<Arc<Agent>>,
    ApiJson(req): ApiJson<ComputerRequest>,
) -> Response {
    match crate::display::computer::run(&agent.display, req).await {
        Ok(r) => Json(r).into_response(),
        Err(e) => {
            let e = ApiError::from(e);
            (
                e.status,
                Json(ComputerResponse {
                    error: Some(e.message),
                    ..Default::default()
                }),
            )
                .into_response()
        }
    }
}
