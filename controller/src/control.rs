//! A person taking the controls of a sandbox's desktop: the control lease (one holder,
//! expiring, renewable) kept in the store and pushed to the sandbox's agent, which refuses
//! the agent's input and observations meanwhile; hand-back, expiry and a restart's recovery;
//! and declining the agent's request for a person.
//!
//! - A holder is the session view (its cookie: the control token is derived from it, so the
//!   controller sends the agent a token without keeping one) or the API key (a random token
//!   answered once; only its hash is kept).
//! - The agent keeps its own deadline for what it was told, so a controller killed while a
//!   person holds the controls never locks the agent out past the lease; after a restart the
//!   controller pushes the leases still valid again and ends the others.

use std::sync::Arc;
use std::time::Duration;

use berth_protocol::EventKind;
use berth_protocol::control::{
    self as wire, ControlGrant, ControlSettings, ControlView, Holder, TakeControl,
};
use serde_json::json;

use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::store::{ControlRow, HeldRow};
use crate::util::{now_ms, random_hex, rfc3339, sha256_hex};

/// One push to the agent.
const PUSH: Duration = Duration::from_secs(5);
/// How often leases are checked for their end.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Who is asking.
#[derive(Debug, Clone, Copy)]
pub enum Caller<'a> {
    /// The API key, with the control token it sent (`x-berth-control`), if any.
    Key(Option<&'a str>),
    /// The session view, by its cookie.
    Session(&'a str),
}

impl Caller<'_> {
    /// The control token this caller presents, if it has one.
    pub fn token(&self) -> Option<String> {
        match self {
            Caller::Key(t) => t.map(str::to_string),
            Caller::Session(cookie) => Some(session_token(cookie)),
        }
    }

    fn holder(&self) -> Holder {
        match self {
            Caller::Key(_) => Holder::ApiKey,
            Caller::Session(_) => Holder::Session,
        }
    }
}

/// The control token of a session view, derived from its cookie (never the cookie itself,
/// which must not reach the sandbox).
pub fn session_token(cookie: &str) -> String {
    sha256_hex(format!("berth-control:{cookie}").as_bytes())
}

/// The key the controller moves a sandbox's controls with (derived from its secret key, so a
/// restarted controller has it and nothing else does).
pub fn key(ctx: &Ctx, sandbox_id: &str) -> String {
    ctx.store.derive(&format!("control-key:{sandbox_id}"))
}

/// Whether the sandbox's agent was told anything a new run may have to take back (requests
/// for a person enabled, login sites).
pub fn had_settings(ctx: &Ctx, id: &str) -> bool {
    ctx.store.control(id).is_ok_and(|c| c.requests_enabled)
        || !ctx
            .store
            .run_logins(id)
            .unwrap_or_default()
            .enabled
            .is_empty()
}

/// At readiness, before the sandbox counts as running (so before anyone else holds its agent
/// token), and at each new run: claims the agent's controls for this controller, and tells the
/// agent whether it may ask for a person and which login sites its run enables (nothing to tell
/// a fresh agent when neither; `pushed_before` when a run may have enabled them).
pub async fn claim_and_push(ctx: &Ctx, row: &crate::store::SandboxRow, pushed_before: bool) {
    let Ok(agent) = ctx.agent(row) else { return };
    let key = key(ctx, &row.id);
    let warn = |what: &str, e: String| tracing::warn!(sandbox = %row.id, error = %e, "{what}");
    match tokio::time::timeout(PUSH, agent.control_claim(&sha256_hex(key.as_bytes()))).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => warn("claiming the controls", e.to_string()),
        Err(_) => warn("claiming the controls", "no answer within 5 s".into()),
    }
    let s = ControlSettings {
        requests_enabled: ctx.store.control(&row.id).is_ok_and(|c| c.requests_enabled),
        logins: ctx.store.run_logins(&row.id).unwrap_or_default().enabled,
    };
    if s == ControlSettings::default() && !pushed_before {
        return;
    }
    match tokio::time::timeout(PUSH, agent.control_settings(&s, &key)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => warn("pushing the run's settings", e.to_string()),
        Err(_) => warn("pushing the run's settings", "no answer within 5 s".into()),
    }
}

/// The lease in `row` still held at `now`.
fn live(row: &ControlRow, now: i64) -> Option<&HeldRow> {
    row.held.as_ref().filter(|h| h.expires_at > now)
}

