//! Foreground commands: run by the agent itself, answered when they end.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use berth_protocol::sync::Locked;
use berth_protocol::{OutputEnd, Stream};
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::record::{self, ExitRecord, ProcInfo, StdinMode};
use super::spawn::{self, SpawnFailure};
use super::{
    Command, CommandTable, DEFAULT_FOREGROUND_TIMEOUT, ExecError, FOREGROUND_KEEP, Foreground,
    ForegroundOutcome, Prepared, new_id, shim,
};
use crate::reaper::Exit;

/// What a program the agent ran for its own use printed.
pub struct ToolOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub timed_out: bool,
}

impl CommandTable {
    /// Runs `program` as the sandbox user, in their home and environment, for the agent's own
    /// use (reading the desktop's settings): not a command of the table — no record, no
    /// events. Answers what it printed on stdout (at most `limit` bytes kept); its group is
    /// killed when `timeout` passes, and what it printed until then is answered.
    pub async fn output_of(
        &self,
        program: Vec<String>,
        timeout: std::time::Duration,
        limit: usize,
    ) -> Result<Vec<u8>, ExecError> {
        Ok(self
            .tool_output(program, None, timeout, limit)
            .await?
            .stdout)
    }

    /// [`Self::output_of`] with `stdin` written to the program, answering its stderr (at most
    /// 16 KiB) and whether it timed out as well.
    pub async fn tool_output(
        &self,
        program: Vec<String>,
        stdin: Option<Vec<u8>>,
        timeout: std::time::Duration,
        limit: usize,
    ) -> Result<ToolOutput, ExecError> {
        let p = self.for_sandbox(program, None)?;
        spawn::precheck(&p.program, &p.cwd).map_err(ExecError::Spawn)?;
        let mut cmd = spawn::command(&p.launch()).map_err(ExecError::Spawn)?;
        cmd.stdin(match stdin {
            Some(_) => std::process::Stdio::piped(),
            None => std::process::Stdio::null(),
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| ExecError::Spawn(SpawnFailure::from_io(&e, &p.program[0])))?;
        let pid = child.id();
        let mut exited = self.reaper.watch(pid);
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        if let (Some(data), Some(pipe)) = (stdin, child.stdin.take()) {
            tokio::spawn(async move {
                if let Ok(mut tx) = tokio::net::unix::pipe::Sender::from_owned_fd(pipe.into()) {
                    let _ = tx.write_all(&data).await;
                }
            });
        }
        drop(child);
        let deadline = tokio::time::Instant::now() + timeout;
        let grace = deadline + shim::DRAIN_GRACE;
        let (stdout, stderr, timed_out) = tokio::join!(
            // Past the deadline the group is killed and the pipes close; a descendant that
            // left the group and holds them gets a moment more.
            async {
                tokio::time::timeout_at(grace, read_pipe(stdout.map(Into::into), limit))
                    .await
                    .unwrap_or_default()
            },
            async {
                tokio::time::timeout_at(grace, read_pipe(stderr.map(Into::into), 16 << 10))
                    .await
                    .unwrap_or_default()
            },
            async {
                if tokio::time::timeout_at(deadline, &mut exited)
                    .await
                    .is_err()
                {
                    crate::proc::signal_group(pid, Signal::SIGKILL);
                    let _ = exited.await;
                    true
                } else {
                    false
                }
            }
        );
        Ok(ToolOutput {
            stdout,
            stderr,
            timed_out,
        })
    }

    /// Runs a command to completion in the agent itself and collects its output.
    pub async fn run_foreground(
        &self,
        p: Prepared,
        fg: Foreground,
    ) -> Result<ForegroundOutcome, ExecError> {
        let id = new_id();
        spawn::precheck(&p.program, &p.cwd).map_err(ExecError::Spawn)?;
        let stdin_mode = if fg.stdin.is_some() {
            StdinMode::Pipe
        } else {
            StdinMode::Null
        };
        let timeout = fg.timeout.unwrap_or(DEFAULT_FOREGROUND_TIMEOUT);
        let meta = self.new_meta(&id, &p, stdin_mode, fg.merge_stderr, Some(timeout), false);

        let (mut child, merged_read, started) =
            spawn_foreground(&p, fg.stdin.is_some(), fg.merge_stderr)?;
        let pid = child.id();
        let exited = self.reaper.watch(pid);

        // No directory and no file on the way in: a foreground command's output stays in
        // memory until it grows (then it spills to its directory) and its record goes to the
        // foreground store when it ends. A later agent that finds neither calls it lost.
        let dir = self.cfg.commands_dir.join(&id);
        let info = ProcInfo {
            supervisor_pid: std::process::id(),
            supervisor_start: self.agent_start,
            pid,
        };
        let command = Arc::new(Command::foreground(dir.clone(), meta));
        *command.proc.locked() = Some(info);
        self.insert(command.clone());
        self.started_event(&command);

        let readers = spawn_readers(&command, &mut child, merged_read);
        if let (Some(data), Some(stdin)) = (fg.stdin, child.stdin.take()) {
            tokio::spawn(async move {
                if let Ok(mut tx) = tokio::net::unix::pipe::Sender::from_owned_fd(stdin.into()) {
                    let _ = tx.write_all(&data).await;
                }
            });
        }
        drop(child);

        let (exit, timed_out) = wait_or_kill(pid, exited, timeout).await?;
        let out = collect_output(readers).await;
        self.finish_foreground(&id, &dir, &command, exit, timed_out);
        self.emit_exit(&command);
        command.bump();
        Ok(ForegroundOutcome {
            id,
            exit,
            timed_out,
            stdout: out.stdout,
            stderr: out.stderr,
            truncated: out.truncated,
            duration: started.elapsed(),
            stdout_end: out.stdout_end,
            stderr_end: out.stderr_end,
        })
    }

    /// Records how a foreground command ended: in its directory when its output spilled
    /// there, otherwise in the foreground store (unless it was deleted while it ran).
    fn finish_foreground(
        &self,
        id: &str,
        dir: &Path,
        command: &Command,
        exit: Exit,
        timed_out: bool,
    ) {
        // A spilled log's writer is closed (a record lives for a day, its descriptors must
        // not) after reading whether it failed.
        let spilled = command.writer.locked().take().map(|mut w| {
            let error = w.error.clone();
            w.close();
            error
        });
        let rec = ExitRecord {
            exit_code: exit.exit_code(),
            signal: exit.signal,
            timed_out,
            ended_at: crate::time::now_rfc3339(),
            output_error: spilled.clone().flatten(),
            reported: true,
        };
        let mut view = command.view();
        view.set_exit(rec.clone());
        match spilled {
            Some(_) => {
                if let Err(e) = record::write_json(dir, record::EXIT, &rec) {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot write an exit record");
                }
            }
            // Deleted while it ran: nothing to keep.
            None if self.get(id).is_none() => {}
            None => {
                let bytes = view.memory_bytes().unwrap_or_default();
                match self.store.put(&command.meta, &rec, bytes, view.index()) {
                    Ok((path, offset)) => view.moved_to_store(path, offset),
                    // Kept in memory until it expires; only a restart would lose it.
                    Err(e) => {
                        tracing::warn!(id = %id, error = %e, "cannot store a foreground record")
                    }
                }
            }
        }
    }
}

/// What one output reader hands back: its stream, the bytes kept for the answer, whether
/// more arrived than were kept, and the stream's size and last bytes.
type ReaderResult = (Stream, Vec<u8>, bool, OutputEnd);

/// Starts a foreground command in a new session with its stdin and output pipes; answers the
/// child, the read end of the merged stdout+stderr pipe when they are merged, and when it
/// started.
fn spawn_foreground(
    p: &Prepared,
    has_stdin: bool,
    merge_stderr: bool,
) -> Result<(std::process::Child, Option<OwnedFd>, Instant), ExecError> {
    let mut cmd = spawn::command(&p.launch()).map_err(ExecError::Spawn)?;
    cmd.stdin(if has_stdin {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    });
    let merged_read = if merge_stderr {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| ExecError::Internal(e.to_string()))?;
        let w2 = w.try_clone()?;
        cmd.stdout(w).stderr(w2);
        Some(r)
    } else {
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        None
    };
    let started = Instant::now();
    let child = cmd
        .spawn()
        .map_err(|e| ExecError::Spawn(SpawnFailure::from_io(&e, &p.program[0])))?;
    drop(cmd);
    Ok((child, merged_read, started))
}

