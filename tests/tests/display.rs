//! The display domain against real X servers (Xvfb, xfwm4 where a window manager matters, Tk
//! windows where a real toolkit must read the input): pixels, the cursor, geometry, the cache,
//! XTEST input read back from the X side, typing into a real text field, settle, windows,
//! the clipboard, computer-use actions, and OSWorld's pyautogui path.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use berth_protocol::routes::native;
use berth_protocol::{Button, ComputerRequest, InputAction, InputRequest, ScreenshotAfter};
use berth_tests::x::{XServer, collect_events, decode_png, pixel, recolour, solid_window};
use berth_tests::{AgentOptions, AgentProcess, wait_until};
use serde_json::{Value, json};
use x11rb::connection::Connection;
use x11rb::protocol::Event;
use x11rb::protocol::xproto::{ConnectionExt as _, EventMask, InputFocus, KeyButMask};

async fn agent_on(x: &XServer) -> AgentProcess {
    agent_with(x, Vec::new()).await
}

async fn agent_with(x: &XServer, env: Vec<(String, String)>) -> AgentProcess {
    AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--display".into(), x.display.clone()],
        env,
        ..Default::default()
    })
    .await
}

async fn shot(a: &AgentProcess, query: &str) -> reqwest::Response {
    a.client()
        .request(reqwest::Method::GET, &format!("/v1/screenshot?{query}"))
        .send()
        .await
        .unwrap()
}

async fn png(a: &AgentProcess, query: &str) -> (u32, u32, Vec<u8>) {
    let r = shot(a, query).await;
    assert_eq!(r.status(), 200, "{query}: {}", r.text().await.unwrap());
    decode_png(&r.bytes().await.unwrap())
}

async fn input(a: &AgentProcess, actions: Value) -> reqwest::Response {
    a.client()
        .request(reqwest::Method::POST, "/v1/input")
        .json(&json!({ "actions": actions }))
        .send()
        .await
        .unwrap()
}

/// A Tk probe window (tests/apps/probe.py) that reports its text field's content.
struct Probe {
    child: Child,
    dir: tempfile::TempDir,
}

