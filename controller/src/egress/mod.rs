//! Egress under control: the proxy that is the only way out of a sandbox with an egress
//! policy, the book of which sandbox each proxy client is, and what the proxy reports.

pub mod ca;
pub mod dns;
pub mod edge;
pub mod hello;
pub mod proxy;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use berth_protocol::egress::{Denial, Egress};
use tokio::sync::mpsc;

/// What the proxy saw, for the sandbox's timeline and record.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    Denied {
        sandbox: String,
        host: String,
        port: u16,
        reason: &'static str,
        via: Via,
    },
    Connected {
        sandbox: String,
        host: String,
    },
}

/// Where a refusal happened: at the proxy (a connection) or at the sandboxes' DNS (a name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Proxy,
    Dns,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Proxy => "proxy",
            Via::Dns => "dns",
        }
    }
}

/// Notes waiting for the controller; past this many, new ones are dropped (and counted).
const NOTES: usize = 4096;

/// The sandboxes behind the proxy, by their address on the internal network.
pub struct Book {
    by_ip: RwLock<HashMap<IpAddr, (String, Egress)>>,
    notes: mpsc::Sender<Note>,
    dropped: std::sync::atomic::AtomicU64,
}

impl Book {
    /// The book, and the notes the proxy sends (read them, or they are dropped once full).
    pub fn new() -> (Arc<Book>, mpsc::Receiver<Note>) {
        let (tx, rx) = mpsc::channel(NOTES);
        let book = Book {
            by_ip: RwLock::new(HashMap::new()),
            notes: tx,
            dropped: Default::default(),
        };
        (Arc::new(book), rx)
    }

    /// `sandbox` is at `ip` with `policy` (replacing whatever had that address).
    pub fn register(&self, ip: IpAddr, sandbox: &str, policy: Egress) {
        let mut m = self.by_ip.write().unwrap_or_else(|e| e.into_inner());
        m.retain(|_, (id, _)| id != sandbox);
        m.insert(ip, (sandbox.to_string(), policy));
    }

    /// `sandbox` is gone: its address no longer names it.
    pub fn forget(&self, sandbox: &str) {
        let mut m = self.by_ip.write().unwrap_or_else(|e| e.into_inner());
        m.retain(|_, (id, _)| id != sandbox);
    }

    /// Notes dropped because the controller did not keep up.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn note(&self, n: Note) {
        if self.notes.try_send(n).is_err() {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl proxy::Sandboxes for Book {
    fn lookup(&self, peer: IpAddr) -> Option<(String, Egress)> {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(peer),
            v4 => v4,
        };
        let m = self.by_ip.read().unwrap_or_else(|e| e.into_inner());
        m.get(&peer).cloned()
    }

    fn denied(&self, sandbox: &str, host: &str, port: u16, reason: Denial) {
        self.note(Note::Denied {
            sandbox: sandbox.into(),
            host: host.into(),
            port,
            reason: reason.as_str(),
            via: Via::Proxy,
        });
    }

    fn name_refused(&self, sandbox: &str, name: &str, reason: Denial) {
        self.note(Note::Denied {
            sandbox: sandbox.into(),
            host: name.into(),
            port: 53,
            reason: reason.as_str(),
            via: Via::Dns,
        });
    }

    fn connected(&self, sandbox: &str, host: &str) {
        self.note(Note::Connected {
            sandbox: sandbox.into(),
            host: berth_protocol::egress::normalise(host),
        });
    }
}

/// The edge of the config: the CA kept in `data_dir` (generated on first use), the
/// `[[egress.credentials]]` with their secrets read now (a missing one stops the start), and
/// the upstream CAs.
pub fn edge_from_config(
    config: &crate::config::EgressConfig,
    data_dir: &std::path::Path,
    name: &str,
) -> anyhow::Result<Arc<edge::Edge>> {
    let ca = Arc::new(ca::Ca::load_or_create(data_dir, name)?);
    let mut credentials = Vec::new();
    for (i, c) in config.credentials.iter().enumerate() {
        let what = format!("[[egress.credentials]] #{} ({})", i + 1, c.host);
        let secret =
            crate::config::read_secret(c.secret.as_deref(), c.secret_file.as_deref(), &what)?;
        let c = credential(
            &c.host,
            &c.header,
            c.value.as_deref(),
            c.basic_user.as_deref(),
            &secret,
        )
        .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        credentials.push(c);
    }
    let mut upstream = Vec::new();
    for f in &config.upstream_ca {
        let pem = std::fs::read(f)
            .map_err(|e| anyhow::anyhow!("[egress] upstream_ca: {}: {e}", f.display()))?;
        upstream.push(pem);
    }
    Ok(Arc::new(edge::Edge::new(ca, credentials, &upstream)?))
}

/// A credential for `host`: `value` with `{secret}` replaced, basic authentication as
/// `basic_user`, or `Bearer <secret>`; its host a name or `*.name`.
pub fn credential(
    host: &str,
    header: &str,
    value: Option<&str>,
    basic_user: Option<&str>,
    secret: &str,
) -> anyhow::Result<edge::Credential> {
    berth_protocol::egress::validate(&Egress::Rules(berth_protocol::egress::EgressRules {
        allow: vec![host.to_string()],
        deny_private: true,
    }))
    .map_err(|e| anyhow::anyhow!(e))?;
    anyhow::ensure!(!secret.is_empty(), "the secret is empty");
    let value = match (value, basic_user) {
        (Some(_), Some(_)) => anyhow::bail!("give value or basic_user, not both"),
        (Some(v), None) if !v.contains("{secret}") => anyhow::bail!("value must hold {{secret}}"),
        (Some(v), None) => v.replace("{secret}", secret),
        (None, Some(user)) => basic(user, secret),
        (None, None) => format!("Bearer {secret}"),
    };
    edge::Credential::new(host, header, &value)
}

/// An `Authorization` value for basic authentication.
pub fn basic(user: &str, secret: &str) -> String {
    use base64::Engine;
    let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{secret}"));
    format!("Basic {b}")
}

/// The environment that points a sandbox's programs at the proxy (`proxy`: `host:port`).
pub fn proxy_env(proxy: &str) -> Vec<String> {
    let url = format!("http://{proxy}");
    let mut env = Vec::new();
    for name in ["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"] {
        env.push(format!("{name}={url}"));
    }
    for name in ["no_proxy", "NO_PROXY"] {
        env.push(format!("{name}=localhost,127.0.0.1,::1"));
    }
    env
}

/// The environment that has a sandbox trust the egress CA: the certificate for the agent to
/// install (system bundle, Chrome's policy), and the variables pointing Python, pip, git and
/// Node at the bundle that holds it.
pub fn trust_env(ca_pem: &str) -> Vec<String> {
    use berth_protocol::egress::trust as t;
    let mut env = vec![format!("{}={ca_pem}", t::CA_VAR)];
    for name in t::BUNDLE_VARS {
        env.push(format!("{name}={}", t::BUNDLE));
    }
    env.push(format!("{}={}", t::NODE_VAR, t::CA_FILE));
    env
}

#[cfg(test)]
mod dns_tests;
#[cfg(test)]
mod tests;
