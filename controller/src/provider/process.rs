//! The `process` provider: one berth-agent per sandbox as a local process, bound to 127.0.0.1,
//! with its own state dir, home, display and ports. Sandboxes share the host's kernel and user
//! and are not isolated from each other; this is for development and one-machine use.
//!
//! Layout: `<root>/<sandbox id>/{marker.json, agent.log, state/, home/}`. The marker (identity
//! labels, creation time) is written before the agent is spawned, so a controller that dies at
//! any point of a create finds the sandbox on restart. Agents run in their own session with no
//! parent-death signal: they outlive a `kill -9` of the controller.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{Endpoint, Identity, Observed, Provider, ProviderError, Result, Spec};
use crate::util::now_ms;

const MARKER: &str = "marker.json";
/// How long an agent may take to bind its listeners.
const BIND_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a full shutdown (SIGINT) may take before SIGKILL.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    #[serde(flatten)]
    identity: Identity,
    created_at_ms: i64,
    desktop: bool,
}

pub struct ProcessProvider {
    root: PathBuf,
    agent_bin: PathBuf,
    image_ref: String,
    /// Where each agent is fenced with its limits (a cgroup of its own, where the host lets
    /// the controller make one).
    cgroups: super::cgroup::Host,
}

impl ProcessProvider {
    /// `root` holds one directory per sandbox; `agent_bin` is the berth-agent to run.
    pub fn new(root: PathBuf, agent_bin: PathBuf) -> anyhow::Result<ProcessProvider> {
        let bytes = std::fs::read(&agent_bin).map_err(|e| {
            anyhow::anyhow!(
                "the berth-agent binary {} cannot be read ({e}); build it with \
                 `cargo build -p berth-agent` (same profile as berth) or pass --agent-bin",
                agent_bin.display()
            )
        })?;
        std::fs::create_dir_all(&root)?;
        Ok(ProcessProvider {
            root,
            agent_bin,
            image_ref: format!("process:{}", crate::util::sha256_hex(&bytes)),
            cgroups: super::cgroup::Host::probe(),
        })
    }

    fn dir(&self, sandbox_id: &str) -> PathBuf {
        self.root.join(sandbox_id)
    }

