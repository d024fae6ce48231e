//! The controller's wire contract (`/sandbox/...`): sandboxes, runs, leases, the catalog, and a
//! typed client for the CLI and the tests.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::client::{AgentClient, Auth, ClientError, Result, check, default_http};
use crate::routes::{controller as route, fill};

/// Header carrying the controller's API key.
pub const API_KEY_HEADER: &str = crate::routes::header::API_KEY;

pub use crate::routes::controller::{CATALOG, LEASES, POOLS, SANDBOXES};

/// `POST /sandbox/sandboxes/v1`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    pub profile: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_ref: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// The desktop's screen as `WIDTHxHEIGHT` (`"1280x800"`): even sides from 320x200 to
    /// 7680x4320. Desktop profiles only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen: Option<String>,
    /// Where its programs may connect: `"open"`, `"none"`, or
    /// `{"allow": ["github.com", "*.pypi.org"], "deny_private": true}`; the config's
    /// `[egress] default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::Egress>,
    /// Headers the egress proxy adds to this sandbox's requests to a host, from secrets given
    /// here (kept sealed by the controller, never shown again, never in the sandbox). Needs an
    /// egress allow list naming each host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<SandboxCredential>,
    /// Lets its agent ask for a person (`request_human_control`, MCP and
    /// `POST /v1/control/request`); the tool is not listed otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub human_control: Option<bool>,
    /// The controller's `[[login]]` sites its run may sign its browser in to (the `login`
    /// tool is listed only when there are some).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logins: Vec<String>,
    /// Its resources, over its profile's and the config's (`{"cpus": 1.5, "memory_mb": 2048}`):
    /// a warm pool serves it only when its members have the same limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsOverride>,
}

/// A credential given at create: `{"host": "api.example.com", "header": "Authorization",
/// "value": "Bearer {secret}", "secret": "…"}` (or `"basic_user"` for basic authentication).
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxCredential {
    /// A host name or `*.name`, which the sandbox's egress policy allows.
    pub host: String,
    /// Default `Authorization`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// The header's value, `{secret}` standing for the secret; default `Bearer {secret}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Basic authentication with this user name, the secret its password (instead of `value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_user: Option<String>,
    /// The secret.
    pub secret: String,
}

impl std::fmt::Debug for SandboxCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCredential")
            .field("host", &self.host)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// A credential as the sandbox's record shows it: where it goes, not what it is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct CredentialView {
    pub host: String,
    pub header: String,
}

/// The smallest and largest screens a desktop is asked to take (`screen`, `PUT /v1/display`).
pub const SCREEN_MIN: (u32, u32) = (320, 200);
pub const SCREEN_MAX: (u32, u32) = (7680, 4320);

/// Parses a screen size `WIDTHxHEIGHT` (`1280x800`; `X` and `*` also separate) within
/// [`SCREEN_MIN`]..=[`SCREEN_MAX`], with even sides; the reason when it is not one.
pub fn parse_screen(s: &str) -> std::result::Result<(u32, u32), String> {
    let bad = || format!("screen {s:?}: give WIDTHxHEIGHT, e.g. 1280x800");
    let (w, h) = s.trim().split_once(['x', 'X', '*']).ok_or_else(bad)?;
    let side = |v: &str| -> std::result::Result<u32, String> {
        let v = v.trim();
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        v.parse().map_err(|_| bad())
    };
    let (w, h) = (side(w)?, side(h)?);
    let (lo, hi) = (SCREEN_MIN, SCREEN_MAX);
    if w < lo.0 || h < lo.1 || w > hi.0 || h > hi.1 {
        return Err(format!(
            "screen {w}x{h}: from {}x{} to {}x{}",
            lo.0, lo.1, hi.0, hi.1
        ));
    }
    if w % 2 != 0 || h % 2 != 0 {
        return Err(format!("screen {w}x{h}: width and height must be even"));
    }
    Ok((w, h))
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Viewer {
    /// `novnc`, or `none` for profiles without a desktop.
    pub kind: String,
    /// Stable and authenticated; `POST …/{id}/viewer` mints a one-time URL for a browser.
    #[serde(default)]
    pub url: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct Endpoints {
    /// The agent's OSWorld-compatible surface (`/screenshot`, `/execute`, …).
    #[serde(default)]
    pub compat: Option<String>,
    /// Chromium's DevTools endpoint through the agent's TCP relay (`connect_over_cdp`).
    #[serde(default)]
    pub cdp: Option<String>,
    /// The declared ports through the controller's preview route, by name:
    /// `{"vlc": {"port": 8080, "url": "<controller>/sandbox/sandboxes/v1/{id}/ports/8080/"}}`
    /// (the URL needs the API key; `POST …/ports/{port}/url` mints one for a browser).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub preview: BTreeMap<String, PortPreview>,
    /// The ports the sandbox's image declares (its `berth.ports` label), by name (`"vlc"`):
    /// `http://host:port` as harnesses on the controller's host reach them.
    #[serde(flatten)]
    pub ports: BTreeMap<String, String>,
}

/// A declared port as `endpoints.preview` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct PortPreview {
    /// The port inside the sandbox (`127.0.0.1:{port}` there).
    pub port: u16,
    /// The controller's preview route for it (`…/{id}/ports/{port}/`).
    pub url: String,
}

/// Names `endpoints` uses itself, which a declared port may not take.
pub const RESERVED_ENDPOINT_NAMES: [&str; 3] = ["compat", "cdp", "preview"];

/// `POST /sandbox/sandboxes/v1?wait=`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateQuery {
    /// false: answer at once (`pending`/`starting`) and let readiness happen in the background.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<bool>,
}

