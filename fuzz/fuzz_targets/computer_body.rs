//! `POST /v1/computer`'s body (Anthropic's and OpenAI's actions, batches):
//! `display::computer::parse`, then `plan` for a 1920x1080 screen, as the handler checks a
//! request before anything runs.
#![no_main]

use berth_agent::display::DisplayError;
use berth_agent::display::computer::{parse, plan};
use berth_protocol::InputAction;
use libfuzzer_sys::fuzz_target;

const SCREEN: (u32, u32) = (1920, 1080);

fn on_screen(x: i32, y: i32) -> bool {
    (0..SCREEN.0 as i32).contains(&x) && (0..SCREEN.1 as i32).contains(&y)
}

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let body = match parse(v) {
        Ok(b) => b,
        Err(e) => {
            // Named: the client learns what to fix.
            assert!(!e.message.is_empty());
            return;
        }
    };
    match plan(&body, SCREEN) {
        Ok(steps) => {
            assert!(steps.len() <= 100, "a batch holds at most 100 actions");
            // Whatever the engine's coordinates and declared size, what is sent lands on the
            // screen.
            for a in steps.iter().flatten() {
                match a {
                    InputAction::Move { x, y } => assert!(on_screen(*x, *y), "{a:?}"),
                    InputAction::Click {
                        x: Some(x),
                        y: Some(y),
                        ..
                    }
                    | InputAction::Scroll {
                        x: Some(x),
                        y: Some(y),
                        ..
                    } => assert!(on_screen(*x, *y), "{a:?}"),
                    InputAction::Drag { path, .. } => {
                        assert!(path.len() >= 2, "{a:?}");
                        assert!(path.iter().all(|p| on_screen(p[0], p[1])), "{a:?}");
                    }
                    InputAction::Wait { ms }
                    | InputAction::Hold {
                        duration_ms: ms, ..
                    } => {
                        assert!(*ms <= 60_000, "{a:?}")
                    }
                    _ => {}
                }
            }
        }
        // Bad input is the client's: a 400, never a failure of the server's.
        Err(e) => assert!(matches!(e, DisplayError::Invalid(_)), "{e:?}"),
    }
});
