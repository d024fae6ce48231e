//! Commands: foreground and background, each with an id, a durable record and a replayable
//! output log (see `log`). Background commands run under a per-command shim (see `shim`) so
//! they survive an agent restart and are re-adopted with their real exit status.

mod background;
mod command;
mod foreground;
pub use foreground::ToolOutput;
pub mod log;
pub mod record;
pub mod result;
pub mod shim;
pub mod spare;
mod spare_shim;
pub mod spawn;
pub mod store;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use berth_protocol::events::EventKind;
use berth_protocol::sync::Locked;
use berth_protocol::{CommandInfo, CommandState};
use nix::sys::signal::Signal;
use serde_json::json;

use crate::account::{Account, AccountError, ChildEnv};
use crate::events::EventLog;
use crate::reaper::{Exit, Reaper};
pub use command::{Command, FollowerGuard, to_chunks};
use record::{Meta, ProcInfo, StdinMode};
use spawn::SpawnFailure;

/// Foreground commands are killed after this long unless the request says otherwise.
pub const DEFAULT_FOREGROUND_TIMEOUT: Duration = Duration::from_secs(120);
/// Output a running foreground command keeps in memory before it spills to its directory.
pub const FOREGROUND_MEMORY: u64 = 1 << 20;
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
    /// The sandbox is at its process limit: the command could not start.
    #[error("{0}")]
    Limit(String),
    #[error("{0}")]
    Internal(String),
}

impl ExecError {
    /// This error, or the process limit's when a fork or thread was refused at it since
    /// `hits_before` (what made a start fail is then the limit, whatever the symptom).
    pub fn or_limit(self, hits_before: Option<u64>) -> ExecError {
        let now = crate::limits::pids_hits();
        match (hits_before, now) {
            (Some(b), Some(n)) if n > b => ExecError::Limit(format!(
                "the sandbox is at its process limit ({} processes and threads): the command \
                 could not start; end what fills it (DELETE /v1/commands/{{id}} ends a \
                 command's whole tree) and try again",
                crate::limits::pids_max().map_or("its".to_string(), |m| m.to_string())
            )),
            _ => self,
        }
    }
}

impl From<std::io::Error> for ExecError {
    fn from(e: std::io::Error) -> Self {
        ExecError::Internal(e.to_string())
    }
}

pub struct ExecConfig {
    pub commands_dir: PathBuf,
    /// The foreground store (see `store`).
    pub store_dir: PathBuf,
    /// This binary, started again as `shim` for background commands.
    pub agent_exe: PathBuf,
    pub account: Account,
    pub home: PathBuf,
    /// Where commands naming no cwd run; the account's home when `None`.
    pub workdir: Option<PathBuf>,
    pub env: ChildEnv,
    pub output_cap: u64,
    pub ttl: Duration,
    /// Shims kept started ahead of their commands.
    pub spare_shims: usize,
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
    /// How a foreground command starts: its program, directory and environment, as its user,
    /// leading a session of its own.
    fn launch(&self) -> spawn::Launch<'_> {
        spawn::Launch {
            program: &self.program,
            cwd: &self.cwd,
            env: &self.env,
            identity: self.identity(),
            group: spawn::Group::NewSession,
        }
    }

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
    /// Each stream's size and last bytes, for an answer that previews it.
    pub stdout_end: berth_protocol::OutputEnd,
    pub stderr_end: berth_protocol::OutputEnd,
}

#[derive(Default)]
pub struct Background {
    pub id: Option<String>,
    pub stdin: Option<Vec<u8>>,
    pub stdin_open: bool,
    pub timeout: Option<Duration>,
    pub merge_stderr: bool,
}

