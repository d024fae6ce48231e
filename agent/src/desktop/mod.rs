//! The desktop: the agent starts the visible workstation itself and keeps it alive. Xvnc (the
//! X server with VNC on a private Unix socket), the D-Bus buses and the AT-SPI bus, the
//! session's parts started by the agent itself — XFCE's or GNOME's (`session.rs` lists them),
//! never through `xfce4-session` or `gnome-session`, whose own restarting would hide crashes — and
//! Chromium. Each component is started once those it waits for are ready (the one before it;
//! XFCE's panel and desktop side by side after the window manager), restarted with
//! exponential backoff when it dies, and given up on after repeated crashes; every change is
//! an event. When the X server dies, everything that draws on it is restarted with it, which
//! does not count as their crash. Components die with the agent on any exit (a parent-death
//! signal), and the next agent starts them afresh.

mod claim;
pub mod ide;
pub mod probe;
pub mod ready;
pub mod session;
mod spawn;
pub mod state;
pub mod supervisor;
pub mod vnc;

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_protocol::events::EventKind;
use berth_protocol::sync::Locked;
use serde_json::json;
use tokio::sync::{Notify, watch};

use crate::account::Account;
use crate::display::conn::Target;
use crate::display::xauth::{self, Cookie};
use crate::events::EventLog;
use crate::reaper::{Exit, Reaper};
pub use session::{BrowserStart, Component, SessionKind};
use session::{ReadyWhen, RunAs, Socket};
use spawn::{Launch, Spawner};
use supervisor::{Ended, Policy, Supervisor};

/// A component that does not become ready within this long counts as a failed start.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How the session's components are supervised.
const POLICY: Policy = Policy {
    ready_timeout: READY_TIMEOUT,
    probe_every: Duration::from_millis(20),
    max_crashes: 5,
    stable: Duration::from_secs(60),
    backoff_first: Duration::from_millis(250),
    backoff_max: Duration::from_secs(30),
    stop_grace: STOP_GRACE,
};
/// After the browser quit on its own (a SIGTERM, a clean exit: OSWorld's `pkill chrome`), how
/// long the desktop waits for one the user starts on its profile (`google-chrome
/// --remote-debugging-port=…`) before starting its own. A crash is restarted without waiting.
const ADOPT_GRACE: Duration = Duration::from_secs(5);
/// How long the user's browser gets to take the profile, watched this often.
const ADOPT_POLL: Duration = Duration::from_millis(100);
/// How long a component gets between SIGTERM and SIGKILL when it is stopped.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// How long a client that needs the browser waits for an idle on-demand one to start.
pub const BROWSER_WAIT: Duration = READY_TIMEOUT;
/// How often an idle on-demand browser's profile is checked for one the user started.
const IDLE_POLL: Duration = Duration::from_millis(250);

pub struct DesktopConfig {
    /// Which session runs (its components, their order and readiness).
    pub session: SessionKind,
    pub state_dir: PathBuf,
    pub home: PathBuf,
    pub account: Account,
    pub screen: (u16, u16),
    /// A display number asked for (`--display`); otherwise Xvnc picks a free one.
    pub display: Option<String>,
    pub chromium: String,
    /// The sandbox user's Xauthority file: the desktop's cookie is written there.
    pub xauthority: PathBuf,
}

/// One component's condition, as `/v1/ready` reports it.
pub use berth_protocol::desktop::ComponentStatus as Status;

/// A status entering `state` now.
pub(crate) fn new_status(state: &str, reason: impl Into<String>) -> Status {
    Status {
        ok: state_ok(state),
        state: state.to_string(),
        reason: reason.into(),
        since: crate::time::now_rfc3339(),
        pid: None,
        restarts: 0,
    }
}

/// Whether a component in `state` does its part: running, or an on-demand browser waiting to
/// be asked for (`idle`).
fn state_ok(state: &str) -> bool {
    matches!(state, "up" | "idle")
}

/// Where Chromium's DevTools endpoint is while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevTools {
    pub port: u16,
    /// `/devtools/browser/<id>`.
    pub browser_path: String,
}

pub struct Desktop {
    cfg: DesktopConfig,
    pub display: String,
    /// The X server admits only holders of this cookie.
    pub x_cookie: Cookie,
    /// The server's copy of the cookie (`-auth`), readable by the agent alone.
    x_auth_file: PathBuf,
    pub vnc_socket: PathBuf,
    pub session_bus: PathBuf,
    /// The session bus's configuration (`session_bus_config`), or None to run it on the
    /// system's session configuration as it is.
    bus_config: Option<PathBuf>,
    pub bin_dir: PathBuf,
    dir: PathBuf,
    logs: PathBuf,
    profile: PathBuf,
    /// What runs as the browser (`/usr/lib/chromium/chrome` where the image links it).
    browser: PathBuf,
    env: Mutex<Vec<(String, String)>>,
    chromium_no_sandbox: AtomicBool,
    /// Every component's status, restarts and stop.
    sup: Supervisor,
    /// Each running component's pid (also its process group) and start time, mirrored to
    /// `desktop/groups` so the next agent can clear what a crashed one left behind.
    groups: Mutex<BTreeMap<&'static str, (u32, u64)>>,
    /// Moves when the X server goes away (its dependents restart with it).
    x_epoch: watch::Sender<u64>,
    /// Asks an idle on-demand browser to start.
    browser_wanted: Notify,
    devtools: Mutex<Option<DevTools>>,
    /// The DevTools port an adopted browser was started with (`--remote-debugging-port=N`,
    /// N > 0: such a browser writes no DevToolsActivePort).
    adopted_port: Mutex<Option<u16>>,
    spawner: Spawner,
    events: Arc<EventLog>,
    reaper: Arc<Reaper>,
    /// The X server started before the agent's domains were built, handed to its supervisor.
    first_x: Mutex<Option<(u32, tokio::sync::oneshot::Receiver<Exit>)>>,
    /// The display this agent claimed (none when one was asked for), held for its life so no
    /// other agent takes it while the X server restarts.
    _display_claim: Option<claim::DisplayClaim>,
}

