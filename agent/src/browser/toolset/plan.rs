//! A browser member call checked against the `anthropic` SDK's input types and the page's
//! viewport: what it runs, or the refusal the model reads. Pure.

use serde_json::{Map, Value};

use berth_protocol::toolset::{BROWSER_FAMILY, browser_member, unknown_member};

use super::keys::{self, Chord};
use crate::display::computer::toolset::{fit, zoom_size};
use crate::toolset_input::{Fields, check};

/// The longest a member waits or holds keys, and all of a turn's waits together.
pub const MAX_WAIT_SECS: f64 = 60.0;
/// The most `scroll_amount` (wheel ticks).
pub const MAX_SCROLL: i64 = 100;
/// Pixels one wheel tick scrolls.
pub const TICK_PX: f64 = 100.0;
/// Ticks when `scroll_amount` is absent.
pub const DEFAULT_SCROLL: i64 = 3;
/// The most characters `type` and `javascript_exec` take.
pub const MAX_TEXT: usize = 1 << 20;
/// The most times `key` repeats.
pub const MAX_REPEAT: i64 = 100;
/// `read_page`'s deepest `depth`.
pub const MAX_DEPTH: i64 = 1000;

/// The page's viewport (CSS pixels) and the screenshot space the model works in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    pub viewport: (f64, f64),
    pub shot: (u32, u32),
}

impl View {
    pub fn of(width: f64, height: f64) -> View {
        View {
            viewport: (width, height),
            shot: fit(
                width.max(1.0).round() as u32,
                height.max(1.0).round() as u32,
            ),
        }
    }

    /// Screenshot pixels per CSS pixel.
    pub fn scale(&self) -> f64 {
        self.shot.0 as f64 / self.viewport.0.max(1.0)
    }

    /// A screenshot point in the viewport's CSS pixels; `None` outside the screenshot.
    pub fn to_css(&self, x: i64, y: i64) -> Option<(f64, f64)> {
        let (w, h) = (self.shot.0 as i64, self.shot.1 as i64);
        ((0..w).contains(&x) && (0..h).contains(&y)).then(|| {
            let s = self.scale();
            ((x as f64 + 0.5) / s, (y as f64 + 0.5) / s)
        })
    }
}

/// Where a pointer member acts.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// A point in the viewport, CSS pixels.
    Point(f64, f64),
    /// An element by its reference (`ref_<n>`: the node's backend id).
    Ref(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    Visible,
    Interactive,
    All,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Nav {
    Url(String),
    Back,
    Forward,
    Reload,
}

/// What one member call becomes once checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Navigate(Nav),
    Screenshot,
    /// A region of the viewport (CSS pixels: x, y, width, height) and the image's size.
    Zoom((f64, f64, f64, f64), (u32, u32)),
    Click {
        target: Target,
        button: &'static str,
        count: u32,
        modifiers: u32,
    },
    Hover(Target),
    Drag((f64, f64), (f64, f64)),
    Down((f64, f64)),
    Up((f64, f64)),
    Scroll {
        at: (f64, f64),
        dx: f64,
        dy: f64,
    },
    ScrollTo(i64),
    Type(String),
    Key(Vec<Chord>, u32),
    HoldKey(Chord, f64),
    FormInput(i64, Value),
    ReadPage {
        depth: Option<usize>,
        filter: Filter,
        root: Option<i64>,
    },
    Find(String),
    PageText,
    Wait(f64),
    FileUpload(i64, Vec<String>),
    ReadConsole,
    ReadNetwork,
    Javascript(String),
    NewTab,
    ListTabs,
    SwitchTab(String),
    CloseTab(String),
}

impl Op {
    /// How long the op waits or holds keys on purpose.
    pub fn waits(&self) -> f64 {
        match self {
            Op::Wait(s) | Op::HoldKey(_, s) => *s,
            _ => 0.0,
        }
    }
}

/// `ref_<n>` as `n`.
pub fn parse_ref(s: &str) -> Option<i64> {
    s.strip_prefix("ref_")
        .filter(|n| !n.is_empty() && n.len() <= 15 && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse().ok())
}