/// The resources a sandbox was created with (its profile's, then the config's `[limits]`), and
/// which of them its provider does not enforce. A sandbox over its memory fails with reason
/// `oom_killed`; one whose processes reach `pids` keeps running and reports
/// `sandbox.pids_limit` on its timeline.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Limits {
    /// CPUs it may use at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Its weight when the host's CPUs are contended (1024: an equal share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_shares: Option<u64>,
    /// Memory, MiB: page cache and `/dev/shm` count against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Swap past `memory_mb`, MiB: 0 (a sandbox over its memory is stopped, not slowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_mb: Option<u64>,
    /// Processes and threads at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// The size of its `/dev/shm`, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_mb: Option<u64>,
    /// The limits above that its provider does not enforce, each with the reason.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unenforced: BTreeMap<String, String>,
}

impl Limits {
    /// The names of the limits set (`cpus`, `memory_mb`, …), in wire order.
    pub fn names(&self) -> Vec<&'static str> {
        let set = [
            ("cpus", self.cpus.is_some()),
            ("cpu_shares", self.cpu_shares.is_some()),
            ("memory_mb", self.memory_mb.is_some()),
            ("swap_mb", self.swap_mb.is_some()),
            ("pids", self.pids.is_some()),
            ("shm_mb", self.shm_mb.is_some()),
        ];
        set.into_iter()
            .filter(|(_, s)| *s)
            .map(|(n, _)| n)
            .collect()
    }
}

/// Limits asked for one sandbox (at create, or for a pool's members) or set by the
/// config's `[limits.*]`: each field set replaces the one below it (the catalog's profile, then
/// `[limits."*"]`, then `[limits.<profile>]`, then the create's).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_shares: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_mb: Option<u64>,
}

impl LimitsOverride {
    /// These limits with `over`'s set fields in their place.
    pub fn over(self, over: &LimitsOverride) -> LimitsOverride {
        LimitsOverride {
            cpus: over.cpus.or(self.cpus),
            cpu_shares: over.cpu_shares.or(self.cpu_shares),
            memory_mb: over.memory_mb.or(self.memory_mb),
            pids: over.pids.or(self.pids),
            shm_mb: over.shm_mb.or(self.shm_mb),
        }
    }

    /// Values a kernel accepts (pure): a positive finite CPU count, Docker's range of CPU
    /// shares, at least 6 MiB of memory (Docker's floor), a positive process count and
    /// `/dev/shm` size.
    pub fn check(&self) -> std::result::Result<(), String> {
        let bad = |ok: bool, why: &str| if ok { Ok(()) } else { Err(why.to_string()) };
        if let Some(c) = self.cpus {
            bad(
                c.is_finite() && c > 0.0 && c <= 4096.0,
                "cpus must be positive",
            )?;
        }
        if let Some(s) = self.cpu_shares {
            bad((2..=262_144).contains(&s), "cpu_shares must be 2..=262144")?;
        }
        if let Some(m) = self.memory_mb {
            bad((6..=1 << 30).contains(&m), "memory_mb must be at least 6")?;
        }
        if let Some(p) = self.pids {
            bad((1..=1 << 22).contains(&p), "pids must be 1..=4194304")?;
        }
        if let Some(s) = self.shm_mb {
            bad((1..=1 << 30).contains(&s), "shm_mb must be positive")?;
        }
        Ok(())
    }
}

