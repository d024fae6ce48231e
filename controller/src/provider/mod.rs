//! Providers: where sandboxes physically run. Code above this trait never branches on which
//! provider it talks to.
//!
//! A provider labels what it creates with the fixed identity only (controller id, sandbox id,
//! profile, image ref): lease ids and user labels live in the store, because some providers
//! (Docker) cannot relabel a running sandbox.

pub mod cgroup;
pub mod docker;
pub mod fake;
pub mod kubernetes;
pub mod process;
pub mod seccomp;

use std::collections::BTreeMap;

pub const LABEL_CONTROLLER: &str = "berth.controller";
pub const LABEL_SANDBOX: &str = "berth.sandbox";
pub const LABEL_PROFILE: &str = "berth.profile";
pub const LABEL_IMAGE: &str = "berth.image_ref";
/// A sandbox behind the egress proxy: its policy (JSON), so a restarted controller knows it
/// again (a Docker label, a Kubernetes annotation).
pub const LABEL_EGRESS: &str = "berth.egress";

/// The labels every provider sandbox carries.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    pub controller_id: String,
    pub sandbox_id: String,
    pub profile: String,
    pub image_ref: String,
}

impl Identity {
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_CONTROLLER.to_string(), self.controller_id.clone()),
            (LABEL_SANDBOX.to_string(), self.sandbox_id.clone()),
            (LABEL_PROFILE.to_string(), self.profile.clone()),
            (LABEL_IMAGE.to_string(), self.image_ref.clone()),
        ])
    }
}

/// What to create.
#[derive(Debug, Clone)]
pub struct Spec {
    pub identity: Identity,
    /// Start the desktop (X server, VNC, window manager, browser) with the agent.
    pub desktop: bool,
    /// The browser IDE the agent serves (`jupyterlab`), for profiles whose viewer is one.
    pub ide: Option<String>,
    /// The bearer token the agent's native API will require.
    pub agent_token: String,
    /// The optional browser toolset members the agent serves (desktops only).
    pub browser_toolset_enable: Vec<String>,
    /// Whether its agent asks the kernel to merge its memory with identical pages (KSM).
    pub memory_merge: bool,
    /// Resource limits (the provider enforces those its `unenforced` does not name).
    pub limits: berth_protocol::controller::Limits,
    /// Where its programs may connect (a provider whose `enforces_egress` is false is only
    /// given `"open"`).
    pub egress: berth_protocol::egress::Egress,
}

impl Spec {
    /// The agent's arguments beyond the provider's own: the IDE's (`ide_args`) and, on a
    /// desktop, the optional browser toolset members it serves.
    pub fn agent_args(&self) -> Vec<String> {
        let mut args = self.ide_args();
        if self.memory_merge {
            args.push("--memory-merge".into());
        }
        if self.desktop && !self.browser_toolset_enable.is_empty() {
            args.push("--browser-toolset-enable".into());
            args.push(self.browser_toolset_enable.join(","));
        }
        args
    }

    /// The agent's IDE arguments: which IDE, and the public path the controller serves the
    /// sandbox's ports under (the IDE builds its URLs from it). None without an IDE.
    pub fn ide_args(&self) -> Vec<String> {
        match &self.ide {
            Some(kind) => vec![
                "--ide".into(),
                kind.clone(),
                "--ports-prefix".into(),
                format!(
                    "{}ports/",
                    berth_protocol::routes::controller::sandbox_base(&self.identity.sandbox_id)
                ),
            ],
            None => Vec::new(),
        }
    }
}

/// How to reach a created sandbox's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The agent's listener (`http://host:port`) as the controller reaches it: native `/v1`
    /// and compat surface.
    pub agent_url: String,
    /// The compat surface as harnesses on this host reach it (often the same).
    pub compat_url: String,
    /// Chromium's CDP through the agent's TCP relay, for desktop sandboxes.
    pub cdp_url: Option<String>,
    /// The ports the image declares, by name (`vlc` → `http://host:port`), as harnesses on
    /// this host reach them.
    pub ports: BTreeMap<String, String>,
}

/// A provider sandbox as observed now.
#[derive(Debug, Clone)]
pub struct Observed {
    pub identity: Identity,
    /// Whether the sandbox's agent process / container is alive.
    pub alive: bool,
    pub endpoint: Option<Endpoint>,
    pub created_at_ms: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The request cannot be served by this provider (an image it cannot run, …).
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Failed(String),
}

pub type Result<T> = std::result::Result<T, ProviderError>;

#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    fn name(&self) -> &'static str;

    /// The image a profile runs from when the caller names none.
    fn default_image(&self, profile: &str) -> Result<String>;

    /// Whether this provider can run `image_ref` for `profile`.
    fn check_image(&self, profile: &str, image_ref: &str) -> Result<()>;

    /// Creates and starts the sandbox; answers once its agent can be reached (not once it is
    /// ready: readiness is the controller's to check). Labels are in place before anything
    /// starts, so a controller that dies mid-create finds what it began.
    async fn create(&self, spec: &Spec) -> Result<Endpoint>;

    /// The sandbox as it is now; `None` when the provider has no trace of it.
    async fn inspect(&self, sandbox_id: &str) -> Result<Option<Observed>>;

    /// Every sandbox labelled with this controller's id.
    async fn list(&self, controller_id: &str) -> Result<Vec<Observed>>;

    /// Stops everything the sandbox runs and removes it. Idempotent.
    async fn destroy(&self, sandbox_id: &str) -> Result<()>;

    /// The limits of `limits` this provider cannot enforce here, each with the reason.
    fn unenforced(&self, limits: &berth_protocol::controller::Limits) -> BTreeMap<String, String>;

    /// Whether its sandboxes can be held to an egress policy other than `"open"`.
    fn enforces_egress(&self) -> bool {
        false
    }

    /// Sandboxes of this controller that die, as the provider learns it (Docker's events);
    /// `None` when the provider has no such feed (the sweep notices within seconds anyway).
    fn deaths(&self, _controller_id: &str) -> Option<tokio::sync::mpsc::Receiver<Death>> {
        None
    }
}

/// A sandbox that died on its own.
#[derive(Debug, Clone)]
pub struct Death {
    pub sandbox_id: String,
    pub reason: String,
}
