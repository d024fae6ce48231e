//! Runs: commands started through the agent's background exec with the run id as the command
//! id, so starting is idempotent and the agent's own record (which survives a controller
//! restart) says how a run ended. The store keeps each run and, once it ends, its output.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_protocol::controller::{Command, Run, RunRequest};
use berth_protocol::events::EventKind;
use berth_protocol::sync::Locked;
use berth_protocol::{AgentClient, ClientError, CommandState, ExecRequest, OutputChunk, Stream};
use serde_json::{Value, json};

use crate::artifact::Artifacts;
use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::lifecycle::{RunStatus, SandboxStatus};
use crate::store::{RunRow, SandboxRow, StreamSpan};
use crate::util::{new_id, now_ms, valid_id};

/// One agent call of the run machinery.
const AGENT_CALL: Duration = Duration::from_secs(15);
/// How long a start waits in the agent for a run the caller waits on to end: a short command
/// ends inside it and is recorded from that one answer (its end and its output) instead of a
/// long-poll, a command query and output pages. A longer one is recorded running this much
/// later, and followed as before.
const START_YIELD: Duration = Duration::from_millis(250);
/// A pending run the agent has no record of is delivered again this long after it was made
/// (well inside the agent's command TTL, so an ended command is never started again).
const REDELIVER_WITHIN_MS: i64 = 3600 * 1000;

/// Runs: commands started in sandboxes, recorded in the store with their output, followed to
/// their end.
pub struct Runs {
    ctx: Arc<Ctx>,
    artifacts: Arc<Artifacts>,
    /// Runs (sandbox id, run id) whose start is waiting in the agent for their end: that
    /// answer records their end, so the agent's exit event need not.
    yielding: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
}

/// Takes a run out of [`Runs::yielding`] when its start ends, however it ends.
struct Yielding<'a> {
    runs: &'a Runs,
    key: (String, String),
}

impl Drop for Yielding<'_> {
    fn drop(&mut self) {
        self.runs.yielding.locked().remove(&self.key);
    }
}

impl Runs {
    pub fn new(ctx: Arc<Ctx>, artifacts: Arc<Artifacts>) -> Runs {
        Runs {
            ctx,
            artifacts,
            yielding: Default::default(),
        }
    }

    /// Whether the run's start is waiting in the agent for its end (which it then records).
    pub fn is_yielding(&self, sandbox_id: &str, run_id: &str) -> bool {
        self.yielding
            .locked()
            .contains(&(sandbox_id.to_string(), run_id.to_string()))
    }

    /// `POST …/{id}/exec`.
    pub async fn exec(self: &Arc<Self>, sandbox_id: &str, req: RunRequest) -> Result<Run> {
        let (row, agent) = self.ctx.running_agent(sandbox_id)?;
        let run_id = match &req.run_id {
            Some(id) if !valid_id(id) => {
                return Err(Error::BadRequest(format!(
                    "run_id {id:?}: use 1-128 letters, digits, '.', '_' or '-', not starting with '.'"
                )));
            }
            Some(id) => id.clone(),
            None => new_id("run"),
        };
        let (exec, command) = agent_request(&req, &run_id)?;
        let fresh = RunRow {
            sandbox_id: row.id.clone(),
            id: run_id.clone(),
            status: RunStatus::Pending,
            command,
            timeout_ms: req.timeout_ms,
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            output: None,
            truncated: false,
            created_at: now_ms(),
            started_at: None,
            ended_at: None,
            unreachable_since: None,
            error: None,
            // Written (sealed) before the agent is called: a controller that stops before the
            // agent answers delivers it on restart, under the same id, so it runs once.
            start_request: Some(
                serde_json::to_string(&exec).map_err(|e| Error::Internal(e.to_string()))?,
            ),
            output_artifact: None,
            output_streams: None,
            output_preview: None,
        };
        let (run, new) = self.ctx.store.insert_run(&fresh)?;
        let wait = req.wait.unwrap_or(true);
        if new {
            let me = self.clone();
            let r = run.clone();
            let yield_for = wait.then_some(START_YIELD);
            // Its own task: the agent call and its record complete even if the caller leaves.
            tokio::spawn(async move { me.start_run(&agent, &r, &exec, yield_for).await })
                .await
                .map_err(|e| Error::Internal(format!("exec task: {e}")))??;
            if !req.secrets.is_empty() {
                let names: Vec<&String> = req.secrets.keys().collect();
                self.ctx.event(
                    &row.id,
                    EventKind::SecretsInjected,
                    json!({"run_id": run_id, "names": names}),
                );
            }
        }
        self.ctx.follow(&row.id);
        if wait {
            let bound = Duration::from_secs(self.ctx.config.exec_wait_secs);
            let me = self.clone();
            let (sid, rid) = (row.id.clone(), run_id.clone());
            tokio::spawn(async move { me.wait_run(&sid, &rid, bound).await })
                .await
                .map_err(|e| Error::Internal(format!("wait task: {e}")))??;
        }
        self.run(&row.id, &run_id)
    }

