//! The controller as the one door: the agent's native API (`…/{id}/v1/{*path}`) and port
//! previews (`…/{id}/ports/{port}/…`) relayed through `berth serve`, with the API key, the
//! agent's token added by the controller and never shown. Real agents (local processes, and a
//! Docker desktop container reached only through the controller), real servers inside the
//! sandbox (`python3 -m http.server`, a hand-written WebSocket echo server), Playwright for
//! Python in real Chromium opening a preview URL.

use std::time::{Duration, Instant};

use berth_tests::controller::{API_KEY, ControllerProcess, Provider, ide};
use berth_tests::{host_port, raw_http, wait_for};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};

const MIB: usize = 1 << 20;
/// The big transfer's size.
const BIG: usize = 64 * MIB;

/// A WebSocket echo server and a few HTTP pages, by hand (no `websockets` in the images):
/// `/` a page whose script echoes one message over `echo`, `/headers` the request's headers
/// as JSON, `/redir` a redirect to the absolute path `/sub/`; an Upgrade on any path echoes
/// text and binary frames and a close frame with its code, choosing subprotocol `berth-echo`.
const ECHO_PY: &str = r#"
import asyncio, base64, hashlib, json, struct, sys
PORT = int(sys.argv[1])
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PAGE = b"""<!doctype html><html><head><title>berth echo</title></head><body><p id="echo"></p>
<script>
const ws = new WebSocket(new URL('echo', location.href).href.replace(/^http/, 'ws'), ['berth-echo']);
ws.onopen = () => ws.send('ping over preview');
ws.onmessage = (m) => { document.getElementById('echo').textContent = 'echo: ' + m.data; };
ws.onerror = () => { document.getElementById('echo').textContent = 'error'; };
</script></body></html>"""

async def read_frame(r):
    b0, b1 = await r.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack(">H", await r.readexactly(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", await r.readexactly(8))[0]
    mask = await r.readexactly(4) if b1 & 0x80 else b"\0\0\0\0"
    data = bytearray(await r.readexactly(n))
    for i in range(n):
        data[i] ^= mask[i % 4]
    return b0 & 0x0F, bytes(data)

def frame(op, data):
    n = len(data)
    if n < 126:
        head = struct.pack(">BB", 0x80 | op, n)
    elif n < 65536:
        head = struct.pack(">BBH", 0x80 | op, 126, n)
    else:
        head = struct.pack(">BBQ", 0x80 | op, 127, n)
    return head + data

async def handle(r, w):
    try:
        head = await r.readuntil(b"\r\n\r\n")
    except Exception:
        w.close()
        return
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for l in lines[1:]:
        if ":" in l:
            k, v = l.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    if headers.get("upgrade", "").lower() == "websocket":
        accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + GUID).digest())
        resp = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n"
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
        if "berth-echo" in offered:
            resp += b"Sec-WebSocket-Protocol: berth-echo\r\n"
        w.write(resp + b"\r\n")
        await w.drain()
        while True:
            try:
                op, data = await read_frame(r)
            except Exception:
                break
            if op == 8:
                w.write(frame(8, data))
                await w.drain()
                break
            if op == 9:
                w.write(frame(10, data))
            elif op in (1, 2):
                w.write(frame(op, data))
            await w.drain()
        w.close()
        return
    n = int(headers.get("content-length", "0") or 0)
    if n:
        await r.readexactly(n)
    status, ctype, extra, body = "200 OK", "text/html", "", PAGE
    if path.startswith("/headers"):
        ctype, body = "application/json", json.dumps(headers).encode()
    elif path == "/redir":
        status, extra, body = "302 Found", "Location: /sub/\r\n", b""
    w.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode() + body)
    await w.drain()
    w.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", PORT)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"#;

