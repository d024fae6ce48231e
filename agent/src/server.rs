//! Start-up, the one HTTP listener, and the lifecycle (restart vs full shutdown).

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use axum::Router;
use berth_protocol::ops::{self, Routes};
use berth_protocol::routes::native;
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::account::{Account, ChildEnv, EnvInputs};
use crate::cli::AgentArgs;
use crate::desktop::ide::{Ide, IdeConfig};
use crate::desktop::ready::{Loopback, Readiness};
use crate::desktop::{Desktop, DesktopConfig};
use crate::events::EventLog;
use crate::exec::{CommandTable, ExecConfig};
use crate::pty::PtyTable;
use crate::reaper::Reaper;
use crate::{Agent, ShutdownKind, api, compat};

/// Where the agent tells its launcher which addresses it bound (written after binding).
pub const ENDPOINTS_FILE: &str = "endpoints.json";

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let base = prepare_base(&args)?;
    // Before anything starts: the egress proxy's CA and settings, where programs look.
    crate::egress::install_from_env();

    if let Err(e) = crate::proc::become_subreaper() {
        tracing::warn!(error = %e, "cannot become a subreaper; orphans may escape to init");
    }
    let reaper = Reaper::start().context("SIGCHLD handler")?;
    let events = Arc::new(EventLog::open(&base.state_dir.join("events.log")).context("event log")?);
    crate::limits::spawn_watch(events.clone());
    if args.memory_merge {
        crate::limits::ask_memory_merge();
    }

    // The listeners bind before the desktop starts (clients may connect and wait for ready).
    let listeners = bind_listeners(&args).await?;
    let desktop = start_desktop(&args, &base, &events, &reaper).await?;
    let display_name = match &desktop {
        Some(d) => Some(d.display.clone()),
        None => args.display.clone(),
    };
    let env = child_env(&base, display_name.as_deref(), desktop.as_deref());
    if let Some(d) = &desktop {
        link_session_bus(&base.runtime_dir, &d.session_bus, &base.account);
        d.run(env.with(None));
    }
    let ide = start_ide(&args, &base, &events, &reaper, &env)?;
    let session_bus = env
        .get("DBUS_SESSION_BUS_ADDRESS")
        .and_then(|a| a.strip_prefix("unix:path="))
        .map(PathBuf::from);
    let (commands, agent_exe) = start_commands(&args, &base, env, &events, &reaper)?;
    let ptys = PtyTable::new(events.clone(), reaper.clone(), agent_exe, args.command_ttl);
    spawn_pty_expiry(&ptys, args.command_ttl);
    let (shutdown_tx, mut shutdown_rx) = watch::channel(None);
    let started = Started {
        events,
        commands,
        ptys,
        desktop: desktop.clone(),
        ide,
        display_name: display_name.clone(),
        session_bus,
        cdp_bound: listeners.cdp_bound,
    };
    let agent = assemble_agent(&args, &base, started, shutdown_tx)?;
    if let (Some(d), Some(l), Some(cdp)) = (&desktop, listeners.cdp, listeners.cdp_bound) {
        crate::browser::relay::serve_relay(l, d.clone());
        agent.readiness.start(Loopback {
            listen: listeners.bound,
            token: agent.token.clone(),
            cdp_listen: cdp,
            probe_key: agent.control.internal_key().to_string(),
        });
    }

    let app = router(agent.clone());
    announce(&base, listeners.bound, listeners.cdp_bound, display_name)?;

    let kind = serve_until_shutdown(&args, listeners.api, app, &mut shutdown_rx).await?;
    shut_down(kind, &agent, &reaper).await;
    let _ = std::fs::remove_file(base.state_dir.join(ENDPOINTS_FILE));
    Ok(())
}

/// Where the agent keeps its state, whom commands run as and what their home needs: the
/// first phase of start-up, before anything runs.
struct Base {
    state_dir: PathBuf,
    token: String,
    account: Account,
    home: PathBuf,
    runtime_dir: PathBuf,
    xauthority: PathBuf,
    helper_bin: PathBuf,
}

/// Creates the state dir, loads the token, picks the account and prepares its home, runtime
/// dir and helper commands.
fn prepare_base(args: &AgentArgs) -> anyhow::Result<Base> {
    let state_dir = args.state_dir.clone();
    make_dir(&state_dir, 0o711)?;
    let token = load_token(args)?;

    let account = match &args.user {
        Some(name) => Account::by_name(name)?,
        None => Account::default_sandbox()?,
    };
    account.check_switchable()?;
    let home = args.home.clone().unwrap_or_else(|| account.home.clone());
    let runtime_dir = runtime_dir(&state_dir, &account)?;
    let xauthority = home.join(".Xauthority");
    prepare_home(&home, &xauthority, &account);
    let helper_bin = write_helpers(&state_dir)?;
    Ok(Base {
        state_dir,
        token,
        account,
        home,
        runtime_dir,
        xauthority,
        helper_bin,
    })
}

