//! The `artifacts` table: what the controller keeps of a sandbox past its end (recordings,
//! published files and directories, long run output, episode bundles). The bytes live in the
//! blob store (`crate::artifact::blob`), keyed by the artifact id; a row is written only once
//! its blob is in place, so a row always has its bytes.

use std::str::FromStr;

use rusqlite::{OptionalExtension, Row, params};
use serde_json::Value;

use super::{Result, Store};
use crate::util::rfc3339;

/// What an artifact is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArtifactKind {
    /// A desktop recording (MP4), published when it stops.
    Recording,
    /// A file published from the sandbox.
    File,
    /// A directory published from the sandbox, as a zip.
    Directory,
    /// A run's whole output, when it passed the inline bound.
    Output,
    /// An episode bundle (zip: the recording, the actions, their screenshots, the timeline).
    Episode,
    /// A workpiece's version, or a proposal's result: kept while the workpiece is.
    Workpiece,
}

impl ArtifactKind {
    pub const ALL: &[ArtifactKind] = &[
        ArtifactKind::Recording,
        ArtifactKind::File,
        ArtifactKind::Directory,
        ArtifactKind::Output,
        ArtifactKind::Episode,
        ArtifactKind::Workpiece,
    ];

    /// Whether a sandbox has at most one artifact of this kind per source (a recording, a
    /// run's output, an episode do not change once made; a file published again may have).
    pub fn one_per_source(self) -> bool {
        matches!(
            self,
            ArtifactKind::Recording | ArtifactKind::Output | ArtifactKind::Episode
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactKind::Recording => "recording",
            ArtifactKind::File => "file",
            ArtifactKind::Directory => "directory",
            ArtifactKind::Output => "output",
            ArtifactKind::Episode => "episode",
            ArtifactKind::Workpiece => "workpiece",
        }
    }
}

impl FromStr for ArtifactKind {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        ArtifactKind::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown artifact kind {s:?}"))
    }
}

impl std::fmt::Display for ArtifactKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactRow {
    pub id: String,
    pub sandbox_id: String,
    pub run_id: Option<String>,
    pub name: String,
    pub content_type: String,
    pub size: u64,
    /// Hex SHA-256 of the bytes.
    pub sha256: String,
    pub kind: ArtifactKind,
    /// Where it came from: the agent recording id, the sandbox path, the run id.
    pub source: Option<String>,
    pub created_at: i64,
}

impl ArtifactRow {
    fn from_row(r: &Row) -> rusqlite::Result<ArtifactRow> {
        let kind: String = r.get("kind")?;
        Ok(ArtifactRow {
            id: r.get("id")?,
            sandbox_id: r.get("sandbox_id")?,
            run_id: r.get("run_id")?,
            name: r.get("name")?,
            content_type: r.get("content_type")?,
            size: r.get::<_, i64>("size")? as u64,
            sha256: r.get("sha256")?,
            kind: kind.parse().unwrap_or(ArtifactKind::File),
            source: r.get("source")?,
            created_at: r.get("created_at")?,
        })
    }

    pub fn to_wire(&self) -> berth_protocol::controller::Artifact {
        berth_protocol::controller::Artifact {
            id: self.id.clone(),
            name: self.name.clone(),
            content_type: self.content_type.clone(),
            size: self.size,
            sandbox: self.sandbox_id.clone(),
            run: self.run_id.clone(),
            created_at: rfc3339(self.created_at),
            kind: self.kind.as_str().to_string(),
            sha256: self.sha256.clone(),
            source: self.source.clone(),
        }
    }
}

impl Store {
    /// Records an artifact. For a kind with one artifact per source, a second insert of the
    /// same (sandbox, kind, source) changes nothing and answers false.
    pub fn insert_artifact(&self, a: &ArtifactRow) -> Result<bool> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            if a.source.is_some() && a.kind.one_per_source() {
                let taken = tx
                    .prepare(
                        "SELECT 1 FROM artifacts WHERE sandbox_id = ?1 AND kind = ?2
                           AND source = ?3",
                    )?
                    .exists(params![a.sandbox_id, a.kind.as_str(), a.source])?;
                if taken {
                    return Ok(false);
                }
            }
            tx.execute(
                "INSERT INTO artifacts (id, sandbox_id, run_id, name, content_type, size,
                   sha256, kind, source, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    a.id,
                    a.sandbox_id,
                    a.run_id,
                    a.name,
                    a.content_type,
                    a.size as i64,
                    a.sha256,
                    a.kind.as_str(),
                    a.source,
                    a.created_at
                ],
            )?;
            tx.commit()?;
            Ok(true)
        })
    }

    pub fn artifact(&self, id: &str) -> Result<Option<ArtifactRow>> {
        self.with(|c| {
            c.query_row("SELECT * FROM artifacts WHERE id = ?1", [id], |r| {
                ArtifactRow::from_row(r)
            })
            .optional()
        })
    }

    /// The artifact of a kind from a source in a sandbox, if one was published.
    pub fn artifact_from(
        &self,
        sandbox_id: &str,
        kind: ArtifactKind,
        source: &str,
    ) -> Result<Option<ArtifactRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT * FROM artifacts WHERE sandbox_id = ?1 AND kind = ?2 AND source = ?3",
                params![sandbox_id, kind.as_str(), source],
                ArtifactRow::from_row,
            )
            .optional()
        })
    }

    /// Artifacts, oldest first, filtered by sandbox and run when given.
    pub fn artifacts(&self, sandbox: Option<&str>, run: Option<&str>) -> Result<Vec<ArtifactRow>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT * FROM artifacts WHERE (?1 IS NULL OR sandbox_id = ?1)
                   AND (?2 IS NULL OR run_id = ?2) ORDER BY created_at, id",
            )?;
            let rows = st.query_map(params![sandbox, run], ArtifactRow::from_row)?;
            rows.collect()
        })
    }

    /// Every artifact id (the blob store's orphans are the blobs not among them).
    pub fn artifact_ids(&self) -> Result<std::collections::HashSet<String>> {
        self.with(|c| {
            let mut st = c.prepare("SELECT id FROM artifacts")?;
            let rows = st.query_map([], |r| r.get(0))?;
            rows.collect()
        })
    }

    /// Removes the row and, in the same transaction, appends `kind` with `data` to its
    /// sandbox's timeline, so an artifact gone from the list always has its event; true when
    /// the row was there (nothing is appended when it was not).
    pub fn delete_artifact(&self, id: &str, at: i64, kind: &str, data: &Value) -> Result<bool> {
        let data = serde_json::to_string(data)?;
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let sandbox: Option<String> = tx
                .query_row(
                    "DELETE FROM artifacts WHERE id = ?1 RETURNING sandbox_id",
                    [id],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(sandbox) = sandbox else {
                return Ok(false);
            };
            super::events::insert_event(&tx, &sandbox, at, kind, &data)?;
            tx.commit()?;
            Ok(true)
        })
    }
}
