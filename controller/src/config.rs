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
    /// Profile names mapped to providers (`process`, `docker`, `kubernetes`); by the profile's
    /// `driver_hint` otherwise.
    pub providers: std::collections::BTreeMap<String, String>,
    /// `[limits."*"]` and `[limits.<profile>]`: resource limits over the catalog's, for every
    /// profile and then for one (by its name or an alias).
    pub limits: std::collections::BTreeMap<String, LimitsConfig>,
    /// The image Docker sandboxes run when a create names none (`berth image build`).
    pub docker_image: Option<String>,
    /// `[runtime]`: the OCI runtime a profile's Docker containers run under, by profile name
    /// or alias (`ide = "runsc"`: gVisor, a second kernel between the sandbox and the
    /// host); the daemon's default (runc) for the rest. The daemon must have it registered.
    pub runtime: std::collections::BTreeMap<String, String>,
    /// The optional members of Anthropic's browser toolset that desktop sandboxes serve
    /// (`javascript_exec`, `read_console`, `read_network`, `file_upload`; none by default): the
    /// agents are started with them enabled.
    pub browser_toolset_enable: Vec<String>,
    /// Sandboxes' agents ask the kernel to merge their memory with identical pages of other
    /// sandboxes (KSM, where the host runs it): less memory per desktop, at the cost of a
    /// timing channel between sandboxes. Off by default.
    pub memory_merge: bool,
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
    /// The `kubernetes` provider (`[kubernetes]`): built when this section is present or a
    /// profile is routed to it.
    pub kubernetes: Option<KubernetesConfig>,
    /// `[session]`: where the session view finds its Debian-packaged JavaScript.
    pub session: SessionConfig,
    /// Artifacts (recordings, published files, long run output, episodes) are deleted this
    /// long after they were made; 0 keeps them until deleted.
    pub artifact_retention_secs: u64,
    /// All artifacts together stay under this many bytes: past it the oldest go first; 0 sets
    /// no bound.
    pub artifact_max_bytes: u64,
    /// One artifact published from a sandbox (a file, a directory's zip, a recording) may be
    /// at most this large; a larger one is refused with 413.
    pub artifact_max_file_bytes: u64,
    /// A directory published as a zip holds at most this many entries.
    pub artifact_max_entries: usize,
    /// How long deleting a running sandbox may spend keeping its work (stopping and
    /// publishing its recordings) before it goes anyway.
    pub keep_work_timeout_secs: u64,
    /// A run whose combined output is larger than this keeps a preview of this size in its
    /// record (`stdout`, `stderr`) and the whole output as an `output` artifact.
    pub run_output_inline_bytes: usize,
    /// `[egress]`: the default egress policy and the proxy's settings.
    pub egress: EgressConfig,
    /// `[[login]]`: sites the guarded login tool signs a sandbox's browser in to, for runs
    /// that enable them by name.
    pub login: Vec<LoginConfig>,
}

/// `[egress]`: where sandboxes may connect when a create names no policy, and the egress
/// proxy's port and names.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// `"open"` (the default), `"none"`, or `{ allow = [...], deny_private = true }`.
    pub default: berth_protocol::egress::Egress,
    /// The port the proxy listens on, on the gateway address of the sandboxes' internal
    /// network (Docker); 0 lets the system pick.
    pub proxy_port: u16,
    /// Names the proxy resolves itself, before the host's resolver: `"git.test" =
    /// ["172.30.0.5"]` (a private mirror, a GitHub Enterprise host, a test host).
    pub hosts: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    /// `[[egress.credentials]]`: headers the proxy adds to requests for a host, from secrets
    /// the controller holds (sandboxes behind the proxy only).
    pub credentials: Vec<CredentialConfig>,
    /// PEM files of CAs trusted for upstream hosts besides the system's, when the proxy opens
    /// a tunnel to add a credential (a GitHub Enterprise host with its own CA).
    pub upstream_ca: Vec<PathBuf>,
    /// `[egress.github]`: the GitHub host and the token of the GitHub tools.
    pub github: Option<GithubConfig>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            default: berth_protocol::egress::Egress::default(),
            proxy_port: 3128,
            hosts: Default::default(),
            credentials: Vec::new(),
            upstream_ca: Vec::new(),
            github: None,
        }
    }
}

