//! The egress proxy: HTTP proxying by host name for sandboxes whose only way out it is.
//! `CONNECT host:port` is tunnelled after the policy allows the name and each address it
//! resolves to, and the tunnel's first bytes are checked: a TLS server name or an HTTP `Host`
//! other than the name asked for closes it. Absolute-form requests (`GET http://host/…`) are
//! forwarded in origin form with `Connection: close`, their `Host` checked against the URL.
//! A connection is told apart by its peer address: the sandbox's on the internal network.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use berth_protocol::egress::{self, Denial, Egress, HostVerdict, host_of};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::edge::{Edge, Prefixed};
use super::hello::{self, Hello};

/// The largest request head read.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client has to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a name has to resolve and an address to accept a connection.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// A tunnel with no traffic either way for this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Connections served at once; more wait for a slot.
const MAX_CONNECTIONS: usize = 4096;

/// What the proxy asks of the controller.
pub trait Sandboxes: Send + Sync + 'static {
    /// The sandbox a connection from `peer` comes from, with its policy.
    fn lookup(&self, peer: IpAddr) -> Option<(String, Egress)>;
    /// A refused attempt (`egress.denied` on its timeline).
    fn denied(&self, sandbox: &str, host: &str, port: u16, reason: Denial);
    /// A connection made to `host`.
    fn connected(&self, sandbox: &str, host: &str);
    /// A name refused by the sandbox's DNS (`egress.denied`, `"via": "dns"`).
    fn name_refused(&self, sandbox: &str, name: &str, reason: Denial);
}

/// Names resolved by the proxy itself before the system's resolver (the config's
/// `[egress.hosts]`: a private mirror or a test host).
pub type Hosts = BTreeMap<String, Vec<IpAddr>>;

pub struct Proxy {
    sandboxes: Arc<dyn Sandboxes>,
    hosts: Hosts,
    slots: Arc<tokio::sync::Semaphore>,
    /// Credentials added at the edge, when any are configured.
    edge: Option<Arc<Edge>>,
}

/// A refusal as the client sees it: the status, and the reason in the body and a header.
struct Refusal {
    status: u16,
    reason: String,
}

impl Refusal {
    fn bad(reason: impl Into<String>) -> Refusal {
        Refusal {
            status: 400,
            reason: reason.into(),
        }
    }
}

/// Header naming the reason a request was refused.
pub const DENIED_HEADER: &str = berth_protocol::routes::header::EGRESS_DENIED;

impl Proxy {
    pub fn new(sandboxes: Arc<dyn Sandboxes>, hosts: Hosts, edge: Option<Arc<Edge>>) -> Arc<Proxy> {
        Arc::new(Proxy {
            sandboxes,
            hosts: normalised(hosts),
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
            edge,
        })
    }

