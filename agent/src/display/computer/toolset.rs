//! Anthropic's computer toolset (`computer_toolset_20260801`) run in the guest: a model turn's
//! `tool_use` blocks for the `computer` family, run in order and answered with the
//! `tool_result` blocks the `anthropic` SDK's driver would build (see `berth_protocol::toolset`).
//!
//! - Coordinates are in the toolset's screenshot pixels: the display fitted to the model's image
//!   limits ([`fit`]), mapped to the display and back.
//! - Every input is checked as the SDK's types define it before the member runs; a bad field, a
//!   coordinate outside the screenshot, a bad `duration`, `repeat` or `scroll_amount` is an
//!   `is_error` result naming the field (never clamped), and the turn stops there: every later
//!   `tool_use` is answered "not executed".
//! - The screen settles before a member reads it (`screenshot`, `zoom`) and once after the
//!   turn's last action, never between two actions but after keys (a shortcut moves the focus).
//! - Error texts are fixed phrases: no screen content, host names or tokens.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_protocol::toolset::{
    COMPUTER_FAMILY, COMPUTER_MEMBERS, COMPUTER_NOT_EXECUTED, COMPUTER_TOOLSET_TYPE,
    ComputerToolsetInfo, ResultKind, acknowledgment, computer_member, image_block, invalid_input,
    text_block, tool_result, unknown_member,
};
use berth_protocol::{Button, InputAction};
use serde_json::{Value, json};

use super::{
    KEY_SETTLE_TIMEOUT, MAX_SCROLL_CLICKS, MAX_TEXT, MAX_WAIT, SETTLE_TIMEOUT, Space, Trace, b64,
    blocking, is_key, shot, waits,
};
use crate::display::{Display, DisplayError, ShotRequest, keys};
pub use crate::toolset_input::calls;
use crate::toolset_input::{Fields, check};

/// The model's image limits: the longest edge and the most pixels an image may have before the
/// API scales it down (which would move every coordinate the model reads off it).
pub const MAX_EDGE: u32 = 1568;
pub const MAX_PIXELS: u64 = 1_150_000;
/// The most times `key` repeats.
pub const MAX_REPEAT: i64 = 100;

/// The size a `w`×`h` image is answered at: scaled down (never up) to fit [`MAX_EDGE`] and
/// [`MAX_PIXELS`], keeping its aspect.
pub fn fit(w: u32, h: u32) -> (u32, u32) {
    scale_to_budget(w, h, false)
}

/// `zoom`'s size for a `w`×`h` region of the display: scaled to fill the budget, up as well as
/// down, so fine detail becomes legible.
pub fn zoom_size(w: u32, h: u32) -> (u32, u32) {
    scale_to_budget(w, h, true)
}

fn scale_to_budget(w: u32, h: u32, up: bool) -> (u32, u32) {
    let (wf, hf) = (w.max(1) as f64, h.max(1) as f64);
    let s = (MAX_EDGE as f64 / wf.max(hf)).min((MAX_PIXELS as f64 / (wf * hf)).sqrt());
    let s = if up { s } else { s.min(1.0) };
    let side = |v: f64| ((v * s).floor() as u32).max(1);
    let (mut ow, mut oh) = (side(wf), side(hf));
    // Rounding never pushes the image over the budget.
    while ow as u64 * oh as u64 > MAX_PIXELS {
        ow -= 1;
        oh = ((ow as f64) * hf / wf).floor().max(1.0) as u32;
    }
    (ow, oh)
}

/// The display and the screenshot space the model works in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Screen {
    pub display: (u32, u32),
    pub shot: (u32, u32),
}

impl Screen {
    pub fn of(display: (u32, u32)) -> Screen {
        Screen {
            display,
            shot: fit(display.0, display.1),
        }
    }

    /// The coordinate space the dialects share: the screenshot is the engine's view.
    fn space(self) -> Space {
        Space {
            screen: self.display,
            engine: self.shot,
        }
    }

