//! The controller on the Docker provider: sandboxes as containers of the desktop image on a
//! private network, with the same guarantees as local processes — readiness, leases, pools,
//! reconciliation after a `kill -9`, `docker kill` noticed at once, no untracked container.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use berth_protocol::controller::{AcquireLease, CreateSandbox, RunRequest};
use berth_tests::controller::{ControllerProcess, ide, shell};
use berth_tests::wait_for;

/// The desktop image (`tests/test.sh` builds it; a build here finds it in under a second).
fn image() -> String {
    let built = berth_tests::controller::build_desktop_image().unwrap();
    built["image_ref"].as_str().unwrap().to_string()
}

async fn on_docker(extra: &str) -> ControllerProcess {
    ControllerProcess::start(&format!(
        "docker_image = \"{}\"\n{extra}[providers]\ndesktop = \"docker\"\nide = \"docker\"\n",
        image()
    ))
    .await
}

#[tokio::test]
async fn a_docker_desktop_is_strictly_ready_runs_as_the_user_and_its_delete_removes_the_container()
{
    let c = on_docker("").await;
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "desktop".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sb.status, "running");
    assert!(
        sb.image_ref.starts_with("berth-desktop:"),
        "{}",
        sb.image_ref
    );
    assert_eq!(c.containers().len(), 1);
    let run = cl
        .exec(&sb.id, &shell("id -un; echo $DISPLAY"))
        .await
        .unwrap();
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    assert!(run.stdout.starts_with("user\n:"), "{run:?}");
    let png = cl.screenshot(&sb.id).await.unwrap();
    assert_eq!(&png[1..4], b"PNG");
    // The compat surface and CDP on loopback ports published for harnesses on this host.
    let compat = sb.endpoints.compat.clone().unwrap();
    assert!(compat.starts_with("http://127.0.0.1:"), "{compat}");
    let shot = reqwest::get(format!("{compat}/screenshot")).await.unwrap();
    assert_eq!(shot.status(), 200);
    assert_eq!(&shot.bytes().await.unwrap()[1..4], b"PNG");
    let cdp = sb.endpoints.cdp.clone().unwrap();
    assert!(cdp.starts_with("http://127.0.0.1:"), "{cdp}");
    let v: serde_json::Value = reqwest::get(format!("{cdp}/json/version"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v["Browser"].as_str().unwrap().contains("Chrome"));
    // The agent's token reached the agent and nothing the sandbox user can read.
    let env = Command::new("docker")
        .args(["inspect", "-f", "{{range .Config.Env}}{{println .}}{{end}}"])
        .arg(format!("berth-{}", sb.id))
        .output()
        .unwrap();
    let env = String::from_utf8_lossy(&env.stdout).into_owned();
    let token = env
        .lines()
        .find_map(|l| l.strip_prefix("BERTH_AGENT_TOKEN="))
        .expect("the token is delivered at create")
        .to_string();
    assert!(token.len() >= 32, "{token}");
    // Not in any process's environment or command line the user can read…
    let look = cl
        .exec(
            &sb.id,
            &shell(
                "env; for p in /proc/[0-9]*; do cat $p/environ $p/cmdline; done 2>/dev/null; true",
            ),
        )
        .await
        .unwrap();
    assert_eq!(look.exit_code, Some(0), "{look:?}");
    assert!(
        !look.stdout.contains(&token) && look.stdout.contains("HOME="),
        "the sandbox user can read the agent's token: {look:?}"
    );
    // … nor in any file the user can read.
    let grep = Command::new("docker")
        .args(["exec", "-u", "user", &format!("berth-{}", sb.id)])
        .args(["grep", "-rlsF", "--", &token])
        .args([
            "/var",
            "/tmp",
            "/home",
            "/etc",
            "/run",
            "/opt",
            "/usr/local",
        ])
        .output()
        .unwrap();
    // grep: 1 = no match, 2 = no match and some paths unreadable (they are not the user's).
    assert!(
        matches!(grep.status.code(), Some(1 | 2)) && grep.stdout.is_empty(),
        "readable by the user: {}",
        String::from_utf8_lossy(&grep.stdout)
    );
    cl.delete(&sb.id).await.unwrap();
    assert!(c.containers().is_empty(), "{:?}", c.containers());
}

