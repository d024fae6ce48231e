//! The browser IDE (`--ide jupyterlab`): JupyterLab supervised like the desktop's components —
//! started as the sandbox user in their home, ready once its API answers, restarted with
//! backoff when it dies, given up on after repeated crashes, every change an event and a
//! `/v1/ready` component. It listens on loopback only (`127.0.0.1:8888`) without a token: the
//! agent's authenticated port relay is the only way in. JupyterLab builds absolute URLs from its
//! `base_url`, so it runs under the public path its port is served at (the controller's
//! `/sandbox/sandboxes/v1/{id}/ports/8888/`, or the agent's own `/v1/ports/8888/`), and the
//! relay gives the prefix back to the requests it forwards (see `api/ports.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use berth_protocol::events::kinds;
use serde_json::json;
use tokio::sync::{Notify, watch};

use super::spawn::{Launch, Spawner};
use super::{Status, new_status};
use crate::account::Account;
use crate::events::EventLog;
use crate::reaper::{Exit, Reaper};

/// The port the IDE listens on inside the sandbox (loopback only).
pub const PORT: u16 = 8888;
/// A start that is not answering within this long counts as a failed one.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
const MAX_CRASHES: u32 = 5;
const STABLE: Duration = Duration::from_secs(60);
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const STOP_GRACE: Duration = Duration::from_secs(3);
/// How often a missing IDE binary is looked for again (an image may gain it by a package
/// install inside the sandbox).
const MISSING_RECHECK: Duration = Duration::from_secs(30);

/// Which IDE the agent serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IdeKind {
    Jupyterlab,
}

impl IdeKind {
    /// Its component name in `/v1/ready` and events, and the viewer kind the controller reports.
    pub fn name(self) -> &'static str {
        match self {
            IdeKind::Jupyterlab => "jupyterlab",
        }
    }
}

pub struct IdeConfig {
    pub kind: IdeKind,
    /// The program (`jupyter-lab`, looked up on the sandbox user's PATH, or a path).
    pub program: String,
    /// The public path ports are served under, ending in `/` (`/v1/ports/` at the agent,
    /// `/sandbox/sandboxes/v1/{id}/ports/` through the controller).
    pub ports_prefix: String,
    pub state_dir: PathBuf,
    pub home: PathBuf,
    pub account: Account,
}

/// `prefix` as a path prefix: one leading and one trailing slash, no empty, `.` or `..`
/// segments, only URL path characters.
pub fn normalize_prefix(prefix: &str) -> Result<String, String> {
    let segments: Vec<&str> = prefix.split('/').filter(|s| !s.is_empty()).collect();
    if let Some(bad) = segments.iter().find(|s| {
        **s == "."
            || **s == ".."
            || !s
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b))
    }) {
        return Err(format!(
            "{prefix:?}: segment {bad:?} is not allowed in a ports prefix"
        ));
    }
    Ok(match segments.is_empty() {
        true => "/".into(),
        false => format!("/{}/", segments.join("/")),
    })
}

/// The IDE's `base_url`: its port's path under the ports prefix.
pub fn base_url(ports_prefix: &str) -> String {
    format!("{ports_prefix}{PORT}/")
}

/// JupyterLab's command line: loopback, no token or password (the agent's relay is the door),
/// no browser, terminals on, WebSockets from any origin (they arrive through two relays),
/// nothing that reaches the internet (update checks, news).
pub fn jupyterlab_argv(program: &str, base_url: &str, root: &Path) -> Vec<String> {
    [
        program.to_string(),
        "--no-browser".into(),
        "--ip=127.0.0.1".into(),
        format!("--port={PORT}"),
        "--port-retries=0".into(),
        format!("--ServerApp.base_url={base_url}"),
        format!("--ServerApp.root_dir={}", root.display()),
        "--IdentityProvider.token=".into(),
        "--PasswordIdentityProvider.hashed_password=".into(),
        "--ServerApp.allow_origin=*".into(),
        "--ServerApp.allow_remote_access=True".into(),
        "--ServerApp.terminals_enabled=True".into(),
        "--ServerApp.quit_button=False".into(),
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate".into(),
        "--LabApp.news_url=None".into(),
        "--LabApp.extension_manager=readonly".into(),
    ]
    .into()
}

/// The user settings that keep JupyterLab from asking about news or updates (written only where
/// the user has none of their own).
const NOTIFICATION_SETTINGS: &str = "{\n  \"checkForUpdates\": false,\n  \"doNotDisturbMode\": false,\n  \"fetchNews\": \"false\"\n}\n";

/// The first `program` on `path` (a `PATH` value) that is an executable file; a program with a
/// `/` is taken as it is.
pub fn find_program(program: &str, path: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return executable(&p).then_some(p);
    }
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(program))
        .find(|p| executable(p))
}

