//! One command as the agent knows it: its record, its output view, its followers.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use berth_protocol::{CommandInfo, CommandState, OutputChunk, OutputPage, Stream};
use tokio::sync::watch;

use super::log::{LogView, LogWriter, ReadOut};
use super::record::{ExitRecord, Meta, ProcInfo};

/// One command and what the agent knows of it.
pub struct Command {
    pub id: String,
    pub dir: PathBuf,
    pub meta: Meta,
    pub(super) view: Mutex<LogView>,
    pub(super) writer: Option<Mutex<LogWriter>>,
    pub(super) proc: Mutex<Option<ProcInfo>>,
    pub(super) lost: AtomicBool,
    pub(super) stdin_open: AtomicBool,
    pub(super) stdin_lock: tokio::sync::Mutex<()>,
    pub(super) changed: watch::Sender<u64>,
    pub(super) followers: Arc<AtomicUsize>,
    pub(super) lagged_followers: AtomicUsize,
    /// Serialises refresh → report → wake, and record removal.
    pub(super) report_lock: Mutex<()>,
}

/// Counts one live follower of a command while it exists.
pub struct FollowerGuard(Arc<AtomicUsize>);

impl Drop for FollowerGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Command {
    pub(super) fn new(dir: PathBuf, meta: Meta, writer: Option<LogWriter>) -> Command {
        let view = LogView::open(&dir);
        Command {
            id: meta.id.clone(),
            dir,
            meta,
            view: Mutex::new(view),
            writer: writer.map(Mutex::new),
            proc: Mutex::new(None),
            lost: AtomicBool::new(false),
            stdin_open: AtomicBool::new(false),
            stdin_lock: tokio::sync::Mutex::new(()),
            changed: watch::channel(0).0,
            followers: Arc::new(AtomicUsize::new(0)),
            lagged_followers: AtomicUsize::new(0),
            report_lock: Mutex::new(()),
        }
    }

    pub fn follower(&self) -> FollowerGuard {
        self.followers.fetch_add(1, Ordering::SeqCst);
        FollowerGuard(self.followers.clone())
    }

    pub fn note_lagged(&self) {
        self.lagged_followers.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn view(&self) -> std::sync::MutexGuard<'_, LogView> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn exit(&self) -> Option<ExitRecord> {
        self.view().exit.clone()
    }

    pub fn state(&self) -> CommandState {
        if self.view().exit.is_some() {
            CommandState::Exited
        } else if self.lost.load(Ordering::SeqCst) {
            CommandState::Lost
        } else {
            CommandState::Running
        }
    }

    pub fn is_running(&self) -> bool {
        self.state() == CommandState::Running
    }

    pub(super) fn proc_info(&self) -> Option<ProcInfo> {
        *self.proc.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn info(&self) -> CommandInfo {
        let view = self.view();
        let exit = view.exit.clone();
        let state = if exit.is_some() {
            CommandState::Exited
        } else if self.lost.load(Ordering::SeqCst) {
            CommandState::Lost
        } else {
            CommandState::Running
        };
        CommandInfo {
            id: self.id.clone(),
            argv: self.meta.argv.clone(),
            shell: self.meta.shell.clone(),
            state,
            pid: self.proc_info().map(|p| p.pid),
            exit_code: exit.as_ref().map(|e| e.exit_code),
            signal: exit
                .as_ref()
                .and_then(|e| e.signal)
                .map(crate::proc::signal_name),
            started_at: self.meta.started_at.clone(),
            ended_at: exit.map(|e| e.ended_at),
            background: self.meta.background,
            output_bytes: view.end,
            followers: self.followers.load(Ordering::SeqCst),
            lagged_followers: self.lagged_followers.load(Ordering::SeqCst),
        }
    }

    /// Reads output from `from`, at most `max` bytes.
    pub fn read(&self, from: u64, max: usize) -> std::io::Result<ReadOut> {
        let view = self.view();
        let mut out = view.read(from, max)?;
        // A lost command will write nothing more: what is there is all there is.
        if self.lost.load(Ordering::SeqCst) && out.next_seq >= view.end {
            out.done = true;
        }
        Ok(out)
    }

    /// One page of the output API.
    pub fn page(&self, from: u64, max: usize) -> std::io::Result<OutputPage> {
        let out = self.read(from, max)?;
        Ok(OutputPage {
            chunks: to_chunks(&out),
            next_seq: out.next_seq,
            done: out.done,
            exit_code: if out.done {
                self.exit().map(|e| e.exit_code)
            } else {
                None
            },
            truncated_before_seq: out.truncated_before,
        })
    }

    /// Appends output produced by an in-process (foreground) child.
    pub(super) fn append(&self, stream: Stream, data: &[u8]) {
        let Some(w) = &self.writer else { return };
        let (end, switch) = {
            let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
            let switch = w.append(stream, data);
            (w.end(), switch)
        };
        self.view().note_append(end, switch);
        self.bump();
    }

    /// Re-reads what the shim wrote. Returns whether anything changed.
    /// Re-reads what the shim wrote; the caller wakes waiters (after putting any exit on the
    /// timeline, so a waiter that sees the end also finds the event).
    pub(super) fn refresh(&self) -> bool {
        self.view().refresh()
    }

    /// Returns whether the command was not already lost. The caller wakes waiters.
    pub(super) fn mark_lost(&self) -> bool {
        !self.lost.swap(true, Ordering::SeqCst)
    }

    /// Whether whoever supervises the command (shim or agent) is still alive.
    pub(super) fn supervisor_alive(&self) -> bool {
        match self.proc_info() {
            Some(p) => crate::proc::is_alive(p.supervisor_pid, p.supervisor_start),
            None => false,
        }
    }
}

/// Splits a read into API chunks (UTF-8 runs as `data`, the rest as `data_b64`).
pub fn to_chunks(out: &ReadOut) -> Vec<OutputChunk> {
    out.segments
        .iter()
        .flat_map(|s| crate::text::encode_chunks(s.seq, s.stream, &s.bytes))
        .collect()
}