/// The reason a sandbox killed for memory fails with (its `error` begins with it).
pub const OOM_KILLED: &str = "oom_killed";

/// The whole reason of a sandbox failed for memory, with its limit when known.
pub fn oom_killed_reason(limit_bytes: Option<u64>) -> String {
    let limit = match limit_bytes {
        Some(b) => format!(" (its limit: {} MiB)", b >> 20),
        None => String::new(),
    };
    format!("{OOM_KILLED}: the kernel killed a process in it for memory{limit}")
}

/// A sandbox as the controller reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Sandbox {
    pub id: String,
    pub profile: String,
    pub status: crate::lifecycle::SandboxStatus,
    pub viewer: Viewer,
    pub endpoints: Endpoints,
    pub labels: BTreeMap<String, String>,
    pub image_ref: String,
    pub created_at: String,
    pub ready_at: Option<String>,
    pub expires_at: Option<String>,
    pub error: Option<String>,
    /// `warm` when the sandbox came from a warm pool, `cold` when it was created for the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// A desktop's screen (`"1280x800"`): the one asked at create or by its pool, else the
    /// one its desktop started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen: Option<String>,
    /// Its resource limits, as it was created with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// Its egress policy and what went through the proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressReport>,
}

/// A sandbox's egress, as its record reports it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct EgressReport {
    pub policy: crate::egress::Egress,
    /// Connections made through the proxy, by host.
    #[serde(default)]
    pub hosts: BTreeMap<String, u64>,
    /// Connections refused (each an `egress.denied` event).
    #[serde(default)]
    pub denied: u64,
    /// GitHub repositories cloned into it (`owner/name`): the proxy adds the token to their
    /// requests, and to no other repository's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repositories: Vec<String>,
    /// The credentials given at create (their hosts and headers; the secrets are never shown).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<CredentialView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

/// `POST …/{id}/exec`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// An argv list (run directly) or a string (run with `sh -c` unless `shell` is false).
    pub command: Command,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Environment values that never appear in logs, events or answers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Wait (bounded) for the run to end and answer with its output; default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<bool>,
    /// Client-chosen id: repeating a request with the same id returns the same run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Run as this account of the sandbox (`root`, a name) instead of its user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Command {
    Argv(Vec<String>),
    Line(String),
}

impl Default for Command {
    fn default() -> Self {
        Command::Argv(Vec::new())
    }
}

/// A run (`GET …/{id}/runs/{run_id}`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Run {
    pub id: String,
    #[serde(default)]
    pub sandbox_id: String,
    pub status: crate::lifecycle::RunStatus,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    pub error: Option<String>,
    /// Set when the stored output was cut at the controller's cap; the agent keeps the rest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_truncated: bool,
    /// Output past the controller's inline bound: `stdout`/`stderr` hold a bounded preview and
    /// the whole output is this artifact (`GET /sandbox/v1/artifacts/{id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_artifact: Option<String>,
    /// Set when `stdout`/`stderr` are a preview (the rest is in `output_artifact`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// With `output_artifact`: the whole output's first and last lines and its size (the
    /// artifact is read by range: `Range: bytes=…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_preview: Option<crate::exec::OutputPreview>,
}

impl Run {
    pub fn done(&self) -> bool {
        self.status.done()
    }
}

/// `POST /sandbox/v1/leases`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireLease {
    pub thread_id: String,
    pub profile: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_ref: Option<String>,
    /// Required labels: a sandbox without them is replaced.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// A desktop's screen (`"1280x800"`), as at create: a new sandbox starts at it and a
    /// reused one of another size is resized to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen: Option<String>,
    /// A new sandbox's egress policy, as at create; a reused one must have the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::Egress>,
    /// Lets the leased sandbox's agent ask for a person (`request_human_control`), as at
    /// create; a reused sandbox is enabled too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub human_control: Option<bool>,
    /// The controller's `[[login]]` sites its run may sign its browser in to (the `login`
    /// tool is listed only when there are some).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logins: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Lease {
    pub lease_id: String,
    pub sandbox: Sandbox,
    #[serde(default)]
    pub thread_id: String,
    #[serde(default)]
    pub expires_at: Option<String>,
    /// `reused`, `warm` or `cold`: how this answer's sandbox was obtained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub how: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewLease {
    pub ttl_seconds: u64,
}

/// One catalog entry; the fields present depend on the kind.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct CatalogList {
    pub kind: String,
    pub items: Vec<serde_json::Value>,
}

