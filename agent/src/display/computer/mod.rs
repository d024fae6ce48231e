//! `POST /v1/computer`: the computer-use actions engines already emit, run as input actions and
//! answered with the settled screenshot. Two dialects, told apart by their key:
//!
//! - Anthropic's computer-use tool input (`action`, `coordinate`, `text`, `scroll_direction`,
//!   …), answered with [`ComputerResponse`] (`base64_image`, `output`, `error`);
//! - OpenAI's computer-use action (`type`: `click`, `double_click`, `drag`, `keypress`,
//!   `move`, `screenshot`, `scroll`, `type`, `wait`), answered with OpenAI's
//!   `computer_call_output.output` ([`OpenAiComputerResponse`]: `type: computer_screenshot`,
//!   `image_url` a PNG data URL) plus berth's own fields.
//!
//! `{"actions": [...]}` is a batch of either (mixed if need be): every action is checked before
//! the first runs, they run in order, the first that fails stops the batch and is named, and
//! the screen is settled and shot once after the last. A batch of only OpenAI actions answers
//! OpenAI's shape, any other Anthropic's.
//!
//! With `display_width_px`/`display_height_px` (beside an action, or at a batch's top level)
//! the engine works in a scaled space: screenshots are scaled to it and its coordinates mapped
//! back.
//!
//! One file per dialect over one action plan ([`Plan`], checked before anything runs, then
//! [`run_steps`]): `anthropic` (Anthropic's computer tool), `openai` (OpenAI's actions) and
//! `toolset` (Anthropic's computer toolset, `/v1/toolsets/computer`); this file holds the body's
//! dispatch, the coordinate space, batches and running.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use berth_protocol::{
    Button, ComputerAction, ComputerAnswer, ComputerBatch, ComputerBody, ComputerFailure,
    ComputerRequest, ComputerResponse, InputAction, OpenAiAction, OpenAiButton,
    OpenAiComputerRequest, OpenAiComputerResponse, OpenAiOutputType,
};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

mod anthropic;
mod openai;
pub mod toolset;

use anthropic::lower_anthropic;
pub use anthropic::{run, run_traced};
pub use openai::run_openai;
use openai::{lower_openai, parse_openai};

use super::encode::Encoding;
use super::{Display, DisplayError, Shot, ShotRequest, keys};

pub(super) const SETTLE_TIMEOUT: Duration = Duration::from_secs(2);
/// Within a batch, how long the screen may take to settle after a key step before the next
/// step runs: a shortcut moves the focus (Ctrl+L to a browser's address bar, Alt+Tab), and a
/// program may still route the keys that follow to where the focus was.
pub(super) const KEY_SETTLE_TIMEOUT: Duration = Duration::from_secs(1);
/// The most actions a batch holds.
pub const MAX_BATCH: usize = 100;
/// The most a batch's `wait`s and `hold_key`s add up to (one action's bound, too).
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// OpenAI's `wait` carries no duration: this long, unless berth's own `ms` says otherwise.
pub const OPENAI_WAIT: Duration = Duration::from_secs(1);
/// OpenAI's `scroll` amounts are pixels; a wheel click is taken as this many: what one click
/// scrolls a page in the desktop's Chromium (measured: 1 click 120 px, 3 clicks 360 px).
pub const SCROLL_PX_PER_CLICK: u64 = 120;
/// The most wheel clicks one scroll direction sends (12 000 pixels of OpenAI's).
pub const MAX_SCROLL_CLICKS: u64 = 100;
/// The longest text one `type` takes.
pub(super) const MAX_TEXT: usize = 1 << 20;

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DisplayError> + Send + 'static,
) -> Result<T, DisplayError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DisplayError::Input(e.to_string()))?
}

/// Maps between the engine's coordinate space and the screen.
struct Space {
    screen: (u32, u32),
    engine: (u32, u32),
}

impl Space {
    fn new(screen: (u32, u32), w: Option<u32>, h: Option<u32>) -> Result<Space, DisplayError> {
        let engine = match (w, h) {
            (Some(w), Some(h)) if w > 0 && h > 0 => (w, h),
            (None, None) => screen,
            _ => {
                return Err(DisplayError::Invalid(
                    "give both display_width_px and display_height_px (positive), or neither"
                        .into(),
                ));
            }
        };
        Ok(Space { screen, engine })
    }

    fn to_screen(&self, c: [i64; 2], what: &str) -> Result<(i32, i32), DisplayError> {
        self.map(c, what, false)
    }

    /// The exclusive end of a region (`zoom`'s `x2, y2`): the screen's width and height are
    /// valid ends, so a region can reach the right and bottom edges.
    fn end_to_screen(&self, c: [i64; 2], what: &str) -> Result<(i32, i32), DisplayError> {
        self.map(c, what, true)
    }

    /// Engine coordinates to screen ones; `end` lets a coordinate equal the width or height.
    fn map(&self, c: [i64; 2], what: &str, end: bool) -> Result<(i32, i32), DisplayError> {
        let (ew, eh) = self.engine;
        let reach = end as i64;
        if c[0] < 0 || c[1] < 0 || c[0] >= ew as i64 + reach || c[1] >= eh as i64 + reach {
            return Err(DisplayError::Invalid(format!(
                "{what} ({}, {}) is outside the {ew}x{eh} screen",
                c[0], c[1]
            )));
        }
        let sx = self.screen.0 as f64 / ew as f64;
        let sy = self.screen.1 as f64 / eh as f64;
        let last = |size: u32| size as i32 - 1 + reach as i32;
        Ok((
            ((c[0] as f64 * sx).round() as i32).min(last(self.screen.0)),
            ((c[1] as f64 * sy).round() as i32).min(last(self.screen.1)),
        ))
    }

