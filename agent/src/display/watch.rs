//! Watching the screen change: DAMAGE on the root window (every redraw anywhere), on a
//! connection of its own served by one thread. (The cursor makes no damage; screenshots key
//! their cache on its position and XFixes serial instead.) It feeds
//! the screenshot cache (a generation number that moves on any change) and "settle" waits
//! (when the last change big enough to matter happened).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_protocol::sync::Locked;
use tokio::sync::watch;
use x11rb::connection::Connection;
use x11rb::protocol::Event;
use x11rb::protocol::damage::{ConnectionExt as _, ReportLevel};
use x11rb::protocol::xproto::{ChangeWindowAttributesAux, ConnectionExt as _, EventMask};

use super::conn::{Target, XConn};
use super::settle::{Sampler, SettleRule, Verdict, verdict};

/// Changes smaller than this share of the screen (summed over `WINDOW`) do not unsettle it:
/// a blinking caret or the panel clock must not keep the screen "busy".
const BIG_SHARE: f64 = 0.001;
const WINDOW: Duration = Duration::from_millis(50);

#[derive(Default)]
struct State {
    /// Moves on every change (and on every reconnect).
    generation: u64,
    last_big: Option<Instant>,
    recent: VecDeque<(Instant, u64)>,
    screen_area: u64,
    connected: bool,
}

pub struct ScreenWatch {
    state: Mutex<State>,
    conn: Mutex<Option<Arc<XConn>>>,
    changed: watch::Sender<u64>,
}

