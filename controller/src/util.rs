//! Small shared pieces: ids, secrets, clocks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use berth_protocol::sync::Locked;
use sha2::{Digest, Sha256};

/// One async lock per key (a thread id, a sandbox id), forgotten once nobody holds it.
#[derive(Default)]
pub struct KeyedLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl KeyedLocks {
    pub fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.0.locked();
        map.retain(|_, l| Arc::strong_count(l) > 1);
        map.entry(key.to_string()).or_default().clone()
    }
}

/// `prefix_` + 16 random hex digits.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_hex(8))
}

/// `n` random bytes as hex.
pub fn random_hex(n: usize) -> String {
    let mut raw = vec![0u8; n];
    getrandom::fill(&mut raw).expect("the OS random source");
    hex(&raw)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// RFC 3339 with milliseconds, UTC.
pub fn rfc3339(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// Client-chosen ids (runs, threads): 1–128 letters, digits, `.`, `_` or `-`, not starting
/// with `.` — the same rule the agent applies to command ids.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_and_unique() {
        let a = new_id("sb");
        assert!(a.starts_with("sb_") && a.len() == 19);
        assert_ne!(a, new_id("sb"));
    }

    #[test]
    fn client_ids_follow_the_agents_rule() {
        assert!(valid_id("run-1.a_b"));
        assert!(!valid_id(".hidden"));
        assert!(!valid_id("a/b"));
        assert!(!valid_id(""));
        assert!(!valid_id(&"x".repeat(129)));
    }
}
