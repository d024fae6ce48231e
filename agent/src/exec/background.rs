//! Background commands: each under its own shim, so it outlives the agent; stdin, signals
//! and kills reach it through the shim and its process group.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use berth_protocol::sync::Locked;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::record::{self, Meta, ProcInfo, StdinMode};
use super::spawn::{self, SpawnFailure};
use super::{
    Background, Command, CommandTable, ExecError, Prepared, SHIM_HANDSHAKE_TIMEOUT,
    STDIN_WRITE_TIMEOUT, new_id, shim, validate_id,
};
use crate::reaper::Exit;

/// Ends an id's creation (even one whose task panicked): the id leaves `creating` only after
/// its command, if it started, is in the table.
struct CreationDone {
    table: Arc<CommandTable>,
    id: String,
    tx: tokio::sync::watch::Sender<bool>,
}

impl Drop for CreationDone {
    fn drop(&mut self) {
        self.table.creating.locked().remove(&self.id);
        let _ = self.tx.send(true);
    }
}

impl CommandTable {
    /// Starts a command under its own shim and answers once it is running (or failed to).
    pub async fn start_background(
        self: &Arc<Self>,
        p: Prepared,
        bg: Background,
    ) -> Result<(Arc<Command>, bool), ExecError> {
        let id = match &bg.id {
            Some(id) => {
                validate_id(id)?;
                id.clone()
            }
            None => new_id(),
        };
        loop {
            if let Some(existing) = self.get(&id) {
                return Ok((existing, false));
            }
            let in_flight = {
                let mut creating = self.creating.locked();
                match creating.get(&id) {
                    Some(rx) => Err(rx.clone()),
                    None => {
                        let (tx, rx) = tokio::sync::watch::channel(false);
                        creating.insert(id.clone(), rx);
                        Ok(tx)
                    }
                }
            };
            let tx = match in_flight {
                Ok(tx) => tx,
                Err(mut rx) => {
                    // Another request is creating this id: its outcome is this one's. A
                    // command it started is answered as existing; one it failed to start is
                    // tried again here.
                    let _ = rx.wait_for(|done| *done).await;
                    continue;
                }
            };
            // The creation is its own task: once the request is accepted, the command and its
            // record come to exist whatever the client does (a client that resets mid-request
            // cancels only its wait for the answer).
            let me = self.clone();
            let task = tokio::spawn(async move {
                let _done = CreationDone {
                    table: me.clone(),
                    id: id.clone(),
                    tx,
                };
                me.spawn_shim(&id, p, bg).await
            });
            return match task.await {
                Ok(r) => r.map(|c| (c, true)),
                Err(e) => Err(ExecError::Internal(format!("creating the command: {e}"))),
            };
        }
    }

    async fn spawn_shim(
        self: &Arc<Self>,
        id: &str,
        p: Prepared,
        bg: Background,
    ) -> Result<Arc<Command>, ExecError> {
        spawn::precheck(&p.program, &p.cwd).map_err(ExecError::Spawn)?;
        let dir = self.cfg.commands_dir.join(id);
        if dir.exists() {
            return Err(ExecError::Conflict(format!(
                "command '{id}' exists in the state dir"
            )));
        }
        self.spares.take(&dir)?;
        let wants_stdin = bg.stdin.is_some() || bg.stdin_open;
        let stdin_mode = if wants_stdin {
            StdinMode::Fifo
        } else {
            StdinMode::Null
        };
        let meta = self.new_meta(id, &p, stdin_mode, bg.merge_stderr, bg.timeout, true);
        write_shim_inputs(&dir, &meta, wants_stdin)?;
        // Watch before the shim starts so no write is missed.
        self.watch_dir(&dir);

        let hits_before = crate::limits::pids_hits();
        let (shim_pid, out, shim_exited) =
            match self.shims.take().and_then(|s| s.assign(&dir, &p.env)) {
                Some(a) => (a.pid, a.stdout, a.exited),
                None => {
                    let mut shim = self
                        .start_shim_process(&dir, &p)
                        .map_err(|e| e.or_limit(hits_before))?;
                    let shim_pid = shim.id();
                    let exited = self.reaper.watch(shim_pid);
                    (shim_pid, shim.stdout.take(), exited)
                }
            };
        let hs = match read_handshake(out).await {
            Some(hs) if hs.ok => hs,
            other => {
                return Err(self
                    .abandon_shim(shim_pid, &dir, other)
                    .or_limit(hits_before));
            }
        };
        let info = record::read_json::<ProcInfo>(&dir, record::PROC).unwrap_or(ProcInfo {
            supervisor_pid: shim_pid,
            supervisor_start: crate::proc::start_time(shim_pid).unwrap_or(0),
            pid: hs.pid.unwrap_or(0),
        });
        let command = Arc::new(Command::new(dir.clone(), meta));
        *command.proc.locked() = Some(info);
        command.stdin_open.store(wants_stdin, Ordering::SeqCst);
        self.insert(command.clone());
        self.started_event(&command);
        self.settle_when_shim_ends(&command, shim_exited);

        if let Some(data) = bg.stdin {
            self.write_stdin(&command, &data).await?;
            if !bg.stdin_open {
                self.close_stdin(&command)?;
            }
        }
        Ok(command)
    }

