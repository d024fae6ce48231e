//! berth-agent: the guest daemon of a berth workstation. It serves the OSWorld-compatible
//! surface at root paths and the native `/v1` API, and supervises what runs in the sandbox.

pub mod a11y;
pub mod account;
pub mod api;
pub mod browser;
pub mod cli;
pub mod compat;
pub mod control;
pub mod desktop;
pub mod display;
pub mod egress;
pub mod episode;
pub mod events;
pub mod exec;
pub mod fs;
pub mod http;
pub mod init;
pub mod limits;
pub mod mcp;
pub mod proc;
pub mod pty;
pub mod reaper;
pub mod record;
pub mod server;
pub mod text;
pub mod time;
pub mod toolset_input;
pub mod viewers;
pub mod workpiece;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

/// Whether the compat surface needs the bearer token (`--compat-auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompatAuth {
    Open,
    Token,
}

/// How the agent is leaving (API.md "Lifecycle").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownKind {
    /// SIGTERM: background commands keep running for the next agent.
    Restart,
    /// SIGINT or `POST /v1/shutdown`: every tree dies, nothing remains.
    Full,
}

/// Everything the handlers reach: the domains and the agent's settings.
pub struct Agent {
    pub token: String,
    pub compat_auth: CompatAuth,
    pub state_dir: PathBuf,
    pub home: PathBuf,
    pub account_name: String,
    pub events: Arc<events::EventLog>,
    pub commands: Arc<exec::CommandTable>,
    pub ptys: Arc<pty::PtyTable>,
    pub files: fs::Files,
    pub display: Arc<display::Display>,
    pub recorder: Arc<record::Recorder>,
    /// The computer-use action log (`/v1/episode`).
    pub episode: Arc<episode::Episode>,
    pub viewers: viewers::Viewers,
    /// The supervised desktop (`--desktop`).
    pub desktop: Option<Arc<desktop::Desktop>>,
    pub readiness: Arc<desktop::ready::Readiness>,
    /// The browser IDE (`--ide`), served through the port relay on its port.
    pub ide: Option<Arc<desktop::ide::Ide>>,
    /// Where the CDP byte relay listens (`--desktop`).
    pub cdp_listen: Option<std::net::SocketAddr>,
    /// Anthropic's browser toolset over CDP (`/v1/toolsets/browser`).
    pub browser_toolset: Arc<browser::toolset::BrowserToolset>,
    pub novnc_dir: PathBuf,
    /// The accessibility tree (AT-SPI on the session bus).
    pub a11y: Arc<a11y::A11y>,
    /// The desktop's controls: a person holding them, the agent asking for one.
    pub control: Arc<control::Control>,
    shutdown: watch::Sender<Option<ShutdownKind>>,
}

impl Agent {
    /// Logs a computer-use call (`/v1/computer`, MCP `computer`): reads the pointer, stamps the
    /// live recordings' media times, queues the entries.
    pub async fn log_computer(
        &self,
        source: episode::Source,
        body: &serde_json::Value,
        trace: &display::computer::Trace,
        error: Option<String>,
        called: std::time::Instant,
    ) {
        let d = self.display.clone();
        let cursor = tokio::task::spawn_blocking(move || d.pointer().ok())
            .await
            .ok()
            .flatten();
        for a in episode::computer_actions(source, body, trace, error, cursor, called) {
            self.episode.log(a.with_media(&self.recorder));
        }
    }

    /// Logs the calls a computer-toolset turn ran (as Anthropic computer actions), if any.
    pub async fn log_toolset_turn(
        &self,
        source: episode::Source,
        answer: &display::computer::toolset::TurnAnswer,
        called: std::time::Instant,
    ) {
        if answer.ran.is_empty() {
            return;
        }
        let body = serde_json::json!({ "actions": answer.ran });
        self.log_computer(source, &body, &answer.trace, answer.error.clone(), called)
            .await;
    }

    /// Marks a change of the controls (`control.taken`, `control.returned`) in the episode.
    pub fn log_control(&self, what: &str) {
        let a = episode::Action {
            source: episode::Source::Control,
            dialect: None,
            action: serde_json::json!({ "action": what }),
            started: std::time::Instant::now(),
            duration: std::time::Duration::ZERO,
            settled: None,
            error: None,
            cursor: None,
            screenshot: None,
            batch: None,
            media: Vec::new(),
        };
        self.episode.log(a.with_media(&self.recorder));
    }

    pub fn request_shutdown(&self, kind: ShutdownKind) {
        self.shutdown.send_if_modified(|cur| {
            if cur.is_none() {
                *cur = Some(kind);
                true
            } else {
                false
            }
        });
    }
}
