//! What the session view's panes show beside the desktop, terminal and files: the browser's
//! tabs, the repositories' changes, the runs and the workspace. Live from the sandbox's agent
//! while it runs; afterwards from what the controller kept when it ended (a record: the last
//! tabs with the active one's picture and the last diff, as artifacts of the sandbox; the runs
//! and the sandbox's own row are kept anyway).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use berth_protocol::AgentClient;
use berth_protocol::workspace::{BrowserTabs, DiffQuery, FileDiff, GitRepos};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::artifact::Artifacts;
use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::store::{ArtifactKind, RunRow, SandboxRow};
use crate::util::rfc3339;

/// One read of a pane from the agent.
const LOOK: Duration = Duration::from_secs(15);
/// The record's artifact names (and sources).
pub const RECORD: &str = "session-record.json";
pub const RECORD_TAB: &str = "session-record-tab.jpg";
/// The lines of a run's output a pane shows before the rest is asked for.
pub const TAIL_LINES: usize = 20;
/// The most commands started on the agent directly a pane lists (the newest).
const MAX_AGENT_COMMANDS: usize = 50;
/// The most file diffs a record keeps (each bounded by the agent).
const RECORD_DIFFS: usize = 200;

/// What the controller keeps of the panes when a sandbox ends.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Record {
    pub taken_at: String,
    pub tabs: BrowserTabs,
    pub repos: GitRepos,
    /// `repo` + `\n` + `path` → its diff.
    pub diffs: BTreeMap<String, FileDiff>,
    /// `repo` + `\n` + `path` → the artifact (by name) holding a huge diff whole, read by
    /// range as the live one is.
    #[serde(default)]
    pub huge: BTreeMap<String, String>,
}

fn diff_key(repo: &str, path: &str) -> String {
    format!("{repo}\n{path}")
}

/// The last lines of `text`, at most `n` (pure).
pub fn tail(text: &str, n: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// The lines of a run's output the pane shows from its start.
pub const HEAD_LINES: usize = 5;
/// How much of a large output's end is read for its last lines.
const TAIL_BYTES: u64 = 16 << 10;

/// The whole lines of a chunk read from the middle of an output: the first, cut, is dropped.
fn whole_lines(chunk: &[u8]) -> String {
    let text = String::from_utf8_lossy(chunk);
    match text.split_once('\n') {
        Some((_, rest)) => rest.to_string(),
        None => text.into_owned(),
    }
}

/// A run's command as one line: its shell line, or its argv joined (pure).
pub fn command_line(command: &Value) -> String {
    match command {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string())
            })
            .collect::<Vec<_>>()
            .join(" "),
        Value::Object(m) => m
            .get("shell")
            .or_else(|| m.get("line"))
            .or_else(|| m.get("argv"))
            .map(command_line)
            .unwrap_or_else(|| command.to_string()),
        other => other.to_string(),
    }
}

/// A run as the agents pane lists it (pure): its first and last lines and its size, the
/// whole output fetched on demand. `whole`: the output artifact's size and its end, when the
/// output passed the inline bound.
pub fn run_entry(r: &RunRow, whole: Option<(u64, Vec<u8>)>) -> Value {
    let inline = format!("{}{}", r.stdout, r.stderr);
    let (bytes, end) = match &whole {
        Some((size, end)) => (*size, whole_lines(end)),
        None => (inline.len() as u64, inline.clone()),
    };
    let head: Vec<String> = inline
        .lines()
        .take(HEAD_LINES)
        .map(str::to_string)
        .collect();
    json!({
        "id": r.id,
        "command": command_line(&r.command),
        "status": r.status,
        "started_at": r.started_at.map(rfc3339),
        "ended_at": r.ended_at.map(rfc3339),
        "exit_code": r.exit_code,
        "started_by": "api",
        "head": head,
        "tail": tail(&end, TAIL_LINES),
        "bytes": bytes,
        "preview": whole.is_some() || inline.lines().count() > TAIL_LINES,
    })
}

pub struct Panes {
    ctx: Arc<Ctx>,
    artifacts: Arc<Artifacts>,
}

impl Panes {
    pub fn new(ctx: Arc<Ctx>, artifacts: Arc<Artifacts>) -> Panes {
        Panes { ctx, artifacts }
    }

    /// The sandbox's running agent, or `None` when its panes come from the record.
    fn live_agent(&self, row: &SandboxRow) -> Option<berth_protocol::AgentClient> {
        (row.status == crate::lifecycle::SandboxStatus::Running)
            .then(|| self.ctx.agent(row).ok())
            .flatten()
    }

