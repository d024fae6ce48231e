//! One encoder and its consumers: a thread that, on every tick of its frame rate, asks the
//! shared capture for the screen, converts and encodes it only when it changed, and hands the
//! picture to every sink (recording files, live streams) that uses the same settings.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use berth_protocol::sync::Locked;
use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::h264::{Encoded, H264, I420};
use super::mp4::TrackInfo;
use super::source::FrameSource;
use crate::display::capture::Frame;

/// A still screen is re-sent this often (a P picture of a few hundred bytes), so a file's
/// end never lags the wall clock by much more than this, even if the agent is killed.
pub const REFRESH: Duration = Duration::from_secs(1);

/// Forced keyframes for consumers that fell behind come at most this often.
const RESYNC_GAP: Duration = Duration::from_secs(1);

/// Consecutive pictures that may fail to encode before the consumers are told.
const MAX_ENCODE_ERRORS: u32 = 10;

/// How long the first capture may keep failing before the consumers are told.
const FIRST_FRAME_PATIENCE: Duration = Duration::from_secs(5);

/// What an encoder is set up for; consumers with equal settings share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub width: u32,
    pub height: u32,
    pub fps: u32,
    pub bitrate_kbps: u32,
    pub keyframe_interval_ms: u32,
    pub cursor: bool,
}

/// An encoded picture as consumers see it.
pub struct Picture<'a> {
    /// Length-prefixed NAL units.
    pub data: &'a [u8],
    pub sync: bool,
    /// When the screen looked like this.
    pub at: Instant,
    pub track: &'a TrackInfo,
}

/// What happened on one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    Encoded,
    /// Nothing changed: the previous picture lasts longer.
    Skipped,
    /// This many ticks were missed because the loop fell behind.
    Dropped(u64),
}

pub enum Verdict {
    Keep,
    /// Keep, and send a keyframe soon (the consumer lost pictures).
    Resync,
    /// Remove this consumer.
    Done,
}

