//! Connection bounds on both HTTP listeners, against a real agent and a real controller run
//! with a 1 s head timeout and a 1 s body idle timeout: connections that never finish their
//! request head are closed, an idle keep-alive connection is closed, a request body that
//! stalls is answered (or its connection closed) instead of hanging — while long-polls, SSE,
//! a long foreground exec and a WebSocket terminal that stay quiet for longer are not cut; past
//! the connection limit, a new connection waits for a free slot.

use std::time::{Duration, Instant};

use berth_protocol::controller::{Command, CreateSandbox, RunRequest};
use berth_protocol::{ExecRequest, PtyRequest};
use berth_tests::controller::{API_KEY, ControllerProcess};
use berth_tests::{AgentOptions, AgentProcess, TOKEN, host_port};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

/// The head and body idle timeouts both servers run with here.
const TIMEOUT: Duration = Duration::from_secs(1);
/// How long past a timeout the server may take to close (a loaded two-core machine).
const MARGIN: Duration = Duration::from_secs(5);
/// How long the "quiet" requests stay silent: well past `TIMEOUT`.
const QUIET_SECS: u32 = 3;

async fn agent() -> AgentProcess {
    AgentProcess::start_with(AgentOptions {
        extra_args: vec![
            "--header-timeout".into(),
            "1s".into(),
            "--body-idle-timeout".into(),
            "1s".into(),
        ],
        ..Default::default()
    })
    .await
}

async fn controller() -> ControllerProcess {
    ControllerProcess::start("http_header_timeout_secs = 1.0\nhttp_body_idle_timeout_secs = 1.0\n")
        .await
}

/// Reads until the server closes the connection or `within` passes: how long that took
/// (`None` if it stayed open) and what was read.
async fn closed_within(s: &mut TcpStream, within: Duration) -> (Option<Duration>, Vec<u8>) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((start + within).into(), s.read(&mut buf)).await {
            Err(_) => return (None, got),
            Ok(Ok(0)) | Ok(Err(_)) => return (Some(start.elapsed()), got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one HTTP/1.1 response with a Content-Length body: its status and body.
async fn read_response(s: &mut TcpStream) -> (u16, Vec<u8>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(20);
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout_at(deadline.into(), s.read(&mut buf))
            .await
            .expect("a response in time")
            .expect("read");
        assert!(
            n > 0,
            "closed before a response: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
    let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .expect("a content-length");
    while got.len() < head_end + len {
        let n = tokio::time::timeout_at(deadline.into(), s.read(&mut buf))
            .await
            .expect("the body in time")
            .expect("read");
        assert!(n > 0, "closed mid-body");
        got.extend_from_slice(&buf[..n]);
    }
    (status, got[head_end..head_end + len].to_vec())
}

/// (a) `n` connections that each send half a request head and then nothing are all closed by
/// the server, none before the head timeout.
async fn half_heads_are_closed(addr: &str, n: usize) {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let addr = addr.to_string();
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(&addr).await.expect("connect");
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: berth\r\nX-Slow: ")
                .await
                .expect("write");
            closed_within(&mut s, TIMEOUT + MARGIN).await
        }));
    }
    let mut closed = Vec::new();
    for t in tasks {
        let (when, got) = t.await.unwrap();
        assert!(
            got.is_empty() || got.starts_with(b"HTTP/1.1 408"),
            "answered a half head: {:?}",
            String::from_utf8_lossy(&got)
        );
        if let Some(d) = when {
            closed.push(d);
        }
    }
    closed.sort();
    println!(
        "{addr}: {}/{n} half-head connections closed by the server (earliest {:?}, latest {:?})",
        closed.len(),
        closed.first(),
        closed.last()
    );
    assert_eq!(
        closed.len(),
        n,
        "connections left open past the head timeout"
    );
    assert!(
        closed[0] >= TIMEOUT / 2,
        "closed before the head timeout: {:?}",
        closed[0]
    );
}

