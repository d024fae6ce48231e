//! The native operations of the screen and the desktop: display, computer use, toolsets,
//! recordings, the episode, the live stream and viewer, readiness and the browser.

use schemars::SchemaGenerator;
use serde_json::{Value, json};

use super::{VIEWER, v1};
use crate::ops::{
    ANY, Answer, Body, ERROR, Operation, Param, Schema, binary, boolean, int, schema, string,
};
use crate::routes::native as path;
use crate::toolset::{BrowserToolsetInfo, ComputerToolsetInfo, ToolsetTurn};
use crate::*;

// Display.

/// What a screenshot may be encoded as.
pub const IMAGE: &[(&str, Schema)] = &[
    ("image/png", binary),
    ("image/jpeg", binary),
    ("image/webp", binary),
];

pub const SCREENSHOT: Operation = v1(Operation::get(
    path::SCREENSHOT,
    "screenshot",
    "the screen as an image",
))
.query(&[
    FORMAT,
    QUALITY,
    Param::query(
        "compression",
        string,
        "png compression (fast, default, best)",
    ),
    SCALE,
    Param::query(
        "region",
        |_| json!({"type": "string", "pattern": "^\\d+,\\d+,\\d+,\\d+$"}),
        "x,y,w,h",
    ),
    Param::query("cursor", boolean, "draw the cursor"),
    Param::query("settle_ms", int, "wait until the screen is quiet this long"),
    Param::query("timeout_ms", int, "give up the settle wait after this long"),
])
.answers(&[
    Answer::media("200", "the image", IMAGE).headers(&[
        ("X-Screen-Width", int),
        ("X-Screen-Height", int),
        ("X-Scale", |_| json!({"type": "number"})),
        (
            "X-Cache",
            |_| json!({"type": "string", "enum": ["hit", "miss"]}),
        ),
        ("X-Settled-Ms", int),
        (
            "X-Settle-Timed-Out",
            |_| json!({"type": "string", "enum": ["true", "false"]}),
        ),
    ]),
    Answer::empty("304", "not modified (If-None-Match)"),
]);

/// A screenshot's query parameters the controller passes on too.
pub const FORMAT: Param = Param::query(
    "format",
    |_| json!({"type": "string", "enum": ["png", "jpeg", "webp"]}),
    "image format",
);
pub const QUALITY: Param = Param::query(
    "quality",
    |_| json!({"type": "integer", "minimum": 1, "maximum": 100}),
    "jpeg/webp quality",
);
pub const SCALE: Param = Param::query(
    "scale",
    |_| json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
    "downscale factor",
);

pub const INPUT: Operation = v1(Operation::post(
    path::INPUT,
    "input",
    "mouse and keyboard actions",
))
.body(Body::json(schema::<InputRequest>))
.answers(&[
    Answer::json("200", "done", schema::<InputResponse>),
    Answer::json("422", "valid but impossible", ERROR),
]);

pub const DISPLAY: Operation = v1(Operation::get(path::DISPLAY, "display", "the display"))
    .answers(&[Answer::json("200", "the display", schema::<DisplayInfo>)]);

pub const DISPLAY_RESIZE: Operation = v1(Operation::put(
    path::DISPLAY,
    "display_resize",
    "resize the live screen (RandR)",
))
.body(Body::json(schema::<DisplaySize>))
.answers(&[
    Answer::json(
        "200",
        "resized: the display at its new size",
        schema::<DisplayInfo>,
    ),
    Answer::json("503", "no display, or no RandR", ERROR),
]);

pub const WINDOWS: Operation = v1(Operation::get(
    path::WINDOWS,
    "windows",
    "top-level windows",
))
.answers(&[Answer::json("200", "the windows", |_| {
    json!({"type": "object", "required": ["windows"],
               "properties": {"windows": {"type": "array", "items": {"type": "object"}}}})
})]);