impl Desktop {
    /// Starts the X server (so its display is known before anything else is built) and the
    /// session bus (so every child's environment can name it). The rest starts in `run`.
    pub async fn start(
        cfg: DesktopConfig,
        events: Arc<EventLog>,
        reaper: Arc<Reaper>,
    ) -> anyhow::Result<Arc<Desktop>> {
        let dir = cfg.state_dir.join("desktop");
        make_dir(&dir, 0o700)?;
        clear_leftovers(&dir);
        let logs = cfg.state_dir.join("components");
        make_dir(&logs, 0o700)?;
        // The session bus socket lives where the sandbox user can create it.
        let session_dir = cfg.state_dir.join("session");
        make_dir(&session_dir, 0o700)?;
        if cfg.account.needs_switch() {
            std::os::unix::fs::chown(&session_dir, Some(cfg.account.uid), Some(cfg.account.gid))?;
        }
        let bin_dir = cfg.state_dir.join("desktop-bin");
        make_dir(&bin_dir, 0o755)?;
        let bus_config = session_bus_config(&cfg.state_dir.join("session-bus"))?;
        // Where Google Chrome keeps its profile: OSWorld's getters read it there.
        let profile = cfg.home.join(".config").join("google-chrome");
        let browser = browser_binary(&cfg.chromium)?;
        let x_cookie = Cookie::generate()?;
        let x_auth_file = dir.join("xauth");
        xauth::write_private(&x_auth_file, &xauth::server_file(&x_cookie), None)?;
        let spawner = Spawner::start()?;
        let (x_epoch, _) = watch::channel(0);
        let sup = Supervisor::new(
            POLICY,
            cfg.session.components().iter().map(|c| c.name()),
            events.clone(),
            logs.clone(),
        );
        let mut desktop = Desktop {
            browser,
            display: String::new(),
            x_cookie,
            x_auth_file,
            vnc_socket: dir.join("vnc.sock"),
            session_bus: session_dir.join("bus"),
            bus_config,
            bin_dir,
            dir,
            logs,
            profile,
            env: Mutex::new(Vec::new()),
            chromium_no_sandbox: AtomicBool::new(false),
            sup,
            groups: Mutex::new(BTreeMap::new()),
            x_epoch,
            browser_wanted: Notify::new(),
            devtools: Mutex::new(None),
            adopted_port: Mutex::new(None),
            spawner,
            events,
            reaper,
            first_x: Mutex::new(None),
            _display_claim: None,
            cfg,
        };
        let (display, pid, held) = desktop.start_x_first().await?;
        desktop.write_client_cookie(&display)?;
        desktop.display = display;
        desktop._display_claim = held;
        let exit = desktop.reaper.watch(pid);
        *desktop.first_x.locked() = Some((pid, exit));
        Ok(Arc::new(desktop))
    }

    /// Supervises every component. `env` is the sandbox user's environment (DISPLAY, the
    /// session bus, …).
    pub fn run(self: &Arc<Self>, env: Vec<(String, String)>) {
        *self.env.locked() = env;
        let me = self.clone();
        tokio::spawn(async move {
            let no_sandbox = me.chromium_needs_no_sandbox().await;
            me.chromium_no_sandbox.store(no_sandbox, Ordering::SeqCst);
            if let Err(e) = me.write_browser_commands() {
                tracing::warn!(error = %e, "cannot write the google-chrome command");
            }
            // Each starts once what it waits for is ready (or failed to be). Every watch is
            // taken before any component starts, so no readiness is missed.
            for &component in me.cfg.session.components() {
                let after: Vec<_> = me
                    .cfg
                    .session
                    .waits_for(component)
                    .iter()
                    .map(|c| me.watch_ready(c.name()))
                    .collect();
                let d = me.clone();
                tokio::spawn(async move {
                    futures_util::future::join_all(after).await;
                    d.supervise(component).await
                });
            }
        });
    }

    /// Resolves once `name` is up or has failed a start attempt.
    fn watch_ready(
        self: &Arc<Self>,
        name: &'static str,
    ) -> impl std::future::Future<Output = ()> + use<> {
        let mut rx = self.sup.changes();
        let me = self.clone();
        async move {
            let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
            loop {
                let settled = me.sup.status(name).is_some_and(|s| s.state != "starting");
                if settled
                    || tokio::time::timeout_at(deadline, rx.changed())
                        .await
                        .is_err()
                {
                    return;
                }
            }
        }
    }

    /// The X server as the agent's own clients reach it (with the cookie).
    pub fn x_target(&self) -> Target {
        Target::new(self.display.clone(), Some(self.x_cookie))
    }

    /// The sandbox user's Xauthority file gets the cookie for `display` (mode 0600, theirs).
    fn write_client_cookie(&self, display: &str) -> anyhow::Result<()> {
        let number = xauth::display_number(display)
            .ok_or_else(|| anyhow::anyhow!("cannot read a display number from {display:?}"))?;
        let a = &self.cfg.account;
        let owner = a.needs_switch().then_some((a.uid, a.gid));
        let bytes = xauth::client_file(&self.x_cookie, number, &xauth::hostname());
        xauth::write_private(&self.cfg.xauthority, &bytes, owner).map_err(|e| {
            anyhow::anyhow!(
                "writing the X cookie to {}: {e}",
                self.cfg.xauthority.display()
            )
        })
    }

