//! The one supervisor every supervised process of the agent runs under: the XFCE and GNOME
//! sessions' components and the IDE. It keeps each component's status (what `/v1/ready`
//! reports), its restart requests, the agent's stop, the crash backoff and give-up, the kill
//! (SIGTERM, SIGKILL after a grace), and the readiness wait and watch of one run with the events
//! each step emits. What differs between owners (what to start, how readiness is probed, what a
//! run depends on) stays with them: `Desktop::supervise` and `Ide::supervise` are loops over
//! these steps.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_protocol::events::EventKind;
use berth_protocol::sync::Locked;
use serde_json::json;
use tokio::sync::{Notify, oneshot, watch};

use super::{Status, new_status, state_ok};
use crate::events::EventLog;
use crate::reaper::Exit;

/// How a supervisor paces its components.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// A run not ready within this long counts as a failed start (killed, backed off).
    pub ready_timeout: Duration,
    /// How often readiness is probed while it is not there yet.
    pub probe_every: Duration,
    /// Crashes in a row (each within `stable` of its start) before giving up.
    pub max_crashes: u32,
    /// A run that stayed up this long has its crash count cleared.
    pub stable: Duration,
    pub backoff_first: Duration,
    pub backoff_max: Duration,
    /// Between SIGTERM and SIGKILL when a component is stopped.
    pub stop_grace: Duration,
}

impl Policy {
    /// The wait after the `crashes`th crash in a row (1-based): doubling from the first, capped.
    pub fn backoff(&self, crashes: u32) -> Duration {
        self.backoff_first
            .saturating_mul(1 << crashes.saturating_sub(1).min(10))
            .min(self.backoff_max)
    }
}

/// How one run of a component ended.
#[derive(Debug, Clone, Copy)]
pub enum Ended {
    /// It exited (or was killed from outside).
    Exited(Exit),
    /// It did not become ready in time; it was killed.
    Unready,
    /// What it depends on went away (the X server); it was killed or left on its own.
    Gone,
    /// A restart was asked for; it was killed.
    Requested,
    /// The agent is stopping; it was killed.
    Stopping,
}

impl Ended {
    /// A failure of the component itself (counted towards the give-up).
    pub fn crashed(&self) -> bool {
        matches!(self, Ended::Exited(_) | Ended::Unready)
    }

    /// The cause a restart after this end is reported with (`component.restarted`).
    pub fn cause(&self) -> &'static str {
        match self {
            Ended::Exited(_) | Ended::Unready => "crash",
            Ended::Gone => "x_restart",
            Ended::Requested | Ended::Stopping => "request",
        }
    }

    /// The exit reported with the `component.down` event (null code and signal when unready).
    pub fn exit(&self) -> Option<Exit> {
        match self {
            Ended::Exited(e) => Some(*e),
            Ended::Unready => Some(Exit {
                code: None,
                signal: None,
            }),
            _ => None,
        }
    }
}

pub struct Supervisor {
    policy: Policy,
    statuses: Mutex<BTreeMap<&'static str, Status>>,
    restart: BTreeMap<&'static str, Notify>,
    /// Moves whenever a status changes.
    changed: watch::Sender<u64>,
    /// Set once when the agent exits; every run is killed.
    stop: watch::Sender<bool>,
    stopping: AtomicBool,
    events: Arc<EventLog>,
    /// Where each component's log is (`<name>.log`), named in a give-up.
    logs: PathBuf,
}

