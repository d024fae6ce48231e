//! `gateway`: what the controller's relay costs. One `ide` sandbox (process provider) reached two
//! ways in the same run — straight at its agent with the bearer token, and through
//! `…/{id}/v1/{*path}` with the API key — for small requests (p50/p99 of `GET /v1/commands`,
//! one connection reused, as `requests.Session` does), a file download and upload (MiB/s, the
//! body read to its `Content-Length`), and a PTY's echo round trip over WebSocket.

use std::time::Instant;

use berth_protocol::client::{AgentClient, Auth};
use berth_protocol::controller::CreateSandbox;
use berth_protocol::{ExecRequest, PtyRequest};
use berth_tests::controller::ControllerProcess;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use crate::pct;

async fn small(c: &AgentClient, n: usize) -> (f64, f64) {
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        c.commands().await.unwrap();
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    (pct(&mut ms, 0.5), pct(&mut ms, 0.99))
}

async fn download(c: &AgentClient, path: &str, bytes: u64) -> f64 {
    let t = Instant::now();
    let r = c.download(path).await.unwrap();
    assert_eq!(r.content_length(), Some(bytes));
    let mut got = 0u64;
    let mut s = r.bytes_stream();
    while let Some(chunk) = s.next().await {
        got += chunk.unwrap().len() as u64;
    }
    assert_eq!(got, bytes);
    bytes as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64()
}

async fn upload(c: &AgentClient, path: &str, body: &[u8]) -> f64 {
    let t = Instant::now();
    c.upload(path, reqwest::Body::from(body.to_vec()), None)
        .await
        .unwrap();
    body.len() as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64()
}

/// Median milliseconds from a byte typed into `cat` to its echo.
async fn pty_echo(c: &AgentClient, n: usize) -> f64 {
    let pty = c
        .pty_create(&PtyRequest {
            cmd: Some(vec!["cat".into()]),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut ws = c.pty_attach(&pty.id).await.unwrap();
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        let b = b'a' + (i % 26) as u8;
        let t = Instant::now();
        ws.send(Message::Binary(vec![b].into())).await.unwrap();
        loop {
            match ws.next().await.unwrap().unwrap() {
                Message::Binary(d) if d.contains(&b) => break,
                _ => {}
            }
        }
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let _ = c.pty_kill(&pty.id).await;
    pct(&mut ms, 0.5)
}

pub async fn bench(requests: usize) {
    let c = ControllerProcess::start("").await;
    let sb = c
        .client()
        .create(&CreateSandbox {
            profile: "ide-ubuntu".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let through = c.client().agent(&sb.id);
    let compat = sb.endpoints.compat.clone().expect("the agent's address");
    let direct = AgentClient::with_auth(
        compat,
        Auth::Bearer(c.agent_token(&sb.id)),
        reqwest::Client::builder().no_proxy().build().unwrap(),
    );
    const SIZE: u64 = 256 << 20;
    direct
        .exec(&ExecRequest {
            shell: Some(format!("head -c {SIZE} /dev/urandom > ~/big.bin")),
            ..Default::default()
        })
        .await
        .unwrap();
    let body: Vec<u8> = (0..(64u32 << 20))
        .map(|i| i.wrapping_mul(2_654_435_761) as u8)
        .collect();
    println!("gateway: one ide sandbox, straight at its agent vs through the controller");
    println!("{:<44} {:>14} {:>18}", "", "agent direct", "via controller");
    let (dp50, dp99) = small(&direct, requests).await;
    let (tp50, tp99) = small(&through, requests).await;
    println!(
        "{:<44} {:>8.2}/{:<5.2} {:>12.2}/{:<5.2}",
        format!("GET /v1/commands p50/p99 ms ({requests})"),
        dp50,
        dp99,
        tp50,
        tp99
    );
    let (dd, td) = (
        download(&direct, "~/big.bin", SIZE).await,
        download(&through, "~/big.bin", SIZE).await,
    );
    println!(
        "{:<44} {:>14.0} {:>18.0}",
        "download 256 MiB, MiB/s", dd, td
    );
    let (du, tu) = (
        upload(&direct, "~/up.bin", &body).await,
        upload(&through, "~/up.bin", &body).await,
    );
    println!("{:<44} {:>14.0} {:>18.0}", "upload 64 MiB, MiB/s", du, tu);
    let n = requests.min(200);
    let (de, te) = (pty_echo(&direct, n).await, pty_echo(&through, n).await);
    println!(
        "{:<44} {:>14.2} {:>18.2}",
        format!("PTY echo round trip p50 ms ({n})"),
        de,
        te
    );
    c.client().delete(&sb.id).await.unwrap();
}