    /// A screenshot point (or, with `end`, a region's exclusive end) on the display; `None`
    /// outside the screenshot.
    fn to_display(self, x: i64, y: i64, end: bool) -> Option<(i32, i32)> {
        self.space().map([x, y], "", end).ok()
    }

    fn to_shot(self, p: (i32, i32)) -> (i64, i64) {
        self.space().to_engine(p)
    }

    /// The `tools[]` entry and what it drives.
    pub fn info(self) -> ComputerToolsetInfo {
        ComputerToolsetInfo {
            tool: json!({"type": COMPUTER_TOOLSET_TYPE}),
            display_width_px: self.display.0,
            display_height_px: self.display.1,
            screenshot_width_px: self.shot.0,
            screenshot_height_px: self.shot.1,
            members: COMPUTER_MEMBERS
                .iter()
                .map(|(n, _)| n.to_string())
                .collect(),
        }
    }
}

/// What one member call becomes once checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Input(Vec<InputAction>),
    Screenshot(ShotRequest),
    Zoom(ShotRequest),
    Cursor,
}

impl Fields<'_> {
    fn point(&mut self, field: &str, required: bool, screen: &Screen) -> Option<(i32, i32)> {
        let [x, y] = self.ints::<2>(field, required, "[x, y]")?;
        let at = screen.to_display(x, y, false);
        if at.is_none() {
            let (w, h) = screen.shot;
            self.problem(
                field,
                format!("({x}, {y}) is outside the {w}x{h} screenshot"),
            );
        }
        at
    }

    /// Modifier keys held during a click or scroll (`text`: `shift`, `ctrl+shift`).
    fn modifiers(&mut self) -> Vec<String> {
        let Some(text) = self.string("text", false) else {
            return Vec::new();
        };
        let mods: Vec<String> = text
            .split('+')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if let Some(bad) = mods.iter().find(|k| keys::keysym(k).is_none()) {
            self.problem("text", format!("unknown key {bad:?}"));
        }
        mods
    }
}

/// A member call checked against the SDK's input types and the screen: what it runs, or the
/// refusal the model reads. Pure.
pub fn plan(name: &str, input: &Value, screen: &Screen) -> Result<Op, String> {
    if computer_member(name).is_none() {
        return Err(unknown_member(COMPUTER_FAMILY, name));
    }
    check(COMPUTER_FAMILY, name, input, |f| lower(name, f, screen))
}

fn lower(name: &str, f: &mut Fields, screen: &Screen) -> Option<Op> {
    let max_wait = MAX_WAIT.as_secs() as i64;
    match name {
        "key" => lower_key(f),
        "hold_key" => lower_hold_key(f, max_wait),
        "type" => {
            let text = f.string("text", true)?;
            if text.len() > MAX_TEXT {
                f.problem("text", "at most 1 MiB");
                return None;
            }
            Some(Op::Input(vec![InputAction::Type { text }]))
        }
        "cursor_position" => Some(Op::Cursor),
        "mouse_move" => {
            let (x, y) = f.point("coordinate", true, screen)?;
            Some(Op::Input(vec![InputAction::Move { x, y }]))
        }
        "left_mouse_down" => Some(Op::Input(vec![InputAction::ButtonDown {
            button: Button::default(),
        }])),
        "left_mouse_up" => Some(Op::Input(vec![InputAction::ButtonUp {
            button: Button::default(),
        }])),
        "left_click" => lower_click(f, screen, "left", 1),
        "right_click" => lower_click(f, screen, "right", 1),
        "middle_click" => lower_click(f, screen, "middle", 1),
        "double_click" => lower_click(f, screen, "left", 2),
        "triple_click" => lower_click(f, screen, "left", 3),
        "left_click_drag" => lower_drag(f, screen),
        "scroll" => lower_scroll(f, screen),
        "wait" => {
            let secs = f.ranged("duration", true, 0, max_wait, " seconds")?;
            Some(Op::Input(vec![InputAction::Wait {
                ms: secs as u64 * 1000,
            }]))
        }
        "screenshot" => Some(Op::Screenshot(ShotRequest {
            size: (screen.shot != screen.display).then_some(screen.shot),
            ..Default::default()
        })),
        "zoom" => lower_zoom(f, screen),
        _ => None,
    }
}

