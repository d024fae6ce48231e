//! One sandbox reached through the controller with its API key: the agent's native API
//! (`/sandbox/sandboxes/v1/{id}/v1/…`) as a typed [`AgentClient`], and raw requests and
//! WebSockets on controller paths (the preview route).

use std::time::Duration;

use anyhow::{Context, anyhow};
use berth_protocol::client::WebSocket;
use berth_protocol::routes::{controller as route, fill, header};
use berth_protocol::{AgentClient, Auth, ClientError};
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::Remote;

pub struct Through {
    /// The controller's URL.
    base: String,
    key: Option<String>,
    http: reqwest::Client,
    agent: AgentClient,
}

impl Through {
    pub fn new(remote: &Remote, id: &str) -> Through {
        // No overall deadline (a copy or a stream lasts as long as it needs), no redirects
        // followed (a forwarded server's redirects are its client's to follow).
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .expect("reqwest client");
        let base = remote.url().trim_end_matches('/').to_string();
        let key = remote.key();
        let auth = key.clone().map(Auth::ApiKey).unwrap_or_default();
        Through {
            agent: AgentClient::with_auth(
                format!("{base}{}", fill(route::SANDBOX, &[id])),
                auth,
                http.clone(),
            ),
            base,
            key,
            http,
        }
    }

    /// The sandbox's agent through the controller.
    pub fn agent(&self) -> &AgentClient {
        &self.agent
    }

    /// The full URL of a controller path.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request to a controller path with the API key.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, self.url(path));
        match &self.key {
            Some(k) => rb.header(header::API_KEY, k),
            None => rb,
        }
    }

    /// Opens a WebSocket on a controller path with `headers` added. A refused handshake
    /// reports the controller's answer (status and error message).
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
                .insert(header::API_KEY, k.parse().context("API key header")?);
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
            Ok(Err(e)) => Err(handshake_error(e)),
        }
    }
}

/// A refused WebSocket handshake as the answer's status and error message.
pub fn handshake_error(e: tungstenite::Error) -> anyhow::Error {
    match e {
        tungstenite::Error::Http(resp) => {
            let body = resp
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            let message = serde_json::from_str::<berth_protocol::ErrorBody>(&body)
                .map(|b| format!("{} ({})", b.error.message, b.error.code))
                .unwrap_or(body);
            anyhow!("{}: {message}", resp.status().as_u16())
        }
        e => anyhow!("WebSocket: {e}"),
    }
}

/// A client error, with a refused WebSocket handshake shown as its answer.
pub fn client_error(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::WebSocket(e) => handshake_error(*e),
        e => e.into(),
    }
}