    fn record_artifact(&self, id: &str, name: &str) -> Result<Option<crate::store::ArtifactRow>> {
        Ok(self
            .artifacts
            .artifacts(Some(id), None)?
            .into_iter()
            .filter(|a| a.name == name)
            .max_by_key(|a| a.created_at))
    }

    /// The kept record, if the sandbox ended with one.
    pub async fn record(&self, id: &str) -> Result<Option<Record>> {
        let Some(a) = self.record_artifact(id, RECORD)? else {
            return Ok(None);
        };
        let bytes = self.artifacts.read_all(&a.id).await?;
        Ok(serde_json::from_slice(&bytes).ok())
    }

    pub async fn browser(&self, id: &str) -> Result<Value> {
        let row = self.ctx.visible_row(id)?;
        if let Some(agent) = self.live_agent(&row) {
            return Ok(
                match tokio::time::timeout(LOOK, agent.browser_tabs()).await {
                    Ok(Ok(t)) => {
                        json!({"record": false, "taken_at": null, "tabs": t.tabs, "error": null})
                    }
                    Ok(Err(e)) => json!({"record": false, "tabs": [], "error": e.to_string()}),
                    Err(_) => {
                        json!({"record": false, "tabs": [], "error": "the browser did not answer"})
                    }
                },
            );
        }
        let r = self.record(id).await?.unwrap_or_default();
        Ok(json!({"record": true, "taken_at": r.taken_at, "tabs": r.tabs.tabs, "error": null}))
    }

    /// The active tab's picture: live, or the one kept.
    pub async fn browser_screenshot(&self, id: &str, tab: &str) -> Result<Vec<u8>> {
        let row = self.ctx.visible_row(id)?;
        if let Some(agent) = self.live_agent(&row) {
            return tokio::time::timeout(
                LOOK,
                agent.browser_tab_screenshot(tab, Some(&crate::control::key(&self.ctx, id))),
            )
            .await
            .map_err(|_| Error::Agent("the browser did not answer".into()))?
            .map_err(|e| match e.status() {
                Some(404) => Error::NotFound(format!("no tab {tab}")),
                _ => Error::Agent(e.to_string()),
            });
        }
        let a = self
            .record_artifact(id, RECORD_TAB)?
            .ok_or_else(|| Error::NotFound("no picture of the browser was kept".into()))?;
        self.artifacts.read_all(&a.id).await
    }

    pub async fn diff(&self, id: &str) -> Result<Value> {
        let row = self.ctx.visible_row(id)?;
        if let Some(agent) = self.live_agent(&row) {
            let repos = tokio::time::timeout(LOOK, agent.git_repos())
                .await
                .map_err(|_| Error::Agent("reading the repositories timed out".into()))?
                .map_err(|e| Error::Agent(e.to_string()))?;
            return Ok(
                json!({"record": false, "taken_at": null, "root": repos.root, "repos": repos.repos}),
            );
        }
        let r = self.record(id).await?.unwrap_or_default();
        Ok(
            json!({"record": true, "taken_at": r.taken_at, "root": r.repos.root, "repos": r.repos.repos}),
        )
    }

    /// One file's diff, live or kept; `q.offset` reads a part of a huge one.
    pub async fn diff_file(&self, id: &str, q: &DiffQuery) -> Result<FileDiff> {
        let row = self.ctx.visible_row(id)?;
        if let Some(agent) = self.live_agent(&row) {
            return tokio::time::timeout(LOOK, agent.git_diff(q))
                .await
                .map_err(|_| Error::Agent("reading the diff timed out".into()))?
                .map_err(|e| match e.status() {
                    Some(s @ 400..=499) => Error::BadRequest(format!("{s}: {e}")),
                    _ => Error::Agent(e.to_string()),
                });
        }
        let r = self.record(id).await?.unwrap_or_default();
        let key = diff_key(&q.repo, &q.path);
        let kept = r.diffs.get(&key).cloned().ok_or_else(|| {
            Error::NotFound(format!(
                "the record keeps no diff of {} in {}",
                q.path, q.repo
            ))
        })?;
        let Some(name) = r.huge.get(&key).filter(|_| q.offset.is_some()) else {
            return Ok(kept);
        };
        let a = self
            .record_artifact(id, name)?
            .ok_or_else(|| Error::NotFound(format!("the kept diff {name} is gone")))?;
        let text = self.artifacts.read_all(&a.id).await?;
        let blank = FileDiff {
            preview: None,
            diff: None,
            ..kept
        };
        blank
            .shown(&String::from_utf8_lossy(&text), q)
            .map_err(Error::BadRequest)
    }

