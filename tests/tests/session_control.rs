//! A person taking the controls of a Docker desktop sandbox, and the session view's new panes,
//! through the controller: the control lease over REST (take, renew, hand back, one holder,
//! expiry), the agent's routes refused with `409 human_in_control` meanwhile (native, compat,
//! MCP) and open to the holder's token, the toolset's next answer after a hand-back, a
//! `kill -9` of the controller while a person holds the controls, and the panes' data (the
//! browser's tabs, a repository's diff, the runs, the workspace) live and as the record kept
//! after the delete.

use std::time::Duration;

use berth_protocol::ExecRequest;
use berth_protocol::controller::Command as RunCommand;
use berth_protocol::controller::{CreateSandbox, RunRequest};
use berth_tests::controller::{API_KEY, ControllerProcess, Provider};
use berth_tests::{screenshot_path, wait_for};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Run as root in the sandbox's container: the controls' pushes made with the agent's token
/// alone (as an engine handed the token would), each answered `[status, error code]`; and
/// whether the controls are still held.
const DIRECT_PUSHES: &str = r#"
import json, urllib.request
env = dict(kv.split("=", 1) for kv in open("/proc/1/environ").read().split("\0") if "=" in kv)
token = env["BERTH_AGENT_TOKEN"]
def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request("http://127.0.0.1:5000" + path, data, method=method,
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
out = {}
for method, path, body in [
    ("DELETE", "/v1/control", None),
    ("PUT", "/v1/control", {"holder_sha256": "0" * 64, "ttl_ms": 1000}),
    ("PUT", "/v1/control/settings", {"requests_enabled": False}),
    ("POST", "/v1/control/decline", None),
    ("PUT", "/v1/control/key", {"key_sha256": "1" * 64}),
    ("POST", "/v1/browser/login", {"url": "https://x.test/login", "password": "p"}),
    ("POST", "/v1/browser/forget", {"hosts": ["x.test"]}),
]:
    code, b = call(method, path, body)
    out[method + " " + path] = [code, b.get("error", {}).get("code")]
code, b = call("GET", "/v1/control")
out["GET /v1/control"] = [code, b.get("held")]
print(json.dumps(out))
"#;

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

struct Sb {
    base: String,
}

impl Sb {
    fn url(&self, rest: &str) -> String {
        format!("{}{rest}", self.base)
    }

    async fn call(
        &self,
        m: reqwest::Method,
        rest: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut rb = http()
            .request(m, self.url(rest))
            .header("x-api-key", API_KEY);
        if let Some(t) = token {
            rb = rb.header("x-berth-control", t);
        }
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.unwrap();
        let status = r.status().as_u16();
        let bytes = r.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(json!({"raw_len": bytes.len()})),
        )
    }
}

const SETUP: &str = "set -e; cd ~; git init -q --bare remote.git; git clone -q remote.git work/demo 2>/dev/null; \
cd work/demo; git config user.email t@example.com; git config user.name Tester; \
printf 'one\\n' > notes.txt; git add notes.txt; git commit -qm init; git push -q origin HEAD; \
printf 'two\\n' > committed.txt; git add committed.txt; git commit -qm 'add committed.txt'; \
printf 'uncommitted line\\n' >> notes.txt; head -c 3000 /dev/urandom > blob.bin; git add blob.bin; \
seq 1 100000 > huge.txt";

