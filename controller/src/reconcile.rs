//! The one reconciler: what to do about a sandbox, given what the store holds and what its
//! provider shows, is decided by [`decide`] — a pure function, so every case is tested
//! without a provider — and carried out by [`crate::sandbox::Sandboxes::apply`]. Start-up recovery, the
//! periodic sweep and the providers' death events all go through both.
//!
//! Every destroy the controller starts goes through [`crate::sandbox::Sandboxes::destroy`]: one tracked task
//! per sandbox at a time, a bounded number at once.

use crate::lifecycle::SandboxStatus;
use crate::provider::{Endpoint, Observed};
use crate::store::SandboxRow;

/// Why a decision is being made: the same (stored, observed) pair can mean different things.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The controller just started: nothing of this controller process drives any sandbox
    /// yet, and what it finds ran while it was down.
    Startup,
    /// The periodic sweep: creates and readiness checks of this process own the sandboxes
    /// still `pending` or `starting`.
    Sweep,
    /// A provider reported that a sandbox died.
    Death,
}

/// What a decision is made at.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    pub pass: Pass,
    pub now_ms: i64,
    /// A provider sandbox the store does not know is left alone this long after it was made
    /// (another controller's create may be about to record it).
    pub orphan_grace_ms: i64,
}

/// The part of a stored sandbox a decision reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub status: SandboxStatus,
    pub expires_at: Option<i64>,
}

impl Stored {
    pub fn of(row: &SandboxRow) -> Stored {
        Stored {
            status: row.status,
            expires_at: row.expires_at,
        }
    }
}

/// The state a provider sandbox was seen in.
#[derive(Debug, Clone, PartialEq)]
pub enum Health {
    /// It runs (and its agent answered, when it was asked).
    Alive,
    /// It runs, but its agent did not answer its probe (why).
    Unreachable(String),
    /// It exists but its agent is not running; the provider's reason when it gave one (a
    /// death event).
    Dead(Option<String>),
}

/// A provider sandbox as seen; no observation means the provider has no trace of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub health: Health,
    pub created_at_ms: i64,
    pub endpoint: Option<Endpoint>,
}

impl Observation {
    /// A provider's observation, before any probe of its agent.
    pub fn of(o: &Observed) -> Observation {
        Observation {
            health: if o.alive {
                Health::Alive
            } else {
                Health::Dead(None)
            },
            created_at_ms: o.created_at_ms,
            endpoint: o.endpoint.clone(),
        }
    }
}

/// What to do about one sandbox.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// It runs as the store says: keep it (recorded as `sandbox.adopted` after a restart), at
    /// the endpoint the provider reports now when it reports one (a port-forward's local
    /// listener is new after a restart).
    Adopt { endpoint: Option<Endpoint> },
    /// Its start was under way when the controller stopped and it is there: record the
    /// endpoint observed (when there is one) and check its readiness again, to its deadline.
    Resume { endpoint: Option<Endpoint> },
    /// Mark it `failed` with `reason`; `destroy`: then destroy what is left of it (nothing is
    /// left to destroy when the provider has no trace of it).
    Fail { reason: String, destroy: bool },
    /// Destroy it: a delete to finish, or (`expired`) a sandbox past its expiry.
    Destroy { expired: bool },
    /// Destroy a provider sandbox the store does not know, past its grace period.
    Reap,
    /// Nothing to do now.
    Nothing,
}

/// Reasons a sandbox is failed with.
pub mod reasons {
    pub const NEVER_CREATED: &str = "the controller stopped before the provider created it";
    pub const VANISHED_WHILE_DOWN: &str =
        "vanished while the controller was down: the provider has no trace of it";
    pub const DIED_WHILE_DOWN: &str = "its agent died while the controller was down";
    pub const NOT_READY_AT_RESTART: &str = "not ready when the controller restarted";
    pub const VANISHED: &str = "vanished: the provider has no trace of it";
    pub const GONE: &str = "its agent process is gone";
    pub const DIED: &str = "its agent died";
}

