//! Authentication of the native surface (and of the compat surface with `--compat-auth
//! token`), `/healthz`, and the event timeline with replay and live follow.

use std::time::Duration;

use berth_protocol::{Event, ExecRequest};
use berth_tests::{AgentOptions, AgentProcess, TOKEN};
use futures_util::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

const NATIVE_ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/exec"),
    ("GET", "/v1/commands"),
    ("GET", "/v1/commands/x"),
    ("DELETE", "/v1/commands/x"),
    ("GET", "/v1/commands/x/output"),
    ("POST", "/v1/commands/x/stdin"),
    ("POST", "/v1/commands/x/signal"),
    ("POST", "/v1/pty"),
    ("GET", "/v1/pty"),
    ("GET", "/v1/pty/x"),
    ("DELETE", "/v1/pty/x"),
    ("GET", "/v1/pty/x/attach"),
    ("POST", "/v1/pty/x/resize"),
    ("GET", "/v1/files?path=/etc/hostname"),
    ("PUT", "/v1/files?path=/tmp/x"),
    ("DELETE", "/v1/fs?path=/tmp/x"),
    ("GET", "/v1/fs/list?path=/"),
    ("GET", "/v1/fs/stat?path=/"),
    ("POST", "/v1/fs/mkdir"),
    ("POST", "/v1/fs/move"),
    ("GET", "/v1/fs/watch?path=/"),
    ("GET", "/v1/events"),
    ("POST", "/v1/shutdown"),
];

#[tokio::test]
async fn every_native_route_needs_the_bearer_token() {
    let a = AgentProcess::start().await;
    let http = reqwest::Client::new();
    for (method, path) in NATIVE_ROUTES {
        let m: reqwest::Method = method.parse().unwrap();
        // No header, a wrong token, and the right token without the Bearer scheme.
        for auth in [
            None,
            Some("Bearer wrong-token".to_string()),
            Some(TOKEN.to_string()),
        ] {
            let mut rb = http.request(m.clone(), a.url(path));
            if let Some(h) = &auth {
                rb = rb.header("authorization", h);
            }
            let r = rb.send().await.unwrap();
            assert_eq!(r.status(), 401, "{method} {path} with {auth:?}");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "unauthorized");
        }
    }
    // The agent is still up (the shutdown route was refused each time).
    a.client().healthz().await.unwrap();
}

#[tokio::test]
async fn healthz_is_open_and_compat_is_open_by_default() {
    let a = AgentProcess::start().await;
    let r = reqwest::get(a.url("/healthz")).await.unwrap();
    assert_eq!(r.status(), 200);
    let r = reqwest::get(a.url("/platform")).await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn compat_auth_token_closes_the_compat_surface() {
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--compat-auth".into(), "token".into()],
        ..Default::default()
    })
    .await;
    let http = reqwest::Client::new();
    let r = http
        .post(a.url("/execute"))
        .json(&serde_json::json!({"command": ["true"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .post(a.url("/execute"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"command": ["true"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(reqwest::get(a.url("/healthz")).await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_generated_token_file_is_private_and_works() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut child = std::process::Command::new(berth_tests::workspace_bin("berth-agent"))
        .args(["--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&state)
        .arg("--home")
        .arg(dir.path())
        .env_remove("BERTH_AGENT_TOKEN")
        .env("BERTH_AGENT_LOG", "warn")
        .spawn()
        .unwrap();
    let endpoints = state.join("endpoints.json");
    berth_tests::wait_until("the agent to bind", Duration::from_secs(20), || {
        endpoints.exists()
    });
    let listen: Value = serde_json::from_slice(&std::fs::read(&endpoints).unwrap()).unwrap();
    let token = std::fs::read_to_string(state.join("token")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state.join("token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(token.len(), 64);
    let c = berth_protocol::AgentClient::new(
        format!("http://{}", listen["listen"].as_str().unwrap()),
        Some(token),
    );
    c.commands().await.unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    child.wait().unwrap();
}

#[tokio::test]
async fn the_timeline_is_numbered_replayable_and_followable() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let r = c.exec(&ExecRequest::argv(["true"])).await.unwrap();
    let page = c.events(0).await.unwrap();
    let kinds: Vec<&str> = page.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, vec!["command.started", "command.exited"]);
    assert!(page.events.iter().all(|e| e.data["id"] == r.id.as_str()));
    assert_eq!(page.events[0].seq, 0);
    assert_eq!(page.events[1].seq, 1);
    assert_eq!(page.next_seq, 2);
    assert_eq!(c.events(1).await.unwrap().events.len(), 1);

    // A live follower from seq 2 sees the next command's events as they happen.
    let mut ws = c
        .websocket("/v1/events?from_seq=2&follow=true")
        .await
        .unwrap();
    let bg = c
        .exec_background(&ExecRequest::shell("exit 9"))
        .await
        .unwrap();
    let mut seen: Vec<Event> = Vec::new();
    while seen.len() < 2 {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("an event")
            .unwrap()
            .unwrap();
        if let Message::Text(t) = msg {
            seen.push(serde_json::from_str(&t).unwrap());
        }
    }
    assert_eq!(seen[0].seq, 2);
    assert_eq!(seen[0].kind, "command.started");
    assert_eq!(seen[1].kind, "command.exited");
    assert_eq!(seen[1].data["id"], bg.id.as_str());
    assert_eq!(seen[1].data["exit_code"], 9);
}

#[tokio::test]
async fn the_timeline_survives_a_restart() {
    let mut a = AgentProcess::start().await;
    a.client().exec(&ExecRequest::argv(["true"])).await.unwrap();
    a.signal(nix::sys::signal::Signal::SIGTERM);
    a.wait_exit(Duration::from_secs(10));
    a.launch().await;
    let c = a.client();
    c.exec(&ExecRequest::argv(["true"])).await.unwrap();
    let seqs: Vec<u64> = c
        .events(0)
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, vec![0, 1, 2, 3]);
}
