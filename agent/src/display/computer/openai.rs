//! OpenAI's computer-use actions (`type`: `click`, `double_click`, `drag`, `keypress`, `move`,
//! `screenshot`, `scroll`, `type`, `wait`) as input, answered in OpenAI's
//! `computer_call_output` shape.

use super::*;
use berth_protocol::{OpenAiDrag, OpenAiKeypress, OpenAiScroll};

/// An OpenAI action object (its `type` and fields).
pub(super) fn parse_openai(mut map: Map<String, Value>) -> Result<OpenAiAction, String> {
    let t = match map.remove("type") {
        Some(Value::String(t)) => t,
        _ => return Err(format!("`type` must be a string: one of {OPENAI_TYPES}")),
    };
    let rest = Value::Object(map);
    let field = |e: String| format!("OpenAI `{t}` action: {e}");
    Ok(match t.as_str() {
        "click" => OpenAiAction::Click(de(rest).map_err(field)?),
        "double_click" => OpenAiAction::DoubleClick(de(rest).map_err(field)?),
        "drag" => OpenAiAction::Drag(de(rest).map_err(field)?),
        "keypress" => OpenAiAction::Keypress(de(rest).map_err(field)?),
        "move" => OpenAiAction::Move(de(rest).map_err(field)?),
        "screenshot" => OpenAiAction::Screenshot(de(rest).map_err(field)?),
        "scroll" => OpenAiAction::Scroll(de(rest).map_err(field)?),
        "type" => OpenAiAction::Type(de(rest).map_err(field)?),
        "wait" => OpenAiAction::Wait(de(rest).map_err(field)?),
        other => {
            return Err(format!(
                "unknown OpenAI action type {other:?} (one of {OPENAI_TYPES})"
            ));
        }
    })
}

pub(super) fn openai_button(b: OpenAiButton) -> Button {
    Button::Name(
        match b {
            OpenAiButton::Left => "left",
            OpenAiButton::Right => "right",
            OpenAiButton::Wheel => "middle",
            OpenAiButton::Back => "back",
            OpenAiButton::Forward => "forward",
        }
        .into(),
    )
}

/// OpenAI's scroll pixels as wheel clicks: [`SCROLL_PX_PER_CLICK`] each, rounded, at least one
/// for any movement; the direction by the sign (`(clicks, positive)`).
pub(super) fn scroll_clicks(px: i64, field: &str) -> Result<(u64, bool), DisplayError> {
    let abs = px.unsigned_abs();
    if abs == 0 {
        return Ok((0, true));
    }
    let clicks = ((abs + SCROLL_PX_PER_CLICK / 2) / SCROLL_PX_PER_CLICK).max(1);
    if clicks > MAX_SCROLL_CLICKS {
        return Err(DisplayError::Invalid(format!(
            "{field} {px} is more than {MAX_SCROLL_CLICKS} wheel clicks of \
             {SCROLL_PX_PER_CLICK} px (at most {} px a direction)",
            MAX_SCROLL_CLICKS * SCROLL_PX_PER_CLICK
        )));
    }
    Ok((clicks, px > 0))
}

/// An OpenAI action as input.
pub(super) fn lower_openai(
    a: &OpenAiAction,
    space: &Space,
) -> Result<Vec<InputAction>, DisplayError> {
    let at = |x: i64, y: i64, what: &str| space.to_screen([x, y], what);
    let actions = match a {
        OpenAiAction::Click(c) => {
            let (x, y) = at(c.x, c.y, "x, y")?;
            vec![InputAction::Click {
                x: Some(x),
                y: Some(y),
                button: openai_button(c.button),
                count: Some(1),
                modifiers: Vec::new(),
            }]
        }
        OpenAiAction::DoubleClick(c) => {
            let (x, y) = at(c.x, c.y, "x, y")?;
            vec![InputAction::Click {
                x: Some(x),
                y: Some(y),
                button: Button::default(),
                count: Some(2),
                modifiers: Vec::new(),
            }]
        }
        OpenAiAction::Drag(d) => lower_drag(d, space)?,
        OpenAiAction::Keypress(k) => lower_keypress(k)?,
        OpenAiAction::Move(m) => {
            let (x, y) = at(m.x, m.y, "x, y")?;
            vec![InputAction::Move { x, y }]
        }
        OpenAiAction::Screenshot(_) => Vec::new(),
        OpenAiAction::Scroll(s) => lower_scroll(s, space)?,
        OpenAiAction::Type(t) => vec![InputAction::Type {
            text: t.text.clone(),
        }],
        OpenAiAction::Wait(w) => vec![InputAction::Wait {
            ms: w.ms.unwrap_or(OPENAI_WAIT.as_millis() as u64),
        }],
    };
    check(&actions)?;
    Ok(actions)
}

