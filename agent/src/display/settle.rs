//! When the screen has settled after input: the rule, as a pure decision over what the screen
//! watch saw (the last big change) and what the display's programs did (their CPU time).
//!
//! - `quiet`: settled once no big change has happened for 150 ms since the input.
//! - `idle` (the default): settled once no big change has happened for 40 ms **and** the
//!   programs connected to the display (and their children: a browser's renderers) have been
//!   idle for 40 ms — nothing is still computing toward the next frame; or, whatever they do,
//!   after `quiet`'s 150 ms. A program busy without drawing (a renderer laying out a page, an
//!   application opening a dialog) keeps the short path closed, so the answer comes no earlier
//!   than `quiet`'s would.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How a turn decides that the screen has settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SettleRule {
    /// 150 ms without a big change.
    Quiet,
    /// 40 ms without a big change while the display's programs are idle; else 150 ms.
    #[default]
    Idle,
}

/// `quiet`'s period, and the `idle` rule's fallback.
pub const QUIET: Duration = Duration::from_millis(150);
/// How long both the screen and the display's programs must be still for `idle`.
pub const SHORT: Duration = Duration::from_millis(40);
/// How often the display's programs are sampled while a settle waits.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// A sample counts as busy when the programs used more than this share of one CPU in it, or
/// when one of them was running at its end.
const BUSY_SHARE: f64 = 0.10;

/// What the display's programs did, as seen by sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    /// When sampling began: nothing is known of the time before.
    pub watched_from: Instant,
    /// The end of the last busy sample, if any.
    pub last_busy: Option<Instant>,
}

impl Activity {
    /// Since when the programs are known to have been idle.
    fn idle_since(&self) -> Instant {
        self.last_busy
            .map_or(self.watched_from, |b| b.max(self.watched_from))
    }
}

/// What a settle wait should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Settled,
    /// Look again at this instant (or at the next change, whichever comes first).
    WaitUntil(Instant),
    TimedOut,
}

/// The decision: `quiet` is the rule's long period (`QUIET` unless a request names its own),
/// `since` the input's start, `last_big` the last big change seen (any time), `activity` what
/// sampling saw (`None`: the programs cannot be watched, and `idle` acts as `quiet`).
pub fn verdict(
    rule: SettleRule,
    quiet: Duration,
    now: Instant,
    since: Instant,
    last_big: Option<Instant>,
    activity: Option<Activity>,
    deadline: Instant,
) -> Verdict {
    let last_change = last_big.filter(|&t| t > since).unwrap_or(since);
    let quiet_at = last_change + quiet;
    let mut at = quiet_at;
    if rule == SettleRule::Idle
        && let Some(a) = activity
    {
        let short_at = (last_change + SHORT).max(a.idle_since() + SHORT);
        at = at.min(short_at);
    }
    if now >= at {
        Verdict::Settled
    } else if now >= deadline {
        Verdict::TimedOut
    } else {
        // While sampling, look again at the next sample even if nothing changes on screen.
        let next = if rule == SettleRule::Idle && activity.is_some() {
            at.min(now + SAMPLE_EVERY)
        } else {
            at
        };
        Verdict::WaitUntil(next.min(deadline))
    }
}

/// Whether a sample of `cpu` used over `span`, ending with `running` programs, is busy.
pub fn busy(cpu: Duration, span: Duration, running: bool) -> bool {
    running || cpu.as_secs_f64() > span.as_secs_f64() * BUSY_SHARE
}

/// Samples the CPU time of the display's programs from `/proc` (the main thread of each: where
/// X programs draw, and a renderer lays out and paints).
pub struct Sampler {
    roots: Vec<u32>,
    except: u32,
    /// Each watched process's CPU time at the last sample.
    last: HashMap<u32, u64>,
    at: Instant,
    activity: Activity,
}

impl Sampler {
    /// Starts sampling the trees of `roots` (the display's client processes).
    pub fn start(roots: Vec<u32>) -> Sampler {
        let now = Instant::now();
        let mut s = Sampler {
            roots,
            except: std::process::id(),
            last: HashMap::new(),
            at: now,
            activity: Activity {
                watched_from: now,
                last_busy: None,
            },
        };
        s.read();
        s.at = Instant::now();
        s.activity.watched_from = s.at;
        s
    }

    pub fn activity(&self) -> Activity {
        self.activity
    }

    /// Takes a sample: the CPU the trees used since the last one, and whether any of them is
    /// running now. A process first seen counts all its time (it started since).
    pub fn sample(&mut self) {
        let (cpu, running) = self.read();
        let now = Instant::now();
        if busy(cpu, now - self.at, running) {
            self.activity.last_busy = Some(now);
        }
        self.at = now;
    }

