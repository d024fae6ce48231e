//! The desktop's Chromium seen from outside: its DevTools endpoint on loopback, a TCP relay to
//! it on `--cdp-listen` (what OSWorld's evaluators and Playwright's `connect_over_cdp` use),
//! and a WebSocket relay at `/v1/browser/cdp` on the native surface.
//!
//! Chromium builds the WebSocket URLs in `/json/*` from the request's `Host`, so a byte relay
//! hands a client URLs that reach it again through the relay. Chromium refuses a `Host` that
//! is a DNS name (DNS-rebinding protection); for such a client the relay rewrites `Host` to
//! loopback and the URLs in `/json` answers back to the name the client used.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::desktop::Desktop;

/// Connections the TCP relay serves at once.
const MAX_RELAYED: usize = 256;
const HEAD_LIMIT: usize = 16 * 1024;
const JSON_LIMIT: usize = 8 << 20;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the TCP relay until the agent exits.
pub fn serve_relay(listener: TcpListener, desktop: Arc<Desktop>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_RELAYED));
    tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                // Full: refuse rather than queue without bound.
                drop(conn);
                continue;
            };
            let desktop = desktop.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let _ = conn.set_nodelay(true);
                if let Err(e) = relay_one(conn, &desktop).await {
                    tracing::debug!(error = %e, "CDP relay connection ended");
                }
            });
        }
    });
}

async fn plain_answer(conn: &mut TcpStream, status: &str, message: &str) -> std::io::Result<()> {
    let body = serde_json::json!({"error": {"code": "browser", "message": message}}).to_string();
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(resp.as_bytes()).await?;
    conn.shutdown().await
}