/// `GET /sandbox/v1/github/repositories`: the repositories the configured GitHub token reads.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GithubRepositoryList {
    pub repositories: Vec<GithubRepository>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GithubRepository {
    /// `owner/name`: what `github_clone_repository` takes.
    pub full_name: String,
    #[serde(default)]
    pub private: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_branch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// `POST /sandbox/sandboxes/v1/{id}/github/clone`: clone a repository into the sandbox, the
/// token added by the egress proxy (it never enters the sandbox).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GithubClone {
    /// `owner/name`.
    pub repository: String,
    /// Where to clone to, relative to the sandbox's working directory (its user's home)
    /// unless absolute; default: the repository's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A branch or tag to check out (default: the repository's default branch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// A shallow clone of this many commits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
}

/// The answer of a clone: where it went and the `git clone` run (its output).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct GithubCloned {
    pub repository: String,
    pub path: String,
    pub run: Run,
}

/// `GET …/{id}/github/pulls` and `…/issues`: which repository (one cloned into the sandbox),
/// which state and page.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GithubListQuery {
    /// `owner/name`, a repository cloned into this sandbox with `github_clone_repository`.
    pub repository: String,
    /// `open` (default), `closed` or `all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// From 1 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<u32>,
    /// 1-100 (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_page: Option<u32>,
}

/// `GET …/{id}/github/pulls/{number}` and `…/issues/{number}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GithubItemQuery {
    /// `owner/name`, a repository cloned into this sandbox.
    pub repository: String,
}

/// A text that may be large (a description, a diff, a comment): whole when it is at most
/// [`GITHUB_INLINE_BYTES`], else a bounded preview and the artifact that holds it whole.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GithubText {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Its first and last lines, when it is not inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<crate::exec::OutputPreview>,
    /// The artifact holding it whole (`GET /sandbox/v1/artifacts/{id}`, `Range` reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub href: Option<String>,
}

/// Texts past this many bytes travel as an artifact with a preview.
pub const GITHUB_INLINE_BYTES: usize = 64 * 1024;

/// A pull request as a list shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GithubPullSummary {
    pub number: u64,
    pub title: String,
    /// `open` or `closed`.
    pub state: String,
    #[serde(default)]
    pub merged: bool,
    #[serde(default)]
    pub draft: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The branch it brings, and the one it goes into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html_url: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GithubPullList {
    pub repository: String,
    pub page: u32,
    pub per_page: u32,
    pub pulls: Vec<GithubPullSummary>,
    /// The next page, when GitHub has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_page: Option<u32>,
}

/// A file a pull request changes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GithubFile {
    pub filename: String,
    /// `added`, `modified`, `removed`, `renamed`, …
    pub status: String,
    #[serde(default)]
    pub additions: u64,
    #[serde(default)]
    pub deletions: u64,
}

/// A review, a review comment (on a line of the diff) or an issue comment.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GithubComment {
    pub id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    pub body: GithubText,
    /// A review's `APPROVED`, `CHANGES_REQUESTED`, `COMMENTED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// A review comment's file and line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
}

/// `GET …/{id}/github/pulls/{number}`: its description, diff, files, reviews and review
/// comments (each list its first [`GITHUB_MAX_ITEMS`]; `truncated` says when there were more).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GithubPull {
    pub repository: String,
    #[serde(flatten)]
    pub summary: GithubPullSummary,
    pub body: GithubText,
    pub diff: GithubText,
    pub files: Vec<GithubFile>,
    pub reviews: Vec<GithubComment>,
    pub review_comments: Vec<GithubComment>,
    /// Lists cut at [`GITHUB_MAX_ITEMS`] (`files`, `reviews`, `review_comments`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub truncated: Vec<String>,
}

/// The most files, reviews or comments one read answers.
pub const GITHUB_MAX_ITEMS: usize = 300;

/// An issue as a list shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GithubIssueSummary {
    pub number: u64,
    pub title: String,
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    #[serde(default)]
    pub comments: u64,
    /// GitHub lists pull requests among issues; this one is one.
    #[serde(default)]
    pub is_pull_request: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html_url: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GithubIssueList {
    pub repository: String,
    pub page: u32,
    pub per_page: u32,
    pub issues: Vec<GithubIssueSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_page: Option<u32>,
}

/// `GET …/{id}/github/issues/{number}`: the issue and its comments.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct GithubIssue {
    pub repository: String,
    #[serde(flatten)]
    pub summary: GithubIssueSummary,
    pub body: GithubText,
    pub comment_list: Vec<GithubComment>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub truncated: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ViewerUrl {
    pub url: String,
}

