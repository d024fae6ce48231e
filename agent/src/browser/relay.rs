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
    let mut upstream = tokio::time::timeout(
        Duration::from_secs(3),
        TcpStream::connect(("127.0.0.1", dt.port)),
    )
    .await
    .map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::TimedOut, "connecting to the browser")
    })??;
    let _ = upstream.set_nodelay(true);
    let Some(head_len) = head_len else {
        // Not HTTP as far as we can tell: relay the bytes as they are.
        upstream.write_all(&buf).await?;
        tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
        return Ok(());
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
        upstream.write_all(&buf).await?;
        tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
        return Ok(());
    }
    let host = host.unwrap_or_default();
    let path = req.path.unwrap_or("/").to_string();
    let is_json = path.starts_with("/json");
    let loopback = format!("127.0.0.1:{}", dt.port);
    let mut head = format!("{} {} HTTP/1.1\r\n", req.method.unwrap_or("GET"), path).into_bytes();
    for h in req.headers.iter() {
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
    head.extend_from_slice(&buf[head_len..]);
    upstream.write_all(&head).await?;
    if !is_json {
        tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
        return Ok(());
    }
    // One /json answer (Chromium keeps the connection open: read by its Content-Length), its
    // URLs pointed back at the name the client used.
    let mut resp = Vec::new();
    let read = async {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(split) = find(&resp, b"\r\n\r\n").map(|p| p + 4) {
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
                if len.is_some_and(|n| resp.len() >= split + n) {
                    return std::io::Result::Ok(());
                }
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
    let Some(split) = find(&resp, b"\r\n\r\n").map(|p| p + 4) else {
        return plain_answer(
            &mut conn,
            "502 Bad Gateway",
            "the browser's answer was cut short",
        )
        .await;
    };
    let body = String::from_utf8_lossy(&resp[split..])
        .replace(&loopback, &host)
        .replace(&format!("localhost:{}", dt.port), &host);
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
    conn.write_all(&out).await?;
    conn.shutdown().await
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
