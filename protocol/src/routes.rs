//! Every route path and header name of the wire, written once.
//!
//! Paths are axum templates (`/v1/commands/{id}`): the routers register them as they are and
//! clients fill them in with [`fill`] (`fill(native::COMMAND, &[id])` → `/v1/commands/cmd_1`).
//! The agent nests its native router under [`native::PREFIX`], so each native path also exists
//! relative to it in [`native::nested`] (`/commands/{id}`); both come from one literal.

/// Fills a template's `{name}` segments in order with `args`. A single-segment parameter is
/// percent-encoded (a `/` or `?` in an id stays inside its segment); a `{*rest}` parameter is
/// inserted as given (it is a path). Missing arguments leave the template's text in place.
pub fn fill(template: &str, args: &[&str]) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut args = args.iter();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}').map(|c| open + c) else {
            break;
        };
        out.push_str(&rest[..open]);
        let name = &rest[open + 1..close];
        match args.next() {
            Some(a) if name.starts_with('*') => out.push_str(a.trim_start_matches('/')),
            Some(a) => encode_segment(a, &mut out),
            None => out.push_str(&rest[open..=close]),
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode_segment(s: &str, out: &mut String) {
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
}

/// Declares each native path twice from one literal: `NAME` = `/v1` + path, and
/// `nested::NAME` = the path relative to the `/v1` nest.
macro_rules! native_paths {
    ($($(#[$doc:meta])* $name:ident = $path:literal;)*) => {
        $($(#[$doc])* pub const $name: &str = concat!("/v1", $path);)*
        /// The same paths relative to [`PREFIX`], for the router nested there.
        pub mod nested {
            $($(#[$doc])* pub const $name: &str = $path;)*
        }
    };
}

/// The agent's native API (`Authorization: Bearer`; the (V) routes also take a viewer cookie).
pub mod native {
    /// Where the native router is nested.
    pub const PREFIX: &str = "/v1";
    /// No auth: liveness (outside the nest).
    pub const HEALTHZ: &str = "/healthz";
    /// OpenAPI 3.1 document of both agent surfaces (outside the nest).
    pub const OPENAPI: &str = "/openapi.json";
    /// MCP (Streamable HTTP, bearer token; outside the nest).
    pub const MCP: &str = "/mcp";

    native_paths! {
        EXEC = "/exec";
        COMMANDS = "/commands";
        COMMAND = "/commands/{id}";
        COMMAND_OUTPUT = "/commands/{id}/output";
        COMMAND_STDIN = "/commands/{id}/stdin";
        COMMAND_SIGNAL = "/commands/{id}/signal";
        /// `POST` opens a PTY, `GET` lists them.
        PTYS = "/pty";
        PTY = "/pty/{id}";
        PTY_ATTACH = "/pty/{id}/attach";
        PTY_RESIZE = "/pty/{id}/resize";
        /// `GET` downloads, `PUT` uploads (`?path=`).
        FILES = "/files";
        /// `DELETE ?path=&recursive=`.
        FS = "/fs";
        FS_LIST = "/fs/list";
        FS_STAT = "/fs/stat";
        FS_MKDIR = "/fs/mkdir";
        FS_MOVE = "/fs/move";
        FS_WATCH = "/fs/watch";
        SCREENSHOT = "/screenshot";
        INPUT = "/input";
        DISPLAY = "/display";
        WINDOWS = "/windows";
        CLIPBOARD = "/clipboard";
        COMPUTER = "/computer";
        /// `GET` the `tools[]` entry of Anthropic's computer toolset, `POST` a model turn's
        /// `tool_use` blocks for it (answered with their `tool_result` blocks).
        TOOLSET_COMPUTER = "/toolsets/computer";
        /// `GET` the `tools[]` entry of Anthropic's browser toolset, `POST` a model turn's
        /// `tool_use` blocks for it, run over CDP in the sandbox's browser.
        TOOLSET_BROWSER = "/toolsets/browser";
        RECORDINGS = "/recordings";
        RECORDING = "/recordings/{id}";
        RECORDING_STOP = "/recordings/{id}/stop";
        RECORDING_FILE = "/recordings/{id}/file";
        VIEWER_TOKENS = "/viewer-tokens";
        READY = "/ready";
        /// `GET`: the desktop-state contract (session, theme, dock, handlers, windows, first-run
        /// state, programs) against the image's expected state.
        DESKTOP_STATE = "/desktop/state";
        /// `POST {"op", …}`: the workpiece engine (inspect, create, read, apply, render, open,
        /// discard), run as the sandbox user.
        WORKPIECE = "/workpiece";
        /// `GET` reads, `PUT` writes (atomically, checked against `sha256`) a workpiece file
        /// with the sandbox user's rights (`?path=`).
        WORKPIECE_FILE = "/workpiece/file";
        A11Y = "/a11y";
        BROWSER = "/browser";
        BROWSER_RESTART = "/browser/restart";
        BROWSER_CDP = "/browser/cdp";
        BROWSER_CDP_TARGET = "/browser/cdp/{kind}/{id}";
        /// `GET`: the browser's tabs (title, URL, the active one).
        BROWSER_TABS = "/browser/tabs";
        /// `POST {"url", …}`: sign the browser in to a site (the controller's key only).
        BROWSER_LOGIN = "/browser/login";
        /// `POST {"hosts"}`: the browser's cookies and storage of those hosts cleared (the
        /// controller's key only).
        BROWSER_FORGET = "/browser/forget";
        /// `GET`: a tab's page as a JPEG (the session view's live view).
        BROWSER_TAB_SCREENSHOT = "/browser/tabs/{id}/screenshot";
        /// `GET`: the git repositories under the sandbox user's working directory and what
        /// changed in each.
        GIT_REPOS = "/git/repos";
        /// `GET ?repo=&path=`: one file's unified diff.
        GIT_DIFF = "/git/diff";
        /// `GET` the controls' state; `PUT` a person holds them, `DELETE` they handed back
        /// (the controller's pushes).
        CONTROL = "/control";
        /// `PUT {"requests_enabled"}` (the controller's push).
        CONTROL_SETTINGS = "/control/settings";
        /// `POST {"reason"}`: the agent asks for a person; answers when one came and went,
        /// declined, or the wait ended.
        CONTROL_REQUEST = "/control/request";
        /// `POST`: a person declined the pending request (the controller's push).
        CONTROL_DECLINE = "/control/decline";
        /// `PUT {"key_sha256"}`: the controller claims the controls' pushes, once.
        CONTROL_KEY = "/control/key";
        EVENTS = "/events";
        /// `DELETE` starts a new episode (clears the action log).
        EPISODE = "/episode";
        /// `GET ?from_seq=&limit=`: the episode's logged actions.
        EPISODE_ACTIONS = "/episode/actions";
        /// `GET`: a screenshot an action answered (`000012.png`).
        EPISODE_SCREENSHOT = "/episode/screenshots/{name}";
        SHUTDOWN = "/shutdown";
        /// (V) the live MP4 stream.
        STREAM_MP4 = "/stream.mp4";
        /// (V) the live stream over a WebSocket.
        STREAM = "/stream";
        /// (V) the noVNC page.
        VNC_INDEX = "/vnc/";
        /// (V) noVNC's WebSocket.
        VNC_WS = "/vnc/websockify";
        /// (V) noVNC's static files.
        VNC_FILE = "/vnc/{*path}";
        /// `ANY`: the preview relay to `127.0.0.1:{port}` inside the sandbox (HTTP, WebSocket).
        PORT = "/ports/{port}/{*path}";
        /// The preview relay's root (`{*path}` does not match an empty path).
        PORT_ROOT = "/ports/{port}/";
        /// The root without its slash: a redirect to [`PORT_ROOT`].
        PORT_BARE = "/ports/{port}";
    }
}

/// The OSWorld-compatible surface the agent serves at root paths.
pub mod compat {
    pub const EXECUTE: &str = "/execute";
    pub const SETUP_EXECUTE: &str = "/setup/execute";
    pub const EXECUTE_WITH_VERIFICATION: &str = "/execute_with_verification";
    pub const SETUP_EXECUTE_WITH_VERIFICATION: &str = "/setup/execute_with_verification";
    pub const SETUP_LAUNCH: &str = "/setup/launch";
    pub const RUN_PYTHON: &str = "/run_python";
    pub const RUN_BASH_SCRIPT: &str = "/run_bash_script";
    pub const FILE: &str = "/file";
    pub const SETUP_UPLOAD: &str = "/setup/upload";
    pub const LIST_DIRECTORY: &str = "/list_directory";
    pub const DESKTOP_PATH: &str = "/desktop_path";
    pub const SETUP_DOWNLOAD_FILE: &str = "/setup/download_file";
    pub const PLATFORM: &str = "/platform";
    pub const SCREENSHOT: &str = "/screenshot";
    pub const SCREEN_SIZE: &str = "/screen_size";
    pub const CURSOR_POSITION: &str = "/cursor_position";
    pub const WINDOW_SIZE: &str = "/window_size";
    pub const SETUP_ACTIVATE_WINDOW: &str = "/setup/activate_window";
    pub const SETUP_CLOSE_WINDOW: &str = "/setup/close_window";
    pub const SETUP_OPEN_FILE: &str = "/setup/open_file";
    pub const WALLPAPER: &str = "/wallpaper";
    pub const SETUP_CHANGE_WALLPAPER: &str = "/setup/change_wallpaper";
    pub const START_RECORDING: &str = "/start_recording";
    pub const END_RECORDING: &str = "/end_recording";
    pub const ACCESSIBILITY: &str = "/accessibility";
    pub const TERMINAL: &str = "/terminal";
}

/// The controller's API (`X-Api-Key` on every route but health, metrics and the viewer's).
pub mod controller {
    pub const HEALTHZ: &str = "/healthz";
    pub const METRICS: &str = "/metrics";
    pub const OPENAPI: &str = "/openapi.json";
    /// MCP: sandbox and lease tools.
    pub const MCP: &str = "/mcp";

    /// `POST` creates (`?wait=`), `GET` lists (`?label=k=v&status=`).
    pub const SANDBOXES: &str = "/sandbox/sandboxes/v1";
    /// `GET` shows, `DELETE` destroys; also the base of a sandbox's agent through the
    /// controller ([`SANDBOX_AGENT`] is this plus the agent's native path).
    pub const SANDBOX: &str = "/sandbox/sandboxes/v1/{id}";

    /// Where a sandbox's own pages start under the controller ([`SANDBOX`] and a slash): its
    /// agent's paths, its ports' previews and its session view are relative to it.
    pub fn sandbox_base(id: &str) -> String {
        format!("{}/", crate::routes::fill(SANDBOX, &[id]))
    }

    /// Where `berth serve` listens unless told otherwise, and so the clients' default URL.
    pub const DEFAULT_URL: &str = "http://localhost:8780";
    pub const SANDBOX_VIEWER: &str = "/sandbox/sandboxes/v1/{id}/viewer";
    pub const SANDBOX_EXEC: &str = "/sandbox/sandboxes/v1/{id}/exec";
    pub const RUN: &str = "/sandbox/sandboxes/v1/{id}/runs/{run_id}";
    pub const RUN_OUTPUT: &str = "/sandbox/sandboxes/v1/{id}/runs/{run_id}/output";
    pub const SANDBOX_EVENTS: &str = "/sandbox/sandboxes/v1/{id}/events";
    pub const SANDBOX_SCREENSHOT: &str = "/sandbox/sandboxes/v1/{id}/screenshot";
    pub const SANDBOX_COMPUTER: &str = "/sandbox/sandboxes/v1/{id}/computer";
    pub const SANDBOX_FILES: &str = "/sandbox/sandboxes/v1/{id}/files";
    /// `ANY`: the sandbox's agent `/v1/{path}`, streamed (HTTP, SSE, WebSocket).
    pub const SANDBOX_AGENT: &str = "/sandbox/sandboxes/v1/{id}/v1/{*path}";
    /// `ANY`: preview of `127.0.0.1:{port}` inside the sandbox (HTTP, WebSocket).
    pub const SANDBOX_PORT: &str = "/sandbox/sandboxes/v1/{id}/ports/{port}/{*path}";
    /// The preview's root (`{*path}` does not match an empty path).
    pub const SANDBOX_PORT_ROOT: &str = "/sandbox/sandboxes/v1/{id}/ports/{port}/";
    /// The root without its slash: a redirect to [`SANDBOX_PORT_ROOT`].
    pub const SANDBOX_PORT_BARE: &str = "/sandbox/sandboxes/v1/{id}/ports/{port}";
    /// `POST {"ttl_seconds"?}` → `{"url", "expires_at"}`: a browser URL for the preview.
    pub const SANDBOX_PORT_URL: &str = "/sandbox/sandboxes/v1/{id}/ports/{port}/url";
    /// MCP for one sandbox.
    pub const SANDBOX_MCP: &str = "/sandbox/sandboxes/v1/{id}/mcp";
    pub const SANDBOX_ARTIFACTS: &str = "/sandbox/sandboxes/v1/{id}/artifacts";
    pub const SANDBOX_EPISODE: &str = "/sandbox/sandboxes/v1/{id}/episode";
    /// `GET` the sandbox's workpieces, `POST` a new one.
    /// `GET` the controls, `POST` take (or renew) them, `DELETE` hand them back.
    pub const CONTROL: &str = "/sandbox/sandboxes/v1/{id}/control";
    /// `POST`: a person declines the agent's request for one.
    pub const CONTROL_DECLINE: &str = "/sandbox/sandboxes/v1/{id}/control/decline";
    pub const WORKPIECES: &str = "/sandbox/sandboxes/v1/{id}/workpieces";
    pub const WORKPIECE: &str = "/sandbox/sandboxes/v1/{id}/workpieces/{wid}";
    /// `GET ?version=&page=&sheet=`: structured content, paged.
    pub const WORKPIECE_CONTENT: &str = "/sandbox/sandboxes/v1/{id}/workpieces/{wid}/content";
    /// `GET`: a version's page rendered as PNG (from 1).
    pub const WORKPIECE_VERSION_PAGE: &str =
        "/sandbox/sandboxes/v1/{id}/workpieces/{wid}/versions/{version}/pages/{page}";
    /// `POST`: opens it in the desktop's editor.
    pub const WORKPIECE_OPEN: &str = "/sandbox/sandboxes/v1/{id}/workpieces/{wid}/open";
    pub const WORKPIECE_PROPOSALS: &str = "/sandbox/sandboxes/v1/{id}/workpieces/{wid}/proposals";
    pub const WORKPIECE_PROPOSAL: &str =
        "/sandbox/sandboxes/v1/{id}/workpieces/{wid}/proposals/{pid}";
    /// `GET`: a proposal's result rendered, page by page (from 1).
    pub const WORKPIECE_PROPOSAL_PAGE: &str =
        "/sandbox/sandboxes/v1/{id}/workpieces/{wid}/proposals/{pid}/pages/{page}";
    pub const WORKPIECE_ACCEPT: &str =
        "/sandbox/sandboxes/v1/{id}/workpieces/{wid}/proposals/{pid}/accept";
    pub const WORKPIECE_REJECT: &str =
        "/sandbox/sandboxes/v1/{id}/workpieces/{wid}/proposals/{pid}/reject";
    /// `POST` a [`crate::controller::GithubClone`]: the repository cloned into the sandbox.
    pub const SANDBOX_GITHUB_CLONE: &str = "/sandbox/sandboxes/v1/{id}/github/clone";
    /// `GET ?repository=owner/name&state=&page=&per_page=`: a cloned repository's pull requests.
    pub const SANDBOX_GITHUB_PULLS: &str = "/sandbox/sandboxes/v1/{id}/github/pulls";
    /// `GET ?repository=owner/name`: one pull request (description, diff, files, reviews,
    /// review comments).
    pub const SANDBOX_GITHUB_PULL: &str = "/sandbox/sandboxes/v1/{id}/github/pulls/{number}";
    /// `GET ?repository=owner/name&state=&page=&per_page=`: a cloned repository's issues.
    pub const SANDBOX_GITHUB_ISSUES: &str = "/sandbox/sandboxes/v1/{id}/github/issues";
    /// `GET ?repository=owner/name`: one issue with its comments.
    pub const SANDBOX_GITHUB_ISSUE: &str = "/sandbox/sandboxes/v1/{id}/github/issues/{number}";
    /// `GET`: the login sites the sandbox's run enables; `POST {"site"}`: sign its browser in.
    pub const SANDBOX_LOGIN: &str = "/sandbox/sandboxes/v1/{id}/login";
    /// `GET`: the repositories the configured GitHub token reads.
    pub const GITHUB_REPOSITORIES: &str = "/sandbox/v1/github/repositories";
    /// `POST` → `{"url", "expires_at"}`: a one-time URL for the session view.
    pub const SANDBOX_SESSION: &str = "/sandbox/sandboxes/v1/{id}/session";
    /// (S) the session view page (`?t=` opens a one-time URL and sets the session cookie).
    pub const SESSION_INDEX: &str = "/sandbox/sandboxes/v1/{id}/session/";
    /// (S) `ANY`: the session view's assets and its `api/…` routes (JSON, files, WebSockets).
    pub const SESSION_PATH: &str = "/sandbox/sandboxes/v1/{id}/session/{*path}";
    /// (V) the viewer: noVNC page, its WebSocket and files, the live stream.
    pub const VNC_INDEX: &str = "/sandbox/sandboxes/v1/{id}/vnc/";
    pub const VNC_WS: &str = "/sandbox/sandboxes/v1/{id}/vnc/websockify";
    pub const VNC_FILE: &str = "/sandbox/sandboxes/v1/{id}/vnc/{*path}";
    pub const STREAM_MP4: &str = "/sandbox/sandboxes/v1/{id}/stream.mp4";
    pub const STREAM: &str = "/sandbox/sandboxes/v1/{id}/stream";

    pub const IMAGES_BUILD: &str = "/sandbox/sandboxes/v1/images/build";
    pub const IMAGE: &str = "/sandbox/sandboxes/v1/images/{image_ref}";

    pub const LEASES: &str = "/sandbox/v1/leases";
    pub const LEASE: &str = "/sandbox/v1/leases/{id}";
    pub const LEASE_RENEW: &str = "/sandbox/v1/leases/{id}/renew";
    pub const CATALOG: &str = "/sandbox/v1/catalog";
    pub const POOLS: &str = "/sandbox/v1/pools";
    pub const POOL: &str = "/sandbox/v1/pools/{profile}";
    pub const ARTIFACTS: &str = "/sandbox/v1/artifacts";
    pub const ARTIFACT: &str = "/sandbox/v1/artifacts/{id}";
}

/// Header names, lowercase (as `http::HeaderName` holds them).
pub mod header {
    /// The native API's `Bearer` token.
    pub const AUTHORIZATION: &str = "authorization";
    /// The controller's API key.
    pub const API_KEY: &str = "x-api-key";
    /// Screenshot: the screen's size in pixels before scaling.
    pub const SCREEN_WIDTH: &str = "x-screen-width";
    pub const SCREEN_HEIGHT: &str = "x-screen-height";
    /// Screenshot: the factor the image was scaled by.
    pub const SCALE: &str = "x-scale";
    /// Screenshot: `hit` when the answer reused the last encoded frame, else `miss`.
    pub const CACHE: &str = "x-cache";
    /// Screenshot: how long the settle wait took.
    pub const SETTLED_MS: &str = "x-settled-ms";
    /// Screenshot: `true` when the screen did not settle before the wait's timeout.
    pub const SETTLE_TIMED_OUT: &str = "x-settle-timed-out";
    /// MCP (Streamable HTTP): the session a server assigned, and the protocol version a
    /// client speaks; both pass through the controller's relay either way.
    pub const MCP_SESSION_ID: &str = "mcp-session-id";
    /// The egress proxy's refusals: the reason (`not_allowed`, `host_mismatch`, …).
    pub const EGRESS_DENIED: &str = "x-berth-egress-denied";
    pub const MCP_PROTOCOL_VERSION: &str = "mcp-protocol-version";
    /// The control token of a person holding the controls: input carrying it passes while
    /// every other caller is refused `human_in_control`.
    pub const CONTROL: &str = "x-berth-control";
    /// The controller's key for the controls' pushes to an agent (`PUT /v1/control/key`).
    pub const CONTROL_KEY: &str = "x-berth-control-key";
    /// Set by the controller's relay on a viewer's VNC connection that must not send input.
    pub const VIEW_ONLY: &str = "x-berth-view-only";
    /// Every header the agent sets on its own answers, which proxies pass through.
    pub const AGENT_RESPONSE: [&str; 6] = [
        SCREEN_WIDTH,
        SCREEN_HEIGHT,
        SCALE,
        CACHE,
        SETTLED_MS,
        SETTLE_TIMED_OUT,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_encodes_segments_and_keeps_rest_paths() {
        assert_eq!(fill(native::COMMAND, &["cmd_1"]), "/v1/commands/cmd_1");
        assert_eq!(fill(native::COMMAND, &["a/b?c"]), "/v1/commands/a%2Fb%3Fc");
        assert_eq!(
            fill(controller::SANDBOX_AGENT, &["sb_1", "/fs/list"]),
            "/sandbox/sandboxes/v1/sb_1/v1/fs/list"
        );
        assert_eq!(
            fill(controller::SANDBOX_PORT_URL, &["sb_1", "8080"]),
            "/sandbox/sandboxes/v1/sb_1/ports/8080/url"
        );
        assert_eq!(fill(controller::SANDBOX, &[]), controller::SANDBOX);
        assert_eq!(native::nested::COMMAND, "/commands/{id}");
        assert_eq!(
            format!("{}{}", native::PREFIX, native::nested::PORT),
            native::PORT
        );
    }
}