/// The modifier bits CDP's input events take (Alt 1, Ctrl 2, Meta 4, Shift 8).
pub fn modifier_bits(text: &str) -> Result<u32, String> {
    let mut bits = 0;
    for part in text.split('+').map(str::trim).filter(|p| !p.is_empty()) {
        bits |= match part.to_ascii_lowercase().as_str() {
            "alt" | "option" => 1,
            "ctrl" | "control" => 2,
            "cmd" | "command" | "meta" | "super" | "win" => 4,
            "shift" => 8,
            _ => return Err(format!("unknown modifier {part:?}")),
        };
    }
    Ok(bits)
}

impl Fields<'_> {
    /// A `{"type": "coordinate", "x", "y"}` target inside the screenshot, in CSS pixels.
    fn coordinate(&mut self, field: &str, view: &View) -> Option<(f64, f64)> {
        match self.target(field, view, false)? {
            Target::Point(x, y) => Some((x, y)),
            Target::Ref(_) => None,
        }
    }

    /// A click target: a coordinate, or (`refs`) an element reference.
    fn target(&mut self, field: &str, view: &View, refs: bool) -> Option<Target> {
        let Some(v) = self.present(field) else {
            self.problem(field, "Field required");
            return None;
        };
        let Some(o) = v.as_object() else {
            self.problem(field, "Input should be a valid dictionary");
            return None;
        };
        match o.get("type").and_then(Value::as_str) {
            Some("coordinate") => {
                let whole = |k: &str| o.get(k).and_then(crate::toolset_input::whole);
                let (Some(x), Some(y)) = (whole("x"), whole("y")) else {
                    self.problem(field, "x and y: Input should be a valid integer");
                    return None;
                };
                match view.to_css(x, y) {
                    Some((cx, cy)) => Some(Target::Point(cx, cy)),
                    None => {
                        let (w, h) = view.shot;
                        self.problem(
                            field,
                            format!("({x}, {y}) is outside the {w}x{h} screenshot"),
                        );
                        None
                    }
                }
            }
            Some("ref") if refs => self.element(o, field).map(Target::Ref),
            _ => {
                let expected = if refs {
                    "'coordinate' or 'ref'"
                } else {
                    "'coordinate'"
                };
                self.problem(
                    &format!("{field}.type"),
                    format!("Input should be {expected}"),
                );
                None
            }
        }
    }

    fn element(&mut self, o: &Map<String, Value>, field: &str) -> Option<i64> {
        match o.get("ref").and_then(Value::as_str) {
            Some(r) => match parse_ref(r) {
                Some(n) => Some(n),
                None => {
                    self.problem(
                        &format!("{field}.ref"),
                        "not an element reference (ref_<n>)",
                    );
                    None
                }
            },
            None => {
                self.problem(&format!("{field}.ref"), "Field required");
                None
            }
        }
    }

    /// A `{"type": "ref", "ref": "ref_7"}` target.
    fn reference(&mut self, field: &str) -> Option<i64> {
        let Some(o) = self.present(field).and_then(Value::as_object) else {
            self.problem(field, "Field required");
            return None;
        };
        if o.get("type").and_then(Value::as_str) != Some("ref") {
            self.problem(&format!("{field}.type"), "Input should be 'ref'");
            return None;
        }
        self.element(o, field)
    }

    fn click_modifiers(&mut self) -> u32 {
        let Some(text) = self.string("modifiers", false) else {
            return 0;
        };
        modifier_bits(&text).unwrap_or_else(|e| {
            self.problem("modifiers", e);
            0
        })
    }

    fn chord(&mut self, text: &str) -> Option<Chord> {
        keys::chord(text).map_err(|e| self.problem("text", e)).ok()
    }
}

/// A member call checked: the op it runs, or the refusal the model reads.
pub fn plan(name: &str, input: &Value, view: &View) -> Result<Op, String> {
    if browser_member(name).is_none() {
        return Err(unknown_member(BROWSER_FAMILY, name));
    }
    check(BROWSER_FAMILY, name, input, |f| lower(name, f, view))
}

