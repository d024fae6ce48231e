//! `berth-agent shim <dir>` (or `shim-spare`, started ahead and handed its directory later):
//! supervises one background command so that it outlives the agent.
//!
//! The shim runs in its own session as a child subreaper. It starts the command in its own
//! process group, owns its pipes and writes every byte to the command's log, enforces the
//! timeout, and finally writes the `exit` record — so an agent started later re-adopts the
//! command and learns how it ended. It reports the spawn result on stdout as one JSON line.
//!
//! Signals: SIGTERM kills the command's whole tree (the exit is still recorded); SIGUSR1
//! closes the shim's end of the stdin FIFO so the command sees end-of-file.
//!
//! The shim lives until its whole tree is gone: a daemon the command left behind stays under
//! it, so deleting the command or shutting the agent down still ends that daemon.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_protocol::Stream;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM, SIGUSR1};

use super::log::LogWriter;
use super::record::{self, EXIT, ExitRecord, Meta, PROC, ProcInfo, STDIN, StdinMode};
use super::spawn::{self, Group, Launch, SpawnFailure};
use crate::reaper::Exit;

/// How long output may keep arriving after the command exited before its exit is recorded
/// while a process it left behind holds its output pipe open (it may for good).
pub const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// How long the exit waits for the rest of an output pipe that nothing but the shim holds any
/// more. Such a reader is bound to reach the end (only a reader stalled on a loaded CPU or
/// disk takes long): an exit recorded before it would be final to every reader of the log,
/// without the output the reader was still copying. This only bounds a reader stuck for good.
const DRAIN_MAX: Duration = Duration::from_secs(30);

