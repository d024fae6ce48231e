//! The agent's native API of one sandbox, reached through the controller
//! (`/sandbox/sandboxes/v1/{id}/v1/…`) with the controller's API key: HTTP and WebSocket.

use std::time::Duration;

use anyhow::{Context, anyhow};
use berth_protocol::client::{WebSocket, check};
use berth_protocol::controller::{API_KEY_HEADER, SANDBOXES};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::Remote;

pub struct Through {
    /// `{controller}/sandbox/sandboxes/v1/{id}`.
    prefix: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl Through {
    pub fn new(remote: &Remote, id: &str) -> Through {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .expect("reqwest client");
        Through {
            prefix: format!("{}{SANDBOXES}/{id}", remote.url().trim_end_matches('/')),
            key: remote.key(),
            http,
        }
    }

    /// The full URL of `path` under the sandbox (`/v1/pty`, `/ports/8000/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }

    /// A request to `path` under the sandbox with the API key.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, self.url(path));
        match &self.key {
            Some(k) => rb.header(API_KEY_HEADER, k),
            None => rb,
        }
    }

    /// Sends and checks the status; an error answer becomes its message.
    pub async fn send(&self, rb: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let resp = rb
            .send()
            .await
            .with_context(|| format!("reaching the controller at {}", self.prefix))?;
        Ok(check(resp).await?)
    }

    pub async fn json<T: DeserializeOwned>(
        &self,
        rb: reqwest::RequestBuilder,
    ) -> anyhow::Result<T> {
        let bytes = self.send(rb).await?.bytes().await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            anyhow!(
                "unexpected answer ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        })
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.json(self.request(reqwest::Method::GET, path)).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.json(self.request(reqwest::Method::POST, path).json(body))
            .await
    }

    /// Opens a WebSocket on `path` under the sandbox; `protocols` is passed as
    /// `Sec-WebSocket-Protocol` when given. A refused handshake reports the controller's answer.
    pub async fn websocket(
        &self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<(WebSocket, tungstenite::handshake::client::Response)> {
        let url = self.url(path).replacen("http", "ws", 1);
        let mut req = url
            .as_str()
            .into_client_request()
            .with_context(|| format!("WebSocket URL {url}"))?;
        if let Some(k) = &self.key {
            req.headers_mut()
                .insert(API_KEY_HEADER, k.parse().context("API key header")?);
        }
        for (name, value) in headers {
            let name: tungstenite::http::HeaderName = name.parse().context("header name")?;
            req.headers_mut()
                .insert(name, value.parse().context("header value")?);
        }
        let connect = tokio_tungstenite::connect_async(req);
        match tokio::time::timeout(Duration::from_secs(30), connect).await {
            Err(_) => Err(anyhow!("the WebSocket {url} was not accepted within 30 s")),
            Ok(Ok(pair)) => Ok(pair),
            Ok(Err(tungstenite::Error::Http(resp))) => {
                let body = resp
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                let message = serde_json::from_str::<berth_protocol::ErrorBody>(&body)
                    .map(|b| format!("{} ({})", b.error.message, b.error.code))
                    .unwrap_or(body);
                Err(anyhow!("{}: {message}", resp.status().as_u16()))
            }
            Ok(Err(e)) => Err(anyhow!("WebSocket {url}: {e}")),
        }
    }
}