/// The site `python3 -m http.server` serves: a page with a relative script that changes it,
/// and a relative link to a directory without its slash (http.server redirects that to the
/// absolute path `/sub/`, which the relays rewrite under the preview's prefix).
const INDEX_HTML: &str = r#"<!doctype html><html><head><title>berth preview</title>
<script src="app.js"></script></head>
<body><p id="status">loading</p><a id="sub" href="sub">sub</a></body></html>"#;
const APP_JS: &str = r#"window.addEventListener('load', () => {
  document.getElementById('status').textContent = 'script ran';
});"#;
const SUB_HTML: &str =
    "<!doctype html><html><head><title>berth sub page</title></head><body>sub</body></html>";

/// Opens the http.server page (its script, then the `sub` link), then the echo page (its
/// WebSocket), each from a one-time preview URL, in Chromium driven by Playwright.
const PLAYWRIGHT_PY: &str = r##"
import json, sys
from playwright.sync_api import sync_playwright
out = {}
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
    page = browser.new_page()
    page.goto(sys.argv[1])
    page.wait_for_function("document.getElementById('status').textContent === 'script ran'", timeout=30000)
    out["title"] = page.title()
    out["url"] = page.url
    out["cookie_visible"] = page.evaluate("document.cookie")
    page.click("#sub")
    page.wait_for_function("document.title === 'berth sub page'", timeout=30000)
    out["sub_url"] = page.url
    page.goto(sys.argv[2])
    page.wait_for_function("document.getElementById('echo').textContent !== ''", timeout=30000)
    out["echo"] = page.text_content("#echo")
    browser.close()
print(json.dumps(out))
"##;

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .unwrap()
}

/// The byte at `i` of the big file: no short period, so a misplaced block is caught.
fn pattern(offset: usize, len: usize) -> Vec<u8> {
    (offset..offset + len)
        .map(|i| ((i as u64).wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i >> 20) as u8)
        .collect()
}

/// The agent's bearer token, read where the provider hands it to the agent.
fn agent_token(c: &ControllerProcess, id: &str) -> String {
    let token = c.agent_token(id);
    assert!(token.len() >= 16, "{token}");
    token
}

/// Every answer a test saw, headers and bodies as text, to check that the agent's token is in
/// none of them.
#[derive(Default)]
struct Seen(Vec<String>);

impl Seen {
    fn note(&mut self, what: &str, headers: &reqwest::header::HeaderMap, body: &[u8]) {
        let mut s = format!("{what}\n");
        for (k, v) in headers {
            s.push_str(&format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())));
        }
        s.push_str(&String::from_utf8_lossy(body));
        self.0.push(s);
    }

    /// Sends, reads the whole answer, notes it: (status, headers, body).
    async fn send(
        &mut self,
        rb: reqwest::RequestBuilder,
    ) -> (u16, reqwest::header::HeaderMap, Bytes) {
        let r = rb.send().await.unwrap();
        let status = r.status().as_u16();
        let url = r.url().to_string();
        let headers = r.headers().clone();
        let body = r.bytes().await.unwrap();
        self.note(&format!("{status} {url}"), &headers, &body);
        (status, headers, body)
    }

    async fn json(&mut self, rb: reqwest::RequestBuilder) -> (u16, Value) {
        let (status, _, body) = self.send(rb).await;
        let v = serde_json::from_slice(&body).unwrap_or_else(|e| {
            panic!(
                "{status}: not JSON ({e}): {}",
                String::from_utf8_lossy(&body)
            )
        });
        (status, v)
    }

    fn assert_clean(&self, token: &str, log: &str) {
        for s in &self.0 {
            assert!(
                !s.contains(token),
                "the agent token shows in an answer: {s}"
            );
        }
        assert!(
            !log.contains(token),
            "the agent token shows in the controller's log"
        );
        println!(
            "agent token in none of {} answers nor the controller's log ({} bytes)",
            self.0.len(),
            log.len()
        );
    }
}

/// One sandbox as a client sees it through the controller.
struct Door<'a> {
    c: &'a ControllerProcess,
    id: String,
    http: reqwest::Client,
}