    /// Starts `berth-agent shim <dir>` (which makes a session of its own), its stderr going to
    /// `shim.log` and its stdout piped for the handshake.
    fn start_shim_process(
        &self,
        dir: &Path,
        p: &Prepared,
    ) -> Result<std::process::Child, ExecError> {
        let shim_log =
            std::fs::File::create(dir.join("shim.log")).map_err(|e| removing_dir(dir, e.into()))?;
        let mut cmd = std::process::Command::new(&self.cfg.agent_exe);
        cmd.arg("shim")
            .arg(dir)
            .env_clear()
            .envs(p.env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(shim_log);
        // The shim makes its own session (no closure between fork and exec: posix_spawn).
        let shim = cmd.spawn().map_err(|e| {
            removing_dir(
                dir,
                ExecError::Internal(format!("cannot start the shim: {e}")),
            )
        })?;
        drop(cmd);
        Ok(shim)
    }

    /// Kills a shim that did not report a running command, forgets its directory, and
    /// answers the error its handshake (or its silence) means.
    fn abandon_shim(
        &self,
        shim_pid: u32,
        dir: &Path,
        handshake: Option<shim::Handshake>,
    ) -> ExecError {
        crate::proc::signal_group(shim_pid, Signal::SIGKILL);
        self.unwatch_dir(dir);
        let _ = std::fs::remove_dir_all(dir);
        match handshake {
            Some(shim::Handshake {
                errno: Some(errno),
                subject: Some(subject),
                ..
            }) => ExecError::Spawn(SpawnFailure { errno, subject }),
            Some(hs) => ExecError::Internal(hs.message.unwrap_or_default()),
            None => ExecError::Internal("the shim did not report".into()),
        }
    }

    /// When the shim ends, the exit record is final (or missing: lost).
    fn settle_when_shim_ends(
        self: &Arc<Self>,
        command: &Arc<Command>,
        shim_exited: tokio::sync::oneshot::Receiver<Exit>,
    ) {
        let t = Arc::downgrade(self);
        let c = command.clone();
        tokio::spawn(async move {
            let _ = shim_exited.await;
            if let Some(t) = t.upgrade() {
                t.refresh(&c);
                if c.exit().is_none() {
                    t.lose(&c);
                }
            }
        });
    }

    pub async fn write_stdin(&self, cmd: &Command, data: &[u8]) -> Result<(), ExecError> {
        if !cmd.stdin_open.load(Ordering::SeqCst) {
            return Err(ExecError::Conflict(format!(
                "stdin of command '{}' is not open (start it with \"stdin\" or \"stdin_open\")",
                cmd.id
            )));
        }
        if !cmd.is_running() {
            return Err(ExecError::Conflict(format!(
                "command '{}' is not running",
                cmd.id
            )));
        }
        let _guard = cmd.stdin_lock.lock().await;
        let path = cmd.dir.join(record::STDIN);
        let write = async {
            let mut tx = tokio::net::unix::pipe::OpenOptions::new().open_sender(&path)?;
            tx.write_all(data).await
        };
        match tokio::time::timeout(STDIN_WRITE_TIMEOUT, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ExecError::Conflict(format!(
                "cannot write to the stdin of '{}': {e}",
                cmd.id
            ))),
            Err(_) => Err(ExecError::Conflict(format!(
                "the command '{}' did not read its stdin within {}s",
                cmd.id,
                STDIN_WRITE_TIMEOUT.as_secs()
            ))),
        }
    }