/// (b) A keep-alive connection that sat idle after one full request is closed.
async fn idle_keep_alive_is_closed(addr: &str) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: berth\r\n\r\n")
        .await
        .unwrap();
    let (status, body) = read_response(&mut s).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (when, got) = closed_within(&mut s, TIMEOUT + MARGIN).await;
    let when = when.expect("the idle keep-alive connection was left open");
    println!("{addr}: idle keep-alive connection closed after {when:?}");
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    assert!(when >= TIMEOUT / 2, "{when:?}");
}

/// (c) A request whose body stops after a few bytes gets a 4xx (or its connection closed)
/// within the body idle timeout, not a hang; the server still serves afterwards.
async fn stalled_body_fails(addr: &str, head: &str) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("{head}Content-Length: 100\r\n\r\n{{\"a\":").as_bytes())
        .await
        .unwrap();
    let start = Instant::now();
    let (when, got) = closed_within(&mut s, TIMEOUT + MARGIN).await;
    let elapsed = start.elapsed();
    let text = String::from_utf8_lossy(&got);
    println!(
        "{addr}: stalled body: {:?} after {elapsed:?}",
        text.lines().next()
    );
    assert!(
        when.is_some() || !got.is_empty(),
        "a stalled body held its request for {elapsed:?}"
    );
    if !got.is_empty() {
        let status: u16 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!((400..500).contains(&status), "{text}");
    }
    assert!(
        elapsed >= TIMEOUT / 2,
        "gave up on the body before the idle timeout: {elapsed:?}"
    );
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: berth\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut s).await.0, 200);
}

fn quiet_script() -> String {
    format!("sleep {QUIET_SECS}; echo done")
}

#[tokio::test]
async fn the_agent_closes_half_heads_and_idle_connections() {
    let a = agent().await;
    let addr = host_port(&a.base);
    half_heads_are_closed(addr, 200).await;
    idle_keep_alive_is_closed(addr).await;
    assert_eq!(a.get_json("/healthz").await["ok"], true);
}

#[tokio::test]
async fn the_agent_answers_a_stalled_body() {
    let a = agent().await;
    let addr = host_port(&a.base);
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    stalled_body_fails(
        addr,
        &format!(
            "POST /v1/exec HTTP/1.1\r\nHost: berth\r\n{auth}Content-Type: application/json\r\n"
        ),
    )
    .await;
    // The compat surface (no token) reads its JSON the same way.
    stalled_body_fails(
        addr,
        "POST /execute HTTP/1.1\r\nHost: berth\r\nContent-Type: application/json\r\n",
    )
    .await;
    // A streamed upload that stalls leaves no file behind.
    stalled_body_fails(
        addr,
        &format!("PUT /v1/files?path=~/stalled.bin HTTP/1.1\r\nHost: berth\r\n{auth}"),
    )
    .await;
    berth_tests::wait_until(
        "the stalled upload to leave nothing",
        Duration::from_secs(5),
        || !a.home.join("stalled.bin").exists(),
    );
}

