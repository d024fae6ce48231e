//! The controller's one source of truth: an SQLite file (WAL). Every state change is a row, so a
//! restarted controller knows every sandbox, run, lease and event it had.
//!
//! Statements are short and run under one connection lock; the claim of a warm member is a
//! single `UPDATE … RETURNING`, so two claims can never take the same row.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::{Map, Value};

use crate::seal::{self, Sealer};
use crate::util::{now_ms, rfc3339};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("store: {0}")]
    Json(#[from] serde_json::Error),
    #[error("store: {0}")]
    Seal(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    profile TEXT NOT NULL,
    image_ref TEXT NOT NULL,
    provider TEXT NOT NULL,
    status TEXT NOT NULL,
    labels TEXT NOT NULL DEFAULT '{}',
    pool TEXT,
    claim TEXT,
    agent_url TEXT,
    agent_token TEXT NOT NULL,
    compat_url TEXT,
    cdp_url TEXT,
    ports TEXT NOT NULL DEFAULT '{}',
    created_at INTEGER NOT NULL,
    ready_deadline INTEGER NOT NULL,
    ready_at INTEGER,
    expires_at INTEGER,
    ended_at INTEGER,
    error TEXT,
    agent_event_seq INTEGER NOT NULL DEFAULT 0,
    screen TEXT
);
CREATE INDEX IF NOT EXISTS sandboxes_pool ON sandboxes (pool, status);
CREATE INDEX IF NOT EXISTS sandboxes_status ON sandboxes (status);
CREATE TABLE IF NOT EXISTS runs (
    sandbox_id TEXT NOT NULL,
    id TEXT NOT NULL,
    status TEXT NOT NULL,
    command TEXT NOT NULL,
    timeout_ms INTEGER,
    exit_code INTEGER,
    stdout TEXT NOT NULL DEFAULT '',
    stderr TEXT NOT NULL DEFAULT '',
    output TEXT,
    truncated INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    ended_at INTEGER,
    unreachable_since INTEGER,
    error TEXT,
    PRIMARY KEY (sandbox_id, id)
);
CREATE INDEX IF NOT EXISTS runs_status ON runs (status);
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    profile TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    ended_at INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS leases_active_thread ON leases (thread_id) WHERE status = 'active';
CREATE TABLE IF NOT EXISTS events (
    sandbox_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, seq)
);
CREATE TABLE IF NOT EXISTS viewer_tokens (
    hash TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    used INTEGER NOT NULL DEFAULT 0
);
";

/// A sandbox row.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRow {
    pub id: String,
    pub profile: String,
    pub image_ref: String,
    pub provider: String,
    pub status: String,
    pub labels: BTreeMap<String, String>,
    /// The pool this sandbox waits in, while it is an unclaimed warm member.
    pub pool: Option<String>,
    pub claim: Option<String>,
    pub agent_url: Option<String>,
    pub agent_token: String,
    pub compat_url: Option<String>,
    pub cdp_url: Option<String>,
    /// The image's declared ports by name (`vlc` → `http://host:port`).
    pub ports: BTreeMap<String, String>,
    pub created_at: i64,
    pub ready_deadline: i64,
    pub ready_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub error: Option<String>,
    pub agent_event_seq: u64,
    /// A desktop's screen (`1280x800`): asked at create or by its pool, or as it started.
    pub screen: Option<String>,
}

impl SandboxRow {
    pub fn live(&self) -> bool {
        matches!(self.status.as_str(), "pending" | "starting" | "running")
    }

