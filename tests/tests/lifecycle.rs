//! The agent's lifecycle with real processes: a crash (`kill -9`) and a SIGTERM restart keep
//! background commands running and the next agent re-adopts them with their real exit status;
//! SIGINT and `POST /v1/shutdown` leave nothing behind.

use std::time::Duration;

use berth_protocol::{CommandState, ExecRequest, PtyRequest};
use berth_tests::{
    AgentProcess, processes_matching, unique_sleep, wait_for, wait_state, wait_until,
};
use nix::sys::signal::Signal;

fn output_len(a: &AgentProcess, id: &str) -> u64 {
    std::fs::metadata(a.state_dir.join("commands").join(id).join("output.log"))
        .map(|m| m.len())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_command_survives_kill_9_of_the_agent_and_is_readopted_with_its_exit_code() {
    let mut a = AgentProcess::start().await;
    let c = a.client();
    // Ticks until the test creates `stop`, so it is certainly still running when the next
    // agent adopts it; every tick is numbered, so a lost byte shows as a gap.
    let stop = a.home.join("stop");
    let script = format!(
        "i=0; while [ ! -e '{}' ]; do i=$((i+1)); echo tick $i; sleep 0.02; done; \
         echo bye >&2; exit 7",
        stop.display()
    );
    let started = c
        .exec_background(&ExecRequest::shell(script))
        .await
        .unwrap();
    let id = started.id.clone();
    wait_for("the first ticks", Duration::from_secs(10), || {
        let c = c.clone();
        let id = id.clone();
        async move { (c.output(&id, 0).await.ok()?.next_seq > 0).then_some(()) }
    })
    .await;

    a.kill9();
    // With no agent at all, the command keeps running and its output keeps being recorded.
    let at_kill = output_len(&a, &id);
    wait_until(
        "output written while the agent is down",
        Duration::from_secs(10),
        || output_len(&a, &id) > at_kill,
    );

    a.launch().await;
    let c = a.client();
    let info = c.command(&id).await.unwrap();
    assert_eq!(info.state, CommandState::Running, "{info:?}");
    // The adopted command's live output still reaches the new agent.
    let adopted_at = info.output_bytes;
    wait_for("output after re-adoption", Duration::from_secs(10), || {
        let c = c.clone();
        let id = id.clone();
        async move { (c.output(&id, 0).await.ok()?.next_seq > adopted_at).then_some(()) }
    })
    .await;

    std::fs::write(&stop, "").unwrap();
    let info = wait_state(&c, &id, CommandState::Exited, Duration::from_secs(10)).await;
    assert_eq!(info.exit_code, Some(7));
    let (bytes, page) = c.output_all(&id, 0).await.unwrap();
    assert_eq!(page.exit_code, Some(7));
    let text = String::from_utf8(bytes).unwrap();
    let ticks = text.lines().count() - 1;
    assert!(ticks > 1, "{text}");
    let expected: String = (1..=ticks)
        .map(|i| format!("tick {i}\n"))
        .collect::<String>()
        + "bye\n";
    assert_eq!(text, expected);
    // The end is on the timeline once.
    let events = c.events(0).await.unwrap().events;
    let exits = events
        .iter()
        .filter(|e| e.kind == "command.exited" && e.data["id"] == id)
        .count();
    assert_eq!(exits, 1);
}

#[tokio::test]
async fn a_command_that_ends_while_no_agent_runs_is_reported_when_one_returns() {
    let mut a = AgentProcess::start().await;
    let c = a.client();
    let started = c
        .exec_background(&ExecRequest::shell("sleep 0.3; echo finished; exit 5"))
        .await
        .unwrap();
    a.kill9();
    let exit_file = a.state_dir.join("commands").join(&started.id).join("exit");
    wait_until(
        "the shim to record the exit",
        Duration::from_secs(10),
        || exit_file.exists(),
    );
    a.launch().await;
    let c = a.client();
    let info = c.command(&started.id).await.unwrap();
    assert_eq!(info.state, CommandState::Exited);
    assert_eq!(info.exit_code, Some(5));
    let (bytes, _) = c.output_all(&started.id, 0).await.unwrap();
    assert_eq!(bytes, b"finished\n");
    let events = c.events(0).await.unwrap().events;
    let exited = events
        .iter()
        .find(|e| e.kind == "command.exited" && e.data["id"] == started.id.as_str())
        .expect("exit reported after the restart");
    assert_eq!(exited.data["exit_code"], 5);
}

#[tokio::test]
async fn sigterm_is_a_restart_that_keeps_background_commands() {
    let mut a = AgentProcess::start().await;
    let c = a.client();
    let s = unique_sleep(100);
    let bg = c
        .exec_background(&ExecRequest::argv(["sleep", &s]))
        .await
        .unwrap();
    let fg_sleep = unique_sleep(100);
    let fg = {
        let c = c.clone();
        let fg_sleep = fg_sleep.clone();
        tokio::spawn(async move { c.exec(&ExecRequest::argv(["sleep", &fg_sleep])).await })
    };
    wait_for("the foreground command", Duration::from_secs(5), || async {
        (!processes_matching(&fg_sleep).is_empty()).then_some(())
    })
    .await;
    a.signal(Signal::SIGTERM);
    let status = a.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "SIGTERM exit: {status}");
    // The foreground request ends with the agent: its connection drops, or (when the answer
    // is written before the runtime stops) it reports the command killed.
    match fg.await.unwrap() {
        Err(_) => {}
        Ok(r) => assert!(
            r.signal.is_some(),
            "a foreground command outlived SIGTERM: {r:?}"
        ),
    }
    assert_eq!(
        processes_matching(&s).len(),
        1,
        "the background command still runs"
    );
    assert!(
        processes_matching(&fg_sleep).is_empty(),
        "foreground commands die with the agent"
    );

    a.launch().await;
    let c = a.client();
    let info = c.command(&bg.id).await.unwrap();
    assert_eq!(info.state, CommandState::Running);
    c.signal(&bg.id, "KILL").await.unwrap();
    let (_, page) = c.output_all(&bg.id, 0).await.unwrap();
    assert_eq!(page.exit_code, Some(128 + 9));
}