    /// Delivers a run's start to the agent. With `yield_for`, the agent answers once the
    /// command ended or that passed; a run that ended in it is recorded from the answer.
    async fn start_run(
        &self,
        agent: &AgentClient,
        run: &RunRow,
        exec: &ExecRequest,
        yield_for: Option<Duration>,
    ) -> Result<()> {
        let call = ExecRequest {
            yield_ms: yield_for.map(|d| d.as_millis() as u64),
            ..exec.clone()
        };
        let _yielding = yield_for.map(|_| {
            let key = (run.sandbox_id.clone(), run.id.clone());
            self.yielding.locked().insert(key.clone());
            Yielding { runs: self, key }
        });
        let started = tokio::time::timeout(AGENT_CALL, agent.exec_background(&call)).await;
        match started {
            Ok(Ok(answer)) => self.started(run, answer),
            Ok(Err(e)) if e.status().is_some_and(|s| (400..500).contains(&s)) => {
                self.end_run(
                    run,
                    RunStatus::Failed,
                    None,
                    None,
                    Some(format!("the agent refused it: {e}")),
                )?;
                Err(Error::BadRequest(format!(
                    "the agent refused the command: {e}"
                )))
            }
            // The agent answered that it could not start it, or was never reached.
            Ok(Err(e)) if e.status().is_some() || e.never_sent() => {
                let reason = format!("the agent could not start it: {e}");
                self.end_run(run, RunStatus::Failed, None, None, Some(reason.clone()))?;
                Ok(())
            }
            // The answer was lost after the request went out (a reset connection, a body cut
            // short): the agent starts what it accepted whatever its client does, so this is
            // the timeout's case, not a failure.
            Ok(Err(e)) => {
                tracing::warn!(run = %run.id, error = %e, "no answer to the run's start; the reconciler checks it");
                Ok(())
            }
            Err(_) => {
                // The agent may have started it; the reconciler finds out by id.
                tracing::warn!(run = %run.id, "starting the run timed out; the reconciler checks it");
                Ok(())
            }
        }
    }

    /// Records the agent's answer to a run's start: running, or started and ended in one
    /// record when the answer holds the whole run.
    fn started(&self, run: &RunRow, answer: berth_protocol::BackgroundStarted) -> Result<()> {
        self.ctx.event(
            &run.sandbox_id,
            EventKind::RunStarted,
            json!({"run_id": run.id, "command": run.command}),
        );
        match ended_within(answer, self.inline_bytes()) {
            Some((exit_code, chunks)) => {
                let fetched = Fetched {
                    chunks,
                    ..Fetched::default()
                };
                let started = RunRow {
                    started_at: Some(now_ms()),
                    ..run.clone()
                };
                self.end_run(
                    &started,
                    RunStatus::Exited,
                    Some(exit_code),
                    Some(fetched),
                    None,
                )?;
            }
            None => {
                self.ctx
                    .store
                    .run_started(&run.sandbox_id, &run.id, now_ms())?;
            }
        }
        Ok(())
    }

    pub fn run(&self, sandbox_id: &str, run_id: &str) -> Result<Run> {
        self.ctx.visible_row(sandbox_id)?;
        self.ctx
            .store
            .run(sandbox_id, run_id)?
            .map(|r| r.to_wire())
            .ok_or_else(|| Error::NotFound(format!("no run {run_id} in sandbox {sandbox_id}")))
    }