#[tokio::test]
async fn docker_kill_fails_the_sandbox_at_once_and_its_lease_reprovisions() {
    let c = on_docker("").await;
    let cl = c.client();
    let acquire = AcquireLease {
        thread_id: "docker-thread".into(),
        profile: "ide".into(),
        ..Default::default()
    };
    let a = cl.acquire(&acquire).await.unwrap();
    let run = cl
        .exec(&a.sandbox.id, &shell("git --version"))
        .await
        .unwrap();
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    let killed = Command::new("docker")
        .args(["kill", &format!("berth-{}", a.sandbox.id)])
        .output()
        .unwrap();
    assert!(killed.status.success());
    let failed = wait_for(
        "the sandbox to be failed",
        Duration::from_secs(10),
        || async {
            let s = cl.get(&a.sandbox.id).await.unwrap();
            (s.status == "failed").then_some(s)
        },
    )
    .await;
    assert!(failed.error.unwrap().contains("container died"));
    let b = cl.acquire(&acquire).await.unwrap();
    assert_eq!(b.lease_id, a.lease_id);
    assert_ne!(b.sandbox.id, a.sandbox.id);
    assert_eq!(b.sandbox.status, "running");
    cl.release(&b.lease_id).await.unwrap();
    wait_for("every container to go", Duration::from_secs(30), || async {
        c.containers().is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_controller_killed_during_docker_creates_leaves_no_untracked_container() {
    let mut c = on_docker("orphan_grace_secs = 0\n").await;
    let cl = c.client();
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(cl.create_nowait(&ide()).await.unwrap().id);
    }
    c.kill9();
    c.launch();
    let cl = c.client();
    for id in &ids {
        let sb = wait_for("the sandbox to settle", Duration::from_secs(60), || async {
            let sb = cl.get(id).await.unwrap();
            matches!(sb.status.as_str(), "running" | "failed").then_some(sb)
        })
        .await;
        if sb.status == "running" {
            let run = cl.exec(id, &shell("echo adopted")).await.unwrap();
            // The whole run: an empty stdout of an `exited` run (its output recorded before it
            // was read) and of a `failed` one (its start answered in error) are not one bug.
            assert_eq!(
                (run.status.as_str(), run.exit_code, run.stdout.as_str()),
                ("exited", Some(0), "adopted\n"),
                "{run:?}"
            );
        }
    }
    // Every labelled container is one the store has as live.
    let live: BTreeSet<String> = cl
        .list(&[])
        .await
        .unwrap()
        .sandboxes
        .iter()
        .filter(|s| s.status == "running")
        .map(|s| format!("berth-{}", s.id))
        .collect();
    wait_for(
        "no untracked container",
        Duration::from_secs(30),
        || async {
            let out = Command::new("docker")
                .args(["ps", "-a", "--format", "{{.Names}}", "--filter"])
                .arg(format!("label=berth.controller={}", c.id))
                .output()
                .unwrap();
            let names: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(String::from)
                .collect();
            (names == live).then_some(())
        },
    )
    .await;
    for id in &ids {
        cl.delete(id).await.unwrap();
    }
    assert!(c.containers().is_empty());
}

#[tokio::test]
async fn an_agent_killed_inside_its_container_is_restarted_by_init_and_its_run_finishes() {
    let c = on_docker("").await;
    let cl = c.client();
    let sb = cl.create(&ide()).await.unwrap();
    let run = cl
        .exec(
            &sb.id,
            &RunRequest {
                wait: Some(false),
                run_id: Some("outlives-the-agent".into()),
                ..shell("sleep 3; echo survived; exit 5")
            },
        )
        .await
        .unwrap();
    assert_eq!(run.status, "running");
    // Kill the agent (not init, PID 1) inside the container.
    let killed = Command::new("docker")
        .args(["exec", &format!("berth-{}", sb.id), "sh", "-c"])
        .arg("kill -9 $(pgrep -f '^/usr/local/bin/berth-agent --listen')")
        .output()
        .unwrap();
    assert!(
        killed.status.success(),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    let done = wait_for("the run to finish", Duration::from_secs(60), || async {
        let r = cl.run(&sb.id, "outlives-the-agent").await.unwrap();
        r.done().then_some(r)
    })
    .await;
    assert_eq!(
        (done.status.as_str(), done.exit_code),
        ("exited", Some(5)),
        "{done:?}"
    );
    assert_eq!(done.stdout, "survived\n");
    assert_eq!(
        cl.get(&sb.id).await.unwrap().status,
        "running",
        "the container lived on"
    );
    cl.delete(&sb.id).await.unwrap();
}