fn lower(name: &str, f: &mut Fields, view: &View) -> Option<Op> {
    let click = |f: &mut Fields, button: &'static str, count: u32| {
        let target = f.target("target", view, true);
        let modifiers = f.click_modifiers();
        Some(Op::Click {
            target: target?,
            button,
            count,
            modifiers,
        })
    };
    match name {
        "navigate" => navigate_op(f),
        "screenshot" => Some(Op::Screenshot),
        "zoom" => zoom_op(f, view),
        "left_click" => click(f, "left", 1),
        "right_click" => click(f, "right", 1),
        "middle_click" => click(f, "middle", 1),
        "double_click" => click(f, "left", 2),
        "triple_click" => click(f, "left", 3),
        "hover" => Some(Op::Hover(f.target("target", view, true)?)),
        "left_click_drag" => {
            let from = f.coordinate("from", view);
            let to = f.coordinate("target", view);
            Some(Op::Drag(from?, to?))
        }
        "left_mouse_down" => Some(Op::Down(f.coordinate("target", view)?)),
        "left_mouse_up" => Some(Op::Up(f.coordinate("target", view)?)),
        "mouse_move" => {
            let (x, y) = f.coordinate("target", view)?;
            Some(Op::Hover(Target::Point(x, y)))
        }
        "scroll" => scroll_op(f, view),
        "scroll_to" => Some(Op::ScrollTo(f.reference("target")?)),
        "type" => Some(Op::Type(bounded_text(f)?)),
        "key" => key_op(f),
        "hold_key" => {
            let text = f.string("text", true);
            let secs = f.seconds("duration", true, 0.0, MAX_WAIT_SECS);
            let chord = f.chord(&text?)?;
            Some(Op::HoldKey(chord, secs?))
        }
        "form_input" => form_input_op(f),
        "read_page" => read_page_op(f),
        "find" => find_op(f),
        "get_page_text" => Some(Op::PageText),
        "wait" => Some(Op::Wait(f.seconds("duration", true, 0.0, MAX_WAIT_SECS)?)),
        "file_upload" => file_upload_op(f),
        "read_console" => Some(Op::ReadConsole),
        "read_network" => Some(Op::ReadNetwork),
        "javascript_exec" => Some(Op::Javascript(bounded_text(f)?)),
        "new_tab" => Some(Op::NewTab),
        "list_tabs" => Some(Op::ListTabs),
        "switch_tab" => Some(Op::SwitchTab(f.string("tab_id", true)?)),
        "close_tab" => Some(Op::CloseTab(f.string("tab_id", true)?)),
        _ => None,
    }
}

/// `navigate`: a URL (`https://` added when the scheme is left out), or back, forward or
/// reload.
fn navigate_op(f: &mut Fields) -> Option<Op> {
    let url = f.string("url", true)?;
    let word = url.trim().to_ascii_lowercase();
    Some(Op::Navigate(match word.as_str() {
        "back" => Nav::Back,
        "forward" => Nav::Forward,
        "reload" => Nav::Reload,
        _ => {
            let url = url.trim();
            if url.is_empty() {
                f.problem("url", "empty");
                return None;
            }
            Nav::Url(with_scheme(url))
        }
    }))
}

/// `zoom`: a region of the screenshot, in CSS pixels, and the size of the image answered.
fn zoom_op(f: &mut Fields, view: &View) -> Option<Op> {
    let [x0, y0, x1, y1] = f.region(view.shot)?;
    let s = view.scale();
    let css = (
        x0 as f64 / s,
        y0 as f64 / s,
        (x1 - x0) as f64 / s,
        (y1 - y0) as f64 / s,
    );
    Some(Op::Zoom(css, zoom_size((x1 - x0) as u32, (y1 - y0) as u32)))
}

/// `scroll`: where, which way, and how far (ticks of [`TICK_PX`]).
fn scroll_op(f: &mut Fields, view: &View) -> Option<Op> {
    let direction = f.string("scroll_direction", true);
    let at = f.coordinate("target", view);
    let amount = f
        .ranged("scroll_amount", false, 1, MAX_SCROLL, "")
        .unwrap_or(DEFAULT_SCROLL) as f64
        * TICK_PX;
    let (dx, dy) = match direction?.as_str() {
        "up" => (0.0, -amount),
        "down" => (0.0, amount),
        "left" => (-amount, 0.0),
        "right" => (amount, 0.0),
        _ => {
            f.problem(
                "scroll_direction",
                "Input should be 'up', 'down', 'left' or 'right'",
            );
            return None;
        }
    };
    Some(Op::Scroll { at: at?, dx, dy })
}

/// The `text` of `type` and `javascript_exec`: at most [`MAX_TEXT`] bytes.
fn bounded_text(f: &mut Fields) -> Option<String> {
    let text = f.string("text", true)?;
    if text.len() > MAX_TEXT {
        f.problem("text", "at most 1 MiB");
        return None;
    }
    Some(text)
}

