//! MCP through the controller, with the official MCP Python SDK (tests/mcp_controller/client.py)
//! and raw HTTP: the controller's own `/mcp` (sandbox and lease tools, calling the same domain
//! code as the REST routes) and a sandbox's `/mcp` relayed to its agent (a Docker desktop from
//! the real image, and a process sandbox for the transport on the wire).

use std::collections::BTreeSet;
use std::time::Duration;

use berth_protocol::routes::{controller as route, fill, header};
use berth_tests::controller::{API_KEY, ControllerProcess, Provider};
use berth_tests::wait_for;
use futures_util::StreamExt;
use serde_json::{Value, json};

const CONTROLLER_TOOLS: [&str; 14] = [
    "acquire_lease",
    "create_sandbox",
    "delete_sandbox",
    "get_sandbox",
    "list_artifacts",
    "list_sandboxes",
    "publish_artifact",
    "release_lease",
    "workpiece_create",
    "workpiece_list",
    "workpiece_proposal",
    "workpiece_proposals",
    "workpiece_propose",
    "workpiece_read",
];
/// What `Accept` an MCP client sends on a POST.
const ACCEPT: &str = "application/json, text/event-stream";

/// Runs tests/mcp_controller/client.py with `args`; the JSON it printed.
async fn client_py(args: &[&str]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp_controller/client.py");
    let run = tokio::process::Command::new("python3")
        .arg(script)
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the MCP Python client finishes within 300 s")
        .expect("python3 with the mcp package (tests/setup.sh)");
    assert!(
        out.status.success(),
        "client.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn mcp_url(c: &ControllerProcess, id: &str) -> String {
    format!("{}{}", c.base, fill(route::SANDBOX_MCP, &[id]))
}

/// The answer's text block is the structured content, as JSON.
fn text_is_structured(a: &Value) {
    let text = a["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text block: {a}"));
    let parsed: Value = serde_json::from_str(text).unwrap();
    assert_eq!(&parsed, &a["structured"], "{a}");
}