impl Probe {
    fn start(x: &XServer, args: &[&str]) -> Probe {
        let dir = tempfile::tempdir().unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/apps/probe.py");
        let child = Command::new("/usr/bin/python3")
            .arg(script)
            .arg("--out")
            .arg(dir.path())
            .args(args)
            .env("DISPLAY", &x.display)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 with tkinter");
        let ready = dir.path().join("ready");
        wait_until("the Tk probe to map", Duration::from_secs(20), || {
            ready.exists()
        });
        Probe { child, dir }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("text.txt")).unwrap_or_default()
    }

    /// Waits until the text field holds exactly `expected`; on a timeout, says where what
    /// arrived first differs from it.
    fn wait_text(&self, expected: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = self.text();
            if got == expected {
                return;
            }
            if Instant::now() >= deadline {
                let at = got
                    .chars()
                    .zip(expected.chars())
                    .take_while(|(a, b)| a == b)
                    .count();
                let near = |t: &str| {
                    t.chars()
                        .skip(at.saturating_sub(5))
                        .take(20)
                        .collect::<String>()
                };
                panic!(
                    "the text field holds {} characters, not the {} typed; they differ from \
                     character {at}: {:?} arrived where {:?} was typed",
                    got.chars().count(),
                    expected.chars().count(),
                    near(&got),
                    near(expected),
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn screenshot_pixels_are_exactly_what_was_drawn() {
    let x = XServer::start(640, 480);
    let a = agent_on(&x).await;
    let (_c1, _) = solid_window(&x, (0, 0, 640, 480), 0x102030, EventMask::NO_EVENT);
    let (_c2, _) = solid_window(&x, (100, 50, 200, 100), 0xff0000, EventMask::NO_EVENT);
    let (_c3, _) = solid_window(&x, (0, 0, 1, 1), 0x00ff00, EventMask::NO_EVENT);
    let img = png(&a, "cursor=false").await;
    assert_eq!((img.0, img.1), (640, 480));
    assert_eq!(
        pixel(&img, 0, 0),
        [0, 255, 0],
        "a single pixel at the origin"
    );
    assert_eq!(pixel(&img, 1, 0), [0x10, 0x20, 0x30]);
    assert_eq!(pixel(&img, 100, 50), [255, 0, 0]);
    assert_eq!(pixel(&img, 299, 149), [255, 0, 0]);
    assert_eq!(pixel(&img, 300, 150), [0x10, 0x20, 0x30]);
    assert_eq!(pixel(&img, 639, 479), [0x10, 0x20, 0x30]);
    // Lossy formats come close.
    for (format, magic) in [("jpeg", &b"\xff\xd8\xff"[..]), ("webp", &b"RIFF"[..])] {
        let r = shot(&a, &format!("format={format}&quality=90&cursor=false")).await;
        assert_eq!(
            r.headers()["content-type"],
            format!("image/{format}").as_str()
        );
        assert!(r.bytes().await.unwrap().starts_with(magic));
    }
}

#[tokio::test]
async fn the_cursor_is_drawn_where_the_pointer_is_and_nowhere_else() {
    let x = XServer::start(640, 480);
    let a = agent_on(&x).await;
    let (_c, _) = solid_window(&x, (0, 0, 640, 480), 0x808080, EventMask::NO_EVENT);
    assert_eq!(
        input(&a, json!([{"type": "move", "x": 300, "y": 200}]))
            .await
            .status(),
        200
    );
    let with = png(&a, "cursor=true").await;
    let without = png(&a, "cursor=false").await;
    let mut changed = Vec::new();
    for y in 0..480 {
        for x in 0..640 {
            if pixel(&with, x, y) != pixel(&without, x, y) {
                changed.push((x, y));
            }
        }
    }
    assert!(!changed.is_empty(), "the cursor is visible");
    // Every changed pixel is within a cursor's reach of the pointer.
    assert!(
        changed
            .iter()
            .all(|&(x, y)| (x as i32 - 300).abs() < 64 && (y as i32 - 200).abs() < 64),
        "cursor pixels far from the pointer: {:?}",
        &changed[..changed.len().min(5)]
    );
    assert_eq!(pixel(&without, 300, 200), [128, 128, 128]);
}

#[tokio::test]
async fn scale_and_region_shape_the_image_and_bad_ones_are_400() {
    let x = XServer::start(640, 480);
    let a = agent_on(&x).await;
    let (_c1, _) = solid_window(&x, (0, 0, 640, 480), 0x000000, EventMask::NO_EVENT);
    let (_c2, _) = solid_window(&x, (200, 100, 50, 40), 0x0000ff, EventMask::NO_EVENT);
    let r = shot(&a, "region=190,90,100,80&cursor=false").await;
    assert_eq!(r.headers()["x-screen-width"], "640");
    let img = decode_png(&r.bytes().await.unwrap());
    assert_eq!((img.0, img.1), (100, 80));
    assert_eq!(pixel(&img, 9, 9), [0, 0, 0]);
    assert_eq!(pixel(&img, 10, 10), [0, 0, 255]);
    assert_eq!(pixel(&img, 59, 49), [0, 0, 255]);
    assert_eq!(pixel(&img, 60, 50), [0, 0, 0]);
    let r = shot(&a, "scale=0.5&cursor=false").await;
    assert_eq!(r.headers()["x-scale"], "0.5");
    let img = decode_png(&r.bytes().await.unwrap());
    assert_eq!((img.0, img.1), (320, 240));
    assert_eq!(pixel(&img, 112, 60), [0, 0, 255]);
    for bad in [
        "region=0,0,0,0",
        "region=600,400,100,100",
        "region=-1,0,10,10",
        "region=1,2,3",
        "scale=0",
        "scale=1.5",
        "format=gif",
        "quality=0",
    ] {
        let r = shot(&a, bad).await;
        assert_eq!(r.status(), 400, "{bad}");
        let v: Value = r.json().await.unwrap();
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
}

#[tokio::test]
async fn an_unchanged_screen_is_answered_from_the_cache_until_it_changes() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let (_c1, _) = solid_window(&x, (0, 0, 320, 240), 0x000000, EventMask::NO_EVENT);
    shot(&a, "").await;
    let r = shot(&a, "").await;
    assert_eq!(r.headers()["x-cache"], "hit");
    // A change on screen invalidates it at once.
    let (_c2, _) = solid_window(&x, (10, 10, 20, 20), 0xffffff, EventMask::NO_EVENT);
    let r = shot(&a, "cursor=false").await;
    assert_eq!(r.headers()["x-cache"], "miss");
    let img = decode_png(&r.bytes().await.unwrap());
    assert_eq!(pixel(&img, 15, 15), [255, 255, 255]);
    // So does a pointer move (the cursor is part of the picture).
    shot(&a, "").await;
    input(&a, json!([{"type": "move", "x": 5, "y": 5}])).await;
    assert_eq!(shot(&a, "").await.headers()["x-cache"], "miss");
}

#[tokio::test]
async fn without_damage_every_screenshot_is_taken_fresh() {
    // Nothing reports changes, so a cached picture could be stale: none is ever served.
    let x = XServer::start_with(320, 240, &["-extension", "DAMAGE"]);
    let a = agent_on(&x).await;
    let info = a.get_json("/v1/display").await;
    assert!(
        !info["extensions"]
            .as_array()
            .unwrap()
            .contains(&json!("DAMAGE")),
        "{info}"
    );
    let (c, w) = solid_window(&x, (0, 0, 320, 240), 0x000000, EventMask::NO_EVENT);
    assert_eq!(pixel(&png(&a, "cursor=false").await, 100, 100), [0, 0, 0]);
    for (rgb, expected) in [(0xff0000, [255, 0, 0]), (0x0000ff, [0, 0, 255])] {
        recolour(&c, w, rgb);
        let r = shot(&a, "cursor=false").await;
        assert_eq!(r.headers()["x-cache"], "miss");
        let img = decode_png(&r.bytes().await.unwrap());
        assert_eq!(pixel(&img, 100, 100), expected, "the screen as it is now");
    }
}

#[tokio::test]
async fn mouse_actions_arrive_at_a_real_window() {
    let x = XServer::start(640, 480);
    let a = agent_on(&x).await;
    let (c, w) = solid_window(
        &x,
        (0, 0, 640, 480),
        0x000000,
        EventMask::BUTTON_PRESS | EventMask::BUTTON_RELEASE | EventMask::POINTER_MOTION,
    );
    let r = input(
        &a,
        json!([
            {"type": "click", "x": 10, "y": 20, "button": "left"},
            {"type": "click", "x": 30, "y": 40, "button": "middle"},
            {"type": "click", "x": 50, "y": 60, "button": "right", "count": 2},
            {"type": "scroll", "x": 70, "y": 80, "direction": "down", "amount": 3},
            {"type": "scroll", "direction": "left"},
            {"type": "drag", "path": [[100, 100], [150, 120], [200, 140]]},
            {"type": "move", "x": 0, "y": 0}
        ]),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["cursor"], json!([0, 0]), "0 is a real coordinate");
    let events = collect_events(&c, Duration::from_secs(10), |evs| {
        evs.iter()
            .filter(|e| matches!(e, Event::ButtonRelease(_)))
            .count()
            >= 9
    });
    let presses: Vec<(u8, i16, i16)> = events
        .iter()
        .filter_map(|e| match e {
            Event::ButtonPress(b) if b.event == w => Some((b.detail, b.event_x, b.event_y)),
            _ => None,
        })
        .collect();
    assert_eq!(
        presses,
        vec![
            (1, 10, 20),
            (2, 30, 40),
            (3, 50, 60),
            (3, 50, 60),
            (5, 70, 80),
            (5, 70, 80),
            (5, 70, 80),
            (6, 70, 80),
            (1, 100, 100),
        ]
    );
    let release = events
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::ButtonRelease(b) if b.detail == 1 => Some((b.event_x, b.event_y)),
            _ => None,
        })
        .unwrap();
    assert_eq!(release, (200, 140), "the drag ends where its path ends");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::MotionNotify(m) if (m.event_x, m.event_y) == (150, 120)))
    );
    let r: Value = a.compat_json("/cursor_position").await;
    assert_eq!(r, json!([0, 0]));
}