    fn to_engine(&self, p: (i32, i32)) -> (i64, i64) {
        let sx = self.engine.0 as f64 / self.screen.0 as f64;
        let sy = self.engine.1 as f64 / self.screen.1 as f64;
        (
            (p.0 as f64 * sx).round() as i64,
            (p.1 as f64 * sy).round() as i64,
        )
    }

    fn scaled(&self) -> Option<(u32, u32)> {
        (self.engine != self.screen).then_some(self.engine)
    }

    /// The whole screen as the engine sees it.
    fn full(&self) -> ShotRequest {
        ShotRequest {
            size: self.scaled(),
            encoding: Encoding::default(),
            ..Default::default()
        }
    }
}

async fn space(d: &Arc<Display>, w: Option<u32>, h: Option<u32>) -> Result<Space, DisplayError> {
    // Checked before the screen is asked, so a bad pair is a 400 even without a display.
    Space::new((1, 1), w, h)?;
    let screen = {
        let d = d.clone();
        blocking(move || d.screen_size()).await?
    };
    Space::new(screen, w, h)
}

// ---- The body: which dialect, parsed with errors that name the field. ----

/// Whose answer shape a request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Anthropic,
    OpenAi,
}

/// A body that is not a computer-use request, and the shape to say so in.
#[derive(Debug, Clone, PartialEq)]
pub struct BodyError {
    pub dialect: Dialect,
    pub message: String,
}

impl BodyError {
    fn anthropic(message: impl Into<String>) -> BodyError {
        BodyError {
            dialect: Dialect::Anthropic,
            message: message.into(),
        }
    }
}

const OPENAI_TYPES: &str =
    "click, double_click, drag, keypress, move, screenshot, scroll, type, wait";
const DISPLAY_KEYS: [&str; 2] = ["display_width_px", "display_height_px"];

/// Deserializes `v`, naming the field an error is in.
fn de<T: DeserializeOwned>(v: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            inner.to_string()
        } else {
            format!("`{path}`: {inner}")
        }
    })
}

/// `POST /v1/computer`'s body by its keys: `action` (Anthropic), `type` (OpenAI) or `actions`
/// (a batch); none or several of them is an error saying so.
pub fn parse(v: Value) -> Result<ComputerBody, BodyError> {
    let Value::Object(mut map) = v else {
        return Err(BodyError::anthropic(
            "expected a JSON object with `action` (an Anthropic computer-use action), `type` \
             (an OpenAI one) or `actions` (a batch)",
        ));
    };
    if map.contains_key("actions") {
        if let Some(k) = ["action", "type"]
            .into_iter()
            .find(|k| map.contains_key(*k))
        {
            return Err(BodyError::anthropic(format!(
                "the body has both `actions` (a batch) and `{k}` (one action): send one or the \
                 other"
            )));
        }
        return parse_batch(map);
    }
    match kind(&map) {
        Ok(Dialect::Anthropic) => de(Value::Object(map))
            .map(ComputerBody::Anthropic)
            .map_err(BodyError::anthropic),
        Ok(Dialect::OpenAi) => {
            let openai = |message| BodyError {
                dialect: Dialect::OpenAi,
                message,
            };
            let w = take_size(&mut map, "display_width_px").map_err(openai)?;
            let h = take_size(&mut map, "display_height_px").map_err(openai)?;
            let action = parse_openai(map).map_err(openai)?;
            Ok(ComputerBody::OpenAi(OpenAiComputerRequest {
                action,
                display_width_px: w,
                display_height_px: h,
            }))
        }
        Err(e) => Err(BodyError::anthropic(e)),
    }
}

/// One action's dialect by its key.
fn kind(map: &Map<String, Value>) -> Result<Dialect, String> {
    match (map.contains_key("action"), map.contains_key("type")) {
        (true, false) => Ok(Dialect::Anthropic),
        (false, true) => Ok(Dialect::OpenAi),
        (false, false) => Err(
            "the body has neither `action` (an Anthropic computer-use action) nor `type` (an \
             OpenAI one)"
                .into(),
        ),
        (true, true) if map.get("type").and_then(Value::as_str) == Some("computer_call") => Err(
            "this is a whole OpenAI `computer_call`: send its `action` object (the one with \
             `type`) instead"
                .into(),
        ),
        (true, true) => Err(
            "the body has both `action` (Anthropic's dialect) and `type` (OpenAI's): send one \
             action in one dialect"
                .into(),
        ),
    }
}

fn take_size(map: &mut Map<String, Value>, key: &str) -> Result<Option<u32>, String> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => de(v).map_err(|e| format!("`{key}`: {e}")),
    }
}