    /// Serves `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let slots = self.slots.clone();
        accept_each(listener, slots, "egress proxy", move |stream, peer| {
            let me = self.clone();
            async move { me.connection(stream, peer).await }
        })
        .await
    }

    async fn connection(&self, mut client: TcpStream, peer: SocketAddr) {
        let _ = client.set_nodelay(true);
        let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
            Ok(Ok(h)) => h,
            Ok(Err(r)) => return refuse(&mut client, r).await,
            Err(_) => return,
        };
        let Some((sandbox, policy)) = self.sandboxes.lookup(peer.ip()) else {
            let r = Refusal {
                status: 403,
                reason: format!("{} is not a sandbox of this controller", peer.ip()),
            };
            return refuse(&mut client, r).await;
        };
        let req = match parse_request(&head.bytes[..head.len]) {
            Ok(r) => r,
            Err(r) => return refuse(&mut client, r).await,
        };
        let deny = |reason: Denial| {
            self.sandboxes.denied(&sandbox, &req.host, req.port, reason);
            Refusal {
                status: 403,
                reason: format!(
                    "{}: {}:{} is not allowed by this sandbox's egress policy",
                    reason.as_str(),
                    req.host,
                    req.port
                ),
            }
        };
        if let Some(h) = &req.host_header
            && !req.connect
            && egress::normalise(host_of(h)) != egress::normalise(&req.host)
        {
            return refuse(&mut client, deny(Denial::HostMismatch)).await;
        }
        let upstream = match self.dial(&policy, &req.host, req.port).await {
            Ok(s) => s,
            Err(Dial::Denied(d)) => return refuse(&mut client, deny(d)).await,
            Err(Dial::Failed(e)) => {
                let r = Refusal {
                    status: 502,
                    reason: format!("{}:{}: {e}", req.host, req.port),
                };
                return refuse(&mut client, r).await;
            }
        };
        let rest = head.bytes[head.len..head.filled].to_vec();
        let edge = self
            .edge
            .as_ref()
            .filter(|e| e.intercepts(&sandbox, &req.host));
        if let (true, Some(edge)) = (req.connect, edge) {
            self.intercept(client, upstream, &sandbox, &req, rest, edge.clone())
                .await;
        } else if req.connect {
            self.tunnel(client, upstream, &sandbox, &req, rest, deny)
                .await;
        } else {
            self.sandboxes.connected(&sandbox, &req.host);
            let mut out = req.origin_form_head.into_bytes();
            out.extend_from_slice(&rest);
            relay(client, upstream, out).await;
        }
    }

    /// Answers the CONNECT, then relays: the upstream's bytes at once (a protocol whose server
    /// speaks first), the client's once its first bytes pass the name checks.
    async fn tunnel(
        &self,
        mut client: TcpStream,
        upstream: TcpStream,
        sandbox: &str,
        req: &Request,
        first: Vec<u8>,
        deny: impl Fn(Denial) -> Refusal,
    ) {
        if !established(&mut client).await {
            return;
        }
        let (mut cr, cw) = client.into_split();
        let (ur, uw) = upstream.into_split();
        let clock = Clock::new();
        let up = async {
            match first_bytes(&mut cr, first, &req.host).await {
                Ok(first) => {
                    self.sandboxes.connected(sandbox, &req.host);
                    pump(cr, uw, first, &clock).await;
                    false
                }
                Err(d) => {
                    // The tunnel is open: the refusal is the event and the close.
                    if let Some(d) = d {
                        let _ = deny(d);
                    }
                    true
                }
            }
        };
        let down = pump(ur, cw, Vec::new(), &clock);
        let refused = async {
            let (refused, _) = tokio::join!(up, down);
            refused
        };
        tokio::select! {
            _ = refused => {}
            _ = clock.idle() => {}
        }
    }

    /// A tunnel to a host with a credential: once the client's first bytes pass the name
    /// checks, a TLS client is served by the edge (which adds the credential); anything else
    /// is relayed untouched.
    async fn intercept(
        &self,
        mut client: TcpStream,
        upstream: TcpStream,
        sandbox: &str,
        req: &Request,
        first: Vec<u8>,
        edge: Arc<Edge>,
    ) {
        if !established(&mut client).await {
            return;
        }
        let first = match first_bytes(&mut client, first, &req.host).await {
            Ok(f) => f,
            Err(d) => {
                if let Some(d) = d {
                    self.sandboxes.denied(sandbox, &req.host, req.port, d);
                }
                return;
            }
        };
        self.sandboxes.connected(sandbox, &req.host);
        if !matches!(hello::parse(&first), Hello::Tls(_)) {
            return relay(client, upstream, first).await;
        }
        let (book, id, host, port) = (
            self.sandboxes.clone(),
            sandbox.to_string(),
            req.host.clone(),
            req.port,
        );
        let deny = move |d: Denial| book.denied(&id, &host, port, d);
        let client = Prefixed::new(first, client);
        edge.serve(
            client,
            upstream,
            sandbox.to_string(),
            req.host.clone(),
            deny,
        )
        .await;
    }

    /// Resolves and connects, each address checked against the policy.
    async fn dial(&self, policy: &Egress, host: &str, port: u16) -> Result<TcpStream, Dial> {
        let addrs: Vec<IpAddr> = match egress::host_verdict(policy, host) {
            HostVerdict::Deny(d) => return Err(Dial::Denied(d)),
            HostVerdict::Connect(ip) => vec![ip],
            HostVerdict::Resolve => self.resolve(host).await?,
        };
        let allowed = egress::reachable(policy, &addrs).map_err(Dial::Denied)?;
        let mut last = String::from("no address");
        for ip in allowed {
            let to = SocketAddr::new(ip, port);
            match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(to)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Ok(Err(e)) => last = format!("{to}: {e}"),
                Err(_) => last = format!("{to}: no answer within {} s", DIAL_TIMEOUT.as_secs()),
            }
        }
        Err(Dial::Failed(last))
    }

    async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, Dial> {
        resolve(&self.hosts, host).await.map_err(|e| match e {
            Unresolved::NotFound => Dial::Denied(Denial::Unresolved),
            Unresolved::TimedOut => Dial::Failed(format!(
                "{host} did not resolve within {} s",
                DIAL_TIMEOUT.as_secs()
            )),
        })
    }
}