/// `POST /sandbox/sandboxes/v1/{id}/session`: the session view's one-time URL.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct SessionUrl {
    pub url: String,
    /// When the URL stops opening (RFC 3339); the cookie it sets lasts longer.
    pub expires_at: String,
}

/// `POST /sandbox/sandboxes/v1/{id}/ports/{port}/url`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PortUrlRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

/// A one-time browser URL for a preview (it sets a cookie scoped to that port's path).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct PortUrl {
    pub url: String,
    pub expires_at: String,
}

/// One warm pool (`GET /sandbox/v1/pools`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct PoolStatus {
    /// `profile@image_ref`, then `#egress-<digest>` for members with a policy other than the
    /// config's default.
    pub pool: String,
    pub profile: String,
    pub image_ref: String,
    /// The target number of ready members.
    pub size: usize,
    pub ready: usize,
    pub starting: usize,
    pub paused: bool,
    /// Set when refill stopped after repeated failures: the last one.
    pub failing: Option<String>,
    /// The members' screen (`"1280x800"`) when the pool declares one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen: Option<String>,
    /// The members' egress policy when it is not the config's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::Egress>,
}

/// `GET /sandbox/v1/pools` and the answer to `PUT /sandbox/v1/pools/{profile}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct PoolList {
    pub pools: Vec<PoolStatus>,
}

/// `PUT /sandbox/v1/pools/{profile}`: pause/resume and/or resize every pool of the profile.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdjustPool {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<usize>,
}

/// `POST /sandbox/sandboxes/v1/images/build`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildImage {
    /// The recipe's profile (`desktop`, `ide`, …); required unless `from` or `dockerfile` is given.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub profile: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apps: Vec<String>,
    /// Bring your own image: an image in the controller's engine, the agent put in as PID 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Bring your own image: a build context on the controller's host whose Dockerfile is
    /// built first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dockerfile: Option<String>,
}

impl BuildImage {
    /// What to build, or why the body says nothing buildable (pure).
    pub fn kind(&self) -> std::result::Result<BuildKind<'_>, String> {
        let recipe = !self.profile.is_empty() || self.bundle.is_some() || !self.apps.is_empty();
        match (&self.from, &self.dockerfile) {
            (Some(_), Some(_)) => Err("give one of from and dockerfile".into()),
            (Some(_), None) | (None, Some(_)) if recipe => Err(
                "from and dockerfile bring their own image: profile, bundle and apps are for \
                 berth's recipes"
                    .into(),
            ),
            (Some(f), None) => Ok(BuildKind::From(f)),
            (None, Some(d)) => Ok(BuildKind::Dockerfile(d)),
            (None, None) if self.profile.is_empty() => {
                Err("give a profile (or from, or dockerfile)".into())
            }
            (None, None) => Ok(BuildKind::Recipe),
        }
    }
}

/// What a [`BuildImage`] body asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildKind<'a> {
    Recipe,
    From(&'a str),
    Dockerfile(&'a str),
}

/// An image build job (`POST …/images/build`, `GET …/images/{image_ref}`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct ImageJob {
    pub image_ref: String,
    /// The same pin, as the gateway API names it.
    pub image_uri: String,
    pub status: crate::lifecycle::ImageJobStatus,
    pub steps: Vec<String>,
    pub error: Option<String>,
    pub started_at: String,
    pub ended_at: Option<String>,
}

/// A typed client for the controller API.
#[derive(Clone)]
pub struct ControllerClient {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl ControllerClient {
    pub fn new(base: impl Into<String>, key: Option<String>) -> Self {
        let http = default_http(Some(Duration::from_secs(900)));
        ControllerClient {
            base: base.into().trim_end_matches('/').to_string(),
            key,
            http,
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// The sandbox's agent through the controller (`ANY /sandbox/sandboxes/v1/{id}/v1/{*path}`):
    /// every typed agent call, WebSockets included, authenticated with this client's API key.
    /// Shares this client's HTTP pool (and its 900 s whole-request timeout).
    pub fn agent(&self, id: &str) -> AgentClient {
        AgentClient::with_auth(
            self.url(&fill(route::SANDBOX, &[id])),
            self.key.clone().map(Auth::ApiKey).unwrap_or_default(),
            self.http.clone(),
        )
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, self.url(path));
        match &self.key {
            Some(k) => rb.header(API_KEY_HEADER, k),
            None => rb,
        }
    }

    async fn call<T: DeserializeOwned>(rb: reqwest::RequestBuilder) -> Result<T> {
        let resp = check(rb.send().await?).await?;
        let bytes = resp.bytes().await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Decode(format!("{e}: {}", String::from_utf8_lossy(&bytes))))
    }