pub trait Sink: Send + Sync {
    fn push(&self, picture: &Picture<'_>) -> Verdict;
    fn tick(&self, now: Instant, tick: Tick) -> Verdict;
    /// The pipeline cannot go on (no encoder, no screen).
    fn fail(&self, error: &str);
}

struct Ctl {
    sinks: Vec<Arc<dyn Sink>>,
    want_keyframe: bool,
    /// Someone waits in `catch_up`.
    want_tick: bool,
    /// Ticks begun and finished.
    begun: u64,
    finished: u64,
    /// The thread has left (no consumers): add to a new pipeline instead.
    closed: bool,
}

pub struct Pipeline {
    pub settings: Settings,
    ctl: Mutex<Ctl>,
    wake: Condvar,
    caught_up: Condvar,
    stop: AtomicBool,
}

/// The encoding thread's own state between ticks.
struct Loop {
    interval: Duration,
    keyframe_every: Duration,
    encoder: H264,
    picture: I420,
    fit: Fit,
    have_picture: bool,
    last_frame: Option<u64>,
    last_at: Instant,
    last_encode: Instant,
    last_keyframe: Option<Instant>,
    last_resync: Instant,
    capture_failing_since: Option<Instant>,
    encode_errors: u32,
    next: Instant,
}

impl Pipeline {
    /// Starts the encoding thread with its first consumer.
    pub fn start(
        settings: Settings,
        source: Arc<FrameSource>,
        first: Arc<dyn Sink>,
    ) -> std::io::Result<Arc<Pipeline>> {
        let p = Arc::new(Pipeline {
            settings,
            ctl: Mutex::new(Ctl {
                sinks: vec![first],
                want_keyframe: true,
                want_tick: false,
                begun: 0,
                finished: 0,
                closed: false,
            }),
            wake: Condvar::new(),
            caught_up: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let me = p.clone();
        std::thread::Builder::new()
            .name("berth-record".into())
            .spawn(move || me.run(&source))?;
        Ok(p)
    }

    fn ctl(&self) -> std::sync::MutexGuard<'_, Ctl> {
        self.ctl.locked()
    }

    /// Adds a consumer; it gets a keyframe at once. False when the pipeline already ended.
    pub fn add(&self, sink: Arc<dyn Sink>) -> bool {
        let mut ctl = self.ctl();
        if ctl.closed {
            return false;
        }
        ctl.sinks.push(sink);
        ctl.want_keyframe = true;
        self.wake.notify_all();
        true
    }

    pub fn is_closed(&self) -> bool {
        self.ctl().closed
    }

    /// Ends the thread after its current tick (consumers are finished by their owners).
    pub fn shut(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify_all();
    }

    /// Has the thread take one more look at the screen now and waits (up to `timeout`) until
    /// that picture reached the consumers: a recording that stops right after a change ends
    /// with that change.
    pub fn catch_up(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut ctl = self.ctl();
        let target = ctl.begun + 1;
        ctl.want_tick = true;
        self.wake.notify_all();
        while !ctl.closed && ctl.finished < target {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            ctl =
                berth_protocol::sync::unpoisoned(self.caught_up.wait_timeout(ctl, deadline - now))
                    .0;
        }
    }

    fn run(self: Arc<Self>, source: &FrameSource) {
        let s = self.settings;
        let encoder = match H264::new(s.width, s.height, s.fps, s.bitrate_kbps) {
            Ok(e) => e,
            Err(e) => {
                self.fail_all(&e);
                return;
            }
        };
        let mut st = Loop {
            interval: Duration::from_secs_f64(1.0 / s.fps as f64),
            keyframe_every: Duration::from_millis(s.keyframe_interval_ms as u64),
            encoder,
            picture: I420::new(s.width as usize, s.height as usize),
            fit: Fit::default(),
            have_picture: false,
            last_frame: None,
            last_at: Instant::now(),
            last_encode: Instant::now(),
            last_keyframe: None,
            last_resync: Instant::now() - RESYNC_GAP,
            capture_failing_since: None,
            encode_errors: 0,
            next: Instant::now(),
        };
        loop {
            // Sleep until the tick, or until a consumer joins (and wants a keyframe) or asks
            // for a look at the screen now.
            let (want_keyframe, seq) = {
                let mut ctl = self.ctl();
                loop {
                    if ctl.sinks.is_empty() || self.stop.load(Ordering::SeqCst) {
                        ctl.closed = true;
                        self.caught_up.notify_all();
                        return;
                    }
                    let now = Instant::now();
                    if ctl.want_keyframe || ctl.want_tick || now >= st.next {
                        break;
                    }
                    ctl = berth_protocol::sync::unpoisoned(
                        self.wake.wait_timeout(ctl, st.next - now),
                    )
                    .0;
                }
                ctl.want_tick = false;
                ctl.begun += 1;
                (std::mem::take(&mut ctl.want_keyframe), ctl.begun)
            };
            let go_on = self.step(&mut st, source, want_keyframe);
            let mut ctl = self.ctl();
            ctl.finished = seq;
            self.caught_up.notify_all();
            if !go_on {
                ctl.closed = true;
                return;
            }
        }
    }

    /// One tick: look at the screen, encode if it changed (or a keyframe or refresh is due),
    /// hand the picture over. False when the pipeline cannot go on.
    fn step(&self, st: &mut Loop, source: &FrameSource, want_keyframe: bool) -> bool {
        let s = self.settings;
        let now = Instant::now();
        self.advance_schedule(st, now);
        let changed = match self.look(st, source, s.cursor, now) {
            ControlFlow::Continue(changed) => changed,
            ControlFlow::Break(()) => return false,
        };
        let refresh_due = now - st.last_encode >= REFRESH;
        if !st.have_picture || !(changed || want_keyframe || refresh_due) {
            self.tick_all(now, Tick::Skipped);
            return true;
        }
        if !changed {
            st.last_at = now.max(st.last_at + Duration::from_micros(100));
        }
        let keyframe = want_keyframe
            || st.encode_errors > 0
            || st
                .last_keyframe
                .is_none_or(|k| changed && now - k >= st.keyframe_every);
        match st.encoder.encode(&st.picture, keyframe) {
            Ok(Some(enc)) => return self.hand_over(st, &enc, now),
            Ok(None) => self.tick_all(now, Tick::Skipped),
            Err(e) => {
                // One bad picture is skipped (the next is a keyframe); a run of them ends it.
                st.encode_errors += 1;
                tracing::warn!(error = %e, errors = st.encode_errors, "recording: a picture failed to encode");
                if st.encode_errors >= MAX_ENCODE_ERRORS {
                    self.fail_all(&e);
                    return false;
                }
                self.tick_all(now, Tick::Dropped(1));
            }
        }
        true
    }

    /// Moves the next tick past `now`, telling the consumers about the ticks missed.
    fn advance_schedule(&self, st: &mut Loop, now: Instant) {
        if now >= st.next {
            let behind = now - st.next;
            let dropped = (behind.as_nanos() / st.interval.as_nanos()) as u64;
            st.next += st.interval * (dropped as u32 + 1);
            if dropped > 0 {
                self.tick_all(now, Tick::Dropped(dropped));
            }
        }
    }

    /// Takes the screen's latest frame into the picture when it is new: whether it changed,
    /// or `Break` when capture kept failing before there was a first picture (the consumers
    /// were told).
    fn look(
        &self,
        st: &mut Loop,
        source: &FrameSource,
        cursor: bool,
        now: Instant,
    ) -> ControlFlow<(), bool> {
        let mut changed = false;
        match source.latest(cursor) {
            Ok(c) => {
                st.capture_failing_since = None;
                if st.last_frame != Some(c.id) {
                    st.fit.convert(&c.frame, &mut st.picture);
                    st.have_picture = true;
                    changed = true;
                    st.last_frame = Some(c.id);
                    // Strictly increasing times, even for a frame another pipeline captured
                    // a moment before this one's last refresh.
                    st.last_at = c.at.max(st.last_at + Duration::from_micros(100));
                }
            }
            Err(e) => {
                let since = *st.capture_failing_since.get_or_insert(now);
                if since == now {
                    tracing::warn!(error = %e, "recording: cannot capture the screen");
                }
                if !st.have_picture && now - since > FIRST_FRAME_PATIENCE {
                    self.fail_all(&format!("cannot capture the screen: {e}"));
                    return ControlFlow::Break(());
                }
            }
        }
        ControlFlow::Continue(changed)
    }

    /// Hands an encoded picture to the consumers, asking for a keyframe (at most every
    /// [`RESYNC_GAP`]) when one fell behind. False when the encoder gave no parameter sets.
    fn hand_over(&self, st: &mut Loop, enc: &Encoded, now: Instant) -> bool {
        st.encode_errors = 0;
        st.last_encode = now;
        if enc.sync {
            st.last_keyframe = Some(now);
        }
        let Some(track) = st.encoder.track().cloned() else {
            self.fail_all("the encoder produced no parameter sets");
            return false;
        };
        let pic = Picture {
            data: &enc.avcc,
            sync: enc.sync,
            at: st.last_at,
            track: &track,
        };
        let resync = self.deliver(&pic);
        if resync && now - st.last_resync >= RESYNC_GAP {
            st.last_resync = now;
            self.ctl().want_keyframe = true;
        }
        self.tick_all(now, Tick::Encoded);
        true
    }

    /// Hands a picture to every consumer; returns whether one asked for a keyframe.
    fn deliver(&self, pic: &Picture<'_>) -> bool {
        let sinks = self.ctl().sinks.clone();
        let mut resync = false;
        let mut done = Vec::new();
        for (i, sink) in sinks.iter().enumerate() {
            match sink.push(pic) {
                Verdict::Keep => {}
                Verdict::Resync => resync = true,
                Verdict::Done => done.push(i),
            }
        }
        self.remove(&sinks, &done);
        resync
    }

    fn tick_all(&self, now: Instant, tick: Tick) {
        let sinks = self.ctl().sinks.clone();
        let done: Vec<usize> = sinks
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s.tick(now, tick), Verdict::Done))
            .map(|(i, _)| i)
            .collect();
        self.remove(&sinks, &done);
    }

