//! Leases: one sandbox per thread, reused across its runs while it stays ready and carries the
//! required labels, replaced when it does not. Acquire is idempotent per thread; renew only
//! extends (clamped); release and expiry destroy the sandbox (a used sandbox never returns to
//! a pool).

use std::sync::Arc;

use berth_protocol::controller::{AcquireLease, Lease};
use berth_protocol::events::EventKind;
use serde_json::json;

use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::lifecycle::{LeaseStatus, SandboxStatus};
use crate::sandbox::{Request, Sandboxes};
use crate::store::{LeaseRow, SandboxRow};
use crate::util::{new_id, now_ms, rfc3339, valid_id};

/// Leases: a thread's sandbox, reused while it serves, destroyed on release or expiry.
pub struct Leases {
    ctx: Arc<Ctx>,
    sandboxes: Arc<Sandboxes>,
    /// One acquire per thread at a time.
    locks: crate::util::KeyedLocks,
}

impl Leases {
    pub fn new(ctx: Arc<Ctx>, sandboxes: Arc<Sandboxes>) -> Leases {
        Leases {
            ctx,
            sandboxes,
            locks: Default::default(),
        }
    }

    pub async fn acquire(self: &Arc<Self>, req: &AcquireLease) -> Result<Lease> {
        if !valid_id(&req.thread_id) {
            return Err(Error::BadRequest(format!(
                "thread_id {:?}: use 1-128 letters, digits, '.', '_' or '-'",
                req.thread_id
            )));
        }
        crate::sandbox::validate_labels(&req.labels)?;
        self.ctx.logins.check(&req.logins)?;
        // An alias leases as its profile's canonical name (what the sandbox row holds).
        let req = &AcquireLease {
            profile: self.ctx.profile(&req.profile)?.name.clone(),
            ..req.clone()
        };
        let screen = self
            .sandboxes
            .check_screen(&req.profile, req.screen.as_deref())?;
        let image = self
            .sandboxes
            .resolve(&req.profile, req.image_ref.as_deref())?;
        let egress = self
            .sandboxes
            .check_egress(&req.profile, req.egress.as_ref())?;
        let req = &AcquireLease {
            egress: Some(egress.clone()),
            ..req.clone()
        };
        let lock = self.locks.get(&req.thread_id);
        let _held = lock.lock().await;
        let want = Request {
            profile: req.profile.clone(),
            image_ref: Some(image.clone()),
            labels: req.labels.clone(),
            ttl_seconds: req.ttl_seconds,
            screen,
            egress: Some(egress),
            credentials: Vec::new(),
            human_control: req.human_control.unwrap_or(false),
            logins: req.logins.clone(),
            limits: None,
        };
        match self.ctx.store.active_lease_for_thread(&req.thread_id)? {
            Some(lease) => self.renew_or_replace(lease, req, want, &image).await,
            None => self.open_lease(req, want).await,
        }
    }

