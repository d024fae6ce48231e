//! The `sandboxes` table: one row per sandbox, its status, endpoints, pool membership and claim.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, Row, params};

use super::{Result, Store, StoreError};
use crate::lifecycle::{SandboxStatus, sql_list};

/// A sandbox row.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRow {
    pub id: String,
    pub profile: String,
    pub image_ref: String,
    pub provider: String,
    pub status: SandboxStatus,
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
    /// The resource limits it was created with (none on rows from before limits).
    pub limits: Option<berth_protocol::controller::Limits>,
    /// Its egress policy and the proxy's counts (none on rows from before egress).
    pub egress: Option<berth_protocol::controller::EgressReport>,
}

impl SandboxRow {
    pub fn live(&self) -> bool {
        self.status.live()
    }

    pub(super) fn from_row(r: &Row) -> rusqlite::Result<SandboxRow> {
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
            limits: r
                .get::<_, Option<String>>("limits")?
                .and_then(|l| serde_json::from_str(&l).ok()),
            egress: r
                .get::<_, Option<String>>("egress")?
                .and_then(|l| serde_json::from_str(&l).ok()),
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

impl Store {
    /// A sandbox row with its agent token opened.
    pub(super) fn open_sandbox(&self, r: &Row) -> rusqlite::Result<SandboxRow> {
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

    pub fn insert_sandbox(&self, s: &SandboxRow) -> Result<()> {
        let labels = serde_json::to_string(&s.labels)?;
        let limits = s.limits.as_ref().map(serde_json::to_string).transpose()?;
        let egress = s.egress.as_ref().map(serde_json::to_string).transpose()?;
        self.with(|c| {
            c.execute(
                "INSERT INTO sandboxes (id, profile, image_ref, provider, status, labels, pool,
                   claim, agent_token, created_at, ready_deadline, expires_at, screen, limits,
                   egress)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
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
                    s.screen,
                    limits,
                    egress
                ],
            )
            .map(|_| ())
        })
    }

    /// Counts a connection to `host` (or a refusal) in the sandbox's egress report.
    pub fn count_egress(&self, id: &str, host: Option<&str>, denied: bool) -> Result<()> {
        self.edit_egress(id, |report| match (host, denied) {
            (_, true) => report.denied += 1,
            (Some(h), false) => *report.hosts.entry(h.to_string()).or_default() += 1,
            (None, false) => {}
        })
    }

    /// Keeps the credentials given at a sandbox's create (`json`), sealed and bound to its row.
    pub fn set_credentials(&self, id: &str, json: &str) -> Result<()> {
        let sealed = self
            .sealer
            .seal(json.as_bytes(), &format!("credentials:{id}"));
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET credentials = ?2 WHERE id = ?1",
                params![id, sealed],
            )
            .map(|_| ())
        })
    }

    /// The credentials given at a sandbox's create (the JSON kept), if any.
    pub fn credentials(&self, id: &str) -> Result<Option<String>> {
        let sealed: Option<String> = self.with(|c| {
            c.query_row(
                "SELECT credentials FROM sandboxes WHERE id = ?1",
                [id],
                |r| r.get(0),
            )
            .optional()
            .map(Option::flatten)
        })?;
        let Some(sealed) = sealed else {
            return Ok(None);
        };
        let plain = self
            .sealer
            .open_string(&sealed, &format!("credentials:{id}"))
            .map_err(|e| StoreError::Seal(format!("sandbox {id}'s credentials: {e}")))?;
        Ok(Some(plain))
    }

    /// Changes the sandbox's egress report in one transaction (nothing on a row without one).
    pub fn edit_egress(
        &self,
        id: &str,
        edit: impl FnOnce(&mut berth_protocol::controller::EgressReport),
    ) -> Result<()> {
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let text: Option<String> = tx
                .query_row("SELECT egress FROM sandboxes WHERE id = ?1", [id], |r| {
                    r.get(0)
                })
                .optional()?
                .flatten();
            let Some(mut report) = text.and_then(|t| {
                serde_json::from_str::<berth_protocol::controller::EgressReport>(&t).ok()
            }) else {
                return Ok(());
            };
            edit(&mut report);
            let text = serde_json::to_string(&report).unwrap_or_default();
            tx.execute(
                "UPDATE sandboxes SET egress = ?2 WHERE id = ?1",
                params![id, text],
            )?;
            tx.commit()
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
    pub fn sandboxes(&self, statuses: &[SandboxStatus]) -> Result<Vec<SandboxRow>> {
        self.with(|c| {
            let mut st = c.prepare("SELECT * FROM sandboxes ORDER BY created_at")?;
            let rows = st.query_map([], |r| self.open_sandbox(r))?;
            let mut out = Vec::new();
            for r in rows {
                let r = r?;
                if statuses.is_empty() || statuses.contains(&r.status) {
                    out.push(r);
                }
            }
            Ok(out)
        })
    }

    /// Moves a sandbox to `to` when the transition table allows it from the status it has
    /// ([`SandboxStatus::can_move`]: a sandbox being deleted never comes back `running`).
    /// True when the row changed.
    pub fn set_status(&self, id: &str, to: SandboxStatus, u: SandboxUpdate) -> Result<bool> {
        self.move_status(id, None, to, u)
    }

    /// Like [`Store::set_status`], but only from `from`: the row must still be as its caller
    /// read it (a decision made on a status acts on that status alone).
    pub fn set_status_from(
        &self,
        id: &str,
        from: SandboxStatus,
        to: SandboxStatus,
        u: SandboxUpdate,
    ) -> Result<bool> {
        self.move_status(id, Some(from), to, u)
    }

    /// The one status write: reads the current status, checks the move and writes it in one
    /// transaction, the update conditional on the status read (a compare-and-set).
    fn move_status(
        &self,
        id: &str,
        from: Option<SandboxStatus>,
        to: SandboxStatus,
        u: SandboxUpdate,
    ) -> Result<bool> {
        let ports = u.ports.map(serde_json::to_string).transpose()?;
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let current: Option<SandboxStatus> = tx
                .query_row("SELECT status FROM sandboxes WHERE id = ?1", [id], |r| {
                    r.get(0)
                })
                .optional()?;
            let Some(current) = current else {
                return Ok(false);
            };
            if from.is_some_and(|f| f != current) || !current.can_move(to) {
                return Ok(false);
            }
            let n = tx.execute(
                "UPDATE sandboxes SET status = ?2,
                   agent_url = COALESCE(?3, agent_url), compat_url = COALESCE(?4, compat_url),
                   cdp_url = COALESCE(?5, cdp_url), ready_at = COALESCE(?6, ready_at),
                   ended_at = COALESCE(?7, ended_at), error = COALESCE(?8, error),
                   ports = COALESCE(?10, ports)
                 WHERE id = ?1 AND status = ?9",
                params![
                    id,
                    to,
                    u.agent_url,
                    u.compat_url,
                    u.cdp_url,
                    u.ready_at,
                    u.ended_at,
                    u.error,
                    current,
                    ports
                ],
            )?;
            tx.commit()?;
            Ok(n == 1)
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
                 WHERE id = (SELECT id FROM sandboxes WHERE pool = ?1 AND status = ?4
                             ORDER BY ready_at LIMIT 1)
                   AND pool = ?1 AND status = ?4
                 RETURNING *",
                params![pool, labels, expires_at, SandboxStatus::Running],
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
            let live: Vec<SandboxStatus> = SandboxStatus::ALL
                .iter()
                .copied()
                .filter(|s| s.live())
                .collect();
            let mut st = c.prepare(&format!(
                "SELECT * FROM sandboxes WHERE pool = ?1 AND status IN {} ORDER BY created_at",
                sql_list(&live, SandboxStatus::as_str)
            ))?;
            let rows = st.query_map([pool], |r| self.open_sandbox(r))?;
            rows.collect()
        })
    }

    /// Takes an idle member out of `pool` to be destroyed (`stopping`): the same
    /// compare-and-swap as a claim, so a member goes to one caller or away, never both. True
    /// when it was still an idle, running member.
    pub fn retire_member(&self, pool: &str, id: &str) -> Result<bool> {
        let (from, to) = (SandboxStatus::Running, SandboxStatus::Stopping);
        debug_assert!(from.can_move(to));
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET status = ?4
                 WHERE id = ?2 AND pool = ?1 AND status = ?3",
                params![pool, id, from, to],
            )
            .map(|n| n == 1)
        })
    }

    /// Members of `pool` that are starting or ready (what a refill counts).
    pub fn pool_members(&self, pool: &str) -> Result<(usize, usize)> {
        self.with(|c| {
            let ready: i64 = c.query_row(
                "SELECT COUNT(*) FROM sandboxes WHERE pool = ?1 AND status = ?2",
                params![pool, SandboxStatus::Running],
                |r| r.get(0),
            )?;
            let starting: i64 = c.query_row(
                "SELECT COUNT(*) FROM sandboxes WHERE pool = ?1 AND status IN (?2, ?3)",
                params![pool, SandboxStatus::Pending, SandboxStatus::Starting],
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
}
