//! The controls of the desktop: whether a person holds them (pushed by the controller, which
//! keeps the lease), the agent's request for a person, and the notice the next toolset answer
//! carries after a hand-back.
//!
//! The agent keeps its own deadline for a lease (the controller's `ttl_ms` from when it heard
//! it), so a controller that died while a person held the controls never locks the agent out
//! past the lease: the refusals end on their own.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use berth_protocol::control::{
    AgentControl, ControlGrant, HumanRequestAnswer, Outcome, PendingRequest,
};
use berth_protocol::sync::Locked;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// A person holds the controls.
#[derive(Debug, Clone)]
struct Held {
    holder_sha256: String,
    until: Instant,
    taken: SystemTime,
}

/// A request for a person, waiting.
#[derive(Debug, Clone)]
struct Waiting {
    id: String,
    reason: String,
    since: SystemTime,
    /// A person took the controls since it was made (or held them when it was).
    taken: bool,
    outcome: Option<Outcome>,
}

/// What the next toolset answer says after a hand-back: when the person had the controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notice {
    pub taken: SystemTime,
    pub returned: SystemTime,
}

#[derive(Default)]
struct State {
    held: Option<Held>,
    requests_enabled: bool,
    /// The login sites the run enables (names; the `login` tool is listed when there are).
    logins: Vec<String>,
    waiting: Option<Waiting>,
    notice: Option<Notice>,
}

/// Why a request for a person could not be made.
#[derive(Debug, PartialEq, Eq)]
pub enum RequestError {
    Disabled,
    Pending,
}

/// A change of the controls the caller reports (episode, events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    Taken,
    Returned,
}

pub struct Control {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    /// The controller's key (its SHA-256), once claimed, and the file that keeps it across
    /// the agent's restarts.
    key: Mutex<Option<String>>,
    key_file: Option<std::path::PathBuf>,
    /// The agent's own key for its readiness probes through its routes (random, never leaves
    /// the process): they observe while a person holds the controls.
    internal: String,
}

/// The controller's key for the pushes.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyError {
    /// A push without the key, once one is set.
    Missing,
    /// A claim of another key than the one set.
    Taken,
}

/// The file under the agent's state directory that keeps the controller's key's SHA-256.
pub const KEY_FILE: &str = "control-key";

impl Default for Control {
    fn default() -> Self {
        Control::new()
    }
}

