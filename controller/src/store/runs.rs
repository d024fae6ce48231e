//! The `runs` table: commands started in sandboxes, their status and, once ended, their output.

use rusqlite::{OptionalExtension, Row, params};
use serde_json::Value;

use super::{Result, Store};
use crate::lifecycle::{RunStatus, sql_list};
use crate::util::rfc3339;

#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub sandbox_id: String,
    pub id: String,
    pub status: RunStatus,
    pub command: Value,
    pub timeout_ms: Option<u64>,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The combined output as the agent's chunks, once the run ended.
    pub output: Option<Value>,
    pub truncated: bool,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub unreachable_since: Option<i64>,
    pub error: Option<String>,
    /// The agent request of a run not yet known to have reached the agent (its environment
    /// and secrets included), so a restarted controller can deliver it. Sealed in the store,
    /// and dropped once the run started or ended.
    pub start_request: Option<String>,
    /// The artifact holding the whole output when it passed the inline bound (`stdout`,
    /// `stderr` and `output` then hold a preview).
    pub output_artifact: Option<String>,
    /// Which stream each stretch of the output artifact came from.
    pub output_streams: Option<Vec<StreamSpan>>,
    /// With the artifact: the output's first and last lines and its size.
    pub output_preview: Option<berth_protocol::OutputPreview>,
}

/// A stretch of a run's combined output from one stream: `len` bytes from agent sequence
/// number `seq`, at `offset` in the output artifact.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamSpan {
    pub seq: u64,
    pub offset: u64,
    pub len: u64,
    pub stream: berth_protocol::Stream,
}

impl RunRow {
    pub fn done(&self) -> bool {
        self.status.done()
    }

    fn from_row(r: &Row) -> rusqlite::Result<RunRow> {
        let command: String = r.get("command")?;
        let output: Option<String> = r.get("output")?;
        Ok(RunRow {
            sandbox_id: r.get("sandbox_id")?,
            id: r.get("id")?,
            status: r.get("status")?,
            command: serde_json::from_str(&command).unwrap_or(Value::Null),
            timeout_ms: r.get::<_, Option<i64>>("timeout_ms")?.map(|v| v as u64),
            exit_code: r.get("exit_code")?,
            stdout: r.get("stdout")?,
            stderr: r.get("stderr")?,
            output: output.and_then(|o| serde_json::from_str(&o).ok()),
            truncated: r.get::<_, i64>("truncated")? != 0,
            created_at: r.get("created_at")?,
            started_at: r.get("started_at")?,
            ended_at: r.get("ended_at")?,
            unreachable_since: r.get("unreachable_since")?,
            error: r.get("error")?,
            // Opened by the store (`Store::open_run`).
            start_request: r.get("start_request")?,
            output_artifact: r.get("output_artifact")?,
            output_streams: r
                .get::<_, Option<String>>("output_streams")?
                .and_then(|s| serde_json::from_str(&s).ok()),
            output_preview: r
                .get::<_, Option<String>>("output_preview")?
                .and_then(|s| serde_json::from_str(&s).ok()),
        })
    }

    pub fn to_wire(&self) -> berth_protocol::controller::Run {
        berth_protocol::controller::Run {
            id: self.id.clone(),
            sandbox_id: self.sandbox_id.clone(),
            status: self.status,
            exit_code: self.exit_code,
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
            started_at: self.started_at.map(rfc3339),
            ended_at: self.ended_at.map(rfc3339),
            error: self.error.clone(),
            output_truncated: self.truncated && self.output_artifact.is_none(),
            output_artifact: self.output_artifact.clone(),
            truncated: self.output_artifact.is_some(),
            output_preview: self.output_preview.clone(),
        }
    }
}

/// What a run's sealed request is bound to.
fn run_binding(sandbox_id: &str, id: &str) -> String {
    format!("run:{sandbox_id}/{id}")
}

impl Store {
    /// A run row with its undelivered request opened.
    fn open_run(&self, r: &Row) -> rusqlite::Result<RunRow> {
        let mut row = RunRow::from_row(r)?;
        row.start_request = row.start_request.as_deref().and_then(|s| {
            self.sealer
                .open_string(s, &run_binding(&row.sandbox_id, &row.id))
                .inspect_err(
                    |e| tracing::error!(run = %row.id, error = %e, "a run's request does not open"),
                )
                .ok()
        });
        Ok(row)
    }

