//! Commands: foreground and background, each with an id, a durable record and a replayable
//! output log (see `log`). Background commands run under a per-command shim (see `shim`) so
//! they survive an agent restart and are re-adopted with their real exit status.

pub mod log;
pub mod record;
pub mod shim;
pub mod spare;
pub mod spawn;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use berth_protocol::events::kinds;
use berth_protocol::{CommandInfo, CommandState, OutputChunk, OutputPage, Stream};
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::account::{Account, AccountError, ChildEnv};
use crate::events::EventLog;
use crate::reaper::{Exit, Reaper};
use log::{LogView, LogWriter, ReadOut};
use record::{ExitRecord, Meta, ProcInfo, StdinMode};
use spawn::{Group, Launch, SpawnFailure};

/// Foreground commands are killed after this long unless the request says otherwise.
pub const DEFAULT_FOREGROUND_TIMEOUT: Duration = Duration::from_secs(120);
/// Bytes of each stream a foreground answer carries; the rest stays readable by id.
pub const FOREGROUND_KEEP: usize = 64 << 20;
const SHIM_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const STDIN_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{0}")]
    Invalid(String),
    #[error("no command '{0}'")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{}", .0.message())]
    Spawn(SpawnFailure),
    #[error(transparent)]
    Account(#[from] AccountError),
    #[error("{0}")]
    Internal(String),
}

impl From<std::io::Error> for ExecError {
    fn from(e: std::io::Error) -> Self {
        ExecError::Internal(e.to_string())
    }
}

pub struct ExecConfig {
    pub commands_dir: PathBuf,
    /// This binary, started again as `shim` for background commands.
    pub agent_exe: PathBuf,
    pub account: Account,
    pub home: PathBuf,
    pub env: ChildEnv,
    pub output_cap: u64,
    pub ttl: Duration,
}

/// A command ready to start: what the request asked for, resolved against the sandbox
/// account and environment.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub argv: Option<Vec<String>>,
    pub shell: Option<String>,
    pub program: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub account: Account,
}

impl Prepared {
    fn identity(&self) -> Option<(u32, u32, Vec<u32>)> {
        self.account.needs_switch().then(|| {
            (
                self.account.uid,
                self.account.gid,
                self.account.groups.clone(),
            )
        })
    }
}

pub struct Foreground {
    pub stdin: Option<Vec<u8>>,
    pub timeout: Option<Duration>,
    pub merge_stderr: bool,
}

#[derive(Debug)]
pub struct ForegroundOutcome {
    pub id: String,
    pub exit: Exit,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub truncated: bool,
    pub duration: Duration,
}

pub struct Background {
    pub id: Option<String>,
    pub stdin: Option<Vec<u8>>,
    pub stdin_open: bool,
    pub timeout: Option<Duration>,
    pub merge_stderr: bool,
}

/// One command and what the agent knows of it.
pub struct Command {
    pub id: String,
    pub dir: PathBuf,
    pub meta: Meta,
    view: Mutex<LogView>,
    writer: Option<Mutex<LogWriter>>,
    proc: Mutex<Option<ProcInfo>>,
    lost: AtomicBool,
    stdin_open: AtomicBool,
    stdin_lock: tokio::sync::Mutex<()>,
    changed: watch::Sender<u64>,
    followers: Arc<AtomicUsize>,
    lagged_followers: AtomicUsize,
}

/// Counts one live follower of a command while it exists.
pub struct FollowerGuard(Arc<AtomicUsize>);

impl Drop for FollowerGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Command {
    fn new(dir: PathBuf, meta: Meta, writer: Option<LogWriter>) -> Command {
        let view = LogView::open(&dir);
        Command {
            id: meta.id.clone(),
            dir,
            meta,
            view: Mutex::new(view),
            writer: writer.map(Mutex::new),
            proc: Mutex::new(None),
            lost: AtomicBool::new(false),
            stdin_open: AtomicBool::new(false),
            stdin_lock: tokio::sync::Mutex::new(()),
            changed: watch::channel(0).0,
            followers: Arc::new(AtomicUsize::new(0)),
            lagged_followers: AtomicUsize::new(0),
        }
    }

    pub fn follower(&self) -> FollowerGuard {
        self.followers.fetch_add(1, Ordering::SeqCst);
        FollowerGuard(self.followers.clone())
    }

    pub fn note_lagged(&self) {
        self.lagged_followers.fetch_add(1, Ordering::SeqCst);
    }