/// Starts one reader task per output pipe. Readers keep up to FOREGROUND_KEEP bytes of each
/// stream for the answer; everything goes to the log.
fn spawn_readers(
    command: &Arc<Command>,
    child: &mut std::process::Child,
    merged_read: Option<OwnedFd>,
) -> Vec<tokio::task::JoinHandle<ReaderResult>> {
    let mut readers = Vec::new();
    let mut sources: Vec<(OwnedFd, Stream)> = Vec::new();
    if let Some(r) = merged_read {
        sources.push((r, Stream::Stdout));
    } else {
        if let Some(o) = child.stdout.take() {
            sources.push((o.into(), Stream::Stdout));
        }
        if let Some(e) = child.stderr.take() {
            sources.push((e.into(), Stream::Stderr));
        }
    }
    for (fd, stream) in sources {
        readers.push(tokio::spawn(read_stream(command.clone(), fd, stream)));
    }
    readers
}

/// Copies one output pipe into the command's log until end-of-file, keeping the first
/// FOREGROUND_KEEP bytes.
async fn read_stream(c: Arc<Command>, fd: OwnedFd, stream: Stream) -> ReaderResult {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut end = OutputEnd::default();
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return (stream, kept, truncated, end);
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                c.append(stream, &buf[..n]);
                end.push(&buf[..n]);
                let room = FOREGROUND_KEEP.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                truncated |= n > room;
            }
        }
    }
    (stream, kept, truncated, end)
}