#[tokio::test]
async fn a_person_takes_the_controls_and_the_panes_show_the_workspace() {
    let mut c = ControllerProcess::start_on(Provider::Docker, "").await;
    let cl = c.client();
    let sb = cl
        .create(&CreateSandbox {
            profile: "desktop".into(),
            human_control: Some(true),
            logins: Vec::new(),
            ..Default::default()
        })
        .await
        .unwrap();
    let id = sb.id.clone();
    let mut s = Sb {
        base: format!("{}/sandbox/sandboxes/v1/{id}", c.base),
    };
    let agent = cl.agent(&id);
    let setup = agent.exec(&ExecRequest::shell(SETUP)).await.unwrap();
    assert_eq!(setup.exit_code, 0, "{setup:?}");

    // Nobody holds the controls: the agent acts.
    let (st, v) = s.call(reqwest::Method::GET, "/control", None, None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["held"].as_bool(), v["requests_enabled"].as_bool()),
        (Some(false), Some(true)),
        "{v}"
    );
    assert_eq!(
        s.call(reqwest::Method::GET, "/v1/screenshot", None, None)
            .await
            .0,
        200
    );

    // A person takes them (the API key): a token, once.
    let (st, taken) = s
        .call(
            reqwest::Method::POST,
            "/control",
            None,
            Some(json!({"ttl_seconds": 60})),
        )
        .await;
    assert_eq!(st, 200, "{taken}");
    let token = taken["token"]
        .as_str()
        .expect("a token on the take")
        .to_string();
    assert_eq!(
        (taken["you"].as_bool(), taken["holder"].as_str()),
        (Some(true), Some("api_key"))
    );
    // Another taker is refused; the relay does not let a caller push the agent's lease.
    let (st, other) = s
        .call(
            reqwest::Method::POST,
            "/control",
            Some("not-the-token"),
            None,
        )
        .await;
    assert_eq!(
        (st, other["error"]["code"].as_str()),
        (409, Some("control_held")),
        "{other}"
    );
    let (st, _) = s
        .call(reqwest::Method::DELETE, "/v1/control", None, None)
        .await;
    assert_eq!(
        st, 404,
        "an engine cannot hand itself the controls back through the relay"
    );
    let (st, e) = s
        .call(reqwest::Method::DELETE, "/control", None, None)
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (409, Some("not_holder")),
        "{e}"
    );
    // Nor can an engine holding the agent's token itself (read here as root from the agent's
    // environment): the controller claimed the controls' pushes with a key of its own.
    let direct: Value = serde_json::from_str(&berth_tests::egress::docker(&[
        "exec",
        &format!("berth-{id}"),
        "python3",
        "-c",
        DIRECT_PUSHES,
    ]))
    .unwrap();
    println!("pushes with the agent token alone: {direct}");
    for call in [
        "DELETE /v1/control",
        "PUT /v1/control",
        "PUT /v1/control/settings",
        "POST /v1/control/decline",
        "PUT /v1/control/key",
        "POST /v1/browser/login",
        "POST /v1/browser/forget",
    ] {
        let want = if call.ends_with("/key") {
            (409, "control_key_set")
        } else if call.contains("/browser/") {
            (403, "login_controller_only")
        } else {
            (403, "not_the_controller")
        };
        assert_eq!(
            (direct[call][0].as_u64(), direct[call][1].as_str()),
            (Some(want.0), Some(want.1)),
            "{call}: {direct}"
        );
    }
    assert_eq!(direct["GET /v1/control"][0], 200, "{direct}");
    assert_eq!(direct["GET /v1/control"][1], true, "still held: {direct}");

    // Every input and observation route refuses the agent; the holder's token passes.
    let refused = [
        (reqwest::Method::GET, "/v1/screenshot", None),
        (
            reqwest::Method::POST,
            "/v1/computer",
            Some(json!({"action": "mouse_move", "coordinate": [5, 5]})),
        ),
        (
            reqwest::Method::POST,
            "/v1/input",
            Some(json!({"actions": [{"type": "move", "x": 5, "y": 5}]})),
        ),
        (reqwest::Method::GET, "/v1/clipboard", None),
        (reqwest::Method::GET, "/v1/a11y", None),
        (
            reqwest::Method::POST,
            "/v1/toolsets/computer",
            Some(
                json!({"content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "toolset_name": "computer", "input": {}}]}),
            ),
        ),
    ];
    for (m, path, body) in &refused {
        let (st, v) = s.call(m.clone(), path, None, body.clone()).await;
        assert_eq!(
            (st, v["error"]["code"].as_str()),
            (409, Some("human_in_control")),
            "{path}: {v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("refused, not queued"),
            "{v}"
        );
    }
    println!("refused while held: {} routes", refused.len());
    // OSWorld's compat surface: observations and pyautogui actions are refused; a command
    // that does not drive the desktop still runs (the harness's setup and its checks).
    let compat = sb.endpoints.compat.clone().expect("a compat endpoint");
    let post = |path: &str, body: Value| {
        let url = format!("{compat}{path}");
        async move {
            let r = http().post(url).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let compat_shot = http()
        .get(format!("{compat}/screenshot"))
        .send()
        .await
        .unwrap();
    assert_eq!(compat_shot.status().as_u16(), 409);
    let (st, text) = post("/execute", json!({"command": ["python3", "-c", "import pyautogui; pyautogui.click(5, 5)"], "shell": false})).await;
    assert_eq!(st, 409, "{text}");
    assert!(text.contains("human_in_control"), "{text}");
    let (st, text) = post(
        "/run_python",
        json!({"code": "import pyautogui\npyautogui.press('a')"}),
    )
    .await;
    assert_eq!(st, 409, "{text}");
    let (st, text) = post(
        "/execute",
        json!({"command": ["echo", "setup-runs"], "shell": false}),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    assert!(text.contains("setup-runs"), "{text}");
    let (st, _) = s
        .call(reqwest::Method::GET, "/v1/screenshot", Some(&token), None)
        .await;
    assert_eq!(st, 200, "the holder's own input passes");
    let (st, v) = s
        .call(
            reqwest::Method::PUT,
            "/v1/clipboard",
            Some(&token),
            Some(json!({"text": "clip-from-person"})),
        )
        .await;
    assert_eq!(st, 204, "{v}");
    // Commands that are not desktop input still run (a person's presence does not stop exec).
    let exec = agent
        .exec(&ExecRequest::shell("echo still-runs"))
        .await
        .unwrap();
    assert_eq!(exec.stdout.as_deref(), Some("still-runs\n"));

    // kill -9 while held: after the restart the lease is still valid and still refuses.
    c.kill9();
    c.launch();
    // A restarted controller listens on a new port.
    s.base = format!("{}/sandbox/sandboxes/v1/{id}", c.base);
    let cl = c.client();
    let agent = cl.agent(&id);
    let (st, v) = s
        .call(reqwest::Method::GET, "/v1/screenshot", None, None)
        .await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (409, Some("human_in_control")),
        "{v}"
    );
    // Renewing with the token, then handing back.
    let (st, v) = s
        .call(
            reqwest::Method::POST,
            "/control",
            Some(&token),
            Some(json!({"ttl_seconds": 30})),
        )
        .await;
    assert_eq!(
        (st, v["you"].as_bool(), v.get("token")),
        (200, Some(true), None),
        "{v}"
    );
    let (st, v) = s
        .call(reqwest::Method::DELETE, "/control", Some(&token), None)
        .await;
    assert_eq!((st, v["held"].as_bool()), (200, Some(false)), "{v}");
    let (st, v) = s
        .call(reqwest::Method::GET, "/v1/clipboard", None, None)
        .await;
    assert_eq!(
        (st, v["text"].as_str()),
        (200, Some("clip-from-person")),
        "{v}"
    );

    // The next toolset answer says the screen changed and carries a fresh screenshot.
    let turn = json!({"content": [{"type": "tool_use", "id": "t2", "name": "mouse_move", "toolset_name": "computer", "input": {"coordinate": [20, 20]}}]});
    let (st, v) = s
        .call(
            reqwest::Method::POST,
            "/v1/toolsets/computer",
            None,
            Some(turn.clone()),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let blocks = v["content"][0]["content"].as_array().unwrap();
    let kinds: Vec<&str> = blocks.iter().filter_map(|b| b["type"].as_str()).collect();
    assert_eq!(&kinds[..2], ["text", "image"], "{kinds:?}");
    assert!(
        blocks[0]["text"]
            .as_str()
            .unwrap()
            .starts_with("The screen changed: a person had the controls")
    );
    let (_, v) = s
        .call(
            reqwest::Method::POST,
            "/v1/toolsets/computer",
            None,
            Some(turn),
        )
        .await;
    let kinds: Vec<&str> = v["content"][0]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["type"].as_str())
        .collect();
    assert!(!kinds.contains(&"image"), "once: {kinds:?}");

    // A lease ends by itself.
    let (_, v) = s
        .call(
            reqwest::Method::POST,
            "/control",
            None,
            Some(json!({"ttl_seconds": 10})),
        )
        .await;
    assert_eq!(v["held"], true, "{v}");
    wait_for(
        "the lease to end by itself",
        Duration::from_secs(40),
        || async {
            let (st, _) = s
                .call(reqwest::Method::GET, "/v1/screenshot", None, None)
                .await;
            (st == 200).then_some(())
        },
    )
    .await;

    // The panes' data, live: a tab opened over CDP, the repository's changes, the runs.
    let opened = agent
        .exec(&ExecRequest::shell(
            "python3 - <<'EOF'\nimport json, urllib.request\nfor p in range(9222, 9232):\n    try:\n        r = urllib.request.urlopen(urllib.request.Request(f'http://127.0.0.1:{p}/json/new?data:text/html,<title>berth-tab</title><h1>berth</h1>', method='PUT'), timeout=5)\n        print(json.load(r)['id']); break\n    except Exception: pass\nEOF",
        ))
        .await
        .unwrap();
    println!("tab: {opened:?}");
    let long = cl
        .exec(
            &id,
            &RunRequest {
                command: RunCommand::Line("sleep 600".into()),
                run_id: Some("long-run".into()),
                wait: Some(false),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(long.id, "long-run");
    let big = cl
        .exec(
            &id,
            &RunRequest {
                command: RunCommand::Line("seq 1 200000".into()),
                run_id: Some("big-run".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(
        big.output_artifact.is_some(),
        "a large output is kept by reference: {:?}",
        big.truncated
    );
    let session = c.client().session(&id).await.unwrap().url;
    let cookie = {
        let r = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .unwrap()
            .get(&session)
            .send()
            .await
            .unwrap();
        r.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_string()
    };
    let page = |rest: &str| format!("{}/session/api/{rest}", s.base);
    let get = |rest: String| {
        let cookie = cookie.clone();
        async move {
            let r = http()
                .get(rest)
                .header("cookie", cookie)
                .send()
                .await
                .unwrap();
            let st = r.status();
            (st, r.bytes().await.unwrap().to_vec())
        }
    };
    let (st, body) = get(page("diff")).await;
    assert_eq!(st, StatusCode::OK);
    let diff: Value = serde_json::from_slice(&body).unwrap();
    let repo = &diff["repos"][0];
    assert_eq!(repo["base_name"], "origin/master", "{diff}");
    let files: Vec<(&str, &str)> = repo["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["status"].as_str().unwrap()))
        .collect();
    assert!(files.contains(&("committed.txt", "added")), "{files:?}");
    assert!(files.contains(&("notes.txt", "modified")), "{files:?}");
    assert_eq!(repo["commits"][0]["subject"], "add committed.txt");
    let repo_path = repo["path"].as_str().unwrap().to_string();
    let q = |p: &str| format!("diff/file?repo={}&path={p}", urlencode(&repo_path));
    let (_, body) = get(page(&q("notes.txt"))).await;
    let nd: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        nd["diff"].as_str().unwrap().contains("+uncommitted line"),
        "{nd}"
    );
    let (_, body) = get(page(&q("blob.bin"))).await;
    let bd: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (bd["binary"].as_bool(), bd["diff"].is_null()),
        (Some(true), true),
        "{bd}"
    );
    let (st, _) = get(page(&q("../../etc/passwd"))).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    // A huge diff: its first and last lines, the rest read by range.
    let huge_live = read_huge_diff(&get, &page(&q("huge.txt"))).await;

    let (_, body) = get(page("browser")).await;
    let tabs: Value = serde_json::from_slice(&body).unwrap();
    let active = tabs["tabs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["active"] == true)
        .cloned()
        .unwrap_or_default();
    assert_eq!(active["title"], "berth-tab", "{tabs}");
    let (st, jpeg) = get(page(&format!(
        "browser/screenshot?tab={}",
        active["id"].as_str().unwrap()
    )))
    .await;
    assert_eq!((st, &jpeg[..2]), (StatusCode::OK, &[0xff, 0xd8][..]));
    let (_, body) = get(page("runs")).await;
    let runs: Value = serde_json::from_slice(&body).unwrap();
    let big = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "big-run")
        .unwrap()
        .clone();
    assert_eq!(
        (
            big["preview"].as_bool(),
            big["tail"].as_array().unwrap().last().cloned()
        ),
        (Some(true), Some(json!("200000"))),
        "{big}"
    );
    let (st, whole) = get(page("runs/big-run/output")).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(whole.len() as u64, big["bytes"].as_u64().unwrap());
    let (_, body) = get(page("workspace")).await;
    let ws: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (ws["profile"].clone(), ws["record"].as_bool()),
        (json!(sb.profile), Some(false)),
        "{ws}"
    );
    assert!(
        ws["limits"]["memory_mb"].is_u64() && ws["endpoints"]["cdp"].is_string(),
        "{ws}"
    );
    assert_eq!(ws["repositories"][0]["path"], repo_path.as_str(), "{ws}");

    // The book's curl block (Taking the controls), as written.
    let chapter = berth_tests::readme::chapter("controller/session-control.md");
    let block = berth_tests::readme::block(chapter, "sh", Some("control-curl"));
    let out = std::process::Command::new("bash")
        .args(["-c", &format!("set -e\n{block}")])
        .env("URL", &c.base)
        .env("KEY", API_KEY)
        .env("ID", &id)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        printed.lines().collect::<Vec<_>>(),
        ["human_in_control", "false"],
        "{printed}"
    );

    // Real clients: Chromium (Playwright) on the session view's panes; a person taking the
    // controls there while berth's driver for the anthropic SDK takes turns; the agent asking
    // for a person through the official MCP SDK.
    let tmp = tempfile::tempdir().unwrap();
    let panes = script(&[
        "panes.py",
        &c.client().session(&id).await.unwrap().url,
        &shot(&tmp, "session-panes.png"),
        "live",
        &shot(&tmp, "session-diff-huge.png"),
    ])
    .await;
    assert_eq!(panes["errors"], json!([]), "{panes}");
    assert!(
        panes["active_tab"]
            .as_str()
            .unwrap_or_default()
            .contains("berth-tab"),
        "{panes}"
    );
    assert!(
        panes["browser_img_width"].as_u64().unwrap_or(0) > 0,
        "{panes}"
    );
    let files = panes["diff_files"].to_string();
    assert!(
        files.contains("notes.txt")
            && files.contains("committed.txt")
            && files.contains("blob.bin"),
        "{files}"
    );
    assert!(
        panes["diff_text"]
            .as_str()
            .unwrap_or_default()
            .contains("uncommitted line"),
        "{panes}"
    );
    assert!(
        panes["runs"].to_string().contains("long-run")
            && panes["runs"].to_string().contains("big-run"),
        "{panes}"
    );
    assert!(
        panes["big_output_len"].as_u64().unwrap_or(0) > 1_000_000,
        "{panes}"
    );
    assert_eq!(panes["big_output_has_last"], true, "{panes}");
    assert_huge_diff_shown(&panes);
    assert!(
        panes["workspace"]
            .as_str()
            .unwrap_or_default()
            .contains(&sb.profile),
        "{panes}"
    );
    takeover(&s, &agent, &c, &id, &tmp).await;
    asking(&s, &c, &id, &tmp).await;

    // After the delete the panes render from the record.
    let record_url = c.client().session(&id).await.unwrap().url;
    cl.delete(&id).await.unwrap();
    let rec = script(&[
        "panes.py",
        &record_url,
        &shot(&tmp, "session-record.png"),
        "record",
    ])
    .await;
    assert_eq!(rec["errors"], json!([]), "{rec}");
    assert_huge_diff_shown(&rec);
    for pane in ["browser", "diff", "agents", "workspace"] {
        assert!(
            rec["notes"][pane]
                .as_str()
                .unwrap_or_default()
                .to_lowercase()
                .contains("record"),
            "{pane}: {rec}"
        );
    }
    assert!(
        rec["diff_text"]
            .as_str()
            .unwrap_or_default()
            .contains("uncommitted line"),
        "{rec}"
    );
    let (_, body) = get(page("diff")).await;
    let rec: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(rec["record"], true, "{rec}");
    assert_eq!(
        rec["repos"][0]["files"], repo["files"],
        "the record keeps the last diff"
    );
    let (_, body) = get(page(&q("notes.txt"))).await;
    let nd: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        nd["diff"].as_str().unwrap().contains("+uncommitted line"),
        "{nd}"
    );
    // The record keeps the huge diff whole, read by range as it was live.
    assert_eq!(
        read_huge_diff(&get, &page(&q("huge.txt"))).await,
        huge_live,
        "the record's huge diff"
    );
    let (_, body) = get(page("browser")).await;
    let rb: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (
            rb["record"].as_bool(),
            rb["tabs"].as_array().map(|t| !t.is_empty())
        ),
        (Some(true), Some(true)),
        "{rb}"
    );
    let (_, body) = get(page("runs")).await;
    let rr: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(rr["record"], true);
    let (_, body) = get(page("events")).await;
    let ev: Value = serde_json::from_slice(&body).unwrap();
    let kinds: Vec<&str> = ev["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    for k in ["control.taken", "control.returned"] {
        assert!(kinds.contains(&k), "{k}: {kinds:?}");
    }
}

fn shot(tmp: &tempfile::TempDir, name: &str) -> String {
    screenshot_path(name, tmp.path()).display().to_string()
}

/// Runs `tests/session/<script> args…` (bounded) and answers the JSON it prints.
async fn script(args: &[&str]) -> Value {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("session");
    let mut cmd = std::process::Command::new("timeout");
    cmd.arg("400")
        .arg("python3")
        .arg(dir.join(args[0]))
        .args(&args[1..]);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("python3 (tests/setup.sh)"))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {stdout}\n{}",
        args[0],
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap_or("null")).unwrap();
    println!("{}: {}", args[0], serde_json::to_string_pretty(&v).unwrap());
    v
}

/// A person in the session view takes the controls while the agent's SDK turns are refused,
/// types into a terminal the agent opened; a second viewer's typing is dropped; the clipboard
/// goes in and out; after the hand-back the next turn carries the notice.
async fn takeover(
    s: &Sb,
    agent: &berth_protocol::AgentClient,
    c: &ControllerProcess,
    id: &str,
    tmp: &tempfile::TempDir,
) {
    let start = "rm -f ~/typed-by-person.txt; xfce4-terminal --disable-server --maximize -T typed-here \
                 -x sh -c 'stty -echo; cat > ~/typed-by-person.txt'";
    agent
        .exec_background(&ExecRequest {
            background: Some(true),
            ..ExecRequest::shell(start)
        })
        .await
        .unwrap();
    wait_for("the terminal's window", Duration::from_secs(60), || async {
        let (_, v) = s
            .call(reqwest::Method::GET, "/v1/windows", None, None)
            .await;
        v.to_string().contains("typed-here").then_some(())
    })
    .await;
    let (a, b) = (
        c.client().session(id).await.unwrap().url,
        c.client().session(id).await.unwrap().url,
    );
    let dir = tmp.path().display().to_string();
    let out = script(&["takeover.py", &c.base, API_KEY, id, &a, &b, &dir]).await;
    if std::env::var("BERTH_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
        let _ = std::fs::copy(
            tmp.path().join("session-takeover.png"),
            screenshot_path("session-takeover.png", tmp.path()),
        );
    }
    assert_eq!(
        (out["errors_a"].clone(), out["errors_b"].clone()),
        (json!([]), json!([])),
        "{out}"
    );
    for r in out["refused"].as_array().unwrap() {
        assert_eq!(r["is_error"], true, "{r}");
        assert!(
            r["text"].as_str().unwrap().starts_with("human_in_control:"),
            "{r}"
        );
    }
    assert_eq!(out["clipboard_back"], "clip-from-person", "{out}");
    assert!(
        out["after"]["first_text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("The screen changed"),
        "{out}"
    );
    let typed = agent
        .exec(&ExecRequest::shell("cat ~/typed-by-person.txt"))
        .await
        .unwrap();
    let typed = typed.stdout.unwrap_or_default();
    assert!(
        typed.contains("person-typed-42"),
        "the holder's typing reached the sandbox: {typed:?}"
    );
    assert!(
        !typed.contains("viewer-b-typed"),
        "a second viewer's typing was dropped: {typed:?}"
    );
}

/// The agent asks for a person through the MCP SDK; the session view shows the banner; a
/// person takes and hands back (`returned`), then declines (`declined`).
async fn asking(s: &Sb, c: &ControllerProcess, id: &str, tmp: &tempfile::TempDir) {
    let url = c.client().session(id).await.unwrap().url;
    let out = script(&[
        "request.py",
        &c.base,
        API_KEY,
        id,
        &url,
        &shot(tmp, "session-request.png"),
    ])
    .await;
    assert_eq!(out["errors"], json!([]), "{out}");
    assert_eq!(out["listed"], true, "{out}");
    assert_eq!(out["refused_is_error"], true, "{out}");
    assert!(
        out["refused_text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("human_in_control:"),
        "{out}"
    );
    assert_eq!(out["after_is_error"], false, "{out}");
    assert!(
        out["returned_text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("returned:"),
        "{out}"
    );
    assert!(
        out["declined_text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("declined:"),
        "{out}"
    );
    let (_, v) = s.call(reqwest::Method::GET, "/control", None, None).await;
    assert_eq!(
        (v["held"].as_bool(), v["request"].is_null()),
        (Some(false), true),
        "{v}"
    );
}

/// huge.txt's diff (`seq 1 100000`, untracked) through the session view: a preview of its
/// ends, then the whole read part after part by `offset`; a range past the end is a 400.
async fn read_huge_diff<F, Fut>(get: &F, url: &str) -> String
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = (StatusCode, Vec<u8>)>,
{
    let (st, body) = get(url.to_string()).await;
    assert_eq!(st, StatusCode::OK);
    let d: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (d["huge"].as_bool(), d["diff"].is_null()),
        (Some(true), true),
        "{d}"
    );
    let bytes = d["bytes"].as_u64().unwrap();
    let p = &d["preview"];
    assert!(p["head"].as_str().unwrap().contains("+1\n+2\n"), "{p}");
    assert!(
        p["tail"].as_str().unwrap().ends_with("+99999\n+100000\n"),
        "{p}"
    );
    assert_eq!(p["bytes"], bytes);
    let mut text = String::new();
    let mut parts = 0;
    while (text.len() as u64) < bytes {
        let (st, body) = get(format!("{url}&offset={}", text.len())).await;
        assert_eq!(st, StatusCode::OK);
        let part: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(part["offset"], text.len() as u64, "{}", part["offset"]);
        let piece = part["diff"].as_str().unwrap();
        assert!(!piece.is_empty());
        text.push_str(piece);
        parts += 1;
    }
    println!("huge diff: {bytes} bytes read in {parts} parts");
    assert!(parts >= 2, "{parts}");
    let numbers: String = (1..=100_000).map(|i| format!("+{i}\n")).collect();
    assert!(text.ends_with(&numbers), "the whole diff");
    let (st, _) = get(format!("{url}&offset={}", bytes + 1)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    text
}

/// The diff pane showed huge.txt's ends with what it left out, and loaded the whole on demand.
fn assert_huge_diff_shown(panes: &Value) {
    assert!(
        panes["huge_gap"]
            .as_str()
            .unwrap_or_default()
            .contains("not shown"),
        "{panes}"
    );
    assert_eq!(panes["huge_preview_has_last"], true, "{panes}");
    assert_eq!(panes["huge_loaded"], true, "{panes}");
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
