//! The README's gateway quick start (the seed's own), run as written: the controller started with
//! the README's command line on the seed's address, the client block run by bash verbatim, and the
//! viewer URL it prints opened in Chromium by Playwright.

use std::process::{Command, Stdio};
use std::time::Duration;

use berth_protocol::controller::ControllerClient;
use berth_tests::{wait_for, workspace_bin};

const README: &str = include_str!("../../README.md");

/// The `sh` fenced blocks of the README's quick start section: the server's, then the client's.
fn quickstart_blocks() -> (String, String) {
    let section = README
        .split("\n## Quick start: the gateway API\n")
        .nth(1)
        .expect("the README has a gateway quick start")
        .split("\n## ")
        .next()
        .unwrap();
    let block = |text: &str| -> String {
        let start = text.find("```sh\n").expect("a sh block") + "```sh\n".len();
        let len = text[start..].find("\n```").expect("the block ends");
        text[start..start + len].to_string()
    };
    let server = block(section);
    let client = block(
        section
            .split("<!-- quickstart -->")
            .nth(1)
            .expect("the client block is marked"),
    );
    (server, client)
}

/// Kills the server's process group when the test ends, however it ends.
struct Group(std::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        // Whatever the test left (it may have failed half-way) is deleted before the controller
        // stops: a stopped controller leaves its sandboxes running for the next one to adopt.
        let _ = Command::new("timeout")
            .args([
                "60",
                "bash",
                "-c",
                "k='X-Api-Key: change-me'; u=http://127.0.0.1:8780/sandbox/sandboxes/v1; \
                 for id in $(curl -s -H \"$k\" $u | jq -r '.sandboxes[].id'); do \
                 curl -s -o /dev/null -H \"$k\" -X DELETE $u/$id; done",
            ])
            .status();
        let pgid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_seed_quick_start_runs_verbatim() {
    let (server, client) = quickstart_blocks();
    assert!(
        server.contains("berth serve --listen 127.0.0.1:8780"),
        "{server}"
    );
    assert!(client.contains("desktop-ubuntu"), "{client}");
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = workspace_bin("berth").parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
    use std::os::unix::process::CommandExt;
    let child = Command::new("bash")
        .args(["-c", &server])
        .env("PATH", &path)
        .env("BERTH_DATA_DIR", dir.path().join("data"))
        .env("BERTH_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("bash");
    let _group = Group(child);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    wait_for(
        "the controller on :8780",
        Duration::from_secs(60),
        || async {
            let r = http
                .get("http://localhost:8780/healthz")
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;

    // The client block as written, with only what a user's shell has around it.
    let out = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .args(["300", "bash", "-e", "-c", &client])
            .env_remove("SANDBOX_GATEWAY_URL")
            .env_remove("SANDBOX_API_KEY")
            .output()
            .expect("bash")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the quick start failed ({}): {stdout}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default()
    );
    let url = stdout.lines().last().unwrap_or("").trim().to_string();
    assert!(
        (url.starts_with("http://localhost:8780/sandbox/sandboxes/v1/")
            || url.starts_with("http://127.0.0.1:8780/sandbox/sandboxes/v1/"))
            && url.contains("?t="),
        "the last line is the viewer's one-time URL: {stdout:?}"
    );

    // Opened in a browser (no key: the one-time URL sets the cookie), noVNC connects.
    let script = r#"
import sys
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
    page = browser.new_page()
    page.goto(sys.argv[1])
    page.wait_for_selector("canvas", timeout=60000)
    page.wait_for_function(
        "() => { const c = document.querySelector('canvas'); return c && c.width > 100 && c.height > 100; }",
        timeout=60000)
    print(page.url)
    print(page.evaluate("(() => { const c = document.querySelector('canvas'); return c.width + 'x' + c.height; })()"))
    browser.close()
"#;
    let opened = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .args(["120", "python3", "-c", script, &url])
            .output()
            .expect("python3 with playwright (tests/setup.sh installs it)")
    })
    .await
    .unwrap();
    let page = String::from_utf8_lossy(&opened.stdout).into_owned();
    assert!(
        opened.status.success(),
        "playwright: {page}\n{}",
        String::from_utf8_lossy(&opened.stderr)
    );
    let lines: Vec<&str> = page.lines().collect();
    println!(
        "the viewer opened at {} with a {} screen",
        lines[0], lines[1]
    );
    assert!(lines[0].contains("/vnc/vnc.html"), "{page}");
    assert_eq!(lines[1], "1920x1080", "the desktop's screen in the viewer");

    // Deleted through the API.
    let c = ControllerClient::new("http://localhost:8780", Some("change-me".to_string()));
    let sandboxes = c.list(&[]).await.unwrap().sandboxes;
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    c.delete(&sandboxes[0].id).await.unwrap();
}