    pub fn statuses(&self) -> BTreeMap<&'static str, Status> {
        self.sup.statuses()
    }

    /// Moves whenever a component's status changes.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.sup.changes()
    }

    pub fn devtools(&self) -> Option<DevTools> {
        self.devtools.locked().clone()
    }

    pub fn session(&self) -> SessionKind {
        self.cfg.session
    }

    /// The browser's DevTools endpoint for a client that needs it now: an idle on-demand
    /// browser is started and waited for, at most `wait`. None when it is not up by then (an
    /// always-running browser that is down is not waited for: its supervisor restarts it).
    pub async fn browser(&self, wait: Duration) -> Option<DevTools> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut changed = self.sup.changes();
        loop {
            if let Some(dt) = self.devtools() {
                return Some(dt);
            }
            let gave_up = self
                .sup
                .status(Component::Browser.name())
                .is_some_and(|s| s.state == "gave_up");
            if self.cfg.session.browser_start() != BrowserStart::OnDemand
                || gave_up
                || tokio::time::Instant::now() >= deadline
            {
                return None;
            }
            // No permit is stored: a request made while the browser runs must not start the
            // next one after it closes. Asked again each poll until it is up.
            self.browser_wanted.notify_waiters();
            let until = (tokio::time::Instant::now() + IDLE_POLL).min(deadline);
            let _ = tokio::time::timeout_at(until, changed.changed()).await;
        }
    }

    /// An on-demand browser's wait while none runs: until a client asks for one (`Some(None)`:
    /// start it), the user starts one on the profile (`Some(Some(found))`: adopt it), or the
    /// agent stops (`None`).
    async fn idle_browser(&self) -> Option<Option<(u32, u64)>> {
        self.set(Component::Browser.name(), |s| {
            s.state = "idle".into();
            s.reason = "not running: starts when a client needs it (CDP, /v1/browser) or \
                        follows one the user starts"
                .into();
            s.pid = None;
        });
        loop {
            if let Some(found) = self.foreign_browser(None) {
                return Some(Some(found));
            }
            tokio::select! {
                _ = self.browser_wanted.notified() => return Some(None),
                // `POST /v1/browser/restart` asks for a fresh one.
                _ = self.sup.restart_requested(Component::Browser.name()) => return Some(None),
                _ = tokio::time::sleep(IDLE_POLL) => {}
                _ = self.stopped() => return None,
            }
        }
    }

    /// Records (or forgets) a component's process group and rewrites `desktop/groups`.
    /// Returns the group it replaces.
    fn set_group(&self, name: &'static str, group: Option<(u32, u64)>) -> Option<(u32, u64)> {
        let mut groups = self.groups.locked();
        let old = match group {
            Some(g) => groups.insert(name, g),
            None => groups.remove(name),
        };
        let text: String = groups
            .values()
            .map(|(pid, start)| format!("{pid} {start}\n"))
            .collect();
        if let Err(e) = std::fs::write(self.dir.join("groups"), text) {
            tracing::warn!(error = %e, "cannot record the desktop's process groups");
        }
        old
    }

    pub fn pid(&self, name: &str) -> Option<u32> {
        self.groups.locked().get(name).map(|(pid, _)| *pid)
    }

    /// Asks for a fresh start of one component (clears a give-up).
    pub fn request_restart(&self, name: &str) -> bool {
        self.sup.request_restart(name)
    }

    fn set(&self, name: &'static str, f: impl FnOnce(&mut Status)) {
        self.sup.set(name, f)
    }

    fn env(&self) -> Vec<(String, String)> {
        self.env.locked().clone()
    }

    fn identity(&self) -> Option<(u32, u32, Vec<u32>)> {
        let a = &self.cfg.account;
        a.needs_switch().then(|| (a.uid, a.gid, a.groups.clone()))
    }

    fn xvnc_argv(&self, display: Option<&str>, displayfd: Option<i32>) -> Vec<String> {
        let (w, h) = self.cfg.screen;
        let mut argv = vec!["Xvnc".to_string()];
        if let Some(d) = display {
            argv.push(d.to_string());
        }
        if let Some(fd) = displayfd {
            argv.extend(["-displayfd".into(), fd.to_string()]);
        }
        argv.extend(
            [
                "-geometry",
                &format!("{w}x{h}"),
                "-depth",
                "24",
                "-rfbunixpath",
                &self.vnc_socket.to_string_lossy(),
                "-rfbunixmode",
                "0600",
                // No TCP listener: the agent's relay is the only way in.
                "-rfbport",
                "-1",
                "-SecurityTypes",
                "None",
                // Xvnc blacklists an address after a few connections that end before the
                // handshake (readiness probes do); every viewer arrives from the same socket,
                // already authenticated by the agent.
                "-BlacklistThreshold",
                "1000000",
                "-AlwaysShared",
                "-AcceptSetDesktopSize=0",
                // Text copied in the sandbox reaches no viewer (every viewer would get it: the
                // relay filters only the viewers' direction); it leaves through
                // GET /v1/clipboard, the holder's alone while a person holds the controls.
                "-SendCutText=0",
                "-desktop",
                "berth",
                "-auth",
                &self.x_auth_file.to_string_lossy(),
                "-nolisten",
                "tcp",
                "-noreset",
            ]
            .map(String::from),
        );
        argv
    }

    /// The first X server: on the display asked for, or on one claimed for this agent's life
    /// (`claim`); another tried when the server cannot take the one claimed (an X server
    /// outside berth took it meanwhile). Xvnc reports its display (`-displayfd`) once it
    /// accepts clients.
    async fn start_x_first(&self) -> anyhow::Result<(String, u32, Option<claim::DisplayClaim>)> {
        let mut refused = std::collections::HashSet::new();
        loop {
            let (target, held) = match &self.cfg.display {
                Some(d) => (d.clone(), None),
                None => {
                    let c = claim::claim(&refused)?;
                    (c.display(), Some(c))
                }
            };
            match self.start_x_on(&target).await {
                Ok(pid) => return Ok((target, pid, held)),
                Err(e) => match held {
                    Some(c) if refused.len() < 4 => {
                        tracing::warn!(display = %target, error = %e, "the X server could not take its display; trying another");
                        refused.insert(c.number);
                    }
                    _ => return Err(e),
                },
            }
        }
    }

    /// Xvnc on `display`, once it has reported the display ready.
    async fn start_x_on(&self, display: &str) -> anyhow::Result<u32> {
        self.clean_before_start(Component::X);
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let pid = self
            .spawn_component(
                Component::X,
                self.xvnc_argv(Some(display), Some(3)),
                Some((write, 3)),
            )
            .await?;
        let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(read)?;
        let mut got = Vec::new();
        let read_number = async {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 16];
            while !got.contains(&b'\n') {
                let n = rx.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            std::io::Result::Ok(())
        };
        match tokio::time::timeout(Duration::from_secs(15), read_number).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => anyhow::bail!("reading Xvnc's display number: {e}"),
            Err(_) => anyhow::bail!("Xvnc did not report {display} ready within 15 s"),
        }
        let number = String::from_utf8_lossy(&got).trim().to_string();
        if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
            anyhow::bail!(
                "Xvnc exited before {display} was ready (see {})",
                self.logs.join("x.log").display()
            );
        }
        Ok(pid)
    }

    async fn spawn_component(
        &self,
        component: Component,
        argv: Vec<String>,
        pass_fd: Option<(std::os::fd::OwnedFd, i32)>,
    ) -> std::io::Result<u32> {
        let name = component.name();
        let as_user = component.runs_as() == RunAs::User;
        if component.runs_as() == RunAs::Root && !nix::unistd::Uid::effective().is_root() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{name} runs as root, and this agent does not"),
            ));
        }
        let mut env = if as_user {
            let mut env = self.env();
            env.extend(
                self.cfg
                    .session
                    .env()
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            );
            env
        } else {
            vec![(
                "PATH".to_string(),
                std::env::var("PATH").unwrap_or_else(|_| crate::account::DEFAULT_PATH.into()),
            )]
        };
        if component == Component::Browser {
            // Google Chrome's window class (`Google-chrome`), as the google-chrome command sets.
            env.push(("CHROME_DESKTOP".into(), "google-chrome.desktop".into()));
            // Expose the browser's tree (pages included) on the AT-SPI bus.
            env.push(("ACCESSIBILITY_ENABLED".into(), "1".into()));
        }
        let pid = self
            .spawner
            .spawn(Launch {
                argv,
                env,
                cwd: match component.runs_as() {
                    RunAs::User => self.cfg.home.clone(),
                    RunAs::Root => PathBuf::from("/"),
                    RunAs::Agent => self.dir.clone(),
                },
                identity: if as_user { self.identity() } else { None },
                log: self.logs.join(format!("{name}.log")),
                pass_fd,
            })
            .await?;
        // A child already gone has no start time: its group is then never swept.
        let start = crate::proc::start_time(pid).unwrap_or(u64::MAX);
        self.set_group(name, Some((pid, start)));
        Ok(pid)
    }

    fn argv(&self, component: Component) -> Vec<String> {
        match component {
            Component::X => self.xvnc_argv(Some(&self.display), None),
            Component::SessionBus => vec![
                "dbus-daemon".into(),
                match &self.bus_config {
                    Some(c) => format!("--config-file={}", c.display()),
                    None => "--session".into(),
                },
                "--nofork".into(),
                "--nopidfile".into(),
                format!("--address=unix:path={}", self.session_bus.display()),
            ],
            Component::Browser => self.chromium_argv(),
            other => other.argv().iter().map(|a| a.to_string()).collect(),
        }
    }

    /// The flags every browser on the desktop's profile runs with: the supervised one and one
    /// the user starts with `google-chrome` (whose own flags come after, so they win).
    fn browser_flags(&self) -> Vec<String> {
        let mut argv = vec![
            format!("--user-data-dir={}", self.profile.display()),
            // Loopback only, on a port the browser picks (written to DevToolsActivePort).
            "--remote-debugging-address=127.0.0.1".into(),
            "--remote-debugging-port=0".into(),
            "--remote-allow-origins=*".into(),
            "--password-store=basic".into(),
            "--no-first-run".into(),
            "--no-default-browser-check".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-default-apps".into(),
            "--disable-breakpad".into(),
            "--disable-domain-reliability".into(),
            "--metrics-recording-only".into(),
            "--disable-features=Translate,MediaRouter,OptimizationHints".into(),
            "--force-renderer-accessibility".into(),
            "--start-maximized".into(),
            // The browser is often killed (SIGKILL after a stop's grace): no "Restore pages?"
            // bubble over the next page.
            "--hide-crash-restore-bubble".into(),
        ];
        if self.chromium_no_sandbox.load(Ordering::SeqCst) {
            argv.push("--no-sandbox".into());
        }
        argv
    }

    fn chromium_argv(&self) -> Vec<String> {
        let mut argv = vec![self.browser.to_string_lossy().into_owned()];
        argv.extend(self.browser_flags());
        argv.push("about:blank".into());
        argv
    }

    /// `google-chrome` (what OSWorld tasks launch; Debian has none): the desktop's browser on
    /// its profile. While the desktop's browser runs, the profile hands the request to it (a
    /// new window); after `pkill chrome` it starts the browser the desktop then adopts.
    fn write_browser_commands(&self) -> std::io::Result<()> {
        let quote = |a: &str| format!("'{}'", a.replace('\'', r"'\''"));
        let mut line = vec![quote(&self.browser.to_string_lossy())];
        line.extend(self.browser_flags().iter().map(|f| quote(f)));
        let script = format!(
            "#!/bin/sh\n# berth: the desktop's browser (Chromium, as Google Chrome) on its profile.\n\
             export CHROME_DESKTOP=google-chrome.desktop ACCESSIBILITY_ENABLED=1\n\
             exec {} \"$@\"\n",
            line.join(" ")
        );
        for name in ["google-chrome", "google-chrome-stable"] {
            let path = self.bin_dir.join(name);
            let tmp = self.bin_dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, &script)?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
            std::fs::rename(&tmp, &path)?;
        }
        Ok(())
    }

    /// A live browser on the desktop's profile that the desktop did not start (`SingletonLock`
    /// names its host and pid; its command line must name the profile, so a recycled pid is
    /// never taken for it). `not`: the pid of the browser that just ended.
    fn foreign_browser(&self, not: Option<u32>) -> Option<(u32, u64)> {
        let lock = std::fs::read_link(self.profile.join("SingletonLock")).ok()?;
        let lock = lock.to_string_lossy();
        let (host, pid) = lock.rsplit_once('-')?;
        if host.as_bytes() != xauth::hostname().as_slice() {
            return None;
        }
        let pid: u32 = pid.parse().ok()?;
        if Some(pid) == not {
            return None;
        }
        let start = crate::proc::start_time(pid)?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let profile_flag = format!("--user-data-dir={}", self.profile.display());
        // Chromium rewrites its command line as one string of space-separated arguments.
        let flag = profile_flag.as_bytes();
        let names_profile = cmdline.windows(flag.len()).enumerate().any(|(i, w)| {
            w == flag && matches!(cmdline.get(i + flag.len()), None | Some(0) | Some(b' '))
        });
        (names_profile && crate::proc::is_alive(pid, start)).then_some((pid, start))
    }

    /// Waits up to `grace` for a browser the user starts on the profile.
    async fn wait_for_foreign(&self, not: Option<u32>, grace: Duration) -> Option<(u32, u64)> {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            if let Some(found) = self.foreign_browser(not) {
                return Some(found);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::select! {
                _ = tokio::time::sleep(ADOPT_POLL) => {}
                _ = self.stopped() => return None,
            }
        }
    }

    /// Its end, as the supervisor waits for a component's: an adopted browser is not the
    /// agent's child (the user's command started it), so its exit is seen in `/proc`.
    fn watch_foreign(pid: u32, start: u64) -> tokio::sync::oneshot::Receiver<Exit> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            while crate::proc::is_alive(pid, start) && !tx.is_closed() {
                tokio::time::sleep(ADOPT_POLL).await;
            }
            let _ = tx.send(Exit {
                code: None,
                signal: None,
            });
        });
        rx
    }

    /// Chromium's sandbox needs unprivileged user namespaces (Debian ships no setuid sandbox);
    /// as root, or where namespaces are refused (many containers), it must run without.
    async fn chromium_needs_no_sandbox(&self) -> bool {
        let runs_as_root = if self.cfg.account.needs_switch() {
            self.cfg.account.uid == 0
        } else {
            nix::unistd::Uid::effective().is_root()
        };
        if runs_as_root {
            tracing::info!("chromium runs as root: --no-sandbox");
            return true;
        }
        let probe = self
            .spawner
            .spawn(Launch {
                argv: vec!["unshare".into(), "--user".into(), "true".into()],
                env: self.env(),
                cwd: self.cfg.home.clone(),
                identity: self.identity(),
                log: self.logs.join("sandbox-probe.log"),
                pass_fd: None,
            })
            .await;
        let works = match probe {
            Ok(pid) => {
                let exit = self.reaper.watch(pid);
                matches!(
                    tokio::time::timeout(Duration::from_secs(5), exit).await,
                    Ok(Ok(Exit { code: Some(0), .. }))
                )
            }
            Err(_) => false,
        };
        if !works {
            tracing::info!("user namespaces are not available here: chromium gets --no-sandbox");
        }
        !works
    }

    /// The component's readiness probe, polled until it passes.
    async fn probe(&self, component: Component) -> probe::Probe {
        let display = self.x_target();
        let blocking = |f: Box<dyn FnOnce() -> probe::Probe + Send>| async move {
            tokio::task::spawn_blocking(f)
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        };
        match component.ready_when() {
            ReadyWhen::XAndVnc => {
                blocking(Box::new(move || probe::x_server(&display))).await?;
                probe::rfb_socket(&self.vnc_socket).await
            }
            ReadyWhen::Socket(socket) => probe::socket_accepts(&self.socket(socket)).await,
            ReadyWhen::Selection(selection, what) => {
                blocking(Box::new(move || {
                    probe::selection_owned(&display, selection, what)
                }))
                .await
            }
            ReadyWhen::WindowMapped(class) => {
                blocking(Box::new(move || probe::window_mapped(&display, class))).await
            }
            ReadyWhen::BusName(name) => probe::bus_name_owned(&self.session_bus, name).await,
            ReadyWhen::ShellStarted => {
                blocking(Box::new(move || {
                    probe::selection_owned(&display, "WM_S0", "window manager")
                }))
                .await?;
                probe::shell_started(&self.session_bus, session::DOCK_EXTENSION).await
            }
            ReadyWhen::DevTools => self.probe_devtools().await,
            ReadyWhen::Running => Ok(()),
        }
    }

    /// Where a component's socket is.
    fn socket(&self, socket: Socket) -> PathBuf {
        match socket {
            Socket::SystemBus => PathBuf::from(session::SYSTEM_BUS_SOCKET),
            Socket::SessionBus => self.session_bus.clone(),
            Socket::Audio => self.runtime_dir().join("pulse").join("native"),
        }
    }

    /// The sandbox user's runtime dir (`XDG_RUNTIME_DIR` of their environment).
    fn runtime_dir(&self) -> PathBuf {
        self.env()
            .into_iter()
            .find(|(k, _)| k == "XDG_RUNTIME_DIR")
            .map(|(_, v)| PathBuf::from(v))
            .unwrap_or_else(|| self.cfg.state_dir.join("run"))
    }

    async fn probe_devtools(&self) -> probe::Probe {
        let adopted_port = *self.adopted_port.locked();
        let (port, browser_path) = match adopted_port {
            Some(port) => {
                let v = crate::browser::cdp::version(port).await?;
                let url = v["webSocketDebuggerUrl"].as_str().unwrap_or_default();
                let path = url
                    .find("/devtools/browser/")
                    .map(|i| url[i..].to_string())
                    .ok_or_else(|| format!("/json/version on port {port} names no browser"))?;
                (port, path)
            }
            None => self.devtools_active_port()?,
        };
        // Up means a page can be opened (a renderer that cannot start fails here), not only
        // that the DevTools port answers.
        tokio::time::timeout(
            Duration::from_secs(10),
            crate::browser::cdp::open_page(port, &browser_path),
        )
        .await
        .map_err(|_| "opening a page took longer than 10 s".to_string())??;
        *self.devtools.locked() = Some(DevTools { port, browser_path });
        Ok(())
    }

    /// The port and browser path the browser wrote to `DevToolsActivePort`.
    fn devtools_active_port(&self) -> Result<(u16, String), String> {
        let file = self.profile.join("DevToolsActivePort");
        let text = std::fs::read_to_string(&file)
            .map_err(|_| "the browser has not opened its DevTools port yet".to_string())?;
        let mut lines = text.lines();
        let port: u16 = lines
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or("DevToolsActivePort holds no port")?;
        let browser_path = lines
            .next()
            .map(|l| l.trim().to_string())
            .filter(|p| p.starts_with("/devtools/browser/"))
            .ok_or("DevToolsActivePort holds no browser path")?;
        Ok((port, browser_path))
    }

    /// Before a start: what a previous run of the component left behind.
    fn clean_before_start(&self, component: Component) {
        match component {
            Component::X => {
                let _ = std::fs::remove_file(&self.vnc_socket);
            }
            Component::SessionBus => {
                let _ = std::fs::remove_file(&self.session_bus);
            }
            Component::SystemBus => {
                let socket = Path::new(session::SYSTEM_BUS_SOCKET);
                let _ = std::fs::remove_file(socket);
                if let Some(dir) = socket.parent() {
                    let _ = make_dir(dir, 0o755);
                }
            }
            Component::Browser => {
                *self.devtools.locked() = None;
                *self.adopted_port.locked() = None;
                let _ = std::fs::remove_file(self.profile.join("DevToolsActivePort"));
                // Locks of a browser that died with a previous agent (no supervised browser
                // runs now), so the profile is not "in use by another computer".
                for f in ["SingletonLock", "SingletonSocket", "SingletonCookie"] {
                    let _ = std::fs::remove_file(self.profile.join(f));
                }
            }
            _ => {}
        }
    }

    async fn x_reachable(&self) -> bool {
        let display = self.x_target();
        tokio::task::spawn_blocking(move || probe::x_server(&display).is_ok())
            .await
            .unwrap_or(false)
    }

    /// Until the components this one waits for are up (or given up on), at most
    /// `READY_TIMEOUT`: one that cannot start must not hold the rest back for ever.
    async fn wait_for_predecessor(&self, component: Component) {
        let before = self.cfg.session.waits_for(component);
        if before.is_empty() {
            return;
        }
        let mut rx = self.sup.changes();
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            let settled = before.iter().all(|c| {
                self.sup
                    .status(c.name())
                    .is_some_and(|s| matches!(s.state.as_str(), "up" | "gave_up"))
            });
            if settled
                || self.sup.is_stopping()
                || tokio::time::timeout_at(deadline, rx.changed())
                    .await
                    .is_err()
            {
                return;
            }
        }
    }

    async fn wait_for_x(&self) {
        let mut rx = self.sup.changes();
        loop {
            if self.sup.is_stopping() {
                return;
            }
            if self.sup.status("x").is_some_and(|s| s.ok) {
                return;
            }
            let _ = rx.changed().await;
        }
    }

    /// One component's life: start, wait until ready, watch, restart.
    async fn supervise(self: Arc<Self>, component: Component) {
        let name = component.name();
        let on_demand = component == Component::Browser
            && self.cfg.session.browser_start() == BrowserStart::OnDemand;
        let mut history = RunHistory::default();
        loop {
            if !self.wait_for_turn(component).await {
                return;
            }
            let mut x_epoch = self.x_epoch.subscribe();
            x_epoch.mark_unchanged();
            let epoch_at_start = *x_epoch.borrow();
            let started = Instant::now();
            // The first X server was started before the agent's domains existed.
            let first = if component == Component::X {
                self.first_x.locked().take()
            } else {
                None
            };
            if component == Component::Browser && first.is_none() && history.adopt.is_none() {
                match self.look_for_browser(on_demand, &mut history).await {
                    Next::Proceed => {}
                    Next::Repeat => continue,
                    Next::Quit => return,
                }
            }
            let adopted = history.adopt.take();
            let (pid, mut exit) = match (first, adopted) {
                (Some(p), _) => p,
                (None, Some((pid, start))) => self.take_over_browser(name, pid, start),
                (None, None) => match self.start_component(component, &mut history).await {
                    Ok(p) => p,
                    Err(Next::Quit) => return,
                    Err(_) => continue,
                },
            };
            let run = Run {
                pid,
                adopted: adopted.is_some(),
                started,
            };
            let ended = self
                .watch_run(component, pid, &mut exit, x_epoch, &history)
                .await;
            let ended = self.settle_end(component, ended, epoch_at_start).await;
            let down_exit = self.report_end(component, &run, &ended);
            if matches!(ended, Ended::Stopping) {
                return;
            }
            history.last_exit = down_exit;
            history.restarts += 1;
            history.cause = Some(ended.cause());
            if !self
                .after_run(component, on_demand, &run, &ended, &mut history)
                .await
            {
                return;
            }
        }
    }

    /// Before a browser start: finds one the user started on the profile, and leaves an
    /// on-demand browser idle until it is asked for (or the user starts one).
    async fn look_for_browser(&self, on_demand: bool, history: &mut RunHistory) -> Next {
        history.adopt = self.foreign_browser(None);
        if on_demand && history.adopt.is_none() && !std::mem::take(&mut history.start_now) {
            match self.idle_browser().await {
                Some(found) => {
                    history.start_now = found.is_none();
                    history.adopt = found;
                }
                None => return Next::Quit,
            }
            // The X server may have gone while the browser idled.
            return Next::Repeat;
        }
        Next::Proceed
    }

    /// Supervises the browser the user started on the profile instead of starting one: takes
    /// its DevTools port and its process, and announces the adoption.
    fn take_over_browser(
        &self,
        name: &'static str,
        pid: u32,
        start: u64,
    ) -> (u32, tokio::sync::oneshot::Receiver<Exit>) {
        let port = std::fs::read(format!("/proc/{pid}/cmdline"))
            .ok()
            .and_then(|c| debugging_port(&c));
        *self.adopted_port.locked() = port;
        // The file is the ended browser's, or the adopted one's own (port 0).
        if port.is_some() {
            let _ = std::fs::remove_file(self.profile.join("DevToolsActivePort"));
        }
        self.set_group(name, Some((pid, start)));
        self.events
            .emit(EventKind::BrowserAdopted, json!({"pid": pid}));
        tracing::info!(pid, "adopted the browser the user started on the profile");
        (pid, Self::watch_foreign(pid, start))
    }

    /// Waits until the component may start: once its X server is up and the component
    /// before it settled. Answers false when the agent is stopping.
    async fn wait_for_turn(&self, component: Component) -> bool {
        if self.sup.is_stopping() {
            return false;
        }
        if component.needs_x() {
            self.wait_for_x().await;
            // On the first start and after an X restart, each waits for what it needs.
            self.wait_for_predecessor(component).await;
            if self.sup.is_stopping() {
                return false;
            }
        }
        true
    }

    /// Starts the component afresh. When it cannot start, reports that, counts it as a crash
    /// and backs off: answers `Repeat` to try again, `Quit` once it is given up.
    async fn start_component(
        &self,
        component: Component,
        history: &mut RunHistory,
    ) -> Result<(u32, tokio::sync::oneshot::Receiver<Exit>), Next> {
        let name = component.name();
        self.clean_before_start(component);
        match self
            .spawn_component(component, self.argv(component), None)
            .await
        {
            Ok(pid) => Ok((pid, self.reaper.watch(pid))),
            Err(e) => {
                self.sup.start_failed(name, format!("cannot start: {e}"));
                history.last_exit = None;
                history.crashes += 1;
                if !self
                    .sup
                    .back_off(name, &mut history.crashes, history.last_exit)
                    .await
                {
                    return Err(Next::Quit);
                }
                Err(Next::Repeat)
            }
        }
    }

    /// Reports the component started and watches it until the run ends: it exits, does not
    /// become ready, its X server goes, or a restart is asked for.
    async fn watch_run(
        &self,
        component: Component,
        pid: u32,
        exit: &mut tokio::sync::oneshot::Receiver<Exit>,
        mut x_epoch: watch::Receiver<u64>,
        history: &RunHistory,
    ) -> Ended {
        let name = component.name();
        let (restarts, cause, last_exit) = (history.restarts, history.cause, history.last_exit);
        self.sup.started(name, pid, restarts);
        let needs_x = component.needs_x();
        let x_gone = async move {
            if needs_x {
                let _ = x_epoch.changed().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        self.sup
            .until_ended(
                name,
                pid,
                exit,
                x_gone,
                restarts,
                cause.map(|c| (c, last_exit)),
                "running".into(),
                || self.probe(component),
                || {
                    if component == Component::Browser
                        && let Some(cause) = cause
                    {
                        self.events.emit(
                            EventKind::BrowserRestarted,
                            json!({"pid": pid, "cause": cause}),
                        );
                    }
                },
            )
            .await
    }

    /// Corrects how a run ended: any end while the agent stops is `Stopping`, and a client
    /// that exited because its X server died ended with the server (`Gone`).
    async fn settle_end(
        &self,
        component: Component,
        mut ended: Ended,
        epoch_at_start: u64,
    ) -> Ended {
        if self.sup.is_stopping() {
            ended = Ended::Stopping;
        }
        // A client of the X server often notices its death first and exits on its own:
        // that is the X server's failure, not this component's.
        if matches!(ended, Ended::Exited(_)) && component.needs_x() {
            let epoch_moved = *self.x_epoch.borrow() != epoch_at_start;
            if epoch_moved || !self.x_reachable().await {
                ended = Ended::Gone;
                if !epoch_moved {
                    let mut rx = self.x_epoch.subscribe();
                    let _ = tokio::time::timeout(
                        Duration::from_secs(5),
                        rx.wait_for(|e| *e != epoch_at_start),
                    )
                    .await;
                }
            }
        }
        ended
    }

    /// Cleans up after a run (what it left in its process group, the browser's DevTools)
    /// and reports the component down; answers its exit when it is known.
    fn report_end(&self, component: Component, run: &Run, ended: &Ended) -> Option<Exit> {
        let name = component.name();
        // Whatever the component forked into its group outlives it (the AT-SPI launcher's
        // bus daemon, say) unless killed here; the next start makes its own.
        if let Some((pgid, start)) = self.set_group(name, None) {
            crate::proc::kill_group_since(pgid, start);
        }
        if component == Component::Browser {
            *self.devtools.locked() = None;
        }
        let reason = match ended {
            Ended::Exited(_) if run.adopted => "the adopted browser exited".to_string(),
            Ended::Exited(e) => describe(e),
            Ended::Unready => "did not become ready in time".to_string(),
            Ended::Gone => "the X server went away".to_string(),
            Ended::Requested => "restart requested".to_string(),
            Ended::Stopping => "the agent is stopping".to_string(),
        };
        // An adopted browser is not the agent's child: how it ended is not known.
        let down_exit = if run.adopted { None } else { ended.exit() };
        self.sup.ended(name, run.pid, ended, &reason, down_exit);
        // Only once X reads as down: a dependent that sees the epoch move must not find
        // the old server's "up" and start again before the new one is ready.
        if component == Component::X {
            self.x_epoch.send_modify(|n| *n += 1);
        }
        down_exit
    }

    /// After a run that ended (not by the agent stopping), readies the next one: an
    /// on-demand browser waits to be asked for, a browser the user started is adopted, a
    /// crash backs off. Answers false once the component is given up.
    async fn after_run(
        &self,
        component: Component,
        on_demand: bool,
        run: &Run,
        ended: &Ended,
        history: &mut RunHistory,
    ) -> bool {
        if on_demand {
            // Closed or crashed, the browser stays away until it is asked for again (or
            // the user starts one); a restart request or the X server's return brings it
            // back at once.
            history.start_now = matches!(ended, Ended::Requested | Ended::Gone);
            return true;
        }
        if component == Component::Browser
            && let Ended::Exited(e) = ended
        {
            let grace = if run.adopted || quit_on_request(e) {
                ADOPT_GRACE
            } else {
                Duration::ZERO
            };
            history.adopt = self.wait_for_foreign(Some(run.pid), grace).await;
            if history.adopt.is_some() {
                history.cause = Some("adopted");
                return true;
            }
        }
        if matches!(ended, Ended::Requested) {
            history.crashes = 0;
        } else if ended.crashed()
            && !self
                .sup
                .after_crash(
                    component.name(),
                    &mut history.crashes,
                    run.started.elapsed(),
                    history.last_exit,
                )
                .await
        {
            return false;
        }
        true
    }

    /// Resolves once the agent is stopping (at once if it already is).
    fn stopped(&self) -> impl std::future::Future<Output = ()> + use<> {
        self.sup.stopped()
    }

    /// Stops every component at once (each supervisor: SIGTERM, SIGKILL after the grace
    /// period), then sweeps up whatever is left. Used on every agent exit.
    pub async fn shutdown(&self) {
        use nix::sys::signal::Signal;
        // Every process of the desktop, with its start time (a pid may be reused later).
        let trees: Vec<(u32, u64)> = {
            let g = self.groups.locked();
            g.values()
                .flat_map(|(pid, _)| {
                    let mut t = crate::proc::descendants(*pid);
                    t.push(*pid);
                    t
                })
                .filter_map(|pid| crate::proc::start_time(pid).map(|s| (pid, s)))
                .collect()
        };
        self.sup.begin_stop();
        let mut changed = self.sup.changes();
        let deadline = tokio::time::Instant::now() + STOP_GRACE * 2 + Duration::from_secs(1);
        while !self.groups.locked().is_empty() {
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                tracing::warn!("desktop components still running after the grace period");
                break;
            }
        }
        let mut killed = Vec::new();
        for (pid, start) in trees {
            if crate::proc::is_alive(pid, start) {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
                killed.push((pid, start));
            }
        }
        // A SIGKILL is not a death yet (a large process takes a while to tear down on a busy
        // machine): the agent exits once what it killed is gone, bounded.
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        while killed.iter().any(|(p, s)| crate::proc::is_alive(*p, *s))
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// What a component's supervision carries from one run to the next.
#[derive(Default)]
struct RunHistory {
    /// An on-demand browser asked for again at once (a restart request), not left idle.
    start_now: bool,
    crashes: u32,
    restarts: u32,
    cause: Option<&'static str>,
    /// What ended the previous run, for the restart and give-up events.
    last_exit: Option<Exit>,
    /// A browser the user started on the profile, to be supervised instead of a new one.
    adopt: Option<(u32, u64)>,
}

/// One run of a component.
struct Run {
    pid: u32,
    /// A browser the user started, not the agent's child.
    adopted: bool,
    started: Instant,
}

/// What the supervision loop does after a step.
enum Next {
    /// Go on with this run.
    Proceed,
    /// Start over at the top of the loop.
    Repeat,
    /// Stop supervising the component.
    Quit,
}

/// The last `--remote-debugging-port=N` of a command line (NUL- or space-separated, as
/// Chromium rewrites it), when N is a fixed port.
fn debugging_port(cmdline: &[u8]) -> Option<u16> {
    cmdline
        .split(|b| *b == 0 || *b == b' ')
        .filter_map(|a| a.strip_prefix(b"--remote-debugging-port="))
        .next_back()
        .and_then(|p| std::str::from_utf8(p).ok()?.parse().ok())
        .filter(|p| *p != 0)
}

/// A browser that ended the way a quit ends (a clean exit, SIGTERM/SIGINT/SIGHUP), not a crash.
fn quit_on_request(e: &Exit) -> bool {
    const QUITS: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
    match (e.code, e.signal) {
        (Some(c), _) => c == 0 || QUITS.iter().any(|s| c == 128 + s),
        (None, Some(s)) => QUITS.contains(&s),
        // An adopted browser's end is seen without its status.
        (None, None) => true,
    }
}

fn describe(e: &Exit) -> String {
    match (e.code, e.signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("killed by {}", crate::proc::signal_name(s)),
        (None, None) => "did not become ready in time".into(),
    }
}

/// Kills what a previous agent's desktop left running: each component's process group named in
/// `desktop/groups`. Components die with the agent (parent-death signal), but what they forked
/// does not (the AT-SPI bus daemon outlives its launcher).
fn clear_leftovers(dir: &Path) {
    let Ok(text) = std::fs::read_to_string(dir.join("groups")) else {
        return;
    };
    for line in text.lines() {
        if let Some((pgid, start)) = line.split_once(' ')
            && let (Ok(pgid), Ok(start)) = (pgid.parse::<u32>(), start.parse::<u64>())
        {
            let n = crate::proc::kill_group_since(pgid, start);
            if n > 0 {
                tracing::info!(pgid, killed = n, "cleared a previous desktop's leftovers");
            }
        }
    }
    let _ = std::fs::remove_file(dir.join("groups"));
}

fn make_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// The browser binary. Google Chrome's processes are named `chrome` (OSWorld's `pkill
/// chrome`): the image links Chromium's binary as `/usr/lib/chromium/chrome` (a process takes
/// the name of its binary, not of a symlink to it: Chromium re-reads `/proc/self/exe`).
/// Debian's `chromium` is a wrapper script: its binary is started directly, with the
/// desktop's own flags.
fn browser_binary(command: &str) -> std::io::Result<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_else(|_| crate::account::DEFAULT_PATH.into());
    let resolved = if command.contains('/') {
        PathBuf::from(command)
    } else {
        crate::account::find_in_path(&path, command).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("the browser command {command:?} is not on the PATH"),
            )
        })?
    };
    if resolved != Path::new("/usr/bin/chromium") {
        return Ok(resolved);
    }
    let debian = Path::new("/usr/lib/chromium");
    Ok(["chrome", "chromium"]
        .iter()
        .map(|n| debian.join(n))
        .find(|p| p.is_file())
        .unwrap_or(resolved))
}