/// The reconciler's one decision: what to do about a sandbox given what the store holds
/// (`None`: no row) and what its provider shows (`None`: no trace of it).
pub fn decide(cx: &Context, stored: Option<&Stored>, observed: Option<&Observation>) -> Action {
    use SandboxStatus::*;
    let Some(s) = stored else {
        return match observed {
            // An orphan: reaped once past its grace, unless this is only its death report
            // (the sweep reaps it).
            Some(o)
                if cx.pass != Pass::Death && cx.now_ms - o.created_at_ms >= cx.orphan_grace_ms =>
            {
                Action::Reap
            }
            _ => Action::Nothing,
        };
    };
    match s.status {
        // Ended in the store but still there: a delete that did not finish.
        Stopped | Failed => match (cx.pass, observed) {
            (Pass::Startup | Pass::Sweep, Some(_)) => Action::Destroy { expired: false },
            _ => Action::Nothing,
        },
        // Being deleted: finish it (the provider's destroy is idempotent), unless this is the
        // report of the destroy's own doing.
        Stopping => match cx.pass {
            Pass::Death => Action::Nothing,
            Pass::Startup | Pass::Sweep => Action::Destroy { expired: false },
        },
        Pending | Starting | Running => match cx.pass {
            Pass::Startup => at_startup(s.status, observed),
            // A TTL counts from readiness (`mark_ready` moves it there): one still starting
            // is its create's until it runs or fails at its ready deadline.
            Pass::Sweep if s.status == Running && s.expires_at.is_some_and(|e| e <= cx.now_ms) => {
                Action::Destroy { expired: true }
            }
            Pass::Sweep => in_sweep(s.status, observed),
            Pass::Death => match observed.map(|o| &o.health) {
                Some(Health::Dead(reason)) => Action::Fail {
                    reason: reason.clone().unwrap_or_else(|| reasons::DIED.into()),
                    destroy: true,
                },
                _ => Action::Nothing,
            },
        },
    }
}

/// A live sandbox found at start-up.
fn at_startup(status: SandboxStatus, observed: Option<&Observation>) -> Action {
    use SandboxStatus::*;
    let fail = |reason: &str, destroy| Action::Fail {
        reason: reason.into(),
        destroy,
    };
    match (status, observed.map(|o| &o.health)) {
        (Pending, None) => fail(reasons::NEVER_CREATED, false),
        (_, None) => fail(reasons::VANISHED_WHILE_DOWN, false),
        (_, Some(Health::Dead(_))) => fail(reasons::DIED_WHILE_DOWN, true),
        (Running, Some(Health::Alive)) => Action::Adopt {
            endpoint: observed.and_then(|o| o.endpoint.clone()),
        },
        (Running, Some(Health::Unreachable(why))) => Action::Fail {
            reason: format!("{}: {why}", reasons::NOT_READY_AT_RESTART),
            destroy: true,
        },
        // Pending or starting, and there: its readiness decides (to its stored deadline).
        (_, Some(Health::Alive | Health::Unreachable(_))) => Action::Resume {
            endpoint: observed.and_then(|o| o.endpoint.clone()),
        },
    }
}

