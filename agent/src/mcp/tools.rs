//! The MCP tools: each calls the agent's own domain code, as the matching `/v1` route does.
//! A tool that runs and fails answers a tool error (`isError: true` with the message), arguments
//! that do not parse included, so an engine sees why and can correct itself.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::request::Parts;
use base64::Engine;
use berth_protocol::desktop::A11yTree;
use berth_protocol::events::EventKind;
use berth_protocol::routes::{fill, native};
use berth_protocol::{ComputerRequest, RecordingRequest};
use bytes::Bytes;
use rmcp::handler::server::common::{FromContextPart, schema_for_input};
use rmcp::handler::server::tool::{Extension, ToolCallContext, ToolRouter};
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, ResourceContents};
use rmcp::{ErrorData, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Agent;
use crate::display::ShotRequest;
use crate::exec::Foreground;

// Answers stay under 1 MiB: the MCP Python SDK refuses a server-sent event larger than that by
// default (a session's answers are SSE events), and a structured answer carries its JSON twice.
/// The largest file `read_file` answers (512 KiB: 683 KiB in base64).
pub const READ_MAX: u64 = 512 << 10;
/// The largest file `write_file` takes (decoded bytes; a request body has no such client limit).
pub const WRITE_MAX: u64 = 8 << 20;
/// stdout and stderr bytes one `exec` answer carries, each (the rest is at
/// `GET /v1/commands/{id}/output`).
pub const OUTPUT_MAX: usize = 128 << 10;
/// The longest `exec` timeout: less than a session's idle limit, which a call's wait counts
/// towards.
pub const EXEC_TIMEOUT_MAX_MS: u64 = 20 * 60 * 1000;
/// Entries one `list_dir` answer carries.
pub const LIST_MAX: usize = 1_000;
/// The largest accessibility tree answered (serialized bytes, answered once, as text).
pub const A11Y_MAX: usize = 960 << 10;
const A11Y_TIMEOUT: Duration = Duration::from_secs(20);

/// A tool's arguments, parsed; a parse failure is kept for the tool to answer as a tool error
/// (rmcp's `Parameters` turns it into a protocol error, which engines show opaquely).
pub struct Args<T>(Result<T, String>);

impl<S, T: DeserializeOwned> FromContextPart<ToolCallContext<'_, S>> for Args<T> {
    fn from_context_part(context: &mut ToolCallContext<S>) -> Result<Self, ErrorData> {
        let args = Value::Object(context.arguments.take().unwrap_or_default());
        Ok(Args(
            serde_path_to_error::deserialize(args).map_err(|e| format!("invalid arguments: {e}")),
        ))
    }
}

/// The input schema of `T`, as rmcp's `Parameters<T>` would declare it.
fn schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("input schema of {}: {e}", std::any::type_name::<T>()))
}

fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

/// A structured answer, its JSON also as the text block (what clients without structured
/// content read).
fn structured(value: impl serde::Serialize) -> CallToolResult {
    match serde_json::to_value(value) {
        Ok(v) => CallToolResult::structured(v),
        Err(e) => tool_error(format!("cannot serialize the answer: {e}")),
    }
}

