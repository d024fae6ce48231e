//! Terminals over WebSocket against a real agent: typed input reaches a real shell, scrollback
//! is replayed on reattach, several attachers share one terminal, resize reaches the program,
//! and the exit code arrives on close.

use std::time::Duration;

use berth_protocol::client::WebSocket;
use berth_protocol::{PtyControl, PtyRequest, PtyState};
use berth_tests::{AgentProcess, wait_for};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

/// Reads from a terminal socket until `needle` shows up; returns everything read and the exit
/// code if the terminal closed.
async fn read_until(ws: &mut WebSocket, needle: &str) -> (String, Option<i32>) {
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {needle:?}; got {text:?}"));
        match msg {
            Some(Ok(Message::Binary(b))) => text.push_str(&String::from_utf8_lossy(&b)),
            Some(Ok(Message::Text(t))) => {
                if let Ok(PtyControl::Exit { exit_code }) = serde_json::from_str(&t) {
                    return (text, Some(exit_code));
                }
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return (text, None),
        }
        if text.contains(needle) {
            return (text, None);
        }
    }
}

fn shell() -> PtyRequest {
    PtyRequest {
        cmd: Some(vec!["/bin/sh".into()]),
        cols: Some(100),
        rows: Some(30),
        ..Default::default()
    }
}

#[tokio::test]
async fn typed_input_runs_in_a_real_shell_and_the_size_is_right() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let info = c.pty_create(&shell()).await.unwrap();
    assert_eq!(info.state, PtyState::Running);
    let mut ws = c.pty_attach(&info.id).await.unwrap();
    ws.send(Message::Binary(b"stty size; tty\n".to_vec().into()))
        .await
        .unwrap();
    let (text, _) = read_until(&mut ws, "/dev/pts/").await;
    assert!(text.contains("30 100"), "{text:?}");
    // Resize through a control message reaches the program.
    ws.send(Message::Text(
        r#"{"resize": {"cols": 120, "rows": 40}}"#.into(),
    ))
    .await
    .unwrap();
    wait_for("the resize", Duration::from_secs(5), || {
        let c = c.clone();
        let id = info.id.clone();
        async move { (c.pty(&id).await.ok()?.cols == 120).then_some(()) }
    })
    .await;
    ws.send(Message::Binary(b"stty size\n".to_vec().into()))
        .await
        .unwrap();
    read_until(&mut ws, "40 120").await;
}

#[tokio::test]
async fn a_reattached_terminal_replays_its_scrollback() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let info = c.pty_create(&shell()).await.unwrap();
    let mut ws = c.pty_attach(&info.id).await.unwrap();
    ws.send(Message::Binary(
        b"echo remembered-$((6*7))\n".to_vec().into(),
    ))
    .await
    .unwrap();
    read_until(&mut ws, "remembered-42").await;
    drop(ws);
    // Output produced while nobody is attached is kept too.
    let mut other = c.pty_attach(&info.id).await.unwrap();
    let done = a.home.join("done");
    let line = format!("sleep 0.2; echo while-detached; touch {}\n", done.display());
    other
        .send(Message::Binary(line.into_bytes().into()))
        .await
        .unwrap();
    drop(other);
    berth_tests::wait_until("output while detached", Duration::from_secs(10), || {
        done.exists()
    });
    let mut again = c.pty_attach(&info.id).await.unwrap();
    let (text, _) = read_until(&mut again, "while-detached\r\n").await;
    assert!(
        text.contains("remembered-42"),
        "scrollback replayed: {text:?}"
    );
}

#[tokio::test]
async fn several_attachers_see_the_same_terminal() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let info = c.pty_create(&shell()).await.unwrap();
    let mut one = c.pty_attach(&info.id).await.unwrap();
    let mut two = c.pty_attach(&info.id).await.unwrap();
    wait_for("two attachers", Duration::from_secs(5), || {
        let c = c.clone();
        let id = info.id.clone();
        async move { (c.pty(&id).await.ok()?.attached == 2).then_some(()) }
    })
    .await;
    one.send(Message::Binary(b"echo from-one\n".to_vec().into()))
        .await
        .unwrap();
    read_until(&mut two, "from-one\r\n").await;
    two.send(Message::Binary(b"echo from-two\n".to_vec().into()))
        .await
        .unwrap();
    read_until(&mut one, "from-two\r\n").await;
}

#[tokio::test]
async fn the_exit_code_arrives_when_the_program_ends() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let info = c.pty_create(&shell()).await.unwrap();
    let mut ws = c.pty_attach(&info.id).await.unwrap();
    ws.send(Message::Binary(b"echo bye; exit 3\n".to_vec().into()))
        .await
        .unwrap();
    let (text, code) = read_until(&mut ws, "\u{0}never").await;
    assert!(text.contains("bye"));
    assert_eq!(code, Some(3));
    let info = c.pty(&info.id).await.unwrap();
    assert_eq!(info.state, PtyState::Exited);
    assert_eq!(info.exit_code, Some(3));
    // Attaching to a closed terminal replays and reports the exit.
    let mut late = c.pty_attach(&info.id).await.unwrap();
    let (text, code) = read_until(&mut late, "\u{0}never").await;
    assert!(text.contains("bye"));
    assert_eq!(code, Some(3));
}

#[tokio::test]
async fn terminals_are_listed_and_killed() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let info = c.pty_create(&shell()).await.unwrap();
    let list = c.pty_list().await.unwrap();
    assert!(list.ptys.iter().any(|p| p.id == info.id));
    let pid = info.pid.unwrap();
    c.pty_kill(&info.id).await.unwrap();
    wait_for(
        "the terminal program to die",
        Duration::from_secs(5),
        || async { (!berth_tests::pid_alive(pid)).then_some(()) },
    )
    .await;
    assert_eq!(c.pty(&info.id).await.unwrap_err().status(), Some(404));
    let events = c.events(0).await.unwrap().events;
    assert!(
        events
            .iter()
            .any(|e| e.kind == "pty.opened" && e.data["id"] == info.id.as_str())
    );
}

#[tokio::test]
async fn bad_terminal_requests_are_4xx() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let e = c
        .pty_create(&PtyRequest {
            cmd: Some(vec!["no-such-shell-xyz".into()]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(422));
    let e = c
        .pty_create(&PtyRequest {
            cols: Some(0),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
    assert_eq!(c.pty("pty_nope").await.unwrap_err().status(), Some(404));
}