/// The handshake line on the shim's stdout.
#[derive(Debug, Serialize, Deserialize)]
pub struct Handshake {
    pub ok: bool,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub errno: Option<i32>,
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

enum Ev {
    Signal(i32),
    ReaderDone,
}

pub fn main(dir: &Path) -> i32 {
    new_session();
    let env: Vec<(String, String)> = std::env::vars().collect();
    supervise(dir, &env)
}

/// What the agent hands a spare shim (`berth-agent shim-spare`): the command's directory and
/// the command's environment, as one JSON line on the spare's stdin.
#[derive(Debug, Serialize, Deserialize)]
pub struct SpareJob {
    pub dir: std::path::PathBuf,
    pub env: Vec<(String, String)>,
}

/// `berth-agent shim-spare`: a shim started before its command, waiting on stdin for its
/// [`SpareJob`]. The loader, the relocations and the first page faults of the agent's binary
/// are paid while nothing waits; the command then starts as fast as a fork. End of input
/// before a job (the agent ended, or no longer wants it) ends it quietly.
pub fn spare_main() -> i32 {
    new_session();
    let mut line = String::new();
    match std::io::stdin().read_line(&mut line) {
        Ok(0) | Err(_) => return 0,
        Ok(_) => {}
    }
    let job: SpareJob = match serde_json::from_str(&line) {
        Ok(j) => j,
        Err(e) => {
            // No directory to log in: the handshake carries the reason.
            report_error(&mut std::io::stdout(), format!("an unreadable job: {e}"));
            return 1;
        }
    };
    // From here on the shim's stderr is its command's shim.log, as for a shim started cold.
    if let Ok(log) = std::fs::File::create(job.dir.join("shim.log")) {
        // SAFETY: dup2 onto fd 2 of a file this process just opened; nothing else runs yet.
        unsafe {
            libc::dup2(log.as_raw_fd(), libc::STDERR_FILENO);
        }
    }
    supervise(&job.dir, &job.env)
}

/// Leaves the agent's session and process group for a session of its own, so nothing aimed
/// at the agent's group reaches the command. Done here rather than between the agent's fork
/// and exec: without a closure to run there, the agent starts a shim with `posix_spawn`
/// instead of copying itself with `fork`.
fn new_session() {
    // SAFETY: setsid takes no arguments; it fails only for a group leader, which a process
    // the agent just spawned is not.
    unsafe {
        libc::setsid();
    }
}

/// The handshake of a shim that could not supervise its command: why, in `message`.
fn report_error(out: &mut std::io::Stdout, msg: String) {
    let hs = Handshake {
        ok: false,
        pid: None,
        errno: None,
        subject: None,
        message: Some(msg),
    };
    let _ = writeln!(out, "{}", serde_json::to_string(&hs).unwrap_or_default());
}

/// Supervises the command `dir` describes, started with `env`; the process's exit code.
fn supervise(dir: &Path, env: &[(String, String)]) -> i32 {
    let mut stdout = std::io::stdout();
    match run(dir, env, &mut stdout) {
        Ok(()) => 0,
        Err(msg) => {
            eprintln!("berth-agent shim: {msg}");
            report_error(&mut stdout, msg);
            1
        }
    }
}

fn run(
    dir: &Path,
    env: &[(String, String)],
    handshake: &mut std::io::Stdout,
) -> Result<(), String> {
    let meta: Meta = record::read_json(dir, record::META)
        .ok_or_else(|| format!("no readable meta.json in {}", dir.display()))?;
    // A kernel without child subreapers (gVisor's, under `[runtime] = "runsc"`) still runs the
    // command: what it leaves behind goes to the sandbox's init instead of staying under the
    // shim, so deleting the command no longer ends such a daemon.
    match crate::proc::become_subreaper() {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {}
        r => r.map_err(|e| format!("subreaper: {e}"))?,
    }

    let (tx, rx) = mpsc::channel::<Ev>();
    forward_signals(tx.clone())?;

    let writer = Arc::new(Mutex::new(
        LogWriter::create(dir, meta.output_cap).map_err(|e| format!("output log: {e}"))?,
    ));

    let (child_stdin, stdin_keeper) = open_stdin(dir, &meta)?;
    let Some(Started {
        mut child,
        merged_output,
    }) = spawn_command(&meta, env, child_stdin, handshake)?
    else {
        return Ok(());
    };
    let pid = child.id();

    let me = std::process::id();
    announce_started(dir, pid, me, handshake)?;

    let (readers, pipes) = spawn_readers(&mut child, merged_output, &writer, &tx);
    drop(tx);

    let deadline = meta
        .timeout_ms
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    let mut supervision = Supervision {
        dir,
        pid,
        me,
        deadline,
        writer,
        stdin_keeper,
        readers,
        pipes,
        timed_out: false,
        child_exit: None,
        exit_written: false,
        childless: false,
    };
    supervision.run(&rx);
    Ok(())
}

/// Forwards the signals the shim handles to the supervision loop from a thread of their own.
fn forward_signals(tx: mpsc::Sender<Ev>) -> Result<(), String> {
    let mut signals =
        signal_hook::iterator::Signals::new([SIGCHLD, SIGTERM, SIGUSR1, SIGINT, SIGHUP])
            .map_err(|e| format!("signals: {e}"))?;
    std::thread::spawn(move || {
        for s in signals.forever() {
            if tx.send(Ev::Signal(s)).is_err() {
                break;
            }
        }
    });
    Ok(())
}

/// The command's stdin, and the shim's write end of the FIFO when stdin is one.
///
/// The child gets the FIFO's read end; the shim holds a write end so the child sees
/// end-of-file only when asked (SIGUSR1), not whenever no agent happens to be writing.
fn open_stdin(dir: &Path, meta: &Meta) -> Result<(Stdio, Option<std::fs::File>), String> {
    let mut stdin_keeper: Option<std::fs::File> = None;
    let child_stdin = match meta.stdin {
        StdinMode::Fifo => {
            let path = dir.join(STDIN);
            let read = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .map_err(|e| format!("stdin fifo: {e}"))?;
            let write = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .map_err(|e| format!("stdin fifo: {e}"))?;
            set_blocking(&read);
            stdin_keeper = Some(write);
            Stdio::from(read)
        }
        _ => Stdio::null(),
    };
    Ok((child_stdin, stdin_keeper))
}

/// A started command and, when stderr is merged into stdout, the read end of their one pipe.
struct Started {
    child: std::process::Child,
    merged_output: Option<OwnedFd>,
}

/// Starts the command in its own process group with its stdin and output pipes. `Ok(None)`
/// means it could not start and that failure is already reported on the handshake.
fn spawn_command(
    meta: &Meta,
    env: &[(String, String)],
    child_stdin: Stdio,
    handshake: &mut std::io::Stdout,
) -> Result<Option<Started>, String> {
    let identity = meta
        .switch_identity
        .then(|| (meta.uid, meta.gid, meta.groups.clone()));
    let cwd = Path::new(&meta.cwd);
    let launch = Launch {
        program: &meta.program,
        cwd,
        env,
        identity,
        group: Group::NewGroup,
    };
    if let Err(f) = spawn::precheck(&meta.program, cwd) {
        report_failure(handshake, &f);
        return Ok(None);
    }
    let mut cmd = match spawn::command(&launch) {
        Ok(c) => c,
        Err(f) => {
            report_failure(handshake, &f);
            return Ok(None);
        }
    };
    cmd.stdin(child_stdin);
    let merged_output = if meta.merge_stderr {
        let (r, w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
        let w2 = w.try_clone().map_err(|e| format!("pipe: {e}"))?;
        cmd.stdout(Stdio::from(w)).stderr(Stdio::from(w2));
        Some(r)
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        None
    };
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            report_failure(handshake, &SpawnFailure::from_io(&e, &meta.program[0]));
            return Ok(None);
        }
    };
    drop(cmd); // closes our copies of the merged pipe's write ends
    Ok(Some(Started {
        child,
        merged_output,
    }))
}