impl ScreenWatch {
    pub fn start(target: Target) -> Arc<ScreenWatch> {
        let w = Arc::new(ScreenWatch {
            state: Mutex::new(State::default()),
            conn: Mutex::new(None),
            changed: watch::channel(0).0,
        });
        let weak = Arc::downgrade(&w);
        let spawned = std::thread::Builder::new()
            .name("berth-screen-watch".into())
            .spawn(move || {
                let mut backoff = Duration::from_millis(100);
                loop {
                    let Some(w) = weak.upgrade() else { return };
                    match w.serve(&target) {
                        Ok(()) => backoff = Duration::from_millis(100),
                        Err(e) => {
                            tracing::debug!(error = %e, "screen watch lost the display; reconnecting");
                        }
                    }
                    w.disconnected();
                    drop(w);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the screen watch thread");
        }
        w
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Connects, subscribes, and handles events until the connection fails.
    fn serve(&self, target: &Target) -> Result<(), super::DisplayError> {
        let x = Arc::new(XConn::open(target)?);
        x.conn.damage_query_version(1, 1)?.reply()?;
        let damage = x.conn.generate_id()?;
        x.conn
            .damage_create(damage, x.root, ReportLevel::RAW_RECTANGLES)?
            .check()?;
        // The root's ConfigureNotify: a RandR resize moves the counter (no cached picture of
        // the old size is served) and the share of the screen a change must cover follows.
        x.conn
            .change_window_attributes(
                x.root,
                &ChangeWindowAttributesAux::new().event_mask(EventMask::STRUCTURE_NOTIFY),
            )?
            .check()?;
        let (w, h) = x.screen_size()?;
        {
            let mut s = self.state();
            s.screen_area = w as u64 * h as u64;
            s.connected = true;
            s.generation += 1;
        }
        self.bump();
        *self.conn.locked() = Some(x.clone());
        loop {
            let ev = x.conn.wait_for_event()?;
            self.handle(ev, x.root);
        }
    }

    fn disconnected(&self) {
        *self.conn.locked() = None;
        {
            let mut s = self.state();
            s.connected = false;
            s.generation += 1;
        }
        self.bump();
    }

    fn handle(&self, ev: Event, root: u32) {
        let now = Instant::now();
        match ev {
            Event::DamageNotify(d) => {
                let area = d.area.width as u64 * d.area.height as u64;
                let mut s = self.state();
                s.generation += 1;
                s.recent.push_back((now, area));
                while s.recent.front().is_some_and(|&(t, _)| now - t > WINDOW) {
                    s.recent.pop_front();
                }
                let sum: u64 = s.recent.iter().map(|&(_, a)| a).sum();
                if sum as f64 > s.screen_area as f64 * BIG_SHARE {
                    s.last_big = Some(now);
                }
            }
            Event::ConfigureNotify(c) if c.window == root => {
                let mut s = self.state();
                s.generation += 1;
                s.screen_area = c.width as u64 * c.height as u64;
            }
            Event::RandrScreenChangeNotify(_) => {
                self.state().generation += 1;
            }
            _ => return,
        }
        self.bump();
    }

    fn bump(&self) {
        let g = self.state().generation;
        self.changed.send_replace(g);
    }

    /// The change counter after every event the server generated before this call has been
    /// seen: a round trip on the watch connection, then the queue drained here.
    pub fn generation_now(&self) -> u64 {
        let conn = self.conn.locked().clone();
        if let Some(x) = conn
            && x.sync().is_ok()
        {
            while let Ok(Some(ev)) = x.conn.poll_for_event() {
                self.handle(ev, x.root);
            }
        }
        self.state().generation
    }

    /// Like `generation_now`, but only while DAMAGE is being watched: without it nothing
    /// moves the counter when the screen changes, so it says nothing about the pixels.
    pub fn watched_generation(&self) -> Option<u64> {
        let g = self.generation_now();
        let s = self.state();
        // A disconnect after the round trip also moves the counter, so `g` still keys a
        // picture that is current for as long as the counter stays at `g`.
        s.connected.then_some(g)
    }

    pub fn connected(&self) -> bool {
        self.state().connected
    }

    /// The process ids of the display's local clients (X-Resource), or `None` when the server
    /// cannot say.
    fn client_pids(&self) -> Option<Vec<u32>> {
        use x11rb::protocol::res::{ClientIdMask, ClientIdSpec, ConnectionExt as _};
        let x = self.conn.locked().clone()?;
        let spec = ClientIdSpec {
            client: 0,
            mask: ClientIdMask::LOCAL_CLIENT_PID,
        };
        let reply = x.conn.res_query_client_ids(&[spec]).ok()?.reply().ok()?;
        let mut pids: Vec<u32> = reply
            .ids
            .iter()
            .filter(|id| id.spec.mask == ClientIdMask::LOCAL_CLIENT_PID)
            .filter_map(|id| id.value.first().copied())
            .collect();
        pids.sort_unstable();
        pids.dedup();
        Some(pids)
    }

    /// Waits until the screen has settled after input that started at `since` (by `rule`, with
    /// `quiet` its long period), or until `timeout` after `since`. Returns how long it waited
    /// and whether it gave up.
    pub async fn settle(
        self: &Arc<Self>,
        rule: SettleRule,
        quiet: Duration,
        since: Instant,
        timeout: Duration,
    ) -> (Duration, bool) {
        let mut rx = self.changed.subscribe();
        let deadline = since + timeout;
        let mut sampler = None;
        if rule == SettleRule::Idle {
            let me = self.clone();
            sampler = tokio::task::spawn_blocking(move || me.client_pids().map(Sampler::start))
                .await
                .ok()
                .flatten();
        }
        loop {
            rx.borrow_and_update();
            // Pull in what the server already sent (and sample the programs) before judging.
            let me = self.clone();
            let taken = sampler.take();
            sampler = tokio::task::spawn_blocking(move || {
                me.generation_now();
                taken.map(|mut s: Sampler| {
                    s.sample();
                    s
                })
            })
            .await
            .ok()
            .flatten();
            let last_big = self.state().last_big;
            let now = Instant::now();
            let activity = sampler.as_ref().map(Sampler::activity);
            match verdict(rule, quiet, now, since, last_big, activity, deadline) {
                Verdict::Settled => return (now - since, false),
                Verdict::TimedOut => return (now - since, true),
                Verdict::WaitUntil(wake) => {
                    let _ = tokio::time::timeout_at(wake.into(), rx.changed()).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_connected_watch_there_is_no_generation_to_cache_on() {
        let w = ScreenWatch::start(Target::new(":9999", None));
        assert!(!w.connected());
        assert_eq!(w.watched_generation(), None);
        // Moving the counter (as a failed reconnect does) does not make it usable.
        w.disconnected();
        assert_eq!(w.watched_generation(), None);
    }
}
