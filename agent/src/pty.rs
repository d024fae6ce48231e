//! Terminal sessions: a program on a pseudo-terminal, a scrollback ring replayed to every
//! attacher, input from any attacher, resize, and the exit code reported on close.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use berth_protocol::events::EventKind;
use berth_protocol::sync::Locked;
use berth_protocol::{PtyInfo, PtyRequest, PtyState};
use nix::sys::signal::Signal;
use portable_pty::{CommandBuilder, MasterPty, PtySize};
use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::events::EventLog;
use crate::exec::{ExecError, Prepared};
use crate::reaper::{Exit, Reaper};

/// Scrollback kept per terminal and replayed on attach.
pub const SCROLLBACK: usize = 1 << 20;
const INPUT_QUEUE: usize = 256;

/// The newest `cap` bytes of a terminal's output, addressed by absolute offset.
pub struct Ring {
    buf: VecDeque<u8>,
    start: u64,
    cap: usize,
}

impl Ring {
    pub fn new(cap: usize) -> Ring {
        Ring {
            buf: VecDeque::new(),
            start: 0,
            cap,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend(data);
        if self.buf.len() > self.cap {
            let drop = self.buf.len() - self.cap;
            self.buf.drain(..drop);
            self.start += drop as u64;
        }
    }

    pub fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// Bytes from `from` (at most `max`), the offset after them, and how many bytes before the
    /// ring's start were skipped because they are no longer kept.
    pub fn read(&self, from: u64, max: usize) -> (Vec<u8>, u64, u64) {
        let skipped = self.start.saturating_sub(from);
        let from = from.max(self.start);
        let off = (from - self.start) as usize;
        let n = self.buf.len().saturating_sub(off).min(max);
        let data: Vec<u8> = self.buf.range(off..off + n).copied().collect();
        (data, from + n as u64, skipped)
    }
}

struct Status {
    cols: u16,
    rows: u16,
    exit: Option<Exit>,
    ended_at: Option<String>,
    /// Exit seen and the output drained: attachers get the exit code and are closed.
    closed: bool,
}

pub enum Input {
    Data(Vec<u8>),
}

pub struct PtySession {
    pub id: String,
    pub cmd: Vec<String>,
    pub pid: Option<u32>,
    started_at: String,
    status: Mutex<Status>,
    ring: Mutex<Ring>,
    master: Mutex<Box<dyn MasterPty + Send>>,
    input: mpsc::Sender<Input>,
    changed: watch::Sender<u64>,
    attached: AtomicUsize,
}

impl PtySession {
    /// A session just started: `p.program` as `pid` on a `cols`×`rows` terminal, its output
    /// empty, its input sent to `input`.
    fn new(
        p: &Prepared,
        pid: Option<u32>,
        (cols, rows): (u16, u16),
        master: Box<dyn MasterPty + Send>,
        input: mpsc::Sender<Input>,
    ) -> Arc<PtySession> {
        Arc::new(PtySession {
            id: new_pty_id(),
            cmd: p.program.clone(),
            pid,
            started_at: crate::time::now_rfc3339(),
            status: Mutex::new(Status {
                cols,
                rows,
                exit: None,
                ended_at: None,
                closed: false,
            }),
            ring: Mutex::new(Ring::new(SCROLLBACK)),
            master: Mutex::new(master),
            input,
            changed: watch::channel(0).0,
            attached: AtomicUsize::new(0),
        })
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.locked()
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn info(&self) -> PtyInfo {
        let s = self.status();
        PtyInfo {
            id: self.id.clone(),
            cmd: self.cmd.clone(),
            cols: s.cols,
            rows: s.rows,
            pid: self.pid,
            state: if s.exit.is_some() {
                PtyState::Exited
            } else {
                PtyState::Running
            },
            exit_code: s.exit.map(|e| e.exit_code()),
            started_at: self.started_at.clone(),
            ended_at: s.ended_at.clone(),
            attached: self.attached.load(Ordering::SeqCst),
            output_bytes: self.ring.locked().end(),
        }
    }

    pub fn read(&self, from: u64, max: usize) -> (Vec<u8>, u64, u64) {
        self.ring.locked().read(from, max)
    }

    /// The exit code once the terminal is closed (program ended, output drained).
    pub fn closed(&self) -> Option<i32> {
        let s = self.status();
        if s.closed {
            s.exit.map(|e| e.exit_code())
        } else {
            None
        }
    }

    /// Queues keyboard input; waits while the terminal is not reading (bounded queue).
    pub async fn write(&self, data: Vec<u8>) -> bool {
        self.input.send(Input::Data(data)).await.is_ok()
    }

    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), ExecError> {
        if cols == 0 || rows == 0 {
            return Err(ExecError::Invalid(
                "cols and rows must be at least 1".into(),
            ));
        }
        self.master
            .locked()
            .resize(PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            })
            .map_err(|e| ExecError::Internal(format!("resize: {e}")))?;
        let mut s = self.status();
        s.cols = cols;
        s.rows = rows;
        Ok(())
    }

