//! Egress under control: the proxy that is the only way out of a sandbox with an egress
//! policy, the book of which sandbox each proxy client is, and what the proxy reports.

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
    },
    Connected {
        sandbox: String,
        host: String,
    },
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
        });
    }

    fn connected(&self, sandbox: &str, host: &str) {
        self.note(Note::Connected {
            sandbox: sandbox.into(),
            host: berth_protocol::egress::normalise(host),
        });
    }
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

#[cfg(test)]
mod tests;