fn ids(list: &Value) -> BTreeSet<String> {
    list["structured"]["sandboxes"]
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn python_sdk_manages_sandboxes_and_leases_through_the_controller_mcp() {
    let c = ControllerProcess::start("").await;
    let url = format!("{}{}", c.base, route::MCP);
    let v = client_py(&["controller", &url, API_KEY, "ide"]).await;

    assert_eq!(v["server"]["name"], "berth-controller", "{}", v["server"]);
    assert_eq!(v["server"]["protocol_version"], "2025-11-25");
    assert!(
        v["server"]["instructions"]
            .as_str()
            .is_some_and(|i| i.contains("mcp_url")),
        "{}",
        v["server"]
    );
    let tools = v["tools"].as_object().unwrap();
    let names: BTreeSet<&str> = tools.keys().map(String::as_str).collect();
    assert_eq!(names, CONTROLLER_TOOLS.into_iter().collect());
    for (name, t) in tools {
        assert_eq!(t["input_schema"]["type"], "object", "{name}: {t}");
        assert_eq!(t["output_schema"]["type"], "object", "{name}: {t}");
        assert!(
            t["description"].as_str().is_some_and(|d| d.len() > 20),
            "{name}: {t}"
        );
    }
    // The create's input is the REST body (`CreateSandbox`) and `wait`.
    let create_in = &tools["create_sandbox"]["input_schema"];
    assert_eq!(create_in["required"], json!(["profile"]), "{create_in}");
    for field in [
        "profile",
        "image_ref",
        "labels",
        "ttl_seconds",
        "screen",
        "wait",
    ] {
        assert!(
            create_in["properties"][field].is_object(),
            "{field}: {create_in}"
        );
    }
    let lease_in = &tools["acquire_lease"]["input_schema"];
    for field in ["thread_id", "profile", "labels", "ttl_seconds"] {
        assert!(
            lease_in["properties"][field].is_object(),
            "{field}: {lease_in}"
        );
    }

    // Create: ready, labelled, with its own MCP URL; the same sandbox REST shows.
    let created = &v["create"];
    assert_eq!(created["is_error"], false, "{created}");
    text_is_structured(created);
    let sb = &created["structured"];
    let id = sb["id"].as_str().unwrap();
    assert_eq!(sb["status"], "running", "{sb}");
    assert_eq!(sb["labels"], json!({"suite": "mcp"}));
    assert_eq!(sb["mcp_url"], mcp_url(&c, id));
    // The REST answer, read after the script deleted it: the same but for the status.
    let mut rest = serde_json::to_value(c.client().get(id).await.unwrap()).unwrap();
    assert_eq!(rest["status"], "stopped");
    rest["status"] = json!("running");
    rest["mcp_url"] = json!(mcp_url(&c, id));
    assert_eq!(sb, &rest);

    // List: by label and by status, as the REST list filters.
    assert_eq!(ids(&v["list"]), BTreeSet::from([id.to_string()]));
    assert_eq!(
        v["list"]["structured"]["sandboxes"][0]["mcp_url"],
        mcp_url(&c, id)
    );
    assert!(ids(&v["list_other"]).is_empty(), "{}", v["list_other"]);
    assert!(
        ids(&v["list_running"]).contains(id),
        "{}",
        v["list_running"]
    );
    assert_eq!(v["get"]["structured"]["id"], id);
    assert_eq!(v["get"]["structured"]["mcp_url"], mcp_url(&c, id));

    // A domain error is a tool error carrying the REST error body.
    let unknown = &v["get_unknown"];
    assert_eq!(unknown["is_error"], true, "{unknown}");
    assert_eq!(
        unknown["structured"],
        json!({"error": {"code": "not_found", "message": "no sandbox sb_nosuch"}})
    );
    text_is_structured(unknown);
    let bad_profile = &v["bad_profile"];
    assert_eq!(bad_profile["is_error"], true, "{bad_profile}");
    let rest_err = reqwest::Client::new()
        .post(format!("{}{}", c.base, route::SANDBOXES))
        .header(header::API_KEY, API_KEY)
        .json(&json!({"profile": "no-such-profile"}))
        .send()
        .await
        .unwrap();
    assert!(rest_err.status().is_client_error(), "{}", rest_err.status());
    let rest_err: Value = rest_err.json().await.unwrap();
    assert_eq!(bad_profile["structured"], rest_err, "the REST error body");
    // Arguments that do not parse are tool errors too, naming what is wrong.
    for (k, word) in [("bad_status", "sleeping"), ("bad_field", "bogus")] {
        let a = &v[k];
        assert_eq!(a["is_error"], true, "{k}: {a}");
        let text = a["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains(word), "{k}: {a}");
    }

    // Leases: idempotent per thread, released (its sandbox destroyed).
    let lease = &v["acquire"];
    assert_eq!(lease["is_error"], false, "{lease}");
    text_is_structured(lease);
    let lease_id = lease["structured"]["lease_id"].as_str().unwrap();
    let leased = lease["structured"]["sandbox"]["id"].as_str().unwrap();
    assert_eq!(lease["structured"]["sandbox"]["status"], "running");
    assert_eq!(lease["structured"]["thread_id"], "mcp-thread");
    assert_eq!(lease["structured"]["mcp_url"], mcp_url(&c, leased));
    assert_ne!(leased, id);
    assert_eq!(v["acquire_again"]["structured"]["lease_id"], lease_id);
    assert_eq!(v["acquire_again"]["structured"]["how"], "reused");
    assert_eq!(
        v["release"]["structured"],
        json!({"lease_id": lease_id, "released": true})
    );
    assert_eq!(v["release_unknown"]["is_error"], true);
    assert_eq!(
        v["release_unknown"]["structured"]["error"]["code"],
        "not_found"
    );
    assert_eq!(c.client().get(leased).await.unwrap().status, "stopped");

    // Delete: answered stopped; gone from the list and from the host.
    assert_eq!(v["delete"]["is_error"], false, "{}", v["delete"]);
    assert_eq!(v["delete"]["structured"]["status"], "stopped");
    assert!(ids(&v["list_after"]).is_empty(), "{}", v["list_after"]);
    wait_for(
        "every sandbox's processes to end",
        Duration::from_secs(20),
        || async { c.all_leftovers().is_empty().then_some(()) },
    )
    .await;

    // A client of protocol 2026-07-28 (no session) sees the same tools.
    assert_eq!(v["stateless"]["protocol_version"], "2026-07-28");
    assert_eq!(
        v["stateless"]["tools"],
        json!(CONTROLLER_TOOLS),
        "{}",
        v["stateless"]
    );
}

fn initialize_body() -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "berth-tests", "version": "0"}
        }
    })
}

