//! The display benchmark: a 1920x1080 Xvfb with a busy XFCE desktop (xfwm4, panel, desktop,
//! windows with text), everything measured in one run.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::desktop::Desktop;
use crate::percentiles;
use berth_protocol::AgentClient;
use berth_tests::{AgentOptions, AgentProcess, raw_http};
use serde_json::{Value, json};

/// Times `n` runs of `f` after two warm-up runs.
async fn time_n<F, Fut>(n: usize, mut f: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    f().await;
    f().await;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f().await;
        v.push(t.elapsed());
    }
    percentiles(v)
}

fn peer(display: &str, kind: &str, n: usize) -> (f64, f64) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/peers.py");
    let out = Command::new("python3")
        .args([script, kind, &n.to_string()])
        .env("DISPLAY", display)
        .output()
        .expect("python3 with Pillow");
    assert!(
        out.status.success(),
        "{kind}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("peer output");
    (v["p50_ms"].as_f64().unwrap(), v["p99_ms"].as_f64().unwrap())
}

fn run_timed(n: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f();
        v.push(t.elapsed());
    }
    percentiles(v)
}

/// berth's screenshot times beside its peers', screen changed and unchanged.
struct ScreenshotFigures {
    png: (f64, f64),
    jpeg: (f64, f64),
    webp: (f64, f64),
    png_adaptive: (f64, f64),
    cached: (f64, f64),
    scrot: (f64, f64),
    grab: (f64, f64),
    pil_jpeg: (f64, f64),
}

/// berth's input times beside xdotool's, and a window-opening click to its settled
/// screenshot.
struct InputFigures {
    click: (f64, f64),
    xdo_click: (f64, f64),
    typed: (f64, f64),
    typed_10k: (f64, f64),
    xdo_type12: (f64, f64),
    xdo_type0: (f64, f64),
    opened: (f64, f64),
}

pub async fn bench(n: usize) {
    let desk = Desktop::start();
    let x = &desk.x;
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--display".into(), x.display.clone()],
        ..Default::default()
    })
    .await;
    // Let the desktop finish drawing before measuring.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let addr = berth_tests::host_port(&a.base).to_string();
    let c = a.client();
    fill_windows(&c).await;
    let shots = measure_screenshots(&addr, &c, &x.display, n).await;
    let input = measure_input(&c, &x.display, n).await;
    print_table(&shots, &input);
}

/// Some text in the windows makes the screen realistically busy for the encoders.
async fn fill_windows(c: &AgentClient) {
    let filler: String = (0..40)
        .map(|i| format!("line {i}: the quick brown fox jumps over the lazy dog\n"))
        .collect();
    let body = json!({"actions": [{"type": "click", "x": 500, "y": 400}, {"type": "type", "text": filler}]});
    post_input(c, body).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// `n` screenshots of `path` (after two warm-up ones), each over a new connection; with
/// `change`, the pointer moves first (not timed) so the cache cannot answer.
async fn screenshot_times(
    addr: &str,
    c: &AgentClient,
    path: &str,
    change: bool,
    n: usize,
) -> (f64, f64) {
    let mut v = Vec::with_capacity(n);
    for i in 0..n + 2 {
        if change {
            let mv = json!({"actions": [{"type": "move", "x": 600 + (i % 400) as i32, "y": 500}]});
            post_input(c, mv).await;
        }
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            berth_tests::TOKEN
        );
        let t = Instant::now();
        let resp = raw_http(addr, req.as_bytes()).await;
        let took = t.elapsed();
        assert!(resp.starts_with(b"HTTP/1.1 200"), "{path}");
        if i >= 2 {
            v.push(took);
        }
    }
    percentiles(v)
}

/// berth's screenshots in each format, then the peers' (scrot and Pillow) on the same
/// display.
async fn measure_screenshots(
    addr: &str,
    c: &AgentClient,
    display: &str,
    n: usize,
) -> ScreenshotFigures {
    let png = screenshot_times(addr, c, "/screenshot", true, n).await;
    let jpeg = screenshot_times(addr, c, "/v1/screenshot?format=jpeg&quality=80", true, n).await;
    let webp = screenshot_times(
        addr,
        c,
        "/v1/screenshot?format=webp&quality=80",
        true,
        n / 2,
    )
    .await;
    let png_adaptive =
        screenshot_times(addr, c, "/v1/screenshot?compression=fast", true, n / 2).await;
    let cached = screenshot_times(addr, c, "/screenshot", false, n).await;
    ScreenshotFigures {
        png,
        jpeg,
        webp,
        png_adaptive,
        cached,
        scrot: peer(display, "scrot-png", n / 4),
        grab: peer(display, "grab-png", n / 4),
        pil_jpeg: peer(display, "grab-jpeg", n / 4),
    }
}

/// One `/v1/input` request of `actions`, its answer unread.
async fn post_input(c: &AgentClient, actions: Value) {
    c.request(reqwest::Method::POST, "/v1/input")
        .json(&actions)
        .send()
        .await
        .unwrap();
}

/// `text` typed through `/v1/input`, `runs` times.
async fn typing_times(c: &AgentClient, text: &str, runs: usize) -> (f64, f64) {
    time_n(runs, || {
        let c = c.clone();
        let t = text.to_string();
        async move {
            let b = json!({"actions": [{"type": "type", "text": t}]});
            post_input(&c, b).await;
        }
    })
    .await
}

