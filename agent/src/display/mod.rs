//! The display domain: seeing and driving the X screen in-process. Screenshots through
//! MIT-SHM with the real cursor and a damage-aware cache, XTEST input, EWMH windows, the
//! clipboard, and waiting for the screen to settle after an action.
//!
//! X calls block; callers run them on blocking threads. Capture and input use separate
//! connections so a screenshot never delays a click.

pub mod capture;
pub mod clipboard;
pub mod computer;
pub mod conn;
pub mod encode;
pub mod input;
pub mod keys;
pub mod randr;
pub mod settle;
pub mod watch;
pub mod windows;
pub mod xauth;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_protocol::sync::Locked;
use berth_protocol::{Button, InputAction};
use x11rb::connection::RequestConnection;

use capture::{Frame, ShmCapture};
use conn::{Reconnecting, Target, XConn};
use encode::{Encoder, Encoding};
use input::Input;
use settle::SettleRule;
use watch::ScreenWatch;
use windows::{Match, WindowInfo};

/// The managed windows with how each is shown, and the active window.
pub type WindowsShown = (Vec<(WindowInfo, windows::WindowState)>, Option<u32>);

#[derive(Debug, thiserror::Error)]
pub enum DisplayError {
    #[error("no display: the agent runs without --display")]
    NoDisplay,
    #[error("cannot connect to the display: {0}")]
    Connect(String),
    #[error("the X connection failed: {0}")]
    Connection(String),
    #[error("an X request failed: {0}")]
    Request(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("capture failed: {0}")]
    Capture(String),
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("input failed: {0}")]
    Input(String),
    #[error("no window manager: the root window has no _NET_CLIENT_LIST")]
    NoWindowManager,
    #[error("{0}")]
    NotFound(String),
    /// The server cannot change its size (no RandR 1.2, no output to drive).
    #[error("{0}")]
    NoRandr(String),
}

impl From<x11rb::errors::ConnectionError> for DisplayError {
    fn from(e: x11rb::errors::ConnectionError) -> Self {
        DisplayError::Connection(e.to_string())
    }
}

impl From<x11rb::errors::ReplyError> for DisplayError {
    fn from(e: x11rb::errors::ReplyError) -> Self {
        match e {
            x11rb::errors::ReplyError::ConnectionError(c) => {
                DisplayError::Connection(c.to_string())
            }
            x11rb::errors::ReplyError::X11Error(x) => DisplayError::Request(format!("{x:?}")),
        }
    }
}

impl From<x11rb::errors::ReplyOrIdError> for DisplayError {
    fn from(e: x11rb::errors::ReplyOrIdError) -> Self {
        DisplayError::Connection(e.to_string())
    }
}

impl DisplayError {
    /// Whether the connection is unusable (the session must be rebuilt).
    fn is_connection(&self) -> bool {
        matches!(self, DisplayError::Connection(_) | DisplayError::Connect(_))
    }
}

/// What a screenshot request asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShotRequest {
    pub encoding: Encoding,
    /// 0 < scale <= 1.
    pub scale: Option<f64>,
    /// An exact output size instead of a scale (what a computer-use engine believes the
    /// screen is).
    pub size: Option<(u32, u32)>,
    /// x, y, width, height in screen pixels.
    pub region: Option<(i32, i32, u32, u32)>,
    pub cursor: bool,
}

impl Default for ShotRequest {
    fn default() -> Self {
        ShotRequest {
            encoding: Encoding::default(),
            scale: None,
            size: None,
            region: None,
            cursor: true,
        }
    }
}