    pub async fn create(&self, req: &CreateSandbox) -> Result<Sandbox> {
        Self::call(self.request(reqwest::Method::POST, SANDBOXES).json(req)).await
    }

    /// Answers as soon as the sandbox exists (`?wait=false`): `starting` when created cold.
    pub async fn create_nowait(&self, req: &CreateSandbox) -> Result<Sandbox> {
        Self::call(
            self.request(reqwest::Method::POST, &format!("{SANDBOXES}?wait=false"))
                .json(req),
        )
        .await
    }

    pub async fn get(&self, id: &str) -> Result<Sandbox> {
        Self::call(self.request(reqwest::Method::GET, &fill(route::SANDBOX, &[id]))).await
    }

    /// `labels`: `k=v` filters, all of which must match.
    pub async fn list(&self, labels: &[(String, String)]) -> Result<SandboxList> {
        let q: Vec<(&str, String)> = labels
            .iter()
            .map(|(k, v)| ("label", format!("{k}={v}")))
            .collect();
        Self::call(self.request(reqwest::Method::GET, SANDBOXES).query(&q)).await
    }

    pub async fn delete(&self, id: &str) -> Result<serde_json::Value> {
        Self::call(self.request(reqwest::Method::DELETE, &fill(route::SANDBOX, &[id]))).await
    }

    pub async fn exec(&self, id: &str, req: &RunRequest) -> Result<Run> {
        Self::call(
            self.request(reqwest::Method::POST, &fill(route::SANDBOX_EXEC, &[id]))
                .json(req),
        )
        .await
    }

    /// `GET /sandbox/v1/github/repositories`.
    pub async fn github_repositories(&self) -> Result<GithubRepositoryList> {
        Self::call(self.request(reqwest::Method::GET, route::GITHUB_REPOSITORIES)).await
    }

    /// `POST …/{id}/github/clone`.
    pub async fn github_clone(&self, id: &str, req: &GithubClone) -> Result<GithubCloned> {
        Self::call(
            self.request(
                reqwest::Method::POST,
                &fill(route::SANDBOX_GITHUB_CLONE, &[id]),
            )
            .json(req),
        )
        .await
    }

    /// `GET …/{id}/github/pulls`: a page of a cloned repository's pull requests.
    pub async fn github_pulls(&self, id: &str, q: &GithubListQuery) -> Result<GithubPullList> {
        Self::call(
            self.request(
                reqwest::Method::GET,
                &fill(route::SANDBOX_GITHUB_PULLS, &[id]),
            )
            .query(q),
        )
        .await
    }

    pub async fn github_pull(&self, id: &str, repository: &str, number: u64) -> Result<GithubPull> {
        let n = number.to_string();
        Self::call(
            self.request(
                reqwest::Method::GET,
                &fill(route::SANDBOX_GITHUB_PULL, &[id, &n]),
            )
            .query(&[("repository", repository)]),
        )
        .await
    }

    pub async fn github_issues(&self, id: &str, q: &GithubListQuery) -> Result<GithubIssueList> {
        Self::call(
            self.request(
                reqwest::Method::GET,
                &fill(route::SANDBOX_GITHUB_ISSUES, &[id]),
            )
            .query(q),
        )
        .await
    }

    pub async fn github_issue(
        &self,
        id: &str,
        repository: &str,
        number: u64,
    ) -> Result<GithubIssue> {
        let n = number.to_string();
        Self::call(
            self.request(
                reqwest::Method::GET,
                &fill(route::SANDBOX_GITHUB_ISSUE, &[id, &n]),
            )
            .query(&[("repository", repository)]),
        )
        .await
    }

    /// `GET …/{id}/login`: the login sites the sandbox's run enables.
    pub async fn login_sites(&self, id: &str) -> Result<crate::login::LoginSites> {
        Self::call(self.request(reqwest::Method::GET, &fill(route::SANDBOX_LOGIN, &[id]))).await
    }

    /// `POST …/{id}/login`: the sandbox's browser signed in to `site`.
    pub async fn login(&self, id: &str, site: &str) -> Result<crate::login::LoginAnswer> {
        let req = crate::login::LoginRequest { site: site.into() };
        Self::call(
            self.request(reqwest::Method::POST, &fill(route::SANDBOX_LOGIN, &[id]))
                .json(&req),
        )
        .await
    }