/// `key`: each whitespace-separated chord of `text` tapped in turn, `repeat` times each.
fn lower_key(f: &mut Fields) -> Option<Op> {
    let text = f.string("text", true);
    let repeat = f.ranged("repeat", false, 1, MAX_REPEAT, "");
    let text = text?;
    let keys: Vec<&str> = text.split_whitespace().collect();
    if keys.is_empty() {
        f.problem("text", "empty key name");
        return None;
    }
    for k in &keys {
        if let Err(e) = keys::chord(k) {
            f.problem("text", e);
            return None;
        }
    }
    Some(Op::Input(
        keys.into_iter()
            .map(|k| InputAction::Key {
                keys: k.to_string(),
                repeat: repeat.map(|r| r as u32),
            })
            .collect(),
    ))
}

/// `hold_key`: the chord `text` held for `duration` seconds (at most `max_wait`).
fn lower_hold_key(f: &mut Fields, max_wait: i64) -> Option<Op> {
    let text = f.string("text", true);
    let secs = f.ranged("duration", true, 0, max_wait, " seconds");
    let text = text?;
    if let Err(e) = keys::chord(&text) {
        f.problem("text", e);
        return None;
    }
    Some(Op::Input(vec![InputAction::Hold {
        keys: text,
        duration_ms: secs? as u64 * 1000,
    }]))
}

/// The click members: `count` clicks of `button`, at the optional `coordinate`, with the
/// modifiers of `text` held.
fn lower_click(f: &mut Fields, screen: &Screen, button: &str, count: u32) -> Option<Op> {
    let at = f.point("coordinate", false, screen);
    let modifiers = f.modifiers();
    Some(Op::Input(vec![InputAction::Click {
        x: at.map(|p| p.0),
        y: at.map(|p| p.1),
        button: Button::Name(button.into()),
        count: Some(count),
        modifiers,
    }]))
}

/// `left_click_drag`: a left-button drag from `start_coordinate` to `coordinate`.
fn lower_drag(f: &mut Fields, screen: &Screen) -> Option<Op> {
    let from = f.point("start_coordinate", true, screen);
    let to = f.point("coordinate", true, screen);
    let modifiers = f.modifiers();
    let (from, to) = (from?, to?);
    Some(Op::Input(vec![InputAction::Drag {
        path: vec![[from.0, from.1], [to.0, to.1]],
        button: Button::default(),
        modifiers,
    }]))
}

/// `scroll`: `scroll_amount` wheel clicks toward `scroll_direction`, at the optional
/// `coordinate`.
fn lower_scroll(f: &mut Fields, screen: &Screen) -> Option<Op> {
    let amount = f.ranged("scroll_amount", true, 1, MAX_SCROLL_CLICKS as i64, "");
    let direction = f.string("scroll_direction", true);
    let at = f.point("coordinate", false, screen);
    let modifiers = f.modifiers();
    let direction = direction?;
    if !["up", "down", "left", "right"].contains(&direction.as_str()) {
        f.problem(
            "scroll_direction",
            "Input should be 'up', 'down', 'left' or 'right'",
        );
        return None;
    }
    Some(Op::Input(vec![InputAction::Scroll {
        x: at.map(|p| p.0),
        y: at.map(|p| p.1),
        direction,
        amount: Some(amount? as u32),
        modifiers,
    }]))
}