enum Ended {
    Exited(Option<Exit>),
    Requested,
    Stopping,
}

pub struct Ide {
    cfg: IdeConfig,
    base_url: String,
    env: OnceLock<Vec<(String, String)>>,
    status: Mutex<Status>,
    pid: Mutex<Option<(u32, u64)>>,
    /// Moves whenever the status changes.
    pub changed: watch::Sender<u64>,
    restart: Notify,
    stop: watch::Sender<bool>,
    stopping: AtomicBool,
    spawner: Spawner,
    events: Arc<EventLog>,
    reaper: Arc<Reaper>,
    logs: PathBuf,
}

impl Ide {
    pub fn new(
        cfg: IdeConfig,
        events: Arc<EventLog>,
        reaper: Arc<Reaper>,
    ) -> anyhow::Result<Arc<Ide>> {
        let logs = cfg.state_dir.join("components");
        std::fs::create_dir_all(&logs)?;
        let base_url = base_url(&cfg.ports_prefix);
        Ok(Arc::new(Ide {
            base_url,
            env: OnceLock::new(),
            status: Mutex::new(new_status("starting", "not started yet")),
            pid: Mutex::new(None),
            changed: watch::channel(0).0,
            restart: Notify::new(),
            stop: watch::channel(false).0,
            stopping: AtomicBool::new(false),
            spawner: Spawner::start()?,
            events,
            reaper,
            logs,
            cfg,
        }))
    }

    pub fn kind(&self) -> IdeKind {
        self.cfg.kind
    }