/// A secret from the controller's environment (`secret`, a variable's name) or a file
/// (`secret_file`, a secrets mount; trailing newline dropped); `what` names it in the error.
pub fn read_secret(
    secret: Option<&str>,
    secret_file: Option<&Path>,
    what: &str,
) -> anyhow::Result<String> {
    let v = match (secret, secret_file) {
        (Some(var), None) => std::env::var(var)
            .map_err(|_| anyhow::anyhow!("{what}: the environment variable {var} is not set"))?,
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| anyhow::anyhow!("{what}: {}: {e}", f.display()))?
            .trim_end_matches(['\r', '\n'])
            .to_string(),
        _ => anyhow::bail!("{what}: give one of secret (a variable's name) or secret_file"),
    };
    anyhow::ensure!(!v.is_empty(), "{what}: the secret is empty");
    Ok(v)
}

/// `[[egress.credentials]]`: `host = "github.com"`, `header = "Authorization"`, `secret =
/// "GITHUB_TOKEN"`, and `value = "Bearer {secret}"` (the default) or `basic_user = "x"`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    /// A host name or `*.name`.
    pub host: String,
    #[serde(default = "authorization")]
    pub header: String,
    /// The header's value, `{secret}` standing for the secret.
    #[serde(default)]
    pub value: Option<String>,
    /// Basic authentication: this user name, the secret its password.
    #[serde(default)]
    pub basic_user: Option<String>,
    /// The controller's environment variable holding the secret.
    #[serde(default)]
    pub secret: Option<String>,
    /// Or a file holding it.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
}

fn authorization() -> String {
    "Authorization".into()
}

/// `[[login]]`: a site the login tool signs in to. Its secrets are named as egress
/// credentials name theirs (a variable of the controller's environment, or a file); the
/// password fills only a masked field, and none of them is ever shown.
///
/// ```toml
/// [[login]]
/// name = "crm"
/// url = "https://crm.example.com/login"
/// username = "agent@example.com"        # or username_secret / username_secret_file
/// secret_file = "/run/secrets/crm"      # the password (or secret = "CRM_PASSWORD")
/// totp_secret_file = "/run/secrets/crm-totp"   # a base32 TOTP seed, when the site asks
/// success = { element = "#account" }    # and/or url = "…", cookie = "session"
/// form = { submit = { name = "Sign in" } }
/// max_uses = 3
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LoginConfig {
    /// What runs enable it by (`[a-z0-9_-]`, 1-64).
    pub name: String,
    /// The login page (`https://…`).
    pub url: String,
    /// The site's host (its cookies, the egress allow list); default the URL's host.
    #[serde(default)]
    pub host: Option<String>,
    /// Shown in the tool's list: what the site is for.
    #[serde(default)]
    pub description: Option<String>,
    /// The user name, when it is not secret.
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub username_secret: Option<String>,
    #[serde(default)]
    pub username_secret_file: Option<PathBuf>,
    /// The password: a variable's name, or a file.
    #[serde(default)]
    pub secret: Option<String>,
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// A TOTP seed (base32, as authenticator apps take it): the tool types the current code
    /// when the site asks for one after the password.
    #[serde(default)]
    pub totp_secret: Option<String>,
    #[serde(default)]
    pub totp_secret_file: Option<PathBuf>,
    #[serde(default)]
    pub form: berth_protocol::login::LoginForm,
    #[serde(default)]
    pub success: berth_protocol::login::LoginSuccess,
    /// Logins to this site one run may make (default 3).
    #[serde(default = "login_max_uses")]
    pub max_uses: u32,
    /// One login's bound (default 30 s, at most 120 s).
    #[serde(default = "login_timeout")]
    pub timeout_secs: u64,
}