/// Starts a spread of process trees: a background command, one that leaves a daemon in its
/// own session, a launched program, a terminal, and a foreground command in flight.
async fn start_everything(a: &AgentProcess) -> Vec<String> {
    let c = a.client();
    let sleeps: Vec<String> = (0..5).map(|_| unique_sleep(200)).collect();
    c.exec_background(&ExecRequest::argv(["sleep", &sleeps[0]]))
        .await
        .unwrap();
    c.exec_background(&ExecRequest::shell(format!(
        "setsid sleep {} > /dev/null 2>&1 < /dev/null & echo daemon started",
        sleeps[1]
    )))
    .await
    .unwrap();
    reqwest::Client::new()
        .post(a.url("/setup/launch"))
        .json(&serde_json::json!({"command": ["sleep", sleeps[2]]}))
        .send()
        .await
        .unwrap();
    c.pty_create(&PtyRequest {
        cmd: Some(vec!["sleep".into(), sleeps[3].clone()]),
        ..Default::default()
    })
    .await
    .unwrap();
    let fg = sleeps[4].clone();
    tokio::spawn(async move { c.exec(&ExecRequest::argv(["sleep", &fg])).await });
    for s in &sleeps {
        wait_for("every tree to start", Duration::from_secs(10), || async {
            (!processes_matching(s).is_empty()).then_some(())
        })
        .await;
    }
    sleeps
}

#[tokio::test]
async fn sigint_is_a_full_shutdown_that_leaves_nothing() {
    let mut a = AgentProcess::start().await;
    let sleeps = start_everything(&a).await;
    a.signal(Signal::SIGINT);
    let status = a.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "SIGINT exit: {status}");
    for s in &sleeps {
        assert!(
            processes_matching(s).is_empty(),
            "sleep {s} survived the shutdown"
        );
    }
    assert!(a.live_supervisors().is_empty(), "a shim survived");
}

#[tokio::test]
async fn post_shutdown_is_a_full_shutdown_even_after_a_restart() {
    let mut a = AgentProcess::start().await;
    let sleeps = start_everything(&a).await;
    // Restart first, so the shims are no longer the agent's descendants.
    a.signal(Signal::SIGTERM);
    a.wait_exit(Duration::from_secs(10));
    a.launch().await;
    let r = a.client().shutdown().await.unwrap();
    assert_eq!(r["shutting_down"], true);
    let status = a.wait_exit(Duration::from_secs(20));
    assert!(status.success());
    for s in &sleeps {
        assert!(
            processes_matching(s).is_empty(),
            "sleep {s} survived the shutdown"
        );
    }
}

#[tokio::test]
async fn a_shim_killed_without_recording_an_exit_makes_the_command_lost() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let s = unique_sleep(100);
    let bg = c
        .exec_background(&ExecRequest::argv(["sleep", &s]))
        .await
        .unwrap();
    let shims = a.live_supervisors();
    assert_eq!(shims.len(), 1);
    for p in berth_tests::processes_with_root(shims[0]) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p as i32), Signal::SIGKILL);
    }
    let info = wait_for("the command to be lost", Duration::from_secs(10), || {
        let c = c.clone();
        let id = bg.id.clone();
        async move {
            let i = c.command(&id).await.ok()?;
            (i.state == CommandState::Lost).then_some(i)
        }
    })
    .await;
    assert_eq!(info.exit_code, None);
    let page = c.output(&bg.id, 0).await.unwrap();
    assert!(page.done, "nothing more will come from a lost command");
}

#[tokio::test]
async fn deleting_a_finished_command_ends_the_daemon_it_left() {
    let a = AgentProcess::start().await;
    let c = a.client();
    let s = unique_sleep(200);
    let bg = c
        .exec_background(&ExecRequest::shell(format!(
            "setsid sleep {s} > /dev/null 2>&1 < /dev/null &"
        )))
        .await
        .unwrap();
    let (_, page) = c.output_all(&bg.id, 0).await.unwrap();
    assert_eq!(page.exit_code, Some(0));
    wait_until(
        "the daemon to outlive its command",
        Duration::from_secs(10),
        || processes_matching(&s).len() == 1,
    );
    c.delete_command(&bg.id).await.unwrap();
    wait_until("the daemon to end", Duration::from_secs(10), || {
        processes_matching(&s).is_empty()
    });
}
