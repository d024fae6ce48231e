//! `settle`: how soon a computer-toolset turn answers its settled screenshot after an action that
//! changes the screen, and whether that answer is the screen as it stays, under both of the
//! agent's rules (`--settle quiet`, today's, and `--settle idle`), two agents on one desktop
//! taking turns. Each round sends one turn — the action, then `screenshot` — to `POST
//! /v1/toolsets/computer` on the benchmarks' busy 1920x1080 desktop (with Chromium), times it
//! to the answer read whole, then asks for the screen again a second later: the answer counts as
//! settled when the two images are the same but for a caret's blink (every differing pixel
//! inside one 40x40 box). Scenarios: a click that opens a window, a right-click that opens the
//! desktop's menu, a click that navigates the browser, typing into a text field. A control shows
//! the check can fail: the same input through `/v1/input`, the screen taken at once, compared
//! the same way.

use std::time::{Duration, Instant};

use base64::Engine;
use berth_protocol::AgentClient;
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

/// Where two PNG screenshots differ (the bounding box `x0, y0, x1, y1`), `None` when they show
/// the same screen, a blinking caret aside.
fn difference(a: Vec<u8>, b: Vec<u8>) -> Option<(u32, u32, u32, u32)> {
    let (wa, pa, sa) = decode(a);
    let (wb, pb, sb) = decode(b);
    if wa != wb || pa.len() != pb.len() || sa != sb {
        return Some((0, 0, u32::MAX, u32::MAX));
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
    let same = x0 == u32::MAX || (x1 - x0 < BLINK_BOX && y1 - y0 < BLINK_BOX);
    (!same).then_some((x0, y0, x1, y1))
}

fn same(a: Vec<u8>, b: Vec<u8>) -> bool {
    difference(a, b).is_none()
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

/// The rules compared, as `--settle` names them: today's first.
const RULES: [&str; 2] = ["quiet", "idle"];
/// Rounds of each scenario that also run the control.
const CONTROL_ROUNDS: usize = 10;

/// Times and counts summed over every scenario, for the `all` row.
#[derive(Default)]
struct Totals {
    times: [Vec<Duration>; 2],
    equal: [usize; 2],
    /// Controls equal, and controls run.
    control: (usize, usize),
    /// Rounds taken again because the minute changed during them.
    retaken: usize,
}

pub async fn bench(rounds: usize) {
    let desk = Desktop::with_browser();
    let agents = start_agents(&desk.x.display).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let clients: Vec<_> = agents.iter().map(|a| a.client()).collect();
    let c = &clients[0];
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
    let scenarios = scenarios(sx, sy);
    print_header(rounds);
    let mut totals = Totals::default();
    for s in &scenarios {
        run_scenario(s, &agents[0], &clients, rounds, &mut totals).await;
    }
    print_totals(totals);
}

/// One agent on `display` per rule, in [`RULES`]' order.
async fn start_agents(display: &str) -> Vec<AgentProcess> {
    let mut agents = Vec::new();
    for rule in RULES {
        agents.push(
            AgentProcess::start_with(AgentOptions {
                extra_args: vec![
                    "--display".into(),
                    display.to_string(),
                    "--settle".into(),
                    rule.into(),
                ],
                ..Default::default()
            })
            .await,
        );
    }
    agents
}

/// The scenarios, their toolset coordinates scaled by `sx`, `sy` (display pixels to
/// screenshot pixels).
fn scenarios(sx: f64, sy: f64) -> [Scenario; 4] {
    let at = |x: f64, y: f64| json!([(x * sx).round() as i64, (y * sy).round() as i64]);
    [
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
            name: "a click that navigates the browser to another page",
            act: vec![tool_use(
                "left_click",
                json!({"coordinate": at(1400.0, 600.0)}),
            )],
            input: json!([{"type": "click", "x": 1400, "y": 600}]),
            reset: Vec::new(),
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
    ]
}

/// What the table measures, and its header.
fn print_header(rounds: usize) {
    println!();
    println!(
        "Settle: a computer-toolset turn (action + screenshot) on the 1920x1080 XFCE desktop with \
         Chromium, {rounds} rounds a scenario and rule, the rules taking turns; `quiet` (today's): \
         150 ms without a big change; `idle`: 40 ms without a big change while the display's \
         programs are idle, else as `quiet`. Equal: the answer is the screen 1 s later (a caret's \
         blink aside); a round whose wait crosses a minute (the panel's clock) is taken again"
    );
    println!(
        "| scenario | quiet p50 ms | quiet p99 ms | quiet equal | idle p50 ms | idle p99 ms | \
         idle equal | control: the screen at once after the input, equal 1 s later |"
    );
    println!("|---|---|---|---|---|---|---|---|");
}

/// Puts the screen back between rounds: the scenario's reset, the opener's windows closed
/// (`opener`: the first agent), then half a second.
async fn reset(c: &AgentClient, opener: &AgentProcess, s: &Scenario) {
    if !s.reset.is_empty() {
        toolset_turn(c, native::TOOLSET_COMPUTER, s.reset.clone()).await;
    }
    // Opened windows pile up at one place: the opener's are closed between rounds.
    if s.opens_window {
        let _ = reqwest::Client::new()
            .post(opener.url(compat::SETUP_CLOSE_WINDOW))
            .json(&json!({"window_name": "Opened", "strict": true}))
            .send()
            .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// The screen now, as PNG.
async fn png(c: &AgentClient) -> Vec<u8> {
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
}

/// A scenario's rounds under every rule (and its controls), its row printed and its figures
/// added to `totals`.
async fn run_scenario(
    s: &Scenario,
    opener: &AgentProcess,
    clients: &[AgentClient],
    rounds: usize,
    totals: &mut Totals,
) {
    let c = &clients[0];
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut equal = [0; 2];
    let mut control = 0;
    let controls = rounds.min(CONTROL_ROUNDS);
    for round in 0..rounds {
        if round < controls && control_round(c, opener, s).await {
            control += 1;
        }
        for k in 0..RULES.len() {
            // The rules take turns going first.
            let r = (k + round) % RULES.len();
            loop {
                reset(c, opener, s).await;
                let Some((took, difference)) = settled_turn(&clients[r], s, round).await else {
                    totals.retaken += 1;
                    continue;
                };
                times[r].push(took);
                match difference {
                    None => equal[r] += 1,
                    Some(d) => eprintln!(
                        "{} ({}), round {round}: answered in {took:?}, differs from the \
                         screen 1 s later in {d:?} (screenshot pixels)",
                        s.name, RULES[r]
                    ),
                }
                break;
            }
        }
    }
    totals.control.0 += control;
    totals.control.1 += controls;
    let mut cells = Vec::new();
    for r in 0..RULES.len() {
        totals.times[r].extend(times[r].iter().copied());
        totals.equal[r] += equal[r];
        let (p50, p99) = percentiles(std::mem::take(&mut times[r]));
        cells.push(format!(
            "{p50:.0} | {p99:.0} | {}/{rounds} ({:.1} %)",
            equal[r],
            100.0 * equal[r] as f64 / rounds as f64
        ));
    }
    println!(
        "| {} | {} | {} | {control}/{controls} |",
        s.name, cells[0], cells[1]
    );
}

/// The control: the same input through `/v1/input`, the screen taken at once (no settle);
/// whether it equals the screen a second later.
async fn control_round(c: &AgentClient, opener: &AgentProcess, s: &Scenario) -> bool {
    reset(c, opener, s).await;
    c.request(reqwest::Method::POST, native::INPUT)
        .json(&json!({ "actions": s.input }))
        .send()
        .await
        .expect("the input");
    let at_once = png(c).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    same(at_once, png(c).await)
}

/// One turn (the action, then `screenshot`) timed to its answer, and where its screenshot
/// differs from the screen a second later (`None`: the same); `None` when the wall clock's
/// minute changed meanwhile (the round must be taken again).
async fn settled_turn(
    client: &AgentClient,
    s: &Scenario,
    round: usize,
) -> Option<(Duration, Option<(u32, u32, u32, u32)>)> {
    let turn = |content| toolset_turn(client, native::TOOLSET_COMPUTER, content);
    let minute = wall_minute();
    let mut content = s.act.clone();
    content.push(tool_use("screenshot", json!({})));
    let t = Instant::now();
    let answer = turn(content).await;
    let took = t.elapsed();
    let shot = answer
        .last()
        .and_then(|r| r["content"][0]["source"]["data"].as_str())
        .unwrap_or_else(|| panic!("{}: round {round}: no image: {answer:?}", s.name))
        .to_string();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = turn(vec![tool_use("screenshot", json!({}))]).await;
    if wall_minute() != minute {
        return None;
    }
    let later = later[0]["content"][0]["source"]["data"]
        .as_str()
        .expect("an image")
        .to_string();
    Some((took, difference(unbase64(&shot), unbase64(&later))))
}

/// The `all` row (every scenario's rounds together) and how many rounds were taken again.
fn print_totals(mut totals: Totals) {
    let mut cells = Vec::new();
    for r in 0..RULES.len() {
        let n = totals.times[r].len();
        let (p50, p99) = percentiles(std::mem::take(&mut totals.times[r]));
        cells.push(format!(
            "{p50:.0} | {p99:.0} | {}/{n} ({:.1} %)",
            totals.equal[r],
            100.0 * totals.equal[r] as f64 / n as f64
        ));
    }
    println!(
        "| all | {} | {} | {}/{} |",
        cells[0], cells[1], totals.control.0, totals.control.1
    );
    println!(
        "rounds taken again (the minute changed): {}",
        totals.retaken
    );
}

/// The wall clock's minute (the panel's clock shows it).
fn wall_minute() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        / 60
}