/// An encoded screenshot.
#[derive(Debug, Clone)]
pub struct Shot {
    pub bytes: Arc<Vec<u8>>,
    pub mime: &'static str,
    pub width: u32,
    pub height: u32,
    pub screen: (u32, u32),
    pub scale: f64,
    /// Answered from the cache: nothing changed since the last identical request.
    pub cached: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct CacheKey {
    request: ShotRequest,
    screen: (u32, u32),
    cursor: Option<(i32, i32, u32)>,
    /// The screen watch's change counter; `None` (never cached) while DAMAGE is not watched.
    generation: Option<u64>,
}

struct CaptureSession {
    x: XConn,
    shm: ShmCapture,
    encoder: Encoder,
    buf: Vec<u8>,
    cache: Option<(CacheKey, Shot)>,
}

pub struct Display {
    target: Option<Target>,
    capture: Reconnecting<CaptureSession>,
    input: Reconnecting<Input>,
    watch: Option<Arc<ScreenWatch>>,
    clipboard: Mutex<Option<clipboard::Owner>>,
    /// Held through a resize: two never interleave.
    resizing: Mutex<()>,
    settle_rule: SettleRule,
}

impl Display {
    /// The display `name` (`:N`) with its cookie (when the agent runs the desktop), or a
    /// display domain that answers "no display".
    pub fn new(
        name: Option<String>,
        cookie: Option<xauth::Cookie>,
        settle_rule: SettleRule,
    ) -> Arc<Display> {
        let target = name.map(|display| Target::new(display, cookie));
        let watch = target.clone().map(ScreenWatch::start);
        Arc::new(Display {
            target,
            capture: Reconnecting::default(),
            input: Reconnecting::default(),
            watch,
            clipboard: Mutex::new(None),
            resizing: Mutex::new(()),
            settle_rule,
        })
    }

    /// Where the screen is and its change watch, for a capture of another domain's own.
    pub fn target_for_recording(&self) -> Option<(Target, Option<Arc<ScreenWatch>>)> {
        self.target.clone().map(|t| (t, self.watch.clone()))
    }

    pub fn name(&self) -> Option<&str> {
        self.target.as_ref().map(|t| t.display.as_str())
    }

    fn target(&self) -> Result<&Target, DisplayError> {
        self.target.as_ref().ok_or(DisplayError::NoDisplay)
    }

    /// Runs `f` on the capture session, (re)connecting when needed; a broken connection is
    /// rebuilt and the call tried once more (the X server may have restarted).
    fn with_capture<T>(
        &self,
        f: impl FnMut(&mut CaptureSession) -> Result<T, DisplayError>,
    ) -> Result<T, DisplayError> {
        let target = self.target()?;
        self.capture.with(
            || {
                Ok(CaptureSession {
                    x: XConn::open(target)?,
                    shm: ShmCapture::default(),
                    encoder: Encoder::default(),
                    buf: Vec::new(),
                    cache: None,
                })
            },
            f,
            |_| {},
            |mut s| s.shm.forget(),
        )
    }

    fn with_input<T>(
        &self,
        f: impl FnMut(&mut Input) -> Result<T, DisplayError>,
    ) -> Result<T, DisplayError> {
        let target = self.target()?;
        self.input.with(
            || Input::new(XConn::open(target)?),
            f,
            |i| i.drain_events(),
            drop,
        )
    }

    pub fn screen_size(&self) -> Result<(u32, u32), DisplayError> {
        self.with_capture(|s| {
            let (w, h) = s.x.screen_size()?;
            Ok((w as u32, h as u32))
        })
    }

    /// Changes the screen's size through RandR and answers the size the server then reports.
    /// Resizes run one at a time, and no screenshot is taken halfway through one (both use
    /// the capture session); the screenshot cache and the SHM segment start over at the new
    /// size, and the screen watch's counter moves (its ConfigureNotify on the root).
    pub fn resize(&self, width: u32, height: u32) -> Result<(u32, u32), DisplayError> {
        let _one = self.resizing.locked();
        let size = self.with_capture(|s| {
            randr::resize(&s.x, (width, height))?;
            s.cache = None;
            s.shm.release(&s.x);
            let (w, h) = s.x.screen_size()?;
            Ok((w as u32, h as u32))
        })?;
        if let Some(w) = &self.watch {
            w.generation_now();
        }
        Ok(size)
    }