/// The system's own session bus configuration, which the desktop's bus includes.
const SYSTEM_SESSION_CONF: &str = "/usr/share/dbus-1/session.conf";

/// Writes the session bus's configuration into `dir`: the system's session configuration, but
/// with the AT-SPI bus not activatable on demand. Only the supervised launcher may own
/// `org.a11y.Bus`: one that D-Bus starts for a client while the supervised one is restarting
/// (after the X server's restart, say) owns the name, and every later start of the supervised
/// one then exits at once (code 0, the name taken) until the supervisor gives up on it.
/// A client that asks in that gap gets an activation error and asks again later, as it does
/// when accessibility is off. Root is admitted besides the bus's own user, so an agent running
/// as root can see which of the session's daemons have come up (readiness). None when the
/// system has no session configuration to include.
fn session_bus_config(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    if !Path::new(SYSTEM_SESSION_CONF).exists() {
        return Ok(None);
    }
    let services = dir.join("services");
    make_dir(dir, 0o755)?;
    make_dir(&services, 0o755)?;
    // Earlier service directories win over later ones for the same name.
    write_readable(
        &services.join("org.a11y.Bus.service"),
        "[D-BUS Service]\nName=org.a11y.Bus\nExec=/bin/false\n",
    )?;
    let conf = dir.join("session.conf");
    write_readable(
        &conf,
        &format!(
            "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"\n              \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n\
             <busconfig>\n  <servicedir>{}</servicedir>\n  <include>{SYSTEM_SESSION_CONF}</include>\n\
             <policy context=\"default\">\n    <allow user=\"root\"/>\n  </policy>\n\
             </busconfig>\n",
            services.display()
        ),
    )?;
    Ok(Some(conf))
}

fn write_readable(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_fixed_debugging_port_of_a_rewritten_command_line_is_found() {
        let spaced =
            b"/usr/lib/chromium/chrome --remote-debugging-port=0 --x --remote-debugging-port=1337";
        assert_eq!(debugging_port(spaced), Some(1337));
        assert_eq!(
            debugging_port(b"chrome\0--remote-debugging-port=9\0"),
            Some(9)
        );
        assert_eq!(debugging_port(b"chrome --remote-debugging-port=0"), None);
        assert_eq!(debugging_port(b"chrome --remote-debugging-port=x"), None);
        assert_eq!(debugging_port(b"chrome"), None);
    }

    #[test]
    fn a_quit_is_told_from_a_crash() {
        let exit = |code, signal| Exit { code, signal };
        assert!(quit_on_request(&exit(Some(0), None)));
        assert!(quit_on_request(&exit(Some(143), None)));
        assert!(quit_on_request(&exit(None, Some(libc::SIGTERM))));
        assert!(!quit_on_request(&exit(Some(3), None)));
        assert!(!quit_on_request(&exit(None, Some(libc::SIGKILL))));
        assert!(!quit_on_request(&exit(None, Some(libc::SIGSEGV))));
    }
}
