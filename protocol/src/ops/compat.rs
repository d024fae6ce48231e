//! The OSWorld-compatible surface the agent serves at root paths: Flask's answers
//! (`{"message", "status": "error"}` or `{"error"}` for errors, JSON objects or text for
//! results). Open or bearer, per `--compat-auth`.

use schemars::SchemaGenerator;
use serde_json::{Value, json};

use super::{Answer, Body, Operation, Schema, binary, boolean, object, string};
use crate::routes::compat as path;

const fn post(path: &'static str, id: &'static str, summary: &'static str) -> Operation {
    Operation::post(path, id, summary)
        .tag("compat")
        .security(&["", "bearer"])
}

const fn get(path: &'static str, id: &'static str, summary: &'static str) -> Operation {
    Operation::get(path, id, summary)
        .tag("compat")
        .security(&["", "bearer"])
}

const JSON: Body = Body::json(object);
const FORM: Body = Body::new("application/x-www-form-urlencoded", form);

fn form(_: &mut SchemaGenerator) -> Value {
    json!({"type": "object", "additionalProperties": true})
}

/// An error in either of Flask's shapes.
fn error(_: &mut SchemaGenerator) -> Value {
    json!({"anyOf": [
        {"type": "object", "required": ["message", "status"],
         "properties": {"message": {"type": "string"}, "status": {"type": "string"}}},
        {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    ]})
}

/// Whatever JSON the reference server's handler returns (objects, the cursor's `[x, y]`), or
/// text.
fn any_json(_: &mut SchemaGenerator) -> Value {
    json!({})
}

const ERRORS: &[(&str, Schema)] = &[("application/json", error), ("text/html", string)];

/// Every operation's answers past its 200.
macro_rules! done {
    ($($media:expr),+) => {
        &[
            Answer::media("200", "done", &[$($media),+]),
            Answer::media(
                "500",
                "the reference server's own 500 (kept: the compat spec freezes it)",
                ERRORS,
            ),
            Answer::media("default", "an error (Flask's shapes)", ERRORS),
        ]
    };
}

const DONE: &[Answer] = done!(("application/json", any_json), ("text/html", string));
const BYTES: &[Answer] = done!(("application/octet-stream", binary), ("*/*", binary));

pub const EXECUTE: Operation = post(
    path::EXECUTE,
    "compat_execute",
    "run a command (destructive)",
)
.body(JSON)
.answers(DONE);

pub const SETUP_EXECUTE: Operation = post(
    path::SETUP_EXECUTE,
    "compat_setup_execute",
    "run a command (destructive)",
)
.body(JSON)
.answers(DONE);

pub const EXECUTE_VERIFY: Operation = post(
    path::EXECUTE_WITH_VERIFICATION,
    "compat_execute_verify",
    "run and verify (destructive)",
)
.body(JSON)
.answers(DONE);

pub const SETUP_EXECUTE_VERIFY: Operation = post(
    path::SETUP_EXECUTE_WITH_VERIFICATION,
    "compat_setup_execute_verify",
    "run and verify (destructive)",
)
.body(JSON)
.answers(DONE);

pub const LAUNCH: Operation = post(
    path::SETUP_LAUNCH,
    "compat_launch",
    "launch a program (destructive)",
)
.body(JSON)
.answers(DONE);

pub const RUN_PYTHON: Operation = post(
    path::RUN_PYTHON,
    "compat_run_python",
    "run Python code (destructive)",
)
.body(JSON)
.answers(DONE);

pub const RUN_BASH: Operation = post(
    path::RUN_BASH_SCRIPT,
    "compat_run_bash",
    "run a bash script (destructive)",
)
.body(JSON)
.answers(DONE);

pub const LIST_DIRECTORY: Operation = post(
    path::LIST_DIRECTORY,
    "compat_list_directory",
    "a directory tree",
)
.body(JSON)
.answers(DONE);

pub const DESKTOP_PATH: Operation = post(
    path::DESKTOP_PATH,
    "compat_desktop_path",
    "the desktop directory",
)
.answers(DONE);

pub const DOWNLOAD_FILE: Operation = post(
    path::SETUP_DOWNLOAD_FILE,
    "compat_download_file",
    "fetch a URL into a file (destructive)",
)
.body(JSON)
.answers(DONE);

pub const SCREEN_SIZE: Operation =
    post(path::SCREEN_SIZE, "compat_screen_size", "the screen's size").answers(DONE);

pub const WINDOW_SIZE: Operation = post(path::WINDOW_SIZE, "compat_window_size", "a window's size")
    .body(JSON)
    .answers(DONE);

pub const ACTIVATE_WINDOW: Operation = post(
    path::SETUP_ACTIVATE_WINDOW,
    "compat_activate_window",
    "raise a window",
)
.body(JSON)
.answers(DONE);

pub const CLOSE_WINDOW: Operation = post(
    path::SETUP_CLOSE_WINDOW,
    "compat_close_window",
    "close a window",
)
.body(JSON)
.answers(DONE);

pub const OPEN_FILE: Operation = post(
    path::SETUP_OPEN_FILE,
    "compat_open_file",
    "open a file (destructive)",
)
.body(JSON)
.answers(DONE);

pub const WALLPAPER: Operation = post(path::WALLPAPER, "compat_wallpaper", "the wallpaper's bytes")
    .body(JSON)
    .answers(BYTES);

pub const CHANGE_WALLPAPER: Operation = post(
    path::SETUP_CHANGE_WALLPAPER,
    "compat_change_wallpaper",
    "set the wallpaper",
)
.body(JSON)
.answers(DONE);

pub const START_RECORDING: Operation = post(
    path::START_RECORDING,
    "compat_start_recording",
    "start the recording",
)
.body(JSON)
.answers(DONE);

pub const END_RECORDING: Operation = post(
    path::END_RECORDING,
    "compat_end_recording",
    "end the recording (the MP4)",
)
.body(JSON)
.answers(done!(("video/mp4", binary)));

pub const FILE: Operation = post(path::FILE, "compat_file", "a file's bytes")
    .body(FORM)
    .answers(BYTES);

pub const UPLOAD: Operation = post(
    path::SETUP_UPLOAD,
    "compat_upload",
    "upload a file (multipart; destructive)",
)
.body(Body::new("multipart/form-data", form))
.answers(DONE);

pub const PLATFORM: Operation = get(
    path::PLATFORM,
    "compat_platform",
    "the platform's name (text)",
)
.answers(done!(("text/html", string)));

pub const SCREENSHOT: Operation = get(path::SCREENSHOT, "compat_screenshot", "the screen as PNG")
    .query(&[super::Param::query("cursor", boolean, "draw the cursor")])
    .answers(done!(("image/png", binary)));

pub const CURSOR_POSITION: Operation = get(
    path::CURSOR_POSITION,
    "compat_cursor_position",
    "the cursor's position",
)
.answers(DONE);

pub const ACCESSIBILITY: Operation = get(
    path::ACCESSIBILITY,
    "compat_accessibility",
    "the accessibility tree as XML in JSON",
)
.answers(DONE);

pub const TERMINAL: Operation =
    get(path::TERMINAL, "compat_terminal", "the terminal's text").answers(DONE);

/// In the order the document lists them.
pub const ALL: &[&Operation] = &[
    &EXECUTE,
    &SETUP_EXECUTE,
    &EXECUTE_VERIFY,
    &SETUP_EXECUTE_VERIFY,
    &LAUNCH,
    &RUN_PYTHON,
    &RUN_BASH,
    &LIST_DIRECTORY,
    &DESKTOP_PATH,
    &DOWNLOAD_FILE,
    &SCREEN_SIZE,
    &WINDOW_SIZE,
    &ACTIVATE_WINDOW,
    &CLOSE_WINDOW,
    &OPEN_FILE,
    &WALLPAPER,
    &CHANGE_WALLPAPER,
    &START_RECORDING,
    &END_RECORDING,
    &FILE,
    &UPLOAD,
    &PLATFORM,
    &SCREENSHOT,
    &CURSOR_POSITION,
    &ACCESSIBILITY,
    &TERMINAL,
];
