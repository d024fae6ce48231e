//! Shims started ahead of their commands. Starting `berth-agent shim` costs a fork of the
//! agent, the loader and the page faults of a large binary: about 3 ms, three times what
//! running `echo` costs. One thread keeps a few shims started (`berth-agent shim-spare`),
//! each waiting on its stdin for a command's directory and environment, so a background
//! command starts in the time a foreground one does.
//!
//! A spare is the agent's child like any shim: the reaper hears its end. When the agent ends
//! (even killed), the spares' stdin closes and they end without a word.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use berth_protocol::sync::Locked;
use tokio::sync::oneshot;

use super::shim::SpareJob;
use crate::reaper::{Exit, Reaper};

/// One started shim waiting for its command.
pub struct Spare {
    pub pid: u32,
    stdin: std::process::ChildStdin,
    pub stdout: Option<std::process::ChildStdout>,
    pub exited: oneshot::Receiver<Exit>,
}

/// A spare handed its command: now that command's shim.
pub struct Assigned {
    pub pid: u32,
    pub stdout: Option<std::process::ChildStdout>,
    pub exited: oneshot::Receiver<Exit>,
}

impl Spare {
    /// Hands the spare its command. `None` means the spare is gone (it is reaped as any child
    /// is); the caller starts a shim cold instead.
    pub fn assign(mut self, dir: &Path, env: &[(String, String)]) -> Option<Assigned> {
        let job = SpareJob {
            dir: dir.to_path_buf(),
            env: env.to_vec(),
        };
        let mut line = serde_json::to_vec(&job).ok()?;
        line.push(b'\n');
        // A pipe takes a job this size at once (64 KiB unless the environment is huge); a
        // larger one waits for the spare, which reads it whole before anything else. A spare
        // that ended answers EPIPE (the agent ignores SIGPIPE).
        self.stdin.write_all(&line).ok()?;
        drop(self.stdin);
        Some(Assigned {
            pid: self.pid,
            stdout: self.stdout,
            exited: self.exited,
        })
    }
}

pub struct SpareShims {
    exe: PathBuf,
    /// How many spares are kept started.
    keep: usize,
    reaper: Arc<Reaper>,
    ready: Mutex<Vec<Spare>>,
    wanted: Condvar,
}

impl SpareShims {
    /// Starts the thread that keeps `keep` spares of `exe` started (none for 0).
    pub fn start(exe: &Path, reaper: Arc<Reaper>, keep: usize) -> Arc<SpareShims> {
        let pool = Arc::new(SpareShims {
            exe: exe.to_path_buf(),
            keep,
            reaper,
            ready: Mutex::new(Vec::new()),
            wanted: Condvar::new(),
        });
        if keep == 0 {
            return pool;
        }
        let weak = Arc::downgrade(&pool);
        let spawned = std::thread::Builder::new()
            .name("berth-spare-shims".into())
            .spawn(move || {
                while let Some(pool) = weak.upgrade() {
                    if !pool.top_up() {
                        break;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the spare-shim thread; shims start cold");
        }
        pool
    }

    /// A spare still alive, if one is ready; asks for the next one either way.
    pub fn take(&self) -> Option<Spare> {
        let mut ready = self.ready.locked();
        self.wanted.notify_one();
        while let Some(mut s) = ready.pop() {
            match s.exited.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => return Some(s),
                // It ended (killed by someone): drop it and look at the next.
                _ => continue,
            }
        }
        None
    }

    /// Starts spares until `keep` are ready, then waits to be asked for more. False when a
    /// spare cannot be started (the agent then starts every shim cold).
    fn top_up(&self) -> bool {
        {
            let ready = self.ready.locked();
            let _unused = berth_protocol::sync::unpoisoned(
                self.wanted.wait_while(ready, |r| r.len() >= self.keep),
            );
        }
        match self.spawn() {
            Ok(s) => {
                self.ready.locked().push(s);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start a spare shim; shims start cold");
                false
            }
        }
    }

    fn spawn(&self) -> std::io::Result<Spare> {
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.arg("shim-spare")
            .env_clear()
            .current_dir("/")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        // The shim makes its own session: nothing runs between fork and exec, so this is a
        // posix_spawn, not a copy of the agent.
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let exited = self.reaper.watch(pid);
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("the spare shim has no stdin pipe"))?;
        Ok(Spare {
            pid,
            stdin,
            stdout: child.stdout.take(),
            exited,
        })
    }
}