/// The server's keyboard mapping as a test reads it back.
struct Keymap {
    min: u8,
    per: usize,
    keysyms: Vec<u32>,
}

impl Keymap {
    fn read(c: &impl Connection) -> Keymap {
        let setup = c.setup();
        let (min, max) = (setup.min_keycode, setup.max_keycode);
        let map = c
            .get_keyboard_mapping(min, max - min + 1)
            .unwrap()
            .reply()
            .unwrap();
        Keymap {
            min,
            per: map.keysyms_per_keycode as usize,
            keysyms: map.keysyms,
        }
    }

    /// The first keysym of keycode `kc`.
    fn keysym(&self, kc: u8) -> u32 {
        self.keysyms[(kc - self.min) as usize * self.per]
    }
}

#[tokio::test]
async fn keys_and_chords_arrive_in_order_and_bad_names_are_400() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let (c, w) = solid_window(
        &x,
        (0, 0, 320, 240),
        0x000000,
        EventMask::KEY_PRESS | EventMask::KEY_RELEASE,
    );
    c.set_input_focus(InputFocus::POINTER_ROOT, w, 0u32)
        .unwrap();
    c.get_input_focus().unwrap().reply().unwrap();
    let map = Keymap::read(&c);
    let keysym_of = |kc: u8| map.keysym(kc);
    let r = input(
        &a,
        json!([{"type": "key", "keys": "ctrl+shift+t"}, {"type": "key", "keys": "Return"}]),
    )
    .await;
    assert_eq!(r.status(), 200);
    let events = collect_events(&c, Duration::from_secs(10), |evs| {
        evs.iter()
            .filter(|e| matches!(e, Event::KeyRelease(_)))
            .count()
            >= 4
    });
    let seq: Vec<(bool, u32)> = events
        .iter()
        .filter_map(|e| match e {
            Event::KeyPress(k) => Some((true, keysym_of(k.detail))),
            Event::KeyRelease(k) => Some((false, keysym_of(k.detail))),
            _ => None,
        })
        .collect();
    assert_eq!(
        seq,
        vec![
            (true, 0xffe3),
            (true, 0xffe1),
            (true, 0x74),
            (false, 0x74),
            (false, 0xffe1),
            (false, 0xffe3),
            (true, 0xff0d),
            (false, 0xff0d),
        ]
    );
    for (bad, name) in [
        (json!([{"type": "key", "keys": "ctrl+bogus"}]), "bogus"),
        (json!([{"type": "click", "button": "sideways"}]), "sideways"),
        (
            json!([{"type": "scroll", "direction": "diagonal"}]),
            "diagonal",
        ),
        (json!([{"type": "teleport"}]), "teleport"),
        (json!([{"type": "click", "x": 5}]), "x and y"),
        (
            json!([{"type": "move", "x": 320, "y": 0}]),
            "outside the 320x240 screen",
        ),
        (
            json!([{"type": "drag", "path": [[0, 0], [-1, 5]]}]),
            "outside",
        ),
    ] {
        let r = input(&a, bad).await;
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"].as_str().unwrap().contains(name),
            "{v}"
        );
    }
}

