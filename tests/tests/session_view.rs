//! The session view (`…/{id}/session/`): its one-time URL and cookie (single use, scoped to
//! one sandbox), the page and its Debian-packaged assets, the routes it uses, an `ide`
//! sandbox and a deleted one over HTTP; and Chromium (Playwright) driving it on a desktop
//! sandbox: the desktop canvas draws, a command typed into the terminal, a file uploaded and
//! downloaded, a recording played, the episode's markers.

use std::process::{Command, Stdio};
use std::time::Duration;

use berth_protocol::controller::{CreateSandbox, SessionUrl};
use berth_protocol::record::RecordingRequest;
use berth_tests::controller::{API_KEY, ControllerProcess, Provider, ide};
use berth_tests::{wait_for, workspace_bin};
use reqwest::StatusCode;
use serde_json::Value;

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

fn page(c: &ControllerProcess, id: &str) -> String {
    format!("{}/sandbox/sandboxes/v1/{id}/session/", c.base)
}

async fn mint(c: &ControllerProcess, id: &str) -> SessionUrl {
    c.client().session(id).await.unwrap()
}

/// Opens a one-time URL: the cookie it sets (`berth_session=…`) and its whole header.
async fn open(url: &str) -> (String, String) {
    let r = http().get(url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "{url}");
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    let pair = set.split(';').next().unwrap().to_string();
    assert!(pair.starts_with("berth_session="), "{set}");
    (pair, set)
}

async fn get(url: &str, cookie: Option<&str>) -> reqwest::Response {
    let mut req = http().get(url);
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    req.send().await.unwrap()
}

async fn status(url: &str, cookie: Option<&str>) -> u16 {
    get(url, cookie).await.status().as_u16()
}

