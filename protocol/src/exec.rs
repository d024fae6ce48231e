use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /v1/exec`. Exactly one of `argv` and `shell` is given.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// A script for `/bin/sh -c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Working directory; default the sandbox user's home. `~/` is expanded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Added to (and overriding) the sandbox environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Run as this account instead of the sandbox user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Kill the command's process group after this long. Foreground default: 120 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Bytes written to the command's stdin; stdin is then closed unless `stdin_open`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Background only: keep stdin open for `POST /v1/commands/{id}/stdin`. Without `stdin` or
    /// this flag, stdin is `/dev/null`, so a program that reads it never waits for input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_open: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<bool>,
    /// Client-chosen id: repeating a request with the same id returns the same command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Background only: wait up to this long and answer with the output so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yield_ms: Option<u64>,
}

impl ExecRequest {
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest {
            argv: Some(argv.into_iter().map(Into::into).collect()),
            ..Default::default()
        }
    }

    pub fn shell(script: impl Into<String>) -> Self {
        ExecRequest {
            shell: Some(script.into()),
            ..Default::default()
        }
    }

    pub fn background(mut self) -> Self {
        self.background = Some(true);
        self
    }
}

/// Foreground `POST /v1/exec` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ExecResult {
    pub id: String,
    /// The exit status; 128 + signal number when the command was killed by a signal.
    pub exit_code: i32,
    /// Set when a signal ended the command (`"KILL"`, `"TERM"`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_b64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_b64: Option<String>,
    pub duration_ms: u64,
    pub timed_out: bool,
    /// Set when the output exceeded what one answer carries; the rest is at
    /// `GET /v1/commands/{id}/output`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_truncated: bool,
}

impl ExecResult {
    /// stdout bytes, whichever field carried them.
    pub fn stdout_bytes(&self) -> Vec<u8> {
        decode_text_or_b64(self.stdout.as_deref(), self.stdout_b64.as_deref())
    }

    pub fn stderr_bytes(&self) -> Vec<u8> {
        decode_text_or_b64(self.stderr.as_deref(), self.stderr_b64.as_deref())
    }
}

fn decode_text_or_b64(text: Option<&str>, b64: Option<&str>) -> Vec<u8> {
    use base64::Engine;
    match (text, b64) {
        (Some(t), _) => t.as_bytes().to_vec(),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .unwrap_or_default(),
        (None, None) => Vec::new(),
    }
}

/// Background `POST /v1/exec` answer (202).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct BackgroundStarted {
    pub id: String,
    /// With `yield_ms`: the output so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<Vec<OutputChunk>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_seq: Option<u64>,
    /// With `yield_ms`: whether the command finished within the wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CommandState {
    Running,
    Exited,
    /// The command's supervisor vanished without recording how the command ended.
    Lost,
}

/// One command record (`GET /v1/commands/{id}`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct CommandInfo {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    pub state: CommandState,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    pub started_at: String,
    pub ended_at: Option<String>,
    #[serde(default)]
    pub background: bool,
    /// Bytes of output recorded so far (the next sequence number).
    #[serde(default)]
    pub output_bytes: u64,
    /// Clients following the output right now.
    #[serde(default)]
    pub followers: usize,
    /// Followers dropped so far because they stopped reading.
    #[serde(default)]
    pub lagged_followers: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct CommandList {
    pub commands: Vec<CommandInfo>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A run of output bytes from one stream. `seq` is the byte offset of its first byte in the
/// command's one combined output stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct OutputChunk {
    pub seq: u64,
    pub stream: Stream,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Replaces `data` for bytes that are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_b64: Option<String>,
}

impl OutputChunk {
    pub fn bytes(&self) -> Vec<u8> {
        decode_text_or_b64(self.data.as_deref(), self.data_b64.as_deref())
    }

    pub fn len(&self) -> u64 {
        match (&self.data, &self.data_b64) {
            (Some(t), _) => t.len() as u64,
            _ => self.bytes().len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `GET /v1/commands/{id}/output` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct OutputPage {
    pub chunks: Vec<OutputChunk>,
    pub next_seq: u64,
    /// The command has ended and every byte up to `next_seq` was delivered.
    pub done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Present when the per-command cap dropped bytes before this sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated_before_seq: Option<u64>,
}

/// One message on a followed output stream (WebSocket text frame, SSE `data:` line).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(untagged)]
pub enum FollowMessage {
    Chunk(OutputChunk),
    /// The follower fell behind and is dropped; reconnect with `from_seq=resume_from_seq`.
    Lagged {
        lagged: bool,
        resume_from_seq: u64,
    },
    /// Bytes before this sequence number were dropped by the per-command cap.
    Truncated {
        truncated_before_seq: u64,
    },
    /// The last message: how the command ended (`null` when it was lost).
    Exit {
        exit_code: Option<i32>,
    },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StdinRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_b64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eof: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// A signal name (`TERM`, `SIGKILL`, `int`) or number.
    pub signal: serde_json::Value,
}
