//! The agent's one child reaper. The agent is a subreaper, so orphans of everything it starts
//! become its children; a single `waitpid(-1)` loop reaps them all and hands each status to
//! whoever registered interest in that pid. Nothing else in the agent may call `wait`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_protocol::sync::Locked;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl Exit {
    /// The shell convention: the exit code, or 128 + the signal number.
    pub fn exit_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => -1,
        }
    }

    /// Python's `returncode`: the exit code, or minus the signal number.
    pub fn python_returncode(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => -s,
            (None, None) => -1,
        }
    }

    pub fn from_wait(status: WaitStatus) -> Option<(i32, Exit)> {
        match status {
            WaitStatus::Exited(pid, code) => Some((
                pid.as_raw(),
                Exit {
                    code: Some(code),
                    signal: None,
                },
            )),
            WaitStatus::Signaled(pid, sig, _) => Some((
                pid.as_raw(),
                Exit {
                    code: None,
                    signal: Some(sig as i32),
                },
            )),
            _ => None,
        }
    }
}

/// Statuses nobody claimed (orphans) are forgotten after this long.
const UNCLAIMED_TTL: Duration = Duration::from_secs(300);

#[derive(Default)]
struct Table {
    waiters: HashMap<i32, oneshot::Sender<Exit>>,
    unclaimed: HashMap<i32, (Exit, Instant)>,
}

#[derive(Default)]
pub struct Reaper {
    table: Mutex<Table>,
}

impl Reaper {
    /// Starts reaping on SIGCHLD (and on a slow tick, in case a signal was coalesced away).
    pub fn start() -> std::io::Result<Arc<Reaper>> {
        let reaper = Arc::new(Reaper::default());
        let mut sigchld = signal(SignalKind::child())?;
        let r = reaper.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = sigchld.recv() => {}
                    _ = tick.tick() => {}
                }
                r.reap_all();
            }
        });
        Ok(reaper)
    }

    /// Resolves when `pid` (a child of the agent) ends. Register right after spawning; a
    /// status reaped before registration is kept for the late caller.
    pub fn watch(&self, pid: u32) -> oneshot::Receiver<Exit> {
        let (tx, rx) = oneshot::channel();
        let mut t = self.table.locked();
        match t.unclaimed.remove(&(pid as i32)) {
            Some((exit, _)) => {
                let _ = tx.send(exit);
            }
            None => {
                t.waiters.insert(pid as i32, tx);
            }
        }
        rx
    }

    pub fn reap_all(&self) {
        let mut t = self.table.locked();
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(status) => {
                    if let Some((pid, exit)) = Exit::from_wait(status) {
                        let undelivered = match t.waiters.remove(&pid) {
                            Some(tx) => tx.send(exit).err(),
                            None => Some(exit),
                        };
                        if let Some(exit) = undelivered {
                            t.unclaimed.insert(pid, (exit, Instant::now()));
                        }
                    }
                }
            }
        }
        let now = Instant::now();
        t.unclaimed
            .retain(|_, (_, at)| now.duration_since(*at) < UNCLAIMED_TTL);
    }
}
