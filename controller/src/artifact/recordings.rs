//! Recordings become artifacts: the sandbox's follower (`crate::follow`) publishes each
//! recording as it stops (`recording.stopped`); when it starts (and so after a controller
//! restart) it publishes every stopped recording not yet published. Destroying a
//! sandbox stops its live recordings and publishes them first (`Episodes::keep_work_within`, the context's `KeepWork`).
//! Publishing is idempotent by (sandbox, agent recording id).

use std::time::Duration;

use berth_protocol::routes::{fill, native};
use berth_protocol::{AgentClient, RecordingInfo, RecordingState};

use super::ArtifactKind;
use super::Artifacts;
use super::publish::{agent_error, body_to_file};
use crate::error::{Error, Result};
use crate::store::{ArtifactRow, SandboxRow};

const AGENT_CALL: Duration = Duration::from_secs(15);

fn ms_of(rfc3339: &str) -> Option<i64> {
    humantime::parse_rfc3339_weak(rfc3339)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
}

/// The run a recording belongs to: the latest controller run in flight when it started.
pub fn run_at(runs: &[(String, Option<i64>, Option<i64>)], at_ms: i64) -> Option<String> {
    runs.iter()
        .filter(|(_, started, ended)| {
            started.is_some_and(|s| s <= at_ms) && ended.is_none_or(|e| e >= at_ms)
        })
        .max_by_key(|(_, started, _)| *started)
        .map(|(id, _, _)| id.clone())
}

impl Artifacts {
    /// Publishes every recording of the sandbox that has ended and is not published yet.
    pub(crate) async fn publish_stopped_recordings(
        &self,
        sandbox: &SandboxRow,
        agent: &AgentClient,
    ) {
        let list = match tokio::time::timeout(AGENT_CALL, agent.recordings()).await {
            Ok(Ok(l)) => l.recordings,
            _ => return,
        };
        for r in list {
            if r.state == RecordingState::Recording {
                continue;
            }
            if let Err(e) = self.publish_recording_info(sandbox, agent, &r).await {
                tracing::warn!(sandbox = %sandbox.id, recording = %r.id, error = %e,
                    "publishing a recording");
            }
        }
    }

    /// Stops the sandbox's live recordings, then publishes every ended one (the first step
    /// of `keep_work`).
    pub(crate) async fn keep_recordings(&self, sandbox: &SandboxRow) {
        let Ok(agent) = self.ctx.agent(sandbox) else {
            return;
        };
        let list = match tokio::time::timeout(AGENT_CALL, agent.recordings()).await {
            Ok(Ok(l)) => l.recordings,
            Ok(Err(e)) => {
                tracing::warn!(sandbox = %sandbox.id, error = %e, "listing recordings");
                return;
            }
            Err(_) => return,
        };
        for r in list.iter().filter(|r| r.state == RecordingState::Recording) {
            match tokio::time::timeout(AGENT_CALL, agent.stop_recording(&r.id)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(sandbox = %sandbox.id, recording = %r.id, error = %e,
                        "stopping a recording before the sandbox goes")
                }
                Err(_) => tracing::warn!(sandbox = %sandbox.id, recording = %r.id,
                    "stopping a recording timed out"),
            }
        }
        self.publish_stopped_recordings(sandbox, &agent).await;
    }

    /// Publishes one recording by its agent id (once it has ended).
    pub async fn publish_recording(
        &self,
        sandbox: &SandboxRow,
        agent: &AgentClient,
        recording_id: &str,
    ) -> Result<Option<ArtifactRow>> {
        if let Some(a) =
            self.ctx
                .store
                .artifact_from(&sandbox.id, ArtifactKind::Recording, recording_id)?
        {
            return Ok(Some(a));
        }
        let info = tokio::time::timeout(AGENT_CALL, agent.recording(recording_id))
            .await
            .map_err(|_| Error::Agent("asking for the recording timed out".into()))?
            .map_err(|e| agent_error(recording_id, e))?;
        self.publish_recording_info(sandbox, agent, &info).await
    }

    async fn publish_recording_info(
        &self,
        sandbox: &SandboxRow,
        agent: &AgentClient,
        info: &RecordingInfo,
    ) -> Result<Option<ArtifactRow>> {
        if info.state == RecordingState::Recording {
            return Ok(None);
        }
        let lock = self
            .source_locks
            .get(&format!("{}/recording/{}", sandbox.id, info.id));
        let _one = lock.lock().await;
        if let Some(a) =
            self.ctx
                .store
                .artifact_from(&sandbox.id, ArtifactKind::Recording, &info.id)?
        {
            return Ok(Some(a));
        }
        if info.bytes == 0 {
            // Ended before its first picture: nothing playable to keep.
            return Ok(None);
        }
        let scratch = self.artifact_scratch()?;
        let resp = tokio::time::timeout(
            AGENT_CALL,
            agent
                .request(
                    reqwest::Method::GET,
                    &fill(native::RECORDING_FILE, &[&info.id]),
                )
                .send(),
        )
        .await
        .map_err(|_| Error::Agent("downloading the recording timed out".into()))?
        .map_err(|e| Error::Agent(format!("downloading the recording: {e}")))?;
        let resp = berth_protocol::client::check(resp)
            .await
            .map_err(|e| agent_error(&info.id, e))?;
        if let Err(e) = body_to_file(resp, &scratch, self.ctx.config.artifact_max_file_bytes).await
        {
            let _ = std::fs::remove_file(&scratch);
            return Err(e);
        }
        let run = ms_of(&info.started_at).and_then(|at| {
            let runs: Vec<_> = self
                .ctx
                .store
                .runs_of(&sandbox.id)
                .ok()?
                .into_iter()
                .map(|r| (r.id, r.started_at, r.ended_at))
                .collect();
            run_at(&runs, at)
        });
        let name = format!("{}.mp4", info.id);
        self.publish_file(
            &sandbox.id,
            run.as_deref(),
            &name,
            "video/mp4",
            ArtifactKind::Recording,
            Some(&info.id),
            &scratch,
        )
        .await
        .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::run_at;

    #[test]
    fn a_recording_belongs_to_the_run_in_flight_when_it_started() {
        let runs = vec![
            ("early".to_string(), Some(100), Some(200)),
            ("open".to_string(), Some(150), None),
            ("late".to_string(), Some(500), Some(600)),
            ("never".to_string(), None, None),
        ];
        assert_eq!(run_at(&runs, 50), None);
        assert_eq!(run_at(&runs, 120).as_deref(), Some("early"));
        assert_eq!(
            run_at(&runs, 180).as_deref(),
            Some("open"),
            "the latest started"
        );
        assert_eq!(run_at(&runs, 300).as_deref(), Some("open"));
        assert_eq!(run_at(&runs, 550).as_deref(), Some("late"));
        assert_eq!(run_at(&[], 550), None);
    }
}
