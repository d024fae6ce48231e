use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntryType {
    File,
    Dir,
    Symlink,
    Other,
}

/// One file system entry (`/v1/fs/stat`, `/v1/fs/list`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct FileEntry {
    pub name: String,
    pub path: String,
    #[serde(rename = "type")]
    pub kind: EntryType,
    pub size: u64,
    /// Permission bits, e.g. 420 for 0644.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub modified_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// Depth below the listed directory (1 = direct child); absent on stat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ListResponse {
    pub path: String,
    pub entries: Vec<FileEntry>,
}

/// `PUT /v1/files` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct UploadResult {
    pub path: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    pub path: String,
    /// Create missing parents and accept an existing directory (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parents: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    pub from: String,
    pub to: String,
    /// Replace an existing destination (default false: 409).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<bool>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WatchKind {
    Create,
    Modify,
    Remove,
    Rename,
    Other,
}

/// One message on `GET /v1/fs/watch`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(untagged)]
pub enum WatchMessage {
    Event {
        kind: WatchKind,
        paths: Vec<String>,
    },
    /// The watcher fell behind; events were dropped and the stream ends.
    Lagged {
        lagged: bool,
    },
}
