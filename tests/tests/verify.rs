//! `berth verify desktop-osworld` against a real `berth serve` on the Docker provider with the
//! desktop image: it passes on a fresh deployment and deletes its sandbox; it fails, naming the
//! check, on a sandbox whose accessibility bus the supervisor gave up on; Ctrl-C still deletes.
//! On the osworld image (GNOME) every fidelity row passes on a fresh sandbox, and a difference
//! introduced into one is named.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use berth_protocol::controller::{Command as RunCommand, RunRequest};
use berth_protocol::controller::{ControllerClient, CreateSandbox};
use berth_tests::controller::{API_KEY, ControllerProcess, Provider, build_image};
use berth_tests::{wait_for, workspace_bin};
use serde_json::Value;

/// Every row the contract asks for, in the order they run.
const CHECKS: &[&str] = &[
    "sandbox",
    "platform",
    "screen_size",
    "screenshot",
    "python platform",
    "pyautogui moveTo",
    "cursor_position",
    "setup/upload",
    "file",
    "list_directory",
    "recording",
    "accessibility",
    "cdp /json/version",
    "desktop state",
];

/// `berth verify desktop-osworld ARGS` with only `env` of the client variables set.
fn verify(args: &[&str], env: &[(&str, &str)]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(workspace_bin("berth"));
    cmd.args(["verify", "desktop-osworld"])
        .args(args)
        .env("BERTH_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for var in [
        "BERTH_URL",
        "BERTH_API_KEY",
        "SANDBOX_GATEWAY_URL",
        "SANDBOX_API_KEY",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

async fn finished(cmd: tokio::process::Child) -> Output {
    tokio::time::timeout(Duration::from_secs(600), cmd.wait_with_output())
        .await
        .expect("verify ends within 10 minutes")
        .unwrap()
}

fn report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "--json prints only the report ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn names(report: &Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

fn has_event(events: &Value, kind: &str, component: &str) -> bool {
    events["events"].as_array().is_some_and(|e| {
        e.iter()
            .any(|e| e["kind"] == kind && e["component"] == component)
    })
}

#[tokio::test]
async fn verify_passes_against_a_fresh_deployment_and_deletes_its_sandbox() {
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let out = finished(
        verify(&["--url", &c.base, "--key", API_KEY, "--json"], &[])
            .spawn()
            .unwrap(),
    )
    .await;
    let report = report(&out);
    let failed: Vec<&Value> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] != true)
        .collect();
    assert!(
        failed.is_empty(),
        "failed checks: {failed:#?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(report["passed"], true);
    let mut expected: Vec<String> = CHECKS.iter().map(|s| s.to_string()).collect();
    // The XFCE image states no expected desktop: one passing row says so.
    expected.push("fidelity".into());
    expected.push("delete".into());
    assert_eq!(names(&report), expected);
    for row in report["checks"].as_array().unwrap() {
        assert!(row["ms"].is_u64(), "{row}");
    }
    // Its sandbox is gone, container and all.
    let id = report["sandbox"].as_str().unwrap();
    assert_eq!(c.client().get(id).await.unwrap().status, "stopped");
    assert!(c.leftovers(id).is_empty(), "{:?}", c.leftovers(id));
}

#[tokio::test]
async fn verify_fails_naming_accessibility_on_a_sandbox_whose_accessibility_bus_was_killed() {
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "desktop".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    // Killed each time it comes back until the supervisor gives up on it (5 crashes in a row).
    let container = format!("berth-{}", sb.id);
    wait_for(
        "the supervisor to give up on a11y-bus",
        Duration::from_secs(120),
        || async {
            let _ = Command::new("docker")
                .args([
                    "exec",
                    &container,
                    "pkill",
                    "-KILL",
                    "-f",
                    "at-spi-bus-launcher",
                ])
                .output();
            tokio::time::sleep(Duration::from_millis(200)).await;
            let events = cl.events(&sb.id, 0).await.ok()?;
            has_event(&events, "component.gave_up", "a11y-bus").then_some(())
        },
    )
    .await;
    // The client variables of the seed's gateway reach the controller as --url/--key would.
    let env = [
        ("SANDBOX_GATEWAY_URL", c.base.as_str()),
        ("SANDBOX_API_KEY", API_KEY),
    ];
    let out = finished(verify(&["--sandbox", &sb.id], &env).spawn().unwrap()).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_ne!(out.status.code(), Some(0), "{stdout}");
    let row = stdout
        .lines()
        .find(|l| l.starts_with("accessibility "))
        .unwrap_or_else(|| panic!("no accessibility row:\n{stdout}"));
    assert_eq!(row.split_whitespace().nth(1), Some("fail"), "{stdout}");
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        summary.contains("FAILED") && summary.contains("accessibility"),
        "{stdout}"
    );
    // Every other row ran: the failure is the check's, not the run's.
    for name in CHECKS {
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("{name} "))),
            "no {name} row:\n{stdout}"
        );
    }
    // A sandbox it did not create is left as it was.
    assert_eq!(cl.get(&sb.id).await.unwrap().status, "running");
    assert!(
        !stdout.lines().any(|l| l.starts_with("delete ")),
        "{stdout}"
    );
}

