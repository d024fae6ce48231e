//! The controller with real desktop sandboxes (Xvnc, XFCE, Chromium): the viewer through the
//! controller on every provider; with local processes, strict readiness, a create that cannot
//! become ready in time, a pool that cannot fill, and `berth demo`.

use std::time::Duration;

use berth_protocol::controller::{Command, CreateSandbox, RunRequest};
use berth_tests::controller::{ControllerProcess, Provider};
use berth_tests::{processes_with_root, wait_for};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};

fn desktop() -> CreateSandbox {
    CreateSandbox {
        profile: "desktop".into(),
        ..Default::default()
    }
}

/// An agent binary whose desktop can never be ready: its browser does not exist.
fn agent_without_a_browser(dir: &std::path::Path) -> String {
    let script = dir.join("berth-agent-no-browser");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec {} \"$@\" --chromium /nonexistent/chromium\n",
            berth_tests::workspace_bin("berth-agent").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script.display().to_string()
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .unwrap()
}

/// On every provider (one desktop at a time).
async fn a_desktop_sandbox_is_viewed_through_a_one_time_url_and_deleted_without_a_trace(
    provider: Provider,
) {
    let c = ControllerProcess::start_on(provider, "").await;
    let cl = c.client();
    let sb = cl.create(&desktop()).await.unwrap();
    assert_eq!(sb.status, "running");
    assert_eq!(sb.viewer.kind, "novnc");
    let stable = sb.viewer.url.clone().unwrap();
    assert!(stable.ends_with(&format!("/sandbox/sandboxes/v1/{}/vnc/", sb.id)));
    // Exec and a screenshot through the controller.
    let run = cl
        .exec(
            &sb.id,
            &RunRequest {
                command: Command::Line("echo $DISPLAY".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(run.stdout.starts_with(':'), "{run:?}");
    let png = cl.screenshot(&sb.id).await.unwrap();
    let decoder = png::Decoder::new(std::io::Cursor::new(png));
    let info = decoder.read_info().unwrap();
    assert_eq!((info.info().width, info.info().height), (1920, 1080));
    // Computer-use actions through the controller.
    let r = cl
        .request(
            reqwest::Method::POST,
            &format!("/sandbox/sandboxes/v1/{}/computer", sb.id),
        )
        .json(&serde_json::json!({"action": "mouse_move", "coordinate": [17, 23]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r: serde_json::Value = cl
        .request(
            reqwest::Method::POST,
            &format!("/sandbox/sandboxes/v1/{}/computer", sb.id),
        )
        .json(&serde_json::json!({"action": "cursor_position"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(r["output"].as_str().unwrap().contains("17"), "{r}");
    // The stable URL needs auth.
    let http = no_redirects();
    assert_eq!(http.get(&stable).send().await.unwrap().status(), 401);
    // A one-time URL works once and sets a cookie scoped to this sandbox.
    let once = cl.viewer(&sb.id).await.unwrap().url;
    let r = http.get(&once).send().await.unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(
        cookie.contains(&format!("Path=/sandbox/sandboxes/v1/{}/", sb.id)),
        "{cookie}"
    );
    let location = r.headers()["location"].to_str().unwrap().to_string();
    assert!(
        location.contains(&format!(
            "path=sandbox/sandboxes/v1/{}/vnc/websockify",
            sb.id
        )),
        "{location}"
    );
    assert_eq!(
        http.get(&once).send().await.unwrap().status(),
        401,
        "used twice"
    );
    let pair = cookie.split(';').next().unwrap().to_string();
    let base = format!("{}/sandbox/sandboxes/v1/{}", c.base, sb.id);
    let page = http
        .get(format!(
            "{base}/vnc/{}",
            location.split('?').next().unwrap()
        ))
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("noVNC"));
    // The cookie opens nothing of another sandbox.
    let other = http
        .get(format!(
            "{}/sandbox/sandboxes/v1/sb_other/vnc/vnc.html",
            c.base
        ))
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 401);
    // noVNC's WebSocket reaches the VNC server through both relays.
    let mut req = format!("{}/vnc/websockify", base.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    req.headers_mut().insert("cookie", pair.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let mut buf = Vec::new();
    while buf.len() < 12 {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .unwrap()
        {
            Some(Ok(tungstenite::Message::Binary(b))) => buf.extend_from_slice(&b),
            other => panic!("{other:?}"),
        }
    }
    assert!(
        buf.starts_with(b"RFB 003.00"),
        "{:?}",
        String::from_utf8_lossy(&buf)
    );
    ws.send(tungstenite::Message::binary(b"RFB 003.008\n".to_vec()))
        .await
        .unwrap();
    let _ = ws.close(None).await;
    // The live stream too.
    let mut stream = http
        .get(format!("{base}/stream.mp4"))
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let mut head = Vec::new();
    while head.len() < 8 {
        head.extend_from_slice(&stream.chunk().await.unwrap().unwrap());
    }
    assert_eq!(&head[4..8], b"ftyp");
    drop(stream);
    // Delete: the agent and every process under it are gone (with its container on Docker).
    let tree = match provider {
        Provider::Process => processes_with_root(c.agent_pid(&sb.id) as u32),
        _ => Vec::new(),
    };
    assert!(
        provider != Provider::Process || tree.len() > 5,
        "the desktop runs under the agent: {tree:?}"
    );
    cl.delete(&sb.id).await.unwrap();
    let left: Vec<u32> = tree
        .into_iter()
        .filter(|p| berth_tests::pid_alive(*p))
        .collect();
    assert!(left.is_empty(), "left running: {left:?}");
    assert!(c.leftovers(&sb.id).is_empty(), "{:?}", c.leftovers(&sb.id));
    assert_eq!(http.get(&once).send().await.unwrap().status(), 401);
}

#[tokio::test]
async fn a_desktop_that_cannot_be_ready_in_time_fails_with_the_reason_and_leaves_nothing() {
    let bin = tempfile::tempdir().unwrap();
    let c = ControllerProcess::start(&format!(
        "create_timeout_secs = 3\nagent_bin = \"{}\"\n",
        agent_without_a_browser(bin.path())
    ))
    .await;
    let cl = c.client();
    let e = cl.create(&desktop()).await.unwrap_err();
    assert_eq!(e.status(), Some(503), "{e}");
    assert!(e.to_string().contains("not ready within 3 s"), "{e}");
    assert!(
        e.to_string().contains("chromium"),
        "the reason names the component: {e}"
    );
    let failed = cl.list(&[]).await.unwrap().sandboxes;
    let sb = failed
        .iter()
        .find(|s| s.status == "failed")
        .expect("a failed sandbox");
    assert!(sb.error.as_ref().unwrap().contains("not ready within 3 s"));
    wait_for("its processes to go", Duration::from_secs(20), || async {
        c.all_sandbox_processes().is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn berth_demo_shows_a_ready_desktop_a_screenshot_and_a_viewer_url() {
    let dir = tempfile::tempdir().unwrap();
    let shot = dir.path().join("demo.png");
    let out = tokio::process::Command::new(berth_tests::workspace_bin("berth"))
        .arg("demo")
        .arg("--once")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--screenshot")
        .arg(&shot)
        .env("BERTH_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("/vnc/?t="), "{stdout}");
    assert!(stdout.contains("exec: exit 0"), "{stdout}");
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    assert!(
        berth_tests::processes_matching(&dir.path().join("data").to_string_lossy()).is_empty(),
        "the demo leaves nothing running"
    );
}

#[tokio::test]
async fn a_pool_whose_members_never_become_ready_stops_refilling_and_says_so() {
    // Desktops without a browser are never ready: every member fails at its deadline.
    let bin = tempfile::tempdir().unwrap();
    let c = ControllerProcess::start(&format!(
        "create_timeout_secs = 2\nrefill_max_failures = 3\nrefill_concurrency = 2\n\
         agent_bin = \"{}\"\n[[pools]]\nprofile = \"desktop\"\nsize = 2\n",
        agent_without_a_browser(bin.path())
    ))
    .await;
    let cl = c.client();
    let pool = wait_for("the refill to stop", Duration::from_secs(60), || async {
        let p = cl.pools().await.ok()?["pools"][0].clone();
        p["failing"].is_string().then_some(p)
    })
    .await;
    assert!(
        pool["failing"]
            .as_str()
            .unwrap()
            .contains("not ready within 2 s"),
        "{pool}"
    );
    wait_for(
        "the failed members' processes to go",
        Duration::from_secs(30),
        || async { c.all_sandbox_processes().is_empty().then_some(()) },
    )
    .await;
    let metrics = c.client().metrics().await.unwrap();
    assert!(
        metrics.contains("berth_pool_refill_failing{pool=\"desktop-ubuntu@"),
        "{metrics}"
    );
    let count = |state: &str| -> u64 {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("berth_sandboxes{{state=\"{state}\"}}")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap()
    };
    // Three failures in a row stop it; at most the starts already under way finish after.
    let failed = count("failed");
    assert!(
        (3..=4).contains(&failed),
        "{failed} failed starts: the refill looped"
    );
    // A create still works (cold) while the pool is failing… and fails for the same reason.
    let e = cl.create(&desktop()).await.unwrap_err();
    assert!(e.to_string().contains("not ready within 2 s"), "{e}");
}

berth_tests::on_every_provider!(
    a_desktop_sandbox_is_viewed_through_a_one_time_url_and_deleted_without_a_trace
);