    fn read_marker(dir: &Path) -> Option<Marker> {
        let bytes = std::fs::read(dir.join(MARKER)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The agent's pid, from its endpoints file (written once bound) or the pid file the
    /// provider writes right after spawning.
    fn agent_pid(dir: &Path) -> Option<i32> {
        let from_endpoints = std::fs::read(dir.join("state/endpoints.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["pid"].as_i64());
        let from_file = std::fs::read_to_string(dir.join("agent.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok());
        from_endpoints.or(from_file).map(|p| p as i32)
    }

    fn endpoint(dir: &Path) -> Option<Endpoint> {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("state/endpoints.json")).ok()?).ok()?;
        let agent_url = format!("http://{}", v["listen"].as_str()?);
        Some(Endpoint {
            compat_url: agent_url.clone(),
            agent_url,
            cdp_url: v["cdp_listen"].as_str().map(|a| format!("http://{a}")),
            ports: Default::default(),
        })
    }

    fn observe(dir: &Path) -> Option<Observed> {
        let marker = Self::read_marker(dir)?;
        let alive = Self::agent_pid(dir).is_some_and(|pid| process_mentions(pid, dir));
        Some(Observed {
            identity: marker.identity,
            alive,
            endpoint: if alive { Self::endpoint(dir) } else { None },
            created_at_ms: marker.created_at_ms,
        })
    }

    fn spawn(&self, spec: &Spec, dir: &Path, fence: Vec<std::ffi::CString>) -> Result<u32> {
        let fail = |what: &str, e: std::io::Error| {
            ProviderError::Failed(format!("{what} {}: {e}", dir.display()))
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("agent.log"))
            .map_err(|e| fail("agent log in", e))?;
        let log2 = log.try_clone().map_err(|e| fail("agent log in", e))?;
        let mut cmd = std::process::Command::new(&self.agent_bin);
        cmd.arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--cdp-listen")
            .arg("127.0.0.1:0")
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--home")
            .arg(dir.join("home"));
        if spec.desktop {
            cmd.arg("--desktop");
        }
        cmd.args(spec.agent_args());
        // The controller's own environment carries API keys: the agent gets a clean one.
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("BERTH_AGENT_TOKEN", &spec.agent_token)
            .env("BERTH_AGENT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        for keep in ["LANG", "TZ"] {
            if let Some(v) = std::env::var_os(keep) {
                cmd.env(keep, v);
            }
        }
        // Its own session: a signal to the controller's terminal or process group does not
        // reach it, and it outlives the controller. Inside its fence before it runs, so all it
        // starts is too.
        use std::os::unix::process::CommandExt;
        unsafe {
            cmd.pre_exec(move || {
                libc::setsid();
                // SAFETY: a forked child before exec.
                super::cgroup::enter(&fence)
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            ProviderError::Failed(format!("starting {}: {e}", self.agent_bin.display()))
        })?;
        let pid = child.id();
        let _ = std::fs::write(dir.join("agent.pid"), pid.to_string());
        // Reaps it while this controller lives; after a restart init does.
        std::thread::Builder::new()
            .name(format!("reap-{pid}"))
            .spawn(move || {
                let _ = child.wait();
            })
            .map_err(|e| ProviderError::Failed(format!("reaper thread: {e}")))?;
        Ok(pid)
    }
}

#[async_trait::async_trait]
impl Provider for ProcessProvider {
    fn name(&self) -> &'static str {
        "process"
    }

    fn default_image(&self, _profile: &str) -> Result<String> {
        Ok(self.image_ref.clone())
    }

    fn check_image(&self, _profile: &str, image_ref: &str) -> Result<()> {
        if image_ref == self.image_ref {
            return Ok(());
        }
        Err(ProviderError::Unsupported(format!(
            "the process provider runs only its own agent binary, image_ref {}; {image_ref} is \
             not available here",
            self.image_ref
        )))
    }

    fn unenforced(
        &self,
        limits: &berth_protocol::controller::Limits,
    ) -> std::collections::BTreeMap<String, String> {
        self.cgroups.unenforced(limits)
    }

    async fn create(&self, spec: &Spec) -> Result<Endpoint> {
        let dir = self.dir(&spec.identity.sandbox_id);
        for sub in ["state", "home"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| ProviderError::Failed(format!("creating {}: {e}", dir.display())))?;
        }
        let marker = Marker {
            identity: spec.identity.clone(),
            created_at_ms: now_ms(),
            desktop: spec.desktop,
        };
        let tmp = dir.join(".marker.json.tmp");
        let write = std::fs::write(&tmp, serde_json::to_vec(&marker).unwrap_or_default())
            .and_then(|_| std::fs::rename(&tmp, dir.join(MARKER)));
        write.map_err(|e| ProviderError::Failed(format!("writing the marker: {e}")))?;
        let fence = self
            .cgroups
            .fence(&spec.identity.sandbox_id, &spec.limits)
            .map_err(|e| ProviderError::Failed(format!("fencing it in a cgroup: {e}")))?
            .map(|f| f.procs())
            .unwrap_or_default();
        let pid = self.spawn(spec, &dir, fence)?;
        let deadline = Instant::now() + BIND_TIMEOUT;
        loop {
            if let Some(ep) = Self::endpoint(&dir)
                && Self::agent_pid(&dir) == Some(pid as i32)
            {
                return Ok(ep);
            }
            // Our own child (reaped by its thread once it ends): alive means not yet reaped and
            // not a zombie. Its command line is no test here — between fork and exec it is
            // still the controller's.
            if !child_running(pid) {
                return Err(ProviderError::Failed(format!(
                    "berth-agent exited during start-up: {}",
                    log_tail(&dir.join("agent.log"))
                )));
            }
            if Instant::now() >= deadline {
                return Err(ProviderError::Failed(format!(
                    "berth-agent did not bind within {BIND_TIMEOUT:?}: {}",
                    log_tail(&dir.join("agent.log"))
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn inspect(&self, sandbox_id: &str) -> Result<Option<Observed>> {
        Ok(Self::observe(&self.dir(sandbox_id)))
    }

    async fn list(&self, controller_id: &str) -> Result<Vec<Observed>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ProviderError::Failed(format!("listing sandboxes: {e}"))),
        };
        Ok(entries
            .flatten()
            .filter_map(|e| Self::observe(&e.path()))
            .filter(|o| o.identity.controller_id == controller_id)
            .collect())
    }

    async fn destroy(&self, sandbox_id: &str) -> Result<()> {
        let dir = self.dir(sandbox_id);
        if !dir.exists() {
            self.cgroups.remove(sandbox_id).await;
            return Ok(());
        }
        // A full shutdown (SIGINT) kills every tree the agent started; SIGKILL if it hangs.
        if let Some(pid) = Self::agent_pid(&dir).filter(|p| process_mentions(*p, &dir)) {
            signal(pid, nix::sys::signal::Signal::SIGINT);
            let deadline = Instant::now() + SHUTDOWN_GRACE;
            while process_mentions(pid, &dir) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if process_mentions(pid, &dir) {
                tracing::warn!(
                    sandbox = sandbox_id,
                    pid,
                    "agent ignored SIGINT; killing it"
                );
                signal(pid, nix::sys::signal::Signal::SIGKILL);
            }
        }
        // Whatever survived a dead agent (command shims lead their own process groups).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = processes_mentioning(&dir);
            if left.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(ProviderError::Failed(format!(
                    "processes of {sandbox_id} survive SIGKILL: {left:?}"
                )));
            }
            for pid in left {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                signal(pid, nix::sys::signal::Signal::SIGKILL);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.cgroups.remove(sandbox_id).await;
        let d = dir.clone();
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&d))
            .await
            .map_err(|e| ProviderError::Failed(format!("removing {}: {e}", dir.display())))?
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(ProviderError::Failed(format!(
                    "removing {}: {e}",
                    dir.display()
                ))),
            })
    }
}

fn child_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_string())
        })
        .is_some_and(|rest| !rest.starts_with('Z'))
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// Whether `pid` is a live process whose command line names `dir` (so a recycled pid never
/// counts as the agent).
fn process_mentions(pid: i32, dir: &Path) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| contains(&c, dir.as_os_str().as_encoded_bytes()))
}

/// Every live process whose command line names `dir`.
pub fn processes_mentioning(dir: &Path) -> Vec<i32> {
    let needle = dir.as_os_str().as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| contains(&c, needle))
        })
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    let tail: Vec<&str> = lines.into_iter().rev().collect();
    match tail.is_empty() {
        true => "(its log is empty)".into(),
        false => tail.join(" | "),
    }
}