/// The MIME type of a base64-encoded screenshot, from its first bytes.
pub fn image_mime(b64: &str) -> &'static str {
    if b64.starts_with("/9j/") {
        "image/jpeg"
    } else if b64.starts_with("UklGR") {
        "image/webp"
    } else {
        "image/png"
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScreenshotArgs {
    /// `png` (default), `jpeg` or `webp`.
    #[serde(default)]
    pub format: Option<String>,
    /// JPEG/WebP quality, 1-100 (as `GET /v1/screenshot`'s `quality`).
    #[serde(default)]
    pub quality: Option<u8>,
    /// Output size as a share of the screen, 0 < scale <= 1 (default 1).
    #[serde(default)]
    pub scale: Option<f64>,
}

/// `exec`: a foreground `POST /v1/exec`. Exactly one of `argv` and `shell`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// The program and its arguments, run without a shell.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// A script for `/bin/sh -c`.
    #[serde(default)]
    pub shell: Option<String>,
    /// Working directory; default the sandbox user's home. `~/` is expanded.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Added to (and overriding) the sandbox environment.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Run as this account instead of the sandbox user.
    #[serde(default)]
    pub user: Option<String>,
    /// Kill the command's process group after this long (default 120000, at most 1200000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Bytes written to the command's stdin, which is then closed.
    #[serde(default)]
    pub stdin: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Absolute, or relative to the sandbox user's home (`~/` expands to it).
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Absolute, or relative to the sandbox user's home. Missing parent directories are created.
    pub path: String,
    /// The file's content: text, or base64 when `base64` is true.
    pub content: String,
    /// `content` is base64 (for binary files).
    #[serde(default)]
    pub base64: Option<bool>,
    /// Octal permission bits such as `644` (default) or `755`.
    #[serde(default)]
    pub mode: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirArgs {
    /// The directory: absolute, or relative to the sandbox user's home.
    pub path: String,
    /// Levels to descend, 1 (default) to 32.
    #[serde(default)]
    pub depth: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopRecordingArgs {
    /// The recording's id, as `start_recording` answered it.
    pub id: String,
}

/// What `browser_cdp_url` answers.
#[derive(Debug, serde::Serialize)]
struct CdpEndpoint {
    /// The browser target through the agent's WebSocket relay, as `GET /v1/browser` gives it:
    /// built from the `Host` this request came in on, bearer token required.
    ws_url: String,
    /// The same relay's path on the agent (prefix it with the base URL a client reaches the
    /// agent at, e.g. the controller's per-sandbox relay).
    ws_path: &'static str,
    /// The agent's TCP relay to Chromium's DevTools port (`--cdp-listen`), no token: what
    /// Playwright's `connect_over_cdp` takes as `http://<address>` on the agent's network.
    cdp_listen: Option<String>,
    browser_version: Option<String>,
    protocol_version: Option<String>,
}

/// One MCP session's server: the agent and the tool table shared by every session.
pub struct BerthMcp {
    agent: Arc<Agent>,
    tool_router: Arc<ToolRouter<BerthMcp>>,
}

impl BerthMcp {
    pub fn new(agent: Arc<Agent>, tool_router: Arc<ToolRouter<BerthMcp>>) -> BerthMcp {
        BerthMcp { agent, tool_router }
    }

    /// The agent's own tools (the toolsets' members are added by [`super::tool_table`]).
    pub(super) fn own_tools() -> ToolRouter<BerthMcp> {
        Self::tool_router()
    }

    pub(super) fn agent(&self) -> &Arc<Agent> {
        &self.agent
    }
}

/// The tool error of a desktop tool while a person holds the controls, if they do.
pub fn refused(agent: &Agent) -> Option<CallToolResult> {
    agent.control.check(None).err().map(|ms| {
        tool_error(format!(
            "{}: {}",
            berth_protocol::control::HUMAN_IN_CONTROL,
            berth_protocol::control::refusal(ms)
        ))
    })
}

#[tool_router]
impl BerthMcp {
    #[tool(
        description = "Anthropic's computer-use tool: one action (key, hold_key, type, cursor_position, mouse_move, left_mouse_down, left_mouse_up, left_click, left_click_drag, right_click, middle_click, double_click, triple_click, scroll, wait, screenshot, zoom) on the desktop. Answers the screen once it settled after the action (PNG), and `output` as text when the action has one (cursor_position: `X=..,Y=..`). With display_width_px/display_height_px, coordinates and screenshots are in that scaled space.",
        input_schema = schema::<ComputerRequest>()
    )]
    async fn computer(&self, Args(req): Args<ComputerRequest>) -> CallToolResult {
        if let Some(r) = refused(&self.agent) {
            return r;
        }
        let req = match req {
            Ok(r) => r,
            Err(e) => return tool_error(e),
        };
        let called = std::time::Instant::now();
        let raw = serde_json::to_value(&req).unwrap_or_default();
        let (result, trace) = crate::display::computer::run_traced(&self.agent.display, req).await;
        let error = match &result {
            Ok(r) => r.error.clone(),
            Err(e) => Some(e.to_string()),
        };
        self.agent
            .log_computer(crate::episode::Source::Mcp, &raw, &trace, error, called)
            .await;
        match result {
            Ok(r) => {
                let mut content = Vec::new();
                if let Some(img) = r.base64_image {
                    let mime = image_mime(&img);
                    content.push(ContentBlock::image(img, mime));
                }
                if let Some(out) = r.output {
                    content.push(ContentBlock::text(out));
                }
                if let Some(e) = r.error {
                    return tool_error(e);
                }
                CallToolResult::success(content)
            }
            Err(e) => tool_error(e.to_string()),
        }
    }

    #[tool(
        description = "A screenshot of the whole screen (PNG unless `format` says jpeg or webp), optionally scaled down.",
        input_schema = schema::<ScreenshotArgs>(),
        annotations(read_only_hint = true)
    )]
    async fn screenshot(&self, Args(args): Args<ScreenshotArgs>) -> CallToolResult {
        if let Some(r) = refused(&self.agent) {
            return r;
        }
        let args = match args {
            Ok(a) => a,
            Err(e) => return tool_error(e),
        };
        let encoding = match crate::display::encode::Encoding::parse(
            args.format.as_deref(),
            args.quality,
            None,
        ) {
            Ok(e) => e,
            Err(e) => return tool_error(e),
        };
        let req = ShotRequest {
            encoding,
            scale: args.scale,
            ..Default::default()
        };
        let d = self.agent.display.clone();
        let shot = tokio::task::spawn_blocking(move || d.screenshot(&req)).await;
        match shot {
            Ok(Ok(shot)) => CallToolResult::success(vec![ContentBlock::image(
                base64::engine::general_purpose::STANDARD.encode(shot.bytes.as_ref()),
                shot.mime,
            )]),
            Ok(Err(e)) => tool_error(e.to_string()),
            Err(e) => tool_error(format!("screenshot failed: {e}")),
        }
    }

    #[tool(
        description = "Runs a command in the sandbox and waits for it (as POST /v1/exec): `argv` without a shell, or `shell` for /bin/sh -c. Answers exit_code, stdout, stderr (base64 in stdout_b64/stderr_b64 when not UTF-8), duration_ms, timed_out. A stream over 128 KiB comes as stdout_preview/stderr_preview instead: its first 20 and last 40 lines, its size and the bytes left out; the whole output is read by range at output_href (?from_seq=&max_bytes=). A non-zero exit is an answer, not a tool error.",
        input_schema = schema::<ExecArgs>()
    )]
    async fn exec(&self, Args(args): Args<ExecArgs>) -> CallToolResult {
        let args = match args {
            Ok(a) => a,
            Err(e) => return tool_error(e),
        };
        match args.timeout_ms {
            Some(0) => return tool_error("`timeout_ms` must be at least 1"),
            Some(ms) if ms > EXEC_TIMEOUT_MAX_MS => {
                return tool_error(format!(
                    "`timeout_ms` is at most {EXEC_TIMEOUT_MAX_MS} here (a session that hears \
                     nothing for {} min ends); run longer commands with POST {} and \
                     \"background\": true",
                    super::SESSION_IDLE.as_secs() / 60,
                    native::EXEC
                ));
            }
            _ => {}
        }
        let commands = &self.agent.commands;
        let prepared = match commands.prepare(
            args.argv,
            args.shell,
            args.cwd.as_deref(),
            args.env.as_ref(),
            args.user.as_deref(),
        ) {
            Ok(p) => p,
            Err(e) => return tool_error(e.to_string()),
        };
        let out = match commands
            .run_foreground(
                prepared,
                Foreground {
                    stdin: args.stdin.map(String::into_bytes),
                    timeout: args.timeout_ms.map(Duration::from_millis),
                    merge_stderr: false,
                },
            )
            .await
        {
            Ok(o) => o,
            Err(e) => return tool_error(e.to_string()),
        };
        structured(out.into_result(OUTPUT_MAX))
    }

    #[tool(
        description = "Reads a file of at most 512 KiB (larger ones: GET /v1/files): its text when it is UTF-8, else an embedded resource with the bytes in base64.",
        input_schema = schema::<ReadFileArgs>(),
        annotations(read_only_hint = true)
    )]
    async fn read_file(&self, Args(args): Args<ReadFileArgs>) -> CallToolResult {
        let args = match args {
            Ok(a) => a,
            Err(e) => return tool_error(e),
        };
        let path = match self.agent.files.resolve(&args.path) {
            Ok(p) => p,
            Err(e) => return tool_error(e.to_string()),
        };
        let p = path.clone();
        let read = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, String> {
            use std::io::Read;
            let err = |e| crate::fs::FsError::from_io(&p, e).to_string();
            let meta = std::fs::metadata(&p).map_err(err)?;
            if meta.is_dir() {
                return Err(crate::fs::FsError::IsADirectory(p).to_string());
            }
            let too_large = |n: u64| {
                format!(
                    "{}: {n} bytes, more than the {READ_MAX} read_file answers; download it with GET {}?path=…",
                    p.display(),
                    native::FILES
                )
            };
            if meta.len() > READ_MAX {
                return Err(too_large(meta.len()));
            }
            let mut data = Vec::new();
            std::fs::File::open(&p)
                .map_err(err)?
                .take(READ_MAX + 1)
                .read_to_end(&mut data)
                .map_err(err)?;
            if data.len() as u64 > READ_MAX {
                return Err(too_large(data.len() as u64));
            }
            Ok(data)
        })
        .await;
        let data = match read {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => return tool_error(e),
            Err(e) => return tool_error(format!("read failed: {e}")),
        };
        match String::from_utf8(data) {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(e) => {
                let mime = mime_guess::from_path(&path).first_or_octet_stream();
                CallToolResult::success(vec![ContentBlock::resource(
                    ResourceContents::blob(
                        base64::engine::general_purpose::STANDARD.encode(e.into_bytes()),
                        format!("file://{}", path.display()),
                    )
                    .with_mime_type(mime.essence_str()),
                )])
            }
        }
    }

    #[tool(
        description = "Writes a file of at most 8 MiB atomically (as PUT /v1/files): text, or base64 with `base64: true`; missing parent directories are created; the file belongs to the sandbox user. Answers path and bytes.",
        input_schema = schema::<WriteFileArgs>()
    )]
    async fn write_file(&self, Args(args): Args<WriteFileArgs>) -> CallToolResult {
        let args = match args {
            Ok(a) => a,
            Err(e) => return tool_error(e),
        };
        let path = match self.agent.files.resolve(&args.path) {
            Ok(p) => p,
            Err(e) => return tool_error(e.to_string()),
        };
        let mode = match args.mode.as_deref() {
            None => None,
            Some(m) => match u32::from_str_radix(m.trim_start_matches("0o"), 8) {
                Ok(bits) if bits <= 0o7777 => Some(bits),
                _ => {
                    return tool_error(format!(
                        "invalid `mode` {m:?}: give octal permission bits such as 644"
                    ));
                }
            },
        };
        let bytes = if args.base64.unwrap_or(false) {
            match base64::engine::general_purpose::STANDARD.decode(args.content.trim()) {
                Ok(b) => b,
                Err(e) => return tool_error(format!("`content` is not base64: {e}")),
            }
        } else {
            args.content.into_bytes()
        };
        if bytes.len() as u64 > WRITE_MAX {
            return tool_error(format!(
                "{} bytes, more than the {WRITE_MAX} write_file takes; upload it with PUT {}?path=…",
                bytes.len(),
                native::FILES
            ));
        }
        let body =
            futures_util::stream::iter([Ok::<Bytes, std::convert::Infallible>(Bytes::from(bytes))]);
        match self.agent.files.upload(&path, body, mode).await {
            Ok(n) => {
                let shown = path.to_string_lossy().into_owned();
                self.agent
                    .events
                    .emit(EventKind::FileUploaded, json!({"path": shown, "bytes": n}));
                structured(berth_protocol::UploadResult {
                    path: shown,
                    bytes: n,
                })
            }
            Err(e) => tool_error(e.to_string()),
        }
    }

    #[tool(
        description = "Lists a directory (as GET /v1/fs/list): its entries (name, path, type, size, mode, modified_at), `depth` levels deep; at most 1000 entries.",
        input_schema = schema::<ListDirArgs>(),
        annotations(read_only_hint = true)
    )]
    async fn list_dir(&self, Args(args): Args<ListDirArgs>) -> CallToolResult {
        let args = match args {
            Ok(a) => a,
            Err(e) => return tool_error(e),
        };
        let path = match self.agent.files.resolve(&args.path) {
            Ok(p) => p,
            Err(e) => return tool_error(e.to_string()),
        };
        let files = self.agent.files.clone();
        let depth = args.depth.unwrap_or(1);
        match tokio::task::spawn_blocking(move || files.list(&path, depth)).await {
            Ok(Ok(list)) if list.entries.len() > LIST_MAX => tool_error(format!(
                "{}: {} entries, more than the {LIST_MAX} list_dir answers; list with a smaller depth or GET {}",
                list.path,
                list.entries.len(),
                native::FS_LIST
            )),
            Ok(Ok(list)) => structured(list),
            Ok(Err(e)) => tool_error(e.to_string()),
            Err(e) => tool_error(format!("list failed: {e}")),
        }
    }

    #[tool(
        description = "The desktop's accessibility tree (AT-SPI, as GET /v1/a11y) as JSON text: every application with its nested objects (role, name, states, attributes, screencoord, size); at most 960 KiB.",
        annotations(read_only_hint = true)
    )]
    async fn accessibility_tree(&self) -> CallToolResult {
        if let Some(r) = refused(&self.agent) {
            return r;
        }
        match tokio::time::timeout(A11Y_TIMEOUT, self.agent.a11y.tree()).await {
            Err(_) => tool_error(format!(
                "the accessibility tree took longer than {} s",
                A11Y_TIMEOUT.as_secs()
            )),
            Ok(Err(e)) => tool_error(e.to_string()),
            Ok(Ok(applications)) => {
                let tree = A11yTree { applications };
                match serde_json::to_value(&tree) {
                    Ok(v) if v.to_string().len() > A11Y_MAX => tool_error(format!(
                        "the accessibility tree is more than {A11Y_MAX} bytes; read it with GET {}",
                        native::A11Y
                    )),
                    Ok(v) => CallToolResult::success(vec![ContentBlock::text(v.to_string())]),
                    Err(e) => tool_error(format!("cannot serialize the tree: {e}")),
                }
            }
        }
    }

    #[tool(
        description = "Where the desktop's Chromium takes CDP clients: `ws_url` through the agent's WebSocket relay (bearer token; built from the Host this request reached the agent at), `ws_path` to put after another base URL, and `cdp_listen`, the agent's token-less TCP relay for Playwright's connect_over_cdp on the agent's network.",
        annotations(read_only_hint = true)
    )]
    async fn browser_cdp_url(&self, Extension(parts): Extension<Parts>) -> CallToolResult {
        let Some(desktop) = &self.agent.desktop else {
            return tool_error("this agent runs without --desktop: there is no browser");
        };
        let Some(dt) = desktop.browser(crate::desktop::BROWSER_WAIT).await else {
            return tool_error(format!(
                "the browser is not running (see GET {})",
                native::READY
            ));
        };
        let version = match crate::browser::cdp::version(dt.port).await {
            Ok(v) => v,
            Err(e) => return tool_error(format!("the browser does not answer: {e}")),
        };
        let host = parts
            .headers
            .get(axum::http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("127.0.0.1");
        let text = |v: &Value| v.as_str().map(String::from);
        structured(CdpEndpoint {
            ws_url: format!("ws://{host}{}", native::BROWSER_CDP),
            ws_path: native::BROWSER_CDP,
            cdp_listen: self.agent.cdp_listen.map(|a| a.to_string()),
            browser_version: text(&version["Browser"]),
            protocol_version: text(&version["Protocol-Version"]),
        })
    }

    #[tool(
        description = "Starts recording the screen to MP4 (as POST /v1/recordings); answers once the first frame is in the file, with the recording's id.",
        input_schema = schema::<RecordingRequest>()
    )]
    async fn start_recording(&self, Args(req): Args<RecordingRequest>) -> CallToolResult {
        let req = match req {
            Ok(r) => r,
            Err(e) => return tool_error(e),
        };
        match self.agent.recorder.start(req, false).await {
            Ok(rec) => structured(rec.info()),
            Err(e) => tool_error(e.to_string()),
        }
    }

    #[tool(
        description = "Stops a recording; answers it (id, duration_ms, bytes, …) and `download_path`, the agent path its MP4 is fetched from with the bearer token.",
        input_schema = schema::<StopRecordingArgs>()
    )]
    async fn stop_recording(&self, Args(args): Args<StopRecordingArgs>) -> CallToolResult {
        let args = match args {
            Ok(a) => a,
            Err(e) => return tool_error(e),
        };
        match self.agent.recorder.stop(&args.id).await {
            Ok(info) => {
                let mut v = match serde_json::to_value(&info) {
                    Ok(v) => v,
                    Err(e) => return tool_error(format!("cannot serialize the answer: {e}")),
                };
                v["download_path"] = json!(fill(native::RECORDING_FILE, &[&info.id]));
                CallToolResult::structured(v)
            }
            Err(e) => tool_error(e.to_string()),
        }
    }
}