/// A live sandbox, not expired, seen by the sweep.
fn in_sweep(status: SandboxStatus, observed: Option<&Observation>) -> Action {
    if status != SandboxStatus::Running {
        // Its create and readiness check own it until it runs or fails.
        return Action::Nothing;
    }
    match observed.map(|o| &o.health) {
        None => Action::Fail {
            reason: reasons::VANISHED.into(),
            destroy: true,
        },
        Some(Health::Dead(reason)) => Action::Fail {
            reason: reason.clone().unwrap_or_else(|| reasons::GONE.into()),
            destroy: true,
        },
        Some(Health::Alive | Health::Unreachable(_)) => Action::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SandboxStatus::*;

    const NOW: i64 = 1_000_000;
    const GRACE: i64 = 60_000;

    fn cx(pass: Pass) -> Context {
        Context {
            pass,
            now_ms: NOW,
            orphan_grace_ms: GRACE,
        }
    }

    fn stored(status: SandboxStatus) -> Stored {
        Stored {
            status,
            expires_at: Some(NOW + 1),
        }
    }

    fn endpoint() -> Endpoint {
        Endpoint {
            agent_url: "http://127.0.0.1:1".into(),
            compat_url: "http://127.0.0.1:1".into(),
            cdp_url: None,
            ports: Default::default(),
        }
    }

    /// The observations a decision can meet: absent, alive, alive but unreachable, dead (with
    /// and without the provider's reason).
    fn observations() -> Vec<(&'static str, Option<Observation>)> {
        let seen = |health| {
            Some(Observation {
                health,
                created_at_ms: 0,
                endpoint: Some(endpoint()),
            })
        };
        vec![
            ("absent", None),
            ("alive", seen(Health::Alive)),
            ("unreachable", seen(Health::Unreachable("timed out".into()))),
            ("dead", seen(Health::Dead(None))),
            ("died", seen(Health::Dead(Some("oom-killed".into())))),
        ]
    }

    fn fail(reason: &str, destroy: bool) -> Action {
        Action::Fail {
            reason: reason.into(),
            destroy,
        }
    }

    fn expected(pass: Pass, status: SandboxStatus, seen: &str) -> Action {
        let resume = Action::Resume {
            endpoint: Some(endpoint()),
        };
        let finish = Action::Destroy { expired: false };
        match (pass, status, seen) {
            // Ended rows: what is still there is destroyed, except on a death report.
            (Pass::Death, Stopped | Failed | Stopping, _) => Action::Nothing,
            (_, Stopped | Failed, "absent") => Action::Nothing,
            (_, Stopped | Failed, _) => finish,
            (_, Stopping, _) => finish,
            // Start-up.
            (Pass::Startup, Pending, "absent") => fail(reasons::NEVER_CREATED, false),
            (Pass::Startup, _, "absent") => fail(reasons::VANISHED_WHILE_DOWN, false),
            (Pass::Startup, _, "dead" | "died") => fail(reasons::DIED_WHILE_DOWN, true),
            (Pass::Startup, Running, "alive") => Action::Adopt {
                endpoint: Some(endpoint()),
            },
            (Pass::Startup, Running, "unreachable") => {
                fail("not ready when the controller restarted: timed out", true)
            }
            (Pass::Startup, Pending | Starting, "alive" | "unreachable") => resume,
            // The sweep: starts are their own; a running one must be there and alive.
            (Pass::Sweep, Pending | Starting, _) => Action::Nothing,
            (Pass::Sweep, Running, "absent") => fail(reasons::VANISHED, true),
            (Pass::Sweep, Running, "dead") => fail(reasons::GONE, true),
            (Pass::Sweep, Running, "died") => fail("oom-killed", true),
            (Pass::Sweep, Running, "alive" | "unreachable") => Action::Nothing,
            // A death report fails a live sandbox at once.
            (Pass::Death, _, "dead") => fail(reasons::DIED, true),
            (Pass::Death, _, "died") => fail("oom-killed", true),
            (Pass::Death, _, _) => Action::Nothing,
            other => panic!("no expectation for {other:?}"),
        }
    }

    #[test]
    fn every_stored_status_and_observation_is_decided() {
        let mut pairs = 0;
        for pass in [Pass::Startup, Pass::Sweep, Pass::Death] {
            for &status in SandboxStatus::ALL {
                for (seen, o) in observations() {
                    let got = decide(&cx(pass), Some(&stored(status)), o.as_ref());
                    assert_eq!(
                        got,
                        expected(pass, status, seen),
                        "{pass:?}, stored {status}, observed {seen}"
                    );
                    pairs += 1;
                }
            }
        }
        assert_eq!(pairs, 3 * 6 * 5);
    }

    #[test]
    fn the_sweep_destroys_an_expired_running_sandbox_whatever_it_sees() {
        for (seen, o) in observations() {
            for expires_at in [NOW, NOW - 1] {
                let s = Stored {
                    status: Running,
                    expires_at: Some(expires_at),
                };
                assert_eq!(
                    decide(&cx(Pass::Sweep), Some(&s), o.as_ref()),
                    Action::Destroy { expired: true },
                    "{seen}"
                );
                // Still starting: its create owns it (a TTL counts from readiness).
                for status in [Pending, Starting] {
                    let s = Stored { status, ..s };
                    assert_eq!(
                        decide(&cx(Pass::Sweep), Some(&s), o.as_ref()),
                        in_sweep(status, o.as_ref()),
                        "{status} {seen}"
                    );
                }
            }
        }
        // Not yet expired, or never: as usual.
        let s = Stored {
            status: Running,
            expires_at: None,
        };
        assert_eq!(
            decide(&cx(Pass::Sweep), Some(&s), None),
            fail(reasons::VANISHED, true)
        );
        // Expiry is the sweep's: a restart or a death report decides as if unexpired.
        let s = Stored {
            status: Running,
            expires_at: Some(0),
        };
        let alive = &observations()[1].1;
        assert_eq!(
            decide(&cx(Pass::Startup), Some(&s), alive.as_ref()),
            Action::Adopt {
                endpoint: Some(endpoint())
            }
        );
        assert_eq!(
            decide(&cx(Pass::Death), Some(&s), alive.as_ref()),
            Action::Nothing
        );
    }

    #[test]
    fn an_orphan_is_reaped_once_past_its_grace_and_kept_while_younger() {
        let orphan = |age: i64, health| Observation {
            health,
            created_at_ms: NOW - age,
            endpoint: None,
        };
        for pass in [Pass::Startup, Pass::Sweep] {
            for health in [
                Health::Alive,
                Health::Dead(None),
                Health::Unreachable("x".into()),
            ] {
                let o = orphan(GRACE, health.clone());
                assert_eq!(decide(&cx(pass), None, Some(&o)), Action::Reap);
                let o = orphan(GRACE + 1, health.clone());
                assert_eq!(decide(&cx(pass), None, Some(&o)), Action::Reap);
                let o = orphan(GRACE - 1, health.clone());
                assert_eq!(decide(&cx(pass), None, Some(&o)), Action::Nothing);
                let o = orphan(0, health.clone());
                assert_eq!(decide(&cx(pass), None, Some(&o)), Action::Nothing);
            }
        }
        // A death report of an unknown sandbox is left to the sweep.
        let o = orphan(GRACE * 10, Health::Dead(Some("x".into())));
        assert_eq!(decide(&cx(Pass::Death), None, Some(&o)), Action::Nothing);
        // Neither stored nor seen: nothing.
        for pass in [Pass::Startup, Pass::Sweep, Pass::Death] {
            assert_eq!(decide(&cx(pass), None, None), Action::Nothing);
        }
    }

    #[test]
    fn a_resume_carries_the_endpoint_seen_or_none() {
        let o = Observation {
            health: Health::Alive,
            created_at_ms: 0,
            endpoint: None,
        };
        assert_eq!(
            decide(&cx(Pass::Startup), Some(&stored(Starting)), Some(&o)),
            Action::Resume { endpoint: None }
        );
    }

    #[test]
    fn a_provider_observation_is_alive_or_dead_before_any_probe() {
        let identity = crate::provider::Identity {
            controller_id: "c".into(),
            sandbox_id: "s".into(),
            profile: "p".into(),
            image_ref: "i".into(),
        };
        let o = Observed {
            identity,
            alive: true,
            endpoint: Some(endpoint()),
            created_at_ms: 5,
        };
        let seen = Observation::of(&o);
        assert_eq!(seen.health, Health::Alive);
        assert_eq!(seen.created_at_ms, 5);
        assert_eq!(seen.endpoint, Some(endpoint()));
        let o = Observed { alive: false, ..o };
        assert_eq!(Observation::of(&o).health, Health::Dead(None));
    }
}