    /// Waits until the run ends or `bound` passes; finishing it when it ended.
    async fn wait_run(&self, sandbox_id: &str, run_id: &str, bound: Duration) -> Result<()> {
        let deadline = Instant::now() + bound;
        let row = self.ctx.get_row(sandbox_id)?;
        let agent = self.ctx.agent(&row)?;
        let mut seq = 0;
        loop {
            let Some(run) = self.ctx.store.run(sandbox_id, run_id)? else {
                return Ok(());
            };
            if run.done() || Instant::now() >= deadline {
                return Ok(());
            }
            if run.status == RunStatus::Pending {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            // A long-poll: answers at new output or the end.
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left.min(AGENT_CALL), agent.output_wait(run_id, seq)).await {
                Ok(Ok(page)) => {
                    seq = page.next_seq;
                    if page.done {
                        self.check_run(&row, &run, false).await?;
                    }
                }
                Ok(Err(_)) => {
                    self.check_run(&row, &run, false).await?;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(_) => {}
            }
        }
    }

    /// Asks the agent about a run and records its end when it ended. `adopting`: the
    /// reconciler is asking; an end is reported as adopted then, and whenever the run was made
    /// before this controller started.
    pub async fn check_run(
        &self,
        sandbox: &SandboxRow,
        run: &RunRow,
        adopting: bool,
    ) -> Result<()> {
        let agent = match self.ctx.agent(sandbox) {
            Ok(a) if sandbox.status == SandboxStatus::Running => a,
            _ => {
                let why = format!(
                    "its sandbox is {}{}",
                    sandbox.status,
                    sandbox
                        .error
                        .as_ref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                );
                return self
                    .end_run(run, RunStatus::Lost, None, None, Some(why))
                    .map(|_| ());
            }
        };
        let adopting = adopting || run.created_at < self.ctx.started_ms;
        match tokio::time::timeout(AGENT_CALL, agent.command(&run.id)).await {
            Ok(Ok(info)) => self.agent_knows(&agent, run, &info, adopting).await,
            Ok(Err(e)) if e.status() == Some(404) => self.agent_forgot(&agent, run).await,
            Ok(Err(e)) => self.agent_unreachable(run, &e.to_string()),
            Err(_) => self.agent_unreachable(run, "timed out"),
        }
    }

    /// The agent answered about the run: it runs, or it ended and its end is recorded.
    async fn agent_knows(
        &self,
        agent: &AgentClient,
        run: &RunRow,
        info: &berth_protocol::CommandInfo,
        adopting: bool,
    ) -> Result<()> {
        self.ctx
            .store
            .run_unreachable(&run.sandbox_id, &run.id, None)?;
        if run.status == RunStatus::Pending {
            self.ctx
                .store
                .run_started(&run.sandbox_id, &run.id, now_ms())?;
        }
        let status = match info.state {
            CommandState::Running => return Ok(()),
            CommandState::Lost => RunStatus::Lost,
            CommandState::Exited => RunStatus::Exited,
        };
        let fetched = self.fetch_output(agent, run).await?;
        let error = (status == RunStatus::Lost)
            .then(|| "the agent lost track of the command's end".to_string());
        let wrote = self.end_run(run, status, info.exit_code, Some(fetched), error)?;
        if wrote && adopting {
            self.ctx.metrics.run_adopted();
            self.ctx.event(
                &run.sandbox_id,
                EventKind::RunAdopted,
                json!({"run_id": run.id, "exit_code": info.exit_code}),
            );
        }
        Ok(())
    }

    /// The agent has no record of the run: its start is delivered again while that is safe,
    /// else the run ends failed (never started) or lost.
    async fn agent_forgot(&self, agent: &AgentClient, run: &RunRow) -> Result<()> {
        let request = run
            .start_request
            .as_deref()
            .and_then(|q| serde_json::from_str::<ExecRequest>(q).ok());
        let why = match (run.status, request) {
            // Its start never reached the agent, or is still on the way: deliver it.
            // The agent keys commands by the run id (a start it is still creating is
            // the same command), so a second delivery never runs it twice.
            (RunStatus::Pending, Some(req)) if now_ms() - run.created_at < REDELIVER_WITHIN_MS => {
                tracing::info!(run = %run.id, "delivering a run the agent has no record of");
                return match self.start_run(agent, run, &req, None).await {
                    Err(Error::BadRequest(_)) => Ok(()), // recorded as failed
                    other => other,
                };
            }
            (RunStatus::Pending, _) => (
                RunStatus::Failed,
                "never started: the controller stopped before the agent had it, \
                 and its request is no longer kept",
            ),
            _ => (RunStatus::Lost, "the agent no longer has a record of it"),
        };
        self.end_run(run, why.0, None, None, Some(why.1.into()))
            .map(|_| ())
    }

    /// The agent could not be asked (`e`): the run ends failed once that has lasted
    /// `run_lost_after_secs`.
    fn agent_unreachable(&self, run: &RunRow, e: &str) -> Result<()> {
        let since = run.unreachable_since.unwrap_or_else(now_ms);
        self.ctx
            .store
            .run_unreachable(&run.sandbox_id, &run.id, Some(since))?;
        if now_ms() - since < self.ctx.config.run_lost_after_secs as i64 * 1000 {
            return Ok(());
        }
        let why = format!(
            "the agent stayed unreachable for {} s: {e}",
            self.ctx.config.run_lost_after_secs
        );
        self.end_run(run, RunStatus::Failed, None, None, Some(why))
            .map(|_| ())
    }

    /// The whole combined output. Up to `run_output_inline_bytes` it is kept in the run's
    /// record; past it the record keeps a preview of that size and the whole output (up to
    /// `artifact_max_file_bytes`) is published as the run's `output` artifact.
    async fn fetch_output(&self, agent: &AgentClient, run: &RunRow) -> Result<Fetched> {
        let id = run.id.as_str();
        let inline = self.inline_bytes();
        let max = self.ctx.config.artifact_max_file_bytes;
        let mut out = Fetched::default();
        let mut seq = 0;
        let mut bytes = 0u64;
        // Once past the inline bound: the artifact being written and the stream spans.
        let mut spill: Option<(std::path::PathBuf, std::fs::File)> = None;
        // The artifact reached `artifact_max_file_bytes`: the rest is not kept.
        let mut full = false;
        // The part of the chunk that crossed the bound that the preview keeps.
        let mut preview_tail: Option<OutputChunk> = None;
        // The output's size and last bytes, for its preview.
        let mut end = berth_protocol::OutputEnd::default();
        loop {
            let page = tokio::time::timeout(AGENT_CALL, agent.output(id, seq))
                .await
                .map_err(|_| Error::Agent("reading the run's output timed out".into()))?
                .map_err(|e: ClientError| Error::Agent(format!("reading the run's output: {e}")))?;
            let empty = page.chunks.is_empty();
            if page.truncated_before_seq.is_some() {
                out.truncated = true;
            }
            for c in page.chunks {
                let data = c.bytes();
                let len = data.len() as u64;
                if spill.is_none() && bytes + len > inline as u64 {
                    spill = Some(self.spill(&mut out)?);
                    // The preview ends with as much of this chunk as fits.
                    let room = (inline as u64).saturating_sub(bytes) as usize;
                    let head = utf8_prefix(&data, room);
                    if !head.is_empty() {
                        preview_tail = Some(chunk_of(c.seq, c.stream, head));
                    }
                }
                match &mut spill {
                    None => {
                        end.push(&data);
                        out.chunks.push(c);
                    }
                    Some((_, f)) => {
                        if bytes + len > max {
                            out.truncated = true;
                            full = true;
                            break;
                        }
                        write_all(f, &data)?;
                        end.push(&data);
                        span(&mut out.spans, c.seq, bytes, len, c.stream);
                    }
                }
                bytes += len;
            }
            if empty || full || page.next_seq == seq {
                break;
            }
            seq = page.next_seq;
        }
        if let Some((path, f)) = spill {
            f.sync_all()
                .map_err(|e| Error::Internal(format!("run output: {e}")))?;
            drop(f);
            out.chunks.extend(preview_tail);
            let first: Vec<u8> = out.chunks.iter().flat_map(|c| c.bytes()).collect();
            out.preview = Some(berth_protocol::OutputPreview::of(
                &first, &end.last, end.total,
            ));
            out.artifact = Some(self.publish_output(run, &path).await?);
        }
        Ok(out)
    }

    /// How much of a run's output its record keeps inline.
    fn inline_bytes(&self) -> usize {
        self.ctx
            .config
            .run_output_inline_bytes
            .min(self.ctx.config.max_stored_output_bytes)
    }

    /// Starts the output's artifact in a scratch file: the chunks kept so far (the preview)
    /// are its first bytes, with their spans.
    fn spill(&self, out: &mut Fetched) -> Result<(std::path::PathBuf, std::fs::File)> {
        let path = self.artifacts.artifact_scratch()?;
        let mut f = std::fs::File::create(&path)
            .map_err(|e| Error::Internal(format!("run output: {e}")))?;
        let mut off = 0;
        for p in &out.chunks {
            let b = p.bytes();
            write_all(&mut f, &b)?;
            span(&mut out.spans, p.seq, off, b.len() as u64, p.stream);
            off += b.len() as u64;
        }
        Ok((path, f))
    }

    /// Publishes a run's whole output (`path`) as its `output` artifact; its id.
    async fn publish_output(&self, run: &RunRow, path: &std::path::Path) -> Result<String> {
        let a = self
            .artifacts
            .publish_file(
                &run.sandbox_id,
                Some(&run.id),
                &format!("{}.log", run.id),
                "text/plain; charset=utf-8",
                crate::artifact::ArtifactKind::Output,
                Some(&run.id),
                path,
            )
            .await?;
        Ok(a.id)
    }

    /// Records a run's end once; true for the caller that wrote it.
    fn end_run(
        &self,
        run: &RunRow,
        status: RunStatus,
        exit_code: Option<i32>,
        output: Option<Fetched>,
        error: Option<String>,
    ) -> Result<bool> {
        let Fetched {
            chunks,
            truncated,
            artifact,
            spans,
            preview,
        } = output.unwrap_or_default();
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        for c in &chunks {
            match c.stream {
                Stream::Stderr => stderr.extend(c.bytes()),
                _ => stdout.extend(c.bytes()),
            }
        }
        let done = RunRow {
            status,
            exit_code,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            output: Some(serde_json::to_value(&chunks).unwrap_or(Value::Null)),
            truncated,
            output_streams: artifact.is_some().then_some(spans),
            output_preview: preview,
            output_artifact: artifact,
            ended_at: Some(now_ms()),
            started_at: run.started_at.or(Some(now_ms())),
            error: error.clone(),
            ..run.clone()
        };
        let wrote = self.ctx.store.finish_run(&done)?;
        if wrote && status != RunStatus::Exited {
            self.ctx.event(
                &run.sandbox_id,
                EventKind::RunFailed,
                json!({"run_id": run.id, "status": status, "reason": error}),
            );
        }
        Ok(wrote)
    }

    /// `GET …/runs/{run_id}/output?from_seq=`: the agent's chunks while it has them, the
    /// stored ones after.
    pub async fn run_output(&self, sandbox_id: &str, run_id: &str, from_seq: u64) -> Result<Value> {
        let row = self.ctx.visible_row(sandbox_id)?;
        let run =
            self.ctx.store.run(sandbox_id, run_id)?.ok_or_else(|| {
                Error::NotFound(format!("no run {run_id} in sandbox {sandbox_id}"))
            })?;
        if row.status == SandboxStatus::Running
            && let Ok(agent) = self.ctx.agent(&row)
            && let Ok(Ok(page)) =
                tokio::time::timeout(AGENT_CALL, agent.output(run_id, from_seq)).await
        {
            return Ok(serde_json::to_value(page).unwrap_or_default());
        }
        if let (Some(art), Some(spans)) = (&run.output_artifact, &run.output_streams)
            && self.ctx.store.artifact(art)?.is_some()
        {
            let (chunks, next) = self.artifact_chunks(art, spans, from_seq).await?;
            return Ok(json!({"chunks": chunks, "next_seq": next, "done": run.done()}));
        }
        let chunks: Vec<OutputChunk> = run
            .output
            .as_ref()
            .and_then(|o| serde_json::from_value(o.clone()).ok())
            .unwrap_or_default();
        let mut next = from_seq;
        let mut out = Vec::new();
        for c in chunks {
            let len = c.bytes().len() as u64;
            if c.seq + len > from_seq {
                next = c.seq + len;
                out.push(c);
            }
        }
        Ok(json!({"chunks": out, "next_seq": next, "done": run.done()}))
    }

    /// One reconcile pass over the runs in flight: a `run.reconciling` heartbeat each, then the
    /// agent's record decides.
    pub async fn reconcile_runs(self: &Arc<Self>) {
        let runs = match self.ctx.store.runs_in_flight() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot list runs in flight");
                return;
            }
        };
        self.ctx.metrics.set_runs_reconciling(runs.len() as u64);
        for run in runs {
            let Ok(Some(sandbox)) = self.ctx.store.sandbox(&run.sandbox_id) else {
                continue;
            };
            self.ctx.event(
                &run.sandbox_id,
                EventKind::RunReconciling,
                json!({"run_id": run.id, "status": run.status}),
            );
            if let Err(e) = self.check_run(&sandbox, &run, true).await {
                tracing::warn!(run = %run.id, error = %e, "reconciling a run");
            }
            if sandbox.status == SandboxStatus::Running {
                self.ctx.follow(&sandbox.id);
            }
        }
    }
}

