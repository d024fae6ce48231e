//! Start-up, the one HTTP listener, and the lifecycle (restart vs full shutdown).

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
    let state_dir = args.state_dir.clone();
    make_dir(&state_dir, 0o711)?;
    let token = load_token(&args)?;

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

    if let Err(e) = crate::proc::become_subreaper() {
        tracing::warn!(error = %e, "cannot become a subreaper; orphans may escape to init");
    }
    let reaper = Reaper::start().context("SIGCHLD handler")?;
    let events = Arc::new(EventLog::open(&state_dir.join("events.log")).context("event log")?);

    // The listeners bind before the desktop starts (clients may connect and wait for ready).
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let bound = listener.local_addr()?;
    let cdp_listener = match args.desktop {
        true => Some(crate::browser::relay::bind_relay(args.cdp_listen).await?),
        false => None,
    };
    let cdp_bound = match &cdp_listener {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    let desktop = match args.desktop {
        true => Some(
            Desktop::start(
                DesktopConfig {
                    session: args.session,
                    state_dir: state_dir.clone(),
                    home: home.clone(),
                    account: account.clone(),
                    screen: args.screen,
                    display: args.display.clone(),
                    chromium: args.chromium.clone(),
                    xauthority: xauthority.clone(),
                },
                events.clone(),
                reaper.clone(),
            )
            .await
            .context("starting the desktop's X server")?,
        ),
        false => None,
    };
    let display_name = match &desktop {
        Some(d) => Some(d.display.clone()),
        None => args.display.clone(),
    };
    let env = ChildEnv::new(EnvInputs {
        account: &account,
        home: &home,
        display: display_name.as_deref(),
        xauthority: &xauthority,
        runtime_dir: &runtime_dir,
        helper_bin: Some(&helper_bin),
        session_bus: desktop.as_ref().map(|d| d.session_bus.as_path()),
        desktop_bin: desktop.as_ref().map(|d| d.bin_dir.as_path()),
        lang: match &desktop {
            Some(d) => d.session().lang(),
            None => crate::desktop::SessionKind::default().lang(),
        },
    });
    if let Some(d) = &desktop {
        link_session_bus(&runtime_dir, &d.session_bus, &account);
        d.run(env.with(None));
    }
    let ide = match args.ide {
        Some(kind) => {
            let ide = crate::desktop::ide::Ide::new(
                crate::desktop::ide::IdeConfig {
                    kind,
                    program: args.jupyter_lab.clone(),
                    ports_prefix: args.ports_prefix.clone(),
                    state_dir: state_dir.clone(),
                    home: home.clone(),
                    account: account.clone(),
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
    let session_bus = env
        .get("DBUS_SESSION_BUS_ADDRESS")
        .and_then(|a| a.strip_prefix("unix:path="))
        .map(PathBuf::from);
    let commands_dir = state_dir.join("commands");
    make_dir(&commands_dir, 0o700)?;
    let agent_exe = std::env::current_exe().context("locating the agent binary")?;
    let commands = CommandTable::start(
        ExecConfig {
            commands_dir,
            store_dir: state_dir.join("foreground"),
            agent_exe: agent_exe.clone(),
            account: account.clone(),
            home: home.clone(),
            env,
            output_cap: args.output_cap,
            ttl: args.command_ttl,
        },
        events.clone(),
        reaper.clone(),
    )
    .context("command table")?;
    let ptys = PtyTable::new(events.clone(), reaper.clone(), agent_exe, args.command_ttl);
    {
        let ptys = Arc::downgrade(&ptys);
        let every = (args.command_ttl / 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let Some(ptys) = ptys.upgrade() else { break };
                ptys.expire();
            }
        });
    }
    let (shutdown_tx, mut shutdown_rx) = watch::channel(None);
    let display = crate::display::Display::new(
        display_name.clone(),
        desktop.as_ref().map(|d| d.x_cookie),
        args.settle,
    );
    let recorder = crate::record::Recorder::open(&display, &state_dir, events.clone())
        .context("recordings directory")?;
    let episode = crate::episode::Episode::open(&state_dir, crate::episode::Limits::default())
        .context("episode log")?;
    let a11y = Arc::new(crate::a11y::A11y::new(
        session_bus,
        desktop.as_ref().map(|d| d.x_target()),
    ));
    let browser_toolset = Arc::new(
        crate::browser::toolset::BrowserToolset::new(&args.browser_toolset_enable)
            .map_err(anyhow::Error::msg)
            .context("--browser-toolset-enable")?,
    );
    let agent = Arc::new(Agent {
        token,
        compat_auth: args.compat_auth,
        state_dir: state_dir.clone(),
        home: home.clone(),
        account_name: account.name.clone(),
        events,
        commands: commands.clone(),
        ptys: ptys.clone(),
        files: crate::fs::Files::new(home.clone(), account.uid, account.gid),
        display,
        recorder: recorder.clone(),
        episode: episode.clone(),
        viewers: crate::viewers::Viewers::default(),
        desktop: desktop.clone(),
        readiness: Readiness::new(desktop.clone(), ide.clone(), a11y.clone()),
        ide: ide.clone(),
        cdp_listen: cdp_bound,
        browser_toolset,
        novnc_dir: args.novnc_dir.clone(),
        a11y,
        shutdown: shutdown_tx,
    });
    if let (Some(d), Some(l), Some(cdp)) = (&desktop, cdp_listener, cdp_bound) {
        crate::browser::relay::serve_relay(l, d.clone());
        agent.readiness.start(Loopback {
            listen: bound,
            token: agent.token.clone(),
            cdp_listen: cdp,
        });
    }

    let app = router(agent.clone());
    crate::exec::record::write_json(
        &state_dir,
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
        user = %account.name,
        home = %home.display(),
        state_dir = %state_dir.display(),
        "berth-agent ready"
    );

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
    // What the episode log has queued is written before the agent goes.
    episode.flush(Duration::from_secs(2)).await;
    // Recordings end properly either way: their files are complete and say how long they are.
    tokio::task::spawn_blocking(move || recorder.shutdown())
        .await
        .ok();
    // Desktop components stop with the agent on any exit; the next agent starts them afresh.
    if let Some(d) = &desktop {
        d.shutdown().await;
    }
    if let Some(i) = &ide {
        i.shutdown().await;
    }
    match kind {
        ShutdownKind::Restart => {
            tracing::info!("SIGTERM: restarting; background commands keep running");
            commands.kill_foreground();
            ptys.kill_all();
        }
        ShutdownKind::Full => {
            tracing::info!("full shutdown: ending every command tree");
            commands.kill_all().await;
            ptys.kill_all();
            let me = std::process::id();
            tokio::task::spawn_blocking(move || {
                crate::proc::kill_descendants(me, Duration::from_secs(3))
            })
            .await
            .ok();
            reaper.reap_all();
        }
    }
    let _ = std::fs::remove_file(state_dir.join(ENDPOINTS_FILE));
    Ok(())
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
                env,
                output_cap: 1 << 20,
                ttl: Duration::from_secs(60),
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
            files: crate::fs::Files::new(home, account.uid, account.gid),
            display,
            episode: crate::episode::Episode::open(dir, crate::episode::Limits::default()).unwrap(),
            viewers: crate::viewers::Viewers::default(),
            desktop: None,
            readiness: Readiness::new(None, None, a11y.clone()),
            ide: None,
            cdp_listen: None,
            browser_toolset: Arc::new(crate::browser::toolset::BrowserToolset::new(&[]).unwrap()),
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