fn login_max_uses() -> u32 {
    3
}

fn login_timeout() -> u64 {
    30
}

/// `[egress.github]`: the tools `github_repositories` and `github_clone_repository`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GithubConfig {
    /// The host repositories are cloned from (`github.com`, an Enterprise host, a test host).
    #[serde(default = "github_host")]
    pub host: String,
    /// The REST API's base URL: `https://api.github.com` for github.com, else
    /// `https://<host>/api/v3`.
    #[serde(default)]
    pub api: Option<String>,
    /// The controller's environment variable holding the token.
    #[serde(default)]
    pub secret: Option<String>,
    /// Or a file holding it.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
}

fn github_host() -> String {
    "github.com".into()
}

impl GithubConfig {
    pub fn api_base(&self) -> String {
        match &self.api {
            Some(a) => a.trim_end_matches('/').to_string(),
            None if self.host == "github.com" => "https://api.github.com".into(),
            None => format!("https://{}/api/v3", self.host),
        }
    }
}

/// `[session]`: the session view's third-party JavaScript, from Debian packages on the
/// controller's host. A missing one makes its pane say so; the page still loads.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// noVNC (package `novnc`): its `core/rfb.js` ES module and what it imports.
    pub novnc_dir: PathBuf,
    /// xterm.js's modules (package `node-xterm`: `lib/**.js`, bundled by the controller).
    pub xterm_dir: PathBuf,
    /// xterm.js's stylesheet (package `libjs-xterm`).
    pub xterm_css: PathBuf,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            novnc_dir: "/usr/share/novnc".into(),
            xterm_dir: "/usr/share/nodejs/xterm".into(),
            xterm_css: "/usr/share/javascript/xterm/xterm.css".into(),
        }
    }
}

/// `[kubernetes]`: where and how sandboxes run as Pods.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// The namespace every object is made in; default the in-cluster namespace (the service
    /// account's), else `default`.
    pub namespace: Option<String>,
    /// The image sandboxes run when a create names none (a registry the cluster pulls from).
    pub image: Option<String>,
    /// A kubeconfig file; default the in-cluster configuration when the controller runs in a
    /// Pod, else `KUBECONFIG` / `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// How the controller reaches agents; default `pod-ip` in the cluster, `port-forward`
    /// outside it.
    pub reach: Option<KubeReach>,
    /// Secrets (in `namespace`) the Pods pull their image with.
    pub image_pull_secrets: Vec<String>,
    /// Where sandboxes may connect: `"public"` (the internet; private, link-local, CGNAT and
    /// loopback ranges denied), `"none"`, or a list of CIDRs.
    pub egress: KubeEgress,
    /// The agent's port in the Pod (CDP is 9222).
    pub agent_port: Option<u16>,
    /// A seccomp profile installed on the nodes (`localhostProfile`, relative to the
    /// kubelet's seccomp directory), e.g. berth's, which lets Chromium keep its own sandbox;
    /// default the runtime's default profile.
    pub seccomp_localhost_profile: Option<String>,
    /// How long a Pod may take to be scheduled, pull its image and start its agent.
    pub start_timeout_secs: Option<u64>,
    /// The controller's Service (in its own namespace): sandboxes with an egress policy reach
    /// the egress proxy (`[egress] proxy_port`) and their DNS (the Service's port 53, to
    /// `egress_dns_port` on the controller's Pods) at its ClusterIP. Default
    /// `berth-controller`, as deploy/kubernetes names it.
    pub egress_service: Option<String>,
    /// The port the controller serves sandboxes' DNS on in its Pod (unprivileged: the Service
    /// maps 53 to it). Default 5353.
    pub egress_dns_port: Option<u16>,
    /// `[kubernetes.runtime_class]`: the RuntimeClass a profile's Pods run under, by profile
    /// name or alias (`desktop = "gvisor"`, a class the cluster defines for runsc); the
    /// cluster's default for the rest.
    pub runtime_class: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum KubeReach {
    /// `http://<Pod IP>:<port>`: the controller runs in the cluster network.
    PodIp,
    /// A local listener per sandbox that forwards through the API server's port-forward.
    PortForward,
}