    /// Inserts a run unless one with this id exists; answers the run that holds and whether it
    /// is new.
    pub fn insert_run(&self, r: &RunRow) -> Result<(RunRow, bool)> {
        let command = serde_json::to_string(&r.command)?;
        let start = r.start_request.as_ref().map(|q| {
            self.sealer
                .seal(q.as_bytes(), &run_binding(&r.sandbox_id, &r.id))
        });
        self.with(|c| {
            let n = c.execute(
                "INSERT INTO runs (sandbox_id, id, status, command, timeout_ms, created_at,
                   start_request)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO NOTHING",
                params![
                    r.sandbox_id,
                    r.id,
                    r.status,
                    command,
                    r.timeout_ms.map(|t| t as i64),
                    r.created_at,
                    start
                ],
            )?;
            let row = c.query_row(
                "SELECT * FROM runs WHERE sandbox_id = ?1 AND id = ?2",
                [&r.sandbox_id, &r.id],
                |row| self.open_run(row),
            )?;
            Ok((row, n == 1))
        })
    }

    pub fn run(&self, sandbox_id: &str, id: &str) -> Result<Option<RunRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT * FROM runs WHERE sandbox_id = ?1 AND id = ?2",
                [sandbox_id, id],
                |row| self.open_run(row),
            )
            .optional()
        })
    }

    pub fn runs_in_flight(&self) -> Result<Vec<RunRow>> {
        self.with(|c| {
            let in_flight: Vec<RunStatus> = RunStatus::ALL
                .iter()
                .copied()
                .filter(|s| !s.done())
                .collect();
            let mut st = c.prepare(&format!(
                "SELECT * FROM runs WHERE status IN {} ORDER BY created_at",
                sql_list(&in_flight, RunStatus::as_str)
            ))?;
            let rows = st.query_map([], |r| self.open_run(r))?;
            rows.collect()
        })
    }

    pub fn run_started(&self, sandbox_id: &str, id: &str, at: i64) -> Result<()> {
        self.with(|c| {
            c.execute(
                &format!(
                    "UPDATE runs SET status = ?4, started_at = COALESCE(started_at, ?3),
                       start_request = NULL
                     WHERE sandbox_id = ?1 AND id = ?2 AND status IN {}",
                    sql_list(&RunStatus::sources(RunStatus::Running), RunStatus::as_str)
                ),
                params![sandbox_id, id, at, RunStatus::Running],
            )
            .map(|_| ())
        })
    }

    pub fn run_unreachable(&self, sandbox_id: &str, id: &str, since: Option<i64>) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE runs SET unreachable_since = ?3 WHERE sandbox_id = ?1 AND id = ?2",
                params![sandbox_id, id, since],
            )
            .map(|_| ())
        })
    }

    /// Ends a run once: a second finisher (the waiting request and the reconciler may race)
    /// changes nothing. True for the one that wrote it.
    pub fn finish_run(&self, r: &RunRow) -> Result<bool> {
        if !r.status.done() {
            // Not an end: nothing to finish.
            return Ok(false);
        }
        let from = sql_list(&RunStatus::sources(r.status), RunStatus::as_str);
        let output = r.output.as_ref().map(serde_json::to_string).transpose()?;
        let streams = r
            .output_streams
            .as_ref()
            .map(serde_json::to_string)
            .transpose()?;
        let preview = r
            .output_preview
            .as_ref()
            .map(serde_json::to_string)
            .transpose()?;
        self.with(|c| {
            c.execute(
                &format!(
                    "UPDATE runs SET status = ?3, exit_code = ?4, stdout = ?5, stderr = ?6,
                       output = ?7, truncated = ?8, ended_at = ?9, error = ?10,
                       started_at = COALESCE(started_at, ?11), start_request = NULL,
                       output_artifact = ?12, output_streams = ?13, output_preview = ?14
                     WHERE sandbox_id = ?1 AND id = ?2 AND status IN {from}"
                ),
                params![
                    r.sandbox_id,
                    r.id,
                    r.status,
                    r.exit_code,
                    r.stdout,
                    r.stderr,
                    output,
                    r.truncated as i64,
                    r.ended_at,
                    r.error,
                    r.started_at,
                    r.output_artifact,
                    streams,
                    preview
                ],
            )
            .map(|n| n == 1)
        })
    }
}

impl Store {
    /// Every run of a sandbox, oldest first.
    pub fn runs_of(&self, sandbox_id: &str) -> Result<Vec<RunRow>> {
        self.with(|c| {
            let mut st =
                c.prepare("SELECT * FROM runs WHERE sandbox_id = ?1 ORDER BY created_at")?;
            let rows = st.query_map([sandbox_id], |r| self.open_run(r))?;
            rows.collect()
        })
    }
}
