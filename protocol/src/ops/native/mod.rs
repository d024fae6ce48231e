//! The agent's native API: `/v1` (bearer token; the (V) operations also take the viewer
//! cookie), and beside it health, the OpenAPI document and MCP.

use serde_json::{Value, json};

use super::{
    Answer, Body, ERROR, Operation, Param, Schema, alive, binary, boolean, int, object, schema,
    string,
};
use crate::routes::native::{self as path, PREFIX};
use crate::*;

mod control;
mod screen;

pub use control::*;
pub use screen::*;

const BEARER: &[&str] = &["bearer"];
/// The browser-facing (V) operations: the bearer token or the viewer cookie.
const VIEWER: &[&str] = &["bearer", "viewerCookie"];

/// An operation of the router nested at `/v1`.
const fn v1(op: Operation) -> Operation {
    op.nest(PREFIX)
        .tag("native")
        .security(BEARER)
        .native_errors()
}

pub const HEALTHZ: Operation = Operation::get(path::HEALTHZ, "healthz", "liveness (no auth)")
    .tag("native")
    .native_errors()
    .answers(&[Answer::json("200", "alive", alive)]);

pub const OPENAPI: Operation = Operation::get(path::OPENAPI, "openapi", "this document (no auth)")
    .tag("native")
    .answers(&[Answer::json("200", "the OpenAPI 3.1 document", object)]);

// Commands.

pub const EXEC: Operation = v1(Operation::post(
    path::EXEC,
    "exec",
    "run a command (foreground or background)",
))
.body(Body::json(schema::<ExecRequest>))
.answers(&[
    Answer::json(
        "200",
        "the foreground command's result",
        schema::<ExecResult>,
    ),
    Answer::json(
        "202",
        "the background command's id",
        schema::<BackgroundStarted>,
    ),
    Answer::json("409", "the id is taken by another request", ERROR),
]);

pub const COMMANDS_LIST: Operation = v1(Operation::get(
    path::COMMANDS,
    "commands_list",
    "background commands",
))
.answers(&[Answer::json("200", "the commands", schema::<CommandList>)]);

pub const COMMAND_GET: Operation = v1(Operation::get(
    path::COMMAND,
    "command_get",
    "one background command",
))
.answers(&[Answer::json("200", "the command", schema::<CommandInfo>)]);

pub const COMMAND_DELETE: Operation = v1(Operation::delete(
    path::COMMAND,
    "command_delete",
    "forget a command (killed if running)",
))
.answers(&[Answer::json("200", "deleted", |_| {
    json!({"type": "object", "required": ["id", "deleted"],
           "properties": {"id": {"type": "string"}, "deleted": {"type": "boolean"}}})
})]);

pub const COMMAND_OUTPUT: Operation = v1(Operation::get(
    path::COMMAND_OUTPUT,
    "command_output",
    "a command's output from a seq",
))
.query(&[
    Param::query("from_seq", int, "byte offset to read from"),
    Param::query(
        "follow",
        boolean,
        "WebSocket, SSE or long-poll until the command ends",
    ),
    Param::query("max_bytes", int, "at most this many bytes"),
    LONG_POLL_TIMEOUT,
    STALL_FOLLOWER,
])
.answers(&[
    Answer::json("200", "chunks from from_seq", schema::<OutputPage>),
    Answer::empty("101", "WebSocket follow"),
]);

pub const COMMAND_STDIN: Operation = v1(Operation::post(
    path::COMMAND_STDIN,
    "command_stdin",
    "write to a command's stdin",
))
.body(Body::json(schema::<StdinRequest>))
.answers(&[
    Answer::json("200", "written", |_| {
        json!({"type": "object", "required": ["written", "eof"],
               "properties": {"written": {"type": "integer", "minimum": 0},
                              "eof": {"type": "boolean"}}})
    }),
    Answer::json(
        "409",
        "the command is not running or its stdin is closed",
        ERROR,
    ),
]);

pub const COMMAND_SIGNAL: Operation = v1(Operation::post(
    path::COMMAND_SIGNAL,
    "command_signal",
    "signal a command's process group",
))
.body(Body::json(schema::<SignalRequest>))
.answers(&[
    Answer::json("200", "sent", |_| {
        json!({"type": "object", "required": ["signal"],
               "properties": {"signal": {"type": "string"}}})
    }),
    Answer::json("409", "the command is not running", ERROR),
]);