/// `zoom`: a screenshot-space `region` captured from the display and scaled to fill the
/// image budget.
fn lower_zoom(f: &mut Fields, screen: &Screen) -> Option<Op> {
    let [x0, y0, x1, y1] = f.region(screen.shot)?;
    let (Some(a), Some(b)) = (
        screen.to_display(x0, y0, false),
        screen.to_display(x1, y1, true),
    ) else {
        return None;
    };
    let (rw, rh) = ((b.0 - a.0).max(1) as u32, (b.1 - a.1).max(1) as u32);
    Some(Op::Zoom(ShotRequest {
        region: Some((a.0, a.1, rw, rh)),
        size: Some(zoom_size(rw, rh)),
        ..Default::default()
    }))
}

/// How long an op waits or holds keys on purpose.
fn op_waits(op: &Op) -> Duration {
    match op {
        Op::Input(actions) => waits(actions),
        _ => Duration::ZERO,
    }
}

/// A turn's answer, and what ran (for the episode log).
pub struct TurnAnswer {
    pub content: Vec<Value>,
    /// The calls that ran, as Anthropic computer actions (`action` and the input's fields).
    pub ran: Vec<Value>,
    pub trace: Trace,
    /// The first failure's text.
    pub error: Option<String>,
}

/// The screen the toolset drives.
pub async fn screen(d: &Arc<Display>) -> Result<Screen, DisplayError> {
    let d = d.clone();
    Ok(Screen::of(blocking(move || d.screen_size()).await?))
}

/// Runs a turn's calls (from [`calls`]) in order, stopping at the first failure.
/// Prepends `text` and a fresh screenshot (in the toolset's screenshot size) to the first
/// `tool_result` of `answer`: what a turn answers after a person handed the controls back.
pub async fn prepend_notice(
    d: &Arc<Display>,
    answer: &mut TurnAnswer,
    text: String,
) -> Result<(), DisplayError> {
    let screen = screen(d).await?;
    let req = ShotRequest {
        size: (screen.shot != screen.display).then_some(screen.shot),
        ..Default::default()
    };
    let shot = shot(d, req).await?;
    let blocks = [text_block(text), image_block(b64(&shot), shot.mime)];
    if let Some(content) = answer
        .content
        .first_mut()
        .and_then(|r| r.get_mut("content"))
        .and_then(Value::as_array_mut)
    {
        content.splice(0..0, blocks);
    }
    Ok(())
}

pub async fn run_turn(d: &Arc<Display>, calls: &[Value]) -> Result<TurnAnswer, DisplayError> {
    let mut answer = TurnAnswer {
        content: Vec::with_capacity(calls.len()),
        ran: Vec::new(),
        trace: Trace::default(),
        error: None,
    };
    if calls.is_empty() {
        return Ok(answer);
    }
    let screen = screen(d).await?;
    // The start of the input the screen has yet to settle after, and whether it pressed keys.
    let mut unsettled: Option<(Instant, bool)> = None;
    let mut waited = Duration::ZERO;
    for call in calls {
        if answer.error.is_some() {
            answer
                .content
                .push(tool_result(call, json!(COMPUTER_NOT_EXECUTED), true));
            continue;
        }
        let name = call["name"].as_str().unwrap_or_default();
        let input = call.get("input").cloned().unwrap_or(Value::Null);
        let planned = plan(name, &input, &screen).and_then(|op| {
            waited += op_waits(&op);
            if waited > MAX_WAIT {
                Err(invalid_input(
                    COMPUTER_FAMILY,
                    name,
                    &format!(
                        "duration: the turn's waits would pass {} seconds",
                        MAX_WAIT.as_secs()
                    ),
                ))
            } else {
                Ok(op)
            }
        });
        let result = match planned {
            Err(e) => Err(e),
            Ok(op) => {
                let mut action = input.as_object().cloned().unwrap_or_default();
                action.insert("action".into(), json!(name));
                answer.ran.push(Value::Object(action));
                let started = Instant::now();
                let ran = run_op(
                    d,
                    &screen,
                    name,
                    &input,
                    op,
                    &mut unsettled,
                    &mut answer.trace,
                )
                .await;
                answer.trace.steps.push((started, started.elapsed()));
                ran
            }
        };
        match result {
            Ok(content) => answer.content.push(tool_result(call, content, false)),
            Err(e) => {
                answer
                    .content
                    .push(tool_result(call, json!([text_block(e.clone())]), true));
                answer.error = Some(e);
            }
        }
    }
    if let Some((since, _)) = unsettled {
        answer.trace.settled = Some(d.settle(since, None, SETTLE_TIMEOUT).await);
    }
    Ok(answer)
}

