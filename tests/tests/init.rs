//! `berth-agent init`, PID 1 of the images: it restarts a dead agent (whose running commands
//! the next agent re-adopts) and turns SIGTERM into a full shutdown.

use std::process::{Command, Stdio};
use std::time::Duration;

use berth_protocol::{AgentClient, CommandState, ExecRequest};
use berth_tests::{TOKEN, pid_alive, processes_matching, unique_sleep, wait_for, workspace_bin};

fn endpoints(state: &std::path::Path) -> Option<(String, i32)> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("endpoints.json")).ok()?).ok()?;
    Some((
        format!("http://{}", v["listen"].as_str()?),
        v["pid"].as_i64()? as i32,
    ))
}

#[tokio::test]
async fn init_restarts_a_killed_agent_which_readopts_commands_and_sigterm_ends_everything() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(dir.path().join("home")).unwrap();
    let mut init = Command::new(workspace_bin("berth-agent"))
        .arg("init")
        .args(["--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&state)
        .arg("--home")
        .arg(dir.path().join("home"))
        .env("BERTH_AGENT_TOKEN", TOKEN)
        .env("BERTH_AGENT_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let (base, first) = wait_for("the agent to start", Duration::from_secs(20), || async {
        endpoints(&state)
    })
    .await;
    let agent = AgentClient::new(base, Some(TOKEN.into()));
    agent.wait_healthy(Duration::from_secs(10)).await.unwrap();
    let sleep = unique_sleep(300);
    let mut req = ExecRequest::argv(["sleep", sleep.as_str()]).background();
    req.id = Some("keeps-running".into());
    agent.exec_background(&req).await.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let (base, second) = wait_for(
        "init to start the agent again",
        Duration::from_secs(20),
        || async { endpoints(&state).filter(|(_, pid)| *pid != first && pid_alive(*pid as u32)) },
    )
    .await;
    let agent = AgentClient::new(base, Some(TOKEN.into()));
    agent.wait_healthy(Duration::from_secs(10)).await.unwrap();
    let info = agent.command("keeps-running").await.unwrap();
    assert_eq!(info.state, CommandState::Running, "re-adopted");
    assert!(!processes_matching(&sleep).is_empty());
    // docker stop: SIGTERM to PID 1 is a full shutdown.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_for("init to exit", Duration::from_secs(30), || {
        let s = init.try_wait().unwrap();
        async move { s }
    })
    .await;
    assert!(status.success(), "{status}");
    assert!(!pid_alive(second as u32));
    assert!(
        processes_matching(&sleep).is_empty(),
        "the command tree died with the shutdown"
    );
}
