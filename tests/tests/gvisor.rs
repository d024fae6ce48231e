//! A second kernel when asked: `[runtime] ide = "runsc"` runs the profile's Docker containers
//! under gVisor (Debian's `runsc`, registered with the daemon by `tests/setup.sh`). What works
//! under it here is what berth ships it for: commands, files and terminals through the
//! controller, each checked to run on gVisor's kernel and not the host's. (The desktop profile
//! starts but is never ready under this runsc: see the gVisor runtime in docs/src/controller/providers.md.)

use berth_protocol::PtyRequest;
use berth_tests::controller::{ControllerProcess, Provider, shell};
use futures_util::SinkExt;
use tokio_tungstenite::tungstenite::Message;

/// Whether the daemon has the runtime (`tests/setup.sh` registers it; elsewhere the suite says
/// so and fails, rather than pass without having run).
fn daemon_has_runsc() -> bool {
    let out = std::process::Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes}}"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("\"runsc\"")
}

#[tokio::test]
async fn an_ide_sandbox_under_runsc_runs_commands_files_and_a_terminal_on_gvisors_kernel() {
    assert!(
        daemon_has_runsc(),
        "the Docker daemon has no runsc runtime: run tests/setup.sh (it registers it)"
    );
    let c = ControllerProcess::start_on(Provider::Docker, "[runtime]\nide = \"runsc\"\n").await;
    let cl = c.client();
    let sb = cl.create(&berth_tests::controller::ide()).await.unwrap();
    assert_eq!(sb.status, "running", "{sb:?}");
    let runtime = berth_tests::egress::docker(&[
        "inspect",
        "-f",
        "{{.HostConfig.Runtime}}",
        &format!("berth-{}", sb.id),
    ]);
    assert_eq!(runtime, "runsc");
    // gVisor's kernel, not the host's: its own version and boot messages.
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let run = cl
        .exec(
            &sb.id,
            &shell("uname -r; dmesg 2>/dev/null | head -1; echo done"),
        )
        .await
        .unwrap();
    println!("{run:?}");
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_ne!(lines[0], host.trim(), "the host's kernel answered: {run:?}");
    assert!(run.stdout.contains("gVisor"), "{run:?}");
    assert_eq!(lines.last(), Some(&"done"));

    // Files, through the controller.
    let agent = cl.agent(&sb.id);
    let body: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
    agent
        .upload(
            "~/under-gvisor.bin",
            reqwest::Body::from(body.clone()),
            None,
        )
        .await
        .unwrap();
    let back = agent
        .download("~/under-gvisor.bin")
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(
        back.as_ref() == body.as_slice(),
        "the file came back changed"
    );
    let run = cl
        .exec(&sb.id, &shell("sha256sum ~/under-gvisor.bin | cut -c1-16"))
        .await
        .unwrap();
    assert_eq!(run.exit_code, Some(0), "{run:?}");

    // A terminal: typed into and read back, its exit code reported.
    let pty = agent
        .pty_create(&PtyRequest {
            cols: Some(90),
            rows: Some(20),
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
    let text = berth_tests::read_terminal_until(&mut term, "typed-42").await;
    assert!(text.contains("20 90"), "{text:?}");
    term.send(Message::Binary(b"exit 4\n".to_vec().into()))
        .await
        .unwrap();
    assert_eq!(berth_tests::terminal_exit_code(&agent, &pty.id).await, 4);
    cl.delete(&sb.id).await.unwrap();
}
