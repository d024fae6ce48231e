//! Display numbers for agents that share a host (the process provider, a developer's
//! machine, the tests). Xvnc's `-displayfd` takes the lowest display with no listening
//! socket and ignores lock files, so while one agent's X server restarted, the next desktop
//! to start took its display and the restart failed until it was given up. Each agent now
//! picks its display itself and holds an exclusive `flock` on `/tmp/.berth-X{n}.lock` for its
//! whole life; another agent skips a display whose lock is held, whose X lock file names a
//! live process, or whose socket answers.

use std::collections::HashSet;
use std::os::fd::OwnedFd;

use nix::fcntl::Flock;

/// The displays tried, in order. A sandbox's only X server is on `:0`, where OSWorld's tasks
/// look for it; on a shared host, the host's own session there is an X server in use.
const DISPLAYS: std::ops::RangeInclusive<u32> = 0..=999;

/// A display number held for the agent's life (released when dropped).
#[derive(Debug)]
pub struct DisplayClaim {
    pub number: u32,
    _lock: Flock<OwnedFd>,
}

impl DisplayClaim {
    pub fn display(&self) -> String {
        format!(":{}", self.number)
    }
}

/// Whether an X lock file's text (the server's pid, space-padded) names a live process.
pub fn lock_is_live(text: &str, alive: impl Fn(i32) -> bool) -> bool {
    text.trim()
        .parse::<i32>()
        .is_ok_and(|pid| pid > 0 && alive(pid))
}

fn pid_alive(pid: i32) -> bool {
    use nix::errno::Errno;
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e != Errno::ESRCH,
    }
}

/// Whether an X server (any, not only an agent's) holds display `n`.
fn x_in_use(n: u32) -> bool {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixStream};
    let lock = std::fs::read_to_string(format!("/tmp/.X{n}-lock")).unwrap_or_default();
    if lock_is_live(&lock, pid_alive) {
        return true;
    }
    let path = format!("/tmp/.X11-unix/X{n}");
    // The abstract socket is the one whose bind fails a second server.
    SocketAddr::from_abstract_name(path.as_bytes())
        .and_then(|a| UnixStream::connect_addr(&a))
        .is_ok()
        || UnixStream::connect(&path).is_ok()
}

/// Takes `/tmp/.berth-X{n}.lock` when no other agent holds it.
fn try_lock(n: u32) -> std::io::Result<Option<Flock<OwnedFd>>> {
    use nix::fcntl::{FlockArg, OFlag};
    use nix::sys::stat::Mode;
    // Read-only: another user's agent may have made the file (a flock needs no write).
    let fd = nix::fcntl::open(
        format!("/tmp/.berth-X{n}.lock").as_str(),
        OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )?;
    match Flock::lock(fd, FlockArg::LockExclusiveNonblock) {
        Ok(held) => Ok(Some(held)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e.into()),
    }
}

/// The first display from `DISPLAYS`, not in `skip`, that no X server and no other agent
/// holds.
pub fn claim(skip: &HashSet<u32>) -> std::io::Result<DisplayClaim> {
    for n in DISPLAYS {
        if skip.contains(&n) || x_in_use(n) {
            continue;
        }
        let Some(lock) = try_lock(n)? else { continue };
        // An X server may have come between the look and the lock.
        if x_in_use(n) {
            continue;
        }
        return Ok(DisplayClaim {
            number: n,
            _lock: lock,
        });
    }
    Err(std::io::Error::other(format!(
        "no free X display from :{} to :{}",
        DISPLAYS.start(),
        DISPLAYS.end()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_x_lock_file_is_live_only_when_it_names_a_live_process() {
        let alive = |pid| pid == 42;
        assert!(lock_is_live("        42\n", alive));
        assert!(!lock_is_live("        43\n", alive));
        assert!(!lock_is_live("", alive));
        assert!(!lock_is_live("junk", alive));
        assert!(!lock_is_live("-42", |_| true));
        assert!(!lock_is_live("0", |_| true));
    }

    #[test]
    fn two_claims_never_hold_one_display_and_a_released_one_is_free_again() {
        let a = claim(&HashSet::new()).unwrap();
        let b = claim(&HashSet::new()).unwrap();
        assert_ne!(a.number, b.number);
        let skipped = claim(&HashSet::from([a.number, b.number])).unwrap();
        assert!(![a.number, b.number].contains(&skipped.number));
        let n = a.number;
        drop(a);
        drop(skipped);
        // Released: the next claim may take it (others' claims aside, it is free).
        assert!(try_lock(n).unwrap().is_some());
    }
}