/// The sandboxes' outbound network.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KubeEgress {
    /// The internet: every address but private, link-local, CGNAT and loopback ranges.
    #[default]
    Public,
    /// Nothing at all (not even DNS).
    None,
    /// These CIDRs only (and the cluster's DNS).
    Allow(Vec<String>),
}

impl<'de> Deserialize<'de> for KubeEgress {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Named(String),
            Cidrs(Vec<String>),
        }
        match Raw::deserialize(d)? {
            Raw::Named(n) if n == "public" => Ok(KubeEgress::Public),
            Raw::Named(n) if n == "none" => Ok(KubeEgress::None),
            Raw::Named(n) => Err(serde::de::Error::custom(format!(
                "egress is \"public\", \"none\" or a list of CIDRs, not {n:?}"
            ))),
            Raw::Cidrs(c) => Ok(KubeEgress::Allow(c)),
        }
    }
}

/// Whether `s` is an IPv4 or IPv6 CIDR (`10.1.0.0/16`, `2001:db8::/32`).
pub fn is_cidr(s: &str) -> bool {
    let Some((ip, len)) = s.split_once('/') else {
        return false;
    };
    let Ok(len) = len.parse::<u8>() else {
        return false;
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => len <= 32,
        Ok(std::net::IpAddr::V6(_)) => len <= 128,
        Err(_) => false,
    }
}

/// A Kubernetes object name part: a DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, ≤ 63).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl KubernetesConfig {
    pub const DEFAULT_AGENT_PORT: u16 = 5000;
    pub const CDP_PORT: u16 = 9222;

    pub fn agent_port(&self) -> u16 {
        self.agent_port.unwrap_or(Self::DEFAULT_AGENT_PORT)
    }

    pub const DEFAULT_EGRESS_SERVICE: &str = "berth-controller";
    pub const DEFAULT_EGRESS_DNS_PORT: u16 = 5353;

    pub fn egress_service(&self) -> &str {
        self.egress_service
            .as_deref()
            .unwrap_or(Self::DEFAULT_EGRESS_SERVICE)
    }

    pub fn egress_dns_port(&self) -> u16 {
        self.egress_dns_port
            .unwrap_or(Self::DEFAULT_EGRESS_DNS_PORT)
    }

    pub fn start_timeout(&self) -> Duration {
        Duration::from_secs(self.start_timeout_secs.unwrap_or(300))
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(ns) = &self.namespace {
            anyhow::ensure!(
                is_dns_label(ns),
                "[kubernetes] namespace {ns:?} is not a Kubernetes namespace name (lowercase \
                 letters, digits and '-', at most 63)"
            );
        }
        if let Some(image) = &self.image {
            anyhow::ensure!(
                !image.trim().is_empty() && !image.contains(char::is_whitespace),
                "[kubernetes] image {image:?} is not an image reference"
            );
        }
        let port = self.agent_port();
        anyhow::ensure!(
            port != 0 && port != Self::CDP_PORT,
            "[kubernetes] agent_port must be a port other than 0 and {} (CDP's)",
            Self::CDP_PORT
        );
        for s in &self.image_pull_secrets {
            anyhow::ensure!(
                !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label),
                "[kubernetes] image_pull_secrets: {s:?} is not a Secret name"
            );
        }
        if let KubeEgress::Allow(cidrs) = &self.egress {
            for c in cidrs {
                anyhow::ensure!(
                    is_cidr(c),
                    "[kubernetes] egress: {c:?} is not a CIDR (like 203.0.113.0/24)"
                );
            }
        }
        anyhow::ensure!(
            is_dns_label(self.egress_service()),
            "[kubernetes] egress_service {:?} is not a Service name",
            self.egress_service()
        );
        anyhow::ensure!(
            self.egress_dns_port() != 0,
            "[kubernetes] egress_dns_port must not be 0 (the Service maps port 53 to it)"
        );
        if let Some(p) = &self.seccomp_localhost_profile {
            anyhow::ensure!(
                !p.is_empty() && !p.starts_with('/') && !p.split('/').any(|c| c == ".."),
                "[kubernetes] seccomp_localhost_profile is a path relative to the kubelet's \
                 seccomp directory"
            );
        }
        anyhow::ensure!(
            self.start_timeout_secs != Some(0),
            "[kubernetes] start_timeout_secs must be positive"
        );
        Ok(())
    }
}

