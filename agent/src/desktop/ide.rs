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
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use berth_protocol::sync::Locked;
use tokio::sync::watch;

use super::Status;
use super::spawn::{Launch, Spawner};
use super::supervisor::{Ended, Policy, Supervisor};
use crate::account::Account;
use crate::events::EventLog;
use crate::reaper::{Exit, Reaper};

/// The port the IDE listens on inside the sandbox (loopback only).
pub const PORT: u16 = 8888;
/// How the IDE is supervised: JupyterLab takes long to answer its first request.
const POLICY: Policy = Policy {
    ready_timeout: Duration::from_secs(90),
    probe_every: Duration::from_millis(250),
    max_crashes: 5,
    stable: Duration::from_secs(60),
    backoff_first: Duration::from_millis(500),
    backoff_max: Duration::from_secs(30),
    stop_grace: Duration::from_secs(3),
};
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

pub struct Ide {
    cfg: IdeConfig,
    base_url: String,
    env: OnceLock<Vec<(String, String)>>,
    /// Its status, restarts and stop: the supervisor the desktop's components run under.
    sup: Supervisor,
    pid: Mutex<Option<(u32, u64)>>,
    spawner: Spawner,
    reaper: Arc<Reaper>,
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
            sup: Supervisor::new(POLICY, [cfg.kind.name()], events, logs),
            pid: Mutex::new(None),
            spawner: Spawner::start()?,
            reaper,
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
        self.sup
            .status(self.name())
            .expect("the supervisor knows its one component")
    }

    /// Moves whenever the status changes.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.sup.changes()
    }

    /// Asks for a fresh start (clears a give-up).
    pub fn request_restart(&self) {
        self.sup.request_restart(self.name());
    }

    /// Starts supervising, with the sandbox user's environment.
    pub fn run(self: &Arc<Self>, env: Vec<(String, String)>) {
        let _ = self.env.set(env);
        let me = self.clone();
        tokio::spawn(async move { me.supervise().await });
    }

    fn set(&self, f: impl FnOnce(&mut Status)) {
        self.sup.set(self.name(), f)
    }

    fn env(&self) -> Vec<(String, String)> {
        self.env.get().cloned().unwrap_or_default()
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
        let sup = &self.sup;
        let mut crashes = 0u32;
        let mut restarts = 0u32;
        let mut previous = None;
        let mut missing_reported = false;
        self.write_quiet_settings();
        loop {
            if sup.is_stopping() {
                return;
            }
            let Some(program) = self.program() else {
                if !self.wait_for_install(&mut missing_reported).await {
                    return;
                }
                continue;
            };
            missing_reported = false;
            let started = Instant::now();
            let (pid, mut exit) = match self.spawner.spawn(self.launch(&program)).await {
                Ok(pid) => (pid, self.reaper.watch(pid)),
                Err(e) => {
                    sup.start_failed(name, format!("cannot start: {e}"));
                    crashes += 1;
                    if !sup.back_off(name, &mut crashes, None).await {
                        return;
                    }
                    continue;
                }
            };
            let ended = self.watch_run(pid, &mut exit, restarts, previous).await;
            self.report_end(pid, &ended);
            if matches!(ended, Ended::Stopping) {
                return;
            }
            restarts += 1;
            previous = Some((ended.cause(), ended.exit()));
            if matches!(ended, Ended::Requested) {
                crashes = 0;
            } else if ended.crashed()
                && !sup
                    .after_crash(name, &mut crashes, started.elapsed(), ended.exit())
                    .await
            {
                return;
            }
        }
    }

    /// Reports the IDE's program missing (in full once, then only as the status's reason)
    /// and waits a while, or for a restart request. Answers false when the agent stops.
    async fn wait_for_install(&self, missing_reported: &mut bool) -> bool {
        let name = self.name();
        let sup = &self.sup;
        let reason = format!(
            "{} is not installed here (not found on the sandbox user's PATH): this \
             sandbox has no IDE server",
            self.cfg.program
        );
        if *missing_reported {
            self.set(|s| s.reason = reason.clone());
        } else {
            sup.start_failed(name, reason.clone());
            tracing::warn!(component = name, "{reason}");
            *missing_reported = true;
        }
        tokio::select! {
            _ = tokio::time::sleep(MISSING_RECHECK) => {}
            _ = sup.restart_requested(name) => {}
            _ = sup.stopped() => return false,
        }
        true
    }

    /// How to start the IDE server: as the sandbox user, in their home, logging to the
    /// component's log.
    fn launch(&self, program: &Path) -> Launch {
        let argv = match self.cfg.kind {
            IdeKind::Jupyterlab => {
                jupyterlab_argv(&program.to_string_lossy(), &self.base_url, &self.cfg.home)
            }
        };
        let a = &self.cfg.account;
        Launch {
            argv,
            env: self.env(),
            cwd: self.cfg.home.clone(),
            identity: a.needs_switch().then(|| (a.uid, a.gid, a.groups.clone())),
            log: self.sup.log_of(self.name()),
            pass_fd: None,
        }
    }

    /// Reports the IDE started and watches it until the run ends.
    async fn watch_run(
        &self,
        pid: u32,
        exit: &mut tokio::sync::oneshot::Receiver<Exit>,
        restarts: u32,
        previous: Option<(&'static str, Option<Exit>)>,
    ) -> Ended {
        let name = self.name();
        let sup = &self.sup;
        let start = crate::proc::start_time(pid).unwrap_or(u64::MAX);
        *self.pid.locked() = Some((pid, start));
        sup.started(name, pid, restarts);
        let mut ended = sup
            .until_ended(
                name,
                pid,
                exit,
                std::future::pending(),
                restarts,
                previous,
                format!("serving on 127.0.0.1:{PORT} under {}", self.base_url),
                || self.probe(),
                || {},
            )
            .await;
        if sup.is_stopping() {
            ended = Ended::Stopping;
        }
        ended
    }

    /// Kills what the IDE left in its process group and reports it down.
    fn report_end(&self, pid: u32, ended: &Ended) {
        // What it forked into its group (kernels, terminals' shells) goes with it.
        if let Some((pgid, start)) = self.pid.locked().take() {
            crate::proc::kill_group_since(pgid, start);
        }
        let reason = match ended {
            Ended::Exited(e) => super::describe(e),
            Ended::Unready => "did not answer in time".to_string(),
            Ended::Gone => "what it depends on went away".to_string(),
            Ended::Requested => "restart requested".to_string(),
            Ended::Stopping => "the agent is stopping".to_string(),
        };
        self.sup
            .ended(self.name(), pid, ended, &reason, ended.exit());
    }

    /// Whether the IDE answers its API under its base URL.
    async fn probe(&self) -> Result<(), String> {
        let url = format!("http://127.0.0.1:{PORT}{}api/status", self.base_url);
        let r = crate::browser::cdp::http()
            .get(&url)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        match r.status().as_u16() {
            200 => Ok(()),
            s => Err(format!("GET {url} answered {s}")),
        }
    }

    /// Stops the IDE (its supervisor kills it) and waits for that, bounded.
    pub async fn shutdown(&self) {
        self.sup.begin_stop();
        let mut changed = self.changes();
        let grace = self.sup.policy().stop_grace;
        let deadline = tokio::time::Instant::now() + grace * 2 + Duration::from_secs(1);
        while self.pid.locked().is_some() {
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
