//! Carrying out the reconciler's decisions ([`crate::reconcile::decide`]) about a sandbox, and
//! every destroy the controller starts: one tracked task per sandbox at a time, a bounded
//! number at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use berth_protocol::events::EventKind;
use berth_protocol::sync::Locked;
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use serde_json::json;
use tokio::sync::Semaphore;

use super::{Sandboxes, endpoint_update};
use crate::lifecycle::SandboxStatus;
use crate::provider::Endpoint;
use crate::reconcile::Action;

/// How many destroys run at once; more wait their turn.
pub const MAX_CONCURRENT_DESTROYS: usize = 16;

/// A destroy under way: completes when it has ended. Dropping it does not stop the destroy.
pub type Destroying = Shared<BoxFuture<'static, ()>>;

/// The destroys under way, one per sandbox, a bounded number at once.
pub struct Destroys {
    running: Mutex<HashMap<String, Destroying>>,
    permits: Arc<Semaphore>,
}

impl Default for Destroys {
    fn default() -> Destroys {
        Destroys {
            running: Default::default(),
            permits: Arc::new(Semaphore::new(MAX_CONCURRENT_DESTROYS)),
        }
    }
}

impl Destroys {
    /// Whether a destroy of `id` is under way.
    pub fn under_way(&self, id: &str) -> bool {
        self.running.locked().contains_key(id)
    }

    /// How many destroys are under way.
    pub fn count(&self) -> usize {
        self.running.locked().len()
    }
}

#[derive(Clone, Copy)]
enum Job {
    /// A stored sandbox: its row ends `stopped` (or keeps `failed`).
    Destroy,
    /// A provider sandbox the store does not know.
    Reap,
}

impl Sandboxes {
    /// Carries out a decision about sandbox `id`. A destroy it starts runs in its own tracked
    /// task; the answer is that destroy, for a caller that must wait for it.
    pub fn apply(self: &Arc<Self>, id: &str, action: &Action) -> Option<Destroying> {
        match action {
            Action::Nothing => None,
            Action::Adopt { endpoint } => {
                if let Some(ep) = endpoint {
                    self.record_endpoint(id, SandboxStatus::Running, ep);
                }
                self.ctx.event(id, EventKind::SandboxAdopted, json!({}));
                None
            }
            Action::Resume { endpoint } => {
                if let Some(ep) = endpoint {
                    self.record_endpoint(id, SandboxStatus::Starting, ep);
                }
                let me = self.clone();
                let id = id.to_string();
                tokio::spawn(async move {
                    let _ = me.await_ready(id).await;
                });
                None
            }
            Action::Fail { reason, destroy } => {
                self.fail(id, reason);
                destroy.then(|| self.destroy(id))
            }
            Action::Destroy { expired } => {
                if *expired && !self.destroys.under_way(id) {
                    self.ctx.event(id, EventKind::SandboxExpired, json!({}));
                }
                Some(self.destroy(id))
            }
            Action::Reap => Some(self.track(id, Job::Reap)),
        }
    }

    /// Records the endpoint a provider reports for `id`, keeping it at `status`.
    fn record_endpoint(&self, id: &str, status: SandboxStatus, ep: &Endpoint) {
        let _ = self.ctx.store.set_status(id, status, endpoint_update(ep));
    }

    /// Stops and removes a stored sandbox in its own task; the row ends `stopped` (or keeps
    /// `failed` with its reason). Answers the destroy under way (a second call while one runs
    /// joins it); await it to wait for the end, or drop it.
    pub fn destroy(self: &Arc<Self>, id: &str) -> Destroying {
        self.track(id, Job::Destroy)
    }

    fn track(self: &Arc<Self>, id: &str, job: Job) -> Destroying {
        let mut running = self.destroys.running.locked();
        if let Some(d) = running.get(id) {
            return d.clone();
        }
        let me = self.clone();
        let key = id.to_string();
        let task = tokio::spawn(async move {
            let permit = me.destroys.permits.clone().acquire_owned().await;
            match job {
                Job::Destroy => me.destroy_now(&key).await,
                Job::Reap => me.reap_orphan(&key).await,
            }
            drop(permit);
            me.destroys.running.locked().remove(&key);
        });
        let done: Destroying = async move {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "a destroy task ended abnormally");
            }
        }
        .boxed()
        .shared();
        running.insert(id.to_string(), done.clone());
        done
    }

    /// Destroys a provider sandbox the store does not know, wherever it runs.
    async fn reap_orphan(&self, id: &str) {
        for p in self.ctx.providers() {
            if let Ok(Some(_)) = p.inspect(id).await {
                tracing::warn!(
                    sandbox = id,
                    provider = p.name(),
                    "reaping a sandbox the store does not know"
                );
                match p.destroy(id).await {
                    Ok(()) => self.ctx.metrics.orphan_reaped(),
                    Err(e) => {
                        self.ctx.metrics.provider_error();
                        tracing::error!(sandbox = id, error = %e, "cannot reap an orphan");
                    }
                }
            }
        }
    }
}
