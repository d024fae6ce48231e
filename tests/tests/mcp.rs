//! The agent's MCP server (`/mcp`, Streamable HTTP) with real clients on a real X server: the
//! official MCP Python SDK (tests/mcp/client.py) and rmcp's Rust client. Clicks are read back
//! from X, screenshots decoded, files checked on disk; the bearer token, the session cap and
//! unknown sessions are checked on the wire.

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine;
use berth_tests::x::{XServer, decode_png};
use berth_tests::{AgentOptions, AgentProcess, TOKEN};
use futures_util::{SinkExt, StreamExt};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};
use x11rb::connection::Connection;
use x11rb::protocol::xproto::ConnectionExt as _;

const TOOLS: [&str; 10] = [
    "accessibility_tree",
    "browser_cdp_url",
    "computer",
    "exec",
    "list_dir",
    "read_file",
    "screenshot",
    "start_recording",
    "stop_recording",
    "write_file",
];
/// Every tool the agent lists: its own and the computer toolset's members, sorted.
pub(crate) fn all_tools() -> Vec<String> {
    let mut all: Vec<String> = TOOLS.iter().map(|s| s.to_string()).collect();
    all.extend(
        berth_protocol::toolset::COMPUTER_MEMBERS
            .iter()
            .map(|(m, _)| format!("computer_{m}")),
    );
    all.sort();
    all
}
/// Every tool an agent with a desktop lists: [`all_tools`] and the browser toolset's default
/// members, sorted.
pub(crate) fn desktop_tools() -> Vec<String> {
    let mut all = all_tools();
    all.extend(
        berth_protocol::toolset::BROWSER_MEMBERS
            .iter()
            .filter(|(_, _, on)| *on)
            .map(|(m, _, _)| format!("browser_{m}")),
    );
    all.sort();
    all
}
/// What `Accept` an MCP client sends on a POST.
const ACCEPT: &str = "application/json, text/event-stream";

async fn agent_on(x: &XServer) -> AgentProcess {
    AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--display".into(), x.display.clone()],
        ..Default::default()
    })
    .await
}

/// The pointer's position on the X server itself.
fn x_pointer(x: &XServer) -> (i16, i16) {
    let c = x.connect();
    let root = c.setup().roots[0].root;
    let p = c.query_pointer(root).unwrap().reply().unwrap();
    (p.root_x, p.root_y)
}

fn initialize_body(id: u64) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "berth-tests", "version": "0"}
        }
    })
}

fn post(a: &AgentProcess, token: Option<&str>) -> reqwest::RequestBuilder {
    let mut r = reqwest::Client::new()
        .post(a.url("/mcp"))
        .header("accept", ACCEPT)
        .header("content-type", "application/json");
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    r
}

