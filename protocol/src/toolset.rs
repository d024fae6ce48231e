//! Anthropic's toolsets as the agent serves them (`/v1/toolsets/{family}`): the `tools[]` entry
//! an engine sends, and a model turn's `tool_use` blocks answered with the `tool_result` blocks
//! the `anthropic` SDK's own drivers build, to the text.
//!
//! The member table, the acknowledgments of pure actions and the fixed refusals are the SDK's
//! (`anthropic.lib.tools._toolsets`, package 2.10): a result answered here is the one the SDK
//! would have built had it run the member itself.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The computer toolset's `tools[]` type.
pub const COMPUTER_TOOLSET_TYPE: &str = "computer_toolset_20260801";
/// The computer toolset's family: the `toolset_name` of its `tool_use` and `tool_result` blocks.
pub const COMPUTER_FAMILY: &str = "computer";

/// What a member answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultKind {
    /// A pure action: its acknowledgment (a template filled from the input).
    Ack(&'static str),
    /// An image block.
    Image,
    /// The cursor as `X={x},Y={y}`.
    Point,
}

/// Every computer member, in the SDK's order, with what it answers.
pub const COMPUTER_MEMBERS: [(&str, ResultKind); 17] = [
    ("key", ResultKind::Ack("Pressed {text}.")),
    ("hold_key", ResultKind::Ack("Held {text} for {duration}s.")),
    ("type", ResultKind::Ack("Typed.")),
    ("cursor_position", ResultKind::Point),
    ("mouse_move", ResultKind::Ack("Moved the mouse.")),
    (
        "left_mouse_down",
        ResultKind::Ack("Left mouse button pressed."),
    ),
    (
        "left_mouse_up",
        ResultKind::Ack("Left mouse button released."),
    ),
    ("left_click", ResultKind::Ack("Clicked.")),
    ("left_click_drag", ResultKind::Ack("Dragged.")),
    ("right_click", ResultKind::Ack("Right-clicked.")),
    ("middle_click", ResultKind::Ack("Middle-clicked.")),
    ("double_click", ResultKind::Ack("Double-clicked.")),
    ("triple_click", ResultKind::Ack("Triple-clicked.")),
    ("scroll", ResultKind::Ack("Scrolled {scroll_direction}.")),
    ("wait", ResultKind::Ack("Waited {duration}s.")),
    ("screenshot", ResultKind::Image),
    ("zoom", ResultKind::Image),
];

/// What a computer member answers, `None` for a name that is not a member.
pub fn computer_member(name: &str) -> Option<ResultKind> {
    COMPUTER_MEMBERS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, k)| *k)
}

/// The browser toolset's `tools[]` type.
pub const BROWSER_TOOLSET_TYPE: &str = "browser_toolset_20260801";
/// The browser toolset's family.
pub const BROWSER_FAMILY: &str = "browser";

/// What a browser member answers (the SDK's result kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrowserResult {
    /// A pure action: its acknowledgment (a template filled from the input).
    Ack(&'static str),
    /// `Navigated to {url} — {title} (HTTP {status})`.
    Navigate,
    /// An image block.
    Image,
    /// Page text (`(empty)` when there is none).
    Text,
    /// Nothing but the `browser_state` block (the tab members).
    StateOnly,
}

/// Every browser member, in the SDK's order: what it answers and whether the API serves it
/// unless `configs` turns it off (the optional four are off unless enabled).
pub const BROWSER_MEMBERS: [(&str, BrowserResult, bool); 31] = [
    ("navigate", BrowserResult::Navigate, true),
    ("screenshot", BrowserResult::Image, true),
    ("zoom", BrowserResult::Image, true),
    ("left_click", BrowserResult::Ack("Clicked."), true),
    ("right_click", BrowserResult::Ack("Right-clicked."), true),
    ("middle_click", BrowserResult::Ack("Middle-clicked."), true),
    ("double_click", BrowserResult::Ack("Double-clicked."), true),
    ("triple_click", BrowserResult::Ack("Triple-clicked."), true),
    ("hover", BrowserResult::Ack("Hovered."), true),
    ("left_click_drag", BrowserResult::Ack("Dragged."), true),
    (
        "left_mouse_down",
        BrowserResult::Ack("Mouse button pressed."),
        true,
    ),
    (
        "left_mouse_up",
        BrowserResult::Ack("Mouse button released."),
        true,
    ),
    ("mouse_move", BrowserResult::Ack("Moved the mouse."), true),
    (
        "scroll",
        BrowserResult::Ack("Scrolled {scroll_direction}."),
        true,
    ),
    ("scroll_to", BrowserResult::Ack("Scrolled to {ref}."), true),
    ("type", BrowserResult::Ack("Typed."), true),
    ("key", BrowserResult::Ack("Pressed {text}."), true),
    (
        "hold_key",
        BrowserResult::Ack("Held {text} for {duration}s."),
        true,
    ),
    (
        "form_input",
        BrowserResult::Ack("Set the value of {ref}."),
        true,
    ),
    ("read_page", BrowserResult::Text, true),
    ("find", BrowserResult::Text, true),
    ("get_page_text", BrowserResult::Text, true),
    ("wait", BrowserResult::Ack("Waited {duration}s."), true),
    ("file_upload", BrowserResult::Ack("Uploaded."), false),
    ("read_console", BrowserResult::Text, false),
    ("read_network", BrowserResult::Text, false),
    ("javascript_exec", BrowserResult::Text, false),
    ("new_tab", BrowserResult::StateOnly, true),
    ("list_tabs", BrowserResult::StateOnly, true),
    ("switch_tab", BrowserResult::StateOnly, true),
    ("close_tab", BrowserResult::StateOnly, true),
];

