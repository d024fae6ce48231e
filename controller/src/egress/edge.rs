//! Credentials added at the edge: for a host that has a credential, the proxy ends the
//! sandbox's TLS with a certificate from the egress CA, opens its own TLS to the host (checked
//! against the system's roots and `[egress] upstream_ca`), and forwards each HTTP/1 request with
//! the credential's header set. The secret lives in the controller only; the sandbox sends
//! requests without it. Every other host's tunnel passes untouched.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{self, HeaderName, HeaderValue, Request, Response, StatusCode};
use berth_protocol::egress::{self, Denial};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::ca::Ca;

/// How long either TLS handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// How long a kept-alive connection waits for the sandbox's next request head.
const IDLE: Duration = Duration::from_secs(600);

/// A header the proxy sets on requests to matching hosts (and, when `paths` is not empty,
/// only on requests under one of them).
#[derive(Clone)]
pub struct Credential {
    /// `github.com` or `*.example.org`.
    pub host: String,
    pub header: HeaderName,
    pub value: HeaderValue,
    /// Path prefixes, compared without case; empty: every path.
    pub paths: Vec<String>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("host", &self.host)
            .field("header", &self.header)
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// `value` with `{secret}` replaced by the secret (marked sensitive: never logged).
    pub fn new(host: &str, header: &str, value: &str) -> anyhow::Result<Credential> {
        let header = HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| anyhow::anyhow!("{header:?} is not a header name"))?;
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| anyhow::anyhow!("the credential for {host} is not a header value"))?;
        value.set_sensitive(true);
        Ok(Credential {
            host: egress::normalise(host),
            header,
            value,
            paths: Vec::new(),
        })
    }

    fn applies(&self, host: &str, path: &str) -> bool {
        egress::name_matches(&self.host, host)
            && (self.paths.is_empty() || self.paths.iter().any(|p| path_under(path, p)))
    }
}

/// Whether `path` (a request target's path) lies under `prefix`: compared without case, and
/// never for a path with a `.`/`..` segment or an escaped `.` or `/`, which could name another
/// place than it seems to.
pub fn path_under(path: &str, prefix: &str) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2e") || lower.contains("%2f") || lower.contains("%5c") {
        return false;
    }
    if path.split('/').any(|s| s == "." || s == "..") {
        return false;
    }
    lower.starts_with(&prefix.to_ascii_lowercase())
}

/// The proxy's edge: the CA, the config's credentials and each sandbox's own.
pub struct Edge {
    ca: Arc<Ca>,
    credentials: Vec<Credential>,
    grants: RwLock<HashMap<String, Vec<Credential>>>,
    connector: tokio_native_tls::TlsConnector,
}

impl Edge {
    /// `upstream_ca`: PEM certificates trusted for upstream hosts besides the system's.
    pub fn new(
        ca: Arc<Ca>,
        credentials: Vec<Credential>,
        upstream_ca: &[Vec<u8>],
    ) -> anyhow::Result<Edge> {
        let mut b = native_tls::TlsConnector::builder();
        for pem in upstream_ca {
            b.add_root_certificate(native_tls::Certificate::from_pem(pem)?);
        }
        Ok(Edge {
            ca,
            credentials,
            grants: RwLock::new(HashMap::new()),
            connector: b.build()?.into(),
        })
    }

    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// Adds credentials for one sandbox (a repository cloned into it).
    pub fn grant(&self, sandbox: &str, c: Vec<Credential>) {
        let mut g = self.grants.write().unwrap_or_else(|e| e.into_inner());
        g.entry(sandbox.to_string()).or_default().extend(c);
    }

    /// The sandbox is gone: its credentials with it.
    pub fn forget(&self, sandbox: &str) {
        let mut g = self.grants.write().unwrap_or_else(|e| e.into_inner());
        g.remove(sandbox);
    }

    /// Whether a tunnel from `sandbox` to `host` is opened to add a credential.
    pub fn intercepts(&self, sandbox: &str, host: &str) -> bool {
        let g = self.grants.read().unwrap_or_else(|e| e.into_inner());
        self.credentials
            .iter()
            .chain(g.get(sandbox).into_iter().flatten())
            .any(|c| egress::name_matches(&c.host, host))
    }