    /// A thread's active lease: its sandbox reused when it still serves `req` (at the screen
    /// asked), else a new one provisioned under the same lease while the old one goes.
    async fn renew_or_replace(
        self: &Arc<Self>,
        lease: LeaseRow,
        req: &AcquireLease,
        want: Request,
        image: &str,
    ) -> Result<Lease> {
        let current = self.ctx.store.sandbox(&lease.sandbox_id)?;
        let reason = match &current {
            None => "its sandbox is unknown".to_string(),
            Some(row) => match self.staleness(row, req, image).await {
                Some(reason) => reason,
                // Reused, at the screen asked (resized when it has another).
                None => match self
                    .sandboxes
                    .claim_screen(row.clone(), want.screen.as_deref())
                    .await
                {
                    Ok(row) => {
                        // A new run on the reused sandbox.
                        let run = self.sandboxes.start_run(&row, &want).await?;
                        self.ctx.event(
                            &row.id,
                            EventKind::LeaseAcquired,
                            json!({"lease_id": lease.id, "thread_id": lease.thread_id,
                                   "claim": "reused", "run": run}),
                        );
                        return Ok(self.lease_wire(&lease, &row, "reused"));
                    }
                    Err(e) => format!("its sandbox could not take the screen: {e}"),
                },
            },
        };
        // Re-provision under the same lease; the old sandbox goes.
        tracing::info!(lease = %lease.id, %reason, "lease re-provisions");
        if let Some(old) = &current {
            self.ctx.event(
                &old.id,
                EventKind::LeaseReleased,
                json!({"lease_id": lease.id, "reason": reason}),
            );
            // Not waited for: it goes on in its own task.
            drop(self.sandboxes.destroy(&old.id));
        }
        let want = Request {
            ttl_seconds: Some(((lease.expires_at - now_ms()).max(1000) / 1000) as u64),
            ..want
        };
        let (row, how) = self.sandboxes.provision(&want).await?;
        self.ctx.store.set_lease_sandbox(&lease.id, &row.id)?;
        self.ctx.store.set_expiry(&row.id, Some(lease.expires_at))?;
        self.ctx.event(
            &row.id,
            EventKind::LeaseAcquired,
            json!({"lease_id": lease.id, "thread_id": lease.thread_id, "claim": how,
                   "reprovisioned": reason}),
        );
        let lease = LeaseRow {
            sandbox_id: row.id.clone(),
            ..lease
        };
        let row = self.ctx.get_row(&row.id)?;
        Ok(self.lease_wire(&lease, &row, how))
    }

    /// A new lease for the thread, on a sandbox provisioned for it.
    async fn open_lease(&self, req: &AcquireLease, want: Request) -> Result<Lease> {
        let (row, how) = self.sandboxes.provision(&want).await?;
        let now = now_ms();
        let lease = LeaseRow {
            id: new_id("ls"),
            thread_id: req.thread_id.clone(),
            sandbox_id: row.id.clone(),
            profile: req.profile.clone(),
            status: LeaseStatus::Active,
            created_at: now,
            expires_at: self.ctx.expiry(req.ttl_seconds),
        };
        self.ctx.store.insert_lease(&lease)?;
        self.ctx.store.set_expiry(&row.id, Some(lease.expires_at))?;
        self.ctx.event(
            &row.id,
            EventKind::LeaseAcquired,
            json!({"lease_id": lease.id, "thread_id": lease.thread_id, "claim": how}),
        );
        let row = self.ctx.get_row(&row.id)?;
        Ok(self.lease_wire(&lease, &row, how))
    }

    /// Why a leased sandbox cannot be reused for `req`, or `None` when it can.
    async fn staleness(&self, row: &SandboxRow, req: &AcquireLease, image: &str) -> Option<String> {
        if row.status != SandboxStatus::Running {
            return Some(format!("its sandbox is {}", row.status));
        }
        if row.profile != req.profile || row.image_ref != image {
            return Some(format!(
                "its sandbox runs {} from {}, not {} from {image}",
                row.profile, row.image_ref, req.profile
            ));
        }
        if let Some((k, v)) = req
            .labels
            .iter()
            .find(|(k, v)| row.labels.get(*k) != Some(*v))
        {
            return Some(format!("its sandbox lacks the required label {k}={v}"));
        }
        let policy = row.egress.as_ref().map(|e| &e.policy);
        if req.egress.is_some() && policy != req.egress.as_ref() {
            return Some("its sandbox has another egress policy".into());
        }
        if let Err(reason) = self.sandboxes.probe(row).await {
            self.sandboxes.fail(
                &row.id,
                &format!("failed its probe at lease reuse: {reason}"),
            );
            return Some(format!("its sandbox is not ready: {reason}"));
        }
        None
    }