#[tokio::test]
async fn every_kind_of_button_scroll_and_key_action_arrives_as_sent() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let (c, w) = solid_window(
        &x,
        (0, 0, 320, 240),
        0x000000,
        EventMask::BUTTON_PRESS
            | EventMask::BUTTON_RELEASE
            | EventMask::KEY_PRESS
            | EventMask::KEY_RELEASE,
    );
    c.set_input_focus(InputFocus::POINTER_ROOT, w, 0u32)
        .unwrap();
    c.get_input_focus().unwrap().reply().unwrap();
    let map = Keymap::read(&c);
    let key_name = |kc: u8| match map.keysym(kc) {
        0xffe1 => "Shift_L".to_string(),
        0xffe3 => "Control_L".to_string(),
        0xffeb => "Super_L".to_string(),
        0xffc2 => "F5".to_string(),
        0xff8d => "KP_Enter".to_string(),
        s @ 0x61..=0x7a => char::from_u32(s).unwrap().to_string(),
        s => format!("{s:#x}"),
    };
    let r = input(
        &a,
        json!([
            {"type": "click", "x": 10, "y": 20, "count": 3},
            {"type": "scroll", "x": 30, "y": 40, "direction": "up", "amount": 2},
            {"type": "scroll", "direction": "right"},
            {"type": "click", "x": 50, "y": 60, "modifiers": ["shift"]},
            {"type": "scroll", "x": 70, "y": 80, "direction": "down", "modifiers": ["ctrl"]},
            {"type": "move", "x": 90, "y": 100},
            {"type": "button_down", "button": "right"},
            {"type": "move", "x": 95, "y": 105},
            {"type": "button_up", "button": "right"},
            {"type": "key_down", "key": "a"},
            {"type": "key_up", "key": "a"},
            {"type": "hold", "keys": "b", "duration_ms": 60},
            {"type": "key", "keys": "super"},
            {"type": "key", "keys": "F5"},
            {"type": "key", "keys": "KP_Enter"}
        ]),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let events = collect_events(&c, Duration::from_secs(10), |evs| {
        evs.iter()
            .filter(|e| matches!(e, Event::KeyRelease(k) if key_name(k.detail) == "KP_Enter"))
            .count()
            == 1
    });
    // Modifiers as the X event's state reports them (pressed buttons left out).
    let mods = |state: KeyButMask| {
        let mut m = String::new();
        if state.contains(KeyButMask::SHIFT) {
            m.push_str(" +shift");
        }
        if state.contains(KeyButMask::CONTROL) {
            m.push_str(" +ctrl");
        }
        m
    };
    let seen: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::ButtonPress(b) if b.event == w => Some(format!(
                "press {} at {},{}{}",
                b.detail,
                b.event_x,
                b.event_y,
                mods(b.state)
            )),
            Event::ButtonRelease(b) if b.event == w => Some(format!(
                "release {} at {},{}",
                b.detail, b.event_x, b.event_y
            )),
            Event::KeyPress(k) => Some(format!("key down {}", key_name(k.detail))),
            Event::KeyRelease(k) => Some(format!("key up {}", key_name(k.detail))),
            _ => None,
        })
        .collect();
    let clicks = |button: u8, at: &str, n: usize, mods: &str| -> Vec<String> {
        (0..n)
            .flat_map(|_| {
                [
                    format!("press {button} at {at}{mods}"),
                    format!("release {button} at {at}"),
                ]
            })
            .collect()
    };
    let mut expected: Vec<String> = Vec::new();
    expected.extend(clicks(1, "10,20", 3, ""));
    expected.extend(clicks(4, "30,40", 2, ""));
    expected.extend(clicks(7, "30,40", 1, ""));
    expected.push("key down Shift_L".into());
    expected.extend(clicks(1, "50,60", 1, " +shift"));
    expected.push("key up Shift_L".into());
    expected.push("key down Control_L".into());
    expected.extend(clicks(5, "70,80", 1, " +ctrl"));
    expected.push("key up Control_L".into());
    expected.extend(
        [
            "press 3 at 90,100",
            "release 3 at 95,105",
            "key down a",
            "key up a",
            "key down b",
            "key up b",
            "key down Super_L",
            "key up Super_L",
            "key down F5",
            "key up F5",
            "key down KP_Enter",
            "key up KP_Enter",
        ]
        .map(String::from),
    );
    assert_eq!(seen, expected);
    // The hold lasted its duration on the server's clock.
    let time_of = |down: bool| {
        events
            .iter()
            .find_map(|e| match e {
                Event::KeyPress(k) if down && key_name(k.detail) == "b" => Some(k.time),
                Event::KeyRelease(k) if !down && key_name(k.detail) == "b" => Some(k.time),
                _ => None,
            })
            .unwrap()
    };
    assert!(time_of(false) - time_of(true) >= 60, "b held for 60 ms");
}