impl Door<'_> {
    /// `…/{id}{rest}`.
    fn url(&self, rest: &str) -> String {
        format!("{}/sandbox/sandboxes/v1/{}{rest}", self.c.base, self.id)
    }

    fn keyed(&self, method: reqwest::Method, rest: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, self.url(rest))
            .header("x-api-key", API_KEY)
    }

    fn get(&self, rest: &str) -> reqwest::RequestBuilder {
        self.keyed(reqwest::Method::GET, rest)
    }

    fn ws_url(&self, rest: &str) -> String {
        self.url(rest).replacen("http://", "ws://", 1)
    }

    async fn ws(
        &self,
        rest: &str,
        protocol: Option<&str>,
    ) -> (
        berth_protocol::client::WebSocket,
        tungstenite::handshake::client::Response,
    ) {
        let mut req = self.ws_url(rest).into_client_request().unwrap();
        req.headers_mut()
            .insert("x-api-key", API_KEY.parse().unwrap());
        if let Some(p) = protocol {
            req.headers_mut()
                .insert("sec-websocket-protocol", p.parse().unwrap());
        }
        tokio::time::timeout(
            Duration::from_secs(20),
            tokio_tungstenite::connect_async(req),
        )
        .await
        .expect("WebSocket handshake within 20 s")
        .unwrap_or_else(|e| panic!("WebSocket {rest}: {e}"))
    }

    /// A background command in the sandbox (through `…/v1/exec`): its id.
    async fn background(&self, seen: &mut Seen, shell: &str) -> String {
        let (status, v) = seen
            .json(
                self.keyed(reqwest::Method::POST, "/v1/exec")
                    .json(&json!({"shell": shell, "background": true, "cwd": "~"})),
            )
            .await;
        assert_eq!(status, 202, "{v}");
        v["id"].as_str().unwrap().to_string()
    }

    async fn put_file(&self, seen: &mut Seen, path: &str, body: &str) {
        let (status, _, b) = seen
            .send(
                self.keyed(reqwest::Method::PUT, &format!("/v1/files?path={path}"))
                    .body(body.to_string()),
            )
            .await;
        assert!(status < 300, "{status}: {}", String::from_utf8_lossy(&b));
    }
}

/// Reads an SSE stream into `text` until one of its `data:` records matches `found`.
async fn sse_until(
    sse: &mut (impl futures_util::Stream<Item = reqwest::Result<Bytes>> + Unpin),
    text: &mut String,
    found: impl Fn(&Value) -> bool,
) {
    let hit = |text: &str| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .any(|e| found(&e))
    };
    let done = tokio::time::timeout(Duration::from_secs(30), async {
        while !hit(text) {
            let b = sse.next().await.expect("the SSE stream ended").unwrap();
            text.push_str(&String::from_utf8_lossy(&b));
        }
    })
    .await;
    assert!(
        done.is_ok(),
        "the SSE stream did not show the record: {text}"
    );
}