/// A `[runtime]`-shaped table (`what`): each key a profile, each value a runtime's name.
fn check_runtimes(
    what: &str,
    table: &std::collections::BTreeMap<String, String>,
    catalog: &crate::catalog::Catalog,
) -> anyhow::Result<()> {
    for (key, runtime) in table {
        anyhow::ensure!(
            catalog.profile(key).is_some(),
            "{what} {key:?} names no profile; known: {}",
            catalog.known_profiles()
        );
        anyhow::ensure!(
            is_runtime_name(runtime),
            "{what} {key} = {runtime:?} is not a runtime's name (letters, digits, . _ -)"
        );
    }
    Ok(())
}

/// A Docker runtime's or a Kubernetes RuntimeClass's name: what both accept (a DNS label's
/// characters, dots and underscores), at most 253 long.
fn is_runtime_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The key of `[limits]` that applies to every profile.
pub const EVERY_PROFILE: &str = "*";

/// One `[limits.*]` table: each field set overrides the catalog's (see
/// `berth_protocol::controller::Limits` for what each means).
pub use berth_protocol::controller::LimitsOverride as LimitsConfig;

/// A `[limits.<key>]` table's values, checked ([`LimitsConfig::check`]).
pub fn validate_limits(key: &str, l: &LimitsConfig) -> anyhow::Result<()> {
    l.check()
        .map_err(|why| anyhow::anyhow!("[limits.{key:?}] {why}"))
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
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
    /// The members' egress policy (`[egress] default` when absent): a claim is served from the
    /// pool whose policy it asks.
    #[serde(default)]
    pub egress: Option<berth_protocol::egress::Egress>,
    /// The members' limits over the profile's and `[limits]` (a create asking the same ones is
    /// served from this pool).
    #[serde(default)]
    pub limits: Option<LimitsConfig>,
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
            limits: Default::default(),
            docker_image: None,
            runtime: Default::default(),
            browser_toolset_enable: Vec::new(),
            memory_merge: false,
            http_header_timeout_secs: 10.0,
            http_body_idle_timeout_secs: 30.0,
            http_max_connections: 4096,
            secret_key_file: None,
            kubernetes: None,
            session: SessionConfig::default(),
            artifact_retention_secs: 7 * 24 * 3600,
            artifact_max_bytes: 0,
            artifact_max_file_bytes: 4 << 30,
            artifact_max_entries: 100_000,
            keep_work_timeout_secs: 60,
            run_output_inline_bytes: 256 << 10,
            egress: EgressConfig::default(),
            login: Vec::new(),
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
        let catalog = crate::catalog::Catalog::builtin();
        for (key, limits) in &self.limits {
            anyhow::ensure!(
                key == EVERY_PROFILE || catalog.profile(key).is_some(),
                "[limits.{key:?}] names no profile; known: \"*\", {}",
                catalog.known_profiles()
            );
            validate_limits(key, limits)?;
        }
        for p in &self.pools {
            if let Some(l) = &p.limits {
                l.check()
                    .map_err(|why| anyhow::anyhow!("[[pools]] {}: limits: {why}", p.profile))?;
            }
        }
        check_runtimes("[runtime]", &self.runtime, &catalog)?;
        if let Some(k) = &self.kubernetes {
            check_runtimes("[kubernetes.runtime_class]", &k.runtime_class, &catalog)?;
        }
        berth_protocol::toolset::check_browser_enable(&self.browser_toolset_enable)
            .map_err(|e| anyhow::anyhow!("browser_toolset_enable: {e}"))?;
        anyhow::ensure!(
            self.artifact_max_file_bytes > 0 && self.artifact_max_entries > 0,
            "artifact_max_file_bytes and artifact_max_entries must be positive"
        );
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
        if let Some(k) = &self.kubernetes {
            k.validate()?;
        }
        berth_protocol::egress::validate(&self.egress.default)
            .map_err(|e| anyhow::anyhow!("[egress] default: {e}"))?;
        Ok(())
    }

    /// `table` (`[runtime]` or `[kubernetes.runtime_class]`) keyed by each profile's own name
    /// instead of the name or alias the config used.
    pub fn by_profile_name(
        table: &std::collections::BTreeMap<String, String>,
    ) -> std::collections::BTreeMap<String, String> {
        let catalog = crate::catalog::Catalog::builtin();
        table
            .iter()
            .filter_map(|(k, v)| Some((catalog.profile(k)?.name.clone(), v.clone())))
            .collect()
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
    fn limits_tables_name_a_profile_or_every_one_and_hold_values_a_kernel_accepts() {
        let c: Config = toml::from_str(
            "memory_merge = true\n[limits.\"*\"]\ncpu_shares = 512\n[limits.desktop]\n\
             memory_mb = 6144\npids = 4096\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert!(c.memory_merge);
        assert_eq!(c.limits["desktop"].pids, Some(4096));
        let refused = |text: &str| {
            let parsed = toml::from_str::<Config>(text);
            let err = match parsed {
                Ok(c) => c.validate().unwrap_err().to_string(),
                Err(e) => e.to_string(),
            };
            assert!(!err.is_empty(), "{text}");
            err
        };
        assert!(refused("[limits.nope]\npids = 1\n").contains("names no profile"));
        assert!(refused("[limits.ide]\npids = 0\n").contains("pids"));
        assert!(refused("[limits.ide]\ncpus = -1.0\n").contains("cpus"));
        assert!(refused("[limits.ide]\ncpu_shares = 1\n").contains("cpu_shares"));
        assert!(refused("[limits.ide]\nmemory_mb = 1\n").contains("memory_mb"));
        assert!(refused("[limits.ide]\nswap_mb = 1\n").contains("unknown field"));
    }

    #[test]
    fn runtimes_name_a_profile_and_a_runtime_and_are_keyed_by_the_profiles_own_name() {
        let c: Config = toml::from_str(
            "[runtime]\nide = \"runsc\"\n[kubernetes.runtime_class]\ndesktop = \"gvisor\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(
            Config::by_profile_name(&c.runtime),
            [("ide-ubuntu".to_string(), "runsc".to_string())].into()
        );
        let k = c.kubernetes.unwrap();
        assert_eq!(
            Config::by_profile_name(&k.runtime_class),
            [("desktop-ubuntu".to_string(), "gvisor".to_string())].into()
        );
        let refused = |text: &str| {
            toml::from_str::<Config>(text)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string()
        };
        assert!(refused("[runtime]\nnope = \"runsc\"\n").contains("names no profile"));
        assert!(refused("[runtime]\nide = \"run sc\"\n").contains("not a runtime's name"));
        assert!(
            refused("[kubernetes.runtime_class]\nnope = \"gvisor\"\n").contains("names no profile")
        );
    }

    #[test]
    fn egress_defaults_parse_in_their_three_forms_and_bad_entries_are_named() {
        use berth_protocol::egress::{Egress, EgressMode, EgressRules};
        let parse = |t: &str| {
            let c: Config = toml::from_str(t).unwrap();
            c.validate().map(|_| c)
        };
        let c = parse(
            "[egress]\ndefault = { allow = [\"github.com\", \"*.pypi.org\", \"10.1.2.0/24\"], \
             deny_private = true }\nproxy_port = 0\nhosts = { \"git.internal\" = [\"10.1.2.7\"] }\n",
        )
        .unwrap();
        assert_eq!(
            c.egress.default,
            Egress::Rules(EgressRules {
                allow: vec![
                    "github.com".into(),
                    "*.pypi.org".into(),
                    "10.1.2.0/24".into()
                ],
                deny_private: true
            })
        );
        assert_eq!(
            c.egress.hosts["git.internal"],
            vec!["10.1.2.7".parse::<std::net::IpAddr>().unwrap()]
        );
        let c = parse("[egress]\ndefault = \"none\"\n").unwrap();
        assert_eq!(c.egress.default, Egress::Mode(EgressMode::None));
        assert_eq!(
            Config::default().egress.default,
            Egress::Mode(EgressMode::Open)
        );
        assert_eq!(Config::default().egress.proxy_port, 3128);
        let err = parse("[egress]\ndefault = { allow = [\"a b\"] }\n").unwrap_err();
        assert!(err.to_string().contains("egress allow entry"), "{err}");
    }

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
    fn a_kubernetes_section_parses_with_defaults_and_validates() {
        let c: Config = toml::from_str(
            "[providers]\nide = \"kubernetes\"\n[kubernetes]\nnamespace = \"berth\"\n\
             image = \"registry.local:5000/berth/desktop:1\"\nreach = \"port-forward\"\n\
             image_pull_secrets = [\"pull\"]\negress = [\"203.0.113.0/24\", \"2001:db8::/32\"]\n",
        )
        .unwrap();
        let k = c.kubernetes.as_ref().unwrap();
        assert_eq!(k.namespace.as_deref(), Some("berth"));
        assert_eq!(k.reach, Some(KubeReach::PortForward));
        assert_eq!(
            k.egress,
            KubeEgress::Allow(vec!["203.0.113.0/24".into(), "2001:db8::/32".into()])
        );
        assert_eq!(k.agent_port(), 5000);
        assert!(c.validate().is_ok());

        let c: Config = toml::from_str("[kubernetes]\n").unwrap();
        let k = c.kubernetes.unwrap();
        assert_eq!(k.egress, KubeEgress::Public);
        assert_eq!(k.reach, None);
        assert_eq!(k.start_timeout(), Duration::from_secs(300));
        let c: Config = toml::from_str("[kubernetes]\negress = \"none\"\n").unwrap();
        assert_eq!(c.kubernetes.unwrap().egress, KubeEgress::None);

        for bad in [
            "egress = \"open\"",
            "reach = \"node-port\"",
            "namespce = \"x\"",
        ] {
            assert!(
                toml::from_str::<Config>(&format!("[kubernetes]\n{bad}\n")).is_err(),
                "{bad}"
            );
        }
        for bad in [
            "namespace = \"Berth_NS\"",
            "egress = [\"10.0.0.0/33\"]",
            "egress = [\"example.com\"]",
            "agent_port = 9222",
            "agent_port = 0",
            "image_pull_secrets = [\"Bad Name\"]",
            "image = \"\"",
            "seccomp_localhost_profile = \"/etc/berth.json\"",
            "start_timeout_secs = 0",
        ] {
            let c: Config = toml::from_str(&format!("[kubernetes]\n{bad}\n")).unwrap();
            assert!(c.validate().is_err(), "{bad} is accepted");
        }
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
