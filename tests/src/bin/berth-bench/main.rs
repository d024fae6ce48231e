//! berth's benchmarks, each figure printed beside the peer it is compared with, measured in
//! the same run on the same machine.
//!
//!   cargo run -p berth-tests --bin berth-bench -- [exec] [display] [record] [workstation] [controller]
//!                                                 [--requests N] [--seconds S] [--runs R]
//!
//! `exec`: `/execute` round trip for `echo hi`, a new TCP connection per request as OSWorld's
//! client makes them, against berth-agent and against a Flask + `subprocess.run` server.
//! `display`: screenshots, input and settle on a 1920x1080 XFCE desktop, against scrot +
//! Pillow, Pillow's ImageGrab and xdotool.
//! `record`: CPU per recorded minute against OSWorld's and Daytona's ffmpeg commands.
//! `workstation`: `--desktop` cold start to strict readiness, agent and desktop memory.
//! `controller`: warm-pool claim latency and cold create-to-ready through `berth serve`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_tests::{AgentProcess, raw_http};

mod controller;
mod desktop;
mod display;
mod record;
mod workstation;

const BODY: &str = r#"{"command": ["echo", "hi"], "shell": false}"#;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let requests: usize = args
        .iter()
        .position(|a| a == "--requests")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let which: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--") && a.parse::<usize>().is_err())
        .collect();
    if which.is_empty() || which.contains(&"exec") {
        bench_exec(requests).await;
    }
    if which.is_empty() || which.contains(&"display") {
        display::bench(requests.min(200)).await;
    }
    if which.is_empty() || which.contains(&"record") {
        let seconds = args
            .iter()
            .position(|a| a == "--seconds")
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        record::bench(seconds).await;
    }
    if which.is_empty() || which.contains(&"workstation") {
        let runs = args
            .iter()
            .position(|a| a == "--runs")
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(5);
        workstation::bench(runs).await;
    }
    if which.is_empty() || which.contains(&"controller") {
        let runs = args
            .iter()
            .position(|a| a == "--runs")
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(5);
        controller::bench(runs).await;
    }
}

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

/// One `/execute` on a fresh connection; returns the round-trip time.
async fn execute_once(addr: &str) -> Duration {
    let req = format!(
        "POST /execute HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let t = Instant::now();
    let resp = raw_http(addr, req.as_bytes()).await;
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&resp);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.contains(r#""output":"hi\n""#),
        "unexpected answer from {addr}: {text}"
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

async fn bench_exec(requests: usize) {
    let agent = AgentProcess::start().await;
    let flask = start_flask().await;
    let berth_addr = berth_tests::host_port(&agent.base).to_string();
    for _ in 0..50 {
        execute_once(&berth_addr).await;
        execute_once(&flask.addr).await;
    }
    // Interleaved in blocks so machine noise hits both alike.
    let mut berth = Vec::with_capacity(requests);
    let mut peer = Vec::with_capacity(requests);
    let block = 50;
    while berth.len() < requests {
        for _ in 0..block.min(requests - berth.len()) {
            berth.push(execute_once(&berth_addr).await);
        }
        for _ in 0..block.min(requests - peer.len()) {
            peer.push(execute_once(&flask.addr).await);
        }
    }
    berth.sort();
    peer.sort();
    let (b50, b99) = (percentile(&berth, 0.5), percentile(&berth, 0.99));
    let (p50, p99) = (percentile(&peer, 0.5), percentile(&peer, 0.99));
    println!(
        "/execute round trip, `echo hi`, new connection per request, {requests} requests each"
    );
    println!("| server | p50 ms | p99 ms |");
    println!("|---|---|---|");
    println!("| berth-agent | {:.2} | {:.2} |", ms(b50), ms(b99));
    println!(
        "| Flask + subprocess.run (OSWorld's server shape) | {:.2} | {:.2} |",
        ms(p50),
        ms(p99)
    );
    println!(
        "| ratio (Flask / berth) | {:.1}x | {:.1}x |",
        ms(p50) / ms(b50),
        ms(p99) / ms(b99)
    );
}