pub struct CommandTable {
    cfg: ExecConfig,
    events: Arc<EventLog>,
    reaper: Arc<Reaper>,
    commands: Mutex<HashMap<String, Arc<Command>>>,
    /// Ids being created right now, each with a signal that turns true once its creation
    /// ended, so two requests with one client id start one command.
    creating: Mutex<HashMap<String, tokio::sync::watch::Receiver<bool>>>,
    watcher: Mutex<Option<notify::RecommendedWatcher>>,
    /// This agent's start time (its identity next to its pid).
    agent_start: u64,
    spares: Arc<spare::SpareDirs>,
    /// Shims started ahead, each waiting for a background command.
    shims: Arc<spare_shim::SpareShims>,
    store: store::ForegroundStore,
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
        let (store, stored) = store::ForegroundStore::open(&cfg.store_dir, cfg.ttl)?;
        let shims = spare_shim::SpareShims::start(&cfg.agent_exe, reaper.clone(), cfg.spare_shims);
        let table = Arc::new(CommandTable {
            cfg,
            events,
            reaper,
            commands: Mutex::new(HashMap::new()),
            creating: Mutex::new(HashMap::new()),
            watcher: Mutex::new(None),
            agent_start: crate::proc::start_time(std::process::id()).unwrap_or(0),
            spares: spare::SpareDirs::start(&cfg_commands_dir),
            shims,
            store,
        });
        let rx = table.start_watcher();
        table.adopt_existing();
        for (record, path) in stored {
            if table.get(&record.meta.id).is_none() {
                let dir = table.cfg.commands_dir.join(&record.meta.id);
                table.insert(Arc::new(Command::stored(dir, record, path)));
            }
        }