// PTYs.

pub const PTY_OPEN: Operation = v1(Operation::post(
    path::PTYS,
    "pty_open",
    "open a PTY session",
))
.body(Body::json(schema::<PtyRequest>))
.answers(&[Answer::json("201", "the session", schema::<PtyInfo>)]);

pub const PTY_LIST: Operation = v1(Operation::get(path::PTYS, "pty_list", "PTY sessions"))
    .answers(&[Answer::json("200", "the sessions", schema::<PtyList>)]);

pub const PTY_GET: Operation = v1(Operation::get(path::PTY, "pty_get", "one PTY session"))
    .answers(&[Answer::json("200", "the session", schema::<PtyInfo>)]);

pub const PTY_KILL: Operation = v1(Operation::delete(
    path::PTY,
    "pty_kill",
    "kill a PTY session",
))
.answers(&[Answer::json("200", "killed", |_| {
    json!({"type": "object", "required": ["id", "killed"],
           "properties": {"id": {"type": "string"}, "killed": {"type": "boolean"}}})
})]);

pub const PTY_ATTACH: Operation = v1(Operation::get(
    path::PTY_ATTACH,
    "pty_attach",
    "attach to a PTY (WebSocket)",
))
.query(&[STALL_CLIENT])
.answers(&[Answer::empty("101", "the terminal's bytes both ways")]);

pub const PTY_RESIZE: Operation = v1(Operation::post(
    path::PTY_RESIZE,
    "pty_resize",
    "resize a PTY",
))
.body(Body::json(schema::<PtySize>))
.answers(&[Answer::json("200", "the session", schema::<PtyInfo>)]);

/// A follow's long-poll bound and its stall bound (command output, events).
const LONG_POLL_TIMEOUT: Param = Param::query(
    "timeout_ms",
    int,
    "long-poll: answer after this long even when empty",
);
const STALL_FOLLOWER: Param = Param::query(
    "stall_ms",
    int,
    "drop a follower that reads nothing this long",
);

const STALL_CLIENT: Param = Param::query(
    "stall_ms",
    int,
    "drop a client that reads nothing this long",
);

// Files.

const PATH: Param = Param::required("path", string, "absolute, or relative to the home");
const BYTES: &[(&str, Schema)] = &[("application/octet-stream", binary)];

// Workpieces (the controller's engine in the guest).

pub const WORKPIECE: Operation = v1(Operation::post(
    path::WORKPIECE,
    "workpiece",
    "the workpiece engine, run as the sandbox user: {\"op\": inspect | create | read | apply | \
     render | open | discard, …} (LibreOffice for decks, sheets and documents, PyMuPDF for PDFs)",
))
.body(Body::json(object))
.answers(&[
    Answer::json("200", "the engine's answer", object),
    Answer::json("400", "a bad request or operation (named)", ERROR),
    Answer::json("403", "the sandbox user cannot reach the path", ERROR),
    Answer::json("404", "no such file", ERROR),
    Answer::json("409", "a file exists already", ERROR),
    Answer::json("413", "past the size limit", ERROR),
    Answer::json("422", "the editor could not be started (open)", ERROR),
    Answer::json(
        "503",
        "the image has no python3, LibreOffice or PyMuPDF",
        ERROR,
    ),
    Answer::json("504", "the engine took longer than its bound", ERROR),
]);

pub const WORKPIECE_FILE_GET: Operation = v1(Operation::get(
    path::WORKPIECE_FILE,
    "workpiece_file_get",
    "a workpiece file, read with the sandbox user's rights",
))
.query(&[PATH])
.answers(&[
    Answer::media("200", "the bytes", BYTES),
    Answer::json("403", "the sandbox user cannot read it", ERROR),
    Answer::json("404", "no such file", ERROR),
]);

