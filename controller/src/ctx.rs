//! The context every domain of the controller shares: its configuration, store, catalog,
//! metrics and providers, one HTTP client for agent calls, and the events it records. It reads
//! sandboxes and reaches their agents; it decides nothing. Two hooks let a lower domain ask a
//! higher one for a service without importing it: following a sandbox's agent events
//! ([`Follow`]) and keeping a sandbox's work before it is destroyed ([`KeepWork`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use berth_protocol::AgentClient;
use berth_protocol::events::EventKind;
use futures_util::future::BoxFuture;

use crate::catalog::{Catalog, Profile};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::lifecycle::SandboxStatus;
use crate::metrics::Metrics;
use crate::provider::Provider;
use crate::store::{SandboxRow, Store};
use crate::util::{new_id, now_ms};

/// Starts following a sandbox's agent events unless that is under way.
pub trait Follow: Send + Sync {
    fn follow(self: Arc<Self>, sandbox_id: &str);
}

/// Keeps a sandbox's work (its recordings, its episode) before it is destroyed, within the
/// configured bound.
pub trait KeepWork: Send + Sync {
    fn keep_work<'a>(&'a self, row: &'a SandboxRow) -> BoxFuture<'a, ()>;
}

/// The services a higher domain gives a lower one, set once when the controller is wired.
#[derive(Default)]
pub struct Hooks {
    follow: OnceLock<Weak<dyn Follow>>,
    keep_work: OnceLock<Weak<dyn KeepWork>>,
}

impl Hooks {
    pub fn set_follow(&self, f: Weak<dyn Follow>) {
        let _ = self.follow.set(f);
    }

    pub fn set_keep_work(&self, k: Weak<dyn KeepWork>) {
        let _ = self.keep_work.set(k);
    }
}

pub struct Ctx {
    pub config: Config,
    pub store: Store,
    pub catalog: Catalog,
    pub metrics: Metrics,
    pub controller_id: String,
    pub public_url: String,
    pub data_dir: PathBuf,
    providers: BTreeMap<String, Arc<dyn Provider>>,
    /// One HTTP client for every agent call (connection pool, TLS set up once).
    pub http: reqwest::Client,
    /// When this controller started: a run made before it is an adopted one.
    pub started_ms: i64,
    pub hooks: Hooks,
    /// The egress proxy's edge (credentials, the CA), set once at start when serving.
    pub edge: std::sync::OnceLock<Arc<crate::egress::edge::Edge>>,
    /// The `[[login]]` sites, their values read at start.
    pub logins: crate::login::sites::Logins,
}

impl Ctx {
    pub fn new(
        config: Config,
        store: Store,
        data_dir: PathBuf,
        public_url: String,
        providers: BTreeMap<String, Arc<dyn Provider>>,
    ) -> Result<Ctx> {
        let controller_id = store.meta_init("controller_id", &new_id("ctl"))?;
        let logins = crate::login::sites::Logins::load(&config.login)
            .map_err(|e| Error::BadRequest(format!("{e:#}")))?;
        Ok(Ctx {
            logins,
            config,
            store,
            catalog: Catalog::builtin(),
            metrics: Metrics::default(),
            controller_id,
            public_url: public_url.trim_end_matches('/').to_string(),
            data_dir,
            providers,
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .no_proxy()
                // Below the servers' idle close (10 s by default), so a request is never sent on a
                // connection the server is closing.
                .pool_idle_timeout(Duration::from_secs(5))
                .build()
                .map_err(|e| Error::Internal(format!("HTTP client: {e}")))?,
            started_ms: now_ms(),
            hooks: Hooks::default(),
            edge: std::sync::OnceLock::new(),
        })
    }

    pub fn profile(&self, name: &str) -> Result<&Profile> {
        let p = self.catalog.profile(name).ok_or_else(|| {
            Error::BadRequest(format!(
                "unknown profile {name:?}; known: {}",
                self.catalog.known_profiles()
            ))
        })?;
        if !p.enabled {
            return Err(Error::Unprocessable(format!(
                "profile {name:?} cannot run here: {}",
                p.description
            )));
        }
        Ok(p)
    }

