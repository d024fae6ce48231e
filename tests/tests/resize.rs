//! A resizable screen: `PUT /v1/display` on the real desktop (Xvnc, xfwm4, xfce4-panel,
//! Chromium) read back from RandR and the root window, from screenshots, the compat
//! `/screen_size` and `GET /v1/display`; XTEST input at the new corner; a maximised window and
//! the panel following; a recording across a resize staying one valid MP4 (scaled, aspect
//! kept); bad sizes refused; and `screen` at create and on a warm pool through the controller.

use std::path::Path;
use std::time::{Duration, Instant};

use berth_protocol::controller::{AcquireLease, CreateSandbox, PoolList};
use berth_protocol::{RecordingRequest, RecordingState};
use berth_tests::controller::{ControllerProcess, Provider};
use berth_tests::video::{decode_rgb, near, probe, rgb_at};
use berth_tests::x::decode_png;
use berth_tests::{AgentOptions, AgentProcess, wait_for, wait_until};
use serde_json::{Value, json};
use x11rb::connection::Connection;
use x11rb::protocol::Event;
use x11rb::protocol::randr::ConnectionExt as _;
use x11rb::protocol::xproto::{
    AtomEnum, ClientMessageEvent, ConnectionExt as _, CreateWindowAux, EventMask, PropMode,
    WindowClass,
};
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

const START: (u32, u32) = (1920, 1080);

async fn desktop_agent() -> AgentProcess {
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec![
            "--desktop".into(),
            // Desktops run side by side: each its own CDP port.
            "--cdp-listen".into(),
            "127.0.0.1:0".into(),
            "--screen".into(),
            format!("{}x{}", START.0, START.1),
        ],
        ..Default::default()
    })
    .await;
    let r = a
        .client()
        .request(reqwest::Method::GET, "/v1/ready?wait=90s")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "not ready: {}", r.text().await.unwrap());
    a
}

async fn put_display(a: &AgentProcess, body: Value) -> (u16, Value) {
    let r = a
        .client()
        .request(reqwest::Method::PUT, "/v1/display")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn resize(a: &AgentProcess, w: u32, h: u32) {
    let started = Instant::now();
    let (status, body) = put_display(a, json!({"width": w, "height": h})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["width"].as_u64(), body["height"].as_u64()),
        (Some(w as u64), Some(h as u64)),
        "{body}"
    );
    println!("PUT /v1/display {w}x{h}: {:?}", started.elapsed());
}

/// The MIT-MAGIC-COOKIE-1 of an Xauthority file.
fn xauth_cookie(path: &Path) -> Vec<u8> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut i = 0;
    let field = |i: &mut usize| {
        let n = u16::from_be_bytes([b[*i], b[*i + 1]]) as usize;
        *i += 2;
        let f = b[*i..*i + n].to_vec();
        *i += n;
        f
    };
    while i + 2 <= b.len() {
        i += 2; // family
        let _address = field(&mut i);
        let _number = field(&mut i);
        let name = field(&mut i);
        let data = field(&mut i);
        if name == b"MIT-MAGIC-COOKIE-1" {
            return data;
        }
    }
    panic!("no cookie in {}", path.display());
}

/// A connection to the agent's desktop with its cookie.
async fn x_connect(a: &AgentProcess) -> RustConnection {
    let display = a.get_json("/v1/display").await["display"]
        .as_str()
        .expect("the desktop's display")
        .to_string();
    let cookie = xauth_cookie(&a.home.join(".Xauthority"));
    let parsed =
        x11rb::reexports::x11rb_protocol::parse_display::parse_display(Some(&display)).unwrap();
    for addr in parsed.connect_instruction() {
        if let Ok((stream, _)) = x11rb::rust_connection::DefaultStream::connect(&addr) {
            return RustConnection::connect_to_stream_with_auth_info(
                stream,
                0,
                b"MIT-MAGIC-COOKIE-1".to_vec(),
                cookie,
            )
            .unwrap();
        }
    }
    panic!("cannot reach {display}");
}