pub const WORKPIECE_FILE_PUT: Operation = v1(Operation::put(
    path::WORKPIECE_FILE,
    "workpiece_file_put",
    "replaces a workpiece file whole (temp beside it, then rename) with the sandbox user's \
     rights, when the body's SHA-256 is `sha256`",
))
.query(&[
    PATH,
    Param::required("sha256", string, "the body's hex SHA-256"),
])
.body(Body::new("application/octet-stream", binary))
.answers(&[
    Answer::json("201", "written", schema::<UploadResult>),
    Answer::json("400", "the body is not the named content", ERROR),
    Answer::json("403", "the sandbox user cannot write there", ERROR),
]);

pub const FILES_DOWNLOAD: Operation = v1(Operation::get(
    path::FILES,
    "files_download",
    "download a file (Range)",
))
.query(&[PATH])
.answers(&[
    Answer::media("200", "the bytes", BYTES),
    Answer::media("206", "the requested range", BYTES),
    Answer::empty("304", "not modified"),
    Answer::json("416", "range not satisfiable", ERROR),
]);

pub const FILES_UPLOAD: Operation = v1(Operation::put(
    path::FILES,
    "files_upload",
    "upload a file (streamed, no size limit)",
))
.query(&[
    PATH,
    Param::query(
        "mode",
        |_| json!({"type": "string", "pattern": "^(0o)?[0-7]{1,4}$"}),
        "octal mode",
    ),
])
.body(Body::new("application/octet-stream", binary))
.answers(&[Answer::json("201", "written", schema::<UploadResult>)]);

pub const FS_REMOVE: Operation = v1(Operation::delete(
    path::FS,
    "fs_remove",
    "remove a file or directory",
))
.query(&[
    PATH,
    Param::query("recursive", boolean, "remove a directory's contents"),
])
.answers(&[
    Answer::json("200", "removed", |_| {
        json!({"type": "object", "required": ["path", "removed"],
               "properties": {"path": {"type": "string"}, "removed": {"type": "boolean"}}})
    }),
    Answer::json("409", "a directory that is not empty", ERROR),
]);

pub const FS_LIST: Operation = v1(Operation::get(path::FS_LIST, "fs_list", "list a directory"))
    .query(&[
        PATH,
        Param::query("depth", int, "levels below the directory (default 1)"),
    ])
    .answers(&[Answer::json("200", "the entries", schema::<ListResponse>)]);

pub const FS_STAT: Operation = v1(Operation::get(
    path::FS_STAT,
    "fs_stat",
    "one entry's metadata",
))
.query(&[PATH])
.answers(&[Answer::json("200", "the entry", schema::<FileEntry>)]);

pub const FS_MKDIR: Operation = v1(Operation::post(
    path::FS_MKDIR,
    "fs_mkdir",
    "make a directory",
))
.body(Body::json(schema::<MkdirRequest>))
.answers(&[
    Answer::json("201", "the directory", schema::<FileEntry>),
    Answer::json("409", "exists", ERROR),
]);

pub const FS_MOVE: Operation = v1(Operation::post(path::FS_MOVE, "fs_move", "move or rename"))
    .body(Body::json(schema::<MoveRequest>))
    .answers(&[
        Answer::json("200", "the moved entry", schema::<FileEntry>),
        Answer::json("409", "the target exists", ERROR),
    ]);

pub const FS_WATCH: Operation = v1(Operation::get(
    path::FS_WATCH,
    "fs_watch",
    "watch a path (WebSocket or SSE)",
))
.query(&[
    PATH,
    Param::query("recursive", boolean, "watch below the path too"),
    STALL_CLIENT,
])
.answers(&[
    Answer::empty("101", "WebSocket of changes"),
    Answer::media("200", "SSE of changes", &[("text/event-stream", string)]),
]);

// Events and lifecycle.

pub const EVENTS: Operation = v1(Operation::get(
    path::EVENTS,
    "events",
    "the agent's event log",
))
.query(&[
    Param::query("from_seq", int, "first seq"),
    Param::query("follow", boolean, "WebSocket, SSE or long-poll"),
    Param::query("limit", int, "at most this many events (1..10000)"),
    LONG_POLL_TIMEOUT,
    STALL_FOLLOWER,
])
.answers(&[
    Answer::json("200", "a page of events", schema::<EventsPage>),
    Answer::empty("101", "WebSocket follow"),
]);

