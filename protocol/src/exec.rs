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
    /// In place of `stdout` when it was larger than one answer carries: its first and last
    /// lines and its size; the whole of it is read by range at `output_href`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_preview: Option<OutputPreview>,
    /// In place of `stderr`, as `stdout_preview`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_preview: Option<OutputPreview>,
    /// With a preview: where the command's whole output is read by range
    /// (`?from_seq=N&max_bytes=M`, the combined stream's byte offsets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_href: Option<String>,
}

/// Bytes of each stream a native `POST /v1/exec` answer carries inline; past it the stream
/// travels as an [`OutputPreview`] and a reference.
pub const EXEC_INLINE_BYTES: usize = 1 << 20;
/// The most lines, and bytes, a preview keeps from the start of the output.
pub const PREVIEW_HEAD_LINES: usize = 20;
/// The most lines a preview keeps from the end.
pub const PREVIEW_TAIL_LINES: usize = 40;
/// The most bytes a preview keeps from each end.
pub const PREVIEW_END_BYTES: usize = 8 << 10;

/// Output too large to travel inline: its first and last lines and byte counts. The whole of
/// it is fetched by range from where the answer carrying this names.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct OutputPreview {
    /// The output's whole size.
    pub bytes: u64,
    /// Its first lines (at most 20 and 8 KiB; bytes that are not UTF-8 replaced).
    pub head: String,
    /// Its last lines (at most 40 and 8 KiB).
    pub tail: String,
    /// Bytes between `head` and `tail`, in neither.
    pub omitted_bytes: u64,
}

impl OutputPreview {
    /// The preview of output of `total` bytes whose first bytes are `first` and last bytes are
    /// `last` (either may hold more than the preview keeps; `last` ends where the output ends).
    pub fn of(first: &[u8], last: &[u8], total: u64) -> OutputPreview {
        let head = head_lines(first, PREVIEW_HEAD_LINES, PREVIEW_END_BYTES);
        let mut tail = tail_lines(last, PREVIEW_TAIL_LINES, PREVIEW_END_BYTES);
        // Short output: the tail starts after the head ends.
        let room = total.saturating_sub(head.len() as u64);
        if (tail.len() as u64) > room {
            tail = &tail[tail.len() - room as usize..];
        }
        OutputPreview {
            bytes: total,
            omitted_bytes: total - head.len() as u64 - tail.len() as u64,
            head: String::from_utf8_lossy(head).into_owned(),
            tail: String::from_utf8_lossy(tail).into_owned(),
        }
    }
}

/// Output's whole size and its last bytes (at least a preview's end, at most twice that),
/// kept while it is read, for its [`OutputPreview`].
#[derive(Debug, Default, Clone)]
pub struct OutputEnd {
    pub total: u64,
    pub last: Vec<u8>,
}

impl OutputEnd {
    pub fn push(&mut self, data: &[u8]) {
        const END: usize = PREVIEW_END_BYTES;
        self.total += data.len() as u64;
        self.last
            .extend_from_slice(&data[data.len().saturating_sub(END)..]);
        if self.last.len() > 2 * END {
            self.last.drain(..self.last.len() - END);
        }
    }
}

/// The first `lines` lines of `data` within `max` bytes (a line longer than that is cut).
fn head_lines(data: &[u8], lines: usize, max: usize) -> &[u8] {
    let data = &data[..data.len().min(max)];
    let mut end = 0;
    for (n, i) in data
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i)
        .enumerate()
    {
        end = i + 1;
        if n + 1 == lines {
            return &data[..end];
        }
    }
    // No newline within the bound: the bound; otherwise whole lines only.
    if end == 0 { data } else { &data[..end] }
}

/// The last `lines` lines of `data` within `max` bytes.
fn tail_lines(data: &[u8], lines: usize, max: usize) -> &[u8] {
    let data = &data[data.len() - data.len().min(max)..];
    // A final newline ends the last line; it does not start another.
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == lines {
                return &data[i + 1..];
            }
        }
    }
    data
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
    /// With `yield_ms`: present when the per-command cap dropped bytes before this sequence
    /// number (the chunks then start there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated_before_seq: Option<u64>,
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

#[cfg(test)]
mod preview_tests {
    use super::*;

    fn numbered(n: usize) -> String {
        (1..=n).map(|i| format!("line {i}\n")).collect()
    }

    #[test]
    fn a_preview_keeps_the_first_and_last_lines_and_counts_the_rest() {
        let text = numbered(1000);
        let p = OutputPreview::of(text.as_bytes(), text.as_bytes(), text.len() as u64);
        assert_eq!(p.head, numbered(PREVIEW_HEAD_LINES));
        assert!(p.tail.starts_with("line 961\n") && p.tail.ends_with("line 1000\n"));
        assert_eq!(p.tail.lines().count(), PREVIEW_TAIL_LINES);
        assert_eq!(p.bytes, text.len() as u64);
        assert_eq!(
            p.omitted_bytes,
            (text.len() - p.head.len() - p.tail.len()) as u64
        );
    }

    #[test]
    fn long_lines_are_cut_at_the_byte_bound_and_short_output_is_not_counted_twice() {
        let one = vec![b'a'; 100_000];
        let p = OutputPreview::of(&one, &one, one.len() as u64);
        assert_eq!(
            (p.head.len(), p.tail.len()),
            (PREVIEW_END_BYTES, PREVIEW_END_BYTES)
        );
        assert_eq!(p.omitted_bytes, 100_000 - 2 * PREVIEW_END_BYTES as u64);
        let short = numbered(30);
        let p = OutputPreview::of(short.as_bytes(), short.as_bytes(), short.len() as u64);
        assert_eq!(p.head.clone() + &p.tail, short);
        assert_eq!(p.omitted_bytes, 0);
        let p = OutputPreview::of(b"", b"", 0);
        assert_eq!(p, OutputPreview::default());
    }

    #[test]
    fn bytes_that_are_not_text_are_replaced_not_refused() {
        let p = OutputPreview::of(&[0xff, b'\n', b'x'], &[0xff, b'\n', b'x'], 3);
        assert_eq!(p.head, "\u{fffd}\n");
        assert_eq!(p.tail, "x");
    }
}
