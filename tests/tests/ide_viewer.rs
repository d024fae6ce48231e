//! The ide-ubuntu viewer: JupyterLab, supervised by the agent as the sandbox user on
//! 127.0.0.1:8888 and served through the controller's preview route under the public path it
//! builds its URLs from. On a Docker sandbox of the desktop image (profile `ide`, no desktop):
//! the record names the viewer, the component is ready, it runs as uid 1000, it answers only on
//! loopback, a browser needs the one-time URL or the API key, and Playwright in Debian's
//! Chromium opens the one-time URL, starts a JupyterLab terminal and types a command whose file
//! the test reads back through the controller. On a local agent: a fake `jupyter-lab` shows the
//! supervision (its arguments, the prefix the relay restores, a restart after a crash) and a
//! missing one is a component down with its reason.

use std::time::{Duration, Instant};

use berth_tests::controller::{API_KEY, ControllerProcess, Provider, ide, shell};
use berth_tests::{AgentOptions, AgentProcess, wait_for};
use serde_json::Value;

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Opens the one-time viewer URL, waits for JupyterLab, starts a terminal from the launcher,
/// types the command (again if the terminal was not connected yet) until JupyterLab's own
/// contents API shows the file, then saves a screenshot.
const PLAYWRIGHT_PY: &str = r##"
import json, sys, time
from playwright.sync_api import sync_playwright
url, shot = sys.argv[1], sys.argv[2]
out = {}
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(url)
    page.wait_for_selector(".jp-LauncherCard", timeout=90000)
    out["title"] = page.title()
    out["url"] = page.url
    out["cookie_visible"] = page.evaluate("document.cookie")
    page.locator(".jp-LauncherCard", has_text="Terminal").first.click()
    page.wait_for_selector(".jp-Terminal .xterm", timeout=30000)
    base = page.url.split("/lab")[0] + "/"
    content = None
    for attempt in range(6):
        page.locator(".jp-Terminal .xterm").first.click()
        page.keyboard.type("echo ide-$((6*7)) > ~/from-ide.txt")
        page.keyboard.press("Enter")
        deadline = time.time() + 10
        while time.time() < deadline:
            r = page.request.get(base + "api/contents/from-ide.txt?content=1&type=file&format=text")
            if r.status == 200:
                content = r.json()["content"]
                break
            page.wait_for_timeout(200)
        if content is not None:
            out["attempts"] = attempt + 1
            break
    out["content"] = content
    page.keyboard.type("cat ~/from-ide.txt; id -u")
    page.keyboard.press("Enter")
    page.wait_for_timeout(1000)
    page.screenshot(path=shot)
    browser.close()
print(json.dumps(out))
"##;

