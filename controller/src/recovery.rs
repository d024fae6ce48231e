//! Reconciliation: the store is the truth and the world is brought to it — at start-up (adopt
//! what the store knows, reap what it does not after a grace period, fail what vanished) and
//! then continuously (vanished sandboxes, expiries, unfinished deletes, runs in flight). What
//! each pass observes is decided on by [`crate::reconcile::decide`] alone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::artifact::Artifacts;
use crate::ctx::Ctx;
use crate::follow::Follower;
use crate::lease::Leases;
use crate::lifecycle::SandboxStatus;
use crate::provider::Observed;
use crate::reconcile::{Action, Context, Health, Observation, Pass, Stored, decide};
use crate::run::Runs;
use crate::sandbox::Sandboxes;
use crate::timeline::Timeline;
use crate::util::now_ms;

const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// The reconciler: start-up recovery and the continuous sweep, over every domain below it.
pub struct Reconciler {
    pub ctx: Arc<Ctx>,
    pub sandboxes: Arc<Sandboxes>,
    pub leases: Arc<Leases>,
    pub runs: Arc<Runs>,
    pub artifacts: Arc<Artifacts>,
    pub timeline: Arc<Timeline>,
    pub follower: Arc<Follower>,
    pub workpieces: Arc<crate::workpiece::Workpieces>,
}

impl Reconciler {
    /// Every provider sandbox labelled with this controller's id, and the providers that
    /// could not say (their sandboxes are decided on once they can).
    async fn observed(&self) -> (BTreeMap<String, (Observed, String)>, BTreeSet<String>) {
        let mut out = BTreeMap::new();
        let mut unlisted = BTreeSet::new();
        for p in self.ctx.providers() {
            match p.list(&self.ctx.controller_id).await {
                Ok(list) => {
                    for o in list {
                        out.insert(o.identity.sandbox_id.clone(), (o, p.name().to_string()));
                    }
                }
                Err(e) => {
                    self.ctx.metrics.provider_error();
                    unlisted.insert(p.name().to_string());
                    tracing::error!(provider = p.name(), error = %e, "cannot list sandboxes");
                }
            }
        }
        (out, unlisted)
    }

    fn context(&self, pass: Pass) -> Context {
        Context {
            pass,
            now_ms: now_ms(),
            orphan_grace_ms: self.ctx.config.orphan_grace_secs as i64 * 1000,
        }
    }

    /// Start-up reconciliation: runs before the API serves. Every stored sandbox and every
    /// provider sandbox of this controller is decided on ([`decide`]) and the decision applied.
    pub async fn recover(self: &Arc<Self>) -> anyhow::Result<()> {
        let (observed, unlisted) = self.observed().await;
        let rows = self.ctx.store.sandboxes(&[])?;
        let cx = self.context(Pass::Startup);
        let (mut adopted, mut resumed, mut vanished, mut reaped) = (0, 0, 0, 0);
        for row in &rows {
            if unlisted.contains(&row.provider) {
                continue;
            }
            let mut seen = observed.get(&row.id).map(|(o, _)| Observation::of(o));
            // A running sandbox is adopted only if its agent answers, where the provider
            // reaches it now (a port-forward's listener of before the restart is gone).
            if row.status == SandboxStatus::Running
                && let Some(o) = seen.as_mut()
                && o.health == Health::Alive
            {
                let mut now = row.clone();
                if let Some(ep) = &o.endpoint {
                    now.agent_url = Some(ep.agent_url.clone());
                }
                if let Err(reason) = self.sandboxes.probe(&now).await {
                    o.health = Health::Unreachable(reason);
                }
            }
            let action = decide(&cx, Some(&Stored::of(row)), seen.as_ref());
            match &action {
                Action::Adopt { .. } => adopted += 1,
                Action::Resume { .. } => resumed += 1,
                Action::Fail { .. } => vanished += 1,
                _ => {}
            }
            self.sandboxes.apply(&row.id, &action);
        }
        let known: BTreeSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        for (id, (o, _)) in &observed {
            if known.contains(id.as_str()) {
                continue;
            }
            let action = decide(&cx, None, Some(&Observation::of(o)));
            if action == Action::Reap {
                reaped += 1;
            }
            self.sandboxes.apply(id, &action);
        }
        tracing::info!(
            adopted,
            resumed,
            vanished,
            reaped,
            "reconciled with the providers"
        );
        Ok(())
    }