/// What a browser member answers, `None` for a name that is not a member.
pub fn browser_member(name: &str) -> Option<BrowserResult> {
    BROWSER_MEMBERS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, k, _)| *k)
}

/// The optional browser members (served only where an agent's configuration enables them).
pub fn browser_optional() -> impl Iterator<Item = &'static str> {
    BROWSER_MEMBERS
        .iter()
        .filter(|(_, _, on)| !on)
        .map(|(n, _, _)| *n)
}

/// Checks a list of optional browser members to enable (empty names are ignored): the first
/// name that is not one, explained.
pub fn check_browser_enable(names: &[String]) -> Result<(), String> {
    match names
        .iter()
        .find(|n| !n.is_empty() && !browser_optional().any(|o| o == n.as_str()))
    {
        Some(bad) => Err(format!(
            "{bad:?} is not an optional browser toolset member (those are {})",
            browser_optional().collect::<Vec<_>>().join(", ")
        )),
        None => Ok(()),
    }
}

/// The browser family's result for every `tool_use` after a turn's first failure.
pub const BROWSER_NOT_EXECUTED: &str = "Not executed: an earlier action in this turn failed.";

/// The refusal of a member this environment does not serve (an optional one not enabled).
pub fn unavailable_member(family: &str, name: &str) -> String {
    format!("The {family} toolset member '{name}' is not available in this environment.")
}

/// The API's limit for a text field, a URL, and an error text.
pub const FIELD_MAX: usize = 4096;

/// `s` on one line, trimmed and cut to [`FIELD_MAX`] characters (a page's title, a line the
/// model reads).
pub fn bounded_line(s: &str) -> String {
    one_line(s).trim().chars().take(FIELD_MAX).collect()
}

/// A tab's URL as the model reads it: on one line, and a longer one as `…` and its first
/// characters.
pub fn bounded_url(url: &str) -> String {
    let line = one_line(url).trim().to_string();
    if line.chars().count() <= FIELD_MAX {
        line
    } else {
        std::iter::once('\u{2026}')
            .chain(line.chars().take(FIELD_MAX - 1))
            .collect()
    }
}

/// The result for every `tool_use` after the first failure of a turn (a plain string, as the
/// SDK's runner sends it).
pub const COMPUTER_NOT_EXECUTED: &str =
    "Not executed: an earlier computer action in this turn failed.";

/// The refusal of a name the family does not have.
pub fn unknown_member(family: &str, name: &str) -> String {
    format!(
        "Error: unknown {family} toolset member '{}'",
        one_line(name)
    )
}

/// The refusal of a bad input: the member and each problem as `field: problem`.
pub fn invalid_input(family: &str, member: &str, problem: &str) -> String {
    format!("invalid input for {family} member '{member}': {problem}")
}

/// `s` on one line: control, line-separator and bidi characters become spaces (what the SDK
/// does to text it puts in front of the model).
pub fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control()
                || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}')
                || ('\u{202a}'..='\u{202e}').contains(&c)
                || ('\u{2066}'..='\u{2069}').contains(&c)
            {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// A pure action's acknowledgment: `template`'s `{text}`, `{duration}`, `{scroll_direction}` and
/// `{ref}` (the input's `target.ref`)
/// filled in one pass from `input` (a value that looks like a placeholder stays as written; a
/// whole number reads without a fraction).
pub fn acknowledgment(template: &str, input: &Value) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        let field = ["text", "duration", "scroll_direction", "ref"]
            .into_iter()
            .find(|f| after[1..].starts_with(f) && after[1 + f.len()..].starts_with('}'));
        match field {
            Some(f) => {
                let value = if f == "ref" {
                    input.get("target").and_then(|t| t.get("ref"))
                } else {
                    input.get(f)
                };
                out.push_str(&one_line(&field_text(value)));
                rest = &after[f.len() + 2..];
            }
            None => {
                out.push('{');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn field_text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            _ => n.to_string(),
        },
        Some(other) => other.to_string(),
    }
}

