//! Watches the sandbox's own cgroup for its limits being reached, on any provider (a Docker
//! container's cgroup, a Pod's, the cgroup the process provider fences an agent in): a fork or
//! a thread refused at the process limit is `sandbox.pids_limit` (first at once, then at most
//! every [`PIDS_EVERY`] while it goes on); a process the kernel killed for memory is
//! `sandbox.oom_kill`, on which the controller fails the sandbox with reason `oom_killed`.
//! Counts before the agent started are its baseline, not news.
//!
//! The watch reads two small files on a timer in an existing task: it needs no new thread or
//! process, so it keeps reporting while a fork bomb holds every pid the sandbox has.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_protocol::EventKind;
use berth_protocol::cgroup::{counter, limit, own_dir};
use serde_json::json;

use crate::events::EventLog;

/// How often the counters are read.
const EVERY: Duration = Duration::from_millis(500);
/// While processes keep hitting the limit, one event per this long at most.
pub const PIDS_EVERY: Duration = Duration::from_secs(10);

/// The files the watch reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    /// `pids.events` and the directory holding `pids.max` and `pids.current`.
    pub pids: Option<PathBuf>,
    /// The memory controller's directory, and whether it is cgroup v2.
    pub memory: Option<(PathBuf, bool)>,
}

impl Files {
    /// The agent's own cgroup files, v1 or v2.
    pub fn find() -> Files {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let (cgroup, mountinfo) = (read("/proc/self/cgroup"), read("/proc/self/mountinfo"));
        let dir = |c: &str| own_dir(&cgroup, &mountinfo, c);
        let v2 = dir("");
        let has = |d: &Option<PathBuf>, f: &str| d.as_ref().is_some_and(|d| d.join(f).exists());
        let pids = [dir("pids"), v2.clone()]
            .into_iter()
            .find(|d| has(d, "pids.events"))
            .flatten();
        let v1_memory = dir("memory").filter(|d| d.join("memory.oom_control").exists());
        let memory = match v1_memory {
            Some(d) => Some((d, false)),
            None => v2
                .filter(|d| d.join("memory.events").exists())
                .map(|d| (d, true)),
        };
        Files { pids, memory }
    }

    fn pids_hits(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.pids.as_ref()?.join("pids.events")).ok()?;
        counter(&text, "max")
    }

    fn oom_kills(&self) -> Option<u64> {
        let (dir, v2) = self.memory.as_ref()?;
        let file = if *v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        counter(&std::fs::read_to_string(dir.join(file)).ok()?, "oom_kill")
    }

    fn read_limit(dir: Option<&Path>, file: &str) -> Option<u64> {
        limit(&std::fs::read_to_string(dir?.join(file)).ok()?)
    }
}

/// What the watch has told so far, and what to tell next: a pure step over the counters read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Watch {
    pids_base: Option<u64>,
    pids_told: u64,
    pids_told_at: Option<Instant>,
    oom_base: Option<u64>,
    oom_told: u64,
}

/// What one reading calls for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct News {
    /// Process-limit hits since the agent started, to report now.
    pub pids_hits: Option<u64>,
    /// Processes killed for memory since the agent started, to report now.
    pub oom_kills: Option<u64>,
}

impl Watch {
    /// Takes a reading (`None`: a file could not be read) at `now`.
    pub fn step(&mut self, pids: Option<u64>, oom: Option<u64>, now: Instant) -> News {
        let mut news = News::default();
        if let Some(p) = pids {
            let base = *self.pids_base.get_or_insert(p);
            let hits = p.saturating_sub(base);
            let due = self
                .pids_told_at
                .is_none_or(|at| now.duration_since(at) >= PIDS_EVERY);
            if hits > self.pids_told && due {
                self.pids_told = hits;
                self.pids_told_at = Some(now);
                news.pids_hits = Some(hits);
            }
        }
        if let Some(o) = oom {
            let base = *self.oom_base.get_or_insert(o);
            let kills = o.saturating_sub(base);
            if kills > self.oom_told {
                self.oom_told = kills;
                news.oom_kills = Some(kills);
            }
        }
        news
    }
}

