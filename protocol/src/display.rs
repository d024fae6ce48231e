use serde::{Deserialize, Serialize};

/// `PUT /v1/display`: the screen's new size, set through RandR.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DisplaySize {
    pub width: u32,
    pub height: u32,
}

/// `GET /v1/display`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct DisplayInfo {
    pub display: Option<String>,
    pub width: u32,
    pub height: u32,
    pub depth: u8,
    pub user: String,
    pub home: String,
    /// X extensions the agent uses and whether the server has them.
    pub extensions: Vec<String>,
    pub listen: String,
}

/// A mouse button by name or number (`left`, `middle`, `right`, `back`, `forward`, 1–9).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Button {
    Name(String),
    Number(u8),
}

impl Default for Button {
    fn default() -> Self {
        Button::Name("left".into())
    }
}

/// One step of `POST /v1/input`. Coordinates are screen pixels; 0 is a real coordinate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum InputAction {
    Move {
        x: i32,
        y: i32,
    },
    /// Presses and releases `count` times (2 = double click), at x/y if given.
    Click {
        #[serde(default)]
        x: Option<i32>,
        #[serde(default)]
        y: Option<i32>,
        #[serde(default)]
        button: Button,
        #[serde(default)]
        count: Option<u32>,
        /// Keys held during the click (`shift`, `ctrl`…).
        #[serde(default)]
        modifiers: Vec<String>,
    },
    ButtonDown {
        #[serde(default)]
        button: Button,
    },
    ButtonUp {
        #[serde(default)]
        button: Button,
    },
    /// Presses at the first point, moves through the rest, releases at the last.
    Drag {
        path: Vec<[i32; 2]>,
        #[serde(default)]
        button: Button,
        #[serde(default)]
        modifiers: Vec<String>,
    },
    Scroll {
        #[serde(default)]
        x: Option<i32>,
        #[serde(default)]
        y: Option<i32>,
        /// `up`, `down`, `left` or `right`.
        direction: String,
        #[serde(default)]
        amount: Option<u32>,
        #[serde(default)]
        modifiers: Vec<String>,
    },
    /// A key or chord (`Return`, `ctrl+shift+t`), pressed and released.
    Key {
        keys: String,
        #[serde(default)]
        repeat: Option<u32>,
    },
    KeyDown {
        key: String,
    },
    KeyUp {
        key: String,
    },
    /// Holds a key or chord for `duration_ms`.
    Hold {
        keys: String,
        duration_ms: u64,
    },
    /// Types text exactly (any Unicode, whatever the layout; `\n` is Return, `\t` Tab).
    Type {
        text: String,
    },
    Wait {
        ms: u64,
    },
}

/// Settled screenshot wanted after the actions.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScreenshotAfter {
    #[serde(default)]
    pub format: Option<String>,
    #[serde(default)]
    pub quality: Option<u8>,
    #[serde(default)]
    pub scale: Option<f64>,
    #[serde(default)]
    pub settle_ms: Option<u64>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputRequest {
    pub actions: Vec<InputAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screenshot_after: Option<ScreenshotAfter>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct InputResponse {
    pub cursor: [i32; 2],
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screenshot_b64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle_timed_out: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Clipboard {
    /// `null` when no application holds the clipboard.
    pub text: Option<String>,
}

/// `POST /v1/computer`: the computer-use tool input engines emit.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ComputerRequest {
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinate: Option<[i64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_coordinate: Option<[i64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scroll_direction: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scroll_amount: Option<u32>,
    /// Seconds, for `wait` and `hold_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    /// `zoom`: `[x1, y1, x2, y2]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<[i64; 4]>,
    /// The size the engine believes the screen is: screenshots are scaled to it and its
    /// coordinates mapped back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_width_px: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_height_px: Option<u32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ComputerResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64_image: Option<String>,
    /// After an action: how long the screen took to settle before the screenshot (as
    /// `/v1/input` reports it), and whether it gave up waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle_timed_out: Option<bool>,
}
