//! The proxy on loopback, driven as sandboxes' programs and hostile ones drive it: an upstream
//! on loopback stands for the outside (allowed by an address entry, named by `[egress.hosts]`),
//! and a fake book (every client one sandbox) records what the proxy reports.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_protocol::egress::{Denial, Egress, EgressRules};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::proxy::{Hosts, Proxy, Sandboxes};

/// A fake book: every client is sandbox `sb` with `policy`, unless `unknown`.
struct FakeBook {
    policy: Egress,
    unknown: bool,
    notes: Mutex<Vec<String>>,
}

impl Sandboxes for FakeBook {
    fn lookup(&self, _peer: IpAddr) -> Option<(String, Egress)> {
        (!self.unknown).then(|| ("sb".to_string(), self.policy.clone()))
    }
    fn denied(&self, _sandbox: &str, host: &str, _port: u16, reason: Denial) {
        let n = format!("denied {host} {}", reason.as_str());
        self.notes.lock().unwrap().push(n);
    }
    fn connected(&self, _sandbox: &str, host: &str) {
        self.notes.lock().unwrap().push(format!("connected {host}"));
    }
}

/// An upstream that answers every connection with what it read, as an HTTP body.
async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", got.len());
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&got).await;
            });
        }
    });
    addr
}

/// A proxy on loopback whose one sandbox may reach `up.test` (the upstream) and nothing else.
async fn proxy(unknown: bool) -> (SocketAddr, SocketAddr, Arc<FakeBook>) {
    let up = upstream().await;
    let book = Arc::new(FakeBook {
        policy: Egress::Rules(EgressRules {
            allow: vec![
                "up.test".into(),
                "127.0.0.1/32".into(),
                "private.test".into(),
            ],
            deny_private: true,
        }),
        unknown,
        notes: Mutex::new(Vec::new()),
    });
    let hosts = Hosts::from([
        ("up.test".to_string(), vec![up.ip()]),
        (
            "private.test".to_string(),
            vec!["10.0.0.1".parse().unwrap()],
        ),
    ]);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(Proxy::new(book.clone() as Arc<dyn Sandboxes>, hosts).serve(l));
    (addr, up, book)
}

/// Sends `bytes` and reads until the proxy closes (bounded).
async fn exchange(proxy: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn an_allowed_request_is_forwarded_in_origin_form_and_counted() {
    let (p, up, book) = proxy(false).await;
    let req = format!(
        "GET http://up.test:{}/x?y HTTP/1.1\r\nHost: up.test:{}\r\nProxy-Connection: keep-alive\r\n\r\n",
        up.port(),
        up.port()
    );
    let out = exchange(p, req.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    assert!(out.contains("GET /x?y HTTP/1.1\r\n"), "{out}");
    assert!(
        out.contains("Connection: close\r\n") && !out.contains("Proxy-"),
        "{out}"
    );
    assert_eq!(*book.notes.lock().unwrap(), ["connected up.test"]);
}

#[tokio::test]
async fn a_tunnel_passes_bytes_and_a_mismatched_server_name_closes_it() {
    let (p, up, book) = proxy(false).await;
    let connect = format!("CONNECT up.test:{} HTTP/1.1\r\n\r\n", up.port());
    let plain = format!("{connect}GET / HTTP/1.1\r\nHost: up.test\r\n\r\n");
    let out = exchange(p, plain.as_bytes()).await;
    assert!(
        out.starts_with("HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK"),
        "{out}"
    );
    let mut hostile = connect.into_bytes();
    hostile.extend_from_slice(&super::hello::tests::hello(Some("evil.test")));
    let out = exchange(p, &hostile).await;
    assert_eq!(out, "HTTP/1.1 200 Connection established\r\n\r\n");
    // A ClientHello in two records, its name in the second: not let through unread.
    let h = super::hello::tests::hello(Some("evil.test"));
    let (a, b) = h[5..].split_at(20);
    let mut split = format!("CONNECT up.test:{} HTTP/1.1\r\n\r\n", up.port()).into_bytes();
    split.extend_from_slice(&[22, 3, 1, 0, a.len() as u8]);
    split.extend_from_slice(a);
    split.extend_from_slice(&[22, 3, 1, (b.len() >> 8) as u8, b.len() as u8]);
    split.extend_from_slice(b);
    let out = exchange(p, &split).await;
    assert_eq!(out, "HTTP/1.1 200 Connection established\r\n\r\n");
    let notes = book.notes.lock().unwrap().clone();
    assert_eq!(
        notes,
        [
            "connected up.test",
            "denied up.test sni_mismatch",
            "denied up.test unreadable_client_hello"
        ]
    );
}

#[tokio::test]
async fn refusals_are_answered_at_once_with_their_reason() {
    let (p, up, book) = proxy(false).await;
    for (req, status, reason) in [
        (
            "CONNECT other.test:443 HTTP/1.1\r\n\r\n".to_string(),
            "403",
            "not_allowed",
        ),
        (
            "CONNECT 10.9.9.9:443 HTTP/1.1\r\n\r\n".into(),
            "403",
            "ip_literal",
        ),
        (
            "GET http://private.test/ HTTP/1.1\r\n\r\n".into(),
            "403",
            "private_address",
        ),
        (
            format!(
                "GET http://up.test:{}/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
                up.port()
            ),
            "403",
            "host_mismatch",
        ),
        (
            "GET / HTTP/1.1\r\nHost: up.test\r\n\r\n".into(),
            "400",
            "this is an egress proxy",
        ),
        (
            "\x16\x03\x01garbage\r\n\r\n".into(),
            "400",
            "not an HTTP/1 request",
        ),
        (
            format!(
                "GET http://up.test/ HTTP/1.1\r\nX: {}\r\n\r\n",
                "a".repeat(20_000)
            ),
            "431",
            "over",
        ),
    ] {
        let out = exchange(p, req.as_bytes()).await;
        assert!(
            out.starts_with(&format!("HTTP/1.1 {status} ")),
            "{req:.60}: {out}"
        );
        assert!(out.contains(reason), "{req:.60}: {out}");
    }
    let notes = book.notes.lock().unwrap().clone();
    assert_eq!(
        notes,
        [
            "denied other.test not_allowed",
            "denied 10.9.9.9 ip_literal",
            "denied private.test private_address",
            "denied up.test host_mismatch"
        ]
    );
}

#[tokio::test]
async fn an_unknown_client_is_refused() {
    let (p, up, _) = proxy(true).await;
    let out = exchange(
        p,
        format!("CONNECT up.test:{} HTTP/1.1\r\n\r\n", up.port()).as_bytes(),
    )
    .await;
    assert!(
        out.starts_with("HTTP/1.1 403 ") && out.contains("is not a sandbox"),
        "{out}"
    );
}

#[tokio::test]
async fn clients_that_vanish_at_any_point_leave_the_proxy_serving() {
    let (p, up, _) = proxy(false).await;
    let full = format!(
        "CONNECT up.test:{} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: up.test\r\n\r\n",
        up.port()
    );
    let mut resets = 0;
    for cut in (0..full.len()).step_by(3) {
        let mut s = TcpStream::connect(p).await.unwrap();
        s.write_all(&full.as_bytes()[..cut]).await.unwrap();
        // A reset, not a close: the proxy sees the connection fail under it.
        s.set_zero_linger().unwrap();
        drop(s);
        resets += 1;
    }
    println!("{resets} clients reset mid-request");
    let out = exchange(p, full.as_bytes()).await;
    assert!(out.contains("HTTP/1.1 200 OK"), "{out}");
}
