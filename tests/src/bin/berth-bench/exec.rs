//! The `/execute` benchmark: `echo hi` against berth-agent and against a Flask +
//! `subprocess.run` server (OSWorld's server shape), each timed by two clients that behave as
//! OSWorld's does: desktop-env 1.0.2's `PythonController.execute_python_command` calls
//! `requests.post(url, headers={'Content-Type': 'application/json'}, data=json.dumps(…))` with no
//! Session, so every request is a new connection the client closes once it has read the answer.
//!
//! 1. This binary's client sends the bytes `requests` sends (its headers, `Connection:
//!    keep-alive`, TCP_NODELAY, the head and the body in two writes as urllib3 does), reads the
//!    status line and headers, then exactly `Content-Length` bytes of body (or chunks to the last
//!    one), and stops the clock there. It never waits for the server to close the connection:
//!    Flask's development server closes ~10 ms after it has answered, which a read-to-close client
//!    counts and `requests` does not.
//! 2. `requests` itself, timed from Python in the same run (`tests/bench/requests_execute.py`),
//!    which adds the library's own per-call cost (a Session, proxy and netrc look-ups) on both
//!    sides alike.
//!
//! Then, in the same run, the native routes with a keep-alive client (as SDKs and the
//! controller call them): the agent's `POST /v1/exec`, and the controller's `POST …/{id}/exec`
//! on a sandbox of the process provider (the same agent binary behind it), so the table shows
//! what the controller adds to an exec.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_tests::AgentProcess;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// What `json.dumps({"command": ["echo", "hi"], "shell": False})` gives.
const BODY: &str = r#"{"command": ["echo", "hi"], "shell": false}"#;

/// Warm-up requests per server before anything is timed.
const WARM_UP: usize = 50;

/// Requests in a row to one server before switching to the other.
const BLOCK: usize = 50;

struct Flask {
    child: Child,
    addr: String,
}

impl Drop for Flask {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_flask() -> Flask {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/flask_execute.py");
    let child = Command::new("python3")
        .arg(script)
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 with Flask (pip install flask)");
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(&addr).await.is_err() {
        assert!(Instant::now() < deadline, "the Flask server did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Flask { child, addr }
}

/// The request head `requests.post` sends for PythonController's call, header for header in
/// its order (captured from requests 2.34 on the wire; `json=` gives the same headers with
/// Content-Length and Content-Type swapped).
fn request_head(addr: &str) -> String {
    format!(
        "POST /execute HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: python-requests/2.34.2\r\n\
         Accept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: keep-alive\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        BODY.len()
    )
}

struct Response {
    status: u16,
    head: String,
    body: Vec<u8>,
}

async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, into: &mut String) {
    into.clear();
    let n = r.read_line(into).await.expect("read");
    assert!(
        n > 0,
        "the connection closed before the answer's head ended"
    );
}

/// Reads one HTTP/1.1 answer as `http.client` does: the status line and headers (skipping any
/// 1xx), then the body by `Content-Length`, or chunk by chunk up to the last chunk and its
/// trailers; only an answer with neither is read to the connection's end (HTTP/1.0 framing).
async fn read_response<R: AsyncBufRead + Unpin>(r: &mut R) -> Response {
    let mut line = String::new();
    let (status, head) = loop {
        read_line(r, &mut line).await;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP status line: {line:?}"));
        let mut head = line.clone();
        loop {
            read_line(r, &mut line).await;
            head.push_str(&line);
            if line == "\r\n" || line == "\n" {
                break;
            }
        }
        if !(100..200).contains(&status) {
            break (status, head);
        }
    };
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    };
    let chunked =
        header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        loop {
            read_line(r, &mut line).await;
            let size = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size, 16)
                .unwrap_or_else(|_| panic!("not a chunk size: {line:?}"));
            if size == 0 {
                loop {
                    read_line(r, &mut line).await;
                    if line == "\r\n" || line == "\n" {
                        break;
                    }
                }
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..]).await.expect("read chunk");
            read_line(r, &mut line).await;
        }
    } else if let Some(len) = header("content-length") {
        let len: usize = len.parse().expect("Content-Length");
        body.resize(len, 0);
        r.read_exact(&mut body).await.expect("read body");
    } else {
        r.read_to_end(&mut body).await.expect("read body");
    }
    Response { status, head, body }
}