fn parse_batch(mut map: Map<String, Value>) -> Result<ComputerBody, BodyError> {
    let items = match map.remove("actions") {
        Some(Value::Array(items)) => items,
        _ => {
            return Err(BodyError::anthropic(
                "`actions` must be an array of actions",
            ));
        }
    };
    // Errors come in OpenAI's shape when every action is OpenAI's.
    let dialect = if !items.is_empty()
        && items.iter().all(|i| {
            i.as_object()
                .is_some_and(|o| o.contains_key("type") && !o.contains_key("action"))
        }) {
        Dialect::OpenAi
    } else {
        Dialect::Anthropic
    };
    let fail = |message: String| BodyError { dialect, message };
    let w = take_size(&mut map, "display_width_px").map_err(fail)?;
    let h = take_size(&mut map, "display_height_px").map_err(fail)?;
    if let Some(k) = map.keys().next() {
        return Err(fail(format!(
            "unknown field `{k}` in a batch (it takes `actions`, `display_width_px` and \
             `display_height_px`)"
        )));
    }
    check_len(items.len()).map_err(|e| fail(e.to_string()))?;
    let mut actions = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let at = |e: String| fail(format!("actions[{i}]: {e}"));
        let Value::Object(item) = item else {
            return Err(at("an action is a JSON object".into()));
        };
        if let Some(k) = DISPLAY_KEYS
            .iter()
            .find(|k| item.get(**k).is_some_and(|v| !v.is_null()))
        {
            return Err(at(format!(
                "`{k}` goes at the batch's top level (it applies to every action), not on an \
                 action"
            )));
        }
        if item.contains_key("actions") {
            return Err(at("batches do not nest".into()));
        }
        actions.push(match kind(&item).map_err(at)? {
            Dialect::Anthropic => ComputerAction::Anthropic(de(Value::Object(item)).map_err(at)?),
            Dialect::OpenAi => ComputerAction::OpenAi(parse_openai(item).map_err(at)?),
        });
    }
    Ok(ComputerBody::Batch(ComputerBatch {
        actions,
        display_width_px: w,
        display_height_px: h,
    }))
}

fn check_len(n: usize) -> Result<(), DisplayError> {
    if n == 0 {
        return Err(DisplayError::Invalid(
            "a batch needs at least one action".into(),
        ));
    }
    if n > MAX_BATCH {
        return Err(DisplayError::Invalid(format!(
            "a batch holds at most {MAX_BATCH} actions, not {n}"
        )));
    }
    Ok(())
}

// ---- Actions to input, checked before anything runs (pure). ----

/// What one engine action becomes once checked.
#[derive(Debug, Clone, PartialEq)]
enum Plan {
    /// Input to send (none for a screenshot).
    Input(Vec<InputAction>),
    /// Anthropic's `cursor_position`: read, not sent.
    CursorPosition,
    /// Anthropic's `zoom`: a region of the screen, in the engine's scale.
    Zoom(ShotRequest),
}

/// A checked action and its name (for naming it when it fails).
#[derive(Debug, Clone, PartialEq)]
struct Step {
    name: String,
    plan: Plan,
}

fn need<'a, T>(v: &'a Option<T>, field: &str, action: &str) -> Result<&'a T, DisplayError> {
    v.as_ref()
        .ok_or_else(|| DisplayError::Invalid(format!("`{field}` is required for {action}")))
}