/// What the X server says the screen is: the root window, RandR 1.0's current size and
/// every active CRTC (RandR 1.2).
fn x_sizes(c: &RustConnection) -> Vec<(u32, u32)> {
    let root = c.setup().roots[0].root;
    c.randr_query_version(1, 3).unwrap().reply().unwrap();
    let g = c.get_geometry(root).unwrap().reply().unwrap();
    let info = c.randr_get_screen_info(root).unwrap().reply().unwrap();
    let current = info.sizes[info.size_id as usize];
    let res = c
        .randr_get_screen_resources_current(root)
        .unwrap()
        .reply()
        .unwrap();
    let mut out = vec![
        (g.width as u32, g.height as u32),
        (current.width as u32, current.height as u32),
    ];
    for &crtc in &res.crtcs {
        let ci = c
            .randr_get_crtc_info(crtc, res.config_timestamp)
            .unwrap()
            .reply()
            .unwrap();
        if ci.mode != 0 {
            out.push((ci.width as u32, ci.height as u32));
        }
    }
    out
}

async fn screenshot_size(a: &AgentProcess) -> (u32, u32) {
    let r = a
        .client()
        .request(reqwest::Method::GET, "/v1/screenshot")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let img = decode_png(&r.bytes().await.unwrap());
    (img.0, img.1)
}

/// A normal window, mapped maximised (EWMH `_NET_WM_STATE`), that the window manager manages.
fn maximised_window(c: &RustConnection) -> u32 {
    let root = c.setup().roots[0].root;
    let atom = |n: &str| {
        c.intern_atom(false, n.as_bytes())
            .unwrap()
            .reply()
            .unwrap()
            .atom
    };
    let (state, vert, horz) = (
        atom("_NET_WM_STATE"),
        atom("_NET_WM_STATE_MAXIMIZED_VERT"),
        atom("_NET_WM_STATE_MAXIMIZED_HORZ"),
    );
    let w = c.generate_id().unwrap();
    c.create_window(
        0,
        w,
        root,
        100,
        100,
        400,
        300,
        0,
        WindowClass::INPUT_OUTPUT,
        0,
        &CreateWindowAux::new()
            .background_pixel(0x3366cc)
            .event_mask(EventMask::STRUCTURE_NOTIFY),
    )
    .unwrap();
    c.change_property8(
        PropMode::REPLACE,
        w,
        AtomEnum::WM_NAME,
        AtomEnum::STRING,
        b"berth-resize-probe",
    )
    .unwrap();
    c.change_property32(PropMode::REPLACE, w, state, AtomEnum::ATOM, &[vert, horz])
        .unwrap();
    c.map_window(w).unwrap();
    // Also asked once mapped, as a running client would.
    let ev = ClientMessageEvent::new(32, w, state, [1, vert, horz, 1, 0]);
    c.send_event(
        false,
        root,
        EventMask::SUBSTRUCTURE_REDIRECT | EventMask::SUBSTRUCTURE_NOTIFY,
        ev,
    )
    .unwrap();
    c.flush().unwrap();
    w
}

/// A window's rectangle on the root.
fn root_rect(c: &RustConnection, w: u32) -> (i32, i32, u32, u32) {
    let root = c.setup().roots[0].root;
    let g = c.get_geometry(w).unwrap().reply().unwrap();
    let t = c
        .translate_coordinates(w, root, 0, 0)
        .unwrap()
        .reply()
        .unwrap();
    (
        t.dst_x as i32,
        t.dst_y as i32,
        g.width as u32,
        g.height as u32,
    )
}

/// Whether a maximised window spans the screen's width and reaches its bottom (the panel
/// sits at the top).
fn fills(rect: (i32, i32, u32, u32), screen: (u32, u32)) -> bool {
    let (x, y, w, h) = rect;
    let right = x + w as i32;
    let bottom = y + h as i32;
    x >= 0
        && right <= screen.0 as i32
        && w + 16 >= screen.0
        && bottom <= screen.1 as i32
        && bottom + 16 >= screen.1 as i32
        && h * 2 > screen.1
}

