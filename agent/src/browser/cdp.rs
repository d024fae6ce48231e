//! A DevTools client for the desktop's Chromium on loopback: its `/json` endpoints, one CDP
//! WebSocket connection for a few calls, and opening a page. It knows nothing of the desktop, so
//! the desktop's start-up and readiness checks use it as the relays and the tools do.

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpStream;

pub fn http() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(3))
            .build()
            .expect("an HTTP client")
    })
}

/// `GET /json/version` of the browser on loopback.
pub async fn version(port: u16) -> Result<Value, String> {
    get_json(&format!("http://127.0.0.1:{port}/json/version")).await
}

pub async fn targets(port: u16) -> Result<Value, String> {
    get_json(&format!("http://127.0.0.1:{port}/json/list")).await
}

/// A CDP connection for the agent's own checks: one call at a time, events skipped.
pub struct Cdp {
    ws: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Cdp {
    pub async fn connect(
        req: impl tokio_tungstenite::tungstenite::client::IntoClientRequest + Unpin,
    ) -> Result<Cdp, String> {
        let (ws, _) = tokio_tungstenite::connect_async(req)
            .await
            .map_err(|e| format!("CDP connection refused: {e}"))?;
        Ok(Cdp { ws, next_id: 0 })
    }

    /// `method` on the browser target, or on an attached page's `session`; its `result`.
    pub async fn call(
        &mut self,
        method: &str,
        params: Value,
        session: Option<&str>,
    ) -> Result<Value, String> {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = serde_json::json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = s.into();
        }
        self.ws
            .send(Message::text(msg.to_string()))
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        while let Some(m) = self.ws.next().await {
            let Message::Text(t) = m.map_err(|e| format!("{method}: {e}"))? else {
                continue;
            };
            let v: Value = serde_json::from_str(t.as_str()).map_err(|e| e.to_string())?;
            if v["id"] != id {
                continue;
            }
            if let Some(e) = v.get("error") {
                return Err(format!("{method}: {e}"));
            }
            return Ok(v["result"].clone());
        }
        Err(format!("{method}: the browser closed the connection"))
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// Proves the browser works, not just listens: a `Browser.getVersion` round trip, then a page
/// opened in the background (`about:blank`), its document loaded (its renderer runs script)
/// and the page closed again.
pub async fn open_page(port: u16, browser_path: &str) -> Result<(), String> {
    let mut cdp = Cdp::connect(format!("ws://127.0.0.1:{port}{browser_path}")).await?;
    let version = cdp
        .call("Browser.getVersion", serde_json::json!({}), None)
        .await?;
    if !version["product"].is_string() {
        return Err(format!("Browser.getVersion answered {version}"));
    }
    let created = cdp
        .call(
            "Target.createTarget",
            serde_json::json!({"url": "about:blank", "background": true}),
            None,
        )
        .await?;
    let target = created["targetId"]
        .as_str()
        .ok_or_else(|| format!("Target.createTarget answered {created}"))?
        .to_string();
    let loaded = page_loaded(&mut cdp, &target).await;
    let closed = cdp
        .call(
            "Target.closeTarget",
            serde_json::json!({"targetId": target}),
            None,
        )
        .await;
    cdp.close().await;
    loaded?;
    closed.map(|_| ())
}

async fn page_loaded(cdp: &mut Cdp, target: &str) -> Result<(), String> {
    let attached = cdp
        .call(
            "Target.attachToTarget",
            serde_json::json!({"targetId": target, "flatten": true}),
            None,
        )
        .await?;
    let session = attached["sessionId"]
        .as_str()
        .ok_or_else(|| format!("Target.attachToTarget answered {attached}"))?
        .to_string();
    // A fresh about:blank is complete almost at once; the caller's deadline bounds the wait.
    loop {
        let v = cdp
            .call(
                "Runtime.evaluate",
                serde_json::json!({"expression": "document.readyState", "returnByValue": true}),
                Some(&session),
            )
            .await?;
        if v["result"]["value"] == "complete" {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn get_json(url: &str) -> Result<Value, String> {
    let r = http()
        .get(url)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !r.status().is_success() {
        return Err(format!("{url}: HTTP {}", r.status()));
    }
    r.json().await.map_err(|e| format!("{url}: {e}"))
}
