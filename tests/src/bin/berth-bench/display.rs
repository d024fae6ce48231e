//! The display benchmark: a 1920x1080 Xvfb with a busy XFCE desktop (xfwm4, panel, desktop,
//! windows with text), everything measured in one run.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::desktop::Desktop;
use crate::percentiles;
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

    // Some text in the windows makes the screen realistically busy for the encoders.
    let filler: String = (0..40)
        .map(|i| format!("line {i}: the quick brown fox jumps over the lazy dog\n"))
        .collect();
    let body = json!({"actions": [{"type": "click", "x": 500, "y": 400}, {"type": "type", "text": filler}]});
    c.request(reqwest::Method::POST, "/v1/input")
        .json(&body)
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // One screenshot over a new connection; with `change`, the pointer moves first (not
    // timed) so the cache cannot answer.
    let shots = |path: &'static str, change: bool, n: usize| {
        let addr = addr.clone();
        let c = c.clone();
        async move {
            let mut v = Vec::with_capacity(n);
            for i in 0..n + 2 {
                if change {
                    let mv = json!({"actions": [{"type": "move", "x": 600 + (i % 400) as i32, "y": 500}]});
                    c.request(reqwest::Method::POST, "/v1/input")
                        .json(&mv)
                        .send()
                        .await
                        .unwrap();
                }
                let req = format!(
                    "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
                    berth_tests::TOKEN
                );
                let t = Instant::now();
                let resp = raw_http(&addr, req.as_bytes()).await;
                let took = t.elapsed();
                assert!(resp.starts_with(b"HTTP/1.1 200"), "{path}");
                if i >= 2 {
                    v.push(took);
                }
            }
            percentiles(v)
        }
    };
    let png = shots("/screenshot", true, n).await;
    let jpeg = shots("/v1/screenshot?format=jpeg&quality=80", true, n).await;
    let webp = shots("/v1/screenshot?format=webp&quality=80", true, n / 2).await;
    let png_adaptive = shots("/v1/screenshot?compression=fast", true, n / 2).await;
    let cached = shots("/screenshot", false, n).await;
    let scrot = peer(&x.display, "scrot-png", n / 4);
    let grab = peer(&x.display, "grab-png", n / 4);
    let pil_jpeg = peer(&x.display, "grab-jpeg", n / 4);

    // One click through /v1/input vs an xdotool process.
    let click = time_n(n, || {
        let c = c.clone();
        async move {
            let b = json!({"actions": [{"type": "click", "x": 1500, "y": 900}]});
            c.request(reqwest::Method::POST, "/v1/input")
                .json(&b)
                .send()
                .await
                .unwrap();
        }
    })
    .await;
    let display = x.display.clone();
    let xdo_click = run_timed(n / 4, || {
        Command::new("xdotool")
            .args(["mousemove", "1500", "900", "click", "1"])
            .env("DISPLAY", &display)
            .status()
            .unwrap();
    });

    // 1,000 characters typed.
    let thousand: String = (0..1000).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    let typed = time_n(5, || {
        let c = c.clone();
        let t = thousand.clone();
        async move {
            let b = json!({"actions": [{"type": "type", "text": t}]});
            c.request(reqwest::Method::POST, "/v1/input")
                .json(&b)
                .send()
                .await
                .unwrap();
        }
    })
    .await;
    let ten_thousand: String = (0..10_000)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let typed_10k = time_n(3, || {
        let c = c.clone();
        let t = ten_thousand.clone();
        async move {
            let b = json!({"actions": [{"type": "type", "text": t}]});
            c.request(reqwest::Method::POST, "/v1/input")
                .json(&b)
                .send()
                .await
                .unwrap();
        }
    })
    .await;
    let xdo_type = |delay: &str| {
        let display = display.clone();
        let t = thousand.clone();
        let delay = delay.to_string();
        run_timed(2, move || {
            Command::new("xdotool")
                .args(["type", "--delay", &delay, &t])
                .env("DISPLAY", &display)
                .status()
                .unwrap();
        })
    };
    let xdo_type12 = xdo_type("12");
    let xdo_type0 = xdo_type("0");

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

    println!();
    println!("Display, 1920x1080 XFCE desktop (xfwm4, panel, desktop, two windows with text)");
    println!(
        "| measurement | berth p50 ms | berth p99 ms | peer | peer p50 ms | peer p99 ms | ratio (p50) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let row = |what: &str, ours: (f64, f64), peer_name: &str, theirs: (f64, f64)| {
        println!(
            "| {what} | {:.2} | {:.2} | {peer_name} | {:.2} | {:.2} | {:.1}x |",
            ours.0,
            ours.1,
            theirs.0,
            theirs.1,
            theirs.0 / ours.0
        );
    };
    row(
        "PNG `/screenshot` (screen changed)",
        png,
        "scrot + Pillow PNG (OSWorld v2)",
        scrot,
    );
    row(
        "PNG `/screenshot` (screen changed)",
        png,
        "Pillow ImageGrab + PNG (OSWorld v1)",
        grab,
    );
    row(
        "JPEG q80 `/v1/screenshot`",
        jpeg,
        "Pillow ImageGrab + JPEG q80",
        pil_jpeg,
    );
    row(
        "unchanged screen `/screenshot` (cache)",
        cached,
        "scrot + Pillow PNG (OSWorld v2)",
        scrot,
    );
    println!(
        "| WebP q80 `/v1/screenshot` | {:.2} | {:.2} | — | — | — | — |",
        webp.0, webp.1
    );
    println!(
        "| PNG `compression=fast` (adaptive filter) | {:.2} | {:.2} | Pillow ImageGrab + PNG (OSWorld v1) | {:.2} | {:.2} | {:.1}x |",
        png_adaptive.0,
        png_adaptive.1,
        grab.0,
        grab.1,
        grab.0 / png_adaptive.0
    );
    row(
        "one click, `/v1/input`",
        click,
        "`xdotool mousemove … click 1`",
        xdo_click,
    );
    row(
        "1,000 characters typed",
        typed,
        "`xdotool type --delay 12` (Anthropic's tool)",
        xdo_type12,
    );
    row(
        "1,000 characters typed",
        typed,
        "`xdotool type --delay 0`",
        xdo_type0,
    );
    println!(
        "| 10,000 characters typed | {:.1} | {:.1} | — | — | — | — |",
        typed_10k.0, typed_10k.1
    );
    println!(
        "| window-opening click → settled screenshot | {:.0} | {:.0} | click + fixed 2 s sleep + screenshot | ≥ 2000 | — | {:.1}x |",
        opened.0,
        opened.1,
        (2000.0 + scrot.0) / opened.0
    );
}