/// Records who supervises the command (`proc.json`), then writes the success handshake and
/// lets go of stdout.
fn announce_started(
    dir: &Path,
    pid: u32,
    me: u32,
    handshake: &mut std::io::Stdout,
) -> Result<(), String> {
    let info = ProcInfo {
        supervisor_pid: me,
        supervisor_start: crate::proc::start_time(me).unwrap_or(0),
        pid,
    };
    record::write_json(dir, PROC, &info).map_err(|e| format!("proc.json: {e}"))?;
    let hs = Handshake {
        ok: true,
        pid: Some(pid),
        errno: None,
        subject: None,
        message: None,
    };
    let _ = writeln!(
        handshake,
        "{}",
        serde_json::to_string(&hs).unwrap_or_default()
    );
    let _ = handshake.flush();
    detach_stdout();
    Ok(())
}

/// Starts one thread per output pipe that copies it into the log and says when it is done;
/// returns how many were started and the pipes' inodes.
fn spawn_readers(
    child: &mut std::process::Child,
    merged_output: Option<OwnedFd>,
    writer: &Arc<Mutex<LogWriter>>,
    tx: &mpsc::Sender<Ev>,
) -> (i32, Vec<u64>) {
    let mut readers = 0;
    let mut pipes = Vec::new();
    let mut spawn_reader = |fd: OwnedFd, stream: Stream| {
        readers += 1;
        let src = std::fs::File::from(fd);
        if let Ok(m) = src.metadata() {
            pipes.push(std::os::unix::fs::MetadataExt::ino(&m));
        }
        let w = writer.clone();
        let tx = tx.clone();
        std::thread::spawn(move || {
            pump(src, stream, &w);
            let _ = tx.send(Ev::ReaderDone);
        });
    };
    if let Some(r) = merged_output {
        spawn_reader(r, Stream::Stdout);
    } else {
        if let Some(o) = child.stdout.take() {
            spawn_reader(OwnedFd::from(o), Stream::Stdout);
        }
        if let Some(e) = child.stderr.take() {
            spawn_reader(OwnedFd::from(e), Stream::Stderr);
        }
    }
    (readers, pipes)
}

/// The supervision loop's state: the running command, its deadline, its output readers and
/// whether its exit is known and recorded.
struct Supervision<'a> {
    dir: &'a Path,
    /// The command's pid, which is also its process group.
    pid: u32,
    /// The shim's own pid: the root of the tree it reaps and kills.
    me: u32,
    deadline: Option<Instant>,
    writer: Arc<Mutex<LogWriter>>,
    /// The shim's write end of the stdin FIFO; dropping it gives the command end-of-file.
    stdin_keeper: Option<std::fs::File>,
    /// Output readers still running.
    readers: i32,
    /// The inodes of the command's output pipes (`pipe:[inode]` in `/proc/<pid>/fd`).
    pipes: Vec<u64>,
    timed_out: bool,
    child_exit: Option<(Exit, Instant)>,
    exit_written: bool,
    /// The last reap found no child left: the command's whole tree is gone.
    childless: bool,
}

