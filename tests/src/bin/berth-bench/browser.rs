//! `browser`: one browser-toolset step — a click on the page, then `screenshot` — as a turn to
//! `POST /v1/toolsets/browser` (the agent runs both over CDP and answers the SDK's blocks with the
//! browser state), beside its peer, what an engine's own driver does today: Playwright for
//! Python over CDP to the same browser, `page.mouse.click` then `page.screenshot`. Both on the
//! agent's supervised desktop (Xvnc, XFCE, Chromium), the page a local file with a button.

use std::time::{Duration, Instant};

use berth_protocol::AgentClient;
use berth_protocol::routes::native;
use berth_tests::{AgentOptions, AgentProcess};
use serde_json::{Value, json};

use crate::{percentiles, toolset_turn};

const PAGE: &str = "<!doctype html><title>bench</title>\
    <button id=b style='position:absolute;left:100px;top:100px;width:200px;height:60px' \
    onclick='this.textContent = +this.textContent + 1'>0</button>";

/// A `tool_use` block of the browser toolset.
fn tool_use(name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": "toolu_bench", "name": name, "toolset_name": "browser",
           "input": input})
}

pub async fn bench(rounds: usize) {
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec![
            "--desktop".into(),
            "--cdp-listen".into(),
            "127.0.0.1:0".into(),
        ],
        ..Default::default()
    })
    .await;
    let c = a.client();
    wait_for_desktop(&c).await;
    let page = a.home.join("bench.html");
    std::fs::write(&page, PAGE).unwrap();
    let url = format!("file://{}", page.display());
    let turn = |content: Vec<Value>| toolset_turn(&c, native::TOOLSET_BROWSER, content);
    turn(vec![tool_use("navigate", json!({"url": url}))]).await;
    let info: Value = c
        .request(reqwest::Method::GET, native::TOOLSET_BROWSER)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let s =
        info["screenshot_width_px"].as_f64().unwrap() / info["viewport_width_px"].as_f64().unwrap();
    // The button's centre: CSS pixels for Playwright, screenshot pixels for the toolset.
    let (cx, cy) = (200.0, 130.0);
    let target = json!({"type": "coordinate", "x": (cx * s) as i64, "y": (cy * s) as i64});
    let step = vec![
        tool_use("left_click", json!({"target": target})),
        tool_use("screenshot", json!({})),
    ];
    let times = time_steps(&c, &step, rounds).await;
    let clicks = turn(vec![tool_use("get_page_text", json!({}))]).await;
    let (p50, p99) = percentiles(times);

    let cdp = a.get_json(native::BROWSER).await["cdp_listen"]
        .as_str()
        .unwrap()
        .to_string();
    let out = playwright(cdp, url, (cx, cy), rounds).await;
    print_table(rounds, &clicks, (p50, p99), &out);
}

/// Waits (up to 90 s) for the agent's desktop to be ready.
async fn wait_for_desktop(c: &AgentClient) {
    let ready = c
        .request(reqwest::Method::GET, &format!("{}?wait=90s", native::READY))
        .send()
        .await
        .expect("readiness");
    assert!(ready.status().is_success(), "the desktop did not come up");
}

/// `step` as a turn `rounds` times (after two warm-up turns), each timed to its answer, whose
/// second result must be an image.
async fn time_steps(c: &AgentClient, step: &[Value], rounds: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(rounds);
    for i in 0..rounds + 2 {
        let t = Instant::now();
        let v = toolset_turn(c, native::TOOLSET_BROWSER, step.to_vec()).await;
        let took = t.elapsed();
        let image = &v[1]["content"][0];
        assert_eq!(image["type"], "image", "round {i}: {v:?}");
        if i >= 2 {
            times.push(took);
        }
    }
    times
}

/// The peer: Playwright for Python over CDP at `cdp`, on `url`, clicking `(cx, cy)` then
/// taking a screenshot `rounds` times; it prints its p50 and p99.
async fn playwright(
    cdp: String,
    url: String,
    (cx, cy): (f64, f64),
    rounds: usize,
) -> std::process::Output {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/bench/playwright_click_screenshot.py"
    );
    tokio::task::spawn_blocking(move || {
        std::process::Command::new("timeout")
            .args(["600", "python3", script, &format!("http://{cdp}"), &url])
            .args([cx.to_string(), cy.to_string(), rounds.to_string()])
            .output()
            .expect("python3 with playwright (tests/setup.sh installs it)")
    })
    .await
    .unwrap()
}

/// berth's turn beside Playwright's (its output `out`; its last error line when it failed).
fn print_table(
    rounds: usize,
    clicks: &[Value],
    (p50, p99): (f64, f64),
    out: &std::process::Output,
) {
    let peer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let peer: Vec<&str> = peer.split_whitespace().collect();
    println!();
    println!(
        "Browser toolset: a click on the page, then its screenshot, {rounds} rounds on the agent's \
         desktop ({} clicks counted by the page)",
        clicks[0]["content"][0]["text"]
    );
    println!("| client | p50 ms | p99 ms |");
    println!("|---|---|---|");
    println!(
        "| berth: one turn to POST /v1/toolsets/browser (SDK blocks and browser state) | {p50:.1} | {p99:.1} |"
    );
    match peer.as_slice() {
        [p50, p99] => {
            println!("| Playwright for Python over CDP: mouse.click + screenshot | {p50} | {p99} |")
        }
        _ => println!(
            "| Playwright for Python over CDP | failed: {} | |",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        ),
    }
}