    fn remove(&self, seen: &[Arc<dyn Sink>], done: &[usize]) {
        if done.is_empty() {
            return;
        }
        let mut ctl = self.ctl();
        ctl.sinks
            .retain(|s| !done.iter().any(|&i| Arc::ptr_eq(s, &seen[i])));
    }

    fn fail_all(&self, error: &str) {
        tracing::warn!(error, "recording pipeline failed");
        let sinks = {
            let mut ctl = self.ctl();
            ctl.closed = true;
            std::mem::take(&mut ctl.sinks)
        };
        for s in sinks {
            s.fail(error);
        }
    }
}

/// Where a `from`-sized screen lands in a `to`-sized picture with its aspect kept: the
/// box's width, height and top-left corner (centred; bars of a pixel or less are not drawn).
pub fn letterbox(from: (usize, usize), to: (usize, usize)) -> (usize, usize, usize, usize) {
    let (fw, fh) = (from.0.max(1) as f64, from.1.max(1) as f64);
    let scale = (to.0 as f64 / fw).min(to.1 as f64 / fh);
    let mut w = ((fw * scale).round() as usize).clamp(1, to.0);
    let mut h = ((fh * scale).round() as usize).clamp(1, to.1);
    if to.0 - w <= 1 {
        w = to.0;
    }
    if to.1 - h <= 1 {
        h = to.1;
    }
    // Even offsets keep the bars' edges on the chroma grid.
    (w, h, ((to.0 - w) / 2) & !1, ((to.1 - h) / 2) & !1)
}

