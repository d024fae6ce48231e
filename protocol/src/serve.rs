//! The HTTP/1.1 server loop both listeners run (the agent's and the controller's), with the
//! bounds `axum::serve` does not set:
//!
//! - **head timeout**: a connection waiting for a request head — a new one, or an idle
//!   keep-alive one between requests — is closed once it has waited this long (hyper's
//!   `header_read_timeout`, which starts whenever the connection reads a head). A response
//!   still being written (a long-poll, SSE, a download) and an upgraded connection (WebSocket)
//!   are not reading a head, so they are not cut.
//! - **body idle timeout**: a request body that delivers nothing for this long fails, so a
//!   handler reading it gets an error (and answers 4xx) instead of waiting forever.
//! - **connection limit**: past this many open connections, accepting waits until one closes.
//!
//! Upgrades (WebSocket) work as under `axum::serve`. Dropping the future stops accepting;
//! connections already accepted run on until they end.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The bounds one listener enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a connection may take to send a request head, and may sit idle between
    /// requests.
    pub header_timeout: Duration,
    /// How long a request body may send nothing before it fails.
    pub body_idle_timeout: Duration,
    /// Connections open at once; past it, accepting waits.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(30),
            max_connections: 4096,
        }
    }
}

/// Serves `app` on `listener` until the future is dropped.
pub async fn serve(listener: TcpListener, app: Router, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let body_idle = limits.body_idle_timeout;
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            unreachable!("the connection semaphore is never closed")
        };
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                accept_failed(e).await;
                continue;
            }
        };
        // An answer written in pieces as it streams (a relayed body, SSE events) must not wait
        // for the peer's delayed ACK between them (Nagle's algorithm: ~40 ms each on Linux).
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let req = req.map(|b| Body::new(IdleBody::new(b, body_idle)));
            app.clone().oneshot(req)
        });
        let conn = http
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
}

/// After a failed accept: a connection that went away before it was accepted is nothing; any
/// other failure (out of file descriptors) is logged and accepting pauses for a second, so
/// the loop does not spin while nothing can be accepted.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// A request body that fails once it has delivered nothing for `idle` while being read.
///
/// Dropped unread (a handler that ignores the body), a small rest is drained in the
/// background: hyper would otherwise close the connection with those bytes unread, and the
/// kernel answers unread bytes at close with a reset that cuts off the response still in
/// flight (schemathesis saw `POST /wallpaper` with a JSON body lose the end of its 300 KiB
/// answer; 44 of 60 raw downloads with a 2-byte body were cut short before this drain).
struct IdleBody {
    /// `None` only once dropped.
    inner: Option<Incoming>,
    idle: Duration,
    /// Running since the reader first found nothing to read after the last frame.
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl IdleBody {
    fn new(inner: Incoming, idle: Duration) -> Self {
        IdleBody {
            inner: Some(inner),
            idle,
            timer: None,
            armed: false,
        }
    }
}

impl http_body::Body for IdleBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(frame) = Pin::new(inner).poll_frame(cx) {
            this.armed = false;
            return Poll::Ready(frame.map(|f| f.map_err(BoxError::from)));
        }
        if !this.armed {
            let deadline = Instant::now() + this.idle;
            match &mut this.timer {
                Some(t) => t.as_mut().reset(deadline),
                None => this.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            this.armed = true;
        }
        let Some(timer) = this.timer.as_mut() else {
            return Poll::Pending;
        };
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(Some(Err(Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the request body sent nothing for {:?}", this.idle),
        )))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map(|b| b.size_hint())
            .unwrap_or_else(|| SizeHint::with_exact(0))
    }
}

/// The most of an unread request body drained after its handler answered; past it (or with no
/// declared length) the connection closes as hyper closes it.
const DRAIN_LIMIT: u64 = 1 << 20;

impl Drop for IdleBody {
    fn drop(&mut self) {
        use http_body::Body as _;
        let Some(mut body) = self.inner.take() else {
            return;
        };
        if body.is_end_stream() || body.size_hint().upper().is_none_or(|n| n > DRAIN_LIMIT) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let idle = self.idle;
        rt.spawn(async move {
            loop {
                let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
                match tokio::time::timeout(idle, frame).await {
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
            }
        });
    }
}

/// An error answer axum made itself, not a handler: an empty body (a 405 with its `Allow`, …)
/// or axum's own `text/plain` rejection text (a path segment that is not UTF-8, …). Each
/// surface gives it its own error body, keeping the status, the headers and axum's message.
pub struct FrameworkError {
    pub parts: axum::http::response::Parts,
    /// axum's rejection text, when it gave one.
    pub text: Option<String>,
}

impl FrameworkError {
    /// `Err(resp)` unchanged for a success or an answer a handler made (one with a body type
    /// other than `text/plain`: no handler answers an error as text/plain).
    pub async fn take(
        resp: axum::response::Response,
    ) -> Result<FrameworkError, axum::response::Response> {
        use axum::http::header::CONTENT_TYPE;
        let status = resp.status();
        let content_type = resp.headers().get(CONTENT_TYPE);
        let plain = content_type
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/plain"));
        if !(status.is_client_error() || status.is_server_error())
            || (content_type.is_some() && !plain)
        {
            return Err(resp);
        }
        let (parts, body) = resp.into_parts();
        let text = match plain {
            true => axum::body::to_bytes(body, 64 << 10)
                .await
                .map(|b| String::from_utf8_lossy(&b).trim().to_string())
                .ok()
                .filter(|t| !t.is_empty()),
            false => None,
        };
        Ok(FrameworkError { parts, text })
    }

    /// The native error code of its status.
    pub fn code(&self) -> &'static str {
        use axum::http::StatusCode;
        match self.parts.status {
            StatusCode::BAD_REQUEST => "invalid_request",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::PAYLOAD_TOO_LARGE => "too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            _ => "error",
        }
    }

    /// axum's text, else the status's reason.
    pub fn message(&self) -> String {
        self.text.clone().unwrap_or_else(|| {
            self.parts
                .status
                .canonical_reason()
                .unwrap_or("error")
                .to_string()
        })
    }

    /// The answer with `json` as its body.
    pub fn answer(mut self, json: String) -> axum::response::Response {
        use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
        self.parts.headers.insert(
            CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        );
        self.parts.headers.remove(CONTENT_LENGTH);
        axum::response::Response::from_parts(self.parts, Body::from(json))
    }
}