impl Supervision<'_> {
    /// Waits for signals and readers, reaps, enforces the timeout and records the exit, until
    /// the exit is written, all output is read and the command's whole tree is gone.
    fn run(&mut self, rx: &mpsc::Receiver<Ev>) {
        loop {
            let wait = self.next_wait();
            self.handle(rx.recv_timeout(wait));
            self.reap();
            self.enforce_deadline();
            self.record_exit_when_drained();
            // Processes the command left behind (daemons) stay our children: we are their
            // reaper, and a kill of this command still reaches them.
            if self.exit_written && self.readers == 0 && self.childless {
                break;
            }
        }
    }

    /// How long to wait for the next event: at most a second, and no later than the deadline
    /// or the end of the drain grace.
    fn next_wait(&self) -> Duration {
        let now = Instant::now();
        let mut wait = Duration::from_secs(1);
        if let Some(d) = self.deadline
            && self.child_exit.is_none()
        {
            wait = wait.min(d.saturating_duration_since(now));
        }
        if let Some((_, at)) = self.child_exit
            && !self.exit_written
        {
            // The grace's end; past it (a reader still copying a pipe nobody else holds), the
            // bound of that wait. A reader that ends wakes the loop sooner.
            let next = match now < at + DRAIN_GRACE {
                true => at + DRAIN_GRACE,
                false => at + DRAIN_MAX,
            };
            wait = wait.min(next.saturating_duration_since(now));
        }
        wait
    }

    /// Acts on one event (or on none, after a timeout).
    fn handle(&mut self, event: Result<Ev, mpsc::RecvTimeoutError>) {
        match event {
            Ok(Ev::Signal(SIGCHLD)) => {}
            Ok(Ev::Signal(SIGTERM)) => {
                crate::proc::signal_group(self.pid, Signal::SIGKILL);
                crate::proc::kill_descendants(self.me, Duration::from_secs(2));
            }
            Ok(Ev::Signal(SIGUSR1)) => {
                self.stdin_keeper = None;
            }
            Ok(Ev::Signal(_)) => {} // SIGINT / SIGHUP: we are not a terminal's job
            Ok(Ev::ReaderDone) => self.readers -= 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Every reader finished and the signal thread ended: nothing more can arrive.
            }
        }
    }

    /// Reaps everything: the command, and orphans of its tree that were re-parented to us.
    fn reap(&mut self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {
                    self.childless = false;
                    break;
                }
                // No child at all. As the subreaper of the command's tree, everything the
                // command left behind is a child of ours once the command ended: none is
                // left. (Without subreapers, what it left went to init and is not ours.)
                Err(nix::errno::Errno::ECHILD) => {
                    self.childless = true;
                    break;
                }
                Err(_) => break,
                Ok(status) => {
                    if let Some((p, exit)) = Exit::from_wait(status)
                        && p == self.pid as i32
                    {
                        self.child_exit = Some((exit, Instant::now()));
                    }
                }
            }
        }
    }

    /// Kills the command's tree once, when it is still running at its deadline.
    fn enforce_deadline(&mut self) {
        if let Some(d) = self.deadline
            && self.child_exit.is_none()
            && !self.timed_out
            && Instant::now() >= d
        {
            self.timed_out = true;
            crate::proc::signal_group(self.pid, Signal::SIGKILL);
            crate::proc::kill_descendants(self.me, Duration::from_secs(2));
        }
    }

    /// Writes the exit record once the command has exited and its output is read (see
    /// [`Self::drained`]), then closes the stdin FIFO's write end.
    fn record_exit_when_drained(&mut self) {
        if let Some((exit, at)) = self.child_exit
            && !self.exit_written
            && self.drained(at)
        {
            let output_error = self.writer.lock().ok().and_then(|w| w.error.clone());
            let rec = ExitRecord {
                exit_code: exit.exit_code(),
                signal: exit.signal,
                timed_out: self.timed_out,
                ended_at: crate::time::now_rfc3339(),
                output_error,
                reported: false,
            };
            if let Err(e) = record::write_json(self.dir, EXIT, &rec) {
                eprintln!("berth-agent shim: cannot write the exit record: {e}");
            }
            self.exit_written = true;
            drop(self.stdin_keeper.take());
        }
    }
}