    fn from_row(r: &Row) -> rusqlite::Result<SandboxRow> {
        let labels: String = r.get("labels")?;
        let ports: String = r.get("ports")?;
        Ok(SandboxRow {
            id: r.get("id")?,
            profile: r.get("profile")?,
            image_ref: r.get("image_ref")?,
            provider: r.get("provider")?,
            status: r.get("status")?,
            labels: serde_json::from_str(&labels).unwrap_or_default(),
            pool: r.get("pool")?,
            claim: r.get("claim")?,
            agent_url: r.get("agent_url")?,
            agent_token: r.get("agent_token")?,
            compat_url: r.get("compat_url")?,
            cdp_url: r.get("cdp_url")?,
            ports: serde_json::from_str(&ports).unwrap_or_default(),
            created_at: r.get("created_at")?,
            ready_deadline: r.get("ready_deadline")?,
            ready_at: r.get("ready_at")?,
            expires_at: r.get("expires_at")?,
            ended_at: r.get("ended_at")?,
            error: r.get("error")?,
            agent_event_seq: r.get::<_, i64>("agent_event_seq")? as u64,
            screen: r.get("screen")?,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub sandbox_id: String,
    pub id: String,
    pub status: String,
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
}

impl RunRow {
    pub fn done(&self) -> bool {
        matches!(self.status.as_str(), "exited" | "failed" | "lost")
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
        })
    }

    pub fn to_wire(&self) -> berth_protocol::controller::Run {
        berth_protocol::controller::Run {
            id: self.id.clone(),
            sandbox_id: self.sandbox_id.clone(),
            status: self.status.clone(),
            exit_code: self.exit_code,
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
            started_at: self.started_at.map(rfc3339),
            ended_at: self.ended_at.map(rfc3339),
            error: self.error.clone(),
            output_truncated: self.truncated,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRow {
    pub id: String,
    pub thread_id: String,
    pub sandbox_id: String,
    pub profile: String,
    pub status: String,
    pub created_at: i64,
    pub expires_at: i64,
}

impl LeaseRow {
    fn from_row(r: &Row) -> rusqlite::Result<LeaseRow> {
        Ok(LeaseRow {
            id: r.get("id")?,
            thread_id: r.get("thread_id")?,
            sandbox_id: r.get("sandbox_id")?,
            profile: r.get("profile")?,
            status: r.get("status")?,
            created_at: r.get("created_at")?,
            expires_at: r.get("expires_at")?,
        })
    }
}

/// Fields a status change may set besides the status.
#[derive(Debug, Default)]
pub struct SandboxUpdate<'a> {
    pub agent_url: Option<&'a str>,
    pub compat_url: Option<&'a str>,
    pub cdp_url: Option<&'a str>,
    /// The declared ports by name, replacing what the row held.
    pub ports: Option<&'a BTreeMap<String, String>>,
    pub ready_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub error: Option<&'a str>,
}

/// What a run's sealed request is bound to.
fn run_binding(sandbox_id: &str, id: &str) -> String {
    format!("run:{sandbox_id}/{id}")
}

pub struct Store {
    conn: Mutex<Connection>,
    sealer: Sealer,
}

/// What the store seals a known value with, to tell at open whether its key is the right one.
const SEAL_CHECK: &str = "seal_check";

impl Store {
    /// Opens (creating) the store. `sealer` holds the key its secrets are sealed with: a store
    /// sealed with another key is refused, and one from before sealing is sealed now.
    pub fn open(path: &Path, sealer: Sealer) -> Result<Store> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        // Stores made before sandboxes had declared ports.
        let has_ports = conn
            .prepare("SELECT 1 FROM pragma_table_info('sandboxes') WHERE name = 'ports'")?
            .exists([])?;
        if !has_ports {
            conn.execute_batch(
                "ALTER TABLE sandboxes ADD COLUMN ports TEXT NOT NULL DEFAULT '{}'",
            )?;
        }
        // Stores made before runs kept their undelivered request.
        let has_start = conn
            .prepare("SELECT 1 FROM pragma_table_info('runs') WHERE name = 'start_request'")?
            .exists([])?;
        if !has_start {
            conn.execute_batch("ALTER TABLE runs ADD COLUMN start_request TEXT")?;
        }
        // Stores made before sandboxes recorded their screen.
        let has_screen = conn
            .prepare("SELECT 1 FROM pragma_table_info('sandboxes') WHERE name = 'screen'")?
            .exists([])?;
        if !has_screen {
            conn.execute_batch("ALTER TABLE sandboxes ADD COLUMN screen TEXT")?;
        }
        let store = Store {
            conn: Mutex::new(conn),
            sealer,
        };
        let check = store.meta_init(SEAL_CHECK, &store.sealer.seal(b"berth", SEAL_CHECK))?;
        if store.sealer.open(&check, SEAL_CHECK).is_err() {
            return Err(StoreError::Seal(format!(
                "{} was sealed with another secret key: start with the key it was made with \
                 (`secret_key_file`)",
                path.display()
            )));
        }
        store.seal_plain_tokens()?;
        Ok(store)
    }

    /// Seals the agent tokens a store from before sealing holds in the clear.
    fn seal_plain_tokens(&self) -> Result<()> {
        self.with(|c| {
            let plain: Vec<(String, String)> = c
                .prepare("SELECT id, agent_token FROM sandboxes WHERE agent_token NOT LIKE ?1")?
                .query_map([format!("{}%", seal::PREFIX)], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            for (id, token) in plain {
                c.execute(
                    "UPDATE sandboxes SET agent_token = ?2 WHERE id = ?1",
                    params![id, self.sealer.seal(token.as_bytes(), &id)],
                )?;
            }
            Ok(())
        })
    }

    /// A sandbox row with its agent token opened.
    fn open_sandbox(&self, r: &Row) -> rusqlite::Result<SandboxRow> {
        let mut row = SandboxRow::from_row(r)?;
        row.agent_token = match self.sealer.open_string(&row.agent_token, &row.id) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(sandbox = %row.id, error = %e, "the agent token does not open");
                String::new()
            }
        };
        Ok(row)
    }

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

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        Ok(f(&conn)?)
    }