    fn read(&mut self) -> (Duration, bool) {
        let table = crate::proc::table();
        let watched = crate::proc::trees(&table, &self.roots, self.except);
        let running = table
            .iter()
            .any(|p| p.running && watched.binary_search(&p.pid).is_ok());
        let mut used = 0u64;
        let mut now = HashMap::with_capacity(watched.len());
        for pid in watched {
            let Some(ns) = cpu_ns(pid) else { continue };
            used += ns.saturating_sub(self.last.get(&pid).copied().unwrap_or(0));
            now.insert(pid, ns);
        }
        self.last = now;
        (Duration::from_nanos(used), running)
    }
}

/// A process's main-thread CPU time (`/proc/<pid>/schedstat`'s first field, in ns).
fn cpu_ns(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    #[test]
    fn quiet_waits_150_ms_after_the_last_big_change() {
        let t0 = Instant::now();
        let deadline = ms(t0, 2000);
        let v = |now, last| {
            verdict(
                SettleRule::Quiet,
                QUIET,
                ms(t0, now),
                t0,
                last,
                None,
                deadline,
            )
        };
        assert_eq!(v(100, None), Verdict::WaitUntil(ms(t0, 150)));
        assert_eq!(v(150, None), Verdict::Settled);
        assert_eq!(v(150, Some(ms(t0, 30))), Verdict::WaitUntil(ms(t0, 180)));
        // A change before the input does not count.
        let before = t0 - Duration::from_millis(10);
        assert_eq!(v(150, Some(before)), Verdict::Settled);
        // An idle desktop does not shorten `quiet`.
        let idle = Activity {
            watched_from: t0,
            last_busy: None,
        };
        assert_eq!(
            verdict(
                SettleRule::Quiet,
                QUIET,
                ms(t0, 60),
                t0,
                None,
                Some(idle),
                deadline
            ),
            Verdict::WaitUntil(ms(t0, 150))
        );
    }

    #[test]
    fn idle_answers_40_ms_after_both_the_screen_and_the_programs_are_still() {
        let t0 = Instant::now();
        let deadline = ms(t0, 2000);
        let act = |from, busy: Option<u64>| Activity {
            watched_from: ms(t0, from),
            last_busy: busy.map(|b| ms(t0, b)),
        };
        let v = |now, last: Option<u64>, a| {
            verdict(
                SettleRule::Idle,
                QUIET,
                ms(t0, now),
                t0,
                last.map(|l| ms(t0, l)),
                a,
                deadline,
            )
        };
        // Idle since sampling began at 5 ms, the window drawn at 30 ms: settled at 70 ms.
        assert_eq!(
            v(69, Some(30), Some(act(5, None))),
            Verdict::WaitUntil(ms(t0, 70))
        );
        assert_eq!(v(70, Some(30), Some(act(5, None))), Verdict::Settled);
        // Busy until 90 ms: not before 130 ms, however still the screen.
        assert_eq!(
            v(100, Some(30), Some(act(5, Some(90)))),
            Verdict::WaitUntil(ms(t0, 110))
        );
        assert_eq!(v(130, Some(30), Some(act(5, Some(90)))), Verdict::Settled);
        // Busy all along: `quiet`'s 150 ms after the last change is the answer.
        assert_eq!(
            v(170, Some(30), Some(act(5, Some(170)))),
            Verdict::WaitUntil(ms(t0, 180))
        );
        assert_eq!(v(180, Some(30), Some(act(5, Some(180)))), Verdict::Settled);
        // Nothing known of the programs before sampling began.
        assert_eq!(
            v(40, None, Some(act(20, None))),
            Verdict::WaitUntil(ms(t0, 50))
        );
        assert_eq!(v(60, None, Some(act(20, None))), Verdict::Settled);
        // Programs that cannot be watched: as `quiet`.
        assert_eq!(v(100, None, None), Verdict::WaitUntil(ms(t0, 150)));
    }

    #[test]
    fn the_deadline_ends_the_wait() {
        let t0 = Instant::now();
        let busy = Activity {
            watched_from: t0,
            last_busy: Some(ms(t0, 1000)),
        };
        let v = verdict(
            SettleRule::Idle,
            QUIET,
            ms(t0, 1000),
            t0,
            Some(ms(t0, 990)),
            Some(busy),
            ms(t0, 1000),
        );
        assert_eq!(v, Verdict::TimedOut);
    }

    #[test]
    fn a_sample_is_busy_over_a_tenth_of_a_cpu_or_with_a_program_running() {
        let span = Duration::from_millis(10);
        assert!(!busy(Duration::from_micros(900), span, false));
        assert!(busy(Duration::from_micros(1100), span, false));
        assert!(busy(Duration::ZERO, span, true));
    }
}
