//! The README's gateway quick start (the seed's own), run as written: the controller started with
//! the README's command line on the seed's address, the client block run by bash verbatim, and the
//! viewer URL it prints opened in Chromium by Playwright.

use std::process::Command;

use berth_protocol::controller::ControllerClient;
use berth_tests::readme::{Served, block, section};

/// The `sh` fenced blocks of the README's quick start section: the server's, then the client's.
fn quickstart_blocks() -> (String, String) {
    let text = section("Quick start: the gateway API");
    (
        block(text, "sh", None),
        block(text, "sh", Some("quickstart")),
    )
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
    let _served = Served::start(&server, dir.path(), "http://localhost:8780", "change-me").await;

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
