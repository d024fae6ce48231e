//! The `workpieces`, `workpiece_versions` and `workpiece_proposals` tables. A version's bytes
//! are an artifact (kind `workpiece`) written before its row; a proposal's result is one too
//! (its preview), and accepting the proposal makes that same artifact the new version in one
//! transaction with the proposal's status, so a crash leaves one or the other, never half.

use berth_protocol::workpiece::{ProposalStatus, VersionAuthor, WorkpieceKind};
use rusqlite::{OptionalExtension, Row, params};

use super::{Result, Store};

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS workpieces (
    id TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    path TEXT NOT NULL,
    title TEXT NOT NULL,
    format TEXT NOT NULL,
    run_id TEXT,
    created_at INTEGER NOT NULL,
    missing_since INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS workpieces_path ON workpieces (sandbox_id, path);
CREATE TABLE IF NOT EXISTS workpiece_versions (
    workpiece_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    artifact_id TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size INTEGER NOT NULL,
    author TEXT NOT NULL,
    proposal_id TEXT,
    created_at INTEGER NOT NULL,
    preview_pages INTEGER NOT NULL DEFAULT 0,
    installed INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (workpiece_id, version)
);
CREATE TABLE IF NOT EXISTS workpiece_proposals (
    id TEXT PRIMARY KEY,
    workpiece_id TEXT NOT NULL,
    base_version INTEGER NOT NULL,
    summary TEXT NOT NULL,
    operations TEXT NOT NULL,
    status TEXT NOT NULL,
    preview_artifact TEXT NOT NULL,
    preview_sha256 TEXT NOT NULL,
    preview_size INTEGER NOT NULL,
    preview_pages INTEGER NOT NULL,
    result_version INTEGER,
    run_id TEXT,
    created_at INTEGER NOT NULL,
    decided_at INTEGER,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS workpiece_proposals_of ON workpiece_proposals (workpiece_id);
";

#[derive(Debug, Clone, PartialEq)]
pub struct WorkpieceRow {
    pub id: String,
    pub sandbox_id: String,
    pub kind: WorkpieceKind,
    pub path: String,
    pub title: String,
    pub format: String,
    pub run_id: Option<String>,
    pub created_at: i64,
    pub missing_since: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VersionRow {
    pub workpiece_id: String,
    pub version: u32,
    pub artifact_id: String,
    pub sha256: String,
    pub size: u64,
    pub author: VersionAuthor,
    pub proposal_id: Option<String>,
    pub created_at: i64,
    pub preview_pages: u32,
    /// Its file is in place in the sandbox (false between an accept and its install).
    pub installed: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProposalRow {
    pub id: String,
    pub workpiece_id: String,
    pub base_version: u32,
    pub summary: String,
    pub operations: String,
    pub status: ProposalStatus,
    pub preview_artifact: String,
    pub preview_sha256: String,
    pub preview_size: u64,
    pub preview_pages: u32,
    pub result_version: Option<u32>,
    pub run_id: Option<String>,
    pub created_at: i64,
    pub decided_at: Option<i64>,
    pub reason: Option<String>,
}

fn workpiece(r: &Row) -> rusqlite::Result<WorkpieceRow> {
    let kind: String = r.get("kind")?;
    Ok(WorkpieceRow {
        id: r.get("id")?,
        sandbox_id: r.get("sandbox_id")?,
        kind: serde_json::from_value(kind.into()).unwrap_or(WorkpieceKind::Document),
        path: r.get("path")?,
        title: r.get("title")?,
        format: r.get("format")?,
        run_id: r.get("run_id")?,
        created_at: r.get("created_at")?,
        missing_since: r.get("missing_since")?,
    })
}

fn version(r: &Row) -> rusqlite::Result<VersionRow> {
    let author: String = r.get("author")?;
    Ok(VersionRow {
        workpiece_id: r.get("workpiece_id")?,
        version: r.get("version")?,
        artifact_id: r.get("artifact_id")?,
        sha256: r.get("sha256")?,
        size: r.get::<_, i64>("size")? as u64,
        author: VersionAuthor::parse(&author).unwrap_or(VersionAuthor::Sandbox),
        proposal_id: r.get("proposal_id")?,
        created_at: r.get("created_at")?,
        preview_pages: r.get("preview_pages")?,
        installed: r.get::<_, i64>("installed")? != 0,
    })
}

fn proposal(r: &Row) -> rusqlite::Result<ProposalRow> {
    let status: String = r.get("status")?;
    Ok(ProposalRow {
        id: r.get("id")?,
        workpiece_id: r.get("workpiece_id")?,
        base_version: r.get("base_version")?,
        summary: r.get("summary")?,
        operations: r.get("operations")?,
        status: ProposalStatus::parse(&status).unwrap_or(ProposalStatus::Pending),
        preview_artifact: r.get("preview_artifact")?,
        preview_sha256: r.get("preview_sha256")?,
        preview_size: r.get::<_, i64>("preview_size")? as u64,
        preview_pages: r.get("preview_pages")?,
        result_version: r.get("result_version")?,
        run_id: r.get("run_id")?,
        created_at: r.get("created_at")?,
        decided_at: r.get("decided_at")?,
        reason: r.get("reason")?,
    })
}

fn insert_version_tx(c: &rusqlite::Connection, v: &VersionRow) -> rusqlite::Result<()> {
    c.execute(
        "INSERT INTO workpiece_versions (workpiece_id, version, artifact_id, sha256, size, author,
           proposal_id, created_at, preview_pages, installed)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            v.workpiece_id,
            v.version,
            v.artifact_id,
            v.sha256,
            v.size as i64,
            v.author.as_str(),
            v.proposal_id,
            v.created_at,
            v.preview_pages,
            v.installed as i64,
        ],
    )?;
    Ok(())
}

impl Store {
    /// Records a workpiece with its first version. False when the sandbox has one at that path.
    pub fn insert_workpiece(&self, w: &WorkpieceRow, first: &VersionRow) -> Result<bool> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let n = tx.execute(
                "INSERT INTO workpieces (id, sandbox_id, kind, path, title, format, run_id,
                   created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT (sandbox_id, path) DO NOTHING",
                params![
                    w.id,
                    w.sandbox_id,
                    w.kind.as_str(),
                    w.path,
                    w.title,
                    w.format,
                    w.run_id,
                    w.created_at
                ],
            )?;
            if n == 0 {
                return Ok(false);
            }
            insert_version_tx(&tx, first)?;
            tx.commit()?;
            Ok(true)
        })
    }

    pub fn workpiece(&self, id: &str) -> Result<Option<WorkpieceRow>> {
        self.with(|c| {
            c.query_row("SELECT * FROM workpieces WHERE id = ?1", [id], workpiece)
                .optional()
        })
    }

    /// A sandbox's workpieces (every sandbox's when None), oldest first.
    pub fn workpieces(&self, sandbox_id: Option<&str>) -> Result<Vec<WorkpieceRow>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT * FROM workpieces WHERE ?1 IS NULL OR sandbox_id = ?1
                 ORDER BY created_at, id",
            )?;
            st.query_map([sandbox_id], workpiece)?.collect()
        })
    }

    pub fn set_workpiece_missing(&self, id: &str, since: Option<i64>) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE workpieces SET missing_since = ?2 WHERE id = ?1",
                params![id, since],
            )
            .map(drop)
        })
    }

    /// A workpiece's versions, oldest first.
    pub fn workpiece_versions(&self, workpiece_id: &str) -> Result<Vec<VersionRow>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT * FROM workpiece_versions WHERE workpiece_id = ?1 ORDER BY version",
            )?;
            st.query_map([workpiece_id], version)?.collect()
        })
    }

    /// Adds a version when `v.version` is the next one; false when another came first.
    pub fn insert_version(&self, v: &VersionRow) -> Result<bool> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let latest: u32 = tx.query_row(
                "SELECT COALESCE(MAX(version), 0) FROM workpiece_versions WHERE workpiece_id = ?1",
                [&v.workpiece_id],
                |r| r.get(0),
            )?;
            if latest + 1 != v.version {
                return Ok(false);
            }
            insert_version_tx(&tx, v)?;
            tx.commit()?;
            Ok(true)
        })
    }

    pub fn set_version_previews(&self, workpiece_id: &str, version: u32, pages: u32) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE workpiece_versions SET preview_pages = ?3
                 WHERE workpiece_id = ?1 AND version = ?2",
                params![workpiece_id, version, pages],
            )
            .map(drop)
        })
    }

    pub fn set_version_installed(&self, workpiece_id: &str, version: u32) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE workpiece_versions SET installed = 1
                 WHERE workpiece_id = ?1 AND version = ?2",
                params![workpiece_id, version],
            )
            .map(drop)
        })
    }

    pub fn insert_proposal(&self, p: &ProposalRow) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT INTO workpiece_proposals (id, workpiece_id, base_version, summary,
                   operations, status, preview_artifact, preview_sha256, preview_size,
                   preview_pages, run_id, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                params![
                    p.id,
                    p.workpiece_id,
                    p.base_version,
                    p.summary,
                    p.operations,
                    p.status.as_str(),
                    p.preview_artifact,
                    p.preview_sha256,
                    p.preview_size as i64,
                    p.preview_pages,
                    p.run_id,
                    p.created_at,
                ],
            )
            .map(drop)
        })
    }

    pub fn proposal(&self, id: &str) -> Result<Option<ProposalRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT * FROM workpiece_proposals WHERE id = ?1",
                [id],
                proposal,
            )
            .optional()
        })
    }

    /// A workpiece's proposals, newest first.
    pub fn proposals(&self, workpiece_id: &str) -> Result<Vec<ProposalRow>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT * FROM workpiece_proposals WHERE workpiece_id = ?1
                 ORDER BY created_at DESC, id DESC",
            )?;
            st.query_map([workpiece_id], proposal)?.collect()
        })
    }

    /// Accepts a pending proposal whose base is still the latest version: its preview becomes
    /// version `base + 1` (not yet installed) and the proposal `accepted`, in one transaction.
    /// False when it was not pending or its base is not the latest any more.
    pub fn accept_proposal(&self, p: &ProposalRow, at: i64) -> Result<bool> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let latest: u32 = tx.query_row(
                "SELECT COALESCE(MAX(version), 0) FROM workpiece_versions WHERE workpiece_id = ?1",
                [&p.workpiece_id],
                |r| r.get(0),
            )?;
            let status: Option<String> = tx
                .query_row(
                    "SELECT status FROM workpiece_proposals WHERE id = ?1",
                    [&p.id],
                    |r| r.get(0),
                )
                .optional()?;
            if status.as_deref() != Some(ProposalStatus::Pending.as_str())
                || latest != p.base_version
            {
                return Ok(false);
            }
            let new = latest + 1;
            insert_version_tx(
                &tx,
                &VersionRow {
                    workpiece_id: p.workpiece_id.clone(),
                    version: new,
                    artifact_id: p.preview_artifact.clone(),
                    sha256: p.preview_sha256.clone(),
                    size: p.preview_size,
                    author: VersionAuthor::Proposal,
                    proposal_id: Some(p.id.clone()),
                    created_at: at,
                    preview_pages: p.preview_pages,
                    installed: false,
                },
            )?;
            tx.execute(
                "UPDATE workpiece_proposals SET status = 'accepted', result_version = ?2,
                   decided_at = ?3 WHERE id = ?1",
                params![p.id, new, at],
            )?;
            tx.commit()?;
            Ok(true)
        })
    }

    /// Rejects a pending proposal; false when it was not pending.
    pub fn reject_proposal(&self, id: &str, at: i64, reason: Option<&str>) -> Result<bool> {
        self.with(|c| {
            let n = c.execute(
                "UPDATE workpiece_proposals SET status = 'rejected', decided_at = ?2, reason = ?3
                 WHERE id = ?1 AND status = 'pending'",
                params![id, at, reason],
            )?;
            Ok(n == 1)
        })
    }

    /// Every artifact a workpiece version or proposal holds (retention leaves them).
    pub fn workpiece_artifact_ids(&self) -> Result<std::collections::HashSet<String>> {
        self.with(|c| {
            let mut ids = std::collections::HashSet::new();
            let mut st = c.prepare(
                "SELECT artifact_id FROM workpiece_versions
                 UNION SELECT preview_artifact FROM workpiece_proposals",
            )?;
            for id in st.query_map([], |r| r.get::<_, String>(0))? {
                ids.insert(id?);
            }
            Ok(ids)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::Sealer;

    fn v(wid: &str, n: u32) -> VersionRow {
        VersionRow {
            workpiece_id: wid.into(),
            version: n,
            artifact_id: format!("art_{n}"),
            sha256: format!("{n:064}"),
            size: 10,
            author: VersionAuthor::Creator,
            proposal_id: None,
            created_at: n as i64,
            preview_pages: 0,
            installed: true,
        }
    }

    fn p(id: &str, base: u32) -> ProposalRow {
        ProposalRow {
            id: id.into(),
            workpiece_id: "wp_1".into(),
            base_version: base,
            summary: "s".into(),
            operations: "[]".into(),
            status: ProposalStatus::Pending,
            preview_artifact: format!("art_{id}"),
            preview_sha256: "f".repeat(64),
            preview_size: 11,
            preview_pages: 2,
            result_version: None,
            run_id: None,
            created_at: 5,
            decided_at: None,
            reason: None,
        }
    }

    #[test]
    fn an_accept_is_one_transaction_and_only_on_the_latest_version() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("b.db"), Sealer::new([1; 32])).unwrap();
        let w = WorkpieceRow {
            id: "wp_1".into(),
            sandbox_id: "sb_1".into(),
            kind: WorkpieceKind::Sheet,
            path: "/home/user/a.xlsx".into(),
            title: "A".into(),
            format: ".xlsx".into(),
            run_id: None,
            created_at: 1,
            missing_since: None,
        };
        assert!(s.insert_workpiece(&w, &v("wp_1", 1)).unwrap());
        // One workpiece per path.
        let again = WorkpieceRow {
            id: "wp_2".into(),
            ..w.clone()
        };
        assert!(!s.insert_workpiece(&again, &v("wp_2", 1)).unwrap());
        assert!(s.workpiece("wp_2").unwrap().is_none());
        s.insert_proposal(&p("wpp_a", 1)).unwrap();
        s.insert_proposal(&p("wpp_b", 1)).unwrap();
        assert!(s.accept_proposal(&p("wpp_a", 1), 9).unwrap());
        let vs = s.workpiece_versions("wp_1").unwrap();
        assert_eq!(vs.len(), 2);
        assert_eq!(vs[1].artifact_id, "art_wpp_a");
        assert_eq!(vs[1].author, VersionAuthor::Proposal);
        assert!(!vs[1].installed);
        let a = s.proposal("wpp_a").unwrap().unwrap();
        assert_eq!(a.status, ProposalStatus::Accepted);
        assert_eq!(a.result_version, Some(2));
        // The other proposal's base is now stale; accepting twice does nothing.
        assert!(!s.accept_proposal(&p("wpp_b", 1), 10).unwrap());
        assert!(!s.accept_proposal(&p("wpp_a", 1), 10).unwrap());
        assert_eq!(s.workpiece_versions("wp_1").unwrap().len(), 2);
        assert!(s.reject_proposal("wpp_b", 11, Some("no")).unwrap());
        assert!(!s.reject_proposal("wpp_a", 11, None).unwrap());
        // A sandbox version must be the next one.
        assert!(!s.insert_version(&v("wp_1", 2)).unwrap());
        assert!(s.insert_version(&v("wp_1", 3)).unwrap());
        s.set_version_installed("wp_1", 2).unwrap();
        assert!(s.workpiece_versions("wp_1").unwrap()[1].installed);
        let ids = s.workpiece_artifact_ids().unwrap();
        assert!(ids.contains("art_1") && ids.contains("art_wpp_b"));
    }
}