/// The view of `row` for a caller presenting `token` (pure).
pub fn view_of(row: &ControlRow, token: Option<&str>, now: i64) -> ControlView {
    let held = live(row, now);
    ControlView {
        held: held.is_some(),
        you: held
            .is_some_and(|h| token.is_some_and(|t| sha256_hex(t.as_bytes()) == h.holder_sha256)),
        holder: held.map(|h| h.holder),
        taken_at: held.map(|h| rfc3339(h.taken_at)),
        expires_at: held.map(|h| rfc3339(h.expires_at)),
        ttl_seconds: wire::DEFAULT_TTL_SECONDS,
        requests_enabled: row.requests_enabled,
        request: None,
        token: None,
    }
}

pub struct Controls {
    ctx: Arc<Ctx>,
}

impl Controls {
    pub fn new(ctx: Arc<Ctx>) -> Controls {
        Controls { ctx }
    }

    /// `GET …/{id}/control`: the lease and, from a running agent, its pending request.
    pub async fn view(&self, id: &str, caller: Caller<'_>) -> Result<ControlView> {
        let row = self.ctx.visible_row(id)?;
        let mut v = view_of(
            &self.ctx.store.control(id)?,
            caller.token().as_deref(),
            now_ms(),
        );
        if row.live()
            && let Ok(agent) = self.ctx.agent(&row)
            && let Ok(Ok(a)) = tokio::time::timeout(PUSH, agent.control()).await
        {
            v.request = a.request;
        }
        Ok(v)
    }

