//! Anthropic's computer-use tool input (`action`, `coordinate`, `text`, `scroll_direction`, …)
//! as input, answered with [`ComputerResponse`].

use super::*;

/// An Anthropic action as input (or as a read of the screen).
pub(super) fn lower_anthropic(req: &ComputerRequest, space: &Space) -> Result<Plan, DisplayError> {
    let action = req.action.as_str();
    let actions: Vec<InputAction> = match action {
        "screenshot" => Vec::new(),
        "cursor_position" => return Ok(Plan::CursorPosition),
        "key" => need(&req.text, "text", action)?
            .split_whitespace()
            .map(|k| InputAction::Key {
                keys: k.to_string(),
                repeat: None,
            })
            .collect(),
        "hold_key" => vec![InputAction::Hold {
            keys: need(&req.text, "text", action)?.clone(),
            duration_ms: seconds(*need(&req.duration, "duration", action)?)?,
        }],
        "type" => vec![InputAction::Type {
            text: need(&req.text, "text", action)?.clone(),
        }],
        "mouse_move" => {
            let (x, y) =
                space.to_screen(*need(&req.coordinate, "coordinate", action)?, "coordinate")?;
            vec![InputAction::Move { x, y }]
        }
        "left_mouse_down" | "left_mouse_up" => mouse_button(req, space, action)?,
        "left_click" => click(req, space, "left", 1)?,
        "right_click" => click(req, space, "right", 1)?,
        "middle_click" => click(req, space, "middle", 1)?,
        "double_click" => click(req, space, "left", 2)?,
        "triple_click" => click(req, space, "left", 3)?,
        "left_click_drag" => drag(req, space, action)?,
        "scroll" => scroll(req, space, action)?,
        "wait" => vec![InputAction::Wait {
            ms: seconds(req.duration.unwrap_or(1.0))?,
        }],
        "zoom" => return zoom(req, space, action),
        other => {
            return Err(DisplayError::Invalid(format!("unknown action {other:?}")));
        }
    };
    check(&actions)?;
    Ok(Plan::Input(actions))
}

/// The optional engine-space point `c` on the screen.
fn point(space: &Space, c: &Option<[i64; 2]>) -> Result<Option<(i32, i32)>, DisplayError> {
    c.map(|c| space.to_screen(c, "coordinate")).transpose()
}

/// The click actions: `count` clicks of `button` at the optional `coordinate`, with the
/// modifiers of `text` held.
fn click(
    req: &ComputerRequest,
    space: &Space,
    button: &str,
    count: u32,
) -> Result<Vec<InputAction>, DisplayError> {
    let p = point(space, &req.coordinate)?;
    Ok(vec![InputAction::Click {
        x: p.map(|p| p.0),
        y: p.map(|p| p.1),
        button: Button::Name(button.into()),
        count: Some(count),
        modifiers: modifiers(&req.text),
    }])
}

/// `left_mouse_down` / `left_mouse_up`: a move to the optional `coordinate`, then the left
/// button pressed or released.
fn mouse_button(
    req: &ComputerRequest,
    space: &Space,
    action: &str,
) -> Result<Vec<InputAction>, DisplayError> {
    let mut v = Vec::new();
    if let Some((x, y)) = point(space, &req.coordinate)? {
        v.push(InputAction::Move { x, y });
    }
    v.push(if action == "left_mouse_down" {
        InputAction::ButtonDown {
            button: Button::default(),
        }
    } else {
        InputAction::ButtonUp {
            button: Button::default(),
        }
    });
    Ok(v)
}

/// `left_click_drag`: a left-button drag from `start_coordinate` to `coordinate`.
fn drag(
    req: &ComputerRequest,
    space: &Space,
    action: &str,
) -> Result<Vec<InputAction>, DisplayError> {
    let from = space.to_screen(
        *need(&req.start_coordinate, "start_coordinate", action)?,
        "start_coordinate",
    )?;
    let to = space.to_screen(*need(&req.coordinate, "coordinate", action)?, "coordinate")?;
    Ok(vec![InputAction::Drag {
        path: vec![[from.0, from.1], [to.0, to.1]],
        button: Button::default(),
        modifiers: Vec::new(),
    }])
}

/// `scroll`: `scroll_amount` (default 3) wheel clicks toward `scroll_direction`, at the
/// optional `coordinate`, with the modifiers of `text` held.
fn scroll(
    req: &ComputerRequest,
    space: &Space,
    action: &str,
) -> Result<Vec<InputAction>, DisplayError> {
    let p = point(space, &req.coordinate)?;
    Ok(vec![InputAction::Scroll {
        x: p.map(|p| p.0),
        y: p.map(|p| p.1),
        direction: need(&req.scroll_direction, "scroll_direction", action)?.clone(),
        amount: Some(req.scroll_amount.unwrap_or(3)),
        modifiers: modifiers(&req.text),
    }])
}

/// `zoom`: the engine-space `region` [x1, y1, x2, y2] captured from the screen.
fn zoom(req: &ComputerRequest, space: &Space, action: &str) -> Result<Plan, DisplayError> {
    let r = *need(&req.region, "region", action)?;
    let a = space.to_screen([r[0], r[1]], "region start")?;
    let b = space.end_to_screen([r[2], r[3]], "region end")?;
    if b.0 <= a.0 || b.1 <= a.1 {
        return Err(DisplayError::Invalid(
            "region must be [x1, y1, x2, y2] with x2 > x1 and y2 > y1".into(),
        ));
    }
    Ok(Plan::Zoom(ShotRequest {
        region: Some((a.0, a.1, (b.0 - a.0) as u32, (b.1 - a.1) as u32)),
        size: space.scaled(),
        ..Default::default()
    }))
}

/// One Anthropic action (what the MCP `computer` tool runs too).
pub async fn run(d: &Arc<Display>, req: ComputerRequest) -> Result<ComputerResponse, DisplayError> {
    run_traced(d, req).await.0
}

/// [`run`], and what it did.
pub async fn run_traced(
    d: &Arc<Display>,
    req: ComputerRequest,
) -> (Result<ComputerResponse, DisplayError>, Trace) {
    let started = Instant::now();
    let mut trace = Trace::default();
    let result = async {
        let space = space(d, req.display_width_px, req.display_height_px).await?;
        let plan = lower_anthropic(&req, &space)?;
        if plan == Plan::CursorPosition {
            let d = d.clone();
            let p = blocking(move || d.pointer()).await?;
            let (x, y) = space.to_engine(p);
            return Ok(ComputerResponse {
                output: Some(format!("X={x},Y={y}")),
                ..Default::default()
            });
        }
        let steps = [Step {
            name: req.action.clone(),
            plan,
        }];
        let done = run_steps(d, &space, &steps).await?;
        trace = Trace::of(&done);
        if let Some((_, e)) = done.failed {
            return Err(e);
        }
        let (settled_ms, settle_timed_out) = settle_fields(&done);
        Ok(ComputerResponse {
            base64_image: done.shot.as_ref().map(b64),
            settled_ms,
            settle_timed_out,
            ..Default::default()
        })
    }
    .await;
    if trace.steps.is_empty() {
        trace.steps.push((started, started.elapsed()));
    }
    (result, trace)
}