#[tokio::test]
async fn the_session_url_opens_once_and_its_cookie_opens_only_its_sandbox() {
    let c = ControllerProcess::start("").await;
    let cl = c.client();
    let a = cl.create(&ide()).await.unwrap().id;
    let b = cl.create(&ide()).await.unwrap().id;

    // Minting needs the key.
    let r = http()
        .post(format!("{}/sandbox/sandboxes/v1/{a}/session", c.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    let missing = c.client().session("sb_nope").await.unwrap_err();
    assert!(missing.to_string().contains("404"), "{missing}");

    let minted = mint(&c, &a).await;
    assert!(minted.url.starts_with(&page(&c, &a)), "{}", minted.url);
    assert!(minted.expires_at.ends_with('Z'), "{}", minted.expires_at);
    let (cookie, set) = open(&minted.url).await;
    assert!(
        set.contains(&format!("Path=/sandbox/sandboxes/v1/{a}/session/")),
        "{set}"
    );
    assert!(set.contains("HttpOnly"), "{set}");
    // Once only.
    let again = get(&minted.url, None).await;
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
    let body: Value = again.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already used"),
        "{body}"
    );

    // The page: hardened headers, no inline script.
    let r = get(&page(&c, &a), Some(&cookie)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let h = r.headers().clone();
    assert!(h["content-type"].to_str().unwrap().starts_with("text/html"));
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'self'"), "{csp}");
    assert!(csp.contains("script-src 'self';"), "{csp}");
    assert!(csp.contains("ws://127.0.0.1:"), "{csp}");
    assert_eq!(h["x-frame-options"], "DENY");
    let html = r.text().await.unwrap();
    for tag in html.split("<script").skip(1) {
        assert!(
            tag.trim_start().starts_with("type=\"module\" src=") || tag.contains("src="),
            "inline script: {tag}"
        );
    }
    assert!(html.contains("assets/app.js"));

    // Its assets, the Debian-packaged ones included.
    for (asset, kind, needle) in [
        ("assets/app.js", "text/javascript", "berthSession"),
        ("assets/style.css", "text/css", ".markers"),
        ("vendor/xterm.js", "text/javascript", "window.Terminal = T"),
        ("vendor/xterm.css", "text/css", ".xterm"),
        (
            "vendor/novnc/core/rfb.js",
            "text/javascript",
            "export default class RFB",
        ),
    ] {
        let r = get(&format!("{}{asset}", page(&c, &a)), Some(&cookie)).await;
        assert_eq!(r.status(), StatusCode::OK, "{asset}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with(kind), "{asset}: {ct}");
        assert!(r.text().await.unwrap().contains(needle), "{asset}");
    }
    // Unknown paths and escapes are 404s with the error body.
    for bad in [
        "nope",
        "assets/nope.js",
        "vendor/novnc/%2e%2e/%2e%2e/etc/passwd",
        "api/nope",
    ] {
        let r = get(&format!("{}{bad}", page(&c, &a)), Some(&cookie)).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{bad}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_found", "{bad}: {body}");
    }

    // The routes the page uses.
    let api = format!("{}api/", page(&c, &a));
    let info: Value = get(&format!("{api}info"), Some(&cookie))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(info["sandbox"]["id"], a.as_str(), "{info}");
    assert_eq!(
        info["desktop"], false,
        "the ide profile has no desktop: {info}"
    );
    assert_eq!(info["running"], true);
    assert_eq!(info["vendor"]["xterm"], true, "{info}");
    let events: Value = get(&format!("{api}events?from_seq=0"), Some(&cookie))
        .await
        .json()
        .await
        .unwrap();
    assert!(!events["events"].as_array().unwrap().is_empty(), "{events}");
    assert!(events["next_seq"].as_u64().unwrap() > 0);
    let listing: Value = get(&format!("{api}agent/fs/list?path=~"), Some(&cookie))
        .await
        .json()
        .await
        .unwrap();
    assert!(listing["entries"].is_array(), "{listing}");
    let put = http()
        .put(format!("{api}agent/files?path=from-session.txt"))
        .header("cookie", &cookie)
        .body("uploaded through the session view\n")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::CREATED);
    let back = get(
        &format!("{api}agent/files?path=from-session.txt"),
        Some(&cookie),
    )
    .await;
    assert_eq!(back.status(), StatusCode::OK);
    assert_eq!(
        back.text().await.unwrap(),
        "uploaded through the session view\n"
    );
    // The agent's API beyond what the page uses stays closed to the cookie.
    let exec = http()
        .post(format!("{api}agent/exec"))
        .header("cookie", &cookie)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(exec.status(), StatusCode::NOT_FOUND);
    let native = format!("{}/sandbox/sandboxes/v1/{a}/v1/fs/list?path=~", c.base);
    assert_eq!(
        status(&native, Some(&cookie)).await,
        401,
        "the cookie is not the API key"
    );
    let viewer = format!("{}/sandbox/sandboxes/v1/{a}/vnc/websockify", c.base);
    assert_eq!(
        status(&viewer, Some(&cookie)).await,
        401,
        "nor the viewer's cookie"
    );

    // Sandbox A's cookie opens nothing of sandbox B.
    let api_b = format!("{}api/", page(&c, &b));
    for url in [
        page(&c, &b),
        format!("{api_b}info"),
        format!("{api_b}events"),
        format!("{api_b}artifacts"),
        format!("{api_b}agent/fs/list?path=~"),
        format!("{api_b}agent/files?path=from-session.txt"),
        format!("{}assets/app.js", page(&c, &b)),
    ] {
        assert_eq!(status(&url, Some(&cookie)).await, 401, "{url}");
    }
    // Nor does no credential; the API key does.
    assert_eq!(status(&page(&c, &a), None).await, 401);
    let keyed = http()
        .get(page(&c, &b))
        .header("x-api-key", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(keyed.status(), StatusCode::OK);
    // A viewer URL's token does not open the session view.
    let (_, v) = (
        (),
        http()
            .get(format!("{}?t=0123456789abcdef", page(&c, &b)))
            .send()
            .await
            .unwrap()
            .status(),
    );
    assert_eq!(v, StatusCode::UNAUTHORIZED);

    let home_b: Value = http()
        .get(format!(
            "{}/sandbox/sandboxes/v1/{b}/v1/fs/list?path=~",
            c.base
        ))
        .header("x-api-key", API_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let home_b = home_b["path"].as_str().unwrap().to_string();
    cl.agent(&b)
        .upload("from-session.txt", b"from B\n".to_vec(), None)
        .await
        .unwrap();
    // `berth sandbox open` prints a fresh one-time URL (and `--json` its expiry).
    let out = Command::new(workspace_bin("berth"))
        .args(["sandbox", "open", &b, "--json"])
        .env("BERTH_URL", &c.base)
        .env("BERTH_API_KEY", API_KEY)
        .env_remove("SANDBOX_GATEWAY_URL")
        .env_remove("SANDBOX_API_KEY")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let url = printed["url"].as_str().unwrap();
    assert!(printed["expires_at"].is_string(), "{printed}");
    let (cookie_b, _) = open(url).await;
    assert_eq!(status(&page(&c, &b), Some(&cookie_b)).await, 200);
    assert_eq!(status(&page(&c, &a), Some(&cookie_b)).await, 401);
    // An artifact of B: listed and served on B's page, never through A's.
    let published: Value = http()
        .post(format!("{}/sandbox/sandboxes/v1/{b}/artifacts", c.base))
        .header("x-api-key", API_KEY)
        .json(&serde_json::json!({"path": format!("{home_b}/from-session.txt")}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let art = published["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{published}"));
    let listed: Value = get(&format!("{api_b}artifacts"), Some(&cookie_b))
        .await
        .json()
        .await
        .unwrap();
    assert!(
        listed["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["id"] == art),
        "{listed}"
    );
    let bytes = get(&format!("{api_b}artifacts/{art}"), Some(&cookie_b)).await;
    assert_eq!(bytes.status(), StatusCode::OK);
    assert_eq!(bytes.text().await.unwrap(), "from B\n");
    assert_eq!(
        status(&format!("{api}artifacts/{art}"), Some(&cookie)).await,
        404,
        "A's page serves only A's artifacts"
    );
    assert_eq!(
        status(&format!("{api_b}artifacts/{art}"), Some(&cookie)).await,
        401
    );
    let out = Command::new(workspace_bin("berth"))
        .args(["sandbox", "open", &b])
        .env("BERTH_URL", &c.base)
        .env("BERTH_API_KEY", API_KEY)
        .env_remove("SANDBOX_GATEWAY_URL")
        .env_remove("SANDBOX_API_KEY")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.trim().starts_with(&page(&c, &b)), "{text}");

    // After the delete: the page, its timeline and artifacts still answer; the live panes
    // are told the sandbox is gone.
    cl.delete(&a).await.unwrap();
    assert_eq!(status(&page(&c, &a), Some(&cookie)).await, 200);
    let info: Value = get(&format!("{api}info"), Some(&cookie))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(info["gone"], true, "{info}");
    assert_eq!(info["running"], false, "{info}");
    let events: Value = get(&format!("{api}events"), Some(&cookie))
        .await
        .json()
        .await
        .unwrap();
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(
        kinds
            .iter()
            .any(|k| k.contains("delet") || k.contains("stop")),
        "{kinds:?}"
    );
    assert_eq!(status(&format!("{api}artifacts"), Some(&cookie)).await, 200);
    assert_eq!(
        status(&format!("{api}agent/fs/list?path=~"), Some(&cookie)).await,
        409,
        "no agent to reach"
    );
    let minted = mint(&c, &a).await;
    assert!(
        !open(&minted.url).await.1.is_empty(),
        "a deleted sandbox's session opens"
    );
}

/// Chromium opens the session view, checks each pane and saves a full-page screenshot.
const PLAYWRIGHT_PY: &str = r##"
import json, sys, base64
from playwright.sync_api import sync_playwright
url, upload, shot = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--autoplay-policy=no-user-gesture-required"])
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    out["url"] = page.url
    out["cookie_visible"] = page.evaluate("document.cookie")
    # The desktop: noVNC connects and its canvas draws something other than one colour.
    page.wait_for_selector("#desktop[data-state=connected]", timeout=60000)
    page.wait_for_function("""() => {
        const c = document.querySelector('#desktop canvas');
        if (!c || !c.width) return false;
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        const seen = new Set();
        for (let i = 0; i < d.length; i += 4 * 97) seen.add(d[i] << 16 | d[i+1] << 8 | d[i+2]);
        return seen.size > 8;
    }""", timeout=60000)
    out["canvas"] = page.evaluate("(() => { const c = document.querySelector('#desktop canvas'); return [c.width, c.height]; })()")
    # The terminal: type a command, read the output back from xterm.js's buffer.
    page.wait_for_selector("#terminal[data-state=attached]", timeout=30000)
    page.click("#terminal")
    page.keyboard.type("echo berth-$((6*7)) > ~/typed.txt; echo done-$((2*3))\n")
    page.wait_for_function("() => window.berthSession.termText().includes('done-6')", timeout=30000)
    out["terminal"] = page.evaluate("window.berthSession.termText()")
    # Upload through the file input.
    page.set_input_files("#upload-input", upload)
    page.wait_for_function("() => document.querySelector('#upload-status').textContent.startsWith('Uploaded')", timeout=30000)
    out["upload_status"] = page.inner_text("#upload-status")
    # Download typed.txt from the tree.
    page.click("#files-refresh")
    page.wait_for_selector("a[download='typed.txt']", timeout=30000)
    with page.expect_download() as d:
        page.click("a[download='typed.txt']")
    out["download"] = base64.b64encode(open(d.value.path(), "rb").read()).decode()
    # The recording: the player plays (currentTime advances); the episode's markers.
    page.wait_for_function("() => document.querySelector('#player').src !== ''", timeout=30000)
    page.evaluate("(() => { const v = document.querySelector('#player'); v.muted = true; return v.play(); })()")
    page.wait_for_function("() => document.querySelector('#player').currentTime > 0.5", timeout=30000)
    out["current_time"] = page.evaluate("document.querySelector('#player').currentTime")
    out["duration"] = page.evaluate("document.querySelector('#player').duration")
    out["artifacts"] = page.evaluate("window.berthSession.artifacts.map(a => a.content_type)")
    out["markers"] = page.evaluate("document.querySelectorAll('#markers .marker').length")
    out["actions"] = page.evaluate("window.berthSession.actions.length")
    page.evaluate("document.querySelector('#player').pause()")
    page.screenshot(path=shot, full_page=True)
    out["errors"] = errors
    browser.close()
print(json.dumps(out))
"##;

async fn chromium_drives_the_session_view(provider: Provider) {
    let c = ControllerProcess::start_on(provider, "").await;
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "desktop".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let id = sb.id.clone();
    let agent = cl.agent(&id);
    // A recording with a few actions in it, stopped: published as the sandbox's artifact.
    let rec = agent
        .start_recording(&RecordingRequest::default())
        .await
        .unwrap();
    for (x, y) in [(200, 200), (400, 300), (600, 250)] {
        let r = http()
            .post(format!("{}/sandbox/sandboxes/v1/{id}/v1/computer", c.base))
            .header("x-api-key", API_KEY)
            .json(&serde_json::json!({"action": "mouse_move", "coordinate": [x, y]}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{:?}", r.text().await);
    }
    wait_for(
        "three seconds of recording",
        Duration::from_secs(30),
        || async {
            let r = agent.recording(&rec.id).await.ok()?;
            (r.duration_ms >= 3000).then_some(())
        },
    )
    .await;
    agent.stop_recording(&rec.id).await.unwrap();
    wait_for(
        "the recording as an artifact",
        Duration::from_secs(30),
        || async {
            let url = format!("{}/sandbox/v1/artifacts?sandbox={id}", c.base);
            let r = http()
                .get(url)
                .header("x-api-key", API_KEY)
                .send()
                .await
                .ok()?;
            let v: Value = r.json().await.ok()?;
            v["artifacts"]
                .as_array()?
                .iter()
                .any(|a| a["content_type"] == "video/mp4")
                .then_some(())
        },
    )
    .await;

    let tmp = tempfile::tempdir().unwrap();
    let upload = tmp.path().join("uploaded.bin");
    let bytes: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&upload, &bytes).unwrap();
    let update = std::env::var("BERTH_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1");
    let shot = match update {
        true => {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("screenshots/session-view.png")
        }
        false => tmp.path().join("session-view.png"),
    };
    let url = mint(&c, &id).await.url;
    let args = [
        url,
        upload.display().to_string(),
        shot.display().to_string(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .args(["240", "python3", "-c", PLAYWRIGHT_PY])
            .args(args)
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
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("{}", serde_json::to_string_pretty(&seen).unwrap());
    assert_eq!(
        seen["url"],
        page(&c, &id).as_str(),
        "the token left the address bar"
    );
    assert_eq!(seen["cookie_visible"], "", "the cookie is HttpOnly");
    assert!(seen["terminal"].as_str().unwrap().contains("done-6"));
    // The typed command ran in the sandbox.
    let typed = fetch(&agent, "typed.txt").await;
    assert_eq!(typed, b"berth-42\n");
    let downloaded = base64_decode(seen["download"].as_str().unwrap());
    assert_eq!(downloaded, typed, "the download is the file's bytes");
    let uploaded = fetch(&agent, "uploaded.bin").await;
    assert_eq!(uploaded, bytes, "the upload is the file's bytes");
    assert!(seen["current_time"].as_f64().unwrap() > 0.5, "{seen}");
    assert!(seen["duration"].as_f64().unwrap() >= 2.5, "{seen}");
    // The episode: the three actions logged during the recording, each a marker on its bar.
    assert!(seen["actions"].as_u64().unwrap() >= 3, "{seen}");
    assert!(seen["markers"].as_u64().unwrap() >= 3, "{seen}");
    assert_eq!(
        seen["errors"],
        serde_json::json!([]),
        "no script errors on the page"
    );
    assert_eq!(seen["canvas"][0], 1920, "{seen}");
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    cl.delete(&id).await.unwrap();
}

async fn fetch(agent: &berth_protocol::client::AgentClient, path: &str) -> Vec<u8> {
    let r = agent.download(path).await.unwrap();
    r.bytes().await.unwrap().to_vec()
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

mod process {
    #[tokio::test]
    async fn chromium_drives_the_session_view() {
        super::chromium_drives_the_session_view(berth_tests::controller::Provider::Process).await
    }
}

mod docker {
    #[tokio::test]
    async fn chromium_drives_the_session_view() {
        super::chromium_drives_the_session_view(berth_tests::controller::Provider::Docker).await
    }
}
