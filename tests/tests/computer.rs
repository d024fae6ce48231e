//! `POST /v1/computer` in OpenAI's dialect and as batches, against real X servers (Xvfb; a Tk
//! text field where a real toolkit must read the keys): every OpenAI action type read back
//! from the X side (button presses with their buttons, positions and state, key events as
//! keysyms, scroll buttons 4-7, back/forward 8/9, the pointer's position, typed text), OpenAI's
//! answer shape, OpenAI's key names, coordinates scaled from `display_width_px`, batches of
//! both dialects answered by one settled screenshot, a batch with a bad action running
//! nothing, a batch stopping at the action that fails, and an OpenAI click through the
//! controller.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use berth_protocol::controller::CreateSandbox;
use berth_tests::controller::ControllerProcess;
use berth_tests::x::{XServer, collect_events, decode_png, pixel, solid_window};
use berth_tests::{AgentOptions, AgentProcess, wait_until};
use serde_json::{Value, json};
use x11rb::connection::Connection;
use x11rb::protocol::Event;
use x11rb::protocol::xproto::{ConnectionExt as _, EventMask, InputFocus, KeyButMask};
use x11rb::rust_connection::RustConnection;

async fn agent_on(x: &XServer) -> AgentProcess {
    AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--display".into(), x.display.clone()],
        ..Default::default()
    })
    .await
}

async fn computer(a: &AgentProcess, body: &Value) -> (u16, Value) {
    let r = a
        .client()
        .request(reqwest::Method::POST, "/v1/computer")
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{body}: {e}: {text}"));
    (status, v)
}

