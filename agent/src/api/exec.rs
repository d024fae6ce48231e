//! `/v1/exec` and `/v1/commands/…`.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use berth_protocol::{
    BackgroundStarted, CommandList, CommandState, ExecRequest, SignalRequest, StdinRequest,
};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use super::follow::{self, Batch, Followable};
use crate::Agent;
use crate::exec::{Background, Command, Foreground};
use crate::http::error::ApiError;
use crate::http::extract::ApiJson;

/// Output bytes one page carries by default, and at most.
const PAGE_BYTES: usize = 1 << 20;
const PAGE_BYTES_MAX: usize = 16 << 20;
/// Bytes per message on a followed stream.
const MESSAGE_BYTES: usize = 64 << 10;
const LONG_POLL_DEFAULT: Duration = Duration::from_secs(30);

pub async fn exec(
    State(agent): State<Arc<Agent>>,
    ApiJson(req): ApiJson<ExecRequest>,
) -> Result<Response, ApiError> {
    let background = req.background.unwrap_or(false);
    if !background {
        for (set, name) in [
            (req.id.is_some(), "id"),
            (req.yield_ms.is_some(), "yield_ms"),
            (req.stdin_open.is_some(), "stdin_open"),
        ] {
            if set {
                return Err(ApiError::bad_request(format!(
                    "`{name}` applies to background commands (\"background\": true)"
                )));
            }
        }
    }
    let prepared = agent.commands.prepare(
        req.argv,
        req.shell,
        req.cwd.as_deref(),
        req.env.as_ref(),
        req.user.as_deref(),
    )?;
    let timeout = req.timeout_ms.map(Duration::from_millis);
    if timeout.is_some_and(|t| t.is_zero()) {
        return Err(ApiError::bad_request("`timeout_ms` must be at least 1"));
    }
    let stdin = req.stdin.map(String::into_bytes);
    if !background {
        let out = agent
            .commands
            .run_foreground(
                prepared,
                Foreground {
                    stdin,
                    timeout,
                    merge_stderr: false,
                },
            )
            .await?;
        let body = out.into_result(berth_protocol::EXEC_INLINE_BYTES);
        return Ok(Json(body).into_response());
    }
    let (cmd, _) = agent
        .commands
        .start_background(
            prepared,
            Background {
                id: req.id,
                stdin,
                stdin_open: req.stdin_open.unwrap_or(false),
                timeout,
                merge_stderr: false,
            },
        )
        .await?;
    let body = match req.yield_ms {
        Some(ms) => yielded(&agent, &cmd, Duration::from_millis(ms)).await?,
        None => BackgroundStarted {
            id: cmd.id.clone(),
            chunks: None,
            next_seq: None,
            done: None,
            exit_code: None,
            truncated_before_seq: None,
        },
    };
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// A background start's answer after waiting up to `wait` for the command's end: its output so
/// far, and how it ended if it did.
async fn yielded(
    agent: &Agent,
    cmd: &Arc<crate::exec::Command>,
    wait: Duration,
) -> Result<BackgroundStarted, ApiError> {
    agent.commands.wait_done(cmd, wait).await;
    let page = cmd.page(0, PAGE_BYTES)?;
    if page.done {
        // Its end is on the timeline before a caller that learned it here goes on.
        agent.commands.ensure_reported(cmd);
    }
    Ok(BackgroundStarted {
        id: cmd.id.clone(),
        chunks: Some(page.chunks),
        next_seq: Some(page.next_seq),
        done: Some(page.done),
        exit_code: page.exit_code,
        truncated_before_seq: page.truncated_before_seq,
    })
}

pub async fn list(State(agent): State<Arc<Agent>>) -> Json<CommandList> {
    Json(CommandList {
        commands: agent.commands.list(),
    })
}

pub async fn get(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let cmd = agent.commands.require(&id)?;
    let info = cmd.info();
    if info.state != CommandState::Running {
        agent.commands.ensure_reported(&cmd);
    }
    Ok(Json(info).into_response())
}

#[derive(Deserialize)]
pub struct OutputQuery {
    #[serde(default)]
    from_seq: u64,
    #[serde(default)]
    follow: bool,
    max_bytes: Option<usize>,
    /// Long-poll: how long to wait for new output.
    timeout_ms: Option<u64>,
    /// Follow: how long one send may take before the follower counts as lagging.
    stall_ms: Option<u64>,
}

pub async fn output(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    q: Result<Query<OutputQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let cmd = agent.commands.require(&id)?;
    let end = cmd.info().output_bytes;
    if q.from_seq > end {
        return Err(ApiError::bad_request(format!(
            "from_seq {} is past the end of the output ({end})",
            q.from_seq
        )));
    }
    let max = q.max_bytes.unwrap_or(PAGE_BYTES).clamp(1, PAGE_BYTES_MAX);
    if !q.follow {
        let page = cmd.page(q.from_seq, max)?;
        if page.done {
            agent.commands.ensure_reported(&cmd);
        }
        return Ok(Json(page).into_response());
    }
    let stall = follow::stall(q.stall_ms);
    let src = Arc::new(OutputSource {
        table: agent.commands.clone(),
        cmd: cmd.clone(),
        first: std::sync::atomic::AtomicBool::new(true),
    });
    if let Ok(ws) = ws {
        let from = q.from_seq;
        return Ok(ws
            .on_upgrade(move |socket| follow::drive(src, from, follow::WsSink::new(socket), stall))
            .into_response());
    }
    if follow::wants_sse(&headers) {
        return Ok(follow::sse(src, q.from_seq, stall));
    }
    // Long-poll: answer as soon as there is something past from_seq, or the command ended.
    let wait = q
        .timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(LONG_POLL_DEFAULT);
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = cmd.subscribe();
    loop {
        changes.borrow_and_update();
        let page = cmd.page(q.from_seq, max)?;
        if page.done {
            agent.commands.ensure_reported(&cmd);
        }
        if !page.chunks.is_empty() || page.done || page.next_seq > q.from_seq {
            return Ok(Json(page).into_response());
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            return Ok(Json(page).into_response());
        }
    }
}

struct OutputSource {
    table: Arc<crate::exec::CommandTable>,
    cmd: Arc<Command>,
    first: std::sync::atomic::AtomicBool,
}

impl Followable for OutputSource {
    fn batch(&self, cursor: u64) -> Batch {
        let Ok(out) = self.cmd.read(cursor, MESSAGE_BYTES) else {
            return Batch {
                messages: Vec::new(),
                next: cursor,
                end: Some(json!({"error": "cannot read the output log"}).to_string()),
            };
        };
        let mut messages = Vec::new();
        if let Some(t) = out.truncated_before
            && self.first.swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            messages.push((t, json!({"truncated_before_seq": t}).to_string()));
        }
        for chunk in crate::exec::to_chunks(&out) {
            let seq = chunk.seq;
            messages.push((seq, serde_json::to_string(&chunk).unwrap_or_default()));
        }
        if out.done {
            self.table.ensure_reported(&self.cmd);
        }
        let end = out.done.then(|| match self.cmd.exit() {
            Some(e) => json!({"exit_code": e.exit_code}).to_string(),
            None => json!({"exit_code": null, "state": "lost"}).to_string(),
        });
        Batch {
            messages,
            next: out.next_seq,
            end,
        }
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.cmd.subscribe()
    }

    fn attach(&self) -> Option<Box<dyn Send>> {
        Some(Box::new(self.cmd.follower()))
    }

    fn lagged(&self) {
        self.cmd.note_lagged();
    }
}