    /// Sets `key` unless it is set already; answers the value that holds.
    pub fn meta_init(&self, key: &str, value: &str) -> Result<String> {
        self.with(|c| {
            c.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
                [key, value],
            )?;
            c.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        })
    }

    // ---- sandboxes ----

    pub fn insert_sandbox(&self, s: &SandboxRow) -> Result<()> {
        let labels = serde_json::to_string(&s.labels)?;
        self.with(|c| {
            c.execute(
                "INSERT INTO sandboxes (id, profile, image_ref, provider, status, labels, pool,
                   claim, agent_token, created_at, ready_deadline, expires_at, screen)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                params![
                    s.id,
                    s.profile,
                    s.image_ref,
                    s.provider,
                    s.status,
                    labels,
                    s.pool,
                    s.claim,
                    self.sealer.seal(s.agent_token.as_bytes(), &s.id),
                    s.created_at,
                    s.ready_deadline,
                    s.expires_at,
                    s.screen
                ],
            )
            .map(|_| ())
        })
    }

    pub fn sandbox(&self, id: &str) -> Result<Option<SandboxRow>> {
        self.with(|c| {
            c.query_row("SELECT * FROM sandboxes WHERE id = ?1", [id], |r| {
                self.open_sandbox(r)
            })
            .optional()
        })
    }

    /// Sandboxes in the given statuses (all when empty).
    pub fn sandboxes(&self, statuses: &[&str]) -> Result<Vec<SandboxRow>> {
        self.with(|c| {
            let mut st = c.prepare("SELECT * FROM sandboxes ORDER BY created_at")?;
            let rows = st.query_map([], |r| self.open_sandbox(r))?;
            let mut out = Vec::new();
            for r in rows {
                let r = r?;
                if statuses.is_empty() || statuses.contains(&r.status.as_str()) {
                    out.push(r);
                }
            }
            Ok(out)
        })
    }

    /// Moves a sandbox to `status` unless it is already in one of `unless` (a sandbox being
    /// deleted must not come back as `running`). True when the row changed.
    pub fn set_status(
        &self,
        id: &str,
        status: &str,
        unless: &[&str],
        u: SandboxUpdate,
    ) -> Result<bool> {
        let current = match self.sandbox(id)? {
            Some(s) => s.status,
            None => return Ok(false),
        };
        if unless.contains(&current.as_str()) {
            return Ok(false);
        }
        let ports = u.ports.map(serde_json::to_string).transpose()?;
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET status = ?2,
                   agent_url = COALESCE(?3, agent_url), compat_url = COALESCE(?4, compat_url),
                   cdp_url = COALESCE(?5, cdp_url), ready_at = COALESCE(?6, ready_at),
                   ended_at = COALESCE(?7, ended_at), error = COALESCE(?8, error),
                   ports = COALESCE(?10, ports)
                 WHERE id = ?1 AND status = ?9",
                params![
                    id,
                    status,
                    u.agent_url,
                    u.compat_url,
                    u.cdp_url,
                    u.ready_at,
                    u.ended_at,
                    u.error,
                    current,
                    ports
                ],
            )
            .map(|n| n == 1)
        })
    }

    pub fn set_expiry(&self, id: &str, expires_at: Option<i64>) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET expires_at = ?2 WHERE id = ?1",
                params![id, expires_at],
            )
            .map(|_| ())
        })
    }

    /// Takes one running member of `pool` for a caller: the compare-and-swap that makes a warm
    /// member belong to exactly one owner. Labels and expiry are applied in the same statement.
    pub fn claim_warm(
        &self,
        pool: &str,
        labels: &BTreeMap<String, String>,
        expires_at: Option<i64>,
    ) -> Result<Option<SandboxRow>> {
        let labels = serde_json::to_string(labels)?;
        self.with(|c| {
            c.query_row(
                "UPDATE sandboxes SET pool = NULL, claim = 'warm', labels = ?2, expires_at = ?3
                 WHERE id = (SELECT id FROM sandboxes WHERE pool = ?1 AND status = 'running'
                             ORDER BY ready_at LIMIT 1)
                   AND pool = ?1 AND status = 'running'
                 RETURNING *",
                params![pool, labels, expires_at],
                |r| self.open_sandbox(r),
            )
            .optional()
        })
    }

    /// Records a sandbox's screen as its desktop now has it.
    pub fn set_screen(&self, id: &str, screen: &str) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET screen = ?2 WHERE id = ?1",
                params![id, screen],
            )
            .map(|_| ())
        })
    }

    /// The live members of `pool` (pending, starting or running): what a shrink decides on.
    pub fn pool_member_rows(&self, pool: &str) -> Result<Vec<SandboxRow>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT * FROM sandboxes WHERE pool = ?1
                   AND status IN ('pending', 'starting', 'running') ORDER BY created_at",
            )?;
            let rows = st.query_map([pool], |r| self.open_sandbox(r))?;
            rows.collect()
        })
    }

    /// Takes an idle member out of `pool` to be destroyed (`stopping`): the same
    /// compare-and-swap as a claim, so a member goes to one caller or away, never both. True
    /// when it was still an idle, running member.
    pub fn retire_member(&self, pool: &str, id: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET status = 'stopping'
                 WHERE id = ?2 AND pool = ?1 AND status = 'running'",
                params![pool, id],
            )
            .map(|n| n == 1)
        })
    }

    /// Members of `pool` that are starting or ready (what a refill counts).
    pub fn pool_members(&self, pool: &str) -> Result<(usize, usize)> {
        self.with(|c| {
            let ready: i64 = c.query_row(
                "SELECT COUNT(*) FROM sandboxes WHERE pool = ?1 AND status = 'running'",
                [pool],
                |r| r.get(0),
            )?;
            let starting: i64 = c.query_row(
                "SELECT COUNT(*) FROM sandboxes WHERE pool = ?1
                   AND status IN ('pending', 'starting')",
                [pool],
                |r| r.get(0),
            )?;
            Ok((ready as usize, starting as usize))
        })
    }

    pub fn count_by_status(&self) -> Result<BTreeMap<String, u64>> {
        self.with(|c| {
            let mut st = c.prepare("SELECT status, COUNT(*) FROM sandboxes GROUP BY status")?;
            let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
            let mut out = BTreeMap::new();
            for r in rows {
                let (k, v) = r?;
                out.insert(k, v as u64);
            }
            Ok(out)
        })
    }

    // ---- runs ----

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
            let mut st = c.prepare(
                "SELECT * FROM runs WHERE status IN ('pending', 'running') ORDER BY created_at",
            )?;
            let rows = st.query_map([], |r| self.open_run(r))?;
            rows.collect()
        })
    }

    pub fn run_started(&self, sandbox_id: &str, id: &str, at: i64) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE runs SET status = 'running', started_at = COALESCE(started_at, ?3),
                   start_request = NULL
                 WHERE sandbox_id = ?1 AND id = ?2 AND status = 'pending'",
                params![sandbox_id, id, at],
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
        let output = r.output.as_ref().map(serde_json::to_string).transpose()?;
        self.with(|c| {
            c.execute(
                "UPDATE runs SET status = ?3, exit_code = ?4, stdout = ?5, stderr = ?6,
                   output = ?7, truncated = ?8, ended_at = ?9, error = ?10,
                   started_at = COALESCE(started_at, ?11), start_request = NULL
                 WHERE sandbox_id = ?1 AND id = ?2 AND status IN ('pending', 'running')",
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
                    r.started_at
                ],
            )
            .map(|n| n == 1)
        })
    }

    // ---- leases ----

    pub fn active_lease_for_thread(&self, thread_id: &str) -> Result<Option<LeaseRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT * FROM leases WHERE thread_id = ?1 AND status = 'active'",
                [thread_id],
                LeaseRow::from_row,
            )
            .optional()
        })
    }

    pub fn lease(&self, id: &str) -> Result<Option<LeaseRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT * FROM leases WHERE id = ?1",
                [id],
                LeaseRow::from_row,
            )
            .optional()
        })
    }

    pub fn lease_for_sandbox(&self, sandbox_id: &str) -> Result<Option<LeaseRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT * FROM leases WHERE sandbox_id = ?1 AND status = 'active'",
                [sandbox_id],
                LeaseRow::from_row,
            )
            .optional()
        })
    }

    pub fn insert_lease(&self, l: &LeaseRow) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT INTO leases (id, thread_id, sandbox_id, profile, status, created_at,
                   expires_at) VALUES (?1, ?2, ?3, ?4, 'active', ?5, ?6)",
                params![
                    l.id,
                    l.thread_id,
                    l.sandbox_id,
                    l.profile,
                    l.created_at,
                    l.expires_at
                ],
            )
            .map(|_| ())
        })
    }

    pub fn set_lease_sandbox(&self, id: &str, sandbox_id: &str) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE leases SET sandbox_id = ?2 WHERE id = ?1",
                params![id, sandbox_id],
            )
            .map(|_| ())
        })
    }

    /// Extend-only: the expiry becomes the later of the current one and `expires_at`.
    pub fn extend_lease(&self, id: &str, expires_at: i64) -> Result<Option<LeaseRow>> {
        self.with(|c| {
            c.query_row(
                "UPDATE leases SET expires_at = MAX(expires_at, ?2)
                 WHERE id = ?1 AND status = 'active' RETURNING *",
                params![id, expires_at],
                LeaseRow::from_row,
            )
            .optional()
        })
    }

    /// Ends an active lease; true for the caller that ended it.
    pub fn end_lease(&self, id: &str, status: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "UPDATE leases SET status = ?2, ended_at = ?3 WHERE id = ?1 AND status = 'active'",
                params![id, status, now_ms()],
            )
            .map(|n| n == 1)
        })
    }

    pub fn expired_leases(&self, now: i64) -> Result<Vec<LeaseRow>> {
        self.with(|c| {
            let mut st =
                c.prepare("SELECT * FROM leases WHERE status = 'active' AND expires_at <= ?1")?;
            let rows = st.query_map([now], LeaseRow::from_row)?;
            rows.collect()
        })
    }

    // ---- events ----

    /// Appends to a sandbox's timeline; answers the event's sequence number.
    pub fn append_event(&self, sandbox_id: &str, at: i64, kind: &str, data: &Value) -> Result<u64> {
        let data = serde_json::to_string(data)?;
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let seq: i64 = tx.query_row(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE sandbox_id = ?1",
                [sandbox_id],
                |r| r.get(0),
            )?;
            tx.execute(
                "INSERT INTO events (sandbox_id, seq, at, kind, data) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![sandbox_id, seq, at, kind, data],
            )?;
            tx.commit()?;
            Ok(seq as u64)
        })
    }

    /// A batch of imported agent events and the agent sequence number reached, atomically, so
    /// a crash never imports one twice.
    pub fn import_events(
        &self,
        sandbox_id: &str,
        events: &[(i64, String, Value)],
        agent_seq: u64,
    ) -> Result<()> {
        let encoded: Vec<(i64, &String, String)> = events
            .iter()
            .map(|(at, kind, data)| Ok((*at, kind, serde_json::to_string(data)?)))
            .collect::<Result<_>>()?;
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let first: i64 = tx.query_row(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE sandbox_id = ?1",
                [sandbox_id],
                |r| r.get(0),
            )?;
            for (seq, (at, kind, data)) in (first..).zip(&encoded) {
                tx.execute(
                    "INSERT INTO events (sandbox_id, seq, at, kind, data)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![sandbox_id, seq, at, kind, data],
                )?;
            }
            tx.execute(
                "UPDATE sandboxes SET agent_event_seq = ?2 WHERE id = ?1",
                params![sandbox_id, agent_seq as i64],
            )?;
            tx.commit()
        })
    }

    /// Timeline records from `from_seq`, at most `limit`, as wire objects.
    pub fn events(&self, sandbox_id: &str, from_seq: u64, limit: usize) -> Result<Vec<Value>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT seq, at, kind, data FROM events WHERE sandbox_id = ?1 AND seq >= ?2
                 ORDER BY seq LIMIT ?3",
            )?;
            let rows = st.query_map(params![sandbox_id, from_seq as i64, limit as i64], |r| {
                let seq: i64 = r.get(0)?;
                let at: i64 = r.get(1)?;
                let kind: String = r.get(2)?;
                let data: String = r.get(3)?;
                let mut obj: Map<String, Value> = serde_json::from_str(&data).unwrap_or_default();
                obj.insert("seq".into(), seq.into());
                obj.insert("at".into(), rfc3339(at).into());
                obj.insert("kind".into(), kind.into());
                Ok(Value::Object(obj))
            })?;
            rows.collect()
        })
    }

    // ---- viewer tokens ----

    pub fn insert_viewer_token(
        &self,
        hash: &str,
        sandbox_id: &str,
        kind: &str,
        expires_at: i64,
    ) -> Result<()> {
        self.with(|c| {
            c.execute(
                "DELETE FROM viewer_tokens WHERE expires_at < ?1",
                [now_ms()],
            )?;
            c.execute(
                "INSERT INTO viewer_tokens (hash, sandbox_id, kind, expires_at)
                 VALUES (?1, ?2, ?3, ?4)",
                params![hash, sandbox_id, kind, expires_at],
            )
            .map(|_| ())
        })
    }

    /// Uses a one-time token: true exactly once, for an unexpired token of this sandbox.
    pub fn use_viewer_token(&self, hash: &str, sandbox_id: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "UPDATE viewer_tokens SET used = 1 WHERE hash = ?1 AND sandbox_id = ?2
                   AND kind = 'url' AND used = 0 AND expires_at > ?3",
                params![hash, sandbox_id, now_ms()],
            )
            .map(|n| n == 1)
        })
    }

    pub fn viewer_session_valid(&self, hash: &str, sandbox_id: &str) -> Result<bool> {
        self.with(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM viewer_tokens WHERE hash = ?1 AND sandbox_id = ?2
                   AND kind = 'session' AND expires_at > ?3",
                params![hash, sandbox_id, now_ms()],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n > 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_sealer() -> Sealer {
        Sealer::new([3; 32])
    }

    #[test]
    fn secrets_are_sealed_at_rest_and_a_copy_under_another_key_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("berth.db");
        let s = Store::open(&path, test_sealer()).unwrap();
        let mut sb = row("a", None, "running");
        sb.agent_token = "agent-secret-token".into();
        s.insert_sandbox(&sb).unwrap();
        assert_eq!(
            s.sandbox("a").unwrap().unwrap().agent_token,
            "agent-secret-token"
        );
        let run = RunRow {
            start_request: Some(r#"{"env":{"API_KEY":"run-secret-value"}}"#.into()),
            ..pending_run("a", "r1")
        };
        let (stored, new) = s.insert_run(&run).unwrap();
        assert!(new);
        assert_eq!(stored.start_request, run.start_request);
        drop(s);
        // Nothing in the file reads as the secrets (WAL included).
        for f in std::fs::read_dir(d.path()).unwrap() {
            let bytes = std::fs::read(f.unwrap().path()).unwrap();
            for secret in ["agent-secret-token", "run-secret-value"] {
                assert!(
                    !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                    "{secret} in the clear"
                );
            }
        }
        let e = Store::open(&path, Sealer::new([4; 32]))
            .err()
            .expect("another key");
        assert!(e.to_string().contains("another secret key"), "{e}");
        let s = Store::open(&path, test_sealer()).unwrap();
        s.run_started("a", "r1", 2).unwrap();
        assert_eq!(s.run("a", "r1").unwrap().unwrap().start_request, None);
    }

    fn pending_run(sandbox_id: &str, id: &str) -> RunRow {
        RunRow {
            sandbox_id: sandbox_id.into(),
            id: id.into(),
            status: "pending".into(),
            command: Value::Null,
            timeout_ms: None,
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            output: None,
            truncated: false,
            created_at: now_ms(),
            started_at: None,
            ended_at: None,
            unreachable_since: None,
            error: None,
            start_request: None,
        }
    }

    fn row(id: &str, pool: Option<&str>, status: &str) -> SandboxRow {
        SandboxRow {
            id: id.into(),
            profile: "ide".into(),
            image_ref: "process:x".into(),
            provider: "process".into(),
            status: status.into(),
            labels: BTreeMap::new(),
            pool: pool.map(Into::into),
            claim: None,
            agent_url: None,
            agent_token: "t".into(),
            compat_url: None,
            cdp_url: None,
            ports: BTreeMap::new(),
            created_at: now_ms(),
            ready_deadline: now_ms() + 1000,
            ready_at: Some(now_ms()),
            expires_at: None,
            ended_at: None,
            error: None,
            agent_event_seq: 0,
            screen: None,
        }
    }

    fn store() -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("berth.db"), test_sealer()).unwrap();
        (d, s)
    }

    #[test]
    fn a_warm_member_is_claimed_once_and_only_when_running() {
        let (_d, s) = store();
        s.insert_sandbox(&row("a", Some("ide"), "running")).unwrap();
        s.insert_sandbox(&row("b", Some("ide"), "starting"))
            .unwrap();
        let labels = BTreeMap::from([("k".to_string(), "v".to_string())]);
        let got = s.claim_warm("ide", &labels, None).unwrap().unwrap();
        assert_eq!(got.id, "a");
        assert_eq!(got.claim.as_deref(), Some("warm"));
        assert_eq!(got.labels, labels);
        assert!(got.pool.is_none());
        assert!(s.claim_warm("ide", &labels, None).unwrap().is_none());
        assert_eq!(s.pool_members("ide").unwrap(), (0, 1));
    }

    #[test]
    fn a_retired_member_is_never_claimed_and_a_claimed_one_is_never_retired() {
        let (_d, s) = store();
        s.insert_sandbox(&row("a", Some("ide"), "running")).unwrap();
        s.insert_sandbox(&row("b", Some("ide"), "running")).unwrap();
        s.insert_sandbox(&row("c", Some("ide"), "starting"))
            .unwrap();
        s.insert_sandbox(&row("d", Some("other"), "running"))
            .unwrap();
        let ids = |v: Vec<SandboxRow>| v.into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(ids(s.pool_member_rows("ide").unwrap()), ["a", "b", "c"]);
        assert!(s.retire_member("ide", "a").unwrap());
        assert!(!s.retire_member("ide", "a").unwrap(), "once");
        assert!(!s.retire_member("ide", "c").unwrap(), "not while starting");
        assert!(!s.retire_member("ide", "d").unwrap(), "not another pool's");
        let got = s
            .claim_warm("ide", &BTreeMap::new(), None)
            .unwrap()
            .unwrap();
        assert_eq!(got.id, "b", "a retired member is not claimed");
        assert!(
            !s.retire_member("ide", "b").unwrap(),
            "a claimed member stays"
        );
        assert_eq!(ids(s.pool_member_rows("ide").unwrap()), ["c"]);
        assert_eq!(s.pool_members("ide").unwrap(), (0, 1));
    }

    #[test]
    fn a_deleted_sandbox_never_comes_back_running() {
        let (_d, s) = store();
        s.insert_sandbox(&row("a", None, "starting")).unwrap();
        assert!(
            s.set_status("a", "stopping", &[], SandboxUpdate::default())
                .unwrap()
        );
        assert!(
            !s.set_status(
                "a",
                "running",
                &["stopping", "stopped"],
                SandboxUpdate::default()
            )
            .unwrap()
        );
        assert_eq!(s.sandbox("a").unwrap().unwrap().status, "stopping");
    }

    #[test]
    fn runs_are_inserted_once_and_finished_once() {
        let (_d, s) = store();
        let r = pending_run("a", "r1");
        assert!(s.insert_run(&r).unwrap().1);
        assert!(!s.insert_run(&r).unwrap().1);
        let done = RunRow {
            status: "exited".into(),
            exit_code: Some(3),
            ..r.clone()
        };
        assert!(s.finish_run(&done).unwrap());
        assert!(!s.finish_run(&done).unwrap());
        assert_eq!(s.run("a", "r1").unwrap().unwrap().exit_code, Some(3));
    }

    #[test]
    fn one_thread_holds_one_active_lease_and_renewals_only_extend() {
        let (_d, s) = store();
        let l = LeaseRow {
            id: "l1".into(),
            thread_id: "t".into(),
            sandbox_id: "a".into(),
            profile: "ide".into(),
            status: "active".into(),
            created_at: 0,
            expires_at: 1000,
        };
        s.insert_lease(&l).unwrap();
        assert!(
            s.insert_lease(&LeaseRow {
                id: "l2".into(),
                ..l.clone()
            })
            .is_err()
        );
        assert_eq!(s.extend_lease("l1", 500).unwrap().unwrap().expires_at, 1000);
        assert_eq!(
            s.extend_lease("l1", 2000).unwrap().unwrap().expires_at,
            2000
        );
        assert!(s.end_lease("l1", "released").unwrap());
        assert!(!s.end_lease("l1", "released").unwrap());
        s.insert_lease(&LeaseRow {
            id: "l3".into(),
            ..l
        })
        .unwrap();
    }

    #[test]
    fn timelines_number_events_per_sandbox_and_viewer_urls_work_once() {
        let (_d, s) = store();
        assert_eq!(
            s.append_event("a", 1, "x", &serde_json::json!({})).unwrap(),
            0
        );
        assert_eq!(
            s.append_event("a", 2, "y", &serde_json::json!({"n": 1}))
                .unwrap(),
            1
        );
        assert_eq!(
            s.append_event("b", 2, "y", &serde_json::json!({})).unwrap(),
            0
        );
        let ev = s.events("a", 1, 10).unwrap();
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0]["kind"], "y");
        assert_eq!(ev[0]["n"], 1);
        s.insert_viewer_token("h", "a", "url", now_ms() + 10_000)
            .unwrap();
        assert!(!s.use_viewer_token("h", "b").unwrap());
        assert!(s.use_viewer_token("h", "a").unwrap());
        assert!(!s.use_viewer_token("h", "a").unwrap());
    }

    #[test]
    fn declared_ports_are_kept_and_an_older_store_gains_their_column() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("berth.db");
        {
            // A store from before sandboxes had declared ports.
            let c = Connection::open(&path).unwrap();
            let old = SCHEMA.replace("    ports TEXT NOT NULL DEFAULT '{}',\n", "");
            assert_ne!(old, SCHEMA);
            c.execute_batch(&old).unwrap();
            c.execute(
                "INSERT INTO sandboxes (id, profile, image_ref, provider, status, agent_token,
                   created_at, ready_deadline) VALUES ('old', 'ide', 'x', 'docker', 'running', 't', 0, 0)",
                [],
            )
            .unwrap();
        }
        let s = Store::open(&path, test_sealer()).unwrap();
        let old = s.sandbox("old").unwrap().unwrap();
        assert!(old.ports.is_empty());
        // Its token, kept in the clear by then, is sealed now and still the same.
        assert_eq!(old.agent_token, "t");
        let raw: String = s
            .with(|c| {
                c.query_row(
                    "SELECT agent_token FROM sandboxes WHERE id = 'old'",
                    [],
                    |r| r.get(0),
                )
            })
            .unwrap();
        assert!(seal::is_sealed(&raw), "{raw}");
        s.insert_sandbox(&row("a", None, "starting")).unwrap();
        let ports = BTreeMap::from([("vlc".to_string(), "http://127.0.0.1:1234".to_string())]);
        let u = SandboxUpdate {
            ports: Some(&ports),
            ..Default::default()
        };
        assert!(s.set_status("a", "running", &[], u).unwrap());
        assert_eq!(s.sandbox("a").unwrap().unwrap().ports, ports);
        // A change that names no ports keeps them.
        s.set_status("a", "stopping", &[], SandboxUpdate::default())
            .unwrap();
        assert_eq!(s.sandbox("a").unwrap().unwrap().ports, ports);
        drop(s);
        // Opening it again (the column exists now) changes nothing.
        let s = Store::open(&path, test_sealer()).unwrap();
        assert_eq!(s.sandbox("a").unwrap().unwrap().ports, ports);
    }
}