    /// The name of the provider that serves a profile: configured by its name or an alias,
    /// else its driver hint.
    pub fn provider_name_for<'a>(&'a self, profile: &'a Profile) -> &'a str {
        std::iter::once(&profile.name)
            .chain(&profile.aliases)
            .find_map(|n| self.config.providers.get(n))
            .unwrap_or(&profile.driver_hint)
    }

    /// The provider that serves a profile (see `provider_name_for`).
    pub fn provider_for(&self, profile: &Profile) -> Result<Arc<dyn Provider>> {
        let name = self.provider_name_for(profile);
        self.providers.get(name).cloned().ok_or_else(|| {
            Error::Unprocessable(format!(
                "profile {:?} needs the {name} provider, which this controller does not run",
                profile.name
            ))
        })
    }

    pub fn provider_named(&self, name: &str) -> Result<Arc<dyn Provider>> {
        self.providers
            .get(name)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("no provider {name}")))
    }

    pub fn providers(&self) -> impl Iterator<Item = &Arc<dyn Provider>> {
        self.providers.values()
    }

    pub fn expiry(&self, ttl_seconds: Option<u64>) -> i64 {
        let ttl = ttl_seconds
            .unwrap_or(self.config.default_ttl_secs)
            .min(self.config.max_ttl_secs);
        now_ms() + ttl as i64 * 1000
    }

    /// A client for the sandbox's agent.
    pub fn agent(&self, row: &SandboxRow) -> Result<AgentClient> {
        let url = row.agent_url.clone().ok_or_else(|| {
            Error::Unavailable(format!(
                "sandbox {} is {} and has no agent yet",
                row.id, row.status
            ))
        })?;
        Ok(AgentClient::with_http(
            url,
            Some(row.agent_token.clone()),
            self.http.clone(),
        ))
    }

    /// The agent of a running sandbox, or a 409/503 saying why there is none.
    pub fn running_agent(&self, id: &str) -> Result<(SandboxRow, AgentClient)> {
        let row = self.visible_row(id)?;
        if row.status != SandboxStatus::Running {
            return Err(Error::Conflict(format!(
                "sandbox {id} is {}{}",
                row.status,
                row.error
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )));
        }
        let agent = self.agent(&row)?;
        Ok((row, agent))
    }

    pub fn get_row(&self, id: &str) -> Result<SandboxRow> {
        self.store
            .sandbox(id)?
            .ok_or_else(|| Error::NotFound(format!("no sandbox {id}")))
    }

    /// A sandbox callers may see: unclaimed warm members belong to no one yet.
    pub fn visible_row(&self, id: &str) -> Result<SandboxRow> {
        let row = self.get_row(id)?;
        if row.pool.is_some() {
            return Err(Error::NotFound(format!("no sandbox {id}")));
        }
        Ok(row)
    }

    /// Appends a controller event to a sandbox's timeline.
    pub fn event(&self, sandbox_id: &str, kind: EventKind, data: serde_json::Value) {
        let data = controller_event_data(data);
        if let Err(e) = self
            .store
            .append_event(sandbox_id, now_ms(), kind.as_str(), &data)
        {
            tracing::error!(sandbox = sandbox_id, kind = kind.as_str(), error = %e, "cannot record an event");
        }
    }

    /// Follows the sandbox's agent events (see [`Follow`]); nothing before the controller is
    /// wired.
    pub fn follow(&self, sandbox_id: &str) {
        if let Some(f) = self.hooks.follow.get().and_then(Weak::upgrade) {
            f.follow(sandbox_id);
        }
    }

    /// Keeps the sandbox's work (see [`KeepWork`]); nothing before the controller is wired.
    pub async fn keep_work(&self, row: &SandboxRow) {
        if let Some(k) = self.hooks.keep_work.get().and_then(Weak::upgrade) {
            k.keep_work(row).await;
        }
    }
}

/// An event's data as the controller records it: marked with its source.
pub fn controller_event_data(mut data: serde_json::Value) -> serde_json::Value {
    if let Some(o) = data.as_object_mut() {
        o.insert("source".into(), "controller".into());
    }
    data
}