    /// Takes a screenshot, or answers from the cache when nothing on screen (cursor
    /// included) changed since the same request.
    pub fn screenshot(&self, req: &ShotRequest) -> Result<Shot, DisplayError> {
        check_shot_request(req)?;
        let watch = self.watch.clone();
        self.with_capture(|s| {
            let generation = watch.as_ref().and_then(|w| w.watched_generation());
            let (sw, sh) = s.x.screen_size()?;
            let screen = (sw as u32, sh as u32);
            let rect = shot_rect(req.region, screen)?;
            let cursor = if req.cursor {
                Some(capture::cursor(&s.x)?)
            } else {
                None
            };
            let key = CacheKey {
                request: *req,
                screen,
                cursor: cursor.as_ref().map(|c| (c.x, c.y, c.serial)),
                generation,
            };
            if generation.is_some()
                && let Some((k, shot)) = &s.cache
                && *k == key
            {
                let mut shot = shot.clone();
                shot.cached = true;
                return Ok(shot);
            }
            let shot = s.capture_shot(req, screen, rect, cursor.as_ref())?;
            s.cache = Some((key, shot.clone()));
            Ok(shot)
        })
    }

    pub fn pointer(&self) -> Result<(i32, i32), DisplayError> {
        self.with_input(|i| i.pointer())
    }

    /// Runs input actions in order and returns where the pointer ended. Every key name and
    /// button is checked before anything is sent, so a bad one changes nothing.
    pub fn run_input(
        self: &Arc<Self>,
        actions: &[InputAction],
    ) -> Result<(i32, i32), DisplayError> {
        let plan = plan(actions)?;
        let result = self.with_input(|i| {
            let (w, h) = i.x.screen_size()?;
            for step in &plan {
                if let Step::Move(x, y) = *step
                    && (x < 0 || y < 0 || x >= w as i32 || y >= h as i32)
                {
                    return Err(DisplayError::Invalid(format!(
                        "({x}, {y}) is outside the {w}x{h} screen"
                    )));
                }
            }
            i.refresh_layout()?;
            i.restore_idle()?;
            let r = execute(i, &plan);
            if r.is_err() {
                i.release_all();
            }
            r?;
            i.x.sync()?;
            i.pointer()
        });
        self.schedule_keymap_restore();
        result
    }