/// The bound listeners: the HTTP one and, with a desktop, the CDP relay's.
struct Listeners {
    api: tokio::net::TcpListener,
    bound: SocketAddr,
    cdp: Option<tokio::net::TcpListener>,
    cdp_bound: Option<SocketAddr>,
}

/// Binds the HTTP listener and, with `--desktop`, the CDP relay's.
async fn bind_listeners(args: &AgentArgs) -> anyhow::Result<Listeners> {
    let api = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let bound = api.local_addr()?;
    let cdp = match args.desktop {
        true => Some(crate::browser::relay::bind_relay(args.cdp_listen).await?),
        false => None,
    };
    let cdp_bound = match &cdp {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    Ok(Listeners {
        api,
        bound,
        cdp,
        cdp_bound,
    })
}

/// Starts the desktop's X server and session bus with `--desktop`; none without.
async fn start_desktop(
    args: &AgentArgs,
    base: &Base,
    events: &Arc<EventLog>,
    reaper: &Arc<Reaper>,
) -> anyhow::Result<Option<Arc<Desktop>>> {
    let desktop = match args.desktop {
        true => Some(
            Desktop::start(
                DesktopConfig {
                    session: args.session,
                    state_dir: base.state_dir.clone(),
                    home: base.home.clone(),
                    account: base.account.clone(),
                    screen: args.screen,
                    display: args.display.clone(),
                    chromium: args.chromium.clone(),
                    xauthority: base.xauthority.clone(),
                },
                events.clone(),
                reaper.clone(),
            )
            .await
            .context("starting the desktop's X server")?,
        ),
        false => None,
    };
    Ok(desktop)
}

/// The environment every child of the agent starts with.
fn child_env(base: &Base, display_name: Option<&str>, desktop: Option<&Desktop>) -> ChildEnv {
    ChildEnv::new(EnvInputs {
        account: &base.account,
        home: &base.home,
        display: display_name,
        xauthority: &base.xauthority,
        runtime_dir: &base.runtime_dir,
        helper_bin: Some(&base.helper_bin),
        session_bus: desktop.map(|d| d.session_bus.as_path()),
        desktop_bin: desktop.map(|d| d.bin_dir.as_path()),
        lang: match desktop {
            Some(d) => d.session().lang(),
            None => crate::desktop::SessionKind::default().lang(),
        },
    })
}

/// Builds and runs the browser IDE with `--ide`; none without.
fn start_ide(
    args: &AgentArgs,
    base: &Base,
    events: &Arc<EventLog>,
    reaper: &Arc<Reaper>,
    env: &ChildEnv,
) -> anyhow::Result<Option<Arc<Ide>>> {
    let ide = match args.ide {
        Some(kind) => {
            let ide = Ide::new(
                IdeConfig {
                    kind,
                    program: args.jupyter_lab.clone(),
                    ports_prefix: args.ports_prefix.clone(),
                    state_dir: base.state_dir.clone(),
                    home: base.home.clone(),
                    account: base.account.clone(),
                },
                events.clone(),
                reaper.clone(),
            )
            .context("the IDE")?;
            ide.run(env.with(None));
            Some(ide)
        }
        None => None,
    };
    Ok(ide)
}

/// Starts the command table (its directory made first); also gives the agent binary's path,
/// which command and terminal shims run from.
fn start_commands(
    args: &AgentArgs,
    base: &Base,
    env: ChildEnv,
    events: &Arc<EventLog>,
    reaper: &Arc<Reaper>,
) -> anyhow::Result<(Arc<CommandTable>, PathBuf)> {
    let commands_dir = base.state_dir.join("commands");
    make_dir(&commands_dir, 0o700)?;
    let agent_exe = std::env::current_exe().context("locating the agent binary")?;
    let commands = CommandTable::start(
        ExecConfig {
            commands_dir,
            store_dir: base.state_dir.join("foreground"),
            agent_exe: agent_exe.clone(),
            account: base.account.clone(),
            home: base.home.clone(),
            workdir: args.workdir.clone(),
            env,
            output_cap: args.output_cap,
            ttl: args.command_ttl,
            spare_shims: args.spare_shims,
        },
        events.clone(),
        reaper.clone(),
    )
    .context("command table")?;
    Ok((commands, agent_exe))
}

/// Expires idle terminals every half TTL (1 s to 60 s) for as long as the table lives.
fn spawn_pty_expiry(ptys: &Arc<PtyTable>, ttl: Duration) {
    let ptys = Arc::downgrade(ptys);
    let every = (ttl / 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let Some(ptys) = ptys.upgrade() else { break };
            ptys.expire();
        }
    });
}