/// Brings captured frames to the encoder's size: a frame one pixel wider or taller than an
/// even size is cropped in place (no copy); any other size is scaled.
///
/// A screen resized during a recording (`PUT /v1/display`) is *scaled*, not restarted: the
/// file keeps the dimensions it started with (one track, one set of parameter sets, so it
/// stays one valid MP4), and each frame of the new size is scaled into it with its aspect
/// kept, black bars where the aspects differ.
#[derive(Default)]
struct Fit {
    resizer: Option<Resizer>,
    /// The picture-sized frame handed to the converter.
    scaled: Vec<u8>,
    /// The scaled screen before it is placed in `scaled` (when bars surround it).
    boxed: Vec<u8>,
    /// The box `scaled`'s bars were last drawn around.
    layout: Option<(usize, usize, usize, usize)>,
}

impl Fit {
    fn convert(&mut self, frame: &Frame, picture: &mut I420) {
        let (w, h) = picture.dimensions();
        let (fw, fh) = (frame.width as usize, frame.height as usize);
        if (fw == w || fw == w + 1) && (fh == h || fh == h + 1) {
            picture.fill_from_bgrx(&frame.bgrx, fw);
            return;
        }
        let layout = letterbox((fw, fh), (w, h));
        let (bw, bh, ox, oy) = layout;
        let full = bw == w && bh == h;
        if self.layout != Some(layout) {
            // Black bars (BGRX zero) once per layout; the box is redrawn every frame.
            self.scaled.clear();
            self.scaled.resize(w * h * 4, 0);
            self.layout = Some(layout);
        }
        let resizer = self.resizer.get_or_insert_with(Resizer::new);
        let dst_buf = if full {
            &mut self.scaled
        } else {
            self.boxed.resize(bw * bh * 4, 0);
            &mut self.boxed
        };
        let ok = ImageRef::new(frame.width, frame.height, &frame.bgrx, PixelType::U8x4)
            .ok()
            .zip(Image::from_slice_u8(bw as u32, bh as u32, dst_buf, PixelType::U8x4).ok())
            .map(|(src, mut dst)| {
                // The fourth byte is padding, not alpha. A bilinear kernel widened to the
                // scale factor: proper area averaging when shrinking, and cheap.
                let opts = ResizeOptions::new()
                    .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
                    .use_alpha(false);
                resizer.resize(&src, &mut dst, &opts).is_ok()
            })
            .unwrap_or(false);
        if !ok {
            return;
        }
        if !full {
            for row in 0..bh {
                let from = &self.boxed[row * bw * 4..(row + 1) * bw * 4];
                let at = ((oy + row) * w + ox) * 4;
                self.scaled[at..at + bw * 4].copy_from_slice(from);
            }
        }
        picture.fill_from_bgrx(&self.scaled, w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resized_screen_keeps_its_aspect_in_the_file() {
        // The same aspect fills the picture (a scaled recording, or a resize back).
        assert_eq!(letterbox((1920, 1080), (960, 540)), (960, 540, 0, 0));
        assert_eq!(letterbox((1920, 1080), (1920, 1080)), (1920, 1080, 0, 0));
        // 16:10 into 16:9: bars left and right.
        assert_eq!(letterbox((1280, 800), (1920, 1080)), (1728, 1080, 96, 0));
        // 4:3 into 16:10 and a tall screen into a wide file.
        assert_eq!(letterbox((1024, 768), (1280, 800)), (1067, 800, 106, 0));
        assert_eq!(letterbox((800, 1200), (1920, 1080)), (720, 1080, 600, 0));
        // Wider: bars top and bottom.
        assert_eq!(letterbox((1920, 1080), (1280, 800)), (1280, 720, 0, 40));
        // A rounding pixel is no bar.
        assert_eq!(letterbox((1366, 768), (1920, 1080)), (1920, 1080, 0, 0));
        for (from, to) in [((333, 201), (640, 480)), ((7680, 4320), (320, 200))] {
            let (w, h, x, y) = letterbox(from, to);
            assert!(x + w <= to.0 && y + h <= to.1, "{from:?} -> {to:?}");
        }
    }
}