/// `text` typed by `xdotool type --delay <delay>`, twice.
fn xdotool_typing_times(display: &str, text: &str, delay: &str) -> (f64, f64) {
    run_timed(2, move || {
        Command::new("xdotool")
            .args(["type", "--delay", delay, text])
            .env("DISPLAY", display)
            .status()
            .unwrap();
    })
}

/// A click, typing and a window-opening click through `/v1/input`, beside xdotool doing the
/// same.
async fn measure_input(c: &AgentClient, display: &str, n: usize) -> InputFigures {
    // One click through /v1/input vs an xdotool process.
    let click = time_n(n, || {
        let c = c.clone();
        async move {
            let b = json!({"actions": [{"type": "click", "x": 1500, "y": 900}]});
            post_input(&c, b).await;
        }
    })
    .await;
    let xdo_click = run_timed(n / 4, || {
        Command::new("xdotool")
            .args(["mousemove", "1500", "900", "click", "1"])
            .env("DISPLAY", display)
            .status()
            .unwrap();
    });
    // 1,000 characters typed.
    let thousand: String = (0..1000).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    let typed = typing_times(c, &thousand, 5).await;
    let ten_thousand: String = (0..10_000)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let typed_10k = typing_times(c, &ten_thousand, 3).await;
    let xdo_type12 = xdotool_typing_times(display, &thousand, "12");
    let xdo_type0 = xdotool_typing_times(display, &thousand, "0");
    // A click that opens a window, to a settled screenshot.
    let opened = time_n(5, || {
        let c = c.clone();
        async move {
            let b = json!({"actions": [{"type": "key", "keys": "Escape"}, {"type": "click", "x": 100, "y": 120}],
                           "screenshot_after": {"format": "png"}});
            let v: Value = c.request(reqwest::Method::POST, "/v1/input").json(&b).send().await.unwrap().json().await.unwrap();
            assert!(v["screenshot_b64"].is_string());
        }
    })
    .await;
    InputFigures {
        click,
        xdo_click,
        typed,
        typed_10k,
        xdo_type12,
        xdo_type0,
        opened,
    }
}

/// One table row: berth's p50 and p99 beside a peer's, and how many times faster berth is.
fn row(what: &str, ours: (f64, f64), peer_name: &str, theirs: (f64, f64)) {
    println!(
        "| {what} | {:.2} | {:.2} | {peer_name} | {:.2} | {:.2} | {:.1}x |",
        ours.0,
        ours.1,
        theirs.0,
        theirs.1,
        theirs.0 / ours.0
    );
}

/// The table: its header, then the screenshot rows and the input rows.
fn print_table(shots: &ScreenshotFigures, input: &InputFigures) {
    println!();
    println!("Display, 1920x1080 XFCE desktop (xfwm4, panel, desktop, two windows with text)");
    println!(
        "| measurement | berth p50 ms | berth p99 ms | peer | peer p50 ms | peer p99 ms | ratio (p50) |"
    );
    println!("|---|---|---|---|---|---|---|");
    print_screenshot_rows(shots);
    print_input_rows(input, shots.scrot);
}

/// The screenshot rows: berth's formats beside scrot and Pillow.
fn print_screenshot_rows(s: &ScreenshotFigures) {
    row(
        "PNG `/screenshot` (screen changed)",
        s.png,
        "scrot + Pillow PNG (OSWorld v2)",
        s.scrot,
    );
    row(
        "PNG `/screenshot` (screen changed)",
        s.png,
        "Pillow ImageGrab + PNG (OSWorld v1)",
        s.grab,
    );
    row(
        "JPEG q80 `/v1/screenshot`",
        s.jpeg,
        "Pillow ImageGrab + JPEG q80",
        s.pil_jpeg,
    );
    row(
        "unchanged screen `/screenshot` (cache)",
        s.cached,
        "scrot + Pillow PNG (OSWorld v2)",
        s.scrot,
    );
    println!(
        "| WebP q80 `/v1/screenshot` | {:.2} | {:.2} | — | — | — | — |",
        s.webp.0, s.webp.1
    );
    println!(
        "| PNG `compression=fast` (adaptive filter) | {:.2} | {:.2} | Pillow ImageGrab + PNG (OSWorld v1) | {:.2} | {:.2} | {:.1}x |",
        s.png_adaptive.0,
        s.png_adaptive.1,
        s.grab.0,
        s.grab.1,
        s.grab.0 / s.png_adaptive.0
    );
}

/// The input rows; the window-opening click is compared with a fixed 2 s sleep plus a scrot
/// screenshot (`scrot`).
fn print_input_rows(i: &InputFigures, scrot: (f64, f64)) {
    row(
        "one click, `/v1/input`",
        i.click,
        "`xdotool mousemove … click 1`",
        i.xdo_click,
    );
    row(
        "1,000 characters typed",
        i.typed,
        "`xdotool type --delay 12` (Anthropic's tool)",
        i.xdo_type12,
    );
    row(
        "1,000 characters typed",
        i.typed,
        "`xdotool type --delay 0`",
        i.xdo_type0,
    );
    println!(
        "| 10,000 characters typed | {:.1} | {:.1} | — | — | — | — |",
        i.typed_10k.0, i.typed_10k.1
    );
    println!(
        "| window-opening click → settled screenshot | {:.0} | {:.0} | click + fixed 2 s sleep + screenshot | ≥ 2000 | — | {:.1}x |",
        i.opened.0,
        i.opened.1,
        (2000.0 + scrot.0) / i.opened.0
    );
}