/// The width of the widest xfce4-panel window.
fn panel_width(c: &RustConnection) -> u32 {
    let root = c.setup().roots[0].root;
    let mut best = 0;
    let mut stack = vec![(root, 0)];
    while let Some((w, depth)) = stack.pop() {
        if depth < 2
            && let Ok(Ok(tree)) = c.query_tree(w).map(|t| t.reply())
        {
            stack.extend(tree.children.iter().map(|&k| (k, depth + 1)));
        }
        let class = c
            .get_property(false, w, AtomEnum::WM_CLASS, AtomEnum::STRING, 0, 64)
            .ok()
            .and_then(|p| p.reply().ok())
            .map(|p| p.value)
            .unwrap_or_default();
        if class.windows(11).any(|s| s == b"xfce4-panel")
            && let Ok(Ok(g)) = c.get_geometry(w).map(|g| g.reply())
        {
            best = best.max(g.width as u32);
        }
    }
    best
}

/// Everything that reports the screen's size agrees on `want`, and the desktop follows.
async fn everything_is(a: &AgentProcess, c: &RustConnection, window: u32, want: (u32, u32)) {
    for s in x_sizes(c) {
        assert_eq!(s, want, "RandR and the root: {:?}", x_sizes(c));
    }
    assert_eq!(screenshot_size(a).await, want, "the screenshot");
    let d = a.get_json("/v1/display").await;
    assert_eq!(
        (d["width"].as_u64(), d["height"].as_u64()),
        (Some(want.0 as u64), Some(want.1 as u64))
    );
    // OSWorld's client POSTs it.
    let compat: Value = reqwest::Client::new()
        .post(a.url("/screen_size"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        compat,
        json!({"width": want.0, "height": want.1}),
        "compat /screen_size"
    );
    let started = Instant::now();
    wait_until(
        "the maximised window to follow",
        Duration::from_secs(20),
        || fills(root_rect(c, window), want),
    );
    wait_until("the panel to follow", Duration::from_secs(20), || {
        panel_width(c) == want.0
    });
    println!(
        "{}x{}: the maximised window is {:?} and the panel {} wide after {:?}",
        want.0,
        want.1,
        root_rect(c, window),
        panel_width(c),
        started.elapsed()
    );
}

/// Input at the screen's bottom-right pixel lands there: the pointer is read back from X
/// and a click reaches a window in that corner.
async fn the_corner_takes_input(a: &AgentProcess, c: &RustConnection, screen: (u32, u32)) {
    let (cx, cy) = (screen.0 as i32 - 1, screen.1 as i32 - 1);
    let root = c.setup().roots[0].root;
    let corner = c.generate_id().unwrap();
    c.create_window(
        0,
        corner,
        root,
        (cx - 19) as i16,
        (cy - 19) as i16,
        20,
        20,
        0,
        WindowClass::INPUT_OUTPUT,
        0,
        &CreateWindowAux::new()
            .background_pixel(0xcc3333)
            .override_redirect(1)
            .event_mask(EventMask::BUTTON_PRESS),
    )
    .unwrap();
    c.map_window(corner).unwrap();
    c.get_input_focus().unwrap().reply().unwrap();
    let r = a
        .client()
        .request(reqwest::Method::POST, "/v1/input")
        .json(&json!({"actions": [{"type": "click", "x": cx, "y": cy}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["cursor"], json!([cx, cy]));
    let p = c.query_pointer(root).unwrap().reply().unwrap();
    assert_eq!((p.root_x as i32, p.root_y as i32), (cx, cy));
    let events = berth_tests::x::collect_events(c, Duration::from_secs(10), |evs| {
        evs.iter().any(|e| matches!(e, Event::ButtonPress(_)))
    });
    let press = events
        .iter()
        .find_map(|e| match e {
            Event::ButtonPress(b) => Some(*b),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (press.event, press.event_x, press.event_y),
        (corner, 19, 19)
    );
    // One pixel past the corner is outside the screen.
    let r = a
        .client()
        .request(reqwest::Method::POST, "/v1/input")
        .json(&json!({"actions": [{"type": "move", "x": cx + 1, "y": cy}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // The computer-use route maps against the size it reads at each call.
    let r = a
        .client()
        .request(reqwest::Method::POST, "/v1/computer")
        .json(&json!({"action": "mouse_move", "coordinate": [cx, cy]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let p = c.query_pointer(root).unwrap().reply().unwrap();
    assert_eq!((p.root_x as i32, p.root_y as i32), (cx, cy));
    c.destroy_window(corner).unwrap();
    c.flush().unwrap();
}

#[tokio::test]
async fn a_resize_and_back_is_read_back_everywhere_and_the_desktop_follows() {
    let a = desktop_agent().await;
    let c = x_connect(&a).await;
    let window = maximised_window(&c);
    everything_is(&a, &c, window, START).await;
    // A cached screenshot of the old size is never served after the resize.
    assert_eq!(screenshot_size(&a).await, START);

    resize(&a, 1280, 800).await;
    everything_is(&a, &c, window, (1280, 800)).await;
    the_corner_takes_input(&a, &c, (1280, 800)).await;

    // A size no mode exists for yet is made.
    resize(&a, 1000, 700).await;
    everything_is(&a, &c, window, (1000, 700)).await;

    resize(&a, START.0, START.1).await;
    everything_is(&a, &c, window, START).await;
    the_corner_takes_input(&a, &c, START).await;
}

#[tokio::test]
async fn bad_sizes_are_refused_and_resizes_do_not_interleave() {
    let a = desktop_agent().await;
    for (body, needle) in [
        (json!({"width": 1281, "height": 800}), "even"),
        (json!({"width": 100, "height": 800}), "320x200"),
        (json!({"width": 1280, "height": 100}), "320x200"),
        (json!({"width": 9000, "height": 800}), "7680x4320"),
        (json!({"width": 0, "height": 0}), "320x200"),
        (json!({"width": 1280}), "height"),
        (json!({"width": "1280", "height": 800}), "width"),
        (json!({"width": -2, "height": 800}), "width"),
        (json!({"width": 1280, "height": 800, "depth": 16}), "depth"),
    ] {
        let (status, err) = put_display(&a, body.clone()).await;
        assert_eq!(status, 400, "{body}: {err}");
        assert_eq!(err["error"]["code"], "invalid_request", "{body}: {err}");
        let msg = err["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    // Nothing changed.
    let d = a.get_json("/v1/display").await;
    assert_eq!(
        (d["width"].as_u64(), d["height"].as_u64()),
        (Some(1920), Some(1080))
    );

    // Many resizes at once: each answers its own size whole, and the server ends consistent
    // (root, RandR and CRTC agree) at one of them.
    let sizes = [
        (1280, 800),
        (1024, 768),
        (1600, 900),
        (800, 600),
        (1366, 768),
        (1440, 900),
    ];
    let answers = futures_util::future::join_all(sizes.iter().map(|&(w, h)| {
        let a = &a;
        async move { (w, h, put_display(a, json!({"width": w, "height": h})).await) }
    }))
    .await;
    for (w, h, (status, body)) in answers {
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            (body["width"].as_u64(), body["height"].as_u64()),
            (Some(w), Some(h)),
            "{body}"
        );
    }
    let c = x_connect(&a).await;
    let end = x_sizes(&c);
    assert!(end.iter().all(|&s| s == end[0]), "{end:?}");
    assert!(
        sizes.contains(&(end[0].0 as u64, end[0].1 as u64)),
        "{end:?}"
    );
    assert_eq!(screenshot_size(&a).await, end[0]);
}

#[tokio::test]
async fn without_a_display_a_resize_is_a_named_503() {
    let a = AgentProcess::start().await;
    let (status, err) = put_display(&a, json!({"width": 1280, "height": 800})).await;
    assert_eq!(status, 503, "{err}");
    assert_eq!(err["error"]["code"], "no_display", "{err}");
}

#[tokio::test]
async fn a_recording_across_a_resize_stays_one_valid_mp4_scaled_with_its_aspect_kept() {
    let a = desktop_agent().await;
    let client = a.client();
    let rec = client
        .start_recording(&RecordingRequest {
            fps: Some(5),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((rec.width, rec.height), START);
    let frames = |n: u64| {
        let client = client.clone();
        let id = rec.id.clone();
        async move {
            wait_for("recorded frames", Duration::from_secs(30), || {
                let client = client.clone();
                let id = id.clone();
                async move {
                    let i = client.recording(&id).await.ok()?;
                    (i.frames_encoded >= n).then_some(i.frames_encoded)
                }
            })
            .await
        }
    };
    let before = frames(2).await;
    resize(&a, 1280, 800).await;
    // The picture changes with the resize, then once-a-second refreshes follow; a picture
    // taken just before the resize may still be encoded after it.
    let at_resize = client.recording(&rec.id).await.unwrap().frames_encoded;
    frames(at_resize + 4).await;
    let info = client.stop_recording(&rec.id).await.unwrap();
    assert_eq!(info.state, RecordingState::Stopped);
    assert_eq!(
        (info.width, info.height),
        START,
        "the file keeps its dimensions"
    );
    let path = a.dir.path().join("across.mp4");
    std::fs::write(&path, client.recording_file(&rec.id).await.unwrap()).unwrap();

    let p = probe(&path);
    assert_eq!(
        (p.codec.as_str(), p.width, p.height),
        ("h264", START.0, START.1)
    );
    assert!(p.frames.len() as u64 >= before + 3, "{p:?}");
    assert_eq!(p.frames[0].1, "I", "{p:?}");
    let decoded = decode_rgb(&path, START.0, START.1);
    assert_eq!(decoded.len(), p.frames.len());
    // 1280x800 is 16:10: scaled into 16:9 it is 1728x1080, with 96-pixel black bars on the
    // left and right. Before the resize the desktop filled the frame.
    let black = [0, 0, 0];
    let first = &decoded[0];
    let last = decoded.last().unwrap();
    for y in [200, 540, 900] {
        assert!(
            near(rgb_at(last, START.0, 40, y), black, 12),
            "left bar at y={y}: {:?}",
            rgb_at(last, START.0, 40, y)
        );
        assert!(
            near(rgb_at(last, START.0, START.0 - 40, y), black, 12),
            "right bar at y={y}"
        );
    }
    let lit = |f: &[u8]| {
        [200, 540, 900]
            .iter()
            .any(|&y| !near(rgb_at(f, START.0, 40, y), black, 12))
    };
    assert!(
        lit(first),
        "the desktop reaches the left edge before the resize"
    );
    assert!(
        !near(rgb_at(last, START.0, 960, 540), black, 12),
        "the screen is inside the bars"
    );
    let after = decoded.iter().filter(|f| !lit(f)).count();
    println!(
        "{} frames, {} of them after the resize (barred), {:.1} s",
        decoded.len(),
        after,
        p.duration
    );
    assert!(after >= 3, "{after} frames after the resize");
}

// Through the controller.

fn desktop_with(screen: Option<&str>) -> CreateSandbox {
    CreateSandbox {
        profile: "desktop-ubuntu".into(),
        screen: screen.map(Into::into),
        ..Default::default()
    }
}

/// The sandbox's screen as its agent (through the controller), its compat surface and a
/// screenshot see it.
async fn sandbox_screen(c: &ControllerProcess, id: &str) -> (u32, u32) {
    let cl = c.client();
    let d: Value = cl
        .agent(id)
        .request(reqwest::Method::GET, "/v1/display")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let size = (
        d["width"].as_u64().unwrap() as u32,
        d["height"].as_u64().unwrap() as u32,
    );
    let sb = cl.get(id).await.unwrap();
    let compat = sb.endpoints.compat.clone().expect("a compat endpoint");
    let s: Value = reqwest::Client::new()
        .post(format!("{}/screen_size", compat.trim_end_matches('/')))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        s,
        json!({"width": size.0, "height": size.1}),
        "compat /screen_size"
    );
    let png = decode_png(&cl.screenshot(id).await.unwrap());
    assert_eq!((png.0, png.1), size, "the screenshot");
    assert_eq!(
        sb.screen,
        Some(format!("{}x{}", size.0, size.1)),
        "the record"
    );
    size
}

async fn screen_at_create(provider: Provider) {
    let c = ControllerProcess::start_on(provider, "").await;
    let cl = c.client();
    // Refused before anything starts.
    for (req, needle) in [
        (desktop_with(Some("1281x800")), "even"),
        (desktop_with(Some("big")), "WIDTHxHEIGHT"),
        (desktop_with(Some("100x100")), "320x200"),
        (
            CreateSandbox {
                profile: "ide".into(),
                screen: Some("1280x800".into()),
                ..Default::default()
            },
            "no desktop",
        ),
    ] {
        let r = cl
            .request(reqwest::Method::POST, "/sandbox/sandboxes/v1")
            .json(&req)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{req:?}");
        let err: Value = r.json().await.unwrap();
        assert_eq!(err["error"]["code"], "invalid_request", "{err}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(needle),
            "{err}"
        );
    }
    assert_eq!(c.live_sandboxes(), 0);

    let started = Instant::now();
    let sb = cl.create(&desktop_with(Some("1280x800"))).await.unwrap();
    println!(
        "{provider:?}: a 1280x800 desktop in {:?}",
        started.elapsed()
    );
    assert_eq!(sb.status, "running", "{sb:?}");
    assert_eq!(sb.screen.as_deref(), Some("1280x800"));
    assert_eq!(sandbox_screen(&c, &sb.id).await, (1280, 800));
    // Through the controller, the agent's PUT resizes it again.
    let r = cl
        .agent(&sb.id)
        .request(reqwest::Method::PUT, "/v1/display")
        .json(&json!({"width": 1024, "height": 768}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The record follows by the time the resize answers, with the event on the timeline.
    let after = cl.get(&sb.id).await.unwrap();
    assert_eq!(after.screen.as_deref(), Some("1024x768"), "{after:?}");
    let display = c
        .client()
        .agent(&sb.id)
        .request(reqwest::Method::GET, "/v1/display")
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(display["width"], 1024);
    cl.delete(&sb.id).await.unwrap();
}

berth_tests::on_every_provider!(screen_at_create);

#[tokio::test]
async fn a_desktop_created_without_a_screen_records_the_one_it_has() {
    let c = ControllerProcess::start("").await;
    let sb = c.client().create(&desktop_with(None)).await.unwrap();
    assert_eq!(sb.screen.as_deref(), Some("1920x1080"), "{sb:?}");
    assert_eq!(sandbox_screen(&c, &sb.id).await, (1920, 1080));
}

#[tokio::test]
async fn a_pool_with_a_screen_hands_out_that_screen_and_a_claim_may_ask_another() {
    let c = ControllerProcess::start(
        "[[pools]]\nprofile = \"desktop-ubuntu\"\nsize = 1\nscreen = \"1024x768\"\n",
    )
    .await;
    let cl = c.client();
    let ready = || async {
        let pools: PoolList = cl.pool_list().await.ok()?;
        (pools.pools.first()?.ready >= 1).then_some(())
    };
    wait_for("the pool to fill", Duration::from_secs(120), ready).await;
    let pools = cl.pool_list().await.unwrap();
    assert_eq!(
        pools.pools[0].screen.as_deref(),
        Some("1024x768"),
        "{pools:?}"
    );
    let sb = cl.create(&desktop_with(None)).await.unwrap();
    assert_eq!(sb.claim.as_deref(), Some("warm"), "{sb:?}");
    assert_eq!(sb.screen.as_deref(), Some("1024x768"));
    assert_eq!(sandbox_screen(&c, &sb.id).await, (1024, 768));

    // The refilled member is claimed by a create asking another screen: resized before the
    // answer.
    wait_for("the pool to refill", Duration::from_secs(120), ready).await;
    let started = Instant::now();
    let other = cl.create(&desktop_with(Some("1280x800"))).await.unwrap();
    println!(
        "a warm claim resized to 1280x800 in {:?}",
        started.elapsed()
    );
    assert_eq!(other.claim.as_deref(), Some("warm"), "{other:?}");
    assert_eq!(other.screen.as_deref(), Some("1280x800"));
    assert_eq!(sandbox_screen(&c, &other.id).await, (1280, 800));
}

// The viewer: Xvnc tells RFB clients the new size (DesktopSize / ExtendedDesktopSize) and the
// agent's relay passes it to full and view-only viewers alike.

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn viewer(a: &AgentProcess, view_only: bool) -> Ws {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let token = a
        .client()
        .viewer_token(&berth_protocol::ViewerTokenRequest {
            view_only: Some(view_only),
            ..Default::default()
        })
        .await
        .unwrap();
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = browser.get(a.url(&token.url)).send().await.unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let url = format!("ws://{}/v1/vnc/websockify", berth_tests::host_port(&a.base));
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert("cookie", cookie.parse().unwrap());
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

/// Reads until `buf` holds at least `n` bytes.
async fn fill(ws: &mut Ws, buf: &mut Vec<u8>, n: usize) {
    use futures_util::StreamExt;
    let read = async {
        while buf.len() < n {
            match ws.next().await {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Binary(b))) => {
                    buf.extend_from_slice(&b)
                }
                Some(Ok(_)) => {}
                other => panic!("the VNC relay ended: {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the VNC server answered within 20 s");
}

async fn send(ws: &mut Ws, bytes: Vec<u8>) {
    use futures_util::SinkExt;
    ws.send(tokio_tungstenite::tungstenite::Message::binary(bytes))
        .await
        .unwrap();
}

/// An RFB 3.8 handshake (security None); the framebuffer size and bytes per pixel.
async fn rfb_handshake(ws: &mut Ws, buf: &mut Vec<u8>) -> ((u32, u32), usize) {
    fill(ws, buf, 12).await;
    assert!(buf.starts_with(b"RFB 003.00"));
    buf.drain(..12);
    send(ws, b"RFB 003.008\n".to_vec()).await;
    fill(ws, buf, 1).await;
    let n = buf[0] as usize;
    fill(ws, buf, 1 + n).await;
    assert!(buf[1..1 + n].contains(&1));
    buf.drain(..1 + n);
    send(ws, vec![1]).await;
    fill(ws, buf, 4).await;
    assert_eq!(&buf[..4], &[0, 0, 0, 0], "SecurityResult");
    buf.drain(..4);
    send(ws, vec![1]).await; // shared
    fill(ws, buf, 24).await;
    let w = u16::from_be_bytes([buf[0], buf[1]]) as u32;
    let h = u16::from_be_bytes([buf[2], buf[3]]) as u32;
    let bytes_per_pixel = buf[4] as usize / 8;
    let name_len = u32::from_be_bytes([buf[20], buf[21], buf[22], buf[23]]) as usize;
    fill(ws, buf, 24 + name_len).await;
    buf.drain(..24 + name_len);
    ((w, h), bytes_per_pixel)
}

/// A framebuffer update's rectangle: width, height, encoding.
type Rect = (u16, u16, i32);

const DESKTOP_SIZE: i32 = -223;
const EXTENDED_DESKTOP_SIZE: i32 = -308;

/// One whole server message at the front of `buf`: its length and the rectangles it carries
/// (width, height, encoding); `None` while more bytes are needed.
fn server_message(buf: &[u8], bytes_per_pixel: usize) -> Option<(usize, Vec<Rect>)> {
    let u16_at = |i: usize| Some(u16::from_be_bytes([*buf.get(i)?, *buf.get(i + 1)?]));
    match *buf.first()? {
        0 => {
            let n = u16_at(2)?;
            let mut pos = 4;
            let mut rects = Vec::new();
            for _ in 0..n {
                let (w, h) = (u16_at(pos + 4)?, u16_at(pos + 6)?);
                let enc = i32::from_be_bytes(buf.get(pos + 8..pos + 12)?.try_into().ok()?);
                pos += 12;
                match enc {
                    0 => pos += w as usize * h as usize * bytes_per_pixel,
                    DESKTOP_SIZE => {}
                    EXTENDED_DESKTOP_SIZE => pos += 4 + 16 * *buf.get(pos)? as usize,
                    other => panic!("an encoding not asked for: {other}"),
                }
                rects.push((w, h, enc));
            }
            (buf.len() >= pos).then_some((pos, rects))
        }
        // Bell, EndOfContinuousUpdates.
        2 | 150 => Some((1, Vec::new())),
        3 => {
            let len = u32::from_be_bytes(buf.get(4..8)?.try_into().ok()?) as usize;
            (buf.len() >= 8 + len).then_some((8 + len, Vec::new()))
        }
        t => panic!("an unexpected server message {t}"),
    }
}

/// Asks for one-pixel updates until a size rectangle of `want` arrives.
async fn hear_size(ws: &mut Ws, buf: &mut Vec<u8>, bpp: usize, want: (u32, u32)) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "no size update of {want:?} came");
        // An incremental request for the top-left pixel: small answers, and a pending size
        // change rides on the next one.
        send(ws, vec![3, 1, 0, 0, 0, 0, 0, 1, 0, 1]).await;
        loop {
            let Some((len, rects)) = server_message(buf, bpp) else {
                let need = buf.len() + 1;
                fill(ws, buf, need).await;
                continue;
            };
            buf.drain(..len);
            if let Some(&(_, _, enc)) = rects.iter().find(|&&(w, h, enc)| {
                (enc == DESKTOP_SIZE || enc == EXTENDED_DESKTOP_SIZE)
                    && (w as u32, h as u32) == want
            }) {
                return enc;
            }
            if !rects.is_empty() {
                break;
            }
        }
    }
}

#[tokio::test]
async fn viewers_through_the_relay_hear_the_new_size() {
    let a = desktop_agent().await;
    let mut viewers = Vec::new();
    for view_only in [false, true] {
        let mut ws = viewer(&a, view_only).await;
        let mut buf = Vec::new();
        let (size, bpp) = rfb_handshake(&mut ws, &mut buf).await;
        assert_eq!(size, START);
        // SetEncodings: raw, ExtendedDesktopSize, DesktopSize (what noVNC announces, among
        // others).
        let mut msg = vec![2, 0, 0, 3];
        for e in [0i32, EXTENDED_DESKTOP_SIZE, DESKTOP_SIZE] {
            msg.extend_from_slice(&e.to_be_bytes());
        }
        send(&mut ws, msg).await;
        // A first full request of one pixel.
        send(&mut ws, vec![3, 0, 0, 0, 0, 0, 0, 1, 0, 1]).await;
        viewers.push((view_only, ws, buf, bpp));
    }
    resize(&a, 1280, 800).await;
    for (view_only, ws, buf, bpp) in &mut viewers {
        let enc = hear_size(ws, buf, *bpp, (1280, 800)).await;
        println!("a viewer (view-only {view_only}) heard 1280x800 (encoding {enc})");
    }
    resize(&a, START.0, START.1).await;
    for (_, ws, buf, bpp) in &mut viewers {
        hear_size(ws, buf, *bpp, START).await;
    }
}

#[tokio::test]
async fn a_lease_may_ask_a_screen_and_a_reused_sandbox_takes_the_next_one_asked() {
    let c = ControllerProcess::start("").await;
    let cl = c.client();
    let acquire = |screen: Option<&str>| AcquireLease {
        thread_id: "screen-thread".into(),
        profile: "desktop-ubuntu".into(),
        screen: screen.map(Into::into),
        ..Default::default()
    };
    let a = cl.acquire(&acquire(Some("1280x800"))).await.unwrap();
    assert_eq!(a.sandbox.screen.as_deref(), Some("1280x800"), "{a:?}");
    assert_eq!(sandbox_screen(&c, &a.sandbox.id).await, (1280, 800));
    // The same thread asks another size: the same sandbox, resized.
    let b = cl.acquire(&acquire(Some("1024x768"))).await.unwrap();
    assert_eq!(b.how.as_deref(), Some("reused"), "{b:?}");
    assert_eq!(b.sandbox.id, a.sandbox.id);
    assert_eq!(b.sandbox.screen.as_deref(), Some("1024x768"));
    assert_eq!(sandbox_screen(&c, &b.sandbox.id).await, (1024, 768));
    // Asking none keeps what it has.
    let same = cl.acquire(&acquire(None)).await.unwrap();
    assert_eq!(same.sandbox.screen.as_deref(), Some("1024x768"));
    // A bad size, or a screen for a profile without a desktop, is refused before anything.
    for (profile, screen) in [("desktop-ubuntu", "1281x800"), ("ide-ubuntu", "1280x800")] {
        let e = cl
            .acquire(&AcquireLease {
                thread_id: "screen-bad".into(),
                profile: profile.into(),
                screen: Some(screen.into()),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("400"), "{profile} {screen}: {e}");
    }
    cl.release(&a.lease_id).await.unwrap();
}
