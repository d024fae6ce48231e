//! Recordings (`/v1/recordings`) and viewer tokens.

use serde::{Deserialize, Serialize};

/// `POST /v1/recordings`. Every field is optional; the defaults suit a 1080p desktop.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordingRequest {
    /// A client-chosen id (`[A-Za-z0-9_.-]`, at most 128 bytes); taken ids are a 409.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Frames per second sampled from the screen, 1–60 (default 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fps: Option<u32>,
    /// Output size as a share of the screen, 0 < scale ≤ 1 (default: fit within 1920×1080).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<f64>,
    /// Target bit rate, 100–50,000 kbit/s (default 4,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bitrate_kbps: Option<u32>,
    /// Longest stretch between keyframes while the screen changes, 1,000–60,000 ms
    /// (default 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyframe_interval_ms: Option<u32>,
    /// Draw the pointer (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<bool>,
    /// Stop on its own after this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RecordingState {
    Recording,
    /// Finished: stopped, reached its limit, or the agent shut down.
    Stopped,
    /// Ended by an error (a full disk, …); the file holds what was written before it.
    Failed,
    /// The agent died while recording; the file holds every fragment written before that.
    Interrupted,
}

/// One recording, live or finished.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct RecordingInfo {
    pub id: String,
    pub state: RecordingState,
    /// Started through the compat surface (`/start_recording`).
    #[serde(default)]
    pub compat: bool,
    pub width: u32,
    pub height: u32,
    pub fps: u32,
    pub bitrate_kbps: u32,
    pub keyframe_interval_ms: u32,
    pub cursor: bool,
    /// Pictures encoded (screen changes, keyframes asked for, and once-a-second refreshes of
    /// a still screen).
    pub frames_encoded: u64,
    /// Ticks where nothing had changed: the previous picture simply lasts longer.
    pub frames_skipped: u64,
    /// Ticks missed because the recorder fell behind.
    pub frames_dropped: u64,
    pub keyframes: u64,
    /// Bytes in the file (complete fragments only).
    pub bytes: u64,
    pub duration_ms: u64,
    /// Ticks handled per second (encoded + skipped): equals `fps` when nothing was dropped.
    pub achieved_fps: f64,
    /// Pictures encoded per second.
    pub encoded_fps: f64,
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Why it ended: `stopped`, `deleted`, `max_duration`, `shutdown`, `error`, `agent_died`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct RecordingList {
    pub recordings: Vec<RecordingInfo>,
}

/// `POST /v1/viewer-tokens`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ViewerTokenRequest {
    /// How long the one-time URL stays valid, 1–3600 s (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view_only: Option<bool>,
    /// The browser-facing page the URL opens (default `/v1/vnc/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ViewerToken {
    pub url: String,
    pub expires_at: String,
}