/// Docker sandboxes of the desktop image through the controller, JupyterLab in Chromium.
#[tokio::test]
async fn an_ide_sandbox_serves_jupyterlab_to_chromium_through_the_preview_route() {
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let cl = c.client();
    let sb = cl.create(&ide()).await.unwrap();
    let id = sb.id.clone();
    let ide_root = format!("{}/sandbox/sandboxes/v1/{id}/ports/8888/", c.base);
    assert_eq!(sb.viewer.kind, "jupyterlab");
    assert_eq!(sb.viewer.url.as_deref(), Some(ide_root.as_str()));
    let again = cl.get(&id).await.unwrap();
    assert_eq!(again.viewer, sb.viewer, "the viewer block is stable");

    // The component reports ready in the agent's /v1/ready (through the controller).
    let h = http();
    let ready_url = format!("{}/sandbox/sandboxes/v1/{id}/v1/ready?wait=60s", c.base);
    let report: Value = wait_for("JupyterLab ready", Duration::from_secs(120), || {
        let h = h.clone();
        let ready_url = ready_url.clone();
        async move {
            let r = h
                .get(&ready_url)
                .header("X-Api-Key", API_KEY)
                .send()
                .await
                .ok()?;
            let v: Value = r.json().await.ok()?;
            (v["components"]["jupyterlab"]["ok"] == true).then_some(v)
        }
    })
    .await;
    assert_eq!(report["ready"], true, "{report}");
    let jl = &report["components"]["jupyterlab"];
    assert_eq!(jl["state"], "up", "{report}");
    let pid = jl["pid"].as_u64().expect("the IDE's pid");
    assert!(
        jl["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("/sandbox/sandboxes/v1/{id}/ports/8888/")),
        "it serves under the controller's path: {jl}"
    );

    // It runs as the sandbox user (uid 1000), not as the agent (root).
    let run = cl
        .exec(&id, &shell(&format!("stat -c %u /proc/{pid}")))
        .await
        .unwrap();
    assert_eq!(run.stdout.trim(), "1000", "{run:?}");

    // It answers on loopback only: the container's own address refuses port 8888 while the
    // agent answers there on 5000.
    let out = std::process::Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
            &format!("berth-{id}"),
        ])
        .output()
        .unwrap();
    let ip = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("the container's address")
        .to_string();
    let connect = |port: u16| {
        std::net::TcpStream::connect_timeout(
            &format!("{ip}:{port}").parse().unwrap(),
            Duration::from_secs(3),
        )
    };
    assert!(connect(5000).is_ok(), "the agent answers at {ip}:5000");
    let refused = connect(8888).expect_err("the IDE must not answer on the external interface");
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{refused}"
    );
    let inside = cl
        .exec(
            &id,
            &shell(&format!(
                "curl -s -o /dev/null -w '%{{http_code}}' --max-time 3 http://{ip}:8888/; echo \" $?\"; \
                 curl -s -o /dev/null -w '%{{http_code}}' --max-time 3 \
                 http://127.0.0.1:8888/sandbox/sandboxes/v1/{id}/ports/8888/api/status"
            )),
        )
        .await
        .unwrap();
    assert_eq!(inside.stdout.trim(), "000 7\n200", "{inside:?}");

    // Without the API key or the cookie of a one-time URL: 401, with the native error body.
    for url in [
        ide_root.clone(),
        format!("{ide_root}lab"),
        format!("{ide_root}api/contents"),
    ] {
        let r = h.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 401, "{url}");
        let body: Value = r.json().await.unwrap();
        assert!(body["error"]["code"].is_string(), "{body}");
    }
    // With the key, JupyterLab answers through the relay, its redirect under the public path.
    let r = h
        .get(&ide_root)
        .header("X-Api-Key", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302);
    assert_eq!(
        r.headers()["location"].to_str().unwrap(),
        format!("/sandbox/sandboxes/v1/{id}/ports/8888/lab?")
    );

    // POST …/viewer mints a one-time preview URL of the IDE's port; it opens once.
    let once = cl.viewer(&id).await.unwrap().url;
    assert!(
        once.starts_with(&format!("{ide_root}?berth_preview=")),
        "{once}"
    );
    let spent = cl.viewer(&id).await.unwrap().url;
    let r = h.get(&spent).send().await.unwrap();
    assert_eq!(r.status(), 303, "the first open sets the cookie");
    let r = h.get(&spent).send().await.unwrap();
    assert_eq!(r.status(), 401, "a spent one-time URL opens nothing");

    // Chromium opens the one-time URL, starts a terminal and types into it.
    let shot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("screenshots/ide-viewer.png");
    std::fs::create_dir_all(shot.parent().unwrap()).unwrap();
    let tmp_shot = c.dir.path().join("ide-viewer.png");
    let t = Instant::now();
    let (once2, shot_arg) = (once.clone(), tmp_shot.to_string_lossy().into_owned());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("timeout")
            .args(["240", "python3", "-c", PLAYWRIGHT_PY, &once2, &shot_arg])
            .output()
            .expect("python3 with playwright (tests/setup.sh installs it)")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "playwright: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("JupyterLab in Chromium in {:?}: {page}", t.elapsed());
    assert!(
        page["url"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{ide_root}lab")),
        "{page}"
    );
    assert!(
        page["title"].as_str().unwrap().contains("JupyterLab"),
        "{page}"
    );
    // JupyterLab's own `_xsrf` cookie is for its scripts; the preview's is HttpOnly.
    assert!(
        !page["cookie_visible"]
            .as_str()
            .unwrap()
            .contains("berth_port"),
        "the preview cookie is HttpOnly: {page}"
    );
    assert_eq!(page["content"], "ide-42\n", "{page}");

    // The file the terminal wrote, read through the controller.
    let run = cl
        .exec(&id, &shell("cat ~/from-ide.txt; stat -c %u ~/from-ide.txt"))
        .await
        .unwrap();
    assert_eq!(run.stdout, "ide-42\n1000\n", "{run:?}");
    let png = std::fs::read(&tmp_shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000);
    std::fs::write(&shot, &png).unwrap();

    cl.delete(&id).await.unwrap();
}