/// The agent's native API through the controller: errors first, then 64 MiB up and down
/// (hash-free: every byte compared), a Range, SSE and long-polls on `/v1/events`, a PTY and a
/// command's output over WebSockets.
async fn native_api(door: &Door<'_>, seen: &mut Seen) {
    let c = door.c;
    // Unknown sandbox, no key, a wrong key, dot segments.
    let (status, v) = seen
        .json(
            door.http
                .get(format!(
                    "{}/sandbox/sandboxes/v1/sb_nope/v1/commands",
                    c.base
                ))
                .header("x-api-key", API_KEY),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );
    let (status, v) = seen.json(door.http.get(door.url("/v1/commands"))).await;
    assert_eq!(status, 401, "{v}");
    let (status, v) = seen
        .json(
            door.http
                .get(door.url("/v1/commands"))
                .header("x-api-key", "wrong"),
        )
        .await;
    assert_eq!(status, 401, "{v}");
    for path in ["/v1/%2e%2e/execute", "/v1/../healthz", "/v1/fs/.%2E/x"] {
        let req = format!(
            "GET /sandbox/sandboxes/v1/{}{path} HTTP/1.1\r\nHost: x\r\nX-Api-Key: {API_KEY}\r\nConnection: close\r\n\r\n",
            door.id
        );
        let answer = String::from_utf8_lossy(&raw_http(host_port(&c.base), req.as_bytes()).await)
            .into_owned();
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("\"invalid_request\""), "{path}: {answer}");
        seen.0.push(answer);
    }
    // The client's own Authorization is not the agent's: replaced, so the call works.
    let (status, v) = seen
        .json(door.get("/v1/commands").bearer_auth("client-secret"))
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(v["commands"].is_array(), "{v}");
    // The typed client through the controller (`ControllerClient::agent`).
    let typed = c.client().agent(&door.id);
    let r = typed
        .exec(&berth_protocol::ExecRequest::shell("echo typed-$((2+3))"))
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.stdout.as_deref()), (0, Some("typed-5\n")));
    assert!(
        typed
            .commands()
            .await
            .unwrap()
            .commands
            .iter()
            .any(|x| x.id == r.id),
        "the typed exec is listed"
    );
    // An agent error body passes as it is.
    let (status, v) = seen.json(door.get("/v1/commands/no-such-command")).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );

    // 64 MiB up, streamed with its length, and down, compared byte for byte.
    let ctl_pid = c.child.as_ref().unwrap().id();
    let peak_before = berth_tests::peak_rss_kib(ctl_pid);
    let chunks = futures_util::stream::iter(
        (0..BIG / MIB).map(|k| Ok::<_, std::io::Error>(Bytes::from(pattern(k * MIB, MIB)))),
    );
    let t = Instant::now();
    let (status, _, b) = seen
        .send(
            door.keyed(reqwest::Method::PUT, "/v1/files?path=~/gw/big.bin")
                .header("content-length", BIG)
                .body(reqwest::Body::wrap_stream(chunks)),
        )
        .await;
    assert!(status < 300, "{status}: {}", String::from_utf8_lossy(&b));
    let up = t.elapsed();
    let t = Instant::now();
    let r = door
        .get("/v1/files?path=~/gw/big.bin")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.content_length(), Some(BIG as u64));
    let mut offset = 0;
    let mut body = r.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        assert!(
            chunk[..] == pattern(offset, chunk.len())[..],
            "the download differs within {offset}..{}",
            offset + chunk.len()
        );
        offset += chunk.len();
    }
    assert_eq!(offset, BIG);
    let down = t.elapsed();
    let peak_after = berth_tests::peak_rss_kib(ctl_pid);
    println!(
        "64 MiB through the controller: up {:.0} MiB/s, down {:.0} MiB/s; controller peak RSS {} -> {} KiB",
        64.0 / up.as_secs_f64(),
        64.0 / down.as_secs_f64(),
        peak_before,
        peak_after
    );
    assert!(
        peak_after.saturating_sub(peak_before) < 32 * 1024,
        "the controller buffered the transfer: peak RSS {peak_before} -> {peak_after} KiB"
    );
    // A Range: 206 with its Content-Range, the right bytes.
    let (status, headers, b) = seen
        .send(
            door.get("/v1/files?path=~/gw/big.bin")
                .header("range", "bytes=40000000-40000999"),
        )
        .await;
    assert_eq!(status, 206);
    assert_eq!(
        headers["content-range"],
        format!("bytes 40000000-40000999/{BIG}").as_str()
    );
    assert!(b[..] == pattern(40_000_000, 1000)[..]);

    // SSE on /v1/events: the existing events, then one made after the stream opened.
    let r = door
        .get("/v1/events?follow=true")
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut sse = Box::pin(r.bytes_stream());
    let mut text = String::new();
    sse_until(&mut sse, &mut text, |_| true).await;
    let (status, v) = seen
        .json(
            door.keyed(reqwest::Method::POST, "/v1/exec")
                .json(&json!({"shell": "echo sse-probe"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let probe = v["id"].clone();
    sse_until(&mut sse, &mut text, |e| {
        e["kind"] == "command.exited" && e["id"] == probe
    })
    .await;
    drop(sse);
    println!("SSE through the controller: {} bytes read", text.len());
    seen.0.push(text);

    // Long-polls: one answered by an event made while it waits, one that times out quietly.
    let (_, page) = seen.json(door.get("/v1/events")).await;
    let next = page["next_seq"].as_u64().unwrap();
    let poll = tokio::spawn(
        door.get(&format!(
            "/v1/events?follow=true&from_seq={next}&timeout_ms=20000"
        ))
        .send(),
    );
    let t = Instant::now();
    let (status, _) = seen
        .json(
            door.keyed(reqwest::Method::POST, "/v1/exec")
                .json(&json!({"shell": "true"})),
        )
        .await;
    assert_eq!(status, 200);
    let r = poll.await.unwrap().unwrap();
    let waited = t.elapsed();
    let v: Value = r.json().await.unwrap();
    assert!(
        !v["events"].as_array().unwrap().is_empty(),
        "the long-poll answered without the event: {v}"
    );
    assert!(waited < Duration::from_secs(15), "{waited:?}");
    let t = Instant::now();
    let (status, v) = seen
        .json(door.get(&format!(
            "/v1/events?follow=true&from_seq={}&timeout_ms=1500",
            next + 100_000
        )))
        .await;
    let quiet = t.elapsed();
    assert_eq!(status, 200, "{v}");
    assert!(v["events"].as_array().unwrap().is_empty(), "{v}");
    assert!(quiet >= Duration::from_millis(1400), "{quiet:?}");
    println!("long-polls: answered by an event after {waited:?}, a quiet one after {quiet:?}");

    // A PTY over a WebSocket: typed into, read back, resized, its exit code.
    let (status, v) = seen
        .json(
            door.keyed(reqwest::Method::POST, "/v1/pty")
                .json(&json!({"cmd": ["/bin/sh"], "cols": 80, "rows": 24})),
        )
        .await;
    assert!(status < 300, "{status}: {v}");
    let pty = v["id"].as_str().unwrap().to_string();
    let (mut ws, _) = door.ws(&format!("/v1/pty/{pty}/attach"), None).await;
    ws.send(Message::binary(b"echo gw-$((6*7))\n".to_vec()))
        .await
        .unwrap();
    let mut screen = String::new();
    let mut exit = None;
    let mut frames = 0;
    tokio::time::timeout(Duration::from_secs(30), async {
        while !screen.contains("gw-42") {
            match ws.next().await.expect("the PTY socket ended").unwrap() {
                Message::Binary(b) => screen.push_str(&String::from_utf8_lossy(&b)),
                other => panic!("unexpected {other:?}"),
            }
            frames += 1;
        }
        ws.send(Message::text(r#"{"resize":{"cols":100,"rows":30}}"#))
            .await
            .unwrap();
        ws.send(Message::binary(b"stty size; exit 5\n".to_vec()))
            .await
            .unwrap();
        while let Some(m) = ws.next().await {
            match m.unwrap() {
                Message::Binary(b) => screen.push_str(&String::from_utf8_lossy(&b)),
                Message::Text(t) => exit = Some(t.to_string()),
                Message::Close(_) => break,
                _ => {}
            }
            frames += 1;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the PTY did not answer: {screen}"));
    assert!(
        screen.contains("30 100"),
        "the resize reached the PTY: {screen}"
    );
    let exit: Value = serde_json::from_str(exit.as_deref().expect("an exit message")).unwrap();
    assert_eq!(exit["exit_code"], 5, "{exit}");
    println!("PTY through the controller: {frames} frames");
    seen.0.push(screen);

    // A background command's output followed over a WebSocket.
    let cmd = door
        .background(seen, "for i in 1 2 3; do echo line$i; done")
        .await;
    let (mut ws, _) = door
        .ws(&format!("/v1/commands/{cmd}/output?follow=true"), None)
        .await;
    let mut out = String::new();
    let mut end = None;
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(m) = ws.next().await {
            if let Message::Text(t) = m.unwrap() {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v.get("exit_code").is_some() {
                    end = Some(v);
                    break;
                }
                out.push_str(v["data"].as_str().unwrap_or(""));
            }
        }
    })
    .await
    .expect("the output follow ends");
    assert_eq!(out, "line1\nline2\nline3\n");
    assert_eq!(end.unwrap()["exit_code"], 0);
}

/// A preview of servers started inside the sandbox: `python3 -m http.server` (read with the
/// API key and by Chromium from a one-time URL) and the echo server (HTTP and WebSocket).
async fn preview(door: &Door<'_>, seen: &mut Seen) {
    // Ports nothing listens on in the sandbox (process: the host's loopback; Docker: the
    // container's, where these are free too).
    let (site, echo) = (berth_tests::free_port(), berth_tests::free_port());
    door.put_file(seen, "~/gw/site/index.html", INDEX_HTML)
        .await;
    door.put_file(seen, "~/gw/site/app.js", APP_JS).await;
    door.put_file(seen, "~/gw/site/sub/index.html", SUB_HTML)
        .await;
    door.put_file(seen, "~/gw/echo.py", ECHO_PY).await;
    door.background(
        seen,
        &format!("cd ~/gw/site && exec python3 -m http.server {site} --bind 127.0.0.1"),
    )
    .await;
    door.background(seen, &format!("exec python3 ~/gw/echo.py {echo}"))
        .await;
    let root = format!("/ports/{site}/");
    wait_for(
        "http.server answers through the preview",
        Duration::from_secs(30),
        || async {
            let r = door.get(&root).send().await.ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
    wait_for(
        "the echo server answers through the preview",
        Duration::from_secs(30),
        || async {
            let r = door.get(&format!("/ports/{echo}/")).send().await.ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
    let (status, headers, body) = seen.send(door.get(&root)).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("<title>berth preview</title>"));
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let (status, _, body) = seen.send(door.get(&format!("{root}app.js"))).await;
    assert_eq!((status, &body[..]), (200, APP_JS.as_bytes()));
    // HEAD, and a directory without its slash: http.server's absolute Location comes back
    // under the preview's prefix.
    let (status, headers, _) = seen
        .send(door.keyed(reqwest::Method::HEAD, &format!("{root}app.js")))
        .await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-length"], APP_JS.len().to_string().as_str());
    let (status, headers, _) = seen.send(door.get(&format!("{root}sub"))).await;
    assert_eq!(status, 301);
    assert_eq!(
        headers["location"],
        format!("/sandbox/sandboxes/v1/{}/ports/{site}/sub/", door.id).as_str()
    );
    let (status, headers, _) = seen.send(door.get(&format!("/ports/{echo}/redir"))).await;
    assert_eq!(status, 302);
    assert_eq!(
        headers["location"],
        format!("/sandbox/sandboxes/v1/{}/ports/{echo}/sub/", door.id).as_str()
    );
    // The bare port redirects (no credentials needed: the cookie is only sent under the slash).
    let (status, headers, _) = seen
        .send(door.http.get(door.url(&format!("/ports/{site}?a=1"))))
        .await;
    assert_eq!(status, 308);
    assert_eq!(headers["location"], format!("{site}/?a=1").as_str());
    // Credentials: none → 401; bad ports → 400; nothing listening → 502 with the reason.
    let (status, v) = seen.json(door.http.get(door.url(&root))).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("unauthorized")),
        "{v}"
    );
    for bad in ["0", "65536", "http", "-1"] {
        let (status, v) = seen.json(door.get(&format!("/ports/{bad}/"))).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{bad}: {v}"
        );
    }
    let dead = berth_tests::free_port();
    let (status, v) = seen.json(door.get(&format!("/ports/{dead}/x"))).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (502, Some("port_unreachable")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("127.0.0.1:{dead}")),
        "{v}"
    );
    // What the app sees: the client's headers, without its credentials or berth's cookies.
    let (status, v) = seen
        .json(
            door.get(&format!("/ports/{echo}/headers"))
                .bearer_auth("client-secret")
                .header("cookie", "app=1; berth_viewer=v; berth_port=p; other=2")
                .header("x-custom", "passed"),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["x-custom"], "passed", "{v}");
    assert_eq!(v["cookie"], "app=1; other=2", "{v}");
    assert!(v.get("x-api-key").is_none(), "{v}");
    assert!(v.get("authorization").is_none(), "{v}");

    // A WebSocket through the preview: subprotocol, text, binary, the close code.
    let (mut ws, resp) = door
        .ws(&format!("/ports/{echo}/echo"), Some("other, berth-echo"))
        .await;
    assert_eq!(resp.headers()["sec-websocket-protocol"], "berth-echo");
    ws.send(Message::text("hello through the door"))
        .await
        .unwrap();
    let blob: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    ws.send(Message::binary(blob.clone())).await.unwrap();
    ws.send(Message::Close(Some(CloseFrame {
        code: CloseCode::Library(4001),
        reason: "bye".into(),
    })))
    .await
    .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(m)) = ws.next().await {
            got.push(m);
        }
    })
    .await
    .expect("the echo socket closes");
    assert_eq!(
        got.len(),
        3,
        "{:?}",
        got.iter().map(|m| m.len()).collect::<Vec<_>>()
    );
    assert_eq!(got[0], Message::text("hello through the door"));
    assert_eq!(got[1], Message::binary(blob));
    match &got[2] {
        Message::Close(Some(f)) => {
            assert_eq!((u16::from(f.code), f.reason.as_str()), (4001, "bye"))
        }
        other => panic!("{other:?}"),
    }

    // The one-time URL: its cookie (scoped to the port's path), used once only.
    let mint = |port: u16, body: Value| {
        door.keyed(reqwest::Method::POST, &format!("/ports/{port}/url"))
            .json(&body)
    };
    let (status, v) = seen.json(mint(site, json!({"ttl_seconds": 0}))).await;
    assert_eq!(status, 400, "{v}");
    let (status, v) = seen
        .json(
            door.http
                .post(door.url(&format!("/ports/{site}/url")))
                .json(&json!({})),
        )
        .await;
    assert_eq!(status, 401, "{v}");
    let (status, v) = seen.json(mint(site, json!({"ttl_seconds": 60}))).await;
    assert_eq!(status, 201, "{v}");
    let once = v["url"].as_str().unwrap().to_string();
    assert!(v["expires_at"].as_str().unwrap().ends_with('Z'), "{v}");
    let (status, headers, _) = seen.send(door.http.get(&once)).await;
    assert_eq!(status, 303);
    let port_path = format!("/sandbox/sandboxes/v1/{}/ports/{site}/", door.id);
    assert_eq!(headers["location"], port_path.as_str());
    let cookie = headers["set-cookie"].to_str().unwrap().to_string();
    for part in [
        "berth_port=".to_string(),
        format!("Path={port_path};"),
        "HttpOnly".into(),
        "SameSite=Lax".into(),
    ] {
        assert!(cookie.contains(&part), "{part} in {cookie}");
    }
    let (status, _, _) = seen.send(door.http.get(&once)).await;
    assert_eq!(status, 401, "a preview URL opens once");
    let session = cookie.split(';').next().unwrap().to_string();
    let (status, _, body) = seen
        .send(door.http.get(door.url(&root)).header("cookie", &session))
        .await;
    assert_eq!(status, 200, "the cookie opens the preview");
    assert!(String::from_utf8_lossy(&body).contains("berth preview"));
    let (status, _, _) = seen
        .send(
            door.http
                .get(door.url(&format!("/ports/{echo}/")))
                .header("cookie", &session),
        )
        .await;
    assert_eq!(status, 401, "a port's cookie opens no other port");
    let (status, _, _) = seen
        .send(
            door.http
                .get(door.url("/v1/commands"))
                .header("cookie", &session),
        )
        .await;
    assert_eq!(status, 401, "a port's cookie opens nothing of the agent");

    // Chromium (Playwright) opens both previews from fresh one-time URLs.
    let (_, v) = seen.json(mint(site, json!({}))).await;
    let site_url = v["url"].as_str().unwrap().to_string();
    let (_, v) = seen.json(mint(echo, json!({}))).await;
    let echo_url = v["url"].as_str().unwrap().to_string();
    let t = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("timeout")
            .args(["120", "python3", "-c", PLAYWRIGHT_PY, &site_url, &echo_url])
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
    println!("Chromium through the preview in {:?}: {page}", t.elapsed());
    assert_eq!(page["title"], "berth preview", "{page}");
    assert_eq!(page["url"], format!("{}{port_path}", door.c.base).as_str());
    assert_eq!(page["cookie_visible"], "", "the cookie is HttpOnly");
    assert_eq!(
        page["sub_url"],
        format!("{}{port_path}sub/", door.c.base).as_str()
    );
    assert_eq!(page["echo"], "echo: ping over preview", "{page}");
}

/// The sandbox stopped: its routes answer 409 (or 503) with the reason.
async fn after_delete(door: &Door<'_>, seen: &mut Seen) {
    door.c.client().delete(&door.id).await.unwrap();
    for rest in ["/v1/commands", "/ports/8000/"] {
        let (status, v) = seen.json(door.get(rest)).await;
        assert!(matches!(status, 409 | 503), "{rest}: {status} {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&door.id), "{msg}");
    }
}

#[tokio::test]
async fn the_native_api_streams_through_the_controller_with_the_agent_token_never_shown() {
    let c = ControllerProcess::start("").await;
    let sb = c.client().create(&ide()).await.unwrap();
    let token = agent_token(&c, &sb.id);
    let door = Door {
        c: &c,
        id: sb.id.clone(),
        http: http(),
    };
    let mut seen = Seen::default();
    native_api(&door, &mut seen).await;
    after_delete(&door, &mut seen).await;
    seen.assert_clean(&token, &c.log_text());
}

#[tokio::test]
async fn a_preview_reaches_servers_inside_the_sandbox_from_chromium_and_websockets() {
    let c = ControllerProcess::start("").await;
    let sb = c.client().create(&ide()).await.unwrap();
    let token = agent_token(&c, &sb.id);
    let door = Door {
        c: &c,
        id: sb.id.clone(),
        http: http(),
    };
    let mut seen = Seen::default();
    preview(&door, &mut seen).await;
    after_delete(&door, &mut seen).await;
    seen.assert_clean(&token, &c.log_text());
}

/// A Docker desktop on its private network, reached only through the controller: the native
/// API (files, events, PTY, output), screenshots with the agent's headers, previews.
#[tokio::test]
async fn a_docker_desktop_is_reached_only_through_the_controller() {
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let sb = c
        .client()
        .create(&berth_protocol::controller::CreateSandbox {
            profile: "desktop".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let token = agent_token(&c, &sb.id);
    let door = Door {
        c: &c,
        id: sb.id.clone(),
        http: http(),
    };
    let mut seen = Seen::default();
    // Screenshots: the agent's headers pass, on the older route and the native one.
    for rest in [
        "/screenshot?settle_ms=3000&timeout_ms=200",
        "/v1/screenshot?settle_ms=3000&timeout_ms=200",
    ] {
        let (status, headers, body) = seen.send(door.get(rest)).await;
        assert_eq!(status, 200, "{rest}");
        assert_eq!(&body[1..4], b"PNG", "{rest}");
        for h in [
            "x-cache",
            "x-settle-timed-out",
            "x-settled-ms",
            "x-screen-width",
        ] {
            assert!(
                headers.contains_key(h),
                "{rest}: {h} missing from {headers:?}"
            );
        }
        assert!(
            matches!(headers["x-cache"].to_str().unwrap(), "hit" | "miss"),
            "{headers:?}"
        );
        assert_eq!(
            headers["x-settle-timed-out"], "true",
            "{rest}: a 3 s quiet cannot fit in 200 ms"
        );
    }
    let (_, headers, _) = seen.send(door.get("/screenshot")).await;
    assert!(headers.contains_key("x-cache"), "{headers:?}");
    native_api(&door, &mut seen).await;
    preview(&door, &mut seen).await;
    after_delete(&door, &mut seen).await;
    seen.assert_clean(&token, &c.log_text());
}