    /// Counts an attacher for as long as the guard lives.
    pub fn attach(self: &Arc<Self>) -> AttachGuard {
        self.attached.fetch_add(1, Ordering::SeqCst);
        AttachGuard(self.clone())
    }
}

pub struct AttachGuard(Arc<PtySession>);

impl Drop for AttachGuard {
    fn drop(&mut self) {
        self.0.attached.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct PtyTable {
    sessions: Mutex<HashMap<String, Arc<PtySession>>>,
    events: Arc<EventLog>,
    reaper: Arc<Reaper>,
    agent_exe: PathBuf,
    ttl: Duration,
}

impl PtyTable {
    pub fn new(
        events: Arc<EventLog>,
        reaper: Arc<Reaper>,
        agent_exe: PathBuf,
        ttl: Duration,
    ) -> Arc<PtyTable> {
        Arc::new(PtyTable {
            sessions: Mutex::new(HashMap::new()),
            events,
            reaper,
            agent_exe,
            ttl,
        })
    }

    pub fn get(&self, id: &str) -> Option<Arc<PtySession>> {
        self.sessions.locked().get(id).cloned()
    }

    pub fn require(&self, id: &str) -> Result<Arc<PtySession>, ExecError> {
        self.get(id)
            .ok_or_else(|| ExecError::NotFound(format!("pty {id}")))
    }

    pub fn list(&self) -> Vec<PtyInfo> {
        self.expire();
        let mut v: Vec<PtyInfo> = self.sessions.locked().values().map(|s| s.info()).collect();
        v.sort_by(|a, b| a.started_at.cmp(&b.started_at));
        v
    }

    /// Starts `p.program` on a new terminal.
    pub fn open(&self, p: Prepared, req: &PtyRequest) -> Result<Arc<PtySession>, ExecError> {
        let cols = req.cols.unwrap_or(80);
        let rows = req.rows.unwrap_or(24);
        if cols == 0 || rows == 0 {
            return Err(ExecError::Invalid(
                "cols and rows must be at least 1".into(),
            ));
        }
        crate::exec::spawn::precheck(&p.program, &p.cwd).map_err(ExecError::Spawn)?;
        let pair = portable_pty::native_pty_system()
            .openpty(PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            })
            .map_err(|e| ExecError::Internal(format!("openpty: {e}")))?;
        let builder = self.command(&p);
        let child = pair.slave.spawn_command(builder).map_err(|e| {
            let errno = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.raw_os_error())
                .unwrap_or(libc::ENOENT);
            ExecError::Spawn(crate::exec::spawn::SpawnFailure {
                errno,
                subject: p.program[0].clone(),
            })
        })?;
        drop(pair.slave);
        let pid = child.process_id();
        // The reaper owns waiting; the handle is only kept to not kill on drop.
        drop(child);
        let reader = pair
            .master
            .try_clone_reader()
            .map_err(|e| ExecError::Internal(format!("pty reader: {e}")))?;
        let writer = pair
            .master
            .take_writer()
            .map_err(|e| ExecError::Internal(format!("pty writer: {e}")))?;
        let (input_tx, input_rx) = mpsc::channel(INPUT_QUEUE);
        let session = PtySession::new(&p, pid, (cols, rows), pair.master, input_tx);
        let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
        spawn_reader(session.clone(), reader, drained_tx);
        spawn_writer(writer, input_rx);
        if let Some(pid) = pid {
            self.report_exit(&session, pid, drained_rx);
        }
        self.events.emit(
            EventKind::PtyOpened,
            json!({"id": session.id, "cmd": session.cmd, "pid": pid}),
        );
        self.sessions
            .locked()
            .insert(session.id.clone(), session.clone());
        Ok(session)
    }