pub fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Control {
    pub fn new() -> Control {
        Control {
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
            key: Mutex::new(None),
            key_file: None,
            internal: {
                let mut b = [0u8; 24];
                getrandom::fill(&mut b).expect("getrandom");
                b.iter().map(|x| format!("{x:02x}")).collect()
            },
        }
    }

    /// The key the agent's own probes present (`x-berth-control-key`).
    pub fn internal_key(&self) -> &str {
        &self.internal
    }

    /// The controls of an agent whose state lives in `state_dir`: a key the controller
    /// claimed before a restart still holds.
    pub fn open(state_dir: &std::path::Path) -> Control {
        let file = state_dir.join(KEY_FILE);
        let kept = std::fs::read_to_string(&file)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| berth_protocol::control::is_sha256_hex(s));
        Control {
            key: Mutex::new(kept),
            key_file: Some(file),
            ..Control::new()
        }
    }

    /// The controller claims the pushes with a key (its SHA-256): the first claim holds, the
    /// same claim again is fine, another is refused.
    pub fn claim(&self, key_sha256: &str) -> Result<(), KeyError> {
        let mut key = self.key.locked();
        match key.as_deref() {
            Some(k) if k.eq_ignore_ascii_case(key_sha256) => return Ok(()),
            Some(_) => return Err(KeyError::Taken),
            None => {}
        }
        let sha = key_sha256.to_ascii_lowercase();
        if let Some(f) = &self.key_file {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            // Readable by the agent's account only; written whole before it counts.
            let tmp = f.with_extension("tmp");
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .and_then(|mut w| w.write_all(sha.as_bytes()).and_then(|_| w.sync_all()))
                .and_then(|_| std::fs::rename(&tmp, f));
            if let Err(e) = written {
                tracing::warn!(error = %e, "keeping the controller's key");
            }
        }
        *key = Some(sha);
        Ok(())
    }

    /// Whether `presented` is the key the controller claimed the controls with (false while
    /// none is claimed), or the agent's own probes' key.
    pub fn is_controller(&self, presented: Option<&str>) -> bool {
        match (self.key.locked().as_deref(), presented) {
            (_, Some(p)) if p == self.internal => true,
            (Some(k), Some(p)) => sha256_hex(p) == k,
            _ => false,
        }
    }

    /// Whether a push carrying `presented` (the key itself, or nothing) may move the controls:
    /// any push until the controller claimed them, then only one with its key.
    pub fn pusher(&self, presented: Option<&str>) -> Result<(), KeyError> {
        match self.key.locked().as_deref() {
            None => Ok(()),
            Some(k) if presented.is_some_and(|p| sha256_hex(p) == k) => Ok(()),
            Some(_) => Err(KeyError::Missing),
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|g| *g += 1);
    }

    /// Ends a lease past its deadline: a hand-back.
    fn expire(s: &mut State, now: Instant) -> bool {
        match &s.held {
            Some(h) if h.until <= now => {
                Self::returned(s);
                true
            }
            _ => false,
        }
    }

    fn returned(s: &mut State) {
        if let Some(h) = s.held.take() {
            s.notice = Some(Notice {
                taken: h.taken,
                returned: SystemTime::now(),
            });
            if let Some(w) = s
                .waiting
                .as_mut()
                .filter(|w| w.taken && w.outcome.is_none())
            {
                w.outcome = Some(Outcome::Returned);
            }
        }
    }

    /// `Ok` when the caller (its `x-berth-control` value) may act, else how long the person
    /// still holds the controls (ms).
    pub fn check(&self, token: Option<&str>) -> Result<(), u64> {
        let now = Instant::now();
        let mut s = self.state.locked();
        if Self::expire(&mut s, now) {
            drop(s);
            self.bump();
            return Ok(());
        }
        match &s.held {
            None => Ok(()),
            Some(h) if token.is_some_and(|t| sha256_hex(t) == h.holder_sha256) => Ok(()),
            Some(h) => Err(h.until.saturating_duration_since(now).as_millis() as u64),
        }
    }

    /// Whether a holder of `token` may send input now (the VNC relay's question per message).
    pub fn allows(&self, token: Option<&str>) -> bool {
        self.check(token).is_ok()
    }

    /// The controller's push: a person holds the controls (a take, or a renewal).
    pub fn grant(&self, g: &ControlGrant) -> Change {
        let now = Instant::now();
        let mut s = self.state.locked();
        let expired = Self::expire(&mut s, now);
        let until = now + Duration::from_millis(g.ttl_ms);
        let change = match s.held.as_mut() {
            Some(h) if h.holder_sha256 == g.holder_sha256 => {
                h.until = until;
                Change::None
            }
            Some(h) => {
                h.holder_sha256 = g.holder_sha256.clone();
                h.until = until;
                Change::None
            }
            None => {
                s.held = Some(Held {
                    holder_sha256: g.holder_sha256.clone(),
                    until,
                    taken: SystemTime::now(),
                });
                if let Some(w) = s.waiting.as_mut() {
                    w.taken = true;
                }
                Change::Taken
            }
        };
        drop(s);
        if expired || change != Change::None {
            self.bump();
        }
        change
    }

    /// The controller's push: the person handed back (or the lease ended).
    pub fn release(&self) -> Change {
        let mut s = self.state.locked();
        let was = s.held.is_some();
        Self::returned(&mut s);
        drop(s);
        self.bump();
        if was { Change::Returned } else { Change::None }
    }

    /// The run's settings (the controller's push).
    pub fn set(&self, requests_enabled: bool, logins: Vec<String>) {
        let mut s = self.state.locked();
        s.requests_enabled = requests_enabled;
        s.logins = logins;
        drop(s);
        self.bump();
    }

    /// A person declined the pending request.
    pub fn decline(&self) {
        if let Some(w) = self.state.locked().waiting.as_mut() {
            w.outcome.get_or_insert(Outcome::Declined);
        }
        self.bump();
    }

    /// The notice for the next toolset answer, once.
    pub fn take_notice(&self) -> Option<Notice> {
        let mut s = self.state.locked();
        Self::expire(&mut s, Instant::now());
        s.notice.take()
    }

    pub fn view(&self) -> AgentControl {
        let now = Instant::now();
        let mut s = self.state.locked();
        Self::expire(&mut s, now);
        AgentControl {
            held: s.held.is_some(),
            expires_in_ms: s
                .held
                .as_ref()
                .map(|h| h.until.saturating_duration_since(now).as_millis() as u64),
            requests_enabled: s.requests_enabled,
            logins: s.logins.clone(),
            request: s
                .waiting
                .as_ref()
                .filter(|w| w.outcome.is_none())
                .map(|w| PendingRequest {
                    id: w.id.clone(),
                    reason: w.reason.clone(),
                    since: crate::time::rfc3339(w.since),
                }),
        }
    }

    /// Makes a request for a person (its id), or says why not.
    pub fn open_request(&self, id: String, reason: String) -> Result<(), RequestError> {
        let mut s = self.state.locked();
        Self::expire(&mut s, Instant::now());
        if !s.requests_enabled {
            return Err(RequestError::Disabled);
        }
        if s.waiting.is_some() {
            return Err(RequestError::Pending);
        }
        let taken = s.held.is_some();
        s.waiting = Some(Waiting {
            id,
            reason,
            since: SystemTime::now(),
            taken,
            outcome: None,
        });
        drop(s);
        self.bump();
        Ok(())
    }

    /// Waits (at most `wait`) for the open request to end; closes it and says how it ended.
    pub async fn await_request(&self, wait: Duration) -> HumanRequestAnswer {
        let started = Instant::now();
        let deadline = started + wait;
        let mut rx = self.changed.subscribe();
        loop {
            rx.borrow_and_update();
            let next_expiry = {
                let mut s = self.state.locked();
                // A lease that ran out while waiting is a hand-back too.
                Self::expire(&mut s, Instant::now());
                if let Some(Waiting {
                    id,
                    outcome: Some(o),
                    ..
                }) = s.waiting.clone()
                {
                    s.waiting = None;
                    drop(s);
                    self.bump();
                    return HumanRequestAnswer::new(id, o, started.elapsed().as_secs());
                }
                s.held.as_ref().map(|h| h.until)
            };
            let wake = next_expiry.map_or(deadline, |u| u.min(deadline));
            let timed_out = tokio::time::timeout_at(wake.into(), rx.changed())
                .await
                .is_err();
            if timed_out && Instant::now() >= deadline {
                let id = {
                    let mut s = self.state.locked();
                    s.waiting.take().map(|w| w.id).unwrap_or_default()
                };
                self.bump();
                return HumanRequestAnswer::new(id, Outcome::TimedOut, wait.as_secs());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(token: &str, ms: u64) -> ControlGrant {
        ControlGrant {
            holder_sha256: sha256_hex(token),
            ttl_ms: ms,
        }
    }

    #[test]
    fn only_the_holder_passes_while_held_and_a_hand_back_leaves_a_notice() {
        let c = Control::new();
        assert!(c.check(None).is_ok());
        assert_eq!(c.grant(&grant("t1", 60_000)), Change::Taken);
        let left = c.check(None).unwrap_err();
        assert!(left > 50_000 && left <= 60_000, "{left}");
        assert!(c.check(Some("t2")).is_err());
        assert!(c.check(Some("t1")).is_ok());
        assert_eq!(c.grant(&grant("t1", 60_000)), Change::None, "a renewal");
        assert!(c.take_notice().is_none());
        assert_eq!(c.release(), Change::Returned);
        assert!(c.check(None).is_ok());
        let n = c.take_notice().unwrap();
        assert!(n.returned >= n.taken);
        assert!(c.take_notice().is_none(), "once");
        assert_eq!(c.release(), Change::None);
    }

    #[test]
    fn once_the_controller_claims_the_pushes_only_its_key_moves_the_controls() {
        let dir = tempfile::tempdir().unwrap();
        let c = Control::open(dir.path());
        // A standalone agent: any caller with the agent token pushes; no one is the controller.
        assert_eq!(c.pusher(None), Ok(()));
        assert!(!c.is_controller(Some("anything")));
        assert!(c.is_controller(Some(c.internal_key())));
        assert_ne!(c.internal_key(), Control::new().internal_key());
        let key = "the-controllers-key";
        c.claim(&sha256_hex(key)).unwrap();
        assert_eq!(c.pusher(None), Err(KeyError::Missing));
        assert_eq!(c.pusher(Some("a-guess")), Err(KeyError::Missing));
        assert_eq!(c.pusher(Some(key)), Ok(()));
        assert!(
            c.is_controller(Some(key)) && !c.is_controller(Some("x")) && !c.is_controller(None)
        );
        // The same claim again is fine; another is refused.
        c.claim(&sha256_hex(key).to_uppercase()).unwrap();
        assert_eq!(c.claim(&sha256_hex("another")), Err(KeyError::Taken));
        // A restarted agent keeps the claim; the file holds no key, only its digest.
        let again = Control::open(dir.path());
        assert_eq!(again.pusher(None), Err(KeyError::Missing));
        assert_eq!(again.pusher(Some(key)), Ok(()));
        let kept = std::fs::read_to_string(dir.path().join(KEY_FILE)).unwrap();
        assert_eq!(kept, sha256_hex(key));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_lease_ends_by_itself() {
        let c = Control::new();
        c.grant(&grant("t", 0));
        assert!(c.check(None).is_ok());
        assert!(!c.view().held);
        assert!(c.take_notice().is_some());
    }

    #[tokio::test]
    async fn requests_end_returned_declined_or_timed_out() {
        let c = std::sync::Arc::new(Control::new());
        assert_eq!(
            c.open_request("r0".into(), "x".into()),
            Err(RequestError::Disabled)
        );
        c.set(true, Vec::new());
        c.open_request("r1".into(), "2FA".into()).unwrap();
        assert_eq!(
            c.open_request("r2".into(), "x".into()),
            Err(RequestError::Pending)
        );
        assert_eq!(c.view().request.unwrap().reason, "2FA");
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move { c.await_request(Duration::from_secs(30)).await })
        };
        c.grant(&grant("t", 60_000));
        c.release();
        let a = waiter.await.unwrap();
        assert_eq!((a.id.as_str(), a.outcome), ("r1", Outcome::Returned));
        assert!(c.view().request.is_none());

        c.open_request("r3".into(), "CAPTCHA".into()).unwrap();
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move { c.await_request(Duration::from_secs(30)).await })
        };
        c.decline();
        assert_eq!(waiter.await.unwrap().outcome, Outcome::Declined);

        c.open_request("r4".into(), "pay".into()).unwrap();
        let a = c.await_request(Duration::from_millis(50)).await;
        assert_eq!(a.outcome, Outcome::TimedOut);
        assert!(c.view().request.is_none());
    }
}