impl Supervisor {
    pub fn new(
        policy: Policy,
        names: impl IntoIterator<Item = &'static str>,
        events: Arc<EventLog>,
        logs: PathBuf,
    ) -> Supervisor {
        let names: Vec<_> = names.into_iter().collect();
        Supervisor {
            policy,
            statuses: Mutex::new(
                names
                    .iter()
                    .map(|n| (*n, new_status("starting", "not started yet")))
                    .collect(),
            ),
            restart: names.iter().map(|n| (*n, Notify::new())).collect(),
            changed: watch::channel(0).0,
            stop: watch::channel(false).0,
            stopping: AtomicBool::new(false),
            events,
            logs,
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn log_of(&self, name: &str) -> PathBuf {
        self.logs.join(format!("{name}.log"))
    }

    /// Moves whenever a status changes.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn statuses(&self) -> BTreeMap<&'static str, Status> {
        self.statuses.locked().clone()
    }

    pub fn status(&self, name: &str) -> Option<Status> {
        self.statuses.locked().get(name).cloned()
    }

    /// Changes one component's status; `since` moves when its state or reason does.
    pub fn set(&self, name: &'static str, f: impl FnOnce(&mut Status)) {
        let mut map = self.statuses.locked();
        let s = map
            .entry(name)
            .or_insert_with(|| new_status("starting", ""));
        let before = (s.ok, s.state.clone(), s.reason.clone());
        f(s);
        s.ok = state_ok(&s.state);
        if (s.ok, &s.state, &s.reason) != (before.0, &before.1, &before.2) {
            s.since = crate::time::now_rfc3339();
        }
        drop(map);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Asks for a fresh start of one component (clears a give-up). False for an unknown name.
    pub fn request_restart(&self, name: &str) -> bool {
        match self.restart.get(name) {
            Some(n) => {
                n.notify_one();
                true
            }
            None => false,
        }
    }

    /// Resolves when a restart of `name` is asked for.
    pub async fn restart_requested(&self, name: &str) {
        match self.restart.get(name) {
            Some(n) => n.notified().await,
            None => std::future::pending().await,
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Tells every run to stop.
    pub fn begin_stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stop.send_replace(true);
    }

    /// Resolves once the agent is stopping (at once if it already is).
    pub fn stopped(&self) -> impl Future<Output = ()> + use<> {
        let mut rx = self.stop.subscribe();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    /// A start that failed before there was a process: down, with an event.
    pub fn start_failed(&self, name: &'static str, reason: String) {
        self.set(name, |s| {
            s.state = "down".into();
            s.reason = reason.clone();
            s.pid = None;
        });
        self.events.emit(
            EventKind::ComponentDown,
            json!({"component": name, "reason": reason, "exit_code": null, "signal": null}),
        );
    }

    /// A run that just started and is not ready yet.
    pub fn started(&self, name: &'static str, pid: u32, restarts: u32) {
        self.set(name, |s| {
            s.state = "starting".into();
            s.reason = "started; waiting until it is ready".into();
            s.pid = Some(pid);
            s.restarts = restarts;
        });
    }

    /// The status and event of a run that ended: `stopped` when the agent is stopping (no
    /// event), otherwise `down` with `component.down` reporting `exit` (None: not known).
    pub fn ended(
        &self,
        name: &'static str,
        pid: u32,
        ended: &Ended,
        reason: &str,
        exit: Option<Exit>,
    ) {
        let stopping = matches!(ended, Ended::Stopping);
        self.set(name, |s| {
            s.state = if stopping { "stopped" } else { "down" }.into();
            s.reason = reason.to_string();
            s.pid = None;
        });
        if !stopping {
            self.events.emit(
                EventKind::ComponentDown,
                with_exit(
                    json!({"component": name, "pid": pid, "reason": reason}),
                    exit,
                ),
            );
        }
    }

    /// From start to end of one run: readiness (`probe`, every `probe_every`, until
    /// `ready_timeout`), then watching. `gone` resolves when what the run depends on goes away.
    /// `on_up` runs once it is ready (its own events), after `component.up` and, for a
    /// restart (`previous`: why the run before ended, and how), `component.restarted`. The
    /// process is killed when it has to go.
    #[allow(clippy::too_many_arguments)]
    pub async fn until_ended<G, P, F>(
        &self,
        name: &'static str,
        pid: u32,
        exit: &mut oneshot::Receiver<Exit>,
        gone: G,
        restarts: u32,
        previous: Option<(&'static str, Option<Exit>)>,
        up_reason: String,
        mut probe: P,
        on_up: impl FnOnce(),
    ) -> Ended
    where
        G: Future<Output = ()>,
        P: FnMut() -> F,
        F: Future<Output = Result<(), String>>,
    {
        tokio::pin!(gone);
        let lost = |e: Result<Exit, _>| {
            Ended::Exited(e.unwrap_or(Exit {
                code: None,
                signal: None,
            }))
        };
        let deadline = tokio::time::Instant::now() + self.policy.ready_timeout;
        let mut last_reason = String::new();
        loop {
            tokio::select! {
                e = &mut *exit => return lost(e),
                _ = &mut gone => { self.kill(name, pid, exit).await; return Ended::Gone; }
                _ = self.restart_requested(name) => { self.kill(name, pid, exit).await; return Ended::Requested; }
                _ = self.stopped() => { self.kill(name, pid, exit).await; return Ended::Stopping; }
                r = probe() => match r {
                    Ok(()) => break,
                    Err(reason) => {
                        if reason != last_reason {
                            self.set(name, |s| s.reason = format!("not ready yet: {reason}"));
                            last_reason = reason;
                        }
                        if tokio::time::Instant::now() >= deadline {
                            // Running but useless: restarted like a crash.
                            tracing::warn!(component = name, reason = %last_reason, "not ready in time; restarting it");
                            self.kill(name, pid, exit).await;
                            return Ended::Unready;
                        }
                        tokio::time::sleep(self.policy.probe_every).await;
                    }
                }
            }
        }
        self.set(name, |s| {
            s.state = "up".into();
            s.reason = up_reason;
        });
        self.events.emit(
            EventKind::ComponentUp,
            json!({"component": name, "pid": pid, "restarts": restarts}),
        );
        if let Some((cause, last_exit)) = previous {
            self.events.emit(
                EventKind::ComponentRestarted,
                with_exit(
                    json!({"component": name, "pid": pid, "restarts": restarts, "cause": cause}),
                    last_exit,
                ),
            );
        }
        on_up();
        tracing::info!(component = name, pid, "up");
        tokio::select! {
            e = &mut *exit => lost(e),
            _ = &mut gone => { self.kill(name, pid, exit).await; Ended::Gone }
            _ = self.restart_requested(name) => { self.kill(name, pid, exit).await; Ended::Requested }
            _ = self.stopped() => { self.kill(name, pid, exit).await; Ended::Stopping }
        }
    }

    /// SIGTERM to the process and its group, SIGKILL after the grace period; helpers that
    /// left the group (a browser's children) are killed too.
    pub async fn kill(&self, name: &str, pid: u32, exit: &mut oneshot::Receiver<Exit>) {
        use nix::sys::signal::Signal;
        // Its whole tree, taken now: once it is gone its children belong to the agent.
        let tree: Vec<(u32, u64)> = crate::proc::descendants(pid)
            .into_iter()
            .filter_map(|d| crate::proc::start_time(d).map(|s| (d, s)))
            .collect();
        // The process itself too: an adopted browser leads no group of its own.
        let signal = |sig| {
            crate::proc::signal_group(pid, sig);
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
        };
        let grace = self.policy.stop_grace;
        signal(Signal::SIGTERM);
        if tokio::time::timeout(grace, &mut *exit).await.is_err() {
            tracing::warn!(component = name, pid, "did not stop on SIGTERM; killing it");
            signal(Signal::SIGKILL);
            let _ = tokio::time::timeout(grace, &mut *exit).await;
        }
        for (d, start) in tree {
            if crate::proc::is_alive(d, start) {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(d as i32), Signal::SIGKILL);
            }
        }
    }

    /// After a crash: waits out the backoff, or gives up (until a restart is requested) after
    /// `max_crashes` in a row. False when the agent is stopping. `last_exit`: how the last run
    /// ended, reported with a give-up.
    pub async fn back_off(
        &self,
        name: &'static str,
        crashes: &mut u32,
        last_exit: Option<Exit>,
    ) -> bool {
        let max = self.policy.max_crashes;
        // The `max`th crash in a row is the last one waited out.
        if *crashes >= max {
            let reason = format!("gave up after {max} crashes in a row");
            self.set(name, |s| {
                s.state = "gave_up".into();
                s.reason = reason.clone();
            });
            self.events.emit(
                EventKind::ComponentGaveUp,
                with_exit(
                    json!({"component": name, "crashes": max, "reason": reason,
                           "log": self.log_of(name)}),
                    last_exit,
                ),
            );
            tracing::error!(component = name, "{reason}");
            tokio::select! {
                _ = self.restart_requested(name) => {}
                _ = self.stopped() => return false,
            }
            *crashes = 0;
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(self.policy.backoff(*crashes)) => true,
            _ = self.restart_requested(name) => { *crashes = 0; true }
            _ = self.stopped() => false,
        }
    }

    /// Counts a crash (cleared first when the run was stable) and waits out its backoff. False
    /// when the agent is stopping.
    pub async fn after_crash(
        &self,
        name: &'static str,
        crashes: &mut u32,
        ran_for: Duration,
        last_exit: Option<Exit>,
    ) -> bool {
        if ran_for >= self.policy.stable {
            *crashes = 0;
        }
        *crashes += 1;
        self.back_off(name, crashes, last_exit).await
    }
}

/// Adds how a process ended, as `component.down` reports it: `exit_code` (null when it did not
/// exit on its own) and `signal` (`KILL`, …; null when none killed it).
pub fn with_exit(mut event: serde_json::Value, exit: Option<Exit>) -> serde_json::Value {
    event["exit_code"] = json!(exit.and_then(|e| e.code));
    event["signal"] = json!(exit.and_then(|e| e.signal).map(crate::proc::signal_name));
    event
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            ready_timeout: Duration::from_secs(30),
            probe_every: Duration::from_millis(50),
            max_crashes: 5,
            stable: Duration::from_secs(60),
            backoff_first: Duration::from_millis(250),
            backoff_max: Duration::from_secs(30),
            stop_grace: Duration::from_secs(3),
        }
    }

    #[test]
    fn backoff_doubles_from_the_first_and_is_capped() {
        let p = policy();
        let waits: Vec<u128> = (1..=10).map(|n| p.backoff(n).as_millis()).collect();
        assert_eq!(
            waits,
            [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(p.backoff(0), Duration::from_millis(250));
        assert_eq!(p.backoff(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn an_unready_run_is_a_crash_reported_without_code_or_signal() {
        assert!(Ended::Unready.crashed());
        assert!(!Ended::Gone.crashed());
        assert!(!Ended::Requested.crashed());
        assert_eq!(Ended::Gone.cause(), "x_restart");
        assert_eq!(Ended::Unready.cause(), "crash");
        let e = with_exit(json!({}), Ended::Unready.exit());
        assert_eq!(e, json!({"exit_code": null, "signal": null}));
        let killed = Ended::Exited(Exit {
            code: None,
            signal: Some(9),
        });
        assert_eq!(
            with_exit(json!({}), killed.exit()),
            json!({"exit_code": null, "signal": "KILL"})
        );
    }
}
