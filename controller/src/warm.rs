//! The warm pools' table: per profile + image, the pool's settings and state (its size, paused
//! or failing, the refill's wake-up), read by a claim ([`crate::sandbox::Sandboxes`]) and kept
//! by the refill ([`crate::pool::Pools`]). The store holds the members; this holds no count.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use berth_protocol::sync::Locked;
use tokio::sync::{Notify, Semaphore};

use crate::config::PoolConfig;

/// The pool a profile + image belongs to, with its members' egress policy when that is not
/// the default one and their limits when they are not the profile's (`profile@image` else, as
/// before policies and limits).
pub fn key(profile: &str, image_ref: &str, egress: Option<&str>, limits: Option<&str>) -> String {
    let short = |s: &str| -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(s.as_bytes());
        digest[..6].iter().map(|b| format!("{b:02x}")).collect()
    };
    let mut key = format!("{profile}@{image_ref}");
    if let Some(policy) = egress {
        key.push_str(&format!("#egress-{}", short(policy)));
    }
    if let Some(limits) = limits {
        key.push_str(&format!("#limits-{}", short(limits)));
    }
    key
}

pub struct PoolState {
    pub key: String,
    pub profile: String,
    pub image_ref: String,
    /// The members' screen (`WxH`), when the pool declares one.
    pub screen: Option<String>,
    /// The members' egress policy.
    pub egress: berth_protocol::egress::Egress,
    /// The members' limits over the profile's, when the pool asks some.
    pub limits: Option<berth_protocol::controller::LimitsOverride>,
    pub size: AtomicUsize,
    pub paused: AtomicBool,
    pub(crate) failures: AtomicU32,
    pub(crate) failing: Mutex<Option<String>>,
    pub(crate) wake: Notify,
}

#[derive(Default)]
pub struct PoolTable {
    pub(crate) configured: Vec<PoolConfig>,
    pub(crate) pools: Mutex<BTreeMap<String, Arc<PoolState>>>,
    pub(crate) starts: Mutex<Option<Arc<Semaphore>>>,
}

impl PoolTable {
    pub fn new(configured: &[PoolConfig]) -> PoolTable {
        PoolTable {
            configured: configured.to_vec(),
            ..Default::default()
        }
    }

    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn get(&self, key: &str) -> Option<Arc<PoolState>> {
        self.pools.locked().get(key).cloned()
    }

    pub fn all(&self) -> Vec<Arc<PoolState>> {
        self.pools.locked().values().cloned().collect()
    }

    /// A member was taken: refill.
    pub fn claimed(&self, key: &str) {
        if let Some(p) = self.get(key) {
            p.wake.notify_one();
        }
    }

    /// A member became ready: its start succeeded, and a shrunk pool may now destroy it.
    pub fn member_ready(&self, key: &str) {
        if let Some(p) = self.get(key) {
            p.failures.store(0, Ordering::SeqCst);
            p.wake.notify_one();
        }
    }

    /// Pauses or resumes every pool of `profile`, optionally with a new size; resuming clears
    /// a failed refill. False when no pool serves that profile.
    pub fn adjust(&self, profile: &str, paused: Option<bool>, size: Option<usize>) -> bool {
        let mut found = false;
        for p in self.all().into_iter().filter(|p| p.profile == profile) {
            found = true;
            if let Some(paused) = paused {
                p.paused.store(paused, Ordering::SeqCst);
                if !paused {
                    p.failures.store(0, Ordering::SeqCst);
                    *p.failing.locked() = None;
                }
            }
            if let Some(size) = size {
                p.size.store(size, Ordering::SeqCst);
            }
            p.wake.notify_one();
        }
        found
    }
}