pub const CLIPBOARD_GET: Operation = v1(Operation::get(
    path::CLIPBOARD,
    "clipboard_get",
    "the clipboard's text",
))
.answers(&[Answer::json("200", "the text", schema::<Clipboard>)]);

pub const CLIPBOARD_PUT: Operation = v1(Operation::put(
    path::CLIPBOARD,
    "clipboard_put",
    "set the clipboard's text",
))
.body(Body::json(schema::<Clipboard>))
.answers(&[Answer::empty("204", "set")]);

pub const COMPUTER: Operation = v1(Operation::post(
    path::COMPUTER,
    "computer",
    "a computer-use tool action (Anthropic's or OpenAI's) or a batch of them",
))
.body(Body::json(schema::<ComputerBody>))
.answers(COMPUTER_ANSWERS);

/// `POST …/computer`: the body by its key (`action` Anthropic's, `type` OpenAI's, `actions` a
/// batch), the answer in the request's dialect; an error answer is the error body or the
/// dialect's answer carrying `error` (and `failed` for a batch that stopped).
pub const COMPUTER_ANSWERS: &[Answer] = &[
    Answer::json(
        "200",
        "done: the settled screen in the request's dialect",
        schema::<ComputerAnswer>,
    ),
    Answer::json("400", "bad input (nothing ran)", computer_failed),
    Answer::json("422", "valid but impossible", computer_failed),
    Answer::json("default", "an error", computer_failed),
];

fn computer_failed(g: &mut SchemaGenerator) -> Value {
    json!({"anyOf": [ERROR(g), schema::<ComputerAnswer>(g)]})
}

pub const TOOLSET_COMPUTER_INFO: Operation = v1(Operation::get(
    path::TOOLSET_COMPUTER,
    "toolset_computer_info",
    "Anthropic's computer toolset: the tools[] entry, the display and the screenshot size",
))
.answers(&[
    Answer::json("200", "the toolset", schema::<ComputerToolsetInfo>),
    Answer::json("503", "no display", ERROR),
]);

pub const TOOLSET_COMPUTER_TURN: Operation = v1(Operation::post(
    path::TOOLSET_COMPUTER,
    "toolset_computer_turn",
    "a model turn's content: its computer tool_use blocks run in order, answered with \
     their tool_result blocks",
))
.body(Body::json(schema::<ToolsetTurn>))
.answers(&[
    Answer::json("200", "one tool_result per tool_use", schema::<ToolsetTurn>),
    Answer::json("503", "no display", ERROR),
]);

pub const TOOLSET_BROWSER_INFO: Operation = v1(Operation::get(
    path::TOOLSET_BROWSER,
    "toolset_browser_info",
    "Anthropic's browser toolset: the tools[] entry, the members served and the \
     active tab's viewport and screenshot size",
))
.answers(&[
    Answer::json("200", "the toolset", schema::<BrowserToolsetInfo>),
    Answer::json("503", "no desktop, or the browser is down", ERROR),
]);

pub const TOOLSET_BROWSER_TURN: Operation = v1(Operation::post(
    path::TOOLSET_BROWSER,
    "toolset_browser_turn",
    "a model turn's content: its browser tool_use blocks run in order over CDP in the \
     sandbox's browser, answered with their tool_result blocks (each with the \
     browser_state block)",
))
.body(Body::json(schema::<ToolsetTurn>))
.answers(&[
    Answer::json("200", "one tool_result per tool_use", schema::<ToolsetTurn>),
    Answer::json("400", "a content block that is not well formed", ERROR),
    Answer::json("503", "no desktop", ERROR),
]);

// Recordings, the episode and the live stream.

pub const RECORDING_START: Operation = v1(Operation::post(
    path::RECORDINGS,
    "recording_start",
    "start a recording",
))
.body(Body::json(schema::<RecordingRequest>))
.answers(&[
    Answer::json("201", "started", schema::<RecordingInfo>),
    Answer::json("409", "conflict", ERROR),
    Answer::json("429", "too many recordings", ERROR),
]);