fn mcp_post(url: &str, key: Option<&str>) -> reqwest::RequestBuilder {
    let mut r = reqwest::Client::new()
        .post(url)
        .header("accept", ACCEPT)
        .header("content-type", "application/json");
    if let Some(k) = key {
        r = r.header(header::API_KEY, k);
    }
    r
}

#[tokio::test]
async fn the_api_key_guards_both_mcp_routes_and_unknown_or_stopped_sandboxes_are_named() {
    let c = ControllerProcess::start("").await;
    let own = format!("{}{}", c.base, route::MCP);
    let unknown = mcp_url(&c, "sb_nosuch");
    for url in [&own, &unknown] {
        for key in [None, Some("wrong-key")] {
            let r = mcp_post(url, key)
                .json(&initialize_body())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 401, "{url} with {key:?}");
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        }
    }
    let r = mcp_post(&unknown, Some(API_KEY))
        .json(&initialize_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": {"code": "not_found", "message": "no sandbox sb_nosuch"}})
    );

    // A sandbox that is not running: the controller's usual conflict, named.
    let cl = c.client();
    let sb = cl.create(&berth_tests::controller::ide()).await.unwrap();
    cl.delete(&sb.id).await.unwrap();
    let r = mcp_post(&mcp_url(&c, &sb.id), Some(API_KEY))
        .json(&initialize_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "conflict", "{body}");
    assert_eq!(
        body["error"]["message"],
        format!("sandbox {} is stopped", sb.id)
    );
}

/// The session's SSE data lines, read until one holds a JSON-RPC answer with `id`.
async fn sse_answer(resp: reqwest::Response, id: u64) -> Value {
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        for line in text.lines() {
            if let Some(data) = line.strip_prefix("data:")
                && let Ok(v) = serde_json::from_str::<Value>(data.trim())
                && v["id"] == id
            {
                return v;
            }
        }
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .unwrap_or_else(|_| panic!("no answer {id} in {text:?}"))
            .unwrap_or_else(|| panic!("the stream ended before answer {id}: {text:?}"))
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
}