/// The agent's cgroup files, found once.
pub fn files() -> &'static Files {
    static FILES: std::sync::OnceLock<Files> = std::sync::OnceLock::new();
    FILES.get_or_init(Files::find)
}

/// How many times a fork or thread has been refused at the process limit (`None`: unknown).
pub fn pids_hits() -> Option<u64> {
    files().pids_hits()
}

/// The sandbox's process limit, when it has one.
pub fn pids_max() -> Option<u64> {
    Files::read_limit(files().pids.as_deref(), "pids.max")
}

/// Starts the watch for as long as the agent runs; nothing when no counter can be read.
pub fn spawn_watch(events: Arc<EventLog>) {
    let files = files().clone();
    if files.pids.is_none() && files.memory.is_none() {
        tracing::info!("no cgroup counters readable: limits reached are not reported");
        return;
    }
    tracing::info!(?files, "watching the sandbox's limits");
    tokio::spawn(async move {
        let mut watch = Watch::default();
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let news = watch.step(files.pids_hits(), files.oom_kills(), Instant::now());
            tell(&events, &files, &news);
        }
    });
}

fn tell(events: &EventLog, files: &Files, news: &News) {
    if let Some(hits) = news.pids_hits {
        let dir = files.pids.as_deref();
        let (max, current) = (
            Files::read_limit(dir, "pids.max"),
            Files::read_limit(dir, "pids.current"),
        );
        tracing::warn!(
            hits,
            ?max,
            ?current,
            "processes reached the sandbox's limit"
        );
        events.emit(
            EventKind::SandboxPidsLimit,
            json!({"reason": "pids_limit", "limit": max, "current": current, "hits": hits}),
        );
    }
    if let Some(kills) = news.oom_kills {
        let limit = files.memory.as_ref().and_then(|(dir, v2)| {
            let file = if *v2 {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            };
            Files::read_limit(Some(dir), file)
        });
        tracing::warn!(kills, ?limit, "the kernel killed a process for memory");
        events.emit(
            EventKind::SandboxOomKill,
            json!({"reason": "oom_killed", "oom_kills": kills, "limit_bytes": limit}),
        );
    }
}

/// `prctl(PR_SET_MEMORY_MERGE, 1)`: this process's memory, and that of every process it starts
/// from now on (the flag is inherited across fork and exec), may be merged by KSM.
pub fn ask_memory_merge() {
    const PR_SET_MEMORY_MERGE: libc::c_int = 67;
    // SAFETY: a prctl with integer arguments only.
    let r = unsafe { libc::prctl(PR_SET_MEMORY_MERGE, 1 as libc::c_ulong, 0, 0, 0) };
    let ksm = std::fs::read_to_string("/sys/kernel/mm/ksm/run").unwrap_or_default();
    match r {
        0 => tracing::info!(
            ksm_run = ksm.trim(),
            "memory may be merged with identical pages"
        ),
        _ => tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "the kernel refused to merge this sandbox's memory (PR_SET_MEMORY_MERGE, Linux 6.4+)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_before_the_start_are_the_baseline_and_pids_news_is_spaced() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        assert_eq!(w.step(Some(7), Some(2), t0), News::default());
        let n = w.step(Some(10), Some(2), t0 + Duration::from_millis(500));
        assert_eq!(n.pids_hits, Some(3));
        assert_eq!(n.oom_kills, None);
        // Still hitting, within the spacing: nothing; past it: the total.
        assert_eq!(
            w.step(Some(500), None, t0 + Duration::from_secs(5))
                .pids_hits,
            None
        );
        let later = w.step(Some(900), None, t0 + Duration::from_secs(11));
        assert_eq!(later.pids_hits, Some(893));
        // No new hits: nothing, however long it has been.
        assert_eq!(
            w.step(Some(900), None, t0 + Duration::from_secs(60))
                .pids_hits,
            None
        );
    }

    #[test]
    fn every_new_oom_kill_is_news_at_once() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        w.step(None, Some(0), t0);
        assert_eq!(w.step(None, Some(1), t0).oom_kills, Some(1));
        assert_eq!(w.step(None, Some(1), t0).oom_kills, None);
        assert_eq!(w.step(None, Some(3), t0).oom_kills, Some(3));
    }
}
