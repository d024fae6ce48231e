//! A typed async client for the agent's native API, used by the tests and the controller.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::desktop::*;
use crate::error::ErrorBody;
use crate::events::EventsPage;
use crate::exec::*;
use crate::fs::*;
use crate::pty::*;
use crate::record::*;
use crate::routes::{fill, header, native};

pub type WebSocket = WebSocketStream<MaybeTlsStream<TcpStream>>;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The agent answered with an error status and the native error body.
    #[error("{status}: {} ({})", .body.error.message, .body.error.code)]
    Api { status: u16, body: ErrorBody },
    /// The agent answered with an error status and a body that is not the error body.
    #[error("{status}: {body}")]
    Status { status: u16, body: String },
    #[error("transport: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("websocket: {0}")]
    WebSocket(#[from] Box<tokio_tungstenite::tungstenite::Error>),
    #[error("decode: {0}")]
    Decode(String),
    #[error("timed out: {0}")]
    Timeout(String),
}

impl ClientError {
    /// HTTP status of an error answer, if the agent answered at all.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } | ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The request never reached the agent: no connection to it could be made. (Any other
    /// transport error may come after the agent had the request.)
    pub fn never_sent(&self) -> bool {
        matches!(self, ClientError::Transport(e) if e.is_connect())
    }

    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { body, .. } => Some(&body.error.code),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

/// How an [`AgentClient`] authenticates: to an agent directly with its bearer token, or
/// through the controller (`{controller}/sandbox/sandboxes/v1/{id}` as the base) with the
/// controller's API key, which the controller swaps for the agent's token.
#[derive(Clone, Default)]
pub enum Auth {
    #[default]
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// `X-Api-Key: <key>`.
    ApiKey(String),
}

impl Auth {
    /// The header this mode adds, as (name, value).
    pub fn header(&self) -> Option<(&'static str, String)> {
        match self {
            Auth::None => None,
            Auth::Bearer(t) => Some((header::AUTHORIZATION, format!("Bearer {t}"))),
            Auth::ApiKey(k) => Some((header::API_KEY, k.clone())),
        }
    }
}

impl std::fmt::Debug for Auth {
    /// Never prints the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::None => "None",
            Auth::Bearer(_) => "Bearer(..)",
            Auth::ApiKey(_) => "ApiKey(..)",
        })
    }
}

#[derive(Clone)]
pub struct AgentClient {
    base: String,
    auth: Auth,
    http: reqwest::Client,
}

/// The HTTP client the typed clients build by default.
pub(crate) fn default_http(total_timeout: Option<Duration>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .no_proxy()
        // Below the servers' idle close (10 s by default), so a request is never sent on a
        // connection the server is closing.
        .pool_idle_timeout(Duration::from_secs(5));
    if let Some(t) = total_timeout {
        b = b.timeout(t);
    }
    b.build().expect("reqwest client")
}

impl AgentClient {
    /// `base` is `http://host:port`; `token` is the native API's bearer token.
    pub fn new(base: impl Into<String>, token: Option<String>) -> Self {
        Self::with_http(base, token, default_http(None))
    }

    /// Shares an existing HTTP client (its connection pool and TLS setup): building a client
    /// loads the system's root certificates, tens of milliseconds that a caller making many
    /// agent clients should pay once.
    pub fn with_http(
        base: impl Into<String>,
        token: Option<String>,
        http: reqwest::Client,
    ) -> Self {
        Self::with_auth(base, token.map(Auth::Bearer).unwrap_or_default(), http)
    }

    /// Any auth mode: `Auth::ApiKey` with the base `{controller}/sandbox/sandboxes/v1/{id}`
    /// reaches that sandbox's agent through the controller (see `ControllerClient::agent`).
    pub fn with_auth(base: impl Into<String>, auth: Auth, http: reqwest::Client) -> Self {
        AgentClient {
            base: base.into().trim_end_matches('/').to_string(),
            auth,
            http,
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    /// Whether this client reaches the agent through the controller.
    fn proxied(&self) -> bool {
        matches!(self.auth, Auth::ApiKey(_))
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// A request builder for `path` with the credentials attached.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, self.url(path));
        match self.auth.header() {
            Some((name, value)) => rb.header(name, value),
            None => rb,
        }
    }

    async fn call<T: DeserializeOwned>(rb: reqwest::RequestBuilder) -> Result<T> {
        let resp = check(rb.send().await?).await?;
        let bytes = resp.bytes().await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Decode(format!("{e}: {}", String::from_utf8_lossy(&bytes))))
    }

    async fn call_json<B: Serialize, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &B,
    ) -> Result<T> {
        Self::call(self.request(method, path).json(body)).await
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        Self::call(self.request(reqwest::Method::GET, path)).await
    }

