//! The one streaming HTTP relay, used by the controller (a client → a sandbox's agent) and by
//! the agent (its preview route → `127.0.0.1:{port}` inside the sandbox).
//!
//! - Bodies stream both ways as they come, with back-pressure (hyper polls a body only when it
//!   can write it), of any size; `Range` and every other end-to-end header pass both ways.
//! - Hop-by-hop headers (RFC 9110 §7.6.1 and those the `Connection` header names), `Host`,
//!   `Expect` and whatever credentials the caller names are not passed on.
//! - No total timeout: SSE, long-polls and big downloads last as long as they last; only the
//!   connection to the upstream must be made within [`CONNECT_TIMEOUT`].
//! - Redirects are answered to the client, never followed; a `Location` under the upstream's
//!   root can be rewritten to the path the client sees.
//! - An upgrade (WebSocket) is passed on with its headers; once the upstream answers 101 the
//!   two connections are joined as raw bytes, so subprotocols, close codes and binary frames
//!   pass as they are.

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;

/// How long connecting to the upstream may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request could not be relayed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Nothing answered at the upstream (connection refused, unreachable, connect timeout).
    #[error("{0}")]
    Connect(String),
    /// The upstream was reached but the exchange failed (reset, a malformed answer, the
    /// request's own deadline).
    #[error("{0}")]
    Upstream(String),
    /// The request cannot be relayed as it is (a dot segment in its path, a bad method).
    #[error("{0}")]
    BadRequest(String),
}

/// Where one request goes, and what changes on the way.
#[derive(Debug, Clone)]
pub struct Upstream {
    base: String,
    path: String,
    add: HeaderMap,
    strip: Vec<HeaderName>,
    strip_cookies: Vec<String>,
    location: Option<(String, String)>,
    timeout: Option<Duration>,
}

impl Upstream {
    /// `base` is `http://host:port` (no path); `path_and_query` is the path as the client sent
    /// it (still percent-encoded), with its query if any.
    pub fn new(base: impl Into<String>, path_and_query: impl Into<String>) -> Upstream {
        Upstream {
            base: base.into().trim_end_matches('/').to_string(),
            path: path_and_query.into(),
            add: HeaderMap::new(),
            strip: Vec::new(),
            strip_cookies: Vec::new(),
            location: None,
            timeout: None,
        }
    }

    /// Sets a header on the relayed request (replacing the client's).
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Upstream {
        self.add.insert(name, value);
        self
    }

    /// Drops a header of the client's (its credentials).
    pub fn strip(mut self, name: HeaderName) -> Upstream {
        self.strip.push(name);
        self
    }

    /// Drops one cookie of the client's `Cookie` header, keeping the others.
    pub fn strip_cookie(mut self, name: impl Into<String>) -> Upstream {
        self.strip_cookies.push(name.into());
        self
    }

    /// A `Location` the upstream answers that is under its own root — `http://host:port/…`
    /// or an absolute path — and starts with `from` (after the base is removed) gets `to` in
    /// place of `from`.
    pub fn rewrite_location(mut self, from: impl Into<String>, to: impl Into<String>) -> Upstream {
        self.location = Some((from.into(), to.into()));
        self
    }

    /// A deadline for the upstream's whole answer (none by default: streams last).
    pub fn timeout(mut self, limit: Duration) -> Upstream {
        self.timeout = Some(limit);
        self
    }

    fn url(&self) -> String {
        format!("{}{}", self.base, self.path)
    }

    /// Refuses `.` and `..` segments, plain or percent-encoded, also where an encoded `/` or
    /// `\` makes one once decoded (`..%2F..%2Fetc`), and backslashes: URL parsing resolves
    /// them, so `/v1/../x` would reach `/x` on the upstream, and an upstream that decodes a
    /// segment before it splits the path would climb out of it.
    fn check_path(&self) -> Result<(), RelayError> {
        let path = self.path.split(['?', '#']).next().unwrap_or("");
        let bad = path.split('/').any(|seg| {
            seg.contains('\\')
                || percent_decode(seg)
                    .split(|b| *b == b'/' || *b == b'\\')
                    .any(|piece| piece == b"." || piece == b"..")
        });
        if bad || !path.starts_with('/') {
            return Err(RelayError::BadRequest(format!(
                "the path {path:?} has a dot segment or a backslash, which is not relayed"
            )));
        }
        Ok(())
    }

    fn location(&self, loc: &HeaderValue) -> Option<HeaderValue> {
        let (from, to) = self.location.as_ref()?;
        let loc = loc.to_str().ok()?;
        let path = match loc.strip_prefix(self.base.as_str()) {
            Some(rest) if rest.is_empty() || rest.starts_with(['/', '?']) => rest,
            _ if loc.starts_with('/') && !loc.starts_with("//") => loc,
            _ => return None,
        };
        let path = if path.is_empty() { "/" } else { path };
        let rest = path.strip_prefix(from.as_str())?;
        HeaderValue::from_str(&format!("{to}{rest}")).ok()
    }
}