/// Reads until the end of an HTTP head (or EOF); returns the bytes read and the head's length.
async fn read_head(conn: &mut TcpStream) -> std::io::Result<(Vec<u8>, Option<usize>)> {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(p) = find(&buf, b"\r\n\r\n") {
            return Ok((buf, Some(p + 4)));
        }
        if buf.len() > HEAD_LIMIT {
            return Ok((buf, None));
        }
        let n = tokio::time::timeout(IO_TIMEOUT, conn.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head"))??;
        if n == 0 {
            return Ok((buf, None));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A `Host` Chromium accepts: an IP literal or `localhost`, with or without a port.
fn host_accepted(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':')
            .filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()))
            .map(|(h, _)| h)
            .unwrap_or(host)
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

async fn relay_one(mut conn: TcpStream, desktop: &Desktop) -> std::io::Result<()> {
    let (buf, head_len) = read_head(&mut conn).await?;
    let Some(dt) = desktop.browser(crate::desktop::BROWSER_WAIT).await else {
        return plain_answer(
            &mut conn,
            "503 Service Unavailable",
            "the browser is not running (see GET /v1/ready)",
        )
        .await;
    };
    let mut upstream = connect_browser(dt.port).await?;
    let Some(head_len) = head_len else {
        // Not HTTP as far as we can tell: relay the bytes as they are.
        return relay_as_is(&mut conn, &mut upstream, &buf).await;
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let parsed = req.parse(&buf[..head_len]).ok();
    let host = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("host"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .map(str::to_string);
    let rewrite = parsed.is_some() && host.as_deref().is_some_and(|h| !host_accepted(h));
    if !rewrite {
        return relay_as_is(&mut conn, &mut upstream, &buf).await;
    }
    let host = host.unwrap_or_default();
    let path = req.path.unwrap_or("/").to_string();
    let is_json = path.starts_with("/json");
    let loopback = format!("127.0.0.1:{}", dt.port);
    let head = loopback_head(
        req.method.unwrap_or("GET"),
        &path,
        req.headers,
        is_json,
        &loopback,
        &buf[head_len..],
    );
    upstream.write_all(&head).await?;
    if !is_json {
        tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
        return Ok(());
    }
    // One /json answer (Chromium keeps the connection open: read by its Content-Length), its
    // URLs pointed back at the name the client used.
    let resp = read_json_answer(&mut upstream).await?;
    let Some(split) = find(&resp, b"\r\n\r\n").map(|p| p + 4) else {
        return plain_answer(
            &mut conn,
            "502 Bad Gateway",
            "the browser's answer was cut short",
        )
        .await;
    };
    let out = json_answer_for_client(&resp, split, &loopback, &host, dt.port);
    conn.write_all(&out).await?;
    conn.shutdown().await
}

/// Sends the bytes `read` from the client on, then relays both ways as they come.
async fn relay_as_is(
    conn: &mut TcpStream,
    upstream: &mut TcpStream,
    read: &[u8],
) -> std::io::Result<()> {
    upstream.write_all(read).await?;
    tokio::io::copy_bidirectional(conn, upstream).await?;
    Ok(())
}

/// Connects to the browser's DevTools port on loopback (at most 3 s).
async fn connect_browser(port: u16) -> std::io::Result<TcpStream> {
    let upstream = tokio::time::timeout(
        Duration::from_secs(3),
        TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    .map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::TimedOut, "connecting to the browser")
    })??;
    let _ = upstream.set_nodelay(true);
    Ok(upstream)
}

/// The request head sent on to the browser: `Host` set to `loopback`, and for a `/json`
/// request `Connection: close`; then the bytes read past the client's head.
fn loopback_head(
    method: &str,
    path: &str,
    headers: &[httparse::Header<'_>],
    is_json: bool,
    loopback: &str,
    rest: &[u8],
) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    for h in headers.iter() {
        let skip = h.name.eq_ignore_ascii_case("host")
            || (is_json && h.name.eq_ignore_ascii_case("connection"));
        if !skip {
            head.extend_from_slice(h.name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(h.value);
            head.extend_from_slice(b"\r\n");
        }
    }
    head.extend_from_slice(format!("Host: {loopback}\r\n").as_bytes());
    if is_json {
        head.extend_from_slice(b"Connection: close\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head.extend_from_slice(rest);
    head
}

/// Reads the browser's `/json` answer: to its Content-Length, EOF or [`JSON_LIMIT`], within
/// [`IO_TIMEOUT`].
async fn read_json_answer(upstream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut resp = Vec::new();
    let read = async {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if json_answer_complete(&resp) {
                return std::io::Result::Ok(());
            }
            let n = upstream.read(&mut chunk).await?;
            if n == 0 || resp.len() > JSON_LIMIT {
                return Ok(());
            }
            resp.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(IO_TIMEOUT, read)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "browser answer"))??;
    Ok(resp)
}

/// Whether `resp` holds a whole head and as many body bytes as its Content-Length says.
fn json_answer_complete(resp: &[u8]) -> bool {
    let Some(split) = find(resp, b"\r\n\r\n").map(|p| p + 4) else {
        return false;
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut headers);
    let _ = r.parse(&resp[..split]);
    let len = r
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        });
    len.is_some_and(|n| resp.len() >= split + n)
}

/// The browser's `/json` answer (its head `split` bytes long) as the client gets it: the
/// loopback URLs in the body pointed at `host`, its length restated, the connection closed.
fn json_answer_for_client(
    resp: &[u8],
    split: usize,
    loopback: &str,
    host: &str,
    port: u16,
) -> Vec<u8> {
    let body = String::from_utf8_lossy(&resp[split..])
        .replace(loopback, host)
        .replace(&format!("localhost:{port}"), host);
    let mut out = Vec::new();
    for line in String::from_utf8_lossy(&resp[..split - 4]).split("\r\n") {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("content-length:") || lower.starts_with("connection:") {
            continue;
        }
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(
        format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(body.as_bytes());
    out
}

/// Binds the relay's listener (before the desktop starts, as API.md asks).
pub async fn bind_relay(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    use anyhow::Context;
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the CDP relay on {addr}"))
}

#[cfg(test)]
mod tests {
    use super::host_accepted;

    #[test]
    fn chromium_accepts_ip_literals_and_localhost_only() {
        for ok in [
            "127.0.0.1:9222",
            "10.1.2.3",
            "[::1]:9222",
            "localhost:9222",
            "LOCALHOST",
        ] {
            assert!(host_accepted(ok), "{ok}");
        }
        for no in ["sandbox-1:9222", "example.com", "box.local:80"] {
            assert!(!host_accepted(no), "{no}");
        }
    }
}