impl Supervision<'_> {
    /// Whether the exit of a command that exited at `at` may be recorded: all its output is
    /// read; or the drain grace is over and a process it left behind holds an output pipe
    /// open (the rest may never come); or the readers are past `DRAIN_MAX`. A reader that is
    /// only slow (not scheduled, or its write to the log waiting on the disk) is waited for:
    /// nothing else holds its pipe, so it reaches the end.
    fn drained(&self, at: Instant) -> bool {
        if self.readers == 0 {
            return true;
        }
        let waited = at.elapsed();
        waited >= DRAIN_MAX || (waited >= DRAIN_GRACE && self.output_held())
    }

    /// Whether a process of the command's tree (it has exited: what it left behind) holds one
    /// of its output pipes. One whose descriptors cannot be read may: it counts.
    fn output_held(&self) -> bool {
        if self.pipes.is_empty() {
            return !crate::proc::descendants(self.me).is_empty();
        }
        let links: Vec<String> = self.pipes.iter().map(|i| format!("pipe:[{i}]")).collect();
        crate::proc::descendants(self.me).into_iter().any(|pid| {
            match std::fs::read_dir(format!("/proc/{pid}/fd")) {
                Ok(fds) => fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path())
                        .ok()
                        .and_then(|l| l.to_str().map(|l| links.iter().any(|p| p == l)))
                        .unwrap_or(false)
                }),
                // Gone meanwhile: it holds nothing.
                Err(e) => e.kind() != std::io::ErrorKind::NotFound,
            }
        })
    }
}

fn report_failure(out: &mut std::io::Stdout, f: &SpawnFailure) {
    let hs = Handshake {
        ok: false,
        pid: None,
        errno: Some(f.errno),
        subject: Some(f.subject.clone()),
        message: Some(f.message()),
    };
    let _ = writeln!(out, "{}", serde_json::to_string(&hs).unwrap_or_default());
    let _ = out.flush();
}

fn pump(mut src: std::fs::File, stream: Stream, writer: &Mutex<LogWriter>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if let Ok(mut w) = writer.lock() {
                    w.append(stream, &buf[..n]);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}

fn set_blocking(f: &std::fs::File) {
    let fd = f.as_raw_fd();
    // SAFETY: fcntl on an open descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
}

/// Points stdout at /dev/null once the handshake is written, so the agent's read of it ends
/// and a later agent restart cannot leave us writing into a dead pipe.
fn detach_stdout() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 onto fd 1 with an open descriptor.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The supervision of a command that exited `ago`, one reader still copying pipe `r`.
    fn exited<'a>(dir: &'a Path, r: &OwnedFd, ago: Duration) -> Supervision<'a> {
        let pipe = std::fs::File::from(r.try_clone().unwrap());
        Supervision {
            dir,
            pid: 0,
            me: std::process::id(),
            deadline: None,
            writer: Arc::new(Mutex::new(LogWriter::create(dir, 1 << 20).unwrap())),
            stdin_keeper: None,
            readers: 1,
            pipes: vec![std::os::unix::fs::MetadataExt::ino(
                &pipe.metadata().unwrap(),
            )],
            timed_out: false,
            child_exit: Some((
                Exit {
                    code: Some(0),
                    signal: None,
                },
                Instant::now()
                    .checked_sub(ago)
                    .expect("the clock is past `ago`"),
            )),
            exit_written: false,
            childless: false,
        }
    }

    #[test]
    fn the_exit_waits_for_a_slow_reader_unless_a_process_left_behind_holds_the_output() {
        let dir = tempfile::tempdir().unwrap();
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        // Past the grace, a reader still copying a pipe only the shim holds: the rest of the
        // output is certain to come, so the exit is not recorded before it.
        let mut s = exited(dir.path(), &r, DRAIN_GRACE * 5);
        s.record_exit_when_drained();
        assert!(!s.exit_written && !dir.path().join(EXIT).exists());
        s.readers = 0;
        s.record_exit_when_drained();
        assert!(s.exit_written && dir.path().join(EXIT).exists());
        // A process left behind holds the pipe: past the grace the exit is recorded.
        let held = tempfile::tempdir().unwrap();
        let mut daemon = std::process::Command::new("sleep")
            .arg("60")
            .stdout(Stdio::from(w))
            .spawn()
            .unwrap();
        let mut s = exited(held.path(), &r, DRAIN_GRACE * 5);
        s.record_exit_when_drained();
        let recorded = s.exit_written;
        let _ = daemon.kill();
        let _ = daemon.wait();
        assert!(recorded);
        // A reader stuck past the bound does not hold the exit back for ever.
        let stuck = tempfile::tempdir().unwrap();
        let mut s = exited(stuck.path(), &r, DRAIN_MAX + DRAIN_GRACE);
        s.record_exit_when_drained();
        assert!(s.exit_written);
    }
}
