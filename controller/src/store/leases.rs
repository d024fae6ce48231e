//! The `leases` table: one active lease per thread, each naming the sandbox it holds.

use rusqlite::{OptionalExtension, Row, params};

use super::{Result, Store};
use crate::lifecycle::LeaseStatus;
use crate::util::now_ms;

#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRow {
    pub id: String,
    pub thread_id: String,
    pub sandbox_id: String,
    pub profile: String,
    pub status: LeaseStatus,
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

impl Store {
    pub fn active_lease_for_thread(&self, thread_id: &str) -> Result<Option<LeaseRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT * FROM leases WHERE thread_id = ?1 AND status = ?2",
                params![thread_id, LeaseStatus::Active],
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
                "SELECT * FROM leases WHERE sandbox_id = ?1 AND status = ?2",
                params![sandbox_id, LeaseStatus::Active],
                LeaseRow::from_row,
            )
            .optional()
        })
    }

    pub fn insert_lease(&self, l: &LeaseRow) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT INTO leases (id, thread_id, sandbox_id, profile, status, created_at,
                   expires_at) VALUES (?1, ?2, ?3, ?4, ?7, ?5, ?6)",
                params![
                    l.id,
                    l.thread_id,
                    l.sandbox_id,
                    l.profile,
                    l.created_at,
                    l.expires_at,
                    LeaseStatus::Active
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
                 WHERE id = ?1 AND status = ?3 RETURNING *",
                params![id, expires_at, LeaseStatus::Active],
                LeaseRow::from_row,
            )
            .optional()
        })
    }

    /// Ends an active lease (`to`: released or expired); true for the caller that ended it.
    pub fn end_lease(&self, id: &str, to: LeaseStatus) -> Result<bool> {
        if !LeaseStatus::Active.can_move(to) {
            return Ok(false);
        }
        self.with(|c| {
            c.execute(
                "UPDATE leases SET status = ?2, ended_at = ?3 WHERE id = ?1 AND status = ?4",
                params![id, to, now_ms(), LeaseStatus::Active],
            )
            .map(|n| n == 1)
        })
    }

    pub fn expired_leases(&self, now: i64) -> Result<Vec<LeaseRow>> {
        self.with(|c| {
            let mut st =
                c.prepare("SELECT * FROM leases WHERE status = ?2 AND expires_at <= ?1")?;
            let rows = st.query_map(params![now, LeaseStatus::Active], LeaseRow::from_row)?;
            rows.collect()
        })
    }
}
