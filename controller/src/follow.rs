//! One follower per running sandbox on its agent's event stream (a long-poll on
//! `GET /v1/events`): a run that ends (`command.exited`) is recorded at once, not at the next
//! reconcile, and a recording that stops (`recording.stopped`) is published as an artifact.
//! When the follower starts, and whenever it has lost its place (the agent restarted or could
//! not be asked), it catches up first: every run in flight is checked and every stopped
//! recording not yet published is published, so nothing that happened meanwhile is missed.
//! It ends when the sandbox stops running; the reconciler starts it again on its next pass.

use std::sync::Arc;
use std::time::Duration;

use berth_protocol::AgentClient;
use berth_protocol::events::Event;
use berth_protocol::events::EventKind;
use berth_protocol::sync::Locked;
use serde_json::Value;

use crate::artifact::Artifacts;
use crate::ctx::{Ctx, Follow};
use crate::lifecycle::SandboxStatus;
use crate::reconcile::Action;
use crate::run::Runs;
use crate::sandbox::Sandboxes;
use crate::store::{RunRow, SandboxRow};

/// One agent call.
const AGENT_CALL: Duration = Duration::from_secs(15);
/// How long a long-poll on the agent's events waits.
const FOLLOW_POLL: Duration = Duration::from_secs(25);

/// The followers of running sandboxes' agent events.
pub struct Follower {
    ctx: Arc<Ctx>,
    sandboxes: Arc<Sandboxes>,
    runs: Arc<Runs>,
    artifacts: Arc<Artifacts>,
    /// Sandboxes whose agent's events a follower watches.
    followers: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Follow for Follower {
    fn follow(self: Arc<Self>, sandbox_id: &str) {
        Follower::follow(&self, sandbox_id);
    }
}

impl Follower {
    pub fn new(
        ctx: Arc<Ctx>,
        sandboxes: Arc<Sandboxes>,
        runs: Arc<Runs>,
        artifacts: Arc<Artifacts>,
    ) -> Follower {
        Follower {
            ctx,
            sandboxes,
            runs,
            artifacts,
            followers: Default::default(),
        }
    }

    /// Starts the follower of a sandbox unless one runs.
    pub fn follow(self: &Arc<Self>, sandbox_id: &str) {
        if !self.followers.locked().insert(sandbox_id.to_string()) {
            return;
        }
        let me = self.clone();
        let id = sandbox_id.to_string();
        tokio::spawn(async move {
            me.follow_loop(&id).await;
            me.followers.locked().remove(&id);
            // Running again while the follower was leaving (a recovery): followed again.
            if me
                .ctx
                .store
                .sandbox(&id)
                .ok()
                .flatten()
                .is_some_and(|s| s.status == SandboxStatus::Running)
            {
                me.follow(&id);
            }
        });
    }

    /// The runs in flight of a sandbox (none when the store cannot say).
    fn in_flight(&self, sandbox_id: &str) -> Vec<RunRow> {
        self.ctx
            .store
            .runs_in_flight()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.sandbox_id == sandbox_id)
            .collect()
    }

    async fn follow_loop(&self, sandbox_id: &str) {
        // None: the place must be found (at start, and after the agent could not be asked).
        let mut cursor: Option<u64> = None;
        loop {
            let Ok(Some(sandbox)) = self.ctx.store.sandbox(sandbox_id) else {
                return;
            };
            if sandbox.status != SandboxStatus::Running {
                // The reconciler settles its runs; the destroy keeps its recordings.
                return;
            }
            let Ok(agent) = self.ctx.agent(&sandbox) else {
                return;
            };
            let from = match cursor {
                Some(c) => c,
                None => match tokio::time::timeout(AGENT_CALL, agent.events(u64::MAX)).await {
                    // Where the agent's events end now; everything before it is caught up.
                    Ok(Ok(page)) => {
                        self.catch_up(&sandbox, &agent).await;
                        cursor = Some(page.next_seq);
                        continue;
                    }
                    _ => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                },
            };
            let page = tokio::time::timeout(
                FOLLOW_POLL + AGENT_CALL,
                agent.events_wait(from, FOLLOW_POLL),
            )
            .await;
            let page = match page {
                Ok(Ok(p)) if p.next_seq >= from => p,
                _ => {
                    // The agent restarted (its events begin again) or could not be asked.
                    cursor = None;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            for e in &page.events {
                self.on_agent_event(&sandbox, &agent, e).await;
            }
            cursor = Some(page.next_seq);
        }
    }

    /// Everything that may have happened while nobody followed.
    async fn catch_up(&self, sandbox: &SandboxRow, agent: &AgentClient) {
        for run in self.in_flight(&sandbox.id) {
            let _ = self.runs.check_run(sandbox, &run, false).await;
        }
        self.artifacts
            .publish_stopped_recordings(sandbox, agent)
            .await;
    }

    async fn on_agent_event(&self, sandbox: &SandboxRow, agent: &AgentClient, e: &Event) {
        if e.kind == EventKind::SandboxOomKill {
            // Its state is no longer what its user made it: it fails, and its work is kept.
            let reason = berth_protocol::controller::oom_killed_reason(
                e.data.get("limit_bytes").and_then(Value::as_u64),
            );
            self.sandboxes.apply(
                &sandbox.id,
                &Action::Fail {
                    reason,
                    destroy: true,
                },
            );
            return;
        }
        let Some(id) = e.data.get("id").and_then(Value::as_str) else {
            return;
        };
        match e.kind {
            // The runs are read now, not before the poll: a run started during it is found.
            // A run whose start is waiting for its end is recorded from that answer.
            EventKind::CommandExited if !self.runs.is_yielding(&sandbox.id, id) => {
                if let Some(run) = self.in_flight(&sandbox.id).iter().find(|r| r.id == id) {
                    let _ = self.runs.check_run(sandbox, run, false).await;
                }
            }
            EventKind::RecordingStopped => {
                if let Err(err) = self.artifacts.publish_recording(sandbox, agent, id).await {
                    tracing::warn!(sandbox = %sandbox.id, recording = id, error = %err,
                        "publishing a recording");
                }
            }
            _ => {}
        }
    }
}