/// What `fetch_output` read: the chunks kept in the record (all of them, or the preview when
/// an artifact holds the whole output) and the artifact's stream spans.
#[derive(Default)]
struct Fetched {
    chunks: Vec<OutputChunk>,
    truncated: bool,
    artifact: Option<String>,
    spans: Vec<StreamSpan>,
    /// With the artifact: the whole output's first and last lines and its size.
    preview: Option<berth_protocol::OutputPreview>,
}

/// The agent's background command for a run (`id` its run id) and the command as the run's
/// record shows it; refused (400) when the command or an environment name is empty or bad.
/// Secrets join the environment of this run only.
fn agent_request(req: &RunRequest, run_id: &str) -> Result<(ExecRequest, Value)> {
    let (argv, shell) = match (&req.command, req.shell) {
        (Command::Argv(a), Some(true)) => (None, Some(shell_join(a))),
        (Command::Argv(a), _) => (Some(a.clone()), None),
        (Command::Line(l), Some(false)) => (Some(vec![l.clone()]), None),
        (Command::Line(l), _) => (None, Some(l.clone())),
    };
    if argv
        .as_ref()
        .is_some_and(|a| a.is_empty() || a[0].is_empty())
        || shell.as_ref().is_some_and(|s| s.trim().is_empty())
    {
        return Err(Error::BadRequest("command is empty".into()));
    }
    for k in req.env.keys().chain(req.secrets.keys()) {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(Error::BadRequest(format!(
                "environment name {k:?} is not valid"
            )));
        }
    }
    let command = match (&argv, &shell) {
        (Some(a), _) => json!({"argv": a}),
        (_, Some(s)) => json!({"shell": s}),
        _ => Value::Null,
    };
    let mut env = req.env.clone();
    env.extend(req.secrets.clone());
    let exec = ExecRequest {
        argv,
        shell,
        cwd: req.cwd.clone(),
        user: req.user.clone(),
        env: (!env.is_empty()).then_some(env),
        timeout_ms: req.timeout_ms,
        background: Some(true),
        id: Some(run_id.to_string()),
        ..Default::default()
    };
    Ok((exec, command))
}