    /// `GET /healthz`. Through the controller (which relays only `/v1`), the agent answering
    /// `GET /v1/ready` at all (200 or 503 with its report) is the liveness answer.
    pub async fn healthz(&self) -> Result<()> {
        if self.proxied() {
            return self.ready(Duration::ZERO).await.map(|_| ());
        }
        check(self.http.get(self.url(native::HEALTHZ)).send().await?).await?;
        Ok(())
    }

    /// Polls `/healthz` until it answers or `timeout` passes.
    pub async fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.healthz().await {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(ClientError::Timeout(format!("agent not healthy: {e}")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    pub async fn exec(&self, req: &ExecRequest) -> Result<ExecResult> {
        self.call_json(reqwest::Method::POST, native::EXEC, req)
            .await
    }

    pub async fn exec_background(&self, req: &ExecRequest) -> Result<BackgroundStarted> {
        let mut req = req.clone();
        req.background = Some(true);
        self.call_json(reqwest::Method::POST, native::EXEC, &req)
            .await
    }

    pub async fn commands(&self) -> Result<CommandList> {
        self.get(native::COMMANDS).await
    }

    pub async fn command(&self, id: &str) -> Result<CommandInfo> {
        self.get(&fill(native::COMMAND, &[id])).await
    }

    pub async fn output(&self, id: &str, from_seq: u64) -> Result<OutputPage> {
        self.get(&format!(
            "{}?from_seq={from_seq}",
            fill(native::COMMAND_OUTPUT, &[id])
        ))
        .await
    }

    /// Long-poll: waits until output past `from_seq` exists or the command ends.
    pub async fn output_wait(&self, id: &str, from_seq: u64) -> Result<OutputPage> {
        self.get(&format!(
            "{}?from_seq={from_seq}&follow=true",
            fill(native::COMMAND_OUTPUT, &[id])
        ))
        .await
    }

    /// Reads the whole output from `from_seq` until the command has ended. The last page is
    /// returned with the first truncation notice seen on the way.
    pub async fn output_all(&self, id: &str, from_seq: u64) -> Result<(Vec<u8>, OutputPage)> {
        let mut seq = from_seq;
        let mut bytes = Vec::new();
        let mut truncated = None;
        loop {
            let mut page = self.output_wait(id, seq).await?;
            truncated = truncated.or(page.truncated_before_seq);
            for c in &page.chunks {
                bytes.extend_from_slice(&c.bytes());
            }
            seq = page.next_seq;
            if page.done {
                page.truncated_before_seq = truncated;
                return Ok((bytes, page));
            }
        }
    }

    /// Follows the output over a WebSocket from `from_seq`.
    pub async fn follow_output(
        &self,
        id: &str,
        from_seq: u64,
        query: &str,
    ) -> Result<FollowStream> {
        let path = format!(
            "{}?from_seq={from_seq}&follow=true{query}",
            fill(native::COMMAND_OUTPUT, &[id])
        );
        Ok(FollowStream {
            ws: self.websocket(&path).await?,
        })
    }

    /// Opens a WebSocket on `path` with the credentials.
    pub async fn websocket(&self, path: &str) -> Result<WebSocket> {
        let url = self.url(path).replacen("http", "ws", 1);
        let mut req = url
            .into_client_request()
            .map_err(|e| ClientError::WebSocket(Box::new(e)))?;
        if let Some((name, value)) = self.auth.header() {
            req.headers_mut().insert(
                name,
                value
                    .parse()
                    .map_err(|_| ClientError::Decode("credential is not a header value".into()))?,
            );
        }
        let (ws, _) = tokio_tungstenite::connect_async(req)
            .await
            .map_err(|e| ClientError::WebSocket(Box::new(e)))?;
        Ok(ws)
    }

    pub async fn stdin(&self, id: &str, req: &StdinRequest) -> Result<serde_json::Value> {
        self.call_json(
            reqwest::Method::POST,
            &fill(native::COMMAND_STDIN, &[id]),
            req,
        )
        .await
    }

    pub async fn signal(&self, id: &str, signal: &str) -> Result<serde_json::Value> {
        let body = SignalRequest {
            signal: signal.into(),
        };
        self.call_json(
            reqwest::Method::POST,
            &fill(native::COMMAND_SIGNAL, &[id]),
            &body,
        )
        .await
    }

    pub async fn delete_command(&self, id: &str) -> Result<serde_json::Value> {
        Self::call(self.request(reqwest::Method::DELETE, &fill(native::COMMAND, &[id]))).await
    }

    pub async fn events(&self, from_seq: u64) -> Result<EventsPage> {
        self.get(&format!("{}?from_seq={from_seq}", native::EVENTS))
            .await
    }

    /// Long-poll: waits up to `wait` for events at or past `from_seq`.
    pub async fn events_wait(&self, from_seq: u64, wait: Duration) -> Result<EventsPage> {
        self.get(&format!(
            "{}?from_seq={from_seq}&follow=true&timeout_ms={}",
            native::EVENTS,
            wait.as_millis()
        ))
        .await
    }

    pub async fn pty_create(&self, req: &PtyRequest) -> Result<PtyInfo> {
        self.call_json(reqwest::Method::POST, native::PTYS, req)
            .await
    }

    pub async fn pty_list(&self) -> Result<PtyList> {
        self.get(native::PTYS).await
    }

    pub async fn pty(&self, id: &str) -> Result<PtyInfo> {
        self.get(&fill(native::PTY, &[id])).await
    }

    pub async fn pty_kill(&self, id: &str) -> Result<serde_json::Value> {
        Self::call(self.request(reqwest::Method::DELETE, &fill(native::PTY, &[id]))).await
    }

    pub async fn pty_attach(&self, id: &str) -> Result<WebSocket> {
        self.websocket(&fill(native::PTY_ATTACH, &[id])).await
    }

    /// Streams `body` to `path` (atomic on the agent: temp file + rename).
    pub async fn upload(
        &self,
        path: &str,
        body: impl Into<reqwest::Body>,
        mode: Option<u32>,
    ) -> Result<UploadResult> {
        let mut query = vec![("path", path.to_string())];
        if let Some(m) = mode {
            query.push(("mode", format!("{m:o}")));
        }
        Self::call(
            self.request(reqwest::Method::PUT, native::FILES)
                .query(&query)
                .body(body),
        )
        .await
    }

    /// Starts a download; the caller streams the body.
    pub async fn download(&self, path: &str) -> Result<reqwest::Response> {
        check(
            self.request(reqwest::Method::GET, native::FILES)
                .query(&[("path", path)])
                .send()
                .await?,
        )
        .await
    }

    pub async fn stat(&self, path: &str) -> Result<FileEntry> {
        Self::call(
            self.request(reqwest::Method::GET, native::FS_STAT)
                .query(&[("path", path)]),
        )
        .await
    }

    pub async fn list(&self, path: &str, depth: u32) -> Result<ListResponse> {
        Self::call(
            self.request(reqwest::Method::GET, native::FS_LIST)
                .query(&[("path", path), ("depth", &depth.to_string())]),
        )
        .await
    }

    pub async fn mkdir(&self, req: &MkdirRequest) -> Result<FileEntry> {
        self.call_json(reqwest::Method::POST, native::FS_MKDIR, req)
            .await
    }

    pub async fn move_path(&self, req: &MoveRequest) -> Result<FileEntry> {
        self.call_json(reqwest::Method::POST, native::FS_MOVE, req)
            .await
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> Result<serde_json::Value> {
        Self::call(
            self.request(reqwest::Method::DELETE, native::FS)
                .query(&[("path", path), ("recursive", &recursive.to_string())]),
        )
        .await
    }

    pub async fn start_recording(&self, req: &RecordingRequest) -> Result<RecordingInfo> {
        self.call_json(reqwest::Method::POST, native::RECORDINGS, req)
            .await
    }

    pub async fn recordings(&self) -> Result<RecordingList> {
        self.get(native::RECORDINGS).await
    }

    pub async fn recording(&self, id: &str) -> Result<RecordingInfo> {
        self.get(&fill(native::RECORDING, &[id])).await
    }

    pub async fn stop_recording(&self, id: &str) -> Result<RecordingInfo> {
        Self::call(self.request(reqwest::Method::POST, &fill(native::RECORDING_STOP, &[id]))).await
    }

    pub async fn delete_recording(&self, id: &str) -> Result<serde_json::Value> {
        Self::call(self.request(reqwest::Method::DELETE, &fill(native::RECORDING, &[id]))).await
    }

    /// The recording's MP4 (complete fragments so far, when it is still recording).
    pub async fn recording_file(&self, id: &str) -> Result<Vec<u8>> {
        let resp = check(
            self.request(reqwest::Method::GET, &fill(native::RECORDING_FILE, &[id]))
                .send()
                .await?,
        )
        .await?;
        Ok(resp.bytes().await?.to_vec())
    }

    pub async fn viewer_token(&self, req: &ViewerTokenRequest) -> Result<ViewerToken> {
        self.call_json(reqwest::Method::POST, native::VIEWER_TOKENS, req)
            .await
    }

    pub async fn shutdown(&self) -> Result<serde_json::Value> {
        Self::call(self.request(reqwest::Method::POST, native::SHUTDOWN)).await
    }

    /// `GET /v1/desktop/state`: the desktop-state contract, with the image's expected state and
    /// each item checked.
    pub async fn desktop_state(&self) -> Result<crate::desktop::DesktopState> {
        self.get(native::DESKTOP_STATE).await
    }

    /// `GET /v1/ready?wait=…`: the report whether ready (200) or not (503); `wait` zero asks
    /// for the state now.
    pub async fn ready(&self, wait: Duration) -> Result<ReadyReport> {
        let path = format!("{}?wait={}ms", native::READY, wait.as_millis());
        let resp = self.request(reqwest::Method::GET, &path).send().await?;
        let resp = if resp.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            resp
        } else {
            check(resp).await?
        };
        let bytes = resp.bytes().await?;
        match serde_json::from_slice(&bytes) {
            Ok(r) => Ok(r),
            // A 503 that is not a report (the controller's "not running", a proxy) is an error.
            Err(e) => Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(body) => ClientError::Api { status: 503, body },
                Err(_) => ClientError::Decode(format!("{e}: {}", String::from_utf8_lossy(&bytes))),
            }),
        }
    }

    pub async fn browser(&self) -> Result<BrowserInfo> {
        self.get(native::BROWSER).await
    }

    /// `POST /v1/browser/restart`: answers once the new browser is up.
    pub async fn browser_restart(&self) -> Result<BrowserInfo> {
        Self::call(self.request(reqwest::Method::POST, native::BROWSER_RESTART)).await
    }

    pub async fn a11y(&self) -> Result<A11yTree> {
        self.get(native::A11Y).await
    }

    /// `PUT /v1/control`: a person holds the controls.
    /// A controller's push to the controls: with its key (`x-berth-control-key`).
    fn pushed(&self, method: reqwest::Method, path: &str, key: &str) -> reqwest::RequestBuilder {
        self.request(method, path)
            .header(crate::routes::header::CONTROL_KEY, key)
    }

    /// `PUT /v1/control/key`: the controller claims the controls' pushes with the key whose
    /// SHA-256 (hex) this is.
    pub async fn control_claim(&self, key_sha256: &str) -> Result<crate::control::AgentControl> {
        let k = crate::control::ControlKey {
            key_sha256: key_sha256.to_string(),
        };
        self.call_json(reqwest::Method::PUT, native::CONTROL_KEY, &k)
            .await
    }

    /// `PUT /v1/control`: a person holds the controls (the controller's push, with its key).
    pub async fn control_grant(
        &self,
        g: &crate::control::ControlGrant,
        key: &str,
    ) -> Result<crate::control::AgentControl> {
        Self::call(
            self.pushed(reqwest::Method::PUT, native::CONTROL, key)
                .json(g),
        )
        .await
    }

    /// `DELETE /v1/control`: the person handed back.
    pub async fn control_release(&self, key: &str) -> Result<crate::control::AgentControl> {
        Self::call(self.pushed(reqwest::Method::DELETE, native::CONTROL, key)).await
    }

    pub async fn control(&self) -> Result<crate::control::AgentControl> {
        self.get(native::CONTROL).await
    }

    pub async fn control_settings(
        &self,
        s: &crate::control::ControlSettings,
        key: &str,
    ) -> Result<crate::control::AgentControl> {
        Self::call(
            self.pushed(reqwest::Method::PUT, native::CONTROL_SETTINGS, key)
                .json(s),
        )
        .await
    }

    /// `POST /v1/browser/login` (the controller's key): the desktop's browser signed in. The
    /// whole login's bound plus a margin bounds the call.
    pub async fn browser_login(
        &self,
        l: &crate::login::BrowserLogin,
        key: &str,
        within: std::time::Duration,
    ) -> Result<crate::login::BrowserLoginResult> {
        Self::call(
            self.pushed(reqwest::Method::POST, native::BROWSER_LOGIN, key)
                .timeout(within)
                .json(l),
        )
        .await
    }

    /// `POST /v1/browser/forget` (the controller's key): those hosts' cookies and storage gone.
    pub async fn browser_forget(
        &self,
        f: &crate::login::BrowserForget,
        key: &str,
    ) -> Result<crate::login::BrowserForgotten> {
        Self::call(
            self.pushed(reqwest::Method::POST, native::BROWSER_FORGET, key)
                .json(f),
        )
        .await
    }

    pub async fn control_decline(&self, key: &str) -> Result<crate::control::AgentControl> {
        Self::call(self.pushed(reqwest::Method::POST, native::CONTROL_DECLINE, key)).await
    }

    pub async fn browser_tabs(&self) -> Result<crate::workspace::BrowserTabs> {
        self.get(native::BROWSER_TABS).await
    }

    /// A tab's page as JPEG bytes. An observation, refused while a person holds the controls
    /// unless `key` is the controller's (its session view's browser pane).
    pub async fn browser_tab_screenshot(&self, id: &str, key: Option<&str>) -> Result<Vec<u8>> {
        let path = crate::routes::fill(native::BROWSER_TAB_SCREENSHOT, &[id]);
        let mut rb = self.request(reqwest::Method::GET, &path);
        if let Some(k) = key {
            rb = rb.header(crate::routes::header::CONTROL_KEY, k);
        }
        let resp = check(rb.send().await?).await?;
        Ok(resp.bytes().await?.to_vec())
    }

    pub async fn git_repos(&self) -> Result<crate::workspace::GitRepos> {
        self.get(native::GIT_REPOS).await
    }

    /// One file's diff (`q.offset`: the part of a huge one from there).
    pub async fn git_diff(
        &self,
        q: &crate::workspace::DiffQuery,
    ) -> Result<crate::workspace::FileDiff> {
        Self::call(
            self.request(reqwest::Method::GET, native::GIT_DIFF)
                .query(q),
        )
        .await
    }
}

/// Turns an error status into `ClientError`, keeping the native error body when present.
pub async fn check(resp: reqwest::Response) -> Result<reqwest::Response> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let text = resp.text().await.unwrap_or_default();
    match serde_json::from_str::<ErrorBody>(&text) {
        Ok(body) => Err(ClientError::Api {
            status: status.as_u16(),
            body,
        }),
        Err(_) => Err(ClientError::Status {
            status: status.as_u16(),
            body: text,
        }),
    }
}

/// Messages of a followed command output.
pub struct FollowStream {
    ws: WebSocket,
}

impl FollowStream {
    /// The next message; `None` once the agent closed the stream.
    pub async fn next(&mut self) -> Option<Result<FollowMessage>> {
        loop {
            match self.ws.next().await? {
                Ok(Message::Text(t)) => {
                    return Some(
                        serde_json::from_str(&t).map_err(|e| ClientError::Decode(e.to_string())),
                    );
                }
                Ok(Message::Close(_)) => return None,
                Ok(_) => continue,
                Err(e) => return Some(Err(ClientError::WebSocket(Box::new(e)))),
            }
        }
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }

    pub fn into_inner(self) -> WebSocket {
        self.ws
    }
}
