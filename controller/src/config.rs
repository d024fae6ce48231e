//! `berth serve` configuration: a TOML file, every field optional.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// API keys accepted in `X-Api-Key` (also `BERTH_API_KEYS`, comma-separated).
    pub api_keys: Vec<String>,
    /// The URL clients reach this controller at (viewer URLs are built on it); default
    /// `http://<listen>`.
    pub public_url: Option<String>,
    /// The berth-agent binary the process provider runs.
    pub agent_bin: Option<PathBuf>,
    /// How long a create may take to become ready before it fails.
    pub create_timeout_secs: u64,
    /// Default and maximum sandbox / lease lifetime.
    pub default_ttl_secs: u64,
    pub max_ttl_secs: u64,
    /// How long `exec` waits for a run by default before answering with it still running.
    pub exec_wait_secs: u64,
    /// In-flight runs are re-probed this often (`run.reconciling`).
    pub reconcile_interval_secs: f64,
    /// A run whose agent stays unreachable this long fails.
    pub run_lost_after_secs: u64,
    /// A provider sandbox the store does not know is reaped once this old.
    pub orphan_grace_secs: u64,
    /// Run output kept in the store per run (the agent keeps everything for its TTL).
    pub max_stored_output_bytes: usize,
    /// At most this many sandboxes start at once for pool refills.
    pub refill_concurrency: usize,
    /// Refill stops for a pool after this many failed starts in a row.
    pub refill_max_failures: u32,
    pub pools: Vec<PoolConfig>,
    /// Profile names mapped to providers (`process`, `docker`); by the profile's
    /// `driver_hint` otherwise.
    pub providers: std::collections::BTreeMap<String, String>,
    /// The image Docker sandboxes run when a create names none (`berth image build`).
    pub docker_image: Option<String>,
    /// The API listener closes a connection that takes this long to send a request head, or
    /// sits this long idle between requests.
    pub http_header_timeout_secs: f64,
    /// A request body that sends nothing this long fails (the request is answered 4xx).
    pub http_body_idle_timeout_secs: f64,
    /// API connections open at once; past it, new ones wait to be accepted.
    pub http_max_connections: usize,
    /// The key the store's secrets (agent tokens, undelivered run requests) are sealed with:
    /// 64 hex digits, created 0600 when missing. Default `<data dir>/secret.key`; keep it
    /// elsewhere (a secrets mount) so a copy of the data dir does not carry it.
    pub secret_key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub profile: String,
    #[serde(default)]
    pub image_ref: Option<String>,
    pub size: usize,
    /// The members' screen (`"1280x800"`, desktop profiles): each is resized to it once
    /// ready, before anyone can claim it.
    #[serde(default)]
    pub screen: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            api_keys: Vec::new(),
            public_url: None,
            agent_bin: None,
            create_timeout_secs: 90,
            default_ttl_secs: 3600,
            max_ttl_secs: 24 * 3600,
            exec_wait_secs: 300,
            reconcile_interval_secs: 15.0,
            run_lost_after_secs: 120,
            orphan_grace_secs: 60,
            max_stored_output_bytes: 16 << 20,
            refill_concurrency: 3,
            refill_max_failures: 5,
            pools: Vec::new(),
            providers: Default::default(),
            docker_image: None,
            http_header_timeout_secs: 10.0,
            http_body_idle_timeout_secs: 30.0,
            http_max_connections: 4096,
            secret_key_file: None,
        }
    }
}

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let c: Config =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.max_ttl_secs > 0, "max_ttl_secs must be positive");
        anyhow::ensure!(
            self.reconcile_interval_secs > 0.0,
            "reconcile_interval_secs must be positive"
        );
        anyhow::ensure!(
            self.refill_concurrency > 0,
            "refill_concurrency must be positive"
        );
        for (name, secs) in [
            ("http_header_timeout_secs", self.http_header_timeout_secs),
            (
                "http_body_idle_timeout_secs",
                self.http_body_idle_timeout_secs,
            ),
        ] {
            anyhow::ensure!(
                secs.is_finite() && secs > 0.0 && secs <= 86_400.0,
                "{name} must be positive and at most a day"
            );
        }
        anyhow::ensure!(
            self.http_max_connections > 0,
            "http_max_connections must be positive"
        );
        Ok(())
    }

    pub fn create_timeout(&self) -> Duration {
        Duration::from_secs(self.create_timeout_secs)
    }

    pub fn reconcile_interval(&self) -> Duration {
        Duration::from_secs_f64(self.reconcile_interval_secs)
    }

    /// The bounds of the API listener.
    pub fn http_limits(&self) -> berth_protocol::serve::Limits {
        berth_protocol::serve::Limits {
            header_timeout: Duration::from_secs_f64(self.http_header_timeout_secs),
            body_idle_timeout: Duration::from_secs_f64(self.http_body_idle_timeout_secs),
            max_connections: self.http_max_connections,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_file_sets_pools_and_rejects_unknown_keys() {
        let c: Config =
            toml::from_str("create_timeout_secs = 30\n[[pools]]\nprofile = \"ide\"\nsize = 4\n")
                .unwrap();
        assert_eq!(c.create_timeout_secs, 30);
        assert_eq!(c.pools[0].size, 4);
        assert_eq!(c.default_ttl_secs, 3600);
        assert!(toml::from_str::<Config>("pool_size = 3").is_err());
        let c: Config = toml::from_str("http_header_timeout_secs = 1.5").unwrap();
        assert_eq!(c.http_limits().header_timeout, Duration::from_millis(1500));
        assert!(c.validate().is_ok());
        let c: Config = toml::from_str("http_body_idle_timeout_secs = 0.0").unwrap();
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_pool_may_declare_its_screen() {
        let c: Config = toml::from_str(
            "[[pools]]\nprofile = \"desktop-ubuntu\"\nsize = 1\nscreen = \"1280x800\"\n",
        )
        .unwrap();
        assert_eq!(c.pools[0].screen.as_deref(), Some("1280x800"));
        let c: Config = toml::from_str("[[pools]]\nprofile = \"ide\"\nsize = 1\n").unwrap();
        assert_eq!(c.pools[0].screen, None);
    }
}