pub const RECORDINGS_LIST: Operation = v1(Operation::get(
    path::RECORDINGS,
    "recordings_list",
    "recordings",
))
.answers(&[Answer::json(
    "200",
    "the recordings",
    schema::<RecordingList>,
)]);

pub const RECORDING_GET: Operation = v1(Operation::get(
    path::RECORDING,
    "recording_get",
    "one recording",
))
.answers(&[Answer::json(
    "200",
    "the recording",
    schema::<RecordingInfo>,
)]);

pub const RECORDING_DELETE: Operation = v1(Operation::delete(
    path::RECORDING,
    "recording_delete",
    "delete a recording",
))
.answers(&[
    Answer::json("200", "deleted", |_| {
        json!({"type": "object", "required": ["deleted"],
               "properties": {"deleted": {"type": "string"}}})
    }),
    Answer::json("409", "conflict", ERROR),
]);

pub const RECORDING_STOP: Operation = v1(Operation::post(
    path::RECORDING_STOP,
    "recording_stop",
    "stop a recording",
))
.answers(&[
    Answer::json("200", "stopped", schema::<RecordingInfo>),
    Answer::json("409", "conflict", ERROR),
]);

/// An MP4 file or stream.
pub const MP4: &[(&str, Schema)] = &[("video/mp4", binary)];

pub const RECORDING_FILE: Operation = v1(Operation::get(
    path::RECORDING_FILE,
    "recording_file",
    "a recording's MP4 (Range)",
))
.answers(&[
    Answer::media("200", "the video", MP4),
    Answer::media("206", "the requested range", MP4),
    Answer::json("409", "not finished", ERROR),
    Answer::json("416", "range not satisfiable", ERROR),
]);

pub const EPISODE_ACTIONS: Operation = v1(Operation::get(
    path::EPISODE_ACTIONS,
    "episode_actions",
    "the episode's logged computer-use and input actions, oldest first",
))
.query(&[
    Param::query("from_seq", int, "the first seq to answer (default 1)"),
    Param::query(
        "limit",
        int,
        "at most this many (default 1000, at most 10000)",
    ),
])
.answers(&[Answer::json("200", "a page of the log", |g| {
    json!({"type": "object", "required": ["actions", "next_seq"], "properties": {
        "actions": {"type": "array", "items": {"type": "object"}},
        "next_seq": int(g),
        "dropped": int(g),
    }})
})]);

pub const EPISODE_SCREENSHOT: Operation = v1(Operation::get(
    path::EPISODE_SCREENSHOT,
    "episode_screenshot",
    "a screenshot an action answered, the bytes it answered",
))
.answers(&[
    Answer::media("200", "the image", IMAGE),
    Answer::json("400", "bad name", ERROR),
    Answer::json("404", "no such screenshot (or dropped)", ERROR),
]);

pub const EPISODE_CLEAR: Operation = v1(Operation::delete(
    path::EPISODE,
    "episode_clear",
    "start a new episode: the action log and its screenshots are cleared",
))
.answers(&[Answer::json(
    "200",
    "cleared",
    |g| json!({"type": "object", "required": ["cleared"], "properties": {"cleared": int(g)}}),
)]);

/// The live stream's query parameters.
const STREAM_QUERY: &[Param] = &[
    Param::query("fps", int, "frames per second"),
    Param::query("width", int, "scaled width"),
    Param::query("bitrate_kbps", int, "target bitrate"),
];

pub const STREAM_MP4: Operation = v1(Operation::get(
    path::STREAM_MP4,
    "stream_mp4",
    "the live screen as fragmented MP4 (V)",
))
.security(VIEWER)
.query(STREAM_QUERY)
.answers(&[Answer::media("200", "the stream", MP4)]);