/// `key`: chords separated by white space, pressed in order `repeat` times.
fn key_op(f: &mut Fields) -> Option<Op> {
    let text = f.string("text", true);
    let repeat = f.ranged("repeat", false, 1, MAX_REPEAT, "");
    let text = text?;
    let parts: Vec<&str> = text.split_whitespace().collect();
    if parts.is_empty() {
        f.problem("text", "empty key name");
        return None;
    }
    let chords: Option<Vec<Chord>> = parts.iter().map(|p| f.chord(p)).collect();
    Some(Op::Key(chords?, repeat.unwrap_or(1) as u32))
}

/// `form_input`: an element reference and a string, number or boolean value.
fn form_input_op(f: &mut Fields) -> Option<Op> {
    let target = f.reference("target");
    let value = match f.present("value") {
        Some(v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => v.clone(),
        Some(_) => {
            f.problem("value", "Input should be a string, a number or a boolean");
            return None;
        }
        None => {
            f.problem("value", "Field required");
            return None;
        }
    };
    Some(Op::FormInput(target?, value))
}

/// `read_page`: how deep, which elements, and from which element (the whole page without).
fn read_page_op(f: &mut Fields) -> Option<Op> {
    let depth = f.ranged("depth", false, 1, MAX_DEPTH, "");
    let filter = match f.string("filter", false).as_deref() {
        None => Filter::Visible,
        Some("interactive") => Filter::Interactive,
        Some("all") => Filter::All,
        Some(_) => {
            f.problem("filter", "Input should be 'all' or 'interactive'");
            return None;
        }
    };
    let root = match f.string("ref", false) {
        None => None,
        Some(r) => match parse_ref(&r) {
            Some(n) => Some(n),
            None => {
                f.problem("ref", "not an element reference (ref_<n>)");
                return None;
            }
        },
    };
    Some(Op::ReadPage {
        depth: depth.map(|d| d as usize),
        filter,
        root,
    })
}

/// `find`: a query that is not blank.
fn find_op(f: &mut Fields) -> Option<Op> {
    let q = f.string("query", true)?;
    if q.trim().is_empty() {
        f.problem("query", "empty");
        return None;
    }
    Some(Op::Find(q))
}

/// `file_upload`: a file input's reference and at least one absolute path (staged documents
/// are refused).
fn file_upload_op(f: &mut Fields) -> Option<Op> {
    let target = f.reference("target");
    let paths: Vec<String> = match f.present("paths") {
        Some(Value::Array(a)) => {
            let p: Option<Vec<String>> = a.iter().map(|v| v.as_str().map(String::from)).collect();
            match p {
                Some(p) => p,
                None => {
                    f.problem("paths", "Input should be a list of strings");
                    return None;
                }
            }
        }
        Some(_) => {
            f.problem("paths", "Input should be a valid list");
            return None;
        }
        None => Vec::new(),
    };
    if f.present("document_ids").is_some() {
        f.problem("document_ids", "staged documents are not available here");
        return None;
    }
    if paths.is_empty() {
        f.problem("paths", "at least one path is required");
        return None;
    }
    if paths.iter().any(|p| !p.starts_with('/')) {
        f.problem("paths", "each path is absolute");
        return None;
    }
    Some(Op::FileUpload(target?, paths))
}

/// A URL as the browser takes it: `https://` when the model left the scheme out.
pub fn with_scheme(url: &str) -> String {
    let lower = url.to_ascii_lowercase();
    let has_scheme = lower.contains("://")
        || [
            "about:",
            "data:",
            "file:",
            "chrome:",
            "javascript:",
            "blob:",
        ]
        .iter()
        .any(|s| lower.starts_with(s));
    if has_scheme {
        url.to_string()
    } else {
        format!("https://{url}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A maximised window's viewport on the 1920x1080 desktop.
    fn view() -> View {
        View::of(1920.0, 960.0)
    }

    #[test]
    fn coordinates_are_screenshot_pixels_and_bad_inputs_name_the_field() {
        let v = view();
        assert_eq!(v.shot, fit(1920, 960));
        let Ok(Op::Click { target, .. }) = plan(
            "left_click",
            &json!({"target": {"type": "coordinate", "x": 0, "y": 0}}),
            &v,
        ) else {
            panic!()
        };
        let Target::Point(x, y) = target else {
            panic!()
        };
        assert!(x > 0.0 && x < 2.0 && y > 0.0 && y < 2.0, "{x},{y}");
        let (w, h) = v.shot;
        assert_eq!(
            plan(
                "left_click",
                &json!({"target": {"type": "coordinate", "x": w, "y": 1}}),
                &v
            )
            .unwrap_err(),
            format!(
                "invalid input for browser member 'left_click': target: ({w}, 1) is outside \
                 the {w}x{h} screenshot"
            )
        );
        assert_eq!(
            plan(
                "left_click",
                &json!({"target": {"type": "ref", "ref": "ref_12"}, "modifiers": "ctrl+shift"}),
                &v
            ),
            Ok(Op::Click {
                target: Target::Ref(12),
                button: "left",
                count: 1,
                modifiers: 10
            })
        );
        assert_eq!(
            plan(
                "hover",
                &json!({"target": {"type": "ref", "ref": "12"}}),
                &v
            )
            .unwrap_err(),
            "invalid input for browser member 'hover': target.ref: not an element reference \
             (ref_<n>)"
        );
        assert_eq!(
            plan(
                "mouse_move",
                &json!({"target": {"type": "ref", "ref": "ref_1"}}),
                &v
            )
            .unwrap_err(),
            "invalid input for browser member 'mouse_move': target.type: Input should be \
             'coordinate'"
        );
        assert_eq!(
            plan(
                "scroll",
                &json!({"scroll_direction": "down", "scroll_amount": 0,
                        "target": {"type": "coordinate", "x": 1, "y": 1}}),
                &v
            )
            .unwrap_err(),
            "invalid input for browser member 'scroll': scroll_amount: must be 1 to 100"
        );
        assert_eq!(
            plan("wait", &json!({"duration": 61}), &v).unwrap_err(),
            "invalid input for browser member 'wait': duration: must be 0 to 60 seconds"
        );
        assert_eq!(
            plan("wait", &json!({"duration": 1.5}), &v),
            Ok(Op::Wait(1.5))
        );
        assert_eq!(
            plan("left_click_drag", &json!({}), &v).unwrap_err(),
            "invalid input for browser member 'left_click_drag': from: Field required; \
             target: Field required"
        );
        assert_eq!(
            plan("fly", &json!({}), &v).unwrap_err(),
            "Error: unknown browser toolset member 'fly'"
        );
        assert_eq!(
            plan("read_page", &json!({"filter": "some"}), &v).unwrap_err(),
            "invalid input for browser member 'read_page': filter: Input should be 'all' or \
             'interactive'"
        );
        assert_eq!(
            plan(
                "form_input",
                &json!({"target": {"type": "ref", "ref": "ref_3"}, "value": true}),
                &v
            ),
            Ok(Op::FormInput(3, json!(true)))
        );
    }

    #[test]
    fn urls_and_history_words() {
        let v = view();
        let nav = |u: &str| match plan("navigate", &json!({"url": u}), &v) {
            Ok(Op::Navigate(n)) => n,
            other => panic!("{other:?}"),
        };
        assert_eq!(nav(" Back "), Nav::Back);
        assert_eq!(nav("RELOAD"), Nav::Reload);
        assert_eq!(
            nav("example.test/a"),
            Nav::Url("https://example.test/a".into())
        );
        assert_eq!(
            nav("http://127.0.0.1:8/"),
            Nav::Url("http://127.0.0.1:8/".into())
        );
        assert_eq!(nav("about:blank"), Nav::Url("about:blank".into()));
        assert!(plan("navigate", &json!({"url": " "}), &v).is_err());
    }

    #[test]
    fn zoom_regions_map_to_css_pixels() {
        let v = View::of(800.0, 600.0);
        assert_eq!(v.shot, (800, 600));
        let Ok(Op::Zoom(css, size)) = plan("zoom", &json!({"region": [100, 50, 300, 150]}), &v)
        else {
            panic!()
        };
        assert_eq!(css, (100.0, 50.0, 200.0, 100.0));
        assert_eq!(size, zoom_size(200, 100));
        assert!(plan("zoom", &json!({"region": [0, 0, 801, 10]}), &v).is_err());
    }
}
