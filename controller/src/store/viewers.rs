//! The `viewer_tokens` table: one-time viewer URLs and the sessions they open.

use rusqlite::params;

use super::{Result, Store};
use crate::util::now_ms;

impl Store {
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