    pub async fn run(&self, id: &str, run_id: &str) -> Result<Run> {
        Self::call(self.request(reqwest::Method::GET, &fill(route::RUN, &[id, run_id]))).await
    }

    pub async fn viewer(&self, id: &str) -> Result<ViewerUrl> {
        Self::call(self.request(reqwest::Method::POST, &fill(route::SANDBOX_VIEWER, &[id]))).await
    }

    /// `POST …/{id}/session`: a one-time URL for the session view.
    pub async fn session(&self, id: &str) -> Result<SessionUrl> {
        Self::call(self.request(reqwest::Method::POST, &fill(route::SANDBOX_SESSION, &[id]))).await
    }

    /// `GET …/{id}/episode`: the episode bundle's bytes (a zip).
    pub async fn episode_bundle(&self, id: &str) -> Result<Vec<u8>> {
        let path = fill(route::SANDBOX_EPISODE, &[id]);
        let resp = check(self.request(reqwest::Method::GET, &path).send().await?).await?;
        Ok(resp.bytes().await?.to_vec())
    }

    /// `GET …/{id}/episode?format=atif`: the episode as an ATIF trajectory.
    pub async fn episode_atif(&self, id: &str) -> Result<serde_json::Value> {
        let path = fill(route::SANDBOX_EPISODE, &[id]);
        Self::call(
            self.request(reqwest::Method::GET, &path)
                .query(&[("format", "atif")]),
        )
        .await
    }

    pub async fn screenshot(&self, id: &str) -> Result<Vec<u8>> {
        let resp = check(
            self.request(
                reqwest::Method::GET,
                &fill(route::SANDBOX_SCREENSHOT, &[id]),
            )
            .send()
            .await?,
        )
        .await?;
        Ok(resp.bytes().await?.to_vec())
    }

    pub async fn acquire(&self, req: &AcquireLease) -> Result<Lease> {
        Self::call(self.request(reqwest::Method::POST, LEASES).json(req)).await
    }

    pub async fn renew(&self, lease_id: &str, ttl_seconds: u64) -> Result<Lease> {
        Self::call(
            self.request(
                reqwest::Method::POST,
                &fill(route::LEASE_RENEW, &[lease_id]),
            )
            .json(&RenewLease { ttl_seconds }),
        )
        .await
    }

    pub async fn release(&self, lease_id: &str) -> Result<serde_json::Value> {
        Self::call(self.request(reqwest::Method::DELETE, &fill(route::LEASE, &[lease_id]))).await
    }

    /// A sandbox's timeline from `from_seq`: `{"events": [...], "next_seq"}`.
    pub async fn events(&self, id: &str, from_seq: u64) -> Result<serde_json::Value> {
        Self::call(self.request(
            reqwest::Method::GET,
            &format!(
                "{}?from_seq={from_seq}&limit=10000",
                fill(route::SANDBOX_EVENTS, &[id])
            ),
        ))
        .await
    }

    /// The warm pools, typed.
    pub async fn pool_list(&self) -> Result<PoolList> {
        Self::call(self.request(reqwest::Method::GET, POOLS)).await
    }

    /// Builds (or finds) an image; the job answers at once.
    pub async fn build_image(&self, req: &BuildImage) -> Result<ImageJob> {
        Self::call(
            self.request(reqwest::Method::POST, route::IMAGES_BUILD)
                .json(req),
        )
        .await
    }

    pub async fn image_job(&self, image_ref: &str) -> Result<ImageJob> {
        Self::call(self.request(reqwest::Method::GET, &fill(route::IMAGE, &[image_ref]))).await
    }

    /// A one-time browser URL for the preview of `port` in the sandbox.
    pub async fn port_url(&self, id: &str, port: u16, req: &PortUrlRequest) -> Result<PortUrl> {
        let path = fill(route::SANDBOX_PORT_URL, &[id, &port.to_string()]);
        Self::call(self.request(reqwest::Method::POST, &path).json(req)).await
    }

    /// Warm pools: `{"pools": [{"pool", "profile", "size", "ready", "starting", "paused", "failing"}]}`.
    pub async fn pools(&self) -> Result<serde_json::Value> {
        Self::call(self.request(reqwest::Method::GET, POOLS)).await
    }