#[tool_handler(
    router = self.tool_router,
    name = "berth",
    instructions = "A berth sandbox: a Linux desktop (X11, Chromium) and a shell. `computer` acts on the screen and answers the settled screenshot; `exec` runs commands; the file tools read and write the sandbox user's files."
)]
impl ServerHandler for BerthMcp {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn screenshot_mime_follows_the_encoded_bytes() {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        assert_eq!(image_mime(&b64(b"\x89PNG\r\n\x1a\n")), "image/png");
        assert_eq!(image_mime(&b64(b"\xff\xd8\xff\xe0")), "image/jpeg");
        assert_eq!(image_mime(&b64(b"RIFF\0\0\0\0WEBP")), "image/webp");
    }

    #[test]
    fn every_tool_is_listed_with_an_object_schema() {
        let router = super::super::tool_table(&[]);
        let mut names: Vec<String> = router
            .list_all()
            .iter()
            .map(|t| t.name.to_string())
            .collect();
        names.retain(|n| !n.starts_with("computer_"));
        names.sort();
        assert_eq!(
            names,
            [
                "accessibility_tree",
                "browser_cdp_url",
                "computer",
                "exec",
                "list_dir",
                "read_file",
                "screenshot",
                "start_recording",
                "stop_recording",
                "write_file"
            ]
        );
        for t in router.list_all() {
            assert_eq!(
                t.input_schema.get("type"),
                Some(&json!("object")),
                "{}",
                t.name
            );
            assert!(t.description.as_deref().is_some_and(|d| !d.is_empty()));
        }
        let computer = router.get("computer").expect("computer");
        assert!(computer.input_schema["properties"]["action"].is_object());
    }
}