/// Modifier keys held during a click or scroll, given as `text` (`shift`, `ctrl+alt`).
fn modifiers(text: &Option<String>) -> Vec<String> {
    text.as_deref()
        .map(|t| {
            t.split('+')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

fn seconds(secs: f64) -> Result<u64, DisplayError> {
    if !(0.0..=MAX_WAIT.as_secs_f64()).contains(&secs) {
        return Err(DisplayError::Invalid(
            "duration must be 0-60 seconds".into(),
        ));
    }
    Ok((secs * 1000.0) as u64)
}

/// Whatever the display would refuse once running, refused before anything runs: key names,
/// scroll directions and amounts, durations, text length.
fn check(actions: &[InputAction]) -> Result<(), DisplayError> {
    let invalid = |m: String| DisplayError::Invalid(m);
    let mods = |m: &[String]| {
        m.iter().try_for_each(|k| {
            keys::keysym(k)
                .map(|_| ())
                .ok_or_else(|| invalid(format!("unknown key {k:?}")))
        })
    };
    for a in actions {
        match a {
            InputAction::Key { keys: k, .. } | InputAction::Hold { keys: k, .. } => {
                keys::chord(k).map_err(invalid)?;
            }
            InputAction::Click { modifiers, .. } | InputAction::Drag { modifiers, .. } => {
                mods(modifiers)?
            }
            InputAction::Scroll {
                direction,
                amount,
                modifiers,
                ..
            } => {
                if !["up", "down", "left", "right"]
                    .contains(&direction.to_ascii_lowercase().as_str())
                {
                    return Err(invalid(format!(
                        "unknown scroll direction {direction:?} (up, down, left, right)"
                    )));
                }
                if !(1..=100).contains(&amount.unwrap_or(1)) {
                    return Err(invalid("scroll_amount must be 1-100".into()));
                }
                mods(modifiers)?;
            }
            InputAction::Type { text } if text.len() > MAX_TEXT => {
                return Err(invalid("text is at most 1 MiB".into()));
            }
            _ => {}
        }
    }
    let waited = waits(actions);
    if waited > MAX_WAIT {
        return Err(invalid(format!(
            "waits {} ms; at most {} ms",
            waited.as_millis(),
            MAX_WAIT.as_millis()
        )));
    }
    Ok(())
}

/// How long `actions` wait or hold keys on purpose.
fn waits(actions: &[InputAction]) -> Duration {
    actions
        .iter()
        .map(|a| match a {
            InputAction::Wait { ms } => Duration::from_millis(*ms),
            InputAction::Hold { duration_ms, .. } => Duration::from_millis(*duration_ms),
            _ => Duration::ZERO,
        })
        .fold(Duration::ZERO, Duration::saturating_add)
}

/// A batch's actions, all checked: the first bad one is named by index and nothing runs.
fn plan_batch(batch: &ComputerBatch, space: &Space) -> Result<Vec<Step>, DisplayError> {
    check_len(batch.actions.len())?;
    let last = batch.actions.len() - 1;
    let mut steps = Vec::with_capacity(batch.actions.len());
    let mut waited = Duration::ZERO;
    for (i, item) in batch.actions.iter().enumerate() {
        let (name, plan) = match item {
            ComputerAction::Anthropic(req) => {
                let name = req.action.clone();
                let plan = if req.display_width_px.is_some() || req.display_height_px.is_some() {
                    Err(DisplayError::Invalid(
                        "display_width_px and display_height_px go at the batch's top level".into(),
                    ))
                } else {
                    lower_anthropic(req, space)
                };
                (name, plan)
            }
            ComputerAction::OpenAi(a) => (
                a.name().to_string(),
                lower_openai(a, space).map(Plan::Input),
            ),
        };
        let plan =
            plan.map_err(|e| DisplayError::Invalid(format!("actions[{i}] ({name}): {e}")))?;
        if i != last && !matches!(plan, Plan::Input(_)) {
            return Err(DisplayError::Invalid(format!(
                "actions[{i}] ({name}): zoom and cursor_position may only be a batch's last \
                 action (the answer carries what they read)"
            )));
        }
        if let Plan::Input(a) = &plan {
            waited = waited.saturating_add(waits(a));
        }
        steps.push(Step { name, plan });
    }
    if waited > MAX_WAIT {
        return Err(DisplayError::Invalid(format!(
            "the batch's waits and held keys add up to {} ms; at most {} ms",
            waited.as_millis(),
            MAX_WAIT.as_millis()
        )));
    }
    Ok(steps)
}

// ---- Running. ----

/// What running checked steps came to.
struct Done {
    shot: Option<Shot>,
    output: Option<String>,
    settled: Option<(Duration, bool)>,
    /// The step that failed (those before it ran) and its error.
    failed: Option<(usize, DisplayError)>,
    /// When each step that ran started and how long it took.
    steps: Vec<(Instant, Duration)>,
    /// When the screenshot was taken.
    shot_at: Option<Instant>,
}

/// What running a request did, as the episode log keeps it: each step's start and length,
/// the screenshot answered and when it was taken, the settle.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub steps: Vec<(Instant, Duration)>,
    pub shot: Option<Shot>,
    pub shot_at: Option<Instant>,
    pub settled: Option<(Duration, bool)>,
}

impl Trace {
    fn of(done: &Done) -> Trace {
        Trace {
            steps: done.steps.clone(),
            shot: done.shot.clone(),
            shot_at: done.shot_at,
            settled: done.settled,
        }
    }
}

/// Whether an action presses keys (what may move the focus before the next step).
fn is_key(a: &InputAction) -> bool {
    matches!(
        a,
        InputAction::Key { .. } | InputAction::KeyDown { .. } | InputAction::Hold { .. }
    )
}

/// Runs the steps in order, stopping at the first that fails (after a key step, the next input
/// step waits for the screen to settle, at most a second); settles once after the input
/// (from the start of the last step that sent any) and takes one screenshot: the last step's
/// zoom if it is one, the whole screen otherwise (after a failure too, as far as it can).
async fn run_steps(d: &Arc<Display>, space: &Space, steps: &[Step]) -> Result<Done, DisplayError> {
    let mut last_start = None;
    let mut failed = None;
    let mut timings = Vec::with_capacity(steps.len());
    // A key step's start, while the next input step has yet to wait for its screen to settle.
    let mut after_keys: Option<Instant> = None;
    for (i, step) in steps.iter().enumerate() {
        let started = Instant::now();
        let actions = match &step.plan {
            Plan::Input(actions) if !actions.is_empty() => actions,
            _ => {
                timings.push((started, Duration::ZERO));
                continue;
            }
        };
        if let Some(t) = after_keys.take() {
            d.settle(t, None, KEY_SETTLE_TIMEOUT).await;
        }
        let started = Instant::now();
        last_start = Some(started);
        if actions.iter().any(is_key) {
            after_keys = Some(started);
        }
        let runner = d.clone();
        let actions = actions.clone();
        let result = blocking(move || runner.run_input(&actions)).await;
        timings.push((started, started.elapsed()));
        if let Err(e) = result {
            failed = Some((i, e));
            break;
        }
    }
    let settled = match last_start {
        Some(t) => Some(d.settle(t, None, SETTLE_TIMEOUT).await),
        None => None,
    };
    let mut done = Done {
        shot: None,
        output: None,
        settled,
        failed,
        steps: timings,
        shot_at: None,
    };
    if done.failed.is_some() {
        done.shot_at = Some(Instant::now());
        done.shot = shot(d, space.full()).await.ok();
        return Ok(done);
    }
    let request = match steps.last().map(|s| &s.plan) {
        Some(Plan::Zoom(z)) => *z,
        Some(Plan::CursorPosition) => {
            let d = d.clone();
            let p = blocking(move || d.pointer()).await?;
            let (x, y) = space.to_engine(p);
            done.output = Some(format!("X={x},Y={y}"));
            space.full()
        }
        _ => space.full(),
    };
    done.shot_at = Some(Instant::now());
    done.shot = Some(shot(d, request).await?);
    Ok(done)
}

async fn shot(d: &Arc<Display>, req: ShotRequest) -> Result<Shot, DisplayError> {
    let d = d.clone();
    blocking(move || d.screenshot(&req)).await
}

pub(super) fn b64(shot: &Shot) -> String {
    base64::engine::general_purpose::STANDARD.encode(shot.bytes.as_ref())
}

fn data_url(shot: &Shot) -> String {
    format!("data:{};base64,{}", shot.mime, b64(shot))
}

fn settle_fields(done: &Done) -> (Option<u64>, Option<bool>) {
    match done.settled {
        Some((waited, timed_out)) => (Some(waited.as_millis() as u64), Some(timed_out)),
        None => (None, None),
    }
}

/// An answer and, when it is an error, the error that decides its status.
pub struct Answer {
    pub body: ComputerAnswer,
    pub error: Option<DisplayError>,
    /// What ran (empty steps when nothing did).
    pub trace: Trace,
}

impl Answer {
    /// `e` in `dialect`'s shape.
    pub fn error(dialect: Dialect, e: DisplayError) -> Answer {
        let message = e.to_string();
        Answer {
            body: match dialect {
                Dialect::Anthropic => ComputerAnswer::Anthropic(ComputerResponse {
                    error: Some(message),
                    ..Default::default()
                }),
                Dialect::OpenAi => ComputerAnswer::OpenAi(OpenAiComputerResponse {
                    error: Some(message),
                    ..Default::default()
                }),
            },
            error: Some(e),
            trace: Trace::default(),
        }
    }
}

/// Whose shape a batch is answered in: OpenAI's when every action is OpenAI's.
fn batch_dialect(b: &ComputerBatch) -> Dialect {
    if !b.actions.is_empty()
        && b.actions
            .iter()
            .all(|a| matches!(a, ComputerAction::OpenAi(_)))
    {
        Dialect::OpenAi
    } else {
        Dialect::Anthropic
    }
}

/// A batch: all checked, run in order up to the first failure, answered once.
pub async fn run_batch(d: &Arc<Display>, batch: ComputerBatch) -> Answer {
    let dialect = batch_dialect(&batch);
    let checked = async {
        let space = space(d, batch.display_width_px, batch.display_height_px).await?;
        let steps = plan_batch(&batch, &space)?;
        Ok::<_, DisplayError>((space, steps))
    };
    let (space, steps) = match checked.await {
        Ok(s) => s,
        Err(e) => return Answer::error(dialect, e),
    };
    let done = match run_steps(d, &space, &steps).await {
        Ok(done) => done,
        Err(e) => return Answer::error(dialect, e),
    };
    let trace = Trace::of(&done);
    let (settled_ms, settle_timed_out) = settle_fields(&done);
    let (failed, error) = match done.failed {
        Some((i, e)) => {
            let name = steps[i].name.clone();
            let message = format!("actions[{i}] ({name}) failed: {e}");
            (
                Some(ComputerFailure {
                    index: i,
                    action: name,
                    error: e.to_string(),
                }),
                Some((message, e)),
            )
        }
        None => (None, None),
    };
    let message = error.as_ref().map(|(m, _)| m.clone());
    let body = match dialect {
        Dialect::Anthropic => ComputerAnswer::Anthropic(ComputerResponse {
            output: done.output,
            error: message,
            base64_image: done.shot.as_ref().map(b64),
            settled_ms,
            settle_timed_out,
            failed,
        }),
        Dialect::OpenAi => ComputerAnswer::OpenAi(OpenAiComputerResponse {
            kind: OpenAiOutputType::ComputerScreenshot,
            image_url: done.shot.as_ref().map(data_url),
            settled_ms,
            settle_timed_out,
            error: message,
            failed,
        }),
    };
    Answer {
        body,
        error: error.map(|(_, e)| e),
        trace,
    }
}

/// What running `body` on a screen of `screen` pixels would send, checked as running it
/// checks (without the display): each action's input in order (none for a screenshot, a
/// zoom or a cursor read), or the error the request would be answered with.
pub fn plan(
    body: &ComputerBody,
    screen: (u32, u32),
) -> Result<Vec<Vec<InputAction>>, DisplayError> {
    let input = |p: Plan| match p {
        Plan::Input(a) => a,
        Plan::CursorPosition | Plan::Zoom(_) => Vec::new(),
    };
    match body {
        ComputerBody::Anthropic(req) => {
            let space = Space::new(screen, req.display_width_px, req.display_height_px)?;
            Ok(vec![input(lower_anthropic(req, &space)?)])
        }
        ComputerBody::OpenAi(req) => {
            let space = Space::new(screen, req.display_width_px, req.display_height_px)?;
            Ok(vec![lower_openai(&req.action, &space)?])
        }
        ComputerBody::Batch(b) => {
            let space = Space::new(screen, b.display_width_px, b.display_height_px)?;
            Ok(plan_batch(b, &space)?
                .into_iter()
                .map(|s| input(s.plan))
                .collect())
        }
    }
}

/// Any body [`parse`] gives, answered in its dialect's shape.
pub async fn run_body(d: &Arc<Display>, body: ComputerBody) -> Answer {
    match body {
        ComputerBody::Anthropic(req) => match run_traced(d, req).await {
            (Ok(r), trace) => Answer {
                body: ComputerAnswer::Anthropic(r),
                error: None,
                trace,
            },
            (Err(e), trace) => Answer {
                trace,
                ..Answer::error(Dialect::Anthropic, e)
            },
        },
        ComputerBody::OpenAi(req) => {
            let mut trace = Trace::default();
            match run_openai(d, req, &mut trace).await {
                Ok(r) => Answer {
                    body: ComputerAnswer::OpenAi(r),
                    error: None,
                    trace,
                },
                Err(e) => Answer {
                    trace,
                    ..Answer::error(Dialect::OpenAi, e)
                },
            }
        }
        ComputerBody::Batch(b) => run_batch(d, b).await,
    }
}

#[cfg(test)]
mod tests {
    use super::openai::scroll_clicks;
    use super::*;
    use berth_protocol::{OpenAiAt, OpenAiClick, OpenAiKeypress, OpenAiScroll, OpenAiWait};
    use serde_json::json;

    fn space(screen: (u32, u32), engine: (u32, u32)) -> Space {
        Space { screen, engine }
    }

    #[test]
    fn engine_coordinates_map_to_the_screen_and_back() {
        let s = space((1920, 1080), (1280, 720));
        assert_eq!(s.to_screen([0, 0], "c").unwrap(), (0, 0));
        assert_eq!(s.to_screen([640, 360], "c").unwrap(), (960, 540));
        assert_eq!(s.to_screen([1279, 719], "c").unwrap(), (1919, 1079));
        assert!(s.to_screen([1280, 0], "c").is_err());
        assert!(s.to_screen([-1, 0], "c").is_err());
        assert_eq!(s.to_engine((960, 540)), (640, 360));
        assert_eq!(s.end_to_screen([1280, 720], "e").unwrap(), (1920, 1080));
        assert_eq!(s.end_to_screen([640, 360], "e").unwrap(), (960, 540));
        assert!(s.end_to_screen([1281, 720], "e").is_err());
        assert!(s.end_to_screen([0, -1], "e").is_err());
        assert_eq!(s.scaled(), Some((1280, 720)));
    }

    fn err(v: Value) -> BodyError {
        parse(v).unwrap_err()
    }

    #[test]
    fn the_dialect_is_told_by_the_key() {
        assert!(matches!(
            parse(json!({"action": "left_click", "coordinate": [1, 2]})).unwrap(),
            ComputerBody::Anthropic(r) if r.action == "left_click"
        ));
        match parse(json!({"type": "click", "x": 1, "y": 2, "button": "wheel",
                            "display_width_px": 100, "display_height_px": 50}))
        .unwrap()
        {
            ComputerBody::OpenAi(r) => {
                assert_eq!(
                    r.action,
                    OpenAiAction::Click(OpenAiClick {
                        x: 1,
                        y: 2,
                        button: OpenAiButton::Wheel
                    })
                );
                assert_eq!(
                    (r.display_width_px, r.display_height_px),
                    (Some(100), Some(50))
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(json!({"actions": [{"type": "screenshot"}, {"action": "screenshot"}]})).unwrap(),
            ComputerBody::Batch(b) if b.actions.len() == 2
        ));
        let e = err(json!({"coordinate": [1, 2]}));
        assert!(e.message.contains("neither `action`"), "{e:?}");
        let e = err(json!({"action": "left_click", "type": "click"}));
        assert!(e.message.contains("both `action`"), "{e:?}");
        let e = err(json!({"type": "computer_call", "action": {"type": "click"}}));
        assert!(e.message.contains("send its `action`"), "{e:?}");
        let e = err(json!({"actions": [], "type": "click"}));
        assert!(e.message.contains("both `actions`"), "{e:?}");
        let e = err(json!([1, 2]));
        assert!(e.message.contains("JSON object"), "{e:?}");
    }

    #[test]
    fn openai_errors_name_the_field_and_come_in_openais_shape() {
        let e = err(json!({"type": "click", "x": "10", "y": 2}));
        assert_eq!(e.dialect, Dialect::OpenAi);
        assert!(
            e.message.contains("`click`") && e.message.contains("`x`"),
            "{e:?}"
        );
        let e = err(json!({"type": "click", "x": 1, "y": 2, "button": "sideways"}));
        assert!(
            e.message.contains("`button`") && e.message.contains("sideways"),
            "{e:?}"
        );
        let e = err(json!({"type": "teleport"}));
        assert!(
            e.message
                .contains("unknown OpenAI action type \"teleport\""),
            "{e:?}"
        );
        let e = err(json!({"type": "move", "x": 1, "y": 2, "z": 3}));
        assert!(e.message.contains("unknown field `z`"), "{e:?}");
        let e = err(json!({"type": "click", "y": 2}));
        assert!(e.message.contains("missing field `x`"), "{e:?}");
        let e = err(json!({"type": 5}));
        assert!(e.message.contains("`type` must be a string"), "{e:?}");
        let e = err(json!({"type": "move", "x": 1, "y": 2, "display_width_px": "wide"}));
        assert!(e.message.contains("display_width_px"), "{e:?}");
        // Anthropic's fields are named too.
        let e = err(json!({"action": "left_click", "coordinate": "here"}));
        assert_eq!(e.dialect, Dialect::Anthropic);
        assert!(e.message.contains("`coordinate`"), "{e:?}");
    }

    #[test]
    fn batch_errors_name_the_index() {
        let e = err(json!({"actions": [{"type": "move", "x": 1, "y": 1}, {"type": "clack"}]}));
        assert_eq!(e.dialect, Dialect::OpenAi);
        assert!(e.message.starts_with("actions[1]: "), "{e:?}");
        let e = err(json!({"actions": [{"action": "screenshot"}, 7]}));
        assert_eq!(e.dialect, Dialect::Anthropic);
        assert!(e.message.starts_with("actions[1]: "), "{e:?}");
        let e = err(json!({"actions": [{"type": "screenshot", "display_width_px": 5}]}));
        assert!(e.message.contains("top level"), "{e:?}");
        assert!(
            parse(json!({"actions": [{"action": "screenshot", "display_width_px": null}]})).is_ok(),
            "a null size is no size"
        );
        let e = err(json!({"actions": [{"actions": []}]}));
        assert!(e.message.contains("nest"), "{e:?}");
        let e = err(json!({"actions": [{"type": "screenshot"}], "speed": 2}));
        assert!(e.message.contains("unknown field `speed`"), "{e:?}");
        let e = err(json!({"actions": []}));
        assert!(e.message.contains("at least one"), "{e:?}");
        let many: Vec<Value> = (0..101).map(|_| json!({"type": "screenshot"})).collect();
        let e = err(json!({ "actions": many }));
        assert!(e.message.contains("at most 100"), "{e:?}");
        let e = err(json!({"actions": {"type": "screenshot"}}));
        assert!(e.message.contains("array"), "{e:?}");
    }

    fn openai(v: Value) -> OpenAiAction {
        match parse(v).unwrap() {
            ComputerBody::OpenAi(r) => r.action,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn openai_actions_become_input_actions() {
        let s = space((1920, 1080), (1280, 720));
        let lower = |v: Value| lower_openai(&openai(v), &s);
        let click = |x, y, button: &str, count| InputAction::Click {
            x: Some(x),
            y: Some(y),
            button: Button::Name(button.into()),
            count: Some(count),
            modifiers: Vec::new(),
        };
        for (b, want) in [
            ("left", "left"),
            ("right", "right"),
            ("wheel", "middle"),
            ("back", "back"),
            ("forward", "forward"),
        ] {
            assert_eq!(
                lower(json!({"type": "click", "x": 640, "y": 360, "button": b})).unwrap(),
                vec![click(960, 540, want, 1)]
            );
        }
        assert_eq!(
            lower(json!({"type": "click", "x": 0, "y": 0})).unwrap(),
            vec![click(0, 0, "left", 1)],
            "the button defaults to left"
        );
        assert_eq!(
            lower(json!({"type": "double_click", "x": 2, "y": 2})).unwrap(),
            vec![click(3, 3, "left", 2)]
        );
        assert_eq!(
            lower(json!({"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 10, "y": 20}, {"x": 640, "y": 360}]}))
                .unwrap(),
            vec![InputAction::Drag {
                path: vec![[0, 0], [15, 30], [960, 540]],
                button: Button::default(),
                modifiers: Vec::new()
            }]
        );
        assert!(
            lower(json!({"type": "drag", "path": [{"x": 0, "y": 0}]}))
                .unwrap_err()
                .to_string()
                .contains("at least two")
        );
        assert!(
            lower(json!({"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 1280, "y": 0}]}))
                .unwrap_err()
                .to_string()
                .contains("path[1] (1280, 0) is outside the 1280x720 screen")
        );
        assert_eq!(
            lower(json!({"type": "keypress", "keys": ["CTRL", "SHIFT", "T"]})).unwrap(),
            vec![InputAction::Key {
                keys: "Control_L+Shift_L+t".into(),
                repeat: None
            }]
        );
        let e = lower(json!({"type": "keypress", "keys": ["CTRL", "HYPER"]})).unwrap_err();
        assert!(e.to_string().contains("unknown key \"HYPER\""), "{e}");
        assert!(lower(json!({"type": "keypress", "keys": []})).is_err());
        assert_eq!(
            lower(json!({"type": "move", "x": 1279, "y": 719})).unwrap(),
            vec![InputAction::Move { x: 1919, y: 1079 }]
        );
        assert!(lower(json!({"type": "move", "x": -1, "y": 0})).is_err());
        assert_eq!(lower(json!({"type": "screenshot"})).unwrap(), vec![]);
        assert_eq!(
            lower(json!({"type": "type", "text": "hé"})).unwrap(),
            vec![InputAction::Type { text: "hé".into() }]
        );
        assert_eq!(
            lower(json!({"type": "wait"})).unwrap(),
            vec![InputAction::Wait { ms: 1000 }]
        );
        assert_eq!(
            lower(json!({"type": "wait", "ms": 250})).unwrap(),
            vec![InputAction::Wait { ms: 250 }]
        );
        assert!(lower(json!({"type": "wait", "ms": 60001})).is_err());
    }

    #[test]
    fn scroll_pixels_become_wheel_clicks_with_openais_signs() {
        assert_eq!(scroll_clicks(0, "s").unwrap(), (0, true));
        assert_eq!(
            scroll_clicks(1, "s").unwrap(),
            (1, true),
            "any movement scrolls"
        );
        assert_eq!(scroll_clicks(179, "s").unwrap(), (1, true));
        assert_eq!(scroll_clicks(180, "s").unwrap(), (2, true));
        assert_eq!(scroll_clicks(-300, "s").unwrap(), (3, false));
        assert_eq!(scroll_clicks(12_000, "s").unwrap(), (100, true));
        assert!(
            scroll_clicks(12_060, "scroll_y")
                .unwrap_err()
                .to_string()
                .contains("scroll_y 12060 is more than 100 wheel clicks of 120 px")
        );
        assert!(scroll_clicks(i64::MIN, "s").is_err());
        let s = space((800, 600), (800, 600));
        let scroll = |sx, sy| {
            lower_openai(
                &OpenAiAction::Scroll(OpenAiScroll {
                    x: 10,
                    y: 20,
                    scroll_x: sx,
                    scroll_y: sy,
                }),
                &s,
            )
            .unwrap()
        };
        let wheel = |direction: &str, amount| InputAction::Scroll {
            x: None,
            y: None,
            direction: direction.into(),
            amount: Some(amount),
            modifiers: Vec::new(),
        };
        let at = InputAction::Move { x: 10, y: 20 };
        assert_eq!(scroll(0, 300), vec![at.clone(), wheel("down", 3)]);
        assert_eq!(scroll(0, -200), vec![at.clone(), wheel("up", 2)]);
        assert_eq!(scroll(100, 0), vec![at.clone(), wheel("right", 1)]);
        assert_eq!(
            scroll(-500, 100),
            vec![at.clone(), wheel("down", 1), wheel("left", 4)]
        );
        assert_eq!(scroll(0, 0), vec![at], "no amount: the pointer only moves");
    }

    fn batch(actions: Value) -> ComputerBatch {
        match parse(json!({ "actions": actions })).unwrap() {
            ComputerBody::Batch(b) => b,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_batch_is_checked_whole_before_it_runs() {
        let s = space((800, 600), (800, 600));
        let steps = plan_batch(
            &batch(json!([
                {"type": "move", "x": 1, "y": 2},
                {"action": "screenshot"},
                {"action": "key", "text": "ctrl+a"},
                {"type": "screenshot"},
                {"action": "zoom", "region": [0, 0, 10, 10]}
            ])),
            &s,
        )
        .unwrap();
        let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["move", "screenshot", "key", "screenshot", "zoom"]);
        assert_eq!(steps[1].plan, Plan::Input(vec![]), "screenshots are no-ops");
        assert!(matches!(steps[4].plan, Plan::Zoom(_)));
        let bad = |actions: Value| plan_batch(&batch(actions), &s).unwrap_err().to_string();
        let e =
            bad(json!([{"type": "move", "x": 1, "y": 2}, {"type": "keypress", "keys": ["NOPE"]}]));
        assert!(
            e.starts_with("actions[1] (keypress): unknown key \"NOPE\""),
            "{e}"
        );
        let e = bad(json!([{"action": "key", "text": "ctrl+bogus"}]));
        assert!(
            e.starts_with("actions[0] (key): unknown key \"bogus\""),
            "{e}"
        );
        let e = bad(json!([{"action": "scroll", "scroll_direction": "sideways"}]));
        assert!(e.contains("sideways"), "{e}");
        let e = bad(json!([{"action": "left_click", "coordinate": [5, 5], "text": "hyper"}]));
        assert!(e.contains("hyper"), "{e}");
        let e = bad(json!([{"action": "cursor_position"}, {"type": "move", "x": 1, "y": 2}]));
        assert!(
            e.starts_with("actions[0] (cursor_position): zoom and cursor_position"),
            "{e}"
        );
        let e = bad(json!([{"action": "juggle"}]));
        assert!(e.starts_with("actions[0] (juggle): unknown action"), "{e}");
        let e = bad(json!([
            {"type": "wait", "ms": 30000},
            {"action": "wait", "duration": 20},
            {"action": "hold_key", "text": "a", "duration": 11}
        ]));
        assert!(e.contains("add up to 61000 ms"), "{e}");
        let mut b = batch(json!([{"action": "screenshot"}]));
        if let ComputerAction::Anthropic(r) = &mut b.actions[0] {
            r.display_width_px = Some(10);
        }
        assert!(
            plan_batch(&b, &s)
                .unwrap_err()
                .to_string()
                .contains("top level")
        );
    }

    #[test]
    fn batches_of_only_openai_actions_answer_in_openais_shape() {
        assert_eq!(
            batch_dialect(&batch(json!([{"type": "screenshot"}, {"type": "wait"}]))),
            Dialect::OpenAi
        );
        assert_eq!(
            batch_dialect(&batch(
                json!([{"type": "screenshot"}, {"action": "screenshot"}])
            )),
            Dialect::Anthropic
        );
        let body = serde_json::to_value(ComputerAnswer::OpenAi(OpenAiComputerResponse {
            image_url: Some("data:image/png;base64,AA==".into()),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(
            body,
            json!({"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="})
        );
        // The protocol's types serialise back to what the parser reads.
        let req = ComputerBody::Batch(ComputerBatch {
            actions: vec![
                ComputerAction::OpenAi(OpenAiAction::Move(OpenAiAt { x: 1, y: 2 })),
                ComputerAction::OpenAi(OpenAiAction::Keypress(OpenAiKeypress {
                    keys: vec!["CTRL".into(), "C".into()],
                })),
                ComputerAction::OpenAi(OpenAiAction::Wait(OpenAiWait::default())),
            ],
            display_width_px: Some(10),
            display_height_px: Some(10),
        });
        let v = serde_json::to_value(&req).unwrap();
        assert_eq!(v["actions"][0], json!({"type": "move", "x": 1, "y": 2}));
        assert_eq!(v["actions"][2], json!({"type": "wait"}));
        assert_eq!(parse(v).unwrap(), req);
    }
}