    /// A huge diff read whole from the agent, part after part (as bounded as the agent's own
    /// read of it).
    async fn read_huge(agent: &AgentClient, d: &FileDiff) -> Option<String> {
        let mut text = String::new();
        while (text.len() as u64) < d.bytes {
            let q = DiffQuery {
                repo: d.repo.clone(),
                path: d.path.clone(),
                offset: Some(text.len() as u64),
                max_bytes: None,
            };
            let part = tokio::time::timeout(LOOK, agent.git_diff(&q))
                .await
                .ok()?
                .ok()?;
            match part.diff {
                Some(p) if !p.is_empty() => text.push_str(&p),
                _ => return None,
            }
        }
        Some(text)
    }

    pub async fn runs(&self, id: &str) -> Result<Value> {
        let row = self.ctx.visible_row(id)?;
        let mut runs = Vec::new();
        for r in self.ctx.store.runs_of(id)? {
            let whole = match r
                .output_artifact
                .as_deref()
                .map(|a| self.artifacts.artifact(a))
            {
                Some(Ok(a)) => {
                    let end = self.artifacts.read_tail(&a.id, a.size, TAIL_BYTES).await?;
                    Some((a.size, end))
                }
                _ => None,
            };
            runs.push(run_entry(&r, whole));
        }
        runs.extend(self.agent_commands(&row, &runs).await);
        Ok(json!({"record": !row.live(), "runs": runs}))
    }

    /// The commands started on the agent directly (its native API, not a run), newest last.
    async fn agent_commands(&self, row: &SandboxRow, runs: &[Value]) -> Vec<Value> {
        let Some(agent) = self.live_agent(row) else {
            return Vec::new();
        };
        let Ok(Ok(list)) = tokio::time::timeout(LOOK, agent.commands()).await else {
            return Vec::new();
        };
        let known: std::collections::HashSet<&str> =
            runs.iter().filter_map(|r| r["id"].as_str()).collect();
        let mut out: Vec<Value> = list
            .commands
            .iter()
            .filter(|c| !known.contains(c.id.as_str()))
            .map(|c| {
                let command = c
                    .shell
                    .clone()
                    .or_else(|| c.argv.as_ref().map(|a| a.join(" ")));
                json!({
                    "id": c.id,
                    "command": command.unwrap_or_default(),
                    "status": c.state,
                    "started_at": c.started_at,
                    "ended_at": c.ended_at,
                    "exit_code": c.exit_code,
                    "started_by": "agent",
                    "head": [],
                    "tail": [],
                    "bytes": c.output_bytes,
                    "preview": false,
                })
            })
            .collect();
        let skip = out.len().saturating_sub(MAX_AGENT_COMMANDS);
        out.drain(..skip);
        out
    }

