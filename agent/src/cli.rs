//! Command line: the agent itself, `init` (PID 1 in images), and the internal `shim` and
//! `exec-as` modes of the same binary. The binary's `main` parses it and starts the mode.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::CompatAuth;

#[derive(Parser, Debug)]
#[command(
    name = "berth-agent",
    version,
    about = "The berth workstation daemon: OSWorld-compatible API at root paths, native API under /v1",
    after_help = "Environment: BERTH_AGENT_TOKEN holds the native API token itself and wins over \
                  --token-file. Every BERTH_AGENT_* variable is stripped from children's environments.\n\
                  Signals: SIGTERM restarts (background commands keep running); SIGINT or \
                  POST /v1/shutdown shuts down fully (every command tree is killed)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Mode>,
    #[command(flatten)]
    pub agent: AgentArgs,
}

#[derive(Subcommand, Debug)]
pub enum Mode {
    /// PID 1 in images: reaps orphans, runs `berth-agent ARGS…` and restarts it when it exits;
    /// SIGTERM/SIGINT is a full shutdown.
    Init {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Internal: supervise one background command (see the state dir's commands/<id>).
    #[command(hide = true)]
    Shim { dir: PathBuf },
    /// Internal: a shim started ahead of its command, waiting on stdin for it.
    #[command(hide = true)]
    ShimSpare,
    /// Internal: switch to a uid/gid and exec a program (used for terminals).
    #[command(hide = true)]
    ExecAs {
        #[arg(long)]
        uid: u32,
        #[arg(long)]
        gid: u32,
        #[arg(long, value_delimiter = ',', default_value = "")]
        groups: Vec<String>,
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
}

#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    /// Address of the HTTP listener (compat surface, /v1, /healthz).
    #[arg(long, env = "BERTH_AGENT_LISTEN", default_value = "0.0.0.0:5000")]
    pub listen: SocketAddr,
    /// File holding the native API token; created (0600, random) when absent.
    /// Default: <state-dir>/token.
    #[arg(long, env = "BERTH_AGENT_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Directory for the token, command records and output, and the event log.
    #[arg(
        long,
        env = "BERTH_AGENT_STATE_DIR",
        default_value = "/var/lib/berth-agent"
    )]
    pub state_dir: PathBuf,
    /// X display children use (DISPLAY), e.g. `:1`.
    #[arg(long, env = "BERTH_AGENT_DISPLAY")]
    pub display: Option<String>,
    /// Start and supervise the desktop: Xvnc (on a free display unless --display names one),
    /// a session bus and the AT-SPI bus, XFCE's settings daemon, window manager, panel and
    /// desktop, and Chromium; serve noVNC at /v1/vnc/ and relay CDP.
    #[arg(long, env = "BERTH_AGENT_DESKTOP")]
    pub desktop: bool,
    /// Let the kernel merge this agent's memory, and that of everything it starts, with
    /// identical pages elsewhere on the host (`PR_SET_MEMORY_MERGE`; takes effect where the
    /// host's KSM runs). Off by default: merged pages let one sandbox time another's memory.
    #[arg(long, env = "BERTH_AGENT_MEMORY_MERGE")]
    pub memory_merge: bool,
    /// The desktop session (with --desktop): `xfce`, or `gnome` — GNOME Shell on X11 as Ubuntu
    /// shows it (the dock, GNOME Settings with the system bus, PulseAudio, the browser started
    /// on demand), which needs an agent running as root and the osworld image's packages.
    #[arg(long, env = "BERTH_AGENT_SESSION", value_enum, default_value = "xfce")]
    pub session: crate::desktop::SessionKind,
    /// Screen size of the desktop's X server.
    #[arg(long, env = "BERTH_AGENT_SCREEN", default_value = "1920x1080", value_parser = parse_screen)]
    pub screen: (u16, u16),
    /// Where the CDP byte relay to the desktop's Chromium listens (with --desktop).
    #[arg(long, env = "BERTH_AGENT_CDP_LISTEN", default_value = "0.0.0.0:9222")]
    pub cdp_listen: SocketAddr,
    /// How a turn decides the screen has settled after input: `idle` (40 ms with neither a big
    /// change on screen nor CPU used by the display's programs, else `quiet`) or `quiet` (150 ms
    /// without a big change).
    #[arg(long, env = "BERTH_AGENT_SETTLE", value_enum, default_value = "idle")]
    pub settle: crate::display::settle::SettleRule,
    /// The optional members of Anthropic's browser toolset this agent serves, comma-separated:
    /// `javascript_exec`, `read_console`, `read_network`, `file_upload` (off unless named).
    #[arg(
        long,
        env = "BERTH_AGENT_BROWSER_TOOLSET_ENABLE",
        value_delimiter = ',',
        default_value = ""
    )]
    pub browser_toolset_enable: Vec<String>,
    /// noVNC's static files (Debian's `novnc` package).
    #[arg(
        long,
        env = "BERTH_AGENT_NOVNC_DIR",
        default_value = "/usr/share/novnc"
    )]
    pub novnc_dir: PathBuf,
    /// Serve a browser IDE and supervise it: `jupyterlab` runs JupyterLab as the sandbox user
    /// on 127.0.0.1:8888 (no token: reached only through the authenticated port relay).
    #[arg(long, env = "BERTH_AGENT_IDE", value_enum)]
    pub ide: Option<crate::desktop::ide::IdeKind>,
    /// The public path the agent's ports are served under, which the IDE builds its URLs from:
    /// the controller's `/sandbox/sandboxes/v1/{id}/ports/`; the agent's own by default.
    #[arg(long, env = "BERTH_AGENT_PORTS_PREFIX", default_value = "/v1/ports/", value_parser = parse_prefix)]
    pub ports_prefix: String,
    /// The JupyterLab program (on the sandbox user's PATH, or a path).
    #[arg(long, env = "BERTH_AGENT_JUPYTER_LAB", default_value = "jupyter-lab")]
    pub jupyter_lab: String,
    /// The browser the desktop runs.
    #[arg(long, env = "BERTH_AGENT_CHROMIUM", default_value = "chromium")]
    pub chromium: String,
    /// Account commands run as. Default: `user` when that account exists, else the agent's own.
    #[arg(long, env = "BERTH_AGENT_USER")]
    pub user: Option<String>,
    /// Home of the sandbox user (`~`, default cwd). Default: the account's home.
    #[arg(long, env = "BERTH_AGENT_HOME")]
    pub home: Option<PathBuf>,
    /// Where commands run when they name no cwd (a brought image's `WORKDIR`). Default: the
    /// home.
    #[arg(long, env = "BERTH_AGENT_WORKDIR")]
    pub workdir: Option<PathBuf>,
    /// Whether the compat surface requires the bearer token too.
    #[arg(
        long,
        env = "BERTH_AGENT_COMPAT_AUTH",
        value_enum,
        default_value = "open"
    )]
    pub compat_auth: CompatAuth,
    /// How long records of finished commands are kept.
    #[arg(long, env = "BERTH_AGENT_COMMAND_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    pub command_ttl: Duration,
    /// Shims kept started ahead for background commands (each a waiting process); 0 starts
    /// every shim when its command comes.
    #[arg(long, env = "BERTH_AGENT_SPARE_SHIMS", default_value_t = 2)]
    pub spare_shims: usize,
    /// Output kept per command; past it the oldest bytes are dropped (and replays say so).
    #[arg(long, env = "BERTH_AGENT_OUTPUT_CAP", default_value_t = 1 << 30)]
    pub output_cap: u64,
    /// How long the HTTP listener waits for a request head, on a new connection or an idle
    /// keep-alive one, before closing it.
    #[arg(long, env = "BERTH_AGENT_HEADER_TIMEOUT", default_value = "10s", value_parser = positive_duration)]
    pub header_timeout: Duration,
    /// A request body that sends nothing this long fails (the request is answered 4xx).
    #[arg(long, env = "BERTH_AGENT_BODY_IDLE_TIMEOUT", default_value = "30s", value_parser = positive_duration)]
    pub body_idle_timeout: Duration,
    /// HTTP connections open at once; past it, new ones wait to be accepted.
    #[arg(long, env = "BERTH_AGENT_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Log filter (tracing syntax: `info`, `berth_agent=debug`).
    #[arg(long, env = "BERTH_AGENT_LOG", default_value = "info")]
    pub log: String,
    /// Log format.
    #[arg(
        long,
        env = "BERTH_AGENT_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

fn parse_screen(s: &str) -> Result<(u16, u16), String> {
    let (w, h) = s
        .split_once('x')
        .ok_or_else(|| format!("{s:?}: expected WIDTHxHEIGHT, e.g. 1920x1080"))?;
    let side = |v: &str| {
        v.parse::<u16>()
            .ok()
            .filter(|n| (64..=8192).contains(n))
            .ok_or_else(|| format!("{s:?}: each side must be 64 to 8192 pixels"))
    };
    Ok((side(w)?, side(h)?))
}

fn parse_prefix(s: &str) -> Result<String, String> {
    crate::desktop::ide::normalize_prefix(s)
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(format!("{s:?}: must be longer than zero")),
        Err(e) => Err(format!("{s:?}: {e}")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