    /// Pauses/resumes or resizes the pools of a profile.
    pub async fn adjust_pool(
        &self,
        profile: &str,
        paused: Option<bool>,
        size: Option<usize>,
    ) -> Result<serde_json::Value> {
        let body = AdjustPool { paused, size };
        Self::call(
            self.request(reqwest::Method::PUT, &fill(route::POOL, &[profile]))
                .json(&body),
        )
        .await
    }

    /// `GET /metrics` (no key needed): the Prometheus text.
    pub async fn metrics(&self) -> Result<String> {
        let resp = check(self.http.get(self.url(route::METRICS)).send().await?).await?;
        Ok(resp.text().await?)
    }

    pub async fn catalog(&self, kind: &str) -> Result<CatalogList> {
        Self::call(
            self.request(reqwest::Method::GET, CATALOG)
                .query(&[("kind", kind)]),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_build_is_a_recipe_or_a_brought_image_never_both() {
        let b = |j: &str| serde_json::from_str::<BuildImage>(j).unwrap();
        assert_eq!(b(r#"{"profile": "ide"}"#).kind(), Ok(BuildKind::Recipe));
        assert_eq!(b(r#"{"from": "a:1"}"#).kind(), Ok(BuildKind::From("a:1")));
        assert_eq!(
            b(r#"{"dockerfile": "/d"}"#).kind(),
            Ok(BuildKind::Dockerfile("/d"))
        );
        for bad in [
            r#"{}"#,
            r#"{"from": "a", "dockerfile": "/d"}"#,
            r#"{"from": "a", "profile": "desktop"}"#,
            r#"{"dockerfile": "/d", "apps": ["gimp"]}"#,
        ] {
            assert!(b(bad).kind().is_err(), "{bad}");
        }
    }

    #[test]
    fn screens_parse_and_bad_ones_are_named() {
        assert_eq!(parse_screen("1280x800"), Ok((1280, 800)));
        assert_eq!(parse_screen(" 1024X768 "), Ok((1024, 768)));
        assert_eq!(parse_screen("320x200"), Ok((320, 200)));
        assert_eq!(parse_screen("7680x4320"), Ok((7680, 4320)));
        for bad in [
            "",
            "1280",
            "1280x",
            "x800",
            "1280x800x2",
            "-1280x800",
            "+1280x800",
            "a x b",
        ] {
            let e = parse_screen(bad).unwrap_err();
            assert!(e.contains("WIDTHxHEIGHT"), "{bad:?}: {e}");
        }
        assert!(parse_screen("99999999999x800").is_err());
        let small = parse_screen("100x100").unwrap_err();
        assert!(small.contains("320x200"), "{small}");
        assert!(parse_screen("7682x4320").is_err());
        let odd = parse_screen("1281x800").unwrap_err();
        assert!(odd.contains("even"), "{odd}");
    }

    #[test]
    fn a_create_carries_its_screen_and_refuses_unknown_fields() {
        let c: CreateSandbox =
            serde_json::from_str(r#"{"profile": "desktop-ubuntu", "screen": "1280x800"}"#).unwrap();
        assert_eq!(c.screen.as_deref(), Some("1280x800"));
        let c: CreateSandbox = serde_json::from_str(r#"{"profile": "desktop-ubuntu"}"#).unwrap();
        assert_eq!(c.screen, None);
        assert!(
            serde_json::from_str::<CreateSandbox>(r#"{"profile": "x", "scren": "1x1"}"#).is_err()
        );
    }
}

/// A file kept by the controller (`GET /sandbox/v1/artifacts/{id}`): a recording, a file or
/// directory published from a sandbox, a run's output, an episode bundle. It outlives its
/// sandbox until the retention setting deletes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Artifact {
    pub id: String,
    pub name: String,
    pub content_type: String,
    /// Bytes.
    pub size: u64,
    /// The sandbox it came from.
    pub sandbox: String,
    /// The run it belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    pub created_at: String,
    /// `recording|file|directory|output|episode`.
    pub kind: String,
    /// Hex SHA-256 of the bytes (also the download's `ETag`).
    pub sha256: String,
    /// Where it came from: the agent recording id, the sandbox path, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// `GET /sandbox/v1/artifacts`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ArtifactList {
    pub artifacts: Vec<Artifact>,
}

/// `POST /sandbox/sandboxes/v1/{id}/artifacts`: publishes a file or directory of the sandbox
/// (a directory becomes `<name>.zip`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishArtifact {
    /// An absolute path in the sandbox.
    pub path: String,
    /// The run it belongs to (a run of this sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// The artifact's name; default the path's last component (`.zip` added for a directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}