    /// A run's whole output: its artifact (ranges honoured), or the output its record holds.
    pub async fn run_output(
        &self,
        id: &str,
        run_id: &str,
        headers: &axum::http::HeaderMap,
    ) -> Result<axum::response::Response> {
        use axum::response::IntoResponse;
        self.ctx.visible_row(id)?;
        let r = self
            .ctx
            .store
            .runs_of(id)?
            .into_iter()
            .find(|r| r.id == run_id)
            .ok_or_else(|| Error::NotFound(format!("sandbox {id} has no run {run_id}")))?;
        if let Some(a) = &r.output_artifact {
            return self.artifacts.artifact_response(a, headers).await;
        }
        Ok((
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; charset=utf-8",
            )],
            format!("{}{}", r.stdout, r.stderr),
        )
            .into_response())
    }

    /// The workspace: the sandbox's identity and what it carries.
    pub async fn workspace(
        &self,
        id: &str,
        wire: &berth_protocol::controller::Sandbox,
    ) -> Result<Value> {
        let row = self.ctx.visible_row(id)?;
        let lease = self.ctx.store.lease_for_sandbox(id)?.map(
            |l| json!({"id": l.id, "thread_id": l.thread_id, "expires_at": rfc3339(l.expires_at)}),
        );
        let secrets = self.secret_names(id)?;
        let repos = match self.diff(id).await {
            Ok(d) => d["repos"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|r| json!({"path": r["path"], "remote": r["remote"]}))
                        .collect()
                })
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        let egress = wire.egress.as_ref();
        Ok(json!({
            "record": !row.live(),
            "id": wire.id,
            "profile": wire.profile,
            "image_ref": wire.image_ref,
            "status": wire.status,
            "created_at": wire.created_at,
            "expires_at": wire.expires_at,
            "screen": wire.screen,
            "lease": lease,
            "labels": wire.labels,
            "workdir": self.diff(id).await.ok().and_then(|d| d["root"].as_str().map(str::to_string)),
            "repositories": repos,
            "cloned": egress.map(|e| e.repositories.clone()).unwrap_or_default(),
            "secrets": secrets,
            "credentials": egress.map(|e| e.credentials.clone()).unwrap_or_default(),
            "egress": egress.map(|e| &e.policy),
            "limits": wire.limits,
            "endpoints": wire.endpoints,
        }))
    }

    /// The names of the secrets runs were given (from the timeline; never values).
    fn secret_names(&self, id: &str) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .ctx
            .store
            .events(id, 0, 10_000)?
            .iter()
            .filter(|e| e["kind"] == "secrets.injected")
            .flat_map(|e| e["names"].as_array().cloned().unwrap_or_default())
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Keeps the record of a sandbox about to end (bounded by the caller's deadline).
    pub async fn keep(&self, row: &SandboxRow) {
        let Ok(agent) = self.ctx.agent(row) else {
            return;
        };
        let tabs = match tokio::time::timeout(LOOK, agent.browser_tabs()).await {
            Ok(Ok(t)) => t,
            _ => BrowserTabs::default(),
        };
        let repos = match tokio::time::timeout(LOOK, agent.git_repos()).await {
            Ok(Ok(r)) => r,
            _ => GitRepos::default(),
        };
        let (diffs, huge) = self.keep_diffs(row, &agent, &repos).await;
        if let Some(active) = tabs.tabs.iter().find(|t| t.active)
            && let Ok(Ok(jpeg)) = tokio::time::timeout(
                LOOK,
                agent.browser_tab_screenshot(
                    &active.id,
                    Some(&crate::control::key(&self.ctx, &row.id)),
                ),
            )
            .await
        {
            self.publish(row, RECORD_TAB, "image/jpeg", &jpeg).await;
        }
        if tabs.tabs.is_empty() && repos.repos.is_empty() {
            // Nothing to show later: no record.
            return;
        }
        let record = Record {
            taken_at: rfc3339(crate::util::now_ms()),
            tabs,
            repos,
            diffs,
            huge,
        };
        let bytes = serde_json::to_vec(&record).unwrap_or_default();
        self.publish(row, RECORD, "application/json", &bytes).await;
    }

    /// Every changed file's diff (up to [`RECORD_DIFFS`]); a huge one is kept whole as an
    /// artifact of its own, named in the second map.
    async fn keep_diffs(
        &self,
        row: &SandboxRow,
        agent: &AgentClient,
        repos: &GitRepos,
    ) -> (BTreeMap<String, FileDiff>, BTreeMap<String, String>) {
        let mut diffs = BTreeMap::new();
        let mut huge = BTreeMap::new();
        let mut files = Vec::new();
        for r in &repos.repos {
            files.extend(r.files.iter().map(|f| (r.path.clone(), f.path.clone())));
        }
        files.truncate(RECORD_DIFFS);
        for (repo, path) in files {
            let q = DiffQuery {
                repo,
                path,
                ..Default::default()
            };
            let Ok(Ok(d)) = tokio::time::timeout(LOOK, agent.git_diff(&q)).await else {
                continue;
            };
            let key = diff_key(&q.repo, &q.path);
            if d.huge
                && let Some(text) = Self::read_huge(agent, &d).await
            {
                let name = format!("session-record-diff-{}.patch", huge.len() + 1);
                self.publish(row, &name, "text/x-diff; charset=utf-8", text.as_bytes())
                    .await;
                huge.insert(key.clone(), name);
            }
            diffs.insert(key, d);
        }
        (diffs, huge)
    }

    async fn publish(&self, row: &SandboxRow, name: &str, ct: &str, bytes: &[u8]) {
        let done = async {
            let path = self.artifacts.artifact_scratch()?;
            tokio::fs::write(&path, bytes)
                .await
                .map_err(|e| Error::Internal(format!("{name}: {e}")))?;
            self.artifacts
                .publish_file(&row.id, None, name, ct, ArtifactKind::File, None, &path)
                .await
        };
        if let Err(e) = done.await {
            tracing::warn!(sandbox = %row.id, error = %e, "keeping {name}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_from_the_middle_keeps_whole_lines() {
        assert_eq!(whole_lines(b"45\n46\n47\n"), "46\n47\n");
        assert_eq!(tail(&whole_lines(b"5\n199999\n200000\n"), 1), ["200000"]);
    }

    #[test]
    fn commands_read_as_one_line() {
        assert_eq!(command_line(&json!({"shell": "seq 1 9"})), "seq 1 9");
        assert_eq!(command_line(&json!({"argv": ["ls", "-l"]})), "ls -l");
        assert_eq!(command_line(&json!("echo hi")), "echo hi");
    }

    #[test]
    fn the_tail_is_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), ["b", "c"]);
        assert_eq!(tail("a", 5), ["a"]);
        assert!(tail("", 3).is_empty());
    }
}