/// A stand-in `jupyter-lab`: serves every path (its own `api/status` included) as JSON naming
/// the path and the arguments it was started with, on the port it was told.
const FAKE_JUPYTER: &str = r#"#!/usr/bin/env python3
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
opt = lambda k: next(a.split("=", 1)[1] for a in args if a.startswith(k + "="))
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path, "args": args, "uid": os.getuid()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
HTTPServer((opt("--ip"), int(opt("--port"))), H).serve_forever()
"#;

/// `/v1/ready` with the token, whatever its status (503 while something is not ready).
async fn ready(a: &AgentProcess) -> Value {
    let r = a
        .client()
        .request(reqwest::Method::GET, "/v1/ready")
        .send()
        .await
        .unwrap();
    r.json().await.unwrap()
}

/// The agent's supervision of the IDE, on a local agent with a stand-in `jupyter-lab`.
#[tokio::test]
async fn the_agent_supervises_the_ide_and_restores_its_prefix_in_the_port_relay() {
    let bin = tempfile::tempdir().unwrap();
    let fake = bin.path().join("jupyter-lab");
    std::fs::write(&fake, FAKE_JUPYTER).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec![
            "--ide".into(),
            "jupyterlab".into(),
            "--ports-prefix".into(),
            "/sandbox/sandboxes/v1/sb_test/ports".into(),
            "--jupyter-lab".into(),
            fake.to_string_lossy().into_owned(),
        ],
        ..Default::default()
    })
    .await;
    let report = wait_for("the IDE up", Duration::from_secs(30), || {
        let a = &a;
        async move {
            let v = ready(a).await;
            (v["components"]["jupyterlab"]["ok"] == true).then_some(v)
        }
    })
    .await;
    assert_eq!(report["ready"], true, "{report}");
    let pid = report["components"]["jupyterlab"]["pid"].as_u64().unwrap();

    // The relay gives the IDE its base URL back; the answer shows the arguments it ran with.
    let v = a.get_json("/v1/ports/8888/lab/tree?x=1").await;
    assert_eq!(
        v["path"],
        "/sandbox/sandboxes/v1/sb_test/ports/8888/lab/tree?x=1"
    );
    let args: Vec<&str> = v["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for want in [
        "--ip=127.0.0.1",
        "--port=8888",
        "--no-browser",
        "--IdentityProvider.token=",
        "--ServerApp.base_url=/sandbox/sandboxes/v1/sb_test/ports/8888/",
        "--ServerApp.terminals_enabled=True",
    ] {
        assert!(args.contains(&want), "{want} missing from {args:?}");
    }

    // Killed, it is restarted, with the events saying so.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let again = wait_for("the IDE back up", Duration::from_secs(30), || {
        let a = &a;
        async move {
            let v = ready(a).await;
            let c = &v["components"]["jupyterlab"];
            (c["ok"] == true && c["pid"].as_u64() != Some(pid)).then(|| c.clone())
        }
    })
    .await;
    assert_eq!(again["restarts"], 1, "{again}");
    let events = a.get_json("/v1/events?from_seq=0").await;
    let kinds: Vec<String> = events["events"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter(|e| e["component"] == "jupyterlab")
                .map(|e| e["kind"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default();
    for want in ["component.up", "component.down", "component.restarted"] {
        assert!(kinds.iter().any(|k| k == want), "{want} missing: {events}");
    }
}

/// Without `jupyter-lab` the IDE is a component down with its reason (and an event).
#[tokio::test]
async fn a_missing_ide_binary_is_a_component_down_with_its_reason() {
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec![
            "--ide".into(),
            "jupyterlab".into(),
            "--jupyter-lab".into(),
            "/nonexistent/jupyter-lab".into(),
        ],
        ..Default::default()
    })
    .await;
    let c = wait_for("the IDE reported down", Duration::from_secs(20), || {
        let a = &a;
        async move {
            let v = ready(a).await;
            let c = v["components"]["jupyterlab"].clone();
            (c["state"] == "down").then_some((v, c))
        }
    })
    .await;
    assert_eq!(c.0["ready"], false, "{}", c.0);
    let reason = c.1["reason"].as_str().unwrap();
    assert!(
        reason.contains("/nonexistent/jupyter-lab is not installed"),
        "{reason}"
    );
    // Said once as an event too.
    let events = a.get_json("/v1/events?from_seq=0").await;
    let down: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "component.down" && e["component"] == "jupyterlab")
        .collect();
    assert_eq!(down.len(), 1, "{events}");
    assert_eq!(down[0]["reason"], reason);
}