/// Waits for the command to exit; past `timeout` kills its group and waits for that. Answers
/// the exit and whether it timed out.
async fn wait_or_kill(
    pid: u32,
    mut exited: tokio::sync::oneshot::Receiver<Exit>,
    timeout: std::time::Duration,
) -> Result<(Exit, bool), ExecError> {
    let mut timed_out = false;
    let lost = || ExecError::Internal("child status lost".into());
    let exit = tokio::select! {
        r = &mut exited => r.map_err(|_| lost())?,
        _ = tokio::time::sleep(timeout) => {
            timed_out = true;
            crate::proc::signal_group(pid, Signal::SIGKILL);
            exited.await.map_err(|_| lost())?
        }
    };
    Ok((exit, timed_out))
}

/// What the readers kept of both streams.
#[derive(Default)]
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
    stdout_end: OutputEnd,
    stderr_end: OutputEnd,
}

/// Gathers what the readers kept: stdout, stderr, whether either was cut short, and their ends.
async fn collect_output(readers: Vec<tokio::task::JoinHandle<ReaderResult>>) -> Collected {
    // Give the pipes a moment to drain; a process left holding them does not stall us.
    let deadline = tokio::time::Instant::now() + shim::DRAIN_GRACE;
    let mut c = Collected::default();
    for r in readers {
        let abort = r.abort_handle();
        match tokio::time::timeout_at(deadline, r).await {
            Ok(Ok((stream, kept, t, end))) => {
                c.truncated |= t;
                match stream {
                    Stream::Stdout => (c.stdout, c.stdout_end) = (kept, end),
                    Stream::Stderr => (c.stderr, c.stderr_end) = (kept, end),
                }
            }
            _ => abort.abort(),
        }
    }
    c
}

/// What a pipe delivers until it closes, at most `limit` bytes kept.
async fn read_pipe(pipe: Option<OwnedFd>, limit: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let Some(out) = pipe else {
        return kept;
    };
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(out) else {
        return kept;
    };
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = rx.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = limit.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    kept
}