    /// The component's name in `/v1/ready`.
    pub fn name(&self) -> &'static str {
        self.cfg.kind.name()
    }

    /// The path the IDE serves itself under (what the relay restores).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn status(&self) -> Status {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Asks for a fresh start (clears a give-up).
    pub fn request_restart(&self) {
        self.restart.notify_one();
    }

    /// Starts supervising, with the sandbox user's environment.
    pub fn run(self: &Arc<Self>, env: Vec<(String, String)>) {
        let _ = self.env.set(env);
        let me = self.clone();
        tokio::spawn(async move { me.supervise().await });
    }

    fn set(&self, f: impl FnOnce(&mut Status)) {
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let before = (s.state.clone(), s.reason.clone());
        f(&mut s);
        s.ok = s.state == "up";
        if (&s.state, &s.reason) != (&before.0, &before.1) {
            s.since = crate::time::now_rfc3339();
        }
        drop(s);
        self.changed.send_modify(|n| *n += 1);
    }

    fn env(&self) -> Vec<(String, String)> {
        self.env.get().cloned().unwrap_or_default()
    }

    fn stopped(&self) -> impl std::future::Future<Output = ()> + use<> {
        let mut rx = self.stop.subscribe();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    /// The user's JupyterLab settings that silence news and update checks, unless they have
    /// their own.
    fn write_quiet_settings(&self) {
        let dir = self
            .cfg
            .home
            .join(".jupyter/lab/user-settings/@jupyterlab/apputils-extension");
        let file = dir.join("notification.jupyterlab-settings");
        if file.exists() {
            return;
        }
        let a = &self.cfg.account;
        let result = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(&file, NOTIFICATION_SETTINGS)?;
            if a.needs_switch() {
                // Every directory made under the home is the user's, as the file is.
                let mut p = file.as_path();
                while p != self.cfg.home {
                    std::os::unix::fs::chown(p, Some(a.uid), Some(a.gid))?;
                    match p.parent() {
                        Some(parent) => p = parent,
                        None => break,
                    }
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot write JupyterLab's notification settings");
        }
    }

    fn program(&self) -> Option<PathBuf> {
        let env = self.env();
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| crate::account::DEFAULT_PATH.into());
        find_program(&self.cfg.program, &path)
    }

    async fn supervise(self: Arc<Self>) {
        let name = self.name();
        let mut crashes = 0u32;
        let mut restarts = 0u32;
        let mut missing_reported = false;
        self.write_quiet_settings();
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let Some(program) = self.program() else {
                let reason = format!(
                    "{} is not installed here (not found on the sandbox user's PATH): this \
                     sandbox has no IDE server",
                    self.cfg.program
                );
                self.set(|s| {
                    s.state = "down".into();
                    s.reason = reason.clone();
                    s.pid = None;
                });
                if !missing_reported {
                    self.events.emit(
                        kinds::COMPONENT_DOWN,
                        json!({"component": name, "reason": reason, "exit_code": null,
                               "signal": null}),
                    );
                    tracing::warn!(component = name, "{reason}");
                    missing_reported = true;
                }
                tokio::select! {
                    _ = tokio::time::sleep(MISSING_RECHECK) => {}
                    _ = self.restart.notified() => {}
                    _ = self.stopped() => return,
                }
                continue;
            };
            missing_reported = false;
            let started = Instant::now();
            let argv = match self.cfg.kind {
                IdeKind::Jupyterlab => {
                    jupyterlab_argv(&program.to_string_lossy(), &self.base_url, &self.cfg.home)
                }
            };
            let a = &self.cfg.account;
            let launch = Launch {
                argv,
                env: self.env(),
                cwd: self.cfg.home.clone(),
                identity: a.needs_switch().then(|| (a.uid, a.gid, a.groups.clone())),
                log: self.logs.join(format!("{name}.log")),
                pass_fd: None,
            };
            let (pid, mut exit) = match self.spawner.spawn(launch).await {
                Ok(pid) => (pid, self.reaper.watch(pid)),
                Err(e) => {
                    let reason = format!("cannot start: {e}");
                    self.set(|s| {
                        s.state = "down".into();
                        s.reason = reason.clone();
                        s.pid = None;
                    });
                    self.events.emit(
                        kinds::COMPONENT_DOWN,
                        json!({"component": name, "reason": reason, "exit_code": null,
                               "signal": null}),
                    );
                    crashes += 1;
                    if !self.back_off(&mut crashes, None).await {
                        return;
                    }
                    continue;
                }
            };
            let start = crate::proc::start_time(pid).unwrap_or(u64::MAX);
            *self.pid.lock().unwrap_or_else(|p| p.into_inner()) = Some((pid, start));
            self.set(|s| {
                s.state = "starting".into();
                s.reason = "started; waiting until it answers".into();
                s.pid = Some(pid);
                s.restarts = restarts;
            });
            let ended = self.until_ended(pid, &mut exit, restarts).await;
            let ended = match self.stopping.load(Ordering::SeqCst) {
                true => Ended::Stopping,
                false => ended,
            };
            // What it forked into its group (kernels, terminals' shells) goes with it.
            if let Some((pgid, start)) = self.pid.lock().unwrap_or_else(|p| p.into_inner()).take() {
                crate::proc::kill_group_since(pgid, start);
            }
            let (reason, last_exit) = match &ended {
                Ended::Exited(Some(e)) => (super::describe(e), Some(*e)),
                Ended::Exited(None) => ("did not answer in time".to_string(), None),
                Ended::Requested => ("restart requested".to_string(), None),
                Ended::Stopping => ("the agent is stopping".to_string(), None),
            };
            self.set(|s| {
                s.state = match ended {
                    Ended::Stopping => "stopped",
                    _ => "down",
                }
                .into();
                s.reason = reason.clone();
                s.pid = None;
            });
            if matches!(ended, Ended::Stopping) {
                return;
            }
            self.events.emit(
                kinds::COMPONENT_DOWN,
                super::with_exit(
                    json!({"component": name, "pid": pid, "reason": reason}),
                    last_exit,
                ),
            );
            restarts += 1;
            match ended {
                Ended::Requested => crashes = 0,
                _ => {
                    if started.elapsed() >= STABLE {
                        crashes = 0;
                    }
                    crashes += 1;
                    if !self.back_off(&mut crashes, last_exit).await {
                        return;
                    }
                }
            }
        }
    }

    /// Whether the IDE answers its API under its base URL.
    async fn probe(&self) -> Result<(), String> {
        let url = format!("http://127.0.0.1:{PORT}{}api/status", self.base_url);
        let r = crate::browser::http()
            .get(&url)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        match r.status().as_u16() {
            200 => Ok(()),
            s => Err(format!("GET {url} answered {s}")),
        }
    }

    async fn until_ended(
        &self,
        pid: u32,
        exit: &mut tokio::sync::oneshot::Receiver<Exit>,
        restarts: u32,
    ) -> Ended {
        let name = self.name();
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let mut last_reason = String::new();
        loop {
            tokio::select! {
                e = &mut *exit => return Ended::Exited(Some(e.unwrap_or(Exit { code: None, signal: None }))),
                _ = self.restart.notified() => { self.kill(pid, exit).await; return Ended::Requested; }
                _ = self.stopped() => { self.kill(pid, exit).await; return Ended::Stopping; }
                r = self.probe() => match r {
                    Ok(()) => break,
                    Err(reason) => {
                        if reason != last_reason {
                            self.set(|s| s.reason = format!("not ready yet: {reason}"));
                            last_reason = reason;
                        }
                        if tokio::time::Instant::now() >= deadline {
                            tracing::warn!(component = name, reason = %last_reason, "not ready in time; restarting it");
                            self.kill(pid, exit).await;
                            return Ended::Exited(None);
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                }
            }
        }
        self.set(|s| {
            s.state = "up".into();
            s.reason = format!("serving on 127.0.0.1:{PORT} under {}", self.base_url);
        });
        self.events.emit(
            kinds::COMPONENT_UP,
            json!({"component": name, "pid": pid, "restarts": restarts}),
        );
        if restarts > 0 {
            self.events.emit(
                kinds::COMPONENT_RESTARTED,
                json!({"component": name, "pid": pid, "restarts": restarts}),
            );
        }
        tracing::info!(component = name, pid, "up");
        tokio::select! {
            e = &mut *exit => Ended::Exited(Some(e.unwrap_or(Exit { code: None, signal: None }))),
            _ = self.restart.notified() => { self.kill(pid, exit).await; Ended::Requested }
            _ = self.stopped() => { self.kill(pid, exit).await; Ended::Stopping }
        }
    }

    /// SIGTERM to its process group, SIGKILL after the grace period.
    async fn kill(&self, pid: u32, exit: &mut tokio::sync::oneshot::Receiver<Exit>) {
        use nix::sys::signal::Signal;
        crate::proc::signal_group(pid, Signal::SIGTERM);
        if tokio::time::timeout(STOP_GRACE, &mut *exit).await.is_err() {
            tracing::warn!(
                component = self.name(),
                pid,
                "did not stop on SIGTERM; killing it"
            );
            crate::proc::signal_group(pid, Signal::SIGKILL);
            let _ = tokio::time::timeout(STOP_GRACE, &mut *exit).await;
        }
    }

    /// Waits out the backoff after a crash, or gives up until a restart is requested. False
    /// when the agent is stopping.
    async fn back_off(&self, crashes: &mut u32, last_exit: Option<Exit>) -> bool {
        if *crashes >= MAX_CRASHES {
            let name = self.name();
            let reason = format!("gave up after {MAX_CRASHES} crashes in a row");
            self.set(|s| {
                s.state = "gave_up".into();
                s.reason = reason.clone();
            });
            self.events.emit(
                kinds::COMPONENT_GAVE_UP,
                super::with_exit(
                    json!({"component": name, "crashes": MAX_CRASHES, "reason": reason,
                           "log": self.logs.join(format!("{name}.log"))}),
                    last_exit,
                ),
            );
            tracing::error!(component = name, "{reason}");
            tokio::select! {
                _ = self.restart.notified() => {}
                _ = self.stopped() => return false,
            }
            *crashes = 0;
            return true;
        }
        let delay = BACKOFF_FIRST
            .saturating_mul(1 << (*crashes - 1).min(10))
            .min(BACKOFF_MAX);
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = self.restart.notified() => { *crashes = 0; true }
            _ = self.stopped() => false,
        }
    }

    /// Stops the IDE (its supervisor kills it) and waits for that, bounded.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stop.send_replace(true);
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + STOP_GRACE * 2 + Duration::from_secs(1);
        while self.pid.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_normalized_and_checked() {
        assert_eq!(normalize_prefix("/v1/ports/").unwrap(), "/v1/ports/");
        assert_eq!(
            normalize_prefix("sandbox/sandboxes/v1/sb-1/ports").unwrap(),
            "/sandbox/sandboxes/v1/sb-1/ports/"
        );
        assert_eq!(normalize_prefix("//a//b/").unwrap(), "/a/b/");
        assert_eq!(normalize_prefix("").unwrap(), "/");
        assert!(normalize_prefix("/a/../b/").is_err());
        assert!(normalize_prefix("/a/./b/").is_err());
        assert!(normalize_prefix("/a b/").is_err());
        assert!(normalize_prefix("/a?b/").is_err());
        assert_eq!(
            base_url("/sandbox/sandboxes/v1/sb-1/ports/"),
            "/sandbox/sandboxes/v1/sb-1/ports/8888/"
        );
    }

    #[test]
    fn jupyterlab_listens_on_loopback_without_a_token_under_its_base_url() {
        let argv = jupyterlab_argv("jupyter-lab", "/v1/ports/8888/", Path::new("/home/user"));
        assert_eq!(argv[0], "jupyter-lab");
        for want in [
            "--ip=127.0.0.1",
            "--port=8888",
            "--port-retries=0",
            "--no-browser",
            "--ServerApp.base_url=/v1/ports/8888/",
            "--ServerApp.root_dir=/home/user",
            "--IdentityProvider.token=",
            "--ServerApp.terminals_enabled=True",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ] {
            assert!(
                argv.iter().any(|a| a == want),
                "{want} missing from {argv:?}"
            );
        }
    }

    #[test]
    fn programs_are_found_on_the_path_only_when_executable() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("jupyter-lab");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        let path = format!("/nonexistent:{}", dir.path().display());
        assert_eq!(find_program("jupyter-lab", &path), None, "not executable");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_program("jupyter-lab", &path), Some(bin.clone()));
        assert_eq!(find_program(&bin.to_string_lossy(), ""), Some(bin));
        assert_eq!(find_program("jupyter-lab", "/nonexistent"), None);
    }
}