    /// Gives borrowed keycodes back once their grace has passed (see `input`).
    fn schedule_keymap_restore(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(input::REMAP_GRACE);
                let Some(d) = me.upgrade() else { return };
                match d.input.if_open(|i| i.restore_idle()) {
                    Some(Ok(true)) => continue,
                    _ => return,
                }
            }
        });
    }

    pub fn windows(&self) -> Result<Vec<WindowInfo>, DisplayError> {
        self.with_capture(|s| windows::list(&s.x))
    }

    /// Every managed window with how it is shown, and the active one.
    pub fn windows_shown(&self) -> Result<WindowsShown, DisplayError> {
        self.with_capture(|s| {
            let shown = windows::list(&s.x)?
                .into_iter()
                .filter_map(|w| windows::state(&s.x, w.id).ok().map(|st| (w, st)))
                .collect();
            Ok((shown, windows::active(&s.x)?))
        })
    }

    /// Activates the first window matching `name`; false when none does.
    pub fn activate(&self, name: &str, how: Match) -> Result<bool, DisplayError> {
        self.with_capture(|s| {
            let found = windows::list(&s.x)?
                .into_iter()
                .find(|w| how.matches(w, name));
            match found {
                Some(w) => windows::activate(&s.x, w.id).map(|_| true),
                None => Ok(false),
            }
        })
    }

    pub fn activate_id(&self, id: u32) -> Result<(), DisplayError> {
        self.with_capture(|s| windows::activate(&s.x, id))
    }

    /// Closes the first window matching `name`; false when none does.
    pub fn close(&self, name: &str, how: Match) -> Result<bool, DisplayError> {
        self.with_capture(|s| {
            let found = windows::list(&s.x)?
                .into_iter()
                .find(|w| how.matches(w, name));
            match found {
                Some(w) => windows::close(&s.x, w.id).map(|_| true),
                None => Ok(false),
            }
        })
    }

    /// Waits until the screen has settled after input that started at `since`, by this
    /// display's rule (or, with `quiet`, once it has been quiet that long), at most `timeout`.
    /// Returns how long it waited and whether it gave up.
    pub async fn settle(
        &self,
        since: Instant,
        quiet: Option<Duration>,
        timeout: Duration,
    ) -> (Duration, bool) {
        let (rule, quiet) = match quiet {
            Some(q) => (SettleRule::Quiet, q),
            None => (self.settle_rule, settle::QUIET),
        };
        match &self.watch {
            Some(w) => w.settle(rule, quiet, since, timeout).await,
            None => (Duration::ZERO, true),
        }
    }

    /// Extensions the display domain relies on, and whether the server has each.
    pub fn extensions(&self) -> Result<Vec<String>, DisplayError> {
        self.with_capture(|s| {
            let mut out = Vec::new();
            for name in ["MIT-SHM", "XFIXES", "DAMAGE", "XTEST", "RANDR"] {
                if s.x.conn.extension_information(name)?.is_some() {
                    out.push(name.to_string());
                }
            }
            Ok(out)
        })
    }

    pub fn depth(&self) -> Result<u8, DisplayError> {
        self.with_capture(|s| Ok(s.x.root_depth))
    }

    pub fn clipboard_get(&self) -> Result<Option<String>, DisplayError> {
        clipboard::get(self.target()?)
    }

    pub fn clipboard_set(&self, text: String) -> Result<(), DisplayError> {
        let owner = clipboard::Owner::start(self.target()?, text)?;
        *self.clipboard.locked() = Some(owner);
        Ok(())
    }
}

/// Refuses an output size or scale out of range, before the screen is touched.
fn check_shot_request(req: &ShotRequest) -> Result<(), DisplayError> {
    if req
        .size
        .is_some_and(|(w, h)| w == 0 || h == 0 || w > 16384 || h > 16384)
    {
        return Err(DisplayError::Invalid(
            "the output size must be 1-16384 pixels a side".into(),
        ));
    }
    if let Some(s) = req.scale
        && !(s > 0.0 && s <= 1.0)
    {
        return Err(DisplayError::Invalid(format!(
            "scale must be in (0, 1], not {s}"
        )));
    }
    Ok(())
}

/// The rectangle (x, y, width, height) to capture: the requested region, checked to be
/// non-empty and inside the screen, or the whole screen.
fn shot_rect(
    region: Option<(i32, i32, u32, u32)>,
    screen: (u32, u32),
) -> Result<(i32, i32, u32, u32), DisplayError> {
    Ok(match region {
        None => (0, 0, screen.0, screen.1),
        Some((x, y, w, h)) => {
            if w == 0 || h == 0 {
                return Err(DisplayError::Invalid(format!(
                    "region {x},{y},{w},{h} is empty"
                )));
            }
            if x < 0
                || y < 0
                || x as u64 + w as u64 > screen.0 as u64
                || y as u64 + h as u64 > screen.1 as u64
            {
                return Err(DisplayError::Invalid(format!(
                    "region {x},{y},{w},{h} is outside the {}x{} screen",
                    screen.0, screen.1
                )));
            }
            (x, y, w, h)
        }
    })
}

/// The size a captured frame is scaled to: the exact requested size, or the frame scaled
/// by `scale` when below 1; `None` keeps the frame as captured.
fn shot_output_size(req: &ShotRequest, frame: &Frame) -> Option<(u32, u32)> {
    let scale = req.scale.unwrap_or(1.0);
    match req.size {
        Some((w, h)) => Some((w.max(1), h.max(1))),
        None if scale < 1.0 => Some((
            ((frame.width as f64 * scale).round() as u32).max(1),
            ((frame.height as f64 * scale).round() as u32).max(1),
        )),
        None => None,
    }
}

