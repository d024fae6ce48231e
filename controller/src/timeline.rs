//! One timeline per sandbox: the controller's own events and the agent's, in one
//! sequence-numbered, replayable stream kept in the store. Agent events are imported in order
//! with the agent sequence number they had, so the import resumes exactly where it stopped.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::store::SandboxRow;
use crate::util::now_ms;

const PAGE: usize = 1000;

/// Each sandbox's timeline: the controller's events and its agent's, imported in order.
pub struct Timeline {
    ctx: Arc<Ctx>,
}

impl Timeline {
    pub fn new(ctx: Arc<Ctx>) -> Timeline {
        Timeline { ctx }
    }

    /// Pulls the agent's events the store does not have yet.
    pub async fn import_agent_events(&self, row: &SandboxRow) -> Result<()> {
        let agent = self.ctx.agent(row)?;
        let mut from = self
            .ctx
            .store
            .sandbox(&row.id)?
            .map(|r| r.agent_event_seq)
            .unwrap_or(row.agent_event_seq);
        loop {
            let page = tokio::time::timeout(Duration::from_secs(5), agent.events(from))
                .await
                .map_err(|_| Error::Agent("the agent's event stream timed out".into()))?
                .map_err(|e| Error::Agent(format!("agent events: {e}")))?;
            if page.events.is_empty() {
                return Ok(());
            }
            let batch: Vec<(i64, String, Value)> = page
                .events
                .iter()
                .map(|e| {
                    let at = humantime::parse_rfc3339_weak(&e.at)
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map(|d| d.as_millis() as i64)
                        .unwrap_or_else(now_ms);
                    let mut data = e.data.clone();
                    data.insert("source".into(), "agent".into());
                    data.insert("agent_seq".into(), e.seq.into());
                    (at, e.kind.to_string(), Value::Object(data))
                })
                .collect();
            self.ctx
                .store
                .import_events(&row.id, &batch, page.next_seq)?;
            if page.next_seq <= from || page.events.len() < PAGE {
                return Ok(());
            }
            from = page.next_seq;
        }
    }

    /// `GET …/{id}/events?from_seq=`: brings the agent's part up to date when it can be
    /// reached, then answers from the store (so the timeline outlives the sandbox).
    pub async fn timeline(
        self: &Arc<Self>,
        id: &str,
        from_seq: u64,
        limit: usize,
    ) -> Result<Value> {
        let row = self.ctx.visible_row(id)?;
        if row.status == crate::lifecycle::SandboxStatus::Running
            && let Err(e) = self.import_agent_events(&row).await
        {
            tracing::debug!(sandbox = id, error = %e, "agent events not imported");
        }
        let events = self
            .ctx
            .store
            .events(id, from_seq, limit.clamp(1, 10_000))?;
        let next_seq = events
            .last()
            .and_then(|e| e["seq"].as_u64())
            .map(|s| s + 1)
            .unwrap_or(from_seq);
        Ok(serde_json::json!({"events": events, "next_seq": next_seq}))
    }
}