        table.spawn_refresher(rx);
        table.spawn_upkeep();
        Ok(table)
    }

    /// Watches the file system for writes and answers the channel the changed paths arrive on.
    fn start_watcher(&self) -> tokio::sync::mpsc::Receiver<PathBuf> {
        let (tx, rx) = tokio::sync::mpsc::channel::<PathBuf>(4096);
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            // Only writes matter. Opens and reads must not count: refreshing a record opens
            // its files, which would otherwise notify again, forever.
            if let Ok(ev) = res
                && !matches!(ev.kind, notify::EventKind::Access(_))
            {
                for p in ev.paths {
                    // A full queue only delays a refresh until the next tick.
                    let _ = tx.try_send(p);
                }
            }
        });
        // Without a watcher (inotify instances are per user and few: 128 by default, and a
        // machine running many agents as one user runs out) records are refreshed by the tick
        // alone, as a directory that cannot be watched is; the agent still starts.
        match watcher {
            Ok(w) => *self.watcher.locked() = Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch command dirs; polling them");
            }
        }
        rx
    }

    /// Refreshes the commands whose files changed, a batch of pending changes at a time.
    fn spawn_refresher(self: &Arc<Self>, mut rx: tokio::sync::mpsc::Receiver<PathBuf>) {
        let t = self.clone();
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
    }

    /// Checks every second that running commands still run, and expires old records; ends
    /// with the table.
    fn spawn_upkeep(self: &Arc<Self>) {
        // Expiry runs every minute, or more often for short TTLs.
        let expire_every = (self.cfg.ttl.as_secs() / 2).clamp(1, 60);
        let t = Arc::downgrade(self);
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
    }

    pub fn config(&self) -> &ExecConfig {
        &self.cfg
    }

    pub fn get(&self, id: &str) -> Option<Arc<Command>> {
        self.commands.locked().get(id).cloned()
    }

    pub fn require(&self, id: &str) -> Result<Arc<Command>, ExecError> {
        self.get(id)
            .ok_or_else(|| ExecError::NotFound(id.to_string()))
    }

    /// A snapshot of every command (the table's lock is not held while callers use them).
    fn all(&self) -> Vec<Arc<Command>> {
        self.commands.locked().values().cloned().collect()
    }

    pub fn list(&self) -> Vec<CommandInfo> {
        let mut infos: Vec<CommandInfo> = self
            .all()
            .iter()
            .map(|c| {
                let info = c.info();
                if info.state != CommandState::Running {
                    self.ensure_reported(c);
                }
                info
            })
            .collect();
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
                let a = Account::for_exec(name)?;
                let env = self.cfg.env.for_account(&a);
                let home = a.home.clone();
                (a, env, home)
            }
        };
        account.check_switchable()?;
        let cwd = match cwd {
            None => self.cfg.workdir.clone().unwrap_or_else(|| home.clone()),
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
        self.commands.locked().insert(cmd.id.clone(), cmd);
    }

    fn started_event(&self, cmd: &Command) {
        self.events.emit(
            EventKind::CommandStarted,
            json!({
                "id": cmd.id,
                "argv": cmd.meta.argv,
                "shell": cmd.meta.shell,
                "pid": cmd.proc_info().map(|p| p.pid),
                "background": cmd.meta.background,
            }),
        );
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

    /// Called after a reader saw `cmd` ended and before it tells anyone: the end is then
    /// already on the timeline (a reporter on another thread finishes first).
    pub fn ensure_reported(&self, cmd: &Command) {
        self.refresh(cmd);
    }

    fn refresh(&self, cmd: &Command) {
        if !cmd.meta.background {
            return; // foreground: fed in-process
        }
        // One refresher at a time per command: whoever sees the end reports it before any
        // waiter wakes, so a waiter that sees the end also finds it on the timeline.
        let _one = cmd.report_lock.locked();
        let changed = cmd.refresh();
        if cmd.exit().is_some() {
            self.report_exit(cmd);
        }
        if changed {
            cmd.bump();
        }
    }

    /// The command's supervisor died without recording an exit.
    pub(super) fn lose(&self, cmd: &Command) {
        let _one = cmd.report_lock.locked();
        if cmd.mark_lost() {
            self.report_exit(cmd);
            cmd.bump();
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
            EventKind::CommandExited,
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
        if let Some(w) = self.watcher.locked().as_mut()
            && let Err(e) = w.watch(dir, notify::RecursiveMode::NonRecursive)
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a command dir; polling it");
        }
    }

    fn unwatch_dir(&self, dir: &Path) {
        use notify::Watcher;
        if let Some(w) = self.watcher.locked().as_mut() {
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
            let cmd = Arc::new(Command::new(dir.clone(), meta));
            let info = record::read_json::<ProcInfo>(&dir, record::PROC);
            *cmd.proc.locked() = info;
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
            .all()
            .into_iter()
            .filter(|c| c.is_running() && c.meta.background)
            .collect();
        for c in running {
            self.refresh(&c);
            if c.is_running() && !c.supervisor_alive() {
                // The exit record may have landed just before the shim died.
                self.refresh(&c);
                if c.exit().is_none() {
                    self.lose(&c);
                }
            }
        }
    }

    /// Deletes records of commands that ended longer ago than the TTL.
    pub fn expire(&self) {
        let now = SystemTime::now();
        let expired: Vec<Arc<Command>> = self
            .all()
            .into_iter()
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
            .collect();
        for c in expired {
            self.forget(&c);
        }
        self.store.drop_expired();
    }

    /// Deletes the record, then forgets the command: once it is gone from the API, it is gone
    /// from the disk too.
    fn forget(&self, cmd: &Command) {
        // Hold the report lock so no refresh writes a marker into the directory meanwhile.
        let _quiet = cmd.report_lock.locked();
        if !cmd.meta.background {
            self.store.forget(&cmd.id);
        }
        self.unwatch_dir(&cmd.dir);
        for _ in 0..3 {
            match std::fs::remove_dir_all(&cmd.dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::debug!(dir = %cmd.dir.display(), error = %e, "retrying a record removal");
                }
                _ => break,
            }
        }
        self.commands.locked().remove(&cmd.id);
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
        let mut waiting = Vec::new();
        for c in &self.all() {
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
        self.all().into_iter().filter(|c| c.is_running()).collect()
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