/// One `/execute` on a fresh connection, as `requests.post` makes it; returns the time from
/// connect to the answer's last body byte.
async fn execute_once(addr: &str) -> Duration {
    let head = request_head(addr);
    let t = Instant::now();
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let mut stream = BufReader::new(stream);
    stream
        .get_mut()
        .write_all(head.as_bytes())
        .await
        .expect("write head");
    stream
        .get_mut()
        .write_all(BODY.as_bytes())
        .await
        .expect("write body");
    let resp = read_response(&mut stream).await;
    let took = t.elapsed();
    drop(stream); // the client closes, as requests' per-call Session does
    let body = String::from_utf8_lossy(&resp.body);
    assert!(
        resp.status == 200 && body.contains(r#""output":"hi\n""#),
        "unexpected answer from {addr}: {}{body}",
        resp.head
    );
    took
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// p50 and p99 of `requests.post` against each base URL, timed in Python.
fn python_requests(requests: usize, urls: &[String]) -> Vec<(f64, f64)> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/requests_execute.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(requests.to_string())
        .args(urls)
        .stderr(Stdio::inherit())
        .output()
        .expect("python3 with requests (pip install requests)");
    assert!(out.status.success(), "{script} failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON from the script");
    v.as_array()
        .expect("one result per URL")
        .iter()
        .map(|r| (r["p50_ms"].as_f64().unwrap(), r["p99_ms"].as_f64().unwrap()))
        .collect()
}

/// p50 and p99 of `requests` calls of `call` after a warm-up.
async fn timed<F, Fut>(requests: usize, mut call: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..WARM_UP {
        call().await;
    }
    let mut v = Vec::with_capacity(requests);
    for _ in 0..requests {
        let t = Instant::now();
        call().await;
        v.push(t.elapsed());
    }
    v.sort();
    (ms(percentile(&v, 0.5)), ms(percentile(&v, 0.99)))
}

/// p50 and p99 of `call` made once every 20 ms, as an engine's loop makes it (the clock runs
/// only during each call).
async fn paced<F, Fut>(requests: usize, mut call: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut v = Vec::with_capacity(requests);
    for _ in 0..requests {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = Instant::now();
        call().await;
        v.push(t.elapsed());
    }
    v.sort();
    (ms(percentile(&v, 0.5)), ms(percentile(&v, 0.99)))
}

/// A run's start on `client`'s agent, `echo hi` in the background with `yield_ms`: back to
/// back, then paced at one every 20 ms (the clock runs only during the call).
async fn background(
    client: &berth_protocol::AgentClient,
    requests: usize,
    tag: &str,
) -> ((f64, f64), (f64, f64)) {
    use berth_protocol::exec::ExecRequest;
    let n = std::sync::atomic::AtomicUsize::new(0);
    let one = || async {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let req = ExecRequest {
            id: Some(format!("bench-{tag}-{i}")),
            yield_ms: Some(250),
            ..ExecRequest::argv(["echo", "hi"])
        };
        let r = client.exec_background(&req).await.unwrap();
        assert_eq!((r.done, r.exit_code), (Some(true), Some(0)));
    };
    let b2b = timed(requests, one).await;
    (b2b, paced(requests, one).await)
}

/// `echo hi` through the agent's native exec and through the controller's, keep-alive.
async fn native(requests: usize) {
    use berth_protocol::controller::{Command as RunCommand, RunRequest};
    use berth_protocol::exec::ExecRequest;
    let agent = AgentProcess::start().await;
    let client = agent.client();
    let echo = ExecRequest::argv(["echo", "hi"]);
    let direct = timed(requests, || async {
        let r = client.exec(&echo).await.unwrap();
        assert_eq!(r.stdout.as_deref(), Some("hi\n"));
    })
    .await;
    // What the controller asks of the agent for a run: a background command (under its own
    // shim, so it outlives the agent) whose start waits for its end. Back to back, and paced
    // as an engine's loop calls (the clock stops between calls), with spare shims (the
    // default) and with every shim started when its command comes (`--spare-shims 0`).
    let spared = background(&client, requests, "spare").await;
    drop(agent);
    let cold = AgentProcess::start_with(berth_tests::AgentOptions {
        extra_args: vec!["--spare-shims".into(), "0".into()],
        ..Default::default()
    })
    .await;
    let started_cold = background(&cold.client(), requests, "cold").await;
    drop(cold);
    let c = berth_tests::controller::ControllerProcess::start("").await;
    let cl = c.client();
    let sb = cl.create(&berth_tests::controller::ide()).await.unwrap();
    let run = RunRequest {
        command: RunCommand::Argv(vec!["echo".into(), "hi".into()]),
        ..Default::default()
    };
    let one = || async {
        let r = cl.exec(&sb.id, &run).await.unwrap();
        assert_eq!((r.exit_code, r.stdout.as_str()), (Some(0), "hi\n"));
    };
    let through = timed(requests, one).await;
    let through_paced = paced(requests, one).await;
    println!();
    println!("exec `echo hi` on the native routes, keep-alive, {requests} requests each");
    println!("| route | p50 ms | p99 ms |");
    println!("|---|---|---|");
    println!(
        "| agent `POST /v1/exec` | {:.2} | {:.2} |",
        direct.0, direct.1
    );
    for (label, (b2b, paced)) in [
        ("spare shims (default)", spared),
        ("`--spare-shims 0`", started_cold),
    ] {
        for (pace, t) in [("back to back", b2b), ("one every 20 ms", paced)] {
            println!(
                "| agent `POST /v1/exec` background + `yield_ms` (a run's start), {label}, {pace}, over the foreground exec | {:.2} (+{:.2}) | {:.2} (+{:.2}) |",
                t.0,
                t.0 - direct.0,
                t.1,
                t.1 - direct.1
            );
        }
    }
    for (pace, t) in [
        ("back to back", through),
        ("one every 20 ms", through_paced),
    ] {
        println!(
            "| controller `POST …/{{id}}/exec` (process provider), {pace}, over the foreground exec | {:.2} (+{:.2}) | {:.2} (+{:.2}) |",
            t.0,
            t.0 - direct.0,
            t.1,
            t.1 - direct.1
        );
    }
}

pub async fn bench(requests: usize) {
    compat(requests).await;
    native(requests).await;
}

async fn compat(requests: usize) {
    let agent = AgentProcess::start().await;
    let flask = start_flask().await;
    let berth_addr = berth_tests::host_port(&agent.base).to_string();
    for _ in 0..WARM_UP {
        execute_once(&berth_addr).await;
        execute_once(&flask.addr).await;
    }
    // Interleaved in blocks so machine noise hits both alike.
    let mut berth = Vec::with_capacity(requests);
    let mut peer = Vec::with_capacity(requests);
    while berth.len() < requests {
        for _ in 0..BLOCK.min(requests - berth.len()) {
            berth.push(execute_once(&berth_addr).await);
        }
        for _ in 0..BLOCK.min(requests - peer.len()) {
            peer.push(execute_once(&flask.addr).await);
        }
    }
    berth.sort();
    peer.sort();
    let raw = [
        (ms(percentile(&berth, 0.5)), ms(percentile(&berth, 0.99))),
        (ms(percentile(&peer, 0.5)), ms(percentile(&peer, 0.99))),
    ];
    let py = python_requests(
        requests,
        &[
            format!("http://{berth_addr}"),
            format!("http://{}", flask.addr),
        ],
    );
    println!(
        "/execute round trip, `echo hi`, new connection per request as OSWorld's requests.post makes them, \
         {requests} requests each, clock stopped at the answer's last body byte"
    );
    println!(
        "| client | berth-agent p50 ms | berth-agent p99 ms | Flask + subprocess.run p50 ms | Flask p99 ms | ratio (Flask / berth) p50 | ratio p99 |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (label, [(b50, b99), (p50, p99)]) in [
        ("requests' bytes, read by Content-Length (Rust)", raw),
        ("Python requests.post (OSWorld's client)", [py[0], py[1]]),
    ] {
        println!(
            "| {label} | {b50:.2} | {b99:.2} | {p50:.2} | {p99:.2} | {:.1}x | {:.1}x |",
            p50 / b50,
            p99 / b99
        );
    }
}
