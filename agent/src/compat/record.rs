//! `/start_recording` and `/end_recording` on the in-process recorder: one compat recording
//! at a time, "started" answered once the first frame is in the file (not after a fixed 2 s),
//! and the MP4 returned as the reference server returns it.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::json;

use super::{error, flask};
use crate::Agent;
use crate::record::CompatError;

pub async fn start_recording(State(agent): State<Arc<Agent>>) -> Response {
    match agent.recorder.compat_start().await {
        Ok(()) => flask(
            StatusCode::OK,
            &json!({"message": "Started recording successfully.", "status": "success"}),
        ),
        Err(CompatError::AlreadyRecording) => {
            error(StatusCode::BAD_REQUEST, "Recording is already in progress.")
        }
        Err(CompatError::NotRecording) => {
            error(StatusCode::BAD_REQUEST, "No recording in progress to stop.")
        }
        Err(CompatError::Failed(e)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Failed to start recording. {e}"),
        ),
    }
}

pub async fn end_recording(State(agent): State<Arc<Agent>>) -> Response {
    match agent.recorder.compat_end().await {
        Ok((path, info)) => {
            if info.bytes == 0 {
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "Recording failed. The output file is missing or empty. {}",
                        info.error.unwrap_or_default()
                    ),
                );
            }
            match crate::http::file::serve_prefix(
                &path,
                info.bytes,
                &HeaderMap::new(),
                "recording.mp4",
            )
            .await
            {
                Ok(r) => r,
                Err(e) => error(e.status, e.message),
            }
        }
        Err(CompatError::NotRecording) => {
            error(StatusCode::BAD_REQUEST, "No recording in progress to stop.")
        }
        Err(CompatError::AlreadyRecording) => {
            error(StatusCode::BAD_REQUEST, "Recording is already in progress.")
        }
        Err(CompatError::Failed(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