/// What start-up has running by the time the agent's shared state is put together.
struct Started {
    events: Arc<EventLog>,
    commands: Arc<CommandTable>,
    ptys: Arc<PtyTable>,
    desktop: Option<Arc<Desktop>>,
    ide: Option<Arc<Ide>>,
    display_name: Option<String>,
    session_bus: Option<PathBuf>,
    cdp_bound: Option<SocketAddr>,
}

/// Opens the display, recordings, episode log, accessibility tree and browser toolset, and
/// puts them with what has `started` into the agent's shared state.
fn assemble_agent(
    args: &AgentArgs,
    base: &Base,
    started: Started,
    shutdown: watch::Sender<Option<ShutdownKind>>,
) -> anyhow::Result<Arc<Agent>> {
    let desktop = started.desktop;
    let display = crate::display::Display::new(
        started.display_name,
        desktop.as_ref().map(|d| d.x_cookie),
        args.settle,
    );
    let recorder = crate::record::Recorder::open(&display, &base.state_dir, started.events.clone())
        .context("recordings directory")?;
    let episode = crate::episode::Episode::open(&base.state_dir, crate::episode::Limits::default())
        .context("episode log")?;
    let a11y = Arc::new(crate::a11y::A11y::new(
        started.session_bus,
        desktop.as_ref().map(|d| d.x_target()),
    ));
    let browser_toolset = Arc::new(
        crate::browser::toolset::BrowserToolset::new(&args.browser_toolset_enable)
            .map_err(anyhow::Error::msg)
            .context("--browser-toolset-enable")?,
    );
    Ok(Arc::new(Agent {
        token: base.token.clone(),
        compat_auth: args.compat_auth,
        state_dir: base.state_dir.clone(),
        home: base.home.clone(),
        account_name: base.account.name.clone(),
        events: started.events,
        commands: started.commands,
        ptys: started.ptys,
        files: crate::fs::Files::for_account(base.home.clone(), &base.account),
        display,
        recorder,
        episode,
        viewers: crate::viewers::Viewers::default(),
        desktop: desktop.clone(),
        readiness: Readiness::new(desktop, started.ide.clone(), a11y.clone()),
        ide: started.ide,
        cdp_listen: started.cdp_bound,
        browser_toolset,
        control: Arc::new(crate::control::Control::open(&base.state_dir)),
        novnc_dir: args.novnc_dir.clone(),
        a11y,
        shutdown,
    }))
}

/// Tells the launcher which addresses the agent bound (the endpoints file) and logs that it
/// is ready.
fn announce(
    base: &Base,
    bound: SocketAddr,
    cdp_bound: Option<SocketAddr>,
    display_name: Option<String>,
) -> anyhow::Result<()> {
    crate::exec::record::write_json(
        &base.state_dir,
        ENDPOINTS_FILE,
        &json!({
            "listen": bound.to_string(),
            "pid": std::process::id(),
            "cdp_listen": cdp_bound.map(|a| a.to_string()),
            "display": display_name,
        }),
    )?;
    tracing::info!(
        listen = %bound,
        user = %base.account.name,
        home = %base.home.display(),
        state_dir = %base.state_dir.display(),
        "berth-agent ready"
    );
    Ok(())
}

/// Serves until the server ends, a signal comes (SIGTERM: restart, SIGINT: full) or the API
/// asks for a shutdown; says which kind of shutdown follows.
async fn serve_until_shutdown(
    args: &AgentArgs,
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown_rx: &mut watch::Receiver<Option<ShutdownKind>>,
) -> anyhow::Result<ShutdownKind> {
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let limits = berth_protocol::serve::Limits {
        header_timeout: args.header_timeout,
        body_idle_timeout: args.body_idle_timeout,
        max_connections: args.max_connections as usize,
    };
    let server = berth_protocol::serve::serve(listener, app, limits);
    let kind = tokio::select! {
        () = server => ShutdownKind::Full,
        _ = sigterm.recv() => ShutdownKind::Restart,
        _ = sigint.recv() => ShutdownKind::Full,
        _ = shutdown_rx.wait_for(Option::is_some) => ShutdownKind::Full,
    };
    Ok(kind)
}