pub const SHUTDOWN: Operation = v1(Operation::post(
    path::SHUTDOWN,
    "shutdown",
    "full shutdown (destructive)",
))
.answers(&[Answer::json("202", "shutting down", |_| {
    json!({"type": "object", "required": ["shutting_down"],
           "properties": {"shutting_down": {"type": "boolean"}}})
})]);

// Preview: 127.0.0.1:{port} inside the sandbox, and MCP.

const PREVIEW_SUMMARY: &str =
    "the preview relay to 127.0.0.1:{port} in the sandbox (HTTP, WebSocket)";

pub const PREVIEW: Operation = Operation::relay(path::PORT, "preview", PREVIEW_SUMMARY)
    .nest(PREFIX)
    .security(VIEWER);

pub const PREVIEW_ROOT: Operation =
    Operation::relay(path::PORT_ROOT, "preview_root", PREVIEW_SUMMARY)
        .nest(PREFIX)
        .security(VIEWER);

/// It redirects to [`PREVIEW_ROOT`].
pub const PREVIEW_BARE: Operation =
    Operation::relay(path::PORT_BARE, "preview_bare", PREVIEW_SUMMARY)
        .nest(PREFIX)
        .security(VIEWER);

pub const MCP: Operation = Operation::mcp(
    path::MCP,
    "mcp",
    "MCP (Streamable HTTP): the sandbox's computer, exec, file, accessibility, browser and recording tools",
)
.security(BEARER);

/// In the order the document lists them.
pub const ALL: &[&Operation] = &[
    &HEALTHZ,
    &OPENAPI,
    &EXEC,
    &COMMANDS_LIST,
    &COMMAND_GET,
    &COMMAND_DELETE,
    &COMMAND_OUTPUT,
    &COMMAND_STDIN,
    &COMMAND_SIGNAL,
    &PTY_OPEN,
    &PTY_LIST,
    &PTY_GET,
    &PTY_KILL,
    &PTY_ATTACH,
    &PTY_RESIZE,
    &FILES_DOWNLOAD,
    &FILES_UPLOAD,
    &WORKPIECE,
    &WORKPIECE_FILE_GET,
    &WORKPIECE_FILE_PUT,
    &FS_REMOVE,
    &FS_LIST,
    &FS_STAT,
    &FS_MKDIR,
    &FS_MOVE,
    &FS_WATCH,
    &SCREENSHOT,
    &INPUT,
    &DISPLAY,
    &DISPLAY_RESIZE,
    &WINDOWS,
    &CLIPBOARD_GET,
    &CLIPBOARD_PUT,
    &COMPUTER,
    &TOOLSET_COMPUTER_INFO,
    &TOOLSET_COMPUTER_TURN,
    &TOOLSET_BROWSER_INFO,
    &TOOLSET_BROWSER_TURN,
    &RECORDING_START,
    &RECORDINGS_LIST,
    &RECORDING_GET,
    &RECORDING_DELETE,
    &RECORDING_STOP,
    &RECORDING_FILE,
    &EPISODE_ACTIONS,
    &EPISODE_SCREENSHOT,
    &EPISODE_CLEAR,
    &STREAM_MP4,
    &STREAM_WS,
    &VIEWER_TOKEN,
    &VNC_INDEX,
    &VNC_WS,
    &VNC_FILE,
    &READY,
    &A11Y,
    &DESKTOP_STATE,
    &BROWSER,
    &BROWSER_RESTART,
    &BROWSER_CDP,
    &BROWSER_CDP_TARGET,
    &BROWSER_TABS,
    &BROWSER_TAB_SCREENSHOT,
    &GIT_REPOS,
    &GIT_DIFF,
    &CONTROL_GET,
    &CONTROL_PUT,
    &CONTROL_DELETE,
    &CONTROL_SETTINGS,
    &CONTROL_REQUEST,
    &CONTROL_DECLINE,
    &CONTROL_KEY_PUT,
    &BROWSER_LOGIN,
    &BROWSER_FORGET,
    &EVENTS,
    &SHUTDOWN,
    &PREVIEW,
    &PREVIEW_ROOT,
    &PREVIEW_BARE,
    &MCP,
];

pub fn security_schemes() -> Value {
    json!({
        "bearer": {"type": "http", "scheme": "bearer"},
        "viewerCookie": {"type": "apiKey", "in": "cookie", "name": "berth_viewer"},
    })
}