/// A start's answer that holds the whole run: it exited (not lost) within the wait, the page
/// reaches the end of its output, nothing was cut before it, and the output fits the record
/// inline. Its exit code and output; `None` sends the run the long way.
fn ended_within(
    answer: berth_protocol::BackgroundStarted,
    inline: usize,
) -> Option<(i32, Vec<OutputChunk>)> {
    if answer.done != Some(true) || answer.truncated_before_seq.is_some() {
        return None;
    }
    let exit_code = answer.exit_code?;
    let chunks = answer.chunks?;
    let bytes: usize = chunks.iter().map(|c| c.bytes().len()).sum();
    (bytes <= inline).then_some((exit_code, chunks))
}

/// Adds `len` bytes of `stream` from `seq` at `offset`, joined to the last span when they
/// follow on from it.
fn span(spans: &mut Vec<StreamSpan>, seq: u64, offset: u64, len: u64, stream: Stream) {
    if len == 0 {
        return;
    }
    if let Some(last) = spans.last_mut()
        && last.stream == stream
        && last.seq + last.len == seq
        && last.offset + last.len == offset
    {
        last.len += len;
        return;
    }
    spans.push(StreamSpan {
        seq,
        offset,
        len,
        stream,
    });
}

fn write_all(f: &mut std::fs::File, data: &[u8]) -> Result<()> {
    use std::io::Write;
    f.write_all(data)
        .map_err(|e| Error::Internal(format!("run output: {e}")))
}

