//! The controller's one source of truth: an SQLite file (WAL). Every state change is a row, so a
//! restarted controller knows every sandbox, run, lease and event it had.
//!
//! Statements are short and run under one connection lock; the claim of a warm member is a
//! single `UPDATE … RETURNING`, so two claims can never take the same row.
//!
//! One file per table: [`sandboxes`], [`runs`], [`leases`], [`events`], [`viewers`],
//! [`artifacts`].

use std::path::Path;
use std::sync::Mutex;

use berth_protocol::sync::Locked;
use rusqlite::{Connection, params};

use crate::seal::{self, Sealer};

mod artifacts;
mod controls;
mod events;
mod leases;
mod runs;
mod sandboxes;
mod viewers;
mod workpieces;

pub use artifacts::{ArtifactKind, ArtifactRow};
pub use controls::{ControlRow, HeldRow, RunLogins};
pub use leases::LeaseRow;
pub use runs::{RunRow, StreamSpan};
pub use sandboxes::{SandboxRow, SandboxUpdate};
pub use workpieces::{ProposalRow, VersionRow, WorkpieceRow};

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
    screen TEXT,
    limits TEXT,
    egress TEXT,
    credentials TEXT
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
CREATE TABLE IF NOT EXISTS artifacts (
    id TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL,
    run_id TEXT,
    name TEXT NOT NULL,
    content_type TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    kind TEXT NOT NULL,
    source TEXT,
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS artifacts_sandbox ON artifacts (sandbox_id, run_id);
CREATE INDEX IF NOT EXISTS artifacts_created ON artifacts (created_at);
";

pub struct Store {
    conn: Mutex<Connection>,
    sealer: Sealer,
}

/// Adds `column` to `table` unless the store has it already (a store made before it).
fn add_column(conn: &Connection, table: &str, column: &str, ddl: &str) -> rusqlite::Result<()> {
    let has = conn
        .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
        .exists([table, column])?;
    if !has {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {ddl}"))?;
    }
    Ok(())
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
        conn.execute_batch(workpieces::SCHEMA)?;
        conn.execute_batch(controls::SCHEMA)?;
        // Columns added since the first stores: each added to a store made before it.
        for (table, column, ddl) in [
            ("sandboxes", "ports", "TEXT NOT NULL DEFAULT '{}'"),
            ("runs", "start_request", "TEXT"),
            ("sandboxes", "screen", "TEXT"),
            ("sandboxes", "limits", "TEXT"),
            ("sandboxes", "egress", "TEXT"),
            ("sandboxes", "credentials", "TEXT"),
            ("runs", "output_artifact", "TEXT"),
            ("runs", "output_streams", "TEXT"),
            ("runs", "output_preview", "TEXT"),
            ("controls", "logins", "TEXT"),
        ] {
            add_column(&conn, table, column, ddl)?;
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

    /// A secret derived from the store's secret key for `label` (see [`Sealer::derive`]).
    pub fn derive(&self, label: &str) -> String {
        self.sealer.derive(label)
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

    pub(super) fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let conn = self.conn.locked();
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
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::Value;

    use super::*;
    use crate::lifecycle::{LeaseStatus, RunStatus, SandboxStatus};
    use crate::util::now_ms;

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
            status: RunStatus::Pending,
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
            output_artifact: None,
            output_streams: None,
            output_preview: None,
        }
    }

    fn row(id: &str, pool: Option<&str>, status: &str) -> SandboxRow {
        SandboxRow {
            id: id.into(),
            profile: "ide".into(),
            image_ref: "process:x".into(),
            provider: "process".into(),
            status: status.parse().unwrap(),
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
            limits: None,
            egress: None,
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
    fn racing_claims_take_each_running_member_once() {
        let (_d, s) = store();
        for i in 0..5 {
            s.insert_sandbox(&row(&format!("m{i}"), Some("ide"), "running"))
                .unwrap();
        }
        s.insert_sandbox(&row("starting", Some("ide"), "starting"))
            .unwrap();
        s.insert_sandbox(&row("stopping", Some("ide"), "stopping"))
            .unwrap();
        // Sixteen claimers, two attempts each, race for the five running members.
        let got: Vec<String> = std::thread::scope(|t| {
            let claimers: Vec<_> = (0..16)
                .map(|_| {
                    t.spawn(|| {
                        (0..2)
                            .filter_map(|_| s.claim_warm("ide", &BTreeMap::new(), None).unwrap())
                            .map(|r| r.id)
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            claimers
                .into_iter()
                .flat_map(|c| c.join().unwrap())
                .collect()
        });
        let mut ids = got.clone();
        ids.sort();
        assert_eq!(ids, ["m0", "m1", "m2", "m3", "m4"], "{got:?}");
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
        let stopping = SandboxStatus::Stopping;
        assert!(s.set_status("a", stopping, Default::default()).unwrap());
        for to in [SandboxStatus::Running, SandboxStatus::Starting, stopping] {
            assert!(!s.set_status("a", to, Default::default()).unwrap(), "{to}");
        }
        assert_eq!(s.sandbox("a").unwrap().unwrap().status, stopping);
        // Stopped is final.
        assert!(
            s.set_status("a", SandboxStatus::Stopped, Default::default())
                .unwrap()
        );
        for &to in SandboxStatus::ALL {
            assert!(!s.set_status("a", to, Default::default()).unwrap(), "{to}");
        }
        assert!(!s.set_status("nope", stopping, Default::default()).unwrap());
    }

    #[test]
    fn the_store_moves_a_status_only_as_the_table_allows() {
        let (_d, s) = store();
        for &from in SandboxStatus::ALL {
            for &to in SandboxStatus::ALL {
                let id = format!("{from}-{to}");
                s.insert_sandbox(&row(&id, None, from.as_str())).unwrap();
                let u = SandboxUpdate {
                    error: Some("why"),
                    ..Default::default()
                };
                let moved = s.set_status(&id, to, u).unwrap();
                assert_eq!(moved, from.can_move(to), "{from} → {to}");
                let got = s.sandbox(&id).unwrap().unwrap();
                assert_eq!(got.status, if moved { to } else { from });
                // A refused move writes nothing of its update either.
                assert_eq!(got.error.is_some(), moved, "{from} → {to}");
            }
        }
        // A compare-and-set on the status read: another status refuses it.
        s.insert_sandbox(&row("c", None, "starting")).unwrap();
        let (pending, starting, running) = (
            SandboxStatus::Pending,
            SandboxStatus::Starting,
            SandboxStatus::Running,
        );
        assert!(
            !s.set_status_from("c", pending, starting, Default::default())
                .unwrap()
        );
        assert!(
            s.set_status_from("c", starting, running, Default::default())
                .unwrap()
        );
        assert_eq!(s.sandbox("c").unwrap().unwrap().status, running);
    }

    #[test]
    fn a_run_ends_once_and_never_from_an_end() {
        let (_d, s) = store();
        s.insert_run(&pending_run("a", "r")).unwrap();
        // Not an end: refused.
        let running = RunRow {
            status: RunStatus::Running,
            ..pending_run("a", "r")
        };
        assert!(!s.finish_run(&running).unwrap());
        s.run_started("a", "r", 5).unwrap();
        assert_eq!(s.run("a", "r").unwrap().unwrap().status, RunStatus::Running);
        assert_eq!(s.runs_in_flight().unwrap().len(), 1);
        let lost = RunRow {
            status: RunStatus::Lost,
            ..pending_run("a", "r")
        };
        assert!(s.finish_run(&lost).unwrap());
        let exited = RunRow {
            status: RunStatus::Exited,
            ..lost.clone()
        };
        assert!(!s.finish_run(&exited).unwrap(), "an end is final");
        s.run_started("a", "r", 6).unwrap();
        let got = s.run("a", "r").unwrap().unwrap();
        assert_eq!(got.status, RunStatus::Lost);
        assert_eq!(got.to_wire().status, "lost");
        assert!(s.runs_in_flight().unwrap().is_empty());
    }

    #[test]
    fn runs_are_inserted_once_and_finished_once() {
        let (_d, s) = store();
        let r = pending_run("a", "r1");
        assert!(s.insert_run(&r).unwrap().1);
        assert!(!s.insert_run(&r).unwrap().1);
        let done = RunRow {
            status: RunStatus::Exited,
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
            status: LeaseStatus::Active,
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
        assert!(
            !s.end_lease("l1", LeaseStatus::Active).unwrap(),
            "not an end"
        );
        assert!(s.end_lease("l1", LeaseStatus::Released).unwrap());
        assert!(!s.end_lease("l1", LeaseStatus::Released).unwrap());
        assert!(!s.end_lease("l1", LeaseStatus::Expired).unwrap());
        assert_eq!(
            s.lease("l1").unwrap().unwrap().status,
            LeaseStatus::Released
        );
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
        assert!(s.set_status("a", SandboxStatus::Running, u).unwrap());
        assert_eq!(s.sandbox("a").unwrap().unwrap().ports, ports);
        // A change that names no ports keeps them.
        s.set_status("a", SandboxStatus::Stopping, SandboxUpdate::default())
            .unwrap();
        assert_eq!(s.sandbox("a").unwrap().unwrap().ports, ports);
        drop(s);
        // Opening it again (the column exists now) changes nothing.
        let s = Store::open(&path, test_sealer()).unwrap();
        assert_eq!(s.sandbox("a").unwrap().unwrap().ports, ports);
    }

    #[test]
    fn an_artifact_leaves_with_its_event_and_only_once() {
        let (_d, s) = store();
        s.insert_sandbox(&row("a", None, "running")).unwrap();
        let art = ArtifactRow {
            id: "art_1".into(),
            sandbox_id: "a".into(),
            run_id: None,
            name: "f".into(),
            content_type: "text/plain".into(),
            size: 4,
            sha256: "00".into(),
            kind: ArtifactKind::File,
            source: None,
            created_at: now_ms(),
        };
        assert!(s.insert_artifact(&art).unwrap());
        let data = serde_json::json!({"artifact_id": "art_1", "reason": "retention"});
        assert!(
            s.delete_artifact("art_1", now_ms(), "artifact.deleted", &data)
                .unwrap()
        );
        assert!(s.artifact("art_1").unwrap().is_none());
        assert!(
            !s.delete_artifact("art_1", now_ms(), "artifact.deleted", &data)
                .unwrap()
        );
        let kinds: Vec<Value> = s
            .events("a", 0, 100)
            .unwrap()
            .into_iter()
            .map(|e| e["kind"].clone())
            .collect();
        assert_eq!(kinds, ["artifact.deleted"]);
    }

    fn held(sha: &str, at: i64, until: i64) -> HeldRow {
        use berth_protocol::control::Holder;
        HeldRow {
            holder: Holder::Session,
            holder_sha256: sha.into(),
            taken_at: at,
            expires_at: until,
        }
    }

    #[test]
    fn one_holder_at_a_time_renewals_keep_the_take_and_ended_leases_are_free() {
        let (_d, s) = store();
        assert!(s.control("sb_1").unwrap().held.is_none());
        let (row, fresh) = s
            .take_control("sb_1", &held("a", 10, 100), 10)
            .unwrap()
            .unwrap();
        assert!(fresh);
        assert_eq!(row.held.unwrap().expires_at, 100);
        assert!(
            s.take_control("sb_1", &held("b", 20, 200), 20)
                .unwrap()
                .is_none()
        );
        let (row, fresh) = s
            .take_control("sb_1", &held("a", 50, 150), 50)
            .unwrap()
            .unwrap();
        assert!(!fresh, "a renewal");
        assert_eq!(row.held.as_ref().unwrap().taken_at, 10);
        assert_eq!(s.held_controls().unwrap().len(), 1);
        // Past its end anyone may take it.
        let (_, fresh) = s
            .take_control("sb_1", &held("b", 151, 300), 151)
            .unwrap()
            .unwrap();
        assert!(fresh);
        assert_eq!(
            s.release_control("sb_1").unwrap().unwrap().holder_sha256,
            "b"
        );
        assert!(s.release_control("sb_1").unwrap().is_none());
        assert!(s.held_controls().unwrap().is_empty());
        s.set_requests_enabled("sb_2", true).unwrap();
        assert!(s.control("sb_2").unwrap().requests_enabled);
    }
}