    pub async fn renew(self: &Arc<Self>, lease_id: &str, ttl_seconds: u64) -> Result<Lease> {
        let lease = self
            .ctx
            .store
            .lease(lease_id)?
            .ok_or_else(|| Error::NotFound(format!("no lease {lease_id}")))?;
        if lease.status != LeaseStatus::Active {
            return Err(Error::Conflict(format!(
                "lease {lease_id} is {}",
                lease.status
            )));
        }
        let lease = self
            .ctx
            .store
            .extend_lease(lease_id, self.ctx.expiry(Some(ttl_seconds)))?
            .ok_or_else(|| Error::Conflict(format!("lease {lease_id} ended")))?;
        self.ctx
            .store
            .set_expiry(&lease.sandbox_id, Some(lease.expires_at))?;
        self.ctx.event(
            &lease.sandbox_id,
            EventKind::LeaseRenewed,
            json!({"lease_id": lease.id, "expires_at": rfc3339(lease.expires_at)}),
        );
        let row = self.ctx.get_row(&lease.sandbox_id)?;
        Ok(self.lease_wire(&lease, &row, "reused"))
    }

    /// Ends the lease and destroys its sandbox. Releasing twice is not an error.
    pub async fn release(self: &Arc<Self>, lease_id: &str, reason: &str) -> Result<()> {
        let lease = self
            .ctx
            .store
            .lease(lease_id)?
            .ok_or_else(|| Error::NotFound(format!("no lease {lease_id}")))?;
        let status = if reason == "expired" {
            LeaseStatus::Expired
        } else {
            LeaseStatus::Released
        };
        if self.ctx.store.end_lease(lease_id, status)? {
            self.ctx.event(
                &lease.sandbox_id,
                EventKind::LeaseReleased,
                json!({"lease_id": lease.id, "reason": reason}),
            );
        }
        self.sandboxes.destroy(&lease.sandbox_id).await;
        Ok(())
    }

