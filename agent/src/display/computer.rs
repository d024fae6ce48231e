//! `POST /v1/computer`: the computer-use tool input engines already emit (`action`,
//! `coordinate`, `text`, `scroll_direction`, …) run as input actions, answered with the
//! settled screenshot. With `display_width_px`/`display_height_px` the engine works in a
//! scaled space: screenshots are scaled to it and its coordinates mapped back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use berth_protocol::{Button, ComputerRequest, ComputerResponse, InputAction};

use super::encode::Encoding;
use super::{Display, DisplayError, ShotRequest};

const SETTLE: Duration = Duration::from_millis(150);
const SETTLE_TIMEOUT: Duration = Duration::from_secs(2);

async fn blocking<T: Send + 'static>(
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

pub async fn run(d: &Arc<Display>, req: ComputerRequest) -> Result<ComputerResponse, DisplayError> {
    let screen = {
        let d = d.clone();
        blocking(move || d.screen_size()).await?
    };
    let engine = match (req.display_width_px, req.display_height_px) {
        (Some(w), Some(h)) if w > 0 && h > 0 => (w, h),
        (None, None) => screen,
        _ => {
            return Err(DisplayError::Invalid(
                "give both display_width_px and display_height_px (positive), or neither".into(),
            ));
        }
    };
    let space = Space { screen, engine };
    let action = req.action.as_str();
    let point = |c: &Option<[i64; 2]>| -> Result<Option<(i32, i32)>, DisplayError> {
        c.map(|c| space.to_screen(c, "coordinate")).transpose()
    };
    let click = |button: &str, count: u32| -> Result<Vec<InputAction>, DisplayError> {
        let p = point(&req.coordinate)?;
        Ok(vec![InputAction::Click {
            x: p.map(|p| p.0),
            y: p.map(|p| p.1),
            button: Button::Name(button.into()),
            count: Some(count),
            modifiers: modifiers(&req.text),
        }])
    };
    let actions: Vec<InputAction> = match action {
        "screenshot" => Vec::new(),
        "cursor_position" => {
            let d = d.clone();
            let p = blocking(move || d.pointer()).await?;
            let (x, y) = space.to_engine(p);
            return Ok(ComputerResponse {
                output: Some(format!("X={x},Y={y}")),
                ..Default::default()
            });
        }
        "key" => need(&req.text, "text", action)?
            .split_whitespace()
            .map(|k| InputAction::Key {
                keys: k.to_string(),
                repeat: None,
            })
            .collect(),
        "hold_key" => {
            let secs = *need(&req.duration, "duration", action)?;
            if !(0.0..=60.0).contains(&secs) {
                return Err(DisplayError::Invalid(
                    "duration must be 0-60 seconds".into(),
                ));
            }
            vec![InputAction::Hold {
                keys: need(&req.text, "text", action)?.clone(),
                duration_ms: (secs * 1000.0) as u64,
            }]
        }
        "type" => vec![InputAction::Type {
            text: need(&req.text, "text", action)?.clone(),
        }],
        "mouse_move" => {
            let (x, y) =
                space.to_screen(*need(&req.coordinate, "coordinate", action)?, "coordinate")?;
            vec![InputAction::Move { x, y }]
        }
        "left_mouse_down" | "left_mouse_up" => {
            let mut v = Vec::new();
            if let Some((x, y)) = point(&req.coordinate)? {
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
            v
        }
        "left_click" => click("left", 1)?,
        "right_click" => click("right", 1)?,
        "middle_click" => click("middle", 1)?,
        "double_click" => click("left", 2)?,
        "triple_click" => click("left", 3)?,
        "left_click_drag" => {
            let from = space.to_screen(
                *need(&req.start_coordinate, "start_coordinate", action)?,
                "start_coordinate",
            )?;
            let to =
                space.to_screen(*need(&req.coordinate, "coordinate", action)?, "coordinate")?;
            vec![InputAction::Drag {
                path: vec![[from.0, from.1], [to.0, to.1]],
                button: Button::default(),
                modifiers: Vec::new(),
            }]
        }
        "scroll" => {
            let p = point(&req.coordinate)?;
            vec![InputAction::Scroll {
                x: p.map(|p| p.0),
                y: p.map(|p| p.1),
                direction: need(&req.scroll_direction, "scroll_direction", action)?.clone(),
                amount: Some(req.scroll_amount.unwrap_or(3)),
                modifiers: modifiers(&req.text),
            }]
        }
        "wait" => {
            let secs = req.duration.unwrap_or(1.0);
            if !(0.0..=60.0).contains(&secs) {
                return Err(DisplayError::Invalid(
                    "duration must be 0-60 seconds".into(),
                ));
            }
            vec![InputAction::Wait {
                ms: (secs * 1000.0) as u64,
            }]
        }
        "zoom" => {
            let r = *need(&req.region, "region", action)?;
            let a = space.to_screen([r[0], r[1]], "region start")?;
            let b = space.end_to_screen([r[2], r[3]], "region end")?;
            if b.0 <= a.0 || b.1 <= a.1 {
                return Err(DisplayError::Invalid(
                    "region must be [x1, y1, x2, y2] with x2 > x1 and y2 > y1".into(),
                ));
            }
            let shot = ShotRequest {
                region: Some((a.0, a.1, (b.0 - a.0) as u32, (b.1 - a.1) as u32)),
                size: space.scaled(),
                ..Default::default()
            };
            return screenshot(d, shot).await;
        }
        other => {
            return Err(DisplayError::Invalid(format!("unknown action {other:?}")));
        }
    };
    let started = Instant::now();
    let mut settled = None;
    if !actions.is_empty() {
        let runner = d.clone();
        blocking(move || runner.run_input(&actions)).await?;
        settled = Some(d.settle(started, SETTLE, SETTLE_TIMEOUT).await);
    }
    let mut resp = screenshot(
        d,
        ShotRequest {
            size: space.scaled(),
            encoding: Encoding::default(),
            ..Default::default()
        },
    )
    .await?;
    // As `/v1/input` reports it: how long the screen took to settle, and whether it gave up.
    if let Some((waited, timed_out)) = settled {
        resp.settled_ms = Some(waited.as_millis() as u64);
        resp.settle_timed_out = Some(timed_out);
    }
    Ok(resp)
}

async fn screenshot(d: &Arc<Display>, req: ShotRequest) -> Result<ComputerResponse, DisplayError> {
    let d = d.clone();
    let shot = blocking(move || d.screenshot(&req)).await?;
    Ok(ComputerResponse {
        base64_image: Some(base64::engine::general_purpose::STANDARD.encode(shot.bytes.as_ref())),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_coordinates_map_to_the_screen_and_back() {
        let s = Space {
            screen: (1920, 1080),
            engine: (1280, 720),
        };
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
}
