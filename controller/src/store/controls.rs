//! The `controls` table: per sandbox, whether its agent may ask for a person and the control
//! lease a person holds (who, the SHA-256 of their control token, when it was taken and when
//! it ends). Only hashes of tokens are kept.

use berth_protocol::control::Holder;
use rusqlite::{OptionalExtension, Row, params};
use serde::{Deserialize, Serialize};

use super::{Result, Store};

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS controls (
    sandbox_id TEXT PRIMARY KEY,
    requests_enabled INTEGER NOT NULL DEFAULT 0,
    holder TEXT,
    holder_sha256 TEXT,
    taken_at INTEGER,
    expires_at INTEGER
);
";

/// A lease a person holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRow {
    pub holder: Holder,
    pub holder_sha256: String,
    pub taken_at: i64,
    pub expires_at: i64,
}

/// A sandbox's run as far as logins go: the sites it enables and how often it used each.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunLogins {
    pub run: String,
    pub enabled: Vec<String>,
    #[serde(default)]
    pub uses: std::collections::BTreeMap<String, u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControlRow {
    pub sandbox_id: String,
    pub requests_enabled: bool,
    pub held: Option<HeldRow>,
}

fn control(r: &Row) -> rusqlite::Result<ControlRow> {
    let holder: Option<String> = r.get("holder")?;
    let held = match (
        holder.as_deref().and_then(Holder::parse),
        r.get::<_, Option<String>>("holder_sha256")?,
    ) {
        (Some(holder), Some(holder_sha256)) => Some(HeldRow {
            holder,
            holder_sha256,
            taken_at: r.get::<_, Option<i64>>("taken_at")?.unwrap_or_default(),
            expires_at: r.get::<_, Option<i64>>("expires_at")?.unwrap_or_default(),
        }),
        _ => None,
    };
    Ok(ControlRow {
        sandbox_id: r.get("sandbox_id")?,
        requests_enabled: r.get::<_, i64>("requests_enabled")? != 0,
        held,
    })
}

impl Store {
    pub fn control(&self, sandbox_id: &str) -> Result<ControlRow> {
        self.with(|c| {
            c.query_row(
                "SELECT * FROM controls WHERE sandbox_id = ?1",
                [sandbox_id],
                control,
            )
            .optional()
        })
        .map(|r| {
            r.unwrap_or(ControlRow {
                sandbox_id: sandbox_id.to_string(),
                ..Default::default()
            })
        })
    }

    pub fn set_requests_enabled(&self, sandbox_id: &str, enabled: bool) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT INTO controls (sandbox_id, requests_enabled) VALUES (?1, ?2)
                 ON CONFLICT (sandbox_id) DO UPDATE SET requests_enabled = ?2",
                params![sandbox_id, enabled as i64],
            )
        })?;
        Ok(())
    }

    /// The sandbox's run as far as logins go (an empty one when none was recorded).
    pub fn run_logins(&self, sandbox_id: &str) -> Result<RunLogins> {
        let text: Option<String> = self
            .with(|c| {
                c.query_row(
                    "SELECT logins FROM controls WHERE sandbox_id = ?1",
                    [sandbox_id],
                    |r| r.get(0),
                )
                .optional()
            })?
            .flatten();
        Ok(text
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default())
    }

    pub fn set_run_logins(&self, sandbox_id: &str, r: &RunLogins) -> Result<()> {
        let text = serde_json::to_string(r).unwrap_or_default();
        self.with(|c| {
            c.execute(
                "INSERT INTO controls (sandbox_id, logins) VALUES (?1, ?2)
                 ON CONFLICT (sandbox_id) DO UPDATE SET logins = ?2",
                params![sandbox_id, text],
            )
        })?;
        Ok(())
    }

    /// Counts a use of login site `site` in the sandbox's run when it has used it fewer than
    /// `max` times: the run and this use's number, or `None` at the limit.
    pub fn count_login(
        &self,
        sandbox_id: &str,
        site: &str,
        max: u32,
    ) -> Result<Option<(String, u32)>> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let text: Option<String> = tx
                .query_row(
                    "SELECT logins FROM controls WHERE sandbox_id = ?1",
                    [sandbox_id],
                    |r| r.get(0),
                )
                .optional()?
                .flatten();
            let mut r: RunLogins = text
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            let n = r.uses.get(site).copied().unwrap_or(0);
            if n >= max {
                return Ok(None);
            }
            r.uses.insert(site.to_string(), n + 1);
            tx.execute(
                "UPDATE controls SET logins = ?2 WHERE sandbox_id = ?1",
                params![sandbox_id, serde_json::to_string(&r).unwrap_or_default()],
            )?;
            tx.commit()?;
            Ok(Some((r.run, n + 1)))
        })
    }

    /// Takes the lease when nobody holds it (or it ended before `now`), or renews it for the
    /// same holder: the row as it now stands and whether this was a new take. `None` when
    /// someone else holds it.
    pub fn take_control(
        &self,
        sandbox_id: &str,
        held: &HeldRow,
        now: i64,
    ) -> Result<Option<(ControlRow, bool)>> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let cur = tx
                .query_row(
                    "SELECT * FROM controls WHERE sandbox_id = ?1",
                    [sandbox_id],
                    control,
                )
                .optional()?
                .and_then(|r| r.held)
                .filter(|h| h.expires_at > now);
            let fresh = match &cur {
                Some(h) if h.holder_sha256 != held.holder_sha256 => return Ok(None),
                Some(_) => false,
                None => true,
            };
            let taken_at = cur.map(|h| h.taken_at).unwrap_or(held.taken_at);
            tx.execute(
                "INSERT INTO controls (sandbox_id, holder, holder_sha256, taken_at, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (sandbox_id) DO UPDATE SET holder = ?2, holder_sha256 = ?3,
                   taken_at = ?4, expires_at = ?5",
                params![
                    sandbox_id,
                    held.holder.as_str(),
                    held.holder_sha256,
                    taken_at,
                    held.expires_at
                ],
            )?;
            let row = tx.query_row(
                "SELECT * FROM controls WHERE sandbox_id = ?1",
                [sandbox_id],
                control,
            )?;
            tx.commit()?;
            Ok(Some((row, fresh)))
        })
    }

    /// Ends the lease; the one that was held, if any.
    pub fn release_control(&self, sandbox_id: &str) -> Result<Option<HeldRow>> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let held = tx
                .query_row(
                    "SELECT * FROM controls WHERE sandbox_id = ?1",
                    [sandbox_id],
                    control,
                )
                .optional()?
                .and_then(|r| r.held);
            tx.execute(
                "UPDATE controls SET holder = NULL, holder_sha256 = NULL, taken_at = NULL,
                   expires_at = NULL WHERE sandbox_id = ?1",
                [sandbox_id],
            )?;
            tx.commit()?;
            Ok(held)
        })
    }

    /// Every lease held, with its sandbox.
    pub fn held_controls(&self) -> Result<Vec<ControlRow>> {
        self.with(|c| {
            let mut st = c.prepare("SELECT * FROM controls WHERE holder IS NOT NULL")?;
            let rows = st.query_map([], control)?;
            rows.collect()
        })
    }
}
