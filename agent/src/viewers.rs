//! The viewer grants: one-time tokens, and the sessions they open, for the browser-facing
//! routes (live stream, VNC viewer). Bounded; sessions compared in constant time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_protocol::sync::Locked;
use subtle::ConstantTimeEq;

/// How long a browser session from one URL (its cookie) lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Tokens waiting to be opened, at most.
pub const MAX_PENDING: usize = 1024;
const MAX_SESSIONS: usize = 1024;

/// [`MAX_PENDING`] tokens wait to be opened already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyPending;

impl std::fmt::Display for TooManyPending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{MAX_PENDING} viewer URLs are waiting to be opened already"
        )
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Grant {
    pub view_only: bool,
    expires: Instant,
}

#[derive(Default)]
struct Inner {
    tokens: HashMap<String, Grant>,
    sessions: HashMap<String, Grant>,
}

#[derive(Default, Clone)]
pub struct Viewers(Arc<Mutex<Inner>>);

fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("OS randomness");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Grant {
    /// What the bearer token grants: everything, for as long as a session.
    pub fn bearer() -> Grant {
        Grant {
            view_only: false,
            expires: Instant::now() + SESSION_TTL,
        }
    }
}

impl Viewers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.locked()
    }

    fn prune(inner: &mut Inner) {
        let now = Instant::now();
        inner.tokens.retain(|_, g| g.expires > now);
        inner.sessions.retain(|_, g| g.expires > now);
    }

    /// A one-time token for a grant of `ttl`; refused while [`MAX_PENDING`] wait unopened.
    pub fn mint(&self, ttl: Duration, view_only: bool) -> Result<String, TooManyPending> {
        let mut inner = self.lock();
        Self::prune(&mut inner);
        if inner.tokens.len() >= MAX_PENDING {
            return Err(TooManyPending);
        }
        let token = random_hex(24);
        inner.tokens.insert(
            token.clone(),
            Grant {
                view_only,
                expires: Instant::now() + ttl,
            },
        );
        Ok(token)
    }

    /// Uses up a token, opening a session; `None` when unknown, used or expired.
    pub fn redeem(&self, token: &str) -> Option<(String, Grant)> {
        let mut inner = self.lock();
        Self::prune(&mut inner);
        let grant = inner.tokens.remove(token)?;
        if inner.sessions.len() >= MAX_SESSIONS {
            // The oldest session makes room.
            if let Some(oldest) = inner
                .sessions
                .iter()
                .min_by_key(|(_, g)| g.expires)
                .map(|(k, _)| k.clone())
            {
                inner.sessions.remove(&oldest);
            }
        }
        let session = random_hex(32);
        let grant = Grant {
            view_only: grant.view_only,
            expires: Instant::now() + SESSION_TTL,
        };
        inner.sessions.insert(session.clone(), grant);
        Some((session, grant))
    }

    pub fn session(&self, id: &str) -> Option<Grant> {
        let inner = self.lock();
        // Compare in constant time: the cookie is a credential.
        inner
            .sessions
            .iter()
            .find(|(k, _)| k.as_bytes().ct_eq(id.as_bytes()).into())
            .map(|(_, g)| *g)
            .filter(|g| g.expires > Instant::now())
    }
}