    fn lease_wire(&self, lease: &LeaseRow, row: &SandboxRow, how: &str) -> Lease {
        Lease {
            lease_id: lease.id.clone(),
            sandbox: self.sandboxes.to_wire(row),
            thread_id: lease.thread_id.clone(),
            expires_at: Some(rfc3339(lease.expires_at)),
            how: Some(how.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::controller::controller_on;
    use crate::provider::fake::FakeProvider;

    const WITHIN: Duration = Duration::from_secs(20);

    fn acquire(thread: &str, ttl: Option<u64>) -> AcquireLease {
        AcquireLease {
            thread_id: thread.into(),
            profile: "ide".into(),
            image_ref: None,
            labels: Default::default(),
            ttl_seconds: ttl,
            screen: None,
            egress: None,
            human_control: None,
            logins: Vec::new(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_with_a_policy_its_provider_cannot_enforce_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let fake = FakeProvider::new("process");
        let c = controller_on(d.path(), &fake, Config::default());
        let req = AcquireLease {
            egress: Some(berth_protocol::egress::Egress::Mode(
                berth_protocol::egress::EgressMode::None,
            )),
            ..acquire("t-egress", Some(600))
        };
        let err = c.leases.acquire(&req).await.unwrap_err().to_string();
        assert!(err.contains("cannot enforce an egress policy"), "{err}");
        assert_eq!(fake.creates(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thread_reuses_its_lease_renews_only_forward_and_a_release_destroys_once() {
        let d = tempfile::tempdir().unwrap();
        let fake = FakeProvider::new("process");
        let c = controller_on(d.path(), &fake, Config::default());
        let first = c.leases.acquire(&acquire("t1", Some(600))).await.unwrap();
        assert_eq!(first.how.as_deref(), Some("cold"));
        assert_eq!(first.sandbox.status, "running");
        let again = c.leases.acquire(&acquire("t1", Some(600))).await.unwrap();
        assert_eq!(again.how.as_deref(), Some("reused"));
        assert_eq!(again.lease_id, first.lease_id);
        assert_eq!(again.sandbox.id, first.sandbox.id);
        assert_eq!(fake.creates(), 1);
        // Another thread, another sandbox.
        let other = c.leases.acquire(&acquire("t2", None)).await.unwrap();
        assert_ne!(other.sandbox.id, first.sandbox.id);
        // Renewals only extend; the sandbox's expiry follows the lease's.
        let before = c
            .ctx
            .store
            .lease(&first.lease_id)
            .unwrap()
            .unwrap()
            .expires_at;
        c.leases.renew(&first.lease_id, 1).await.unwrap();
        assert_eq!(
            c.ctx
                .store
                .lease(&first.lease_id)
                .unwrap()
                .unwrap()
                .expires_at,
            before
        );
        c.leases.renew(&first.lease_id, 7200).await.unwrap();
        let after = c.ctx.store.lease(&first.lease_id).unwrap().unwrap();
        assert!(after.expires_at > before);
        assert_eq!(
            c.ctx.get_row(&first.sandbox.id).unwrap().expires_at,
            Some(after.expires_at)
        );
        // Released: the lease ends, its sandbox is destroyed; twice is no error.
        c.leases.release(&first.lease_id, "done").await.unwrap();
        c.leases.release(&first.lease_id, "done").await.unwrap();
        let l = c.ctx.store.lease(&first.lease_id).unwrap().unwrap();
        assert_eq!(l.status, LeaseStatus::Released);
        assert_eq!(
            c.ctx.get_row(&first.sandbox.id).unwrap().status,
            SandboxStatus::Stopped
        );
        assert!(!fake.ids().contains(&first.sandbox.id));
        assert!(
            c.leases.renew(&first.lease_id, 60).await.is_err(),
            "an ended lease"
        );
        // The thread's next acquire is a new lease.
        let next = c.leases.acquire(&acquire("t1", None)).await.unwrap();
        assert_ne!(next.lease_id, first.lease_id);
        assert!(
            c.leases
                .acquire(&acquire("bad thread!", None))
                .await
                .is_err()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_whose_sandbox_died_or_stopped_answering_is_given_a_new_one() {
        let d = tempfile::tempdir().unwrap();
        let fake = FakeProvider::new("process");
        let c = controller_on(d.path(), &fake, Config::default());
        let first = c.leases.acquire(&acquire("t", None)).await.unwrap();
        fake.set_reachable(&first.sandbox.id, false);
        let second = c.leases.acquire(&acquire("t", None)).await.unwrap();
        assert_eq!(second.lease_id, first.lease_id);
        assert_ne!(second.sandbox.id, first.sandbox.id);
        assert_eq!(second.how.as_deref(), Some("cold"));
        let old = c.ctx.get_row(&first.sandbox.id).unwrap();
        assert_eq!(old.status, SandboxStatus::Failed);
        assert!(
            old.error
                .unwrap()
                .contains("failed its probe at lease reuse")
        );
        // The old one is destroyed behind the new one.
        let gone = fake
            .wait_for(WITHIN, |f| !f.ids().contains(&first.sandbox.id))
            .await;
        assert!(gone);
        fake.kill(&second.sandbox.id, "oom");
        let third = c.leases.acquire(&acquire("t", None)).await.unwrap();
        assert_ne!(third.sandbox.id, second.sandbox.id);
        assert_eq!(
            c.ctx
                .store
                .lease(&first.lease_id)
                .unwrap()
                .unwrap()
                .sandbox_id,
            third.sandbox.id
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_acquires_of_one_thread_share_one_lease() {
        let d = tempfile::tempdir().unwrap();
        let fake = FakeProvider::new("process");
        let c = controller_on(d.path(), &fake, Config::default());
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move { c.leases.acquire(&acquire("same", None)).await.unwrap() })
            })
            .collect();
        let mut leases = std::collections::BTreeSet::new();
        let mut sandboxes = std::collections::BTreeSet::new();
        for t in tasks {
            let l = t.await.unwrap();
            leases.insert(l.lease_id);
            sandboxes.insert(l.sandbox.id);
        }
        assert_eq!(leases.len(), 1);
        assert_eq!(sandboxes.len(), 1);
        assert_eq!(fake.creates(), 1);
    }
}