#[tokio::test]
async fn quiet_long_requests_and_terminals_on_the_agent_are_not_cut() {
    let a = agent().await;
    let c = a.client();
    let quiet = Duration::from_secs(QUIET_SECS as u64);

    // A foreground exec answers only when its command ends.
    let start = Instant::now();
    let r = c.exec(&ExecRequest::shell(quiet_script())).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_deref()), (0, Some("done\n")));
    assert!(start.elapsed() >= quiet, "{:?}", start.elapsed());

    // A long-poll for output waits quietly until there is some.
    let started = c
        .exec_background(&ExecRequest::shell(quiet_script()))
        .await
        .unwrap();
    let start = Instant::now();
    let page = c.output_wait(&started.id, 0).await.unwrap();
    let text: Vec<u8> = page.chunks.iter().flat_map(|ch| ch.bytes()).collect();
    assert_eq!(text, b"done\n");
    assert!(start.elapsed() >= quiet - Duration::from_millis(500));

    // SSE: the event stream stays open through the quiet stretch and ends with the exit.
    let started = c
        .exec_background(&ExecRequest::shell(quiet_script()))
        .await
        .unwrap();
    let start = Instant::now();
    let resp = reqwest::Client::new()
        .get(a.url(&format!(
            "/v1/commands/{}/output?from_seq=0&follow=true",
            started.id
        )))
        .bearer_auth(TOKEN)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let body = resp.text().await.unwrap();
    assert!(start.elapsed() >= quiet - Duration::from_millis(500));
    assert!(body.contains(r#""data":"done\n""#), "{body}");
    assert!(body.contains(r#"{"exit_code":0}"#), "{body}");

    // A terminal's WebSocket that carries nothing for a while still works afterwards.
    let info = c
        .pty_create(&PtyRequest {
            cmd: Some(vec!["/bin/sh".into()]),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut ws = c.pty_attach(&info.id).await.unwrap();
    // The quiet stretch itself: whatever the shell prints at start is read, nothing is sent.
    let quiet_until = tokio::time::Instant::now() + quiet;
    while let Ok(m) = tokio::time::timeout_at(quiet_until, ws.next()).await {
        match m {
            Some(Ok(_)) => {}
            other => panic!("the terminal socket ended while quiet: {other:?}"),
        }
    }
    ws.send(Message::Binary(b"echo hi-$((6*7))\n".to_vec().into()))
        .await
        .expect("the terminal socket is still open");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut text = String::new();
    while !text.contains("hi-42") {
        match tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("no echo after the quiet stretch; got {text:?}"))
        {
            Some(Ok(Message::Binary(b))) => text.push_str(&String::from_utf8_lossy(&b)),
            Some(Ok(_)) => {}
            other => panic!("the terminal socket ended: {other:?}; got {text:?}"),
        }
    }
}

#[tokio::test]
async fn the_controller_bounds_its_connections_and_keeps_long_requests() {
    let ctl = controller().await;
    let addr = host_port(&ctl.base).trim_end_matches('/').to_string();
    half_heads_are_closed(&addr, 200).await;
    idle_keep_alive_is_closed(&addr).await;
    stalled_body_fails(
        &addr,
        &format!(
            "POST /sandbox/sandboxes/v1 HTTP/1.1\r\nHost: berth\r\nX-Api-Key: {API_KEY}\r\n\
             Content-Type: application/json\r\n"
        ),
    )
    .await;

    // An exec answers when its run ends, after a quiet stretch past the head timeout.
    let cl = ctl.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "ide".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let start = Instant::now();
    let run = cl
        .exec(
            &sb.id,
            &RunRequest {
                command: Command::Line(quiet_script()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (run.status.as_str(), run.stdout.as_str()),
        ("exited", "done\n")
    );
    assert!(start.elapsed() >= Duration::from_secs(QUIET_SECS as u64));
    cl.delete(&sb.id).await.unwrap();
}

#[tokio::test]
async fn past_the_connection_limit_accepting_waits_for_a_free_slot() {
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec![
            "--header-timeout".into(),
            "1s".into(),
            "--max-connections".into(),
            "2".into(),
        ],
        ..Default::default()
    })
    .await;
    let addr = host_port(&a.base);
    // Two connections that never finish a head hold both slots until the head timeout.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    let start = Instant::now();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: berth\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = read_response(&mut s).await;
    let waited = start.elapsed();
    println!("the third connection was served after {waited:?}");
    assert_eq!(status, 200);
    assert!(
        waited >= TIMEOUT / 2,
        "served past the limit without waiting: {waited:?}"
    );
    for mut h in held {
        let (when, _) = closed_within(&mut h, MARGIN).await;
        assert!(when.is_some(), "a held connection stayed open");
    }
}