#[tokio::test]
async fn unicode_and_long_text_arrive_exactly_in_a_real_text_field() {
    let x = XServer::start(800, 600);
    let a = agent_on(&x).await;
    let probe = Probe::start(&x, &[]);
    let text = "héllo ✓ Ωμέγα\tend\n";
    let r = input(
        &a,
        json!([{"type": "click", "x": 400, "y": 300}, {"type": "type", "text": text}]),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    probe.wait_text(text);
    // 10,000 ASCII characters (every printable one, in order, with newlines).
    let long: String = (0..10_000)
        .map(|i| {
            if i % 100 == 99 {
                '\n'
            } else {
                (b' ' + (i % 95) as u8) as char
            }
        })
        .collect();
    let r = input(
        &a,
        json!([{"type": "key", "keys": "ctrl+End"}, {"type": "type", "text": long}]),
    )
    .await;
    assert_eq!(r.status(), 200);
    probe.wait_text(&format!("{text}{long}"));
    assert_eq!(probe.text().chars().count(), text.chars().count() + 10_000);
}

#[tokio::test]
async fn more_distinct_missing_characters_than_spare_keycodes_arrive_exactly() {
    let x = XServer::start(800, 600);
    let a = agent_on(&x).await;
    let probe = Probe::start(&x, &[]);
    let c = x.connect();
    let map = Keymap::read(&c);
    let spare = map
        .keysyms
        .chunks(map.per)
        .filter(|row| row.iter().all(|&s| s == 0))
        .count();
    // Three times as many distinct CJK characters as there are keycodes to lend, each typed
    // again right after the next one (so every stretch reuses a character borrowed by the
    // one before), the first fifty once more at the end, and ASCII between them.
    let distinct = 3 * spare + 7;
    let cjk = |k: usize| char::from_u32(0x4e00 + k as u32).unwrap();
    let mut text = String::new();
    for k in 0..distinct {
        text.push(cjk(k));
        if k > 0 {
            text.push(cjk(k - 1));
        }
        if k % 40 == 39 {
            text.push_str(" ok\n");
        }
    }
    text.extend((0..50).map(cjk));
    let r = input(
        &a,
        json!([{"type": "click", "x": 400, "y": 300}, {"type": "type", "text": text}]),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    probe.wait_text(&text);
}

#[tokio::test]
async fn a_click_that_opens_a_window_returns_a_settled_screenshot_showing_it() {
    let x = XServer::start(1280, 800);
    let a = agent_on(&x).await;
    let _probe = Probe::start(&x, &["--opener", "--geometry", "500x400+0+0"]);
    // The text field's caret blinks every 300 ms the whole time.
    let req = InputRequest {
        actions: vec![InputAction::Click {
            x: Some(40),
            y: Some(25),
            button: Button::default(),
            count: None,
            modifiers: Vec::new(),
        }],
        screenshot_after: Some(ScreenshotAfter::default()),
    };
    let r = a
        .client()
        .request(reqwest::Method::POST, "/v1/input")
        .json(&req)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["settle_timed_out"], false,
        "a blinking caret does not keep the screen busy"
    );
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v["screenshot_b64"].as_str().unwrap())
        .unwrap();
    let img = decode_png(&bytes);
    assert_eq!(
        pixel(&img, 800, 450),
        [255, 0, 255],
        "the opened window is in the screenshot"
    );
}