    /// The loops that keep the world matching the store.
    pub fn start_loops(self: &Arc<Self>) {
        // Deaths the providers report (Docker's die/oom events) are acted on at once.
        for p in self.ctx.providers() {
            if let Some(mut deaths) = p.deaths(&self.ctx.controller_id) {
                let me = self.clone();
                tokio::spawn(async move {
                    while let Some(d) = deaths.recv().await {
                        // A death report is an observation like any other.
                        let Ok(Some(row)) = me.ctx.store.sandbox(&d.sandbox_id) else {
                            continue;
                        };
                        let seen = Observation {
                            health: Health::Dead(Some(d.reason)),
                            created_at_ms: row.created_at,
                            endpoint: None,
                        };
                        let cx = me.context(Pass::Death);
                        me.sandboxes
                            .apply(&row.id, &decide(&cx, Some(&Stored::of(&row)), Some(&seen)));
                    }
                });
            }
        }
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(me.ctx.config.reconcile_interval());
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.runs.reconcile_runs().await;
            }
        });
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.sweep().await;
            }
        });
    }

    async fn sweep(self: &Arc<Self>) {
        let now = now_ms();
        // Expired leases, then expired sandboxes.
        if let Ok(leases) = self.ctx.store.expired_leases(now) {
            for l in leases {
                if let Err(e) = self.leases.release(&l.id, "expired").await {
                    tracing::warn!(lease = %l.id, error = %e, "releasing an expired lease");
                }
            }
        }
        use SandboxStatus::*;
        let Ok(rows) = self
            .ctx
            .store
            .sandboxes(&[Running, Starting, Pending, Stopping])
        else {
            return;
        };
        // Artifacts past their retention.
        self.artifacts.sweep_artifacts().await;
        // Its own task: a slow sandbox's look does not hold the rest of the sweep.
        let workpieces = self.workpieces.clone();
        tokio::spawn(async move { workpieces.sweep().await });
        let cx = self.context(Pass::Sweep);
        for row in rows {
            let stored = Stored::of(&row);
            // Only a running, unexpired sandbox is looked at: its create and readiness check
            // own one still starting (its TTL counts from readiness), and an expired one goes
            // whatever it shows.
            let look = row.status == Running && row.expires_at.is_none_or(|e| e > cx.now_ms);
            let seen = if look {
                let Ok(provider) = self.ctx.provider_named(&row.provider) else {
                    continue;
                };
                match provider.inspect(&row.id).await {
                    Ok(o) => o.as_ref().map(Observation::of),
                    Err(e) => {
                        tracing::warn!(sandbox = %row.id, error = %e, "cannot inspect");
                        continue;
                    }
                }
            } else {
                None
            };
            let action = decide(&cx, Some(&stored), seen.as_ref());
            if action == Action::Nothing && seen.as_ref().is_some_and(|o| o.health == Health::Alive)
            {
                // Its runs are recorded as they end, its recordings published as they stop.
                self.follower.follow(&row.id);
            }
            if action == Action::Nothing
                && seen.as_ref().is_some_and(|o| o.health == Health::Alive)
                && let Err(e) = self.timeline.import_agent_events(&row).await
            {
                tracing::debug!(sandbox = %row.id, error = %e, "agent events not imported");
            }
            self.sandboxes.apply(&row.id, &action);
        }
        // What the providers run that the store holds ended, or not at all.
        let (observed, _) = self.observed().await;
        for (id, (o, _)) in observed {
            let Ok(known) = self.ctx.store.sandbox(&id) else {
                continue;
            };
            let stored = known.as_ref().map(Stored::of);
            if stored
                .as_ref()
                .is_some_and(|s| s.status.live() || s.status == Stopping)
            {
                continue; // decided on above
            }
            let action = decide(&cx, stored.as_ref(), Some(&Observation::of(&o)));
            self.sandboxes.apply(&id, &action);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::controller::Controller;
    use crate::controller::controller_on;
    use crate::lifecycle::LeaseStatus;
    use crate::provider::fake::{CreateMode, FakeProvider};
    use crate::provider::{Identity, Provider};
    use crate::reconcile::reasons;
    use crate::sandbox::Request;
    use crate::store::SandboxUpdate;

    const WITHIN: Duration = Duration::from_secs(20);

    fn req() -> Request {
        Request {
            profile: "ide".into(),
            image_ref: None,
            labels: Default::default(),
            ttl_seconds: None,
            screen: None,
            egress: None,
            credentials: Vec::new(),
            human_control: false,
            logins: Vec::new(),
            limits: None,
        }
    }

    fn status(c: &Controller, id: &str) -> SandboxStatus {
        c.ctx.get_row(id).unwrap().status
    }

    fn kinds(c: &Controller, id: &str) -> Vec<String> {
        c.ctx
            .store
            .events(id, 0, 1000)
            .unwrap()
            .iter()
            .map(|e| e["kind"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// A controller restarted on the same store and the same provider finds each sandbox in
    /// each state the provider can show, and does what `decide` says.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restarted_controller_adopts_resumes_fails_finishes_and_reaps() {
        let d = tempfile::tempdir().unwrap();
        let fake = FakeProvider::new("process");
        let config = Config {
            orphan_grace_secs: 60,
            ..Config::default()
        };
        let before = controller_on(d.path(), &fake, config.clone());
        let make = || async { before.sandboxes.provision(&req()).await.unwrap().0.id };
        let adopted = make().await;
        let died = make().await;
        let vanished = make().await;
        let unreachable = make().await;
        let deleting = make().await;
        let failed = make().await;
        fake.kill(&died, "oom");
        fake.vanish(&vanished);
        fake.set_reachable(&unreachable, false);
        assert!(
            before
                .ctx
                .store
                .set_status(&deleting, SandboxStatus::Stopping, Default::default())
                .unwrap()
        );
        before
            .sandboxes
            .fail(&failed, "a failure before the restart");
        // A start under way: recorded, made by the provider, not ready yet.
        let starting = before
            .sandboxes
            .insert_row(&req(), "fake:ide-ubuntu", None)
            .unwrap();
        let identity = Identity {
            controller_id: before.ctx.controller_id.clone(),
            sandbox_id: starting.id.clone(),
            profile: starting.profile.clone(),
            image_ref: starting.image_ref.clone(),
        };
        fake.plant(identity.clone(), 0).await;
        let ep = fake
            .inspect(&starting.id)
            .await
            .unwrap()
            .unwrap()
            .endpoint
            .unwrap();
        before
            .ctx
            .store
            .set_status(
                &starting.id,
                SandboxStatus::Starting,
                SandboxUpdate {
                    agent_url: Some(&ep.agent_url),
                    compat_url: Some(&ep.compat_url),
                    ..Default::default()
                },
            )
            .unwrap();
        // A create the provider never answered.
        let pending = before
            .sandboxes
            .insert_row(&req(), "fake:ide-ubuntu", None)
            .unwrap();
        // Sandboxes of this controller the store does not know: an old one and a new one.
        let orphan = |id: &str| Identity {
            sandbox_id: id.into(),
            ..identity.clone()
        };
        fake.plant(orphan("sb_old_orphan"), 61_000).await;
        fake.plant(orphan("sb_new_orphan"), 1_000).await;
        // Another controller's sandbox is none of this one's business.
        let foreign = Identity {
            controller_id: "ctl_other".into(),
            ..orphan("sb_foreign")
        };
        fake.plant(foreign, 3_600_000).await;
        drop(before);

        let after = controller_on(d.path(), &fake, config);
        after.reconciler.recover().await.unwrap();
        assert_eq!(status(&after, &adopted), SandboxStatus::Running);
        assert!(kinds(&after, &adopted).contains(&"sandbox.adopted".to_string()));
        let check_failed = |id: &str, reason: &str| {
            let row = after.ctx.get_row(id).unwrap();
            assert_eq!(row.status, SandboxStatus::Failed, "{id}");
            assert!(
                row.error.as_deref().unwrap_or_default().starts_with(reason),
                "{id}: {:?}",
                row.error
            );
        };
        check_failed(&died, reasons::DIED_WHILE_DOWN);
        check_failed(&vanished, reasons::VANISHED_WHILE_DOWN);
        check_failed(&unreachable, reasons::NOT_READY_AT_RESTART);
        check_failed(&pending.id, reasons::NEVER_CREATED);
        check_failed(&failed, "a failure before the restart");
        let gone = fake
            .wait_for(WITHIN, |f| {
                let ids = f.ids();
                [&died, &unreachable, &deleting, &failed, "sb_old_orphan"]
                    .iter()
                    .all(|id| !ids.contains(&id.to_string()))
            })
            .await;
        assert!(gone, "left: {:?}", fake.ids());
        assert!(fake.ids().contains(&"sb_new_orphan".to_string()));
        assert!(fake.ids().contains(&"sb_foreign".to_string()));
        assert!(fake.ids().contains(&adopted));
        // The delete cut short is finished.
        let finished = fake
            .wait_for(WITHIN, |_| {
                after.ctx.get_row(&deleting).unwrap().status == SandboxStatus::Stopped
            })
            .await;
        assert!(finished);
        // The start under way is driven to ready again.
        let ready = fake
            .wait_for(WITHIN, |_| {
                after.ctx.get_row(&starting.id).unwrap().status == SandboxStatus::Running
            })
            .await;
        assert!(ready, "{:?}", after.ctx.get_row(&starting.id).unwrap());
        // A failed sandbox keeps its status once destroyed.
        assert_eq!(status(&after, &failed), SandboxStatus::Failed);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_death_report_fails_a_sandbox_at_once_and_the_sweep_catches_what_is_not_reported() {
        let d = tempfile::tempdir().unwrap();
        let fake = FakeProvider::new("process");
        let c = controller_on(d.path(), &fake, Config::default());
        c.reconciler.start_loops();
        let id = c.sandboxes.provision(&req()).await.unwrap().0.id;
        fake.kill(&id, "the container was OOM-killed");
        let failed = fake
            .wait_for(WITHIN, |f| {
                status(&c, &id) == SandboxStatus::Failed && !f.ids().contains(&id)
            })
            .await;
        assert!(failed);
        assert_eq!(
            c.ctx.get_row(&id).unwrap().error.as_deref(),
            Some("the container was OOM-killed")
        );
        // Gone without a report: the sweep finds it.
        let quiet = c.sandboxes.provision(&req()).await.unwrap().0.id;
        fake.vanish(&quiet);
        let found = fake
            .wait_for(WITHIN, |_| status(&c, &quiet) == SandboxStatus::Failed)
            .await;
        assert!(found);
        assert_eq!(
            c.ctx.get_row(&quiet).unwrap().error.as_deref(),
            Some(reasons::VANISHED)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_sweep_ends_expired_leases_and_sandboxes_and_leaves_starts_alone() {
        let d = tempfile::tempdir().unwrap();
        let fake = FakeProvider::new("process");
        let c = controller_on(d.path(), &fake, Config::default());
        let lease = c
            .leases
            .acquire(&berth_protocol::controller::AcquireLease {
                thread_id: "t".into(),
                profile: "ide".into(),
                image_ref: None,
                labels: Default::default(),
                ttl_seconds: Some(1),
                screen: None,
                egress: None,
                human_control: None,
                logins: Vec::new(),
            })
            .await
            .unwrap();
        let short = c
            .sandboxes
            .provision(&Request {
                ttl_seconds: Some(1),
                ..req()
            })
            .await
            .unwrap()
            .0
            .id;
        // A create that hangs stays pending: the sweep does not touch it.
        fake.set_create(CreateMode::Hang);
        let hanging = {
            let c = c.clone();
            tokio::spawn(async move { c.sandboxes.provision_nowait(&req()).await })
        };
        assert!(fake.wait_for(WITHIN, |f| f.creates() == 3).await);
        // The clock passes both expiries (what the sweep waits for is time itself).
        let expires = c
            .ctx
            .store
            .lease(&lease.lease_id)
            .unwrap()
            .unwrap()
            .expires_at;
        let latest = expires.max(c.ctx.get_row(&short).unwrap().expires_at.unwrap());
        tokio::time::sleep(Duration::from_millis((latest - now_ms()).max(0) as u64 + 5)).await;
        c.reconciler.sweep().await;
        assert_eq!(
            c.ctx.store.lease(&lease.lease_id).unwrap().unwrap().status,
            LeaseStatus::Expired
        );
        let stopped = fake
            .wait_for(WITHIN, |f| {
                status(&c, &lease.sandbox.id) == SandboxStatus::Stopped
                    && status(&c, &short) == SandboxStatus::Stopped
                    && !f.ids().contains(&short)
            })
            .await;
        assert!(stopped);
        assert!(kinds(&c, &short).contains(&"sandbox.expired".to_string()));
        let pending = c.ctx.store.sandboxes(&[SandboxStatus::Pending]).unwrap();
        assert_eq!(pending.len(), 1);
        hanging.abort();
    }
}