pub async fn stdin(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<StdinRequest>,
) -> Result<Response, ApiError> {
    let cmd = agent.commands.require(&id)?;
    let data = match (req.data, req.data_b64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give either data or data_b64, not both",
            ));
        }
        (Some(d), None) => Some(d.into_bytes()),
        (None, Some(b)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| ApiError::bad_request(format!("invalid field `data_b64`: {e}")))?,
        ),
        (None, None) => None,
    };
    let eof = req.eof.unwrap_or(false);
    if data.is_none() && !eof {
        return Err(ApiError::bad_request(
            "give data, data_b64 or \"eof\": true",
        ));
    }
    let mut written = 0;
    if let Some(d) = data {
        agent.commands.write_stdin(&cmd, &d).await?;
        written = d.len();
    }
    if eof {
        agent.commands.close_stdin(&cmd)?;
    }
    Ok(Json(json!({"written": written, "eof": eof})).into_response())
}

pub async fn signal(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<SignalRequest>,
) -> Result<Response, ApiError> {
    let cmd = agent.commands.require(&id)?;
    let sig = crate::proc::parse_signal(&req.signal).ok_or_else(|| {
        ApiError::bad_request(format!(
            "invalid field `signal`: unknown signal {}",
            req.signal
        ))
    })?;
    agent.commands.signal(&cmd, sig)?;
    Ok(Json(json!({"signal": sig.as_str().trim_start_matches("SIG")})).into_response())
}

pub async fn delete(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    agent.commands.delete(&id).await?;
    Ok(Json(json!({"id": id, "deleted": true})).into_response())
}
