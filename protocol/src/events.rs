use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One observed action on the agent's sequence-numbered timeline.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Event {
    pub seq: u64,
    /// RFC 3339 wall-clock time with milliseconds.
    pub at: String,
    /// One of the kinds in `API.md` (`command.started`, `pty.closed`, `file.uploaded`, …).
    pub kind: String,
    /// Kind-specific fields, flattened into the event object.
    #[serde(flatten)]
    pub data: Map<String, Value>,
}

/// `GET /v1/events` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct EventsPage {
    pub events: Vec<Event>,
    pub next_seq: u64,
    /// Present when events older than this sequence number are no longer kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated_before_seq: Option<u64>,
}

/// A message on a followed stream that is not a record: the follower fell too far behind.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Lagged {
    pub lagged: bool,
    pub resume_from_seq: u64,
}

pub mod kinds {
    pub const COMMAND_STARTED: &str = "command.started";
    pub const COMMAND_EXITED: &str = "command.exited";
    pub const PTY_OPENED: &str = "pty.opened";
    pub const PTY_CLOSED: &str = "pty.closed";
    pub const FILE_UPLOADED: &str = "file.uploaded";
    pub const RECORDING_STARTED: &str = "recording.started";
    pub const RECORDING_STOPPED: &str = "recording.stopped";
    pub const COMPONENT_UP: &str = "component.up";
    pub const COMPONENT_DOWN: &str = "component.down";
    pub const COMPONENT_RESTARTED: &str = "component.restarted";
    pub const COMPONENT_GAVE_UP: &str = "component.gave_up";
    pub const BROWSER_RESTARTED: &str = "browser.restarted";
    /// The desktop took over a browser the user started on its profile (after `pkill chrome`).
    pub const BROWSER_ADOPTED: &str = "browser.adopted";
}