    /// The command that runs `p.program` in its directory and environment (`TERM` set when
    /// it has none), as `p.account`: portable-pty cannot switch users itself, so through
    /// `berth-agent exec-as`.
    fn command(&self, p: &Prepared) -> CommandBuilder {
        let mut argv: Vec<String> = Vec::new();
        if p.account.needs_switch() {
            let groups: Vec<String> = p.account.groups.iter().map(|g| g.to_string()).collect();
            argv.extend([
                self.agent_exe.to_string_lossy().into_owned(),
                "exec-as".into(),
                format!("--uid={}", p.account.uid),
                format!("--gid={}", p.account.gid),
                format!("--groups={}", groups.join(",")),
                "--".into(),
            ]);
        }
        argv.extend(p.program.iter().cloned());
        let mut builder = CommandBuilder::new(&argv[0]);
        builder.args(&argv[1..]);
        builder.cwd(&p.cwd);
        builder.env_clear();
        let mut has_term = false;
        for (k, v) in &p.env {
            has_term |= k == "TERM";
            builder.env(k, v);
        }
        if !has_term {
            builder.env("TERM", "xterm-256color");
        }
        builder
    }

    /// When the terminal's program (`pid`) exits and its output is drained (or the drain
    /// grace is up): marks the session closed with the exit and emits `pty.closed`.
    fn report_exit(
        &self,
        session: &Arc<PtySession>,
        pid: u32,
        drained_rx: tokio::sync::oneshot::Receiver<()>,
    ) {
        let exited = self.reaper.watch(pid);
        let s = session.clone();
        let events = self.events.clone();
        tokio::spawn(async move {
            let exit = exited.await.unwrap_or(Exit {
                code: None,
                signal: Some(libc::SIGKILL),
            });
            // A process the program left behind may keep the terminal open: do not wait
            // for it longer than the drain grace.
            let _ = tokio::time::timeout(crate::exec::shim::DRAIN_GRACE, drained_rx).await;
            {
                let mut st = s.status();
                st.exit = Some(exit);
                st.ended_at = Some(crate::time::now_rfc3339());
                st.closed = true;
            }
            s.bump();
            events.emit(
                EventKind::PtyClosed,
                json!({"id": s.id, "exit_code": exit.exit_code()}),
            );
        });
    }

    /// Kills the terminal's program (its whole process group) and forgets the session.
    pub fn kill(&self, id: &str) -> Result<(), ExecError> {
        let s = self.require(id)?;
        if s.closed().is_none()
            && let Some(pid) = s.pid
        {
            crate::proc::signal_group(pid, Signal::SIGHUP);
            crate::proc::signal_group(pid, Signal::SIGKILL);
        }
        self.sessions.locked().remove(id);
        Ok(())
    }

    /// Kills every terminal (agent exit: a terminal does not outlive its agent).
    pub fn kill_all(&self) {
        let ids: Vec<String> = self.sessions.locked().keys().cloned().collect();
        for id in ids {
            let _ = self.kill(&id);
        }
    }

    /// Forgets terminals that closed longer ago than the TTL.
    pub fn expire(&self) {
        let now = SystemTime::now();
        self.sessions.locked().retain(|_, s| {
            let st = s.status();
            match st.ended_at.as_deref().and_then(crate::time::parse_rfc3339) {
                Some(t) => now.duration_since(t).unwrap_or_default() < self.ttl,
                None => true,
            }
        });
    }
}

fn spawn_reader(
    session: Arc<PtySession>,
    mut reader: Box<dyn Read + Send>,
    drained: tokio::sync::oneshot::Sender<()>,
) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    session.ring.locked().push(&buf[..n]);
                    session.bump();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // EIO: every slave descriptor is closed.
                Err(_) => break,
            }
        }
        let _ = drained.send(());
    });
}

fn spawn_writer(mut writer: Box<dyn Write + Send>, mut input: mpsc::Receiver<Input>) {
    std::thread::spawn(move || {
        while let Some(Input::Data(d)) = input.blocking_recv() {
            if writer.write_all(&d).and_then(|_| writer.flush()).is_err() {
                break;
            }
        }
    });
}

fn new_pty_id() -> String {
    crate::exec::new_id().replacen("cmd_", "pty_", 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_bytes_and_reports_skips() {
        let mut r = Ring::new(8);
        r.push(b"0123456789");
        assert_eq!(r.end(), 10);
        let (d, next, skipped) = r.read(0, 100);
        assert_eq!(d, b"23456789");
        assert_eq!(next, 10);
        assert_eq!(skipped, 2);
        let (d, next, skipped) = r.read(5, 2);
        assert_eq!((d.as_slice(), next, skipped), (b"56".as_slice(), 7, 0));
        assert_eq!(r.read(10, 5).0, Vec::<u8>::new());
    }
}