async fn run_op(
    d: &Arc<Display>,
    screen: &Screen,
    name: &str,
    input: &Value,
    op: Op,
    unsettled: &mut Option<(Instant, bool)>,
    trace: &mut Trace,
) -> Result<Value, String> {
    match op {
        Op::Input(actions) => {
            // After keys, the next input waits for the focus to move (as a batch does).
            if let Some((since, true)) = *unsettled {
                d.settle(since, None, KEY_SETTLE_TIMEOUT).await;
            }
            let started = Instant::now();
            let keys = actions.iter().any(is_key);
            *unsettled = Some((started, keys));
            let runner = d.clone();
            blocking(move || runner.run_input(&actions))
                .await
                .map_err(|_| format!("The {name} action could not be performed on the display."))?;
            let Some(ResultKind::Ack(template)) = computer_member(name) else {
                return Ok(json!([]));
            };
            Ok(json!([text_block(acknowledgment(template, input))]))
        }
        Op::Screenshot(req) | Op::Zoom(req) => {
            if let Some((since, _)) = unsettled.take() {
                trace.settled = Some(d.settle(since, None, SETTLE_TIMEOUT).await);
            }
            let shot = shot(d, req)
                .await
                .map_err(|_| "The screen could not be captured.".to_string())?;
            trace.shot_at = Some(Instant::now());
            let block = image_block(b64(&shot), shot.mime);
            trace.shot = Some(shot);
            Ok(json!([block]))
        }
        Op::Cursor => {
            let runner = d.clone();
            let p = blocking(move || runner.pointer())
                .await
                .map_err(|_| "The cursor position could not be read.".to_string())?;
            let (x, y) = screen.to_shot(p);
            Ok(json!([text_block(format!("X={x},Y={y}"))]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HD: Screen = Screen {
        display: (1920, 1080),
        shot: (1429, 804),
    };

    #[test]
    fn screenshots_fit_the_models_image_limits() {
        assert_eq!(fit(1920, 1080), (1429, 804));
        assert_eq!(Screen::of((1920, 1080)), HD);
        assert_eq!(fit(1280, 720), (1280, 720));
        assert_eq!(fit(1024, 768), (1024, 768));
        let (w, h) = fit(3840, 2160);
        assert!(
            w <= MAX_EDGE && (w as u64 * h as u64) <= MAX_PIXELS,
            "{w}x{h}"
        );
        // zoom fills the budget, up as well as down.
        let (w, h) = zoom_size(200, 100);
        assert_eq!(w, 1516);
        assert!(h == 758 && (w as u64 * h as u64) <= MAX_PIXELS);
        assert_eq!(zoom_size(1920, 1080), (1429, 804));
    }

    #[test]
    fn coordinates_are_screenshot_pixels() {
        let Ok(Op::Input(a)) = plan("left_click", &json!({"coordinate": [1428, 803]}), &HD) else {
            panic!()
        };
        assert!(matches!(
            a[0],
            InputAction::Click {
                x: Some(1919),
                y: Some(1079),
                ..
            }
        ));
        let Ok(Op::Input(a)) = plan("mouse_move", &json!({"coordinate": [714, 402]}), &HD) else {
            panic!()
        };
        assert_eq!(a[0], InputAction::Move { x: 959, y: 540 });
        assert_eq!(HD.to_shot((1919, 1079)), (1428, 803));
        assert_eq!(HD.to_shot((959, 540)), (714, 402));
        let Ok(Op::Zoom(z)) = plan("zoom", &json!({"region": [0, 0, 1429, 804]}), &HD) else {
            panic!()
        };
        assert_eq!(z.region, Some((0, 0, 1920, 1080)));
    }

    #[test]
    fn bad_inputs_name_the_field_and_are_never_clamped() {
        let err = |name: &str, input: Value| plan(name, &input, &HD).unwrap_err();
        assert_eq!(
            err("left_click", json!({"coordinate": [1429, 10]})),
            "invalid input for computer member 'left_click': coordinate: (1429, 10) is outside \
             the 1429x804 screenshot"
        );
        assert_eq!(
            err("left_click", json!({"coordinate": [1, 2, 3]})),
            "invalid input for computer member 'left_click': coordinate: expected [x, y]"
        );
        assert_eq!(
            err(
                "scroll",
                json!({"scroll_direction": "down", "scroll_amount": 0})
            ),
            "invalid input for computer member 'scroll': scroll_amount: must be 1 to 100"
        );
        assert_eq!(
            err(
                "scroll",
                json!({"scroll_direction": "sideways", "scroll_amount": 2})
            ),
            "invalid input for computer member 'scroll': scroll_direction: Input should be 'up', \
             'down', 'left' or 'right'"
        );
        assert_eq!(
            err("wait", json!({"duration": 61})),
            "invalid input for computer member 'wait': duration: must be 0 to 60 seconds"
        );
        assert_eq!(
            err("wait", json!({"duration": 1.5})),
            "invalid input for computer member 'wait': duration: Input should be a valid integer"
        );
        assert_eq!(
            err("key", json!({"text": "ctrl+s", "repeat": 0})),
            "invalid input for computer member 'key': repeat: must be 1 to 100"
        );
        assert_eq!(
            err("left_click_drag", json!({})),
            "invalid input for computer member 'left_click_drag': start_coordinate: Field \
             required; coordinate: Field required"
        );
        assert_eq!(
            err("zoom", json!({"region": [10, 10, 10, 20]})),
            "invalid input for computer member 'zoom': region: expected x1 > x0 and y1 > y0"
        );
        assert!(
            err("key", json!({"text": "notakey"}))
                .starts_with("invalid input for computer member 'key': text: ")
        );
        assert_eq!(
            err("fly", json!({})),
            "Error: unknown computer toolset member 'fly'"
        );
        assert_eq!(
            err("type", json!("hello")),
            "invalid input for computer member 'type': Input should be a valid dictionary"
        );
        // Integral floats are integers, as the SDK's types take them.
        assert!(plan("wait", &json!({"duration": 2.0}), &HD).is_ok());
        assert!(plan("left_mouse_down", &json!(null), &HD).is_ok());
    }

    #[test]
    fn only_the_familys_tool_use_blocks_run() {
        let content = vec![
            json!({"type": "text", "text": "I'll click."}),
            json!({"type": "tool_use", "id": "a", "name": "left_click", "toolset_name": "computer", "input": {}}),
            json!({"type": "tool_use", "id": "b", "name": "navigate", "toolset_name": "browser", "input": {}}),
            json!({"type": "tool_use", "id": "c", "name": "my_tool", "input": {}}),
        ];
        let got = calls(&content, "computer").unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["id"], "a");
        let bad =
            vec![json!({"type": "tool_use", "name": "left_click", "toolset_name": "computer"})];
        assert_eq!(
            calls(&bad, "computer").unwrap_err(),
            "content[0]: a tool_use block needs a string `id` and `name`"
        );
        assert!(calls(&[json!(1)], "computer").is_err());
    }
}