#[tokio::test]
async fn python_sdk_session_drives_the_tools() {
    let x = XServer::start(1024, 768);
    let a = agent_on(&x).await;
    let work = a.home.join("mcp-work");
    std::fs::create_dir_all(&work).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp/client.py");
    let run = tokio::process::Command::new("python3")
        .arg(script)
        .arg(a.url("/mcp"))
        .arg(TOKEN)
        .arg(&work)
        .args(["321", "234"])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the MCP Python client finishes within 120 s")
        .expect("python3 with the mcp package (tests/setup.sh)");
    assert!(
        out.status.success(),
        "client.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let s = &v["session"];

    assert_eq!(s["server"]["name"], "berth", "{}", s["server"]);
    assert_eq!(s["server"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["server"]["protocol_version"], "2025-11-25");
    assert_eq!(s["server"]["has_tools"], true);
    let names: BTreeSet<String> = s["tools"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(names, all_tools().into_iter().collect::<BTreeSet<_>>());
    for (name, t) in s["tools"].as_object().unwrap() {
        assert_eq!(t["input_schema"]["type"], "object", "{name}: {t}");
        assert!(
            t["description"].as_str().is_some_and(|d| d.len() > 20),
            "{name}: {t}"
        );
    }
    let computer = &s["tools"]["computer"]["input_schema"];
    assert_eq!(computer["required"], json!(["action"]), "{computer}");
    for field in ["coordinate", "text", "scroll_direction", "region"] {
        assert!(
            computer["properties"][field].is_object(),
            "{field}: {computer}"
        );
    }
    let exec = &s["tools"]["exec"]["input_schema"]["properties"];
    assert!(
        exec["argv"].is_object() && exec["shell"].is_object() && exec["timeout_ms"].is_object()
    );

    // The click answers the settled screen; the cursor reads back where it went, as X says.
    let click = &s["click"];
    assert_eq!(click["is_error"], false, "{click}");
    assert_eq!(
        click["content"][0],
        json!({"type": "image", "mime_type": "image/png", "size": [1024, 768]})
    );
    assert_eq!(
        s["cursor"]["content"],
        json!([{"type": "text", "text": "X=321,Y=234"}])
    );
    assert_eq!(x_pointer(&x), (321, 234));

    assert_eq!(
        s["screenshot"]["content"],
        json!([{"type": "image", "mime_type": "image/png", "size": [1024, 768]}])
    );

    let e = &s["exec"];
    assert_eq!(e["is_error"], false, "{e}");
    assert_eq!(e["structured"]["exit_code"], 3, "{e}");
    assert_eq!(e["structured"]["stdout"], "out\n");
    assert_eq!(e["structured"]["stderr"], "err\n");
    assert_eq!(e["structured"]["timed_out"], false);
    // The text block carries the same answer for clients that ignore structured content.
    let text: Value = serde_json::from_str(e["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, e["structured"]);
    assert_eq!(s["exec_argv"]["structured"]["stdout"], "a b");
    assert_eq!(s["exec_argv"]["structured"]["exit_code"], 0);

    // Files: the text round trip, parents created, the bytes on disk; binary as a blob.
    let notes = work.join("sub/dir/notes.txt");
    assert_eq!(s["write_text"]["is_error"], false, "{}", s["write_text"]);
    assert_eq!(
        s["write_text"]["structured"]["bytes"],
        "héllo\nworld\n".len()
    );
    assert_eq!(
        s["write_text"]["structured"]["path"],
        notes.display().to_string()
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "héllo\nworld\n");
    assert_eq!(
        s["read_text"]["content"],
        json!([{"type": "text", "text": "héllo\nworld\n"}])
    );
    assert_eq!(
        std::fs::read(work.join("blob.bin")).unwrap(),
        (0..=255u8).collect::<Vec<u8>>()
    );
    let bin = &s["read_binary"];
    assert_eq!(bin["roundtrip"], true, "{bin}");
    assert_eq!(bin["content"][0]["type"], "resource");
    assert_eq!(bin["content"][0]["mime_type"], "application/octet-stream");
    let listed: BTreeSet<String> = s["list_dir"]["structured"]["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", s["list_dir"]))
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    for p in ["sub", "sub/dir", "sub/dir/notes.txt", "blob.bin"] {
        let p = work.join(p).display().to_string();
        assert!(listed.contains(&p), "{p} not in {listed:?}");
    }

    // Failures are tool errors with the reason, arguments that do not parse included.
    let err_text = |k: &str| -> String {
        let r = &s[k];
        assert_eq!(r["is_error"], true, "{k}: {r}");
        r["content"][0]["text"].as_str().unwrap().to_string()
    };
    // Answers are bounded (under the Python SDK's 1 MiB event limit), with a clear way on.
    let big = &s["exec_big"]["structured"];
    assert_eq!(big["output_truncated"], true, "{big}");
    assert!(big.get("stdout").is_none(), "{big}");
    let preview = &big["stdout_preview"];
    assert_eq!(preview["bytes"], 300_000, "{big}");
    assert_eq!(preview["head"].as_str().unwrap().len(), 8 << 10);
    assert_eq!(preview["omitted_bytes"], 300_000 - (16 << 10));
    assert!(
        big["output_href"]
            .as_str()
            .is_some_and(|h| h.starts_with("/v1/commands/") && h.ends_with("/output")),
        "{big}"
    );
    let too_large = err_text("read_big");
    assert!(
        too_large.contains("614400 bytes") && too_large.contains("GET /v1/files"),
        "{too_large}"
    );
    assert!(err_text("missing_file").contains("not found"));
    assert!(err_text("bad_action").contains("unknown action"));
    let bad = err_text("bad_args");
    assert!(
        bad.contains("invalid arguments") && bad.contains("coordinate"),
        "{bad}"
    );

    // A recording started and stopped over MCP downloads from the path it names.
    assert_eq!(
        s["start_recording"]["is_error"], false,
        "{}",
        s["start_recording"]
    );
    let stopped = &s["stop_recording"]["structured"];
    let id = stopped["id"].as_str().expect("a recording id");
    assert_eq!(stopped["state"], "stopped", "{stopped}");
    let path = stopped["download_path"].as_str().unwrap();
    assert_eq!(path, format!("/v1/recordings/{id}/file"));
    let mp4 = a
        .client()
        .request(reqwest::Method::GET, path)
        .send()
        .await
        .unwrap();
    assert_eq!(mp4.status(), 200);
    let bytes = mp4.bytes().await.unwrap();
    assert_eq!(&bytes[4..8], b"ftyp", "an MP4");

    // A 2026-07-28 client needs no session: discover, list, call.
    let st = &v["stateless"];
    assert!(st.get("error").is_none(), "{st}");
    assert_eq!(st["protocol_version"], "2026-07-28", "{st}");
    assert_eq!(st["tools"], json!(all_tools()));
    assert_eq!(st["exec"]["structured"]["stdout"], "stateless\n", "{st}");
}

fn args(v: Value) -> serde_json::Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn image(r: &CallToolResult) -> (u32, u32, Vec<u8>) {
    let ContentBlock::Image(img) = &r.content[0] else {
        panic!("not an image: {r:?}");
    };
    assert_eq!(img.mime_type, "image/png");
    let png = base64::engine::general_purpose::STANDARD
        .decode(&img.data)
        .unwrap();
    decode_png(&png)
}

#[tokio::test]
async fn rmcp_client_lists_clicks_and_sees_the_screen() {
    let x = XServer::start(800, 600);
    let a = agent_on(&x).await;
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(a.url("/mcp")).auth_header(TOKEN),
    );
    let client = ().serve(transport).await.expect("an MCP session");
    let info = client.peer_info().expect("the server's info");
    let server = info.server_info.as_ref().expect("serverInfo");
    assert_eq!(server.name, "berth");
    assert_eq!(server.version, env!("CARGO_PKG_VERSION"));

    let tools = client.list_all_tools().await.unwrap();
    let names: BTreeSet<String> = tools.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(names, all_tools().into_iter().collect::<BTreeSet<_>>());

    let click = client
        .call_tool(CallToolRequestParams::new("computer").with_arguments(args(
            json!({"action": "left_click", "coordinate": [100, 200]}),
        )))
        .await
        .unwrap();
    assert_eq!(click.is_error, Some(false), "{click:?}");
    let (w, h, _) = image(&click);
    assert_eq!((w, h), (800, 600));
    assert_eq!(x_pointer(&x), (100, 200));

    // In an engine's scaled space (400x300 for this 800x600 screen): the move lands at twice
    // the coordinates and the screenshot comes at the engine's size.
    let moved = client
        .call_tool(
            CallToolRequestParams::new("computer").with_arguments(args(json!({
                "action": "mouse_move", "coordinate": [150, 100],
                "display_width_px": 400, "display_height_px": 300
            }))),
        )
        .await
        .unwrap();
    let (w, h, _) = image(&moved);
    assert_eq!((w, h), (400, 300));
    assert_eq!(x_pointer(&x), (300, 200));

    let shot = client
        .call_tool(
            CallToolRequestParams::new("screenshot").with_arguments(args(json!({"scale": 0.5}))),
        )
        .await
        .unwrap();
    let (w, h, _) = image(&shot);
    assert_eq!((w, h), (400, 300));
    // The REST screenshot's encodings: a JPEG at a quality, and a bad one named as REST names it.
    let jpeg = client
        .call_tool(
            CallToolRequestParams::new("screenshot")
                .with_arguments(args(json!({"format": "jpeg", "quality": 40}))),
        )
        .await
        .unwrap();
    let ContentBlock::Image(img) = &jpeg.content[0] else {
        panic!("not an image: {jpeg:?}");
    };
    assert_eq!(img.mime_type, "image/jpeg");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&img.data)
        .unwrap();
    assert_eq!(&bytes[..3], b"\xff\xd8\xff", "a JPEG's SOI marker");
    for (bad, says) in [
        (json!({"format": "gif"}), "png, jpeg or webp"),
        (
            json!({"format": "jpeg", "quality": 0}),
            "quality must be 1-100",
        ),
    ] {
        let r = client
            .call_tool(CallToolRequestParams::new("screenshot").with_arguments(args(bad)))
            .await
            .unwrap();
        assert_eq!(r.is_error, Some(true), "{r:?}");
        let why = &r.content[0].as_text().unwrap().text;
        assert!(why.contains(says), "{why}");
    }

    // zoom answers the region at the screen's own pixels.
    let zoom = client
        .call_tool(
            CallToolRequestParams::new("computer")
                .with_arguments(args(json!({"action": "zoom", "region": [0, 0, 400, 150]}))),
        )
        .await
        .unwrap();
    let (w, h, _) = image(&zoom);
    assert_eq!((w, h), (400, 150));

    // A wait longer than a session may sit silent is refused, with the way to run it.
    let long = client
        .call_tool(
            CallToolRequestParams::new("exec")
                .with_arguments(args(json!({"argv": ["true"], "timeout_ms": 3_600_000}))),
        )
        .await
        .unwrap();
    assert_eq!(long.is_error, Some(true), "{long:?}");
    let why = long.content[0].as_text().unwrap().text.clone();
    assert!(why.contains("background"), "{why}");

    // Without --desktop, the desktop's tools say why they cannot answer.
    for (tool, why) in [
        ("browser_cdp_url", "without --desktop"),
        ("accessibility_tree", "without --desktop"),
    ] {
        let r = client
            .call_tool(CallToolRequestParams::new(tool))
            .await
            .unwrap();
        assert_eq!(r.is_error, Some(true), "{tool}: {r:?}");
        let text = r.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(text.contains(why), "{tool}: {text}");
    }

    client.cancel().await.unwrap();
}

#[tokio::test]
async fn no_or_wrong_bearer_token_is_401() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    for token in [None, Some("wrong-token")] {
        let r = post(&a, token)
            .json(&initialize_body(1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{token:?}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    }
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let r = reqwest::Client::new()
            .request(method.clone(), a.url("/mcp"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{method}");
    }
    let r = post(&a, Some(TOKEN))
        .json(&initialize_body(1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("mcp-session-id"));
}

/// Opens a session with a bare `initialize`; its id, or the refusal.
async fn open(a: &AgentProcess, id: u64) -> Result<String, (u16, Value)> {
    let r = post(a, Some(TOKEN))
        .json(&initialize_body(id))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let session = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    let text = r.text().await.unwrap();
    match (status, session) {
        (200, Some(s)) => {
            assert!(text.contains("\"serverInfo\""), "{text}");
            Ok(s)
        }
        _ => Err((status, serde_json::from_str(&text).unwrap_or(json!(text)))),
    }
}

#[tokio::test]
async fn sessions_are_capped_and_unknown_ones_are_404() {
    let x = XServer::start(320, 240);
    let a = agent_on(&x).await;
    let mut sessions = Vec::new();
    for i in 0..64 {
        sessions.push(
            open(&a, i)
                .await
                .unwrap_or_else(|e| panic!("session {i}: {e:?}")),
        );
    }
    let (status, body) = open(&a, 99).await.expect_err("the 65th session is refused");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["id"], 99, "{body}");
    let why = body["error"]["message"].as_str().unwrap();
    assert!(why.contains("64 MCP sessions are open"), "{why}");

    // Ending one makes room for the next.
    let r = reqwest::Client::new()
        .delete(a.url("/mcp"))
        .bearer_auth(TOKEN)
        .header("mcp-session-id", &sessions[0])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    open(&a, 100).await.expect("a session after one ended");

    // An ended session is unknown: 404 with a JSON-RPC error body.
    let r = post(&a, Some(TOKEN))
        .header("mcp-session-id", &sessions[0])
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.headers()["content-type"],
        "application/json",
        "{:?}",
        r.headers()
    );
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Session not found"),
        "{body}"
    );
}

async fn call(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &'static str,
) -> CallToolResult {
    let r = client
        .call_tool(CallToolRequestParams::new(tool))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{tool}: {r:?}");
    r
}

#[tokio::test]
async fn desktop_tools_answer_on_a_real_desktop() {
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec![
            "--desktop".into(),
            "--cdp-listen".into(),
            "127.0.0.1:0".into(),
        ],
        ..Default::default()
    })
    .await;
    let r = a
        .client()
        .request(reqwest::Method::GET, "/v1/ready?wait=90s")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "not ready: {}", r.text().await.unwrap());
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(a.url("/mcp")).auth_header(TOKEN),
    );
    let client = ().serve(transport).await.expect("an MCP session");

    // browser_cdp_url: both relays it names reach Chromium.
    let cdp = call(&client, "browser_cdp_url").await;
    let v = cdp.structured_content.clone().expect("structured");
    let host = berth_tests::host_port(&a.base);
    assert_eq!(v["ws_url"], format!("ws://{host}/v1/browser/cdp"), "{v}");
    assert_eq!(v["ws_path"], "/v1/browser/cdp");
    assert!(
        v["browser_version"]
            .as_str()
            .is_some_and(|b| b.contains('/')),
        "{v}"
    );
    let listen = v["cdp_listen"].as_str().expect("cdp_listen");
    let version: Value = reqwest::get(format!("http://{listen}/json/version"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(version["Browser"], v["browser_version"]);
    let mut req = v["ws_url"].as_str().unwrap().into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    ws.send(tungstenite::Message::text(
        json!({"id": 1, "method": "Browser.getVersion"}).to_string(),
    ))
    .await
    .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(Ok(tungstenite::Message::Text(t))) = ws.next().await {
                let m: Value = serde_json::from_str(&t).unwrap();
                if m["id"] == 1 {
                    return m;
                }
            }
        }
    })
    .await
    .expect("Browser.getVersion answers through ws_url");
    assert_eq!(
        answer["result"]["product"], v["browser_version"],
        "{answer}"
    );

    // accessibility_tree: the applications on the bus, as /v1/a11y lists them.
    let tree = call(&client, "accessibility_tree").await;
    let text = tree.content[0]
        .as_text()
        .expect("a text block")
        .text
        .clone();
    let tree: Value = serde_json::from_str(&text).unwrap();
    let names = |t: &Value| -> BTreeSet<String> {
        t["applications"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["name"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let over_mcp = names(&tree);
    assert!(over_mcp.len() >= 2, "{tree}");
    let over_rest = names(&a.get_json("/v1/a11y").await);
    assert!(
        over_mcp.intersection(&over_rest).count() >= 2,
        "{over_mcp:?} vs {over_rest:?}"
    );
    client.cancel().await.unwrap();
}
