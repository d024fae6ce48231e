//! `berth-agent init [ARGS…]`: PID 1 of a sandbox image. It reaps every orphan (what a
//! container's PID 1 must do), runs `berth-agent ARGS…` and starts it again whenever it exits,
//! so an agent crash or restart never ends the container; background commands, reparented to
//! init meanwhile, are re-adopted by the next agent. SIGTERM or SIGINT to init (`docker stop`)
//! is a full shutdown: the agent gets SIGINT (every tree it started dies), then init exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

/// Restart backoff: doubles from the first delay to the cap; reset once an agent ran this long.
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
const STABLE: Duration = Duration::from_secs(30);
/// How long a full shutdown may take before init kills what is left.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

pub fn main(args: &[String]) -> i32 {
    if std::process::id() != 1
        && let Err(e) = crate::proc::become_subreaper()
    {
        eprintln!("berth-agent init: cannot become a subreaper: {e}");
        return 1;
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("berth-agent init: cannot find its own binary: {e}");
            return 1;
        }
    };
    let stopping = Arc::new(AtomicBool::new(false));
    let agent = Arc::new(AtomicI32::new(0));
    if let Err(e) = watch_signals(stopping.clone(), agent.clone()) {
        eprintln!("berth-agent init: signal handlers: {e}");
        return 1;
    }
    let mut delay = BACKOFF_FIRST;
    loop {
        if stopping.load(Ordering::SeqCst) {
            return 0;
        }
        let started = Instant::now();
        let child = match std::process::Command::new(&exe).args(args).spawn() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("berth-agent init: cannot start the agent: {e}");
                std::thread::sleep(delay);
                delay = (delay * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let pid = child.id() as i32;
        agent.store(pid, Ordering::SeqCst);
        // A signal that arrived between the check above and the store must still reach it.
        if stopping.load(Ordering::SeqCst) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGINT);
        }
        // Reap everything; the agent's end decides what happens next.
        let status = reap_until_agent_ends(pid);
        agent.store(0, Ordering::SeqCst);
        drop(child);
        if stopping.load(Ordering::SeqCst) {
            // The full shutdown has run; collect what it left and leave.
            reap_leftovers();
            return 0;
        }
        if started.elapsed() >= STABLE {
            delay = BACKOFF_FIRST;
        }
        eprintln!("berth-agent init: the agent ended ({status}); starting it again in {delay:?}");
        std::thread::sleep(delay);
        delay = (delay * 2).min(BACKOFF_MAX);
    }
}

/// Installs the SIGTERM and SIGINT handlers: on either, init is `stopping`, the running
/// `agent` (its pid, 0 for none) gets SIGINT, and whatever is left is killed after
/// [`SHUTDOWN_GRACE`].
fn watch_signals(stopping: Arc<AtomicBool>, agent: Arc<AtomicI32>) -> std::io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    std::thread::spawn(move || {
        for _ in signals.forever() {
            stopping.store(true, Ordering::SeqCst);
            let pid = agent.load(Ordering::SeqCst);
            if pid > 0 {
                let _ = kill(Pid::from_raw(pid), Signal::SIGINT);
            }
            // A hung shutdown must not keep the container up for ever.
            std::thread::spawn(|| {
                std::thread::sleep(SHUTDOWN_GRACE);
                eprintln!("berth-agent init: shutdown took too long; killing what is left");
                let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
                std::process::exit(1);
            });
        }
    });
    Ok(())
}

/// Reaps every child that ends until the agent (`pid`) does; says how it ended.
fn reap_until_agent_ends(pid: i32) -> String {
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(p, code)) if p.as_raw() == pid => {
                break format!("exit code {code}");
            }
            Ok(WaitStatus::Signaled(p, sig, _)) if p.as_raw() == pid => {
                break format!("signal {sig}");
            }
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::ECHILD) => break "gone".to_string(),
            Err(e) => {
                eprintln!("berth-agent init: waitpid: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Reaps the children that have already ended, without waiting for the others.
fn reap_leftovers() {
    while let Ok(s) = waitpid(
        Pid::from_raw(-1),
        Some(nix::sys::wait::WaitPidFlag::WNOHANG),
    ) {
        if s == WaitStatus::StillAlive {
            break;
        }
    }
}
