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
pub(super) struct FakeBook {
    policy: Egress,
    unknown: bool,
    pub(super) notes: Mutex<Vec<String>>,
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
    fn name_refused(&self, _sandbox: &str, name: &str, reason: Denial) {
        let n = format!("name refused {name} {}", reason.as_str());
        self.notes.lock().unwrap().push(n);
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

/// A fake book whose one sandbox may reach `up.test`, `private.test` by name and 127.0.0.1.
pub(super) fn book(unknown: bool) -> Arc<FakeBook> {
    Arc::new(FakeBook {
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
    })
}

/// `up.test` at `up`, `private.test` at a private address.
pub(super) fn hosts(up: IpAddr) -> Hosts {
    Hosts::from([
        ("up.test".to_string(), vec![up]),
        (
            "private.test".to_string(),
            vec!["10.0.0.1".parse().unwrap()],
        ),
    ])
}

/// A proxy on loopback whose one sandbox may reach `up.test` (the upstream) and nothing else.
async fn proxy(unknown: bool) -> (SocketAddr, SocketAddr, Arc<FakeBook>) {
    let up = upstream().await;
    let book = book(unknown);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let hosts = hosts(up.ip());
    tokio::spawn(Proxy::new(book.clone() as Arc<dyn Sandboxes>, hosts, None).serve(l));
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

/// An HTTPS upstream (a certificate for `up.test` from `ca`) answering each request on a
/// connection with its head.
async fn tls_upstream(ca: &super::ca::Ca) -> SocketAddr {
    let acceptor = ca.acceptor("up.test").unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(s).await else {
                    return;
                };
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                loop {
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    let head: Vec<u8> = got.drain(..end).collect();
                    let reply =
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", head.len());
                    if s.write_all(reply.as_bytes()).await.is_err()
                        || s.write_all(&head).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A proxy with an edge: `up.test` (the HTTPS upstream) has a credential for `/o/r.git/`
/// granted to sandbox `sb`, and `X-Key` for every path.
async fn edge_proxy() -> (SocketAddr, SocketAddr, Arc<FakeBook>, String) {
    use super::edge::{Credential, Edge};
    let upstream_ca = super::ca::Ca::ephemeral("upstream").unwrap();
    let up = tls_upstream(&upstream_ca).await;
    let ca = Arc::new(super::ca::Ca::ephemeral("test").unwrap());
    let pem = ca.pem().to_string();
    let key = Credential::new("up.test", "X-Key", "Key s3cret-key").unwrap();
    let edge =
        Arc::new(Edge::new(ca, vec![key], &[upstream_ca.pem().as_bytes().to_vec()]).unwrap());
    let mut repo = Credential::new("up.test", "Authorization", "Basic s3cret-repo").unwrap();
    repo.paths = vec!["/o/r.git/".into()];
    edge.grant("sb", vec![repo]);
    let book = Arc::new(FakeBook {
        policy: Egress::Rules(EgressRules {
            allow: vec!["up.test".into(), "127.0.0.1/32".into()],
            deny_private: true,
        }),
        unknown: false,
        notes: Mutex::new(Vec::new()),
    });
    let hosts = Hosts::from([("up.test".to_string(), vec![up.ip()])]);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(Proxy::new(book.clone() as Arc<dyn Sandboxes>, hosts, Some(edge)).serve(l));
    (addr, up, book, pem)
}

/// Through a CONNECT tunnel, TLS trusting `ca_pem` as `up.test`, the requests' answers.
async fn through_edge(p: SocketAddr, port: u16, ca_pem: &str, requests: &[String]) -> Vec<String> {
    let mut s = TcpStream::connect(p).await.unwrap();
    let connect = format!("CONNECT up.test:{port} HTTP/1.1\r\nHost: up.test:{port}\r\n\r\n");
    s.write_all(connect.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 39];
    s.read_exact(&mut head).await.unwrap();
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let connector: tokio_native_tls::TlsConnector = native_tls::TlsConnector::builder()
        .add_root_certificate(native_tls::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap()
        .into();
    let mut tls = connector.connect("up.test", s).await.unwrap();
    let mut answers = Vec::new();
    for r in requests {
        tls.write_all(r.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // The answer's head and a body whose length the head gives.
        loop {
            let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).into_owned();
            if let Some(i) = text.find("\r\n\r\n") {
                let len: usize = text[..i]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if got.len() >= i + 4 + len {
                    break;
                }
            }
        }
        answers.push(String::from_utf8_lossy(&got).into_owned());
    }
    answers
}

#[tokio::test]
async fn the_edge_adds_credentials_by_host_and_path_and_checks_each_host() {
    let (p, up, book, pem) = edge_proxy().await;
    let get = |path: &str, host: &str, extra: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n")
    };
    let answers = through_edge(
        p,
        up.port(),
        &pem,
        &[
            get(
                "/o/r.git/info/refs?service=git-upload-pack",
                "up.test",
                "Authorization: Basic forged\r\n",
            ),
            get("/o/other.git/info/refs", "up.test", ""),
            get("/o/r.git/../other.git/info/refs", "up.test", ""),
            get("/x", "elsewhere.test", ""),
        ],
    )
    .await;
    for a in &answers {
        println!("---\n{a}");
    }
    let lower = |i: usize| answers[i].to_ascii_lowercase();
    // Every request to the host carries its key; the repository's requests its token, the
    // client's own header replaced.
    assert!(lower(0).contains("x-key: key s3cret-key"), "{}", answers[0]);
    assert!(
        lower(0).contains("authorization: basic s3cret-repo"),
        "{}",
        answers[0]
    );
    assert!(!lower(0).contains("forged"), "{}", answers[0]);
    assert!(lower(1).contains("x-key: key s3cret-key"), "{}", answers[1]);
    assert!(!lower(1).contains("authorization"), "{}", answers[1]);
    assert!(!lower(2).contains("authorization"), "{}", answers[2]);
    // Another host named inside the tunnel is refused, not forwarded.
    assert!(answers[3].starts_with("HTTP/1.1 403"), "{}", answers[3]);
    assert!(lower(3).contains("host_mismatch"), "{}", answers[3]);
    let notes = book.notes.lock().unwrap().clone();
    assert!(
        notes.contains(&"connected up.test".to_string()),
        "{notes:?}"
    );
    assert!(
        notes.contains(&"denied up.test host_mismatch".to_string()),
        "{notes:?}"
    );
}

#[tokio::test]
async fn a_host_without_credentials_is_tunnelled_untouched() {
    let (p, up, _book, pem) = edge_proxy().await;
    // Another name for the same upstream: no credential, so no interception: the client sees
    // the upstream's own certificate, which the proxy's CA did not sign.
    let mut s = TcpStream::connect(p).await.unwrap();
    let connect = format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", up.port());
    s.write_all(connect.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 39];
    s.read_exact(&mut head).await.unwrap();
    let connector: tokio_native_tls::TlsConnector = native_tls::TlsConnector::builder()
        .add_root_certificate(native_tls::Certificate::from_pem(pem.as_bytes()).unwrap())
        .danger_accept_invalid_hostnames(true)
        .build()
        .unwrap()
        .into();
    let err = connector
        .connect("127.0.0.1", s)
        .await
        .err()
        .map(|e| e.to_string());
    println!("{err:?}");
    assert!(
        err.is_some(),
        "the proxy's CA signed a tunnel it had no credential for"
    );
}

#[test]
fn credentials_come_from_the_config_with_their_secrets_and_the_ca_is_kept() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("token");
    std::fs::write(&secret, "t0ken\n").unwrap();
    let build = |extra: &str| {
        let text = format!(
            "[[egress.credentials]]\nhost = \"*.example.org\"\nsecret_file = \"{}\"\n{extra}",
            secret.display()
        );
        let c: crate::config::Config = toml::from_str(&text).unwrap();
        super::edge_from_config(&c.egress, dir.path(), "t").map(|_| ())
    };
    build("").unwrap();
    build("value = \"token {secret}\"\nheader = \"X-Token\"\n").unwrap();
    build("basic_user = \"x-access-token\"\n").unwrap();
    let err = |extra: &str| build(extra).unwrap_err().to_string();
    assert!(err("value = \"no secret\"\n").contains("{secret}"));
    assert!(err("value = \"{secret}\"\nbasic_user = \"u\"\n").contains("not both"));
    assert!(err("header = \"bad header\"\n").contains("header name"));
    let c: crate::config::Config = toml::from_str(
        "[[egress.credentials]]\nhost = \"a.test\"\nsecret = \"BERTH_TEST_NO_SUCH_VARIABLE\"\n",
    )
    .unwrap();
    let e = super::edge_from_config(&c.egress, dir.path(), "t")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("BERTH_TEST_NO_SUCH_VARIABLE is not set"), "{e}");
    // One CA, generated once, its key the controller's alone.
    let pem = std::fs::read_to_string(dir.path().join(super::ca::CERT_FILE)).unwrap();
    let again = super::ca::Ca::load_or_create(dir.path(), "t").unwrap();
    assert_eq!(again.pem(), pem);
    let mode = std::fs::metadata(dir.path().join(super::ca::KEY_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        super::basic("x-access-token", "t0ken"),
        "Basic eC1hY2Nlc3MtdG9rZW46dDBrZW4="
    );
}