/// Accepts connections on `listener` until the task is dropped, each served by `serve` on a
/// task of its own while it holds one of `slots` (more wait for one).
pub async fn accept_each<F, Fut>(
    listener: TcpListener,
    slots: Arc<tokio::sync::Semaphore>,
    what: &'static str,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, "{what}: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let work = serve(stream, peer);
        tokio::spawn(async move {
            let _permit = permit;
            work.await;
        });
    }
}

/// Why a name has no addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unresolved {
    NotFound,
    TimedOut,
}

/// The addresses of `host`: from `hosts` (normalised names), else the system's resolver.
pub async fn resolve(hosts: &Hosts, host: &str) -> Result<Vec<IpAddr>, Unresolved> {
    if let Some(a) = hosts.get(&egress::normalise(host)) {
        return Ok(a.clone());
    }
    let lookup = tokio::net::lookup_host((host, 0));
    match tokio::time::timeout(DIAL_TIMEOUT, lookup).await {
        Ok(Ok(it)) => {
            let v: Vec<IpAddr> = it.map(|a| a.ip()).collect();
            if v.is_empty() {
                Err(Unresolved::NotFound)
            } else {
                Ok(v)
            }
        }
        Ok(Err(_)) => Err(Unresolved::NotFound),
        Err(_) => Err(Unresolved::TimedOut),
    }
}

/// `[egress.hosts]` with its names as compared.
pub fn normalised(hosts: Hosts) -> Hosts {
    hosts
        .into_iter()
        .map(|(k, v)| (egress::normalise(&k), v))
        .collect()
}

enum Dial {
    Denied(Denial),
    Failed(String),
}

/// A request head read whole, and what came after it.
struct Head {
    bytes: Vec<u8>,
    /// The head's length, blank line included.
    len: usize,
    /// The bytes read.
    filled: usize,
}

async fn read_head(s: &mut TcpStream) -> Result<Head, Refusal> {
    let mut bytes = vec![0u8; MAX_HEAD];
    let mut filled = 0;
    loop {
        let n = s
            .read(&mut bytes[filled..])
            .await
            .map_err(|e| Refusal::bad(e.to_string()))?;
        if n == 0 {
            return Err(Refusal::bad("the connection closed before a request"));
        }
        let from = filled.saturating_sub(3);
        filled += n;
        if let Some(i) = bytes[from..filled]
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
        {
            return Ok(Head {
                bytes,
                len: from + i + 4,
                filled,
            });
        }
        if filled == MAX_HEAD {
            return Err(Refusal {
                status: 431,
                reason: format!("the request head is over {MAX_HEAD} bytes"),
            });
        }
    }
}

/// A proxy request, parsed.
#[derive(Debug, PartialEq)]
struct Request {
    connect: bool,
    host: String,
    port: u16,
    host_header: Option<String>,
    /// For a forwarded request: its head in origin form, `Connection: close`, no `Proxy-*`.
    origin_form_head: String,
}