/// Flushes the episode log, ends recordings and desktop components, then ends commands:
/// a restart keeps background commands running, a full shutdown ends every command tree.
async fn shut_down(kind: ShutdownKind, agent: &Agent, reaper: &Reaper) {
    // What the episode log has queued is written before the agent goes.
    agent.episode.flush(Duration::from_secs(2)).await;
    // Recordings end properly either way: their files are complete and say how long they are.
    let recorder = agent.recorder.clone();
    tokio::task::spawn_blocking(move || recorder.shutdown())
        .await
        .ok();
    // Desktop components stop with the agent on any exit; the next agent starts them afresh.
    if let Some(d) = &agent.desktop {
        d.shutdown().await;
    }
    if let Some(i) = &agent.ide {
        i.shutdown().await;
    }
    match kind {
        ShutdownKind::Restart => {
            tracing::info!("SIGTERM: restarting; background commands keep running");
            agent.commands.kill_foreground();
            agent.ptys.kill_all();
        }
        ShutdownKind::Full => {
            tracing::info!("full shutdown: ending every command tree");
            agent.commands.kill_all().await;
            agent.ptys.kill_all();
            let me = std::process::id();
            tokio::task::spawn_blocking(move || {
                crate::proc::kill_descendants(me, Duration::from_secs(3))
            })
            .await
            .ok();
            reaper.reap_all();
        }
    }
}

/// Both surfaces, every operation of the agent's document bound once (checked here: a route
/// left out or bound twice stops the agent at start-up).
pub fn router(agent: Arc<Agent>) -> Router {
    Routes::new()
        .bind(&ops::native::HEALTHZ, healthz)
        .bind(&ops::native::OPENAPI, openapi)
        .nest(native::PREFIX, api::routes(agent.clone()))
        .merge(crate::mcp::routes(agent.clone()))
        .merge(compat::routes(agent.clone()))
        .fallback(compat::not_found)
        .layer(axum::middleware::from_fn(compat::fill_empty_errors))
        .finish(&ops::AGENT)
        .with_state(agent)
}

/// The OpenAPI 3.1 document of both surfaces (no auth, like `/healthz`).
async fn openapi() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        berth_protocol::openapi::agent_json(),
    )
}

async fn healthz() -> axum::Json<serde_json::Value> {
    axum::Json(json!({"ok": true}))
}

fn make_dir(dir: &Path, mode: u32) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", dir.display()))
}

/// BERTH_AGENT_TOKEN wins; else the token file, created with a random token when absent.
fn load_token(args: &AgentArgs) -> anyhow::Result<String> {
    if let Ok(t) = std::env::var("BERTH_AGENT_TOKEN") {
        let t = t.trim().to_string();
        if t.is_empty() {
            bail!("BERTH_AGENT_TOKEN is set but empty");
        }
        return Ok(t);
    }
    let path = args
        .token_file
        .clone()
        .unwrap_or_else(|| args.state_dir.join("token"));
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
        Ok(_) => bail!("the token file {} is empty", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| anyhow::anyhow!("random token: {e}"))?;
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    std::io::Write::write_all(&mut f, token.as_bytes())?;
    tracing::info!(path = %path.display(), "generated a native API token");
    Ok(token)
}

/// `/run/user/<uid>` when the system provides it, else a private one in the state dir.
fn runtime_dir(state_dir: &Path, account: &Account) -> anyhow::Result<PathBuf> {
    let system = PathBuf::from(format!("/run/user/{}", account.uid));
    if system.is_dir() {
        return Ok(system);
    }
    let dir = state_dir.join("run").join(account.uid.to_string());
    make_dir(&dir, 0o700)?;
    if account.needs_switch() {
        std::os::unix::fs::chown(&dir, Some(account.uid), Some(account.gid))?;
    }
    Ok(dir)
}

/// `$XDG_RUNTIME_DIR/bus`, where a systemd session keeps its bus (commands that name
/// `unix:path=/run/user/1000/bus` outright find the desktop's), unless something is there.
fn link_session_bus(runtime_dir: &Path, bus: &Path, account: &Account) {
    let link = runtime_dir.join("bus");
    if std::fs::symlink_metadata(&link).is_ok_and(|m| !m.file_type().is_symlink()) {
        return;
    }
    let _ = std::fs::remove_file(&link);
    match std::os::unix::fs::symlink(bus, &link) {
        Ok(()) if account.needs_switch() => {
            let _ = std::os::unix::fs::lchown(&link, Some(account.uid), Some(account.gid));
        }
        Ok(()) => {}
        Err(e) => tracing::warn!(path = %link.display(), error = %e, "cannot link the session bus"),
    }
}