    fn view(&self) -> std::sync::MutexGuard<'_, LogView> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn exit(&self) -> Option<ExitRecord> {
        self.view().exit.clone()
    }

    pub fn state(&self) -> CommandState {
        if self.view().exit.is_some() {
            CommandState::Exited
        } else if self.lost.load(Ordering::SeqCst) {
            CommandState::Lost
        } else {
            CommandState::Running
        }
    }

    pub fn is_running(&self) -> bool {
        self.state() == CommandState::Running
    }

    fn proc_info(&self) -> Option<ProcInfo> {
        *self.proc.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn info(&self) -> CommandInfo {
        let view = self.view();
        let exit = view.exit.clone();
        let state = if exit.is_some() {
            CommandState::Exited
        } else if self.lost.load(Ordering::SeqCst) {
            CommandState::Lost
        } else {
            CommandState::Running
        };
        CommandInfo {
            id: self.id.clone(),
            argv: self.meta.argv.clone(),
            shell: self.meta.shell.clone(),
            state,
            pid: self.proc_info().map(|p| p.pid),
            exit_code: exit.as_ref().map(|e| e.exit_code),
            signal: exit
                .as_ref()
                .and_then(|e| e.signal)
                .map(crate::proc::signal_name),
            started_at: self.meta.started_at.clone(),
            ended_at: exit.map(|e| e.ended_at),
            background: self.meta.background,
            output_bytes: view.end,
            followers: self.followers.load(Ordering::SeqCst),
            lagged_followers: self.lagged_followers.load(Ordering::SeqCst),
        }
    }

    /// Reads output from `from`, at most `max` bytes.
    pub fn read(&self, from: u64, max: usize) -> std::io::Result<ReadOut> {
        let view = self.view();
        let mut out = view.read(from, max)?;
        // A lost command will write nothing more: what is there is all there is.
        if self.lost.load(Ordering::SeqCst) && out.next_seq >= view.end {
            out.done = true;
        }
        Ok(out)
    }

    /// One page of the output API.
    pub fn page(&self, from: u64, max: usize) -> std::io::Result<OutputPage> {
        let out = self.read(from, max)?;
        Ok(OutputPage {
            chunks: to_chunks(&out),
            next_seq: out.next_seq,
            done: out.done,
            exit_code: if out.done {
                self.exit().map(|e| e.exit_code)
            } else {
                None
            },
            truncated_before_seq: out.truncated_before,
        })
    }

    /// Appends output produced by an in-process (foreground) child.
    fn append(&self, stream: Stream, data: &[u8]) {
        let Some(w) = &self.writer else { return };
        let (end, switch) = {
            let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
            let switch = w.append(stream, data);
            (w.end(), switch)
        };
        self.view().note_append(end, switch);
        self.bump();
    }

    /// Re-reads what the shim wrote. Returns whether anything changed.
    fn refresh(&self) -> bool {
        let changed = self.view().refresh();
        if changed {
            self.bump();
        }
        changed
    }

    fn mark_lost(&self) {
        if !self.lost.swap(true, Ordering::SeqCst) {
            self.bump();
        }
    }

    /// Whether whoever supervises the command (shim or agent) is still alive.
    fn supervisor_alive(&self) -> bool {
        match self.proc_info() {
            Some(p) => crate::proc::is_alive(p.supervisor_pid, p.supervisor_start),
            None => false,
        }
    }
}

/// Splits a read into API chunks (UTF-8 runs as `data`, the rest as `data_b64`).
pub fn to_chunks(out: &ReadOut) -> Vec<OutputChunk> {
    out.segments
        .iter()
        .flat_map(|s| crate::text::encode_chunks(s.seq, s.stream, &s.bytes))
        .collect()
}

pub struct CommandTable {
    cfg: ExecConfig,
    events: Arc<EventLog>,
    reaper: Arc<Reaper>,
    commands: Mutex<HashMap<String, Arc<Command>>>,
    /// Ids being created right now, so two requests with one client id start one command.
    creating: Mutex<HashSet<String>>,
    watcher: Mutex<Option<notify::RecommendedWatcher>>,
    /// This agent's start time (its identity next to its pid).
    agent_start: u64,
    spares: Arc<spare::SpareDirs>,
}