fn split_authority(a: &str, default_port: Option<u16>) -> Result<(String, u16), Refusal> {
    let bad = || Refusal::bad(format!("{a:?} is not host:port"));
    let host = host_of(a);
    let port = match a.trim().strip_prefix('[') {
        Some(rest) => rest.split_once("]:").map(|(_, p)| p),
        None => a.rsplit_once(':').map(|(_, p)| p),
    };
    let port = match (port.filter(|_| host != a.trim()), default_port) {
        (Some(p), _) => p.parse().ok().filter(|p| *p > 0).ok_or_else(bad)?,
        (None, Some(d)) => d,
        (None, None) => return Err(bad()),
    };
    if host.is_empty() || host.bytes().any(|b| b.is_ascii_whitespace() || b == b'@') {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

fn parse_request(head: &[u8]) -> Result<Request, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(Refusal::bad("not an HTTP/1 request")),
    }
    let method = req.method.unwrap_or_default().to_string();
    let target = req.path.unwrap_or_default().to_string();
    let version = req.version.unwrap_or(1);
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).into_owned())
    };
    let host_header = header("host");
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(&target, None)?;
        return Ok(Request {
            connect: true,
            host,
            port,
            host_header,
            origin_form_head: String::new(),
        });
    }
    let Some(rest) = target.strip_prefix("http://") else {
        return Err(Refusal::bad(
            "this is an egress proxy: send CONNECT host:port, or a request with an absolute \
             http:// URL",
        ));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let (host, port) = split_authority(authority, Some(80))?;
    let mut out = format!("{method} {path} HTTP/1.{version}\r\n");
    for h in req.headers.iter() {
        let n = h.name.to_ascii_lowercase();
        if n.starts_with("proxy-") || n == "connection" || n == "keep-alive" {
            continue;
        }
        out.push_str(h.name);
        out.push_str(": ");
        out.push_str(&String::from_utf8_lossy(h.value));
        out.push_str("\r\n");
    }
    if host_header.is_none() {
        out.push_str(&format!("Host: {authority}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok(Request {
        connect: false,
        host,
        port,
        host_header,
        origin_form_head: out,
    })
}

/// The `Host` of plain HTTP sent into a tunnel must name the host tunnelled to; bytes that
/// are not an HTTP request pass.
fn plain_host_check(first: &[u8], host: &str) -> Result<(), Denial> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(_)) = req.parse(first) else {
        return Ok(());
    };
    let named = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("host"))
        .map(|h| String::from_utf8_lossy(h.value).into_owned());
    match named {
        Some(h) if egress::normalise(host_of(&h)) != egress::normalise(host) => {
            Err(Denial::HostMismatch)
        }
        _ => Ok(()),
    }
}

