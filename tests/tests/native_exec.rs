//! `/v1/exec` and `/v1/commands/…` against a real agent: foreground and background commands,
//! replayable output, followers (WebSocket, SSE, long-poll), stdin, signals, deletion, and the
//! bad-input paths.

use std::time::Duration;

use base64::Engine;
use berth_protocol::{CommandState, ExecRequest, FollowMessage, StdinRequest, Stream};
use berth_tests::{AgentOptions, AgentProcess, processes_matching, unique_sleep, wait_for};
use futures_util::StreamExt;
use serde_json::{Value, json};

#[tokio::test]
async fn foreground_exec_answers_output_exit_code_and_duration() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let r = c
        .exec(&ExecRequest::argv([
            "sh",
            "-c",
            "echo out; echo err >&2; exit 4",
        ]))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 4);
    assert_eq!(r.stdout.as_deref(), Some("out\n"));
    assert_eq!(r.stderr.as_deref(), Some("err\n"));
    assert!(!r.timed_out);
    // The command is on record with its output.
    let info = c.command(&r.id).await.unwrap();
    assert_eq!(info.state, CommandState::Exited);
    assert_eq!(info.exit_code, Some(4));
    let page = c.output(&r.id, 0).await.unwrap();
    assert!(page.done);
    assert_eq!(c.output(&r.id, 999).await.unwrap_err().status(), Some(400));
    // Two pipes carry no order between them; each stream's bytes are exact.
    let of = |s: Stream| -> String {
        page.chunks
            .iter()
            .filter(|c| c.stream == s)
            .map(|c| c.data.clone().unwrap())
            .collect()
    };
    assert_eq!(of(Stream::Stdout), "out\n");
    assert_eq!(of(Stream::Stderr), "err\n");
}

#[tokio::test]
async fn foreground_exec_honours_cwd_env_stdin_and_shell() {
    let a = AgentProcess::start().await;
    std::fs::create_dir(a.home.join("work")).unwrap();
    let mut req = ExecRequest::shell("pwd; echo \"$GREETING\"; cat");
    req.cwd = Some("~/work".into());
    req.env = Some([("GREETING".to_string(), "hello".to_string())].into());
    req.stdin = Some("piped in".into());
    let r = a.client().exec(&req).await.unwrap();
    assert_eq!(
        r.stdout.as_deref(),
        Some(format!("{}\nhello\npiped in", a.home.join("work").display()).as_str())
    );
}

#[tokio::test]
async fn non_utf8_output_is_preserved_as_base64() {
    let a = AgentProcess::start().await;
    let r = a
        .client()
        .exec(&ExecRequest::argv(["printf", "\\377\\376ok"]))
        .await
        .unwrap();
    assert!(r.stdout.is_none());
    assert_eq!(r.stdout_bytes(), vec![0xff, 0xfe, b'o', b'k']);
    // On the wire: one stdout chunk carrying exactly those bytes as `data_b64`, and no lossy
    // `data` beside it.
    let page = a
        .get_json(&format!("/v1/commands/{}/output?from_seq=0", r.id))
        .await;
    assert_eq!(
        page["chunks"],
        json!([{
            "seq": 0,
            "stream": "stdout",
            "data_b64": base64::engine::general_purpose::STANDARD.encode([0xff, 0xfe, b'o', b'k']),
        }]),
        "{page}"
    );
}