impl CaptureSession {
    /// Captures `rect` of a `screen`-sized screen, draws `cursor` in, scales and encodes it
    /// as `req` asks. The pixel buffer goes back to `self.buf` for the next capture.
    fn capture_shot(
        &mut self,
        req: &ShotRequest,
        screen: (u32, u32),
        rect: (i32, i32, u32, u32),
        cursor: Option<&capture::Cursor>,
    ) -> Result<Shot, DisplayError> {
        self.shm.capture(
            &self.x,
            (rect.0 as i16, rect.1 as i16, rect.2 as u16, rect.3 as u16),
            &mut self.buf,
        )?;
        let mut frame = Frame {
            width: rect.2,
            height: rect.3,
            bgrx: std::mem::take(&mut self.buf),
        };
        if let Some(c) = cursor {
            capture::composite_cursor(&mut frame, (rect.0, rect.1), c);
        }
        let target = shot_output_size(req, &frame);
        let resized = target.is_some_and(|t| t != (frame.width, frame.height));
        let frame = if let (true, Some((w, h))) = (resized, target) {
            let scaled = encode::scale(&frame, w, h)?;
            self.buf = frame.bgrx;
            scaled
        } else {
            frame
        };
        let bytes = self.encoder.encode(&frame, req.encoding)?;
        let shot = Shot {
            bytes: Arc::new(bytes),
            mime: req.encoding.format.mime(),
            width: frame.width,
            height: frame.height,
            screen,
            scale: frame.width as f64 / rect.2 as f64,
            cached: false,
        };
        if !resized {
            self.buf = frame.bgrx;
        }
        Ok(shot)
    }
}

/// Input actions with every name resolved.
/// How long modifiers held for a click stay down waiting for its button events to be processed.
const BUTTONS_PROCESSED_WAIT: Duration = Duration::from_millis(500);

enum Step {
    Move(i32, i32),
    Button(u8, bool),
    Keys(Vec<u32>, KeyMode),
    Type(String),
    Sleep(Duration),
    /// Until the button events sent are processed (before releasing held modifiers).
    ButtonsProcessed,
}

#[derive(Clone, Copy)]
enum KeyMode {
    Tap,
    Down,
    Up,
}

const MAX_WAIT: Duration = Duration::from_secs(60);

fn button(b: &Button) -> Result<u8, DisplayError> {
    match b {
        Button::Number(n) if (1..=9).contains(n) => Ok(*n),
        Button::Number(n) => Err(DisplayError::Invalid(format!(
            "button {n} does not exist (1-9)"
        ))),
        Button::Name(name) => match name.to_ascii_lowercase().as_str() {
            "left" => Ok(1),
            "middle" => Ok(2),
            "right" => Ok(3),
            "back" => Ok(8),
            "forward" => Ok(9),
            other => Err(DisplayError::Invalid(format!(
                "unknown button {other:?} (left, middle, right, back, forward or 1-9)"
            ))),
        },
    }
}

fn key_list(names: &[String]) -> Result<Vec<u32>, DisplayError> {
    names
        .iter()
        .map(|n| keys::keysym(n).ok_or_else(|| DisplayError::Invalid(format!("unknown key {n:?}"))))
        .collect()
}

fn point(x: Option<i32>, y: Option<i32>) -> Result<Option<(i32, i32)>, DisplayError> {
    match (x, y) {
        (Some(x), Some(y)) => Ok(Some((x, y))),
        (None, None) => Ok(None),
        _ => Err(DisplayError::Invalid(
            "give both x and y, or neither".into(),
        )),
    }
}

fn plan(actions: &[InputAction]) -> Result<Vec<Step>, DisplayError> {
    let mut steps = Vec::new();
    for a in actions {
        plan_action(a, &mut steps)?;
    }
    Ok(steps)
}