    pub fn close_stdin(&self, cmd: &Command) -> Result<(), ExecError> {
        if !cmd.stdin_open.swap(false, Ordering::SeqCst) {
            return Err(ExecError::Conflict(format!(
                "stdin of command '{}' is not open",
                cmd.id
            )));
        }
        let _ = std::fs::write(cmd.dir.join(record::STDIN_CLOSED), b"");
        if let Some(p) = cmd.proc_info()
            && cmd.supervisor_alive()
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.supervisor_pid as i32),
                Signal::SIGUSR1,
            );
        }
        Ok(())
    }

    /// Signals the command's process group.
    pub fn signal(&self, cmd: &Command, sig: Signal) -> Result<(), ExecError> {
        if !cmd.is_running() {
            return Err(ExecError::Conflict(format!(
                "command '{}' is not running",
                cmd.id
            )));
        }
        let Some(p) = cmd.proc_info() else {
            return Err(ExecError::Conflict(format!(
                "command '{}' has no process",
                cmd.id
            )));
        };
        crate::proc::signal_group(p.pid, sig);
        Ok(())
    }

    /// Kills a command's whole tree (including daemons it left under its shim) and waits
    /// (bounded) for its end to be recorded.
    pub async fn kill(&self, cmd: &Command) {
        let shim_alive = cmd.meta.background && cmd.supervisor_alive();
        if !cmd.is_running() && !shim_alive {
            return;
        }
        if let Some(p) = cmd.proc_info() {
            if cmd.meta.background {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.supervisor_pid as i32),
                    Signal::SIGTERM,
                );
            } else {
                crate::proc::signal_group(p.pid, Signal::SIGKILL);
            }
        }
        self.wait_done(cmd, Duration::from_secs(5)).await;
        // The shim writes into the record until it exits; deleting before that would race it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while cmd.meta.background
            && cmd.supervisor_alive()
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Kills (if running) and deletes a command and its record.
    pub async fn delete(&self, id: &str) -> Result<(), ExecError> {
        let cmd = self.require(id)?;
        self.kill(&cmd).await;
        self.forget(&cmd);
        Ok(())
    }
}

/// Removes a command directory whose creation failed, passing the error on.
fn removing_dir(dir: &Path, e: ExecError) -> ExecError {
    let _ = std::fs::remove_dir_all(dir);
    e
}

/// Writes what the shim reads on start: `meta.json`, and the stdin FIFO when the command
/// takes stdin. On failure the directory is removed.
fn write_shim_inputs(dir: &Path, meta: &Meta, wants_stdin: bool) -> Result<(), ExecError> {
    record::write_json(dir, record::META, meta).map_err(|e| removing_dir(dir, e.into()))?;
    if wants_stdin {
        nix::unistd::mkfifo(
            &dir.join(record::STDIN),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| removing_dir(dir, ExecError::Internal(format!("stdin fifo: {e}"))))?;
    }
    Ok(())
}

/// Reads the shim's one handshake line, waiting at most SHIM_HANDSHAKE_TIMEOUT; `None` when
/// it did not come or does not parse.
async fn read_handshake(out: Option<std::process::ChildStdout>) -> Option<shim::Handshake> {
    let line = async {
        let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(out?.into()).ok()?;
        let mut line = String::new();
        tokio::io::BufReader::new(rx)
            .read_line(&mut line)
            .await
            .ok()?;
        Some(line)
    };
    let line = tokio::time::timeout(SHIM_HANDSHAKE_TIMEOUT, line).await;
    match line {
        Ok(Some(l)) => serde_json::from_str(&l).ok(),
        _ => None,
    }
}
