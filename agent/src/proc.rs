//! Process-table helpers: identity that survives PID reuse, descendants, and tree kills.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22). Paired
/// with the pid it names one process for good: a recycled pid has another start time.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|s| s.start_time)
}

/// Whether the process `pid` that started at `start` is still alive (zombies count as gone).
pub fn is_alive(pid: u32, start: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    matches!(parse_stat(&stat), Some(s) if s.start_time == start && s.state != 'Z')
}

struct Stat {
    state: char,
    ppid: u32,
    pgrp: u32,
    start_time: u64,
}

fn parse_stat(stat: &str) -> Option<Stat> {
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Every live descendant of `root` (not `root` itself), found through the parent links in
/// `/proc`.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut out = trees(&table(), &[root], 0);
    out.retain(|&p| p != root);
    out
}

/// A live process as the process table shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub pid: u32,
    pub ppid: u32,
    /// `R`: running or waiting for a CPU.
    pub running: bool,
}

/// Every live process (zombies left out).
pub fn table() -> Vec<Entry> {
    live_processes()
        .map(|(pid, s)| Entry {
            pid,
            ppid: s.ppid,
            running: s.state == 'R',
        })
        .collect()
}

/// `roots` and every descendant of them in `table`, sorted; `except` and the processes only
/// it leads to are left out.
pub fn trees(table: &[Entry], roots: &[u32], except: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for p in table {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<u32> = roots.iter().copied().filter(|&p| p != except).collect();
    while let Some(pid) = stack.pop() {
        if !seen.insert(pid) {
            continue;
        }
        out.push(pid);
        if let Some(kids) = children.get(&pid) {
            stack.extend(kids.iter().copied().filter(|&k| k != except));
        }
    }
    out.sort_unstable();
    out
}

/// SIGKILLs every descendant of `root` until none is left (processes forked meanwhile are
/// caught by the next pass). `root` itself is spared. Returns whether the tree emptied within
/// `deadline`.
pub fn kill_descendants(root: u32, deadline: Duration) -> bool {
    let until = Instant::now() + deadline;
    loop {
        let pids = descendants(root);
        if pids.is_empty() {
            return true;
        }
        // Stop first so nothing forks between our reads and kills, then kill.
        for &p in &pids {
            let _ = kill(Pid::from_raw(p as i32), Signal::SIGSTOP);
        }
        for &p in &pids {
            let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
        }
        if Instant::now() >= until {
            return descendants(root).is_empty();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGKILLs every live member of process group `pgid` that started at or after `since` (clock
/// ticks since boot): what is left of a group whose leader is gone. The start-time bound keeps a
/// recycled pgid's unrelated processes out.
pub fn kill_group_since(pgid: u32, since: u64) -> usize {
    let own = nix::unistd::getpgrp().as_raw() as u32;
    if pgid <= 1 || pgid == own {
        return 0;
    }
    live_processes()
        .filter(|(_, s)| s.pgrp == pgid && s.start_time >= since)
        .filter(|(pid, _)| kill(Pid::from_raw(*pid as i32), Signal::SIGKILL).is_ok())
        .count()
}

/// Every process in `/proc` that is not a zombie, with its stat.
fn live_processes() -> impl Iterator<Item = (u32, Stat)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let s = parse_stat(&stat)?;
            (s.state != 'Z').then_some((pid, s))
        })
}

/// Sends `sig` to the process group `pgid`, ignoring a group that is already gone. Never
/// signals our own group (pgid 0 or ours).
pub fn signal_group(pgid: u32, sig: Signal) {
    let own = nix::unistd::getpgrp().as_raw() as u32;
    if pgid <= 1 || pgid == own {
        tracing::warn!(pgid, "refusing to signal process group {pgid}");
        return;
    }
    let _ = kill(Pid::from_raw(-(pgid as i32)), sig);
}

/// Makes this process the reaper of its orphaned descendants, so nothing it started can
/// escape to init.
pub fn become_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes a plain integer argument.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Parses a signal given as a name (`TERM`, `SIGTERM`, `term`) or a number.
pub fn parse_signal(value: &serde_json::Value) -> Option<Signal> {
    match value {
        serde_json::Value::Number(n) => Signal::try_from(n.as_i64()? as i32).ok(),
        serde_json::Value::String(s) => {
            let upper = s.trim().to_ascii_uppercase();
            if let Ok(n) = upper.parse::<i32>() {
                return Signal::try_from(n).ok();
            }
            let name = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            name.parse().ok()
        }
        _ => None,
    }
}

/// `KILL` for SIGKILL: the name without its prefix, as the API reports it.
pub fn signal_name(signo: i32) -> String {
    match Signal::try_from(signo) {
        Ok(s) => s.as_str().trim_start_matches("SIG").to_string(),
        Err(_) => signo.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_take_the_descendants_of_the_roots_and_leave_the_exception_out() {
        let p = |pid, ppid| Entry {
            pid,
            ppid,
            running: false,
        };
        // 1 (the agent) runs 10 (a browser, an X client) and 20 (a shell, not a client);
        // 10's children are renderers 11 and 12; 12 has 13.
        let table = [
            p(1, 0),
            p(10, 1),
            p(11, 10),
            p(12, 10),
            p(13, 12),
            p(20, 1),
            p(21, 20),
        ];
        assert_eq!(trees(&table, &[10], 1), vec![10, 11, 12, 13]);
        // The agent among the roots (its own connections) brings none of its children.
        assert_eq!(trees(&table, &[1, 10], 1), vec![10, 11, 12, 13]);
        // A loop in a stale table ends.
        let cyclic = [p(5, 6), p(6, 5)];
        assert_eq!(trees(&cyclic, &[5], 1), vec![5, 6]);
    }

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let line = "123 (a) b (c)) S 1 123 123 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 0 0";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!(s.ppid, 1);
        assert_eq!(s.start_time, 98765);
    }

    #[test]
    fn own_process_is_alive_and_has_a_start_time() {
        let me = std::process::id();
        let st = start_time(me).unwrap();
        assert!(is_alive(me, st));
        assert!(!is_alive(me, st + 1));
    }

    #[test]
    fn signals_parse_by_name_and_number() {
        use serde_json::json;
        assert_eq!(parse_signal(&json!("TERM")), Some(Signal::SIGTERM));
        assert_eq!(parse_signal(&json!("sigkill")), Some(Signal::SIGKILL));
        assert_eq!(parse_signal(&json!(2)), Some(Signal::SIGINT));
        assert_eq!(parse_signal(&json!("BOGUS")), None);
        assert_eq!(signal_name(9), "KILL");
    }
}
