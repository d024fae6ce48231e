//! `settle`: how soon a computer-toolset turn answers its settled screenshot after an action that
//! changes the screen, and whether that answer is the screen as it stays. Each round sends one
//! turn — the action, then `screenshot` — to `POST /v1/toolsets/computer` on the benchmarks' busy
//! 1920x1080 desktop, times it to the answer read whole, then asks for the screen again a second
//! later: the answer counts as settled when the two images are the same but for a caret's blink
//! (every differing pixel inside one 40x40 box). Scenarios: a click that opens a window, a
//! right-click that opens the desktop's menu, typing into a text field. A control shows the check
//! can fail: the same input through `/v1/input`, the screen taken at once, compared the same way.

use std::time::{Duration, Instant};

use base64::Engine;
use berth_protocol::routes::{compat, native};
use berth_tests::{AgentOptions, AgentProcess};
use serde_json::{Value, json};

use crate::desktop::Desktop;
use crate::{percentiles, toolset_turn};

/// The box a difference may fill and still count as the same screen (a caret, blinking).
const BLINK_BOX: u32 = 40;

fn tool_use(name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": "toolu_bench", "name": name, "toolset_name": "computer",
           "input": input})
}

fn unbase64(b64: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64")
}

/// RGB(A) rows of a PNG, and its width.
fn decode(bytes: Vec<u8>) -> (u32, Vec<u8>, usize) {
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    buf.truncate(info.buffer_size());
    (info.width, buf, info.color_type.samples())
}

/// Whether two PNG screenshots show the same screen, a blinking caret aside.
fn same(a: Vec<u8>, b: Vec<u8>) -> bool {
    let (wa, pa, sa) = decode(a);
    let (wb, pb, sb) = decode(b);
    if wa != wb || pa.len() != pb.len() || sa != sb {
        return false;
    }
    let (mut x0, mut y0, mut x1, mut y1) = (u32::MAX, u32::MAX, 0, 0);
    for (i, (pa, pb)) in pa.chunks(sa).zip(pb.chunks(sb)).enumerate() {
        if pa != pb {
            let (x, y) = ((i as u32) % wa, (i as u32) / wa);
            x0 = x0.min(x);
            y0 = y0.min(y);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
    }
    x0 == u32::MAX || (x1 - x0 < BLINK_BOX && y1 - y0 < BLINK_BOX)
}

struct Scenario {
    name: &'static str,
    act: Vec<Value>,
    /// The same action as `/v1/input` actions (display pixels), for the control.
    input: Value,
    /// What puts the screen back between rounds.
    reset: Vec<Value>,
    /// Whether the action opens a window that must be closed between rounds.
    opens_window: bool,
}

pub async fn bench(rounds: usize) {
    let desk = Desktop::start();
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--display".into(), desk.x.display.clone()],
        ..Default::default()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let c = a.client();
    let turn = |content: Vec<Value>| toolset_turn(&c, native::TOOLSET_COMPUTER, content);
    let info: Value = c
        .request(reqwest::Method::GET, native::TOOLSET_COMPUTER)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Display pixels to the toolset's screenshot pixels.
    let sx = info["screenshot_width_px"].as_f64().unwrap() / 1920.0;
    let sy = info["screenshot_height_px"].as_f64().unwrap() / 1080.0;
    let at = |x: f64, y: f64| json!([(x * sx).round() as i64, (y * sy).round() as i64]);
    let scenarios = [
        Scenario {
            name: "a click that opens a window",
            act: vec![tool_use(
                "left_click",
                json!({"coordinate": at(100.0, 120.0)}),
            )],
            input: json!([{"type": "click", "x": 100, "y": 120}]),
            reset: vec![tool_use("key", json!({"text": "Escape"}))],
            opens_window: true,
        },
        Scenario {
            name: "a right-click that opens the desktop's menu",
            act: vec![tool_use(
                "right_click",
                json!({"coordinate": at(1500.0, 900.0)}),
            )],
            input: json!([{"type": "click", "x": 1500, "y": 900, "button": "right"}]),
            reset: vec![tool_use("key", json!({"text": "Escape"}))],
            opens_window: false,
        },
        Scenario {
            name: "typing 12 characters into a text field",
            act: vec![
                tool_use("left_click", json!({"coordinate": at(400.0, 400.0)})),
                tool_use("type", json!({"text": "hello world "})),
            ],
            input: json!([{"type": "click", "x": 400, "y": 400},
                          {"type": "type", "text": "hello world "}]),
            reset: Vec::new(),
            opens_window: false,
        },
    ];
    println!();
    println!(
        "Settle: a computer-toolset turn (action + screenshot) on the 1920x1080 XFCE desktop, \
         {rounds} rounds a scenario; today's rule: 150 ms of quiet after the last action"
    );
    println!(
        "| scenario | answer p50 ms | answer p99 ms | answers equal to the screen 1 s later | \
         control: the screen taken at once after the input, equal 1 s later |"
    );
    println!("|---|---|---|---|---|");
    let mut all_equal = 0;
    let mut all_control = 0;
    let mut all = Vec::new();
    for s in &scenarios {
        let mut times = Vec::with_capacity(rounds);
        let mut equal = 0;
        let mut control = 0;
        let reset = || async {
            if !s.reset.is_empty() {
                turn(s.reset.clone()).await;
            }
            // Opened windows pile up at one place: the opener's are closed between rounds.
            if s.opens_window {
                let _ = reqwest::Client::new()
                    .post(a.url(compat::SETUP_CLOSE_WINDOW))
                    .json(&json!({"window_name": "Opened", "strict": true}))
                    .send()
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
        };
        let png = || async {
            c.request(
                reqwest::Method::GET,
                &format!("{}?format=png", native::SCREENSHOT),
            )
            .send()
            .await
            .expect("a screenshot")
            .bytes()
            .await
            .expect("its bytes")
            .to_vec()
        };
        for round in 0..rounds {
            // The control: the same input, the screen taken at once (no settle).
            reset().await;
            c.request(reqwest::Method::POST, native::INPUT)
                .json(&json!({ "actions": s.input }))
                .send()
                .await
                .expect("the input");
            let at_once = png().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            if same(at_once, png().await) {
                control += 1;
            }
            reset().await;
            let mut content = s.act.clone();
            content.push(tool_use("screenshot", json!({})));
            let t = Instant::now();
            let answer = turn(content).await;
            times.push(t.elapsed());
            let shot = answer
                .last()
                .and_then(|r| r["content"][0]["source"]["data"].as_str())
                .unwrap_or_else(|| panic!("{}: round {round}: no image: {answer:?}", s.name))
                .to_string();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let later = turn(vec![tool_use("screenshot", json!({}))]).await;
            let later = later[0]["content"][0]["source"]["data"]
                .as_str()
                .expect("an image")
                .to_string();
            if same(unbase64(&shot), unbase64(&later)) {
                equal += 1;
            }
        }
        all.extend(times.iter().copied());
        all_equal += equal;
        all_control += control;
        let (p50, p99) = percentiles(times);
        println!(
            "| {} | {p50:.0} | {p99:.0} | {equal}/{rounds} ({:.1} %) | {control}/{rounds} |",
            s.name,
            100.0 * equal as f64 / rounds as f64
        );
    }
    let n = all.len();
    let (p50, p99) = percentiles(all);
    println!(
        "| all | {p50:.0} | {p99:.0} | {all_equal}/{n} ({:.1} %) | {all_control}/{n} |",
        100.0 * all_equal as f64 / n as f64
    );
}
