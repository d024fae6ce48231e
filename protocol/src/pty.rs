use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /v1/pty`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyRequest {
    /// Program and arguments; default the sandbox user's login shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cols: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PtyState {
    Running,
    Exited,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct PtyInfo {
    pub id: String,
    pub cmd: Vec<String>,
    pub cols: u16,
    pub rows: u16,
    pub pid: Option<u32>,
    pub state: PtyState,
    pub exit_code: Option<i32>,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// WebSocket clients attached right now.
    pub attached: usize,
    /// Bytes the terminal has written so far.
    pub output_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct PtyList {
    pub ptys: Vec<PtyInfo>,
}

/// JSON control messages on a PTY WebSocket (text frames; terminal bytes travel as binary).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(untagged)]
pub enum PtyControl {
    /// Client → agent.
    Resize { resize: PtySize },
    /// Agent → client, once, before the close: how the program ended.
    Exit { exit_code: i32 },
    /// Agent → client: this attacher fell behind and `skipped` bytes were not sent to it.
    Lagged { lagged: bool, skipped: u64 },
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}