/// The most a page of output read back from an artifact holds.
const ARTIFACT_PAGE: u64 = 1 << 20;

/// At most `n` bytes of `data`, not ending inside a UTF-8 character when it is text.
fn utf8_prefix(data: &[u8], n: usize) -> &[u8] {
    let mut end = n.min(data.len());
    if std::str::from_utf8(data).is_ok() {
        while end > 0 && end < data.len() && (data[end] & 0xC0) == 0x80 {
            end -= 1;
        }
    }
    &data[..end]
}

/// Bytes as an output chunk: text when UTF-8, else base64.
fn chunk_of(seq: u64, stream: Stream, data: &[u8]) -> OutputChunk {
    match std::str::from_utf8(data) {
        Ok(t) => OutputChunk {
            seq,
            stream,
            data: Some(t.to_string()),
            data_b64: None,
        },
        Err(_) => {
            use base64::Engine;
            OutputChunk {
                seq,
                stream,
                data: None,
                data_b64: Some(base64::engine::general_purpose::STANDARD.encode(data)),
            }
        }
    }
}

/// Which bytes of the artifact a page from `from_seq` reads: `(seq, offset, len, stream)`
/// per span, at most `limit` bytes in all.
fn spans_from(spans: &[StreamSpan], from_seq: u64, limit: u64) -> Vec<(u64, u64, u64, Stream)> {
    let mut out = Vec::new();
    let mut left = limit;
    for s in spans {
        if left == 0 {
            break;
        }
        if s.seq + s.len <= from_seq {
            continue;
        }
        let skip = from_seq.saturating_sub(s.seq);
        let len = (s.len - skip).min(left);
        out.push((s.seq + skip, s.offset + skip, len, s.stream));
        left -= len;
    }
    out
}