#[tokio::test]
async fn a_foreground_timeout_kills_the_group_and_reports_timed_out() {
    let a = AgentProcess::start().await;
    let s = unique_sleep(100);
    let mut req = ExecRequest::shell(format!("echo before; sleep {s} & sleep {s}"));
    req.timeout_ms = Some(300);
    let r = a.client().exec(&req).await.unwrap();
    assert!(r.timed_out);
    assert_eq!(r.signal.as_deref(), Some("KILL"));
    assert_eq!(r.exit_code, 137);
    assert_eq!(r.stdout.as_deref(), Some("before\n"));
    wait_for("the group to die", Duration::from_secs(5), || async {
        processes_matching(&s).is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn spawn_failures_and_bad_requests_are_clear_4xx() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let e = c
        .exec(&ExecRequest::argv(["no-such-program-xyz"]))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(422));
    assert_eq!(e.code(), Some("spawn_failed"));
    assert!(e.to_string().contains("no-such-program-xyz"));
    let mut req = ExecRequest::argv(["true"]);
    req.cwd = Some("/no/such/dir".into());
    let e = c.exec(&req).await.unwrap_err();
    assert_eq!(e.status(), Some(422));
    assert!(e.to_string().contains("/no/such/dir"));
    let e = c
        .exec(&ExecRequest::argv(["echo", "a\0b"]))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
    assert!(e.to_string().contains("NUL"));
    let mut req = ExecRequest::argv(["true"]);
    req.user = Some("no-such-user-xyz".into());
    assert_eq!(c.exec(&req).await.unwrap_err().status(), Some(400));

    let http = reqwest::Client::new();
    let post = |body: String| {
        http.post(a.url("/v1/exec"))
            .bearer_auth(berth_tests::TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    // Wrong JSON types name the field (400, never axum's 422).
    let r = post(r#"{"argv": "ls"}"#.into()).await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`argv`"),
        "{v}"
    );
    let r = post(r#"{"argv": ["true"], "timeout_ms": "soon"}"#.into())
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`timeout_ms`"),
        "{v}"
    );
    let r = post(r#"{"argv": ["true"], "bogus": 1}"#.into())
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = post("{not json".into()).await.unwrap();
    assert_eq!(r.status(), 400);
    let r = post(r#"{}"#.into()).await.unwrap();
    assert_eq!(r.status(), 400);
    let r = post(r#"{"argv": ["a"], "shell": "b"}"#.into())
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // A body past the JSON limit: 413.
    let huge = format!(
        r#"{{"argv": ["true"], "stdin": "{}"}}"#,
        "x".repeat(5 << 20)
    );
    let r = post(huge).await.unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "too_large");
}

#[tokio::test]
async fn a_background_command_is_replayed_in_full_after_its_follower_left() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let started = c
        .exec_background(&ExecRequest::shell(
            "for i in $(seq 1 50); do echo line $i; sleep 0.01; done; echo done >&2",
        ))
        .await
        .unwrap();
    // Follow briefly, then disconnect mid-stream.
    let mut f = c.follow_output(&started.id, 0, "").await.unwrap();
    let first = f.next().await.unwrap().unwrap();
    assert!(matches!(first, FollowMessage::Chunk(ref ch) if ch.seq == 0));
    drop(f);
    // The command carries on without anyone attached; the replay from 0 is complete.
    let (bytes, page) = c.output_all(&started.id, 0).await.unwrap();
    let expected: String = (1..=50).map(|i| format!("line {i}\n")).collect::<String>() + "done\n";
    assert_eq!(String::from_utf8(bytes).unwrap(), expected);
    assert_eq!(page.exit_code, Some(0));
    assert_eq!(page.next_seq, expected.len() as u64);
}

#[tokio::test]
async fn followers_get_chunks_then_the_exit_code_over_ws_and_sse() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let started = c
        .exec_background(&ExecRequest::shell("echo a; sleep 0.2; echo b; exit 3"))
        .await
        .unwrap();
    let mut f = c.follow_output(&started.id, 0, "").await.unwrap();
    let mut text = String::new();
    let mut exit = None;
    while let Some(m) = f.next().await {
        match m.unwrap() {
            FollowMessage::Chunk(ch) => text.push_str(ch.data.as_deref().unwrap()),
            FollowMessage::Exit { exit_code } => exit = exit_code,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(text, "a\nb\n");
    assert_eq!(exit, Some(3));

    let resp = reqwest::Client::new()
        .get(a.url(&format!(
            "/v1/commands/{}/output?from_seq=2&follow=true",
            started.id
        )))
        .bearer_auth(berth_tests::TOKEN)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let body = resp.text().await.unwrap();
    let data: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        data,
        vec![
            json!({"seq": 2, "stream": "stdout", "data": "b\n"}),
            json!({"exit_code": 3})
        ]
    );
}

#[tokio::test]
async fn a_long_poll_waits_for_new_output() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let mut req = ExecRequest::shell("read x; echo got $x");
    req.stdin_open = Some(true);
    let started = c.exec_background(&req).await.unwrap();
    let poll = {
        let c = c.clone();
        let id = started.id.clone();
        tokio::spawn(async move { c.output_wait(&id, 0).await })
    };
    c.stdin(
        &started.id,
        &StdinRequest {
            data: Some("it\n".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let page = poll.await.unwrap().unwrap();
    assert_eq!(page.chunks[0].data.as_deref(), Some("got it\n"));
}

#[tokio::test]
async fn a_burst_with_a_slow_and_a_fast_follower_blocks_nobody() {
    let a = AgentProcess::start().await;
    let c = a.client();
    // 10 MB of numbered lines, so any loss or reordering shows. The command waits for a line
    // on stdin so every follower is attached before the burst.
    let mut req = ExecRequest::shell("read go; seq 1 1250000 | awk '{printf \"%07d\\n\", $1}'");
    req.stdin_open = Some(true);
    let started = c.exec_background(&req).await.unwrap();
    let id = started.id.clone();
    let expected_len: u64 = 1_250_000 * 8;

    let fast = c.follow_output(&id, 0, "").await.unwrap();
    // Stalled: reads one message, then nothing for a while; its sends stall past 500 ms.
    let mut slow = follow_with_tiny_buffer(&a, &id, "&stall_ms=500").await;
    // Dead: never reads at all and would only be dropped after ten minutes. If followers could
    // hold up the command, the burst would not finish before that.
    let dead = follow_with_tiny_buffer(&a, &id, "&stall_ms=600000").await;
    c.stdin(
        &id,
        &StdinRequest {
            data: Some("go\n".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let fast_task = tokio::spawn(async move {
        let mut f = fast;
        let mut bytes = Vec::with_capacity(expected_len as usize);
        let mut exit = None;
        let mut next = 0u64;
        while let Some(m) = f.next().await {
            match m.unwrap() {
                FollowMessage::Chunk(ch) => {
                    assert_eq!(ch.seq, next, "fast follower saw a gap");
                    let b = ch.bytes();
                    next += b.len() as u64;
                    bytes.extend_from_slice(&b);
                }
                FollowMessage::Exit { exit_code } => exit = exit_code,
                other => panic!("fast follower got {other:?}"),
            }
        }
        (bytes, exit)
    });
    let first = next_message(&mut slow).await;
    let FollowMessage::Chunk(first) = first else {
        panic!("{first:?}")
    };
    // With stuck followers attached, the command still runs to its end.
    berth_tests::wait_state(&c, &id, CommandState::Exited, Duration::from_secs(60)).await;
    let (bytes, exit) = fast_task.await.unwrap();
    assert_eq!(exit, Some(0));
    assert_eq!(bytes.len() as u64, expected_len);
    let expected: String = (1..=1_250_000).map(|i| format!("{i:07}\n")).collect();
    assert!(bytes == expected.as_bytes(), "fast follower's bytes differ");

    // The agent gives up on the stalled follower (it is still not reading)…
    wait_for(
        "the stalled follower to be dropped",
        Duration::from_secs(30),
        || {
            let c = c.clone();
            let id = id.clone();
            async move { (c.command(&id).await.unwrap().lagged_followers == 1).then_some(()) }
        },
    )
    .await;
    // …and when it reads again it gets what was in flight, then the lagged notice.
    let mut seen = first.seq + first.bytes().len() as u64;
    let mut lagged_at = None;
    let mut ws = slow;
    while let Some(Ok(msg)) = ws.next().await {
        if let tokio_tungstenite::tungstenite::Message::Text(t) = msg {
            match serde_json::from_str::<FollowMessage>(&t).unwrap() {
                FollowMessage::Chunk(ch) => {
                    assert!(lagged_at.is_none(), "data after the lagged notice");
                    assert!(ch.seq <= seen, "stalled follower skipped bytes");
                    seen = ch.seq + ch.bytes().len() as u64;
                }
                FollowMessage::Lagged {
                    resume_from_seq, ..
                } => lagged_at = Some(resume_from_seq),
                other => panic!("stalled follower got {other:?} after seq {seen}"),
            }
        }
    }
    let resume = lagged_at.expect("the stalled follower was told it lagged");
    assert!(resume <= seen && resume < expected_len);
    // Resuming from there gives the rest, byte for byte.
    let (rest, page) = c.output_all(&id, resume).await.unwrap();
    assert!(page.done);
    assert!(rest[..] == expected.as_bytes()[resume as usize..]);
    assert_eq!(
        c.command(&id).await.unwrap().followers,
        1,
        "only the dead follower is left"
    );
    drop(dead);
}

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// A follower whose socket buffers are tiny, so a client that stops reading stalls the
/// agent's sends quickly (loopback buffers would otherwise swallow megabytes).
async fn follow_with_tiny_buffer(a: &AgentProcess, id: &str, query: &str) -> Ws {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let addr: std::net::SocketAddr = berth_tests::host_port(&a.base).parse().unwrap();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let stream = sock.connect(addr).await.unwrap();
    let url = format!("ws://{addr}/v1/commands/{id}/output?from_seq=0&follow=true{query}");
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", berth_tests::TOKEN).parse().unwrap(),
    );
    tokio_tungstenite::client_async(req, stream)
        .await
        .unwrap()
        .0
}

async fn next_message(ws: &mut Ws) -> FollowMessage {
    loop {
        match ws.next().await.unwrap().unwrap() {
            tokio_tungstenite::tungstenite::Message::Text(t) => {
                return serde_json::from_str(&t).unwrap();
            }
            _ => continue,
        }
    }
}

#[tokio::test]
async fn stdin_eof_and_signals_reach_a_background_command() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let mut req = ExecRequest::argv(["cat"]);
    req.stdin = Some("first\n".into());
    req.stdin_open = Some(true);
    let cat = c.exec_background(&req).await.unwrap();
    c.stdin(
        &cat.id,
        &StdinRequest {
            data_b64: Some(base64::engine::general_purpose::STANDARD.encode(b"\xffsecond\n")),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    c.stdin(
        &cat.id,
        &StdinRequest {
            eof: Some(true),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (bytes, page) = c.output_all(&cat.id, 0).await.unwrap();
    assert_eq!(bytes, b"first\n\xffsecond\n");
    assert_eq!(page.exit_code, Some(0));
    // stdin of a command started without it is a 409.
    let no_stdin = c
        .exec_background(&ExecRequest::argv(["sleep", "5"]))
        .await
        .unwrap();
    let e = c
        .stdin(
            &no_stdin.id,
            &StdinRequest {
                data: Some("x".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409));
    // Signals go to the process group.
    c.signal(&no_stdin.id, "TERM").await.unwrap();
    let (_, page) = c.output_all(&no_stdin.id, 0).await.unwrap();
    assert_eq!(page.exit_code, Some(128 + 15));
    let info = c.command(&no_stdin.id).await.unwrap();
    assert_eq!(info.signal.as_deref(), Some("TERM"));
    let e = c.signal(&no_stdin.id, "KILL").await.unwrap_err();
    assert_eq!(e.status(), Some(409), "signalling an exited command");
    let e = c.signal(&cat.id, "NOPE").await.unwrap_err();
    assert_eq!(e.status(), Some(400));
}

#[tokio::test]
async fn yield_ms_answers_with_the_output_so_far() {
    let a = AgentProcess::start().await;
    let mut req = ExecRequest::shell("echo quick");
    req.yield_ms = Some(5000);
    let r = a.client().exec_background(&req).await.unwrap();
    assert_eq!(r.done, Some(true));
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.chunks.unwrap()[0].data.as_deref(), Some("quick\n"));
    let mut req = ExecRequest::shell("echo partial; sleep 5");
    req.yield_ms = Some(300);
    let r = a.client().exec_background(&req).await.unwrap();
    assert_eq!(r.done, Some(false));
    assert_eq!(r.next_seq, Some(8));
}

#[tokio::test]
async fn a_client_chosen_id_makes_exec_idempotent() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let mut req = ExecRequest::shell("echo once >> ~/count; sleep 1");
    req.id = Some("run-42".into());
    let (x, y) = tokio::join!(c.exec_background(&req), c.exec_background(&req));
    let ok: Vec<_> = [x, y].into_iter().filter_map(Result::ok).collect();
    assert!(!ok.is_empty());
    assert!(ok.iter().all(|s| s.id == "run-42"));
    let again = c.exec_background(&req).await.unwrap();
    assert_eq!(again.id, "run-42");
    let (_, page) = c.output_all("run-42", 0).await.unwrap();
    assert!(page.done);
    assert_eq!(
        std::fs::read_to_string(a.home.join("count")).unwrap(),
        "once\n"
    );
    let mut bad = req.clone();
    bad.id = Some("../escape".into());
    assert_eq!(
        c.exec_background(&bad).await.unwrap_err().status(),
        Some(400)
    );
}

#[tokio::test]
async fn records_survive_reads_and_delete_kills_and_forgets() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let s = unique_sleep(100);
    let bg = c
        .exec_background(&ExecRequest::argv(["sleep", &s]))
        .await
        .unwrap();
    for _ in 0..3 {
        c.command(&bg.id).await.unwrap();
        c.output(&bg.id, 0).await.unwrap();
    }
    assert_eq!(
        c.commands()
            .await
            .unwrap()
            .commands
            .iter()
            .filter(|x| x.id == bg.id)
            .count(),
        1
    );
    c.delete_command(&bg.id).await.unwrap();
    assert!(processes_matching(&s).is_empty());
    assert_eq!(c.command(&bg.id).await.unwrap_err().status(), Some(404));
    assert!(!a.state_dir.join("commands").join(&bg.id).exists());
    assert_eq!(
        c.delete_command(&bg.id).await.unwrap_err().status(),
        Some(404)
    );
}

#[tokio::test]
async fn the_output_cap_drops_the_oldest_bytes_and_replays_say_so() {
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--output-cap".into(), "65536".into()],
        ..Default::default()
    })
    .await;
    let c = a.client();
    let bg = c
        .exec_background(&ExecRequest::shell(
            "seq 1 100000 | awk '{printf \"%06d\\n\", $1}'",
        ))
        .await
        .unwrap();
    berth_tests::wait_state(&c, &bg.id, CommandState::Exited, Duration::from_secs(30)).await;
    let (bytes, page) = c.output_all(&bg.id, 0).await.unwrap();
    let t = page.truncated_before_seq.expect("truncation reported");
    let total = 100_000 * 7;
    assert!(t > 0 && t < total);
    assert!((bytes.len() as u64) < 65536 * 2);
    assert_eq!(t + bytes.len() as u64, total);
    // The kept bytes are the true tail.
    let full: String = (1..=100_000).map(|i| format!("{i:06}\n")).collect();
    assert_eq!(&bytes[..], &full.as_bytes()[t as usize..]);
    let first = c.output(&bg.id, 0).await.unwrap();
    assert_eq!(first.truncated_before_seq, Some(t));
    assert_eq!(first.chunks[0].seq, t);
}

#[tokio::test]
async fn records_expire_after_the_ttl() {
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--command-ttl".into(), "1s".into()],
        ..Default::default()
    })
    .await;
    let c = a.client();
    let fg = c.exec(&ExecRequest::argv(["true"])).await.unwrap();
    let bg = c
        .exec_background(&ExecRequest::argv(["true"]))
        .await
        .unwrap();
    c.output_all(&bg.id, 0).await.unwrap();
    assert!(c.command(&fg.id).await.is_ok());
    for id in [&fg.id, &bg.id] {
        wait_for("the record to expire", Duration::from_secs(10), || {
            let c = c.clone();
            let id = id.clone();
            async move { (c.command(&id).await.err()?.status() == Some(404)).then_some(()) }
        })
        .await;
    }
    assert!(!a.state_dir.join("commands").join(&bg.id).exists());
    // The foreground store drops whole segments once they are past the TTL.
    berth_tests::wait_until(
        "expired store segments to go",
        Duration::from_secs(10),
        || {
            std::fs::read_dir(a.state_dir.join("foreground"))
                .map(|d| d.count() == 0)
                .unwrap_or(true)
        },
    );
}

#[tokio::test]
async fn foreground_records_survive_a_restart_and_deletes_stick() {
    let mut a = AgentProcess::start().await;
    let c = a.client();
    let kept = c
        .exec(&ExecRequest::shell("echo kept; echo warn >&2; exit 3"))
        .await
        .unwrap();
    let gone = c.exec(&ExecRequest::argv(["echo", "gone"])).await.unwrap();
    c.delete_command(&gone.id).await.unwrap();
    a.signal(nix::sys::signal::Signal::SIGTERM);
    a.wait_exit(Duration::from_secs(10));
    a.launch().await;
    let c = a.client();
    let info = c.command(&kept.id).await.unwrap();
    assert_eq!(info.state, CommandState::Exited);
    assert_eq!(info.exit_code, Some(3));
    let page = c.output(&kept.id, 0).await.unwrap();
    let of = |s: Stream| -> String {
        page.chunks
            .iter()
            .filter(|c| c.stream == s)
            .map(|c| c.data.clone().unwrap())
            .collect()
    };
    assert_eq!(of(Stream::Stdout), "kept\n");
    assert_eq!(of(Stream::Stderr), "warn\n");
    assert_eq!(c.command(&gone.id).await.unwrap_err().status(), Some(404));
}

#[tokio::test]
async fn large_foreground_output_spills_and_reads_back_whole() {
    let a = AgentProcess::start().await;
    let c = a.client();
    // 3 MB: past what a running foreground command keeps in memory.
    let r = c
        .exec(&ExecRequest::shell(
            "seq 1 400000 | awk '{printf \"%07d\\n\", $1}'; echo end >&2",
        ))
        .await
        .unwrap();
    let expected: String = (1..=400_000).map(|i| format!("{i:07}\n")).collect();
    // Past the inline bound the answer carries a preview of both ends and where the rest is.
    assert_eq!(r.stdout, None);
    let p = r.stdout_preview.as_ref().expect("a preview");
    assert_eq!(p.bytes, expected.len() as u64);
    let lines =
        |from: usize, to: usize| -> String { (from..=to).map(|i| format!("{i:07}\n")).collect() };
    assert_eq!(p.head, lines(1, 20));
    assert_eq!(p.tail, lines(399_961, 400_000));
    assert_eq!(p.omitted_bytes, (expected.len() - 60 * 8) as u64);
    assert_eq!(r.stderr.as_deref(), Some("end\n"));
    assert!(r.output_truncated);
    assert_eq!(
        r.output_href.as_deref(),
        Some(format!("/v1/commands/{}/output", r.id).as_str())
    );
    // Below the bound everything is inline, as before.
    let small = c
        .exec(&ExecRequest::shell(
            "head -c 1048576 /dev/zero | tr '\\0' x",
        ))
        .await
        .unwrap();
    assert_eq!(small.stdout.as_deref().map(str::len), Some(1 << 20));
    assert!(small.stdout_preview.is_none() && !small.output_truncated);
    // Read back page by page; the two pipes carry no order between them, so compare per stream.
    let (mut out, mut err, mut seq) = (Vec::new(), Vec::new(), 0);
    loop {
        let page = c.output(&r.id, seq).await.unwrap();
        for ch in &page.chunks {
            match ch.stream {
                Stream::Stdout => out.extend(ch.bytes()),
                Stream::Stderr => err.extend(ch.bytes()),
            }
        }
        seq = page.next_seq;
        if page.done {
            assert_eq!(page.exit_code, Some(0));
            break;
        }
    }
    assert!(out == expected.as_bytes());
    assert_eq!(err, b"end\n");
    assert!(
        a.state_dir
            .join("commands")
            .join(&r.id)
            .join("output.log")
            .exists()
    );
}

#[tokio::test]
async fn commands_run_as_another_account_when_asked() {
    let Some(user) = berth_tests::test_account("berthtest") else {
        return;
    };
    let name = "berthtest";
    let a = AgentProcess::start().await;
    let mut req = ExecRequest::shell("id -u; echo $HOME; pwd");
    req.user = Some(name.into());
    let r = a.client().exec(&req).await.unwrap();
    assert_eq!(
        r.stdout.as_deref().unwrap(),
        format!("{}\n/home/berthtest\n/home/berthtest\n", user.uid)
    );
    // Uploaded files belong to the sandbox user (here: the agent's own), not to whoever asked.
    let mut bg = ExecRequest::shell("id -u");
    bg.user = Some(name.into());
    let started = a.client().exec_background(&bg).await.unwrap();
    let (bytes, _) = a.client().output_all(&started.id, 0).await.unwrap();
    assert_eq!(String::from_utf8(bytes).unwrap(), format!("{}\n", user.uid));
}

#[tokio::test]
async fn with_user_everything_runs_and_lands_as_that_account() {
    let name = "berthsandbox";
    let Some(user) = berth_tests::test_account(name) else {
        return;
    };
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--user".into(), name.into()],
        home: Some(user.dir.clone()),
        ..Default::default()
    })
    .await;
    let c = a.client();
    let uid = user.uid.as_raw();
    // Foreground, background, compat and terminal commands all run as the account.
    let r = c.exec(&ExecRequest::shell("id -u; id -G")).await.unwrap();
    let out = r.stdout.unwrap();
    assert!(out.starts_with(&format!("{uid}\n")), "{out}");
    let bg = c
        .exec_background(&ExecRequest::shell("id -u"))
        .await
        .unwrap();
    let (bytes, _) = c.output_all(&bg.id, 0).await.unwrap();
    assert_eq!(String::from_utf8(bytes).unwrap(), format!("{uid}\n"));
    let v: Value = reqwest::Client::new()
        .post(a.url("/execute"))
        .json(&json!({"command": ["id", "-u"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["output"], format!("{uid}\n"));
    let pty = c
        .pty_create(&berth_protocol::PtyRequest {
            cmd: Some(vec!["sh".into(), "-c".into(), "id -u".into()]),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut ws = c.pty_attach(&pty.id).await.unwrap();
    let mut text = String::new();
    while let Some(Ok(m)) = ws.next().await {
        if let tokio_tungstenite::tungstenite::Message::Binary(b) = m {
            text.push_str(&String::from_utf8_lossy(&b));
        }
    }
    assert_eq!(text.trim(), uid.to_string());
    // What the agent writes belongs to the account.
    use std::os::unix::fs::MetadataExt;
    c.upload("~/deep/up.txt", reqwest::Body::from("x"), None)
        .await
        .unwrap();
    for p in ["deep", "deep/up.txt"] {
        let m = std::fs::metadata(a.home.join(p)).unwrap();
        assert_eq!(m.uid(), uid, "{p} owned by the sandbox user");
    }
}

#[tokio::test]
async fn finished_commands_hold_no_descriptors() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", a.pid()))
            .unwrap()
            .count()
    };
    c.exec(&ExecRequest::argv(["true"])).await.unwrap();
    let before = fds();
    for i in 0..200 {
        let script = format!("echo out {i}; echo err {i} >&2");
        if i % 2 == 0 {
            c.exec(&ExecRequest::shell(script)).await.unwrap();
        } else {
            let bg = c
                .exec_background(&ExecRequest::shell(script))
                .await
                .unwrap();
            c.output_all(&bg.id, 0).await.unwrap();
        }
    }
    // Records stay readable after their descriptors are gone.
    assert_eq!(c.commands().await.unwrap().commands.len(), 201);
    let after = fds();
    assert!(
        after <= before + 8,
        "descriptors grew from {before} to {after} over 200 commands"
    );
}

#[tokio::test]
async fn a_json_body_declared_another_type_is_415_and_the_agent_lives() {
    let a = AgentProcess::start().await;
    let http = reqwest::Client::new();
    let body = r#"{"argv": ["true"]}"#;
    for ct in [
        "text/plain",
        "application/xml",
        "multipart/form-data; boundary=x",
    ] {
        let r = http
            .post(a.url("/v1/exec"))
            .bearer_auth(berth_tests::TOKEN)
            .header("content-type", ct)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 415, "{ct:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "unsupported_media_type", "{ct:?}: {v}");
        assert!(v["error"]["message"].is_string(), "{ct:?}: {v}");
        assert!(berth_tests::pid_alive(a.pid()), "agent died on {ct:?}");
    }
    assert!(a.client().commands().await.unwrap().commands.is_empty());
    // JSON with parameters, a `+json` type, and JSON as `curl -d` sends it (labelled a form,
    // or with no type: what the controller relays from such a client) are read.
    for ct in [
        Some("application/json; charset=utf-8"),
        Some("application/vnd.berth+json"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let mut rb = http
            .post(a.url("/v1/exec"))
            .bearer_auth(berth_tests::TOKEN)
            .body(body);
        if let Some(ct) = ct {
            rb = rb.header("content-type", ct);
        }
        let r = rb.send().await.unwrap();
        assert_eq!(r.status(), 200, "{ct:?}");
        assert_eq!(r.json::<Value>().await.unwrap()["exit_code"], 0, "{ct:?}");
    }
}