/// `drag`: a left-button drag along `path` (at least two points).
fn lower_drag(d: &OpenAiDrag, space: &Space) -> Result<Vec<InputAction>, DisplayError> {
    if d.path.len() < 2 {
        return Err(DisplayError::Invalid(format!(
            "a drag's path needs at least two points, not {}",
            d.path.len()
        )));
    }
    let path = d
        .path
        .iter()
        .enumerate()
        .map(|(i, p)| {
            space
                .to_screen([p.x, p.y], &format!("path[{i}]"))
                .map(|(x, y)| [x, y])
        })
        .collect::<Result<_, _>>()?;
    Ok(vec![InputAction::Drag {
        path,
        button: Button::default(),
        modifiers: Vec::new(),
    }])
}

/// `keypress`: OpenAI's key names pressed together as one chord.
fn lower_keypress(k: &OpenAiKeypress) -> Result<Vec<InputAction>, DisplayError> {
    if k.keys.is_empty() {
        return Err(DisplayError::Invalid(
            "keypress needs at least one key in `keys`".into(),
        ));
    }
    let names = k
        .keys
        .iter()
        .map(|n| {
            keys::openai_key(n).ok_or_else(|| {
                DisplayError::Invalid(format!(
                    "unknown key {n:?} (OpenAI's key names: CTRL, ALT, SHIFT, CMD, \
                     ENTER, ESC, TAB, SPACE, BACKSPACE, DELETE, ARROWLEFT, ARROWUP, \
                     HOME, END, PAGEUP, PAGEDOWN, INSERT, CAPSLOCK, F1-F24, or one \
                     character)"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(vec![InputAction::Key {
        keys: names.join("+"),
        repeat: None,
    }])
}

/// `scroll`: a move to `x, y`, then the vertical and the horizontal pixels as wheel clicks.
fn lower_scroll(s: &OpenAiScroll, space: &Space) -> Result<Vec<InputAction>, DisplayError> {
    let (x, y) = space.to_screen([s.x, s.y], "x, y")?;
    let mut v = vec![InputAction::Move { x, y }];
    let (down, positive_y) = scroll_clicks(s.scroll_y, "scroll_y")?;
    let (right, positive_x) = scroll_clicks(s.scroll_x, "scroll_x")?;
    let mut wheel = |clicks: u64, direction: &str| {
        if clicks > 0 {
            v.push(InputAction::Scroll {
                x: None,
                y: None,
                direction: direction.into(),
                amount: Some(clicks as u32),
                modifiers: Vec::new(),
            });
        }
    };
    wheel(down, if positive_y { "down" } else { "up" });
    wheel(right, if positive_x { "right" } else { "left" });
    Ok(v)
}

/// One OpenAI action, answered in OpenAI's shape.
pub async fn run_openai(
    d: &Arc<Display>,
    req: OpenAiComputerRequest,
    trace: &mut Trace,
) -> Result<OpenAiComputerResponse, DisplayError> {
    let space = space(d, req.display_width_px, req.display_height_px).await?;
    let steps = [Step {
        name: req.action.name().into(),
        plan: Plan::Input(lower_openai(&req.action, &space)?),
    }];
    let done = run_steps(d, &space, &steps).await?;
    *trace = Trace::of(&done);
    if let Some((_, e)) = done.failed {
        return Err(e);
    }
    let (settled_ms, settle_timed_out) = settle_fields(&done);
    Ok(OpenAiComputerResponse {
        kind: OpenAiOutputType::ComputerScreenshot,
        image_url: done.shot.as_ref().map(data_url),
        settled_ms,
        settle_timed_out,
        ..Default::default()
    })
}