/// A text content block.
pub fn text_block(text: impl Into<String>) -> Value {
    json!({"type": "text", "text": text.into()})
}

/// An image content block around base64 `data`.
pub fn image_block(data: String, media_type: &str) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}})
}

/// The `tool_result` answering `tool_use` (its `id` and `toolset_name` echoed).
pub fn tool_result(tool_use: &Value, content: Value, is_error: bool) -> Value {
    let mut block = json!({
        "type": "tool_result",
        "tool_use_id": tool_use.get("id").cloned().unwrap_or(Value::Null),
        "toolset_name": tool_use.get("toolset_name").cloned().unwrap_or(Value::Null),
        "content": content,
    });
    if is_error {
        block["is_error"] = Value::Bool(true);
    }
    block
}

/// `POST /v1/toolsets/{family}`'s body and answer: a model reply's `content` as it came (the
/// family's `tool_use` blocks run in order, other blocks are ignored), answered with one
/// `tool_result` per such `tool_use`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ToolsetTurn {
    pub content: Vec<Value>,
}

/// `GET /v1/toolsets/browser`: the `tools[]` entry to send as it is, and what it drives.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct BrowserToolsetInfo {
    /// The `tools[]` entry (`type`, and `configs` enabling the optional members this agent
    /// serves).
    pub tool: Value,
    /// The members this agent serves.
    pub members: Vec<String>,
    /// The browser's viewport, in CSS pixels, and the screenshots the toolset answers (the
    /// viewport fitted to the model's image limits): member coordinates are in these pixels.
    pub viewport_width_px: u32,
    pub viewport_height_px: u32,
    pub screenshot_width_px: u32,
    pub screenshot_height_px: u32,
}

/// `GET /v1/toolsets/computer`: the `tools[]` entry to send as it is, and the screen it drives.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ComputerToolsetInfo {
    /// The `tools[]` entry (`type`, and `configs` turning off any member this desktop lacks).
    pub tool: Value,
    /// The display, in pixels.
    pub display_width_px: u32,
    pub display_height_px: u32,
    /// The screenshots the toolset answers (the display fitted to the model's image limits);
    /// member coordinates are in these pixels.
    pub screenshot_width_px: u32,
    pub screenshot_height_px: u32,
    /// The members this desktop serves.
    pub members: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledgments_are_the_sdks() {
        let ack = |name: &str, input: Value| match computer_member(name) {
            Some(ResultKind::Ack(t)) => acknowledgment(t, &input),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(ack("key", json!({"text": "ctrl+s"})), "Pressed ctrl+s.");
        assert_eq!(
            ack("hold_key", json!({"text": "shift", "duration": 2})),
            "Held shift for 2s."
        );
        assert_eq!(ack("wait", json!({"duration": 2.0})), "Waited 2s.");
        assert_eq!(
            ack("scroll", json!({"scroll_direction": "down"})),
            "Scrolled down."
        );
        // A value that looks like a placeholder stays data; line breaks fold.
        assert_eq!(
            ack("key", json!({"text": "{duration}\nx"})),
            "Pressed {duration} x."
        );
        assert_eq!(ack("left_click", json!({})), "Clicked.");
        let Some(BrowserResult::Ack(t)) = browser_member("scroll_to") else {
            panic!()
        };
        assert_eq!(
            acknowledgment(t, &json!({"target": {"type": "ref", "ref": "ref_7"}})),
            "Scrolled to ref_7."
        );
        assert_eq!(BROWSER_MEMBERS.iter().filter(|(_, _, on)| *on).count(), 27);
        assert_eq!(bounded_url(&"a".repeat(5000)).chars().count(), FIELD_MAX);
        assert!(bounded_url(&"a".repeat(5000)).starts_with('\u{2026}'));
        assert_eq!(computer_member("zoom"), Some(ResultKind::Image));
        assert_eq!(computer_member("navigate"), None);
        assert_eq!(
            unknown_member("computer", "fly\n"),
            "Error: unknown computer toolset member 'fly '"
        );
    }

    #[test]
    fn results_echo_the_tool_use() {
        let tu = json!({"type": "tool_use", "id": "toolu_1", "name": "left_click",
                        "toolset_name": "computer", "input": {}});
        let r = tool_result(&tu, json!([text_block("Clicked.")]), false);
        assert_eq!(
            r,
            json!({"type": "tool_result", "tool_use_id": "toolu_1", "toolset_name": "computer",
                   "content": [{"type": "text", "text": "Clicked."}]})
        );
        assert_eq!(
            tool_result(&tu, json!(COMPUTER_NOT_EXECUTED), true)["is_error"],
            true
        );
    }
}