    /// The credentials a request gets: each that applies, one per header (the sandbox's own
    /// first).
    fn credentials_for(&self, sandbox: &str, host: &str, path: &str) -> Vec<Credential> {
        let g = self.grants.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Credential> = Vec::new();
        for c in g
            .get(sandbox)
            .into_iter()
            .flatten()
            .chain(self.credentials.iter())
        {
            if c.applies(host, path) && !out.iter().any(|o| o.header == c.header) {
                out.push(c.clone());
            }
        }
        out
    }

    /// Serves one opened tunnel: TLS with the sandbox as `host`, TLS to `upstream`, and the
    /// requests between them with the credential added. `deny` reports a refused request.
    pub async fn serve<S>(
        self: Arc<Self>,
        client: S,
        upstream: TcpStream,
        sandbox: String,
        host: String,
        deny: impl Fn(Denial) + Send + Sync + 'static,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let acceptor = match self.ca.acceptor(&host) {
            Ok(a) => a,
            Err(e) => return tracing::warn!(%host, error = %e, "egress: no leaf certificate"),
        };
        let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE, acceptor.accept(client)).await else {
            return;
        };
        let sender = match self.upstream(upstream, &host).await {
            Ok(s) => Ok(tokio::sync::Mutex::new(s)),
            Err(e) => Err(e),
        };
        let shared = Arc::new((sender, self, sandbox, host, deny));
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let shared = shared.clone();
            async move {
                let (sender, edge, sandbox, host, deny) = &*shared;
                Ok::<_, std::convert::Infallible>(
                    edge.forward(sender, sandbox, host, deny, req).await,
                )
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(IDLE)
            .serve_connection(TokioIo::new(tls), service)
            .await;
    }

    async fn upstream(
        &self,
        upstream: TcpStream,
        host: &str,
    ) -> Result<hyper::client::conn::http1::SendRequest<Incoming>, String> {
        let tls = tokio::time::timeout(HANDSHAKE, self.connector.connect(host, upstream))
            .await
            .map_err(|_| format!("{host}: no TLS handshake within {HANDSHAKE:?}"))?
            .map_err(|e| format!("{host}: TLS: {e}"))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("{host}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    async fn forward(
        &self,
        sender: &Result<
            tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>,
            String,
        >,
        sandbox: &str,
        host: &str,
        deny: &(impl Fn(Denial) + Send + Sync),
        mut req: Request<Incoming>,
    ) -> Response<Body> {
        let named = req
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string)
            .or_else(|| req.uri().host().map(str::to_string));
        let other = named.is_some_and(|n: String| {
            egress::normalise(egress::host_of(n.as_str())) != egress::normalise(host)
        });
        if other {
            deny(Denial::HostMismatch);
            return answer(
                StatusCode::FORBIDDEN,
                format!("host_mismatch: this tunnel is to {host}"),
            );
        }
        let sender = match sender {
            Ok(s) => s,
            Err(e) => return answer(StatusCode::BAD_GATEWAY, e.clone()),
        };
        let path = req.uri().path().to_string();
        for c in self.credentials_for(sandbox, host, &path) {
            req.headers_mut().insert(c.header, c.value);
        }
        let mut sender = sender.lock().await;
        if sender.ready().await.is_err() {
            return answer(
                StatusCode::BAD_GATEWAY,
                format!("{host} closed the connection"),
            );
        }
        match sender.send_request(req).await {
            Ok(resp) => resp.map(Body::new),
            Err(e) => answer(StatusCode::BAD_GATEWAY, format!("{host}: {e}")),
        }
    }
}

fn answer(status: StatusCode, reason: String) -> Response<Body> {
    let mut r = Response::new(Body::from(format!("{reason}\n")));
    *r.status_mut() = status;
    let short = reason.split(':').next().unwrap_or_default().to_string();
    if let Ok(v) = HeaderValue::from_str(&short) {
        r.headers_mut()
            .insert(berth_protocol::routes::header::EGRESS_DENIED, v);
    }
    r
}

/// A stream whose first bytes were already read (a tunnel's ClientHello, read to check its
/// server name): they are read again first.
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: Vec<u8>, inner: S) -> Prefixed<S> {
        Prefixed {
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = (self.prefix.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