impl CommandTable {
    /// Opens the table, re-adopting what earlier agents left in the state dir, and starts the
    /// background upkeep (file-change refresh, liveness checks, TTL expiry).
    pub fn start(
        cfg: ExecConfig,
        events: Arc<EventLog>,
        reaper: Arc<Reaper>,
    ) -> std::io::Result<Arc<CommandTable>> {
        std::fs::create_dir_all(&cfg.commands_dir)?;
        let cfg_commands_dir = cfg.commands_dir.clone();
        let table = Arc::new(CommandTable {
            cfg,
            events,
            reaper,
            commands: Mutex::new(HashMap::new()),
            creating: Mutex::new(HashSet::new()),
            watcher: Mutex::new(None),
            agent_start: crate::proc::start_time(std::process::id()).unwrap_or(0),
            spares: spare::SpareDirs::start(&cfg_commands_dir),
        });
        let (tx, mut rx) = tokio::sync::mpsc::channel::<PathBuf>(4096);
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if let Ok(ev) = res {
                for p in ev.paths {
                    // A full queue only delays a refresh until the next tick.
                    let _ = tx.try_send(p);
                }
            }
        })
        .map_err(std::io::Error::other)?;
        *table.watcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(watcher);
        table.adopt_existing();

        let t = table.clone();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut ids = HashSet::new();
                let mut push = |p: PathBuf| {
                    if let Some(id) = p
                        .parent()
                        .and_then(|d| d.file_name())
                        .and_then(|n| n.to_str())
                    {
                        ids.insert(id.to_string());
                    }
                };
                push(first);
                while let Ok(p) = rx.try_recv() {
                    push(p);
                }
                for id in ids {
                    if let Some(c) = t.get(&id) {
                        t.refresh(&c);
                    }
                }
            }
        });
        // Expiry runs every minute, or more often for short TTLs.
        let expire_every = (table.cfg.ttl.as_secs() / 2).clamp(1, 60);
        let t = Arc::downgrade(&table);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut n: u64 = 0;
            loop {
                tick.tick().await;
                let Some(t) = t.upgrade() else { break };
                t.check_running();
                n += 1;
                if n.is_multiple_of(expire_every) {
                    t.expire();
                }
            }
        });
        Ok(table)
    }

    pub fn config(&self) -> &ExecConfig {
        &self.cfg
    }

    pub fn get(&self, id: &str) -> Option<Arc<Command>> {
        self.commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    pub fn require(&self, id: &str) -> Result<Arc<Command>, ExecError> {
        self.get(id)
            .ok_or_else(|| ExecError::NotFound(id.to_string()))
    }

    pub fn list(&self) -> Vec<CommandInfo> {
        let cmds: Vec<Arc<Command>> = self
            .commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut infos: Vec<CommandInfo> = cmds.iter().map(|c| c.info()).collect();
        infos.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.id.cmp(&b.id)));
        infos
    }

    /// Resolves a request's command, account, cwd and environment.
    pub fn prepare(
        &self,
        argv: Option<Vec<String>>,
        shell: Option<String>,
        cwd: Option<&str>,
        env: Option<&BTreeMap<String, String>>,
        user: Option<&str>,
    ) -> Result<Prepared, ExecError> {
        let program = match (&argv, &shell) {
            (Some(a), None) => {
                if a.is_empty() {
                    return Err(ExecError::Invalid("argv must not be empty".into()));
                }
                a.clone()
            }
            (None, Some(s)) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
            (Some(_), Some(_)) => {
                return Err(ExecError::Invalid(
                    "give either argv or shell, not both".into(),
                ));
            }
            (None, None) => return Err(ExecError::Invalid("argv or shell is required".into())),
        };
        self.resolve(argv, shell, program, cwd, env, user)
    }

    /// A program run as the sandbox user in its home (the compat surface's commands).
    pub fn for_sandbox(
        &self,
        program: Vec<String>,
        cwd: Option<PathBuf>,
    ) -> Result<Prepared, ExecError> {
        let mut p = self.resolve(Some(program.clone()), None, program, None, None, None)?;
        if let Some(c) = cwd {
            p.cwd = c;
        }
        Ok(p)
    }

    fn resolve(
        &self,
        argv: Option<Vec<String>>,
        shell: Option<String>,
        program: Vec<String>,
        cwd: Option<&str>,
        env: Option<&BTreeMap<String, String>>,
        user: Option<&str>,
    ) -> Result<Prepared, ExecError> {
        if program.iter().any(|a| a.contains('\0')) {
            return Err(ExecError::Invalid("the command contains a NUL byte".into()));
        }
        let (account, base_env, home) = match user {
            None => (
                self.cfg.account.clone(),
                self.cfg.env.clone(),
                self.cfg.home.clone(),
            ),
            Some(name) => {
                let a = Account::by_name(name)?;
                let env = self.cfg.env.for_account(&a);
                let home = a.home.clone();
                (a, env, home)
            }
        };
        account.check_switchable()?;
        let cwd = match cwd {
            None => home.clone(),
            Some(c) if c.contains('\0') => {
                return Err(ExecError::Invalid("cwd contains a NUL byte".into()));
            }
            Some(c) => resolve_path(&home, c),
        };
        if let Some(env) = env
            && env
                .iter()
                .any(|(k, v)| k.contains(['\0', '=']) || k.is_empty() || v.contains('\0'))
        {
            return Err(ExecError::Invalid(
                "env names must be non-empty without '=' or NUL, values without NUL".into(),
            ));
        }
        Ok(Prepared {
            argv,
            shell,
            program,
            cwd,
            env: base_env.with(env),
            account,
        })
    }

    fn new_meta(
        &self,
        id: &str,
        p: &Prepared,
        stdin: StdinMode,
        merge: bool,
        timeout: Option<Duration>,
        background: bool,
    ) -> Meta {
        Meta {
            id: id.to_string(),
            argv: p.argv.clone(),
            shell: p.shell.clone(),
            program: p.program.clone(),
            cwd: p.cwd.to_string_lossy().into_owned(),
            uid: p.account.uid,
            gid: p.account.gid,
            groups: p.account.groups.clone(),
            switch_identity: p.account.needs_switch(),
            stdin,
            merge_stderr: merge,
            timeout_ms: timeout.map(|t| t.as_millis() as u64),
            background,
            output_cap: self.cfg.output_cap,
            started_at: crate::time::now_rfc3339(),
        }
    }

    fn insert(&self, cmd: Arc<Command>) {
        self.commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cmd.id.clone(), cmd);
    }

    fn started_event(&self, cmd: &Command) {
        self.events.emit(
            kinds::COMMAND_STARTED,
            json!({
                "id": cmd.id,
                "argv": cmd.meta.argv,
                "shell": cmd.meta.shell,
                "pid": cmd.proc_info().map(|p| p.pid),
                "background": cmd.meta.background,
            }),
        );
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

        let launch = Launch {
            program: &p.program,
            cwd: &p.cwd,
            env: &p.env,
            identity: p.identity(),
            group: Group::NewSession,
        };
        let mut cmd = spawn::command(&launch).map_err(ExecError::Spawn)?;
        cmd.stdin(if fg.stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        });
        let merged_read = if fg.merge_stderr {
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
        let mut child = cmd
            .spawn()
            .map_err(|e| ExecError::Spawn(SpawnFailure::from_io(&e, &p.program[0])))?;
        drop(cmd);
        let pid = child.id();
        let mut exited = self.reaper.watch(pid);

        // The record is written while the child runs (its output waits in the pipes), so the
        // disk is off the answer's critical path. No proc.json: a foreground command's
        // supervisor is this agent, and any later agent reads a missing exit record as lost.
        let dir = self.cfg.commands_dir.join(&id);
        let recorded = self
            .spares
            .take(&dir)
            .and_then(|_| record::write_json(&dir, record::META, &meta))
            .and_then(|_| LogWriter::create(&dir, self.cfg.output_cap));
        let writer = match recorded {
            Ok(w) => w,
            Err(e) => {
                crate::proc::signal_group(pid, Signal::SIGKILL);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(ExecError::Internal(format!(
                    "cannot record command {id} in {}: {e}",
                    dir.display()
                )));
            }
        };
        let info = ProcInfo {
            supervisor_pid: std::process::id(),
            supervisor_start: self.agent_start,
            pid,
        };
        let command = Arc::new(Command::new(dir.clone(), meta, Some(writer)));
        *command.proc.lock().unwrap_or_else(|p| p.into_inner()) = Some(info);
        self.insert(command.clone());
        self.started_event(&command);

        // Readers keep up to FOREGROUND_KEEP bytes of each stream for the answer; everything
        // goes to the log.
        let mut readers = Vec::new();
        let mut sources: Vec<(std::os::fd::OwnedFd, Stream)> = Vec::new();
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
            let c = command.clone();
            readers.push(tokio::spawn(async move {
                let mut kept = Vec::new();
                let mut truncated = false;
                let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
                    return (stream, kept, truncated);
                };
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match rx.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            c.append(stream, &buf[..n]);
                            let room = FOREGROUND_KEEP.saturating_sub(kept.len());
                            kept.extend_from_slice(&buf[..n.min(room)]);
                            truncated |= n > room;
                        }
                    }
                }
                (stream, kept, truncated)
            }));
        }
        if let (Some(data), Some(stdin)) = (fg.stdin, child.stdin.take()) {
            tokio::spawn(async move {
                if let Ok(mut tx) = tokio::net::unix::pipe::Sender::from_owned_fd(stdin.into()) {
                    let _ = tx.write_all(&data).await;
                }
            });
        }
        drop(child);

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
        // Give the pipes a moment to drain; a process left holding them does not stall us.
        let deadline = tokio::time::Instant::now() + shim::DRAIN_GRACE;
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let mut truncated = false;
        for r in readers {
            let abort = r.abort_handle();
            match tokio::time::timeout_at(deadline, r).await {
                Ok(Ok((stream, kept, t))) => {
                    truncated |= t;
                    match stream {
                        Stream::Stdout => stdout = kept,
                        Stream::Stderr => stderr = kept,
                    }
                }
                _ => abort.abort(),
            }
        }
        let output_error = command
            .writer
            .as_ref()
            .and_then(|w| w.lock().ok().and_then(|w| w.error.clone()));
        let rec = ExitRecord {
            exit_code: exit.exit_code(),
            signal: exit.signal,
            timed_out,
            ended_at: crate::time::now_rfc3339(),
            output_error,
            reported: true,
        };
        let on_disk = rec.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = record::write_json(&dir, record::EXIT, &on_disk) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot write an exit record");
            }
        });
        command.view().set_exit(rec);
        command.bump();
        self.emit_exit(&command);
        Ok(ForegroundOutcome {
            id,
            exit,
            timed_out,
            stdout,
            stderr,
            truncated,
            duration: started.elapsed(),
        })
    }

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
        if let Some(existing) = self.get(&id) {
            return Ok((existing, false));
        }
        if !self
            .creating
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone())
        {
            return Err(ExecError::Conflict(format!(
                "command '{id}' is being created by another request"
            )));
        }
        let result = self.spawn_shim(&id, p, bg).await;
        self.creating
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        result.map(|c| (c, true))
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
        let cleanup = |e: ExecError| {
            let _ = std::fs::remove_dir_all(&dir);
            e
        };
        record::write_json(&dir, record::META, &meta).map_err(|e| cleanup(e.into()))?;
        if wants_stdin {
            nix::unistd::mkfifo(
                &dir.join(record::STDIN),
                nix::sys::stat::Mode::from_bits_truncate(0o600),
            )
            .map_err(|e| cleanup(ExecError::Internal(format!("stdin fifo: {e}"))))?;
        }
        // Watch before the shim starts so no write is missed.
        self.watch_dir(&dir);

        let shim_log =
            std::fs::File::create(dir.join("shim.log")).map_err(|e| cleanup(e.into()))?;
        let mut cmd = std::process::Command::new(&self.cfg.agent_exe);
        cmd.arg("shim")
            .arg(&dir)
            .env_clear()
            .envs(p.env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(shim_log);
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut shim = cmd
            .spawn()
            .map_err(|e| cleanup(ExecError::Internal(format!("cannot start the shim: {e}"))))?;
        drop(cmd);
        let shim_pid = shim.id();
        let shim_exited = self.reaper.watch(shim_pid);
        let out = shim.stdout.take();
        drop(shim);
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
        let hs: Option<shim::Handshake> = match line {
            Ok(Some(l)) => serde_json::from_str(&l).ok(),
            _ => None,
        };
        let hs = match hs {
            Some(hs) if hs.ok => hs,
            other => {
                crate::proc::signal_group(shim_pid, Signal::SIGKILL);
                self.unwatch_dir(&dir);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(match other {
                    Some(shim::Handshake {
                        errno: Some(errno),
                        subject: Some(subject),
                        ..
                    }) => ExecError::Spawn(SpawnFailure { errno, subject }),
                    Some(hs) => ExecError::Internal(hs.message.unwrap_or_default()),
                    None => ExecError::Internal("the shim did not report".into()),
                });
            }
        };
        let info = record::read_json::<ProcInfo>(&dir, record::PROC).unwrap_or(ProcInfo {
            supervisor_pid: shim_pid,
            supervisor_start: crate::proc::start_time(shim_pid).unwrap_or(0),
            pid: hs.pid.unwrap_or(0),
        });
        let command = Arc::new(Command::new(dir.clone(), meta, None));
        *command.proc.lock().unwrap_or_else(|p| p.into_inner()) = Some(info);
        command.stdin_open.store(wants_stdin, Ordering::SeqCst);
        self.insert(command.clone());
        self.started_event(&command);

        // When the shim ends, the exit record is final (or missing: lost).
        let t = Arc::downgrade(self);
        let c = command.clone();
        tokio::spawn(async move {
            let _ = shim_exited.await;
            if let Some(t) = t.upgrade() {
                t.refresh(&c);
                if c.exit().is_none() {
                    c.mark_lost();
                    t.report_exit(&c);
                }
            }
        });

        if let Some(data) = bg.stdin {
            self.write_stdin(&command, &data).await?;
            if !bg.stdin_open {
                self.close_stdin(&command)?;
            }
        }
        Ok(command)
    }

    /// Waits until the command has ended or `wait` passed.
    pub async fn wait_done(&self, cmd: &Command, wait: Duration) {
        let mut rx = cmd.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            self.refresh(cmd);
            if !cmd.is_running() {
                return;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    fn refresh(&self, cmd: &Command) {
        if cmd.writer.is_some() {
            return; // foreground: fed in-process
        }
        cmd.refresh();
        if cmd.exit().is_some() {
            self.report_exit(cmd);
        }
    }

    /// Puts a background command's end on the timeline, once per command across agent
    /// restarts (the marker file remembers; foreground exits carry `reported` themselves).
    fn report_exit(&self, cmd: &Command) {
        let marker = cmd.dir.join(record::EXIT_REPORTED);
        if cmd.exit().is_some_and(|e| e.reported) || marker.exists() {
            return;
        }
        if std::fs::write(&marker, b"").is_err() {
            return;
        }
        self.emit_exit(cmd);
    }

    fn emit_exit(&self, cmd: &Command) {
        self.unwatch_dir(&cmd.dir);
        let info = cmd.info();
        self.events.emit(
            kinds::COMMAND_EXITED,
            json!({
                "id": info.id,
                "state": info.state,
                "exit_code": info.exit_code,
                "signal": info.signal,
                "timed_out": cmd.exit().map(|e| e.timed_out).unwrap_or(false),
            }),
        );
    }

    fn watch_dir(&self, dir: &Path) {
        use notify::Watcher;
        if let Some(w) = self
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            && let Err(e) = w.watch(dir, notify::RecursiveMode::NonRecursive)
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a command dir; polling it");
        }
    }

    fn unwatch_dir(&self, dir: &Path) {
        use notify::Watcher;
        if let Some(w) = self
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            let _ = w.unwatch(dir);
        }
    }

    /// Reloads every command record left in the state dir: finished ones as they ended,
    /// running ones re-adopted (their shim is alive), the rest `lost`.
    fn adopt_existing(&self) {
        let Ok(entries) = std::fs::read_dir(&self.cfg.commands_dir) else {
            return;
        };
        let mut adopted = 0;
        for entry in entries.flatten() {
            let dir = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue; // spare directories and temp files
            }
            let Some(meta) = record::read_json::<Meta>(&dir, record::META) else {
                // Half-created before a crash: nothing to adopt.
                let _ = std::fs::remove_dir_all(&dir);
                continue;
            };
            if validate_id(&meta.id).is_err() || dir.file_name() != Some(meta.id.as_ref()) {
                continue;
            }
            let cmd = Arc::new(Command::new(dir.clone(), meta, None));
            let info = record::read_json::<ProcInfo>(&dir, record::PROC);
            *cmd.proc.lock().unwrap_or_else(|p| p.into_inner()) = info;
            let open =
                cmd.meta.stdin == StdinMode::Fifo && !dir.join(record::STDIN_CLOSED).exists();
            cmd.stdin_open.store(open, Ordering::SeqCst);
            if cmd.exit().is_none() {
                if cmd.meta.background && cmd.supervisor_alive() {
                    self.watch_dir(&dir);
                    adopted += 1;
                } else {
                    cmd.mark_lost();
                }
            }
            self.insert(cmd.clone());
            if !cmd.is_running() {
                self.report_exit(&cmd);
            }
        }
        if adopted > 0 {
            tracing::info!(adopted, "re-adopted running background commands");
        }
    }

    /// The slow path behind file notifications: refresh running background commands and
    /// notice supervisors that died without recording an exit.
    fn check_running(&self) {
        let running: Vec<Arc<Command>> = self
            .commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|c| c.is_running() && c.writer.is_none())
            .cloned()
            .collect();
        for c in running {
            self.refresh(&c);
            if c.is_running() && !c.supervisor_alive() {
                // The exit record may have landed just before the shim died.
                self.refresh(&c);
                if c.exit().is_none() {
                    c.mark_lost();
                    self.report_exit(&c);
                }
            }
        }
    }

    /// Deletes records of commands that ended longer ago than the TTL.
    pub fn expire(&self) {
        let now = SystemTime::now();
        let expired: Vec<Arc<Command>> = self
            .commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|c| {
                let ended = match c.exit() {
                    Some(e) => crate::time::parse_rfc3339(&e.ended_at),
                    None if c.state() == CommandState::Lost => {
                        std::fs::metadata(&c.dir).and_then(|m| m.modified()).ok()
                    }
                    None => None,
                };
                ended.is_some_and(|t| now.duration_since(t).unwrap_or_default() > self.cfg.ttl)
            })
            .cloned()
            .collect();
        for c in expired {
            self.forget(&c);
        }
    }

    fn forget(&self, cmd: &Command) {
        self.commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&cmd.id);
        self.unwatch_dir(&cmd.dir);
        let _ = std::fs::remove_dir_all(&cmd.dir);
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
    }

    /// Kills (if running) and deletes a command and its record.
    pub async fn delete(&self, id: &str) -> Result<(), ExecError> {
        let cmd = self.require(id)?;
        self.kill(&cmd).await;
        self.forget(&cmd);
        Ok(())
    }

    /// Restart: foreground commands die with the agent (their client is gone); background
    /// ones keep running for the next agent.
    pub fn kill_foreground(&self) {
        for c in self.running() {
            if !c.meta.background
                && let Some(p) = c.proc_info()
            {
                crate::proc::signal_group(p.pid, Signal::SIGKILL);
            }
        }
    }

    /// Full shutdown: every command tree dies; exits are recorded where the shim can. Shims of
    /// finished commands that still hold daemons the command left behind are ended too.
    pub async fn kill_all(&self) {
        let all: Vec<Arc<Command>> = self
            .commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut waiting = Vec::new();
        for c in &all {
            let Some(p) = c.proc_info() else { continue };
            if c.meta.background && c.supervisor_alive() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.supervisor_pid as i32),
                    Signal::SIGTERM,
                );
                waiting.push(c.clone());
            } else if c.is_running() {
                crate::proc::signal_group(p.pid, Signal::SIGKILL);
                waiting.push(c.clone());
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for c in &waiting {
            let left = deadline.saturating_duration_since(Instant::now());
            self.wait_done(c, left).await;
        }
        // Shims re-adopted from an earlier agent are not our descendants: end them directly.
        for c in &waiting {
            if let Some(p) = c.proc_info()
                && c.meta.background
                && c.supervisor_alive()
            {
                crate::proc::kill_descendants(p.supervisor_pid, Duration::from_secs(1));
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.supervisor_pid as i32),
                    Signal::SIGKILL,
                );
            }
        }
    }

    fn running(&self) -> Vec<Arc<Command>> {
        self.commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|c| c.is_running())
            .cloned()
            .collect()
    }
}

/// `~/x` and relative paths resolve against `home`.
pub fn resolve_path(home: &Path, p: &str) -> PathBuf {
    if p == "~" {
        home.to_path_buf()
    } else if let Some(rest) = p.strip_prefix("~/") {
        home.join(rest)
    } else {
        home.join(p) // an absolute `p` replaces `home`
    }
}

pub fn new_id() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("getrandom");
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("cmd_{hex}")
}

/// Client-chosen ids name directories: letters, digits, `.`, `_`, `-`, at most 128, and not
/// starting with a dot.
pub fn validate_id(id: &str) -> Result<(), ExecError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ExecError::Invalid(format!(
            "invalid id {}: use 1-128 letters, digits, '.', '_' or '-', not starting with '.'",
            crate::text::py_repr_str(id)
        )))
    }
}