/// A path segment's bytes with its `%XX` escapes decoded (a malformed escape stays as is).
fn percent_decode(seg: &str) -> Vec<u8> {
    let b = seg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// An HTTP client for relaying: connect timeout only, no redirects followed, no proxy.
pub struct Relay {
    http: reqwest::Client,
}

impl Default for Relay {
    fn default() -> Self {
        Relay::new()
    }
}

/// Hop-by-hop headers: they describe one connection, not the message.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

impl Relay {
    pub fn new() -> Relay {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            // Below the servers' idle close (10 s by default), so a request is never sent on
            // a connection the server is closing.
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .expect("reqwest client");
        Relay { http }
    }

    /// One relay for the whole process (its connection pool shared).
    pub fn shared() -> &'static Relay {
        static RELAY: OnceLock<Relay> = OnceLock::new();
        RELAY.get_or_init(Relay::new)
    }

    /// Relays `req` to `to`, answering the upstream's answer as it streams.
    pub async fn forward(
        &self,
        mut req: Request<Body>,
        to: &Upstream,
    ) -> Result<Response<Body>, RelayError> {
        to.check_path()?;
        let upgrade = upgrade_of(req.headers());
        let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
        let (parts, body) = req.into_parts();
        let headers = request_headers(&parts.headers, upgrade.as_ref(), to);
        let mut rb = self
            .http
            .request(parts.method.clone(), to.url())
            .headers(headers);
        if upgrade.is_none() && !http_body::Body::is_end_stream(&body) {
            rb = rb.body(reqwest::Body::wrap_stream(body.into_data_stream()));
        }
        if let Some(limit) = to.timeout {
            rb = rb.timeout(limit);
        }
        let resp = rb.send().await.map_err(|e| classify(&e))?;
        let status = resp.status();
        let mut out_headers = response_headers(resp.headers(), to);
        if status == StatusCode::SWITCHING_PROTOCOLS
            && let (Some(proto), Some(client)) = (upgrade, client_upgrade)
        {
            out_headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            if !out_headers.contains_key(header::UPGRADE) {
                out_headers.insert(header::UPGRADE, proto);
            }
            tokio::spawn(async move {
                let (client, upstream) = tokio::join!(client, resp.upgrade());
                match (client, upstream) {
                    (Ok(client), Ok(mut upstream)) => {
                        let mut client = TokioIo::new(client);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                    (c, u) => tracing::debug!(
                        client = c.is_ok(),
                        upstream = u.is_ok(),
                        "an upgraded relay ended before it began"
                    ),
                }
            });
            let mut out = Response::new(Body::empty());
            *out.status_mut() = status;
            *out.headers_mut() = out_headers;
            return Ok(out);
        }
        let resp: axum::http::Response<reqwest::Body> = resp.into();
        let mut out = Response::new(Body::new(resp.into_body()));
        *out.status_mut() = status;
        *out.headers_mut() = out_headers;
        Ok(out)
    }
}

/// The protocol a request asks to upgrade to, when it asks (`Connection: upgrade` and an
/// `Upgrade` header).
fn upgrade_of(headers: &HeaderMap) -> Option<HeaderValue> {
    let wants = connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade"));
    match wants {
        true => headers.get(header::UPGRADE).cloned(),
        false => None,
    }
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Removes the hop-by-hop headers, including those `Connection` names.
fn drop_hop_by_hop(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<HeaderName> = connection_tokens(headers)
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    let mut out = headers.clone();
    for h in HOP_BY_HOP.iter().chain(named.iter()) {
        out.remove(h);
    }
    out.remove(header::UPGRADE);
    out
}

fn request_headers(headers: &HeaderMap, upgrade: Option<&HeaderValue>, to: &Upstream) -> HeaderMap {
    let mut out = drop_hop_by_hop(headers);
    out.remove(header::HOST);
    out.remove(header::EXPECT);
    for h in &to.strip {
        out.remove(h);
    }
    if !to.strip_cookies.is_empty() {
        let kept: Vec<&str> = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .map(str::trim)
            .filter(|kv| {
                let name = kv.split_once('=').map_or(*kv, |(k, _)| k).trim();
                !kv.is_empty() && !to.strip_cookies.iter().any(|c| c == name)
            })
            .collect();
        out.remove(header::COOKIE);
        if !kept.is_empty()
            && let Ok(v) = HeaderValue::from_str(&kept.join("; "))
        {
            out.insert(header::COOKIE, v);
        }
    }
    if let Some(proto) = upgrade {
        out.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        out.insert(header::UPGRADE, proto.clone());
        out.remove(header::CONTENT_LENGTH);
    }
    for (name, value) in &to.add {
        out.insert(name.clone(), value.clone());
    }
    out
}

fn response_headers(headers: &HeaderMap, to: &Upstream) -> HeaderMap {
    let mut out = drop_hop_by_hop(headers);
    let rewritten = out.get(header::LOCATION).and_then(|l| to.location(l));
    if let Some(loc) = rewritten {
        out.insert(header::LOCATION, loc);
    }
    out
}

/// The error and its causes, one line (`connection refused` sits in a source).
fn classify(e: &reqwest::Error) -> RelayError {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        src = s.source();
    }
    match e.is_connect() {
        true => RelayError::Connect(msg),
        false => RelayError::Upstream(msg),
    }
}

/// Passes messages between a WebSocket a client opened here and one opened upstream, frame by
/// frame (text, binary; pings are answered by each side's own stack), until either side
/// closes. For relays that must see the frames (limits on the CDP socket, a client-side
/// forward); [`Relay::forward`] joins upgrades as raw bytes instead.
pub async fn pump_frames(
    client: axum::extract::ws::WebSocket,
    upstream: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
) {
    use axum::extract::ws::Message;
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite;
    let (mut c_tx, mut c_rx) = client.split();
    let (mut u_tx, mut u_rx) = upstream.split();
    let up = async {
        while let Some(Ok(m)) = c_rx.next().await {
            let m = match m {
                Message::Text(t) => tungstenite::Message::text(t.as_str()),
                Message::Binary(b) => tungstenite::Message::binary(b),
                Message::Close(_) => break,
                _ => continue,
            };
            if u_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = u_tx.close().await;
    };
    let down = async {
        while let Some(Ok(m)) = u_rx.next().await {
            let m = match m {
                tungstenite::Message::Text(t) => Message::text(t.as_str()),
                tungstenite::Message::Binary(b) => Message::binary(b),
                tungstenite::Message::Close(_) => break,
                _ => continue,
            };
            if c_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = c_tx.send(Message::Close(None)).await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_and_backslashes_are_refused() {
        for bad in [
            "/v1/../x",
            "/v1/%2e%2E/x",
            "/v1/./x",
            "/v1/.%2e",
            "/v1/a\\b",
            "v1",
            "/v1/..?q",
            "/v1/vnc/..%2F..%2Fetc%2Fpasswd",
            "/v1/a%5C..",
            "/v1/%2E",
        ] {
            assert!(
                Upstream::new("http://h", bad).check_path().is_err(),
                "{bad}"
            );
        }
        for good in [
            "/v1/files?path=/a/../b",
            "/v1/a..b/.c",
            "/",
            "/v1/%2F",
            "/v1/a%2Fb",
            "/v1/%",
            "/v1/%2",
        ] {
            assert!(
                Upstream::new("http://h", good).check_path().is_ok(),
                "{good}"
            );
        }
    }

    #[test]
    fn hop_by_hop_credentials_and_named_cookies_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("x"));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-hop"),
        );
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        h.insert(header::RANGE, HeaderValue::from_static("bytes=0-1"));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; berth_viewer=s; b=2"),
        );
        let to = Upstream::new("http://h", "/")
            .strip(HeaderName::from_static("x-api-key"))
            .strip_cookie("berth_viewer")
            .header(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        let out = request_headers(&h, None, &to);
        assert!(out.get(header::HOST).is_none());
        assert!(out.get(header::CONNECTION).is_none());
        assert!(out.get("x-hop").is_none());
        assert!(out.get("x-api-key").is_none());
        assert_eq!(out[header::RANGE], "bytes=0-1");
        assert_eq!(out[header::COOKIE], "a=1; b=2");
        assert_eq!(out[header::AUTHORIZATION], "Bearer t");
    }

    #[test]
    fn locations_under_the_upstream_root_are_rewritten() {
        let to =
            Upstream::new("http://127.0.0.1:8000", "/").rewrite_location("/", "/v1/ports/8000/");
        let loc = |s: &'static str| to.location(&HeaderValue::from_static(s));
        assert_eq!(loc("/sub/").unwrap(), "/v1/ports/8000/sub/");
        assert_eq!(
            loc("http://127.0.0.1:8000/a?b").unwrap(),
            "/v1/ports/8000/a?b"
        );
        assert_eq!(loc("http://127.0.0.1:8000").unwrap(), "/v1/ports/8000/");
        assert!(loc("//elsewhere/x").is_none());
        assert!(loc("http://127.0.0.1:80001/x").is_none());
        assert!(loc("relative/x").is_none());
    }
}