impl Runs {
    /// A page of a run's output read back from its output artifact.
    async fn artifact_chunks(
        &self,
        artifact: &str,
        spans: &[StreamSpan],
        from_seq: u64,
    ) -> Result<(Vec<OutputChunk>, u64)> {
        use futures_util::StreamExt;
        let mut chunks = Vec::new();
        let mut next = from_seq;
        for (seq, offset, len, stream) in spans_from(spans, from_seq, ARTIFACT_PAGE) {
            let (mut body, _) = self
                .artifacts
                .blobs
                .open(artifact, Some((offset, offset + len - 1)))
                .await
                .map_err(|e| Error::Internal(format!("artifact {artifact}: {e}")))?;
            let mut data = Vec::with_capacity(len as usize);
            while let Some(b) = body.next().await {
                data.extend(b.map_err(|e| Error::Internal(format!("artifact {artifact}: {e}")))?);
            }
            // A page does not end inside a UTF-8 character (the next one starts there).
            let mut take = data.len();
            if let Err(e) = std::str::from_utf8(&data)
                && e.error_len().is_none()
                && e.valid_up_to() > 0
            {
                take = e.valid_up_to();
            }
            chunks.push(chunk_of(seq, stream, &data[..take]));
            next = seq + take as u64;
            if take < data.len() {
                break;
            }
        }
        Ok((chunks, next))
    }
}