async fn refuse(client: &mut TcpStream, r: Refusal) {
    let text = match r.status {
        400 => "Bad Request",
        403 => "Forbidden",
        431 => "Request Header Fields Too Large",
        _ => "Bad Gateway",
    };
    let body = format!("{}\n", r.reason);
    let reason_header = r.reason.split(':').next().unwrap_or_default();
    let head = format!(
        "HTTP/1.1 {} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         {DENIED_HEADER}: {reason_header}\r\nConnection: close\r\n\r\n",
        r.status,
        body.len()
    );
    let _ = client.write_all(head.as_bytes()).await;
    let _ = client.write_all(body.as_bytes()).await;
    let _ = client.shutdown().await;
    // A lingering close: what the client still sends is read and dropped (bounded), so the
    // close is not a reset that could discard the answer before the client reads it.
    let drain = async {
        let mut buf = [0u8; 8192];
        let mut left = 1usize << 20;
        while left > 0 {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
}

/// Answers a CONNECT: false when the client is gone.
async fn established(client: &mut TcpStream) -> bool {
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_ok()
}

/// When a relay last moved a byte, for its idle timeout.
struct Clock {
    started: Instant,
    last_ms: AtomicU64,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            started: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
    fn touch(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_ms.store(now, Ordering::Relaxed);
    }
    /// Ends once nothing moved for [`IDLE_TIMEOUT`].
    async fn idle(&self) {
        loop {
            tokio::time::sleep(IDLE_TIMEOUT / 10).await;
            let now = self.started.elapsed().as_millis() as u64;
            if now.saturating_sub(self.last_ms.load(Ordering::Relaxed))
                >= IDLE_TIMEOUT.as_millis() as u64
            {
                return;
            }
        }
    }
}

/// The client's first bytes in a tunnel, read until they show what they are: `Err(Some)` when
/// they name another host, `Err(None)` when the client left first.
async fn first_bytes(
    cr: &mut (impl AsyncRead + Unpin),
    mut first: Vec<u8>,
    host: &str,
) -> Result<Vec<u8>, Option<Denial>> {
    let by_name = host.parse::<IpAddr>().is_err();
    let mut buf = [0u8; 4096];
    loop {
        match hello::parse(&first) {
            Hello::Partial if first.len() < hello::MAX_HELLO => {}
            Hello::Partial => return Ok(first),
            Hello::Tls(Some(sni)) if by_name && sni != egress::normalise(host) => {
                return Err(Some(Denial::SniMismatch));
            }
            Hello::Tls(_) => return Ok(first),
            Hello::Unreadable => return Err(Some(Denial::UnreadableHello)),
            Hello::NotTls => return plain_host_check(&first, host).map(|_| first).map_err(Some),
        }
        match tokio::time::timeout(IDLE_TIMEOUT, cr.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => first.extend_from_slice(&buf[..n]),
            _ => return Err(None),
        }
    }
}

/// Copies both ways until both ends close or nothing moves for [`IDLE_TIMEOUT`]; `up` is
/// written to the upstream first.
async fn relay(client: TcpStream, upstream: TcpStream, up: Vec<u8>) {
    let clock = Clock::new();
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let both = async {
        tokio::join!(pump(cr, uw, up, &clock), pump(ur, cw, Vec::new(), &clock));
    };
    tokio::select! {
        _ = both => {}
        _ = clock.idle() => {}
    }
}

async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    first: Vec<u8>,
    clock: &Clock,
) {
    if !first.is_empty() && to.write_all(&first).await.is_err() {
        return;
    }
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        clock.touch();
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_targets() {
        let r = parse_request(b"CONNECT GitHub.com:443 HTTP/1.1\r\nHost: github.com:443\r\n\r\n")
            .ok()
            .unwrap();
        assert!(r.connect);
        assert_eq!((r.host.as_str(), r.port), ("GitHub.com", 443));
        let r = parse_request(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n")
            .ok()
            .unwrap();
        assert_eq!((r.host.as_str(), r.port), ("::1", 8443));
        for bad in [
            &b"CONNECT github.com HTTP/1.1\r\n\r\n"[..],
            b"CONNECT github.com:0 HTTP/1.1\r\n\r\n",
            b"CONNECT :443 HTTP/1.1\r\n\r\n",
            b"CONNECT u@h:443 HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET https://x/ HTTP/1.1\r\n\r\n",
            b"\x16\x03\x01\x00\x05hello\r\n\r\n",
        ] {
            assert!(
                parse_request(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn absolute_form_becomes_origin_form() {
        let r = parse_request(
            b"GET http://u:p@example.org:8080/a/b?c=d HTTP/1.1\r\nHost: example.org:8080\r\n\
              Proxy-Connection: keep-alive\r\nProxy-Authorization: x\r\nAccept: */*\r\n\r\n",
        )
        .ok()
        .unwrap();
        assert!(!r.connect);
        assert_eq!((r.host.as_str(), r.port), ("example.org", 8080));
        assert_eq!(
            r.origin_form_head,
            "GET /a/b?c=d HTTP/1.1\r\nHost: example.org:8080\r\nAccept: */*\r\n\
             Connection: close\r\n\r\n"
        );
        let r = parse_request(b"GET http://example.org?q HTTP/1.0\r\n\r\n")
            .ok()
            .unwrap();
        assert_eq!(r.port, 80);
        assert_eq!(
            r.origin_form_head,
            "GET /?q HTTP/1.0\r\nHost: example.org\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn hosts_of_authorities() {
        assert_eq!(host_of("a.b:80"), "a.b");
        assert_eq!(host_of("a.b"), "a.b");
        assert_eq!(host_of("[::1]:80"), "::1");
        assert_eq!(host_of("::1"), "::1");
        assert_eq!(host_of(" A.b:x"), "A.b:x");
    }

    #[test]
    fn plain_http_in_a_tunnel_must_name_its_host() {
        let get = |h: &str| format!("GET / HTTP/1.1\r\nHost: {h}\r\n\r\n").into_bytes();
        assert_eq!(plain_host_check(&get("a.test"), "a.test"), Ok(()));
        assert_eq!(plain_host_check(&get("A.test:80"), "a.test"), Ok(()));
        assert_eq!(
            plain_host_check(&get("b.test"), "a.test"),
            Err(Denial::HostMismatch)
        );
        assert_eq!(plain_host_check(b"SSH-2.0-x\r\n", "a.test"), Ok(()));
    }
}