/// Appends the steps of one input action to `steps`.
fn plan_action(a: &InputAction, steps: &mut Vec<Step>) -> Result<(), DisplayError> {
    match a {
        InputAction::Move { x, y } => steps.push(Step::Move(*x, *y)),
        InputAction::Click {
            x,
            y,
            button: b,
            count,
            modifiers,
        } => plan_click((*x, *y), b, *count, modifiers, steps)?,
        InputAction::ButtonDown { button: b } => steps.push(Step::Button(button(b)?, true)),
        InputAction::ButtonUp { button: b } => steps.push(Step::Button(button(b)?, false)),
        InputAction::Drag {
            path,
            button: b,
            modifiers,
        } => plan_drag(path, b, modifiers, steps)?,
        InputAction::Scroll {
            x,
            y,
            direction,
            amount,
            modifiers,
        } => plan_scroll((*x, *y), direction, *amount, modifiers, steps)?,
        InputAction::Key { keys: k, repeat } => plan_key(k, *repeat, steps)?,
        InputAction::KeyDown { key } => steps.push(Step::Keys(
            keys::chord(key).map_err(DisplayError::Invalid)?,
            KeyMode::Down,
        )),
        InputAction::KeyUp { key } => steps.push(Step::Keys(
            keys::chord(key).map_err(DisplayError::Invalid)?,
            KeyMode::Up,
        )),
        InputAction::Hold {
            keys: k,
            duration_ms,
        } => plan_hold(k, *duration_ms, steps)?,
        InputAction::Type { text } => {
            if text.len() > 1 << 20 {
                return Err(DisplayError::Invalid("text is at most 1 MiB".into()));
            }
            steps.push(Step::Type(text.clone()));
        }
        InputAction::Wait { ms } => {
            let d = Duration::from_millis(*ms);
            if d > MAX_WAIT {
                return Err(DisplayError::Invalid("ms is at most 60000".into()));
            }
            steps.push(Step::Sleep(d));
        }
    }
    Ok(())
}

/// Appends `inner` to `steps` with the modifier keys `mods` held around it; when `inner`
/// presses buttons, the modifiers stay down until those button events are processed.
fn push_held(mods: &[String], steps: &mut Vec<Step>, inner: Vec<Step>) -> Result<(), DisplayError> {
    let m = key_list(mods)?;
    if !m.is_empty() {
        steps.push(Step::Keys(m.clone(), KeyMode::Down));
    }
    let buttons = inner.iter().any(|s| matches!(s, Step::Button(..)));
    steps.extend(inner);
    if !m.is_empty() {
        if buttons {
            steps.push(Step::ButtonsProcessed);
        }
        steps.push(Step::Keys(m, KeyMode::Up));
    }
    Ok(())
}

/// A click: an optional move to `at`, then `count` presses of button `b`, under `modifiers`.
fn plan_click(
    at: (Option<i32>, Option<i32>),
    b: &Button,
    count: Option<u32>,
    modifiers: &[String],
    steps: &mut Vec<Step>,
) -> Result<(), DisplayError> {
    let b = button(b)?;
    let count = count.unwrap_or(1);
    if !(1..=10).contains(&count) {
        return Err(DisplayError::Invalid("count must be 1-10".into()));
    }
    let mut inner = Vec::new();
    if let Some((x, y)) = point(at.0, at.1)? {
        inner.push(Step::Move(x, y));
    }
    for _ in 0..count {
        inner.push(Step::Button(b, true));
        inner.push(Step::Button(b, false));
    }
    push_held(modifiers, steps, inner)
}

