//! One command as the agent knows it: its record, its output view, its followers.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use berth_protocol::sync::Locked;
use berth_protocol::{CommandInfo, CommandState, OutputChunk, OutputPage, Stream};
use tokio::sync::watch;

use super::FOREGROUND_MEMORY;
use super::log::{LogView, LogWriter, ReadOut};
use super::record::{ExitRecord, Meta, ProcInfo};
use super::store::Stored;

/// One command and what the agent knows of it.
pub struct Command {
    pub id: String,
    pub dir: PathBuf,
    pub meta: Meta,
    pub(super) view: Mutex<LogView>,
    /// A foreground command's log writer, once its output spilled out of memory.
    pub(super) writer: Mutex<Option<LogWriter>>,
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
    /// A command whose record is its directory (background, or found on disk).
    pub(super) fn new(dir: PathBuf, meta: Meta) -> Command {
        let view = LogView::open(&dir);
        Self::with_view(dir, meta, view)
    }

    /// A running foreground command: output in memory until it spills.
    pub(super) fn foreground(dir: PathBuf, meta: Meta) -> Command {
        let view = LogView::memory(&dir);
        Self::with_view(dir, meta, view)
    }

    /// A finished foreground command read back from the store.
    pub(super) fn stored(dir: PathBuf, stored: Stored, path: PathBuf) -> Command {
        let view = LogView::stored(
            &dir,
            path,
            stored.offset,
            stored.len,
            stored.streams,
            stored.exit,
        );
        Self::with_view(dir, stored.meta, view)
    }

    fn with_view(dir: PathBuf, meta: Meta, view: LogView) -> Command {
        Command {
            id: meta.id.clone(),
            dir,
            meta,
            view: Mutex::new(view),
            writer: Mutex::new(None),
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
        self.view.locked()
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
        *self.proc.locked()
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

    /// Appends output produced by an in-process (foreground) child: to memory while small,
    /// past that to the command's directory.
    pub(super) fn append(&self, stream: Stream, data: &[u8]) {
        {
            let mut view = self.view();
            let mut writer = self.writer.locked();
            let in_memory = view.memory_bytes().is_some();
            if in_memory && writer.is_none() {
                if view.end + data.len() as u64 <= FOREGROUND_MEMORY {
                    view.memory_append(stream, data);
                    drop((view, writer));
                    self.bump();
                    return;
                }
                match self.spill(&view) {
                    Ok(w) => {
                        *view = LogView::open(&self.dir);
                        *writer = Some(w);
                    }
                    Err(e) => {
                        // What fits stays in memory; the rest is lost and the exit record
                        // says why.
                        tracing::warn!(id = %self.id, error = %e, "cannot spill output to disk");
                        *writer = Some(LogWriter::failed(&self.dir, e));
                    }
                }
            }
            if let Some(w) = writer.as_mut() {
                let switch = w.append(stream, data);
                if !in_memory || w.error.is_none() {
                    view.note_append(w.end(), switch);
                }
            }
        }
        self.bump();
    }

    /// Moves in-memory output into the command's directory and returns the writer that
    /// continues it there.
    fn spill(&self, view: &LogView) -> std::io::Result<LogWriter> {
        std::fs::create_dir_all(&self.dir)?;
        super::record::write_json(&self.dir, super::record::META, &self.meta)?;
        let mut w = LogWriter::create(&self.dir, self.meta.output_cap)?;
        let bytes = view.memory_bytes().unwrap_or_default();
        let mut switches = view.index().to_vec();
        if switches.first().is_none_or(|&(seq, _)| seq > 0) {
            switches.insert(0, (0, Stream::Stdout));
        }
        for (i, &(seq, stream)) in switches.iter().enumerate() {
            let end = switches
                .get(i + 1)
                .map(|&(s, _)| s)
                .unwrap_or(bytes.len() as u64);
            w.append(stream, &bytes[seq as usize..end as usize]);
        }
        match &w.error {
            Some(e) => Err(std::io::Error::other(e.clone())),
            None => Ok(w),
        }
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
