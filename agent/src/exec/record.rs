//! The on-disk record of one command, `commands/<id>/`:
//! `meta.json` (what runs and how), `proc.json` (who supervises it), `output.log`, `streams`
//! and `trunc` (its output, see `log`), `exit` (how it ended), `stdin` (a FIFO, when open).
//!
//! Written by the agent and by the per-command shim; read by any later agent.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Meta {
    pub id: String,
    /// What the client asked for, echoed in listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// What actually runs (`/bin/sh -c …` for shell scripts).
    pub program: Vec<String>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// Switch to uid/gid before exec (false when the agent already runs as that account).
    pub switch_identity: bool,
    pub stdin: StdinMode,
    #[serde(default)]
    pub merge_stderr: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    pub background: bool,
    pub output_cap: u64,
    pub started_at: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StdinMode {
    /// `/dev/null`.
    Null,
    /// The `stdin` FIFO in the command directory.
    Fifo,
    /// A pipe written once by the agent (foreground commands).
    Pipe,
}

/// Who supervises a command: the shim (background) or the agent itself (foreground). A
/// command without an `exit` record whose supervisor is gone is `lost`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcInfo {
    pub supervisor_pid: u32,
    pub supervisor_start: u64,
    pub pid: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExitRecord {
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default)]
    pub timed_out: bool,
    pub ended_at: String,
    /// Set when output could not be recorded (disk full …); the command itself still ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_error: Option<String>,
    /// Written by an agent that put this exit on the timeline itself (foreground commands),
    /// so no later agent reports it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reported: bool,
}

pub const META: &str = "meta.json";
pub const PROC: &str = "proc.json";
pub const EXIT: &str = "exit";
pub const STDIN: &str = "stdin";
pub const STDIN_CLOSED: &str = "stdin.closed";
/// Present once the agent has put this command's exit on the timeline.
pub const EXIT_REPORTED: &str = "exit.reported";

/// Writes `value` as JSON to `dir/name` atomically (temp file + rename), so a reader never
/// sees half a record.
pub fn write_json<T: Serialize>(dir: &Path, name: &str, value: &T) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    // Writing over a prepared temp file (see `spare`) is much cheaper than creating one. It is
    // cut to length after the write, not truncated at open: ext4 starts writing back, on
    // close, a file that was truncated to nothing (its guard for replace-by-truncate), which
    // costs about 45 µs of every record.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&tmp)?;
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    f.write_all(&bytes)?;
    f.set_len(bytes.len() as u64)?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name))
}

pub fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, name: &str) -> Option<T> {
    let bytes = std::fs::read(dir.join(name)).ok()?;
    serde_json::from_slice(&bytes).ok()
}