/// The home exists and holds an (empty) Xauthority file: python-xlib refuses to start
/// without one.
fn prepare_home(home: &Path, xauthority: &Path, account: &Account) {
    let chown = |p: &Path| {
        if account.needs_switch() {
            let _ = std::os::unix::fs::chown(p, Some(account.uid), Some(account.gid));
        }
    };
    if !home.exists() && std::fs::create_dir_all(home).is_ok() {
        chown(home);
    }
    if !xauthority.exists() {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(xauthority)
        {
            Ok(_) => chown(xauthority),
            Err(e) => {
                tracing::warn!(path = %xauthority.display(), error = %e, "cannot create the Xauthority file")
            }
        }
    }
}

/// Helper commands for the sandbox PATH: a `python` that runs `python3` (OSWorld's harness
/// calls `python`; Debian has only `python3`).
fn write_helpers(state_dir: &Path) -> anyhow::Result<PathBuf> {
    let bin = state_dir.join("bin");
    make_dir(&bin, 0o755)?;
    let python = bin.join("python");
    let script = "#!/bin/sh\nexec python3 \"$@\"\n";
    if std::fs::read_to_string(&python).ok().as_deref() != Some(script) {
        let tmp = bin.join(".python.tmp");
        std::fs::write(&tmp, script)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
        std::fs::rename(&tmp, &python)?;
    }
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent without a desktop, its state in `dir`.
    fn agent(dir: &Path) -> Arc<Agent> {
        let account = Account::current().unwrap();
        let home = dir.join("home");
        std::fs::create_dir_all(&home).unwrap();
        let events = Arc::new(EventLog::open(&dir.join("events.log")).unwrap());
        let reaper = Reaper::start().unwrap();
        let env = ChildEnv::new(EnvInputs {
            account: &account,
            home: &home,
            display: None,
            xauthority: &home.join(".Xauthority"),
            runtime_dir: dir,
            helper_bin: None,
            session_bus: None,
            desktop_bin: None,
            lang: crate::desktop::SessionKind::default().lang(),
        });
        let agent_exe = std::env::current_exe().unwrap();
        let commands = CommandTable::start(
            ExecConfig {
                commands_dir: dir.join("commands"),
                store_dir: dir.join("foreground"),
                agent_exe: agent_exe.clone(),
                account: account.clone(),
                home: home.clone(),
                workdir: None,
                env,
                output_cap: 1 << 20,
                ttl: Duration::from_secs(60),
                // The test binary is no agent to start shims from.
                spare_shims: 0,
            },
            events.clone(),
            reaper.clone(),
        )
        .unwrap();
        let display = crate::display::Display::new(None, None, Default::default());
        let a11y = Arc::new(crate::a11y::A11y::new(None, None));
        Arc::new(Agent {
            token: "token".into(),
            compat_auth: crate::CompatAuth::Token,
            state_dir: dir.to_path_buf(),
            home: home.clone(),
            account_name: account.name.clone(),
            ptys: PtyTable::new(events.clone(), reaper, agent_exe, Duration::from_secs(60)),
            recorder: crate::record::Recorder::open(&display, dir, events.clone()).unwrap(),
            events,
            commands,
            files: crate::fs::Files::for_account(home, &account),
            display,
            episode: crate::episode::Episode::open(dir, crate::episode::Limits::default()).unwrap(),
            viewers: crate::viewers::Viewers::default(),
            desktop: None,
            readiness: Readiness::new(None, None, a11y.clone()),
            ide: None,
            cdp_listen: None,
            browser_toolset: Arc::new(crate::browser::toolset::BrowserToolset::new(&[]).unwrap()),
            control: Arc::new(crate::control::Control::new()),
            novnc_dir: dir.join("novnc"),
            a11y,
            shutdown: watch::channel(None).0,
        })
    }

    /// The router is built from the operation table and checks, as it is built, that it
    /// serves every operation of the agent's document exactly once at its path
    /// (`Routes::finish`); a route cannot be added but by naming an operation.
    #[tokio::test]
    async fn the_router_serves_the_agents_document_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let _ = router(agent(dir.path()));
    }
}