pub const STREAM_WS: Operation = v1(Operation::get(
    path::STREAM,
    "stream_ws",
    "the live screen over a WebSocket (V)",
))
.security(VIEWER)
.query(STREAM_QUERY)
.answers(&[Answer::empty("101", "fragmented MP4 in binary messages")]);

pub const VIEWER_TOKEN: Operation = v1(Operation::post(
    path::VIEWER_TOKENS,
    "viewer_token",
    "a one-time viewer URL",
))
.body(Body::json(schema::<ViewerTokenRequest>))
.answers(&[
    Answer::json("201", "the URL", schema::<ViewerToken>),
    Answer::json("429", "too many unused URLs", ERROR),
]);

pub const VNC_INDEX: Operation = v1(Operation::get(
    path::VNC_INDEX,
    "vnc_index",
    "the noVNC page (V)",
))
.security(VIEWER)
.query(&[Param::query(
    "t",
    string,
    "a one-time viewer token (sets the cookie)",
)])
.answers(&[
    Answer::empty("302", "to the page"),
    Answer::empty("303", "to the clean URL, cookie set"),
]);

pub const VNC_WS: Operation = v1(Operation::get(
    path::VNC_WS,
    "vnc_ws",
    "noVNC's WebSocket (V)",
))
.security(VIEWER)
.answers(&[Answer::empty("101", "RFB over WebSocket")]);

pub const VNC_FILE: Operation = v1(Operation::get(
    path::VNC_FILE,
    "vnc_file",
    "noVNC's static files (V)",
))
.security(VIEWER)
.answers(&[Answer::media("200", "the file", ANY)]);

// Desktop.

pub const READY: Operation = v1(Operation::get(
    path::READY,
    "ready",
    "readiness of the desktop's components",
))
.query(&[Param::query(
    "wait",
    string,
    "wait up to this long for ready (30s, 2m; at most 300 s)",
)])
.answers(&[
    Answer::json("200", "ready", schema::<ReadyReport>),
    Answer::json("503", "not ready", schema::<ReadyReport>),
]);

pub const A11Y: Operation = v1(Operation::get(path::A11Y, "a11y", "the accessibility tree"))
    .answers(&[
        Answer::json("200", "the tree", schema::<A11yTree>),
        Answer::json("503", "no accessibility bus", ERROR),
    ]);

pub const DESKTOP_STATE: Operation = v1(Operation::get(
    path::DESKTOP_STATE,
    "desktopState",
    "the desktop-state contract: session, theme, dock, default applications, windows, \
     first-run state, programs, volume and time zone, each expected item checked",
))
.answers(&[
    Answer::json("200", "the state", schema::<DesktopState>),
    Answer::json(
        "503",
        "no desktop, or its settings could not be read",
        ERROR,
    ),
]);

pub const BROWSER: Operation = v1(Operation::get(
    path::BROWSER,
    "browser",
    "the desktop's Chromium",
))
.answers(&[
    Answer::json("200", "the browser", schema::<BrowserInfo>),
    Answer::json("503", "no browser", ERROR),
]);

pub const BROWSER_RESTART: Operation = v1(Operation::post(
    path::BROWSER_RESTART,
    "browser_restart",
    "restart Chromium",
))
.answers(&[
    Answer::json("200", "the new browser", schema::<BrowserInfo>),
    Answer::json("503", "no browser", ERROR),
]);

pub const BROWSER_CDP: Operation = v1(Operation::get(
    path::BROWSER_CDP,
    "browser_cdp",
    "the browser target's CDP (WebSocket)",
))
.answers(&[Answer::empty("101", "CDP over WebSocket")]);

pub const BROWSER_CDP_TARGET: Operation = v1(Operation::get(
    path::BROWSER_CDP_TARGET,
    "browser_cdp_target",
    "one target's CDP (WebSocket)",
))
.answers(&[Answer::empty("101", "CDP over WebSocket")]);