#[tokio::test]
async fn an_interrupted_verify_still_deletes_its_sandbox() {
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let child = verify(
        &["--json"],
        &[("BERTH_URL", &c.base), ("BERTH_API_KEY", API_KEY)],
    )
    .spawn()
    .unwrap();
    let client: ControllerClient = c.client();
    // Interrupted in the middle of its checks.
    let id = wait_for(
        "verify's sandbox to run",
        Duration::from_secs(120),
        || async {
            let list = client.list(&[]).await.ok()?;
            let sb = list.sandboxes.first()?;
            (sb.status == "running").then(|| sb.id.clone())
        },
    )
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = finished(child).await;
    let report = report(&out);
    assert_ne!(out.status.code(), Some(0));
    assert_eq!(report["interrupted"], true, "{report}");
    assert_eq!(report["sandbox"], id.as_str(), "{report}");
    let delete = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "delete")
        .unwrap_or_else(|| panic!("no delete row: {report}"));
    assert_eq!(delete["ok"], true, "{report}");
    assert_eq!(client.get(&id).await.unwrap().status, "stopped");
    assert!(c.leftovers(&id).is_empty(), "{:?}", c.leftovers(&id));
}

#[tokio::test]
async fn the_gnome_osworld_image_passes_every_fidelity_row_and_a_difference_is_named() {
    // `tests/test.sh` builds it; here the build finds it.
    let built = build_image(&["--profile", "desktop", "--bundle", "osworld"]).unwrap();
    let image = built["image_ref"].as_str().unwrap().to_string();
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let out = finished(
        verify(
            &[
                "--url",
                &c.base,
                "--key",
                API_KEY,
                "--image-ref",
                &image,
                "--json",
            ],
            &[],
        )
        .spawn()
        .unwrap(),
    )
    .await;
    let fresh = report(&out);
    let rows = fresh["checks"].as_array().unwrap();
    let failed: Vec<&Value> = rows.iter().filter(|c| c["ok"] != true).collect();
    assert!(failed.is_empty(), "failed checks: {failed:#?}");
    let fidelity: Vec<&Value> = rows.iter().filter(|c| c["name"] == "fidelity").collect();
    // Session, theme, dock, settings, handlers, first runs, OSWorld's programs and the rest.
    assert!(fidelity.len() > 60, "{fidelity:#?}");
    for item in [
        "session: gnome",
        "icon theme: Yaru",
        "program bc: present",
        "first run vlc:",
    ] {
        assert!(
            fidelity
                .iter()
                .any(|r| r["detail"].as_str().unwrap_or_default().starts_with(item)),
            "no passing row {item:?}: {fidelity:#?}"
        );
    }

    // A difference: the icon theme changed.
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "desktop".into(),
            image_ref: Some(image.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let run = cl
        .exec(
            &sb.id,
            &RunRequest {
                command: RunCommand::Line(
                    "gsettings set org.gnome.desktop.interface icon-theme Adwaita".into(),
                ),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    let out = finished(
        verify(
            &[
                "--url",
                &c.base,
                "--key",
                API_KEY,
                "--sandbox",
                &sb.id,
                "--json",
            ],
            &[],
        )
        .spawn()
        .unwrap(),
    )
    .await;
    assert_ne!(out.status.code(), Some(0));
    let report = report(&out);
    let failed: Vec<String> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] != true)
        .map(|c| c["detail"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        failed.contains(&"icon theme: expected Yaru, found Adwaita".to_string()),
        "{failed:#?}"
    );
    cl.delete(&sb.id).await.unwrap();
}
