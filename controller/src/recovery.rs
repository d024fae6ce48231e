//! Reconciliation: the store is the truth and the world is brought to it — at start-up (adopt
//! what the store knows, reap what it does not after a grace period, fail what vanished) and
//! then continuously (vanished sandboxes, expiries, unfinished deletes, runs in flight).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::provider::Observed;
use crate::sandbox::Controller;
use crate::store::{SandboxRow, SandboxUpdate};
use crate::util::now_ms;

const SWEEP_EVERY: Duration = Duration::from_secs(2);

impl Controller {
    /// Every provider sandbox labelled with this controller's id.
    async fn observed(&self) -> BTreeMap<String, (Observed, String)> {
        let mut out = BTreeMap::new();
        for p in self.providers() {
            match p.list(&self.controller_id).await {
                Ok(list) => {
                    for o in list {
                        out.insert(o.identity.sandbox_id.clone(), (o, p.name().to_string()));
                    }
                }
                Err(e) => {
                    self.metrics.provider_error();
                    tracing::error!(provider = p.name(), error = %e, "cannot list sandboxes");
                }
            }
        }
        out
    }

    /// Start-up reconciliation: runs before the API serves.
    pub async fn recover(self: &Arc<Self>) -> anyhow::Result<()> {
        let observed = self.observed().await;
        let rows = self.store.sandboxes(&[])?;
        let known: BTreeMap<&str, &SandboxRow> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
        let (mut adopted, mut resumed, mut vanished, mut reaped) = (0, 0, 0, 0);
        for row in rows.iter().filter(|r| r.live() || r.status == "stopping") {
            match observed.get(&row.id) {
                None if row.status == "stopping" => {
                    // Nothing of it runs, but a delete cut short may have left its files: the
                    // provider's destroy (idempotent) finishes it and marks it stopped.
                    let me = self.clone();
                    let id = row.id.clone();
                    tokio::spawn(async move { me.destroy(&id).await });
                }
                None => {
                    vanished += 1;
                    let reason = if row.status == "pending" {
                        "the controller stopped before the provider created it"
                    } else {
                        "vanished while the controller was down: the provider has no trace of it"
                    };
                    self.fail(&row.id, reason);
                }
                Some((o, _)) if !o.alive => {
                    vanished += 1;
                    self.fail(&row.id, "its agent died while the controller was down");
                    let me = self.clone();
                    let id = row.id.clone();
                    tokio::spawn(async move { me.destroy(&id).await });
                }
                Some((o, _)) => match row.status.as_str() {
                    "running" => match self.probe(row).await {
                        Ok(()) => {
                            adopted += 1;
                            self.event(&row.id, "sandbox.adopted", json!({}));
                        }
                        Err(reason) => {
                            vanished += 1;
                            self.fail(
                                &row.id,
                                &format!("not ready when the controller restarted: {reason}"),
                            );
                            let me = self.clone();
                            let id = row.id.clone();
                            tokio::spawn(async move { me.destroy(&id).await });
                        }
                    },
                    "pending" | "starting" => {
                        resumed += 1;
                        if let Some(ep) = &o.endpoint {
                            let _ = self.store.set_status(
                                &row.id,
                                "starting",
                                &["stopping", "stopped", "failed"],
                                SandboxUpdate {
                                    agent_url: Some(&ep.agent_url),
                                    compat_url: Some(&ep.compat_url),
                                    cdp_url: ep.cdp_url.as_deref(),
                                    ports: Some(&ep.ports),
                                    ..Default::default()
                                },
                            );
                        }
                        let me = self.clone();
                        let id = row.id.clone();
                        tokio::spawn(async move {
                            let _ = me.await_ready(id).await;
                        });
                    }
                    _ => {
                        let me = self.clone();
                        let id = row.id.clone();
                        tokio::spawn(async move { me.destroy(&id).await });
                    }
                },
            }
        }
        for (id, (o, _)) in &observed {
            match known.get(id.as_str()) {
                Some(r) if r.live() || r.status == "stopping" => {}
                Some(_) => {
                    // A delete that did not finish: finish it.
                    let me = self.clone();
                    let id = id.clone();
                    tokio::spawn(async move { me.destroy(&id).await });
                }
                None => {
                    if now_ms() - o.created_at_ms >= self.config.orphan_grace_secs as i64 * 1000 {
                        reaped += 1;
                        self.reap_orphan(id).await;
                    }
                }
            }
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

    async fn reap_orphan(&self, id: &str) {
        for p in self.providers() {
            if let Ok(Some(_)) = p.inspect(id).await {
                tracing::warn!(
                    sandbox = id,
                    provider = p.name(),
                    "reaping a sandbox the store does not know"
                );
                match p.destroy(id).await {
                    Ok(()) => self.metrics.orphan_reaped(),
                    Err(e) => {
                        self.metrics.provider_error();
                        tracing::error!(sandbox = id, error = %e, "cannot reap an orphan");
                    }
                }
            }
        }
    }

    /// The loops that keep the world matching the store.
    pub fn start_loops(self: &Arc<Self>) {
        // Deaths the providers report (Docker's die/oom events) are acted on at once.
        for p in self.providers() {
            if let Some(mut deaths) = p.deaths(&self.controller_id) {
                let me = self.clone();
                tokio::spawn(async move {
                    while let Some(d) = deaths.recv().await {
                        let live = me
                            .store
                            .sandbox(&d.sandbox_id)
                            .ok()
                            .flatten()
                            .is_some_and(|r| r.live());
                        if live {
                            me.fail(&d.sandbox_id, &d.reason);
                            let me2 = me.clone();
                            tokio::spawn(async move { me2.destroy(&d.sandbox_id).await });
                        }
                    }
                });
            }
        }
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(me.config.reconcile_interval());
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.reconcile_runs().await;
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
        if let Ok(leases) = self.store.expired_leases(now) {
            for l in leases {
                if let Err(e) = self.release(&l.id, "expired").await {
                    tracing::warn!(lease = %l.id, error = %e, "releasing an expired lease");
                }
            }
        }
        let Ok(rows) = self
            .store
            .sandboxes(&["running", "starting", "pending", "stopping"])
        else {
            return;
        };
        for row in rows {
            if row.status == "stopping" {
                let me = self.clone();
                tokio::spawn(async move { me.destroy(&row.id).await });
                continue;
            }
            if row.expires_at.is_some_and(|e| e <= now) {
                self.event(&row.id, "sandbox.expired", json!({}));
                let me = self.clone();
                tokio::spawn(async move { me.destroy(&row.id).await });
                continue;
            }
            if row.status != "running" {
                continue;
            }
            // The store says running: is it?
            let Ok(provider) = self.provider_named(&row.provider) else {
                continue;
            };
            match provider.inspect(&row.id).await {
                Ok(Some(o)) if o.alive => {
                    if let Err(e) = self.import_agent_events(&row).await {
                        tracing::debug!(sandbox = %row.id, error = %e, "agent events not imported");
                    }
                }
                Ok(found) => {
                    let reason = match found {
                        Some(_) => "its agent process is gone",
                        None => "vanished: the provider has no trace of it",
                    };
                    self.fail(&row.id, reason);
                    let me = self.clone();
                    tokio::spawn(async move { me.destroy(&row.id).await });
                }
                Err(e) => tracing::warn!(sandbox = %row.id, error = %e, "cannot inspect"),
            }
        }
        // Orphans past their grace period.
        let observed = self.observed().await;
        for (id, (o, _)) in observed {
            let known = self.store.sandbox(&id).ok().flatten();
            match known {
                Some(r) if r.status == "failed" || r.status == "stopped" => {
                    let me = self.clone();
                    tokio::spawn(async move { me.destroy(&id).await });
                }
                Some(_) => {}
                None => {
                    if now - o.created_at_ms >= self.config.orphan_grace_secs as i64 * 1000 {
                        self.reap_orphan(&id).await;
                    }
                }
            }
        }
    }
}