/// An OpenAI answer's image: `image_url` a PNG data URL, and no Anthropic fields.
fn openai_image(v: &Value) -> (u32, u32, Vec<u8>) {
    assert_eq!(v["type"], "computer_screenshot", "{}", brief(v));
    assert!(v.get("base64_image").is_none(), "{}", brief(v));
    let url = v["image_url"].as_str().expect("image_url");
    let b64 = url
        .strip_prefix("data:image/png;base64,")
        .unwrap_or_else(|| panic!("not a PNG data URL: {}", &url[..url.len().min(40)]));
    decode_png(
        &base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
}

fn anthropic_image(v: &Value) -> (u32, u32, Vec<u8>) {
    assert!(
        v.get("type").is_none() && v.get("image_url").is_none(),
        "{}",
        brief(v)
    );
    decode_png(
        &base64::engine::general_purpose::STANDARD
            .decode(v["base64_image"].as_str().expect("base64_image"))
            .unwrap(),
    )
}

/// How many images a JSON answer carries (any string holding a PNG, data URL or not).
fn images_in(v: &Value) -> usize {
    match v {
        Value::String(s) => {
            (s.starts_with("iVBORw0KGgo") || s.starts_with("data:image/png;base64,iVBORw0KGgo"))
                as usize
        }
        Value::Array(a) => a.iter().map(images_in).sum(),
        Value::Object(o) => o.values().map(images_in).sum(),
        _ => 0,
    }
}

/// The answer with its images cut short, for assertion messages.
fn brief(v: &Value) -> String {
    let mut v = v.clone();
    for k in ["image_url", "base64_image"] {
        if let Some(s) = v.get(k).and_then(Value::as_str) {
            v[k] = json!(format!("{}… ({} chars)", &s[..s.len().min(24)], s.len()));
        }
    }
    v.to_string()
}

fn pointer(c: &RustConnection) -> (i16, i16, KeyButMask) {
    let root = c.setup().roots[0].root;
    let p = c.query_pointer(root).unwrap().reply().unwrap();
    (p.root_x, p.root_y, p.mask)
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

/// A full-screen window that records buttons, motion and keys, with the input focus.
fn listener(x: &XServer) -> (RustConnection, u32, Keymap) {
    let (c, w) = solid_window(
        x,
        (0, 0, x.width, x.height),
        0x000000,
        EventMask::BUTTON_PRESS
            | EventMask::BUTTON_RELEASE
            | EventMask::POINTER_MOTION
            | EventMask::KEY_PRESS
            | EventMask::KEY_RELEASE,
    );
    c.set_input_focus(InputFocus::POINTER_ROOT, w, 0u32)
        .unwrap();
    c.get_input_focus().unwrap().reply().unwrap();
    let map = Keymap::read(&c);
    (c, w, map)
}

fn releases(evs: &[Event]) -> usize {
    evs.iter()
        .filter(|e| matches!(e, Event::ButtonRelease(_)))
        .count()
}

fn presses(evs: &[Event]) -> Vec<(u8, i16, i16)> {
    evs.iter()
        .filter_map(|e| match e {
            Event::ButtonPress(b) => Some((b.detail, b.event_x, b.event_y)),
            _ => None,
        })
        .collect()
}

/// Key events as (pressed, keysym).
fn keys(evs: &[Event], map: &Keymap) -> Vec<(bool, u32)> {
    evs.iter()
        .filter_map(|e| match e {
            Event::KeyPress(k) => Some((true, map.keysym(k.detail))),
            Event::KeyRelease(k) => Some((false, map.keysym(k.detail))),
            _ => None,
        })
        .collect()
}

/// A chord as X reports it: pressed in order, released in reverse.
fn chord(syms: &[u32]) -> Vec<(bool, u32)> {
    let mut v: Vec<(bool, u32)> = syms.iter().map(|&s| (true, s)).collect();
    v.extend(syms.iter().rev().map(|&s| (false, s)));
    v
}

#[tokio::test]
async fn every_openai_action_type_arrives_at_x_and_answers_openais_shape() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let (c, w, map) = listener(&x);
    let actions = [
        json!({"type": "click", "x": 10, "y": 20, "button": "left"}),
        json!({"type": "click", "x": 11, "y": 21, "button": "right"}),
        json!({"type": "click", "x": 12, "y": 22, "button": "wheel"}),
        json!({"type": "click", "x": 13, "y": 23, "button": "back"}),
        json!({"type": "click", "x": 14, "y": 24, "button": "forward"}),
        json!({"type": "double_click", "x": 30, "y": 40}),
        json!({"type": "drag", "path": [{"x": 50, "y": 50}, {"x": 60, "y": 55}, {"x": 70, "y": 60}]}),
        json!({"type": "scroll", "x": 100, "y": 100, "scroll_x": 0, "scroll_y": 300}),
        json!({"type": "scroll", "x": 101, "y": 101, "scroll_x": 0, "scroll_y": -100}),
        json!({"type": "scroll", "x": 102, "y": 102, "scroll_x": 200, "scroll_y": 0}),
        json!({"type": "scroll", "x": 103, "y": 103, "scroll_x": -50, "scroll_y": 0}),
        json!({"type": "keypress", "keys": ["CTRL", "SHIFT", "T"]}),
        json!({"type": "move", "x": 80, "y": 90}),
    ];
    for body in &actions {
        let (status, v) = computer(&a, body).await;
        assert_eq!(status, 200, "{body}: {}", brief(&v));
        let img = openai_image(&v);
        assert_eq!((img.0, img.1), (320, 240), "{body}");
        assert!(v["settled_ms"].is_u64(), "{body}: {}", brief(&v));
        assert_eq!(v["settle_timed_out"], false, "{body}: {}", brief(&v));
        assert!(v.get("error").is_none(), "{body}: {}", brief(&v));
    }
    let events = collect_events(&c, Duration::from_secs(10), |evs| {
        releases(evs) >= 15 && keys(evs, &map).len() >= 6
    });
    assert_eq!(
        presses(&events),
        vec![
            (1, 10, 20),
            (3, 11, 21),
            (2, 12, 22),
            (8, 13, 23),
            (9, 14, 24),
            (1, 30, 40),
            (1, 30, 40),
            (1, 50, 50),
            (5, 100, 100),
            (5, 100, 100),
            (5, 100, 100),
            (4, 101, 101),
            (7, 102, 102),
            (7, 102, 102),
            (6, 103, 103),
        ],
        "buttons: wheel is the middle one, back/forward 8/9; scroll pixels at 120 a click, \
         positive scroll_y down (5), negative up (4), positive scroll_x right (7), negative \
         left (6), any movement at least one click"
    );
    // The drag held button 1 while it moved through its path and released it at its end.
    let motion = events
        .iter()
        .find_map(|e| match e {
            Event::MotionNotify(m) if m.event == w && (m.event_x, m.event_y) == (60, 55) => {
                Some(m.state)
            }
            _ => None,
        })
        .expect("motion through the drag's middle point");
    assert!(motion.contains(KeyButMask::BUTTON1), "{motion:?}");
    let drag_release = events
        .iter()
        .filter_map(|e| match e {
            Event::ButtonRelease(b) if b.detail == 1 => Some((b.event_x, b.event_y)),
            _ => None,
        })
        .nth(3)
        .unwrap();
    assert_eq!(drag_release, (70, 60), "the drag ends where its path ends");
    assert_eq!(
        keys(&events, &map),
        chord(&[0xffe3, 0xffe1, 0x74]),
        "CTRL+SHIFT+T: one chord, the T key unshifted"
    );
    let (px, py, mask) = pointer(&c);
    assert_eq!((px, py), (80, 90), "move");
    assert!(
        !mask.intersects(KeyButMask::BUTTON1 | KeyButMask::BUTTON2 | KeyButMask::BUTTON3),
        "no button left held: {mask:?}"
    );

    // screenshot: the screen as it is, no settling.
    let (status, v) = computer(&a, &json!({"type": "screenshot"})).await;
    assert_eq!(status, 200);
    let img = openai_image(&v);
    assert_eq!(pixel(&img, 300, 10), [0, 0, 0]);
    assert!(v.get("settled_ms").is_none(), "{}", brief(&v));
    // wait: 1 s without a duration (OpenAI sends none), `ms` when given.
    let t = Instant::now();
    let (status, v) = computer(&a, &json!({"type": "wait"})).await;
    assert_eq!(status, 200, "{}", brief(&v));
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    let t = Instant::now();
    let (status, _) = computer(&a, &json!({"type": "wait", "ms": 50})).await;
    assert_eq!(status, 200);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());

    // Bad OpenAI input: 400 in OpenAI's shape, the problem named.
    for (body, says) in [
        (
            json!({"type": "click", "x": 320, "y": 0}),
            "outside the 320x240 screen",
        ),
        (
            json!({"type": "click", "x": 1, "y": 1, "button": "sideways"}),
            "sideways",
        ),
        (json!({"type": "click", "x": "1", "y": 1}), "`x`"),
        (json!({"type": "teleport"}), "teleport"),
        (
            json!({"type": "drag", "path": [{"x": 1, "y": 1}]}),
            "at least two points",
        ),
        (
            json!({"type": "keypress", "keys": ["CTRL", "HYPER"]}),
            "unknown key \"HYPER\"",
        ),
        (
            json!({"type": "scroll", "x": 1, "y": 1, "scroll_y": 20000}),
            "scroll_y",
        ),
        (json!({"type": "wait", "ms": 600000}), "60000"),
        (
            json!({"type": "move", "x": 1, "y": 1, "speed": 3}),
            "unknown field `speed`",
        ),
    ] {
        let (status, v) = computer(&a, &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["type"], "computer_screenshot", "{body}: {v}");
        assert!(v.get("image_url").is_none(), "{body}: {v}");
        let e = v["error"].as_str().unwrap();
        assert!(e.contains(says), "{body}: {e}");
    }
    // Neither dialect, or both: 400 naming the problem.
    for (body, says) in [
        (json!({"x": 1, "y": 1}), "neither `action`"),
        (
            json!({"action": "left_click", "type": "click"}),
            "both `action`",
        ),
        (
            json!({"actions": [], "action": "left_click"}),
            "both `actions`",
        ),
    ] {
        let (status, v) = computer(&a, &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{body}: {v}");
    }
}

/// A Tk probe window (tests/apps/probe.py) that reports its text field's content.
struct Probe {
    child: Child,
    dir: tempfile::TempDir,
}

impl Probe {
    fn start(x: &XServer) -> Probe {
        let dir = tempfile::tempdir().unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/apps/probe.py");
        let child = Command::new("/usr/bin/python3")
            .arg(script)
            .arg("--out")
            .arg(dir.path())
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

    fn wait_text(&self, expected: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.text() != expected {
            assert!(
                Instant::now() < deadline,
                "the text field holds {:?}, not {expected:?}",
                self.text()
            );
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
async fn openai_typing_and_key_chords_arrive_in_a_real_text_field() {
    let x = XServer::start(800, 600);
    let a = agent_on(&x).await;
    let probe = Probe::start(&x);
    let (status, v) = computer(
        &a,
        &json!({"type": "click", "x": 400, "y": 300, "button": "left"}),
    )
    .await;
    assert_eq!(status, 200, "{}", brief(&v));
    let (status, v) = computer(&a, &json!({"type": "type", "text": "héllo wörld ✓"})).await;
    assert_eq!(status, 200, "{}", brief(&v));
    openai_image(&v);
    probe.wait_text("héllo wörld ✓");
    // OpenAI's key names in a real toolkit: BACKSPACE deletes, SHIFT+D is a capital,
    // ARROWLEFT moves the caret, ENTER breaks the line, HOME goes to its start.
    for (keys, after) in [
        (json!(["BACKSPACE"]), "héllo wörld "),
        (json!(["SHIFT", "D"]), "héllo wörld D"),
        (json!(["arrowleft"]), "héllo wörld D"),
        (json!(["SPACE"]), "héllo wörld  D"),
        (json!(["ENTER"]), "héllo wörld  \nD"),
        (json!(["HOME"]), "héllo wörld  \nD"),
    ] {
        let (status, v) = computer(&a, &json!({"type": "keypress", "keys": keys})).await;
        assert_eq!(status, 200, "{keys}: {}", brief(&v));
        probe.wait_text(after);
    }
    let (status, v) = computer(
        &a,
        &json!({"actions": [
            {"type": "type", "text": "ab"},
            {"type": "keypress", "keys": ["ARROWLEFT"]},
            {"type": "type", "text": "c"},
            {"type": "keypress", "keys": ["END"]},
            {"type": "type", "text": "!"}
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{}", brief(&v));
    assert_eq!(images_in(&v), 1);
    openai_image(&v);
    probe.wait_text("héllo wörld  \nacbD!");
}

#[tokio::test]
async fn openai_key_names_map_to_x_keysyms() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let (c, _w, map) = listener(&x);
    // Every name once (CAPSLOCK left out: it would lock the keyboard for what follows),
    // as an OpenAI batch: one answer in OpenAI's shape.
    let names: [(&str, u32); 31] = [
        ("CTRL", 0xffe3),
        ("control", 0xffe3),
        ("ALT", 0xffe9),
        ("SHIFT", 0xffe1),
        ("META", 0xffeb),
        ("CMD", 0xffeb),
        ("SUPER", 0xffeb),
        ("WIN", 0xffeb),
        ("ENTER", 0xff0d),
        ("RETURN", 0xff0d),
        ("ESC", 0xff1b),
        ("ESCAPE", 0xff1b),
        ("TAB", 0xff09),
        ("SPACE", 0x20),
        ("BACKSPACE", 0xff08),
        ("DELETE", 0xffff),
        ("ARROWLEFT", 0xff51),
        ("ARROWUP", 0xff52),
        ("ARROWRIGHT", 0xff53),
        ("ARROWDOWN", 0xff54),
        ("Left", 0xff51),
        ("DOWN", 0xff54),
        ("HOME", 0xff50),
        ("END", 0xff57),
        ("PAGEUP", 0xff55),
        ("PAGEDOWN", 0xff56),
        ("INSERT", 0xff63),
        ("F1", 0xffbe),
        ("F12", 0xffc9),
        ("/", 0x2f),
        ("q", 0x71),
    ];
    let actions: Vec<Value> = names
        .iter()
        .map(|(n, _)| json!({"type": "keypress", "keys": [n]}))
        .collect();
    let (status, v) = computer(&a, &json!({ "actions": actions })).await;
    assert_eq!(status, 200, "{}", brief(&v));
    openai_image(&v);
    let events = collect_events(&c, Duration::from_secs(10), |evs| {
        keys(evs, &map).len() >= 2 * names.len()
    });
    let want: Vec<(bool, u32)> = names.iter().flat_map(|&(_, s)| chord(&[s])).collect();
    assert_eq!(keys(&events, &map), want);
    // A chord of three, in any case.
    let (status, _) = computer(
        &a,
        &json!({"type": "keypress", "keys": ["ctrl", "Alt", "DELETE"]}),
    )
    .await;
    assert_eq!(status, 200);
    let events = collect_events(&c, Duration::from_secs(10), |evs| {
        keys(evs, &map).len() >= 6
    });
    assert_eq!(keys(&events, &map), chord(&[0xffe3, 0xffe9, 0xffff]));
}

#[tokio::test]
async fn coordinates_scale_from_the_declared_display_size() {
    let x = XServer::start(1280, 800);
    let a = agent_on(&x).await;
    let (c, _w, _map) = listener(&x);
    let (status, v) = computer(
        &a,
        &json!({"type": "click", "x": 320, "y": 200, "button": "right",
                "display_width_px": 640, "display_height_px": 400}),
    )
    .await;
    assert_eq!(status, 200, "{}", brief(&v));
    let img = openai_image(&v);
    assert_eq!(
        (img.0, img.1),
        (640, 400),
        "the screenshot in the engine's size"
    );
    let events = collect_events(&c, Duration::from_secs(10), |evs| releases(evs) >= 1);
    assert_eq!(presses(&events), vec![(3, 640, 400)]);
    // In a batch, the top-level size applies to every action, of either dialect.
    let (status, v) = computer(
        &a,
        &json!({"actions": [
            {"type": "scroll", "x": 100, "y": 50, "scroll_y": 100},
            {"action": "left_click", "coordinate": [200, 100]},
            {"type": "drag", "path": [{"x": 10, "y": 10}, {"x": 639, "y": 399}]},
            {"type": "move", "x": 300, "y": 150}
        ], "display_width_px": 640, "display_height_px": 400}),
    )
    .await;
    assert_eq!(status, 200, "{}", brief(&v));
    let img = anthropic_image(&v);
    assert_eq!((img.0, img.1), (640, 400));
    let events = collect_events(&c, Duration::from_secs(10), |evs| releases(evs) >= 3);
    assert_eq!(
        presses(&events),
        vec![(5, 200, 100), (1, 400, 200), (1, 20, 20)]
    );
    let drag_end = events
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::ButtonRelease(b) if b.detail == 1 => Some((b.event_x, b.event_y)),
            _ => None,
        })
        .unwrap();
    assert_eq!(drag_end, (1278, 798));
    assert_eq!((pointer(&c).0, pointer(&c).1), (600, 300));
    // Outside the engine's screen (inside the real one): 400, nothing run.
    let (status, v) = computer(
        &a,
        &json!({"type": "move", "x": 640, "y": 0, "display_width_px": 640, "display_height_px": 400}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("outside the 640x400 screen"),
        "{v}"
    );
    let (status, v) = computer(
        &a,
        &json!({"type": "move", "x": 1, "y": 0, "display_width_px": 640}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("both"), "{v}");
}

#[tokio::test]
async fn a_batch_of_ten_mixed_actions_is_answered_by_one_settled_screenshot() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let (c, _w, map) = listener(&x);
    let batch = json!({"actions": [
        {"type": "move", "x": 10, "y": 10},
        {"action": "left_click", "coordinate": [20, 20]},
        {"type": "click", "x": 30, "y": 30, "button": "right"},
        {"action": "scroll", "coordinate": [40, 40], "scroll_direction": "down", "scroll_amount": 2},
        {"type": "scroll", "x": 50, "y": 50, "scroll_x": -100, "scroll_y": 0},
        {"type": "keypress", "keys": ["SHIFT", "A"]},
        {"action": "key", "text": "Return"},
        {"type": "double_click", "x": 60, "y": 60},
        {"type": "drag", "path": [{"x": 70, "y": 70}, {"x": 90, "y": 90}]},
        {"action": "mouse_move", "coordinate": [200, 150]}
    ]});
    let (status, v) = computer(&a, &batch).await;
    assert_eq!(status, 200, "{}", brief(&v));
    assert_eq!(
        images_in(&v),
        1,
        "one image for the whole batch: {}",
        brief(&v)
    );
    let img = anthropic_image(&v);
    assert!(v["settled_ms"].is_u64(), "{}", brief(&v));
    assert_eq!(v["settle_timed_out"], false);
    assert!(v.get("error").is_none() && v.get("failed").is_none());
    let events = collect_events(&c, Duration::from_secs(10), |evs| {
        releases(evs) >= 8 && keys(evs, &map).len() >= 6
    });
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::MotionNotify(m) if (m.event_x, m.event_y) == (10, 10))),
        "the first move"
    );
    assert_eq!(
        presses(&events),
        vec![
            (1, 20, 20),
            (3, 30, 30),
            (5, 40, 40),
            (5, 40, 40),
            (6, 50, 50),
            (1, 60, 60),
            (1, 60, 60),
            (1, 70, 70),
        ]
    );
    let mut want = chord(&[0xffe1, 0x61]);
    want.extend(chord(&[0xff0d]));
    assert_eq!(keys(&events, &map), want);
    let (px, py, _) = pointer(&c);
    assert_eq!((px, py), (200, 150), "the last action ran");
    // The one image is of the screen after the last action: its cursor is at 200,150.
    let r = a
        .client()
        .request(reqwest::Method::GET, "/v1/screenshot?cursor=false")
        .send()
        .await
        .unwrap();
    let bare = decode_png(&r.bytes().await.unwrap());
    let mut changed = Vec::new();
    for y in 0..240 {
        for x in 0..320 {
            if pixel(&img, x, y) != pixel(&bare, x, y) {
                changed.push((x as i32, y as i32));
            }
        }
    }
    assert!(!changed.is_empty(), "the cursor is in the answer's image");
    assert!(
        changed
            .iter()
            .all(|&(x, y)| (x - 200).abs() < 64 && (y - 150).abs() < 64),
        "cursor pixels away from 200,150: {:?}",
        &changed[..changed.len().min(5)]
    );
    // `screenshot` inside a batch is a no-op; a batch may end with cursor_position or zoom
    // (and only end with them: checked in the unit tests).
    let (status, v) = computer(
        &a,
        &json!({"actions": [
            {"type": "screenshot"},
            {"type": "move", "x": 33, "y": 44},
            {"action": "screenshot"},
            {"action": "cursor_position"}
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{}", brief(&v));
    assert_eq!(v["output"], "X=33,Y=44");
    assert_eq!(images_in(&v), 1);
    let (status, v) = computer(
        &a,
        &json!({"actions": [
            {"type": "move", "x": 5, "y": 5},
            {"action": "zoom", "region": [0, 0, 64, 32]}
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{}", brief(&v));
    let img = anthropic_image(&v);
    assert_eq!((img.0, img.1), (64, 32), "the zoom is the batch's image");
}

#[tokio::test]
async fn a_batch_with_a_bad_action_runs_nothing() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let (c, _w, _map) = listener(&x);
    let before = pointer(&c);
    for (batch, says) in [
        (
            json!({"actions": [
                {"type": "move", "x": 5, "y": 5},
                {"type": "click", "x": 6, "y": 6},
                {"type": "keypress", "keys": ["NOPE"]}
            ]}),
            "actions[2] (keypress): unknown key \"NOPE\"",
        ),
        (
            json!({"actions": [
                {"action": "left_click", "coordinate": [6, 6]},
                {"type": "click", "x": 1000, "y": 1}
            ]}),
            "actions[1] (click): x, y (1000, 1) is outside the 320x240 screen",
        ),
        (
            json!({"actions": [
                {"type": "click", "x": 6, "y": 6},
                {"action": "scroll", "scroll_direction": "diagonal"}
            ]}),
            "actions[1] (scroll): unknown scroll direction",
        ),
        (
            json!({"actions": [
                {"type": "click", "x": 6, "y": 6},
                {"type": "wait", "ms": 40000},
                {"type": "wait", "ms": 40000}
            ]}),
            "at most 60000 ms",
        ),
        (
            json!({"actions": [{"type": "click", "x": 6, "y": 6}, {"type": "bogus"}]}),
            "actions[1]: unknown OpenAI action type \"bogus\"",
        ),
    ] {
        let (status, v) = computer(&a, &batch).await;
        assert_eq!(status, 400, "{batch}: {v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{batch}: {v}");
        assert!(v.get("image_url").is_none() && v.get("base64_image").is_none());
    }
    let only_openai = computer(
        &a,
        &json!({"actions": [{"type": "click", "x": 6, "y": 6}, {"type": "bogus"}]}),
    )
    .await
    .1;
    assert_eq!(only_openai["type"], "computer_screenshot", "{only_openai}");
    let mixed = computer(
        &a,
        &json!({"actions": [{"action": "left_click", "coordinate": [6, 6]}, {"type": "bogus"}]}),
    )
    .await
    .1;
    assert!(mixed.get("type").is_none(), "{mixed}");
    assert_eq!(
        (pointer(&c).0, pointer(&c).1),
        (before.0, before.1),
        "the pointer never moved"
    );
    // Nothing arrived before a marker sent afterwards.
    let (status, _) = computer(&a, &json!({"type": "move", "x": 1, "y": 1})).await;
    assert_eq!(status, 200);
    let events = collect_events(&c, Duration::from_secs(10), |evs| {
        evs.iter()
            .any(|e| matches!(e, Event::MotionNotify(m) if (m.event_x, m.event_y) == (1, 1)))
    });
    let other: Vec<&Event> = events
        .iter()
        .filter(|e| !matches!(e, Event::MotionNotify(m) if (m.event_x, m.event_y) == (1, 1)))
        .collect();
    assert!(other.is_empty(), "events from a rejected batch: {other:?}");
}

// Multi-threaded: the batch runs in a task while this one watches the pointer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_stops_at_the_action_that_fails_and_names_it() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let c = x.connect();
    let batch = json!({"actions": [
        {"type": "move", "x": 10, "y": 10},
        {"type": "wait", "ms": 3000},
        {"type": "click", "x": 5, "y": 5},
        {"type": "move", "x": 1, "y": 1}
    ]});
    let client = a.client();
    let call = tokio::spawn(async move {
        let r = client
            .request(reqwest::Method::POST, "/v1/computer")
            .json(&batch)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    // The first action ran; the X server goes away during the wait.
    wait_until("the batch's first move", Duration::from_secs(10), || {
        let (x, y, _) = pointer(&c);
        (x, y) == (10, 10)
    });
    drop(c);
    drop(x);
    let (status, v) = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("the batch answers")
        .unwrap();
    assert_eq!(status, 503, "{}", brief(&v));
    assert_eq!(
        v["type"],
        "computer_screenshot",
        "OpenAI's shape: {}",
        brief(&v)
    );
    // The wait ends with a round trip to the server, which is gone: the wait is what failed.
    assert_eq!(v["failed"]["index"], 1, "{}", brief(&v));
    assert_eq!(v["failed"]["action"], "wait", "{}", brief(&v));
    assert!(
        v["failed"]["error"].as_str().unwrap().contains("display"),
        "{}",
        brief(&v)
    );
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("actions[1] (wait) failed: "),
        "{}",
        brief(&v)
    );
    assert!(
        v.get("image_url").is_none(),
        "no screen to show: {}",
        brief(&v)
    );
}

#[tokio::test]
async fn an_openai_click_through_the_controller_answers_openais_shape() {
    let c = ControllerProcess::start("").await;
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "desktop".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    for path in [
        format!("/sandbox/sandboxes/v1/{}/computer", sb.id),
        format!("/sandbox/sandboxes/v1/{}/v1/computer", sb.id),
    ] {
        let r = cl
            .request(reqwest::Method::POST, &path)
            .json(&json!({"type": "click", "x": 17, "y": 23, "button": "left"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let v: Value = r.json().await.unwrap();
        let img = openai_image(&v);
        assert_eq!((img.0, img.1), (1920, 1080), "{path}");
        let r = cl
            .request(reqwest::Method::POST, &path)
            .json(&json!({"actions": [
                {"type": "move", "x": 31, "y": 41},
                {"action": "cursor_position"}
            ]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["output"], "X=31,Y=41", "{path}: {}", brief(&v));
    }
    let r = cl
        .request(
            reqwest::Method::POST,
            &format!("/sandbox/sandboxes/v1/{}/computer", sb.id),
        )
        .json(&json!({"type": "keypress", "keys": ["HYPER"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "computer_screenshot");
    assert!(v["error"].as_str().unwrap().contains("HYPER"), "{v}");
    cl.delete(&sb.id).await.unwrap();
}
