//! The controller is the one door: a Docker desktop sandbox from the image, reached only through
//! the controller's endpoint (`ControllerClient::agent`: the controller's API key, never the
//! agent's address or token), with the agent and the desktop running as different users.

use std::time::Duration;

use berth_protocol::controller::CreateSandbox;
use berth_protocol::{
    ExecRequest, FollowMessage, MoveRequest, PtyRequest, RecordingRequest, WatchKind, WatchMessage,
};
use berth_tests::controller::{ControllerProcess, Provider};
use berth_tests::wait_for;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn a_docker_desktop_is_worked_only_through_the_controller() {
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "desktop-ubuntu".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sb.status, "running", "{sb:?}");
    let agent = cl.agent(&sb.id);
    assert!(
        agent.base().starts_with(cl.base()),
        "{} goes through the controller at {}",
        agent.base(),
        cl.base()
    );

    // What the agent sees first: Chromium maximised right under the top panel, focused.
    berth_tests::assert_browser_under_the_panel(&agent).await;

    // The agent and the desktop are different users.
    let who = agent
        .exec(&ExecRequest {
            shell: Some(
                "ps -o user= -C berth-agent | sort -u; ps -o user= -C xfce4-panel | sort -u; \
                 echo \"$DISPLAY\""
                    .into(),
            ),
            ..Default::default()
        })
        .await
        .unwrap();
    let lines: Vec<&str> = who.stdout.as_deref().unwrap_or("").lines().collect();
    assert_eq!(lines.len(), 3, "{who:?}");
    // The sandbox's one X server is on :0, where OSWorld's tasks and scripts look for it.
    assert_eq!(lines[2], ":0", "{who:?}");
    println!(
        "the agent runs as {:?}, the desktop as {:?}",
        lines[0], lines[1]
    );
    assert_ne!(lines[0], lines[1], "{who:?}");

    // A terminal: typed into and read back.
    let pty = agent
        .pty_create(&PtyRequest {
            cols: Some(100),
            rows: Some(30),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut term = agent.pty_attach(&pty.id).await.unwrap();
    term.send(Message::Binary(
        b"stty size; echo typed-$((6*7))\n".to_vec().into(),
    ))
    .await
    .unwrap();
    let out = berth_tests::read_terminal_until(&mut term, "typed-42").await;
    assert!(out.contains("30 100"), "{out:?}");
    term.send(Message::Binary(b"exit 3\n".to_vec().into()))
        .await
        .unwrap();
    assert_eq!(berth_tests::terminal_exit_code(&agent, &pty.id).await, 3);
    let agent_ref = &agent;

    // Files: uploaded, listed, watched while moved.
    agent
        .mkdir(&berth_protocol::MkdirRequest {
            path: "~/door".into(),
            parents: Some(true),
            mode: None,
        })
        .await
        .unwrap();
    let body = vec![7u8; 3 << 20];
    agent
        .upload("~/door/a.bin", reqwest::Body::from(body.clone()), None)
        .await
        .unwrap();
    let listed = agent.list("~/door", 1).await.unwrap();
    let names: Vec<&str> = listed.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["a.bin"], "{listed:?}");
    assert_eq!(listed.entries[0].size, body.len() as u64);
    let mut watch = agent
        .websocket("/v1/fs/watch?path=~/door&recursive=true")
        .await
        .unwrap();
    // The watch is armed once the upgrade completes through both hops; move until it tells.
    let moved = agent
        .move_path(&MoveRequest {
            from: "~/door/a.bin".into(),
            to: "~/door/b.bin".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(moved.path.ends_with("/door/b.bin"), "{moved:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|(k, _): &(WatchKind, Vec<String>)| matches!(k, WatchKind::Rename | WatchKind::Create))
    {
        let msg = tokio::time::timeout_at(deadline, watch.next())
            .await
            .unwrap_or_else(|_| panic!("no watch event of the move: {seen:?}"))
            .unwrap()
            .unwrap();
        if let Message::Text(t) = msg
            && let WatchMessage::Event { kind, paths } = serde_json::from_str(&t).unwrap()
        {
            seen.push((kind, paths));
        }
    }
    println!("watch events of the move: {seen:?}");
    let back = agent.download("~/door/b.bin").await.unwrap();
    assert_eq!(back.bytes().await.unwrap().as_ref(), body.as_slice());

    // A background command's output followed over a WebSocket.
    let started = agent
        .exec_background(&ExecRequest {
            shell: Some("for i in 1 2 3; do echo line-$i; sleep 0.2; done; exit 4".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut follow = agent.follow_output(&started.id, 0, "").await.unwrap();
    let mut text = Vec::new();
    let exit = loop {
        let m = tokio::time::timeout(Duration::from_secs(20), follow.next())
            .await
            .expect("output within 20 s")
            .expect("the stream stays open until the exit")
            .unwrap();
        match m {
            FollowMessage::Chunk(c) => text.extend_from_slice(&c.bytes()),
            FollowMessage::Exit { exit_code } => break exit_code,
            _ => {}
        }
    };
    assert_eq!(String::from_utf8_lossy(&text), "line-1\nline-2\nline-3\n");
    assert_eq!(exit, Some(4));

    // A recording started, something drawn, stopped and downloaded.
    let rec = agent
        .start_recording(&RecordingRequest {
            fps: Some(10),
            ..Default::default()
        })
        .await
        .unwrap();
    agent
        .exec(&ExecRequest {
            shell: Some("xsetroot -solid '#3060c0' 2>/dev/null || true".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let rec_id = rec.id.clone();
    wait_for("a second of recording", Duration::from_secs(20), || {
        let id = rec_id.clone();
        async move {
            let r = agent_ref.recording(&id).await.ok()?;
            (r.duration_ms >= 1000).then_some(())
        }
    })
    .await;
    let stopped = agent.stop_recording(&rec.id).await.unwrap();
    let mp4 = agent.recording_file(&rec.id).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("door.mp4");
    std::fs::write(&file, &mp4).unwrap();
    let probe = berth_tests::video::probe(&file);
    println!(
        "recording: {} bytes, {} frames encoded, ffprobe counts {}",
        mp4.len(),
        stopped.frames_encoded,
        probe.frames.len()
    );
    assert_eq!(probe.frames.len() as u64, stopped.frames_encoded);
    assert!(probe.frames.len() >= 2, "{} frames", probe.frames.len());

    // The accessibility tree.
    let tree = wait_for(
        "an accessibility tree with applications",
        Duration::from_secs(30),
        || async move {
            let t = agent_ref.a11y().await.ok()?;
            (!t.applications.is_empty()).then_some(t)
        },
    )
    .await;
    let apps: Vec<&str> = tree.applications.iter().map(|a| a.name.as_str()).collect();
    println!("accessibility applications: {apps:?}");

    cl.delete(&sb.id).await.unwrap();
}