/// A drag: button `b` pressed at the first point of `path`, moved through the rest and
/// released at the last, under `modifiers`.
fn plan_drag(
    path: &[[i32; 2]],
    b: &Button,
    modifiers: &[String],
    steps: &mut Vec<Step>,
) -> Result<(), DisplayError> {
    if path.len() < 2 {
        return Err(DisplayError::Invalid(
            "a drag needs at least two points".into(),
        ));
    }
    let b = button(b)?;
    let mut inner = vec![Step::Move(path[0][0], path[0][1]), Step::Button(b, true)];
    for p in &path[1..] {
        inner.push(Step::Move(p[0], p[1]));
    }
    inner.push(Step::Button(b, false));
    push_held(modifiers, steps, inner)
}

/// A scroll: an optional move to `at`, then `amount` clicks of the wheel button for
/// `direction`, under `modifiers`.
fn plan_scroll(
    at: (Option<i32>, Option<i32>),
    direction: &str,
    amount: Option<u32>,
    modifiers: &[String],
    steps: &mut Vec<Step>,
) -> Result<(), DisplayError> {
    let b = match direction.to_ascii_lowercase().as_str() {
        "up" => 4,
        "down" => 5,
        "left" => 6,
        "right" => 7,
        other => {
            return Err(DisplayError::Invalid(format!(
                "unknown scroll direction {other:?} (up, down, left, right)"
            )));
        }
    };
    let amount = amount.unwrap_or(1);
    if !(1..=100).contains(&amount) {
        return Err(DisplayError::Invalid("amount must be 1-100".into()));
    }
    let mut inner = Vec::new();
    if let Some((x, y)) = point(at.0, at.1)? {
        inner.push(Step::Move(x, y));
    }
    for _ in 0..amount {
        inner.push(Step::Button(b, true));
        inner.push(Step::Button(b, false));
    }
    push_held(modifiers, steps, inner)
}

/// A key chord tapped `repeat` times.
fn plan_key(k: &str, repeat: Option<u32>, steps: &mut Vec<Step>) -> Result<(), DisplayError> {
    let syms = keys::chord(k).map_err(DisplayError::Invalid)?;
    let n = repeat.unwrap_or(1);
    if !(1..=1000).contains(&n) {
        return Err(DisplayError::Invalid("repeat must be 1-1000".into()));
    }
    for _ in 0..n {
        steps.push(Step::Keys(syms.clone(), KeyMode::Tap));
    }
    Ok(())
}

/// A key chord held down for `duration_ms`, then released.
fn plan_hold(k: &str, duration_ms: u64, steps: &mut Vec<Step>) -> Result<(), DisplayError> {
    let syms = keys::chord(k).map_err(DisplayError::Invalid)?;
    let d = Duration::from_millis(duration_ms);
    if d > MAX_WAIT {
        return Err(DisplayError::Invalid("duration_ms is at most 60000".into()));
    }
    steps.push(Step::Keys(syms.clone(), KeyMode::Down));
    steps.push(Step::Sleep(d));
    steps.push(Step::Keys(syms, KeyMode::Up));
    Ok(())
}

fn execute(i: &mut Input, steps: &[Step]) -> Result<(), DisplayError> {
    for s in steps {
        match s {
            Step::Move(x, y) => i.move_to(*x, *y)?,
            Step::Button(b, down) => i.button(*b, *down)?,
            Step::Keys(syms, KeyMode::Tap) => i.chord(syms)?,
            Step::Keys(syms, KeyMode::Down) => {
                for &s in syms {
                    i.key(s, true)?;
                }
            }
            Step::Keys(syms, KeyMode::Up) => {
                for &s in syms.iter().rev() {
                    i.key(s, false)?;
                }
            }
            Step::Type(t) => i.type_text(t)?,
            Step::Sleep(d) => {
                i.x.sync()?;
                std::thread::sleep(*d);
            }
            Step::ButtonsProcessed => {
                i.x.sync()?;
                i.buttons_processed(BUTTONS_PROCESSED_WAIT)?;
            }
        }
    }
    Ok(())
}

/// Runs a blocking display call off the async workers.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DisplayError> + Send + 'static,
) -> Result<T, DisplayError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DisplayError::Capture(e.to_string()))?
}