#[tokio::test]
async fn a_sandbox_mcp_session_is_relayed_on_the_wire() {
    let c = ControllerProcess::start("").await;
    let cl = c.client();
    let sb = cl.create(&berth_tests::controller::ide()).await.unwrap();
    let url = mcp_url(&c, &sb.id);

    // initialize: the agent's session id comes back through the relay.
    let r = mcp_post(&url, Some(API_KEY))
        .json(&initialize_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let session = r
        .headers()
        .get(header::MCP_SESSION_ID)
        .expect("Mcp-Session-Id on the initialize answer")
        .to_str()
        .unwrap()
        .to_string();
    let init = sse_answer(r, 1).await;
    assert_eq!(init["result"]["serverInfo"]["name"], "berth", "{init}");
    let with_session = |body: Value| {
        mcp_post(&url, Some(API_KEY))
            .header(header::MCP_SESSION_ID, &session)
            .header(header::MCP_PROTOCOL_VERSION, "2025-11-25")
            .json(&body)
    };
    let r = with_session(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);

    // GET: the session's standing SSE stream opens and stays open (its head and priming
    // bytes arrive although the body never ends).
    let get = reqwest::Client::new()
        .get(&url)
        .header(header::API_KEY, API_KEY)
        .header("accept", "text/event-stream")
        .header(header::MCP_SESSION_ID, &session)
        .header(header::MCP_PROTOCOL_VERSION, "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);
    assert!(
        get.headers()[reqwest::header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut standing = get.bytes_stream();

    // A tool call in the session, answered on its own stream.
    let r = with_session(json!({
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "exec", "arguments": {"shell": "echo relayed; exit 4"}}
    }))
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let call = sse_answer(r, 2).await;
    let result = &call["result"]["structuredContent"];
    assert_eq!(result["exit_code"], 4, "{call}");
    assert_eq!(result["stdout"], "relayed\n", "{call}");

    // The protocol version header reaches the agent: one it does not know is refused there.
    let r = mcp_post(&url, Some(API_KEY))
        .header(header::MCP_SESSION_ID, &session)
        .header(header::MCP_PROTOCOL_VERSION, "1999-01-01")
        .json(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "{:?}", r.text().await);

    // DELETE ends the session: the standing stream ends, and the session is unknown after.
    let r = reqwest::Client::new()
        .delete(&url)
        .header(header::API_KEY, API_KEY)
        .header(header::MCP_SESSION_ID, &session)
        .header(header::MCP_PROTOCOL_VERSION, "2025-11-25")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = standing.next().await {}
    })
    .await
    .expect("the standing stream ends with its session");
    let r = with_session(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn python_sdk_drives_a_docker_desktop_through_the_controller() {
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let url = format!("{}{}", c.base, route::MCP);
    let v = client_py(&[
        "engine",
        &url,
        API_KEY,
        "desktop-ubuntu",
        "1280x800",
        "321",
        "234",
    ])
    .await;
    let created = &v["create"];
    assert_eq!(created["is_error"], false, "{created}");
    let id = created["structured"]["id"].as_str().unwrap();
    assert_eq!(created["structured"]["status"], "running", "{created}");
    assert!(
        created["structured"]["image_ref"]
            .as_str()
            .unwrap()
            .starts_with(Provider::Docker.image_prefix()),
        "{created}"
    );
    assert_eq!(created["structured"]["mcp_url"], mcp_url(&c, id));

    // The second session, to the sandbox's own MCP server through the controller.
    let s = &v["sandbox"];
    assert_eq!(s["server"]["name"], "berth", "{}", s["server"]);
    // The agent's tools, relayed as they are (a desktop's include the browser toolset's).
    assert_eq!(
        s["tools"],
        json!(crate::mcp::desktop_tools()),
        "{}",
        s["tools"]
    );
    let screen = json!([1280, 800]);
    let click = &s["click"];
    assert_eq!(click["is_error"], false, "{click}");
    assert_eq!(
        click["content"][0],
        json!({"type": "image", "mime_type": "image/png", "size": screen})
    );
    assert_eq!(
        s["cursor"]["content"],
        json!([{"type": "text", "text": "X=321,Y=234"}]),
        "{}",
        s["cursor"]
    );
    assert_eq!(
        s["screenshot"]["content"],
        json!([{"type": "image", "mime_type": "image/png", "size": screen}]),
        "{}",
        s["screenshot"]
    );
    // The computer toolset's members as tools: the SDK's acknowledgment, the cursor in
    // screenshot pixels (a 1280x800 screen fits the model's image limits as it is), the image.
    assert_eq!(
        s["toolset_click"],
        json!({"is_error": false, "content": [{"type": "text", "text": "Clicked."}], "structured": null}),
        "{}",
        s["toolset_click"]
    );
    assert_eq!(
        s["toolset_cursor"]["content"],
        json!([{"type": "text", "text": "X=100,Y=120"}]),
        "{}",
        s["toolset_cursor"]
    );
    assert_eq!(
        s["toolset_screenshot"]["content"],
        json!([{"type": "image", "mime_type": "image/png", "size": screen}]),
        "{}",
        s["toolset_screenshot"]
    );
    let refused = &s["toolset_refused"];
    assert_eq!(refused["is_error"], true, "{refused}");
    assert_eq!(
        refused["content"],
        json!([{"type": "text", "text": "invalid input for computer member 'left_click': coordinate: (1280, 0) is outside the 1280x800 screenshot"}]),
        "{refused}"
    );
    // The browser toolset's members: the SDK's line, then the browser_state block as JSON.
    let nav = &s["browser_navigate"];
    assert_eq!(nav["is_error"], false, "{nav}");
    assert_eq!(
        nav["content"][0]["text"],
        "Navigated to data:text/html,<title>MCP page</title><button>Go</button> — MCP page",
        "{nav}"
    );
    let state: serde_json::Value =
        serde_json::from_str(nav["content"][1]["text"].as_str().unwrap()).unwrap();
    assert_eq!(state["type"], "browser_state", "{state}");
    let found = s["browser_find"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        found.starts_with("button \"Go\" [ref_"),
        "{}",
        s["browser_find"]
    );
    assert_eq!(s["exec"]["structured"]["exit_code"], 7, "{}", s["exec"]);
    assert_eq!(s["exec"]["structured"]["stdout"], "out\n", "{}", s["exec"]);
    assert_eq!(s["stateless"]["protocol_version"], "2026-07-28");
    assert_eq!(
        s["stateless"]["exec"]["structured"]["stdout"], "stateless\n",
        "{}",
        s["stateless"]
    );

    // Deleted by the first session: answered stopped, and the container goes.
    assert_eq!(
        v["delete"]["structured"]["status"], "stopped",
        "{}",
        v["delete"]
    );
    wait_for("the container to go", Duration::from_secs(30), || async {
        c.all_leftovers().is_empty().then_some(())
    })
    .await;
}