#[tokio::test]
async fn a_program_computing_before_it_draws_holds_the_settled_answer() {
    // The button computes for 120 ms, drawing nothing, then opens its window: the screen is
    // still for longer than the idle rule's 40 ms, but the program's CPU time keeps the answer
    // back until the window is drawn.
    let x = XServer::start(1280, 800);
    let a = agent_on(&x).await;
    let _probe = Probe::start(
        &x,
        &["--opener", "--busy-ms", "120", "--geometry", "500x400+0+0"],
    );
    let r = a
        .client()
        .request(reqwest::Method::POST, native::TOOLSET_COMPUTER)
        .json(&json!({"content": [
            {"type": "tool_use", "id": "toolu_1", "name": "left_click", "toolset_name": "computer",
             "input": {"coordinate": [40, 25]}},
            {"type": "tool_use", "id": "toolu_2", "name": "screenshot", "toolset_name": "computer",
             "input": {}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let b64 = v["content"][1]["content"][0]["source"]["data"]
        .as_str()
        .unwrap_or_else(|| panic!("no image: {v}"));
    let img = decode_png(
        &base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    );
    assert_eq!(
        pixel(&img, 800, 450),
        [255, 0, 255],
        "the window opened after the computation is in the answer"
    );
}

#[tokio::test]
async fn the_settle_rule_is_the_agents_choice() {
    // A click on the bare root window changes nothing. `idle` (the default) answers once the
    // screen and the display's programs have been still for 40 ms; `quiet` waits its 150 ms.
    let x = XServer::start(640, 480);
    let _probe = Probe::start(&x, &["--geometry", "300x200+0+0"]);
    let idle = agent_on(&x).await;
    let quiet = agent_with(&x, vec![("BERTH_AGENT_SETTLE".into(), "quiet".into())]).await;
    for (a, rule) in [(&idle, "idle"), (&quiet, "quiet")] {
        let mut waits = Vec::new();
        for _ in 0..5 {
            let r = a
                .client()
                .request(reqwest::Method::POST, "/v1/computer")
                .json(&json!({"action": "left_click", "coordinate": [500, 400]}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["settle_timed_out"], false, "{rule}: {v}");
            waits.push(v["settled_ms"].as_u64().unwrap());
        }
        waits.sort_unstable();
        println!("{rule}: settled_ms {waits:?}");
        match rule {
            "idle" => assert!(
                waits[2] < 150,
                "idle answers before quiet's 150 ms: {waits:?}"
            ),
            _ => assert!(waits[0] >= 150, "quiet waits 150 ms: {waits:?}"),
        }
    }
}

#[tokio::test]
async fn settle_on_a_screenshot_reports_how_long_it_waited() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let r = shot(&a, "settle_ms=100&timeout_ms=1000").await;
    assert_eq!(r.status(), 200);
    let waited: u64 = r.headers()["x-settled-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(waited >= 100);
    assert_eq!(r.headers()["x-settle-timed-out"], "false");
}

#[tokio::test]
async fn window_routes_work_against_real_windows() {
    let x = XServer::start(1024, 768).with_wm();
    let a = agent_on(&x).await;
    let _one = Probe::start(
        &x,
        &[
            "--title",
            "First Window",
            "--class",
            "alphaapp",
            "--geometry",
            "300x200+10+10",
        ],
    );
    let _two = Probe::start(
        &x,
        &[
            "--title",
            "Second Window",
            "--class",
            "betaapp",
            "--geometry",
            "320x240+400+300",
        ],
    );
    let http = reqwest::Client::new();
    let r = http
        .post(a.url("/window_size"))
        .form(&[("app_class_name", "Betaapp")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"width": 320, "height": 240})
    );
    let r = http
        .post(a.url("/window_size"))
        .form(&[("app_class_name", "nope")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = http
        .post(a.url("/window_size"))
        .form(&[("x", "y")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "app_class_name is required"})
    );

    // Activation through EWMH: the window manager makes it the active window.
    let c = x.connect();
    let root = c.setup().roots[0].root;
    let active_atom = c
        .intern_atom(false, b"_NET_ACTIVE_WINDOW")
        .unwrap()
        .reply()
        .unwrap()
        .atom;
    let active_window = || {
        c.get_property(
            false,
            root,
            active_atom,
            x11rb::protocol::xproto::AtomEnum::WINDOW,
            0,
            1,
        )
        .unwrap()
        .reply()
        .unwrap()
        .value32()
        .and_then(|mut v| v.next())
        .unwrap_or(0)
    };
    let windows: Value = a.get_json("/v1/windows").await;
    let id_of = |title: &str| {
        windows["windows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["title"] == title)
            .unwrap()["id"]
            .as_u64()
            .unwrap() as u32
    };
    // The window manager focuses the window mapped last; wait for that to settle first.
    let second = id_of("Second Window");
    wait_until(
        "the new window to be focused",
        Duration::from_secs(10),
        || active_window() == second,
    );
    for (name, strict, by_class, expect) in [
        ("first", false, false, "First Window"),
        ("Second Window", true, false, "Second Window"),
        ("alphaapp.Alphaapp", true, true, "First Window"),
    ] {
        let r = http
            .post(a.url("/setup/activate_window"))
            .json(&json!({"window_name": name, "strict": strict, "by_class": by_class}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.text().await.unwrap(), "Window activated successfully");
        let want = id_of(expect);
        wait_until(
            &format!("{expect} to be active"),
            Duration::from_secs(10),
            || active_window() == want,
        );
    }
    // A verification waits for a window by title.
    let r = http
        .post(a.url("/setup/execute_with_verification"))
        .json(&json!({"command": ["true"], "verification": {"window_exists": "second window"}, "max_wait_time": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["verification"], "passed");
    // Closing: the window goes away.
    let r = http
        .post(a.url("/setup/close_window"))
        .json(&json!({"window_name": "Second"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "Window closed successfully.");
    let client = a.client();
    berth_tests::wait_for("the window to close", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let v = berth_tests::try_json(&client, "/v1/windows").await?;
            (!v["windows"]
                .as_array()?
                .iter()
                .any(|w| w["title"] == "Second Window"))
            .then_some(())
        }
    })
    .await;
    let r = http
        .post(a.url("/setup/close_window"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.text().await.unwrap(), "window_name required");
}

#[tokio::test]
async fn open_file_launches_an_app_and_waits_for_its_window() {
    let x = XServer::start(1024, 768).with_wm();
    let bin = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let app = bin.path().join("probe-open-app");
    std::fs::write(
        &app,
        format!(
            "#!/bin/sh\nexec /usr/bin/python3 {} --out {} --title 'probe-open-app window'\n",
            concat!(env!("CARGO_MANIFEST_DIR"), "/apps/probe.py"),
            out.path().display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&app, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap()
    );
    let a = agent_with(&x, vec![("PATH".into(), path)]).await;
    let http = reqwest::Client::new();
    let r = http
        .post(a.url("/setup/open_file"))
        .json(&json!({"path": "probe-open-app"}))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.text().await.unwrap(),
        "File opened and window activated successfully"
    );
    let r = http
        .post(a.url("/setup/open_file"))
        .json(&json!({"path": "/no/such/thing"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.text().await.unwrap(),
        "Application/file not found: /no/such/thing"
    );
    let r = http
        .post(a.url("/setup/open_file"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn the_clipboard_round_trips_with_other_clients() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let c = a.client();
    let r = c
        .request(reqwest::Method::PUT, "/v1/clipboard")
        .json(&json!({"text": "héllo clipboard ✓"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let v: Value = c
        .request(reqwest::Method::GET, "/v1/clipboard")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["text"], "héllo clipboard ✓");
    // Another client reads what we set, and sets what we then read.
    let mut req = berth_protocol::ExecRequest::argv(["xclip", "-selection", "clipboard", "-o"]);
    let out = c.exec(&req).await.unwrap();
    assert_eq!(out.stdout.as_deref(), Some("héllo clipboard ✓"));
    req = berth_protocol::ExecRequest::shell("printf 'from xclip' | xclip -selection clipboard -i");
    c.exec(&req).await.unwrap();
    let v: Value = c
        .request(reqwest::Method::GET, "/v1/clipboard")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["text"], "from xclip");
}

#[tokio::test]
async fn computer_use_actions_map_coordinates_and_answer_screenshots() {
    let x = XServer::start(1280, 800);
    let a = agent_on(&x).await;
    let (_bg, _) = solid_window(&x, (0, 0, 1280, 800), 0x000000, EventMask::NO_EVENT);
    let post = |body: ComputerRequest| {
        let c = a.client();
        async move {
            c.request(reqwest::Method::POST, "/v1/computer")
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    let scaled = |action: &str| ComputerRequest {
        action: action.into(),
        display_width_px: Some(640),
        display_height_px: Some(400),
        ..Default::default()
    };
    let r = post(scaled("screenshot")).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let img = decode_png(
        &base64::engine::general_purpose::STANDARD
            .decode(v["base64_image"].as_str().unwrap())
            .unwrap(),
    );
    assert_eq!(
        (img.0, img.1),
        (640, 400),
        "screenshots come in the engine's size"
    );
    let mut click = scaled("left_click");
    click.coordinate = Some([320, 200]);
    let r = post(click).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["base64_image"].is_string(),
        "an action answers with the screen after it"
    );
    assert!(v["settled_ms"].is_u64(), "and how long it settled: {v}");
    assert_eq!(v["settle_timed_out"], false, "{v}");
    let pos: Value = a.compat_json("/cursor_position").await;
    assert_eq!(
        pos,
        json!([640, 400]),
        "engine coordinates map back to the screen"
    );
    let r = post(scaled("cursor_position")).await;
    assert_eq!(r.json::<Value>().await.unwrap()["output"], "X=320,Y=200");
    let mut zoom = ComputerRequest {
        action: "zoom".into(),
        ..Default::default()
    };
    zoom.region = Some([0, 0, 100, 50]);
    let v: Value = post(zoom).await.json().await.unwrap();
    let img = decode_png(
        &base64::engine::general_purpose::STANDARD
            .decode(v["base64_image"].as_str().unwrap())
            .unwrap(),
    );
    assert_eq!((img.0, img.1), (100, 50));
    // A region may end on the right and bottom edges (x2, y2 are exclusive), not beyond.
    for (region, size) in [
        ([0, 0, 1280, 800], (1280, 800)),
        ([1200, 700, 1280, 800], (80, 100)),
    ] {
        let zoom = ComputerRequest {
            action: "zoom".into(),
            region: Some(region),
            ..Default::default()
        };
        let r = post(zoom).await;
        assert_eq!(r.status(), 200, "{region:?}");
        let v: Value = r.json().await.unwrap();
        let img = decode_png(
            &base64::engine::general_purpose::STANDARD
                .decode(v["base64_image"].as_str().unwrap())
                .unwrap(),
        );
        assert_eq!((img.0, img.1), size, "{region:?}");
    }
    let mut edge = scaled("zoom");
    edge.region = Some([320, 200, 640, 400]);
    assert_eq!(post(edge).await.status(), 200, "the engine's own edges");
    for region in [[0, 0, 1281, 800], [0, 0, 1280, 801], [1280, 0, 1280, 10]] {
        let zoom = ComputerRequest {
            action: "zoom".into(),
            region: Some(region),
            ..Default::default()
        };
        let r = post(zoom).await;
        assert_eq!(r.status(), 400, "{region:?}");
        assert!(
            r.json::<Value>().await.unwrap()["error"]
                .as_str()
                .unwrap()
                .contains("outside"),
            "{region:?}"
        );
    }
    let mut outside = scaled("left_click");
    outside.coordinate = Some([640, 10]);
    let r = post(outside).await;
    assert_eq!(r.status(), 400);
    assert!(
        r.json::<Value>().await.unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("outside")
    );
    let r = post(ComputerRequest {
        action: "juggle".into(),
        ..Default::default()
    })
    .await;
    assert_eq!(r.status(), 400);
    let r = post(ComputerRequest {
        action: "type".into(),
        ..Default::default()
    })
    .await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn osworlds_pyautogui_call_moves_the_pointer() {
    let x = XServer::start(800, 600);
    // Debian's python3 only (no `python`): the agent's shim supplies `python`.
    let a = agent_with(
        &x,
        vec![(
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        )],
    )
    .await;
    let prefix = "import pyautogui; import time; pyautogui.FAILSAFE = False; ";
    let r = reqwest::Client::new()
        .post(a.url("/execute"))
        .json(&json!({"command": ["python", "-c", format!("{prefix}pyautogui.moveTo(123, 234)")], "shell": false}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["returncode"], 0, "{v}");
    let pos: Value = a.compat_json("/cursor_position").await;
    assert_eq!(pos, json!([123, 234]));
}

#[tokio::test]
async fn screenshots_come_back_after_the_x_server_restarts() {
    let mut x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    assert_eq!(shot(&a, "").await.status(), 200);
    x.restart();
    let (_c, _) = solid_window(&x, (0, 0, 320, 240), 0x00ff00, EventMask::NO_EVENT);
    let client = a.client();
    let img = berth_tests::wait_for("screenshots again", Duration::from_secs(20), || {
        let client = client.clone();
        async move {
            let r = client
                .request(reqwest::Method::GET, "/v1/screenshot?cursor=false")
                .send()
                .await
                .ok()?;
            if r.status() != 200 {
                return None;
            }
            Some(decode_png(&r.bytes().await.ok()?))
        }
    })
    .await;
    assert_eq!(
        pixel(&img, 100, 100),
        [0, 255, 0],
        "the new server's pixels"
    );
    assert_eq!(
        input(&a, json!([{"type": "move", "x": 7, "y": 8}]))
            .await
            .status(),
        200
    );
}

#[tokio::test]
async fn every_computer_use_action_runs() {
    let x = XServer::start(800, 600);
    let a = agent_on(&x).await;
    let (_bg, _) = solid_window(&x, (0, 0, 800, 600), 0x202020, EventMask::NO_EVENT);
    let c = a.client();
    let cases = [
        json!({"action": "key", "text": "ctrl+a Return"}),
        json!({"action": "hold_key", "text": "shift", "duration": 0.05}),
        json!({"action": "type", "text": "héllo"}),
        json!({"action": "mouse_move", "coordinate": [10, 20]}),
        json!({"action": "left_mouse_down", "coordinate": [30, 30]}),
        json!({"action": "left_mouse_up", "coordinate": [60, 60]}),
        json!({"action": "left_click", "coordinate": [0, 0], "text": "shift"}),
        json!({"action": "right_click", "coordinate": [100, 100]}),
        json!({"action": "middle_click"}),
        json!({"action": "double_click", "coordinate": [200, 200]}),
        json!({"action": "triple_click", "coordinate": [210, 210]}),
        json!({"action": "left_click_drag", "start_coordinate": [10, 10], "coordinate": [300, 300]}),
        json!({"action": "scroll", "coordinate": [400, 300], "scroll_direction": "down", "scroll_amount": 5}),
        json!({"action": "scroll", "scroll_direction": "left"}),
        json!({"action": "wait", "duration": 0.1}),
        json!({"action": "screenshot"}),
    ];
    for body in cases {
        let r = c
            .request(reqwest::Method::POST, "/v1/computer")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{body}");
        let v: Value = r.json().await.unwrap();
        assert!(v["base64_image"].is_string(), "{body}: {v}");
        assert!(v.get("error").is_none(), "{body}: {v}");
    }
    let pos: Value = a.compat_json("/cursor_position").await;
    assert_eq!(
        pos,
        json!([400, 300]),
        "the last positioned action left the pointer there"
    );
}

#[tokio::test]
async fn the_wallpaper_is_set_and_served_through_xfconf() {
    let x = XServer::start(640, 480);
    // A session bus where the agent's children look for one: <runtime dir>/bus.
    let a_dir = tempfile::tempdir().unwrap();
    let uid = nix::unistd::Uid::effective().as_raw();
    let state = a_dir.path().join("state");
    let runtime = state.join("run").join(uid.to_string());
    std::fs::create_dir_all(&runtime).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    let system_runtime = Path::new("/run/user").join(uid.to_string());
    let runtime = if system_runtime.is_dir() {
        system_runtime
    } else {
        runtime
    };
    let bus = runtime.join("bus");
    let _ = std::fs::remove_file(&bus);
    let mut dbus = Command::new("dbus-daemon")
        .args(["--session", "--nofork", "--address"])
        .arg(format!("unix:path={}", bus.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("dbus-daemon");
    wait_until("the session bus", Duration::from_secs(10), || bus.exists());
    let a = AgentProcess::start_in(
        a_dir,
        AgentOptions {
            extra_args: vec!["--display".into(), x.display.clone()],
            ..Default::default()
        },
    )
    .await;
    let image = a.home.join("wall.png");
    std::fs::write(&image, b"\x89PNG not really").unwrap();
    let http = reqwest::Client::new();
    let r = http
        .post(a.url("/setup/change_wallpaper"))
        .json(&json!({"path": image}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "Wallpaper changed successfully");
    let r = http.post(a.url("/wallpaper")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "image/png");
    assert_eq!(
        r.headers()["content-disposition"],
        "inline; filename=wall.png"
    );
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"\x89PNG not really");
    let r = http
        .post(a.url("/setup/change_wallpaper"))
        .json(&json!({"path": "/no/such.png"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.text().await.unwrap(), "File not found: /no/such.png");
    let r = http
        .post(a.url("/setup/change_wallpaper"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.text().await.unwrap(), "Path not supplied!");
    drop(a);
    let _ = dbus.kill();
    let _ = dbus.wait();
}

#[tokio::test]
async fn compat_display_routes_answer_like_the_reference() {
    let x = XServer::start(800, 600);
    let a = agent_on(&x).await;
    let r = reqwest::get(a.url("/screenshot")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "image/png");
    assert_eq!(
        r.headers()["content-disposition"],
        "inline; filename=screenshot.png"
    );
    let img = decode_png(&r.bytes().await.unwrap());
    assert_eq!((img.0, img.1), (800, 600));
    let r = reqwest::Client::new()
        .post(a.url("/screen_size"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"height": 600, "width": 800})
    );
}

#[tokio::test]
async fn without_a_display_the_display_routes_say_so() {
    let a = AgentProcess::start().await;
    let r = shot(&a, "").await;
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "no_display"
    );
    let r = reqwest::get(a.url("/screenshot")).await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "error");
}