/// An argv as one `sh -c` line, each word quoted.
fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_start_that_holds_the_whole_ended_run_records_it() {
        let chunk = |seq: u64, text: &str| OutputChunk {
            seq,
            stream: Stream::Stdout,
            data: Some(text.into()),
            data_b64: None,
        };
        let ended = berth_protocol::BackgroundStarted {
            id: "run_1".into(),
            chunks: Some(vec![chunk(0, "hi\n"), chunk(3, "there\n")]),
            next_seq: Some(9),
            done: Some(true),
            exit_code: Some(3),
            truncated_before_seq: None,
        };
        let (code, chunks) = ended_within(ended.clone(), 9).expect("recorded from the answer");
        assert_eq!((code, chunks.len()), (3, 2));
        // Output past what the record keeps inline: the long way (an artifact).
        assert_eq!(ended_within(ended.clone(), 8), None);
        let with = |f: &dyn Fn(&mut berth_protocol::BackgroundStarted)| {
            let mut a = ended.clone();
            f(&mut a);
            ended_within(a, 1 << 20)
        };
        // Still running at the end of the wait; a start without a wait.
        assert_eq!(with(&|a| a.done = Some(false)), None);
        assert_eq!(with(&|a| a.done = None), None);
        // Lost (ended without an exit record): the agent's record says how, the long way.
        assert_eq!(with(&|a| a.exit_code = None), None);
        // The cap dropped its beginning: the long way keeps the truncation.
        assert_eq!(with(&|a| a.truncated_before_seq = Some(4)), None);
        assert_eq!(with(&|a| a.chunks = None), None);
    }

    #[test]
    fn a_run_request_becomes_the_agents_background_command_or_a_clear_400() {
        let req = |command: Command, shell: Option<bool>| RunRequest {
            command,
            shell,
            env: [("A".to_string(), "1".to_string())].into(),
            secrets: [("TOKEN".to_string(), "s".to_string())].into(),
            ..Default::default()
        };
        let argv = Command::Argv(vec!["echo".into(), "a b".into()]);
        let (exec, shown) = agent_request(&req(argv.clone(), None), "r1").unwrap();
        assert_eq!(exec.argv, Some(vec!["echo".to_string(), "a b".to_string()]));
        assert_eq!(exec.id.as_deref(), Some("r1"));
        assert_eq!(exec.background, Some(true));
        let env = exec.env.unwrap();
        assert_eq!((env["A"].as_str(), env["TOKEN"].as_str()), ("1", "s"));
        assert_eq!(shown, json!({"argv": ["echo", "a b"]}));
        // The record shows the command, never the secrets.
        assert!(!shown.to_string().contains("TOKEN"));
        let (exec, shown) = agent_request(&req(argv, Some(true)), "r2").unwrap();
        assert_eq!(
            (exec.argv, exec.shell.as_deref()),
            (None, Some("'echo' 'a b'"))
        );
        assert_eq!(shown, json!({"shell": "'echo' 'a b'"}));
        for bad in [
            req(Command::Argv(vec![]), None),
            req(Command::Line("  ".into()), None),
            RunRequest {
                env: [("A=B".to_string(), String::new())].into(),
                ..req(Command::Line("true".into()), None)
            },
        ] {
            assert!(matches!(
                agent_request(&bad, "r"),
                Err(Error::BadRequest(_))
            ));
        }
    }

    #[test]
    fn spans_join_what_follows_on_and_pages_cut_them() {
        let mut spans = Vec::new();
        span(&mut spans, 0, 0, 10, Stream::Stdout);
        span(&mut spans, 10, 10, 5, Stream::Stdout);
        span(&mut spans, 15, 15, 5, Stream::Stderr);
        span(&mut spans, 20, 20, 0, Stream::Stdout);
        span(&mut spans, 20, 20, 30, Stream::Stdout);
        assert_eq!(spans.len(), 3);
        assert_eq!((spans[0].len, spans[2].seq, spans[2].len), (15, 20, 30));
        assert_eq!(
            spans_from(&spans, 0, 100),
            [
                (0, 0, 15, Stream::Stdout),
                (15, 15, 5, Stream::Stderr),
                (20, 20, 30, Stream::Stdout)
            ]
        );
        assert_eq!(
            spans_from(&spans, 12, 10),
            [
                (12, 12, 3, Stream::Stdout),
                (15, 15, 5, Stream::Stderr),
                (20, 20, 2, Stream::Stdout)
            ]
        );
        assert!(spans_from(&spans, 50, 10).is_empty());
        assert_eq!(utf8_prefix("aé".as_bytes(), 2), b"a");
        assert_eq!(utf8_prefix(b"abc", 2), b"ab");
        assert_eq!(utf8_prefix(b"abc", 9), b"abc");
        let c = chunk_of(3, Stream::Stdout, &[0xff, 0x00]);
        assert_eq!(c.bytes(), [0xff, 0x00]);
        assert!(c.data.is_none());
    }
}