    /// `POST …/{id}/control`: takes the controls, or renews them for their holder.
    pub async fn take(
        &self,
        id: &str,
        caller: Caller<'_>,
        req: &TakeControl,
    ) -> Result<ControlView> {
        let ttl = wire::lease_seconds(req.ttl_seconds).map_err(Error::BadRequest)?;
        let (_, agent) = self.ctx.running_agent(id)?;
        let now = now_ms();
        let fresh_token = caller.token().is_none().then(|| random_hex(32));
        let token = caller.token().or(fresh_token.clone()).unwrap_or_default();
        let held = HeldRow {
            holder: caller.holder(),
            holder_sha256: sha256_hex(token.as_bytes()),
            taken_at: now,
            expires_at: now + ttl as i64 * 1000,
        };
        let Some((row, fresh)) = self.ctx.store.take_control(id, &held, now)? else {
            let cur = self.ctx.store.control(id)?;
            let until = live(&cur, now)
                .map(|h| rfc3339(h.expires_at))
                .unwrap_or_default();
            return Err(Error::ConflictCode(
                wire::CONTROL_HELD,
                format!("another person holds the controls of sandbox {id} until {until}"),
            ));
        };
        let grant = ControlGrant {
            holder_sha256: held.holder_sha256.clone(),
            ttl_ms: ttl * 1000,
        };
        match tokio::time::timeout(PUSH, agent.control_grant(&grant, &key(&self.ctx, id))).await {
            Ok(Ok(_)) => {}
            failed => {
                if fresh {
                    self.ctx.store.release_control(id)?;
                }
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "no answer within 5 s".into(),
                };
                return Err(Error::Agent(format!(
                    "the sandbox's agent did not take the lease: {why}"
                )));
            }
        }
        if fresh {
            self.ctx.event(
                id,
                EventKind::ControlTaken,
                json!({"holder": held.holder.as_str(), "expires_at": rfc3339(held.expires_at)}),
            );
        }
        let mut v = view_of(&row, Some(&token), now);
        v.token = fresh_token.filter(|_| fresh);
        Ok(v)
    }

    /// `DELETE …/{id}/control`: the holder hands back (or the API key with `force`).
    pub async fn hand_back(
        &self,
        id: &str,
        caller: Caller<'_>,
        force: bool,
    ) -> Result<ControlView> {
        self.ctx.visible_row(id)?;
        let row = self.ctx.store.control(id)?;
        let now = now_ms();
        let token = caller.token();
        let mine = view_of(&row, token.as_deref(), now).you;
        if live(&row, now).is_some() && !mine && !force {
            return Err(Error::ConflictCode(
                wire::NOT_HOLDER,
                "only the person holding the controls hands them back (send their control \
                 token as x-berth-control, or ?force=true with the API key)"
                    .into(),
            ));
        }
        let reason = if mine { "handed_back" } else { "forced" };
        self.release_now(id, reason).await;
        Ok(view_of(&self.ctx.store.control(id)?, None, now_ms()))
    }

    /// `POST …/{id}/control/decline`: a person declines the agent's pending request.
    pub async fn decline(&self, id: &str, caller: Caller<'_>) -> Result<ControlView> {
        let (_, agent) = self.ctx.running_agent(id)?;
        let before = tokio::time::timeout(PUSH, agent.control())
            .await
            .ok()
            .and_then(|r| r.ok())
            .and_then(|a| a.request);
        let Some(req) = before else {
            return Err(Error::Conflict(format!(
                "sandbox {id} has no request for a person waiting"
            )));
        };
        tokio::time::timeout(PUSH, agent.control_decline(&key(&self.ctx, id)))
            .await
            .map_err(|_| Error::Agent("the sandbox's agent did not answer within 5 s".into()))?
            .map_err(|e| Error::Agent(e.to_string()))?;
        self.ctx.event(
            id,
            EventKind::ControlDeclined,
            json!({"id": req.id, "reason": req.reason}),
        );
        self.view(id, caller).await
    }

    /// Ends the lease now: the store, the agent (when it can be reached), the timeline.
    pub async fn release_now(&self, id: &str, reason: &str) {
        let held = match self.ctx.store.release_control(id) {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(sandbox = id, error = %e, "releasing the controls");
                return;
            }
        };
        if let Ok(row) = self.ctx.visible_row(id)
            && row.live()
            && let Ok(agent) = self.ctx.agent(&row)
            && let Ok(Err(e)) | Err(e) =
                tokio::time::timeout(PUSH, agent.control_release(&key(&self.ctx, id)))
                    .await
                    .map(|r| r.map(|_| ()))
                    .map_err(|_| berth_protocol::ClientError::Decode("no answer within 5 s".into()))
        {
            // The agent's own deadline ends its refusals anyway.
            tracing::warn!(sandbox = id, error = %e, "telling the agent the controls came back");
        }
        self.ctx.event(
            id,
            EventKind::ControlReturned,
            json!({"reason": reason, "held_ms": now_ms() - held.taken_at}),
        );
    }

    /// After a restart: the leases still valid are pushed to their agents again (one may
    /// have restarted), the others end.
    pub async fn restore(&self) {
        let now = now_ms();
        for c in self.ctx.store.held_controls().unwrap_or_default() {
            let id = c.sandbox_id.clone();
            let running = self.ctx.running_agent(&id);
            match (live(&c, now), running) {
                (Some(h), Ok((_, agent))) => {
                    let g = ControlGrant {
                        holder_sha256: h.holder_sha256.clone(),
                        ttl_ms: (h.expires_at - now).max(0) as u64,
                    };
                    if tokio::time::timeout(PUSH, agent.control_grant(&g, &key(&self.ctx, &id)))
                        .await
                        .is_err()
                    {
                        tracing::warn!(sandbox = %id, "pushing a held lease after a restart");
                    }
                }
                (Some(_), Err(_)) => self.release_now(&id, "sandbox_ended").await,
                (None, _) => self.release_now(&id, "expired").await,
            }
        }
    }

    /// Ends leases past their end and those of sandboxes that ended.
    pub async fn sweep(&self) {
        let now = now_ms();
        for c in self.ctx.store.held_controls().unwrap_or_default() {
            let ended = self
                .ctx
                .visible_row(&c.sandbox_id)
                .map(|r| !r.live())
                .unwrap_or(true);
            if ended {
                self.release_now(&c.sandbox_id, "sandbox_ended").await;
            } else if live(&c, now).is_none() {
                self.release_now(&c.sandbox_id, "expired").await;
            }
        }
    }

    /// Restores the leases, then sweeps them for as long as the controller runs.
    pub fn spawn(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            me.restore().await;
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            loop {
                tick.tick().await;
                me.sweep().await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_says_who_holds_and_whether_it_is_you() {
        let token = "tok";
        let row = ControlRow {
            sandbox_id: "sb".into(),
            requests_enabled: true,
            held: Some(HeldRow {
                holder: Holder::ApiKey,
                holder_sha256: sha256_hex(token.as_bytes()),
                taken_at: 1_000,
                expires_at: 61_000,
            }),
        };
        let v = view_of(&row, Some(token), 2_000);
        assert!(v.held && v.you && v.requests_enabled);
        assert_eq!(v.holder, Some(Holder::ApiKey));
        assert!(!view_of(&row, Some("other"), 2_000).you);
        assert!(!view_of(&row, None, 2_000).you);
        let ended = view_of(&row, Some(token), 61_000);
        assert!(!ended.held && !ended.you && ended.expires_at.is_none());
    }

    #[test]
    fn a_session_token_is_derived_not_the_cookie() {
        let t = session_token("cookie");
        assert_eq!(t.len(), 64);
        assert_ne!(t, "cookie");
        assert_eq!(t, session_token("cookie"));
        assert_eq!(Caller::Session("cookie").token(), Some(t));
        assert_eq!(Caller::Key(None).token(), None);
    }
}
