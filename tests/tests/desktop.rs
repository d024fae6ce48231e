//! `berth-agent --desktop` end to end: the real Xvnc, XFCE and Chromium it supervises, strict
//! readiness, the noVNC page and its RFB relay (view-only enforced by the relay), Chromium
//! driven through both CDP relays (Playwright for one), components killed and brought back,
//! and nothing of the desktop left after the agent goes.

use std::time::Duration;

use berth_protocol::ViewerTokenRequest;
use berth_tests::{AgentOptions, AgentProcess, pid_alive, wait_for, wait_until};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const WIDTH: u32 = 1280;
const HEIGHT: u32 = 800;

async fn desktop_agent() -> AgentProcess {
    AgentProcess::start_with(AgentOptions {
        extra_args: vec![
            "--desktop".into(),
            "--cdp-listen".into(),
            "127.0.0.1:0".into(),
            "--screen".into(),
            format!("{WIDTH}x{HEIGHT}"),
        ],
        ..Default::default()
    })
    .await
}

async fn ready(a: &AgentProcess, wait: &str) -> (u16, Value) {
    let r = a
        .client()
        .request(reqwest::Method::GET, &format!("/v1/ready?wait={wait}"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn wait_ready(a: &AgentProcess) -> Value {
    let (status, body) = ready(a, "90s").await;
    assert_eq!(status, 200, "not ready: {body:#}");
    body
}

/// Every pid the readiness report names (the desktop's processes).
fn component_pids(report: &Value) -> Vec<u32> {
    report["components"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|c| c["pid"].as_u64().map(|p| p as u32))
        .collect()
}

fn ws_request(
    a: &AgentProcess,
    path: &str,
    header: (&'static str, String),
) -> tungstenite::handshake::client::Request {
    let url = format!("ws://{}{path}", berth_tests::host_port(&a.base));
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert(header.0, header.1.parse().unwrap());
    req
}

/// Reads until `buf` holds at least `n` bytes.
async fn fill(ws: &mut Ws, buf: &mut Vec<u8>, n: usize) {
    let read = async {
        while buf.len() < n {
            match ws.next().await {
                Some(Ok(tungstenite::Message::Binary(b))) => buf.extend_from_slice(&b),
                Some(Ok(_)) => {}
                other => panic!("the VNC relay ended: {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the VNC server answered within 10 s");
}

/// An RFB 3.8 handshake (security None) through the relay; returns the framebuffer size.
async fn rfb_handshake(ws: &mut Ws) -> (u32, u32) {
    let mut buf = Vec::new();
    fill(ws, &mut buf, 12).await;
    assert!(
        buf.starts_with(b"RFB 003.00"),
        "{:?}",
        String::from_utf8_lossy(&buf)
    );
    buf.drain(..12);
    ws.send(tungstenite::Message::binary(b"RFB 003.008\n".to_vec()))
        .await
        .unwrap();
    fill(ws, &mut buf, 1).await;
    let n = buf[0] as usize;
    fill(ws, &mut buf, 1 + n).await;
    assert!(
        buf[1..1 + n].contains(&1),
        "security types {:?}",
        &buf[1..1 + n]
    );
    buf.drain(..1 + n);
    ws.send(tungstenite::Message::binary(vec![1u8]))
        .await
        .unwrap();
    fill(ws, &mut buf, 4).await;
    assert_eq!(&buf[..4], &[0, 0, 0, 0], "SecurityResult");
    buf.drain(..4);
    ws.send(tungstenite::Message::binary(vec![1u8]))
        .await
        .unwrap(); // shared
    fill(ws, &mut buf, 24).await;
    let w = u16::from_be_bytes([buf[0], buf[1]]) as u32;
    let h = u16::from_be_bytes([buf[2], buf[3]]) as u32;
    let name_len = u32::from_be_bytes([buf[20], buf[21], buf[22], buf[23]]) as usize;
    fill(ws, &mut buf, 24 + name_len).await;
    (w, h)
}

/// A pointer move to (x, y), then a full update request: once the update arrives, the server
/// has handled the move (messages are handled in order).
async fn point_and_sync(ws: &mut Ws, x: u16, y: u16) {
    let mut msg = vec![5u8, 0];
    msg.extend_from_slice(&x.to_be_bytes());
    msg.extend_from_slice(&y.to_be_bytes());
    msg.extend_from_slice(&[3, 0, 0, 0, 0, 0]);
    msg.extend_from_slice(&(WIDTH as u16).to_be_bytes());
    msg.extend_from_slice(&(HEIGHT as u16).to_be_bytes());
    ws.send(tungstenite::Message::binary(msg)).await.unwrap();
    let mut buf = Vec::new();
    fill(ws, &mut buf, 1).await;
    assert_eq!(buf[0], 0, "a FramebufferUpdate");
}

async fn cursor(a: &AgentProcess) -> Value {
    a.get_json("/cursor_position").await
}

async fn viewer_cookie(a: &AgentProcess, view_only: bool) -> String {
    let token = a
        .client()
        .viewer_token(&ViewerTokenRequest {
            view_only: Some(view_only),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(token.url.starts_with("/v1/vnc/?t="), "{token:?}");
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = browser.get(a.url(&token.url)).send().await.unwrap();
    assert_eq!(r.status(), 303);
    r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn the_viewer_is_served_and_view_only_viewers_cannot_touch() {
    let a = desktop_agent().await;
    let report = wait_ready(&a).await;
    for name in [
        "x",
        "session-bus",
        "a11y-bus",
        "xfsettingsd",
        "xfwm4",
        "xfce4-panel",
        "xfdesktop",
        "chromium",
        "novnc",
        "vnc",
        "window_manager",
        "browser_cdp",
        "cdp_relay",
        "cdp_ws_relay",
        "accessibility",
    ] {
        assert_eq!(report["components"][name]["ok"], true, "{name}: {report:#}");
    }
    let display = a.get_json("/v1/display").await;
    assert_eq!(
        (display["width"].as_u64(), display["height"].as_u64()),
        (Some(1280), Some(800))
    );

    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    assert_eq!(
        browser
            .get(a.url("/v1/vnc/vnc.html"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let cookie = viewer_cookie(&a, false).await;
    let r = browser
        .get(a.url("/v1/vnc/"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302);
    let location = r.headers()["location"].to_str().unwrap().to_string();
    assert!(
        location.starts_with("vnc.html?") && location.contains("path=v1/vnc/websockify"),
        "{location}"
    );
    let page = browser
        .get(a.url(&format!("/v1/vnc/{location}")))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("noVNC"));
    let js = browser
        .get(a.url("/v1/vnc/app/ui.js"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(js.status(), 200);
    assert!(
        js.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("javascript"),
        "{:?}",
        js.headers()
    );
    let r = browser
        .get(a.url("/v1/vnc/../token"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error());

    // A full viewer through the relay moves the pointer.
    let (mut full, _) = tokio_tungstenite::connect_async(ws_request(
        &a,
        "/v1/vnc/websockify",
        ("cookie", cookie.clone()),
    ))
    .await
    .unwrap();
    assert_eq!(rfb_handshake(&mut full).await, (WIDTH, HEIGHT));
    point_and_sync(&mut full, 600, 400).await;
    let c = a.client();
    wait_for("the viewer's pointer move", Duration::from_secs(5), || {
        let c = c.clone();
        async move {
            (berth_tests::try_json(&c, "/cursor_position").await? == json!([600, 400]))
                .then_some(())
        }
    })
    .await;

    // A view-only viewer sees the screen but its pointer never arrives.
    let view_only = viewer_cookie(&a, true).await;
    let (mut watcher, _) = tokio_tungstenite::connect_async(ws_request(
        &a,
        "/v1/vnc/websockify",
        ("cookie", view_only),
    ))
    .await
    .unwrap();
    assert_eq!(rfb_handshake(&mut watcher).await, (WIDTH, HEIGHT));
    point_and_sync(&mut watcher, 100, 100).await;
    assert_eq!(cursor(&a).await, json!([600, 400]));
}

/// Reads the server's messages (32-bit pixels, Raw rectangles: the client asked for no other
/// encoding) until `updates` framebuffer updates arrived, each asked for in turn; the types of
/// the other messages that came meanwhile (3: ServerCutText).
async fn other_server_messages(ws: &mut Ws, updates: usize) -> Vec<u8> {
    let request = |incremental: u8| {
        let mut m = vec![3u8, incremental, 0, 0, 0, 0];
        m.extend_from_slice(&(WIDTH as u16).to_be_bytes());
        m.extend_from_slice(&(HEIGHT as u16).to_be_bytes());
        tungstenite::Message::binary(m)
    };
    let mut buf = Vec::new();
    let mut others = Vec::new();
    ws.send(request(0)).await.unwrap();
    let mut seen = 0;
    while seen < updates {
        fill(ws, &mut buf, 1).await;
        match buf[0] {
            0 => {
                fill(ws, &mut buf, 4).await;
                let rects = u16::from_be_bytes([buf[2], buf[3]]) as usize;
                buf.drain(..4);
                for _ in 0..rects {
                    fill(ws, &mut buf, 12).await;
                    let w = u16::from_be_bytes([buf[4], buf[5]]) as usize;
                    let h = u16::from_be_bytes([buf[6], buf[7]]) as usize;
                    let encoding = i32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]);
                    assert_eq!(encoding, 0, "Raw only");
                    fill(ws, &mut buf, 12 + w * h * 4).await;
                    buf.drain(..12 + w * h * 4);
                }
                seen += 1;
                // A full update each time, so one always comes.
                ws.send(request(0)).await.unwrap();
            }
            2 => {
                others.push(2);
                buf.drain(..1);
            }
            3 => {
                fill(ws, &mut buf, 8).await;
                let n = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
                fill(ws, &mut buf, 8 + n).await;
                others.push(3);
                buf.drain(..8 + n);
            }
            t => panic!("server message type {t}"),
        }
    }
    others
}

#[tokio::test]
async fn text_copied_in_the_sandbox_does_not_reach_the_viewers() {
    let a = desktop_agent().await;
    wait_ready(&a).await;
    let cookie = viewer_cookie(&a, false).await;
    let (mut viewer, _) =
        tokio_tungstenite::connect_async(ws_request(&a, "/v1/vnc/websockify", ("cookie", cookie)))
            .await
            .unwrap();
    assert_eq!(rfb_handshake(&mut viewer).await, (WIDTH, HEIGHT));
    assert_eq!(
        other_server_messages(&mut viewer, 1).await,
        Vec::<u8>::new()
    );
    // Copied in the sandbox: the X clipboard holds it (read back), the viewer never hears it;
    // it leaves only through GET /v1/clipboard (the holder's while a person holds the controls).
    let c = a.client();
    let r = c
        .request(reqwest::Method::PUT, "/v1/clipboard")
        .json(&json!({"text": "copied-in-the-sandbox"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let back: Value = c
        .request(reqwest::Method::GET, "/v1/clipboard")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(back["text"], "copied-in-the-sandbox");
    let xclip = c
        .exec(&berth_protocol::ExecRequest::shell(
            "xclip -selection primary -i /etc/hostname >/dev/null 2>&1",
        ))
        .await
        .unwrap();
    assert_eq!(xclip.exit_code, 0, "{xclip:?}");
    let others = other_server_messages(&mut viewer, 5).await;
    println!("server messages besides 5 updates after two copies: {others:?}");
    assert!(
        !others.contains(&3),
        "ServerCutText reached a viewer: {others:?}"
    );
}

/// Runs Playwright for Python against the CDP relay: a new page, a local file, its title.
fn playwright_title(cdp: &str, url: &str) -> String {
    let script = r#"
import sys
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    browser = p.chromium.connect_over_cdp(sys.argv[1], timeout=30000)
    page = browser.contexts[0].new_page()
    page.goto(sys.argv[2])
    print(page.title())
    print(page.evaluate("document.querySelectorAll('li').length"))
    page.close()
"#;
    berth_tests::playwright(script, &[cdp, url], 90)
}

async fn cdp_call<S>(
    ws: &mut tokio_tungstenite::WebSocketStream<S>,
    id: u64,
    method: &str,
    params: Value,
) -> Value
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.send(tungstenite::Message::text(
        json!({"id": id, "method": method, "params": params}).to_string(),
    ))
    .await
    .unwrap();
    let answer = async {
        loop {
            match ws.next().await {
                Some(Ok(tungstenite::Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    if v["id"] == id {
                        return v;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("the CDP relay ended: {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), answer)
        .await
        .expect("a CDP answer within 20 s")
}

#[tokio::test]
async fn chromium_is_driven_through_both_cdp_relays() {
    let a = desktop_agent().await;
    wait_ready(&a).await;
    let page = a.home.join("page.html");
    let items: String = (0..50).map(|i| format!("<li>item {i}</li>")).collect();
    std::fs::write(
        &page,
        format!("<!doctype html><title>berth page</title><ul>{items}</ul>"),
    )
    .unwrap();
    let url = format!("file://{}", page.display());
    let info = a.get_json("/v1/browser").await;
    assert!(
        info["version"].as_str().unwrap().starts_with("Chrome/"),
        "{info}"
    );
    let cdp = info["cdp_listen"].as_str().unwrap().to_string();

    // Relay 1 with a real client.
    let out = tokio::task::spawn_blocking({
        let (cdp, url) = (cdp.clone(), url.clone());
        move || playwright_title(&format!("http://{cdp}"), &url)
    })
    .await
    .unwrap();
    assert_eq!(out.lines().collect::<Vec<_>>(), ["berth page", "50"]);

    // A client that names the sandbox by a DNS name: Chromium refuses such a Host, the relay
    // rewrites it and points the URLs back at that name.
    let port = cdp.rsplit(':').next().unwrap();
    let raw = berth_tests::raw_http(
        &cdp,
        format!("GET /json/version HTTP/1.1\r\nHost: sandbox-7:{port}\r\n\r\n").as_bytes(),
    )
    .await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let body: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let ws_url = body["webSocketDebuggerUrl"].as_str().unwrap().to_string();
    assert!(
        ws_url.starts_with(&format!("ws://sandbox-7:{port}/devtools/browser/")),
        "{ws_url}"
    );
    let tcp = tokio::net::TcpStream::connect(&cdp).await.unwrap();
    let (mut named, _) = tokio_tungstenite::client_async(ws_url.as_str(), tcp)
        .await
        .expect("the browser endpoint under the DNS name");
    let v = cdp_call(&mut named, 1, "Browser.getVersion", json!({})).await;
    assert!(
        v["result"]["product"]
            .as_str()
            .unwrap()
            .starts_with("Chrome/"),
        "{v}"
    );

    // Relay 2: the native surface's WebSocket.
    let bearer = ("authorization", format!("Bearer {}", berth_tests::TOKEN));
    let (mut browser, _) =
        tokio_tungstenite::connect_async(ws_request(&a, "/v1/browser/cdp", bearer.clone()))
            .await
            .unwrap();
    let created = cdp_call(&mut browser, 1, "Target.createTarget", json!({"url": url})).await;
    let target = created["result"]["targetId"].as_str().unwrap().to_string();
    let (mut tab, _) = tokio_tungstenite::connect_async(ws_request(
        &a,
        &format!("/v1/browser/cdp/page/{target}"),
        bearer,
    ))
    .await
    .unwrap();
    // Poll the page (no sleeps: each evaluation is a round trip) until it has loaded.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut id = 0;
    let title = loop {
        id += 1;
        let v = cdp_call(
            &mut tab,
            id,
            "Runtime.evaluate",
            json!({"expression": "document.readyState === 'complete' ? document.title : ''",
                   "returnByValue": true, "awaitPromise": true}),
        )
        .await;
        let t = v["result"]["result"]["value"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !t.is_empty() {
            break t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the page did not load: {v}"
        );
        tokio::task::yield_now().await;
    };
    assert_eq!(title, "berth page");
    let listed = a.get_json("/v1/browser").await;
    assert!(
        listed["targets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == target.as_str()
                && t["ws_url"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!("/v1/browser/cdp/page/{target}"))),
        "{listed:#}"
    );
    // A target that does not exist is a clear 404, not a hang.
    let r = a
        .client()
        .request(reqwest::Method::GET, "/v1/browser/cdp/page/NOPE")
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

async fn events_since(a: &AgentProcess, from: u64) -> Vec<Value> {
    a.get_json(&format!("/v1/events?from_seq={from}")).await["events"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn killed_components_come_back_and_readiness_follows() {
    let a = desktop_agent().await;
    wait_ready(&a).await;
    for victim in ["chromium", "x", "xfwm4"] {
        let (_, before) = ready(&a, "0s").await;
        let pid = before["components"][victim]["pid"].as_u64().unwrap() as i32;
        let from = a.get_json("/v1/events?from_seq=0&limit=10000").await["next_seq"]
            .as_u64()
            .unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let a = &a;
        wait_for(
            &format!("readiness to drop after killing {victim}"),
            Duration::from_secs(10),
            || async move {
                let (status, r) = ready(a, "0s").await;
                (status == 503 && r["components"][victim]["ok"] == false).then_some(())
            },
        )
        .await;
        let after = wait_ready(a).await;
        let new_pid = after["components"][victim]["pid"].as_u64().unwrap() as i32;
        assert_ne!(new_pid, pid, "{victim} was restarted");
        let events = events_since(a, from).await;
        // The kill is what the events report, on the way down and on the way back up.
        for kind in ["component.down", "component.restarted"] {
            let e = events
                .iter()
                .find(|e| e["kind"] == kind && e["component"] == victim)
                .unwrap_or_else(|| panic!("no {kind} of {victim}: {events:#?}"));
            assert_eq!(
                (&e["signal"], &e["exit_code"]),
                (&json!("KILL"), &Value::Null),
                "{e:#}"
            );
        }
        if victim == "x" {
            // Its dependents came back with it, and that was not their crash.
            for dep in ["xfwm4", "xfce4-panel", "chromium"] {
                assert!(
                    events.iter().any(|e| e["kind"] == "component.restarted"
                        && e["component"] == dep
                        && e["cause"] == "x_restart"),
                    "{dep}: {events:#?}"
                );
            }
            // … in start order: one by one up to the window manager, then the panel and the
            // desktop side by side, and the browser once the panel is up.
            let order: Vec<&str> = events
                .iter()
                .filter(|e| e["kind"] == "component.up")
                .filter_map(|e| e["component"].as_str())
                .collect();
            assert_eq!(
                order
                    .iter()
                    .copied()
                    .filter(|c| *c != "xfdesktop")
                    .collect::<Vec<_>>(),
                [
                    "x",
                    "a11y-bus",
                    "xfsettingsd",
                    "xfwm4",
                    "xfce4-panel",
                    "chromium"
                ],
                "{events:#?}"
            );
            let at = |c: &str| order.iter().position(|x| *x == c);
            assert!(at("xfdesktop") > at("xfwm4"), "{events:#?}");
            // Screenshots reconnect to the new server.
            let r = a
                .client()
                .request(reqwest::Method::GET, "/v1/screenshot")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
        if victim == "chromium" {
            assert!(
                events.iter().any(|e| e["kind"] == "browser.restarted"),
                "{events:#?}"
            );
        }
    }
}

/// The display an agent's X server serves (from its command line).
fn x_display(report: &Value) -> String {
    let pid = report["components"]["x"]["pid"].as_u64().unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).to_string())
        .find(|a| a.starts_with(':'))
        .unwrap_or_else(|| panic!("no display in {cmdline:?}"))
}

/// Desktops sharing a host: while one's X server restarts, a desktop starting beside it does
/// not take its display (Xvnc alone would: it takes the lowest display with no socket), and
/// the restarted server comes back on the same one.
#[tokio::test]
async fn a_restarting_x_server_keeps_its_display_when_another_desktop_starts() {
    let a = desktop_agent().await;
    let before = wait_ready(&a).await;
    let display = x_display(&before);
    let pid = before["components"]["x"]["pid"].as_u64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Started while A's server is down: its own X server looks for a display now.
    let b = desktop_agent().await;
    let b_ready = wait_ready(&b).await;
    let after = wait_ready(&a).await;
    assert_ne!(after["components"]["x"]["pid"].as_u64(), Some(pid as u64));
    assert_eq!(
        x_display(&after),
        display,
        "A's server came back on its display"
    );
    assert_ne!(x_display(&b_ready), display, "B took another display");
    assert_eq!(after["components"]["x"]["restarts"], 1, "{after:#}");
}

/// Clients that ask the session bus for the accessibility bus while its launcher is down must
/// not get one that D-Bus starts for them: that one would own `org.a11y.Bus`, and every start of
/// the supervised launcher after it would exit at once (code 0) until the supervisor gave up.
#[tokio::test]
async fn clients_asking_for_the_accessibility_bus_while_it_restarts_do_not_take_its_place() {
    let a = desktop_agent().await;
    let before = wait_ready(&a).await;
    let pid = before["components"]["a11y-bus"]["pid"].as_u64().unwrap() as i32;
    let from = a.get_json("/v1/events?from_seq=0&limit=10000").await["next_seq"]
        .as_u64()
        .unwrap();
    let ask = "gdbus call --session --dest org.a11y.Bus --object-path /org/a11y/bus \
               --method org.a11y.Bus.GetAddress";
    // A client asking for the bus over and over, from before the kill to after the restart.
    let asker = a
        .client()
        .exec_background(&berth_protocol::ExecRequest {
            shell: Some(format!(
                "for i in $(seq 400); do {ask} >/dev/null 2>&1; done"
            )),
            background: Some(true),
            ..Default::default()
        })
        .await
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let a = &a;
    let new_pid = wait_for(
        "the accessibility bus launcher to be restarted",
        Duration::from_secs(20),
        || async move {
            let (_, r) = ready(a, "0s").await;
            let c = &r["components"]["a11y-bus"];
            c["pid"]
                .as_u64()
                .filter(|p| *p as i32 != pid && c["ok"] == true)
        },
    )
    .await;
    let asker = &asker.id;
    wait_for(
        "the asking client to end",
        Duration::from_secs(60),
        || async move {
            let c = a.client().command(asker).await.unwrap();
            c.exit_code.is_some().then_some(())
        },
    )
    .await;
    // The supervised launcher owns the name, and it never had to exit for want of it.
    let owner = a
        .client()
        .exec(&berth_protocol::ExecRequest {
            shell: Some(
                "gdbus call --session --dest org.freedesktop.DBus --object-path /org/freedesktop/DBus \
                 --method org.freedesktop.DBus.GetConnectionUnixProcessID org.a11y.Bus"
                    .into(),
            ),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(owner.exit_code, 0, "{owner:?}");
    assert_eq!(
        owner.stdout.as_deref().unwrap_or("").trim(),
        format!("(uint32 {new_pid},)"),
        "the supervised launcher owns org.a11y.Bus"
    );
    let events = events_since(a, from).await;
    let downs: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "component.down" && e["component"] == "a11y-bus")
        .collect();
    assert_eq!(downs.len(), 1, "only the kill took it down: {downs:#?}");
    let (_, r) = ready(a, "0s").await;
    assert_eq!(r["components"]["a11y-bus"]["state"], "up", "{r:#}");
}

#[tokio::test]
async fn a_component_that_keeps_crashing_is_given_up_on_and_readiness_says_why() {
    // A "browser" that exits at once with code 3, however often it is started.
    let bin = tempfile::Builder::new()
        .prefix("berth-crash-")
        .tempdir()
        .unwrap();
    let script = bin.path().join("crashing-browser");
    std::fs::write(&script, "#!/bin/sh\nexit 3\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec![
            "--desktop".into(),
            "--cdp-listen".into(),
            "127.0.0.1:0".into(),
            "--chromium".into(),
            script.display().to_string(),
        ],
        ..Default::default()
    })
    .await;
    let c = a.client();
    let report = wait_for(
        "the crashing browser to be given up on",
        Duration::from_secs(60),
        || {
            let c = c.clone();
            async move {
                let r = c.ready(Duration::ZERO).await.ok()?;
                (r.components.get("chromium")?.state == "gave_up").then_some(r)
            }
        },
    )
    .await;
    assert!(!report.ready, "{report:#?}");
    let chromium = &report.components["chromium"];
    assert!(!chromium.ok);
    assert_eq!(chromium.reason, "gave up after 5 crashes in a row");
    assert!(chromium.pid.is_none(), "{chromium:?}");
    // The rest of the desktop is unaffected.
    assert!(report.components["xfwm4"].ok, "{report:#?}");
    // The status code agrees with the body.
    let (status, _) = ready(&a, "0s").await;
    assert_eq!(status, 503);

    let events = c.events(0).await.unwrap().events;
    let downs: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "component.down" && e.data["component"] == "chromium")
        .collect();
    assert_eq!(
        downs.len(),
        5,
        "five crashes, then no more starts: {downs:#?}"
    );
    for d in &downs {
        assert_eq!(
            (&d.data["exit_code"], &d.data["signal"]),
            (&json!(3), &Value::Null),
            "{d:?}"
        );
    }
    let gave_up = events
        .iter()
        .find(|e| e.kind == "component.gave_up")
        .unwrap_or_else(|| panic!("no component.gave_up: {events:#?}"));
    assert!(gave_up.seq > downs[4].seq);
    assert_eq!(gave_up.data["component"], "chromium");
    assert_eq!(gave_up.data["crashes"], 5);
    assert_eq!(gave_up.data["exit_code"], 3);
    assert_eq!(gave_up.data["signal"], Value::Null);
    assert_eq!(gave_up.data["reason"], "gave up after 5 crashes in a row");
}

#[tokio::test]
async fn nothing_of_the_desktop_outlives_the_agent() {
    let mut a = desktop_agent().await;
    let report = wait_ready(&a).await;
    let mut pids = component_pids(&report);
    for p in pids.clone() {
        pids.extend(berth_tests::processes_with_root(p));
    }
    assert!(pids.len() >= 8, "{pids:?}");
    // SIGTERM is a restart: the desktop stops with the agent …
    a.signal(nix::sys::signal::Signal::SIGTERM);
    a.wait_exit(Duration::from_secs(20));
    let alive: Vec<u32> = pids.iter().copied().filter(|p| pid_alive(*p)).collect();
    assert!(alive.is_empty(), "left running after SIGTERM: {alive:?}");
    // … and the next agent starts it afresh.
    a.launch().await;
    let report = wait_ready(&a).await;
    let pids = component_pids(&report);
    let mut tree = pids.clone();
    for p in pids.clone() {
        tree.extend(berth_tests::processes_with_root(p));
    }
    // A SIGKILL of the agent takes the components with it (parent-death signal) …
    a.kill9();
    wait_until(
        "the desktop to die with the agent",
        Duration::from_secs(10),
        || pids.iter().all(|p| !pid_alive(*p)),
    );
    // … and the next agent clears what they had forked (the AT-SPI bus daemon).
    a.launch().await;
    let report = wait_ready(&a).await;
    let alive: Vec<u32> = tree.iter().copied().filter(|p| pid_alive(*p)).collect();
    assert!(alive.is_empty(), "left running after kill -9: {alive:?}");
    let mut pids = component_pids(&report);
    for p in pids.clone() {
        pids.extend(berth_tests::processes_with_root(p));
    }
    let r = a.client().shutdown().await;
    assert!(r.is_ok(), "{r:?}");
    a.wait_exit(Duration::from_secs(20));
    let alive: Vec<u32> = pids.iter().copied().filter(|p| pid_alive(*p)).collect();
    assert!(alive.is_empty(), "left running after shutdown: {alive:?}");
}

/// The attribute `name="value"` of the first element matching `needle` in the XML.
fn xml_attr(xml: &str, needle: &str, name: &str) -> Option<String> {
    let at = xml.find(needle)?;
    let end = at + xml[at..].find('>')?;
    let element = &xml[at..end];
    let key = format!(" {name}=\"");
    let start = element.find(&key)? + key.len();
    Some(element[start..start + element[start..].find('"')?].to_string())
}

fn pair(v: &str) -> (i64, i64) {
    let inner = v.trim_start_matches('(').trim_end_matches(')');
    let (a, b) = inner.split_once(", ").expect("(a, b)");
    (a.parse().unwrap(), b.parse().unwrap())
}

#[tokio::test]
async fn the_accessibility_tree_shows_the_page_where_it_is_and_the_terminal_text() {
    let a = desktop_agent().await;
    wait_ready(&a).await;
    let page = a.home.join("a11y.html");
    let links: String = (0..150)
        .map(|i| format!("<li><a href='#l{i}'>link {i}</a></li>"))
        .collect();
    std::fs::write(
        &page,
        format!(
            "<!doctype html><title>a11y page</title><h1>Heading one</h1>\
             <button id=b1 style='margin:40px;width:160px;height:60px' \
             onclick=\"document.title='clicked'\">Press me</button><ul>{links}</ul>"
        ),
    )
    .unwrap();
    let info = a.get_json("/v1/browser").await;
    let cdp = info["cdp_listen"].as_str().unwrap().to_string();
    let created = reqwest::Client::new()
        .put(format!("http://{cdp}/json/new?file://{}", page.display()))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success());
    let target: Value = created.json().await.unwrap();

    let xml = wait_for(
        "the page in the accessibility tree",
        Duration::from_secs(30),
        || async {
            let v = a.compat_json("/accessibility").await;
            let xml = v["AT"].as_str()?.to_string();
            (xml.contains("link 149") && xml.contains("<push-button name=\"Press me\""))
                .then_some(xml)
        },
    )
    .await;
    assert!(xml.starts_with(
        "<desktop-frame xmlns:st=\"https://accessibility.ubuntu.example.org/ns/state\""
    ));
    assert!(
        xml.contains("<application name=\"xfce4-panel\""),
        "the panel's tree"
    );
    let button = "<push-button name=\"Press me\"";
    for state in ["st:enabled", "st:showing", "st:visible", "st:focusable"] {
        assert_eq!(
            xml_attr(&xml, button, state).as_deref(),
            Some("true"),
            "{state}"
        );
    }
    let (x, y) = pair(&xml_attr(&xml, button, "cp:screencoord").unwrap());
    let (w, h) = pair(&xml_attr(&xml, button, "cp:size").unwrap());
    // As styled, give or take the rounding of a fractional position.
    assert!(
        (w - 160).abs() <= 1 && (h - 60).abs() <= 1,
        "size ({w}, {h})"
    );
    assert!(
        x > 0 && y > 0 && x + w <= 1280 && y + h <= 800,
        "({x}, {y}) on screen"
    );
    // Where the tree says the button is, a click lands on it.
    let click = a
        .client()
        .request(reqwest::Method::POST, "/v1/input")
        .json(&json!({"actions": [{"type": "click", "x": x + w / 2, "y": y + h / 2}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(click.status(), 200);
    let id = target["id"].as_str().unwrap().to_string();
    let c = a.client();
    wait_for(
        "the click to reach the button",
        Duration::from_secs(10),
        || {
            let (c, id) = (c.clone(), id.clone());
            async move {
                berth_tests::try_json(&c, "/v1/browser").await?["targets"]
                    .as_array()?
                    .iter()
                    .any(|t| t["id"] == id.as_str() && t["title"] == "clicked")
                    .then_some(())
            }
        },
    )
    .await;
    // The same tree as JSON.
    let tree = a.get_json("/v1/a11y").await;
    assert!(
        tree["applications"].as_array().unwrap().len() >= 3,
        "{tree}"
    );

    // /terminal: the focused terminal's text.
    assert_eq!(
        a.compat_json("/terminal").await,
        json!({"output": null, "status": "success"})
    );
    let launched = reqwest::Client::new()
        .post(a.url("/setup/launch"))
        .json(&json!({"command": ["xfce4-terminal"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(launched.status(), 200);
    wait_for("a focused terminal", Duration::from_secs(30), || async {
        a.compat_json("/terminal").await["output"]
            .as_str()
            .map(|_| ())
    })
    .await;
    let typed = a
        .client()
        .request(reqwest::Method::POST, "/v1/input")
        .json(&json!({"actions": [{"type": "type", "text": "echo berth-$((6*7))-check\n"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(typed.status(), 200);
    let out = wait_for(
        "the command's output in /terminal",
        Duration::from_secs(20),
        || async {
            let out = a.compat_json("/terminal").await["output"]
                .as_str()?
                .to_string();
            out.contains("berth-42-check\n").then_some(out)
        },
    )
    .await;
    assert_eq!(out, out.trim_end(), "right-trimmed");
}

#[tokio::test]
async fn without_a_desktop_terminal_is_null_and_accessibility_a_clear_503() {
    let a = AgentProcess::start().await;
    assert_eq!(
        a.compat_json("/terminal").await,
        json!({"output": null, "status": "success"})
    );
    let r = reqwest::get(a.url("/accessibility")).await.unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], "error");
    let (status, report) = ready(&a, "0s").await;
    assert_eq!((status, report["ready"].clone()), (200, json!(true)));
}

fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[tokio::test]
async fn the_desktop_runs_as_the_sandbox_user_and_the_browser_restarts_on_request() {
    let Some(user) = berth_tests::test_account("berthdesk") else {
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("berth-desk-")
        .tempdir()
        .unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(user.uid.as_raw()), Some(user.gid.as_raw())).unwrap();
    let a = AgentProcess::start_in(
        dir,
        AgentOptions {
            extra_args: vec![
                "--desktop".into(),
                "--user".into(),
                "berthdesk".into(),
                "--cdp-listen".into(),
                "127.0.0.1:0".into(),
                "--screen".into(),
                format!("{WIDTH}x{HEIGHT}"),
            ],
            home: Some(home.clone()),
            ..Default::default()
        },
    )
    .await;
    let report = wait_ready(&a).await;
    let pid = |name: &str| report["components"][name]["pid"].as_u64().unwrap() as u32;
    let uid = user.uid.as_raw();
    for name in ["chromium", "xfwm4", "xfce4-panel", "session-bus"] {
        assert_eq!(uid_of(pid(name)), uid, "{name} runs as the sandbox user");
    }
    assert_eq!(
        uid_of(pid("x")),
        0,
        "Xvnc runs as the agent (its VNC socket is the agent's alone)"
    );
    let profile = home.join(".config/google-chrome");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&profile).unwrap().uid(),
        uid,
        "the profile is where Google Chrome keeps it, in the user's home"
    );

    // The session bus is the user's (it refuses the agent, root); accessibility works anyway,
    // and readiness counted it.
    assert_eq!(
        report["components"]["accessibility"]["ok"], true,
        "{report:#}"
    );
    let tree = a.compat_json("/accessibility").await;
    let xml = tree["AT"].as_str().unwrap_or_default();
    assert!(
        xml.contains("<application name=\"Google Chrome\""),
        "the browser as Google Chrome in the tree: {}",
        &xml[..xml.len().min(2000)]
    );
    assert!(xml.contains("<application name=\"xfce4-panel\""));

    // The X server admits only holders of the desktop's cookie, which only the user can read.
    let xauthority = home.join(".Xauthority");
    let meta = std::fs::metadata(&xauthority).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (uid, 0o600));
    let display = a.get_json("/v1/display").await["display"]
        .as_str()
        .expect("the desktop's display")
        .to_string();
    let xdpyinfo = |auth: &std::path::Path| {
        std::process::Command::new("xdpyinfo")
            .env("DISPLAY", &display)
            .env("XAUTHORITY", auth)
            .output()
            .expect("xdpyinfo (x11-utils)")
    };
    let refused = xdpyinfo(std::path::Path::new("/dev/null"));
    assert!(
        !refused.status.success(),
        "a client without the cookie is refused"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("Authorization required"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(xdpyinfo(&xauthority).status.success(), "the cookie admits");

    // A browser restart on request: a new process, an event, and readiness comes back.
    let from = a.get_json("/v1/events?from_seq=0&limit=10000").await["next_seq"]
        .as_u64()
        .unwrap();
    let r = a
        .client()
        .request(reqwest::Method::POST, "/v1/browser/restart")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let info: Value = r.json().await.unwrap();
    assert_ne!(info["pid"].as_u64().unwrap() as u32, pid("chromium"));
    let events = events_since(&a, from).await;
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "browser.restarted" && e["cause"] == "request"),
        "{events:#?}"
    );
    wait_ready(&a).await;
}

/// A browser-toolset turn against the agent: its `tool_result` blocks.
async fn browser_turn(a: &AgentProcess, calls: &[(&str, Value)]) -> Vec<Value> {
    let content: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, input))| {
            json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": name,
                   "toolset_name": "browser", "input": input})
        })
        .collect();
    let v: Value = a
        .client()
        .request(
            reqwest::Method::POST,
            berth_protocol::routes::native::TOOLSET_BROWSER,
        )
        .json(&json!({ "content": content }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["content"].as_array().cloned().unwrap()
}

fn first_text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn the_browser_toolsets_optional_members_serve_when_the_agent_enables_them() {
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec![
            "--desktop".into(),
            "--cdp-listen".into(),
            "127.0.0.1:0".into(),
            "--screen".into(),
            format!("{WIDTH}x{HEIGHT}"),
            "--browser-toolset-enable".into(),
            "javascript_exec,read_console,read_network,file_upload".into(),
        ],
        ..Default::default()
    })
    .await;
    wait_ready(&a).await;
    let info = a.get_json("/v1/toolsets/browser").await;
    assert_eq!(info["members"].as_array().unwrap().len(), 31, "{info}");
    assert_eq!(
        info["tool"]["configs"]["javascript_exec"],
        json!({"enabled": true}),
        "{info}"
    );

    // A page served over HTTP from the test's own directory: it logs and fetches when loaded.
    let site = tempfile::tempdir().unwrap();
    std::fs::write(
        site.path().join("opt.html"),
        "<!doctype html><title>Opt page</title><input type=file aria-label='Attachment'>\
         <script>console.log('hello from page', 42); fetch('data.txt');</script>",
    )
    .unwrap();
    std::fs::write(site.path().join("data.txt"), "data").unwrap();
    let port = berth_tests::free_port();
    let mut server = std::process::Command::new("python3")
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .current_dir(site.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_for("the test site", Duration::from_secs(20), || {
        let url = format!("{base}/data.txt");
        async move { reqwest::get(url).await.ok().filter(|r| r.status() == 200) }
    })
    .await;
    let upload = a.home.join("up.txt");
    std::fs::write(&upload, "upload me").unwrap();

    let r = browser_turn(
        &a,
        &[
            ("navigate", json!({"url": format!("{base}/opt.html")})),
            ("javascript_exec", json!({"text": "document.title"})),
            ("javascript_exec", json!({"text": "({a: 1 + 1})"})),
            (
                "javascript_exec",
                json!({"text": "await new Promise(r => setTimeout(r, 50)); 'later'"}),
            ),
            ("find", json!({"query": "attachment"})),
        ],
    )
    .await;
    assert!(r.iter().all(|x| x.get("is_error").is_none()), "{r:#?}");
    assert_eq!(
        first_text(&r[0]),
        format!("Navigated to {base}/opt.html — Opt page (HTTP 200)")
    );
    assert_eq!(first_text(&r[1]), "Opt page");
    assert_eq!(first_text(&r[2]), r#"{"a":2}"#);
    assert_eq!(first_text(&r[3]), "later");
    let found = first_text(&r[4]);
    let file_ref = found
        .split(['[', ']'])
        .find(|s| s.starts_with("ref_"))
        .unwrap_or_else(|| panic!("no reference: {found}"))
        .to_string();

    // The console and the network since the tab was attached, each read once.
    let page_requests = wait_for("the page's fetch", Duration::from_secs(10), || {
        let a = &a;
        async move {
            let r = browser_turn(a, &[("read_network", json!({}))]).await;
            let t = first_text(&r[0]);
            t.contains("data.txt 200").then_some(t)
        }
    })
    .await;
    assert!(
        page_requests.contains(&format!("GET {base}/data.txt 200")),
        "{page_requests}"
    );
    let r = browser_turn(
        &a,
        &[("read_console", json!({})), ("read_console", json!({}))],
    )
    .await;
    assert!(
        first_text(&r[0]).contains("[log] hello from page 42"),
        "{r:#?}"
    );
    assert_eq!(first_text(&r[1]), "(empty)", "read once");

    // file_upload: the input holds the file, as the page sees it.
    let r = browser_turn(
        &a,
        &[
            (
                "file_upload",
                json!({"target": {"type": "ref", "ref": file_ref}, "paths": [upload]}),
            ),
            (
                "javascript_exec",
                json!({"text": "document.querySelector('input').files[0].name + ' ' + \
                                 document.querySelector('input').files[0].size"}),
            ),
        ],
    )
    .await;
    assert_eq!(first_text(&r[0]), "Uploaded.", "{r:#?}");
    assert_eq!(first_text(&r[1]), "up.txt 9");

    // A script that throws is the turn's failure; what follows is not run.
    let r = browser_turn(
        &a,
        &[
            (
                "javascript_exec",
                json!({"text": "throw new Error('boom')"}),
            ),
            ("javascript_exec", json!({"text": "window.ran = true"})),
        ],
    )
    .await;
    assert_eq!(r[0]["is_error"], true);
    assert!(
        first_text(&r[0]).starts_with("The script threw: Error: boom"),
        "{r:#?}"
    );
    assert_eq!(
        r[1]["content"],
        "Not executed: an earlier action in this turn failed."
    );
    let r = browser_turn(
        &a,
        &[(
            "file_upload",
            json!({"target": {"type": "ref", "ref": file_ref}, "paths": ["/no/such/file"]}),
        )],
    )
    .await;
    assert_eq!(first_text(&r[0]), "paths: a file to upload does not exist.");
    let _ = server.kill();
    let _ = server.wait();
}

/// What an agent sees first on XFCE: Chromium maximised right under the top panel, focused, in
/// its own frame.
#[tokio::test]
async fn the_browser_opens_maximised_under_the_panel_focused_in_its_own_frame() {
    let a = desktop_agent().await;
    wait_ready(&a).await;
    berth_tests::assert_browser_under_the_panel(&a.client()).await;
}
